"""One checkpoint, resolved once: :class:`Checkpoint` — the object every stage above takes.

A reference (a bundled name ``fire``, a group's ``copy/fire``, a folder path, or a fireviz
checkpoint's Hugging Face repo id) is resolved once at the edge (the CLI, a page) into a
:class:`Checkpoint`: its name, folder, validated config, where it came from, and ONE identity,
``sha256`` (of ``model.safetensors`` then ``config.json``, the key of every cache and the
``checkpoint_sha256`` of every result). :meth:`Checkpoint.load` reads exactly the bytes that
identity names and refuses files changed since. Evaluation, fitting, analysis, jobs and pages
take these objects, never path strings.

The interface is what evaluation needs of a model, so that other kinds (a published causal LM,
a model with its own tokenizer) can join behind it as new classes, not branches in evaluation:
``name``, ``sha256``, ``config`` (``seq_len``, ``position_encoding``), ``kind``, ``tokenizer``
and ``load(device)`` returning a module that maps token ids ``(B, T)`` int64 to logits
``(B, T, vocab)``.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from fireviz.checkpoints import hub
from fireviz.checkpoints.catalog import (
    _config_checked,
    _files_sha256,
    _local_path,
    _safetensors_entries,
    checkpoint_files,
)
from fireviz.checkpoints.causal_lm import (
    CausalLMCheckpoint,
    is_causal_lm_folder,
    is_gguf_file,
    load_tokenizer,
    tokenizer_files,
)
from fireviz.checkpoints.hub import looks_like_hub_id
from fireviz.core import MAX_JSON_BYTES, FileFormatError, read_json
from fireviz.data.tokenizers import BYTE_TOKENIZER, stored_tokenizer_problem
from fireviz.model import GPT, CheckpointError, GPTConfig, load_checked

#: per identity: the config checked against its weights' header (a meta-device model build)
_CONFIGS: dict[str, GPTConfig] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A fireviz checkpoint, resolved once (:meth:`resolve`); compare and hash by ``(path, sha256)``.

    Attributes:
      name: the folder's name (``fire``; a Hub id's last part), shown in tables and legends.
      path: the reference as it was given (``checkpoints/fire``, ``fire``, ``owner/name``),
        recorded as a result's ``checkpoint_path``.
      folder: the local folder holding config.json and model.safetensors (a Hub checkpoint: its
        snapshot in the Hub cache).
      config: the validated :class:`fireviz.model.GPTConfig`, checked against the weights'
        safetensors header (names and shapes; no tensor read).
      sha256: the one identity: sha256 (hex) of model.safetensors followed by config.json.
      source: ``"local"`` or ``"hub"`` (then ``repo_id`` is the Hub id).
      kind: ``"fireviz"`` (the GPT of ``fireviz.model``).
      tokenizer: ``fireviz.data.tokenizers.BYTE_TOKENIZER`` (one token per byte, BOS = 256), or
        the ``HFTokenizer`` stored beside its config.json when it was trained on token shards of
        one (issue #37; config.json's ``training.tokenizer.key`` names its files' sha256, so the
        identity covers it).
    """

    name: str
    path: str
    folder: Path
    config: GPTConfig
    sha256: str
    source: str = "local"
    repo_id: str | None = None
    tokenizer: Any = field(default=BYTE_TOKENIZER, repr=False)
    kind: ClassVar[str] = "fireviz"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and (self.path, self.sha256) == (other.path, other.sha256)

    def __hash__(self) -> int:
        return hash((self.path, self.sha256))

    @classmethod
    def resolve(cls, ref: str | os.PathLike | Checkpoint) -> Checkpoint:
        """The checkpoint a reference names: an existing folder path (``~`` expanded), else a name
        under the checkpoints root (``fire``) or a group's folder (``copy/fire``), else a fireviz
        checkpoint on the Hugging Face Hub (``owner/name``, fetched into the Hub cache; never a
        pickle). A :class:`Checkpoint` is returned as it is.
        Raises: CheckpointError (CheckpointNotFoundError when nothing is there) naming the problem
          and the fix: no such folder or repo, a missing or unreadable file, a config.json that is
          not valid, weights whose header does not match it."""
        if isinstance(ref, Checkpoint):
            return ref
        config_path, weights_path = checkpoint_files(ref)
        sha256 = _files_sha256(config_path, weights_path)
        with _LOCK:
            config = _CONFIGS.get(sha256)
        if config is None:
            config = _config_checked(config_path, weights_path)
            with _LOCK:
                _CONFIGS[sha256] = config
        local = _local_path(ref)
        hub_id = str(ref) if not local.exists() and looks_like_hub_id(str(ref)) else None
        return cls(
            name=Path(str(ref)).name or str(ref),
            path=str(ref),
            folder=config_path.parent,
            config=config,
            sha256=sha256,
            source="hub" if hub_id else "local",
            repo_id=hub_id,
            tokenizer=_stored_tokenizer(config, config_path.parent),
        )

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    @property
    def weights_path(self) -> Path:
        return self.folder / "model.safetensors"

    def load(self, device: str | torch.device = "cpu") -> GPT:
        """The model, built from exactly the bytes ``sha256`` names: one read of both files,
        hashed; strict safetensors loading (never pickle) through ``fireviz.model.load_checked``,
        the one loader; on ``device``, in eval mode.
        Raises: CheckpointError if the files changed since :meth:`resolve` (a training run writing
        an interim checkpoint: resolve it again), are corrupt or truncated, or do not match."""
        weights = _read_bytes(self.weights_path)
        config_bytes = _read_bytes(self.config_path, MAX_JSON_BYTES)
        h = hashlib.sha256(weights)
        h.update(config_bytes)  # weights then config, as the identity hashes them
        if h.hexdigest() != self.sha256:
            raise CheckpointError(
                f"{self.name} changed since it was opened ({self.folder}; is a training run writing it?); "
                "open it again to use the files as they are now"
            )
        _safetensors_entries(io.BytesIO(weights), len(weights), str(self.weights_path))  # junk: one message
        model = load_checked(GPT, self.config, weights, str(self.weights_path))
        return model.to(device).eval()


