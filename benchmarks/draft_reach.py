"""How far drafts reach (issue 14): forwards with drafts that cross into the next sub-block (and, in
eager windows, the next block) against the same drafts stopped at the end of the rule's region.

    python benchmarks/draft_reach.py [--model tiny] [--n 50] [--rule sub_block] [--graph G.json]

Under the model's native sub-block rule, each method runs twice on the same held-out problems: as
shipped (the verification also computes the next region's logits, `Step.ahead`, and the drafts go
on there) and with the look-ahead hidden from the drafts (their reach before issue 14). Both must
give vanilla's tokens (checked); the table gives forwards per problem and their ratio to vanilla.
One thread, float32; forwards are a property of the model and the rule, not of the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.decoding.plugins import Step  # noqa: E402


class StopAtRegion:
    """The same policy with `Step.ahead` hidden: drafts stop at the rule region's end."""
    reads_ahead = False

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def drafts(self, root, parent, ctx):
        if parent is not None:
            parent = Step(parent.state, parent.scored, parent.next, parent.region, None)
        return self.inner.drafts(root, parent, ctx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--rule", default=None, help="default: the model's own")
    ap.add_argument("--graph", default=None, help="Spiffy graph (default: the shipped one)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    llm = LLM(a.model, dtype="float32")
    rows = [json.loads(x) for x in (Path(llm.path) / "heldout.jsonl").read_text().splitlines()[: a.n]]
    prompts = [llm.encode(r["question"], DecodeParams(chat_template=True)) for r in rows]
    base = DecodeParams(rule=a.rule, chat_template=True, max_new_tokens=a.max_new_tokens)
    van = [llm.decoder(base).run(p) for p in prompts]
    v_nfe = sum(st.nfe for _, _, st in van)
    print(f"model {llm.path}, rule {base.resolve(llm.spec).rule}, {len(rows)} held-out problems; vanilla "
          f"{v_nfe / len(rows):.2f} forwards per problem\n")
    print("| method | drafts reach | forwards/problem | × vanilla | tokens = vanilla's |")
    print("|---|---|---|---|---|")
    methods = {"FreeDave++ d=8": dict(method="freedave", draft_depth=8),
               "FreeDave++ d=8 eager": dict(method="freedave", draft_depth=8, eager=True),
               "Spiffy B=7": dict(method="spiffy", branches=7, graph=a.graph),
               "Spiffy B=7 eager": dict(method="spiffy", branches=7, graph=a.graph, eager=True)}
    for name, kw in methods.items():
        p = base.replace(**kw)
        for reach in ("next region", "rule region only"):
            dec = llm.decoder(p)
            if reach != "next region":
                dec.policy = StopAtRegion(dec.policy)
            got = [dec.run(pr) for pr in prompts]
            same = all(g[0] == v[0] for g, v in zip(got, van))
            nfe = sum(st.nfe for _, _, st in got)
            print(f"| {name} | {reach} | {nfe / len(rows):.2f} | {nfe / v_nfe:.3f} | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
