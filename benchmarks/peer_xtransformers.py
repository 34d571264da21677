"""fireviz vs x-transformers (lucidrains, the well-known peer) at the same model shape.

Training step (forward + backward + AdamW) at length 512, batch 16, d=128, 4 layers,
4 heads of 32 dims, byte vocabulary, for T5 bias, ALiBi and RoPE, plus each library's NoPE.
Reports each library's step time and the ratio fireviz / x-transformers per encoding
(target ≤ 1.0). x-transformers is a benchmark-only dependency:

    .venv/bin/pip install x-transformers==2.31.10
    python benchmarks/peer_xtransformers.py [--repeats 7]

x-transformers runs with flash (SDPA) attention where it allows it (ALiBi, RoPE, NoPE);
its T5 bias refuses flash, so it runs its own attention there.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _timing import interleaved_medians

from fireviz.model import GPT, GPTConfig

VOCAB, SEQ, BATCH, DIM, DEPTH, HEADS = 257, 512, 16, 128, 4, 4


def peer_model(kind: str):
    from x_transformers import Decoder, TransformerWrapper

    opts = {
        "t5": {"rel_pos_bias": True},
        "alibi": {"alibi_pos_bias": True, "attn_flash": True},
        "rope": {"rotary_pos_emb": True, "attn_flash": True},
        "nope": {"attn_flash": True},
    }[kind]
    return TransformerWrapper(
        num_tokens=VOCAB,
        max_seq_len=SEQ,
        use_abs_pos_emb=False,
        attn_layers=Decoder(dim=DIM, depth=DEPTH, heads=HEADS, attn_dim_head=DIM // HEADS, **opts),
    )


def step_fn(model, x):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    try:
        import x_transformers
    except ImportError:
        sys.exit("x-transformers is not installed: .venv/bin/pip install x-transformers==2.31.10")
    torch.manual_seed(0)
    x = torch.randint(0, 256, (BATCH, SEQ + 1))
    kinds = ["nope", "t5", "alibi", "rope"]
    fns = {}
    for k in kinds:
        ours = GPT(GPTConfig(n_layer=DEPTH, n_head=HEADS, d_model=DIM, seq_len=SEQ, position_encoding=k))
        fns[f"fireviz/{k}"] = step_fn(ours, x)
        fns[f"x-transformers/{k}"] = step_fn(peer_model(k), x)
    med = interleaved_medians(fns, repeats=args.repeats)
    print(
        f"torch {torch.__version__}, x-transformers {x_transformers.__version__ if hasattr(x_transformers, '__version__') else '2.31.10'}"
    )
    print(
        f"{'encoding':8s} {'fireviz ms':>11s} {'x-tf ms':>9s} {'ratio':>6s}  {'fireviz/NoPE':>12s} {'x-tf/NoPE':>10s}"
    )
    for k in kinds:
        a, b = med[f"fireviz/{k}"], med[f"x-transformers/{k}"]
        print(
            f"{k:8s} {a * 1000:11.0f} {b * 1000:9.0f} {a / b:6.2f}  {a / med['fireviz/nope']:12.2f} {b / med['x-transformers/nope']:10.2f}"
        )


if __name__ == "__main__":
    main()
