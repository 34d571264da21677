"""GPU benchmark (issue 9): the paper's base recipe on CUDA, and FIRE evaluation memory.

1. Training step of the base recipe (12 layers, 12 heads, d=768, length 2048, batch 8) in
   bf16 autocast, with and without ``torch.compile``, for FIRE and RoPE: tokens/s and model
   FLOPs utilization (MFU = 6·N·tokens/s + attention FLOPs, over the GPU's dense bf16 peak).
2. FIRE evaluation memory at 8192 and 32768 (batch 1, one attention layer's worth): a
   materialized bias (fireviz's SDPA path) against the bias computed inside the kernel
   (``fireviz.model.flex``: FlexAttention with a ``score_mod`` evaluating FIRE's MLP).
3. The whole model's evaluation forward at 8k and 32k, ``set_attention_backend("sdpa")`` vs
   ``"flex"`` (seconds, peak GPU memory), for FIRE and ALiBi.

On a machine without CUDA it prints that it skipped and exits 0.

    python benchmarks/gpu.py [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F


def train_tokens_per_s(name: str, compile_model: bool, steps: int = 10, batch: int = 8, seq: int = 2048):
    from fireviz.model import GPT, GPTConfig

    cfg = GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=seq, position_encoding=name, attn_query_block=seq)
    model = GPT(cfg).cuda()
    n_params = model.num_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model) if compile_model else model
    x = torch.randint(0, 256, (batch, seq + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(run(x[:, :-1]).reshape(-1, 257).float(), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    tps = batch * seq * steps / (time.perf_counter() - t)
    # 6N per token for the weights + 12·layers·d·seq per token for attention scores (fwd+bwd)
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.d_model * seq
    return tps, flops_per_token * tps


def fire_eval_memory(n: int, heads: int = 12, head_dim: int = 64):
    from fireviz.encodings import FIRE

    fire = FIRE(heads, init_L=512.0).cuda()
    q = torch.randn(1, heads, n, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = {}
    # (a) materialized bias, in query blocks of 1024 as the model does
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, n, 1024):
            e = min(s + 1024, n)
            bias = fire.bias(e - s, e, s)
            allowed = torch.arange(e, device="cuda")[None, :] <= torch.arange(s, e, device="cuda")[:, None]
            mask = bias.masked_fill(~allowed, float("-inf")).to(q.dtype)[None]
            F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=mask)
    torch.cuda.synchronize()
    out["materialized"] = (time.perf_counter() - t, (torch.cuda.max_memory_allocated() - base) / 2**20)
    # (b) bias inside the kernel: fireviz.flex (FlexAttention with FIRE's score_mod)
    from fireviz.model import flex

    if not flex.flex_available():
        out["flex_attention"] = None
        print(f"  FlexAttention unavailable: {flex.unavailable_reason()}")
        return out
    with torch.inference_mode():
        flex.causal_flex(q, k, v, fire)  # compile
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        flex.causal_flex(q, k, v, fire)
        torch.cuda.synchronize()
    out["flex_attention"] = (time.perf_counter() - t, (torch.cuda.max_memory_allocated() - base) / 2**20)
    return out


def model_eval(n: int, backend: str, name: str = "fire"):
    """One forward of the base-shape GPT (12L, 12H, d=768) at length n, bf16 autocast: (s, peak MiB)."""
    from fireviz.model import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=2048, position_encoding=name)).cuda().eval()
    model.set_attention_backend(backend)
    x = torch.randint(0, 256, (1, n), device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(x[:, :1024])  # compile / warm up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        model(x)
        torch.cuda.synchronize()
    return time.perf_counter() - t, (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200: 989)")
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: skipping the GPU benchmark (nothing measured).")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    if not args.skip_train:
        print("\nBase recipe (12L, 12H, d=768, length 2048, batch 8), bf16 training step")
        for name in ("rope", "fire"):
            for comp in (False, True):
                try:
                    tps, flops = train_tokens_per_s(name, comp)
                    print(
                        f"  {name:5s} compile={str(comp):5s} {tps:10.0f} tok/s  MFU {flops / (args.peak_tflops * 1e12):6.1%}"
                    )
                except Exception as e:  # report and continue: one failure must not hide the rest
                    print(f"  {name:5s} compile={str(comp):5s} failed: {type(e).__name__}: {str(e)[:200]}")
                torch.cuda.empty_cache()
    print("\nFIRE attention at evaluation length (batch 1, 12 heads × 64), one layer")
    for n in (8192, 32768):
        try:
            res = fire_eval_memory(n)
            for kind, r in res.items():
                print(
                    f"  {n:6d} {kind:15s} " + ("unavailable" if r is None else f"{r[0]:7.3f} s  peak +{r[1]:8.0f} MiB")
                )
        except Exception as e:
            print(f"  {n:6d} failed: {type(e).__name__}: {str(e)[:200]}")
        torch.cuda.empty_cache()
    print("\nWhole-model evaluation forward (12L, 12H, d=768, bf16), SDPA with a materialized bias vs FlexAttention")
    for name in ("fire", "alibi"):
        for n in (8192, 32768):
            for backend in ("sdpa", "flex"):
                try:
                    sec, mib = model_eval(n, backend, name)
                    print(f"  {name:5s} {n:6d} {backend:4s} {sec:7.3f} s  peak +{mib:8.0f} MiB")
                except Exception as e:
                    print(f"  {name:5s} {n:6d} {backend:4s} failed: {type(e).__name__}: {str(e)[:200]}")
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
