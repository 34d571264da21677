"""The GPT decoder and its attention: config, the model, attention paths (SDPA, compiled backward, FlexAttention), captured attention, the checked safetensors state."""

from fireviz.model.attention_kernel import backward_kernel
from fireviz.model.config import GPTConfig
from fireviz.model.gpt import BOS_ID, GPT
from fireviz.model.memory import (
    InsufficientMemoryError,
    bias_matrix_bytes,
    bias_report_bytes,
    check_fits,
    fire_curve_bytes,
    fit_bytes,
    memory_problem,
    train_step_bytes,
)
from fireviz.model.state import (
    ENCODING_METADATA_KEY,
    CheckpointError,
    EncodingRecordWarning,
    check_encoding_record,
    config_from_dict,
    encoding_record,
    load_checked,
    load_state_checked,
    nonfinite_parameters,
    nonfinite_tensors,
)

__all__ = [
    "InsufficientMemoryError",
    "bias_matrix_bytes",
    "bias_report_bytes",
    "check_fits",
    "fire_curve_bytes",
    "fit_bytes",
    "memory_problem",
    "train_step_bytes",
    "BOS_ID",
    "CheckpointError",
    "ENCODING_METADATA_KEY",
    "EncodingRecordWarning",
    "GPT",
    "GPTConfig",
    "backward_kernel",
    "check_encoding_record",
    "config_from_dict",
    "encoding_record",
    "load_checked",
    "load_state_checked",
    "nonfinite_parameters",
    "nonfinite_tensors",
]
