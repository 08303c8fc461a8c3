"""`specfold bench` / `specfold eval` on a small random checkpoint with a character tokenizer:
the table and the JSONL, resume without recomputation, corrupt lines, parameter mismatches, sweeps,
plots; and, when the embedded tiny model ships its quality figures, that bench reproduces them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specfold.eval.bench import run_bench
from specfold.eval.sweeps import expand_runs, parse_sweep
from specfold.eval.plots import write_plots
from specfold.eval.records import CorruptRecordError, ResumeError, load_records
from specfold.eval.summary import format_table, summarize, token_match
from specfold.params import DecodeParams
from tests.eval.test_bench_model import text_checkpoint

pytestmark = pytest.mark.slow  # bench and eval runs, accuracy decodes, plots

torch.set_num_threads(1)
N = 3  # samples per task
BASE = DecodeParams(chat_template=True, max_new_tokens=8)


@pytest.fixture(scope="module")
def model_dir(checkpoint, tmp_path_factory) -> Path:
    return text_checkpoint(checkpoint(peaked=30.0), tmp_path_factory.mktemp("textmodel"))


@pytest.fixture(scope="module")
def llm(model_dir):
    from specfold import LLM
    return LLM(str(model_dir))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("tinydata") / "heldout.jsonl"
    p.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                         for i in range(5)))
    return p


class Counting:
    """Wraps an LLM and counts generate calls."""

    def __init__(self, llm):
        self.llm, self.path, self.calls = llm, llm.path, 0

    def generate(self, prompts, params, use_tqdm=False):
        self.calls += len(prompts)
        return self.llm.generate(prompts, params)


def bench(llm, data, out, methods=("vanilla", "freedave"), sweeps=(("draft_depth", [2, 4]),), **kw):
    return run_bench(llm, ["tiny"], list(methods), kw.pop("base", BASE), list(sweeps), str(data), N, out,
                     model_name="m", progress=False, **kw)


def test_cli_bench_table_jsonl_resume_and_plots(model_dir, data, tmp_path, capsys, monkeypatch):
    from specfold.api import LLM
    from specfold.cli import main
    out, plots = tmp_path / "b.jsonl", tmp_path / "plots"
    argv = ["bench", "--model", str(model_dir), "--tasks", "tiny", "--data", str(data), "--limit", str(N),
            "--methods", "vanilla,freedave", "--max-new-tokens", "8", "--sweep", "draft_depth=2..3",
            "--out", str(out), "--plot", str(plots), "--threads", "1", "--no-progress", "--warmup", "0"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| task | method | setting |" in table and "tok/s" in table
    for setting in ("| vanilla | default |", "| freedave | draft_depth=2 |", "| freedave | draft_depth=3 |"):
        assert setting in table
    recs = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(recs) == N * 3  # vanilla once (draft_depth only steers drafts) + 2 sweep points
    for r in recs:
        assert {"task", "id", "method", "setting", "output", "score", "nfe", "tokens", "seconds",
                "fold_ratio", "match", "exact"} <= set(r)
        assert (r["match"] is None) == (r["method"] == "vanilla")
    assert out.with_suffix(".md").read_text().count("| freedave |") == 2
    assert not (plots / "gain_vs_branches.png").exists()  # no branches sweep
    for name in ("accuracy_vs_speed.png", "speed_vs_vanilla.png"):
        png = plots / name
        assert png.is_file() and png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"

    calls = []
    real = LLM.generate
    monkeypatch.setattr(LLM, "generate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert main(argv) == 0
    assert calls == []  # everything resumed
    assert capsys.readouterr().out.splitlines()[:5] == table.splitlines()[:5]
    assert len(out.read_text().splitlines()) == N * 3


def test_cli_bench_says_when_it_resumes_and_overwrite_starts_over(model_dir, data, tmp_path, capsys, monkeypatch):
    """`specfold bench` without --out writes ./bench.jsonl; a rerun resumes from it and says so in one
    line (how many records, which file, how to start over); --overwrite recomputes every record."""
    from specfold.cli import main
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--model", str(model_dir), "--tasks", "tiny", "--data", str(data), "--limit", "2",
            "--methods", "vanilla", "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--warmup", "0"]
    out = tmp_path / "bench.jsonl"
    assert main(argv) == 0
    assert "resuming" not in capsys.readouterr().err  # a new file: nothing to resume
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2
    out.write_text("".join(json.dumps(dict(r, output="STORED")) + "\n" for r in recs))
    assert main(argv) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "resum" in line]
    assert said == ["bench: resuming from bench.jsonl (2 records found; only the missing ones run); "
                    "to start over pass --overwrite or delete the file"]
    assert [json.loads(line)["output"] for line in out.read_text().splitlines()] == ["STORED"] * 2
    assert main(argv + ["--overwrite"]) == 0
    assert "resum" not in capsys.readouterr().err
    again = [json.loads(line)["output"] for line in out.read_text().splitlines()]
    assert again == [r["output"] for r in recs]  # recomputed, not the stored ones
    e = ["eval", "--model", str(model_dir), "--tasks", "tiny", "--data", str(data), "--limit", "2",
         "--max-new-tokens", "8", "--no-progress", "--warmup", "0", "--out", "e.jsonl"]
    assert main(e) == 0 and main(e) == 0
    assert "eval: resuming from e.jsonl (2 records found;" in capsys.readouterr().err


def test_resume_continues_an_interrupted_run(llm, data, tmp_path):
    out = tmp_path / "r.jsonl"
    first = Counting(llm)
    full = bench(first, data, out)
    assert first.calls == N * 3
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:4]) + "\n")  # interrupted after 4 records
    again = Counting(llm)
    recs = bench(again, data, out)
    assert again.calls == N * 3 - 4
    assert [(r["id"], r["method"], r["setting"]) for r in recs] == \
           [(r["id"], r["method"], r["setting"]) for r in full]
    assert [r["token_ids"] for r in recs] == [r["token_ids"] for r in full]


def test_corrupt_line_is_an_error_naming_its_line(llm, data, tmp_path):
    out = tmp_path / "c.jsonl"
    bench(Counting(llm), data, out, methods=("vanilla",), sweeps=())
    lines = out.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a half-written record on line 2
    out.write_text("\n".join(lines))  # and no final newline
    before = out.read_text()
    again = Counting(llm)
    with pytest.raises(CorruptRecordError, match=rf"{out.name}:2: not a complete record") as e:
        bench(again, data, out, methods=("vanilla",), sweeps=())
    assert "\n" not in str(e.value) and again.calls == 0 and out.read_text() == before
    out.write_text(before.replace(lines[1], '["a list"]'))
    with pytest.raises(CorruptRecordError, match=":2: not a complete record .not a JSON object"):
        load_records(out)


def test_resume_refuses_other_parameters(llm, data, tmp_path):
    out = tmp_path / "p.jsonl"
    bench(Counting(llm), data, out, methods=("vanilla",), sweeps=())
    again = Counting(llm)
    with pytest.raises(ResumeError, match="max_new_tokens: 8 -> 6"):
        bench(again, data, out, methods=("vanilla",), sweeps=(), base=BASE.replace(max_new_tokens=6))
    assert again.calls == 0


def test_sweeps_and_runs():
    assert parse_sweep("delta=0,0.05,0.1") == ("delta", [0, 0.05, 0.1])
    assert parse_sweep("branches=2..5") == ("branches", [2, 3, 4, 5])
    with pytest.raises(ValueError, match="cannot sweep 'bogus'"):
        parse_sweep("bogus=1,2")
    runs = expand_runs(["specfold", "vanilla"], BASE, [("delta", [0.0, 0.1]), ("branches", [2, 4])])
    assert [(r.method, r.setting) for r in runs][:2] == [("vanilla", "default"), ("specfold", "delta=0.0,branches=2")]
    assert len(runs) == 1 + 4 and runs[-1].params.branches == 4 and runs[-1].params.delta == 0.1
    # delta is read by specfold only: the other methods run once, each compared with the one vanilla
    runs = expand_runs(["vanilla", "freedave", "spiffy", "specfold"], BASE, [("delta", [0, 0.1, 0.2])])
    assert [(r.method, r.setting, r.ref_setting) for r in runs] == [
        ("vanilla", "default", "default"), ("freedave", "default", "default"), ("spiffy", "default", "default"),
        ("specfold", "delta=0", "default"), ("specfold", "delta=0.1", "default"), ("specfold", "delta=0.2", "default")]
    runs = expand_runs(["freedave", "spiffy"], BASE, [("draft_depth", [2, 4]), ("branches", [3])])
    assert [(r.method, r.setting) for r in runs] == [
        ("freedave", "draft_depth=2"), ("freedave", "draft_depth=4"), ("spiffy", "branches=3")]
    assert runs[0].params.draft_depth == 2 and runs[2].params.branches == 3
    runs = expand_runs(["vanilla", "freedave"], BASE, [("threshold", [0.5, 0.9])])  # applies to vanilla too
    assert [(r.method, r.setting, r.ref_setting) for r in runs] == [
        ("vanilla", "threshold=0.5", "threshold=0.5"), ("vanilla", "threshold=0.9", "threshold=0.9"),
        ("freedave", "threshold=0.5", "threshold=0.5"), ("freedave", "threshold=0.9", "threshold=0.9")]


def _rec(method, setting, i, tokens, nfe, secs, ids, sweep=None, correct=True):
    return {"task": "tiny", "id": f"tiny/{i}", "method": method, "setting": setting, "sweep": sweep or {},
            "ref_setting": "default", "score": {"correct": correct}, "correct": correct, "nfe": nfe,
            "tokens": tokens, "seconds": secs, "fold_ratio": 0.5 if method == "specfold" else None,
            "token_ids": ids, "match": None if method == "vanilla" else token_match(ids, [1, 2, 3, 4])[0],
            "exact": None if method == "vanilla" else ids == [1, 2, 3, 4]}


def test_summarize_ratios_and_plots(tmp_path):
    recs = [_rec("vanilla", "default", i, 4, 8, 1.0, [1, 2, 3, 4]) for i in range(2)]
    for b in (2, 4):
        recs += [_rec("specfold", f"branches={b}", i, 4, 8 // b, 1.0 / b, [1, 2, 3, 5] if i else [1, 2, 3, 4],
                      sweep={"branches": b}, correct=i == 0) for i in range(2)]
    rows = summarize(recs)
    v, s2, s4 = rows
    assert v["accuracy_x"] == 1.0 and v["tokens_per_second"] == 4.0
    assert s4["tokens_per_second_x"] == 4.0 and s4["nfe_per_sample_x"] == 0.25 and s4["accuracy_x"] == 0.5
    assert s2["match"] == pytest.approx(0.875) and s2["exact"] == 0.5 and s2["fold_ratio"] == 0.5
    assert "| tiny | specfold | branches=4 | 2 | 0.500 | 0.50 |" in format_table(rows)
    paths = write_plots(rows, tmp_path / "p")
    assert [p.name for p in paths] == ["accuracy_vs_speed.png", "speed_vs_vanilla.png", "gain_vs_branches.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    deep = summarize([dict(r, sweep={"graph_depth": r["sweep"]["branches"]}) if r.get("sweep") else r for r in recs])
    assert [p.name for p in write_plots(deep, tmp_path / "d")][-1] == "gain_vs_graph_depth.png"
    assert token_match([], []) == (1.0, True) and token_match([1, 2], [1, 2, 3]) == (2 / 3, False)


def test_cli_eval_prints_accuracy_and_speed(model_dir, data, tmp_path, capsys):
    from specfold.cli import main
    out = tmp_path / "e.jsonl"
    assert main(["eval", "--model", str(model_dir), "--tasks", "tiny", "--data", str(data), "--limit", "2",
                 "--max-new-tokens", "8", "--out", str(out), "--no-progress", "--warmup", "0"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("tiny [vanilla]: accuracy 0.000 (n=2) |") and "tokens/s" in line
    assert len(out.read_text().splitlines()) == 2
    assert main(["bench", "--model", str(model_dir), "--tasks", "nope", "--no-progress"]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


# ------------------------------------------------------------------ the embedded tiny model
TINY = Path(__file__).resolve().parents[2] / "specfold" / "tiny" / "model"
QUALITY = TINY / "quality.json"


def test_cli_bench_on_tiny_model(tmp_path, capsys):
    if not (TINY / "config.json").is_file():
        pytest.skip("the embedded tiny model is not trained yet")
    from specfold.cli import main
    out = tmp_path / "t.jsonl"
    assert main(["bench", "--model", "tiny", "--tasks", "tiny", "--limit", "2", "--methods", "vanilla",
                 "--max-new-tokens", "32", "--out", str(out), "--no-progress", "--warmup", "0"]) == 0
    assert "| tiny | vanilla | default | 2 |" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 2


def check_quality(llm, quality: dict, data: str | None = None) -> list[str]:
    """Compare bench's vanilla accuracy on the tiny task with `quality` (the format of quality.json:
    {"vanilla_<rule>": {"accuracy": a, "n": n, optional DecodeParams fields such as "max_new_tokens"
    (and "rule", overriding the key's), optional "correct": [bool per held-out sample], optional
    "tolerance"}}); the names of the entries checked. bench must give the same accuracy on the first n
    samples (exactly, unless a tolerance is given). Entries with n > 64 run only with
    SPECFOLD_EVAL_FULL=1, unless they list per-sample `correct`, then checked on the first 16."""
    fields = set(DecodeParams.__dataclass_fields__)
    full, checked = os.environ.get("SPECFOLD_EVAL_FULL") == "1", []
    for name, entry in vanilla_entries(quality).items():
        method, _, rule = name.partition("_")
        n = int(entry["n"])
        k = n if full or n <= 64 else (16 if "correct" in entry else 0)
        if not k:
            continue
        params = DecodeParams(chat_template=True, rule=entry.get("rule", rule or None),
                              **{f: v for f, v in entry.items() if f in fields and f not in ("method", "rule")})
        recs = run_bench(llm, ["tiny"], ["vanilla"], params, data=data, limit=k, progress=False)
        assert len(recs) == k, (name, len(recs), k)  # every sample asked for was scored
        if k == n:
            acc = summarize(recs)[0]["accuracy"]
            assert acc == pytest.approx(entry["accuracy"], abs=entry.get("tolerance", 1e-9)), name
        else:
            assert [r["correct"] for r in recs] == [bool(c) for c in entry["correct"][:k]], name
        checked.append(name)
    return checked


def vanilla_entries(quality: dict) -> dict:
    """The entries of quality.json that bench can check: vanilla figures with an accuracy."""
    return {name: e for name, e in quality.items()
            if name.partition("_")[0] == "vanilla" and isinstance(e, dict) and "accuracy" in e}


def test_quality_check_itself(llm, data, tmp_path):
    entry = {"n": 3, "max_new_tokens": 8, "rule": "threshold"}
    checked = check_quality(llm, {"vanilla_static": dict(entry, accuracy=0.0), "other": {}}, str(data))
    assert checked == ["vanilla_static"]
    with pytest.raises(AssertionError, match="vanilla_static"):
        check_quality(llm, {"vanilla_static": dict(entry, accuracy=2 / 3)}, str(data))
    big = {"n": 500, "accuracy": 0.9, "max_new_tokens": 8, "correct": [False] * 500}
    if os.environ.get("SPECFOLD_EVAL_FULL") != "1":  # per sample on the first 16
        many = tmp_path / "many.jsonl"
        many.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                                for i in range(16)))
        assert check_quality(llm, {"vanilla_threshold": big}, str(many)) == ["vanilla_threshold"]
        with pytest.raises(AssertionError, match="vanilla_threshold"):  # one sample's verdict differs
            check_quality(llm, {"vanilla_threshold": dict(big, correct=[False, True] + [False] * 498)}, str(many))
        with pytest.raises(AssertionError, match="vanilla_threshold"):  # fewer samples than asked for
            check_quality(llm, {"vanilla_threshold": big}, str(data))
        unchecked = {k: v for k, v in big.items() if k != "correct"}  # n > 64, no per-sample verdicts
        assert check_quality(llm, {"vanilla_threshold": unchecked}, str(many)) == []


def test_bench_reproduces_tiny_model_quality(tiny_llm):
    """Every vanilla figure quality.json ships is reproduced by bench: on all n samples with
    SPECFOLD_EVAL_FULL=1, otherwise per sample on the first 16 (none left unchecked)."""
    if not QUALITY.is_file():
        pytest.skip(f"{QUALITY} not written yet (tiny-model issue)")
    quality = json.loads(QUALITY.read_text())
    want = list(vanilla_entries(quality))
    assert want, f"{QUALITY} lists no vanilla accuracy"
    assert check_quality(tiny_llm, quality) == want, ("entries with n > 64 need per-sample 'correct' "
                                                      "(or SPECFOLD_EVAL_FULL=1) to be checked")


def test_plots_are_readable(monkeypatch, tmp_path):
    """13 points close together (the README command's count): named in a legend, not by overlapping text;
    13 distinct colours; accuracy axes [0, 1] with a margin; one bar per non-vanilla row."""
    from matplotlib.colors import to_hex

    from specfold.eval import plots
    figs = {}
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: figs.setdefault(Path(path).name, fig) and
                        real(plt, fig, path))
    recs = [_rec("vanilla", "default", i, 4, 8, 1.0, [1, 2, 3, 4]) for i in range(2)]
    for b in range(1, 13):
        recs += [_rec("specfold", f"branches={b}", i, 4, 8, 1.0 + 0.01 * b, [1, 2, 3, 4], sweep={"branches": b})
                 for i in range(2)]
    rows = summarize(recs)
    write_plots(rows, tmp_path)
    acc = figs["accuracy_vs_speed.png"]
    ax = acc.axes[0]
    lo, hi = ax.get_ylim()
    assert lo < 0.0 and 1.0 < hi and ax.get_yticks()[0] == 0.0 and ax.get_yticks()[-1] == 1.0 and len(ax.texts) == 0
    van = next(r["tokens_per_second"] for r in rows if r["method"] == "vanilla")
    assert [tuple(line.get_xdata()) for line in ax.get_lines()] == [(van, van)]  # vanilla's reference line
    assert ax.get_xlim()[1] >= max(r["tokens_per_second"] for r in rows)        # no point cut off
    labels = [t.get_text() for t in acc.legends[0].get_texts()]
    assert labels == ["vanilla"] + [f"specfold branches={b}" for b in range(1, 13)]
    colours = {to_hex(c) for coll in ax.collections for c in coll.get_facecolor()}
    assert len(colours) == 13
    bars = figs["speed_vs_vanilla.png"].axes[0]
    assert [t.get_text() for t in bars.get_yticklabels()] == labels[1:]
    gain = figs["gain_vs_branches.png"].axes[0]
    assert [line.get_label() for line in gain.get_lines() if not line.get_label().startswith("_")] == ["tiny specfold"]


def test_accuracy_plot_shows_every_point_whole(monkeypatch, tmp_path):
    """Every marker of accuracy_vs_speed.png lies whole inside its axes, in pixels: points at accuracy
    1 (an easy task) and 0, and the fastest point of each panel (the plot used to cut every point at
    accuracy 1 by the top edge)."""
    import numpy as np

    from specfold.eval import plots
    figs = {}
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: figs.setdefault(Path(path).name, fig) and
                        real(plt, fig, path))
    rows = [{"task": "tiny", "method": m, "setting": "default", "tokens_per_second": tps, "accuracy": 1.0}
            for m, tps in (("vanilla", 100.0), ("freedave", 140.0), ("spiffy", 120.0), ("specfold", 160.0))]
    rows += [{"task": "gsm8k", "method": "vanilla", "setting": "default", "tokens_per_second": 80.0, "accuracy": 0.0},
             {"task": "gsm8k", "method": "specfold", "setting": "default", "tokens_per_second": 90.0, "accuracy": 0.5}]
    plots.plot_accuracy_speed(rows, tmp_path / "a.png")
    fig = figs["a.png"]
    fig.canvas.draw()
    seen = 0
    for ax in fig.axes:
        box = ax.get_window_extent()
        for coll in ax.collections:
            centres = ax.transData.transform(coll.get_offsets())
            radii = np.broadcast_to(np.sqrt(coll.get_sizes()) / 2 * fig.dpi / 72, (len(centres),))
            for (x, y), r in zip(centres, radii):
                assert box.x0 + r <= x <= box.x1 - r and box.y0 + r <= y <= box.y1 - r, (ax.get_title(), x, y, r, box)
                seen += 1
    assert seen == len(rows)


def test_eval_progress_bar_says_eval(model_dir, data, capsys):
    from specfold.cli import main
    assert main(["eval", "--model", str(model_dir), "--tasks", "tiny", "--data", str(data), "--limit", "2",
                 "--max-new-tokens", "8", "--warmup", "0"]) == 0
    err = capsys.readouterr().err
    assert "eval: 100%" in err and "bench" not in err


def test_outside_forward_share():
    """The share of decode time outside the model forwards: 1 - model seconds / seconds per group,
    and a dash for records that carry no engine timing."""
    recs = [dict(_rec("vanilla", "default", i, 4, 8, 2.0, [1, 2, 3, 4]), extra={"model_seconds": m})
            for i, m in enumerate((1.9, 1.7))]
    recs += [_rec("spiffy", "default", i, 4, 4, 1.0, [1, 2, 3, 4]) for i in range(2)]
    v, s = summarize(recs)
    assert v["outside_forward"] == pytest.approx(1 - 3.6 / 4.0) and s["outside_forward"] is None
    table = format_table([v, s])
    assert table.splitlines()[0].endswith("| outside fwd |") and "| 10.0% |" in table.splitlines()[2]
    assert table.splitlines()[3].endswith("| — |")


def test_table_says_which_rows_are_approximate():
    recs = [_rec("vanilla", "default", 0, 4, 8, 1.0, [1, 2, 3, 4])]
    for d in (0, 0.1):
        recs.append(dict(_rec("specfold", f"delta={d}", 0, 4, 4, 1.0, [1, 2, 3, 4], sweep={"delta": d}),
                         params={"method": "specfold", "delta": d}))
    recs.append(dict(_rec("spiffy", "default", 0, 4, 4, 1.0, [1, 2, 3, 4]), params={"method": "spiffy", "delta": 0.1}))
    notes = [ln for ln in format_table(summarize(recs)).splitlines() if ln.startswith("- approximate")]
    assert len(notes) == 1 and notes[0].endswith(": specfold delta=0.1; every other method is lossless")


def test_batch_sizes_budgets_and_the_batch_plot(llm, data, tmp_path):
    """`bench --batch-sizes`: every run also at batch B (B requests through one engine, compared with
    vanilla at the same B, tokens equal to batch 1's), the draft budgets in the table, and the
    tokens/s-against-batch-size plot."""
    out = tmp_path / "b.jsonl"
    recs = bench(llm, data, str(out), methods=("vanilla", "freedave"), sweeps=(("draft_budget", ["auto", 0, 2]),),
                 batch_sizes=(1, 3))
    rows = summarize(recs)
    by = {(r["method"], r["setting"]): r for r in rows}
    assert set(by) == {("vanilla", "default"), ("vanilla", "batch=3")} | {
        ("freedave", f"draft_budget={b}{s}") for b in ("auto", 0, 2) for s in ("", ",batch=3")}
    one = {(r["method"], r["setting"].replace(",batch=3", "").replace("batch=3", "default"), r["id"]): r["token_ids"]
           for r in recs if r["batch"] == 1}
    for r in recs:  # batching and budgets never change tokens
        assert r["token_ids"] == one[(r["method"], r["setting"].replace(",batch=3", "").replace("batch=3", "default"), r["id"])]
        assert r["match"] in (None, 1.0)
    assert by[("freedave", "draft_budget=0,batch=3")]["mean_budget"] == 0
    assert 0 < by[("freedave", "draft_budget=2")]["mean_budget"] <= 2
    b3 = [r for r in recs if r["batch"] == 3 and r["method"] == "vanilla"]
    assert len({r["throughput_seconds"] for r in b3}) == 1  # one batch: its wall time shared
    assert len({r["cpu_seconds"] for r in b3}) == 1 and all(r["cpu_seconds"] > 0 for r in recs)  # CPU time too
    table = format_table(rows)
    assert "| drafts/verif. | outside fwd |" in table.splitlines()[0]
    paths = write_plots(rows, tmp_path / "plots")
    assert tmp_path / "plots" / "speed_vs_batch.png" in paths
    assert (tmp_path / "plots" / "speed_vs_batch.png").stat().st_size > 10_000
