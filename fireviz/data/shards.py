"""Token shards: a corpus tokenized once (``python -m fireviz prepare``), read by memory map.

The layout of a shard folder (issue #37; the idea of nanoGPT's and modded-nanogpt's ``.bin``
shards — a small header, then the tokens — with a document index beside them):

* ``prepare.json`` — the settings the folder was prepared with (source, tokenizer sha256,
  chunk size), written first: a resumed ``prepare`` must give the same ones;
* ``train-NNNNN.bin`` / ``validation-NNNNN.bin`` — one pair per chunk of the source (about
  ``chunk_bytes`` of its text, whole documents, in source order): a 64-byte header
  (:data:`HEADER`: magic ``FVZTOKS\\0``, format version, bytes per token, tokens, documents, the
  tokenizer's sha256) then the tokens, little-endian uint16 (or uint32 for a vocabulary over
  65,536), each document's tokens as its tokenizer makes them (``[BOS] + bytes`` for ``byte``);
* ``chunk-NNNNN.json`` — the chunk's documents (id, split, tokens, bytes, sha256 of its bytes),
  the sha256 of its source text and of its two shard files; written after the shards, it marks
  the chunk done (a killed ``prepare`` resumes from the chunks without one);
* ``train.order.npy`` / ``validation.order.npy`` — int64 ``[documents, 3]``: (chunk, token
  offset in the shard, tokens) of each document of the split **sorted by id**, the order of
  fireviz's training stream (``fireviz.data.corpus.TokenStream``): with the byte tokenizer a
  run reads the same tokens from shards as from the corpus;
* ``manifest.json`` — written last: the tokenizer (its name, sha256, ids, BOS), the source and
  its fingerprint, per split the documents, tokens, bytes and the ``data_fingerprint`` of its
  documents, and every shard's tokens and sha256;
* ``tokenizer/`` — a copy of a Hugging Face tokenizer's files (absent for ``byte``).

Splits follow ``fireviz.data.corpus.is_validation`` (sha256 of the id), as everywhere else.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np
import torch

from fireviz.core import FileFormatError, read_json, sha256_files
from fireviz.core.bounded import MAX_DOCUMENTS
from fireviz.data.corpus import SPLITS, DataError, Document, FileBytes, fingerprint_entry
from fireviz.data.tokenizers import stored_tokenizer_problem

FORMAT = "fireviz-token-shards"
FORMAT_VERSION = 1
MAGIC = b"FVZTOKS\0"
#: magic, format version, bytes per token, tokens, documents, sha256 of the tokenizer's identity
HEADER = struct.Struct("<8sIIQQ32s")
MANIFEST = "manifest.json"
SETTINGS = "prepare.json"
TOKENIZER_DIR = "tokenizer"
#: what a refusal of a damaged folder says to do (the same command would refuse it again)
AGAIN = "prepare the data again into a new --out (or delete this folder first)"


def shard_name(split: str, chunk: int) -> str:
    """``train-00012.bin``: the shard file of ``split`` for source chunk ``chunk``."""
    return f"{split}-{chunk:05d}.bin"


def chunk_name(chunk: int) -> str:
    """``chunk-00012.json``: the document table that marks chunk ``chunk`` done."""
    return f"chunk-{chunk:05d}.json"


def order_name(split: str) -> str:
    return f"{split}.order.npy"


def tokenizer_digest(key: str) -> bytes:
    """The 32 bytes a shard header holds for a tokenizer: sha256 of its identity ``key``
    (``"byte"``, or the sha256 of a Hugging Face tokenizer's files)."""
    return hashlib.sha256(key.encode()).digest()


def itemsize_for(num_ids: int) -> int:
    """Bytes per token for ids ``0 .. num_ids − 1``: 2 (uint16) up to 65,536 ids, else 4."""
    return 2 if num_ids <= 1 << 16 else 4


def is_shard_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder ``prepare`` wrote into (finished or not)."""
    p = Path(path).expanduser()
    return p.is_dir() and ((p / MANIFEST).is_file() or (p / SETTINGS).is_file())


def read_shard_header(path: Path) -> dict:
    """The header of one shard file: ``{"version", "itemsize", "tokens", "documents", "tokenizer"}``.
    Raises: DataError for a file that is not a fireviz shard (foreign), of a later format, or
    whose size does not match its header (truncated)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER.size)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise DataError(f"cannot read the shard {path}: {e}") from e
    if len(raw) < HEADER.size or raw[:8] != MAGIC:
        raise DataError(f"{path} is not a fireviz token shard (no {MAGIC[:7].decode()} header); {AGAIN}")
    magic, version, itemsize, n_tokens, n_docs, digest = HEADER.unpack(raw)
    if version != FORMAT_VERSION or itemsize not in (2, 4):
        raise DataError(
            f"{path} is a shard of format {version} with {itemsize}-byte tokens; this fireviz reads format "
            f"{FORMAT_VERSION}: {AGAIN}"
        )
    if size != HEADER.size + n_tokens * itemsize:
        raise DataError(
            f"{path} is {size:,} bytes but its header says {n_tokens:,} tokens ({HEADER.size + n_tokens * itemsize:,} "
            f"bytes): it is truncated or corrupt; {AGAIN}"
        )
    return {"version": version, "itemsize": itemsize, "tokens": n_tokens, "documents": n_docs, "tokenizer": digest}


