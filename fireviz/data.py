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
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .model import BOS_ID

DOMAINS = ("prose", "latex", "code")
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
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
    for ch in err.object[err.start:err.end]:
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


@dataclass(frozen=True)
class Document:
    """One text document. ``id`` is stable (it decides the split); ``text`` is str."""

    id: str
    text: str
    domain: str = ""
    source: str = ""
    license: str = ""

    @property
    def num_tokens(self) -> int:
        """Tokens of ``document_tokens(self)``: UTF-8 bytes + 1 (BOS)."""
        if self.text.isascii():  # one byte per character: no copy of a long text
            return len(self.text) + 1
        return len(text_bytes(self.text)) + 1


def _open_text(path: Path):
    # surrogateescape: bytes that are not UTF-8 survive as U+DC80…U+DCFF (see text_bytes)
    if path.suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8", errors="surrogateescape")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape")
    return open(path, "r", encoding="utf-8", errors="surrogateescape")


def _read_jsonl(path: Path) -> list[Document]:
    docs = []
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError) as e:  # JSONDecodeError, or a 5000-digit integer
                    raise DataError(f"{path}:{lineno} is not valid JSON ({getattr(e, 'msg', e)}); each line must be one "
                                    "JSON object with a 'text' field") from e
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise DataError(f"{path}:{lineno} has no string 'text' field; each line must be a "
                                    "JSON object like {\"id\": ..., \"text\": ...}")
                docs.append(Document(id=str(obj.get("id", f"{path.name}#{lineno}")), text=obj["text"],
                                     domain=str(obj.get("domain", "")), source=str(obj.get("source", "")),
                                     license=str(obj.get("license", ""))))
    except (OSError, EOFError, lzma.LZMAError, zlib.error, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    return docs


def _is_jsonl(path: Path) -> bool:
    name = path.name
    return any(name.endswith(s) for s in (".jsonl", ".jsonl.gz", ".jsonl.xz", ".json.gz", ".json.xz"))


def load_documents(source: str | Path) -> list[Document]:
    """Read documents from a bundled domain or a path.

    Args:
      source: ``"prose" | "latex" | "code"`` (bundled), a JSONL file (plain, .gz or .xz;
        one object per line with a ``text`` field, optional ``id``), a .txt file (one
        document, id = file name), or a folder of such files (recursively, sorted).
    Returns: documents with non-empty text, in file order.
    Raises: DataError if the source does not exist, is unreadable, or holds no text.
    """
    if isinstance(source, str) and source in DOMAINS:
        path = DATA_DIR / f"{source}.jsonl.xz"
        if not path.exists():
            raise DataError(f"bundled corpus {path} is missing; restore data/ from the repository")
    else:
        path = Path(source)
        if not path.exists():
            hint = f"use one of {', '.join(DOMAINS)} or" if isinstance(source, str) and "/" not in source \
                and "." not in source else "give"
            raise DataError(f"data source {str(source)!r} not found; {hint} a path to .jsonl[.gz|.xz], .txt or a folder")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and (_is_jsonl(p) or p.suffix == ".txt"))
        docs = [d for p in files for d in load_documents(p)] if files else []
    elif _is_jsonl(path):
        docs = _read_jsonl(path)
    elif path.suffix in (".txt", ".gz", ".xz", ".md", ".tex", ".py"):
        try:
            with _open_text(path) as f:
                docs = [Document(id=path.name, text=f.read())]
        except (OSError, EOFError, lzma.LZMAError, zlib.error, UnicodeDecodeError) as e:
            raise DataError(f"cannot read {path} as text: {e}") from e
    else:
        raise DataError(f"unsupported data file {path.name!r}; use .jsonl, .jsonl.gz, .jsonl.xz or .txt")
    docs = [d for d in docs if d.text]
    if not docs:
        raise DataError(f"{source} contains no text (no documents with a non-empty 'text')")
    raw = sum(1 for d in docs if has_raw_bytes(d.text))
    if raw:
        warnings.warn(f"{raw} of {len(docs)} document(s) in {source} are not valid UTF-8 text; they are tokenized "
                      "as the raw bytes they hold (byte-level tokenizer)", RawBytesWarning, stacklevel=2)
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
        raise DataError(f"the {split} split of these {len(docs)} documents is empty; add documents "
                        f"(the split puts ~{fraction:.0%} of ids in validation)")
    return out


def encode_bytes(text: str) -> torch.Tensor:
    """The bytes of ``text`` (:func:`text_bytes`) as int64 token ids ``[n_bytes]`` (no BOS)."""
    return torch.from_numpy(np.frombuffer(text_bytes(text), dtype=np.uint8).astype(np.int64))


def document_tokens(doc: Document) -> torch.Tensor:
    """``[BOS] + UTF-8 bytes`` of a document, int64 ``[doc.num_tokens]``."""
    return torch.cat([torch.tensor([BOS_ID], dtype=torch.int64), encode_bytes(doc.text)])


class DocumentTokens:
    """``[BOS] + bytes`` of a document, sliceable like :func:`document_tokens`, in one byte
    per token (the bytes themselves; BOS is added when a slice starts at position 0).

    ``tokens[a:b]`` → int64 ``[b − a]`` (a step-1 slice); ``len(tokens)`` = ``doc.num_tokens``.
    A window copies out only its own tokens, so a 50 MB document costs 50 MB, not 8 bytes
    per token of int64.
    """

    def __init__(self, doc: Document):
        self.raw = np.frombuffer(text_bytes(doc.text), dtype=np.uint8)

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
                out[:] = self.raw[a - 1: b - 1]
        return torch.from_numpy(out)


def data_fingerprint(docs: list[Document]) -> str:
    """sha256 over ids and texts in order: identifies exactly which data a number came from."""
    h = hashlib.sha256()
    for d in docs:
        h.update(text_bytes(d.id) + b"\0" + hashlib.sha256(text_bytes(d.text)).digest())
    return h.hexdigest()


class TokenStream:
    """Concatenated ``[BOS] + bytes`` of documents, stored as uint16, for training windows.

    ``window(start, length)`` returns int64 ``[length]``; ``num_tokens`` total tokens.
    Raises: DataError if the stream is shorter than one window of ``min_tokens``.
    """

    def __init__(self, docs: list[Document], min_tokens: int = 2):
        parts = []
        for d in sorted(docs, key=lambda d: d.id):
            b = np.frombuffer(text_bytes(d.text), dtype=np.uint8).astype(np.uint16)
            parts.append(np.concatenate([np.array([BOS_ID], dtype=np.uint16), b]))
        self.tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        if len(self.tokens) < min_tokens:
            raise DataError(f"the data holds {len(self.tokens)} tokens, fewer than one window of {min_tokens}; "
                            "use more or longer documents, or a shorter seq_len")

    @property
    def num_tokens(self) -> int:
        """Tokens (bytes plus one BOS per document) in the concatenated stream."""
        return int(len(self.tokens))

    def batch(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """Windows at ``starts [batch]`` of ``length`` tokens → int64 ``[batch, length]``."""
        idx = starts.numpy()[:, None] + np.arange(length)[None, :]
        return torch.from_numpy(self.tokens[idx].astype(np.int64))
