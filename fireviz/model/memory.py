"""Memory before work: estimate what a call will need, compare it with what the machine has.

Evaluation (and the other long calls) estimate their peak memory from the settings alone and
refuse, before allocating, what would not fit — with the estimate and the largest setting
that does — instead of climbing until the allocator fails.

The estimate is the working memory of one inference forward pass of the GPT (fireviz.model)
on ``batch`` windows of ``length`` tokens, float32, attention in query blocks of
``attn_query_block`` (a block's bias/mask ``[heads, block, keys]`` is built per layer), plus
the logits and the loss; calibrated against measured peak RSS by benchmarks/memory_estimate.py
(within 2× of it at 512…8192).
"""

from __future__ import annotations

import os

from fireviz.encodings import encoding_spec

FLOAT32 = 4
#: floats per token held at once inside a block (residual, LayerNorm out, qkv and its permuted
#: copy, attention out, projection, MLP hidden and GELU out): ≈ 16·d_model
ACTIVATION_FLOATS_PER_CHANNEL = 16
#: copies of ``[batch, length, vocab]`` alive while the loss is computed (logits, the slice
#: cross_entropy reads, its log-softmax)
LOGIT_COPIES = 3
#: ``[heads, block, keys]`` float32 tensors alive per attention call (the bias/mask and one
#: temporary while it is built); SDPA's fused CPU kernel reads it without a batch copy
BIAS_COPIES = 2
#: allocations of the scoring loop itself (batches of windows, per-document sums, allocator
#: slack), measured ≈ 100 MiB on the bundled models
SCORING_OVERHEAD = 96 << 20


class InsufficientMemoryError(ValueError):
    """A call would need more memory than the machine has available (message: both figures)."""


def forward_bytes(config, batch: int, length: int) -> int:
    """Estimated working memory (bytes) of one inference forward + loss of a GPT.

    Args: ``config`` a ``GPTConfig`` (n_head, d_model, vocab_size, attn_query_block,
      position_encoding kind via ``additive``), ``batch`` windows of ``length`` tokens.
    Returns: bytes above what is already allocated (weights and data are not included).
    """
    tokens = batch * length
    block = min(length, config.attn_query_block)
    act = ACTIVATION_FLOATS_PER_CHANNEL * config.d_model * tokens * FLOAT32
    logits = LOGIT_COPIES * config.vocab_size * tokens * FLOAT32
    additive = getattr(config, "additive_attention", None)  # a published model's config says it
    if additive is None:
        additive = encoding_spec(config.position_encoding).additive
    if additive:
        attn = BIAS_COPIES * config.n_head * block * length * FLOAT32
    else:  # a bool mask [block, keys] (one byte each) when blocked; none for one causal block
        attn = block * length if length > block else 0
    return int(SCORING_OVERHEAD + act + logits + attn)


def current_rss() -> int:
    """Resident memory of this process now (bytes); 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        except Exception:  # not on this platform
            return 0


def available_bytes(device: str = "cpu") -> int | None:
    """Memory a new allocation may use (bytes): ``MemAvailable`` of /proc/meminfo on CPU, the free
    memory of the current CUDA device on ``cuda``; None where unknown (then nothing is refused)."""
    if str(device).startswith("cuda"):
        try:
            import torch

            return int(torch.cuda.mem_get_info()[0])
        except Exception:  # no CUDA runtime: unknown
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: float) -> str:
    """``n`` bytes as a short human figure: ``"1.3 GiB"``, ``"512 MiB"``."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_fits(needed: int, device: str = "cpu", what: str = "this call", hint: str = "") -> None:
    """Refuse ``needed`` bytes if they exceed the available memory of ``device``.

    Raises: InsufficientMemoryError naming ``what``, the estimate, what is available and ``hint``.
    """
    free = available_bytes(device)
    if free is not None and needed > free:
        raise InsufficientMemoryError(
            f"{what} needs about {gib(needed)} of memory (estimate), more than the "
            f"{gib(free)} available on {device}" + (f"; {hint}" if hint else "")
        )


