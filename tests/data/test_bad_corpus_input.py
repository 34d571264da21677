"""Bad input (issue 21) in text data (fireviz.data.corpus): bytes are bytes (Latin-1, invalid
UTF-8, lone surrogates), documents read from disk equal those in memory, and broken data
files are data errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from fireviz.data import corpus as data


# -- bytes are bytes --------------------------------------------------------------------------------
def test_latin1_text_is_tokenized_as_its_raw_bytes(tmp_path):
    raw = "café — naïve ".encode("latin-1", errors="replace") * 5
    p = tmp_path / "latin1.txt"
    p.write_bytes(raw)
    with pytest.warns(data.RawBytesWarning, match="raw bytes"):
        docs = data.load_documents(p)
    toks = data.document_tokens(docs[0])
    assert bytes(toks[1:].tolist()) == raw and docs[0].num_tokens == len(raw) + 1
    stream = data.TokenStream(docs)
    assert bytes(stream.tokens[1:].astype("uint8").tobytes()) == raw


def test_invalid_utf8_and_lone_surrogates_in_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"id": "a", "text": "x\\ud800y"}\n{"id": "b\xff", "text": "ok \xe9 bytes"}\n')
    with pytest.warns(data.RawBytesWarning):
        docs = data.load_documents(p)
    assert bytes(data.document_tokens(docs[0])[1:].tolist()) == b"x\xed\xa0\x80y"  # surrogatepass bytes
    assert bytes(data.document_tokens(docs[1])[1:].tolist()) == b"ok \xe9 bytes"
    data.data_fingerprint(docs)
    data.is_validation(docs[1].id)


def test_valid_utf8_warns_nothing_and_is_unchanged(tmp_path):
    p = tmp_path / "u.txt"
    p.write_text("naïve café ✓", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.RawBytesWarning)
        docs = data.load_documents(p)
    assert bytes(data.document_tokens(docs[0])[1:].tolist()) == "naïve café ✓".encode()


def test_train_and_eval_take_a_lone_surrogate(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "ab\ud800cd " * 20}) + "\n" for i in range(3)))
    with pytest.warns(data.RawBytesWarning):
        docs = data.load_documents(p)
    data.TokenStream(docs, min_tokens=17).batch(torch.tensor([0, 3]), 17)


# -- progress for every long call -------------------------------------------------------------------
def test_document_tokens_slices_equal_the_int64_tokens():
    doc = data.Document("d", "héllo wörld " * 7)
    full, lazy = data.document_tokens(doc), data.DocumentTokens(doc)
    assert len(lazy) == len(full) == doc.num_tokens
    for a, b in ((0, 1), (0, 9), (1, 9), (5, len(full)), (len(full) - 3, len(full) + 10), (4, 4)):
        assert torch.equal(lazy[a:b], full[a:b]), (a, b)


@pytest.mark.parametrize("kind", ["txt", "txt.gz", "jsonl"])
def test_documents_on_disk_read_the_same_tokens_as_in_memory(tmp_path, monkeypatch, kind):
    """A plain file is read on demand, a compressed one spooled, a big JSONL line spooled:
    every slice, the fingerprint (so every cache key), the split and the text are those of
    the same document held in memory."""
    import gzip
    import json as _json

    from fireviz.data import corpus as data

    monkeypatch.setattr(data, "SPOOL_BYTES", 1000)  # spool anything over 1000 bytes
    text = "Grüße, ✓ straße " * 400 + "\udcff end"  # non-ASCII, and one raw byte (0xff, surrogateescape'd)
    raw = data.text_bytes(text)
    p = tmp_path / f"doc.{kind}"
    if kind == "txt":
        p.write_bytes(raw)
    elif kind == "txt.gz":
        p.write_bytes(gzip.compress(raw))
    else:
        p.write_text(_json.dumps({"id": "doc.txt", "text": text}) + "\n")
    with pytest.warns(data.RawBytesWarning):
        (doc,) = data.load_documents(p)
    if kind != "jsonl":
        assert doc.id == p.name
        doc = data.Document(doc.id, raw=doc.raw_bytes())
    mem = data.Document(doc.id, text)
    assert doc.on_disk and not mem.on_disk and doc == mem and len(doc) == len(raw)
    assert data.data_fingerprint([doc]) == data.data_fingerprint([mem])
    assert data.text_bytes(doc.text) == raw
    a, b = data.DocumentTokens(doc), data.DocumentTokens(mem)
    for lo, hi in [(0, 7), (5, 900), (len(a) - 3, len(a)), (3, 3)]:
        assert torch.equal(a[lo:hi], b[lo:hi])
    assert torch.equal(data.document_tokens(doc), data.document_tokens(mem))
    assert np.array_equal(data.TokenStream([doc]).tokens, data.TokenStream([mem]).tokens)


# -- found by an adversarial review ------------------------------------------------------------------
def test_data_files_with_giant_numbers_or_corrupt_gzip_are_data_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "text": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(data.DataError, match="not valid JSON"):
        data.load_documents(p)
    g = tmp_path / "d.jsonl.gz"
    g.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    with pytest.raises(data.DataError, match="cannot read"):
        data.load_documents(g)


def test_a_data_folder_takes_every_text_kind_with_paths_as_ids_and_one_spool(tmp_path, monkeypatch):
    import gzip

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.txt").write_text("first document " * 10)
    (tmp_path / "b" / "x.txt").write_text("second document " * 10)
    (tmp_path / "c.md").write_text("# notes " * 10)
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(b"compressed text " * 10))
    docs = data.load_documents(tmp_path)
    assert [d.id for d in docs] == ["a/x.txt", "b/x.txt", "c.md", "d.txt.gz"]
    monkeypatch.setattr(data, "SPOOL_BYTES", 100)
    (tmp_path / "e.jsonl").write_text(
        "".join(json.dumps({"id": f"j{k}", "text": f"doc {k} " * 50}) + "\n" for k in range(30))
    )
    big = data.load_documents(tmp_path / "e.jsonl")
    assert all(d.on_disk for d in big) and len({id(d.raw_bytes().fileobj) for d in big}) == 1  # one descriptor
    assert [d.text for d in big] == [f"doc {k} " * 50 for k in range(30)]


def test_empty_files_in_a_folder_are_skipped_and_a_pipe_is_refused_not_waited_on(tmp_path):
    """Issue #38: a data folder with an empty file among its texts (an ``__init__.py``, an empty
    .jsonl) reads the others; a named pipe called ``*.jsonl`` (or .txt) is refused at once."""
    import os
    import threading

    from fireviz.data import DataError, load_documents

    folder = tmp_path / "src"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_bytes(b"")
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "a.txt").write_text("some text")
    (folder / "b.jsonl").write_text('{"id": "b", "text": "more"}\n')
    docs = load_documents(folder)
    assert sorted(d.text for d in docs) == ["more", "some text"]
    for name in ("pipe.jsonl", "pipe.txt"):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        result: list = []
        t = threading.Thread(
            target=lambda f=fifo, out=result: out.append(_refusal(load_documents, f, DataError)), daemon=True
        )
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{name}: waited on the pipe"
        assert result and "not a regular file" in result[0]


def _refusal(fn, arg, error) -> str:
    try:
        fn(arg)
    except error as e:
        return str(e)
    return "accepted"
