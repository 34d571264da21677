"""Train a GPT with one position encoding: ``python -m fireviz train``.

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

The modules: ``fireviz.train.setup`` (every check and everything built before the first step),
``fireviz.train.step`` (AdamW, one step with gradient accumulation, the validation loss),
``fireviz.train.schedule`` (learning rate, windows and seeds as functions of the step),
``fireviz.train.state`` (the checkpoint files); this one runs the loop.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import torch

from fireviz.core.distributed import Dist, all_reduce_sum, barrier, init_distributed
from fireviz.core.text import duration
from fireviz.model import GPT, GPTConfig
from fireviz.train.config import TrainConfig, TrainingError, TrainingInterrupted
from fireviz.train.schedule import derive_seed, lr_at, position_offsets, window_starts
from fireviz.train.setup import (
    EVAL_LENGTH_FACTOR,
    RunData,
    build_model,
    check_settings,
    check_step_memory,
    hold_run_folder,
    load_run_data,
    open_log,
    provenance,
    store_tokenizer,
    wrap_model,
)
from fireviz.train.state import _write_checkpoint
from fireviz.train.step import evaluate_windows, position_parameters, training_step

# kept importable from here: the optimizer the loop steps (benchmarks/train_throughput.py)


#: Longest gap between two plain progress lines (seconds) when no progress bar is drawn
PROGRESS_EVERY_S = 60.0


def train(
    model_config: GPTConfig | None,
    train_config: TrainConfig | None,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    command: str | None = None,
    progress: bool | None = None,
    stop_at_step: int | None = None,
    deadline: float | None = None,
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
      deadline: a ``time.monotonic()`` value (seconds): the first optimizer step that ends at or
        past it is the last of this invocation, with its checkpoint written, as ``stop_at_step``
        would end there (a run held to a time budget; ``resume`` continues exactly). Under
        ``torchrun`` every rank stops after the same step. None: no time limit.
    Returns: ``{"step", "tokens", "loss", "val_loss", "val_loss_4x", "out_dir"}`` — the step
      reached, the last training loss and validation losses in nats/token (None if not evaluated).
    Raises: TrainingError (settings, folder), DataError (missing/empty/too short data),
      CheckpointError (corrupt, truncated or mismatched checkpoint on resume). All checks
      happen before anything is written. During the run: TrainingError for a loss or weights
      that are no longer finite (settings that overflow), before that step's checkpoint.
    """
    from tqdm import tqdm

    out = Path(out_dir)
    d = init_distributed(train_config.device if train_config else "auto")
    try:
        return _train(model_config, train_config, out, resume, command, progress, d, tqdm, stop_at_step, deadline)
    finally:
        if d.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _train(
    model_config,
    train_config,
    out: Path,
    resume: bool,
    command,
    progress,
    d: Dist,
    tqdm,
    stop_at_step: int | None = None,
    deadline: float | None = None,
) -> dict:
    """``train`` in an initialised process group: the setup (``fireviz.train.setup``), then the loop."""
    mc, tc, state, tensors, device, micro, end_step = check_settings(
        model_config, train_config, out, resume, d, stop_at_step
    )
    eval_lengths = (mc.seq_len, EVAL_LENGTH_FACTOR * mc.seq_len)
    if device.type in ("cpu", "cuda"):  # before the data: a copy task's batches grow with batch_size (issue #38)
        check_step_memory(mc, micro, device)
    data = load_run_data(mc, tc, eval_lengths)
    if resume and state["data_fingerprint"] != data.fingerprint:
        raise TrainingError(
            f"--resume: the training data {tc.data!r} changed since the checkpoint "
            f"(fingerprint {data.fingerprint[:12]}… vs {state['data_fingerprint'][:12]}…)"
        )
    with hold_run_folder(out, resume, d):  # one run per folder
        raw_model, opt, names = build_model(mc, tc, device, out, tensors)
        del tensors
        start_step = state["step"] if resume else 0
        barrier(d)  # every rank passed its checks before rank 0 writes anything
        store_tokenizer(data, out, d)
        model, autocast = wrap_model(raw_model, tc, d, device)
        record = provenance(mc, tc, data, eval_lengths, d, raw_model, command)
        log = open_log(out, d, resume, start_step)
        run = _Run(
            raw_model, model, opt, names, mc, tc, data, eval_lengths, device, micro, autocast, d, out, record, log
        )
        run.plain_progress = d.master and progress is None and not sys.stderr.isatty()
        run.deadline = deadline
        bar = tqdm(
            total=tc.max_steps,
            initial=start_step,
            disable=(not d.master) or (None if progress is None else not progress),
            desc=f"train {mc.position_encoding}",
            unit="step",
            dynamic_ncols=True,
        )
        try:
            final = run.loop(start_step, end_step, bar)
        finally:
            bar.close()
            if log is not None:
                log.close()
        return {"step": final, "tokens": final * tc.batch_size * mc.seq_len, **run.last, "out_dir": str(out)}