def train_step_bytes(config, micro_batch: int, seq_len: int, num_parameters: int) -> int:
    """Estimated memory (bytes) of one training step: weights, gradients and Adam's two moments
    (16 bytes per parameter), the activations autograd keeps for the backward (≈ 20·d_model
    floats per token per layer plus the logits and their gradient), and for an additive bias
    the ``[heads, T, T]`` mask and its gradient per layer. Dominant terms only: a lower-side
    estimate, so that nothing that fits is refused."""
    tokens = micro_batch * seq_len
    act = config.n_layer * 20 * config.d_model * tokens * FLOAT32 + 3 * config.vocab_size * tokens * FLOAT32
    additive = getattr(config, "additive_attention", None)  # a published model's config says it
    if additive is None:
        additive = encoding_spec(config.position_encoding).additive
    bias = config.n_layer * 2 * config.n_head * seq_len * seq_len * FLOAT32 if additive else 0
    return int(16 * num_parameters + act + bias)


def fit_bytes(num_heads: int, max_len: int, mlp_width: int = 32, beyond_factor: int = 4, chunk: int = 16) -> int:
    """Estimated memory (bytes) of ``fireviz.fit.fitting.fit_fire``: the per-distance data (float64
    ``[max_len, heads]``, a few copies) and the chunked check beyond the fitted range
    (``[chunk, beyond_factor·max_len]`` rows through the MLP, float64 differences per head)."""
    top = beyond_factor * max_len
    data = 8 * max_len * (num_heads + mlp_width) * 8
    beyond = chunk * top * (mlp_width * FLOAT32 + 4 * num_heads * 8) + num_heads * top * 8
    return int(data + beyond)


def bias_report_bytes(n_head: int, n_layer: int, max_position: int) -> int:
    """Estimated memory (bytes) of ``fireviz.analysis.biases.run_bias_report``'s curves: one bias row
    ``[heads, i + 1]`` per query position and layer up to ``max_position`` (a few float32 copies)."""
    return int(16 * n_head * n_layer * (max_position + 1) + (64 << 20))


def bias_matrix_bytes(n_head: int, points: int) -> int:
    """Estimated memory (bytes) of one query × key bias matrix on ``points`` positions per axis:
    float32 ``[heads, points, points]``, a few copies."""
    return int(3 * FLOAT32 * n_head * points * points + (64 << 20))


def fire_curve_bytes(n_head: int, mlp_width: int, points: int, mlp_depth: int = 1) -> int:
    """Estimated memory (bytes) of FIRE's f_θ on ``points`` inputs: per hidden layer its
    ``[points, width]`` activations before and after the ReLU, then ``[points, heads]`` out."""
    return int(FLOAT32 * points * (2 * mlp_width * mlp_depth + 2 * n_head + 2) + (64 << 20))


def memory_problem(configs, length: int, batch: int, device, batch_tokens: int) -> str | None:
    """Why ``length`` cannot be evaluated in this machine's memory, or None if it fits.

    The estimate (``fireviz.model.memory.forward_bytes`` of the largest of ``configs`` on ``batch``
    windows) is compared with the memory available now. The message gives both figures and the
    largest length that fits with ``batch_tokens``.
    """
    need = max(forward_bytes(c, batch, length) for c in configs)
    free = available_bytes(str(device))
    if free is None or need <= free:
        return None
    lo, hi = 2, length  # forward_bytes grows with the length: the largest that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if max(forward_bytes(c, max(1, batch_tokens // mid), mid) for c in configs) <= free:
            lo = mid
        else:
            hi = mid - 1
    return (
        f"length {length:,} needs about {gib(need)} of memory (estimate for {batch} window(s) of {length:,} tokens), "
        f"more than the {gib(free)} available on {device.type}; the largest length that fits is about {lo:,} "
        "tokens — ask for a shorter length (or a machine with more memory)"
    )
