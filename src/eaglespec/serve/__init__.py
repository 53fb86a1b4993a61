"""OpenAI-compatible HTTP server over the EAGLE generator (FastAPI + uvicorn).

Batch size 1: requests queue for one worker thread that owns the generator. Importing this package
imports no web framework; `create_app` (in `app.py`) does.
"""

from .config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def create_app(generator, config: ServeConfig | None = None):
    from .app import create_app as _create_app

    return _create_app(generator, config)
