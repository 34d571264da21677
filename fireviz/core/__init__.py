"""Shared foundations below every stage: argument checks, atomic files and hashing, compiled-kernel loading, reused scratch memory, torch.distributed plumbing."""

from fireviz.core.arg_checks import as_float, as_int, as_seed, is_int
from fireviz.core.files import (
    MAX_JSON_BYTES,
    FileFormatError,
    atomic_write,
    atomic_write_text,
    check_safetensors_header,
    file_state,
    output_path_problem,
    parse_json,
    read_json,
    read_jsonl,
    read_safetensors,
    sha256_files,
    sort_safetensors_metadata,
    write_json_atomic,
)
from fireviz.core.kernels import LazyKernel, numba_kernel_call
from fireviz.core.scratch import mask_output, reuse_mask_memory
from fireviz.core.text import duration

__all__ = [
    "FileFormatError",
    "LazyKernel",
    "MAX_JSON_BYTES",
    "as_float",
    "as_int",
    "as_seed",
    "atomic_write",
    "atomic_write_text",
    "check_safetensors_header",
    "duration",
    "is_int",
    "mask_output",
    "numba_kernel_call",
    "output_path_problem",
    "parse_json",
    "read_json",
    "read_jsonl",
    "read_safetensors",
    "reuse_mask_memory",
    "file_state",
    "sha256_files",
    "sort_safetensors_metadata",
    "write_json_atomic",
]
