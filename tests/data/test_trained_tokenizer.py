"""``python -m fireviz tokenizer train`` (issue #37): a byte-level BPE tokenizer trained on bundled
text round-trips every text, loads with transformers and fireviz's HFTokenizer, and its byte
offsets cover every byte."""

from __future__ import annotations

import numpy as np
import pytest

from fireviz.cli import main as fireviz_main
from fireviz.data import Document, load_documents

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "prose-512"
    assert fireviz_main(["tokenizer", "train", "--vocab-size", "512", "--data", "prose", "--out", str(out)]) == 0
    return out


def test_every_character_and_document_round_trips(trained):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained)
    assert len(tok) == 512 and tok.bos_token == "<s>"
    every = "".join(chr(i) for i in range(1, 256)) + "✓ 𝔽 日本 \r\n\t <s> </s>"
    texts = [every] + [d.text for d in load_documents("code")[:3] + load_documents("latex")[:3]]
    for text in texts:
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert tok.decode(ids) == text
    assert tok("a")["input_ids"][0] == tok.bos_token_id  # BOS at each text's start


def test_byte_offsets_cover_every_byte_of_unseen_text(trained):
    from transformers import AutoTokenizer

    from fireviz.data.tokenizers import HFTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(trained), key="t")
    for doc in load_documents("code")[:4] + [Document("u", "Ünïcödé ✓ 😀 " * 20)]:
        td = tok.encode(doc)
        raw = len(doc.raw_bytes()[:])
        assert td.ids[0] == tok.bos_token_id and int(td.token_bytes().sum()) == raw
        assert (np.diff(td.byte_ends) >= 0).all()


def test_only_the_train_split_is_learned(tmp_path):
    import json

    from fireviz.data import split_documents
    from fireviz.data.tokenizers import train_bpe

    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"id": f"doc{k}", "text": f"text number {k} " * 20}) + "\n" for k in range(40)))
    docs = load_documents(small)
    summary = train_bpe(str(small), 300, tmp_path / "t")
    assert summary["documents"] == len(split_documents(docs, "train")) < len(docs)
    assert train_bpe(str(small), 300, tmp_path / "a", split="all")["documents"] == len(docs)


def test_bad_input_is_one_line(tmp_path, capsys):
    assert fireviz_main(["tokenizer", "train", "--vocab-size", "100", "--data", "prose", "--out", str(tmp_path)]) == 2
    assert "--vocab-size must be an integer >= 260" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = fireviz_main(
        ["tokenizer", "train", "--vocab-size", "300", "--data", str(empty), "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "error" in capsys.readouterr().err
