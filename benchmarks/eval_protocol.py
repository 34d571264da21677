"""Cost of the published evaluation protocol per checkpoint, per length and in total.

Usage::

    .venv/bin/python benchmarks/eval_protocol.py [--checkpoints checkpoints/fire,checkpoints/alibi]
        [--data prose] [--lengths 128,256,512,1024,2048,4096,8192] [--documents 0] [--device cpu]

The published protocol is ``fireviz.eval.evaluation``'s default ``mode="same_text"``: every
validation document that holds the largest length M, its first M tokens scored at every
length (no token budget). This script runs exactly that through ``evaluate_many`` with the
cache off (``use_cache=False``, so nothing is read from a cache or a shipped results.json)
and prints, per checkpoint and length, the documents, windows, tokens scored, seconds and
tokens/s, then the total per checkpoint — with the CPU model and thread count, since the
figures differ between machine kinds. ``--documents N`` scores only N documents (drawn
with the seed) for a quicker estimate; the time scales linearly with the documents.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fireviz.cli.eval import format_table  # noqa: E402
from fireviz.eval import DEFAULT_LENGTHS, evaluate_many, with_paired_differences  # noqa: E402


def cpu_model() -> str:
    """The CPU's model name (lscpu's "model name" from /proc/cpuinfo), or the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoints", default="checkpoints/fire", help="comma-separated checkpoint folders (default %(default)s)"
    )
    p.add_argument("--data", default="prose")
    p.add_argument("--lengths", default=",".join(str(n) for n in DEFAULT_LENGTHS))
    p.add_argument("--documents", type=int, default=0, help="0 = every qualifying document (the protocol)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="also write the results (evaluate's JSON, paired vs the first) here")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"CPU: {cpu_model()} · {torch.get_num_threads()} torch threads · torch {torch.__version__}")
    print(
        f"protocol: data {args.data}, validation split, mode same_text, lengths {lengths}, "
        + ("every qualifying document" if args.documents == 0 else f"{args.documents} documents")
    )
    grand = 0.0
    everything = []
    for ckpt in args.checkpoints.split(","):
        budget = None if args.documents == 0 else args.documents * (max(lengths) - 1)
        t0 = time.perf_counter()
        r = evaluate_many([ckpt], args.data, lengths, token_budget=budget, device=args.device, use_cache=False)[0]
        total = time.perf_counter() - t0
        grand += total
        everything.append(r)
        print(
            f"\n{ckpt} ({r['position_encoding']}): {r['settings']['documents_scored']} documents × "
            f"{r['settings']['prefix_tokens']} tokens"
        )
        print(f"{'length':>7} {'docs':>5} {'windows':>8} {'tokens':>9} {'seconds':>8} {'tokens/s':>9}")
        for e in r["per_length"]:
            if "error" in e:
                print(f"{e['length']:>7}  error: {e['error']}")
                continue
            print(
                f"{e['length']:>7} {e['documents']:>5} {e['windows']:>8} {e['tokens_scored']:>9} "
                f"{e['seconds']:>8.1f} {e['tokens_scored'] / e['seconds']:>9.0f}"
            )
        print(f"total {total:.1f} s ({total / 60:.1f} min) for this checkpoint, loading and planning included")
    print(f"\nall checkpoints: {grand:.1f} s ({grand / 60:.1f} min)")
    if args.out:
        from fireviz.core import write_json_atomic

        everything = with_paired_differences(everything, 0)
        write_json_atomic(args.out, everything)
        print(format_table(everything))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
