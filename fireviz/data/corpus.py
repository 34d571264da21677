"""Text in, byte tokens out: corpora, the train/validation split and training batches.

Tokenizer: byte-level. A document becomes ``[BOS] + UTF-8 bytes`` (ids 0..255 are bytes,
``BOS_ID = 256``), so lengths and positions are in bytes and bits per byte is exact.

Bytes are bytes: a file that is not valid UTF-8 is tokenized as the bytes it holds. Text is
read with Python's ``surrogateescape`` (each undecodable byte b becomes U+DC00+b) and
:func:`text_bytes` turns those back into the original bytes; a lone surrogate from a JSON
escape (``"\ud800"``) becomes its 3 ``surrogatepass`` bytes. :func:`load_documents` warns once
(``RawBytesWarning``) when a source holds such text.

Bundled corpora (``data/<domain>.jsonl.xz``, see data/DATA.md for sources and licenses):
``prose`` (the paper's C4 analog), ``latex`` (arXiv analog), ``code`` (GitHub analog).

Split: a document is in ``validation`` iff ``sha256(id)`` read as a fraction of 2^64 is
below ``VALIDATION_FRACTION``; training and evaluation use the same rule.

Training windows (``TokenStream``): the training documents, each as ``[BOS] + bytes``,
concatenated in id order into one stream; a window is ``seq_len + 1`` consecutive tokens at
a uniformly random start. A window may therefore cross a document boundary: the tokens
after the boundary start with BOS and attention is *not* reset there (nanoGPT's choice);
evaluation windows (fireviz.evaluate) never cross one.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import lzma
import os
import re
import stat
import warnings
from pathlib import Path

import numpy as np
import torch

from fireviz.core.bounded import (
    DECOMPRESSION_ERRORS,
    MAX_DECOMPRESSED_BYTES,
    MAX_DOCUMENTS,
    MAX_LINE_BYTES,
    iter_lines,
    read_bounded,
)
from fireviz.core.files import check_json_shape

DOMAINS = ("prose", "latex", "code")
#: the byte-level vocabulary: ids 0..255 are bytes, ``BOS_ID`` = 256 marks the start of a document
BOS_ID = 256
BYTE_VOCAB_SIZE = 257
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
VALIDATION_FRACTION = 0.10
SPLITS = ("train", "validation")


class DataError(ValueError):
    """Data that cannot be used: missing, empty, unreadable, or too short."""


class RawBytesWarning(UserWarning):
    """Data that is not valid UTF-8 (or holds lone surrogates) is tokenized as its raw bytes."""


def _raw_bytes_handler(err: UnicodeError):
    # encoding errors only: surrogateescape'd bytes (U+DC80…U+DCFF) back to themselves, any other
    # surrogate as its surrogatepass (CESU-8 style) bytes
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out = bytearray()
    for ch in err.object[err.start : err.end]:
        c = ord(ch)
        out += bytes([c - 0xDC00]) if 0xDC80 <= c <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
    return bytes(out), err.end


RAW_BYTES = "fireviz-raw-bytes"
codecs.register_error(RAW_BYTES, _raw_bytes_handler)
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_bytes(text: str) -> bytes:
    """The bytes a document's text stands for: its UTF-8 encoding, with the raw bytes of a
    non-UTF-8 file (read with ``surrogateescape``) restored and lone surrogates as their
    ``surrogatepass`` bytes. Never raises for a str."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", RAW_BYTES)


def has_raw_bytes(text: str) -> bool:
    """True if ``text`` holds surrogates (undecodable bytes of its file, or lone-surrogate escapes)."""
    return _SURROGATE.search(text) is not None


#: documents of more bytes than this are kept on disk (a spool file read on demand), not as a str in memory
SPOOL_BYTES = 4 << 20
#: plain-text files read from disk where a window lies; compressed ones are decompressed to a
#: spool file in chunks first
TEXT_SUFFIXES = (".txt", ".md", ".tex", ".py")
_CHUNK = 1 << 20


