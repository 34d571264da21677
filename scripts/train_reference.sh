#!/usr/bin/env bash
# Train every reference checkpoint the way checkpoints/ was made: configs/tiny.toml on the prose
# corpus, one folder per encoding at seed 0, and fire and kerple_power also at seeds 1 and 2; and
# the randomized-position runs (issue #18): fire_offset (seeds 0 and 1), fire_s_offset and
# fire_offset_nopi, trained with train.random_position_offset=7680 (the last also without FIRE's
# progressive interpolation); and the position-parameter runs (issue #35): fire_L512_plr10 and
# t5_plr10 (the encoding's parameters in their own AdamW group at 10 × lr; FIRE's L starting at
# 512), and alibi at seeds 1 and 2 (the paired rows' reference needs its own seed spread); and the two
# arms that separate FIRE's init_L from that learning rate (issue #51): fire_L512 (init_L 512, 1 × lr)
# and fire_L128_plr10 (init_L 128, the default, at 10 × lr).
#
#   scripts/train_reference.sh [OUT_ROOT] [more `fireviz train` options, e.g. --stop-at-step 2500]
#
# OUT_ROOT defaults to runs/reference (not checkpoints/, so the shipped folders stay as they are);
# RUNS="fire fire_seed1" trains only those folders (names: <encoding>[_offset|_offset_nopi|_L512_plr10|_L512|_L128_plr10|_plr10][_seed<N>]).
# Re-running continues each unfinished run exactly (--resume; a run stopped before its first
# checkpoint at step 100 starts again) and finished runs are a no-op, so the script can be stopped
# at any point and started again. Python: .venv's (make venv), else python3 on PATH, or PYTHON=. A run is 3,700 steps; one CPU core does
# ≈ 1,000 steps in 20–45 min. Then evaluate as docs/protocol.md says (scripts/publish_results.py).
set -euo pipefail
repo=$(CDPATH= cd -- "$(dirname "$0")/.." && pwd)
root=${1:-$repo/runs/reference}
if [[ $root == -* ]]; then
  echo "usage: $0 [OUT_ROOT] [fireviz train options]: the first argument is the output folder" \
       "(got option '$root'; e.g. $0 runs/reference $*)" >&2
  exit 2
fi
shift $(( $# > 0 ? 1 : 0 ))
# OUT_ROOT is relative to where the script is called from (the default is in the repository)
mkdir -p -- "$root"
root=$(CDPATH= cd -- "$root" && pwd)
cd "$repo"
# the project's virtual environment (make venv), else the python on PATH; PYTHON= overrides
if [[ -n ${PYTHON:-} ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=$(command -v python3 || command -v python) ||
  { echo "no python3 or python on PATH: run make venv, or set PYTHON=/path/to/python" >&2; exit 2; }
fi
runs=(${RUNS:-nope rope t5 alibi kerple_log kerple_power sandwich fire fire_s
       fire_seed1 fire_seed2 kerple_power_seed1 kerple_power_seed2
       fire_offset fire_offset_seed1 fire_s_offset fire_offset_nopi
       fire_L512_plr10 t5_plr10 alibi_seed1 alibi_seed2 fire_L512 fire_L128_plr10})
for name in "${runs[@]}"; do
  out="$root/$name"
  base=${name%_seed*} variant=()
  case $base in  # the variants of the recipe: random absolute positions, and without progressive interpolation
    *_offset_nopi) base=${base%_offset_nopi}
      variant=(--set train.random_position_offset=7680 --set model.encoding_options.progressive_interpolation=false) ;;
    *_offset) base=${base%_offset} variant=(--set train.random_position_offset=7680) ;;
    # position parameters that can reach their values (issue #35): their own AdamW group at 10 × lr,
    # and FIRE's threshold L starting at the training length
    *_L512_plr10) base=${base%_L512_plr10}
      variant=(--set train.position_lr_multiplier=10 --set model.encoding_options.init_L=512) ;;
    *_L128_plr10) base=${base%_L128_plr10}
      variant=(--set train.position_lr_multiplier=10 --set model.encoding_options.init_L=128) ;;
    *_L512) base=${base%_L512} variant=(--set model.encoding_options.init_L=512) ;;
    *_plr10) base=${base%_plr10} variant=(--set train.position_lr_multiplier=10) ;;
  esac
  args=(--config configs/tiny.toml --set "model.position_encoding=$base" "${variant[@]}"
        --set train.checkpoint_interval=100)
  [[ $name == *_seed* ]] && args+=(--set "train.seed=${name##*_seed}")
  # one trainer per folder: a second copy of this script skips a run that is being trained
  exec {lock}>"$root/.$name.lock"
  if ! flock -n "$lock"; then
    echo "$out is being trained by another process; skipping it" >&2
    exec {lock}>&-
    continue
  fi
  # the same settings on resume: fireviz train checks them against the checkpoint
  if [ -f "$out/trainer_state.safetensors" ]; then
    args+=(--resume)
  elif [ -d "$out" ]; then
    # stopped before its first checkpoint (step 100): nothing there can be resumed, start again
    extra=$(find "$out" -mindepth 1 ! -name train_log.jsonl ! -name config.json ! -name '.*.tmp-*' -print -quit)
    if [ -n "$extra" ]; then
      echo "$out has no trainer state to resume but holds other files ($extra); move it away and re-run" >&2
      exit 2
    fi
    echo "$out stopped before its first checkpoint; starting it again" >&2
    rm -rf "$out"
  fi
  "$PY" -m fireviz train "${args[@]}" --out "$out" "$@"
  exec {lock}>&-
done
