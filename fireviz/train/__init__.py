"""Training: settings, the loop, its step, schedule and resumable state."""

from fireviz.train.config import TrainingError, TrainingInterrupted, apply_overrides, configs_from_tables, load_config
from fireviz.train.loop import train
from fireviz.train.schedule import window_starts
from fireviz.train.step import build_optimizer, training_step

__all__ = [
    "TrainingError",
    "TrainingInterrupted",
    "apply_overrides",
    "build_optimizer",
    "configs_from_tables",
    "load_config",
    "train",
    "training_step",
    "window_starts",
]
