"""Bounded requests: the body cap, a character bound on prompts, tokenization off the GIL.

- `read_body(request, limit)`: the body, or 413 before it is read in full (Content-Length above the
  cap is refused before any byte of the body is read; a body without one is counted as it streams).
- `max_chars_per_token(tokenizer)`: a number L such that no token of this tokenizer ever stands for
  more than L characters of the input text, or None where no such bound can be proved. A text of
  more than `budget * L` characters therefore needs more than `budget` tokens: it is refused without
  tokenizing it, and a text that would fit is never refused.
- `tokenize(tokenizer, text)`: the same ids as `Tokenizer.encode`, through the backend's batch call,
  which releases the GIL, so the event loop and the engine thread run while a long prompt is encoded.

Why L is a bound (HF `tokenizers`, the pipeline normalizer -> pre-tokenizer -> model):
- a token of the model covers a substring of the normalized, pre-tokenized text no longer than its
  vocabulary string: BPE/Unigram pieces are those substrings (a subword prefix or word suffix only
  lengthens the string), a byte-level string has one character per byte and a character has at least
  one byte, an added token is its literal content;
- the normalizer can shorten the text only by composing characters (NFC, NFKC): a composed
  character stands for at most CANONICAL_MAX input characters (its full canonical decomposition;
  no character decomposes to nothing). Lowercase, Prepend, NFD and NFKD never shorten; Replace of
  a literal string shortens by at most len(pattern) / len(content);
- None (no character bound) wherever text can vanish or one token can swallow an unbounded run:
  normalizers that delete (StripAccents, Strip, Bert, Nmt, Precompiled, a regex Replace), a
  pre-tokenizer that removes what it splits on (Whitespace, BertPreTokenizer, CharDelimiterSplit, a
  "Removed" Split), unknown-token fusing, WordPiece/WordLevel unknowns, added tokens that strip
  whitespace, truncation, or any component not listed here.
"""
from __future__ import annotations

import json
import math

MAX_BODY_BYTES = 16 * 2**20  # the default of --max-body-bytes: far above any prompt that fits a context
CANONICAL_MAX = 4  # the longest full canonical decomposition of one character (checked by a test)
_GROW = {"Lowercase", "Prepend", "NFD", "NFKD", "ByteLevel"}  # normalizers that never shorten text
_COMPOSE = {"NFC", "NFKC"}
_SAFE_PRE = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}
_SPLITTING_PRE = {"Split", "Punctuation"}  # safe unless they remove what they split on


def _shrink(norm: dict | None) -> int | None:
    """How many input characters one normalized character can stand for, at most (None: unbounded)."""
    if norm is None:
        return 1
    kind = norm.get("type")
    if kind == "Sequence":
        out = 1
        for n in norm.get("normalizers", []):
            s = _shrink(n)
            if s is None:
                return None
            out *= s
        return out
    if kind in _GROW:
        return 1
    if kind in _COMPOSE:
        return CANONICAL_MAX
    if kind == "Replace" and set(norm.get("pattern") or {}) == {"String"}:
        pattern, content = norm["pattern"]["String"], norm.get("content", "")
        if not pattern:
            return 1
        return None if not content else max(1, math.ceil(len(pattern) / len(content)))
    return None


def _pre_tokenizer_ok(pre: dict | None) -> bool:
    if pre is None:
        return True
    kind = pre.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_ok(p) for p in pre.get("pretokenizers", []))
    if kind in _SPLITTING_PRE:
        return pre.get("behavior") != "Removed" and not pre.get("invert", False)
    return kind in _SAFE_PRE


def _has(pre: dict | None, kind: str) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "Sequence":
        return any(_has(p, kind) for p in pre.get("pretokenizers", []))
    return pre.get("type") == kind


def _model_ok(model: dict, pre: dict | None) -> bool:
    """Every character reaches a token of bounded length (no unknown swallows a run, none is dropped)."""
    kind = model.get("type")
    if kind == "BPE":
        if model.get("byte_fallback") or (_has(pre, "ByteLevel") and _covers_bytes(model.get("vocab", {}))):
            return True
        return model.get("unk_token") is not None and not model.get("fuse_unk", False)
    if kind == "Unigram":
        return bool(model.get("byte_fallback"))
    return False  # WordPiece, WordLevel: one unknown token can stand for a whole word


def _covers_bytes(vocab: dict) -> bool:
    """The byte-level alphabet (one character per byte value) is in the vocabulary."""
    from tokenizers.pre_tokenizers import ByteLevel
    return all(c in vocab for c in ByteLevel.alphabet())


def max_chars_per_token(tokenizer) -> int | None:
    """L for this tokenizer (see the module docstring), or None where none can be proved."""
    backend = getattr(tokenizer, "_tok", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if spec.get("truncation") is not None or not _pre_tokenizer_ok(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model") or {}
    if not _model_ok(model, spec.get("pre_tokenizer")):
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    vocab = model.get("vocab") or {}
    strings = vocab.keys() if isinstance(vocab, dict) else (piece for piece, _score in vocab)  # Unigram: pairs
    longest = max([len(s) for s in strings] + [len(t.get("content", "")) for t in added] + [1])
    return longest * shrink


def tokenize(tokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text)`, with the GIL released while the backend works."""
    backend = getattr(tokenizer, "_tok", None)
    if backend is None or not hasattr(backend, "encode_batch"):
        return tokenizer.encode(text)
    return backend.encode_batch([text], add_special_tokens=False)[0].ids


async def read_body(request, limit: int) -> bytes:
    """The request body, or ApiError 413 as soon as it is known to exceed `limit` bytes."""
    from specfold.serve.protocol import ApiError

    def too_large(size: str) -> ApiError:
        return ApiError(413, f"the request body is {size}; this server accepts at most {limit} bytes "
                             f"(--max-body-bytes)", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, f"Content-Length {declared!r} is not a byte count", code="invalid_request")
        if int(declared) > limit:
            raise too_large(f"{int(declared)} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
