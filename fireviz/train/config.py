"""Training settings: the ``[model]`` and ``[train]`` tables of a TOML file, ``--set`` overrides.

``TrainConfig`` (the ``[train]`` table, frozen: a changed setting is a new one made with
``dataclasses.replace``; ``[model]`` is ``fireviz.model.gpt.GPTConfig``) with ``validate``;
``load_config(path, overrides)`` reads a TOML file, applies ``--set section.key=value``
overrides and refuses an unknown key with the list of known ones;
``settings_dict``/``config_hash`` are a run's identity (a resume must match it outside the
settings that do not change the numbers).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import tomllib

from fireviz.model import GPTConfig

#: largest train.random_position_offset (tokens)
MAX_POSITION_OFFSET = 1 << 30
#: largest value of any integer setting, train.seed included: int64's maximum (what torch's
#: generators and every file fireviz writes hold)
MAX_INT_SETTING = (1 << 63) - 1
#: largest train.lr: AdamW moves each weight by about lr per step (weights start near 0.02),
#: so a larger one only destroys the model, or overflows the float32 update
MAX_LR = 1.0
#: Training settings that do not change the trained numbers; they may differ on --resume.
#: (``data`` may move: its content is checked by fingerprint instead.)
_FREE_ON_RESUME = frozenset({"data", "device", "compile", "eval_interval", "checkpoint_interval", "eval_batches"})
#: GPTConfig fields a config file may not set (written by the trainer itself).
_MODEL_RESERVED = frozenset({"training", "config_format"})


class TrainingInterrupted(RuntimeError):
    """Ctrl-C (SIGINT) during ``train``: the run stopped after a whole step, ``step``, with its
    checkpoint written (``checkpointed``; False for an interrupt before the first step of this
    invocation), so ``--resume`` continues exactly."""

    def __init__(self, step: int, out, checkpointed: bool):
        self.step, self.out, self.checkpointed = step, out, checkpointed
        where = f"checkpoint of step {step} written to {out}" if checkpointed else f"nothing new written to {out}"
        super().__init__(
            f"interrupted after step {step}: {where}; continue with: python -m fireviz train --out {out} --resume"
        )


class TrainingError(ValueError):
    """A training request that cannot run: a bad setting, an unknown key, an occupied or
    missing output folder, a resume that disagrees with its checkpoint."""


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainConfig:
    """The ``[train]`` table: how a model is trained (saved in ``config.json['training']``).

    Frozen: ``dataclasses.replace(tc, lr=…)`` makes a changed copy (validate it again).

    Attributes:
      data: ``"prose" | "latex" | "code"`` (bundled) or a path accepted by
        ``fireviz.data.corpus.load_documents``; training uses its ``train`` split.
      batch_size: sequences per optimizer step, summed over all processes and
        accumulation micro-steps (so tokens/step = batch_size × seq_len whatever the
        number of GPUs). Must be divisible by world_size × grad_accum.
      grad_accum: micro-steps per optimizer step on each process.
      max_steps: optimizer steps in the whole run (the cosine reaches min_lr here).
      lr, min_lr: peak and final learning rate, lr in (0, ``MAX_LR``]; ``min_lr`` in [0, lr],
        None → lr / 10.
      warmup_steps: steps of linear warmup from 0 to lr.
      weight_decay: AdamW decoupled decay on 2-D transformer weights only (not on
        biases, LayerNorm or position-encoding parameters); >= 0 with lr × weight_decay <= 1
        (each step multiplies those weights by 1 − lr·weight_decay).
      beta1, beta2: AdamW moment coefficients (0.9, 0.95 as in GPT-3 / nanoGPT).
      grad_clip: max global L2 norm of the gradient (finite); 0 disables clipping.
      seed: seeds initialization, data windows and dropout; in [0, 2**63 − 1].
      eval_interval: validate every N steps (and at steps 0 and max_steps); 0 → only at
        the end.
      eval_batches: validation windows per length = eval_batches × batch_size.
      checkpoint_interval: checkpoint every N steps (and at max_steps); 0 → only at the end.
      device: ``"auto"`` (cuda if available, else cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
      dtype: ``"auto"`` (bfloat16 autocast on CUDA, float32 on CPU), ``"float32"``,
        ``"bfloat16"`` (autocast; weights and optimizer stay float32).
      compile: wrap the model in ``torch.compile`` (CUDA recommended).
      random_position_offset: largest absolute starting position in tokens (0 = off, the
        default): each micro-batch's windows are placed at an offset drawn uniformly from
        [0, random_position_offset] (``position_offsets``; generator seeded by seed, step,
        rank and micro-batch), so FIRE's normalizer ψ(max(L, i)) sees the query positions of
        long evaluations while windows stay seq_len long (in the spirit of randomized
        positions, Ruoss et al. 2023, which sample sorted positions with gaps; with FIRE: Zhou
        et al. 2024). Only FIRE / FIRE-S change with it: a contiguous shift leaves every bias
        of i − j (T5, ALiBi, Kerple, Sandwich) and RoPE's q·k (a function of i − j) as they
        were, up to rounding. All windows of one micro-batch
        share the offset (one bias per attention call); with grad_accum > 1 a step draws
        several. Needs a relative encoding (no absolute position embedding).
      position_lr_multiplier: the position encoding's own parameters (every parameter under
        ``encodings.``: FIRE's c, L and f_θ, T5's bucket table, ALiBi/Kerple/Sandwich scalars)
        train in their own AdamW group at ``position_lr_multiplier × lr`` (following the same
        warmup and cosine), never weight-decayed. 1.0 (the default) keeps one no-decay group as
        before. Adam moves a scalar by about its learning rate per step, so with the tiny recipe
        (Σ lr ≈ 2.0 over 3,700 steps) FIRE's L multiplier cannot move more than ~2 from its init
        and T5's logits no more than ~±2; a multiplier of 10 lifts that to ~20. In
        (0, ``MAX_LR`` / lr].
    Every number must be finite (TOML's nan and inf are refused) and every integer at most
    ``MAX_INT_SETTING``.
    """

    data: str = "prose"
    batch_size: int = 16
    grad_accum: int = 1
    max_steps: int = 1000
    lr: float = 1e-3
    min_lr: float | None = None
    warmup_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    eval_interval: int = 250
    eval_batches: int = 4
    checkpoint_interval: int = 500
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    random_position_offset: int = 0
    position_lr_multiplier: float = 1.0

    def validate(self) -> "TrainConfig":
        """Check every field; returns self. Raises TrainingError naming the field and the fix."""
        _check_types(self, "train")
        _check_numbers(self, "train")
        for name in ("batch_size", "grad_accum", "max_steps"):
            if getattr(self, name) < 1:
                raise TrainingError(f"train.{name} must be >= 1 (got {getattr(self, name)})")
        if self.random_position_offset > MAX_POSITION_OFFSET:
            raise TrainingError(
                f"train.random_position_offset must be at most {MAX_POSITION_OFFSET} tokens (got "
                f"{self.random_position_offset})"
            )
        for name in (
            "warmup_steps",
            "eval_interval",
            "checkpoint_interval",
            "weight_decay",
            "grad_clip",
            "seed",
            "random_position_offset",
        ):
            if getattr(self, name) < 0:
                raise TrainingError(f"train.{name} must be >= 0 (got {getattr(self, name)})")
        if self.eval_batches < 1:
            raise TrainingError(f"train.eval_batches must be >= 1 (got {self.eval_batches})")
        if not 0 < self.lr <= MAX_LR:
            raise TrainingError(
                f"train.lr must be > 0 and at most {MAX_LR} (got {self.lr}); AdamW moves each weight by "
                "about lr per step (e.g. --set train.lr=1e-3)"
            )
        if not 0 < self.position_lr_multiplier * self.lr <= MAX_LR:
            raise TrainingError(
                f"train.position_lr_multiplier must be > 0 with position_lr_multiplier × lr at most {MAX_LR} "
                f"(got {self.position_lr_multiplier} × {self.lr}); e.g. --set train.position_lr_multiplier=10"
            )
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise TrainingError(f"train.min_lr must lie in [0, lr={self.lr}] (got {self.min_lr})")
        if self.lr * self.weight_decay > 1:
            raise TrainingError(
                f"train.weight_decay × train.lr must be at most 1 (got {self.weight_decay} × {self.lr}): each "
                "step multiplies the decayed weights by 1 − lr·weight_decay; lower train.weight_decay (e.g. 0.1)"
            )
        if self.warmup_steps > self.max_steps:
            raise TrainingError(
                f"train.warmup_steps={self.warmup_steps} exceeds max_steps={self.max_steps}; "
                f"also pass --set train.warmup_steps=N with N <= {self.max_steps}"
            )
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise TrainingError(f"train.{name} must lie in [0, 1) (got {getattr(self, name)})")
        if self.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:[0-9]{1,4}", self.device):
            raise TrainingError(f"train.device must be auto, cpu, cuda or cuda:N (got {self.device!r})")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise TrainingError(f"train.dtype must be auto, float32 or bfloat16 (got {self.dtype!r})")
        if not self.data:
            raise TrainingError("train.data is empty; give a bundled corpus name or a path")
        return self

    @property
    def final_lr(self) -> float:
        """Learning rate at the end of the cosine schedule: ``min_lr``, or ``lr / 10`` when unset."""
        return self.lr / 10 if self.min_lr is None else float(self.min_lr)


def _check_types(obj, section: str) -> None:
    """Raise TrainingError if a dataclass field holds a value of the wrong TOML type."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        want = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        ok = True
        if want == "bool":
            ok = isinstance(value, bool)
        elif want == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif want.startswith("float"):
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (value is None and "None" in want)
        elif want == "str":
            ok = isinstance(value, str)
        elif want == "dict":
            ok = isinstance(value, dict)
        if not ok:
            raise TrainingError(
                f"{section}.{f.name} must be {want.replace(' | None', '')} "
                f"(got {value!r} of type {type(value).__name__})"
            )


def _check_numbers(obj, section: str) -> None:
    """Raise TrainingError for a non-finite float or an integer past ``MAX_INT_SETTING`` in a
    dataclass's fields (after ``_check_types``: every value has its field's type)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise TrainingError(f"{section}.{f.name} must be a finite number (got {value})")
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT_SETTING:
            raise TrainingError(
                f"{section}.{f.name} must be at most 2**63 − 1 = {MAX_INT_SETTING} (got {value}); "
                + ("give a smaller seed" if f.name == "seed" else "give a smaller number")
            )


def _section_fields() -> dict[str, list[str]]:
    return {
        "model": [f.name for f in fields(GPTConfig) if f.name not in _MODEL_RESERVED],
        "train": [f.name for f in fields(TrainConfig)],
    }


def _parse_value(text: str):
    """A ``--set`` value as a TOML literal (``3e-4``, ``true``, ``"x"``, ``{a = 1}``); a bare
    word that is not a literal (``alibi``) is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(tables: dict, overrides: list[str]) -> dict:
    """Apply ``key=value`` overrides to parsed TOML ``tables`` (a new dict is returned).

    Keys: ``section.field`` (``model.position_encoding``, ``train.lr``), a nested
    ``model.encoding_options.init_L``, or a bare ``field`` when only one section has it.
    Raises: TrainingError for a malformed override or a key that does not exist (the
    message lists the valid keys).
    """
    tables = json.loads(json.dumps(tables))  # deep copy of plain TOML data
    valid = _section_fields()
    for item in overrides:
        if "=" not in item:
            raise TrainingError(f"--set {item!r} is not key=value (e.g. --set train.lr=3e-4)")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if parts[0] not in valid:
            owners = [s for s, names in valid.items() if parts[0] in names]
            if len(owners) != 1:
                raise TrainingError(_unknown_key_message(key))
            parts = [owners[0]] + parts
        section, name = parts[0], parts[1] if len(parts) > 1 else ""
        if name not in valid[section]:
            raise TrainingError(_unknown_key_message(key))
        if len(parts) > 2 and name != "encoding_options":
            raise TrainingError(f"--set {key}: {section}.{name} is not a table")
        node = tables.setdefault(section, {})
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _parse_value(text.strip())
    return tables


def _unknown_key_message(key: str) -> str:
    listing = "; ".join(f"[{s}] " + ", ".join(names) for s, names in _section_fields().items())
    return f"unknown config key {key!r}; valid keys: {listing}"


def configs_from_tables(tables: dict) -> tuple[GPTConfig, TrainConfig]:
    """Build and validate ``(GPTConfig, TrainConfig)`` from ``{"model": {...}, "train": {...}}``.

    Raises: TrainingError for an unknown table or key (listing the valid ones), a value of
    the wrong type, or an invalid setting (e.g. an unknown position encoding).
    """
    valid = _section_fields()
    unknown_tables = set(tables) - set(valid)
    if unknown_tables:
        raise TrainingError(f"unknown config table(s) {sorted(unknown_tables)}; use [model] and [train]")
    for section, names in valid.items():
        table = tables.get(section, {})
        if not isinstance(table, dict):
            raise TrainingError(f"[{section}] must be a table")
        for key in table:
            if key not in names:
                raise TrainingError(_unknown_key_message(f"{section}.{key}"))
    mc = GPTConfig(**tables.get("model", {}))
    _check_types(mc, "model")
    try:
        mc.validate()
    except ValueError as e:
        raise TrainingError(f"[model] {e}") from e
    tc = TrainConfig(**tables.get("train", {})).validate()
    _check_pair(mc, tc)
    return mc, tc


def _check_pair(mc: GPTConfig, tc: TrainConfig) -> None:
    # settings that are fine alone but not together
    if tc.random_position_offset and mc.absolute_position_embedding:
        raise TrainingError(
            "train.random_position_offset needs a relative encoding: absolute position embeddings "
            f"cover only seq_len={mc.seq_len} positions; set model.absolute_position_embedding=false "
            "or train.random_position_offset=0"
        )


#: Largest TOML config read (bytes): fireviz's configs are 1–3 KB; a bigger file is not a config,
#: and parsing one costs memory per value, so it is refused before it is read
MAX_CONFIG_BYTES = 1 << 20


def load_config(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> tuple[GPTConfig, TrainConfig]:
    """Read a TOML config (``[model]`` and ``[train]`` tables) and apply ``--set`` overrides.

    ``path`` None starts from the defaults. Raises: TrainingError if the file is missing, larger
    than :data:`MAX_CONFIG_BYTES`, or not valid TOML, or for any problem ``configs_from_tables`` names.
    """
    tables: dict = {}
    if path is not None:
        try:
            size = Path(path).stat().st_size
            if size > MAX_CONFIG_BYTES:  # bounded before it is read or parsed (issue #50)
                raise TrainingError(
                    f"config file {path} is {size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a training config "
                    "needs (configs/tiny.toml is under 2 KB); give the TOML file of [model] and [train] settings"
                )
            tables = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise TrainingError(f"config file {path} not found") from e
        except (OSError, UnicodeDecodeError) as e:
            raise TrainingError(f"cannot read config file {path}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise TrainingError(f"config file {path} is not valid TOML: {e}") from e
    return configs_from_tables(apply_overrides(tables, list(overrides)))


def settings_dict(model_config: GPTConfig, train_config: TrainConfig) -> dict:
    """``{"model": …, "train": …}`` as plain JSON data (model without ``training``)."""
    model = {k: v for k, v in asdict(model_config).items() if k not in _MODEL_RESERVED}
    return {"model": model, "train": asdict(train_config)}


def config_hash(model_config: GPTConfig, train_config: TrainConfig) -> str:
    """sha256 over every setting that changes the trained numbers (all but ``_FREE_ON_RESUME``)."""
    s = settings_dict(model_config, train_config)
    s["train"] = {k: v for k, v in s["train"].items() if k not in _FREE_ON_RESUME}
    if not s["train"].get("random_position_offset"):  # off: the hash of runs made before the option existed
        s["train"].pop("random_position_offset", None)
    if s["train"].get("position_lr_multiplier") == 1.0:  # the default: the hash of runs made before the option
        s["train"].pop("position_lr_multiplier", None)
    return hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()
