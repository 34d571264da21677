"""One GPU check, ready to run in one call (issues #9, #37, #49): everything the CPU cannot show.

Steps (each one reports what failed and the script goes on with the rest):

1. ``environment``: torch, CUDA, the GPU(s), whether FlexAttention compiles here.
2. ``parity``: FIRE's CUDA path first (issue 49: ``FIRE.masked_bias_segments`` against eq. 3–4,
   ``masked_bias_reference``, on the device — below L, across L, a position offset with a query
   block, a normalizer cap, mlp_depth 2: float64 values and the gradients of c, L and every MLP
   weight, float32 values); then for every registered encoding a small GPT's float32 logits on the
   device against a float64 CPU reference (TF32 off), at 2.3 × its training length (FIRE on CUDA:
   the new path); FlexAttention's forward against the SDPA path for each additive encoding; and the
   gradients of a training step through FlexAttention (bias tables with gradients) against the SDPA
   path (PyTorch has no FlexAttention backward on CPU: there it says so).
3. ``train_step``: optimizer steps of the paper's base shape (12 layers, 12 heads, d = 768, 2048
   tokens, batch 8) in bf16 autocast for every variant of ``VARIANTS`` (NoPE, ALiBi, RoPE, T5,
   Kerple, Sandwich, FIRE, FIRE-S, FIRE with mlp_depth 2), SDPA eager and under ``torch.compile``,
   FlexAttention eager for ALiBi, FIRE and T5 (``TRAIN_ROWS``, most wanted first) — tokens/s, MFU
   (6·N + attention FLOPs per token over the GPU's dense bf16 peak), peak memory, and the cost
   (time per step) relative to ALiBi and to NoPE on the same path.
4. ``fire_profile``: one eager FIRE training step under ``torch.profiler`` (its top kernels by self
   time), and ``torch._dynamo.explain`` of a FIRE training forward + loss: graphs, breaks, and
   how many of them are inside attention or the encoding.
5. ``eval_memory``: the base shape's evaluation forward at 8k and 32k tokens (batch 1) per variant
   (``EVAL_ROWS``), SDPA (bias materialised per 1024-query block) and FlexAttention (bias inside
   the kernel): seconds of the second of two forwards, tokens/s, MFU, peak memory, the cost relative
   to ALiBi and NoPE, and the size a full ``[heads, n, n]`` bias would have taken.
6. ``trainer``: ``python -m fireviz train`` (configs/tiny.toml on the bundled prose, FIRE) on the
   device with ``compile`` off and on: steps/s, tokens/s, the last loss.
7. ``ddp``: the same run under ``torchrun`` on every visible GPU (NCCL; with ``--dry-run``: two
   CPU processes, gloo) and its last loss against the one-process run.
8. ``published``: a published causal LM through fireviz's evaluation (issue #36,
   ``benchmarks/published_lm.py``: SmolLM2-135M's Llama shape, random weights, bf16 autocast) at
   8k and 32k tokens — tokens/s and peak memory; ``--dry-run``: a 2-layer model at 64 and 128 on the CPU.
9. ``shards``: issue #37's path at scale — a BPE tokenizer (8k; ``--dry-run``: 300) trained on the
   bundled prose, its token shards written by ``prepare`` (tokens/s, several processes), and the small
   GPU recipe (configs/gpu_small.toml, ~29M parameters at 2048 tokens) trained from those shards on
   the device: tokens/s, peak memory, the last loss; ``--dry-run``: a 1-layer model at 64 tokens.

    python benchmarks/gpu.py [--out DIR] [--stem NAME] [--budget-s 540] [--step-budget STEP=S,…]
        [--peak-tflops F] [--only STEP,…] [--attention sdpa,flex] [--no-compile] [--flex-parity ENC,…]
    python benchmarks/gpu.py --dry-run      # every step at toy sizes on the CPU (~4 min on 2 cores)
    python benchmarks/gpu.py --dry-run --no-compile --attention sdpa   # the plumbing only (~2 min)

Issue 49's one device call (≤ 9 minutes on one H100; benchmarks/README.md):

    python3 benchmarks/gpu.py --only environment,parity,train_step,fire_profile,eval_memory \\
        --flex-parity fire --budget-s 490 \\
        --step-budget parity=60,train_step=240,fire_profile=45,eval_memory=110 \\
        --out benchmarks/results --stem gpu_issue49_$(date -u +%F)

Writes ``DIR/STEM.json`` (every figure, the settings, the failures) and ``DIR/STEM.md`` (a short
report); default ``out/gpu/gpu.*`` (git-ignored; the published runs are in benchmarks/results). Without CUDA and without ``--dry-run`` it says so and
exits 0 having measured nothing. A step that would start after ``--budget-s`` seconds is skipped
and named as such, so the call ends inside its lease.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from eval_protocol import cpu_model  # noqa: E402  (one way to name the CPU in every benchmark)

STEPS = (
    "environment", "parity", "train_step", "fire_profile", "eval_memory", "trainer", "ddp", "published", "shards",
)  # fmt: skip
#: dense bf16 peak (TFLOP/s) by GPU name fragment, for MFU; --peak-tflops overrides
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}
#: float32 logits against float64: rounding alone is ~1e-6 here; an indexing or formula bug is O(0.1)
PARITY_TOL = 1e-4
#: relative gradient difference, FlexAttention vs SDPA, both float32 (TF32 off)
GRAD_TOL = 1e-3
#: the attention paths measured (--attention), and whether torch.compile rows run (--no-compile)
ATTENTION = ["sdpa", "flex"]
COMPILE = [True]
#: encodings whose FlexAttention parity runs, forward and gradients (--flex-parity; empty: every one)
FLEX_PARITY: list[str] = []
#: the report's file name stem in --out (--stem)
STEM = ["gpu"]


@dataclass(frozen=True)
class Sizes:
    """Model shapes and counts of one run (``FULL`` on a GPU, ``TOY`` for ``--dry-run``)."""

    parity_model: tuple[int, int, int, int]  # n_layer, n_head, d_model, seq_len
    parity_length: int
    base_model: tuple[int, int, int]  # n_layer, n_head, d_model
    train_seq: int
    train_batch: int
    train_steps: int
    warmup_steps: int
    eval_lengths: tuple[int, ...]
    trainer_steps: int
    trainer_model: tuple[str, ...]  # extra --set options for the tiny recipe
    shard_vocab: int = 8192  # the BPE tokenizer of the shards step
    shard_steps: int = 30  # optimizer steps of configs/gpu_small.toml from the shards
    shard_model: tuple[str, ...] = ()  # --set options for configs/gpu_small.toml


FULL = Sizes((2, 4, 64, 128), 300, (12, 12, 768), 2048, 8, 10, 3, (8192, 32768), 200, ())
TOY = Sizes(
    (2, 4, 64, 128),
    300,
    (2, 2, 64),
    128,
    2,
    2,
    1,
    (256, 1024),
    4,
    ("model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=64", "train.batch_size=4"),
    shard_vocab=300,
    shard_steps=4,
    shard_model=(
        "model.n_layer=1",
        "model.d_model=32",
        "model.n_head=2",
        "model.seq_len=64",
        "model.vocab_size=300",
        "train.batch_size=4",
    ),
)


class Budget:
    """Seconds left of ``--budget-s``; ``ok(need)`` is False once fewer than ``need`` remain."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def ok(self, need: float = 0.0) -> bool:
        return self.left() > need

    def within(self, seconds: float | None) -> "Budget":
        """This budget, ending ``seconds`` from now if that comes first (``--step-budget``)."""
        sub = Budget(0.0)
        sub.end = self.end if seconds is None else min(self.end, time.monotonic() + seconds)
        return sub


