"""Generated IFEval responses and the official checkers, for the agreement test and benchmark.

`responses(record, rng, n)` builds `n` programmatic responses for one IFEval prompt: the prompt's
own text and sentence soup from all prompts, shaped by the record's instructions near their
thresholds (sentence/word/paragraph/bullet/highlight/section counts one under, at and over the
limit, keywords repeated around their frequency, letters, JSON in each fence style, titles,
postscripts, quotes, two responses, repeated prompts, end phrases, first words, upper/lower case,
commas, markdown stars, a chatty first or last line for the loose variants).

`official()` imports lm-eval's IFEval checkers with nltk pointed at the punkt parameters shipped
in specfold (so both sides split sentences with the same data; lm-eval's `immutabledict`
dependency is replaced by `dict` when absent).
"""
from __future__ import annotations

import json
import random
import re
import sys
import types
from pathlib import Path

from specfold.eval.instructions.text import PUNKT_DIR

NLTK_DATA = PUNKT_DIR.parents[2]


def official():
    """lm-eval's `utils` module (test_instruction_following_strict/loose), or None if absent."""
    try:
        import langdetect  # noqa: F401
        import nltk
    except ImportError:
        return None
    if "immutabledict" not in sys.modules:
        try:
            import immutabledict  # noqa: F401
        except ImportError:
            shim = types.ModuleType("immutabledict")
            shim.immutabledict = dict
            sys.modules["immutabledict"] = shim
    if str(NLTK_DATA) not in nltk.data.path:
        nltk.data.path.insert(0, str(NLTK_DATA))
    try:
        from lm_eval.tasks.ifeval import instructions_util, utils
    except ImportError:
        return None
    instructions_util._get_sentence_tokenizer.cache_clear()
    return utils


def load_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sentence_pool(records: list[dict]) -> list[str]:
    pool = []
    for r in records:
        pool += [s.strip() for s in re.split(r"(?<=[.!?])\s+", r["prompt"]) if len(s.strip()) > 3]
    pool += ["Dr. Smith arrived at 5 P.M. It was late.", "Yes. No. Maybe.", "The U.S. economy grew 2.5 percent.",
             "See Fig. 3 for details.", "It costs $3.50, i.e. cheap.", "Mr. and Mrs. Jones left... Then rain.",
             "J. R. R. Tolkien wrote it.", "Wait!! Really?! Yes.", "\"Go now.\" She left.", "e.g. this one. And that."]
    return pool


def _soup(rng: random.Random, pool: list[str], k: int) -> str:
    return " ".join(rng.choice(pool) for _ in range(k))


