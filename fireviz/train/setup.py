"""Everything a training run decides before its first step (``fireviz.train.loop`` runs the loop).

The checks come first and write nothing (``check_settings``: the settings, the output folder,
the resumed trainer state, the device, the batch split over processes), then the data
(``load_run_data``: the training stream and the fixed validation sets, of a corpus or a
synthetic task), the step's memory (``check_step_memory``), the model and its AdamW, from a
seeded init or the trainer state (``build_model``), its compiled / DDP / autocast wrapping
(``wrap_model``), what config.json records about the run (``provenance``) and the train log
(``open_log``).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import torch

from fireviz import __version__
from fireviz.core import FileFormatError, read_json
from fireviz.core.distributed import Dist, all_reduce_sum
from fireviz.data import DataError, TokenStream, data_fingerprint, load_documents, split_documents, synthetic
from fireviz.data.prepare import copy_tokenizer
from fireviz.data.shards import ShardStream, TokenShards, is_shard_folder
from fireviz.model import (
    GPT,
    CheckpointError,
    GPTConfig,
    InsufficientMemoryError,
    check_fits,
    config_from_dict,
    load_state_checked,
    train_step_bytes,
)
from fireviz.train.config import _FREE_ON_RESUME, TrainConfig, TrainingError, _check_pair, config_hash, settings_dict
from fireviz.train.schedule import random_validation_windows, validation_windows
from fireviz.train.state import _load_optimizer, _truncate_log, has_checkpoint, read_trainer_state
from fireviz.train.step import build_optimizer

EVAL_LENGTH_FACTOR = 4  # validation at the training length and at 4× it


def _resolve_device(tc: TrainConfig, d: Dist) -> torch.device:
    """The device ``train.device`` names (``auto``: CUDA if available; this process's GPU under
    torchrun). Raises: TrainingError for CUDA asked for but not available, or a GPU index past
    the ones there are."""
    if tc.device == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        name = tc.device
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise TrainingError("train.device='cuda' but CUDA is not available; use device='cpu' or 'auto'")
        index = d.local_rank if d.world > 1 else (torch.device(name).index or 0)
        if index >= torch.cuda.device_count():
            raise TrainingError(
                f"train.device={name!r}: this machine has {torch.cuda.device_count()} GPU(s), numbered from 0; "
                "use device='cuda' or a smaller index"
            )
        return torch.device("cuda", index)
    return torch.device("cpu")


def _command_line() -> str:
    """This process's command line, shell-quoted (recorded in config.json)."""
    return shlex.join(sys.argv)


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
    _check_config_file_unchanged(out, saved_mc, saved_tc)
    return model_config, train_config, state, tensors


def _config_file_differences(out: Path, saved_mc: GPTConfig, saved_tc: TrainConfig) -> list[str]:
    """``field: run value vs config.json value`` for every model field (encoding options completed
    on both sides) and training setting that ``out/config.json`` holds differently from the run's
    trainer state. Raises: CheckpointError for a config.json that does not read."""
    try:
        raw = read_json(out / "config.json", expect=dict)
        file_mc = config_from_dict(raw, str(out / "config.json"))
    except (FileFormatError, ValueError, TypeError) as e:
        raise CheckpointError(f"--resume: {out / 'config.json'} does not read ({e}); restore it") from e
    diff = []
    for f in dataclasses.fields(GPTConfig):
        if f.name in ("training", "config_format"):  # provenance and the file's format version
            continue
        run_v, file_v = getattr(saved_mc, f.name), getattr(file_mc, f.name)
        if f.name == "encoding_options":
            run_v, file_v = saved_mc.complete_encoding_options(), file_mc.complete_encoding_options()
        if run_v != file_v:
            diff.append(f"{f.name}: run {run_v!r} vs config.json {file_v!r}")
    recorded = (raw.get("training") or {}).get("settings")
    if isinstance(recorded, dict):
        run_tc = dataclasses.asdict(saved_tc)
        diff += [
            f"train.{k}: run {run_tc[k]!r} vs config.json {recorded[k]!r}"
            for k in run_tc
            # None: derived at the start (min_lr from lr), recorded resolved in config.json
            if k in recorded and run_tc[k] is not None and recorded[k] != run_tc[k] and k not in _FREE_ON_RESUME
        ]
    return diff


