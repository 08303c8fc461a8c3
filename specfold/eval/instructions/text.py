"""Offline text utilities for the IFEval checkers (replacing nltk and wrapping langdetect).

- `count_words`: number of `\\w+` runs (what the official code counts with nltk's RegexpTokenizer).
- `split_sentences` / `count_sentences`: a regex splitter standing in for nltk's punkt model
  (which needs a download): a sentence ends at `.`, `!` or `?` (plus closing quotes/brackets)
  followed by whitespace, except after a known abbreviation or a single-letter initial, and a `.`
  does not end a sentence when the next word starts in lower case. Lines without end punctuation
  do not end sentences (as with punkt).
- `word_tokens`: a Treebank-like tokenizer standing in for `nltk.word_tokenize` (hyphenated words
  stay whole, clitics such as n't / 's are split off, punctuation marks are tokens).
- `detect_language`: langdetect with a fixed seed (deterministic); langdetect is an optional
  dependency (`pip install langdetect`, it ships its language profiles, so it works offline).
"""
from __future__ import annotations

import re

_ABBREV = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd",
    "co", "corp", "no", "fig", "approx", "dept", "est", "mt", "u.s", "u.k", "a.m", "p.m", "jan",
    "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "gen", "gov",
    "capt", "lt", "col", "rev", "ph.d", "cf", "al", "vol", "ed", "eds",
}
_END = re.compile(r"([.!?]+)([\"'\u201d\u2019)\]]*)(\s+)")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` (see module docstring); empty text gives []."""
    out, start = [], 0
    for m in _END.finditer(text):
        punct, end = m.group(1), m.end()
        if "." in punct and not any(c in punct for c in "!?"):
            before = text[start : m.start()].split()
            word = before[-1].lower().rstrip(".") if before else ""
            nxt = text[end : end + 1]
            if len(punct) == 1 and (word in _ABBREV or re.fullmatch(r"[a-z]", word)):
                continue
            if nxt.islower():
                continue
        out.append(text[start : m.end(2)].strip())
        start = end
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def count_words(text: str) -> int:
    return len(re.findall(r"\w+", text))


_TOKEN = re.compile(
    r"(?:[A-Za-z]\.){2,}"  # acronyms: U.S.
    r"|\w+(?:-\w+)*?(?=n't\b)"  # do|n't
    r"|n't\b|'(?:s|re|ve|ll|d|m)\b"
    r"|\w+(?:-\w+)*"
    r"|[^\w\s]",
    re.IGNORECASE,
)


def word_tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def detect_language(text: str) -> str | None:
    """ISO 639-1 code from langdetect; None when it cannot decide (e.g. no letters)."""
    try:
        import langdetect  # type: ignore[import-not-found]
        from langdetect import DetectorFactory
    except ImportError:
        raise ImportError(
            "IFEval language checks need the optional package langdetect (pip install langdetect)"
        ) from None
    DetectorFactory.seed = 0
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None