class TokenShards:
    """A prepared shard folder, checked once: what training and validation read.

    Args: ``path`` the folder; ``verify`` also compare every shard's sha256 with the manifest
      (reads each file once, in chunks; memory stays flat).
    Attributes: ``path``, ``manifest`` (the parsed manifest.json), ``tokenizer`` (its record:
      ``name``, ``key``, ``num_ids``, ``bos_token_id``), ``num_ids``, ``itemsize``.
    Raises: DataError naming the problem and the fix: not a shard folder, a ``prepare`` that did
      not finish (run it again to resume), a foreign, truncated or corrupt shard, an order file
      that does not match. Nothing is changed.
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path).expanduser()
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            if (self.path / SETTINGS).is_file():
                raise DataError(
                    f"{self.path}: its prepare did not finish (no {MANIFEST}); run the same `python -m fireviz "
                    "prepare` command again to resume it"
                )
            raise DataError(
                f"{self.path} is not a token-shard folder (no {MANIFEST}); write one with python -m fireviz prepare"
            )
        try:
            self.manifest = read_json(manifest_path, expect=dict)
        except FileFormatError as e:
            raise DataError(f"{e}; {AGAIN}") from e
        m = self.manifest
        if m.get("format") != FORMAT or m.get("version") != FORMAT_VERSION:
            raise DataError(
                f"{manifest_path} is not a fireviz token-shard manifest of version {FORMAT_VERSION} (format "
                f"{m.get('format')!r}, version {m.get('version')!r}); {AGAIN}"
            )
        try:
            self.tokenizer = dict(m["tokenizer"])
            self.num_ids = int(self.tokenizer["num_ids"])
            self._digest = tokenizer_digest(str(self.tokenizer["key"]))
            self.shards: dict[str, list[dict]] = {s: list(m["splits"][s]["shards"]) for s in SPLITS}
            counts = {s: int(m["splits"][s]["documents"]) for s in SPLITS}
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{manifest_path} lacks or garbles {e} (it is not as prepare wrote it); {AGAIN}") from e
        self.itemsize = itemsize_for(self.num_ids)
        if len(self.shards["train"]) != len(self.shards["validation"]):
            raise DataError(f"{manifest_path} lists unequal train and validation shards (corrupt); {AGAIN}")
        for split in SPLITS:
            for k, rec in enumerate(self.shards[split]):
                self._check_shard(split, k, rec, verify)
        if verify:
            self._check_tokenizer_files()
        self.orders = {s: self._order(s, counts[s], verify) for s in SPLITS}

    def _check_tokenizer_files(self) -> None:
        """A Hugging Face tokenizer's copy in ``tokenizer/`` is what the manifest names (a run trained
        on these shards stores it: a missing or changed copy would make a checkpoint no one can read)."""
        key = self.tokenizer["key"]
        if key == "byte":
            return
        folder = self.path / TOKENIZER_DIR
        files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        try:
            problem = stored_tokenizer_problem(files, key)
        except OSError as e:
            raise DataError(f"cannot read {folder}: {e}") from e
        if problem:
            raise DataError(
                f"{folder} {'is missing' if not files else 'does not hold the tokenizer these shards were made with'} "
                f"(the manifest names {self.tokenizer.get('name')!r}, files sha256 {str(key)[:12]}…); copy the shard "
                f"folder whole, or {AGAIN}"
            )

    def _check_shard(self, split: str, k: int, rec: dict, verify: bool) -> None:
        path = self.path / shard_name(split, k)
        head = read_shard_header(path)
        if head["tokenizer"] != self._digest or head["itemsize"] != self.itemsize:
            raise DataError(
                f"{path} was written with another tokenizer than {self.path / MANIFEST} names (a foreign shard); "
                f"{AGAIN}"
            )
        if head["tokens"] != rec["tokens"] or (verify and sha256_files(path) != rec["sha256"]):
            raise DataError(
                f"{path} does not match {MANIFEST} (its bytes changed since prepare wrote it: corrupt or replaced); "
                f"{AGAIN}"
            )

    def _order(self, split: str, documents: int, verify: bool) -> np.ndarray:
        path = self.path / order_name(split)
        want = self.manifest["splits"][split].get("order_sha256")
        try:
            if verify and want is not None and sha256_files(path) != want:
                raise DataError(f"{path} does not match {MANIFEST} (changed since prepare wrote it); {AGAIN}")
            order = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path}: {e}; {AGAIN}") from e
        tokens = np.asarray([r["tokens"] for r in self.shards[split]], dtype=np.int64)
        ok = order.dtype == np.int64 and order.ndim == 2 and order.shape[1] == 3
        ok = ok and order.shape[0] == documents
        if ok and len(order):
            chunk, off, n = order[:, 0], order[:, 1], order[:, 2]
            ok = bool(chunk.min() >= 0 and chunk.max() < len(tokens) and off.min() >= 0 and n.min() >= 0)
            ok = ok and bool(np.all(off + n <= tokens[chunk]))
        if not ok:
            raise DataError(f"{path} does not match {MANIFEST} (corrupt); {AGAIN}")
        return order

    def fingerprint(self, split: str) -> str:
        """``data_fingerprint`` of the split's documents in source order (equal to the one of the
        same documents read from the corpus)."""
        return str(self.manifest["splits"][split]["fingerprint"])

    def verified_fingerprints(self) -> dict[str, str]:
        """``{split: data_fingerprint}`` computed from the chunk tables' documents (id and sha256 of
        each, in source order), not copied from the manifest: what a run records (issue #50).

        For byte-tokenized shards every document's bytes are read from its shard once (after its
        BOS) and hashed against the sha256 its table lists, so a shard edited with its table's
        shard hashes and the manifest is refused. Shards of another tokenizer hold token ids that
        do not give back the text's bytes: their documents are checked in token counts only (their
        shard files against the manifest's sha256, as every :class:`TokenShards` does).
        Raises: DataError naming the chunk, the document and :data:`AGAIN` when a table does not
          read, a document's bytes do not hash to its sha256, a table's token counts do not fill
          its shard, or the manifest's fingerprint is not the one its tables give."""
        fps = {s: hashlib.sha256() for s in SPLITS}
        byte = self.tokenizer.get("key") == "byte"
        for k in range(len(self.shards["train"])):
            path = self.path / chunk_name(k)
            try:
                table = read_json(path, expect=dict)["documents"]
            except (FileFormatError, KeyError, TypeError) as e:
                raise DataError(f"{path} does not read ({e}); {AGAIN}") from e
            offsets = [0, 0]
            maps: dict[int, np.ndarray] = {}
            rows: list = table if isinstance(table, list) else [None]
            for row in rows:
                try:
                    doc_id, s, n_tok, n_bytes, doc_sha256 = row
                    digest = bytes.fromhex(doc_sha256)
                    if s not in (0, 1) or len(digest) != 32 or not (n_tok >= 0 and n_bytes >= 0):
                        raise ValueError
                except (ValueError, TypeError):
                    raise DataError(
                        f"{path}: a row {str(row)[:80]} is not [id, split, tokens, bytes, sha256]; {AGAIN}"
                    ) from None
                split = SPLITS[s]
                if byte:
                    if s not in maps:
                        maps[s] = self.map(split, k)
                    if n_tok != n_bytes + 1 or not _bytes_match(maps[s], offsets[s] + 1, n_bytes, digest):
                        raise DataError(
                            f"document {str(doc_id)[:80]!r} in {self.path / shard_name(split, k)} does not hash to the "
                            f"sha256 its table {path.name} lists: the shard was edited after prepare; {AGAIN}"
                        )
                fps[split].update(fingerprint_entry(str(doc_id), digest))
                offsets[s] += int(n_tok)
            maps.clear()
            for s, split in enumerate(SPLITS):
                if offsets[s] != int(self.shards[split][k]["tokens"]):
                    raise DataError(
                        f"{path} lists {offsets[s]:,} {split} tokens but its shard holds "
                        f"{int(self.shards[split][k]['tokens']):,}: the folder was edited; {AGAIN}"
                    )
        out = {s: fps[s].hexdigest() for s in SPLITS}
        for split in SPLITS:
            if out[split] != self.fingerprint(split):
                raise DataError(
                    f"{self.path / MANIFEST} names the {split} fingerprint {self.fingerprint(split)[:12]}… but its chunk "
                    f"tables' documents give {out[split][:12]}…: the folder was edited after prepare; {AGAIN}"
                )
        return out

    def map(self, split: str, chunk: int) -> np.ndarray:
        """The tokens of one shard as a read-only memory map (uint16 or uint32 ``[tokens]``)."""
        dtype = np.dtype("<u2" if self.itemsize == 2 else "<u4")
        n = int(self.shards[split][chunk]["tokens"])
        if n == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(self.path / shard_name(split, chunk), dtype=dtype, mode="r", offset=HEADER.size, shape=(n,))

    def stream(self, split: str = "train", min_tokens: int = 2) -> ShardStream:
        """The split's documents concatenated in id order, for training windows (:class:`ShardStream`).
        Raises: DataError if it holds fewer than ``min_tokens`` tokens."""
        return ShardStream(self, split, min_tokens)

    def documents(self, split: str) -> list[ShardDocument]:
        """The split's documents, sorted by id, each sliceable into int64 token tensors."""
        return [ShardDocument(self, split, int(c), int(o), int(n)) for c, o, n in self.orders[split]]


