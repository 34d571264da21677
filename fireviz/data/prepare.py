"""Tokenize a corpus once into token shards: ``python -m fireviz prepare`` (issue #37).

:func:`prepare` reads a source with :func:`fireviz.data.sources.iter_documents` (one document at
a time), cuts it into chunks of about ``chunk_bytes`` of text (whole documents, in source
order), tokenizes each chunk (in ``num_proc`` worker processes) and writes its two shards
(train, validation) and then its document table, each atomically (a temp file, fsync, rename:
``fireviz.core.atomic_write``). A chunk whose table is there and whose shards match it is done:
a killed ``prepare`` run again with the same settings skips those chunks (checking that their
source text is unchanged) and writes byte-identical files for the rest. The orders and the
manifest come last (format: :mod:`fireviz.data.shards`).

Memory: the chunks in flight (``2 × num_proc`` of them) and a table of ids, never the corpus.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fireviz import __version__
from fireviz.core import FileFormatError, atomic_write, read_json, sha256_files, write_json_atomic
from fireviz.core.worker import bare_main, die_with_parent
from fireviz.data.corpus import SPLITS, DataError, Document, document_sha256, fingerprint_entry, is_validation
from fireviz.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MANIFEST,
    SETTINGS,
    TOKENIZER_DIR,
    TokenShards,
    chunk_name,
    itemsize_for,
    order_name,
    read_shard_header,
    shard_name,
    tokenizer_digest,
)
from fireviz.data.sources import iter_documents, source_spec, source_state

#: source text per chunk (and so per pair of shards); recorded, and fixed for a resumed run
DEFAULT_CHUNK_BYTES = 16 << 20
#: most documents per chunk, whatever their bytes: a chunk's documents and table are held while it
#: is written and its table read back whole (2 million one-character documents made one 16 MiB
#: chunk of 2.6 GB and a 250 MB table, issue #50); ~65,536 rows are ~7 MB of JSON
CHUNK_MAX_DOCUMENTS = 1 << 16


def tokenizer_record(tokenizer: Any) -> dict:
    """What a shard folder (and a checkpoint trained on it) records of its tokenizer: ``name``,
    ``key`` (``"byte"`` or the sha256 of its files), ``num_ids`` (ids it can produce),
    ``bos_token_id``, ``adds_bos``."""
    return {
        "name": tokenizer.name,
        "key": tokenizer.key,
        "num_ids": int(tokenizer.num_ids),
        "bos_token_id": tokenizer.bos_token_id,
        "adds_bos": bool(tokenizer.adds_bos),
    }


def _portable(doc: Document) -> Document:
    """``doc`` as it can be sent to a worker process: a document in memory or in a file of its own
    (read there) as it is; one in a load's spool file (an unlinked temp file) as its text."""
    raw = doc.raw_bytes()
    return doc if not doc.on_disk or getattr(raw, "path", None) is not None else Document(doc.id, doc.text)


def _chunks(
    docs: Iterator[Document], chunk_bytes: int, portable: bool
) -> Iterator[tuple[int, list[Document], list[list], str]]:
    """``(k, documents, table rows [id, split, n_bytes, sha256], source sha256)`` per chunk of
    ``chunk_bytes`` of text or ``CHUNK_MAX_DOCUMENTS`` documents, whichever comes first
    (``portable``: documents made sendable to a worker process)."""
    k, batch, rows, size = 0, [], [], 0
    for doc in docs:
        n, digest = len(doc), document_sha256(doc).hex()
        batch.append(_portable(doc) if portable else doc)
        rows.append([doc.id, int(is_validation(doc.id)), n, digest])
        size += n
        if size >= chunk_bytes or len(batch) >= CHUNK_MAX_DOCUMENTS:
            yield k, batch, rows, _rows_sha256(rows)
            k, batch, rows, size = k + 1, [], [], 0
    if batch:
        yield k, batch, rows, _rows_sha256(rows)


def _rows_sha256(rows) -> str:
    """``data_fingerprint`` of a chunk's documents (sha256 over id, NUL, sha256 of the bytes)."""
    h = hashlib.sha256()
    for doc_id, _, _, digest in rows:
        h.update(fingerprint_entry(doc_id, bytes.fromhex(digest)))
    return h.hexdigest()