def _failure(e: BaseException) -> dict:
    """A failure as JSON: the exception's type, first line and the innermost frame."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return {"status": "failed", "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}", "at": where}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _reset_peak(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    return torch.cuda.memory_allocated(dev)


def _peak_mib(dev: torch.device, base: int) -> float | None:
    return round((torch.cuda.max_memory_allocated(dev) - base) / 2**20, 1) if dev.type == "cuda" else None


def _autocast(dev: torch.device):
    from contextlib import nullcontext

    return torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext()


#: the measured variants: label → (encoding name, encoding options)
VARIANTS = {
    "nope": ("nope", {}),
    "alibi": ("alibi", {}),
    "rope": ("rope", {}),
    "t5": ("t5", {}),
    "kerple_log": ("kerple_log", {}),
    "sandwich": ("sandwich", {}),
    "fire": ("fire", {}),
    "fire_s": ("fire_s", {}),
    "fire_depth2": ("fire", {"mlp_depth": 2}),
}
#: train_step rows in the order they run (the budget skips the tail first): what the issue's
#: targets need compiled (FIRE vs ALiBi, NoPE, T5; FIRE-S), then eager, then the rest
TRAIN_ROWS = (
    [(v, "sdpa", True) for v in ("alibi", "fire", "nope", "t5", "fire_s")]
    + [(v, "sdpa", False) for v in ("alibi", "fire", "nope", "t5", "fire_s", "kerple_log", "sandwich", "fire_depth2", "rope")]
    + [(v, "sdpa", True) for v in ("kerple_log", "sandwich", "fire_depth2", "rope")]
    + [(v, "flex", False) for v in ("alibi", "fire", "t5")]
)  # fmt: skip
#: evaluation rows in the order they run: (variant, index into the eval lengths, attention path) —
#: the issue's targets first (FIRE and ALiBi at the longest length, SDPA and FlexAttention)
EVAL_ROWS = [
    ("alibi", 1, "sdpa"), ("fire", 1, "sdpa"), ("alibi", 1, "flex"), ("fire", 1, "flex"),
    ("nope", 1, "sdpa"), ("fire_s", 1, "sdpa"), ("t5", 1, "sdpa"),
    ("alibi", 0, "sdpa"), ("fire", 0, "sdpa"), ("nope", 0, "sdpa"), ("fire_s", 0, "sdpa"), ("t5", 0, "sdpa"),
    ("nope", 1, "flex"), ("t5", 1, "flex"), ("alibi", 0, "flex"), ("fire", 0, "flex"),
    ("kerple_log", 1, "sdpa"), ("sandwich", 1, "sdpa"), ("kerple_log", 0, "sdpa"), ("sandwich", 0, "sdpa"),
    ("fire_depth2", 0, "sdpa"), ("fire_depth2", 1, "sdpa"),
]  # fmt: skip


def _gpt(name: str, shape: tuple[int, ...], seq_len: int, dev: torch.device, seed: int = 0, options=None):
    """A GPT of ``shape`` for ``name`` (an encoding, or a label of ``VARIANTS``) on ``dev``."""
    from fireviz.model import GPT, GPTConfig

    encoding, opts = VARIANTS.get(name, (name, {}))
    torch.manual_seed(seed)
    n_layer, n_head, d_model = shape[:3]
    cfg = GPTConfig(
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        seq_len=seq_len,
        position_encoding=encoding,
        encoding_options={**opts, **(options or {})},
    )
    return GPT(cfg).to(dev)


# ---------------------------------------------------------------------------------------------
# 1. environment
# ---------------------------------------------------------------------------------------------
def environment(dev: torch.device, sizes: Sizes, budget: Budget) -> dict:
    from fireviz.model import flex

    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "device": str(dev),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        out["gpu_memory_gib"] = round(total / 2**30, 1)
    out["flex_available"] = flex.flex_available()
    out["flex_unavailable_reason"] = flex.unavailable_reason() or None
    return out


# ---------------------------------------------------------------------------------------------
# 2. parity
# ---------------------------------------------------------------------------------------------
def _logits_parity(name: str, dev: torch.device, sizes: Sizes) -> dict:
    *shape, seq = sizes.parity_model
    model = _gpt(name, shape, seq, torch.device("cpu")).eval()
    x = torch.randint(0, 256, (2, sizes.parity_length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.double()(x)
        got = model.float().to(dev)(x.to(dev)).double().cpu()
    err = (got - ref).abs().max().item()
    return {"max_abs_logit_error": err, "status": "ok" if err <= PARITY_TOL else "mismatch"}


def _flex_forward_parity(name: str, dev: torch.device, sizes: Sizes) -> dict:
    *shape, seq = sizes.parity_model
    model = _gpt(name, shape, seq, dev).eval()
    x = torch.randint(0, 256, (1, sizes.parity_length), generator=torch.Generator().manual_seed(2)).to(dev)
    with torch.no_grad():
        a = model.set_attention_backend("sdpa")(x)
        b = model.set_attention_backend("flex")(x)
    err = (a - b).abs().max().item()
    return {"max_abs_logit_error": err, "status": "ok" if err <= PARITY_TOL else "mismatch"}


def _flex_grad_parity(name: str, dev: torch.device, sizes: Sizes) -> dict:
    *shape, seq = sizes.parity_model
    x = torch.randint(0, 256, (2, seq + 1), generator=torch.Generator().manual_seed(3)).to(dev)
    grads = {}
    for backend in ("sdpa", "flex"):
        model = _gpt(name, shape, seq, dev).train().set_attention_backend(backend)
        logits = model(x[:, :-1])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).backward()
        grads[backend] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    worst, where = 0.0, ""
    for n, g in grads["sdpa"].items():
        h = grads["flex"].get(n)
        if h is None:
            return {"status": "mismatch", "error": f"no gradient for {n} through FlexAttention"}
        rel = ((g - h).norm() / g.norm().clamp_min(1e-12)).item()
        if rel > worst:
            worst, where = rel, n
    return {"max_rel_grad_error": worst, "at": where, "status": "ok" if worst <= GRAD_TOL else "mismatch"}


#: the new FIRE path (``FIRE.masked_bias_segments``, issue 49) against eq. 3–4 on the device:
#: (q_len, k_len, q_offset, position_offset, FIRE options) — below L, across L, above L with a
#: position offset and a query block, a normalizer cap, mlp_depth 2
FIRE_PATH_CASES = {
    "below L": (256, 256, 0, 0, {"init_L": 512.0}),
    "across L": (300, 300, 0, 0, {"init_L": 64.0}),
    "offset, query block": (128, 384, 256, 1000, {"init_L": 64.0}),
    "cap": (256, 256, 0, 0, {"init_L": 32.0, "normalizer_cap": 128}),
    "mlp_depth 2": (200, 200, 0, 0, {"init_L": 64.0, "mlp_depth": 2}),
}
#: float64 on both sides: rounding only (~1e-15); float32 path vs float64 formula: float32 rounding
FIRE_PATH_TOL64, FIRE_PATH_TOL32 = 1e-10, 1e-4


def _fire_path_parity(case: str, dev: torch.device) -> dict:
    """``masked_bias_segments`` vs ``masked_bias_reference`` on ``dev``: values in float64 and
    float32, gradients of c, L and every MLP weight in float64 (relative to each gradient's max)."""
    from fireviz.encodings import FIRE

    q_len, k_len, q_offset, P, opts = FIRE_PATH_CASES[case]
    torch.manual_seed(0)
    f = FIRE(8, **opts).to(dev).double()
    with torch.no_grad():
        for p in f.mlp.parameters():
            p.normal_(0.0, 1.0)
    out: dict = {}
    ref = f.masked_bias_reference(q_len, k_len, q_offset, P)
    got = f.masked_bias_segments(q_len, k_len, q_offset, P)
    finite = torch.isfinite(ref)
    same_mask = bool(torch.equal(finite, torch.isfinite(got)))
    out["max_abs_error_f64"] = (got[finite] - ref[finite]).abs().max().item()
    upstream = torch.randn(ref.shape, dtype=torch.float64, device=dev, generator=None)
    grads = []
    for b in (got, ref):
        f.zero_grad(set_to_none=True)
        (b.masked_fill(~finite, 0.0) * upstream).sum().backward()
        grads.append({n: p.grad.clone() for n, p in f.named_parameters() if p.grad is not None})
    worst, where = 0.0, ""
    for n, g in grads[1].items():
        h = grads[0].get(n)
        err = float("inf") if h is None else ((h - g).abs().max() / g.abs().max().clamp_min(1e-3)).item()
        if err > worst:
            worst, where = err, n
    out.update(max_rel_grad_error_f64=worst, grad_worst=where, gradients=sorted(grads[1]))
    f32 = f.float()
    with torch.no_grad():
        got32 = f32.masked_bias_segments(q_len, k_len, q_offset, P).double()
    out["max_abs_error_f32"] = (got32[finite] - ref[finite].detach()).abs().max().item()
    ok = (
        same_mask
        and out["max_abs_error_f64"] <= FIRE_PATH_TOL64
        and worst <= FIRE_PATH_TOL64
        and out["max_abs_error_f32"] <= FIRE_PATH_TOL32
    )
    out["status"] = "ok" if ok else "mismatch"
    return out


def parity(dev: torch.device, sizes: Sizes, budget: Budget) -> dict:
    from fireviz.encodings import encoding_names, encoding_spec
    from fireviz.model import flex

    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out: dict = {
        "tolerance_logits": PARITY_TOL,
        "tolerance_grad": GRAD_TOL,
        "logits": {},
        "flex_forward": {},
        "flex_grad": {},
        "fire_path": {},
    }
    try:
        for case in FIRE_PATH_CASES:  # the new FIRE path first: what issue 49 changed
            out["fire_path"][case] = _run(_fire_path_parity, case, dev)
        for name in encoding_names():
            out["logits"][name] = (
                _run(_logits_parity, name, dev, sizes) if budget.ok() else {"status": "skipped", "error": "time budget"}
            )
        flex_ok = flex.flex_available()
        for name in encoding_names():
            if encoding_spec(name).kind != "additive" and name != "rope":
                continue
            if FLEX_PARITY and name not in FLEX_PARITY:
                continue
            if "flex" not in ATTENTION:
                out["flex_forward"][name] = {"status": "skipped", "error": "--attention without flex"}
                continue
            if not budget.ok(30):
                out["flex_forward"][name] = {"status": "skipped", "error": "time budget"}
                continue
            if not flex_ok:
                out["flex_forward"][name] = {"status": "unavailable", "error": flex.unavailable_reason()}
                continue
            out["flex_forward"][name] = _run(_flex_forward_parity, name, dev, sizes)
        for name in ("alibi", "t5", "fire"):
            if FLEX_PARITY and name not in FLEX_PARITY:
                continue
            if "flex" not in ATTENTION:
                out["flex_grad"][name] = {"status": "skipped", "error": "--attention without flex"}
            elif dev.type != "cuda":
                out["flex_grad"][name] = {
                    "status": "unavailable",
                    "error": "PyTorch has no FlexAttention backward on CPU",
                }
            elif not flex_ok:
                out["flex_grad"][name] = {"status": "unavailable", "error": flex.unavailable_reason()}
            elif not budget.ok(60):
                out["flex_grad"][name] = {"status": "skipped", "error": "time budget"}
            else:
                out["flex_grad"][name] = _run(_flex_grad_parity, name, dev, sizes)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return out


def _run(fn, *args) -> dict:
    """``fn(*args)``, or the failure as JSON: one failure must not hide the rest."""
    try:
        return fn(*args)
    except Exception as e:
        return _failure(e)


# ---------------------------------------------------------------------------------------------
# 3. train_step
# ---------------------------------------------------------------------------------------------
def _train_speed(
    name: str, backend: str, compile_model: bool, dev: torch.device, sizes: Sizes, peak: float | None
) -> dict:
    model = _gpt(name, sizes.base_model, sizes.train_seq, dev).train().set_attention_backend(backend)
    n_params = model.num_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    run = torch.compile(model) if compile_model else model
    x = torch.randint(0, 256, (sizes.train_batch, sizes.train_seq + 1), device=dev)
    vocab = model.lm_head.out_features

    def step():
        with _autocast(dev):
            logits = run(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(sizes.warmup_steps):
        step()
    _sync(dev)
    warm = time.perf_counter() - t0
    base = _reset_peak(dev)
    t = time.perf_counter()
    for _ in range(sizes.train_steps):
        loss = step()
    _sync(dev)
    sec = time.perf_counter() - t
    tps = sizes.train_batch * sizes.train_seq * sizes.train_steps / sec
    n_layer, _, d_model = sizes.base_model
    flops_per_token = 6 * n_params + 12 * n_layer * d_model * sizes.train_seq  # weights + causal scores (fwd+bwd)
    return {
        "status": "ok" if torch.isfinite(loss).item() else "non-finite loss",
        "tokens_per_s": round(tps),
        "mfu": round(flops_per_token * tps / (peak * 1e12), 4) if peak else None,
        "peak_mib": _peak_mib(dev, base),
        "warmup_s": round(warm, 2),
        "parameters": n_params,
    }


def train_step(dev: torch.device, sizes: Sizes, budget: Budget, peak: float | None) -> dict:
    out: dict = {"shape": list(sizes.base_model), "seq_len": sizes.train_seq, "batch": sizes.train_batch, "rows": []}
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    for name, backend, comp in TRAIN_ROWS:
        if backend not in ATTENTION or (comp and not COMPILE[0]):
            continue
        row = {"encoding": name, "attention": backend, "compile": comp}
        if not budget.ok(60 if comp else 20):
            row.update(status="skipped", error="time budget")
        elif backend == "flex" and dev.type != "cuda":
            row.update(status="unavailable", error="PyTorch has no FlexAttention backward on CPU")
        else:
            row.update(_run(_train_speed, name, backend, comp, dev, sizes, peak))
        out["rows"].append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    _add_ratios(out["rows"], "tokens_per_s", ("attention", "compile"), higher_is_faster=True)
    return out


def _add_ratios(rows: list[dict], key: str, same: tuple[str, ...], higher_is_faster: bool) -> None:
    """``vs_alibi`` / ``vs_nope`` on each ok row: its cost (time per step or per forward) over
    ALiBi's / NoPE's in the row with the same ``same`` fields (e.g. attention path and compile);
    above 1 means slower. None where that row is missing or failed."""
    for row in rows:
        for ref_name in ("alibi", "nope"):
            ref = next(
                (
                    r
                    for r in rows
                    if r["encoding"] == ref_name and all(r.get(k) == row.get(k) for k in same) and r.get(key)
                ),
                None,
            )
            value = row.get(key)
            ratio = None
            if ref is not None and value and row.get("status") == "ok":
                ratio = ref[key] / value if higher_is_faster else value / ref[key]
            row[f"vs_{ref_name}"] = round(ratio, 3) if ratio is not None else None


# ---------------------------------------------------------------------------------------------
# 3b. fire_profile: where a FIRE training step goes, and torch.compile's graph breaks
# ---------------------------------------------------------------------------------------------
#: kernels listed per profile
TOP_KERNELS = 12


def _fire_step(dev: torch.device, sizes: Sizes, name: str = "fire"):
    model = _gpt(name, sizes.base_model, sizes.train_seq, dev).train()
    x = torch.randint(0, 256, (sizes.train_batch, sizes.train_seq + 1), device=dev)
    vocab = model.lm_head.out_features

    def loss_of(idx):
        with _autocast(dev):
            logits = model(idx[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab).float(), idx[:, 1:].reshape(-1))

    return model, x, loss_of


def _top_kernels(dev: torch.device, sizes: Sizes) -> dict:
    """torch.profiler over one eager FIRE training step (forward + backward) after two warm-ups:
    the kernels (CUDA) or operators (CPU) with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    model, x, loss_of = _fire_step(dev, sizes)
    for _ in range(2):
        loss_of(x).backward()
    _sync(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        loss_of(x).backward()
        _sync(dev)
    events = prof.key_averages()

    def self_us(e) -> float:
        if dev.type == "cuda":
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))
        return float(e.self_cpu_time_total)

    total = sum(self_us(e) for e in events) or 1.0
    ranked = sorted(events, key=self_us, reverse=True)[:TOP_KERNELS]
    rows = [
        {
            "kernel": e.key[:120],
            "self_ms": round(self_us(e) / 1e3, 3),
            "share": round(self_us(e) / total, 4),
            "calls": e.count,
        }
        for e in ranked
    ]
    return {"clock": "device" if dev.type == "cuda" else "cpu", "total_ms": round(total / 1e3, 2), "rows": rows}


def _graph_breaks(dev: torch.device, sizes: Sizes) -> dict:
    """``torch._dynamo.explain`` of a FIRE training forward + loss: graphs, breaks and their reasons
    (the reasons that point into attention or the encoding listed apart)."""
    import torch._dynamo

    from fireviz.encodings import fire

    torch._dynamo.reset()
    _, x, loss_of = _fire_step(dev, sizes)
    # on a CPU (--dry-run) the CUDA path is traced too: the CPU's own path calls compiled kernels
    forced = dev.type not in fire.SEGMENT_PATH_DEVICES
    fire.SEGMENT_PATH_DEVICES.add(dev.type)
    try:
        explanation = torch._dynamo.explain(loss_of)(x)
    finally:
        if forced:
            fire.SEGMENT_PATH_DEVICES.discard(dev.type)
    reasons = []
    for r in explanation.break_reasons:
        frame = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        where = f"{Path(frame.filename).name}:{frame.lineno}" if frame is not None else ""
        reasons.append({"reason": str(r.reason).splitlines()[0][:200], "at": where})

    def count(files: tuple[str, ...]) -> int:
        return sum(1 for r in reasons if r["at"].split(":")[0] in files)

    return {
        "fire_path": "masked_bias_segments" + (f" (forced on {dev.type} for this count)" if forced else ""),
        "graphs": explanation.graph_count,
        "graph_breaks": explanation.graph_break_count,
        # attention.py's breaks on a CPU are its own training path (BiasedAttention), which CUDA does not take
        "breaks_inside_attention": count(("attention.py", "flex.py")),
        "breaks_inside_fire_bias": count(("fire.py", "fire_segments.py", "base.py")),
        "reasons": reasons[:10],
    }


def fire_profile(dev: torch.device, sizes: Sizes, budget: Budget) -> dict:
    if not budget.ok(45):
        return {"status": "skipped", "error": "time budget"}
    out: dict = {"top_kernels": _run(_top_kernels, dev, sizes)}
    out["compile_graph_breaks"] = _run(_graph_breaks, dev, sizes) if budget.ok(30) else {"status": "skipped"}
    failed = [k for k, v in out.items() if isinstance(v, dict) and v.get("status") == "failed"]
    out["status"] = "failed" if failed else "ok"
    if failed:
        out["error"] = "; ".join(f"{k}: {out[k].get('error')}" for k in failed)
    return out


# ---------------------------------------------------------------------------------------------
# 4. eval_memory
# ---------------------------------------------------------------------------------------------
def _eval_forward(name: str, n: int, backend: str, dev: torch.device, sizes: Sizes, peak: float | None) -> dict:
    model = _gpt(name, sizes.base_model, sizes.train_seq, dev).eval().set_attention_backend(backend)
    x = torch.randint(0, 256, (1, n), device=dev)
    with torch.inference_mode(), _autocast(dev):
        t = time.perf_counter()
        model(x)  # warm-up at the measured length: FlexAttention compiles per shape (dynamic=False)
        _sync(dev)
        warm = time.perf_counter() - t
        base = _reset_peak(dev)
        t = time.perf_counter()
        logits = model(x)
        _sync(dev)
        sec = time.perf_counter() - t
    n_layer, heads, d_model = sizes.base_model
    flops_per_token = 2 * model.num_parameters() + 2 * n_layer * d_model * n  # weights + causal scores (fwd)
    return {
        "status": "ok" if torch.isfinite(logits).all().item() else "non-finite logits",
        "seconds": round(sec, 3),
        "tokens_per_s": round(n / sec),
        "mfu": round(flops_per_token * n / sec / (peak * 1e12), 4) if peak else None,
        "peak_mib": _peak_mib(dev, base),
        "warmup_s": round(warm, 2),
        # what a [heads, n, n] bias alone would take in the dtype of this run (bf16 on CUDA, float32 on CPU)
        "full_bias_mib": round(heads * n * n * (2 if dev.type == "cuda" else 4) / 2**20, 1),
    }


def eval_memory(dev: torch.device, sizes: Sizes, budget: Budget, peak: float | None = None) -> dict:
    from fireviz.model import flex

    out: dict = {"shape": list(sizes.base_model), "rows": []}
    for name, which, backend in EVAL_ROWS:
        if backend not in ATTENTION:
            continue
        n = sizes.eval_lengths[which]
        row = {"encoding": name, "length": n, "attention": backend}
        if not budget.ok(20):
            row.update(status="skipped", error="time budget")
        elif backend == "flex" and not flex.flex_available():
            row.update(status="unavailable", error=flex.unavailable_reason())
        else:
            row.update(_run(_eval_forward, name, n, backend, dev, sizes, peak))
        out["rows"].append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out["rows"].sort(key=lambda r: (r["length"], r["attention"]))  # the report reads length by length
    _add_ratios(out["rows"], "seconds", ("length", "attention"), higher_is_faster=False)
    return out


# ---------------------------------------------------------------------------------------------
# 5. trainer and 6. ddp: the real `fireviz train` in subprocesses
# ---------------------------------------------------------------------------------------------
def _train_command(dev: torch.device, sizes: Sizes, out: Path, compile_model: bool) -> list[str]:
    steps = sizes.trainer_steps
    sets = [
        "model.position_encoding=fire",
        f"train.max_steps={steps}",
        f"train.warmup_steps={max(1, steps // 10)}",
        f"train.eval_interval={steps}",
        f"train.checkpoint_interval={steps}",
        "train.eval_batches=1",
        f"train.device={dev.type}",
        f"train.compile={'true' if compile_model else 'false'}",
        *sizes.trainer_model,
    ]
    args = ["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(out), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    return args


def _last_log(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r and "step" in r]
    return steps[-1] if steps else {}


def _subprocess_train(cmd: list[str], out: Path, timeout: float, env: dict | None = None) -> dict:
    """Run ``cmd`` (a `fireviz train`, maybe under torchrun) in its own process group; past
    ``timeout`` seconds the whole group is killed (torchrun's workers too, not only the launcher)."""
    t = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {
            "status": "failed",
            "error": f"stopped after the {timeout:.0f} s left of the budget (every process killed)",
        }
    sec = time.perf_counter() - t
    if p.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"status": "failed", "error": f"exit {p.returncode}: {' | '.join(tail)[:400]}", "seconds": round(sec, 1)}
    last = _last_log(out)
    return {
        "status": "ok",
        "seconds": round(sec, 1),
        "steps": last.get("step"),
        "last_loss": last.get("loss"),
        "tokens_per_s": round(last["tokens_per_s"]) if "tokens_per_s" in last else None,
    }


def trainer(dev: torch.device, sizes: Sizes, budget: Budget, work: Path) -> dict:
    out: dict = {"rows": []}
    for comp in (False, True) if COMPILE[0] else (False,):
        row: dict = {"compile": comp}
        if not budget.ok(120 if comp else 60):
            row.update(status="skipped", error="time budget")
        else:
            folder = work / f"trainer_compile{int(comp)}"
            cmd = [sys.executable, "-m", "fireviz", "train", *_train_command(dev, sizes, folder, comp)]
            row.update(_run(_subprocess_train, cmd, folder, max(30.0, budget.left())))
        out["rows"].append(row)
    return out


def ddp(dev: torch.device, sizes: Sizes, budget: Budget, work: Path, single: dict | None) -> dict:
    procs = torch.cuda.device_count() if dev.type == "cuda" else 2
    backend = ("nccl" if dev.type == "cuda" else "gloo") if procs > 1 else "none: one process, no process group"
    out: dict = {"processes": procs, "backend": backend}
    if not budget.ok(60):
        out.update(status="skipped", error="time budget")
        return out
    folder = work / "ddp"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
        "-m", "fireviz", "train", *_train_command(dev, sizes, folder, False),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out.update(_run(_subprocess_train, cmd, folder, max(30.0, budget.left()), env))
    if single and single.get("status") == "ok" and out.get("status") == "ok":
        out["one_process_last_loss"] = single["last_loss"]
        out["last_loss_difference"] = abs(out["last_loss"] - single["last_loss"])
    return out


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def published(dev: torch.device, sizes: Sizes, budget: Budget) -> dict:
    """A published causal LM's evaluation at the eval lengths (``benchmarks/published_lm.py``)."""
    from published_lm import run as run_published

    if not budget.ok(60):
        return {"status": "skipped", "error": "out of budget"}
    tiny = dev.type != "cuda"
    lengths = [64, 128] if tiny else list(sizes.eval_lengths)
    result = run_published(lengths, 1, dev.type, tiny)
    failed = [r for r in result["rows"] if r.get("status") != "ok"]
    return {"status": "failed" if failed else "ok", **result, **({"error": failed[0].get("error")} if failed else {})}


def shards(dev: torch.device, sizes: Sizes, budget: Budget, work: Path) -> dict:
    """Tokenizer → ``prepare`` → training from shards (configs/gpu_small.toml) on ``dev``."""
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.data.prepare import prepare
    from fireviz.data.tokenizers import train_bpe
    from fireviz.train import load_config, train

    if not budget.ok(90):
        return {"status": "skipped", "error": "time budget"}
    out: dict = {"vocab_size": sizes.shard_vocab}
    t = time.perf_counter()
    train_bpe("prose", sizes.shard_vocab, work / "tokenizer")
    out["tokenizer_s"] = round(time.perf_counter() - t, 1)
    procs = max(1, min(8, os.cpu_count() or 1))
    t = time.perf_counter()
    m = prepare("prose", load_tokenizer(work / "tokenizer"), work / "shards", num_proc=procs, chunk_bytes=2 << 20)
    sec = time.perf_counter() - t
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["validation"]["tokens"]
    out.update(prepare_processes=procs, prepare_s=round(sec, 1), prepare_tokens_per_s=round(tokens / sec))
    out["tokens_per_byte"] = round(m["splits"]["train"]["tokens"] / m["splits"]["train"]["bytes"], 4)
    steps = sizes.shard_steps
    sets = [f"train.data={work / 'shards'}", f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 10)}"]
    sets += [f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}", "train.eval_batches=1"]
    sets += [f"train.device={dev.type}", f"train.compile={'true' if COMPILE[0] and dev.type == 'cuda' else 'false'}"]
    mc, tc = load_config(REPO / "configs" / "gpu_small.toml", [*sets, *sizes.shard_model])
    base = _reset_peak(dev)
    t = time.perf_counter()
    result = train(mc, tc, work / "small", progress=False)
    sec = time.perf_counter() - t
    last = _last_log(work / "small")
    out.update(
        status="ok",
        model=f"{mc.n_layer} layers, {mc.n_head} heads, d = {mc.d_model}, {mc.seq_len} tokens, vocab {mc.vocab_size}",
        train_s=round(sec, 1),
        steps=result["step"],
        tokens_per_s=round(last["tokens_per_s"]) if "tokens_per_s" in last else None,
        peak_mib=_peak_mib(dev, base),
        last_loss=result["loss"],
        val_loss=result["val_loss"],
    )
    return out


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def _table(rows: list[dict], cols: list[str]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return lines


def _not_run(results: dict) -> list[str]:
    """One line per reason a measurement was skipped or unavailable, naming what it left out."""
    reasons: dict[str, list[str]] = {}
    for kind, items in results.get("parity", {}).items():
        if isinstance(items, dict):
            for name, r in items.items():
                if isinstance(r, dict) and r.get("status") in ("skipped", "unavailable"):
                    reasons.setdefault(f"{r['status']}: {r.get('error')}", []).append(f"parity {kind} {name}")
    for step in ("train_step", "eval_memory", "trainer"):
        for row in results.get(step, {}).get("rows", []):
            if row.get("status") in ("skipped", "unavailable"):
                what = " ".join(str(row[k]) for k in ("encoding", "length", "attention") if k in row)
                reasons.setdefault(f"{row['status']}: {row.get('error')}", []).append(f"{step} {what}".strip())
    for step in ("ddp", "shards"):
        d = results.get(step, {})
        if d.get("status") == "skipped":
            reasons.setdefault(f"skipped: {d.get('error')}", []).append(step)
    asked = results.get("asked", {})
    left = [s for s in STEPS if s not in asked.get("only", STEPS)]
    if left:
        reasons.setdefault("left out by --only", []).extend(left)
    paths = [a for a in ("sdpa", "flex") if a not in asked.get("attention", ["sdpa", "flex"])]
    if paths:
        reasons.setdefault("left out by --attention", []).append(
            f"{', '.join(paths)} rows of train_step and eval_memory"
        )
    if asked.get("compile") is False:
        reasons.setdefault("left out by --no-compile", []).append("torch.compile rows of train_step and trainer")
    return [f"- {why} — {', '.join(what)}" for why, what in reasons.items()]


def _parity_section(par: dict) -> list[str]:
    """The parity table: logits on the device vs float64, FlexAttention's forward and gradients."""
    if not par.get("logits"):
        return []
    rows = []
    for name, r in par["logits"].items():
        f = par.get("flex_forward", {}).get(name, {})
        g = par.get("flex_grad", {}).get(name, {})
        rows.append(
            {
                "encoding": name,
                "logits": r.get("max_abs_logit_error", r.get("status")),
                "flex fwd": f.get("max_abs_logit_error", f.get("status")),
                "flex grad (rel)": g.get("max_rel_grad_error", g.get("status")),
            }
        )
    return (
        [f"## Parity (float32 on the device vs float64 on CPU; tolerance {PARITY_TOL:g} in logits)", ""]
        + _table(rows, ["encoding", "logits", "flex fwd", "flex grad (rel)"])
        + [
            "",
            "– : not measured for that encoding (FlexAttention fuses additive biases and RoPE; gradients are "
            "checked for ALiBi, T5 and FIRE); skipped / unavailable: see Not run.",
            "",
        ]
    )


def _fire_path_section(par: dict) -> list[str]:
    """The new FIRE path against eq. 3–4 on the device (issue 49)."""
    rows = [{"case": case, **r} for case, r in par.get("fire_path", {}).items()]
    if not rows:
        return []
    return (
        [
            f"## FIRE's CUDA path vs eq. 3–4 (``masked_bias_segments`` vs ``masked_bias_reference`` on the device; "
            f"float64 values and gradients ≤ {FIRE_PATH_TOL64:g}, float32 values ≤ {FIRE_PATH_TOL32:g})",
            "",
        ]
        + _table(
            rows, ["case", "status", "max_abs_error_f64", "max_rel_grad_error_f64", "grad_worst", "max_abs_error_f32"]
        )
        + [""]
    )


def _profile_section(prof: dict) -> list[str]:
    """FIRE's top kernels by self time and the graph breaks of its compiled training forward."""
    lines: list[str] = []
    top = prof.get("top_kernels", {})
    if top.get("rows"):
        lines += [
            f"## FIRE training step: top kernels by self {top.get('clock')} time (one eager step, {top.get('total_ms')} ms in all)",
            "",
        ]
        lines += _table(top["rows"], ["kernel", "self_ms", "share", "calls"]) + [""]
    gb = prof.get("compile_graph_breaks", {})
    if "graph_breaks" in gb:
        lines += [
            "## torch.compile of a FIRE training forward + loss (torch._dynamo.explain)",
            "",
            f"FIRE's mask from {gb.get('fire_path')}: {gb['graphs']} graph(s), {gb['graph_breaks']} break(s), "
            f"{gb['breaks_inside_attention']} inside attention (attention.py, flex.py), "
            f"{gb['breaks_inside_fire_bias']} inside FIRE's bias (fire.py, fire_segments.py).",
            "",
        ]
        if gb.get("reasons"):
            lines += _table(gb["reasons"], ["reason", "at"]) + [""]
    return lines


def report(results: dict) -> str:
    """The short Markdown report of ``results`` (what ``gpu.json`` holds)."""
    env = results.get("environment", {})
    lines = [
        f"# GPU check ({'dry run on CPU, toy sizes' if results['dry_run'] else 'full sizes'})",
        "",
        (
            f"{results['started']} · torch {env.get('torch')} · CUDA {env.get('cuda')} · "
            f"{', '.join(env.get('gpus') or []) or 'no GPU'} · FlexAttention "
            f"{'available' if env.get('flex_available') else 'unavailable: ' + str(env.get('flex_unavailable_reason'))}"
            if "torch" in env
            else f"{results['started']} · {results.get('device', '?')} (the environment step was not run)"
        ),
        "",
    ]
    failures = []
    par = results.get("parity", {})
    lines += _parity_section(par)
    lines += _fire_path_section(par)
    sizes = results.get("sizes", {})
    device = results.get("device", env.get("device", "?"))
    cuda = str(device).startswith("cuda")
    layers, heads, width = sizes.get("base_model", ("?", "?", "?"))
    shape = f"{layers} layers, {heads} heads, d = {width}"
    where = f"{'bf16 autocast' if cuda else 'float32'} on {device}"
    steps = f"{sizes.get('train_steps')} timed steps after {sizes.get('warmup_steps')}, one run: no interval"
    for key, title, cols in (
        ("train_step", f"Training step ({shape}; {sizes.get('train_seq')} tokens × batch {sizes.get('train_batch')}; {where}; {steps}; vs_*: time per step over ALiBi's / NoPE's, same path and compile)", ["encoding", "attention", "compile", "status", "tokens_per_s", "mfu", "peak_mib", "vs_alibi", "vs_nope", "warmup_s"]),
        ("eval_memory", f"Evaluation forward ({shape}; batch 1; {where}; the second of two forwards; vs_*: seconds over ALiBi's / NoPE's, same length and path)", ["encoding", "length", "attention", "status", "seconds", "tokens_per_s", "mfu", "peak_mib", "vs_alibi", "vs_nope", "full_bias_mib"]),
        ("trainer", f"`fireviz train` (configs/tiny.toml, FIRE, {sizes.get('trainer_steps')} steps, {device})", ["compile", "status", "seconds", "steps", "tokens_per_s", "last_loss"]),
        ("published", f"Published causal LM through the evaluation (Llama, {_fmt((results.get('published') or {}).get('parameters'))} parameters, random weights; {where}; one window per length)", ["length", "status", "seconds", "tokens_per_s", "peak_bytes", "weights_bytes"]),
    ):  # fmt: skip
        rows = results.get(key, {}).get("rows", [])
        if rows:
            lines += [f"## {title}", ""] + _table(rows, cols) + [""]
    lines += _profile_section(results.get("fire_profile", {}))
    if "ddp" in results:
        d = results["ddp"]
        lines += [
            "## DDP under torchrun",
            "",
            f"{d.get('processes')} process(es), {d.get('backend')}: {d.get('status')}"
            + (
                f", last loss {_fmt(d.get('last_loss'))} (one process {_fmt(d.get('one_process_last_loss'))})"
                if d.get("status") == "ok"
                else ""
            ),
            "",
        ]
    if results.get("shards", {}).get("status") == "ok":
        sh = results["shards"]
        lines += [
            "## Token shards (issue #37)",
            "",
            f"BPE tokenizer of {sh['vocab_size']:,} tokens on the bundled prose in {sh['tokenizer_s']} s "
            f"({sh['tokens_per_byte']} tokens per byte); `prepare` with {sh['prepare_processes']} processes: "
            f"{sh['prepare_s']} s, {_fmt(sh['prepare_tokens_per_s'])} tokens/s. configs/gpu_small.toml ({sh['model']}) "
            f"from the shards on {device}: {sh['steps']} steps in {sh['train_s']} s, {_fmt(sh['tokens_per_s'])} "
            f"tokens/s, peak {_fmt(sh['peak_mib'])} MiB, last loss {_fmt(sh['last_loss'])}.",
            "",
        ]
    for step in STEPS:
        r = results.get(step)
        if isinstance(r, dict) and r.get("status") == "failed":
            failures.append(f"- {step}: {r.get('error')} ({r.get('at', '')})")
        for sub in ("rows",):
            for row in (r or {}).get(sub, []) if isinstance(r, dict) else []:
                if row.get("status") not in ("ok", "skipped", "unavailable"):
                    what = " ".join(f"{k}={row[k]}" for k in ("encoding", "length", "attention", "compile") if k in row)
                    failures.append(f"- {step} {what}: {row.get('error', row.get('status'))} ({row.get('at', '')})")
    for kind in ("logits", "flex_forward", "flex_grad", "fire_path"):
        for name, r in par.get(kind, {}).items():
            if r.get("status") not in ("ok", "skipped", "unavailable"):
                failures.append(f"- parity {kind} {name}: {r.get('error', r.get('status'))}")
    lines += ["## Failures", ""] + (failures or ["none"]) + [""]
    lines += ["## Not run", ""] + (_not_run(results) or ["nothing"]) + [""]
    lines += [f"Wall time {results['seconds']:.0f} s of a {results['budget_s']:.0f} s budget."]
    return "\n".join(lines) + "\n"


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], dict[str, float]]:
    """The command line, checked: ``(args, steps asked for, per-step caps in seconds)``; sets
    ``ATTENTION``, ``COMPILE``, ``FLEX_PARITY`` and ``STEM``. Exits with argparse's message on bad input."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=str(REPO / "out" / "gpu"), help="folder for STEM.json and STEM.md (default out/gpu)"
    )
    ap.add_argument("--dry-run", action="store_true", help="every step at toy sizes on the CPU")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip steps that would start after this (s)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by GPU name)")
    ap.add_argument("--attention", default="sdpa,flex", help="attention paths of train_step / eval_memory rows")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    ap.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps of {', '.join(STEPS)}")
    ap.add_argument(
        "--flex-parity", default="", help="encodings of the FlexAttention parity, forward and gradients (default all)"
    )
    ap.add_argument("--step-budget", default="", help="per-step caps in seconds, e.g. train_step=220,eval_memory=120")
    ap.add_argument("--stem", default="gpu", help="file names STEM.json and STEM.md in --out (default gpu)")
    args = ap.parse_args(argv)
    FLEX_PARITY[:] = [a.strip() for a in args.flex_parity.split(",") if a.strip()]
    ATTENTION[:] = [a.strip() for a in args.attention.split(",") if a.strip()]
    COMPILE[0] = not args.no_compile
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(STEPS))
    if unknown or not only:
        ap.error(f"--only: unknown or no step(s) {unknown or args.only!r}; choose from {', '.join(STEPS)}")
    bad = sorted(set(ATTENTION) - {"sdpa", "flex"})
    if bad or not ATTENTION:
        ap.error(f"--attention: unknown or no path(s) {bad or args.attention!r}; choose from sdpa, flex")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a file; give a folder (it is created if missing)")
    step_budget = {}
    for item in filter(None, (a.strip() for a in args.step_budget.split(","))):
        name, _, sec = item.partition("=")
        try:
            step_budget[name.strip()] = float(sec)
        except ValueError:
            ap.error(f"--step-budget: {item!r} is not STEP=SECONDS")
        if name.strip() not in STEPS:
            ap.error(f"--step-budget: unknown step {name.strip()!r}; choose from {', '.join(STEPS)}")
    if not args.stem or "/" in args.stem or args.stem.startswith("."):
        ap.error(f"--stem {args.stem!r}: give a plain file name stem, e.g. gpu_issue49_2026-12-07")
    STEM[0] = args.stem
    return args, only, step_budget


def _run_step(step: str, dev, sizes: Sizes, budget: Budget, peak, work: Path, results: dict) -> dict:
    """One step's results (its failure as JSON if it raised)."""
    if step == "environment":
        return _run(environment, dev, sizes, budget)
    if step == "parity":
        return _run(parity, dev, sizes, budget)
    if step == "train_step":
        return _run(train_step, dev, sizes, budget, peak)
    if step == "fire_profile":
        return _run(fire_profile, dev, sizes, budget)
    if step == "eval_memory":
        return _run(eval_memory, dev, sizes, budget, peak)
    if step == "trainer":
        return _run(trainer, dev, sizes, budget, work)
    if step == "ddp":
        rows = results.get("trainer", {}).get("rows", [])
        return _run(ddp, dev, sizes, budget, work, rows[0] if rows else None)
    if step == "published":
        return _run(published, dev, sizes, budget)
    return _run(shards, dev, sizes, budget, work)


