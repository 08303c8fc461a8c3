"""The character bound on prompts (serve/limits.py) never refuses a prompt that would fit.

`max_chars_per_token(tok)` = L claims: no text of more than `n * L` characters encodes to `n` tokens
or fewer. Checked against the tokenizers themselves (the `tokenizers` library is the reference) on
adversarial texts: runs of the longest tokens, special tokens, decomposed accents and Hangul jamo
that NFC composes, whitespace runs, 4-byte characters, for the shipped tiny tokenizer and for
tokenizers built here with the normalizers the bound must account for; and None wherever a token
can stand for an unbounded run (deleting normalizers or pre-tokenizers, unknown words).
"""
from __future__ import annotations

import random
import unicodedata

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from specfold.models.tokenizer import Tokenizer
from specfold.serve.limits import CANONICAL_MAX, max_chars_per_token, tokenize

CORPUS = ["Tom has 3 apples and buys 4 more apples.", "Café naïve résumé déjà vu — ünïcödé", "한국어 텍스트 안녕하세요",
          "    indented    code\n\tand tabs", "emoji 😀😃 and ﬁ ligatures", "=" * 40, "a" * 64,
          "\u1f82" * 60, " " * 200] * 20  # a composed run and a space run become the longest tokens
PIECES = ["e\u0301", "s\u0323\u0307", "\u1100\u1161\u11a8", "\u03b1\u0313\u0300\u0345", "é", "  ", "\n\n", "😀",
          "ﬁ", "Ａ", "x", "7", "=", "a"]


def wrap(hf: HFTokenizer) -> Tokenizer:
    return Tokenizer(hf, {}, None)


def byte_bpe(normalizer=None, specials=("<|im_end|>",)) -> Tokenizer:
    tok = HFTokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(specials), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return wrap(tok)


def texts(tok: Tokenizer, rng: random.Random) -> list[str]:
    vocab = tok.vocab
    longest = sorted(vocab, key=len)[-8:]
    decoded = [tok.decode([vocab[s]], skip_special_tokens=False) for s in longest]
    pool = PIECES + decoded
    out = [d * 50 for d in decoded] + [p * 200 for p in PIECES]
    # the worst cases of the normalizers: 240 characters that NFC makes the 60 of one token, and 400
    # spaces that "two spaces -> one" makes the 200 of one token (the longest)
    out += [unicodedata.normalize("NFD", "\u1f82" * 60), " " * 400]
    out += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 300))) for _ in range(300)]
    return [t for t in out if t]


TOKENIZERS = {
    "tiny": lambda: Tokenizer.load(__import__("specfold.api", fromlist=["tiny_path"]).tiny_path()),
    "byte-level BPE": lambda: byte_bpe(),
    "NFC": lambda: byte_bpe(normalizers.NFC()),
    "NFKC + lowercase": lambda: byte_bpe(normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])),
    "Replace two spaces by one": lambda: byte_bpe(normalizers.Replace("  ", " ")),
    "Prepend": lambda: byte_bpe(normalizers.Prepend("_")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_no_text_beyond_the_bound_fits(name):
    tok = TOKENIZERS[name]()
    per = max_chars_per_token(tok)
    assert per is not None
    for text in texts(tok, random.Random(name)):
        ids = tokenize(tok, text)
        assert ids == tok.encode(text)  # the GIL-free path gives the same ids
        assert len(text) <= per * len(ids), (name, per, len(ids), text[:80])


def test_the_bound_is_tight_for_the_tiny_tokenizer():
    """A run of the longest token reaches the bound exactly: one token per L characters."""
    tok = TOKENIZERS["tiny"]()
    per = max_chars_per_token(tok)
    longest = max(tok.vocab, key=len)
    assert per == len(longest) == 13 and longest == "<|endoftext|>"
    assert len(tokenize(tok, longest * 100)) == 100


@pytest.mark.parametrize("build", [
    lambda: byte_bpe(normalizers.StripAccents()),  # deletes combining marks
    lambda: byte_bpe(normalizers.Strip()),  # deletes leading and trailing whitespace
    lambda: byte_bpe(normalizers.Replace(" ", "")),  # deletes spaces
    lambda: byte_bpe(normalizers.BertNormalizer()),
])
def test_no_bound_where_text_can_vanish(build):
    assert max_chars_per_token(build()) is None


def test_no_bound_for_deleting_pre_tokenizers_unknown_words_and_stripping_specials():
    tok = byte_bpe()
    tok._tok.pre_tokenizer = pre_tokenizers.Whitespace()  # drops whitespace
    assert max_chars_per_token(tok) is None
    wl = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))  # one [UNK] per word
    wl.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert max_chars_per_token(wrap(wl)) is None
    fused = HFTokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True))
    assert max_chars_per_token(wrap(fused)) is None
    tok = byte_bpe()
    from tokenizers import AddedToken
    tok._tok.add_special_tokens([AddedToken("<|sep|>", rstrip=True)])  # swallows the whitespace after it
    assert max_chars_per_token(tok) is None
    assert len(tokenize(tok, "<|sep|>" + " " * 500)) == 1  # why: 507 characters, one token


def test_canonical_max_is_the_longest_canonical_decomposition():
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest == CANONICAL_MAX