def _write_shard(path: Path, tokens: np.ndarray, n_docs: int, itemsize: int, digest: bytes) -> str:
    header = HEADER.pack(MAGIC, FORMAT_VERSION, itemsize, len(tokens), n_docs, digest)
    array = np.ascontiguousarray(tokens.astype("<u2" if itemsize == 2 else "<u4", copy=False))
    data = memoryview(array).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(data)

    atomic_write(path, write)
    h = hashlib.sha256(header)
    h.update(data)
    return h.hexdigest()


def write_chunk(out: Path, k: int, docs: list[Document], rows: list[list], source_sha256: str, tokenizer) -> dict:
    """Tokenize one chunk and write its shards, then its table (what a worker process runs).
    Returns the table written."""
    itemsize, tok_digest = itemsize_for(tokenizer.num_ids), tokenizer_digest(tokenizer.key)
    parts: dict[int, list[np.ndarray]] = {0: [], 1: []}
    table = []
    dtype = np.uint16 if itemsize == 2 else np.uint32
    for doc, (doc_id, split, n_bytes, doc_sha256) in zip(docs, rows, strict=True):
        ids = tokenizer.ids(doc)  # a document that gives no token (whitespace in WordPiece) is kept, empty
        if len(ids) and int(ids.max()) >= tokenizer.num_ids:
            raise DataError(f"{tokenizer.name} gave ids outside 0..{tokenizer.num_ids - 1} for document {doc_id!r}")
        parts[split].append(ids.astype(dtype, copy=False))
        table.append([doc_id, split, len(ids), n_bytes, doc_sha256])
        del ids
    shards = {}
    for split_index, split in enumerate(SPLITS):
        toks = np.concatenate(parts[split_index]) if parts[split_index] else np.zeros(0, dtype=dtype)
        parts[split_index] = []
        shard_sha256 = _write_shard(out / shard_name(split, k), toks, len(parts[split_index]), itemsize, tok_digest)
        shards[split] = {"tokens": len(toks), "documents": len(parts[split_index]), "sha256": shard_sha256}
    record = {
        "chunk": k,
        "source_sha256": source_sha256,
        "tokenizer": tokenizer.key,
        "shards": shards,
        "documents": table,
    }
    write_json_atomic(out / chunk_name(k), record)
    return record


def _done_chunk(out: Path, k: int, source_sha256: str, key: str) -> dict | None:
    """The table of chunk ``k`` when it is done and its shards match it; None to (re)write it.
    Raises: DataError when the chunk was written from other source text (the source changed)."""
    path = out / chunk_name(k)
    if not path.is_file():
        return None
    try:
        rec = read_json(path, expect=dict)
    except FileFormatError:
        return None
    if rec.get("tokenizer") != key:
        return None
    if rec.get("source_sha256") != source_sha256:
        raise DataError(
            f"the source text of chunk {k} differs from when {out} was prepared (the data changed); prepare it into "
            "a new --out folder, or delete this one (nothing was changed)"
        )
    for split in SPLITS:
        p = out / shard_name(split, k)
        try:
            head = read_shard_header(p)
            ok = head["tokens"] == rec["shards"][split]["tokens"] and sha256_files(p) == rec["shards"][split]["sha256"]
        except (DataError, OSError, KeyError, TypeError):
            ok = False
        if not ok:
            return None
    return rec


def _settings(source, tokenizer, chunk_bytes: int, columns: dict) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "source": str(source),
        "tokenizer": tokenizer_record(tokenizer),
        "chunk_bytes": int(chunk_bytes),
        **columns,
    }


def _said(value) -> str:
    """A setting as a message says it (a tokenizer by its name and the start of its sha256)."""
    if isinstance(value, dict) and "key" in value:
        return f"tokenizer {value.get('name')!r} ({str(value['key'])[:12]})"
    return repr(value)


