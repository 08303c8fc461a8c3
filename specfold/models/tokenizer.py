"""Tokenizer and chat template of a checkpoint folder, without `transformers`.

Reads `tokenizer.json` (the `tokenizers` library) and the chat template from `tokenizer_config.json`
or `chat_template.jinja`, rendered with a sandboxed Jinja environment the way HF does
(`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`).
A checkpoint without tokenizer files still loads: `Tokenizer.load` returns None and only text
prompts fail.
"""
from __future__ import annotations

import json
from pathlib import Path

from specfold.errors import CheckpointError


def _token_str(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


class Tokenizer:
    def __init__(self, tok, config: dict, chat_template: str | None):
        self._tok = tok
        self.config = config
        self.chat_template = chat_template
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self._compiled: tuple[str, object] | None = None  # (template text, its compiled Jinja template)

    @classmethod
    def load(cls, path: Path) -> "Tokenizer | None":
        from tokenizers import Tokenizer as HFTokenizer

        tj = path / "tokenizer.json"
        if not tj.is_file():
            return None
        try:
            tok = HFTokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise CheckpointError(f"cannot read {tj}: {e}") from None
        cfg: dict = {}
        tc = path / "tokenizer_config.json"
        if tc.is_file():
            try:
                cfg = json.loads(tc.read_text())
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{tc} is not valid JSON: {e}") from None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja = path / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()
        return cls(tok, cfg, template)

    @property
    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise CheckpointError("this checkpoint has no chat template (tokenizer_config.json "
                                  "'chat_template' or chat_template.jinja); use chat_template=False")
        return self._template().render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def _template(self):
        """The chat template compiled once per template text (compiling costs more than rendering)."""
        if self._compiled is None or self._compiled[0] != self.chat_template:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(msg: str):
                raise TemplateError(msg)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._compiled = (self.chat_template, env.from_string(self.chat_template))
        return self._compiled[1]
