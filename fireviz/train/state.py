"""A training run's files: the checkpoint folder written at every checkpoint, read on resume.

``_write_checkpoint`` writes, every file atomically: ``trainer_state.safetensors`` (the complete
resume state: weights ``model.*``, AdamW moments ``optim.*`` and, in its metadata, the JSON
trainer state), ``model.safetensors``, ``config.json`` (with the run's provenance), and
``trainer_state.json`` last (with the sha256 of both safetensors files: it marks the
checkpoint complete). ``read_trainer_state`` checks all of that before a resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from fireviz import __version__
from fireviz.core import (
    FileFormatError,
    atomic_write,
    atomic_write_text,
    parse_json,
    read_json,
    read_safetensors,
    sha256_files,
    sort_safetensors_metadata,
)
from fireviz.model import ENCODING_METADATA_KEY, GPT, CheckpointError, GPTConfig, encoding_record
from fireviz.train.config import TrainConfig, config_hash, settings_dict

STATE_FORMAT = "fireviz-trainer-state/1"


CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "trainer_state.safetensors",
    "trainer_state.json",
    "train_log.jsonl",
)


def has_checkpoint(out_dir: str | os.PathLike) -> bool:
    """Whether ``out_dir`` holds any checkpoint file (config, weights, trainer state, log)."""
    return any((Path(out_dir) / n).exists() for n in CHECKPOINT_FILES)


def _save_sorted(tensors: dict[str, torch.Tensor], path, metadata: dict[str, str]) -> None:
    """``safetensors.torch.save_file`` with the metadata keys in sorted order: the same state writes
    the same bytes (``fireviz.core.sort_safetensors_metadata``)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    sort_safetensors_metadata(path)


