"""The server's configuration: a frozen dataclass, validated once, from which the CLI is derived."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EagleError


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"            # bind address; anything but loopback exposes the model to the network
    port: int = 8000
    model_name: str | None = None      # the id clients pass as `model`; None = the target's name
    api_key: str | None = None         # when set, `Authorization: Bearer <key>` is required on every route but /health
    max_tokens: int = 1024             # upper bound on a request's max_tokens (the model's context bounds it too)
    default_max_tokens: int = 256      # max_tokens for a request that gives none (cut to the room left in the context)
    max_prompt_tokens: int | None = None  # longest prompt accepted, in tokens; None = the model's context - 1
    queue_timeout: float = 30.0        # seconds a request may wait for the worker before it gets a 503
    max_queue: int = 64                # requests waiting beyond this get a 503 at once
    # request defaults for the sampling fields a request omits (OpenAI's own default temperature is 1;
    # ours is greedy, the lossless showcase)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise EagleError(f"port must be in [0, 65535], got {self.port}")
        if self.max_tokens < 1 or self.default_max_tokens < 1:
            raise EagleError(f"max_tokens and default_max_tokens must be >= 1, got {self.max_tokens}, {self.default_max_tokens}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise EagleError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if not self.queue_timeout > 0:
            raise EagleError(f"queue_timeout must be > 0 seconds, got {self.queue_timeout}")
        if self.max_queue < 1:
            raise EagleError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.api_key is not None and not self.api_key.strip():
            raise EagleError("api_key must not be empty")