def _bytes_match(tokens: np.ndarray, start: int, n: int, digest: bytes) -> bool:
    """Whether byte tokens ``tokens[start : start + n]`` (each < 256) hash to ``digest`` (sha256),
    read in 1 MiB pieces."""
    if start + n > len(tokens):
        return False
    h = hashlib.sha256()
    for a in range(start, start + n, 1 << 20):
        piece = np.asarray(tokens[a : min(a + (1 << 20), start + n)])
        if len(piece) and int(piece.max()) > 255:
            return False
        h.update(piece.astype(np.uint8).tobytes())
    return h.digest() == digest


class _ShardBytes(FileBytes):
    """A byte-tokenized document's bytes in its shard (its tokens after BOS), read through a
    memory map when sliced: ``fb[a:b]`` → uint8 ``[b − a]``."""

    __slots__ = ("shards", "split", "chunk", "start")

    def __init__(self, shards: TokenShards, split: str, chunk: int, start: int, size: int):
        self.path, self.fileobj, self.offset, self.size, self.stamp = None, None, 0, int(size), None
        self.shards, self.split, self.chunk, self.start = shards, split, chunk, start

    def _read(self, a: int, b: int) -> np.ndarray:
        m = self.shards.map(self.split, self.chunk)
        out = np.array(m[self.start + a : self.start + b], dtype=np.uint8)
        del m
        return out


