"""`eaglespec serve`: the sub-command, registered by the main CLI through `register`."""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = "EAGLESPEC_API_KEY"


def register(subparsers) -> argparse.ArgumentParser:
    from ..cli.options import add_model_args, add_sampling_args
    from .config import ServeConfig

    d = ServeConfig()
    p = subparsers.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                              description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, "
                                          "/v1/models, /health. Requests are decoded together (continuous batching, --max-batch), in arrival order.")
    add_model_args(p)
    add_sampling_args(p)  # here: defaults for the fields a request omits
    p.add_argument("--host", default=d.host, help=f"bind address (default {d.host}: this machine only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV} if set)")
    p.add_argument("--model-name", default=None, help="the model id clients pass (default: the target's name)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens, help=f"largest max_tokens a request may ask for (default {d.max_tokens})")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt accepted (default: the model's context - 1)")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout,
                   help=f"seconds a request may wait for the model before a 503 (default {d.queue_timeout:g})")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help=f"waiting requests beyond this get a 503 (default {d.max_queue})")
    p.add_argument("--max-batch", type=int, default=d.max_batch,
                   help=f"requests decoded together; new ones join the running batch at its next step (default {d.max_batch})")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"a request body beyond this gets a 413 (default {d.max_body_bytes})")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout,
                   help=f"seconds a client may take to send a request body before a 408 (default {d.read_timeout:g})")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout,
                   help=f"seconds a connection may take to send a request's headers before a 408 and close (default {d.header_timeout:g})")
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help=f"open connections beyond this get a 503 and are closed (default {d.max_connections})")
    p.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout,
                   help=f"on shutdown, seconds running requests may take to finish before they fail (default {d.shutdown_timeout:g})")
    p.add_argument("--allowed-host", action="append", default=None, metavar="HOST",
                   help="a Host header name the server answers (repeatable; '*' = any). Default: localhost, "
                        "127.0.0.1, ::1 and the bind address when bound to loopback, any host otherwise")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
    return p


def config_from_args(args) -> "ServeConfig":
    from ..cli.options import check_counts, sampling_mode
    from ..core.config import SamplingParams
    from .config import ServeConfig

    SamplingParams(args.temperature, args.top_p, args.top_k, mode=sampling_mode(args))  # validate before loading
    check_counts(args, max_new_tokens=1, max_tokens_limit=1, max_prompt_tokens=1, max_queue=1, max_batch=1,
                 max_connections=1, max_body_bytes=1024)  # by their flags (ServeConfig names its fields)
    return ServeConfig(
        host=args.host, port=args.port, model_name=args.model_name,
        api_key=_api_key(args.api_key),
        max_tokens=args.max_tokens_limit, default_max_tokens=min(args.max_new_tokens, args.max_tokens_limit),
        max_prompt_tokens=args.max_prompt_tokens, queue_timeout=args.queue_timeout, max_queue=args.max_queue,
        max_batch=args.max_batch,
        max_body_bytes=args.max_body_bytes, read_timeout=args.read_timeout, shutdown_timeout=args.shutdown_timeout,
        header_timeout=args.header_timeout, max_connections=args.max_connections,
        allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, sampling_mode=args.sampling_mode,
    )


def _api_key(flag: str | None) -> str | None:
    """--api-key, else $EAGLESPEC_API_KEY, else None. An empty one is refused, not read as "no key":
    `--api-key "$KEY"` with KEY unset must not start a server without authentication."""
    from ..errors import EagleError

    if flag is not None:
        key, source, fix = flag, "--api-key", "leave --api-key out"
    else:
        key, source, fix = os.environ.get(API_KEY_ENV), f"${API_KEY_ENV}", f"unset {API_KEY_ENV}"
    if key is not None and not key.strip():
        raise EagleError(f"{source} is empty (an unset shell variable?): give a key, or {fix} to serve without one")
    return key


def cmd_serve(args) -> int:
    from ..cli.options import load_generator
    from ..errors import EagleError

    config = config_from_args(args)
    try:
        import uvicorn  # noqa: F401 (here for the message below; `server` uses it)

        from .app import create_app, server
    except ImportError as exc:
        raise EagleError(f"serving needs fastapi and uvicorn: pip install 'eaglespec[serve]' ({exc})") from exc
    if args.seed is not None:
        print("note: --seed is ignored by serve; requests pass their own seed", file=sys.stderr)
    gen = load_generator(args, max_batch=config.max_batch)  # the one-row steps are built or loaded here
    # and the batch buckets' (2, 4, ... up to --max-batch's) before the first request, not inside its step
    gen.warm_batches(config.max_batch, say=lambda line: print(f"[eaglespec] {line}", file=sys.stderr))
    app = create_app(gen, config)
    auth = "API key required" if config.api_key else "no API key"
    base = f"http://{config.host}:{config.port}"
    print(f"eaglespec: serving {app.state.model_name!r} on {base}/v1 ({auth}); chat page at {base}/", file=sys.stderr)
    server(app, host=config.host, port=config.port, log_level=args.log_level).run()
    return 0
