"""Make the shipped copy of a trained checkpoint: float16 weights and a compressed train log.

    python scripts/ship_checkpoint.py runs/kerple_log checkpoints/kerple_log [--dtype float16]

The repository's size budget (≤ 60 MiB for the whole tree) does not hold thirteen-plus
float32 checkpoints with their logs, so the shipped weights are stored in float16 (half the
bytes; every value of these small models is well inside its range, checked here) and the log
as ``train_log.jsonl.gz``. Loading upcasts to float32, exactly. Every published number is then
computed from exactly these stored weights (scripts/publish_results.py evaluates the folder as
shipped; the cache key is the stored file's sha256), never from the float32 original.

Writes into DST: config.json (byte-identical), model.safetensors (float16; metadata names the
stored dtype and the sha256 of the float32 source), train_log.jsonl.gz (deterministic gzip), and
the tokenizer files of a model trained on a BPE tokenizer's shards (byte-identical: config.json
records their sha256).
Results and the model card are left to the publish script. Prints the conversion error.
Refuses a tensor that would overflow float16 or lose its non-zero values to underflow.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from fireviz.checkpoints import LOG_FILE, LOG_FILE_GZ  # noqa: E402
from fireviz.checkpoints.causal_lm import tokenizer_files  # noqa: E402
from fireviz.core import atomic_write, read_safetensors, sha256_files  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def convert(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict]:
    """Float tensors cast to ``dtype`` (others kept), and the worst errors.

    Returns: ``(converted, {"max_abs_error", "max_rel_error" (over |x| >= 1e-3), "tensors"})``.
    Raises: ValueError naming a tensor that overflows ``dtype`` or whose non-zero values vanish.
    """
    out, worst_abs, worst_rel = {}, 0.0, 0.0
    info = torch.finfo(dtype)
    for k, t in tensors.items():
        if not t.is_floating_point():
            out[k] = t
            continue
        if t.abs().max() > info.max:
            raise ValueError(f"{k}: |x| up to {float(t.abs().max()):.3g} overflows {dtype} (max {info.max:.3g})")
        c = t.to(dtype)
        if ((t != 0) & (c == 0)).any() and (t[(t != 0) & (c == 0)].abs() > info.smallest_normal).any():
            raise ValueError(f"{k}: non-zero values would be lost to underflow in {dtype}")
        err = (c.float() - t.float()).abs()
        worst_abs = max(worst_abs, float(err.max()))
        big = t.abs() >= 1e-3
        if big.any():
            worst_rel = max(worst_rel, float((err[big] / t.abs()[big]).max()))
        out[k] = c.contiguous()
    return out, {"max_abs_error": worst_abs, "max_rel_error": worst_rel, "tensors": len(tensors)}


def ship(src: Path, dst: Path, dtype_name: str = "float16") -> dict:
    """Write the shipped copy of ``src`` into ``dst`` (see the module docstring). Returns the error stats."""
    dtype = DTYPES[dtype_name]
    tensors, meta = read_safetensors(src / "model.safetensors")
    converted, stats = convert(tensors, dtype)
    dst.mkdir(parents=True, exist_ok=True)
    meta = {
        **meta,
        "format": "pt",
        "fireviz_stored_dtype": dtype_name,
        "fireviz_converted_from_sha256": sha256_files(src / "model.safetensors"),
    }
    atomic_write(dst / "model.safetensors", lambda p: save_file(converted, str(p), metadata=meta))
    atomic_write(dst / "config.json", lambda p: shutil.copyfile(src / "config.json", p))
    for f in tokenizer_files(src):  # a BPE-trained model's tokenizer travels with it
        atomic_write(dst / f.name, lambda p, f=f: shutil.copyfile(f, p))
    log = src / LOG_FILE
    if log.exists():

        def write_gz(p):
            with open(p, "wb") as raw, gzip.GzipFile(filename=LOG_FILE, mode="wb", fileobj=raw, mtime=0) as g:
                g.write(log.read_bytes())

        atomic_write(dst / LOG_FILE_GZ, write_gz)
        if (dst / LOG_FILE).exists():
            (dst / LOG_FILE).unlink()
    elif (src / LOG_FILE_GZ).exists():
        atomic_write(dst / LOG_FILE_GZ, lambda p: shutil.copyfile(src / LOG_FILE_GZ, p))
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="trained checkpoint folder (float32)")
    ap.add_argument("dst", type=Path, help="the shipped folder to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    a = ap.parse_args(argv)
    if a.src.resolve() == a.dst.resolve():
        print(
            "ship_checkpoint: error: SRC and DST are the same folder; write the shipped copy elsewhere", file=sys.stderr
        )
        return 2
    try:
        stats = ship(a.src, a.dst, a.dtype)
    except (OSError, ValueError) as e:
        print(f"ship_checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(
        f"{a.src} → {a.dst} ({a.dtype}): {stats['tensors']} tensors, max |error| {stats['max_abs_error']:.3g}, "
        f"max relative error {stats['max_rel_error']:.3g} (|x| ≥ 1e-3)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
