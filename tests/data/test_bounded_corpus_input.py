"""Corpora small on disk and huge when read end in one clear line, in bounded memory (issue #50).

Each input is built by :mod:`bombs` (concatenated gzip members: gigabytes of content in a few MB)
and read in a child process whose peak resident memory is measured.
"""

from __future__ import annotations

import gzip

import pytest
from bombs import RSS_BOUND_MB, gzip_repeated, one_clear_line, run_cli_measured, run_measured

from fireviz.core.bounded import MAX_DOCUMENTS, MAX_LINE_BYTES, MiB
from fireviz.data import DataError, load_documents
from fireviz.data.sources import iter_documents


def _load_code(path, call: str = "load_documents") -> str:
    return (
        "from fireviz.data import DataError, load_documents\n"
        "from fireviz.data.sources import iter_documents\n"
        f"try:\n    print(len(list({call}({str(path)!r}))))\n"
        "except DataError as e:\n    print(e)\n    raise SystemExit(2)\n"
    )


@pytest.mark.slow
def test_a_2gib_line_in_a_2mb_gzip_is_refused_by_prepare_in_one_line(tmp_path):
    """The issue's row: a 2 MB .jsonl.gz holding one 2 GiB line grew past 3 GB with no message."""
    path = tmp_path / "huge_line.jsonl.gz"
    path.write_bytes(gzip_repeated(b'{"text": "', b"a" * MiB, 2048, b'"}\n'))
    assert path.stat().st_size < 3 * MiB
    rc, out, rss = run_cli_measured(["prepare", "--data", str(path), "--out", str(tmp_path / "shards")])
    assert rc != 0 and one_clear_line(out), out
    assert "line longer than 64 MiB" in out and "FIREVIZ_MAX_LINE_MB" in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"
    assert not (tmp_path / "shards").exists()  # nothing claimed
    rc, out, rss = run_measured(_load_code(path))
    assert rc == 2 and one_clear_line(out) and "line longer" in out and rss < RSS_BOUND_MB, (out, rss)


def test_the_line_limit_is_checked_while_streaming_and_raised_by_its_setting(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl.xz"
    import lzma

    path.write_bytes(lzma.compress(b'{"text": "short"}\n{"text": "' + b"b" * (3 * MiB) + b'"}\n'))
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "2")
    assert MAX_LINE_BYTES.value == 2 * MiB
    with pytest.raises(DataError, match=r"c\.jsonl\.xz:2 is a line longer than 2 MiB.*FIREVIZ_MAX_LINE_MB above 2"):
        load_documents(path)
    with pytest.raises(DataError, match="line longer"):
        list(iter_documents(path))  # prepare's reader: the same bound
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "4")
    assert [len(d) for d in load_documents(path)] == [5, 3 * MiB]
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "lots")  # a bad setting: said, and the default (64 MiB) used
    with pytest.warns(RuntimeWarning, match="FIREVIZ_MAX_LINE_MB='lots' is not a positive whole number"):
        assert [len(d) for d in load_documents(path)] == [5, 3 * MiB]


def test_millions_of_tiny_documents_are_refused_at_the_document_limit_in_bounded_memory(tmp_path):
    """The issue's upload row as a corpus: ~10 million one-character documents in a few hundred KB."""
    line = b'{"text":"a"}\n'
    path = tmp_path / "tiny.jsonl.gz"
    path.write_bytes(gzip_repeated(b"", line * 80_000, 125))
    assert path.stat().st_size < MiB
    env = {"FIREVIZ_MAX_DOCUMENTS": "200000"}
    rc, out, rss = run_measured(_load_code(path), env=env)
    assert rc == 2 and one_clear_line(out), out
    assert "more than 200,000 documents" in out and "FIREVIZ_MAX_DOCUMENTS" in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"
    assert MAX_DOCUMENTS.default >= 1_000_000  # the default: ~250 MB of documents at most


@pytest.mark.slow
def test_a_decompression_bomb_of_blank_lines_is_refused_at_the_decompressed_limit(tmp_path):
    """Lines within the line limit, the file past the decompressed-bytes limit (here set to 1 GiB):
    refused while streaming, in the memory of one line."""
    space, nl = gzip.compress(b" " * MiB, 9), gzip.compress(b"\n")
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes((space * 48 + nl) * 30)  # 1.4 GiB of blank 48 MiB lines
    rc, out, rss = run_measured(_load_code(path, "iter_documents"), env={"FIREVIZ_MAX_DECOMPRESSED_GB": "1"})
    assert rc == 2 and one_clear_line(out), out
    assert "more than 1 GiB (decompressed)" in out and "FIREVIZ_MAX_DECOMPRESSED_GB above 1" in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"


