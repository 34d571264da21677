"""fireviz.synthetic: the copy task, training on it, and evaluating answer loss and accuracy."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from fireviz.cli import eval as eval_cli
from fireviz.data import synthetic as S
from fireviz.data.corpus import DataError
from fireviz.eval import evaluation as ev
from fireviz.model.gpt import BOS_ID, GPT, GPTConfig
from fireviz.train.config import apply_overrides, configs_from_tables
from fireviz.train.loop import train


@pytest.mark.parametrize("length", [4, 5, 64, 65, 513])
def test_copy_sequences(length):
    task = S.CopyTask()
    seq = task.sequence(length, seed=7)
    first = task.split(length)
    n = first - 2
    assert seq.shape == (length,) and seq.dtype == torch.int64
    assert seq[0] == BOS_ID and seq[n + 1] == S.SEP_ID
    s = seq[1 : n + 1]
    assert set(s.tolist()) <= set(S.COPY_ALPHABET.tolist()) and S.SEP_ID not in S.COPY_ALPHABET
    assert torch.equal(seq[first:], s[: length - first])  # the answers are the string again
    assert 0 <= n - (length - first) <= 1  # the copy is the whole string, or all but its last symbol
    assert torch.equal(task.sequence(length, seed=7), seq) and not torch.equal(task.sequence(length, seed=8), seq)


def test_copy_task_errors_and_names():
    with pytest.raises(DataError, match="at least 4 tokens"):
        S.CopyTask().split(3)
    with pytest.raises(DataError, match="synthetic:copy"):
        S.load_task("synthetic:sort")
    assert S.is_synthetic("synthetic:copy") and not S.is_synthetic("prose")
    stream = S.SyntheticStream(S.load_task("synthetic:copy"))
    a = stream.batch(torch.tensor([3, 99]), 20)
    assert torch.equal(a, stream.batch(torch.tensor([3, 99]), 20)) and not torch.equal(a[0], a[1])
    v = S.validation_sequences(S.CopyTask(), 33, 4)
    assert v.shape == (4, 33) and torch.equal(v, S.validation_sequences(S.CopyTask(), 33, 4))


def _tables(**train):
    t = {
        "data": "synthetic:copy",
        "batch_size": 8,
        "max_steps": 12,
        "lr": 3e-3,
        "warmup_steps": 2,
        "eval_interval": 6,
        "eval_batches": 1,
        "checkpoint_interval": 6,
        "seed": 0,
        "device": "cpu",
    }
    t.update(train)
    return {"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "position_encoding": "fire"}, "train": t}


def test_training_on_the_copy_task_counts_only_the_answers(tmp_path):
    mc, tc = configs_from_tables(apply_overrides(_tables(), []))
    train(mc, tc, tmp_path / "run", progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "val_loss" in r] == [0, 6, 12]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["training"]["data_fingerprint"] == S.CopyTask().fingerprint()
    # the logged validation loss is the answer loss of the fixed validation sequences
    model = GPT.from_pretrained(str(tmp_path / "run")).eval()
    val = S.validation_sequences(S.CopyTask(), 17, 8)
    first = S.CopyTask().split(17)
    with torch.no_grad():
        logits = model(val[:, :-1])
    expected = F.cross_entropy(logits[:, first - 1 :].reshape(-1, logits.shape[-1]), val[:, first:].reshape(-1))
    assert log[-1]["val_loss"] == pytest.approx(float(expected), rel=1e-5)


def test_evaluating_on_the_copy_task(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for enc in ("fire", "alibi"):
        torch.manual_seed(0)
        GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, position_encoding=enc)).save_pretrained(
            tmp_path / enc
        )
    r = ev.evaluate_many(
        [tmp_path / "alibi", tmp_path / "fire"], "synthetic:copy", [16, 40], token_budget=6, device="cpu"
    )
    assert r[0]["settings"]["mode"] == "synthetic" and r[0]["settings"]["token_budget"] == 6
    model = GPT.from_pretrained(str(tmp_path / "fire")).eval()
    task = S.CopyTask()
    for e in r[1]["per_length"]:
        n = e["length"]  # the model reads n tokens of a sequence of n + 1, as a training window at seq_len n
        seqs = task.sequences(n + 1, 6, S.EVALUATION_SEED + n)
        first = task.split(n + 1)
        with torch.no_grad():
            logits = model(seqs[:, :n])
        pred, tgt = logits[:, first - 1 : n], seqs[:, first:]
        nll = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), tgt.reshape(-1))
        assert e["tokens_scored"] == 6 * (n + 1 - first) and e["windows"] == 6 and e["documents"] == 6
        assert e["nats_per_token"] == pytest.approx(float(nll), rel=1e-5)
        hits = (pred.argmax(-1) == tgt).sum(1)
        assert e["accuracy"] == pytest.approx(float(hits.sum()) / (6 * (n + 1 - first)))
        assert e["sequence_accuracy"] == pytest.approx(float((hits == n + 1 - first).float().mean()))
        lo, hi = e["accuracy_ci95"]
        assert lo <= e["accuracy"] <= hi
        assert "paired_delta_bpb" in e and e["first_answer_position"] == first
    again = ev.evaluate_many([tmp_path / "fire"], "synthetic:copy", [16], token_budget=6, device="cpu")
    assert again[0]["per_length"][0]["cached"]
    with pytest.raises(ev.EvaluationError, match="drop --mode"):
        ev.evaluate_many([tmp_path / "fire"], "synthetic:copy", [16], mode="sliding", stride=4, device="cpu")
    assert "answer accuracy" in eval_cli.format_table(r)
    # --seed draws another set of sequences (seed 0 is the published set above)
    other = ev.evaluate_many([tmp_path / "fire"], "synthetic:copy", [16], token_budget=6, seed=1, device="cpu")
    seqs = task.sequences(17, 6, S.evaluation_seed(16, 1))
    assert not torch.equal(seqs, task.sequences(17, 6, S.EVALUATION_SEED + 16))
    with torch.no_grad():
        logits = model(seqs[:, :16])
    first = task.split(17)
    nll = F.cross_entropy(logits[:, first - 1 : 16].reshape(-1, logits.shape[-1]), seqs[:, first:].reshape(-1))
    assert other[0]["settings"]["seed"] == 1 and not other[0]["per_length"][0].get("cached")
    # its own format in the cache key: entries made when --seed drew seed 0's set are never read for it
    assert (r[0]["settings"]["task_format"], other[0]["settings"]["task_format"]) == (2, 3)
    assert other[0]["per_length"][0]["nats_per_token"] == pytest.approx(float(nll), rel=1e-5)


def test_the_copy_config_loads():
    from pathlib import Path

    from fireviz.train.config import load_config

    mc, tc = load_config(Path(__file__).resolve().parents[2] / "configs" / "copy.toml")
    assert tc.data == "synthetic:copy" and mc.seq_len == 64


def test_eval_cli_default_lengths_follow_a_synthetic_tasks_training_length(tmp_path, monkeypatch):
    """Without --lengths, a synthetic task is evaluated at L/4 … 16·L of the checkpoint's training
    length L (the task groups' published range), not prose's 128…8192."""
    from fireviz.checkpoints import Checkpoint
    from fireviz.eval.settings import DEFAULT_LENGTHS

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=16, position_encoding="alibi")).save_pretrained(
        tmp_path / "m"
    )
    out = tmp_path / "r.json"
    argv = [str(tmp_path / "m"), "--data", "synthetic:copy", "--token-budget", "2", "--quiet", "--device", "cpu"]
    assert eval_cli.main([*argv, "--out", str(out)]) == 0
    assert [e["length"] for e in json.loads(out.read_text())[0]["per_length"]] == [4, 8, 16, 32, 64, 128, 256]
    prose = eval_cli.build_parser().parse_intermixed_args([str(tmp_path / "m"), "--data", "prose"])
    ckpt = Checkpoint.resolve(tmp_path / "m")
    assert eval_cli.settings_from_args(prose, [ckpt]).lengths == tuple(DEFAULT_LENGTHS)
