"""The checks every request passes before a route sees it, as one pure ASGI middleware: the Host
header against an allow-list (DNS rebinding), the API key, and the body, read whole under a size
limit and a time limit and then handed on.

Pure ASGI, not Starlette's BaseHTTPMiddleware: behind that, `request.is_disconnected()` never
turns true, and a non-streaming request whose client has gone would keep the model busy.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from .config import ServeConfig
from .page import PAGE_PATHS
from .protocol import error_body


class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.code, self.close = status, message, code, close


class Guard:
    def __init__(self, app, config: ServeConfig):
        self.app, self.config = app, config
        self.hosts = config.trusted_hosts()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self._check_host(headers.get("host", ""))
            self._check_key(scope["path"], headers.get("authorization", ""))
            body = await self._read_body(headers, receive)
        except _Refused as r:
            response = JSONResponse(error_body(r.message, "invalid_request_error", None, r.code), status_code=r.status,
                                    headers={"Connection": "close"} if r.close else None)
            await response(scope, receive, send)
            return
        if body is not None:  # None: the client left while sending it
            await self.app(scope, _replay(body, receive), send)

    def _check_host(self, host: str) -> None:
        if self.hosts is not None and _hostname(host) not in self.hosts:
            raise _Refused(400, f"the Host header {host!r} is not allowed: this server answers to "
                                f"{', '.join(sorted(self.hosts))} (add names with --allowed-host)", "invalid_host")

    def _check_key(self, path: str, header: str) -> None:
        key = self.config.api_key
        if key is None or path == "/health" or (path in PAGE_PATHS and not header):
            return  # the chat page holds no data and a page load cannot carry the key: it asks for it
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), key.encode()):
            raise _Refused(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", "invalid_api_key")

    async def _read_body(self, headers: Headers, receive) -> bytes | None:
        limit, timeout = self.config.max_body_bytes, self.config.read_timeout
        too_large = _Refused(413, f"the request body is larger than this server's limit of {limit} bytes "
                                  "(--max-body-bytes)", "body_too_large", close=True)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        deadline = time.monotonic() + timeout
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except asyncio.TimeoutError:
                raise _Refused(408, f"the request body did not arrive within {timeout:g} s (--read-timeout)",
                               "request_timeout", close=True) from None
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:  # a chunked body, or one longer than its Content-Length says
                raise too_large
            more = message.get("more_body", False)
        return b"".join(chunks)


def _replay(body: bytes, receive):
    """The body read, once, then the server's own receive (so disconnects still reach the route)."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _hostname(host: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")
