"""Load: 32 concurrent clients (plain, streaming, and streaming ones that hang up midway) against
one live server. Every request completes or fails cleanly, the server stays healthy, and the
greedy outputs equal those of the same requests sent one at a time."""

import asyncio
import json

import httpx
from serve_helpers import live_server, one_torch_thread  # noqa: F401 (autouse fixture)
from tiny_tokenizer import tiny_chat_generator

from eaglespec.serve import ServeConfig, create_app

N = 32


def request(i: int) -> tuple[str, dict, str]:
    """-> (path, body, kind) with kind in plain | stream | cancel."""
    kind = ("plain", "stream", "cancel", "stream")[i % 4]
    body = {"max_tokens": 6 + i % 5, "stream": kind != "plain"}
    if i % 3 == 0:
        return "/v1/completions", {**body, "prompt": f"Story number {i}:"}, kind
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": f"Question {i}?"}]}, kind


def delta_text(chunk: dict) -> str:
    choice = chunk["choices"][0]
    return choice.get("text") or choice.get("delta", {}).get("content") or ""


async def send(http: httpx.AsyncClient, i: int, hang_up: bool) -> tuple[str, str | None]:
    """-> (kind, text or None for a stream it hung up on)."""
    path, body, kind = request(i)
    if not body["stream"]:
        r = await http.post(path, json=body)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return kind, choice.get("text", choice.get("message", {}).get("content"))
    parts = []
    async with http.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return kind, "".join(parts)
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                parts.append(delta_text(chunk))
            if hang_up and kind == "cancel" and len(parts) >= 2:
                return kind, None  # leaving the `async with` closes the connection mid-stream
    raise AssertionError(f"request {i}: the stream ended without [DONE]")


async def run_all(url: str, indices, concurrent: bool) -> list:
    limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        if concurrent:
            return await asyncio.gather(*(send(http, i, True) for i in indices), return_exceptions=True)
        return [await send(http, i, False) for i in indices]


def test_32_concurrent_requests():
    gen = tiny_chat_generator()
    app = create_app(gen, ServeConfig(max_tokens=16, queue_timeout=120, max_queue=N))
    with live_server(app) as url:
        together = asyncio.run(run_all(url, range(N), concurrent=True))  # "cancel" ones hang up midway
        errors = [r for r in together if isinstance(r, BaseException)]
        assert not errors, errors
        health = httpx.get(url + "/health").json()
        assert health["status"] == "ok"

        alone = asyncio.run(run_all(url, range(N), concurrent=False))  # every one to the end
        for i, ((kind, text), (_, ref)) in enumerate(zip(together, alone)):
            assert ref, f"request {i} produced nothing alone"
            if kind == "cancel":
                assert text is None
            else:
                assert text == ref, f"request {i} ({kind}) differs under load"
        # and one request alone equals the engine's own greedy output
        path, body, _ = request(1)
        assert alone[1][1] == gen.generate(messages=body["messages"], max_new_tokens=body["max_tokens"]).text
        assert app.state.engine.waiting == 0 and not app.state.engine.busy

