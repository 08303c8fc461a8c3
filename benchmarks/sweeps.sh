#!/usr/bin/env bash
# SpecFold / Spiffy sweeps in the shape of the SpecFold paper's Figs. 4, 5 and 8 (issue 14), on one
# checkpoint (default: the embedded model widened to the 0.5B preset width, a cost proxy) under its
# native rule, one thread:
#   delta:       δ ∈ {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7}   -> accuracy against tokens/s
#   branches:    B = 2..8 for Spiffy and SpecFold                      -> tokens/s gain against B
#   graph depth: D = 1..4 at B = 7 for Spiffy and SpecFold (graphs calibrated with --max-depth D)
#                                                                      -> tokens/s gain against D
# Usage: benchmarks/sweeps.sh [MODEL_DIR] [OUT_DIR] [N_PROBLEMS]
# Every run compares with vanilla on the same problems in the same process (records and plots in OUT_DIR).
set -euo pipefail
MODEL=${1:-runs/widened/tiny-0.5b-l4}
OUT=${2:-runs/sweeps}
N=${3:-20}
PY=${PYTHON:-python}
mkdir -p "$OUT"
[ -d "$MODEL" ] || $PY -m specfold widen --model tiny --preset 0.5b --out "$MODEL"
common=(--model "$MODEL" --tasks tiny --limit "$N" --threads 1 --max-new-tokens 96 --no-progress)
$PY -m specfold bench "${common[@]}" --methods vanilla,specfold \
    --sweep delta=0,0.01,0.02,0.05,0.1,0.2,0.3,0.5,0.7 --out "$OUT/delta.jsonl" --plot "$OUT/delta"
$PY -m specfold bench "${common[@]}" --methods vanilla,spiffy,specfold \
    --sweep branches=2..8 --out "$OUT/branches.jsonl" --plot "$OUT/branches"
$PY benchmarks/depth_sweep.py --model "$MODEL" --depths 1,2,3,4 --branches 7 --n "$N" --out "$OUT/depth"
