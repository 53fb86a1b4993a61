"""The server's load test: many concurrent `openai` clients, mixed streaming / non-streaming and
chat / completions, greedy; then every request again alone, to check that each text under load
equals the text of the same request by itself. Reports errors, mismatches, p50 / p95 latency
and throughput.

    python -m eaglespec.serve.loadtest                       # in-process server on the default model
    python -m eaglespec.serve.loadtest --max-batch 1 --queue-timeout 30   # one request at a time
    python -m eaglespec.serve.loadtest --url http://host:8000  # a server already running

The report adds the peak resident memory under the load (`peak_rss_mb`, reset when the load
begins, so that start-up's compiling does not count; `peak_rss_since` says so): of this process
with the in-process server (the server and its clients, the clients' share being a few tens of
MB), or, with `--url`, of the server process named by `--server-pid` on this machine. The
in-process server builds its compiled batch steps (up to `--max-batch`) before the load, as
`eaglespec serve` does.

The CI test (tests/test_serve_load.py) runs `run` on the default model with default settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from ..errors import EagleError
from ..memory import peak_rss_mb, reset_peak_rss

TOPICS = ["a river", "the moon", "bread", "a violin", "winter", "a lighthouse", "chess", "honey", "a bicycle",
          "thunder", "a library", "coffee", "a volcano", "silk", "a compass", "rain"]


@dataclass(frozen=True)
class Request:
    index: int
    chat: bool
    stream: bool
    text: str


def requests(clients: int, per_client: int) -> list[Request]:
    """Request i: chat or completion, streaming or not, alternating so every mix occurs."""
    out = []
    for i in range(clients * per_client):
        topic = TOPICS[i % len(TOPICS)]
        chat, stream = (i // 2) % 2 == 0, i % 2 == 1
        text = f"In one sentence, what is {topic}? ({i})" if chat else f"A short fact about {topic} (note {i}):"
        out.append(Request(i, chat, stream, text))
    return out


@dataclass
class Outcome:
    index: int
    text: str | None = None
    latency: float = 0.0
    tokens: int = 0
    error: str | None = None


_USAGE = {"stream_options": {"include_usage": True}}  # a stream's last chunk counts its tokens


async def _one(client, model: str, req: Request, max_tokens: int) -> Outcome:
    start = time.perf_counter()
    try:
        if req.chat:
            kwargs = dict(model=model, messages=[{"role": "user", "content": req.text}], max_tokens=max_tokens,
                          temperature=0)
            if req.stream:
                parts, tokens = [], 0
                async for chunk in await client.chat.completions.create(stream=True, **kwargs, **_USAGE):
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                    tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                text = "".join(parts)
            else:
                r = await client.chat.completions.create(**kwargs)
                text, tokens = r.choices[0].message.content, r.usage.completion_tokens
        else:
            kwargs = dict(model=model, prompt=req.text, max_tokens=max_tokens, temperature=0)
            if req.stream:
                parts, tokens = [], 0
                async for chunk in await client.completions.create(stream=True, **kwargs, **_USAGE):
                    if chunk.choices:
                        parts.append(chunk.choices[0].text)
                    tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                text = "".join(parts)
            else:
                r = await client.completions.create(**kwargs)
                text, tokens = r.choices[0].text, r.usage.completion_tokens
    except Exception as exc:  # every failure is counted, none stops the test
        return Outcome(req.index, error=f"{type(exc).__name__}: {exc}", latency=time.perf_counter() - start)
    return Outcome(req.index, text, time.perf_counter() - start, tokens)


async def _all(url: str, reqs: list[Request], max_tokens: int, concurrent: bool, timeout: float) -> list[Outcome]:
    import httpx
    import openai

    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=len(reqs) + 4), timeout=timeout)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", http_client=http, max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        if concurrent:
            return list(await asyncio.gather(*(_one(client, model, r, max_tokens) for r in reqs)))
        return [await _one(client, model, r, max_tokens) for r in reqs]


@dataclass(frozen=True)
class Report:
    requests: int
    errors: int
    mismatches: int
    p50_s: float
    p95_s: float
    wall_s: float
    tokens_per_s: float  # completion tokens of every request under load / its wall time
    first_error: str | None
    peak_rss_mb: int | None = None  # set by main: see the module's docstring
    peak_rss_since: str | None = None  # "the load" (reset before it) or "the start"


def run(url: str, clients: int = 32, per_client: int = 2, max_tokens: int = 16, timeout: float = 600) -> Report:
    """The load, then each request alone; -> the report."""
    reqs = requests(clients, per_client)
    start = time.perf_counter()
    loaded = asyncio.run(_all(url, reqs, max_tokens, concurrent=True, timeout=timeout))
    wall = time.perf_counter() - start
    alone = asyncio.run(_all(url, reqs, max_tokens, concurrent=False, timeout=timeout))
    errors = [o for o in loaded + alone if o.error]
    mismatches = sum(1 for a, b in zip(loaded, alone) if not a.error and not b.error and a.text != b.text)
    latencies = sorted(o.latency for o in loaded if not o.error) or [0.0]
    tokens = sum(o.tokens for o in loaded if not o.error)
    return Report(len(reqs), len(errors), mismatches, statistics.median(latencies),
                  latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], wall, tokens / wall,
                  errors[0].error if errors else None)


@contextmanager
def serve_in_thread(app, host: str = "127.0.0.1"):
    """A live uvicorn server on a free loopback port, in a thread, as `eaglespec serve` runs it
    (`app.server`: bounded shutdown, header timeout, connection cap); yields its base URL."""
    from .app import server as app_server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = app_server(app, log_level="warning", timeout_graceful_shutdown=2)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eaglespec.serve.loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start one in-process)")
    p.add_argument("--server-pid", type=int, default=None,
                   help="with --url: the server's pid on this machine, to report its peak resident memory")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=None, help="in-process server: --max-batch (default: its default)")
    p.add_argument("--queue-timeout", type=float, default=None, help="in-process server: --queue-timeout")
    p.add_argument("--target", default=None)
    p.add_argument("--head", default="default")
    p.add_argument("--tree", default="auto")
    p.add_argument("--compile", default=None, choices=("auto", "on", "off"),
                   help="in-process server: the decoding path (default: $EAGLESPEC_COMPILE, else auto)")
    args = p.parse_args(argv)
    if args.server_pid is not None and not args.url:
        raise SystemExit("--server-pid names a running server's process: give its --url too")
    if args.server_pid is not None:
        try:  # now, not after minutes of load
            peak_rss_mb(args.server_pid)
        except EagleError as exc:
            raise SystemExit(f"--server-pid {args.server_pid}: {exc}; pass the pid of the running "
                             "`eaglespec serve`, or leave --server-pid out") from exc
    if args.url:
        reset = args.server_pid is not None and reset_peak_rss(args.server_pid)
        report = run(args.url, args.clients, args.requests, args.max_tokens)
        if args.server_pid is not None:
            try:
                report = replace(report, peak_rss_mb=peak_rss_mb(args.server_pid),
                                 peak_rss_since="the load" if reset else "the start")
            except EagleError as exc:  # the server went away during the load: the report stands
                print(f"[loadtest] no peak memory: {exc}", file=sys.stderr)
    else:
        from ..engine.decoding import EagleGenerator
        from .app import create_app
        from .config import ServeConfig

        given = {"max_batch": args.max_batch, "queue_timeout": args.queue_timeout}
        config = ServeConfig(**{k: v for k, v in given.items() if v is not None})
        gen = EagleGenerator.from_pretrained(args.target, None if args.head == "none" else args.head, args.tree,
                                             max_batch=config.max_batch, compile=args.compile)
        print(f"[loadtest] decoding step: {gen.compile_note}", file=sys.stderr)
        gen.warm_batches(config.max_batch, say=lambda line: print(f"[loadtest] {line}", file=sys.stderr))
        with serve_in_thread(create_app(gen, config)) as url:
            reset = reset_peak_rss()
            report = run(url, args.clients, args.requests, args.max_tokens)
        report = replace(report, peak_rss_mb=peak_rss_mb(), peak_rss_since="the load" if reset else "the start")
    print(json.dumps(asdict(report), indent=1))
    return 0 if report.errors == 0 and report.mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
