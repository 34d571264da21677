"""Token shards under the inputs a breaker found (issue #37): documents with no tokens, a folder
copied without its tokenizer, no validation documents, a prepare that fails at once, a source
changed after a finished prepare, edited tables, ids of raw bytes, bad options — each one clear
line or the right result, and nothing lost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fireviz.cli import main as fireviz_main
from fireviz.data import TokenStream, load_documents
from fireviz.data.corpus import DataError, is_validation
from fireviz.data.prepare import prepare
from fireviz.data.shards import TokenShards, shard_documents
from fireviz.data.tokenizers import BYTE_TOKENIZER

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.test_shards import _files, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl", n_docs=60)


def _wordpiece(folder: Path) -> Path:
    """A WordPiece tokenizer.json that adds no BOS and gives whitespace no token at all."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]"] + sorted(set("the cat sat on a mat while one dog ran to red barn".split()))
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_documents_that_give_no_token_are_kept_empty_and_the_folder_trains(tmp_path):
    pytest.importorskip("transformers")
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.train import load_config, train

    src = tmp_path / "ws.jsonl"
    lines = [{"id": f"w{k}", "text": "   \n\t " if k % 3 == 0 else "the cat sat on a mat " * 20} for k in range(60)]
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    tok = load_tokenizer(_wordpiece(tmp_path / "wp"))
    m = prepare(str(src), tok, tmp_path / "s", chunk_bytes=300)
    shards = TokenShards(tmp_path / "s")
    assert int((shards.orders["train"][:, 2] == 0).sum()) > 0  # the empty ones are there, with 0 tokens
    assert m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"] == 60
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nn_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 16\nvocab_size = 300\nposition_encoding = "alibi"\n'
        f'[train]\ndata = "{tmp_path / "s"}"\nbatch_size = 4\nmax_steps = 2\nwarmup_steps = 1\neval_interval = 2\n'
        'eval_batches = 1\ncheckpoint_interval = 2\ndevice = "cpu"\n'
    )
    mc, tc = load_config(cfg)
    assert train(mc, tc, tmp_path / "run", progress=False)["step"] == 2


def test_a_folder_copied_without_its_tokenizer_is_refused_before_training(corpus, tmp_path):
    pytest.importorskip("transformers")
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.data.tokenizers import train_bpe

    train_bpe(str(corpus), 280, tmp_path / "tok")
    prepare(str(corpus), load_tokenizer(tmp_path / "tok"), tmp_path / "s")
    cfg = tmp_path / "tokenizer.json"
    (tmp_path / "s" / "tokenizer" / "tokenizer.json").rename(cfg)
    with pytest.raises(DataError, match="tokenizer is missing|copy the shard folder whole"):
        TokenShards(tmp_path / "s")
    (tmp_path / "s" / "tokenizer" / "tokenizer.json").write_text(cfg.read_text().replace('"<s>"', '"<S>"', 1))
    with pytest.raises(DataError, match="does not hold the tokenizer"):
        TokenShards(tmp_path / "s")


def test_shards_with_no_validation_document_are_one_clear_error(tmp_path):
    from fireviz.data.corpus import is_validation
    from fireviz.train import load_config, train
    from fireviz.train.config import TrainingError

    ids = [f"t{k}" for k in range(400) if not is_validation(f"t{k}")][:30]
    src = tmp_path / "train_only.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": "words and more words " * 30}) + "\n" for i in ids))
    prepare(str(src), BYTE_TOKENIZER, tmp_path / "s")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nn_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 16\nposition_encoding = "alibi"\n'
        f'[train]\ndata = "{tmp_path / "s"}"\nbatch_size = 4\nmax_steps = 2\nwarmup_steps = 1\ndevice = "cpu"\n'
    )
    mc, tc = load_config(cfg)
    with pytest.raises((DataError, TrainingError), match="validation split .* is empty"):
        train(mc, tc, tmp_path / "run", progress=False)


def test_a_prepare_that_fails_at_once_leaves_nothing_and_the_fix_is_taken(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["some text here " * 10] * 12}), tmp_path / "a.parquet")
    args = ["prepare", "--data", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "o"), "--no-progress"]
    assert fireviz_main(args) == 2
    assert "--text-column" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert fireviz_main(args + ["--text-column", "body"]) == 0


