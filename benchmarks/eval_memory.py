"""Time and peak memory of ``fireviz.eval.evaluation`` at long evaluation lengths, per encoding.

Usage::

    .venv/bin/python benchmarks/eval_memory.py [--lengths 512,1024,2048,4096,8192]
        [--encodings nope,rope,alibi,t5,fire] [--windows 1] [--device cpu] [--limit-gb 3]

Each (encoding, length) runs in a fresh subprocess so its peak RSS (``ru_maxrss`` of that
child, read with ``os.wait4``) measures that evaluation alone, including Python + torch
(the "baseline" column: RSS after imports and model construction, before evaluating).
The model is the ~1M-parameter shape of the issue (d_model 128, 4 layers, 4 heads,
seq_len 512), randomly initialised — enough for memory and time, not for perplexity. The
data is one synthetic document per window, evaluated with ``evaluate_checkpoint`` exactly
as the CLI does (non-overlapping, batch size 1 at these lengths, cache off).

Prints a table (seconds of the whole ``evaluate_checkpoint`` call — loading and hashing
the checkpoint, reading the data — and of the scoring alone, scored tokens/s, baseline
and peak RSS in GB) and exits 1
if any peak exceeds ``--limit-gb`` (the issue's budget: 3 GB at 8192 on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENCODINGS = ("nope", "rope", "alibi", "t5", "fire")
LENGTHS = (512, 1024, 2048, 4096, 8192)


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def child(encoding: str, length: int, windows: int, device: str) -> None:
    """Evaluate one (encoding, length) and print a JSON line with the timings."""
    sys.path.insert(0, str(ROOT))
    import random

    import torch

    from fireviz.eval import evaluate_checkpoint
    from fireviz.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, d_model=128, seq_len=512, position_encoding=encoding))
    params = model.num_parameters()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "ckpt")
        del model
        rng = random.Random(length)
        with open(Path(tmp) / "data.jsonl", "w") as f:
            for i in range(windows):
                text = "".join(rng.choice("etaoin shrdlu\n") for _ in range(length - 1))
                f.write(json.dumps({"id": f"doc{i}", "text": text}) + "\n")
        baseline_kb = _rss_kb("VmRSS")
        t0 = time.perf_counter()
        result = evaluate_checkpoint(
            Path(tmp) / "ckpt",
            Path(tmp) / "data.jsonl",
            [length],
            token_budget=None,
            split="all",
            device=device,
            use_cache=False,
        )
        seconds = time.perf_counter() - t0
    entry = result["per_length"][0]
    if "error" in entry:
        raise SystemExit(f"{encoding} @ {length}: {entry['error']}")
    print(
        json.dumps(
            {
                "encoding": encoding,
                "length": length,
                "params": params,
                "seconds": seconds,
                "score_seconds": entry["seconds"],
                "tokens": entry["tokens_scored"] + entry["windows"],
                "baseline_kb": baseline_kb,
                "self_hwm_kb": _rss_kb("VmHWM"),
                "threads": torch.get_num_threads(),
            }
        )
    )


def run_one(encoding: str, length: int, windows: int, device: str) -> dict:
    """One fresh child process; adds its peak RSS (KB, from wait4) to the child's report."""
    cmd = [sys.executable, __file__, "--child", encoding, str(length), "--windows", str(windows), "--device", device]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)  # reaps the child and returns its own rusage
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code:
            err.seek(0)
            raise RuntimeError(f"{encoding} @ {length} failed ({code}):\n{err.read()[-2000:]}")
    row = json.loads(out.strip().splitlines()[-1])
    row["peak_kb"] = usage.ru_maxrss  # KB on Linux
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--encodings", default=",".join(ENCODINGS))
    p.add_argument("--windows", type=int, default=1, help="windows evaluated per run (default 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--limit-gb", type=float, default=3.0)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--child", nargs=2, metavar=("ENCODING", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.windows, args.device)
        return 0
    rows = []
    print(
        f"{'encoding':8s} {'length':>6s} {'total s':>8s} {'score s':>8s} {'tok/s':>8s} {'baseline GB':>11s} "
        f"{'peak GB':>8s}",
        flush=True,
    )
    for enc in args.encodings.split(","):
        for n in (int(x) for x in args.lengths.split(",")):
            r = run_one(enc, n, args.windows, args.device)
            rows.append(r)
            print(
                f"{enc:8s} {n:6d} {r['seconds']:8.2f} {r['score_seconds']:8.2f} "
                f"{r['tokens'] / r['score_seconds']:8.0f} "
                f"{r['baseline_kb'] / 2**20:11.2f} {r['peak_kb'] / 2**20:8.2f}",
                flush=True,
            )
    print(f"model: {rows[0]['params']:,} parameters; torch threads {rows[0]['threads']}; one fresh process per row")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    over = [r for r in rows if r["peak_kb"] / 2**20 > args.limit_gb]
    for r in over:
        print(f"OVER BUDGET: {r['encoding']} @ {r['length']}: {r['peak_kb'] / 2**20:.2f} GB > {args.limit_gb} GB")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
