"""FIRE's cost against NoPE and a static bias: the issue-9 targets, side by side in one run.

1. Training step (forward + backward + AdamW) at the training length 512, batch 16,
   d=128, 4 layers, 4 heads: tokens/s and ratio to NoPE for nope, alibi (a precomputed
   static bias), t5, kerple_log, fire, fire_s. Target: fire ≤ 1.10× NoPE.
2. Evaluation forward at 8192, batch 1: time ratio to NoPE (target ≤ 3×) and peak RSS
   above the loaded model (target ≤ 1.5 GiB), each in a fresh subprocess.

    python benchmarks/fire_speed.py [--repeats 7] [--skip-eval]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _timing import interleaved_medians  # noqa: E402

from fireviz.model import GPT, GPTConfig  # noqa: E402

SHAPE = dict(n_layer=4, n_head=4, d_model=128)

EVAL_CHILD = r"""
import json, resource, statistics, sys, time, torch
from fireviz.model import GPT, GPTConfig
name, n = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=4, n_head=4, d_model=128, seq_len=512, position_encoding=name)).eval()
idx = torch.randint(0, 256, (1, n))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
with torch.inference_mode():
    for _ in range(3):
        t = time.perf_counter(); model(idx); times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": statistics.median(times), "peak_above_model_mib": (peak - base) / 1024}))
"""


def train_steps(names, seq_len=512, batch=16, repeats=7):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (batch, seq_len + 1))
    fns = {}
    for name in names:
        model = GPT(GPTConfig(seq_len=seq_len, position_encoding=name, **SHAPE))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, 257), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        fns[name] = step
    med = interleaved_medians(fns, repeats=repeats)
    return {n: {"seconds": s, "tokens_per_s": batch * seq_len / s, "ratio_to_nope": s / med["nope"]}
            for n, s in med.items()}


def eval_forward(name, n):
    out = subprocess.run([sys.executable, "-c", EVAL_CHILD, name, str(n)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-eval", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    names = ["nope", "alibi", "t5", "kerple_log", "fire", "fire_s"]
    print("\nTraining step, length 512, batch 16, d=128, 4 layers, 4 heads (interleaved medians)")
    for n, r in train_steps(names, repeats=args.repeats).items():
        print(f"  {n:12s} {r['seconds']*1000:8.0f} ms  {r['tokens_per_s']:8.0f} tok/s  {r['ratio_to_nope']:.2f}× NoPE")
    if args.skip_eval:
        return
    print("\nEvaluation forward at 8192, batch 1 (fresh process each; median of 3)")
    res = {n: eval_forward(n, 8192) for n in ["nope", "alibi", "fire"]}
    for n, r in res.items():
        print(f"  {n:12s} {r['seconds']:7.2f} s  {r['seconds'] / res['nope']['seconds']:.2f}× NoPE  "
              f"peak {r['peak_above_model_mib']:.0f} MiB above the model")


if __name__ == "__main__":
    main()
