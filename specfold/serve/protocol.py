"""The OpenAI wire protocol: request validation, error bodies and response/chunk shapes.

Pure Python (no FastAPI), so every rule here is testable on its own.

Invariants:
- `parse_request(body, chat)` either returns a `GenRequest` whose every field is typed and in range,
  or raises `ApiError` (HTTP 4xx, OpenAI's `{"error": {"message", "type", "param", "code"}}` body)
  naming the offending field. Nothing is coerced ("8" is not 8, true is not 1) or silently dropped.
- A field OpenAI defines but this server does not implement is refused by name unless it carries
  its neutral value (`NEUTRAL`: e.g. `presence_penalty: 0`, `top_p: 1`, `echo: false`, null).
- logprobs: chat takes `logprobs: true` with `top_logprobs` 0..20, completions `logprobs: N` (0..20; params.MAX_LOGPROBS, the API's limit too);
  the shapes are OpenAI's (`chat_logprobs`, `completion_logprobs`; -inf is sent as -9999.0, as vLLM).
- Any other field is unknown and refused by name, with the list of accepted fields. There are no
  engine fields (method, graph, delta, ...): the engine is fixed when the server starts, and no
  request field names a server-side file.
- The request fields that set a `SamplingParams` field are `SAMPLING_FIELDS` (the rest of its fields
  are the server's: `SERVER_SAMPLING`); `sampling_params(req, defaults)` makes the request's
  SamplingParams from it, and whatever SamplingParams refuses, `parse_request` refuses (its limits
  are params.py's), naming the request's field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from dataclasses import dataclass, field

from specfold.errors import ParamsError
from specfold.params import MAX_LOGPROBS, MAX_SEED, MAX_TEMPERATURE, SamplingParams, seed_error  # noqa: F401 (MAX_SEED: app.py)

MAX_N = 16  # choices per request (each one an engine request)
MAX_STOP = 4  # stop strings per request (OpenAI's limit)

# Fields OpenAI defines that this server does not implement: accepted only at these neutral values
# (null is always accepted). Any other value is a 400 that names the field.
NEUTRAL: dict[str, tuple] = {
    "top_logprobs": (0,), "echo": (False,), "best_of": (1,), "suffix": ("",),
    "logit_bias": ({},), "presence_penalty": (0,), "frequency_penalty": (0,), "top_p": (1,),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (False,), "response_format": ({"type": "text"},), "modalities": (["text"],),
    "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": (), "store": (False,),
    "metadata": ({},), "service_tier": ("auto", "default"),
}
COMMON = ("model", "n", "max_tokens", "temperature", "seed", "stop", "stream", "stream_options", "user")
CHAT_FIELDS = COMMON + ("messages", "max_completion_tokens", "logprobs", "top_logprobs")
COMPLETION_FIELDS = COMMON + ("prompt", "logprobs")
ROLES = ("system", "developer", "user", "assistant")

# GenRequest field -> the SamplingParams field it sets (max_completion_tokens arrives as max_tokens);
# the other SamplingParams fields are the server's: the model's stop tokens, and the chat template
# (the chat endpoint applies it). tests/test_serve_protocol.py checks both against the dataclasses.
SAMPLING_FIELDS = {"max_tokens": "max_new_tokens", "temperature": "temperature", "seed": "seed", "stop": "stop",
                   "logprobs": "logprobs"}
SERVER_SAMPLING = ("stop_token_ids", "chat_template")


class ApiError(Exception):
    """An error answered to the client: HTTP status + OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(slots=True)
class GenRequest:
    """A validated /v1/completions or /v1/chat/completions request."""
    chat: bool
    model: str
    prompts: list = field(default_factory=list)  # completions: each a str or a list of token ids
    messages: list[dict] = field(default_factory=list)  # chat: [{"role", "content": str}]
    n: int = 1
    max_tokens: int | None = None  # None: the server's default
    temperature: float | None = None  # None: the server's default
    seed: int | None = None  # None: the server draws one
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # alternatives per token (None: no logprobs)


