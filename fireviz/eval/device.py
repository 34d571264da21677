"""Where an evaluation runs: the device, the attention path per length, and memory before work.

``resolve_device`` turns ``"auto"`` / ``"cpu"`` / ``"cuda"`` into a torch device (or says why
not); ``use_flex`` decides per length whether CUDA computes the bias inside FlexAttention
(``fireviz.model.flex``); ``memory_refusals`` replaces a length whose forward pass would not fit in
the memory available now by the reason (``fireviz.core.memory.memory_problem``), before any work.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from fireviz.eval.windows import EvaluationError, Window
from fireviz.model import flex, memory_problem

#: On CUDA, lengths from which evaluation computes the bias inside FlexAttention (``fireviz.model.flex``)
#: instead of materialising [heads, block, keys] per query block; None: never (the default). CPU
#: always uses the SDPA path. Off until a GPU run shows FlexAttention ahead: on an H200
#: (benchmarks/results/gpu_run1.md) the SDPA path evaluated the base shape with FIRE at 32,768 tokens
#: in 9.1 s with 6.0 GiB at peak, and the FlexAttention runs of that session were not valid (the
#: probe failed, then the recompile limit sent it to PyTorch's dense fallback; both fixed since).
FLEX_MIN_LENGTH: int | None = None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` as given.

    Raises: EvaluationError for CUDA requested without an available GPU, or an unknown name.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EvaluationError(f"unknown device {device!r}; use auto, cpu or cuda") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EvaluationError(
            "device 'cuda' requested but no CUDA GPU is available (torch.cuda.is_available() "
            "is False); use --device cpu or auto"
        )
    if dev.type not in ("cpu", "cuda"):
        raise EvaluationError(f"device {device!r} is not supported; use auto, cpu or cuda")
    return dev


def device_name(dev: torch.device) -> str:
    """``"cpu"``, or ``"cuda:0 (<GPU name>)"``: the ``device`` every result carries."""
    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return "cpu"


def use_flex(dev: torch.device, length: int, report: Callable[[str], None]) -> bool:
    """True when length ``length`` (tokens) is scored through FlexAttention: on CUDA from
    ``FLEX_MIN_LENGTH`` on (None: never), where FlexAttention is available (else ``report`` says why not and
    the SDPA path is used). Part of the cache key (bf16 numbers differ slightly between paths)."""
    if dev.type != "cuda" or FLEX_MIN_LENGTH is None or length < FLEX_MIN_LENGTH:
        return False

    if flex.flex_available():
        return True
    report(f"FlexAttention unavailable ({flex.unavailable_reason()}); long lengths use the SDPA path")
    return False


def memory_refusals(
    windows: dict[int, list[Window] | str],
    configs: Sequence,
    dev: torch.device,
    batch_tokens: int,
    window_tokens: Callable[[int], int] | None = None,
) -> dict[int, str]:
    """Memory before work: per length (tokens) whose forward pass on its first batch
    (``min(max(1, batch_tokens // n), windows)`` windows) is estimated to exceed the memory
    available on ``dev`` now, for the largest of ``configs`` (GPTConfig), the reason (naming
    both figures and the largest length that fits). Lengths without windows are not checked.
    ``window_tokens``: length → tokens per window where they differ (a context length's windows,
    ``Plan.read_tokens``); default the length itself."""
    out = {}
    for n, ws in windows.items():
        if isinstance(ws, list) and ws:
            t = window_tokens(n) if window_tokens is not None else n
            problem = memory_problem(list(configs), t, min(max(1, batch_tokens // t), len(ws)), dev, batch_tokens)
            if problem:
                out[n] = problem
    return out