def test_a_finished_prepare_sees_a_changed_source(corpus, tmp_path, capsys, monkeypatch):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(corpus.read_text())
    args = ["prepare", "--data", str(mine), "--out", str(tmp_path / "s"), "--no-progress"]
    assert fireviz_main(args) == 0
    before = _files(tmp_path / "s")
    assert fireviz_main(args) == 0 and "already prepared" in capsys.readouterr().out
    assert _files(tmp_path / "s") == before
    monkeypatch.chdir(tmp_path)  # the same file by a relative path is the same source
    assert fireviz_main(["prepare", "--data", "mine.jsonl", "--out", "s", "--no-progress"]) == 0
    with open(mine, "a") as f:
        f.write(json.dumps({"id": "late", "text": "a document added afterwards"}) + "\n")
    assert fireviz_main(args) == 2
    assert "differs from when" in capsys.readouterr().err
    assert {k: v for k, v in _files(tmp_path / "s").items()} == before


def test_edited_order_and_chunk_tables_are_refused(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "s", chunk_bytes=20_000)
    order_path = tmp_path / "s" / "train.order.npy"
    original = order_path.read_bytes()
    order = np.load(order_path)
    np.save(order_path, order[::-1].copy())  # in bounds, but another order: another training stream
    with pytest.raises(DataError, match="train.order.npy does not match"):
        TokenShards(tmp_path / "s")
    order_path.write_bytes(original)
    table = tmp_path / "s" / "chunk-00000.json"
    table.write_text(table.read_text().replace('"d0', '"e0', 1))
    with pytest.raises(DataError, match="chunk-00000.json does not match"):
        shard_documents(tmp_path / "s")
    manifest = tmp_path / "s" / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["splits"]
    manifest.write_text(json.dumps(m))
    with pytest.raises(DataError, match="lacks or garbles"):
        TokenShards(tmp_path / "s")


def test_ids_of_raw_bytes_and_trailing_nul_sort_as_the_corpus_stream(tmp_path):
    src = tmp_path / "raw.jsonl"
    ids = [b"a\xf5x", "a\uff01".encode(), "a😀".encode(), b"a", b"a\\u0000", b"b\xe9", b"a\xf5"]
    with open(src, "wb") as f:
        for k, i in enumerate(ids):
            line = b'{"id": "' + i + b'", "text": "' + f"text {k} ".encode() * (k + 3) + b'"}\n'
            f.write(line)
    docs = load_documents(src)
    assert any(d.id.startswith("a\udcf5") for d in docs)  # an id of raw bytes (not UTF-8), as read
    prepare(str(src), BYTE_TOKENIZER, tmp_path / "s")
    shards = TokenShards(tmp_path / "s")
    for split in ("train", "validation"):
        part = [d for d in docs if is_validation(d.id) == (split == "validation")]
        if part:
            ref = TokenStream(part)
            n = ref.num_tokens
            assert torch.equal(shards.stream(split).batch(torch.tensor([0]), n), ref.batch(torch.tensor([0]), n))


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan"])
def test_a_chunk_size_that_is_not_a_positive_number_is_one_line(corpus, tmp_path, capsys, bad):
    args = ["prepare", "--data", str(corpus), "--out", str(tmp_path / "s"), f"--chunk-mb={bad}", "--no-progress"]
    assert fireviz_main(args) == 2
    err = capsys.readouterr().err
    assert "--chunk-mb must be a positive number" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_a_tokenizer_file_by_another_name_is_refused_with_the_fix(tmp_path):
    pytest.importorskip("transformers")
    from fireviz.checkpoints.causal_lm import load_tokenizer
    from fireviz.model import CheckpointError

    path = _wordpiece(tmp_path / "wp")
    assert load_tokenizer(path).num_ids > 10
    other = path.rename(tmp_path / "wp" / "mine.json")
    with pytest.raises(CheckpointError, match="rename or copy it to tokenizer.json"):
        load_tokenizer(other)