# ---------------------------------------------------------------------------------- field checks
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(name: str, v, lo: int, hi: int | None = None) -> int:
    if not _is_int(v) or v < lo or (hi is not None and v >= hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
        raise bad(name, f"'{name}' must be an integer {rng}, got {v!r}")
    return v


def _float(name: str, v, lo: float, hi: float) -> float:
    if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad(name, f"'{name}' must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def _bool(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise bad(name, f"'{name}' must be true or false, got {v!r}")
    return v


def _logprobs(body: dict, chat: bool) -> int | None:
    """Chat: `logprobs` true/false with `top_logprobs` 0..20; completions: `logprobs` 0..20 (the
    alternatives per token). None: no logprobs."""
    get = {k: v for k, v in body.items() if v is not None}.get
    n_range = f"an integer in [0, {MAX_LOGPROBS}]"
    if not chat:
        if get("top_logprobs") not in (None, 0):
            raise bad("top_logprobs", f"'top_logprobs' is a chat field; completions take 'logprobs': N "
                                      f"({n_range}: the alternatives per token)", code="unsupported_parameter")
        v = get("logprobs")
        if v is None or v is False:
            return None
        if not _is_int(v) or not 0 <= v <= MAX_LOGPROBS:
            raise bad("logprobs", f"'logprobs' must be {n_range} (the alternatives per token) or null, got "
                                  f"{json.dumps(v)}")
        return v
    on = _bool("logprobs", get("logprobs", False))
    top = get("top_logprobs", 0)
    if not _is_int(top) or not 0 <= top <= MAX_LOGPROBS:
        raise bad("top_logprobs", f"'top_logprobs' must be {n_range}, got {json.dumps(top)}")
    if top and not on:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return top if on else None


def _stop(v) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad("stop", f"'stop' must be a non-empty string or a list of non-empty strings, got {v!r}")
    if len(items) > MAX_STOP:
        raise bad("stop", f"'stop' takes at most {MAX_STOP} strings, got {len(items)}")
    return list(items)


def _stream_options(v) -> bool:
    if not isinstance(v, dict) or set(v) - {"include_usage"}:
        raise bad("stream_options", f"'stream_options' accepts only {{\"include_usage\": bool}}, got {v!r}")
    return _bool("stream_options.include_usage", v.get("include_usage", False))


def _prompts(v) -> list:
    """A string, a list of token ids, or a non-empty list of either."""
    if isinstance(v, str) or (isinstance(v, list) and v and all(_is_int(t) for t in v)):
        v = [v]
    if not isinstance(v, list) or not v:
        raise bad("prompt", f"'prompt' must be a non-empty string, a list of token ids or a list of those, "
                            f"got {v!r}")
    for p in v:
        if isinstance(p, str):
            if not p:
                raise bad("prompt", "'prompt' contains an empty string")
        elif not (isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p)):
            raise bad("prompt", f"each prompt must be a non-empty string or a non-empty list of token ids "
                                f"(integers >= 0), got {p!r}")
    return v


def _content(i: int, c) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": str} parts (joined)."""
    param = f"messages[{i}].content"
    if isinstance(c, str):
        return c
    if not isinstance(c, list) or not c:
        raise bad(param, f"'{param}' must be a string or a non-empty list of text parts, got {c!r}")
    texts = []
    for part in c:
        if not isinstance(part, dict) or "type" not in part:
            raise bad(param, f"each part of '{param}' must be an object with a 'type', got {part!r}")
        if part["type"] != "text":
            raise bad(param, f"'{param}': content part type {part['type']!r} is not supported (only 'text')",
                      code="unsupported_value")
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise bad(param, f"a text part is {{\"type\": \"text\", \"text\": str}}, got {part!r}")
        texts.append(part["text"])
    return "".join(texts)


def _messages(v) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise bad("messages", f"'messages' must be a non-empty list of message objects, got {v!r}")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"'messages[{i}]' must be an object with 'role' and 'content', got {m!r}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise bad(f"messages[{i}].{extra[0]}", f"message field {extra[0]!r} is not supported "
                      f"(a message has 'role' and 'content')", code="unsupported_parameter")
        if m.get("role") not in ROLES:
            raise bad(f"messages[{i}].role", f"'messages[{i}].role' must be one of {list(ROLES)}, "
                                             f"got {m.get('role')!r}")
        if "content" not in m or m["content"] is None:
            raise bad(f"messages[{i}].content", f"'messages[{i}].content' is missing", code="missing_required")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content(i, m["content"])})
    return out


# ---------------------------------------------------------------------------------- the request
def _neutral(value, options: tuple) -> bool:
    """null, or equal to one of `options` (a bool only equals a bool: `logprobs: 0` is not false)."""
    return value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in options)


def _check_names(body: dict, accepted: tuple[str, ...]) -> None:
    for name, value in body.items():
        if name in accepted:
            continue
        if name in NEUTRAL:
            if _neutral(value, NEUTRAL[name]):
                continue
            neutral = " or ".join([json.dumps(n) for n in NEUTRAL[name]] + ["null"])
            raise ApiError(400, f"'{name}' is not supported by this server (accepted only as {neutral})",
                           param=name, code="unsupported_parameter")
        raise ApiError(400, f"unknown field {name!r}; accepted fields: {sorted(accepted)} (engine settings "
                            f"are fixed when the server starts)", param=name, code="unknown_parameter")


