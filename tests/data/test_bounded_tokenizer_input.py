"""Tokenizer files that are huge when parsed, and tokenizers that encode none of the text, end
in one line (issue #50): ``prepare`` never exits 0 with "0 tokens"."""

from __future__ import annotations

import json
import string

import pytest
from bombs import RSS_BOUND_MB, one_clear_line, run_cli_measured

from fireviz.checkpoints.causal_lm import load_tokenizer
from fireviz.data.tokenizers import MAX_TOKENIZER_FILE_BYTES, MAX_TOKENIZER_VALUES
from fireviz.model import CheckpointError


def _ascii_tokenizer(folder, unk: bool = False):
    """A BPE tokenizer whose vocabulary is ASCII letters, digits and punctuation, no merges, no
    byte fallback (and an unknown token when ``unk``): it cannot encode Greek."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = string.ascii_letters + string.digits + string.punctuation
    vocab = {c: i for i, c in enumerate(chars)}
    if unk:
        vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]" if unk else None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.mark.parametrize("unk", [False, True])
def test_prepare_refuses_a_tokenizer_that_encodes_no_byte_of_a_document(tmp_path, unk):
    tok = _ascii_tokenizer(tmp_path / "tok", unk)
    data = tmp_path / "greek.jsonl"
    data.write_text(json.dumps({"id": "g", "text": "καλημέρα κόσμε"}) + "\n")
    rc, out, rss = run_cli_measured(
        ["prepare", "--data", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / "s")]
    )
    assert rc != 0 and one_clear_line(out), out
    said = "only its unknown token" if unk else "no token"
    assert f"encodes document 'g' to {said}" in out and "byte-level tokenizer" in out, out
    assert "0 tokens" not in out and rss < RSS_BOUND_MB


def test_a_tokenizer_that_encodes_no_byte_of_plain_text_is_refused_when_loaded(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={"§": 0}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "t").mkdir()
    tok.save(str(tmp_path / "t" / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="encodes a probe text of letters and digits to no token"):
        load_tokenizer(tmp_path / "t" / "tokenizer.json")


def test_a_tokenizer_json_of_millions_of_entries_is_refused_before_it_is_parsed(tmp_path):
    """The issue's row: a 60 MB tokenizer.json of 3 million entries took 1.1 GB and was accepted."""
    folder = tmp_path / "big"
    folder.mkdir()
    entries = ",".join(f'"t{k}":{k}' for k in range(3_000_000))
    (folder / "tokenizer.json").write_text(
        '{"version":"1.0","model":{"type":"WordLevel","unk_token":"t0","vocab":{' + entries + "}}}"
    )
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    rc, out, rss = run_cli_measured(
        ["prepare", "--data", str(data), "--tokenizer", str(folder), "--out", str(tmp_path / "s")]
    )
    assert rc != 0 and one_clear_line(out), out
    assert f"at most {MAX_TOKENIZER_VALUES.value:,} are read" in out and "FIREVIZ_MAX_TOKENIZER_VALUES" in out, out
    assert rss < RSS_BOUND_MB, f"{rss:.0f} MiB"


def test_a_tokenizer_file_past_the_size_limit_is_refused_unread(tmp_path):
    folder = tmp_path / "huge"
    folder.mkdir()
    with open(folder / "tokenizer.json", "wb") as f:
        f.write(b'{"model": {"vocab": {')
        f.truncate(MAX_TOKENIZER_FILE_BYTES.value + 1)  # sparse: nothing written
    with pytest.raises(CheckpointError, match="more than the 64 MiB fireviz reads.*FIREVIZ_MAX_TOKENIZER_MB above 64"):
        load_tokenizer(folder / "tokenizer.json")


def test_prepare_refuses_a_corpus_its_tokenizer_turns_into_no_token_at_all(tmp_path):
    """Every document blank to a WordPiece tokenizer (whitespace gives no token): each is kept, but a
    folder of 0 tokens is refused at the end, not written with "0 tokens" and exit 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from fireviz.data import DataError
    from fireviz.data.prepare import prepare

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "cat": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "wp").mkdir()
    tok.save(str(tmp_path / "wp" / "tokenizer.json"))
    data = tmp_path / "blank.jsonl"
    data.write_text("".join(json.dumps({"id": f"b{k}", "text": " \n\t " * (k + 1)}) + "\n" for k in range(20)))
    with pytest.raises(DataError, match="encoded no byte of the .* bytes of text into a token"):
        prepare(str(data), load_tokenizer(tmp_path / "wp" / "tokenizer.json"), tmp_path / "s")
    assert not (tmp_path / "s" / "manifest.json").exists()
