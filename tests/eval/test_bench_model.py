"""A text checkpoint for the bench / lm-eval tests: the random `checkpoint` fixture (96 ids, mask 95,
stop 94) plus a character-level tokenizer and a ChatML-like chat template, so text prompts work.

Ids: 0 `<unk>`, 1 `<|im_start|>`, 2..93 characters, 94 `<|im_end|>` (stop), 95 `<|mask|>`.
"""
from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

CHARS = (string.digits + string.ascii_lowercase + string.ascii_uppercase + " \n.,:;?!#=+-*/()'\"_<>")[:92]
SPECIALS = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 94, "<|mask|>": 95}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i + 2 for i, c in enumerate(CHARS)}
    vocab.update(SPECIALS)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "mask_token": "<|mask|>", "chat_template": CHAT_TEMPLATE}))


def text_checkpoint(src: Path, dst: Path) -> Path:
    """Copy the random checkpoint folder `src` to `dst` and add the tokenizer files."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    write_tokenizer(dst)
    return dst


def test_tokenizer_round_trip(tmp_path):
    from specfold.models.tokenizer import Tokenizer

    write_tokenizer(tmp_path)
    tok = Tokenizer.load(tmp_path)
    text = "What is 12 + 7?\n#### 19"
    ids = tok.encode(text)
    assert len(ids) == len(text) and max(ids) < 94
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.encode(chat)[0] == 1 and 94 in tok.encode(chat)