class Document:
    """One document. ``id`` is stable (it decides the split).

    Its content is either in memory (``text``, a str as read) or, for a plain-text file and
    for any document larger than ``SPOOL_BYTES``, its bytes on disk (:class:`FileBytes`):
    a window reads just its own bytes, so a 50 MB document costs the windows being scored,
    not 50 MB (a spooled document's file is unlinked at once and closed with the document).
    ``text`` always works (it reads and decodes everything with ``surrogateescape``, so
    streaming readers slice :meth:`raw_bytes` instead). Equality: same id, metadata and
    bytes; hash: the id.
    """

    __slots__ = ("id", "_text", "_raw", "domain", "source", "license")

    def __init__(
        self,
        id: str,
        text: str | None = None,
        domain: str = "",
        source: str = "",
        license: str = "",
        raw: FileBytes | None = None,
    ):
        if (text is None) == (raw is None):
            raise TypeError("a Document holds either text (str) or raw (FileBytes: its bytes on disk)")
        self.id, self._text, self._raw = id, text, raw
        self.domain, self.source, self.license = domain, source, license

    @property
    def text(self) -> str:
        """The document as a str (decoded from disk with ``surrogateescape`` for a mapped one)."""
        if self._text is not None:
            return self._text
        assert self._raw is not None  # a Document holds text or raw
        return self._raw[:].tobytes().decode("utf-8", errors="surrogateescape")

    @property
    def on_disk(self) -> bool:
        """True when the content is a file read on demand (:class:`FileBytes`), not a str in memory."""
        return self._raw is not None

    def raw_bytes(self) -> np.ndarray | FileBytes:
        """The document's bytes (:func:`text_bytes` of its text), sliceable to uint8 arrays:
        :class:`FileBytes` for a document on disk (nothing read until sliced), else a uint8
        ``[n_bytes]`` array of the encoded text."""
        if self._raw is not None:
            return self._raw
        assert self._text is not None  # a Document holds text or raw
        return np.frombuffer(text_bytes(self._text), dtype=np.uint8)

    @property
    def num_tokens(self) -> int:
        """Tokens of ``document_tokens(self)``: UTF-8 bytes + 1 (BOS)."""
        if self._raw is not None:
            return len(self._raw) + 1
        assert self._text is not None  # a Document holds text or raw
        if self._text.isascii():  # one byte per character: no copy of a long text
            return len(self._text) + 1
        return len(text_bytes(self._text)) + 1

    def __len__(self) -> int:  # truthiness: a document with no bytes is empty
        return self.num_tokens - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Document):
            return NotImplemented
        return (
            (self.id, self.domain, self.source, self.license) == (other.id, other.domain, other.source, other.license)
            and self.num_tokens == other.num_tokens
            and np.array_equal(self.raw_bytes()[:], other.raw_bytes()[:])
        )

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        where = "on disk" if self._raw is not None else "in memory"
        return f"Document(id={self.id!r}, {self.num_tokens - 1:,} bytes {where})"


class FileBytes:
    """Bytes of a file read on demand with ``os.pread``: ``fb[a:b]`` → uint8 ``[b − a]`` (a
    fresh array of just those bytes; nothing is mapped or kept), ``len(fb)`` the size.

    ``path``: a file opened per read (a folder of many documents holds no descriptors); its
    size, modification time and inode are recorded when it is loaded and checked at every
    read, so a file changed, replaced or deleted while in use is refused (DataError), never
    scored as other text under the old fingerprint. ``fileobj`` + ``offset``: a range of an
    open, already unlinked spool file (one per load, shared by its documents).
    """

    __slots__ = ("path", "fileobj", "offset", "size", "stamp")

    def __init__(self, size: int, path: Path | None = None, fileobj=None, offset: int = 0):
        self.path, self.fileobj, self.offset, self.size = path, fileobj, int(offset), int(size)
        self.stamp = _stamp(os.stat(path)) if path is not None else None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("FileBytes takes step-1 slices only")
        a, b, _ = key.indices(self.size)
        if b <= a:
            return np.zeros(0, dtype=np.uint8)
        return self._read(a, b)

    def _read(self, a: int, b: int) -> np.ndarray:
        """Bytes ``a … b − 1`` (0 <= a < b <= size) as a fresh uint8 array."""
        if self.fileobj is not None:
            return np.frombuffer(_pread_all(self.fileobj.fileno(), b - a, self.offset + a), dtype=np.uint8)
        changed = (
            f"{self.path} changed, moved or was deleted while in use (it was {self.size:,} bytes when read); "
            "read the data again"
        )
        assert self.path is not None  # FileBytes has a path or a fileobj
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise DataError(f"{changed} ({e.strerror})") from e
        try:
            if _stamp(os.fstat(fd)) != self.stamp:
                raise DataError(changed)
            buf = _pread_all(fd, b - a, a)
        except OSError as e:
            raise DataError(f"{changed} ({e.strerror})") from e
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=np.uint8)


