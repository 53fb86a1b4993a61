"""The FastAPI app: OpenAI routes over the engine's queue, OpenAI-style JSON errors everywhere.

`create_app(generator, config)` builds it; tests pass a tiny in-process generator. One app per
generator: the app's worker is the only code that runs it. `server(app, ...)` wraps it in a
uvicorn server whose shutdown is bounded (`drain`).

Prompts are tokenized off the event loop (a long one must not stall other clients), after a check
that refuses a text too long to fit whatever the tokenizer does (`prompts.max_token_bytes`), and
only as far as the context (`Engine.encode`). A list of prompts on /v1/completions is one job per
prompt in the running batch, answered as one choice each.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.config import SamplingParams
from ..engine.prompts import max_token_bytes
from ..errors import EagleError
from .config import ServeConfig
from .engine import Delta, Done, Engine, Failed, Job, PromptTooLong, QueueFull, Started
from .guard import Guard
from .origin import tree_label, whole_tokens
from .page import add_page
from .protocol import MIN_TEMPERATURE, ChatCompletionRequest, CompletionRequest, error_body, new_id, now, usage

_POLL_S = 0.25  # a request waiting for events checks at least this often that its client is still there
_KEEP_ALIVE_S = 5  # uvicorn closes a keep-alive connection idle this long
_FLUSH_S = 1.0  # after the drain, how long uvicorn may take to send the last responses
SHUTTING_DOWN = "the server is shutting down"


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
    engine = Engine(generator, config.max_queue, config.max_batch)
    context = generator.target.max_context
    max_prompt = min(config.max_prompt_tokens or context - 1, context - 1)
    max_prompt_bytes = max_prompt * max_token_bytes(generator.target.tokenizer)
    jobs: dict[int, Job] = {}  # submitted, not yet finished with: failed at shutdown
    running: set[int] = set()  # those of them the worker has taken

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    app = FastAPI(title="eaglespec", description="OpenAI-compatible server over EAGLE speculative decoding",
                  lifespan=lifespan)
    app.add_middleware(Guard, config=config)
    app.state.engine, app.state.config, app.state.model_name = engine, config, model_name
    app.state.jobs, app.state.draining = jobs, False

    # -- errors: OpenAI's JSON shape, 4xx for anything a client sent ----------------------------
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        err = _most_specific(exc.errors()) or {"msg": "invalid request", "loc": ()}
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

    # -- routes ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        status = "shutting down" if app.state.draining else "ok" if engine.alive else "worker stopped"
        return JSONResponse({"status": status, "model": model_name, "busy": engine.busy, "waiting": engine.waiting},
                            status_code=200 if status == "ok" else 503)

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
        _check_size([m["content"] for m in messages], "messages")
        try:
            ids = await asyncio.to_thread(engine.encode, messages, True, max_prompt)
        except PromptTooLong as exc:
            raise _too_long(exc.tokens, "messages") from exc
        except Exception as exc:  # a template that refuses these roles, for example
            raise APIError(400, f"messages could not be rendered with the chat template: {exc}", "messages") from exc
        max_tokens = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        return await _complete(request, req, [ids], max_tokens, param, "messages", chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        _check_model(req.model, model_name)
        prompts = req.prompts()
        limit = min(config.max_queue, config.max_batch)  # all of a list decode together, in one batch
        if len(prompts) > limit:
            raise APIError(400, f"prompt: {len(prompts)} prompts; this server decodes at most {limit} in one request "
                                f"(--max-batch {config.max_batch}, --max-queue {config.max_queue}): split the list",
                           "prompt")
        params = [f"prompt.{i}" if len(prompts) > 1 else "prompt" for i in range(len(prompts))]
        for prompt, param in zip(prompts, params):
            if isinstance(prompt, str):
                _check_size([prompt], param)
        all_ids = []
        for prompt, param in zip(prompts, params):
            if isinstance(prompt, str):  # plain text: special-token strings in it are not parsed
                try:
                    ids = await asyncio.to_thread(engine.encode, [{"role": "user", "content": prompt}], False, max_prompt)
                except PromptTooLong as exc:
                    raise _too_long(exc.tokens, param) from exc
            else:
                ids = list(prompt)
                if any(not 0 <= t < generator.target.vocab_size for t in ids):
                    raise APIError(400, f"{param}: token ids must be in [0, {generator.target.vocab_size})", param)
            all_ids.append(ids)
        return await _complete(request, req, all_ids, req.max_tokens, "max_tokens", params, chat=False)

    def _check_size(texts: list[str], param: str) -> None:
        """Refuse before tokenizing a text that cannot fit in max_prompt tokens, whatever the tokenizer."""
        size = sum(len(t.encode()) for t in texts)
        if size > max_prompt_bytes:
            raise APIError(400, f"{param}: the prompt is {size} bytes of text, more than {max_prompt} tokens can hold; "
                                f"this server accepts at most {max_prompt} tokens (model context {context})",
                           param, "context_length_exceeded")

    def _too_long(n: int, param: str, at_least: bool = True) -> APIError:
        return APIError(400, f"{param}: the prompt has {'at least ' if at_least else ''}{n} tokens; this server accepts "
                             f"at most {max_prompt} (model context {context})", param, "context_length_exceeded")

    def _room(n: int, max_tokens: int | None, max_param: str, prompt_param: str) -> int:
        """The max_tokens for a prompt of n tokens, or a 400."""
        if n == 0:
            raise APIError(400, f"{prompt_param}: the prompt is empty", prompt_param)
        if n > max_prompt:
            raise _too_long(n, prompt_param, at_least=False)
        if max_tokens is None:
            return min(config.default_max_tokens, config.max_tokens, context - n)
        if max_tokens > config.max_tokens:
            raise APIError(400, f"{max_param}: {max_tokens} is more than this server's limit of {config.max_tokens}", max_param)
        if n + max_tokens > context:
            raise APIError(400, f"{max_param}: the prompt ({n} tokens) plus {max_param} ({max_tokens}) exceeds the "
                                f"model's context of {context} tokens", max_param, "context_length_exceeded")
        return max_tokens

    async def _complete(request: Request, req, prompts: list[list[int]], max_tokens: int | None, max_param: str,
                        prompt_params: str | list[str], chat: bool):
        """Decode the prompts together (one job each, in the running batch) and answer one choice a
        prompt, its `index` the prompt's place in the list."""
        if isinstance(prompt_params, str):
            prompt_params = [prompt_params] * len(prompts)
        budgets = [_room(len(ids), max_tokens, max_param, p) for ids, p in zip(prompts, prompt_params)]
        temperature = req.temperature if req.temperature is not None else config.temperature
        try:
            sampling = SamplingParams(
                0.0 if temperature < MIN_TEMPERATURE else temperature,  # logits / 1e-39 overflow: serve it greedy
                req.top_p if req.top_p is not None else config.top_p,
                req.top_k_or_off() if req.top_k is not None else config.top_k, req.seed,
                req.sampling_mode or config.sampling_mode or generator.default_sampling_mode)
            generator.check_sampling(sampling)
        except EagleError as exc:
            raise APIError(400, str(exc), str(exc).split(" ", 1)[0]) from exc
        if app.state.draining:
            raise APIError(503, SHUTTING_DOWN, code="shutting_down", type_="server_error")
        batch: list[Job] = []
        try:
            ext = req.extension()
            for ids, budget in zip(prompts, budgets):
                batch.append(engine.submit(ids, budget, sampling, req.stops(), ext.speculative, ext.token_origin))
                jobs[id(batch[-1])] = batch[-1]
        except QueueFull as exc:
            for job in batch:
                _release(job)
            raise APIError(503, f"server busy: {exc}; retry later", code="queue_full", type_="server_error") from exc
        try:
            deadline = time.monotonic() + config.queue_timeout
            starts = [await _wait_start(request, job, deadline) for job in batch]
        except BaseException:
            for job in batch:
                _release(job)
            raise
        if any(started is None for started in starts):
            for job in batch:
                _release(job)
            raise APIError(503, f"server busy: the request waited {config.queue_timeout:g} s for the model; retry later",
                           code="queue_timeout", type_="server_error")
        meta = {"id": new_id("chatcmpl" if chat else "cmpl"), "created": now(), "model": model_name,
                "object": "chat.completion" if chat else "text_completion"}
        extras = [{"queue_s": round(started.queue_s, 4)} for started in starts]
        n = sum(len(ids) for ids in prompts)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_sse(batch, meta, n, chat, include_usage, extras), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(request, batch, meta, n, chat, extras)

    async def _next_event(request: Request, job: Job, timeout: float = _POLL_S):
        """The job's next event, or None after `timeout` s. Raises a 499 once the client has gone,
        checked on every call: a steady flow of events must not hide a disconnect."""
        try:
            event = await asyncio.wait_for(job.events.get(), timeout=timeout)
        except asyncio.TimeoutError:
            event = None
        if await request.is_disconnected():
            raise APIError(499, "client closed the request", code="client_closed")
        return event

    async def _wait_start(request: Request, job: Job, deadline: float) -> Started | None:
        """The Started event, or None once the deadline has passed."""
        while (left := deadline - time.monotonic()) > 0:
            event = await _next_event(request, job, min(left, _POLL_S))
            if isinstance(event, Started):
                running.add(id(job))
                return event
            if isinstance(event, Failed):
                raise _failure(event)
        return None

    async def _collect(request: Request, batch: list[Job], meta: dict, n: int, chat: bool, extras: list[dict]):
        choices, stats, completion_tokens = [], [], 0
        try:
            for index, job in enumerate(batch):  # one after the other: the others' events wait in their queues
                parts: list[str] = []
                spans, steps = [], []
                while not isinstance(event := await _next_event(request, job), Done):
                    if isinstance(event, Delta):
                        parts.append(event.text)
                        if event.origin is not None:
                            spans += event.origin["tokens"]
                            steps += event.origin["steps"]
                    elif isinstance(event, Failed):
                        raise _failure(event)
                text = "".join(parts)
                choices.append({"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                "finish_reason": event.finish_reason} if chat else
                               {"index": index, "text": text, "logprobs": None, "finish_reason": event.finish_reason})
                extra = extras[index]
                if job.token_origin:
                    extra = {**extra, "tree": tree_label(generator, job.speculative), "tokens": whole_tokens(spans),
                             "steps": steps}
                stats.append({**event.stats, **extra})
                completion_tokens += event.completion_tokens
        finally:
            for job in batch:
                _release(job)  # frees the worker if we leave early
        if len(batch) > 1:
            for choice, s in zip(choices, stats):
                choice["eaglespec"] = s
        return {**meta, "choices": choices, "usage": usage(n, completion_tokens), "eaglespec": _merged_stats(stats, completion_tokens)}

    async def _sse(batch: list[Job], meta: dict, n: int, chat: bool, include_usage: bool,
                   extras: list[dict]) -> AsyncIterator[str]:
        meta = {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(index: int, delta: str | None, finish: str | None = None, role: bool = False, **more) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
                choice = {"index": index, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": index, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return _event({**meta, "choices": [choice], **more})

        # with token_origin the first chunk names the tree and every step's chunk carries its tokens' origins
        first = batch[0]
        head = {"eaglespec": {"tree": tree_label(generator, first.speculative)}} if first.token_origin else {}
        completion_tokens = 0
        try:
            if chat or head:
                yield chunk(0, None, role=chat, **head)
            async for index, event in _events(batch):
                if isinstance(event, Delta):
                    yield chunk(index, event.text, **({} if event.origin is None else {"eaglespec": event.origin}))
                elif isinstance(event, Failed):
                    err = _failure(event)
                    yield _event(error_body(err.message, err.type, None, err.code))
                    break
                elif isinstance(event, Done):
                    completion_tokens += event.completion_tokens
                    yield chunk(index, None, event.finish_reason, eaglespec={**event.stats, **extras[index]})
            else:
                if include_usage:
                    yield _event({**meta, "choices": [], "usage": usage(n, completion_tokens)})
            yield "data: [DONE]\n\n"
        finally:
            for job in batch:
                _release(job)  # the client went away mid-stream (or we are done): free the worker

    def _release(job: Job) -> None:
        engine.cancel(job)  # a no-op once the job is done
        jobs.pop(id(job), None)
        running.discard(id(job))

    def _failure(event: Failed) -> APIError:
        if app.state.draining:
            return APIError(503, event.message, code="shutting_down", type_="server_error")
        return APIError(500, event.message, type_="server_error")

    async def drain(give_up: Callable[[], bool] = lambda: False) -> None:
        """Shutdown: refuse new requests and fail the queued ones at once (a 503, or an error event
        in a stream); give the running ones `shutdown_timeout` seconds, then fail them too."""
        app.state.draining = True
        deadline = time.monotonic() + config.shutdown_timeout
        while True:
            for key, job in list(jobs.items()):
                if key not in running or time.monotonic() >= deadline or give_up():
                    job.emit(Failed(SHUTTING_DOWN))
                    _release(job)
            if not jobs:
                return
            await asyncio.sleep(0.05)

    app.state.drain = drain
    add_page(app)
    return app


def server(app: FastAPI, **uvicorn_config):
    """A uvicorn server for `app` (keyword arguments go to `uvicorn.Config`) whose shutdown is
    bounded: `drain` first (at most `shutdown_timeout` s; a second Ctrl-C cuts it short), then
    uvicorn closes the connections, waiting at most _FLUSH_S s more. Its connections have the
    header timeout and the cap of `connections.py`."""
    import uvicorn

    from .connections import guarded_protocol

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            await app.state.drain(lambda: self.force_exit)
            await super().shutdown(sockets)

    config = app.state.config
    options = {"timeout_keep_alive": _KEEP_ALIVE_S, "timeout_graceful_shutdown": _FLUSH_S,
               "http": guarded_protocol(config.header_timeout, config.max_connections), **uvicorn_config}
    return _Server(uvicorn.Config(app, **options))


async def _events(batch: list[Job]) -> AsyncIterator[tuple[int, object]]:
    """(index, event) for the jobs' events as they come, until each has sent Done or Failed."""
    pending = {asyncio.ensure_future(job.events.get()): i for i, job in enumerate(batch)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.get):
                index = pending.pop(future)
                event = future.result()
                if not isinstance(event, (Done, Failed)):
                    pending[asyncio.ensure_future(batch[index].events.get())] = index
                yield index, event
    finally:
        for future in pending:
            future.cancel()


def _merged_stats(stats: list[dict], completion_tokens: int) -> dict:
    """One request's `eaglespec` field from its choices' statistics (the one choice's, unchanged)."""
    if len(stats) == 1:
        return stats[0]
    lengths = [n for s in stats for n in s["accepted_lengths"]]
    elapsed = max(s["elapsed_s"] for s in stats)
    return {"target_forwards": sum(s["target_forwards"] for s in stats),
            "tau": round(sum(lengths) / len(lengths), 4) if lengths else 0.0, "accepted_lengths": lengths,
            "accepted_draft_tokens": sum(s["accepted_draft_tokens"] for s in stats),
            "speculative": stats[0]["speculative"], "elapsed_s": elapsed,
            "tokens_per_second": round(completion_tokens / elapsed, 2) if elapsed else 0.0,
            "queue_s": max(s["queue_s"] for s in stats)}


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}", "model", "model_not_found")


def _model_card(name: str, context: int) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "eaglespec", "max_model_len": context}


def _most_specific(errors: list[dict]) -> dict | None:
    """Of pydantic's errors (one per union branch tried), the one most likely to help: our own
    validators' messages first, then the deepest location."""
    def depth(err: dict) -> int:
        return sum(not _is_type_label(str(x)) for x in err.get("loc", ()))

    return max(errors, key=lambda e: (e.get("type") == "value_error", depth(e)), default=None)


def _is_type_label(part: str) -> bool:
    """pydantic names union branches in error locations ('str', 'list[int]', 'function-after[...]')."""
    return part in ("str", "int", "float", "bool", "list", "dict") or "[" in part or part.startswith("function-")
