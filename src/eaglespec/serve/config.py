"""The server's configuration: a frozen dataclass, validated once, from which the CLI is derived."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import EagleError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"            # bind address; anything but loopback exposes the model to the network
    port: int = 8000
    model_name: str | None = None      # the id clients pass as `model`; None = the target's name
    api_key: str | None = None         # when set, `Authorization: Bearer <key>` is required on every route but /health
    max_tokens: int = 1024             # upper bound on a request's max_tokens (the model's context bounds it too)
    default_max_tokens: int = 256      # max_tokens for a request that gives none (cut to the room left in the context)
    max_prompt_tokens: int | None = None  # longest prompt accepted, in tokens; None = the model's context - 1
    queue_timeout: float = 600.0       # seconds a request may wait for a place in the batch before a 503 (the openai client waits 600)
    max_queue: int = 64                # requests waiting beyond this get a 503 at once
    max_batch: int = 16                # sequences decoded together (continuous batching); see docs/serving.md
    max_body_bytes: int = 4 * 2**20    # a request body beyond this gets a 413 (checked while it is read)
    read_timeout: float = 30.0         # seconds a client may take to send a request body; then a 408
    header_timeout: float = 10.0       # seconds a connection may take to send a request's headers; then a 408 and close
    max_connections: int = 256         # open connections beyond this get a 503 and are closed at once
    shutdown_timeout: float = 5.0      # on shutdown, seconds running requests may take to finish; then they fail
    # Host header names answered (against DNS rebinding); "*" = any. None = the loopback names and the
    # bind host when bound to loopback, any host otherwise.
    allowed_hosts: tuple[str, ...] | None = None
    # request defaults for the sampling fields a request omits (OpenAI's own default temperature is 1;
    # ours is greedy, the lossless showcase)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    sampling_mode: str | None = None  # SamplingParams.mode for a request that gives none; None: the generator's
                                      # default (reproducible; speculative under --allow-inexact)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise EagleError(f"port must be in [0, 65535], got {self.port}")
        if self.max_tokens < 1 or self.default_max_tokens < 1:
            raise EagleError(f"max_tokens and default_max_tokens must be >= 1, got {self.max_tokens}, {self.default_max_tokens}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise EagleError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        for name in ("queue_timeout", "read_timeout", "header_timeout", "shutdown_timeout"):
            if not getattr(self, name) > 0:
                raise EagleError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_queue < 1:
            raise EagleError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.max_connections < 1:
            raise EagleError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.max_batch < 1:
            raise EagleError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_body_bytes < 1024:
            raise EagleError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.api_key is not None and not self.api_key.strip():
            raise EagleError("api_key is empty (an unset shell variable?): give a key, or none to serve without one")
        if self.allowed_hosts is not None and not all(h.strip() for h in self.allowed_hosts):
            raise EagleError(f"allowed_hosts must be host names, got {self.allowed_hosts}")

    def trusted_hosts(self) -> frozenset[str] | None:
        """The Host header names (lower case, no port) the server answers; None = any."""
        if self.allowed_hosts is None:
            return frozenset({*LOOPBACK_NAMES, self.host.lower()}) if _is_loopback(self.host) else None
        if "*" in self.allowed_hosts:
            return None
        return frozenset(h.strip().lower().strip("[]") for h in self.allowed_hosts)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"
