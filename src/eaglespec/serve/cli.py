"""`eaglespec serve`: the sub-command, registered by the main CLI through `register`."""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = "EAGLESPEC_API_KEY"


def register(subparsers) -> argparse.ArgumentParser:
    from ..cli import add_model_args, add_sampling_args
    from .config import ServeConfig

    d = ServeConfig()
    p = subparsers.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                              description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, "
                                          "/v1/models, /health. Requests are served one at a time, in order.")
    add_model_args(p)
    add_sampling_args(p)  # here: defaults for the fields a request omits
    p.add_argument("--host", default=d.host, help=f"bind address (default {d.host}: this machine only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV} if set)")
    p.add_argument("--model-name", default=None, help="the model id clients pass (default: the target's name)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens, help=f"largest max_tokens a request may ask for (default {d.max_tokens})")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt accepted (default: the model's context)")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout,
                   help=f"seconds a request may wait for the model before a 503 (default {d.queue_timeout:g})")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help=f"waiting requests beyond this get a 503 (default {d.max_queue})")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
    return p


def config_from_args(args) -> "ServeConfig":
    from ..config import SamplingParams
    from .config import ServeConfig

    SamplingParams(args.temperature, args.top_p, args.top_k)  # validate before loading
    return ServeConfig(
        host=args.host, port=args.port, model_name=args.model_name,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_tokens=args.max_tokens_limit, default_max_tokens=min(args.max_new_tokens, args.max_tokens_limit),
        max_prompt_tokens=args.max_prompt_tokens, queue_timeout=args.queue_timeout, max_queue=args.max_queue,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
    )


def cmd_serve(args) -> int:
    from ..cli import load_generator
    from ..errors import EagleError

    config = config_from_args(args)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise EagleError(f"serving needs fastapi and uvicorn: pip install 'eaglespec[serve]' ({exc})") from exc
    if args.seed is not None:
        print("note: --seed is ignored by serve; requests pass their own seed", file=sys.stderr)
    gen = load_generator(args)
    app = create_app(gen, config)
    auth = "API key required" if config.api_key else "no API key"
    print(f"eaglespec: serving {app.state.model_name!r} on http://{config.host}:{config.port}/v1 ({auth})", file=sys.stderr)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level)
    return 0
