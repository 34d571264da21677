"""Token shards (issue #37): ``python -m fireviz prepare`` writes them once; training reads them by
memory map and, with the byte tokenizer, reads exactly the tokens it reads from the corpus."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fireviz.cli import main as fireviz_main
from fireviz.data import TokenStream, data_fingerprint, load_documents, split_documents
from fireviz.data import prepare as prepare_module
from fireviz.data.corpus import DataError, is_validation
from fireviz.data.prepare import prepare
from fireviz.data.shards import HEADER, ShardStream, TokenShards
from fireviz.data.tokenizers import BYTE_TOKENIZER
from fireviz.train.schedule import random_validation_windows, validation_windows

WORDS = "the cat sat on a mat while one dog ran to the red barn ✓ 日本 Ünï".split()


def write_corpus(path: Path, n_docs: int = 80, seed: int = 0, ids: bool = True) -> Path:
    """Word salad, 100–3000 bytes a document (some UTF-8), ids in shuffled order (the training
    stream sorts by id, the shards keep source order)."""
    rng = random.Random(seed)
    order = list(range(n_docs))
    rng.shuffle(order)
    with open(path, "w", encoding="utf-8") as f:
        for i in order:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 600)))
            f.write(json.dumps({"id": f"d{i:04d}", "text": text} if ids else {"text": text}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_byte_shards_hold_exactly_the_training_stream_and_validation_sets(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=20_000)
    shards = TokenShards(tmp_path / "s")
    docs = load_documents(corpus)
    train_docs, val_docs = split_documents(docs, "train"), split_documents(docs, "validation")
    assert len(shards.shards["train"]) > 3  # several chunks: windows cross shards
    stream, ref = shards.stream("train"), TokenStream(train_docs)
    assert stream.num_tokens == ref.num_tokens
    n = ref.num_tokens
    starts = torch.tensor([0, 1, n - 65, n - 64] + list(range(0, n - 64, 997)))
    assert torch.equal(stream.batch(starts, 64), ref.batch(starts, 64))
    assert shards.fingerprint("train") == data_fingerprint(train_docs)
    assert shards.fingerprint("validation") == data_fingerprint(val_docs)
    vdocs = shards.documents("validation")
    for length in (16, 100):
        assert torch.equal(validation_windows(vdocs, length, 12), validation_windows(val_docs, length, 12))
        assert torch.equal(
            random_validation_windows(vdocs, length, 12), random_validation_windows(val_docs, length, 12)
        )
    manifest = shards.manifest
    assert manifest["splits"]["train"]["bytes"] == sum(len(d) for d in train_docs)
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["key"] == "byte"


def test_the_cli_writes_the_same_shards_with_several_processes(corpus, tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["prepare", "--data", str(corpus), "--chunk-mb", "0.02", "--no-progress"]
    assert fireviz_main(args + ["--out", str(one)]) == 0
    assert "train.data=" in capsys.readouterr().out
    assert fireviz_main(args + ["--out", str(two), "--num-proc", "2"]) == 0
    assert _files(one) == _files(two)
    before = _files(one)
    assert fireviz_main(args + ["--out", str(one)]) == 0  # done already: checked, nothing rewritten
    assert _files(one) == before


class _Killed(Exception):
    """Stands for the process dying after some chunks were written."""


def test_a_prepare_killed_midway_resumes_to_byte_identical_shards(corpus, tmp_path, monkeypatch):
    full = tmp_path / "full"
    prepare(str(corpus), BYTE_TOKENIZER, full, chunk_bytes=15_000)
    real, calls = prepare_module.write_chunk, []

    def dies_at_the_fourth(out, k, *args):
        calls.append(k)
        if len(calls) == 4:
            (out / f".train-{k:05d}.bin.tmp-1").write_bytes(b"half a shard")  # what a kill leaves
            raise _Killed
        return real(out, k, *args)

    monkeypatch.setattr(prepare_module, "write_chunk", dies_at_the_fourth)
    killed = tmp_path / "killed"
    with pytest.raises(_Killed):
        prepare(str(corpus), BYTE_TOKENIZER, killed, chunk_bytes=15_000)
    with pytest.raises(DataError, match="did not finish"):
        TokenShards(killed)
    calls.clear()
    monkeypatch.setattr(prepare_module, "write_chunk", lambda out, k, *a: calls.append(k) or real(out, k, *a))
    prepare(str(corpus), BYTE_TOKENIZER, killed, chunk_bytes=15_000)
    assert calls[0] == 3  # the three finished chunks were kept
    assert _files(killed) == _files(full)


@pytest.mark.slow
def test_sigkill_during_prepare_then_the_same_command_gives_identical_shards(tmp_path):
    import os
    import signal
    import subprocess
    import time

    corpus = write_corpus(tmp_path / "big.jsonl", n_docs=1500, seed=3)
    args = [sys.executable, "-m", "fireviz", "prepare", "--data", str(corpus), "--chunk-mb", "0.01", "--no-progress"]
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    killed = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--out", str(killed)], cwd=repo, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(killed.glob("chunk-*.json"))) < 20 and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "prepare finished before it could be killed"
    assert not (killed / "manifest.json").exists()
    subprocess.run(args + ["--out", str(killed)], cwd=repo, env=env, check=True)
    subprocess.run(args + ["--out", str(tmp_path / "full")], cwd=repo, env=env, check=True)
    assert _files(killed) == _files(tmp_path / "full")


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "magic", "order"])
def test_a_corrupt_or_foreign_shard_is_refused_and_left_as_it_is(corpus, tmp_path, damage):
    folder = tmp_path / "s"
    prepare(str(corpus), BYTE_TOKENIZER, folder, chunk_bytes=30_000)
    target = folder / "train-00001.bin"
    raw = bytearray(target.read_bytes())
    if damage == "flip":
        raw[HEADER.size + 10] ^= 1
    elif damage == "truncate":
        raw = raw[:-3]
    elif damage == "foreign":  # a shard of another tokenizer: its header names it
        raw[HEADER.size - 32 : HEADER.size] = hashlib.sha256(b"another").digest()
    elif damage == "magic":
        raw[:8] = b"GPT2BIN\0"
    if damage == "order":
        target = folder / "train.order.npy"
        order = np.load(target)
        order[0, 2] += 10**9
        np.save(target, order)
        raw = bytearray(target.read_bytes())
    else:
        target.write_bytes(bytes(raw))
    expect = {
        "flip": "corrupt",
        "truncate": "truncated",
        "foreign": "foreign",
        "magic": "not a fireviz",
        "order": "corrupt",
    }
    with pytest.raises(DataError, match=expect[damage]) as e:
        TokenShards(folder)
    assert target.name in str(e.value)
    assert target.read_bytes() == bytes(raw)


def test_other_settings_or_a_changed_source_are_refused_before_anything_is_written(corpus, tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(corpus.read_text())
    folder = tmp_path / "s"
    prepare(str(mine), BYTE_TOKENIZER, folder, chunk_bytes=20_000)
    with pytest.raises(DataError, match="chunk_bytes"):
        prepare(str(mine), BYTE_TOKENIZER, folder, chunk_bytes=10_000)
    (folder / "manifest.json").unlink()  # as if killed before its end
    before = _files(folder)
    mine.write_text(corpus.read_text().replace("cat", "cow", 1))  # the data changed under the run
    with pytest.raises(DataError, match="differs from when"):
        prepare(str(mine), BYTE_TOKENIZER, folder, chunk_bytes=20_000)
    assert _files(folder) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="holds other files"):
        prepare(str(corpus), BYTE_TOKENIZER, other)
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_parquet_files_stream_with_ids_from_a_column_or_their_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"document {k} " * (k + 3) for k in range(50)]
    pq.write_table(
        pa.table({"id": [f"p{k}" for k in range(50)], "content": texts}), tmp_path / "a.parquet", row_group_size=7
    )
    m = prepare(str(tmp_path / "a.parquet"), BYTE_TOKENIZER, tmp_path / "s", text_column="content")
    jsonl = tmp_path / "same.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"p{k}", "text": t}) + "\n" for k, t in enumerate(texts)))
    assert m["source"]["fingerprint"] == data_fingerprint(load_documents(jsonl))
    pq.write_table(pa.table({"text": texts[:5]}), tmp_path / "b.parquet")
    shards = TokenShards(prepare(str(tmp_path / "b.parquet"), BYTE_TOKENIZER, tmp_path / "t") and tmp_path / "t")
    ids = [row[0] for row in json.loads((tmp_path / "t" / "chunk-00000.json").read_text())["documents"]]
    assert ids == [f"b.parquet#{k}" for k in range(5)] and shards.manifest["splits"]["train"]["documents"] >= 1
    with pytest.raises(DataError, match="no column 'text'"):
        prepare(str(tmp_path / "a.parquet"), BYTE_TOKENIZER, tmp_path / "u")


def test_a_hugging_face_dataset_is_streamed_record_by_record(tmp_path, monkeypatch):
    seen = []

    def load_dataset(name, config, split, streaming):
        assert streaming and (name, config, split) == ("org/corpus", "en", "train")

        def records():
            for k in range(30):
                seen.append(k)
                yield {"text": f"record {k} " * 40, "url": "x"}

        return records()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    m = prepare("hf:org/corpus", BYTE_TOKENIZER, tmp_path / "s", hf_config="en", chunk_bytes=2000)
    assert seen == list(range(30)) and m["chunks"] > 3
    assert m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"] == 30
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(DataError, match="pip install datasets"):
        prepare("hf:org/corpus", BYTE_TOKENIZER, tmp_path / "t")


def test_a_bpe_tokenizers_shards_hold_its_own_ids_and_its_files(corpus, tmp_path):
    pytest.importorskip("transformers")
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.data.tokenizers import train_bpe

    train_bpe(str(corpus), 300, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.num_ids == 300 and load_tokenizer(tmp_path / "tok" / "tokenizer.json").key != "byte"
    m = prepare(str(corpus), tok, tmp_path / "s", chunk_bytes=25_000)
    shards = TokenShards(tmp_path / "s")
    assert m["tokenizer"]["key"] == tok.key and (tmp_path / "s" / "tokenizer" / "tokenizer.json").is_file()
    docs = sorted(split_documents(load_documents(corpus), "train"), key=lambda d: d.id)
    want = np.concatenate([tok.encode(d).ids for d in docs])
    stream: ShardStream = shards.stream("train")
    assert stream.num_tokens == len(want) < sum(d.num_tokens for d in docs)
    assert np.array_equal(stream.batch(torch.tensor([0]), len(want))[0].numpy(), want)
    assert m["splits"]["train"]["bytes"] == sum(len(d) for d in docs)
    from fireviz.data.shards import shard_documents

    with pytest.raises(DataError, match="not text"):  # token ids: evaluation reads its source instead
        shard_documents(tmp_path / "s")


def test_evaluation_reads_the_same_documents_from_byte_shards_and_refuses_token_ids(corpus, tmp_path):
    from fireviz.data.shards import shard_documents
    from fireviz.eval.plan import load_eval_documents

    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=25_000)
    for split in ("validation", "all"):
        a, _, fp_a = load_eval_documents(str(corpus), split)
        b, _, fp_b = load_eval_documents(str(tmp_path / "s"), split)
        assert fp_a == fp_b and [d.id for d in a] == [d.id for d in b]
        assert all(
            d.on_disk and d.text == e.text and d.raw_bytes()[3:9].tobytes() == e.text.encode()[3:9]
            for d, e in zip(b, a, strict=True)
        )
    (tmp_path / "s" / "manifest.json").write_text(
        (tmp_path / "s" / "manifest.json").read_text().replace('"key": "byte"', '"key": "0123"', 1)
    )
    with pytest.raises(DataError):  # a manifest naming another tokenizer than its shards: foreign
        shard_documents(tmp_path / "s")


def test_ids_of_any_script_and_repeated_ids_give_the_corpus_stream_order(tmp_path):
    ids = ["b", "a", "Z", "a", "日本", "ä", "a b", "ab", "é1", "𝔽", "a", "10", "9", "", "~"]
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": f"text of {k} " * (k + 5)}) + "\n" for k, i in enumerate(ids)))
    prepare(str(src), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=200)
    shards, docs = TokenShards(tmp_path / "s"), load_documents(src)
    for split in ("train", "validation"):
        part = [d for d in docs if (split == "validation") == is_validation(d.id)]
        if not part:
            continue
        ref = TokenStream(part)
        got = shards.stream(split)
        assert torch.equal(got.batch(torch.tensor([0]), ref.num_tokens), ref.batch(torch.tensor([0]), ref.num_tokens))


def test_max_documents_takes_the_first_documents_of_a_stream_and_is_part_of_the_settings(corpus, tmp_path):
    from fireviz.data.tokenizers import train_bpe

    m = prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", max_documents=10)
    assert m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"] == 10
    assert m["source"]["max_documents"] == 10
    with pytest.raises(DataError, match="max_documents: 10 then, 11 now"):
        prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", max_documents=11)
    with pytest.raises(ValueError, match="max-documents"):
        prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "t", max_documents=0)
    summary = train_bpe(str(corpus), 280, tmp_path / "tok", max_documents=7)
    assert summary["documents"] == 7 and 0 < summary["tokens_per_byte"] < 1