def test_a_compressed_text_file_is_bounded_as_it_is_spooled(tmp_path, monkeypatch):
    path = tmp_path / "doc.txt.gz"
    path.write_bytes(gzip_repeated(b"x", b"y" * MiB, 3))
    assert len(load_documents(path)[0]) == 3 * MiB + 1
    import fireviz.core.bounded as bounded

    monkeypatch.setattr(bounded.MAX_DECOMPRESSED_BYTES, "default", 2 * MiB)
    with pytest.raises(DataError, match="doc.txt.gz expands to more than 2,097,152"):
        load_documents(path)


def test_a_line_that_parses_into_millions_of_values_is_refused_before_parsing(tmp_path):
    path = tmp_path / "values.jsonl"
    path.write_bytes(b'{"text": "t", "x": [' + b"[]," * 3_000_000 + b"[]]}\n")
    with pytest.raises(DataError, match=r"values.jsonl:1 holds up to [\d,]+ JSON values"):
        load_documents(path)


def test_a_load_keeps_a_bounded_amount_of_text_in_memory_and_spools_the_rest(tmp_path, monkeypatch):
    from fireviz.data import corpus

    monkeypatch.setattr(corpus, "IN_MEMORY_TEXT_BYTES", 1000)
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'{{"id": "d{k}", "text": "{"z" * 300}{k}"}}\n' for k in range(10)))
    docs = load_documents(path)
    assert [d.on_disk for d in docs] == [False] * 3 + [True] * 7
    assert [d.text for d in docs] == ["z" * 300 + str(k) for k in range(10)]


def _dictionary_parquet(path, text: str, rows: int) -> None:
    """A Parquet file of ``rows`` copies of ``text``, dictionary-encoded: one copy on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([text]))
    pq.write_table(pa.table({"text": column}), path, compression="zstd")


def test_a_parquet_table_of_repeated_long_texts_streams_in_bounded_memory(tmp_path):
    """2,000 rows of one 1 MiB text (a dictionary page: ~1 KB on disk, 2 GiB decoded) took 2.3 GB;
    its rows are now expanded one at a time."""
    path = tmp_path / "repeated.parquet"
    _dictionary_parquet(path, "c" * MiB, 2000)
    assert path.stat().st_size < 100_000
    code = (
        f"from fireviz.data.sources import iter_documents\nprint(sum(len(d) for d in iter_documents({str(path)!r})))\n"
    )
    rc, out, rss = run_measured(code)
    assert rc == 0 and out == str(2000 * MiB), out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"


def test_a_parquet_text_or_row_group_past_its_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "long.parquet"
    _dictionary_parquet(path, "d" * (3 * MiB), 2)
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "2")
    with pytest.raises(DataError, match=r"long.parquet: a text near row 0 is 3,145,728 bytes.*FIREVIZ_MAX_LINE_MB"):
        list(iter_documents(path))
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": ["e" * MiB] * 3}), plain, compression="zstd", use_dictionary=False)
    monkeypatch.setenv("FIREVIZ_MAX_PARQUET_GROUP_MB", "2")
    with pytest.raises(
        DataError, match=r"row group 0 holds [\d,]+ bytes of text.*FIREVIZ_MAX_PARQUET_GROUP_MB above 2"
    ):
        list(iter_documents(plain))
    monkeypatch.delenv("FIREVIZ_MAX_PARQUET_GROUP_MB")
    assert [len(d) for d in iter_documents(plain)] == [MiB] * 3


def test_a_streamed_dataset_row_past_the_line_limit_is_refused(monkeypatch):
    import sys
    import types

    rows = [{"text": "short"}, {"text": "x" * (3 * MiB)}]
    fake = types.SimpleNamespace(load_dataset=lambda *a, **k: iter(rows))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setenv("FIREVIZ_MAX_LINE_MB", "2")
    with pytest.raises(DataError, match=r"hf:org/c row 1 holds a text of 3,145,728 characters.*FIREVIZ_MAX_LINE_MB"):
        list(iter_documents("hf:org/c"))
