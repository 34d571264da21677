"""One optimizer step of the trainer and the losses it logs (``fireviz.train.loop`` runs them in its loop).

AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices only
(``build_optimizer``), one step with gradient accumulation and gradient-norm clipping
(Pascanu et al. 2013; ``training_step``, nanoGPT's inner loop), the validation loss
(``evaluate_windows``) and the learned position parameters logged beside it
(``position_parameters``). Losses are next-token cross-entropies in nats/token.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import torch
import torch.nn.functional as F

from fireviz.core.distributed import Dist, all_reduce_sum
from fireviz.encodings import PositionEncoding
from fireviz.model import GPT
from fireviz.train.config import TrainConfig


def _param_groups(model: GPT, tc: TrainConfig) -> tuple[list[dict], list[str]]:
    """AdamW groups: decay 2-D transformer weights; no decay for biases, LayerNorm and
    position-encoding parameters (their scale is the encoding's meaning). With
    ``tc.position_lr_multiplier != 1`` the position-encoding parameters (names under
    ``encodings.``) form a third group whose ``lr_scale`` multiplies the scheduled learning
    rate. Returns the groups and the parameter names in optimizer order."""
    split = tc.position_lr_multiplier != 1.0
    decay: list[tuple[str, torch.nn.Parameter]] = []
    no_decay: list[tuple[str, torch.nn.Parameter]] = []
    position: list[tuple[str, torch.nn.Parameter]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_position = name.startswith("encodings.")
        if split and is_position:
            position.append((name, p))
        else:
            (decay if p.dim() >= 2 and not is_position else no_decay).append((name, p))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": tc.weight_decay, "lr_scale": 1.0},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    if position:
        groups.append({"params": [p for _, p in position], "weight_decay": 0.0, "lr_scale": tc.position_lr_multiplier})
    names = [n for n, _ in decay] + [n for n, _ in no_decay] + [n for n, _ in position]
    return groups, names


def build_optimizer(model: GPT, tc: TrainConfig, device: torch.device) -> tuple[torch.optim.AdamW, list[str]]:
    """AdamW (Loshchilov & Hutter 2019) over ``model``'s parameters, betas (beta1, beta2).

    Decoupled weight decay ``tc.weight_decay`` on 2-D transformer matrices (embedding,
    attention, MLP); none on biases, LayerNorm gains and position-encoding parameters, which
    get their own group at ``lr × tc.position_lr_multiplier`` when that is not 1 (each group's
    ``lr_scale``; the caller sets ``group["lr"] = lr_at(step) × group["lr_scale"]``).
    Fused kernels on CUDA. The learning rate is set per step by the caller (``lr_at``).
    Returns: ``(optimizer, parameter names in optimizer order)`` — the names key the
    optimizer moments in ``trainer_state.safetensors``.
    """
    groups, names = _param_groups(model, tc)
    kwargs = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), **kwargs), names


def training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[torch.Tensor],
    grad_clip: float,
    device: torch.device,
    autocast=nullcontext,
    ddp: bool = False,
    position_offsets: list[int] | None = None,
    first_target: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step with gradient accumulation (nanoGPT's inner loop).

    Args:
      model: the GPT (possibly compiled and/or wrapped in DistributedDataParallel).
      micro_batches: int64 ``[micro_batch, seq_len + 1]`` windows (inputs ``[:, :-1]``,
        targets ``[:, 1:]``); each contributes 1/len of the gradient.
      grad_clip: max global L2 norm of the gradient (0: no clipping, norm still returned).
      autocast: a context factory (``nullcontext`` or bf16 ``torch.autocast``).
      ddp: ``model`` is DDP — gradients are all-reduced only on the last micro-batch.
      position_offsets: per micro-batch, the absolute position (tokens) its windows start at
        (``train.random_position_offset``); None = 0 for all.
      first_target: window position of the first target that counts (1 = all; a synthetic
        task's first answer position, ``fireviz.data.synthetic.CopyTask.split``).
    Returns: ``(mean loss, grad norm)``, float32 0-d tensors on ``device``; the loss is the
      mean next-token cross-entropy of this process's micro-batches in nats/token.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    n = len(micro_batches)
    for m, batch in enumerate(micro_batches):
        batch = batch.to(device, non_blocking=True)
        ctx = model.no_sync() if ddp and m < n - 1 else nullcontext()  # type: ignore[operator]  # DDP's
        with ctx:
            loss = _forward_loss(
                model,
                batch[:, :-1],
                batch[:, 1:],
                autocast,
                position_offsets[m] if position_offsets else 0,
                first_target,
            )
            (loss / n).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for module in model.modules():  # projected gradient descent for constrained encodings (Kerple)
        if isinstance(module, PositionEncoding):
            module.project_()
    return loss_sum / n, grad_norm


def position_parameters(model: GPT) -> dict[str, dict[str, list[float]]]:
    """The learned scalar position parameters of every layer, as the forward pass uses them.

    Returns ``{parameter: {layer: [value per head (or one value)]}}`` with layer as a string
    ("0", "1", …; one entry "0" for an encoding shared by all layers), e.g. FIRE's ``c`` and
    ``L`` (tokens) and Kerple's ``r1``, ``r2``; empty for encodings without such parameters.
    Logged in ``train_log.jsonl`` at every validation point under ``position_parameters``.
    """
    out: dict[str, dict[str, list[float]]] = {}
    for layer, enc in enumerate(model.encodings):
        for name, values in cast(PositionEncoding, enc).position_parameters().items():
            out.setdefault(name, {})[str(layer)] = [float(v) for v in values]
    return out


def _forward_loss(
    model, x: torch.Tensor, y: torch.Tensor, autocast, position_offset: int = 0, first_target: int = 1
) -> torch.Tensor:
    with autocast():
        logits = model(x, position_offset=position_offset) if position_offset else model(x)
    if first_target > 1:  # a synthetic task: only its answers are targets (the rest is random)
        y = y.clone()
        y[:, : first_target - 1] = -100  # cross_entropy's ignore_index
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate_windows(
    model: GPT,
    windows: torch.Tensor,
    micro: int,
    device: torch.device,
    autocast,
    d: Dist | None = None,
    first_target: int = 1,
) -> float:
    """Mean next-token loss in nats/token over ``windows`` int64 ``[n, length + 1]``.

    Rank r of a process group evaluates windows r, r + world, …; sums are all-reduced.
    ``micro``: windows per forward pass. ``first_target``: window position of the first
    target that counts (1 = all; a synthetic task's answers). Returns NaN when there are
    no windows at all.
    """
    d = d or Dist()
    was_training = model.training
    model.eval()
    mine = windows[d.rank :: d.world]
    total = torch.zeros(2, dtype=torch.float64)
    for i in range(0, len(mine), micro):
        w = mine[i : i + micro].to(device)
        with autocast():
            logits = model(w[:, :-1])
        y = w[:, first_target:]
        pred = logits[:, first_target - 1 :].float()
        nats = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), y.reshape(-1), reduction="sum")
        total += torch.tensor([float(nats), y.numel()], dtype=torch.float64)
    model.train(was_training)
    total = all_reduce_sum(total.to(d.comm_device), d).cpu()
    return float(total[0] / total[1])