def _check_config_file_unchanged(out: Path, saved_mc: GPTConfig, saved_tc: TrainConfig) -> None:
    """A config.json edited since the checkpoint would be ignored by --resume and then overwritten
    (issue #38): refused, naming each field. Raises: TrainingError, CheckpointError."""
    if diff := _config_file_differences(out, saved_mc, saved_tc):
        raise TrainingError(
            f"--resume: {out / 'config.json'} was edited since its checkpoint ({'; '.join(diff[:8])}); "
            "--resume continues the run as it was saved and would overwrite the edit: restore config.json, "
            "or train the edited settings into a new folder with --set (nothing was changed)"
        )


@contextmanager
def hold_run_folder(out: Path, resume: bool, d: Dist) -> Iterator[None]:
    """``with hold_run_folder(out, resume, d):`` make ``out`` and hold it for the run inside: an
    exclusive ``flock`` on the folder itself (no file added; released when the block ends, and by
    the kernel when the process ends, so a killed run never leaves it stuck). Rank 0 holds it;
    every rank learns whether it could (one all-reduce). A new run checks the folder again once
    held (another run may have written a checkpoint meanwhile).
    Raises: TrainingError when another process holds it (issue #38: two runs into one --out
      interleaved their logs and the second replaced the first)."""
    import fcntl
    import os

    fd, ok = None, 1
    if d.master:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            fd, ok = None, 0
    try:
        ok_all = int(all_reduce_sum(torch.tensor([ok], device=d.comm_device), d).item()) == d.world
        if not ok_all:
            raise TrainingError(
                f"another fireviz train is writing into {out}; wait for it to end (or stop it), or choose "
                "another --out (nothing was changed)"
            )
        if not resume and d.master:
            _check_new_out(out, held=True)  # what another run may have written before we held the folder
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _held_by_another_run(out: Path) -> bool:
    """Whether another process holds ``out`` (:func:`hold_run_folder`'s lock); False if it cannot
    be told (no such folder, not readable). Only for a process that does not hold it itself."""
    import fcntl
    import os

    try:
        fd = os.open(out, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _check_new_out(out: Path, held: bool = False) -> None:
    """A fresh run never overwrites a checkpoint (``held``: this process holds the folder).
    Raises: TrainingError naming the way out."""
    if has_checkpoint(out):
        if not held and _held_by_another_run(out):  # a live run before its first checkpoint: never "delete it"
            raise TrainingError(
                f"another fireviz train is writing into {out}; wait for it to end (or stop it), or choose "
                "another --out (nothing was changed)"
            )
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
class RunData:
    """The training stream and the fixed validation sets of a run (a corpus or a synthetic task)."""

    stream: TokenStream | ShardStream | synthetic.SyntheticStream  # num_tokens, batch(starts, length)
    fingerprint: str
    val_fingerprint: str
    val_sets: dict  # validation length → int64 [n_val, L + 1] windows (document starts / fixed task sequences)
    val_random: torch.Tensor | None  # windows drawn like the evaluation's (text only)
    answers_from: Callable[[int], int]  # window length → first scored target (1 for text: every target counts)
    shards: TokenShards | None = None  # the token shards read (train.data a prepared folder)


def load_run_data(mc: GPTConfig, tc: TrainConfig, eval_lengths: tuple[int, int]) -> RunData:
    """The run's data: ``train.data``'s training split as a token stream and
    ``eval_batches × batch_size`` validation windows per length in ``eval_lengths`` (tokens), or a
    synthetic task's fresh sequences and fixed validation sequences. Raises: DataError."""
    n_val = tc.eval_batches * tc.batch_size
    if synthetic.is_synthetic(tc.data):  # a task generated on the fly: fresh sequences, fixed validation
        task = synthetic.load_task(tc.data)
        # the loss counts its answers only (the rest is random); sequences already fresh: no random windows
        return RunData(
            synthetic.SyntheticStream(task),
            task.fingerprint(),
            task.fingerprint(),
            {L: synthetic.validation_sequences(task, L + 1, n_val) for L in eval_lengths},
            None,
            task.split,
        )
    if is_shard_folder(tc.data):
        return _shard_run_data(mc, tc, eval_lengths, n_val)
    docs = load_documents(tc.data)
    train_docs, val_docs = split_documents(docs, "train"), split_documents(docs, "validation")
    # also windows drawn like the evaluation's (logged as val_loss_random): document starts read high
    # (least context), which looks like overfitting and is not
    return RunData(
        TokenStream(train_docs, min_tokens=mc.seq_len + 1),
        data_fingerprint(train_docs),
        data_fingerprint(val_docs),
        {L: validation_windows(val_docs, L, n_val) for L in eval_lengths},
        random_validation_windows(val_docs, mc.seq_len, n_val),
        lambda length: 1,
    )


def _shard_run_data(mc: GPTConfig, tc: TrainConfig, eval_lengths: tuple[int, int], n_val: int) -> RunData:
    """A prepared shard folder's training stream (memory-mapped, in id order) and validation sets
    (from its validation shards, as from a corpus's documents). Raises: DataError, TrainingError
    for a vocabulary smaller than the tokenizer's ids."""
    shards = TokenShards(tc.data)
    if shards.num_ids > mc.vocab_size:
        raise TrainingError(
            f"train.data {tc.data} holds tokens of {shards.tokenizer['name']} (ids 0..{shards.num_ids - 1}) but "
            f"model.vocab_size is {mc.vocab_size}; set --set model.vocab_size={shards.num_ids}"
        )
    if not shards.manifest["splits"]["validation"]["documents"]:
        raise DataError(
            f"the validation split of {tc.data} is empty (none of its documents' ids fell there); prepare more "
            "documents (the split puts ~10% of ids in validation)"
        )
    val_docs = shards.documents("validation")
    fingerprints = shards.verified_fingerprints()  # computed from the documents, each checked (issue #50)
    return RunData(
        shards.stream("train", min_tokens=mc.seq_len + 1),
        fingerprints["train"],
        fingerprints["validation"],
        {L: validation_windows(val_docs, L, n_val) for L in eval_lengths},
        random_validation_windows(val_docs, mc.seq_len, n_val),
        lambda length: 1,
        shards,
    )


def store_tokenizer(data: RunData, out: Path, d: Dist) -> None:
    """A checkpoint stores its tokenizer: a shard folder's Hugging Face tokenizer files are copied
    beside config.json (rank 0; the byte tokenizer has none)."""
    if d.master and data.shards is not None:
        copy_tokenizer(data.shards.path, out)


def check_step_memory(mc: GPTConfig, micro: int, device: torch.device) -> None:
    """Memory before work: refuse a training step that cannot fit. Raises: TrainingError."""

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


def check_settings(model_config, train_config, out: Path, resume: bool, d: Dist, stop_at_step):
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


def build_model(mc: GPTConfig, tc: TrainConfig, device: torch.device, out: Path, tensors) -> tuple:
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


def wrap_model(model: GPT, tc: TrainConfig, d: Dist, device: torch.device):
    """``(model to step: compiled and/or DDP-wrapped, autocast context factory)``."""
    use_bf16 = tc.dtype == "bfloat16" or (tc.dtype == "auto" and device.type == "cuda")
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True
    stepped: Any = model
    if tc.compile:
        stepped = torch.compile(stepped)
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        stepped = DDP(stepped, device_ids=[device.index] if device.type == "cuda" else None)
    return stepped, autocast


def provenance(mc: GPTConfig, tc: TrainConfig, data: RunData, eval_lengths, d: Dist, model: GPT, command) -> dict:
    """What config.json['training'] records about the run."""
    return {
        "settings": settings_dict(mc, tc)["train"] | {"min_lr": tc.final_lr},
        "data": tc.data,
        "data_split": "train",
        "data_fingerprint": data.fingerprint,
        "tokenizer": data.shards.tokenizer if data.shards is not None else {"name": "byte", "key": "byte"},
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


def open_log(out: Path, d: Dist, resume: bool, start_step: int) -> TextIO | None:
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
