"""GGUF headers read and bounded by fireviz before transformers / ``gguf`` sees the file (issue #50).

GGUF (llama.cpp's model format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all
little-endian: ``"GGUF"``, version u32 (2 or 3: counts and lengths are u64), tensor count u64,
metadata key/value count u64; then each key/value: key (string), value type u32, value; then each
tensor's info: name (string), n_dims u32, dims u64 × n_dims, ggml type u32, offset u64. A string
is a u64 length and that many UTF-8 bytes; an array is an element type u32, a count u64 and the
elements (arrays of arrays too).

:func:`check_gguf_header` walks all of it without building the values (a string's bytes and a
fixed-size array are skipped by ``seek``), so what it costs is the number of entries, never what
they claim: every count and length is checked against the bytes left in the file and against
the limits below before it is followed. transformers' reader turns every value into Python
objects (a 4 KB file claiming 8 million strings grew past 3 GB); after this check it only meets
files whose metadata is within the limits.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from fireviz.model import CheckpointError

#: Most metadata key/values one GGUF file may hold (llama.cpp's converters write ~30–60).
MAX_GGUF_KEYS = 10_000
#: Most tensors one GGUF file may describe (a 405B-parameter model has ~1,100).
MAX_GGUF_TENSORS = 100_000
#: Most elements of one metadata array (a tokenizer's vocabulary or merges: ≤ ~300,000 in
#: today's models), and of all arrays together: transformers holds each as a Python object.
MAX_GGUF_ARRAY = 1_000_000
MAX_GGUF_ELEMENTS = 4_000_000
#: Longest metadata string (a chat template is ~10 KB) and the most metadata bytes in all (a
#: 128k-token vocabulary with its merges is ~10 MB).
MAX_GGUF_STRING = 1 << 20
MAX_GGUF_METADATA_BYTES = 64 << 20
#: ggml's most tensor dimensions
GGUF_MAX_DIMS = 4

#: bytes of each fixed-size value type (8: string and 9: array are sized as they are read)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_TYPE_NAMES = {8: "string", 9: "array"}


class _Header:
    """A cursor over a GGUF file's header: reads exact little-endian values, refusing any that
    runs past the file's end, and counts what the limits count."""

    def __init__(self, f, size: int, source: str):
        self.f, self.size, self.source = f, size, source
        self.elements = 0

    def bad(self, why: str) -> CheckpointError:
        return CheckpointError(
            f"{self.source} is not a GGUF file transformers can read safely: {why}; restore or replace it"
        )

    @property
    def left(self) -> int:
        return self.size - self.f.tell()

    def take(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        raw = self.f.read(n)
        if len(raw) != n:
            raise self.bad(f"it ends inside {what} (the file is truncated)")
        return struct.unpack("<" + fmt, raw)[0]

    def skip(self, n: int, what: str) -> None:
        if n > self.left:
            raise self.bad(f"{what} claims {n:,} bytes but only {self.left:,} are left in the file")
        self.f.seek(n, os.SEEK_CUR)

    def count(self, n: int, each: int, limit: int, what: str) -> None:
        """Refuse a count ``n`` of items of at least ``each`` bytes past the file or ``limit``."""
        if n > limit:
            raise self.bad(f"{what} claims {n:,} entries, more than the {limit:,} fireviz reads")
        if n * each > self.left:
            raise self.bad(
                f"{what} claims {n:,} entries (at least {n * each:,} bytes) but only {self.left:,} bytes are left"
            )

    def string(self, what: str, limit: int = MAX_GGUF_STRING) -> int:
        n = self.take("Q", f"the length of {what}")
        if n > limit:
            raise self.bad(f"{what} is a string of {n:,} bytes, longer than the {limit:,} fireviz reads")
        self.skip(n, what)
        return n

    def key(self, k: int) -> str:
        n = self.take("Q", f"the length of key {k}")
        if n > 65535:
            raise self.bad(f"key {k} is {n:,} bytes long (a key is at most 65,535)")
        raw = self.f.read(n)
        if len(raw) != n:
            raise self.bad(f"it ends inside key {k} (the file is truncated)")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"key {k} is not UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _FIXED:
            self.skip(_FIXED[vtype], what)
        elif vtype == 8:
            self.string(what)
        elif vtype == 9:
            if depth >= 2:
                raise self.bad(f"{what} nests arrays more than 2 deep")
            etype = self.take("I", f"the element type of {what}")
            if etype not in _FIXED and etype not in (8, 9):
                raise self.bad(f"{what} has an unknown element type {etype}")
            n = self.take("Q", f"the length of {what}")
            each = _FIXED.get(etype, 8)  # a string or an array is at least its u64 length
            self.count(n, each, MAX_GGUF_ARRAY, what)
            self.elements += n
            if self.elements > MAX_GGUF_ELEMENTS:
                raise self.bad(
                    f"its metadata arrays hold more than {MAX_GGUF_ELEMENTS:,} elements together (at {what})"
                )
            if etype in _FIXED:
                self.skip(n * each, what)
            else:
                for i in range(n):
                    self.value(etype, f"{what}[{i}]", depth + 1)
        else:
            raise self.bad(f"{what} has an unknown value type {vtype}")


def check_gguf_header(path: str | os.PathLike) -> dict:
    """Walk a GGUF file's header, metadata and tensor infos, bounded as the module docstring says.

    Returns: ``{"version", "tensors", "keys", "metadata_bytes"}``.
    Raises: CheckpointError (one line naming the file and the entry) for a file that is not GGUF,
      is truncated, has an unknown type, or claims more entries or bytes than it holds or than
      the limits (``MAX_GGUF_*``) allow. Reads the header only; never the tensor data.
    """
    path = Path(path)
    source = str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            h = _Header(f, size, source)
            if f.read(4) != b"GGUF":
                raise h.bad("it does not start with the bytes GGUF")
            version = h.take("I", "the version")
            if version not in (2, 3):
                raise h.bad(f"its version is {version} (fireviz reads GGUF versions 2 and 3)")
            n_tensors = h.take("Q", "the tensor count")
            n_keys = h.take("Q", "the metadata count")
            h.count(n_keys, 8 + 4 + 1, MAX_GGUF_KEYS, "the metadata")  # key length, type, smallest value
            for k in range(n_keys):
                key = h.key(k)
                vtype = h.take("I", f"the type of {key!r}")
                h.value(vtype, repr(key))
                if f.tell() > MAX_GGUF_METADATA_BYTES:
                    raise h.bad(f"its metadata is longer than {MAX_GGUF_METADATA_BYTES:,} bytes (at {key!r})")
            metadata_bytes = f.tell()
            h.count(n_tensors, 8 + 4 + 4 + 8, MAX_GGUF_TENSORS, "the tensor list")
            for t in range(n_tensors):
                h.string(f"the name of tensor {t}", 65535)
                n_dims = h.take("I", f"the dimensions of tensor {t}")
                if n_dims > GGUF_MAX_DIMS:
                    raise h.bad(f"tensor {t} has {n_dims} dimensions (ggml allows at most {GGUF_MAX_DIMS})")
                h.skip(8 * n_dims + 4, f"the shape of tensor {t}")
                offset = h.take("Q", f"the offset of tensor {t}")
                if offset > size:
                    raise h.bad(f"tensor {t} starts at byte {offset:,} of its data, past the file's end")
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"cannot read the GGUF file {path}: {e}") from e
    return {"version": version, "tensors": n_tensors, "keys": n_keys, "metadata_bytes": metadata_bytes}
