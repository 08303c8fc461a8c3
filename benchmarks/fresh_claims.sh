#!/bin/sh
# Table 1 and the engine table on fresh problems (specfold.tiny.fresh, seed 0: the problems of task
# tiny_fresh, written once to OUTDIR/fresh.jsonl so that each bench process need not rebuild the
# exclusion set), every configuration side by side in one bench record file per rule, one thread.
#
#   benchmarks/fresh_claims.sh MODEL OUTDIR N [CHUNK]     # MODEL: tiny or a `specfold widen` folder
#
# Resumable (bench's JSONL records) and interleaved: the first CHUNK problems (default 16) go through
# every configuration, then the next CHUNK, ... up to N, so a change of load on a shared machine
# hits every configuration alike. Per chunk and rule (native = the model's own, static = k=1):
#   batch 1:  vanilla; FreeDave d=8 and Spiffy B=7, plain and eager, at the fixed budget 7 (every
#             draft: the old tables' setting); SpecFold δ = 0, 0.05, 0.1 at budget 7; FreeDave,
#             Spiffy and SpecFold (δ = 0.05) at draft_budget=auto;
#   batch 16: 16 concurrent requests through one engine: vanilla, FreeDave, Spiffy, SpecFold
#             (δ = 0.05) at budget 7 and auto.
# CONFIGS=core (for the widened models: a fifth of the CPU time each): batch 1 without the eager
# windows and δ = 0, auto for Spiffy and SpecFold only; batch 16 without FreeDave at auto.
# SPECFOLD_PY (default: python) runs `-m specfold`; set PYTHONPATH to run another tree's code.
# Tables: python benchmarks/fresh_report.py OUTDIR
set -e
MODEL=$1; OUT=$2; N=$3; CHUNK=${4:-16}
[ -n "$N" ] || { echo "usage: $0 MODEL OUTDIR N [CHUNK]" >&2; exit 2; }
PY=${SPECFOLD_PY:-python}
mkdir -p "$OUT"
[ -f "$OUT/fresh.jsonl" ] || $PY -m specfold.tiny.fresh --seed 0 --n "$N" --out "$OUT/fresh.jsonl"
bench() {
  OMP_NUM_THREADS=1 $PY -m specfold bench --model "$MODEL" --tasks tiny --data "$OUT/fresh.jsonl" --threads 1 \
    --max-new-tokens 96 \
    --draft-depth 8 --branches 7 --no-progress "$@" > /dev/null
}
lim=$CHUNK
while [ "$lim" -le "$N" ]; do
  for rule in native static; do
    if [ "$rule" = static ]; then R="--rule static --tokens-per-step 1"; else R=""; fi
    f="$OUT/$rule.jsonl"
    echo "$(date -u +%H:%M:%S) $rule, first $lim problems, load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/log.txt"
    # shellcheck disable=SC2086
    if [ "$CONFIGS" = core ]; then
      bench $R --limit "$lim" --out "$f" --methods vanilla,freedave,spiffy --sweep draft_budget=7 --sweep eager=false
      bench $R --limit "$lim" --out "$f" --methods vanilla,specfold --sweep draft_budget=7 --sweep delta=0.05,0.1
      bench $R --limit "$lim" --out "$f" --methods vanilla,spiffy,specfold --sweep draft_budget=auto
      bench $R --limit "$lim" --out "$f" --methods vanilla,freedave,spiffy,specfold --sweep draft_budget=7 --batch-sizes 16
      bench $R --limit "$lim" --out "$f" --methods vanilla,spiffy,specfold --sweep draft_budget=auto --batch-sizes 16
    else
      bench $R --limit "$lim" --out "$f" --methods vanilla,freedave,spiffy --sweep draft_budget=7 --sweep eager=false,true
      bench $R --limit "$lim" --out "$f" --methods vanilla,specfold --sweep draft_budget=7 --sweep delta=0,0.05,0.1
      bench $R --limit "$lim" --out "$f" --methods vanilla,freedave,spiffy,specfold --sweep draft_budget=auto
      bench $R --limit "$lim" --out "$f" --methods vanilla,freedave,spiffy,specfold --sweep draft_budget=7,auto \
        --batch-sizes 16
    fi
  done
  lim=$((lim + CHUNK))
done
echo "$(date -u +%H:%M:%S) done, load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/log.txt"
