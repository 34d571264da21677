"""``python -m fireviz train``: parse the arguments into settings and run ``fireviz.train.loop.train``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from fireviz.data import DataError
from fireviz.model import CheckpointError
from fireviz.train import TrainingError, TrainingInterrupted, load_config, train


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m fireviz train`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m fireviz train",
        description="Train a GPT with one position encoding (on a corpus's bytes, or on token shards).",
    )
    p.add_argument("--config", help="TOML file with [model] and [train] tables (optional with --resume)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, e.g. --set model.position_encoding=alibi --set train.lr=3e-4",
    )
    p.add_argument("--out", required=True, help="checkpoint folder to create (or continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument(
        "--stop-at-step",
        type=int,
        metavar="N",
        help="stop after step N (checkpoint written) keeping the max_steps schedule; continue later "
        "with --resume (training in sessions)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry: returns 0 on success, 2 with one line on stderr for any bad input."""
    args = build_parser().parse_args(argv)
    command = " ".join(
        shlex.quote(a) for a in ["python", "-m", "fireviz", "train", *(sys.argv[1:] if argv is None else argv)]
    )
    try:
        if args.config is None and not args.resume:
            raise TrainingError("--config is required (except with --resume, which reuses the checkpoint's)")
        if args.config is None:
            if args.set:
                raise TrainingError("--set needs --config (a resumed run keeps its checkpoint's settings)")
            mc = tc = None
        else:
            mc, tc = load_config(args.config, args.set)
        result = train(
            mc,
            tc,
            args.out,
            resume=args.resume,
            command=command,
            progress=False if args.no_progress else None,
            stop_at_step=args.stop_at_step,
        )
    except TrainingInterrupted as e:  # Ctrl-C: stopped after a whole step, its checkpoint written
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"fireviz train: {e}", file=sys.stderr)
        return 130
    except (TrainingError, DataError, CheckpointError) as e:
        rank = os.environ.get("RANK")
        prefix = f"fireviz train [rank {rank}]" if rank not in (None, "0") else "fireviz train"
        print(f"{prefix}: error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        vals = ", ".join(f"{k}={result[k]:.4f}" for k in ("loss",) if result.get(k) is not None)
        if result.get("val_step") is not None:  # the last validation, which may be from an earlier step
            at = "" if result["val_step"] == result["step"] else f" (validated at step {result['val_step']})"
            vals += (
                (", " if vals else "")
                + ", ".join(f"{k}={result[k]:.4f}" for k in ("val_loss", "val_loss_4x") if result.get(k) is not None)
                + at
            )
        print(
            f"trained to step {result['step']} ({result['tokens']} tokens) → {result['out_dir']}"
            + (f": {vals}" if vals else "")
        )
    return 0