def _start(out: Path, settings: dict, tokenizer) -> None:
    """Claim ``out`` for these settings (or check a resumed run's are the same) and copy the
    tokenizer's files. Raises: DataError for a folder holding something else."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a folder")
    if (out / SETTINGS).is_file():
        try:
            before = read_json(out / SETTINGS, expect=dict)
        except FileFormatError as e:
            raise DataError(f"{e}; delete {out} and prepare again") from e
        if before != settings:
            diff = [
                f"{k}: {_said(before.get(k))} then, {_said(v)} now" for k, v in settings.items() if before.get(k) != v
            ]
            raise DataError(
                f"{out} holds shards prepared with other settings ({'; '.join(diff)}); prepare into another --out, or "
                "delete it (nothing was changed)"
            )
    elif out.is_dir() and any(out.iterdir()):
        raise DataError(
            f"--out {out} is a folder that holds other files; give a new or empty folder (nothing was changed)"
        )
    out.mkdir(parents=True, exist_ok=True)
    for stray in out.glob(".*.tmp-*"):
        stray.unlink()  # temp files of a killed run (ours)
    if not (out / SETTINGS).is_file():
        write_json_atomic(out / SETTINGS, settings)
    _copy_files(getattr(tokenizer, "files", ()), out / TOKENIZER_DIR)


def prepare(
    source: str | os.PathLike,
    tokenizer: Any,
    out: str | os.PathLike,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    num_proc: int = 1,
    text_column: str = "text",
    id_column: str = "id",
    hf_config: str | None = None,
    hf_split: str = "train",
    max_documents: int | None = None,
    progress: bool | None = None,
) -> dict:
    """Tokenize ``source`` into token shards in ``out`` (format: :mod:`fireviz.data.shards`).

    Args:
      source: a bundled domain, a JSONL / text / Parquet file or a folder of them, or
        ``hf:<dataset>`` (:func:`fireviz.data.sources.iter_documents`; ``text_column``,
        ``id_column``, ``hf_config``, ``hf_split`` go there).
      tokenizer: ``fireviz.data.tokenizers.BYTE_TOKENIZER`` or an ``HFTokenizer`` (its ``files``
        are copied into ``out/tokenizer``); each document is encoded with its own BOS convention.
      out: a new or empty folder, or one an interrupted ``prepare`` with the same settings left
        (resumed: finished chunks are checked and kept).
      chunk_bytes: source text per chunk (≥ 1). num_proc: worker processes (1: in this one).
      max_documents: the first N documents of the source only (None: all; for a large streamed
        dataset); recorded with the settings.
      progress: a tqdm bar (None: on a terminal).
    Returns: the manifest written (``manifest.json``).
    Raises: DataError (the source, a folder of something else or of other settings, a source
      that changed under a resumed run), ValueError for bad ``chunk_bytes`` / ``num_proc``, OSError.
    """
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer (got {chunk_bytes!r})")
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"--num-proc must be a positive integer (got {num_proc!r})")
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ValueError(f"--max-documents must be a positive integer (got {max_documents!r})")
    out = Path(out).expanduser()
    columns = {
        "text_column": text_column,
        "id_column": id_column,
        "hf_config": hf_config,
        "hf_split": hf_split,
        "max_documents": max_documents,
    }
    settings = _settings(source_spec(source), tokenizer, chunk_bytes, columns)
    state = source_state(source)
    if (out / MANIFEST).is_file() and (out / SETTINGS).is_file():
        finished = _finished(out, settings, state)
        if finished is not None:  # done before from this very source: checked, not redone
            return finished
    fresh = not (out / SETTINGS).exists()
    _start(out, settings, tokenizer)
    try:
        docs = itertools.islice(iter_documents(source, text_column, id_column, hf_config, hf_split), max_documents)
        records = _tokenize_all(out, docs, tokenizer, chunk_bytes, num_proc, progress)
    except BaseException:
        if fresh and not any(out.glob("chunk-*.json")):  # nothing done: the folder is left as it was
            _unclaim(out)
        raise
    return _finish(out, settings, records, state)


def _finished(out: Path, settings: dict, state) -> dict | None:
    """The manifest of a finished folder of these settings whose source is unchanged since (its
    files' sizes and times; a streamed dataset is always read again); None to go through it again
    (each chunk is then checked against the source: a changed one is refused)."""
    try:
        before = read_json(out / SETTINGS, expect=dict)
        manifest = read_json(out / MANIFEST, expect=dict)
    except FileFormatError:
        return None
    if before != settings or state is None or manifest.get("source", {}).get("state") != state:
        return None
    TokenShards(out)  # every shard checked
    return manifest


def _unclaim(out: Path) -> None:
    """Undo ``_start`` of a run that wrote no chunk (a source that failed at once): a retry with
    other settings is not refused for a folder that holds nothing."""
    (out / SETTINGS).unlink(missing_ok=True)
    tok = out / TOKENIZER_DIR
    if tok.is_dir():
        for f in tok.iterdir():
            f.unlink()
        tok.rmdir()
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _tokenize_all(out: Path, docs, tokenizer, chunk_bytes: int, num_proc: int, progress: bool | None) -> list[dict]:
    """Every chunk of ``docs`` written (or found done), in ``num_proc`` processes; their summaries."""
    import sys

    from tqdm import tqdm

    bar = tqdm(
        unit="B",
        unit_scale=True,
        desc=f"prepare {out.name}",
        disable=not (progress or (progress is None and sys.stderr.isatty())),
    )
    records: dict[int, dict] = {}
    pool = _pool(num_proc, tokenizer) if num_proc > 1 else None
    pending: dict[int, Any] = {}
    try:
        for k, batch, rows, digest in _chunks(docs, chunk_bytes, portable=pool is not None):
            done = _done_chunk(out, k, digest, tokenizer.key)
            if done is not None:
                records[k] = _summary(done)
            elif pool is None:
                records[k] = _summary(write_chunk(out, k, batch, rows, digest, tokenizer))
            else:
                pending[k] = pool.apply_async(_write_chunk_in_worker, (out, k, batch, rows, digest))
                while len(pending) >= 2 * num_proc:  # memory: the chunks in flight, never the corpus
                    first = min(pending)
                    records[first] = _summary(pending.pop(first).get())
            bar.update(sum(r[2] for r in rows))
        for k in sorted(pending):
            records[k] = _summary(pending.pop(k).get())
    finally:
        if pool is not None:
            if pending:  # an error: the chunks in flight are dropped
                pool.terminate()
            else:
                pool.close()
            pool.join()
        bar.close()
    return [records[k] for k in range(len(records))]


def _pool(num_proc: int, tokenizer):
    """``num_proc`` spawned worker processes (no fork of a process holding threads: torch,
    tokenizers), started without re-running this process's ``__main__`` (a Streamlit page, a
    script) in them (``fireviz.core.worker.bare_main``); each receives ``tokenizer`` once."""
    import multiprocessing

    with bare_main():
        return multiprocessing.get_context("spawn").Pool(num_proc, initializer=_start_worker, initargs=(tokenizer,))


#: a worker process's tokenizer, given once when it starts (not with every chunk)
_WORKER_TOKENIZER: Any = None


def _start_worker(tokenizer) -> None:
    """A worker keeps its tokenizer and ends when the process that started it dies (Linux
    ``PR_SET_PDEATHSIG``): a ``prepare`` killed with SIGKILL leaves no orphans holding memory."""
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer
    die_with_parent()


def _write_chunk_in_worker(out: Path, k: int, docs: list[Document], rows: list[list], source_sha256: str) -> dict:
    """:func:`write_chunk` with the worker's tokenizer."""
    return write_chunk(out, k, docs, rows, source_sha256, _WORKER_TOKENIZER)