def parse_request(body, chat: bool) -> GenRequest:
    """Validate a decoded JSON body (see module docstring)."""
    if not isinstance(body, dict):
        raise bad(None, f"the request body must be a JSON object, got {type(body).__name__}")
    logprobs = _logprobs(body, chat)  # first: completions' top_logprobs gets its own message
    _check_names(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad("model", f"'model' must be a non-empty string, got {body.get('model')!r}", code="missing_required")
    req = GenRequest(chat=chat, model=body["model"])
    if chat:
        if "messages" not in body:
            raise bad("messages", "'messages' is missing", code="missing_required")
        req.messages = _messages(body["messages"])
    else:
        if "prompt" not in body:
            raise bad("prompt", "'prompt' is missing", code="missing_required")
        req.prompts = _prompts(body["prompt"])
    get = {k: v for k, v in body.items() if v is not None}.get
    req.n = _int("n", get("n", 1), 1, MAX_N + 1)
    if chat and get("max_tokens") is not None and get("max_completion_tokens") is not None:
        raise bad("max_completion_tokens", "give 'max_completion_tokens' or 'max_tokens', not both")
    for name in ("max_tokens", "max_completion_tokens"):
        if get(name) is not None:
            req.max_tokens = _int(name, get(name), 1)
    if get("temperature") is not None:
        req.temperature = _float("temperature", get("temperature"), 0.0, MAX_TEMPERATURE)
    if get("seed") is not None:
        if seed_error(get("seed")):
            raise bad("seed", seed_error(get("seed")))
        req.seed = get("seed")
    if get("stop") is not None:
        req.stop = _stop(get("stop"))
    req.stream = _bool("stream", get("stream", False))
    if get("stream_options") is not None:
        if not req.stream:
            raise bad("stream_options", "'stream_options' is only allowed with 'stream': true")
        req.include_usage = _stream_options(get("stream_options"))
    if get("user") is not None and not isinstance(get("user"), str):
        raise bad("user", f"'user' must be a string, got {get('user')!r}")
    req.logprobs = logprobs
    _check_sampling(req)
    return req


def _check_sampling(req: GenRequest) -> None:
    """Refuse (400, naming the request's field) any value SamplingParams refuses: the checks above give
    the wire's messages, this makes sure the server never takes a value the API would not."""
    for name, target in SAMPLING_FIELDS.items():
        value = getattr(req, name)
        if value is not None:
            try:
                SamplingParams(**{target: value})
            except ParamsError as e:
                raise bad(name, str(e)) from None


def sampling_params(req: GenRequest, defaults: SamplingParams, **kw) -> SamplingParams:
    """The request's SamplingParams: `defaults` (the server's) with each field the request gives, then `kw`."""
    given = {target: getattr(req, name) for name, target in SAMPLING_FIELDS.items() if getattr(req, name) is not None}
    return dataclasses.replace(defaults, **{**given, **kw})


# ---------------------------------------------------------------------------------- responses
def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(chat: bool, index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    if chat:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish_reason}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chunk_choice(chat: bool, index: int, text: str | None, finish_reason: str | None,
                 first: bool = False, logprobs: dict | None = None) -> dict:
    if chat:
        delta: dict = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}


def _lp(x: float) -> float:
    return max(x, -9999.0)  # JSON has no -inf


def chat_logprobs(ids: list[int], lps: list[dict], n: int, text_of) -> dict:
    """OpenAI's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [n x {token,
    logprob, bytes}]}]}; `lps[i]`: {id: logprob} (the most likely first, the chosen one included);
    `text_of(id)`: a token's text."""
    def entry(t: int, x: float) -> dict:
        s = text_of(t)
        return {"token": s, "logprob": _lp(x), "bytes": list(s.encode("utf-8"))}
    return {"content": [dict(entry(t, d[t]), top_logprobs=[entry(k, v) for k, v in list(d.items())[:n]])
                        for t, d in zip(ids, lps)]}


def completion_logprobs(ids: list[int], lps: list[dict], text_of, offset: int = 0) -> tuple[dict, int]:
    """OpenAI's completions `logprobs`: {tokens, token_logprobs, top_logprobs: [{token: logprob}] (the
    n most likely and the chosen one), text_offset} for tokens starting at character `offset` of the
    choice's text; returns it and the offset after the last token."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, d in zip(ids, lps):
        s = text_of(t)
        out["tokens"].append(s)
        out["token_logprobs"].append(_lp(d[t]))
        out["top_logprobs"].append({text_of(k): _lp(v) for k, v in d.items()})
        out["text_offset"].append(offset)
        offset += len(s)
    return out, offset


def envelope(rid: str, chat: bool, model: str, choices: list[dict], stream: bool,
             created: int | None = None, usage_: dict | None = None) -> dict:
    obj = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    body = {"id": rid, "object": obj, "created": created or int(time.time()), "model": model,
            "choices": choices}
    if usage_ is not None or not stream:
        body["usage"] = usage_
    return body
