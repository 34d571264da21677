"""Tokenizers for evaluation text: fireviz's bytes, or a published model's own tokenizer.

Every tokenizer turns one document into token ids and, for each token, the byte offset (into
the document's UTF-8 bytes) where its text ends, so that bits per byte can be taken over the
bytes the scored targets cover and models with different tokenizers pair on one text
(issue #36):

* :data:`BYTE_TOKENIZER` — fireviz's own: ``[BOS=256] + bytes``, one token per byte
  (``fireviz.data.corpus.document_tokens``).
* :class:`HFTokenizer` — a Hugging Face tokenizer (``transformers.AutoTokenizer``, a fast
  tokenizer with offset mapping). Its ids are the tokenizer's own; byte ends come from the
  character offsets it reports (a token inside a multi-byte character ends where that
  character ends). Special tokens (BOS) cover no bytes; the text of a special token inside a
  document ("<s>" in LaTeX) is tokenized as text. Bytes that are not UTF-8 reach the model as
  U+FFFD and count as the one byte each they are.

BOS conventions (``bos`` of an evaluation, :data:`BOS_MODES`): ``None`` — the model's own
(what its tokenizer adds with ``add_special_tokens=True``; fireviz checkpoints: BOS 256 at each
document start); ``"document"`` — BOS at each document's start, whatever the tokenizer does
by default; ``"window"`` — BOS as the first token of *every* window (the window's first,
context-only position is replaced by BOS); ``"none"`` — no BOS anywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fireviz.core.bounded import Limit, MiB
from fireviz.core.files import check_json_shape
from fireviz.data.corpus import BOS_ID, DataError, Document, is_validation
from fireviz.data.sources import iter_documents

#: BOS conventions of an evaluation besides the model's own (None); see the module docstring
BOS_MODES = ("document", "window", "none")


@dataclass(frozen=True)
class TokenizedDocument:
    """One document in a tokenizer's tokens.

    Attributes: ``ids`` int64 ``[T]`` token ids (BOS first where the convention adds one);
      ``byte_ends`` int64 ``[T]``: the byte offset (in the document's UTF-8 bytes) where each
      token's text ends, non-decreasing (BOS: 0). Token ``t`` covers bytes
      ``byte_ends[t − 1] … byte_ends[t]`` (``byte_ends[−1]`` read as 0).
    """

    ids: np.ndarray
    byte_ends: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def token_bytes(self) -> np.ndarray:
        """int64 ``[T]``: the bytes each token covers (0 for BOS and other special tokens)."""
        return np.diff(self.byte_ends, prepend=0)


def _utf8_ends(text: str) -> np.ndarray:
    """int64 ``[len(text) + 1]``: the UTF-8 byte offset of every character boundary (a lone
    surrogate, as ``surrogateescape`` decodes a non-UTF-8 byte, counts as the one byte it was)."""
    cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    size = np.where(cps < 0x80, 1, np.where(cps < 0x800, 2, np.where(cps < 0x10000, 3, 4)))
    size = np.where((cps >= 0xDC80) & (cps <= 0xDCFF), 1, size)  # surrogateescape: one raw byte
    return np.concatenate([[0], np.cumsum(size)]).astype(np.int64)


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


class ByteTokenizer:
    """fireviz's byte-level tokenizer: ``[BOS=256] + UTF-8 bytes``; key ``"byte"``."""

    name = "byte"
    key = "byte"
    bos_token_id = BOS_ID
    adds_bos = True
    #: ids it produces: 256 bytes and BOS
    num_ids = BOS_ID + 1
    #: no files: it is part of fireviz
    files: tuple[Path, ...] = ()

    def encode(self, doc: Document, bos: str | None = None) -> TokenizedDocument:
        """``doc`` as ``[BOS] + bytes`` (``bos`` ``"none"``: bytes only). Raises: DataError for an
        unknown ``bos``."""
        raw = np.asarray(doc.raw_bytes()[:], dtype=np.int64)
        ends = np.arange(1, len(raw) + 1, dtype=np.int64)
        if _check_bos(bos) == "none":
            return TokenizedDocument(raw, ends)
        return TokenizedDocument(np.concatenate([[BOS_ID], raw]), np.concatenate([[0], ends]))

    def ids(self, doc: Document) -> np.ndarray:
        """``encode(doc).ids`` (``[BOS] + bytes``) as uint16, without the byte ends: what token
        shards store, at 2 bytes a token (a document read from disk is read once)."""
        raw = doc.raw_bytes()[:]
        out = np.empty(len(raw) + 1, dtype=np.uint16)
        out[0] = BOS_ID
        out[1:] = raw
        return out


BYTE_TOKENIZER = ByteTokenizer()


def _check_bos(bos: str | None) -> str | None:
    if bos is not None and bos not in BOS_MODES:
        raise DataError(f"bos must be one of {', '.join(BOS_MODES)} or None for the model's own (got {bos!r})")
    return bos


#: Largest tokenizer file read (bytes): today's largest tokenizer.json (Gemma 3's) is ~33 MB.
#: Raise with ``FIREVIZ_MAX_TOKENIZER_MB``.
MAX_TOKENIZER_FILE_BYTES = Limit(64 * MiB, "FIREVIZ_MAX_TOKENIZER_MB", MiB, "MiB")
#: Most JSON values a tokenizer file may parse into (vocabulary entries and merges: Llama 3's
#: vocabulary and merges are ~1,000,000, Gemma 3's 262k vocabulary and merges ~1,900,000): the
#: Rust tokenizers library spends ~370 bytes a value (3 million entries took 1.1 GB).
#: Raise with ``FIREVIZ_MAX_TOKENIZER_VALUES``.
MAX_TOKENIZER_VALUES = Limit(2_500_000, "FIREVIZ_MAX_TOKENIZER_VALUES", 1, "values")
#: what a tokenizer must encode to at least one token when it is loaded (ASCII, accents, CJK, emoji)
PROBE_TEXT = "The quick brown fox, 0123456789. Éé ü 東京 😀"


def check_tokenizer_files(files, name: str = "tokenizer") -> None:
    """Refuse tokenizer files that would cost more to load than any real tokenizer, before
    transformers or tokenizers parses them: each at most ``MAX_TOKENIZER_FILE_BYTES``, and a JSON
    one (tokenizer.json, its config) nesting and holding values within ``MAX_TOKENIZER_VALUES``
    (counted by ``fireviz.core.bounded.check_json_shape``, without parsing).
    Raises: DataError naming the file and the limit."""
    for f in files:
        f = Path(f)
        try:
            size = f.stat().st_size
            if size > MAX_TOKENIZER_FILE_BYTES.value:
                raise DataError(
                    f"{name}: {f} is {size:,} bytes, more than the {MAX_TOKENIZER_FILE_BYTES.said()} fireviz reads for "
                    "a tokenizer file (the largest published tokenizer.json is ~33 MB); use another tokenizer, or "
                    f"{MAX_TOKENIZER_FILE_BYTES.fix()}"
                )
            if f.suffix == ".json":
                text = f.read_bytes().decode("utf-8", errors="replace")
                check_json_shape(
                    text,
                    f"{name}: {f}",
                    DataError,
                    max_values=MAX_TOKENIZER_VALUES.value,
                    fix=f"use another tokenizer, or {MAX_TOKENIZER_VALUES.fix()}",
                )
        except OSError as e:
            raise DataError(f"{name}: cannot read {f}: {e}") from e


class HFTokenizer:
    """A Hugging Face fast tokenizer (``transformers.PreTrainedTokenizerFast``) for evaluation.

    Args: ``tokenizer`` the loaded tokenizer; ``key`` what tells it from other tokenizers (the
      sha256 of its files); ``name`` for messages; ``files`` the files it was loaded from (what a
      shard folder and a checkpoint copy to store it).
    Raises: DataError for a tokenizer without offset mapping (a slow, Python tokenizer).
    """

    def __init__(self, tokenizer: Any, key: str, name: str = "tokenizer", files: tuple[Path, ...] = ()):
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(
                f"{name}: the tokenizer is not a fast (Rust) tokenizer, so it reports no byte offsets; "
                "give a model folder with a tokenizer.json"
            )
        self._tok, self.key, self.name, self.files = tokenizer, key, name, tuple(files)
        self.bos_token_id: int | None = tokenizer.bos_token_id
        probe = tokenizer("a", add_special_tokens=True)["input_ids"]
        self.adds_bos = bool(self.bos_token_id is not None and probe and probe[0] == self.bos_token_id)
        self.unk_token_id: int | None = getattr(tokenizer, "unk_token_id", None)
        if self.unk_token_id is None:  # a bare tokenizer.json names it in its model only
            unk = getattr(tokenizer.backend_tokenizer.model, "unk_token", None)
            self.unk_token_id = tokenizer.backend_tokenizer.token_to_id(unk) if isinstance(unk, str) else None
        try:
            self._check_encodes(PROBE_TEXT, "a probe text of letters and digits")
        except DataError:
            raise
        except Exception as e:  # a tokenizer that fails on plain text (WordLevel without [UNK]…)
            raise DataError(f"{name}: the tokenizer cannot encode plain text ({type(e).__name__}: {e})") from e

    def _check_encodes(self, text: str, what: str) -> None:
        """Refuse (DataError) a tokenizer that encodes ``text`` (not blank) to no token at all: it
        would be scored on, or trained from, nothing (a small word-level vocabulary that makes
        the probe unknown tokens is let through here; each document is checked as it is encoded)."""
        ids = self._text_ids(text)
        if not len(ids):
            self.check_ids(ids, text, what)

    def check_ids(self, ids: np.ndarray, text: str | None, what: str) -> None:
        """Refuse (DataError, one line) ``ids`` (this tokenizer's, special tokens excluded) that
        hold no token, or only its unknown token, for a ``text`` that is not blank (``text``
        None: not known to be blank)."""
        empty = len(ids) == 0
        unknown = not empty and self.unk_token_id is not None and bool(np.all(ids == self.unk_token_id))
        if (empty or unknown) and (text is None or text.strip()):
            said = "no token" if empty else f"only its unknown token (id {self.unk_token_id})"
            raise DataError(
                f"{self.name}: the tokenizer encodes {what} to {said}: it cannot encode this text's bytes (its "
                "vocabulary lacks them and it has no byte fallback); use a byte-level tokenizer (byte, or one "
                "trained with python -m fireviz tokenizer train)"
            )

    def _text_ids(self, text: str) -> np.ndarray:
        # the Rust tokenizer itself, as transformers calls it with split_special_tokens (a literal "<s>"
        # is text): only the ids become Python objects, not every field of a BatchEncoding
        backend = self._tok.backend_tokenizer
        before = backend.encode_special_tokens
        backend.encode_special_tokens = True
        try:
            enc = backend.encode(self._readable(text), add_special_tokens=False)
        finally:
            backend.encode_special_tokens = before
        out = np.asarray(enc.ids, dtype=np.uint32)
        del enc
        return out

    @property
    def vocab_size(self) -> int:
        """Ids text can encode to: the base vocabulary (added special tokens not counted, as text
        never becomes them here)."""
        return int(self._tok.vocab_size)

    @property
    def num_ids(self) -> int:
        """Ids it can produce: the base vocabulary and its added (special) tokens."""
        return int(len(self._tok))

    @staticmethod
    def _readable(text: str) -> str:
        # bytes that are not UTF-8 (decoded as lone surrogates) reach the model as U+FFFD, one
        # character each, so character offsets still map to the document's own bytes
        return (
            "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text) if _has_surrogates(text) else text
        )

    def ids(self, doc: Document) -> np.ndarray:
        """``encode(doc).ids`` (the model's own BOS convention) as uint32, without offsets: what
        token shards store (no per-token offset list is built).
        Raises: DataError for a document that is not blank encoded to no token or unknown tokens only."""
        text = doc.text
        out = self._text_ids(text)
        if len(out) == 0 or (self.unk_token_id is not None and out[0] == self.unk_token_id):
            self.check_ids(out, text, f"document {doc.id!r}")
        del text
        if self.adds_bos:
            out = np.concatenate([np.asarray([self.bos_token_id], dtype=np.uint32), out])
        return out

    def encode(self, doc: Document, bos: str | None = None) -> TokenizedDocument:
        """``doc.text`` in this tokenizer's ids, with byte ends; BOS first when the convention
        (``bos``, see the module docstring) adds one (``"window"`` starts documents with BOS too).
        Raises: DataError for an unknown ``bos``, a BOS asked of a tokenizer that has none, or a
        document that is not blank encoded to no token or unknown tokens only (:meth:`check_ids`)."""
        mode = _check_bos(bos)
        text = doc.text
        readable = self._readable(text)
        # split_special_tokens: a literal "<s>" in the text is text, never a control token
        enc = self._tok(
            readable, add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True, verbose=False
        )
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        if len(ids) == 0 or (self.unk_token_id is not None and ids[0] == self.unk_token_id):
            self.check_ids(ids, text, f"document {doc.id!r}")
        char_ends = np.asarray([e for _, e in enc["offset_mapping"]], dtype=np.int64).reshape(-1)
        ends = _utf8_ends(text)[char_ends] if len(ids) else np.zeros(0, dtype=np.int64)
        ends = np.maximum.accumulate(ends) if len(ends) else ends
        add = self.adds_bos if mode is None else mode in ("document", "window")
        if add:
            if self.bos_token_id is None:
                raise DataError(
                    f"{self.name} has no BOS token, so bos={mode!r} cannot be applied; use the model's own "
                    "convention (no --bos) or --bos none"
                )
            ids = np.concatenate([[self.bos_token_id], ids]).astype(np.int64)
            ends = np.concatenate([[0], ends]).astype(np.int64)
        return TokenizedDocument(ids, ends)


def bos_description(tokenizer, bos: str | None) -> str:
    """The BOS convention a checkpoint was scored with, in words (saved as a result's ``settings.bos``):
    ``tokenizer`` (:data:`BYTE_TOKENIZER` or an :class:`HFTokenizer`) under ``bos`` (:data:`BOS_MODES`
    or None for the model's own)."""
    bos_id = tokenizer.bos_token_id
    token = "BOS (id 256)" if tokenizer.key == "byte" else f"BOS (id {bos_id})"
    own = tokenizer.adds_bos
    if bos == "none" or (bos is None and not own):
        start = "no BOS: each document's tokens alone" + (" (its tokenizer adds none)" if bos is None else "")
    elif bos == "window":
        start = f"{token} first in every window (the window's first, context-only position replaced by it)"
    else:
        start = f"{token} at each document's start" + (
            " (the model's own convention)" if bos is None else " (asked for: bos document)"
        )
    return start + "; windows never cross documents; the first token of a window is context only"


#: files_sha256 per file state (path, size, modification time, inode of each file)
_FILES_SHA256: dict[tuple, str] = {}


def files_sha256(paths) -> str:
    """sha256 (hex) over ``(name, bytes)`` of each file, in name order (a published model's
    ``sha256``), read in 1 MiB chunks and memoized per file state: asking again for unchanged
    files costs a ``stat`` each, not a read of gigabytes of weights.
    Raises: OSError for a file that cannot be read."""
    files = sorted((Path(p) for p in paths), key=lambda p: p.name)
    state = tuple((str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino) for p in files for st in (p.stat(),))
    if state not in _FILES_SHA256:
        h = hashlib.sha256()
        for p in files:
            h.update(p.name.encode())
            h.update(b"\0")
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
        _FILES_SHA256[state] = h.hexdigest()
    return _FILES_SHA256[state]


def stored_tokenizer_problem(files, key: str) -> str | None:
    """What is wrong with a stored copy of a tokenizer (a shard folder's ``tokenizer/``, a
    checkpoint's files beside config.json) whose identity should be ``key`` (:func:`files_sha256`):
    ``"holds no tokenizer files"``, ``"its tokenizer files hash to <sha256>…"``, or None when they
    are the tokenizer. Raises: OSError for a file that cannot be read."""
    files = list(files)
    if not files:
        return "holds no tokenizer files"
    found = files_sha256(files)
    return None if found == key else f"its tokenizer files hash to {found[:12]}…"


#: special tokens of a tokenizer fireviz trains: BOS, EOS
TRAINED_SPECIALS = ("<s>", "</s>")


#: documents whose tokens per byte ``train_bpe`` reports (the first ones it learned from)
TOKENS_PER_BYTE_SAMPLE = 2000


def _learned_documents(data, split: str, max_documents: int | None, seen: list[Document]):
    """The documents ``train_bpe`` learns from, one at a time: each source streamed
    (``fireviz.data.sources.iter_documents``), its validation documents left out unless ``split``
    is ``"all"``; ``Document`` s as given. The first ``TOKENS_PER_BYTE_SAMPLE`` are kept in ``seen``."""
    n = 0
    for source in [data] if isinstance(data, (str, Path)) else list(data):
        docs = [source] if isinstance(source, Document) else iter_documents(source)
        for d in docs:
            if split != "all" and not isinstance(source, Document) and is_validation(d.id):
                continue
            if max_documents is not None and n >= max_documents:
                return
            n += 1
            if len(seen) < TOKENS_PER_BYTE_SAMPLE:
                seen.append(d)
            yield d


def train_bpe(
    data, vocab_size: int, out, split: str = "train", add_bos: bool = True, max_documents: int | None = None
) -> dict:
    """Train a byte-level BPE tokenizer (Hugging Face ``tokenizers``; GPT-2's byte-to-character
    map, so every UTF-8 text encodes and decodes back exactly, whatever it holds) on the documents
    of ``data`` and save it as a transformers tokenizer folder at ``out``. Its special tokens are
    part of ``vocab_size``: BOS ``<s>`` (id 0, added at each text's start unless ``add_bos`` is
    False, as GPT-2's tokenizer adds none) and EOS ``</s>`` (id 1).

    Args: ``data`` a source ``fireviz.data.sources.iter_documents`` reads (a bundled domain, JSONL,
      text or Parquet files or folders, ``hf:<dataset>``; streamed, never held whole), or a list of
      them, or a list of ``Document`` (learned as given); ``vocab_size`` tokens (>= 260: the 256
      bytes, the two specials and some merges); ``split`` ``"train"`` (default: the validation
      documents are not learned) or ``"all"``; ``max_documents`` the first N learned documents only.
    Returns: ``{"vocab_size", "documents", "bytes", "tokens_per_byte"}``; tokens per byte on the
      first ``TOKENS_PER_BYTE_SAMPLE`` documents learned.
    Raises: ValueError for a vocabulary below 260; DataError for data that does not load or no
      document to learn from; OSError when ``out`` cannot be written.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 260:
        raise ValueError(
            f"--vocab-size must be an integer >= 260 (the 256 bytes, 2 specials, merges); got {vocab_size!r}"
        )
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ValueError(f"--max-documents must be a positive integer (got {max_documents!r})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TRAINED_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    seen: list[Document] = []
    counts = {"documents": 0, "bytes": 0}

    def texts():
        for d in _learned_documents(data, split, max_documents, seen):
            counts["documents"] += 1
            counts["bytes"] += len(d)
            yield d.text

    tok.train_from_iterator(texts(), trainer)
    if not counts["documents"]:
        raise DataError(f"no documents to learn from in {data!r} ({split} split)")
    if add_bos:
        bos = tok.token_to_id(TRAINED_SPECIALS[0])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=TRAINED_SPECIALS[0], eos_token=TRAINED_SPECIALS[1])
    Path(out).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    sample_bytes = sum(len(d) for d in seen)
    sample_tokens = sum(len(tok.encode(d.text, add_special_tokens=False).ids) for d in seen)
    return {
        "vocab_size": tok.get_vocab_size(),
        "documents": counts["documents"],
        "bytes": counts["bytes"],
        "tokens_per_byte": sample_tokens / max(sample_bytes, 1),
    }


__all__ = [
    "BOS_MODES",
    "BYTE_TOKENIZER",
    "ByteTokenizer",
    "HFTokenizer",
    "TokenizedDocument",
    "bos_description",
    "files_sha256",
    "stored_tokenizer_problem",
    "train_bpe",
]
