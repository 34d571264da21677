"""One buffer that the masks of a blocked inference forward reuse, block after block.

A long input goes through attention in query blocks (``GPTConfig.attn_query_block``), and each
block's additive mask ``[heads, rows, keys]`` is a fresh float32 tensor: up to 128 MiB at 8192
keys, mapped anew and page-faulted in on its first write (a fresh 128 MiB fill took 35 ms
against 8–11 ms into memory already touched; Intel Xeon, 2026-12-02). Inside
``reuse_mask_memory(numel)`` the masks built without autograd take views of one buffer instead
(``mask_output``), so a forward pass touches its pages once per layer instead of once per block;
the peak is the same (one block's mask is alive at a time, as before).

Only for masks consumed before the next is built (the model's query-block loop, without a
capture of attention); thread-local, so concurrent forwards never share it.
"""

from __future__ import annotations

import contextlib
import math
import threading

import torch

_local = threading.local()


@contextlib.contextmanager
def reuse_mask_memory(numel: int, device: torch.device | str = "cpu"):
    """Within the block, ``mask_output`` hands out views of one float32 buffer of ``numel``
    values on ``device`` (allocated here, freed at the end; the previous buffer is restored)."""
    previous = getattr(_local, "buffer", None)
    _local.buffer = torch.empty(numel, dtype=torch.float32, device=device)
    try:
        yield
    finally:
        _local.buffer = previous


def mask_output(shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised float32 tensor of ``shape`` (contiguous) on ``device`` for a mask that
    no autograd graph keeps: a view of this thread's ``reuse_mask_memory`` buffer when one is
    active, on that device and large enough; else a new tensor."""
    buffer = getattr(_local, "buffer", None)
    n = math.prod(shape)
    if buffer is not None and not torch.is_grad_enabled() and n <= buffer.numel():
        if buffer.device == torch.device(device):
            return buffer[:n].view(shape)
    return torch.empty(shape, dtype=torch.float32, device=device)