def _model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Float CPU copy of the weights, tied ``lm_head.weight`` dropped, ``_orig_mod.`` stripped."""
    state = {}
    for k, v in model.state_dict().items():
        k = k.replace("_orig_mod.", "").removeprefix("module.")
        if k == "lm_head.weight":
            continue  # tied to wte.weight; load_state_checked restores the alias
        state[k] = v.detach().to("cpu", copy=True).contiguous()
    return state


def read_trainer_state(out_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and verify the resume state of a checkpoint folder.

    Returns ``(state_json, tensors)``: the trainer state (step, tokens, settings,
    config_hash, …) and the tensors of ``trainer_state.safetensors`` (``model.*``,
    ``optim.*``), float32 on CPU.
    Raises: CheckpointError if a file is missing, corrupt or truncated, or the files of one
    checkpoint disagree (sha256 mismatch). Nothing is modified.
    """
    from safetensors import SafetensorError

    out = Path(out_dir)
    st_path, js_path = out / "trainer_state.safetensors", out / "trainer_state.json"
    if not st_path.exists():
        raise CheckpointError(
            f"{out} has no trainer_state.safetensors: the run stopped before its first "
            "checkpoint, so there is nothing to resume; delete the folder or use another --out"
        )
    try:
        tensors, meta = read_safetensors(st_path)
        state = parse_json(meta["fireviz_trainer_state"], f"the trainer state in {st_path}", allow_nonfinite=True)
        if not isinstance(state, dict):
            raise ValueError("the trainer state is not a JSON object")
    except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{st_path} is corrupt or truncated ({e}); the folder was left untouched") from e
    if state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{st_path} has format {state.get('format')!r}, expected {STATE_FORMAT!r}")
    summary, summary_step = {}, -1  # no trainer_state.json: the first checkpoint write was interrupted
    if js_path.exists():
        try:
            summary = read_json(js_path, expect=dict, allow_nonfinite=True)
            summary_step = int(summary["step"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{js_path} is corrupt or truncated ({e}); the folder was left untouched") from e
    if summary_step == state["step"]:
        # Same checkpoint: the recorded hashes must match (detects damage after writing).
        for name in ("trainer_state.safetensors", "model.safetensors"):
            want = summary.get("sha256", {}).get(name)
            path = out / name
            if want is None or not path.exists() or sha256_files(path) != want:
                raise CheckpointError(
                    f"{path} does not match the sha256 recorded in trainer_state.json "
                    "(corrupt, truncated or replaced); the folder was left untouched"
                )
    elif summary_step > state["step"]:
        raise CheckpointError(
            f"trainer_state.json is at step {summary_step} but trainer_state.safetensors at "
            f"step {state['step']}: the checkpoint files are inconsistent"
        )
    # summary_step < state step (or no summary): a checkpoint write was interrupted after its first file;
    # trainer_state.safetensors alone is complete and newer, so resume from it.
    return state, tensors


def _optimizer_tensors(opt: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for name, p in zip(names, params, strict=True):
        st = opt.state.get(p, {})
        for key, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(float(value))
            out[f"optim.{name}.{key}"] = t.detach().to("cpu", torch.float32, copy=True).contiguous().reshape(t.shape)
    return out


def _load_optimizer(
    opt: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor], source: str
) -> None:
    params = [p for g in opt.param_groups for p in g["params"]]
    sd = opt.state_dict()
    state = {}
    for i, (name, p) in enumerate(zip(names, params, strict=True)):
        keys = {
            k[len(f"optim.{name}.") :]: v
            for k, v in tensors.items()
            if k.startswith(f"optim.{name}.") and "." not in k[len(f"optim.{name}.") :]
        }
        if not keys:
            continue
        for k in ("exp_avg", "exp_avg_sq"):
            if k in keys and keys[k].shape != p.shape:
                raise CheckpointError(
                    f"{source}: optimizer moment {name}.{k} has shape {tuple(keys[k].shape)}, "
                    f"the model {tuple(p.shape)}"
                )
        st = {}
        for k, v in keys.items():
            st[k] = v.to(torch.float32) if k == "step" else v.to(p.device, p.dtype)
        state[i] = st
    known = {f"optim.{n}." for n in names}
    stray = [k for k in tensors if k.startswith("optim.") and not any(k.startswith(p) for p in known)]
    if stray:
        raise CheckpointError(f"{source}: optimizer state for unknown parameters {stray[:5]}")
    sd["state"] = state
    opt.load_state_dict(sd)


#: Largest train log a resumed run reads back (bytes): the bound ``read_train_log`` keeps too; a
#: 3,700-step run's log is ~0.7 MB
MAX_RESUMED_LOG_BYTES = 256 << 20


def _truncate_log(path: Path, step: int) -> None:
    """Keep the log lines with ``step`` ≤ the resumed step (a torn last line is dropped)."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size > MAX_RESUMED_LOG_BYTES:  # read whole below: bounded first (issue #50)
        raise CheckpointError(
            f"{path} is {size:,} bytes, more than the {MAX_RESUMED_LOG_BYTES:,} a training log holds (~8 records a "
            "step); it is not this run's log — move it away and resume again"
        )
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, f"{path}:{i + 1}", allow_nonfinite=True)
        except FileFormatError as e:
            if i == len(lines) - 1:
                continue  # torn by a kill mid-append
            raise CheckpointError(f"{e}; the log is corrupt") from e
        step_of = rec.get("step", 0) if isinstance(rec, dict) else None
        if not isinstance(step_of, (int, float)) or isinstance(step_of, bool):
            raise CheckpointError(f"{path}:{i + 1} is not a train-log record with a numeric step; the log is corrupt")
        if step_of <= step:
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _write_checkpoint(
    out: Path,
    model: GPT,
    opt,
    names,
    mc: GPTConfig,
    tc: TrainConfig,
    provenance: dict,
    step: int,
    tokens: int,
    fingerprint: str,
    log,
) -> None:
    """Write one checkpoint: trainer_state.safetensors (complete resume state) first, then
    model.safetensors, config.json, and trainer_state.json (with sha256 of both) last."""

    if log is not None:
        log.flush()
        os.fsync(log.fileno())
    weights = _model_state(model)
    state = {
        "format": STATE_FORMAT,
        "step": step,
        "tokens": tokens,
        "data_fingerprint": fingerprint,
        "data_position": {"step": step, "rule": "window starts of step s drawn from seed (seed, 'data', s)"},
        "scheduler": {
            "kind": "linear_warmup_cosine",
            "lr": tc.lr,
            "min_lr": tc.final_lr,
            "warmup_steps": tc.warmup_steps,
            "max_steps": tc.max_steps,
            "next_step": step,
        },
        "rng": "torch.manual_seed(derive_seed(seed, 'dropout', step, rank)) at every step",
        "settings": settings_dict(mc, tc),
        "config_hash": config_hash(mc, tc),
        "fireviz_version": __version__,
    }
    tensors = {f"model.{k}": v for k, v in weights.items()} | _optimizer_tensors(opt, names)
    meta = {"format": "pt", "fireviz_trainer_state": json.dumps(state)}
    atomic_write(out / "trainer_state.safetensors", lambda p: _save_sorted(tensors, p, meta))
    # the encoding is recorded beside the weights: a config.json relabelled to another encoding of the
    # same tensor names (kerple_log / kerple_power, alibi / nope) is refused on load (issue #50)
    weights_meta = {"format": "pt", ENCODING_METADATA_KEY: encoding_record(mc)}
    atomic_write(out / "model.safetensors", lambda p: _save_sorted(weights, p, weights_meta))
    config = dataclasses.replace(mc, training=provenance | {"steps": step, "tokens_seen": tokens})
    # every encoding option named (config_format 2): a deleted option is an error on load, not a default
    atomic_write_text(out / "config.json", json.dumps(config.to_json_dict(), indent=2, sort_keys=True) + "\n")
    summary = state | {"sha256": {n: sha256_files(out / n) for n in ("trainer_state.safetensors", "model.safetensors")}}
    atomic_write_text(out / "trainer_state.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
