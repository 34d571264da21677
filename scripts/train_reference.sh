#!/usr/bin/env bash
# Train every reference checkpoint the way checkpoints/ was made: configs/tiny.toml on the prose
# corpus, one folder per encoding at seed 0, and fire and kerple_power also at seeds 1 and 2.
#
#   scripts/train_reference.sh [OUT_ROOT] [more `fireviz train` options, e.g. --stop-at-step 2500]
#
# OUT_ROOT defaults to runs/reference (not checkpoints/, so the shipped folders stay as they are);
# RUNS="fire fire_seed1" trains only those folders (names: <encoding> or <encoding>_seed<N>).
# Re-running continues each unfinished run exactly (--resume) and finished runs are a no-op, so the
# script can be stopped at any point and started again. A run is 3,700 steps; one CPU core does
# ≈ 1,000 steps in 20–40 min. Then evaluate as the README says (scripts/publish_results.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
root=${1:-runs/reference}
if [[ $root == -* ]]; then
  echo "usage: $0 [OUT_ROOT] [fireviz train options]: the first argument is the output folder" \
       "(got option '$root'; e.g. $0 runs/reference $*)" >&2
  exit 2
fi
shift $(( $# > 0 ? 1 : 0 ))
runs=(${RUNS:-nope rope t5 alibi kerple_log kerple_power sandwich fire fire_s
       fire_seed1 fire_seed2 kerple_power_seed1 kerple_power_seed2})
for name in "${runs[@]}"; do
  out="$root/$name"
  args=(--config configs/tiny.toml --set "model.position_encoding=${name%_seed*}"
        --set train.checkpoint_interval=100)
  [[ $name == *_seed* ]] && args+=(--set "train.seed=${name##*_seed}")
  # the same settings on resume: fireviz train checks them against the checkpoint
  [ -f "$out/trainer_state.safetensors" ] && args+=(--resume)
  "$PY" -m fireviz train "${args[@]}" --out "$out" "$@"
done
