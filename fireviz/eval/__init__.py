"""Evaluation: perplexity / bits per byte versus length, windows, scoring, intervals, the cache."""

from fireviz.eval.cache import PUBLISHED_RESULTS, EvalCache, default_cache_dir
from fireviz.eval.evaluation import (
    NOT_COMPUTED,
    NonFiniteLossError,
    cached_results,
    check_reference,
    evaluate,
    evaluate_checkpoint,
    evaluate_many,
    lookup,
)
from fireviz.eval.progress import EvaluationCancelled
from fireviz.eval.results import (
    EvalResult,
    FullContextDifference,
    LengthEntry,
    PairedDifference,
)
from fireviz.eval.settings import (
    ALL_ROPE_SCALINGS,
    DEFAULT_LENGTHS,
    SETTING_NAMES,
    SPLITS,
    SYNTHETIC_SEQUENCES,
    EvalSettings,
    check_setting_names,
    checkpoint_list,
)
from fireviz.eval.stats import (
    bootstrap_ci95,
    dominant_document_note,
    missing_interval_note,
    paired_difference,
    with_paired_differences,
)
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
    "dominant_document_note",
    "missing_interval_note",
    "DEFAULT_CONTEXT_LENGTHS",
    "DEFAULT_CONTEXT_PREFIX",
    "DEFAULT_CONTEXT_STRIDE",
    "DEFAULT_CONTEXT_TARGETS",
    "DEFAULT_LENGTHS",
    "DEFAULT_MODE",
    "DEFAULT_POSITION_BUCKETS",
    "DEFAULT_TOKEN_BUDGET",
    "EvalCache",
    "EvalResult",
    "EvalSettings",
    "EvaluationCancelled",
    "FullContextDifference",
    "LengthEntry",
    "PairedDifference",
    "EvaluationError",
    "FULL_CONTEXT",
    "NOT_COMPUTED",
    "NonFiniteLossError",
    "MAX_UPLOAD_MB",
    "MODES",
    "PUBLISHED_RESULTS",
    "ALL_ROPE_SCALINGS",
    "ROPE_SCALINGS",
    "SETTING_NAMES",
    "SPLITS",
    "SYNTHETIC_SEQUENCES",
    "UPLOAD_TYPES",
    "bootstrap_ci95",
    "check_setting_names",
    "checkpoint_list",
    "cached_results",
    "check_reference",
    "default_cache_dir",
    "evaluate",
    "evaluate_checkpoint",
    "evaluate_many",
    "lookup",
    "paired_difference",
    "save_upload",
    "with_paired_differences",
]
