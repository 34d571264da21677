"""Reading files of any size in bounded memory: named limits, and line streams that check them.

Every reader of a file fireviz did not write itself takes its bytes through here (issue #50):
a compressed file is decompressed as a stream and its lines are read with ``readline(limit + 1)``,
so a line longer than its limit, or more decompressed bytes than a file may hold, is refused
*while streaming*, before the bytes become one Python object. A 2 MB ``.jsonl.gz`` holding one
2 GiB line costs the line limit, not 2 GiB.

Each limit is a :class:`Limit`: a default, and where a user may legitimately need more, the
environment variable that raises it (named in the refusal).
"""

from __future__ import annotations

import gzip
import lzma
import os
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

MiB = 1 << 20
GiB = 1 << 30


class FileFormatError(ValueError):
    """A file fireviz reads is unreadable, too large, too deeply nested, not the expected JSON
    shape, or holds a non-finite number. The message names the file and the problem; the file
    itself is never modified."""


class Limit:
    """One bound on what a reader takes in: ``default`` (in bytes or items), raised by the
    environment variable ``env`` (a positive whole number of ``unit_name`` s, e.g. ``FIREVIZ_MAX_LINE_MB=512``).

    ``value`` is read at each use (a changed variable counts at the next read); a variable that
    is not a positive whole number is said once (RuntimeWarning) and the default used, so a bad
    setting never breaks a reader that would otherwise work.
    """

    __slots__ = ("default", "env", "unit", "unit_name")
    _said_bad: set[tuple[str, str]] = set()

    def __init__(self, default: int, env: str | None = None, unit: int = 1, unit_name: str = ""):
        self.default, self.env, self.unit, self.unit_name = int(default), env, int(unit), unit_name

    @property
    def value(self) -> int:
        """The limit now: the environment variable's (× ``unit``) when set and valid, else the default."""
        raw = os.environ.get(self.env, "").strip() if self.env else ""
        if not raw or self.env is None:
            return self.default
        try:
            n = int(raw)
            if n < 1:
                raise ValueError
        except ValueError:
            if (self.env, raw) not in Limit._said_bad:
                Limit._said_bad.add((self.env, raw))
                import warnings

                warnings.warn(
                    f"{self.env}={raw!r} is not a positive whole number{' of ' + self.unit_name if self.unit_name else ''}; "
                    f"the default {self.default // self.unit:,} {self.unit_name} is used: set it to one, or unset it",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return self.default
        return n * self.unit

    def said(self) -> str:
        """The limit in words, with its unit (``64 MiB``, ``1,000,000``)."""
        v = self.value
        return f"{v // self.unit:,} {self.unit_name}".strip() if v % self.unit == 0 else f"{v:,}"

    def fix(self) -> str:
        """How to raise it (``set FIREVIZ_MAX_LINE_MB above 64``), or "" for a fixed limit."""
        if not self.env:
            return ""
        return f"set {self.env} above {self.value // self.unit} ({self.unit_name or 'items'}) to read it"


#: Most bytes one compressed corpus file may expand to (a 1 MB ``.gz`` can hold gigabytes of one
#: repeated byte): counted while decompressing. Raise with ``FIREVIZ_MAX_DECOMPRESSED_GB``.
MAX_DECOMPRESSED_BYTES = Limit(64 * GiB, "FIREVIZ_MAX_DECOMPRESSED_GB", GiB, "GiB")
#: Longest line of a JSON-lines corpus (one document, JSON-escaped): read whole and parsed, so
#: memory is ~3 times it. A longer document belongs in a text file (read where its windows lie).
#: Raise with ``FIREVIZ_MAX_LINE_MB``.
MAX_LINE_BYTES = Limit(64 * MiB, "FIREVIZ_MAX_LINE_MB", MiB, "MiB")
#: Most documents one :func:`fireviz.data.load_documents` call holds in memory (~250 bytes each
#: whatever their text: 10 million one-character documents took 2 GB). Streaming readers
#: (``prepare``) hold one at a time and are not bound by it. Raise with ``FIREVIZ_MAX_DOCUMENTS``.
MAX_DOCUMENTS = Limit(1_000_000, "FIREVIZ_MAX_DOCUMENTS", 1, "documents")
#: Most bytes one Parquet row group's columns read may decompress to (read whole by pyarrow).
#: Raise with ``FIREVIZ_MAX_PARQUET_GROUP_MB``.
MAX_PARQUET_GROUP_BYTES = Limit(512 * MiB, "FIREVIZ_MAX_PARQUET_GROUP_MB", MiB, "MiB")
#: Longest line of a JSON-lines file fireviz writes itself (a training log, ~200 bytes a line).
MAX_LOG_LINE_BYTES = Limit(16 * MiB, None, MiB, "MiB")

#: the compressions read, by magic bytes: gzip (every member), xz (every stream)
_MAGIC = {b"\x1f\x8b": "gz", b"\xfd7zXZ\x00": "xz"}


def compression(path: str | os.PathLike) -> str | None:
    """``"gz"``, ``"xz"`` or None for ``path``, by its first bytes (a renamed file is read as
    what it is), else by its suffix. Raises: OSError if it cannot be opened."""
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading bytes, decompressed as it is read when it is gzip or xz
    (:func:`compression`). Raises: OSError."""
    kind = compression(path)
    if kind == "gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "xz":
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


#: what a broken compressed stream raises while it is read
DECOMPRESSION_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


def iter_lines(
    path: str | os.PathLike,
    *,
    max_line_bytes: Limit,
    max_total_bytes: Limit | int,
    error: type[Exception] = FileFormatError,
    what: str = "file",
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for each line of ``path`` (plain, gzip or xz), the line's bytes
    without its ``\\n``; streamed: memory is one line, at most ``max_line_bytes``.

    Raises: ``error`` (one line naming the file, the limit and how to raise it) when a line is
      longer than ``max_line_bytes``, when the file holds (decompressed) more than
      ``max_total_bytes``, or when it cannot be read or decompressed. The file is never modified.
    """
    path = Path(path)
    line_limit = max_line_bytes.value
    total_limit = max_total_bytes.value if isinstance(max_total_bytes, Limit) else int(max_total_bytes)
    total = 0
    try:
        with open_binary(path) as f:
            n = 0
            while line := f.readline(line_limit + 1):  # readline(n) stops at n bytes: no line held whole
                n += 1
                total += len(line)
                if len(line) > line_limit and not (len(line) == line_limit + 1 and line.endswith(b"\n")):
                    fix = max_line_bytes.fix()
                    raise error(
                        f"{path}:{n} is a line longer than {max_line_bytes.said()} (the most one {what} line may be); "
                        + (f"split the document, give it as a text file, or {fix}" if fix else "restore or delete it")
                    )
                if total > total_limit:
                    fix = max_total_bytes.fix() if isinstance(max_total_bytes, Limit) else ""
                    said = max_total_bytes.said() if isinstance(max_total_bytes, Limit) else f"{total_limit:,} bytes"
                    raise error(
                        f"{path} holds more than {said} (decompressed), more than one {what} may; "
                        + (fix if fix else "restore or delete it")
                    )
                yield n, line[:-1] if line.endswith(b"\n") else line
    except DECOMPRESSION_ERRORS as e:
        raise error(f"cannot read {path}: {e}; restore or replace it") from e


def read_bounded(
    f: BinaryIO | gzip.GzipFile | lzma.LZMAFile,
    limit: Limit | int,
    source: str,
    error: type[Exception] = FileFormatError,
    chunk: int = MiB,
):
    """The bytes of the open stream ``f`` in ``chunk`` pieces (a generator), refusing with
    ``error`` once more than ``limit`` came out (a decompression bomb costs one piece)."""
    cap = limit.value if isinstance(limit, Limit) else int(limit)
    total = 0
    while piece := f.read(chunk):
        total += len(piece)
        if total > cap:
            fix = limit.fix() if isinstance(limit, Limit) else ""
            said = limit.said() if isinstance(limit, Limit) else f"{cap:,} bytes"
            raise error(f"{source} expands to more than {said}; " + (fix or "restore or delete it"))
        yield piece
