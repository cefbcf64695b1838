"""OpenAI's request and response formats: parsing and checking a request body, the response and stream chunks, and
the error object ``{"error": {"message", "type", "param", "code"}}``.

Supported: ``model`` (the served name), ``prompt`` (text, token ids, or a list holding one of them) or ``messages``
(through the tokenizer's chat template), ``max_tokens`` / ``max_completion_tokens``, ``temperature`` in [0, 2],
``top_p`` in (0, 1], ``top_k`` (an extension; 0 or -1 = all tokens), ``seed``, ``stop`` (strings), ``stop_token_ids``
and ``ignore_eos`` (extensions), ``n`` = 1, ``stream`` with ``stream_options.include_usage``. Features the engine does
not have (log probabilities, echo, suffix, penalties, logit bias, tools, structured output, ``n`` > 1) are refused
with a 400 naming the parameter; other keys are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from lumotree.errors import UsageError
from lumotree.generate import prompt_ids
from lumotree.optimized.engine import SamplingParams

__all__ = ["APIError", "ServedModel", "GenerationRequest", "parse_request", "response_body", "chunk_body",
           "usage_body", "FINISH_REASONS", "DEFAULT_COMPLETION_TOKENS"]

#: the engine's finish reasons as OpenAI's (a time limit ends the output as its length would)
FINISH_REASONS = {"stop": "stop", "max_new_tokens": "length", "length": "length", "timeout": "length"}
#: OpenAI's default ``max_tokens`` of a completion; a chat completion defaults to the rest of the context
DEFAULT_COMPLETION_TOKENS = 16
#: request keys of features the engine does not have (refused unless absent, null, false, zero or empty)
UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty", "logit_bias",
               "tools", "functions")
ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error response: HTTP ``status`` and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


@dataclass
class ServedModel:
    """The model as the API shows it: its name, tokenizer (None: prompts and outputs are token ids written as
    whitespace-separated numbers), vocabulary, context and the token ids that end a generation by default."""

    name: str
    tokenizer: Any
    vocab_size: int
    max_seq_len: int
    created: int
    eos_token_ids: tuple[int, ...] = ()

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, prompt: str | list[int], param: str) -> list[int]:
        try:
            return prompt_ids(prompt, self.tokenizer, self.vocab_size, self.max_seq_len, param)
        except UsageError as exc:
            code = "context_length_exceeded" if "context" in str(exc) else None
            raise invalid(param, str(exc), code) from None

    @property
    def chat_template(self) -> bool:
        return getattr(self.tokenizer, "chat_template", None) is not None


@dataclass
class GenerationRequest:
    """A checked request: prompt ids, sampling, stop strings, streaming."""

    prompt: list[int]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    chat: bool = False


# ------------------------------------------------------------------------------------------------------ values
def _integer(body: dict, key: str, minimum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise invalid(key, f"{key} = {value!r}: must be an integer")
    if minimum is not None and value < minimum:
        raise invalid(key, f"{key} = {value}: must be at least {minimum}")
    return int(value)


def _number(body: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise invalid(key, f"{key} = {value!r}: must be a number")
    if not ((low < value) if low_open else (low <= value)) or value > high:
        raise invalid(key, f"{key} = {value}: must lie in {'(' if low_open else '['}{low:g}, {high:g}]")
    return float(value)


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(key, f"{key} = {value!r}: must be true or false")
    return value


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise invalid("stop", "stop must be a non-empty string or a list of non-empty strings")
    return tuple(items)


def _stop_token_ids(body: dict, vocab_size: int) -> list[int]:
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
                                            for t in ids):
        raise invalid("stop_token_ids", f"stop_token_ids must be a list of token ids in [0, {vocab_size})")
    return ids


# ------------------------------------------------------------------------------------------------------ prompts
def _completion_prompt(body: dict, served: ServedModel) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) != 1:
            raise invalid("prompt", f"one prompt per request is supported, got {len(prompt)}")
        prompt = prompt[0]
    if not isinstance(prompt, (str, list)):
        raise invalid("prompt", "prompt must be a string or a list of token ids")
    return served.encode(prompt, "prompt")


def _message_text(message: Any, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise invalid("messages", f"{where} must be an object with a role in {', '.join(ROLES)}")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise invalid("messages", f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                      "are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise invalid("messages", f"{where}.content must be a string or a list of text parts")
    return {"role": message["role"], "content": content}


def _chat_prompt(body: dict, served: ServedModel) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects")
    turns = [_message_text(m, i) for i, m in enumerate(messages)]
    if not served.chat_template:
        raise invalid("messages", f"the model {served.name!r} has no chat template (its checkpoint has no tokenizer "
                                  "with one): use /v1/completions with a prompt", "chat_template_missing")
    try:
        text = served.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template that refuses these messages (jinja's raise_exception)
        raise invalid("messages", f"the chat template refused the messages: {str(exc).splitlines()[0][:200]}") \
            from None
    return served.encode(list(served.tokenizer.encode(text, add_special_tokens=False)), "messages")


# ------------------------------------------------------------------------------------------------------ request
def parse_request(body: Any, served: ServedModel, chat: bool) -> GenerationRequest:
    """Check a request body and turn it into engine inputs; raises :class:`APIError` naming the bad parameter."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "model must name the served model (see /v1/models)")
    if model != served.name:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served.name!r}", "model",
                       "model_not_found")
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, 0, "", [], {}):
            raise invalid(key, f"{key} is not supported by this server")
    for key in ("n", "best_of"):
        if _integer(body, key, 1) not in (None, 1):
            raise invalid(key, f"{key} = {body[key]}: this server returns one choice per request ({key} = 1)")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise invalid("response_format", "only response_format {\"type\": \"text\"} is supported")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise invalid("stream_options", "stream_options is an object, allowed only with stream = true")
    include_usage = _flag(options or {}, "include_usage")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", -1)
    seed = _integer(body, "seed", 0)
    if seed is not None and seed >= 2**63:
        raise invalid("seed", f"seed = {seed}: must be below 2**63")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, 1)
    stop = _stop_strings(body)
    stop_ids = _stop_token_ids(body, served.vocab_size)
    if not _flag(body, "ignore_eos"):
        stop_ids = stop_ids + [t for t in served.eos_token_ids if t not in stop_ids]
    prompt = _chat_prompt(body, served) if chat else _completion_prompt(body, served)
    room = served.max_seq_len - len(prompt)
    if max_tokens is None:
        max_tokens = room if chat else min(DEFAULT_COMPLETION_TOKENS, room)
    elif max_tokens > room:
        raise invalid(key, f"the model's context holds {served.max_seq_len} tokens: the prompt's {len(prompt)} "
                           f"leave room for {room}, and {key} asks for {max_tokens}", "context_length_exceeded")
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k or 0, 0), seed=seed,
                            max_new_tokens=max_tokens, stop_token_ids=tuple(stop_ids))
    return GenerationRequest(prompt, params, stop, stream, include_usage, chat)


# ------------------------------------------------------------------------------------------------------ responses
def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(request_id: str, created: int, model: str, chat: bool, text: str, finish_reason: str,
                  usage: dict[str, int]) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage}


def chunk_body(request_id: str, created: int, model: str, chat: bool, text: str | None,
               finish_reason: str | None = None, first: bool = False,
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One streamed chunk: new text, the final finish reason, or (``usage`` given) the usage chunk without choices."""
    if usage is not None:
        choices: list[dict[str, Any]] = []
    elif chat:
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    body = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body
