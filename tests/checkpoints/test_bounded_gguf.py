"""GGUF files whose header claims more than they hold, or more than fireviz reads, are refused in
one line before transformers builds a Python object from them (issue #50)."""

from __future__ import annotations

import struct

import pytest
from bombs import RSS_BOUND_MB, one_clear_line, run_measured

from fireviz.checkpoints.gguf_header import MAX_GGUF_ARRAY, MAX_GGUF_KEYS, check_gguf_header
from fireviz.model import CheckpointError


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(kvs: bytes, n_keys: int, n_tensors: int = 0, tail: bytes = b"", pad_to: int = 0) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_keys) + kvs + tail
    return out + b"\0" * max(0, pad_to - len(out))


def _kv(key: str, vtype: int, value: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + value


def _array(etype: int, count: int, body: bytes = b"") -> bytes:
    return struct.pack("<IQ", etype, count) + body


GOOD_KVS = (
    _kv("general.architecture", 8, _s("llama"))
    + _kv("llama.block_count", 4, struct.pack("<I", 2))
    + _kv("tokenizer.ggml.tokens", 9, _array(8, 3, _s("a") + _s("b") + _s("ab")))
    + _kv("tokenizer.ggml.scores", 9, _array(6, 3, struct.pack("<3f", 0, 0, 1)))
)
GOOD_TENSOR = _s("token_embd.weight") + struct.pack("<I2QIQ", 2, 4, 3, 0, 0)

#: the bad classes: name → (file bytes, what the one line says)
BAD = {
    "8M strings claimed in 4 KB": (
        _gguf(_kv("tokenizer.ggml.tokens", 9, _array(8, 8_000_000)), 1, pad_to=4096),
        "claims 8,000,000 entries, more than the 1,000,000",
    ),
    "500k strings claimed in 4 KB": (
        _gguf(_kv("tokenizer.ggml.tokens", 9, _array(8, 500_000)), 1, pad_to=4096),
        "claims 500,000 entries (at least 4,000,000 bytes) but only",
    ),
    "a 1.5e9-byte array": (
        _gguf(_kv("tokenizer.ggml.merges_blob", 9, _array(0, 1_500_000_000)), 1, pad_to=4096),
        "claims 1,500,000,000 entries",
    ),
    "more keys than the file": (_gguf(GOOD_KVS, 300), "the metadata claims 300 entries"),
    "more keys than read": (_gguf(GOOD_KVS, 10**12), f"more than the {MAX_GGUF_KEYS:,} fireviz reads"),
    "more tensors than the file": (_gguf(GOOD_KVS, 4, n_tensors=10**6), "the tensor list claims 1,000,000"),
    "a string past the end": (_gguf(_kv("general.name", 8, struct.pack("<Q", 1 << 19) + b"x"), 1), "only 1 are left"),
    "a string past the limit": (_gguf(_kv("general.name", 8, struct.pack("<Q", 1 << 40)), 1), "longer than the"),
    "an unknown type": (_gguf(_kv("general.name", 77, b"\0" * 8), 1), "unknown value type 77"),
    "truncated in a value": (_gguf(_kv("llama.block_count", 4, b"\1\0"), 1), "claims 4 bytes but only 2"),
    "truncated in the counts": (b"GGUF" + struct.pack("<IQ", 3, 0) + b"\1\2", "ends inside the metadata count"),
    "version 1": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "its version is 1"),
    "a 5-d tensor": (_gguf(GOOD_KVS, 4, 1, _s("t") + struct.pack("<I", 5) + b"\0" * 60), "5 dimensions"),
}


def test_a_well_formed_header_is_walked_and_counted(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(_gguf(GOOD_KVS, 4, 1, GOOD_TENSOR, pad_to=512))
    assert check_gguf_header(path) == {"version": 3, "tensors": 1, "keys": 4, "metadata_bytes": 24 + len(GOOD_KVS)}


def test_a_file_written_by_the_gguf_package_passes(tmp_path):
    import gguf  # what llama.cpp's converters write with (tests/causal_lm_folders.py)
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    w.add_block_count(2)
    w.add_token_list(["x", "y", "xy"])
    w.add_token_merges(["x y"])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    head = check_gguf_header(tmp_path / "w.gguf")
    assert head["tensors"] == 1 and head["keys"] >= 5


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_or_oversized_header_is_one_line(tmp_path, name):
    raw, said = BAD[name]
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match="bad.gguf") as e:
        check_gguf_header(path)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert path.read_bytes() == raw


@pytest.mark.parametrize("name", ["8M strings claimed in 4 KB", "a 1.5e9-byte array", "more keys than the file"])
def test_resolving_a_bad_gguf_is_one_line_in_bounded_memory(tmp_path, name):
    """The issue's rows, through the front door (what the picker and ``eval --ckpt`` call):
    past 3 GB before any check, or a struct.error traceback."""
    path = tmp_path / "model.gguf"
    path.write_bytes(BAD[name][0])
    code = (
        "from fireviz.checkpoints import resolve_any\nfrom fireviz.model import CheckpointError\n"
        f"try:\n    resolve_any({str(path)!r})\nexcept CheckpointError as e:\n    print(e)\n    raise SystemExit(2)\n"
    )
    rc, out, rss = run_measured(code)
    assert rc == 2 and one_clear_line(out) and BAD[name][1] in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"
    assert MAX_GGUF_ARRAY <= 1_000_000


def test_metadata_past_its_byte_limit_is_refused_by_its_offset(tmp_path):
    """65 strings of 1 MiB (a sparse file: nothing but their lengths written) pass every per-entry
    limit and the file's size, and cross MAX_GGUF_METADATA_BYTES together."""
    from fireviz.checkpoints.gguf_header import MAX_GGUF_METADATA_BYTES, MAX_GGUF_STRING

    n = MAX_GGUF_METADATA_BYTES // MAX_GGUF_STRING + 1
    path = tmp_path / "fat.gguf"
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n))
        for k in range(n):
            f.write(_s(f"k{k:03d}") + struct.pack("<IQ", 8, MAX_GGUF_STRING))
            f.seek(MAX_GGUF_STRING, 1)
        f.truncate(f.tell() + 64)
    with pytest.raises(CheckpointError, match=f"its metadata is longer than {MAX_GGUF_METADATA_BYTES:,} bytes"):
        check_gguf_header(path)