@contextmanager
def _ctrl_c_requests():
    """``with _ctrl_c_requests() as interrupted:`` — a first Ctrl-C (SIGINT) only sets a flag that
    ``interrupted()`` returns, so the loop ends after a whole step with its checkpoint (issue #40:
    Ctrl-C printed a traceback and wrote nothing); a second one interrupts at once. Only in the
    main thread (elsewhere signals cannot be caught; ``interrupted()`` stays False)."""
    seen = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handler(signum, frame):
        if seen:
            raise KeyboardInterrupt
        seen.append(signum)
        with suppress(OSError):  # a closed stderr (… 2>&1 | head) must not turn this into a crash
            print(
                "\nfireviz train: Ctrl-C: stopping after this step with its checkpoint (Ctrl-C again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Run:
    """One training run's loop, validation and checkpoints (everything decided beforehand)."""

    raw: GPT  # the model itself: validated and saved
    model: torch.nn.Module  # what is stepped: ``raw`` compiled and/or DDP-wrapped
    opt: torch.optim.Optimizer
    names: list[str]  # parameter names in optimizer order (they key the saved AdamW moments)
    mc: GPTConfig
    tc: TrainConfig
    data: RunData
    eval_lengths: tuple[int, int]  # tokens
    device: torch.device
    micro: int  # windows per micro-batch on this process
    autocast: Callable
    d: Dist
    out: Path
    provenance: dict  # config.json['training']
    log: TextIO | None  # the open train log (rank 0), else None
    # plain progress lines on stderr (the first step, every validation, at least every
    # PROGRESS_EVERY_S): rank 0 when no bar is drawn because stderr is not a terminal (a run logged
    # to a file showed nothing for an hour); not with --no-progress
    plain_progress: bool = False
    #: when the last plain progress line was printed (perf_counter seconds)
    _last_line: float = 0.0
    deadline: float | None = None  # time.monotonic(): the step that ends past it is the last (``train``)
    last: dict = field(
        default_factory=lambda: dict.fromkeys(("loss", "val_loss", "val_loss_4x", "val_loss_random", "val_step"))
    )

    def __post_init__(self):
        self.tokens_per_step = self.tc.batch_size * self.mc.seq_len
        self.val_keys = ("val_loss", "val_loss_4x") + (("val_loss_random",) if self.data.val_random is not None else ())

    def loop(self, start_step: int, end_step: int, bar) -> int:
        """Steps ``start_step + 1 … end_step``: the schedule, data and RNG follow from the step alone.
        Returns the last step done (earlier than ``end_step`` when the deadline passed)."""
        tc, d = self.tc, self.d
        if start_step == 0 and tc.eval_interval > 0:
            self.validate(0, {"step": 0, "tokens": 0})
        self.model.train()
        t_start = time.perf_counter()
        with _ctrl_c_requests() as interrupted:
            final = self._steps(start_step, end_step, bar, t_start, interrupted)
        if start_step >= end_step and d.master:
            bar.write(
                f"{self.out} is already trained to step {start_step} (asked to stop at {end_step}); nothing to do"
            )
        return max(start_step, final)

    def _steps(self, start_step: int, end_step: int, bar, t_start: float, interrupted: Callable[[], bool]) -> int:
        """The optimizer steps of :meth:`loop`; after each one, a Ctrl-C seen meanwhile (on any rank)
        ends the run there with that step's checkpoint (TrainingInterrupted), and a passed
        ``deadline`` ends it there with its checkpoint (returned normally). Returns the last step done."""
        tc, d = self.tc, self.d
        done = start_step
        for step in range(start_step, end_step):
            t0 = time.perf_counter()
            lr = lr_at(step, tc)
            for g in self.opt.param_groups:
                g["lr"] = lr * g.get("lr_scale", 1.0)
            torch.manual_seed(derive_seed(tc.seed, "dropout", step, d.rank))
            loss_mean, grad_norm = training_step(
                self.model,
                self.opt,
                self.micro_batches(step),
                tc.grad_clip,
                self.device,
                self.autocast,
                ddp=d.world > 1,
                position_offsets=position_offsets(step, tc, d.rank),
                first_target=self.data.answers_from(self.mc.seq_len + 1),
            )
            loss = float(all_reduce_sum(loss_mean.reshape(1).to(d.comm_device), d) / d.world)
            if not math.isfinite(loss):
                raise TrainingError(
                    f"loss became {loss} at step {step + 1}: the weights or gradients are no longer finite; "
                    f"lower train.lr (now {tc.lr:g}) or train.weight_decay (now {tc.weight_decay:g}), or check the data"
                )
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
            validated = bool((tc.eval_interval and done % tc.eval_interval == 0) or done == tc.max_steps)
            if validated:
                self.validate(done, rec)
            else:
                self.write_log(rec)
            # a plain line at the first step, at every validation and at least every
            # PROGRESS_EVERY_S between them (issue #48: the first line came at step 250, ~19 min in)
            if self.plain_progress and (
                validated or done == start_step + 1 or time.perf_counter() - self._last_line >= PROGRESS_EVERY_S
            ):
                self.progress_line(rec, start_step, t_start)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
            late = self._past_deadline()
            saved = (tc.checkpoint_interval and done % tc.checkpoint_interval == 0) or done == end_step or late
            if saved:
                self.checkpoint(done)
            if late:
                if d.master:
                    bar.write(f"{self.out}: time budget reached after step {done}; continue with --resume")
                break
            stop = interrupted()
            if d.world > 1:  # every rank stops after the same step (a checkpoint is a collective)
                stop = bool(all_reduce_sum(torch.tensor([float(stop)], device=d.comm_device), d).item())
            if stop:
                if not saved:
                    self.checkpoint(done)
                raise TrainingInterrupted(done, self.out, checkpointed=True)
        return done

    def _past_deadline(self) -> bool:
        """Whether ``deadline`` has passed, agreed by every rank (any rank's clock past it stops all)."""
        if self.deadline is None:
            return False
        late = time.monotonic() >= self.deadline
        if self.d.world > 1:
            late = bool(all_reduce_sum(torch.tensor([float(late)], device=self.d.comm_device), self.d).item())
        return late

    def progress_line(self, rec: dict, start_step: int, t_start: float) -> None:
        """One plain progress line on stderr when no progress bar is drawn (output to a file or a
        pipe): step, training and last validation loss (nats/token), throughput, time left.
        Where stderr no longer takes it (a reader that closed the pipe: ``… 2>&1 | head``), the
        lines stop and the run goes on to its checkpoints."""
        done, total = rec["step"], self.tc.max_steps
        per_step = (time.perf_counter() - t_start) / max(1, done - start_step)
        left = per_step * (total - done)
        val = " · ".join(
            f"val {self.last[k]:.4f} @ {n}"
            for k, n in zip(("val_loss", "val_loss_4x"), self.eval_lengths, strict=True)
            if self.last.get(k) is not None
        )
        self._last_line = time.perf_counter()
        try:
            print(
                f"train {self.mc.position_encoding}: step {done:,}/{total:,} · loss {rec['loss']:.4f}"
                + (f" · {val}" if val else "")
                + f" (nats/token) · {rec['tokens_per_s'] or 0:,.0f} tokens/s · ~{duration(left)} left",
                file=sys.stderr,
                flush=True,
            )
        except OSError:  # BrokenPipeError and the like: progress is not worth the run
            self.plain_progress = False

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """This process's ``grad_accum`` micro-batches of step ``step``: int64 ``[micro, seq_len + 1]``
        windows, its contiguous slice of the global batch (``schedule.window_starts``)."""
        tc, m, length = self.tc, self.micro, self.mc.seq_len
        starts = window_starts(step, tc, self.data.stream.num_tokens, length)[self.d.rank * m * tc.grad_accum :]
        return [self.data.stream.batch(starts[i * m : (i + 1) * m], length + 1) for i in range(tc.grad_accum)]

    def validate(self, step: int, rec: dict) -> None:
        """Validation losses (and FIRE's / Kerple's position parameters) into ``rec``, then logged."""
        res = {}
        for L, key in zip(self.eval_lengths, ("val_loss", "val_loss_4x"), strict=True):
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
        """Write the checkpoint of ``step`` (rank 0). Raises: TrainingError, before writing, for
        weights that are no longer finite (the step's update overflowed; every rank checks)."""
        bad = next((n for n, p in self.raw.named_parameters() if not bool(torch.isfinite(p).all())), None)
        if bad is not None:
            raise TrainingError(
                f"the weights are no longer finite after step {step} ({bad}); nothing was written for this step: "
                f"lower train.lr (now {self.tc.lr:g}) or train.weight_decay (now {self.tc.weight_decay:g}), "
                "or check the data"
            )
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
        barrier(self.d)
