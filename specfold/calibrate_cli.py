"""`specfold calibrate`: calibrate a Spiffy draft graph by replaying vanilla decoding (the command
around `specfold.decoding.drafts.calibrate.calibrate`)."""
from __future__ import annotations

import argparse

from specfold.decoding.drafts.calibrate import MAX_DEPTH, SELECTIONS, calibrate, read_prompts


def _cmd(a: argparse.Namespace) -> int:
    from specfold.args import llm_from_args, params_from_args
    params = params_from_args(a)  # bad settings fail before the model is loaded
    llm = llm_from_args(a)
    prompts = read_prompts(a.prompts)[: a.limit]
    g = calibrate(llm, prompts, params, a.branches, a.selection, a.max_depth)
    g.save(a.out)
    m = g.meta
    print(f"wrote {a.out}: {len(g)} nodes from {m['roots']} roots over {m['prompts']} prompts "
          f"(rule {m['rule']}); estimated hit rates {[round(x, 3) for x in m['hit_rate_estimate']]}")
    return 0


def register(subparsers) -> None:
    from specfold.args import add_model_args, add_settings, positive_int
    from specfold.params import EngineConfig, draft_fields
    ap = subparsers.add_parser("calibrate", help="calibrate a Spiffy draft graph by replaying vanilla decoding")
    add_model_args(ap, parallel=False)  # calibration swaps the verifier: one rank only
    # it replays greedy vanilla decoding: no method, no drafts, no sampling; --branches is the graph's size
    unused = tuple(n for n in draft_fields(EngineConfig) if n != "branches") + ("method", "temperature", "seed",
                                                                                 "logprobs")
    add_settings(ap, exclude=unused)
    ap.add_argument("--prompts", required=True, help="JSON Lines with 'prompt' or 'question', or plain text lines")
    ap.add_argument("--limit", type=positive_int, default=50, help="prompts used (default 50)")
    ap.add_argument("--out", required=True, help="graph JSON to write")
    ap.add_argument("--max-depth", type=positive_int, default=MAX_DEPTH,
                    help=f"deepest node of the graph (default {MAX_DEPTH}): a graph of depth D at fixed branches")
    ap.add_argument("--selection", choices=SELECTIONS, default="degree1",
                    help="node choice: count + parent's count (Spiffy's degree-1 accumulation) or count alone")
    ap.set_defaults(func=_cmd)
