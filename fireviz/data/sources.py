"""Documents from any source, one at a time (``fireviz prepare`` reads corpora of any size this way).

:func:`iter_documents` yields :class:`fireviz.data.corpus.Document` s in a fixed order, holding
at most one file (or one Parquet row group, one streamed record) in memory:

* a bundled domain (``prose``, ``latex``, ``code``) or a JSONL file (plain, .gz, .xz): line by line;
* a text file (.txt, .md, .tex, .py, optionally .gz/.xz): one document (id = its name);
* a folder: its JSONL, text and Parquet files, recursively, in sorted path order (a text file's id
  is its path inside the folder, as :func:`fireviz.data.corpus.load_documents` names it);
* a Parquet file (``.parquet``; read with pyarrow, row group by row group): a string column
  ``text`` (``text_column``), ids from ``id_column`` when present, else ``<file>#<row>``;
* ``hf:<dataset>`` — a Hugging Face dataset, streamed with ``datasets.load_dataset(…,
  streaming=True)`` (``hf_config``, ``hf_split``; ``datasets`` must be installed): ids from
  ``id_column`` when present, else ``<dataset>#<row>``.

Documents with no text are skipped, as :func:`load_documents` does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from fireviz.core.bounded import MAX_LINE_BYTES, MAX_PARQUET_GROUP_BYTES
from fireviz.data.corpus import DATA_DIR, DOMAINS, DataError, Document, _is_jsonl, _is_text, iter_jsonl, load_documents

HF_PREFIX = "hf:"


def _is_parquet(path: Path) -> bool:
    return path.name.endswith(".parquet")


def source_spec(source: str | os.PathLike) -> str:
    """How a source is recorded (what a resumed ``prepare`` compares): a bundled name or ``hf:…`` as
    it is, a path that exists as its absolute path (``data.jsonl`` and ``./data.jsonl`` are one source)."""
    if isinstance(source, str) and (source in DOMAINS or source.startswith(HF_PREFIX)):
        return source
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else str(source)


def source_state(source: str | os.PathLike) -> list | None:
    """What tells whether a local source changed without reading it: ``[name, size, mtime_ns]``
    of its file (of every file under a folder, sorted); None for a streamed dataset or a path
    that cannot be read."""
    if isinstance(source, str) and source.startswith(HF_PREFIX):
        return None
    path = DATA_DIR / f"{source}.jsonl.xz" if isinstance(source, str) and source in DOMAINS else Path(source)
    try:
        path = path.expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return [
            [p.relative_to(path).as_posix() if p != path else p.name, st.st_size, st.st_mtime_ns]
            for p in files
            for st in (p.stat(),)
        ]
    except OSError:
        return None


def iter_documents(
    source: str | os.PathLike,
    text_column: str = "text",
    id_column: str = "id",
    hf_config: str | None = None,
    hf_split: str = "train",
) -> Iterator[Document]:
    """The documents of ``source`` in a fixed order (see the module docstring), one at a time.

    Raises: DataError for a source that does not exist, cannot be read, has no ``text_column``,
      a ``hf:`` source without ``datasets`` installed, or no document at all (raised at the end).
    """
    n = 0
    for doc in _iter_any(source, text_column, id_column, hf_config, hf_split):
        if len(doc):
            n += 1
            yield doc
    if not n:
        raise DataError(f"{source} contains no text (no documents with a non-empty {text_column!r})")


def _iter_any(source, text_column, id_column, hf_config, hf_split) -> Iterator[Document]:
    if isinstance(source, str) and source.startswith(HF_PREFIX):
        yield from _iter_hf(source[len(HF_PREFIX) :], text_column, id_column, hf_config, hf_split)
        return
    if isinstance(source, str) and source in DOMAINS:
        path = DATA_DIR / f"{source}.jsonl.xz"
        if not path.exists():
            raise DataError(f"bundled corpus {path} is missing; restore data/ from the repository")
        yield from iter_jsonl(path)
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"data source {str(source)!r} not found; give a bundled domain ({', '.join(DOMAINS)}), a .jsonl, .txt or "
            ".parquet file, a folder of them, or hf:<dataset name>"
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and (_is_jsonl(p) or _is_text(p) or _is_parquet(p)))
        for p in files:
            if p.stat().st_size == 0:
                continue
            for d in _iter_file(p, text_column, id_column, p.relative_to(path).as_posix()):
                if _is_text(p):
                    d.id = p.relative_to(path).as_posix()
                yield d
        return
    yield from _iter_file(path, text_column, id_column)


def _iter_file(path: Path, text_column: str, id_column: str, name: str | None = None) -> Iterator[Document]:
    if _is_parquet(path):
        yield from _iter_parquet(path, text_column, id_column, name or path.name)
    elif _is_jsonl(path):
        yield from iter_jsonl(path)
    else:
        yield from load_documents(path)  # one text document (read where its windows lie)


def _document(doc_id, text, where: str, text_column: str) -> Document:
    if not isinstance(text, str):
        raise DataError(
            f"{where}: column {text_column!r} holds {type(text).__name__}, not text; name the text column "
            "with --text-column"
        )
    return Document(str(doc_id), text)


def _iter_parquet(path: Path, text_column: str, id_column: str, name: str) -> Iterator[Document]:
    """Row group by row group; a row without an id is ``<name>#<row>`` (``name``: its path in a folder)."""
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        pf = pq.ParquetFile(path)
    except Exception as e:  # not Parquet, truncated: one message naming the file
        raise DataError(f"cannot read {path} as Parquet: {e}") from e
    names = pf.schema_arrow.names
    if text_column not in names:
        raise DataError(
            f"{path} has no column {text_column!r} (its columns: {', '.join(names)}); name the text column with "
            "--text-column"
        )
    columns = [text_column] + ([id_column] if id_column in names else [])
    _check_parquet_sizes(pf, path, columns)
    try:  # a dictionary-encoded text column stays one copy per distinct text until a row is read
        pf = pq.ParquetFile(path, read_dictionary=[text_column])
    except Exception as e:
        raise DataError(f"cannot read {path} as Parquet: {e}") from e
    row = 0
    try:
        for batch in pf.iter_batches(columns=columns, batch_size=1024):
            column = batch.column(text_column)
            if _check_parquet_cells(column, path, row) <= MAX_LINE_BYTES.value:
                texts = column.to_pylist()
            else:  # a batch of long texts: one str at a time (a dictionary column is only expanded here)
                texts = (column[k].as_py() for k in range(len(column)))
            ids = batch.column(id_column).to_pylist() if id_column in names else None
            for k, text in enumerate(texts):
                doc_id = ids[k] if ids is not None and ids[k] is not None else f"{name}#{row + k}"
                if text:
                    yield _document(doc_id, text, f"{path} row {row + k}", text_column)
            row += len(column)
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot read {path} as Parquet (row {row}): {e}") from e


