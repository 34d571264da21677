"""Checkpoints: find, describe and load fireviz checkpoints (local, bundled, Hub), published causal LMs in transformers folders, and published models' position encodings."""

from fireviz.checkpoints.catalog import (
    LOG_FILE,
    CheckpointNotFoundError,
    checked_config,
    checkpoint_folder,
    checkpoint_groups,
    checkpoint_sha256,
    default_device,
    read_checkpoint,
    scan_checkpoints,
)
from fireviz.checkpoints.causal_lm import CausalLMCheckpoint, is_causal_lm_folder
from fireviz.checkpoints.checkpoint import (
    Checkpoint,
    load_model,
    load_model_or_published,
    load_model_with_identity,
    resolve_any,
)
from fireviz.checkpoints.records import (
    LOG_FILE_GZ,
    overview_first,
    read_train_log,
    seed_base,
    seed_groups,
    validation_rows,
)

__all__ = [
    "CausalLMCheckpoint",
    "Checkpoint",
    "CheckpointNotFoundError",
    "LOG_FILE",
    "LOG_FILE_GZ",
    "checked_config",
    "checkpoint_folder",
    "checkpoint_groups",
    "checkpoint_sha256",
    "default_device",
    "is_causal_lm_folder",
    "load_model",
    "load_model_or_published",
    "load_model_with_identity",
    "read_checkpoint",
    "read_train_log",
    "resolve_any",
    "scan_checkpoints",
    "seed_base",
    "overview_first",
    "seed_groups",
    "validation_rows",
]