def shard_documents(path: str | os.PathLike) -> list[Document]:
    """The documents of a byte-tokenized shard folder, in source order, as ``Document`` s whose
    bytes are read from the shards where a window lies (what evaluation reads for ``--data
    <shard folder>``: the same documents, ids and fingerprint as the corpus they were prepared from).
    Raises: DataError as :class:`TokenShards`, or for shards of another tokenizer (they hold its
    token ids, not the text: evaluate on their source, which the manifest names)."""
    shards = TokenShards(path)
    if shards.tokenizer["key"] != "byte":
        raise DataError(
            f"{shards.path} holds token ids of {shards.tokenizer['name']}, not text; evaluate on the corpus it was "
            f"prepared from (--data {shards.manifest['source']['data']})"
        )
    n_docs = sum(int(shards.manifest["splits"][s]["documents"]) for s in SPLITS)
    if n_docs > MAX_DOCUMENTS.value:  # each becomes an object: refused before any is made
        raise DataError(
            f"{shards.path} holds {n_docs:,} documents, more than the {MAX_DOCUMENTS.said()} one evaluation keeps in "
            f"memory; {MAX_DOCUMENTS.fix()}"
        )
    docs: list[Document] = []
    tables = shards.manifest.get("chunk_tables") or []
    for k in range(len(shards.shards["train"])):
        path = shards.path / chunk_name(k)
        try:
            if k >= len(tables) or sha256_files(path) != tables[k]:
                raise DataError(f"{path} does not match {MANIFEST} (changed since prepare wrote it); {AGAIN}")
            table = read_json(path, expect=dict)["documents"]
        except (FileFormatError, KeyError, TypeError, OSError) as e:
            raise DataError(f"{path} does not read ({e}); {AGAIN}") from e
        offsets = {0: 0, 1: 0}
        for doc_id, split_index, n_tok, n_bytes, _ in table:
            raw = _ShardBytes(shards, SPLITS[split_index], k, offsets[split_index] + 1, n_bytes)
            docs.append(Document(str(doc_id), raw=raw))
            offsets[split_index] += n_tok
    return docs