def _stamp(st: os.stat_result) -> tuple:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            raise DataError(
                f"a document file ended early ({offset + got} of {offset + n} bytes): it changed "
                "while in use; read the data again"
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts) if len(parts) > 1 else parts[0]


class _Spool:
    """One unlinked temporary file per load holding the bytes of its spooled documents (one
    descriptor however many documents), closed when the last of them is dropped."""

    def __init__(self):
        self.file = None

    def add(self, chunks) -> FileBytes | None:
        """Append byte ``chunks``; their range as :class:`FileBytes` (None if no bytes)."""
        import tempfile

        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="fireviz-doc-")  # unlinked at once
        start = self.file.seek(0, os.SEEK_END)
        n = 0
        for c in chunks:
            self.file.write(c)
            n += len(c)
        self.file.flush()
        return FileBytes(n, fileobj=self.file, offset=start) if n else None


#: text one :func:`load_documents` call keeps in memory as str; documents past it are spooled to
#: disk (one temp file), so what a load holds in memory stays bounded whatever the source holds
IN_MEMORY_TEXT_BYTES = 256 << 20


class _Load:
    """What one :func:`load_documents` call holds: its spool file, the documents so far (at most
    ``fireviz.core.bounded.MAX_DOCUMENTS``, or ``max_documents``) and the text kept in memory
    (past ``IN_MEMORY_TEXT_BYTES`` every further document is spooled)."""

    def __init__(self, source, max_documents: int | None = None):
        self.source, self.spool, self.documents, self.in_memory = source, _Spool(), 0, 0
        self.max_documents = MAX_DOCUMENTS.value if max_documents is None else int(max_documents)
        self.raisable = max_documents is None

    def admit(self, where: str) -> None:
        """Count one more document (at ``where``). Raises: DataError past the document limit."""
        self.documents += 1
        if self.documents > self.max_documents:
            fix = (
                f"; use fewer, longer documents, or {MAX_DOCUMENTS.fix()}"
                if self.raisable
                else "; use fewer, longer documents"
            )
            raise DataError(
                f"{self.source} holds more than {self.max_documents:,} documents (at {where}), more than one "
                f"load keeps in memory{fix} (python -m fireviz prepare streams any number)"
            )


def _text_document(doc_id: str, text: str, spool: _Spool, load: _Load | None = None, **meta) -> Document:
    """A document for ``text``: in memory, or spooled to disk when larger than ``SPOOL_BYTES`` (or
    once ``load`` holds ``IN_MEMORY_TEXT_BYTES`` of text in memory)."""
    over = load is not None and load.in_memory + len(text) > IN_MEMORY_TEXT_BYTES
    if over or len(text) > SPOOL_BYTES // 4:  # at most 4 bytes a character: shorter texts cannot exceed it
        encoded = text_bytes(text)
        if over or len(encoded) > SPOOL_BYTES:
            raw = spool.add([encoded])
            return Document(doc_id, raw=raw, **meta) if raw is not None else Document(doc_id, "", **meta)
    if load is not None:
        load.in_memory += len(text)
    return Document(doc_id, text, **meta)


