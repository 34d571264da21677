"""Memory estimate vs measured peak RSS for evaluation at 512 … 8192 tokens (issue 21).

Each length runs in a fresh Python process: load the prose corpus, note the resident memory
(rss0), evaluate one checkpoint at that length on two batches of random windows (cache off),
then read the process's peak RSS. The estimate is rss0 + ``fireviz.model.memory.forward_bytes``
(what evaluation checks against the available memory before it starts).

    .venv/bin/python benchmarks/memory_estimate.py [--checkpoint checkpoints/fire] [--lengths 512,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_protocol import cpu_model  # noqa: E402  (one way to name the CPU in every benchmark)

CHILD = r"""
import json, resource, sys
sys.path.insert(0, {root!r})
from fireviz.eval import evaluate_many
from fireviz.model import memory
from fireviz.data import load_documents
from fireviz.checkpoints import load_model
ckpt, n, batch_tokens = {ckpt!r}, {n}, {batch_tokens}
cfg = load_model(ckpt).config
docs = load_documents("prose")
rss0 = memory.current_rss()
batch = max(1, batch_tokens // n)
evaluate_many([ckpt], "prose", [n], mode="nonoverlapping", token_budget=2 * batch * (n - 1),
                       use_cache=False, batch_tokens=batch_tokens, device="cpu")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"length": n, "batch": batch, "rss0": rss0, "work_estimate": memory.forward_bytes(cfg, batch, n),
                  "peak": peak}}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "fire"))
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--batch-tokens", type=int, default=8192)
    args = p.parse_args(argv)
    print(f"CPU: {cpu_model()}; checkpoint {args.checkpoint}; batch_tokens {args.batch_tokens}")
    print(
        f"{'length':>7} {'batch':>5} {'rss0 MiB':>9} {'estimate MiB':>13} {'peak MiB':>9} {'est/peak':>8} "
        f"{'work est MiB':>12} {'work meas MiB':>13}"
    )
    worst = 0.0
    for n in (int(x) for x in args.lengths.split(",")):
        code = CHILD.format(root=str(ROOT), ckpt=args.checkpoint, n=n, batch_tokens=args.batch_tokens)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        est = r["rss0"] + r["work_estimate"]
        ratio = est / r["peak"]
        worst = max(worst, ratio, 1 / ratio)
        print(
            f"{n:>7} {r['batch']:>5} {r['rss0'] / 2**20:>9.0f} {est / 2**20:>13.0f} {r['peak'] / 2**20:>9.0f} "
            f"{ratio:>8.2f} {r['work_estimate'] / 2**20:>12.0f} {(r['peak'] - r['rss0']) / 2**20:>13.0f}"
        )
    print(f"worst factor between estimate and measured peak: {worst:.2f}× (target ≤ 2×)")
    return 0 if worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