class ShardDocument:
    """One document's tokens in a shard: ``doc[a:b]`` → int64 tensor ``[b − a]`` (read then, through
    a memory map), ``len(doc)`` its tokens."""

    __slots__ = ("shards", "split", "chunk", "offset", "n")

    def __init__(self, shards: TokenShards, split: str, chunk: int, offset: int, n: int):
        self.shards, self.split, self.chunk, self.offset, self.n = shards, split, chunk, offset, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> torch.Tensor:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardDocument takes step-1 slices only")
        a, b, _ = key.indices(self.n)
        b = max(a, b)
        m = self.shards.map(self.split, self.chunk)
        out = np.asarray(m[self.offset + a : self.offset + b], dtype=np.int64)
        del m
        return torch.from_numpy(out)


class ShardStream:
    """The documents of one split of a :class:`TokenShards`, concatenated in id order: the same
    interface and, for the byte tokenizer, the same tokens as ``fireviz.data.corpus.TokenStream``
    (``num_tokens``, ``batch(starts, length)``).

    Memory: the document table (24 bytes a document), never the tokens; each batch maps the
    shards its windows touch and lets them go, so a long run's resident memory does not grow with
    the corpus (nanoGPT re-creates its memmap per batch for the same reason).
    Raises: DataError if the split holds fewer than ``min_tokens`` tokens.
    """

    def __init__(self, shards: TokenShards, split: str = "train", min_tokens: int = 2):
        self.shards, self.split = shards, split
        self.order = shards.orders[split]
        self.cum = np.concatenate([[0], np.cumsum(self.order[:, 2])]).astype(np.int64)
        if self.num_tokens < min_tokens:
            raise DataError(
                f"{shards.path} holds {self.num_tokens} {split} tokens, fewer than one window of {min_tokens}; "
                "use more or longer documents, or a shorter seq_len"
            )

    @property
    def num_tokens(self) -> int:
        """Tokens in the split (every document's tokens, BOS included)."""
        return int(self.cum[-1])

    def batch(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """Windows at ``starts [batch]`` (int64, in ``[0, num_tokens − length]``) of ``length``
        tokens → int64 ``[batch, length]``; a window may run across documents (and shards)."""
        s = starts.numpy().astype(np.int64)
        out = np.empty((len(s), length), dtype=np.int64)
        maps: dict[int, np.ndarray] = {}
        for row, start in enumerate(s):
            i = int(np.searchsorted(self.cum, start, side="right")) - 1
            pos, filled = int(start - self.cum[i]), 0
            while filled < length:
                chunk, off, n = (int(v) for v in self.order[i])
                take = min(n - pos, length - filled)
                if chunk not in maps:
                    maps[chunk] = self.shards.map(self.split, chunk)
                out[row, filled : filled + take] = maps[chunk][off + pos : off + pos + take]
                filled += take
                i, pos = i + 1, 0
        maps.clear()  # unmapped: the pages read stay in the page cache, not in this process
        return torch.from_numpy(out)


__all__ = [
    "FORMAT",
    "HEADER",
    "MAGIC",
    "MANIFEST",
    "ShardDocument",
    "ShardStream",
    "TokenShards",
    "is_shard_folder",
    "read_shard_header",
    "shard_documents",
]
