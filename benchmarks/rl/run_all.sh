#!/usr/bin/env bash
# Every engine x mode of the RL workload, one after the other, JSON into $OUT (default
# benchmarks/rl/results), then the reward-equality check over all of them.
# Usage (from the repo root, venv active): bash benchmarks/rl/run_all.sh [engines...]
set -u
OUT=${OUT:-benchmarks/rl/results}
ITER=${ITER:-10}
ENGINES=${*:-serial mp rtml spark ray}
mkdir -p "$OUT"
for engine in $ENGINES; do
  for spec in "episode 10" "fine 10" "fine 50"; do
    set -- $spec
    name="$engine-$1"; [ "$1" = fine ] && name="$name-k$2"
    python benchmarks/rl/run.py --engine "$engine" --mode "$1" --k "$2" --iterations "$ITER" \
      --json "$OUT/$name.json" 2>&1 | grep -v -e WARN -e "^Setting default log level" \
      -e "^To adjust logging level"
    [ "${PIPESTATUS[0]}" = 0 ] || rm -f "$OUT/$name.json"
  done
done
python benchmarks/rl/check_same.py "$OUT"/*.json
