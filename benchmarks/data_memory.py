"""Peak memory of an evaluation against the size of its one document: data is read streaming.

    .venv/bin/python benchmarks/data_memory.py [--mb 46] [--checkpoint checkpoints/alibi]

Writes a random-word text of ``--mb`` megabytes as one line, as ``.txt``, ``.txt.gz`` and as
a one-line ``.jsonl``, plus a 0.2 MB ``.txt`` baseline, and evaluates the checkpoint on each
at 512 tokens (``--mode nonoverlapping --token-budget 8192 --split all --no-cache``), each in
a fresh process. Prints the peak resident memory of each run and the growth over the
baseline per document byte: a plain or compressed text is read where a window lies (≈ 0
bytes per byte); a JSONL line is parsed whole (≈ 1 byte per byte at the peak, then spooled
to disk).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_protocol import cpu_model  # noqa: E402  (one way to name the CPU in every benchmark)

CHILD = """
import resource, sys
from fireviz.cli.eval import main
rc = main(sys.argv[1:])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(rc)
"""


def peak_mib(checkpoint: str, data: Path) -> float:
    args = [
        sys.executable,
        "-c",
        CHILD,
        checkpoint,
        "--data",
        str(data),
        "--split",
        "all",
        "--lengths",
        "512",
        "--mode",
        "nonoverlapping",
        "--token-budget",
        "8192",
        "--no-cache",
        "--quiet",
    ]
    out = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    ).stdout
    kb = int(next(line.split()[1] for line in out.splitlines() if line.startswith("MAXRSS_KB")))
    return kb / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=46.0)
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "alibi"))
    args = ap.parse_args()
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(1000)]
    n = int(args.mb * 1e6)
    text = " ".join(rng.choice(words) for _ in range(n // 5 + 1))[:n]
    print(f"CPU: {cpu_model()}; one document of {n:,} bytes; eval at 512, 16 windows, each run a fresh process")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "small.txt").write_text(text[:200_000])
        (t / "big.txt").write_text(text)
        with gzip.open(t / "big.txt.gz", "wt", compresslevel=1) as f:
            f.write(text)
        (t / "big.jsonl").write_text(json.dumps({"id": "big", "text": text}) + "\n")
        base = peak_mib(args.checkpoint, t / "small.txt")
        print(f"{'data':<12} {'peak MiB':>9} {'growth MiB':>11} {'bytes per document byte':>24}")
        print(f"{'small.txt':<12} {base:>9.0f} {'—':>11} {'(baseline)':>24}")
        for name in ("big.txt", "big.txt.gz", "big.jsonl"):
            peak = peak_mib(args.checkpoint, t / name)
            print(f"{name:<12} {peak:>9.0f} {peak - base:>11.0f} {(peak - base) * 2**20 / n:>24.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
