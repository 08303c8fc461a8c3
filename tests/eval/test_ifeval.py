"""IFEval checkers: a satisfying and a violating response per instruction type, strict vs loose."""
from __future__ import annotations

import json

import pytest

from specfold.eval.instructions import CHECKERS, check_one, follows
from specfold.eval.instructions.text import count_sentences, word_tokens
from specfold.eval.tasks import get_task
from specfold.eval.tasks.base import Sample

pytestmark = pytest.mark.slow  # IFEval's checkers: langdetect and nltk load

CASES = [
    ("punctuation:no_comma", {}, "No commas here at all.", "Well, a comma."),
    ("keywords:existence", {"keywords": ["banana", "kiwi"]}, "A Banana and a kiwi.", "Only a banana."),
    ("keywords:forbidden_words", {"forbidden_words": ["cat"]}, "Concatenate dogs.", "The Cat sat."),
    ("keywords:frequency", {"keyword": "data", "frequency": 3, "relation": "at least"},
     "data, Data and DATA", "data and data"),
    ("keywords:frequency", {"keyword": "data", "frequency": 2, "relation": "less than"}, "one data", "data data"),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zigzag", "zebra"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "Four words right here.",
     "These are five whole words."),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     "Dr. Smith came. He left!", "Dr. Smith came and left."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\nSecond.", "First.\n***\n***\nSecond."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "Start here.\n\n\"Then, more.", "Start here.\n\nAfter that."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name] at [address]", "Dear [name]"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. bye", "Hi. PS bye"),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\np.p.s. more", "Hi.\nP.S. more"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n- two", "* one\n* two\n* three"),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*a* and **b**", "*a* and * *"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nfoo\nSection 2\nbar", "Section 1\nfoo"),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{'a': 1}"),
    ("detectable_format:title", {}, "<<My Poem>>\nroses", "<< >> no title"),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", "Same.\n******\nSame."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", "Hi! Say hi."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?\"",
     "Any other questions? Done."),
    ("startend:quotation", {}, '"All quoted."', '"Not closed.'),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"},
     "THIS IS GREAT", "This IS fine"),
    ("change_case:english_lowercase", {}, "this is an english sentence written in lower case letters.",
     "This has a Capital letter in an English sentence."),
    ("change_case:english_capital", {}, "THIS IS AN ENGLISH SENTENCE WRITTEN IN CAPITAL LETTERS.",
     "THIS IS MOSTLY CAPITAL but not all."),
    ("language:response_language", {"language": "fr"}, "Bonjour, je suis très content de vous voir aujourd'hui.",
     "Hello, I am very happy to see you today, my friend."),
]


@pytest.mark.parametrize("iid,kwargs,good,bad", CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)])
def test_checker_accepts_and_rejects(iid, kwargs, good, bad):
    assert check_one(iid, good, kwargs)
    assert not check_one(iid, bad, kwargs)


def test_every_data_instruction_id_has_a_checker_and_a_case(data_dir):
    ids = set()
    for line in (data_dir / "ifeval" / "input_data.jsonl").read_text().splitlines():
        ids.update(json.loads(line)["instruction_id_list"])
    assert len(ids) == 25 and ids == set(CHECKERS)
    assert {c[0] for c in CASES} == ids


def test_blank_response_follows_nothing():
    assert not check_one("punctuation:no_comma", "   ", {})


def test_loose_forgives_first_line_and_markdown():
    strict, loose = follows("Sure, here it is:\n\"quoted answer\"", ["startend:quotation"], [{}])
    assert strict == [False] and loose == [True]
    strict, loose = follows("**done**", ["startend:end_checker"], [{"end_phrase": "done"}])
    assert strict == [False] and loose == [True]


def test_none_kwargs_are_ignored():
    assert check_one("punctuation:no_comma", "ok", {"keywords": None})


def test_text_helpers():
    assert count_sentences("Mr. Brown went home. It rained! Did it? Yes.") == 4
    assert count_sentences("It costs 3.5 dollars. and then some") == 2  # punkt: only abbreviations hold a period
    assert word_tokens("DON'T stop") == ["DO", "N'T", "stop"]


def test_task_scores_and_aggregates():
    task = get_task("ifeval")
    s = Sample("ifeval/1", "p", {"instruction_id_list": ["punctuation:no_comma", "startend:quotation"],
                                 "kwargs": [{}, {}]})
    good, half = task.score(s, '"no commas"'), task.score(s, "no commas")
    assert good["correct"] and good["inst_strict"] == [True, True]
    assert not half["correct"] and half["inst_strict"] == [True, False]
    agg = task.aggregate([good, half])
    assert agg == {"accuracy": 0.5, "prompt_strict": 0.5, "prompt_loose": 0.5, "inst_strict": 0.75, "inst_loose": 0.75}