def _raw_is_utf8(raw: np.ndarray | FileBytes) -> bool:
    """Whether the bytes are valid UTF-8, checked in 1 MiB chunks (no full decode in memory)."""
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        for a in range(0, len(raw), _CHUNK):
            dec.decode(raw[a : a + _CHUNK].tobytes())
        dec.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def iter_jsonl(path: Path, load: _Load | None = None):
    """The documents of a JSONL file (plain, .gz or .xz), one at a time in file order, as
    :func:`load_documents` reads them (a large one spooled to disk): a file of any size streams
    in the memory of its largest line. Bounded while streaming, before a line is parsed: a line
    longer than ``fireviz.core.bounded.MAX_LINE_BYTES``, more decompressed bytes than
    ``MAX_DECOMPRESSED_BYTES``, a line that parses into too many values; with ``load`` (a
    :func:`load_documents` call), more documents than it may hold.
    Raises: DataError naming the file and line, the limit and how to raise it."""
    spool = load.spool if load is not None else _Spool()
    for lineno, raw in iter_lines(
        path,
        max_line_bytes=MAX_LINE_BYTES,
        max_total_bytes=MAX_DECOMPRESSED_BYTES,
        error=DataError,
        what="JSON-lines corpus",
    ):
        if not raw.strip():
            continue
        if load is not None:
            load.admit(f"{path}:{lineno}")
        line = raw.decode("utf-8", errors="surrogateescape")  # bytes that are not UTF-8 survive (text_bytes)
        del raw
        check_json_shape(line, f"{path}:{lineno}", DataError, max_depth=None)  # too deep: RecursionError below
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, or a 5000-digit integer
            raise DataError(
                f"{path}:{lineno} is not valid JSON ({getattr(e, 'msg', e)}); each line must be one "
                "JSON object with a 'text' field"
            ) from e
        del line
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError(
                f"{path}:{lineno} has no string 'text' field; each line must be a "
                'JSON object like {"id": ..., "text": ...}'
            )
        yield _text_document(
            str(obj.get("id", f"{path.name}#{lineno}")),
            obj["text"],
            spool,
            load,
            domain=str(obj.get("domain", "")),
            source=str(obj.get("source", "")),
            license=str(obj.get("license", "")),
        )
        del obj  # a spooled document's str goes now, not at the next line


def _is_text(path: Path) -> bool:
    """A plain or compressed text file (``.txt``, ``.md``, ``.tex``, ``.py``, or ``.txt.gz`` / ``.txt.xz``)."""
    name = path.name
    return path.suffix in TEXT_SUFFIXES or any(name.endswith(t + c) for t in TEXT_SUFFIXES for c in (".gz", ".xz"))


def _is_jsonl(path: Path) -> bool:
    name = path.name
    return any(name.endswith(s) for s in (".jsonl", ".jsonl.gz", ".jsonl.xz", ".json.gz", ".json.xz"))


def load_documents(source: str | os.PathLike, max_documents: int | None = None) -> list[Document]:
    """Read documents from a bundled domain or a path.

    Args:
      source: ``"prose" | "latex" | "code"`` (bundled), a JSONL file (plain, .gz or .xz;
        one object per line with a ``text`` field, optional ``id``), a .txt file (one
        document, id = file name; .md, .tex, .py and .gz/.xz-compressed text too), or a folder of such files
        (recursively, sorted; a text file's id is then its path inside the folder).
      max_documents: most documents held (default ``fireviz.core.bounded.MAX_DOCUMENTS``).
    Returns: documents with non-empty text, in file order.
    Raises: DataError if the source does not exist, is unreadable, or holds no text; or when it
      crosses a limit while it is read (``fireviz.core.bounded``: line length, decompressed bytes,
      documents), naming the limit and the setting that raises it. Memory: at most
      ``IN_MEMORY_TEXT_BYTES`` of text (the rest spooled to one temp file) and ~250 bytes per document.
    """
    load = _Load(source, max_documents)
    docs = _load(source, load)
    docs = [d for d in docs if len(d)]
    if not docs:
        raise DataError(f"{source} contains no text (no documents with a non-empty 'text')")
    n_raw = sum(1 for d in docs if (not _raw_is_utf8(d.raw_bytes()) if d.on_disk else has_raw_bytes(d.text)))
    if n_raw:
        warnings.warn(
            f"{n_raw} of {len(docs)} document(s) in {source} are not valid UTF-8 text; they are tokenized "
            "as the raw bytes they hold (byte-level tokenizer)",
            RawBytesWarning,
            stacklevel=2,
        )
    return docs


