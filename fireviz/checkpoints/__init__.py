"""Checkpoints: find, describe and load fireviz checkpoints (local, bundled, Hub) and read published models' position encodings."""

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
from fireviz.checkpoints.checkpoint import Checkpoint, load_model, load_model_or_published, load_model_with_identity
from fireviz.checkpoints.records import (
    LOG_FILE_GZ,
    overview_first,
    read_train_log,
    seed_base,
    seed_groups,
    validation_rows,
)

__all__ = [
    "Checkpoint",
    "CheckpointNotFoundError",
    "LOG_FILE",
    "LOG_FILE_GZ",
    "checked_config",
    "checkpoint_folder",
    "checkpoint_groups",
    "checkpoint_sha256",
    "default_device",
    "load_model",
    "load_model_or_published",
    "load_model_with_identity",
    "read_checkpoint",
    "read_train_log",
    "scan_checkpoints",
    "seed_base",
    "overview_first",
    "seed_groups",
    "validation_rows",
]
