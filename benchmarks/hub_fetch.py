"""Bytes and seconds to read a T5-style model's position bias from a cold cache: fireviz's
ranged reads (safetensors header + the bias tables) against downloading the weights file.

A ~200 MB T5-layout repo (real tensor names and config fields; random weights) is written to a
temporary folder and served by the loopback Hub server of the tests (tests/hub_server.py) with
HTTP Range support; ``HF_ENDPOINT`` points huggingface_hub at it, so the Hub code path runs for
real, over TCP on this machine (no network latency: on the real Hub the difference in seconds
is larger still).

    .venv/bin/python benchmarks/hub_fetch.py [--mb 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of the weights file (MB)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["HF_HOME"] = str(tmp / "hf")
        os.environ["HF_HUB_CACHE"] = str(tmp / "hf" / "hub")
        os.environ["FIREVIZ_CACHE_DIR"] = str(tmp / "fireviz")
        import huggingface_hub.constants as hc
        from hub_folders import t5_folder  # the tests' fixture: the layout transformers writes
        from hub_server import HubServer

        hc.HF_HUB_CACHE = str(tmp / "hf" / "hub")
        d_model = 512
        vocab = max(1000, int(args.mb * 2**20 / 4 / d_model / 3))  # embeddings dominate the file
        repo = t5_folder(tmp / "repo", d_model=d_model, vocab=vocab, layers=6, dec_layers=6, heads=8)
        size = (repo / "model.safetensors").stat().st_size
        from huggingface_hub import hf_hub_download

        from fireviz.checkpoints import hub

        with HubServer({"bench/t5-style": repo}) as server:
            os.environ["HF_ENDPOINT"] = server.url
            t0 = time.perf_counter()
            m = hub.load_published("bench/t5-style")
            t_ranged = time.perf_counter() - t0
            ranged = server.bytes_sent("model.safetensors")
            t0 = time.perf_counter()
            hf_hub_download("bench/t5-style", "model.safetensors", endpoint=server.url, cache_dir=str(tmp / "full"))
            t_full = time.perf_counter() - t0
            full = server.bytes_sent("model.safetensors") - ranged
        print(
            f"T5-style repo: model.safetensors {size / 2**20:.1f} MiB, {m.config.n_layer} decoder layers × "
            f"{m.config.n_head} heads"
        )
        print(f"{'':24s} {'bytes of weights':>18s} {'seconds':>8s}")
        print(f"{'fireviz (ranged reads)':24s} {ranged:>18,d} {t_ranged:>8.3f}")
        print(f"{'full download':24s} {full:>18,d} {t_full:>8.3f}")
        print(
            f"fireviz read {ranged / size:.2e} of the file ({size / max(ranged, 1):,.0f}× less), "
            f"{t_full / t_ranged:.1f}× faster on loopback"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