def _load(source: str | os.PathLike, load: _Load) -> list[Document]:
    """The documents of ``source`` (see :func:`load_documents`), empty ones included, counted in ``load``."""
    if isinstance(source, str) and source in DOMAINS:
        path = DATA_DIR / f"{source}.jsonl.xz"
        if not path.exists():
            raise DataError(f"bundled corpus {path} is missing; restore data/ from the repository")
    else:
        path = Path(source)
        if not path.exists():
            hint = (
                f"use one of {', '.join(DOMAINS)} or"
                if isinstance(source, str) and "/" not in source and "." not in source
                else "give"
            )
            raise DataError(
                f"data source {str(source)!r} not found; {hint} a path to .jsonl[.gz|.xz], .txt or a folder"
            )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and (_is_jsonl(p) or _is_text(p)))
        docs = []
        for p in files:
            if p.stat().st_size == 0:  # an empty file (e.g. __init__.py) adds no text; it does not spoil the folder
                continue
            for d in _load(p, load):
                if not _is_jsonl(p):  # a text file's id is its path in the folder: a/x.txt and b/x.txt differ
                    d.id = p.relative_to(path).as_posix()
                docs.append(d)
    elif _is_jsonl(path):
        if not stat.S_ISREG(path.stat().st_mode):  # a named pipe would be waited on forever
            raise DataError(f"{path} is not a regular file (a pipe, device or special file); give a JSONL file")
        docs = list(iter_jsonl(path, load))
    elif path.suffix in TEXT_SUFFIXES + (".gz", ".xz"):
        try:  # streamed: a plain file is read where a window lies, a compressed one spooled in chunks
            if not stat.S_ISREG(path.stat().st_mode):
                raise DataError(f"{path} is not a regular file (a pipe, device or special file); give a text file")
            load.admit(str(path))
            if path.suffix in TEXT_SUFFIXES:
                size = path.stat().st_size
                raw = FileBytes(size, path=path.resolve()) if size else None
            else:  # decompressed piece by piece into the spool, counted: a bomb costs one piece
                with (lzma.open if path.suffix == ".xz" else gzip.open)(path, "rb") as f:
                    raw = load.spool.add(read_bounded(f, MAX_DECOMPRESSED_BYTES, str(path), DataError, _CHUNK))
            docs = [Document(path.name, raw=raw)] if raw is not None else []
        except DataError:
            raise
        except (*DECOMPRESSION_ERRORS, ValueError) as e:
            raise DataError(f"cannot read {path} as text: {e}") from e
    else:
        raise DataError(f"unsupported data file {path.name!r}; use .jsonl, .jsonl.gz, .jsonl.xz or .txt")
    return docs


def is_validation(doc_id: str, fraction: float = VALIDATION_FRACTION) -> bool:
    """Deterministic split rule: sha256(id) as a fraction of 2^64 < fraction."""
    h = int.from_bytes(hashlib.sha256(text_bytes(doc_id)).digest()[:8], "big")
    return h / 2.0**64 < fraction