def _shape(rng: random.Random, pool: list[str], iid: str, kw: dict, text: str) -> str:
    """One transformation of `text` aimed at instruction `iid` (kwargs `kw`)."""
    d = rng.choice([-1, 0, 1])
    if iid == "length_constraints:number_sentences":
        return _soup(rng, pool, max(1, kw["num_sentences"] + d))
    if iid == "length_constraints:number_words":
        words = _soup(rng, pool, 60).split()
        return " ".join(words[: max(1, kw["num_words"] + d * rng.randint(1, 3))])
    if iid == "length_constraints:number_paragraphs":
        sep = rng.choice(["\n***\n", "\n\n***\n\n", " *** ", "\n***\n\n***\n"])
        return sep.join(_soup(rng, pool, 2) for _ in range(max(1, kw["num_paragraphs"] + d)))
    if iid == "length_constraints:nth_paragraph_first_word":
        paras = [_soup(rng, pool, 2) for _ in range(max(1, kw["num_paragraphs"] + d))]
        i = kw["nth_paragraph"] - 1
        if i < len(paras):
            w = kw["first_word"]
            paras[i] = rng.choice([w, w.capitalize(), f'"{w}', f"{w},", w + "s"]) + " " + paras[i]
        return rng.choice(["\n\n", "\n\n\n", "\n"]).join(paras)
    if iid == "detectable_format:number_bullet_lists":
        n = max(0, kw["num_bullets"] + d)
        return text + "\n" + "\n".join(rng.choice(["* ", "- ", "  * ", "*", "** "]) + rng.choice(pool) for _ in range(n))
    if iid == "detectable_format:number_highlighted_sections":
        n = max(0, kw["num_highlights"] + d)
        return text + " " + " ".join(rng.choice(["*{}*", "**{}**", "* {} *", "*{}", "** **"]).format(rng.choice(pool)[:20]) for _ in range(n))
    if iid == "detectable_format:multiple_sections":
        sp = kw["section_spliter"]
        n = max(1, kw["num_sections"] + d)
        return "\n".join(f"{rng.choice([sp, sp.upper(), sp.lower()])} {i + 1}\n{_soup(rng, pool, 2)}" for i in range(n))
    if iid == "detectable_content:number_placeholders":
        n = max(0, kw["num_placeholders"] + d)
        return text + " " + " ".join(rng.choice(["[name]", "[ address ]", "[]", "[x"]) for _ in range(n))
    if iid == "detectable_content:postscript":
        m = kw["postscript_marker"]
        return text + rng.choice(["\n\n", "\n", " "]) + rng.choice([m, m.lower(), m.replace(".", ""), "P.S.", "P. S.", "PS:"]) + " " + rng.choice(pool)
    if iid in ("keywords:existence", "keywords:forbidden_words"):
        words = kw.get("keywords") or kw.get("forbidden_words")
        ins = [rng.choice([w, w.upper(), w + "s", "un" + w]) for w in words if rng.random() < 0.7]
        return text + " " + " ".join(ins)
    if iid == "keywords:frequency":
        k = kw["keyword"]
        return text + " " + " ".join(rng.choice([k, k.upper(), k + "ing"]) for _ in range(max(0, kw["frequency"] + d)))
    if iid == "keywords:letter_frequency":
        return text + " " + kw["letter"] * max(0, kw["let_frequency"] + d)
    if iid == "detectable_format:json_format":
        body = json.dumps({"answer": rng.choice(pool)}, indent=rng.choice([None, 2]))
        body = body if rng.random() < 0.8 else body[:-1]
        fence = rng.choice(["```json\n{}\n```", "```JSON\n{}\n```", "```Json\n{}\n```", "```\n{}\n```", "{}",
                            "```json```json\n{}\n```", "Here:\n```json\n{}\n```", "```json\n{}", "```json```{}```"])
        return fence.format(body)
    if iid == "detectable_format:title":
        return rng.choice(["<<{}>>\n", "<< >>\n", "<<{}\n", "Title: <<{}>>\n", "<<\n{}>>\n"]).format(rng.choice(pool)[:20]) + text
    if iid == "combination:two_responses":
        a, b = rng.choice(pool), rng.choice(pool)
        return rng.choice(["{}\n******\n{}", "{}\n******\n{}\n******", "{}\n*****\n{}", "{0}\n******\n{0}"]).format(a, b)
    if iid == "combination:repeat_prompt":
        p = kw["prompt_to_repeat"]
        return rng.choice([p, p.upper(), p[:-1], "Sure! " + p]) + "\n" + text
    if iid == "startend:end_checker":
        e = kw["end_phrase"]
        return text + " " + rng.choice([e, e.lower(), e + ".", e + '"', e[:-1], e + "\nThanks"])
    if iid == "startend:quotation":
        return rng.choice(['"{}"', '"{}', "'{}'", ' "{}" ', '"{}"\n']).format(text)
    if iid == "detectable_format:constrained_response":
        return rng.choice(["My answer is yes.", "My answer is no.", "My answer is maybe.", "My answer is Yes.",
                           "Yes.", "my answer is no."]) + rng.choice(["", " " + rng.choice(pool)])
    if iid == "change_case:capital_word_frequency":
        words = text.split()
        n = max(0, kw["capital_frequency"] + d)
        return " ".join(w.upper() if i < n else w.lower() for i, w in enumerate(words))
    if iid in ("change_case:english_capital", "change_case:english_lowercase"):
        return rng.choice([text.upper(), text.lower(), text])
    if iid == "punctuation:no_comma":
        return text.replace(",", "") if rng.random() < 0.6 else text
    return text


def responses(record: dict, pool: list[str], rng: random.Random, n: int) -> list[str]:
    out = [record["prompt"]]
    while len(out) < n:
        text = rng.choice([record["prompt"], _soup(rng, pool, rng.randint(1, 8))])
        for iid, kw in zip(record["instruction_id_list"], record["kwargs"]):
            if rng.random() < 0.8:
                text = _shape(rng, pool, iid, {k: v for k, v in kw.items() if v is not None}, text)
        r = rng.random()
        if r < 0.15:
            text = "Sure, here is my response:\n" + text
        elif r < 0.25:
            text = text + "\nI hope this helps!"
        elif r < 0.3:
            text = "**" + text + "**"
        elif r < 0.33:
            text = ""
        out.append(text)
    return out
