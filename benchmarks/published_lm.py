"""A published causal LM through fireviz's evaluation: tokens/s and peak memory by length (issue #36).

The model is Llama-shaped with SmolLM2-135M's shape (30 layers, d_model 576, 9 query / 3 key-value
heads, MLP 1536, vocabulary 49,152, RoPE θ = 10⁵, trained at 2048; 134.5M parameters) and random
weights, written by ``transformers`` into a temporary folder with a byte-level BPE tokenizer trained
on the bundled prose; nothing is downloaded. Each length runs in a fresh process: the model is
loaded as ``fireviz.checkpoints.CausalLMCheckpoint`` (float32 on CPU, the model's own SDPA
attention; bf16 autocast on CUDA) and ``fireviz.eval.scoring.score_windows`` scores ``--windows``
windows of that length cut from the prose in the model's tokens — the path every evaluation takes.

    python benchmarks/published_lm.py                       # 2048 and 8192 on this CPU (~5 min on 2 cores)
    python benchmarks/published_lm.py --device cuda --lengths 8192,32768
    python benchmarks/published_lm.py --tiny                # a 2-layer model at 64 and 128 (seconds; tests)

Prints one row per length: seconds, the seconds of transformers' own forward (with the
log-softmax every scorer needs) over the same windows in the same process right after, their
ratio, scored tokens/s, peak resident memory (CPU: the process's
maximum RSS; CUDA: ``max_memory_allocated``) and how much of it the model's weights are, with the
CPU model (ratios between lengths are comparable only within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval_protocol import cpu_model  # noqa: E402  (one way to name the CPU in every benchmark)

#: SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M config.json), random weights
SHAPE_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=2048,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
SHAPE_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    max_position_embeddings=64,
)


def write_model(folder: Path, shape: dict, vocab: int) -> int:
    """A random Llama of ``shape`` and a BPE tokenizer of ``vocab`` tokens (trained on the bundled
    prose) saved into ``folder``. Returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fireviz.data import load_documents
    from fireviz.data.tokenizers import train_bpe

    docs = load_documents("prose")
    train_bpe(docs[:100] if vocab <= 1024 else docs, vocab, folder)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(bos_token_id=0, eos_token_id=1, **shape))
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def measure(folder: str, length: int, windows: int, device: str) -> dict:
    """One length in this process: load, score ``windows`` windows, time and peak memory."""
    import numpy as np
    import torch

    from fireviz.checkpoints import CausalLMCheckpoint
    from fireviz.data import load_documents
    from fireviz.eval.scoring import score_windows
    from fireviz.eval.windows import Window

    ckpt = CausalLMCheckpoint.resolve(folder)
    stream = np.concatenate([ckpt.tokenizer.encode(d).ids for d in load_documents("prose")])
    need = windows * length
    if len(stream) < need:  # the prose is repeated to fill the windows (a speed figure, not a protocol)
        stream = np.tile(stream, need // len(stream) + 1)
    model = ckpt.load(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    nats, counts, *_ = score_windows(
        model,
        lambda i: stream,
        [Window(0, k * length, 1) for k in range(windows)],
        length,
        device=device,
        batch_tokens=length,  # one window per forward: the memory of one window of this length
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    # transformers' own forward over the same windows, in the same process right after: what
    # fireviz's scoring costs beyond the model itself (issue #48: within 1.2×)
    hf = model.model  # the transformers model inside fireviz's CausalLMModule
    t1 = time.perf_counter()
    with torch.inference_mode():
        for k in range(windows):
            ids = torch.as_tensor(stream[k * length : (k + 1) * length], dtype=torch.long, device=device)[None]
            hf(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    hf_seconds = time.perf_counter() - t1
    peak = (
        torch.cuda.max_memory_allocated()
        if device.startswith("cuda")
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "length": length,
        "windows": windows,
        "tokens_scored": int(counts.sum()),
        "seconds": seconds,
        "transformers_seconds": hf_seconds,
        "tokens_per_s": float(counts.sum()) / seconds,
        "nats_per_token": float(nats.sum() / counts.sum()),
        "peak_bytes": int(peak),
        "rss_before_scoring_bytes": int(rss_before),
        "weights_bytes": int(weights),
    }


def run(lengths: list[int], windows: int, device: str, tiny: bool, threads: int | None = None) -> dict:
    """Every length in its own process; returns ``{"rows", "parameters", "cpu", "device"}``."""
    shape, vocab = (SHAPE_TINY, 1024) if tiny else (SHAPE_135M, 8192)
    with tempfile.TemporaryDirectory(prefix="fireviz-published-") as tmp:
        params = write_model(Path(tmp), shape, vocab)
        rows = []
        env = dict(os.environ, PYTHONPATH=str(REPO))
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        for n in lengths:
            code = (
                "import json, sys; sys.path.insert(0, sys.argv[5]); from published_lm import measure; "
                "print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code, tmp, str(n), str(windows), device, str(Path(__file__).parent)],
                env=env,
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                rows.append({"length": n, "status": "failed", "error": proc.stderr.strip().splitlines()[-1:]})
                continue
            rows.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "status": "ok"})
    return {"rows": rows, "parameters": params, "cpu": cpu_model(), "device": device, "tiny": tiny}


def report(result: dict) -> str:
    mib = 1 << 20
    lines = [
        f"published causal LM (Llama, {result['parameters'] / 1e6:.1f}M parameters, random weights) on "
        f"{result['device']} — {result['cpu']}",
        f"{'length':>7}  {'windows':>7}  {'seconds':>8}  {'HF fwd s':>8}  {'× HF':>5}  {'tokens/s':>9}  "
        f"{'peak MiB':>9}  {'weights MiB':>11}",
    ]
    for r in result["rows"]:
        if r.get("status") != "ok":
            lines.append(f"{r['length']:>7}  failed: {r.get('error')}")
            continue
        lines.append(
            f"{r['length']:>7}  {r['windows']:>7}  {r['seconds']:>8.1f}  {r['transformers_seconds']:>8.1f}  "
            f"{r['seconds'] / r['transformers_seconds']:>5.2f}  {r['tokens_per_s']:>9.0f}  "
            f"{r['peak_bytes'] / mib:>9.0f}  {r['weights_bytes'] / mib:>11.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--lengths", default=None, help="comma-separated lengths in tokens (default 2048,8192; --tiny 64,128)"
    )
    ap.add_argument("--windows", type=int, default=1, help="windows scored per length (default 1)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model at toy lengths (the tests run this)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in (args.lengths or ("64,128" if args.tiny else "2048,8192")).split(",") if x.strip()]
    result = run(lengths, args.windows, args.device, args.tiny)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if all(r.get("status") == "ok" for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
