"""Evaluation: perplexity / bits per byte versus length, windows, scoring, intervals, the cache."""

from fireviz.eval.cache import PUBLISHED_RESULTS, default_cache_dir
from fireviz.eval.evaluate import evaluate_checkpoint, evaluate_many
from fireviz.eval.settings import (
    DEFAULT_LENGTHS,
    SPLITS,
    SYNTHETIC_SEQUENCES,
    EvalSettings,
    check_setting_names,
    checkpoint_list,
)
from fireviz.eval.stats import bootstrap_ci95, paired_difference
from fireviz.eval.uploads import MAX_UPLOAD_MB, UPLOAD_TYPES, save_upload
from fireviz.eval.variants import ROPE_SCALINGS
from fireviz.eval.windows import (
    DEFAULT_CONTEXT_LENGTHS,
    DEFAULT_CONTEXT_PREFIX,
    DEFAULT_CONTEXT_STRIDE,
    DEFAULT_CONTEXT_TARGETS,
    DEFAULT_MODE,
    DEFAULT_POSITION_BUCKETS,
    DEFAULT_TOKEN_BUDGET,
    FULL_CONTEXT,
    MODES,
    EvaluationError,
)

__all__ = [
    "DEFAULT_CONTEXT_LENGTHS",
    "DEFAULT_CONTEXT_PREFIX",
    "DEFAULT_CONTEXT_STRIDE",
    "DEFAULT_CONTEXT_TARGETS",
    "DEFAULT_LENGTHS",
    "DEFAULT_MODE",
    "DEFAULT_POSITION_BUCKETS",
    "DEFAULT_TOKEN_BUDGET",
    "EvalSettings",
    "EvaluationError",
    "FULL_CONTEXT",
    "MAX_UPLOAD_MB",
    "MODES",
    "PUBLISHED_RESULTS",
    "ROPE_SCALINGS",
    "SPLITS",
    "SYNTHETIC_SEQUENCES",
    "UPLOAD_TYPES",
    "bootstrap_ci95",
    "check_setting_names",
    "checkpoint_list",
    "default_cache_dir",
    "evaluate_checkpoint",
    "evaluate_many",
    "paired_difference",
    "save_upload",
]
