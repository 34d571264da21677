"""Train a synthetic-task group's recipe at more seeds and count how many seeds learn the task.

A copy-task run either learns the task (answer accuracy ≈ 1 at the training length, after a sudden
drop in loss somewhere between steps ~1,000 and 6,000) or does not (loss stays near log 64 nats,
accuracy near chance), and which one a run ends in flips with float rounding across CPU kinds
(issue #40). One checkpoint per encoding is then not a result: this script trains the group's
recipe — each shipped checkpoint's own config, only ``train.seed`` changed — at ``--seeds`` into
``--runs`` (resumable: a finished run is a no-op, a stopped one continues exactly), scores every run
and the shipped checkpoint (seed 0) at the training length on the same fresh sequences, and writes
``checkpoints/<group>/seeds.json``. ``scripts/publish_task_group.py`` prints its table in the
group's RESULTS.md: seeds per encoding and how many learned the task.

    python scripts/task_seeds.py [--group copy] [--seeds 1,2] [--runs runs/task_seeds]
        [--only alibi,fire] [--publish-only]

A run "learns the task" when its answer accuracy at the training length is at least
``LEARNED_ACCURACY`` (0.9; chance is 1/64). Training a copy run takes ~5 min on one free core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from publish_results import ROOT

from fireviz.checkpoints import checkpoint_groups, read_train_log, scan_checkpoints
from fireviz.core import write_json_atomic
from fireviz.eval import SYNTHETIC_SEQUENCES, EvaluationError, evaluate_many
from fireviz.model import CheckpointError

CKPTS = ROOT / "checkpoints"
#: answer accuracy at the training length from which a run counts as having learned the task
LEARNED_ACCURACY = 0.9
SEEDS_FILE = "seeds.json"


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", default="copy", help="sub-folder of checkpoints/ (default copy)")
    ap.add_argument("--seeds", default="1,2", help="training seeds beside the shipped seed 0 (default 1,2)")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "task_seeds"), help="where the runs are trained")
    ap.add_argument("--only", default="", help="comma-separated encodings (default: every one in the group)")
    ap.add_argument("--sequences", type=int, default=SYNTHETIC_SEQUENCES, help="sequences scored per run")
    ap.add_argument("--publish-only", action="store_true", help="train nothing: score the finished runs")
    return ap.parse_args(argv)


def train(shipped: Path, seed: int, out: Path) -> bool:
    """Train (or continue) ``shipped``'s recipe at ``seed`` into ``out``; True once it is finished."""
    config = json.loads((shipped / "config.json").read_text())
    steps = config["training"]["settings"]["max_steps"]
    if _finished(out, steps):
        return True
    cmd = [sys.executable, "-m", "fireviz", "train", "--out", str(out), "--no-progress"]
    if (out / "trainer_state.json").exists():
        cmd.append("--resume")
    else:
        recipe = ROOT / "configs" / f"{shipped.parent.name}.toml"
        if not recipe.exists():
            sys.exit(
                f"no recipe {recipe} for the group {shipped.parent.name!r}: a group's recipe is configs/<group>.toml"
            )
        cmd += ["--config", str(recipe)]
        cmd += ["--set", f"model.position_encoding={config['position_encoding']}", "--set", f"train.seed={seed}"]
    print(f"training {out.name}: {' '.join(cmd[1:])}", flush=True)
    t = time.time()
    done = subprocess.run(cmd, cwd=ROOT).returncode == 0
    print(f"  {'finished' if done else 'FAILED'} in {time.time() - t:.0f} s", flush=True)
    return done and _finished(out, steps)


def _finished(out: Path, steps: int) -> bool:
    if not (out / "model.safetensors").exists():
        return False
    log = read_train_log(out)
    return bool(log) and log[-1].get("step") == steps


def score(folders: list[Path], task: str, seq_len: int, sequences: int) -> list[dict]:
    """Answer accuracy at the training length of each folder, on the same fresh sequences."""
    runs = evaluate_many([str(f) for f in folders], task, [seq_len], token_budget=sequences, device="cpu")
    rows = []
    for f, r in zip(folders, runs, strict=True):
        (e,) = r["per_length"]
        log = read_train_log(f)
        cfg = json.loads((f / "config.json").read_text())
        rows.append(
            {
                "encoding": cfg["position_encoding"],
                "seed": cfg["training"]["settings"]["seed"],
                "folder": str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f),
                "accuracy": e.get("accuracy"),
                "accuracy_ci95": e.get("accuracy_ci95"),
                "bits_per_answer_token": e.get("bits_per_byte"),
                "final_train_loss": log[-1].get("loss") if log else None,
                "learned": isinstance(e.get("accuracy"), float) and e["accuracy"] >= LEARNED_ACCURACY,
                "command": cfg["training"].get("command"),
            }
        )
    return rows


def main(argv=None) -> int:
    a = _args(argv)
    groups = checkpoint_groups(CKPTS)
    if a.group not in groups or not a.group:
        sys.exit(f"no checkpoint group {a.group!r} under {CKPTS}")
    gdir = groups[a.group]
    infos, _ = scan_checkpoints(gdir)
    only = {x for x in a.only.split(",") if x}
    shipped = [Path(i.path) for i in infos if not only or Path(i.path).name in only]
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s]
    except ValueError:
        sys.exit(f"--seeds {a.seeds!r} is not a comma-separated list of whole numbers, e.g. 1,2")
    runs_root = Path(a.runs).expanduser().resolve()
    folders: list[Path] = []
    for ck in shipped:
        folders.append(ck)
        for s in seeds:
            out = runs_root / f"{ck.name}_seed{s}"
            if a.publish_only and not _finished(
                out, json.loads((ck / "config.json").read_text())["training"]["settings"]["max_steps"]
            ):
                print(f"not finished, left out: {out}", file=sys.stderr)
                continue
            if a.publish_only or train(ck, s, out):
                folders.append(out)
    info = infos[0]
    try:
        rows = score(folders, info.data, info.seq_len, a.sequences)
    except (EvaluationError, CheckpointError) as e:
        sys.exit(f"cannot score the runs: {e}")
    out = {
        "task": info.data,
        "training_length": info.seq_len,
        "sequences": a.sequences,
        "learned_accuracy": LEARNED_ACCURACY,
        "rows": rows,
    }
    write_json_atomic(gdir / SEEDS_FILE, out)
    for r in rows:
        print(f"{r['encoding']:14s} seed {r['seed']}: accuracy {r['accuracy']:.3f}, learned {r['learned']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
