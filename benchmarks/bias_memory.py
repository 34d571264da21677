"""Time and peak memory of every additive bias at q_len = k_len = 8192, 8 heads (issue 2).

Each encoding runs in a fresh subprocess so its peak RSS is its own. Prints: median time of
3 calls, peak RSS above the process baseline, and the size of the output itself
(8 × 8192 × 8192 float32 = 2 GiB): "extra" is what the computation needs beyond its result.
FIRE is also timed through ``bias_reference`` at 2048 to show what the fast path saves.

    python benchmarks/bias_memory.py [--length 8192] [--heads 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, statistics, sys, time, torch
from fireviz.encodings import build_encoding
name, n, heads, method = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
enc = build_encoding(name, heads, 64)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
with torch.no_grad():
    for _ in range(3):
        t = time.perf_counter()
        b = getattr(enc, method)(n, n)
        times.append(time.perf_counter() - t)
        del b
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": statistics.median(times), "peak_mib": (peak - base) / 1024}))
"""


def run(name: str, n: int, heads: int, method: str = "bias") -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(n), str(heads), method], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    args = ap.parse_args()
    n, h = args.length, args.heads
    out_mib = h * n * n * 4 / 2**20
    print(f"bias({n}, {n}), {h} heads; output alone = {out_mib:.0f} MiB")
    print(f"{'encoding':14s} {'seconds':>8s} {'peak MiB':>9s} {'extra MiB':>10s}")
    for name in ["t5", "alibi", "kerple_log", "kerple_power", "sandwich", "fire", "fire_s"]:
        r = run(name, n, h)
        print(f"{name:14s} {r['seconds']:8.2f} {r['peak_mib']:9.0f} {r['peak_mib'] - out_mib:10.0f}")
    small = 2048
    fast, ref = run("fire", small, h), run("fire", small, h, "bias_reference")
    print(
        f"\nFIRE at {small}: fast path {fast['seconds']:.3f} s / {fast['peak_mib']:.0f} MiB; "
        f"plain formula {ref['seconds']:.3f} s / {ref['peak_mib']:.0f} MiB "
        f"(output {h * small * small * 4 / 2**20:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
