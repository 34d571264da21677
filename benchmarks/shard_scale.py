"""Token shards against corpus size (issue #37): ``prepare``'s speed, and training memory that does
not grow with the corpus.

    .venv/bin/python benchmarks/shard_scale.py [--factors 1,10,100] [--num-proc 2] [--steps 20]

For each factor k it writes the bundled prose k times over as one JSONL (each copy's ids made
distinct, so the split rule draws anew), runs ``python -m fireviz prepare --tokenizer byte`` on it
(wall time, tokens/s, peak RSS of the main process and of its workers), then trains
configs/tiny.toml (the bundled recipe's model) from the shards for ``--steps`` steps with
validation at the start and end, each in a fresh process, and prints its peak RSS. Beside them:
the same training on the synthetic copy task (no corpus at all: the model's own memory) and, for
k ≤ 10, on the JSONL read the old way (the whole corpus in memory as one uint16 stream).
``--tokenizer`` prepares with a BPE tokenizer instead (training then sets ``model.vocab_size`` to
its ids). Figures are for one run each: no interval; the disk needs ~7 GB per 100× (JSONL and shards).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_protocol import cpu_model  # noqa: E402  (one way to name the CPU in every benchmark)

CHILD = """
import resource, sys
from fireviz.cli import main
rc = main(sys.argv[1:])
self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("MAXRSS_KB", self, kids)
sys.exit(rc)
"""


def _child(args: list[str]) -> tuple[float, float, float, str]:
    """(seconds, peak RSS MiB of the process, of its largest child, stdout) of one fireviz command."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, capture_output=True, text=True)
    sec = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{p.stderr[-2000:]}")
    line = next(x for x in p.stdout.splitlines() if x.startswith("MAXRSS_KB"))
    _, me, kids = line.split()
    return sec, int(me) / 1024, int(kids) / 1024, p.stdout


def write_repeated(path: Path, factor: int) -> int:
    """The bundled prose ``factor`` times over as one JSONL; returns its bytes of text."""
    from fireviz.data import load_documents

    docs = [(d.id, d.text) for d in load_documents("prose")]
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in range(factor):
            for doc_id, text in docs:
                f.write(json.dumps({"id": f"{doc_id}~{r}", "text": text}) + "\n")
                n += len(text.encode())
    return n


def train_args(data: str, out: Path, steps: int, vocab_size: int | None = None) -> list[str]:
    sets = [f"train.data={data}", f"train.max_steps={steps}", "train.warmup_steps=2"]
    sets += [f"model.vocab_size={vocab_size}"] if vocab_size else []
    sets += [f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}", "train.device=cpu"]
    args = ["train", "--config", str(ROOT / "configs" / "tiny.toml"), "--out", str(out), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", default="1,10,100", help="corpus sizes as multiples of the bundled prose")
    ap.add_argument("--num-proc", type=int, default=2, help="prepare's processes")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--tokenizer", default="byte", help="prepare's --tokenizer (default byte; a BPE folder too)")
    ap.add_argument("--workdir", default=None, help="where the corpora and shards go (default: a temp folder)")
    args = ap.parse_args(argv)
    factors = [int(f) for f in args.factors.split(",")]
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fireviz-shards-"))
    work.mkdir(parents=True, exist_ok=True)
    from fireviz.checkpoints.causal_lm import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    vocab = None if tok.key == "byte" else tok.num_ids
    print(
        f"{cpu_model()}; prepare --tokenizer {args.tokenizer} with {args.num_proc} process(es); training: "
        f"configs/tiny.toml{f' with vocab_size {vocab}' if vocab else ''}, {args.steps} steps"
    )
    sec, rss, _, _ = _child(train_args("synthetic:copy", work / "t-copy", args.steps))
    print(f"\nno corpus (synthetic copy task): training peak RSS {rss:,.0f} MiB — the model's own memory\n")
    print(
        "| corpus | text MB | prepare s | tokens/s | prepare RSS MiB (main / worker) | shards MB | train RSS MiB | old way RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    try:
        for k in factors:
            corpus = work / f"prose-x{k}.jsonl"
            n_bytes = write_repeated(corpus, k)
            shards = work / f"shards-x{k}"
            p_sec, p_rss, p_kids, _ = _child(
                ["prepare", "--data", str(corpus), "--tokenizer", args.tokenizer, "--out", str(shards)]
                + ["--num-proc", str(args.num_proc), "--no-progress"]
            )
            m = json.loads((shards / "manifest.json").read_text())
            tokens = sum(m["splits"][s]["tokens"] for s in ("train", "validation"))
            size = sum(p.stat().st_size for p in shards.glob("*.bin")) / 1e6
            _, t_rss, _, _ = _child(train_args(str(shards), work / f"t-shards-x{k}", args.steps, vocab))
            old = "–"
            if k <= 10 and vocab is None:
                _, o_rss, _, _ = _child(train_args(str(corpus), work / f"t-old-x{k}", args.steps))
                old = f"{o_rss:,.0f}"
            print(
                f"| {k}× prose | {n_bytes / 1e6:,.0f} | {p_sec:,.1f} | {tokens / p_sec:,.0f} | {p_rss:,.0f} / {p_kids:,.0f} "
                f"| {size:,.0f} | {t_rss:,.0f} | {old} |",
                flush=True,
            )
            corpus.unlink()
            shutil.rmtree(shards)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