def _summary(record: dict) -> dict:
    """What the manifest needs of a chunk's table (its shards), not its documents."""
    return {"chunk": record["chunk"], "shards": record["shards"]}


def _finish(out: Path, settings: dict, records: list[dict], state=None) -> dict:
    """The orders (documents sorted by id), the fingerprints and the manifest, written last. The
    chunk tables are read back one at a time; what is held is per document an id (as UTF-8 bytes
    in one numpy array) and three integers, for the sort."""
    n = len(records)
    for stale in out.glob("chunk-*.json"):  # chunks past the end: a source that has shrunk
        found = re.fullmatch(r"chunk-(\d{5,})\.json", stale.name)
        if found and int(found.group(1)) >= n:
            k = int(found.group(1))
            for p in [stale] + [out / shard_name(s, k) for s in SPLITS]:
                p.unlink(missing_ok=True)
    ids: dict[int, list[np.ndarray]] = {0: [], 1: []}
    rows: dict[int, list[np.ndarray]] = {0: [], 1: []}
    fps = {0: hashlib.sha256(), 1: hashlib.sha256()}
    n_bytes = {0: 0, 1: 0}
    source_fp = hashlib.sha256()
    tables = []
    for k in range(n):
        tables.append(sha256_files(out / chunk_name(k)))
        table = read_json(out / chunk_name(k), expect=dict)["documents"]
        offsets = {0: 0, 1: 0}
        chunk_ids: dict[int, list[str]] = {0: [], 1: []}
        chunk_rows: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
        for doc_id, s, n_tok, nb, doc_sha256 in table:
            key = fingerprint_entry(doc_id, bytes.fromhex(doc_sha256))
            fps[s].update(key)
            source_fp.update(key)
            chunk_ids[s].append(str(doc_id))
            chunk_rows[s].append((k, offsets[s], n_tok))
            offsets[s] += n_tok
            n_bytes[s] += nb
        for s in (0, 1):
            ids[s].append(np.array(chunk_ids[s], dtype=object))
            rows[s].append(np.asarray(chunk_rows[s], dtype=np.int64).reshape(-1, 3))
    splits: dict[str, dict[str, Any]] = {}
    for split_index, split in enumerate(SPLITS):
        all_ids = np.concatenate(ids[split_index]) if ids[split_index] else np.zeros(0, dtype=object)
        order = np.concatenate(rows[split_index]) if rows[split_index] else np.zeros((0, 3), dtype=np.int64)
        # Python's str order (TokenStream's sort, also for ids of raw bytes), stable: equal ids keep source order
        order = order[np.argsort(all_ids, kind="stable")] if len(order) else order
        atomic_write(out / order_name(split), functools.partial(_save_npy, array=order))
        splits[split] = {
            "order_sha256": sha256_files(out / order_name(split)),
            "documents": len(order),
            "tokens": int(order[:, 2].sum()),
            "bytes": n_bytes[split_index],
            "fingerprint": fps[split_index].hexdigest(),
            "shards": [
                {"tokens": r["shards"][split]["tokens"], "sha256": r["shards"][split]["sha256"]} for r in records
            ],
        }
    n_docs, n_tok, n_text = (sum(int(splits[sp][k]) for sp in SPLITS) for k in ("documents", "tokens", "bytes"))
    if n_text and n_tok <= (n_docs if settings["tokenizer"].get("adds_bos") else 0):
        raise DataError(
            f"{settings['tokenizer'].get('name')} encoded no byte of the {n_text:,} "
            f"bytes of text into a token (every document empty or BOS only): nothing to train on; use a tokenizer "
            f"that encodes this text (byte, or one trained on it), and delete {out} first"
        )
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "tokenizer": settings["tokenizer"],
        "source": {
            "data": settings["source"],
            "fingerprint": source_fp.hexdigest(),
            **{k: settings[k] for k in ("text_column", "id_column", "hf_config", "hf_split", "max_documents")},
            "state": state,
        },
        "chunk_bytes": settings["chunk_bytes"],
        "chunks": n,
        "chunk_tables": tables,
        "dtype": "uint16" if itemsize_for(settings["tokenizer"]["num_ids"]) == 2 else "uint32",
        "splits": splits,
        "fireviz_version": __version__,
    }
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _write_bytes(path: Path, data: bytes) -> None:
    Path(path).write_bytes(data)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def copy_tokenizer(shards_dir: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Copy a shard folder's tokenizer files into ``out`` (a checkpoint stores its tokenizer);
    the files copied (none for ``byte``)."""
    src = Path(shards_dir) / TOKENIZER_DIR
    return _copy_files(sorted(f for f in src.iterdir() if f.is_file()) if src.is_dir() else [], Path(out))


def _copy_files(files, dest_dir: Path) -> list[Path]:
    """Each file copied by name into ``dest_dir``, atomically; one already there with the same bytes
    is left as it is (a resumed run on read-only media writes nothing). Returns the copies."""
    copied = []
    for f in files:
        dest, data = dest_dir / Path(f).name, Path(f).read_bytes()
        if not dest.is_file() or dest.read_bytes() != data:
            atomic_write(dest, functools.partial(_write_bytes, data=data))
        copied.append(dest)
    return copied


__all__ = ["DEFAULT_CHUNK_BYTES", "copy_tokenizer", "prepare", "tokenizer_record", "write_chunk"]
