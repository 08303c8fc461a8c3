"""Offline text utilities for the IFEval checkers: nltk's punkt with shipped parameters, langdetect.

- `count_words`: number of `\\w+` runs (what the official code counts with nltk's RegexpTokenizer).
- `split_sentences` / `count_sentences`: nltk's own `PunktSentenceTokenizer` (the official
  checker's splitter) with the English punkt_tab parameters shipped in `nltk_data/` (loaded from
  there, never downloaded; see nltk_data/README.md for what is shipped and what is missing).
- `word_tokens`: `nltk.word_tokenize` done the same way (punkt sentences, then nltk's Treebank
  word tokenizer), with the shipped parameters.
- `detect_language`: langdetect with a fixed seed (deterministic); langdetect ships its language
  profiles, so it works offline.
nltk and langdetect are the `eval` extra's dependencies, imported lazily: without them these
functions raise an ImportError naming the package.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

PUNKT_DIR = Path(__file__).with_name("nltk_data") / "tokenizers" / "punkt_tab" / "english"


def _nltk():
    try:
        import nltk  # type: ignore[import-not-found]
    except ImportError:
        raise ImportError("IFEval sentence and word counts need nltk (pip install 'specfold[eval]')") from None
    return nltk


@lru_cache(maxsize=1)
def punkt():
    """nltk's punkt sentence tokenizer with the shipped English parameters (loaded once)."""
    _nltk()
    from nltk.tabdata import PunktDecoder
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params, dec = PunktParameters(), PunktDecoder()  # what nltk's load_punkt_params reads, read here
    with open(PUNKT_DIR / "collocations.tab", encoding="utf-8") as f:
        params.collocations = set(dec.tab2tups(f))
    with open(PUNKT_DIR / "sent_starters.txt", encoding="utf-8") as f:
        params.sent_starters = dec.txt2set(f)
    with open(PUNKT_DIR / "abbrev_types.txt", encoding="utf-8") as f:
        params.abbrev_types = dec.txt2set(f)
    with open(PUNKT_DIR / "ortho_context.tab", encoding="utf-8") as f:
        params.ortho_context = dec.tab2intdict(f)
    return PunktSentenceTokenizer(params)


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` as punkt splits them; empty text gives []."""
    return punkt().tokenize(text)


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def count_words(text: str) -> int:
    return len(re.findall(r"\w+", text))


@lru_cache(maxsize=1)
def _treebank():
    return _nltk().tokenize.NLTKWordTokenizer()


def word_tokens(text: str) -> list[str]:
    """`nltk.word_tokenize(text)` with the shipped punkt parameters."""
    tok = _treebank()
    return [t for sent in split_sentences(text) for t in tok.tokenize(sent)]


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
