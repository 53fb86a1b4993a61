"""OpenAI request and response shapes (the subset served), as pydantic models, and the
OpenAI-style error body. Fields OpenAI defines but this server does not use are ignored; fields it
cannot honour (n > 1, logprobs, tools, a JSON response format, ...) are refused unless they carry
their no-op value. Every string must be valid Unicode (JSON lets a lone surrogate through)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationInfo,
                      field_validator)

MAX_STOP = 4  # OpenAI's limit on stop sequences
SEED_RANGE = (-2**63, 2**64)  # what torch.Generator.manual_seed accepts (a negative seed wraps around)
MIN_TEMPERATURE = 1e-5  # below this, logits / temperature overflow float32: such a request is served greedy


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}") from None
    return text


Text = Annotated[StrictStr, AfterValidator(_unicode)]


class ContentPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart]
    name: Text | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class Extension(BaseModel):
    """The request's own `eaglespec` object (not OpenAI's; docs/serving.md): off unless asked for."""
    model_config = ConfigDict(extra="forbid")

    token_origin: StrictBool = False  # each chunk says its tokens' origins (draft, bonus, recovered, target) and steps
    speculative: StrictBool = True    # false: decode this request without drafting (vanilla, for comparison)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    top_k: StrictInt | None = Field(default=None, ge=-1)  # not OpenAI's; as vLLM and SGLang, 0 or -1: off
    seed: StrictInt | None = None
    sampling_mode: Literal["speculative", "reproducible"] | None = None  # not OpenAI's; null = the server's --sampling-mode
    stop: Text | list[Text] | None = None
    stream: StrictBool | None = None  # null = false, as OpenAI
    stream_options: StreamOptions | None = None
    n: StrictInt | None = Field(default=None, ge=1, le=1)  # null = 1
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None  # vLLM's and SGLang's, as the five below
    min_p: Any = None
    min_tokens: Any = None
    ignore_eos: Any = None
    stop_token_ids: Any = None
    eaglespec: Extension | None = None  # null = the defaults, as for every optional field

    # fields this server cannot honour -> the values that ask for nothing, the only ones accepted
    # (a penalty would change which tokens are sampled: ignoring it would answer another request)
    UNSUPPORTED: ClassVar[dict[str, tuple]] = {
        "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
        "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0), "min_tokens": (None, 0),
        "ignore_eos": (None, False), "stop_token_ids": (None, [])}

    @field_validator("seed")
    @classmethod
    def _seed(cls, v):
        if v is not None and not SEED_RANGE[0] <= v < SEED_RANGE[1]:
            raise ValueError("must be an integer in [-2**63, 2**64)")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v, info: ValidationInfo):
        if v is not None and not info.data.get("stream"):  # as OpenAI and vLLM
            raise ValueError("only allowed when stream is true")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return [s for s in stops if s]

    @field_validator("*")
    @classmethod
    def _unsupported(cls, v, info: ValidationInfo):
        noops = cls.UNSUPPORTED.get(info.field_name)
        if noops is not None and not any(type(v) is type(x) and v == x for x in noops):
            allowed = " or ".join(json.dumps(x) for x in noops)
            raise ValueError(f"not supported by this server: omit it or send {allowed}")
        return v

    def stops(self) -> list[str]:
        return self.stop or []

    def top_k_or_off(self) -> int | None:
        """top_k with vLLM's and SGLang's -1 ("off") read as ours, 0."""
        return 0 if self.top_k == -1 else self.top_k

    def extension(self) -> Extension:
        return self.eaglespec or Extension()


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # the newer name for max_tokens
    logprobs: Any = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None      # the deprecated form of tools
    function_call: Any = None
    response_format: Any = None

    UNSUPPORTED = {**_Request.UNSUPPORTED, "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []),
                   "tool_choice": (None, "none", "auto"), "functions": (None, []), "function_call": (None, "none", "auto"),
                   "response_format": (None, {"type": "text"})}


class CompletionRequest(_Request):
    # a string or a list of token ids, or a list of either: several prompts, decoded together
    prompt: Text | list[StrictInt] | list[Text] | list[list[StrictInt]]
    logprobs: Any = None
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    UNSUPPORTED = {**_Request.UNSUPPORTED, "logprobs": (None,), "echo": (None, False), "best_of": (None, 1),
                   "suffix": (None, "")}

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v):
        prompts = _prompts(v)
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError("the prompt is empty" if len(prompts) == 1 else f"prompt.{i} is empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one, or each of a list of strings or of token-id lists."""
        return _prompts(self.prompt)


def _prompts(v) -> list:
    return v if isinstance(v, list) and v and isinstance(v[0], (str, list)) else [v]


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
