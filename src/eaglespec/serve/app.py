"""The FastAPI app: OpenAI routes over the engine's queue, OpenAI-style JSON errors everywhere.

`create_app(generator, config)` builds it; tests pass a tiny in-process generator. One app per
generator: the app's worker is the only code that runs it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SamplingParams
from ..errors import EagleError
from .config import ServeConfig
from .engine import Delta, Done, Engine, Failed, Job, QueueFull, Started
from .protocol import ChatCompletionRequest, CompletionRequest, error_body, new_id, now, usage

_POLL_S = 0.25  # how often a waiting non-streaming request checks that its client is still there


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status)


def create_app(generator, config: ServeConfig | None = None) -> FastAPI:
    config = config or ServeConfig()
    model_name = config.model_name or generator.target.name
    if generator.target.tokenizer is None:
        raise EagleError("the server needs a target with a tokenizer")
    engine = Engine(generator, config.max_queue)
    context = generator.target.max_context
    max_prompt = min(config.max_prompt_tokens or context - 1, context - 1)

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    app = FastAPI(title="eaglespec", description="OpenAI-compatible server over EAGLE speculative decoding",
                  lifespan=lifespan)
    app.state.engine, app.state.config, app.state.model_name = engine, config, model_name

    # -- errors: OpenAI's JSON shape, 4xx for anything a client sent ----------------------------
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            return APIError(400, f"the body is not valid JSON: {err.get('msg')}", code="invalid_json").response()
        # the field named in OpenAI style: messages.0.content; drop pydantic's union-branch labels
        param = ".".join(x for x in loc if not _is_type_label(x)) or None
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        message = f"{param}: {msg}" if param else f"the body: {msg}"
        if not param and "json" not in request.headers.get("content-type", ""):
            message = "send the body as a JSON object with 'Content-Type: application/json'"
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None, code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if config.api_key is not None and request.url.path != "/health":
            header = request.headers.get("authorization", "")
            scheme, _, key = header.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip().encode(), config.api_key.encode()):
                return APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                                code="invalid_api_key").response()
        return await call_next(request)

    # -- routes ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        status = 200 if engine.alive else 503
        return JSONResponse({"status": "ok" if engine.alive else "worker stopped", "model": model_name,
                             "busy": engine.busy, "waiting": engine.waiting}, status_code=status)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(model_name, context)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        _check_model(name, model_name)
        return _model_card(model_name, context)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        _check_model(req.model, model_name)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = engine.encode(messages=messages)
        except Exception as exc:  # a template that refuses these roles, for example
            raise APIError(400, f"messages could not be rendered with the chat template: {exc}", "messages") from exc
        max_tokens = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        return await _complete(request, req, ids, max_tokens, param, "messages", chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        _check_model(req.model, model_name)
        if isinstance(req.prompt, str):
            ids = engine.encode(prompt=req.prompt, chat_template=False)
        else:
            ids = list(req.prompt)
            if any(not 0 <= t < generator.target.vocab_size for t in ids):
                raise APIError(400, f"prompt: token ids must be in [0, {generator.target.vocab_size})", "prompt")
        return await _complete(request, req, ids, req.max_tokens, "max_tokens", "prompt", chat=False)

    async def _complete(request: Request, req, ids: list[int], max_tokens: int | None, max_param: str,
                        prompt_param: str, chat: bool):
        n = len(ids)
        if n == 0:
            raise APIError(400, f"{prompt_param}: the prompt is empty", prompt_param)
        if n > max_prompt:
            raise APIError(400, f"{prompt_param}: the prompt has {n} tokens; this server accepts at most {max_prompt} "
                                f"(model context {context})", prompt_param, "context_length_exceeded")
        if max_tokens is None:
            max_tokens = min(config.default_max_tokens, config.max_tokens, context - n)
        elif max_tokens > config.max_tokens:
            raise APIError(400, f"{max_param}: {max_tokens} is more than this server's limit of {config.max_tokens}", max_param)
        elif n + max_tokens > context:
            raise APIError(400, f"{max_param}: the prompt ({n} tokens) plus {max_param} ({max_tokens}) exceeds the "
                                f"model's context of {context} tokens", max_param, "context_length_exceeded")
        try:
            sampling = SamplingParams(
                req.temperature if req.temperature is not None else config.temperature,
                req.top_p if req.top_p is not None else config.top_p,
                req.top_k if req.top_k is not None else config.top_k, req.seed)
        except EagleError as exc:
            raise APIError(400, str(exc), str(exc).split(" ", 1)[0]) from exc
        try:
            job = engine.submit(ids, max_tokens, sampling, req.stops())
        except QueueFull as exc:
            raise APIError(503, f"server busy: {exc}; retry later", code="queue_full", type_="server_error") from exc
        try:
            started = await _wait_start(request, job)
        except BaseException:
            job.cancel()
            raise
        if started is None:
            job.cancel()
            raise APIError(503, f"server busy: the request waited {config.queue_timeout:g} s for the model; retry later",
                           code="queue_timeout", type_="server_error")
        meta = {"id": new_id("chatcmpl" if chat else "cmpl"), "created": now(), "model": model_name,
                "object": "chat.completion" if chat else "text_completion"}
        extra = {"queue_s": round(started.queue_s, 4)}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_sse(job, meta, n, chat, include_usage, extra), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(request, job, meta, n, chat, extra)

    async def _wait_start(request: Request, job: Job) -> Started | None:
        """The Started event, or None after the queue timeout. A client that leaves while queued
        cancels its job."""
        deadline = time.monotonic() + config.queue_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=min(left, _POLL_S))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    raise APIError(499, "client closed the request", code="client_closed")
                continue
            if isinstance(event, Started):
                return event
            if isinstance(event, Failed):
                raise APIError(500, event.message, type_="server_error")

    async def _collect(request: Request, job: Job, meta: dict, n: int, chat: bool, extra: dict):
        parts: list[str] = []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), timeout=_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        raise APIError(499, "client closed the request", code="client_closed")
                    continue
                if isinstance(event, Delta):
                    parts.append(event.text)
                elif isinstance(event, Failed):
                    raise APIError(500, event.message, type_="server_error")
                elif isinstance(event, Done):
                    break
        finally:
            job.cancel()  # no-op once done; frees the worker if we leave early
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": event.finish_reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": event.finish_reason})
        return {**meta, "choices": [choice], "usage": usage(n, event.completion_tokens),
                "eaglespec": {**event.stats, **extra}}

    async def _sse(job: Job, meta: dict, n: int, chat: bool, include_usage: bool, extra: dict) -> AsyncIterator[str]:
        meta = {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(delta: str | None, finish: str | None = None, role: bool = False, **more) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return _event({**meta, "choices": [choice], **more})

        try:
            if chat:
                yield chunk(None, role=True)
            while True:
                event = await job.events.get()
                if isinstance(event, Delta):
                    yield chunk(event.text)
                elif isinstance(event, Failed):
                    yield _event(error_body(event.message, "server_error"))
                    break
                elif isinstance(event, Done):
                    yield chunk(None, event.finish_reason, eaglespec={**event.stats, **extra})
                    if include_usage:
                        yield _event({**meta, "choices": [], "usage": usage(n, event.completion_tokens)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # the client went away mid-stream (or we are done): free the worker

    return app


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}", "model", "model_not_found")


def _model_card(name: str, context: int) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "eaglespec", "max_model_len": context}


def _is_type_label(part: str) -> bool:
    """pydantic names union branches in error locations ('str', 'list[int]', 'function-after[...]')."""
    return part in ("str", "int", "float", "bool", "list", "dict") or "[" in part or part.startswith("function-")