def _stored_tokenizer(config: GPTConfig, folder: Path):
    """The tokenizer a checkpoint was trained with: the byte tokenizer, or the Hugging Face one
    whose files lie beside config.json and hash to what config.json records.
    Raises: CheckpointError for missing or changed tokenizer files."""
    record = (config.training or {}).get("tokenizer") or {}
    key = record.get("key", "byte") if isinstance(record, dict) else "byte"
    if key == "byte":
        return BYTE_TOKENIZER
    try:
        problem = stored_tokenizer_problem(tokenizer_files(folder), key)
    except OSError as e:
        raise CheckpointError(f"cannot read the tokenizer of {folder}: {e}") from e
    if problem:
        raise CheckpointError(
            f"{folder} was trained with the tokenizer {record.get('name')!r} (files sha256 {str(key)[:12]}…) but "
            f"{problem}; restore the tokenizer files the run copied beside config.json"
        )
    return load_tokenizer(folder)


def _read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path`` (at most ``limit``). Raises: CheckpointError naming the file."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if limit is not None and size > limit:
                raise CheckpointError(
                    f"{path} is {size:,} bytes, more than the {limit:,} read for a JSON file; "
                    "it is not a file fireviz wrote — restore it or train the checkpoint again"
                )
            return f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e


def load_model(ref: str | os.PathLike | Checkpoint, device: str | torch.device = "cpu") -> GPT:
    """``Checkpoint.resolve(ref).load(device)``: the GPT of a checkpoint (safetensors only, strict,
    eval mode). Raises: CheckpointError as :meth:`Checkpoint.resolve` and :meth:`Checkpoint.load`."""
    return Checkpoint.resolve(ref).load(device)


def load_model_with_identity(ref: str | os.PathLike | Checkpoint, device: str = "cpu") -> tuple[GPT, str]:
    """``(model, sha256)``: the model of exactly the bytes its identity names (:meth:`Checkpoint.load`).
    Raises: CheckpointError as :func:`load_model`."""
    ckpt = Checkpoint.resolve(ref)
    return ckpt.load(device), ckpt.sha256


def load_model_or_published(ref: str, stack: str = "decoder", revision: str | None = None, with_identity: bool = False):
    """A fireviz checkpoint (GPT) or a published model's position encodings (``hub.PublishedModel``):
    a folder whose config.json names ``model_type`` or a repo id not on disk is read through
    ``fireviz.checkpoints.hub``; everything else is a fireviz checkpoint (:class:`Checkpoint`).
    ``with_identity``: return ``(model, sha256)`` instead — a fireviz checkpoint's identity of exactly
    the bytes loaded, None for a published model.
    Raises: CheckpointError (``hub.HubModelError`` for a published one) naming the problem."""

    def fireviz(r):
        ckpt = Checkpoint.resolve(r)
        return (ckpt.load(), ckpt.sha256) if with_identity else ckpt.load()

    def published(model):
        return (model, None) if with_identity else model

    folder = _local_path(ref)
    cfg = folder / "config.json"
    if folder.is_dir() and cfg.is_file():
        try:
            is_published = hub.is_transformers_config(read_json(cfg))
        except (ValueError, FileFormatError):
            is_published = False  # let the checkpoint loader name the problem
        return published(hub.load_published(str(folder), stack=stack)) if is_published else fireviz(ref)
    if hub.looks_like_hub_id(str(ref)):
        try:
            return published(hub.load_published(ref, stack=stack, revision=revision))
        except hub.NotPublishedModelError:  # a fireviz checkpoint on the Hub
            pass
    return fireviz(ref)


def resolve_any(ref) -> Checkpoint | CausalLMCheckpoint:
    """A checkpoint of either kind, resolved once: a folder ``transformers`` wrote for a causal LM or
    a GGUF file → :class:`CausalLMCheckpoint`; a Hub id → its config.json decides (a fireviz
    checkpoint there, else a published causal LM); anything else → :meth:`Checkpoint.resolve`.
    Raises: CheckpointError naming the problem and the fix."""
    if isinstance(ref, (Checkpoint, CausalLMCheckpoint)):
        return ref
    if is_causal_lm_folder(ref) or is_gguf_file(ref):
        return CausalLMCheckpoint.resolve(ref)
    if not Path(str(ref)).expanduser().exists() and looks_like_hub_id(str(ref)):
        try:  # config.json alone decides the kind (a published model's weights are not fetched twice)
            config = hub.hub_file(str(ref), "config.json")
        except CheckpointError:
            return Checkpoint.resolve(ref)  # its own message: offline, no such repo, …
        if config is not None and is_causal_lm_folder(config.parent):
            return CausalLMCheckpoint.resolve(ref)
    return Checkpoint.resolve(ref)


__all__ = ["Checkpoint", "load_model", "load_model_or_published", "load_model_with_identity", "resolve_any"]
