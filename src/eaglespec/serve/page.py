"""The chat page at `/`: plain HTML, CSS and JavaScript shipped in the package (serve/static/), read
once when the app is built and served as they are. The page talks to this server's own /v1 routes,
asking for the per-token origins through the `eaglespec` request extension (serve/origin.py).

The page holds no data and a browser cannot send an API key with a page load, so the guard lets
these paths through without a key (the Host check still applies); the page asks for the key and
sends it with every API call. Its Content-Security-Policy allows only its own script and style, a
second line behind the page's rule of never parsing reply text as HTML (textContent only).
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

FILES = {  # path -> (file in static/, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/static/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
PAGE_PATHS = frozenset(FILES)
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_page(app: FastAPI) -> None:
    static = resources.files(__package__).joinpath("static")
    for path, (name, media_type) in FILES.items():
        app.add_api_route(path, _file(static.joinpath(name).read_bytes(), media_type), methods=["GET"],
                          include_in_schema=False)


def _file(body: bytes, media_type: str):
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve
