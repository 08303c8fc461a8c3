"""`LLM.chat` (vLLM's split): `generate` takes prompts as given, `chat` applies the checkpoint's chat
template; the CLI says in one stderr line which it does, and its --json stdout is unchanged."""
from __future__ import annotations

import json

import pytest

from specfold import DecodeParams, LLM, SamplingParams
from specfold.cli import main, template_line
from specfold.errors import ParamsError

QUESTIONS = ["Tom has 7 apples. He gets 5 more apples. How many apples does Tom have now?",
             "Mia has 9 pens. She gives away 4 pens. How many pens does Mia have now?"]
ASK = "chat() takes a conversation (a list of {'role': str, 'content': str} dicts) or a list of them"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_is_generate_with_the_chat_template(tiny_llm):
    want = tiny_llm.generate(QUESTIONS, SamplingParams(max_new_tokens=12, chat_template=True))
    got = tiny_llm.chat([user(q) for q in QUESTIONS], SamplingParams(max_new_tokens=12))
    assert [o.token_ids for o in got] == [o.token_ids for o in want] and len(got) == 2
    assert got[0].prompt == tiny_llm.tokenizer.apply_chat_template(user(QUESTIONS[0]))
    one = tiny_llm.chat(user(QUESTIONS[1]), DecodeParams(max_new_tokens=12, chat_template=True))  # applied once
    assert len(one) == 1 and one[0].token_ids == want[1].token_ids
    plain = tiny_llm.generate(QUESTIONS[:1], SamplingParams(max_new_tokens=12))[0]  # as given: no template
    assert plain.prompt == QUESTIONS[0]


@pytest.mark.parametrize("messages, says", [
    ("hi", ", got str"),
    ([], ", got an empty list"),
    ([[]], "; conversation 0 is empty"),
    ([{"role": "user"}], "; message 0 of the conversation has no string 'content'"),
    ([{"role": 1, "content": None}], "; message 0 of the conversation has no string 'role' or 'content'"),
    ([user("x"), "x"], "; conversation 1 is a str"),
    ([user("x"), [{"role": "user", "content": "x"}, 3]], "; message 1 of conversation 1 is a int"),
    (7, ", got int"),
])
def test_bad_messages_are_one_line(tiny_llm, messages, says):
    with pytest.raises(ParamsError) as e:
        tiny_llm.chat(messages)
    assert str(e.value) == ASK + says


def test_chat_without_a_tokenizer_is_one_line():
    llm = LLM("tiny")
    llm.tokenizer = None
    with pytest.raises(ParamsError, match=r"^chat\(\) needs a tokenizer: .* has no tokenizer.json") as e:
        llm.chat(user("hi"))
    assert "\n" not in str(e.value)


def test_cli_says_whether_it_applies_the_template(capsys):
    args = ["generate", "--model", "tiny", "--prompt", QUESTIONS[0], "--max-new-tokens", "8", "--json",
            "--threads", "1"]
    assert main(args) == 0
    got = capsys.readouterr()
    assert got.err.splitlines() == [template_line(True)]
    assert template_line(True) == "applying the chat template (--no-chat-template sends the prompt as is)"
    rec = json.loads(got.out)  # stdout: the JSON objects only, as before
    assert set(rec) == {"prompt", "text", "token_ids", "finish_reason", "stats"} and len(got.out.splitlines()) == 1
    assert main(args + ["--no-chat-template"]) == 0
    got = capsys.readouterr()
    assert got.err.splitlines() == ["sending the prompt as is"] and json.loads(got.out)["prompt"] == QUESTIONS[0]
