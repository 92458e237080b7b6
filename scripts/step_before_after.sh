#!/usr/bin/env bash
# The same training jobs on an earlier commit and on this tree, alternately, on this machine: whether a change made
# a step slower. Prints each run's steady step, its data phase and the ratio of the medians (this tree / earlier).
#
#   scripts/step_before_after.sh REV [ROUNDS] -- JOB FLAGS...
#   scripts/step_before_after.sh 7242292 3 -- --dataset mnist --data-dir ../shared/data --max-steps 30
#
# Each job runs as `python -m mpi_train FLAGS --no-tracking --summary-json ...` (add mpirun yourself with
# MPIRUN="mpirun -np 4 --oversubscribe"); the earlier commit is checked out into a temporary worktree, removed
# on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$1; shift
rounds=3
if [ "${1:-}" != "--" ]; then rounds=$1; shift; fi
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d)
trap 'git worktree remove --force "$work/before" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/before" "$rev" >/dev/null 2>&1
here=$(pwd)
read -r -a launch <<< "${MPIRUN:-}"
for round in $(seq "$rounds"); do
    for side in before after; do
        tree=$([ "$side" = before ] && echo "$work/before" || echo "$here")
        out="$work/$side-$round.json"
        (cd "$tree" && PYTHONPATH="$tree" "${launch[@]}" python -m mpi_train "$@" --no-tracking --summary-json "$out" \
            > "$work/$side-$round.log" 2>&1) || { echo "the $side job failed:"; tail -20 "$work/$side-$round.log"; exit 1; }
    done
done
python - "$work" "$rounds" <<'EOF'
import json, statistics, sys
from pathlib import Path
work, rounds = Path(sys.argv[1]), int(sys.argv[2])
steps = {}
for side in ("before", "after"):
    for round_ in range(1, rounds + 1):
        means = json.loads((work / f"{side}-{round_}.json").read_text())["mean_times_after_warmup"]
        steps.setdefault(side, []).append(means["step_time_s"])
        print(f"{side:>6} round {round_}: step {means['step_time_s'] * 1e3:8.1f} ms, data {means['data_time_s'] * 1e3:7.2f} ms")
before, after = statistics.median(steps["before"]), statistics.median(steps["after"])
print(f"median step: before {before * 1e3:.1f} ms, after {after * 1e3:.1f} ms, after / before {after / before:.3f}")
EOF
