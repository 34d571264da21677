"""Training throughput (tokens/s) per position encoding on the tiny config, and its ratio to NoPE.

    .venv/bin/python benchmarks/train_throughput.py [--config configs/tiny.toml] [--steps 3]
        [--repeats 5] [--batch-size 16] [--threads N] [--encodings nope,fire,...] [--json out.json]

One training step = forward + backward + AdamW update of ``batch_size`` windows of
``seq_len`` tokens (``fireviz.train.step.training_step``, the loop's own step). The machine is
shared, so the encodings are *interleaved*: each repeat runs every encoding once, in a
rotated order, for ``--steps`` timed steps after one untimed warm-up step; the reported
figure is the median over repeats of tokens/s, and the ratio is median(enc) / median(nope).
Models and optimizers are built once per encoding, outside the timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fireviz.data import TokenStream, load_documents, split_documents
from fireviz.encodings import ENCODING_NAMES
from fireviz.model import GPT
from fireviz.train import apply_overrides, build_optimizer, configs_from_tables, training_step, window_starts


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per encoding. Returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "tiny.toml"))
    p.add_argument("--steps", type=int, default=3, help="timed steps per encoding per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=None, help="override train.batch_size")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--encodings", default=",".join(ENCODING_NAMES))
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import tomllib

    tables = tomllib.loads(Path(args.config).read_text())
    overrides = ['train.device="cpu"'] + ([f"train.batch_size={args.batch_size}"] if args.batch_size else [])
    names = [n.strip() for n in args.encodings.split(",") if n.strip()]
    if "nope" not in names:
        names.insert(0, "nope")
    mc0, tc = configs_from_tables(apply_overrides(tables, overrides))
    stream = TokenStream(split_documents(load_documents(tc.data), "train"), min_tokens=mc0.seq_len + 1)
    device = torch.device("cpu")
    runs = {}
    for name in names:
        mc, _ = configs_from_tables(apply_overrides(tables, overrides + [f"model.position_encoding={name}"]))
        torch.manual_seed(0)
        model = GPT(mc).to(device).train()
        opt, _ = build_optimizer(model, tc, device)
        runs[name] = (model, opt, mc)
    tokens_per_step = tc.batch_size * mc0.seq_len
    results: dict[str, list[float]] = {n: [] for n in names}
    step = 0
    print(
        f"# {len(names)} encodings, {args.repeats} repeats × {args.steps} steps of {tc.batch_size} × "
        f"{mc0.seq_len} tokens, {torch.get_num_threads()} threads, torch {torch.__version__}",
        flush=True,
    )
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            model, opt, mc = runs[name]

            def one_step(model=model, opt=opt, mc=mc):
                nonlocal step
                starts = window_starts(step, tc, stream.num_tokens, mc.seq_len)
                step += 1
                training_step(model, opt, [stream.batch(starts, mc.seq_len + 1)], tc.grad_clip, device)

            one_step()  # warm-up (allocator, first-call overheads)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                one_step()
            results[name].append(args.steps * tokens_per_step / (time.perf_counter() - t0))
        print(f"# repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    base = statistics.median(results["nope"])
    summary = {}
    print(f"{'encoding':14s} {'tokens/s (median)':>18s} {'min':>9s} {'max':>9s} {'vs nope':>8s}")
    for name in names:
        med = statistics.median(results[name])
        summary[name] = {"tokens_per_s_median": med, "all": results[name], "ratio_to_nope": med / base}
        print(f"{name:14s} {med:18.0f} {min(results[name]):9.0f} {max(results[name]):9.0f} {med / base:8.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": args.config,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "batch_size": tc.batch_size,
                    "seq_len": mc0.seq_len,
                    "threads": torch.get_num_threads(),
                    "results": summary,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
