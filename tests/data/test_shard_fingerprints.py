"""Training from token shards checks every document against the sha256 its chunk table lists and
records the fingerprint it computed (issue #50): a shard edited together with its chunk table and
manifest is refused, or, edited throughout, recorded as the data it now is."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fireviz.core import sha256_files
from fireviz.data import data_fingerprint, load_documents, split_documents
from fireviz.data.corpus import DataError
from fireviz.data.prepare import prepare
from fireviz.data.shards import HEADER, TokenShards
from fireviz.data.tokenizers import BYTE_TOKENIZER

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.test_shards import write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl", n_docs=40)


def _edit_first_train_document(folder: Path, *, table_doc_sha: bool, manifest_fingerprint: bool) -> None:
    """Change one byte of the first train document of chunk 0, then make the folder consistent as
    an attacker would: the shard's sha256 in its table and the manifest, the table's sha256 in the
    manifest, and (as asked) the document's sha256 in its table and the manifest's fingerprint."""
    shard, table_path, manifest_path = folder / "train-00000.bin", folder / "chunk-00000.json", folder / "manifest.json"
    table = json.loads(table_path.read_text())
    row = next(r for r in table["documents"] if r[1] == 0)
    raw = bytearray(shard.read_bytes())
    pos = HEADER.size + 2 * 1  # the first byte after the first document's BOS (uint16 tokens)
    raw[pos] = ord("Z") if raw[pos] != ord("Z") else ord("Y")
    shard.write_bytes(bytes(raw))
    if table_doc_sha:
        text = np.frombuffer(bytes(raw[HEADER.size :]), dtype="<u2")[1 : 1 + row[3]].astype(np.uint8).tobytes()
        row[4] = hashlib.sha256(text).hexdigest()
    table["shards"]["train"]["sha256"] = sha256_files(shard)
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    m = json.loads(manifest_path.read_text())
    m["splits"]["train"]["shards"][0]["sha256"] = sha256_files(shard)
    m["chunk_tables"][0] = sha256_files(table_path)
    if manifest_fingerprint:
        from fireviz.data.corpus import fingerprint_entry

        h = hashlib.sha256()
        for k in range(m["chunks"]):
            for r in json.loads((folder / f"chunk-{k:05d}.json").read_text())["documents"]:
                if r[1] == 0:
                    h.update(fingerprint_entry(r[0], bytes.fromhex(r[4])))
        m["splits"]["train"]["fingerprint"] = h.hexdigest()
    manifest_path.write_text(json.dumps(m, indent=1) + "\n")


def test_clean_shards_give_the_corpus_fingerprint_computed_from_their_documents(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=3000)
    fps = TokenShards(tmp_path / "s").verified_fingerprints()
    docs = load_documents(corpus)
    assert fps == {s: data_fingerprint(split_documents(docs, s)) for s in ("train", "validation")}


def test_a_shard_edited_with_its_shard_hashes_is_refused_by_its_documents_sha256(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=3000)
    _edit_first_train_document(tmp_path / "s", table_doc_sha=False, manifest_fingerprint=False)
    shards = TokenShards(tmp_path / "s")  # every file matches the manifest: the edit is consistent
    with pytest.raises(DataError, match=r"does not hash to the sha256 its table chunk-00000.json lists") as e:
        shards.verified_fingerprints()
    assert "\n" not in str(e.value)


def test_a_shard_edited_with_its_table_but_not_the_manifest_fingerprint_is_refused(corpus, tmp_path):
    """The issue's case: config.json recorded the clean corpus's fingerprint."""
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=3000)
    _edit_first_train_document(tmp_path / "s", table_doc_sha=True, manifest_fingerprint=False)
    with pytest.raises(DataError, match="names the train fingerprint .* but its chunk tables' documents give"):
        TokenShards(tmp_path / "s").verified_fingerprints()


def test_a_folder_edited_throughout_is_recorded_as_the_data_it_now_holds(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=3000)
    clean = TokenShards(tmp_path / "s").verified_fingerprints()["train"]
    _edit_first_train_document(tmp_path / "s", table_doc_sha=True, manifest_fingerprint=True)
    edited = TokenShards(tmp_path / "s").verified_fingerprints()["train"]
    assert edited != clean  # a run records what it trained on, never the clean corpus's name


def test_a_shard_folder_of_more_documents_than_a_load_holds_is_refused_before_any_is_made(
    corpus, tmp_path, monkeypatch
):
    from fireviz.data.shards import shard_documents

    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=3000)
    assert len(shard_documents(tmp_path / "s")) == 40
    monkeypatch.setenv("FIREVIZ_MAX_DOCUMENTS", "39")
    with pytest.raises(
        DataError, match="holds 40 documents, more than the 39 documents .*FIREVIZ_MAX_DOCUMENTS above 39"
    ):
        shard_documents(tmp_path / "s")


def test_a_chunk_holds_at_most_chunk_max_documents(corpus, tmp_path, monkeypatch):
    """Many tiny documents: a chunk is cut at CHUNK_MAX_DOCUMENTS as well as at chunk_bytes (2 million
    one-character documents made one chunk of 2.6 GB whose 250 MB table could not be read back)."""
    from fireviz.data import prepare as prepare_mod

    monkeypatch.setattr(prepare_mod, "CHUNK_MAX_DOCUMENTS", 7)
    m = prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s")  # 40 documents, far below chunk_bytes
    assert m["chunks"] == 6
    fps = TokenShards(tmp_path / "s").verified_fingerprints()
    assert fps["train"] == data_fingerprint(split_documents(load_documents(corpus), "train"))