def split_documents(docs: list[Document], split: str, fraction: float = VALIDATION_FRACTION) -> list[Document]:
    """The ``"train"`` or ``"validation"`` documents of ``docs`` (order kept).

    Raises: ValueError for an unknown split name; DataError if the split is empty.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} (got {split!r})")
    want = split == "validation"
    out = [d for d in docs if is_validation(d.id, fraction) == want]
    if not out:
        raise DataError(
            f"the {split} split of these {len(docs)} documents is empty; add documents "
            f"(the split puts ~{fraction:.0%} of ids in validation)"
        )
    return out


def document_tokens(doc: Document) -> torch.Tensor:
    """``[BOS] + UTF-8 bytes`` of a document, int64 ``[doc.num_tokens]``."""
    return torch.cat([torch.tensor([BOS_ID], dtype=torch.int64), torch.from_numpy(doc.raw_bytes()[:].astype(np.int64))])


class DocumentTokens:
    """``[BOS] + bytes`` of a document, sliceable like :func:`document_tokens`, holding only
    the document's bytes (``Document.raw_bytes``; BOS is added when a slice starts at 0).

    ``tokens[a:b]`` → int64 ``[b − a]`` (a step-1 slice); ``len(tokens)`` = ``doc.num_tokens``.
    A window copies out only its own tokens: an in-memory document costs one byte per token
    (not 8 of int64), a document on disk (a text file, a spooled large one) nothing until a
    window reads its bytes.
    """

    def __init__(self, doc: Document):
        self.raw = doc.raw_bytes()  # a document on disk stays there: slices read only their pages

    def __len__(self) -> int:
        return len(self.raw) + 1

    def __getitem__(self, key: slice) -> torch.Tensor:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("DocumentTokens takes step-1 slices only, e.g. tokens[start:start + n]")
        a, b, _ = key.indices(len(self))
        b = max(a, b)
        out = np.empty(b - a, dtype=np.int64)
        if b > a:
            if a == 0:
                out[0] = BOS_ID
                out[1:] = self.raw[: b - 1]
            else:
                out[:] = self.raw[a - 1 : b - 1]
        return torch.from_numpy(out)


def document_sha256(doc: Document) -> bytes:
    """sha256 (raw 32 bytes) of a document's bytes, read in 1 MiB chunks (a document on disk is
    never held whole)."""
    raw, inner = doc.raw_bytes(), hashlib.sha256()
    for a in range(0, len(raw), _CHUNK):  # the same digest as of the whole bytes, in chunks
        inner.update(raw[a : a + _CHUNK])  # type: ignore[arg-type]  # an ndarray is a buffer
    return inner.digest()


def fingerprint_entry(doc_id: str, digest: bytes) -> bytes:
    """What :func:`data_fingerprint` hashes for one document: its id, NUL, the sha256 of its bytes
    (:func:`document_sha256`). Token shards build the same fingerprint from these entries."""
    return text_bytes(doc_id) + b"\0" + digest


def data_fingerprint(docs: list[Document]) -> str:
    """sha256 over ids and texts in order: identifies exactly which data a number came from."""
    h = hashlib.sha256()
    for d in docs:
        h.update(fingerprint_entry(d.id, document_sha256(d)))
    return h.hexdigest()


class TokenStream:
    """Concatenated ``[BOS] + bytes`` of documents, stored as uint16, for training windows.

    ``window(start, length)`` returns int64 ``[length]``; ``num_tokens`` total tokens.
    Raises: DataError if the stream is shorter than one window of ``min_tokens``.
    """

    def __init__(self, docs: list[Document], min_tokens: int = 2):
        parts = []
        for d in sorted(docs, key=lambda d: d.id):
            b = np.asarray(d.raw_bytes()[:]).astype(np.uint16)
            parts.append(np.concatenate([np.array([BOS_ID], dtype=np.uint16), b]))
        self.tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        if len(self.tokens) < min_tokens:
            raise DataError(
                f"the data holds {len(self.tokens)} tokens, fewer than one window of {min_tokens}; "
                "use more or longer documents, or a shorter seq_len"
            )

    @property
    def num_tokens(self) -> int:
        """Tokens (bytes plus one BOS per document) in the concatenated stream."""
        return int(len(self.tokens))

    def batch(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """Windows at ``starts [batch]`` of ``length`` tokens → int64 ``[batch, length]``."""
        idx = starts.numpy()[:, None] + np.arange(length)[None, :]
        return torch.from_numpy(self.tokens[idx].astype(np.int64))