def main(argv: list[str] | None = None) -> int:
    args, only, step_budget = _parse_args(argv)
    if not torch.cuda.is_available() and not args.dry_run:
        print("CUDA is not available: nothing measured (use --dry-run to run every step at toy sizes on the CPU).")
        return 0
    dev = torch.device("cpu" if args.dry_run else "cuda")
    sizes = TOY if args.dry_run else FULL
    peak = args.peak_tflops
    if peak is None and dev.type == "cuda":
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in torch.cuda.get_device_name()), None)
    whole = Budget(args.budget_s)
    t0 = time.perf_counter()
    results: dict = {
        "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "budget_s": args.budget_s,
        "peak_tflops": peak,
        "device": str(dev),
        "sizes": asdict(sizes),
        "asked": {
            "only": only,
            "attention": list(ATTENTION),
            "compile": COMPILE[0],
            "flex_parity": list(FLEX_PARITY),
            "step_budget_s": step_budget,
        },
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fireviz-gpu-") as tmp:
        for step in STEPS:
            if step not in only:
                continue
            print(f"[{time.perf_counter() - t0:6.0f} s] {step} …", flush=True)
            budget = whole.within(step_budget.get(step))
            results[step] = _run_step(step, dev, sizes, budget, peak, Path(tmp), results)
            results["seconds"] = time.perf_counter() - t0
            _write(out_dir, results)  # after every step: a killed call keeps what it measured
    results["seconds"] = time.perf_counter() - t0
    _write(out_dir, results)
    print(report(results))
    return 0


def _write(out_dir: Path, results: dict) -> None:
    """gpu.json and gpu.md, each replaced atomically."""
    for name, text in (
        (f"{STEM[0]}.json", json.dumps(results, indent=1, default=str)),
        (f"{STEM[0]}.md", report(results)),
    ):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)


if __name__ == "__main__":
    sys.exit(main())