def _check_parquet_sizes(pf, path: Path, columns: list[str]) -> None:
    """Refuse (DataError) a Parquet file whose row group would decompress to more than
    ``MAX_PARQUET_GROUP_BYTES`` in the columns read, from its footer's sizes, before any is read
    (a few KB of run-length-encoded pages can stand for gigabytes of text)."""
    meta, limit = pf.metadata, MAX_PARQUET_GROUP_BYTES.value
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        size = sum(
            group.column(c).total_uncompressed_size
            for c in range(group.num_columns)
            if group.column(c).path_in_schema in columns
        )
        if size > limit:
            raise DataError(
                f"{path}: row group {g} holds {size:,} bytes of {', '.join(columns)} once decompressed, more than "
                f"{MAX_PARQUET_GROUP_BYTES.said()} read at once; write it with smaller row groups, or "
                f"{MAX_PARQUET_GROUP_BYTES.fix()}"
            )


def _check_parquet_cells(column, path: Path, row: int) -> int:
    """Refuse (DataError) a text cell longer than ``MAX_LINE_BYTES``, before it becomes a str;
    return the bytes the batch's texts hold (a dictionary-encoded column: as expanded)."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    try:
        if isinstance(column, pa.DictionaryArray):
            lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
        else:
            lengths = pc.binary_length(column)
        longest, total = pc.max(lengths).as_py(), pc.sum(lengths).as_py()
    except Exception:  # not a string column: _document says so
        return 0
    if longest is not None and longest > MAX_LINE_BYTES.value:
        raise DataError(
            f"{path}: a text near row {row} is {longest:,} bytes, longer than {MAX_LINE_BYTES.said()} (the most one "
            f"document of a table may be); give it as a text file, or {MAX_LINE_BYTES.fix()}"
        )
    return int(total or 0)


def _iter_hf(name: str, text_column: str, id_column: str, config: str | None, split: str) -> Iterator[Document]:
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as e:
        raise DataError(
            f"hf:{name} needs the Hugging Face `datasets` package: pip install datasets (or give a local "
            "JSONL, text or Parquet file)"
        ) from e
    try:
        stream = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as e:  # offline, no such dataset or split: its own words
        raise DataError(f"cannot open the Hugging Face dataset {name!r} (config {config}, split {split}): {e}") from e
    for row, rec in enumerate(stream):
        if text_column not in rec:
            raise DataError(
                f"hf:{name} has no column {text_column!r} (its columns: {', '.join(rec)}); name the text column "
                "with --text-column"
            )
        text = rec[text_column]
        if isinstance(text, str) and len(text) > MAX_LINE_BYTES.value:  # characters: at least as many bytes
            raise DataError(
                f"hf:{name} row {row} holds a text of {len(text):,} characters, longer than {MAX_LINE_BYTES.said()} "
                f"(the most one document of a dataset may be); {MAX_LINE_BYTES.fix()}"
            )
        if text:
            doc_id = rec.get(id_column)
            yield _document(f"{name}#{row}" if doc_id is None else doc_id, text, f"hf:{name} row {row}", text_column)


__all__ = ["HF_PREFIX", "iter_documents", "source_spec", "source_state"]
