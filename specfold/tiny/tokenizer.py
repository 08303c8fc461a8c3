"""Train the tiny model's BPE tokenizer (the `tokenizers` library) and write its HF files.

Byte-level BPE (so any text round-trips) with a digit pre-tokenizer that isolates every digit, so
numbers are always one token per digit. Special tokens, with fixed ids 0..3:
`<|endoftext|>` (pad / stop), `<|im_start|>`, `<|im_end|>` (end of turn, stop), `<|mask|>` (mask).
`tokenizer_config.json` carries a ChatML chat template rendered by specfold's Tokenizer and by HF.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: str | Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "rstrip": False,
                                        "normalized": False, "single_word": False, "special": True}
             for t in SPECIALS}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
         "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, indent=2) + "\n")


def corpus(problems: Iterable[dict]) -> Iterator[str]:
    """Training texts: each problem as the chat-templated conversation the model sees."""
    for p in problems:
        yield (f"<|im_start|>user\n{p['question']}<|im_end|>\n<|im_start|>assistant\n"
               f"{p['answer']}<|im_end|>")
