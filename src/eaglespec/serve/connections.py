"""What uvicorn does not bound on a connection: the time its request headers may take, and how
many connections are open at once. Both are enforced in the HTTP protocol (below the ASGI app,
which sees a request only once its headers are complete) by a subclass of uvicorn's h11 protocol.

- Header timeout: a connection must deliver a request's complete header block within
  `header_timeout` seconds of opening (or of its first byte, for a later request on a kept-alive
  connection), else it gets a 408 and is closed. Without it a client that sends half a header
  block holds its connection open for ever (uvicorn's own timeouts cover idle keep-alive and, with
  `Guard`, the body).
- Connection cap: beyond `max_connections` open connections, a new one gets a 503 at once and is
  closed, its request unread; the server keeps answering the connections it has.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .protocol import error_body

_LINGER_S = 1.0  # a refused connection is read and discarded this long, so that closing it does not reset the 503


def guarded_protocol(header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header timeout and a cap on open connections (pass it as
    `uvicorn.Config(http=...)`)."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport) -> None:
            if len(self.connections) >= max_connections:
                self._refuse(transport)
                return
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self._arm()  # part of a request's head has come: the rest must follow in time
            else:
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._refused:
                return
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(_response(408, f"the request headers did not arrive within {header_timeout:g} s "
                                                    "(--header-timeout)", "request_timeout"))
                self.transport.close()

        def _refuse(self, transport) -> None:
            self._refused, self.transport = True, transport
            transport.write(_response(503, f"server busy: {max_connections} connections are open "
                                           "(--max-connections); retry later", "too_many_connections", "server_error"))
            if transport.can_write_eof():
                transport.write_eof()
            self._header_timer = self.loop.call_later(_LINGER_S, transport.close)

    return GuardedH11Protocol


def _response(status: int, message: str, code: str, type_: str = "invalid_request_error") -> bytes:
    body = json.dumps(error_body(message, type_, None, code)).encode()
    phrase = {408: "Request Timeout", 503: "Service Unavailable"}[status]
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body
