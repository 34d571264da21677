"""Train a byte-level GPT with one position encoding: ``python -m fireviz train``.

A training loop with no framework, in the spirit of nanoGPT's train.py (Karpathy): AdamW
(Loshchilov & Hutter 2019) with decoupled weight decay on matrices only, linear warmup then
cosine decay (Loshchilov & Hutter 2017, SGDR, without restarts), gradient-norm clipping
(Pascanu et al. 2013), gradient accumulation, bf16 autocast + TF32 on CUDA, optional
``torch.compile``, and DistributedDataParallel under ``torchrun`` (gloo on CPU, NCCL on CUDA).

Settings come from a TOML file with two tables, ``[model]`` (``GPTConfig`` fields) and
``[train]`` (``TrainConfig`` fields), overridable with ``--set section.key=value``.

Determinism, which makes ``--resume`` exact:
  * the training windows of step ``s`` are drawn from a ``torch.Generator`` seeded by
    ``(seed, s)``: ``batch_size`` window starts for the whole (global) batch, of which rank
    ``r`` takes its own contiguous slice — the data position is the step count, each rank
    sees distinct windows, and the global batch does not depend on the number of processes;
  * the global torch RNG (dropout) is re-seeded from ``(seed, s, rank)`` at every step, so
    the RNG state is a function of the step and needs no storing;
  * the learning rate is a function of the step (``lr_at``).

The output folder is a checkpoint in the Hugging Face layout (``GPT.from_pretrained`` reads
it), written only by rank 0, every file atomically (temp file in the same folder, fsync,
``os.replace``):
  * ``config.json`` — ``GPTConfig`` with ``training`` = settings, data provenance
    (source, ``data_fingerprint`` of the training split), tokens seen, versions, command;
  * ``model.safetensors`` — the weights (no ``_orig_mod.`` prefix);
  * ``trainer_state.safetensors`` — the complete resume state in one file: the weights
    (``model.*``), AdamW moments and step counts (``optim.<param>.exp_avg`` …), and, in the
    safetensors metadata, the JSON trainer state (step, tokens, settings, config hash);
  * ``trainer_state.json`` — the same JSON plus sha256 of the two safetensors files,
    written last: it marks the checkpoint complete;
  * ``train_log.jsonl`` — one line per step (appended live, truncated on resume).

No pickle anywhere: never ``torch.save``/``torch.load``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from . import __version__, synthetic
from .data import TokenStream, data_fingerprint, load_documents, split_documents
from .encodings import PositionEncoding
from .model import GPT, CheckpointError, GPTConfig, load_state_checked
from .distributed import _all_reduce_sum, _barrier, _Dist, _init_distributed
from .schedule import (
    derive_seed,
    lr_at,
    position_offsets,
    random_validation_windows,
    validation_windows,
    window_starts,
)
from .train_state import (
    _load_optimizer,
    _model_state,  # noqa: F401
    _truncate_log,
    _write_checkpoint,
    has_checkpoint,
    read_trainer_state,
)
from .train_config import (
    _FREE_ON_RESUME,
    TrainConfig,
    TrainingError,
    _check_pair,
    config_hash,
    settings_dict,
)

EVAL_LENGTH_FACTOR = 4  # validation at the training length and at 4× it


# ---------------------------------------------------------------------------------------------
# Schedule, seeds, data
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Files: atomic writes, checkpoint reading
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Distributed helpers
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
def _resolve_device(tc: TrainConfig, d: _Dist) -> torch.device:
    if tc.device == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        name = tc.device
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise TrainingError("train.device='cuda' but CUDA is not available; use device='cpu' or 'auto'")
        return torch.device("cuda", d.local_rank if d.world > 1 else (torch.device(name).index or 0))
    return torch.device("cpu")


def _param_groups(model: GPT, tc: TrainConfig) -> tuple[list[dict], list[str]]:
    """AdamW groups: decay 2-D transformer weights; no decay for biases, LayerNorm and
    position-encoding parameters (their scale is the encoding's meaning). Returns the groups
    and the parameter names in optimizer order."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and not name.startswith("encodings.") else no_decay).append((name, p))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": tc.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    names = [n for n, _ in decay] + [n for n, _ in no_decay]
    return groups, names


def build_optimizer(model: GPT, tc: TrainConfig, device: torch.device) -> tuple[torch.optim.AdamW, list[str]]:
    """AdamW (Loshchilov & Hutter 2019) over ``model``'s parameters, betas (beta1, beta2).

    Decoupled weight decay ``tc.weight_decay`` on 2-D transformer matrices (embedding,
    attention, MLP); none on biases, LayerNorm gains and position-encoding parameters.
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
        task's first answer position, ``fireviz.synthetic.CopyTask.split``).
    Returns: ``(mean loss, grad norm)``, float32 0-d tensors on ``device``; the loss is the
      mean next-token cross-entropy of this process's micro-batches in nats/token.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    n = len(micro_batches)
    for m, batch in enumerate(micro_batches):
        batch = batch.to(device, non_blocking=True)
        ctx = model.no_sync() if ddp and m < n - 1 else nullcontext()
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
        for name, values in enc.position_parameters().items():
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
    d: _Dist | None = None,
    first_target: int = 1,
) -> float:
    """Mean next-token loss in nats/token over ``windows`` int64 ``[n, length + 1]``.

    Rank r of a process group evaluates windows r, r + world, …; sums are all-reduced.
    ``micro``: windows per forward pass. ``first_target``: window position of the first
    target that counts (1 = all; a synthetic task's answers). Returns NaN when there are
    no windows at all.
    """
    d = d or _Dist()
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
    total = _all_reduce_sum(total.to(d.comm_device), d).cpu()
    return float(total[0] / total[1])


def _command_line() -> str:
    return shlex.join(sys.argv)


def train(
    model_config: GPTConfig | None,
    train_config: TrainConfig | None,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    command: str | None = None,
    progress: bool | None = None,
    stop_at_step: int | None = None,
) -> dict:
    """Train (or resume) a GPT and write its checkpoint folder ``out_dir``.

    Args:
      model_config, train_config: the run; on ``resume`` either may be None to take it from
        the checkpoint. When given on resume, every setting outside
        ``data`` (path; its content must match by fingerprint), ``device, compile,
        eval_interval, eval_batches, checkpoint_interval`` must equal the checkpoint's.
      out_dir: output folder; must not hold a checkpoint unless ``resume``.
      resume: continue from ``out_dir``'s trainer state (model, AdamW moments, step; the
        schedule, RNG and data position follow from the step).
      command: recorded in ``config.json['training']['command']``.
      progress: tqdm bar on rank 0 (None: only on a terminal).
      stop_at_step: end this invocation after optimizer step N (1 ≤ N ≤ max_steps), with a
        checkpoint written there, keeping the max_steps schedule (learning rate, data order):
        training in sessions. ``resume`` later continues exactly as if never stopped. Pick N
        a multiple of eval_interval to end on a validation point.
    Returns: ``{"step", "tokens", "loss", "val_loss", "val_loss_4x", "out_dir"}`` — the last
      training loss and validation losses in nats/token (None if not evaluated).
    Raises: TrainingError (settings, folder), DataError (missing/empty/too short data),
      CheckpointError (corrupt, truncated or mismatched checkpoint on resume). All checks
      happen before anything is written.
    """
    from tqdm import tqdm

    out = Path(out_dir)
    d = _init_distributed(train_config.device if train_config else "auto")
    try:
        return _train(model_config, train_config, out, resume, command, progress, d, tqdm, stop_at_step)
    finally:
        if d.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _resume_settings(out: Path, model_config, train_config) -> tuple[GPTConfig, TrainConfig, dict, dict]:
    """The run to continue from ``out``'s trainer state: ``(mc, tc, state, tensors)``; given
    settings must equal the saved ones outside ``_FREE_ON_RESUME``. Raises: TrainingError, CheckpointError."""
    if not has_checkpoint(out):
        raise TrainingError(f"--resume: {out} holds no checkpoint to resume")
    state, tensors = read_trainer_state(out)
    try:
        saved_mc = GPTConfig(**state["settings"]["model"])
        saved_tc = TrainConfig(**state["settings"]["train"])
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"the trainer state in {out} has unreadable settings ({e})") from e
    model_config, train_config = model_config or saved_mc, train_config or saved_tc
    if config_hash(model_config, train_config) != state["config_hash"]:
        now, then = settings_dict(model_config, train_config), state["settings"]
        diff = [
            f"{s}.{k}: checkpoint {then[s].get(k)!r} vs now {now[s][k]!r}"
            for s in ("model", "train")
            for k in now[s]
            if now[s][k] != then[s].get(k) and not (s == "train" and k in _FREE_ON_RESUME)
        ]
        raise TrainingError(
            f"--resume with settings that differ from the checkpoint in {out}: "
            + "; ".join(diff)
            + ". Resume with the original settings or train into a new folder"
        )
    return model_config, train_config, state, tensors


def _check_new_out(out: Path) -> None:
    """A fresh run never overwrites a checkpoint. Raises: TrainingError naming the way out."""
    if has_checkpoint(out):
        if not (out / "trainer_state.safetensors").exists():
            raise TrainingError(
                f"{out} holds files of a run that stopped before its first checkpoint (no "
                "trainer_state.safetensors), so it cannot be resumed either; delete the folder "
                "or choose another --out (nothing was overwritten)"
            )
        raise TrainingError(
            f"{out} already holds a checkpoint; pass --resume to continue it or choose "
            "another --out (nothing was overwritten)"
        )
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} exists and is not a folder")


@dataclass
class _RunData:
    """The training stream and the fixed validation sets of a run (a corpus or a synthetic task)."""

    stream: object  # TokenStream or synthetic.SyntheticStream: num_tokens, batch(starts, length)
    fingerprint: str
    val_fingerprint: str
    val_sets: dict  # validation length → int64 [n_val, L + 1] windows (document starts / fixed task sequences)
    val_random: torch.Tensor | None  # windows drawn like the evaluation's (text only)
    answers_from: Callable[[int], int]  # window length → first scored target (1 for text: every target counts)


def _load_run_data(mc: GPTConfig, tc: TrainConfig, eval_lengths: tuple[int, int]) -> _RunData:
    n_val = tc.eval_batches * tc.batch_size
    if synthetic.is_synthetic(tc.data):  # a task generated on the fly: fresh sequences, fixed validation
        task = synthetic.load_task(tc.data)
        # the loss counts its answers only (the rest is random); sequences already fresh: no random windows
        return _RunData(
            synthetic.SyntheticStream(task),
            task.fingerprint(),
            task.fingerprint(),
            {L: synthetic.validation_sequences(task, L + 1, n_val) for L in eval_lengths},
            None,
            task.split,
        )
    docs = load_documents(tc.data)
    train_docs, val_docs = split_documents(docs, "train"), split_documents(docs, "validation")
    # also windows drawn like the evaluation's (logged as val_loss_random): document starts read high
    # (least context), which looks like overfitting and is not
    return _RunData(
        TokenStream(train_docs, min_tokens=mc.seq_len + 1),
        data_fingerprint(train_docs),
        data_fingerprint(val_docs),
        {L: validation_windows(val_docs, L, n_val) for L in eval_lengths},
        random_validation_windows(val_docs, mc.seq_len, n_val),
        lambda length: 1,
    )


def _check_step_memory(mc: GPTConfig, micro: int, device: torch.device) -> None:
    """Memory before work: refuse a training step that cannot fit. Raises: TrainingError."""
    from .memory import InsufficientMemoryError, check_fits, train_step_bytes

    n_params = 12 * mc.n_layer * mc.d_model**2 + mc.vocab_size * mc.d_model  # before the model exists
    try:
        check_fits(
            train_step_bytes(mc, micro, mc.seq_len, n_params),
            str(device),
            f"a training step (micro-batch {micro} × seq_len {mc.seq_len})",
            "lower train.batch_size (or raise train.grad_accum) or model.seq_len",
        )
    except InsufficientMemoryError as e:
        raise TrainingError(str(e)) from None


def _settings_checked(model_config, train_config, out: Path, resume: bool, d: _Dist, stop_at_step):
    """Every check before anything is written: ``(mc, tc, state, tensors, device, micro, end_step)``."""
    state = tensors = None
    if resume:
        model_config, train_config, state, tensors = _resume_settings(out, model_config, train_config)
    else:
        if model_config is None or train_config is None:
            raise TrainingError("model_config and train_config are required unless resuming")
        _check_new_out(out)
    mc, tc = model_config, train_config.validate()
    try:
        mc.validate()
    except ValueError as e:
        raise TrainingError(f"[model] {e}") from e
    _check_pair(mc, tc)
    device = _resolve_device(tc, d)
    if device.type == "cuda":
        d.comm_device = device
    if tc.batch_size % (d.world * tc.grad_accum):
        raise TrainingError(
            f"train.batch_size={tc.batch_size} is not divisible by world_size × grad_accum = "
            f"{d.world} × {tc.grad_accum}"
        )
    if stop_at_step is not None and not (isinstance(stop_at_step, int) and 1 <= stop_at_step <= tc.max_steps):
        raise TrainingError(
            f"--stop-at-step must be an integer in 1..train.max_steps={tc.max_steps} (got {stop_at_step!r})"
        )
    micro = tc.batch_size // (d.world * tc.grad_accum)
    return mc, tc, state, tensors, device, micro, tc.max_steps if stop_at_step is None else stop_at_step


def _build_model(mc: GPTConfig, tc: TrainConfig, device: torch.device, out: Path, tensors) -> tuple:
    """The GPT (seeded init, or the trainer state's weights) and its AdamW: ``(model, opt, names)``."""
    torch.manual_seed(tc.seed)
    model = GPT(dataclasses.replace(mc, training={}))
    if tensors is not None:
        load_state_checked(
            model,
            {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")},
            source=str(out / "trainer_state.safetensors"),
        )
    model.to(device)
    opt, names = build_optimizer(model, tc, device)
    if tensors is not None:
        _load_optimizer(opt, names, tensors, str(out / "trainer_state.safetensors"))
    return model, opt, names


def _wrapped(model: GPT, tc: TrainConfig, d: _Dist, device: torch.device):
    """``(model to step: compiled and/or DDP-wrapped, autocast context factory)``."""
    use_bf16 = tc.dtype == "bfloat16" or (tc.dtype == "auto" and device.type == "cuda")
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True
    if tc.compile:
        model = torch.compile(model)
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model, autocast


def _provenance(mc: GPTConfig, tc: TrainConfig, data: _RunData, eval_lengths, d: _Dist, model: GPT, command) -> dict:
    """What config.json['training'] records about the run."""
    return {
        "settings": settings_dict(mc, tc)["train"] | {"min_lr": tc.final_lr},
        "data": tc.data,
        "data_split": "train",
        "data_fingerprint": data.fingerprint,
        "train_tokens_available": data.stream.num_tokens,
        "validation_fingerprint": data.val_fingerprint,
        "validation_lengths": list(eval_lengths),
        "validation_windows": {str(L): int(v.shape[0]) for L, v in data.val_sets.items()},
        "validation_random_windows": None if data.val_random is None else int(data.val_random.shape[0]),
        "world_size": d.world,
        "num_parameters": model.num_parameters(),
        "config_hash": config_hash(mc, tc),
        "fireviz_version": __version__,
        "torch_version": torch.__version__,
        "command": command or _command_line(),
    }


def _open_log(out: Path, d: _Dist, resume: bool, start_step: int):
    """The train log, appended to by rank 0 (a resumed one first cut back to the resumed step)."""
    log_path = out / "train_log.jsonl"
    if not d.master:
        return None
    out.mkdir(parents=True, exist_ok=True)
    for stray in out.glob(".*.tmp-*"):
        stray.unlink()  # temp files of an interrupted write (ours; never a checkpoint file)
    if resume:
        _truncate_log(log_path, start_step)
    return open(log_path, "a", encoding="utf-8")


def _train(
    model_config,
    train_config,
    out: Path,
    resume: bool,
    command,
    progress,
    d: _Dist,
    tqdm,
    stop_at_step: int | None = None,
) -> dict:
    mc, tc, state, tensors, device, micro, end_step = _settings_checked(
        model_config, train_config, out, resume, d, stop_at_step
    )
    eval_lengths = (mc.seq_len, EVAL_LENGTH_FACTOR * mc.seq_len)
    data = _load_run_data(mc, tc, eval_lengths)
    if resume and state["data_fingerprint"] != data.fingerprint:
        raise TrainingError(
            f"--resume: the training data {tc.data!r} changed since the checkpoint "
            f"(fingerprint {data.fingerprint[:12]}… vs {state['data_fingerprint'][:12]}…)"
        )
    if device.type in ("cpu", "cuda"):
        _check_step_memory(mc, micro, device)
    raw_model, opt, names = _build_model(mc, tc, device, out, tensors)
    del tensors
    start_step = state["step"] if resume else 0
    _barrier(d)  # every rank passed its checks before rank 0 writes anything
    model, autocast = _wrapped(raw_model, tc, d, device)
    provenance = _provenance(mc, tc, data, eval_lengths, d, raw_model, command)
    log = _open_log(out, d, resume, start_step)
    run = _Run(
        raw_model, model, opt, names, mc, tc, data, eval_lengths, device, micro, autocast, d, out, provenance, log
    )
    bar = tqdm(
        total=tc.max_steps,
        initial=start_step,
        disable=(not d.master) or (None if progress is None else not progress),
        desc=f"train {mc.position_encoding}",
        unit="step",
        dynamic_ncols=True,
    )
    try:
        run.loop(start_step, end_step, bar)
    finally:
        bar.close()
        if log is not None:
            log.close()
    final = max(start_step, end_step)
    return {"step": final, "tokens": final * tc.batch_size * mc.seq_len, **run.last, "out_dir": str(out)}


class _Run:
    """One training run's loop, validation and checkpoints (everything decided beforehand)."""

    def __init__(
        self,
        raw_model,
        model,
        opt,
        names,
        mc,
        tc,
        data: _RunData,
        eval_lengths,
        device,
        micro,
        autocast,
        d: _Dist,
        out: Path,
        provenance: dict,
        log,
    ):
        self.raw, self.model, self.opt, self.names, self.mc, self.tc, self.data = (
            raw_model,
            model,
            opt,
            names,
            mc,
            tc,
            data,
        )
        self.eval_lengths, self.device, self.micro, self.autocast, self.d = eval_lengths, device, micro, autocast, d
        self.out, self.provenance, self.log = out, provenance, log
        self.tokens_per_step = tc.batch_size * mc.seq_len
        self.last = {"loss": None, "val_loss": None, "val_loss_4x": None, "val_loss_random": None, "val_step": None}
        self.val_keys = ("val_loss", "val_loss_4x") + (("val_loss_random",) if data.val_random is not None else ())

    def loop(self, start_step: int, end_step: int, bar) -> None:
        """Steps ``start_step + 1 … end_step``: the schedule, data and RNG follow from the step alone."""
        tc, mc, d, micro = self.tc, self.mc, self.d, self.micro
        if start_step == 0 and tc.eval_interval > 0:
            self.validate(0, {"step": 0, "tokens": 0})
        self.model.train()
        for step in range(start_step, end_step):
            t0 = time.perf_counter()
            lr = lr_at(step, tc)
            for g in self.opt.param_groups:
                g["lr"] = lr
            torch.manual_seed(derive_seed(tc.seed, "dropout", step, d.rank))
            starts = window_starts(step, tc, self.data.stream.num_tokens, mc.seq_len)[d.rank * micro * tc.grad_accum :]
            micro_batches = [
                self.data.stream.batch(starts[m * micro : (m + 1) * micro], mc.seq_len + 1)
                for m in range(tc.grad_accum)
            ]
            loss_mean, grad_norm = training_step(
                self.model,
                self.opt,
                micro_batches,
                tc.grad_clip,
                self.device,
                self.autocast,
                ddp=d.world > 1,
                position_offsets=position_offsets(step, tc, d.rank),
                first_target=self.data.answers_from(mc.seq_len + 1),
            )
            loss = float(_all_reduce_sum(loss_mean.reshape(1).to(d.comm_device), d) / d.world)
            if not math.isfinite(loss):
                raise TrainingError(f"loss became {loss} at step {step + 1}; lower train.lr or check the data")
            done, dt = step + 1, time.perf_counter() - t0
            rec = {
                "step": done,
                "tokens": done * self.tokens_per_step,
                "loss": loss,
                "lr": lr,
                "grad_norm": float(grad_norm),
                "tokens_per_s": self.tokens_per_step / dt if dt > 0 else None,
            }
            self.last["loss"] = loss
            if (tc.eval_interval and done % tc.eval_interval == 0) or done == tc.max_steps:
                self.validate(done, rec)
            else:
                self.write_log(rec)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
            if (tc.checkpoint_interval and done % tc.checkpoint_interval == 0) or done == end_step:
                self.checkpoint(done)
        if start_step >= end_step and d.master:
            bar.write(
                f"{self.out} is already trained to step {start_step} (asked to stop at {end_step}); nothing to do"
            )

    def validate(self, step: int, rec: dict) -> None:
        """Validation losses (and FIRE's / Kerple's position parameters) into ``rec``, then logged."""
        res = {}
        for L, key in zip(self.eval_lengths, ("val_loss", "val_loss_4x")):
            eval_micro = max(1, self.micro * self.mc.seq_len // L)
            res[key] = evaluate_windows(
                self.raw,
                self.data.val_sets[L],
                eval_micro,
                self.device,
                self.autocast,
                self.d,
                first_target=self.data.answers_from(L + 1),
            )
        if self.data.val_random is not None:
            res["val_loss_random"] = evaluate_windows(
                self.raw, self.data.val_random, self.micro, self.device, self.autocast, self.d
            )
        self.last.update(res, val_step=step)
        params = position_parameters(self.raw)
        self.write_log(
            {**rec, **{k: self.last[k] for k in self.val_keys}, **({"position_parameters": params} if params else {})}
        )

    def write_log(self, rec: dict) -> None:
        if self.log is not None:
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()

    def checkpoint(self, step: int) -> None:
        if self.d.master:
            _write_checkpoint(
                self.out,
                self.raw,
                self.opt,
                self.names,
                self.mc,
                self.tc,
                self.provenance,
                step,
                step * self.tokens_per_step,
                self.data.fingerprint,
                self.log,
            )
        _barrier(self.d)
