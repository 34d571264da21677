"""Training from token shards (issue #37): a byte-tokenized run from shards equals today's run step
for step (also under torchrun); a BPE model stores its tokenizer, and everything downstream —
evaluation, biases, fitting and every app page — reads text in that tokenizer's tokens."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fireviz.cli import main as fireviz_main
from fireviz.data.prepare import prepare
from fireviz.data.tokenizers import BYTE_TOKENIZER
from fireviz.model import CheckpointError
from fireviz.train import load_config, train
from fireviz.train.config import TrainingError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app_pages import click_and_wait as _click_and_wait  # noqa: E402
from app_pages import ok as _ok  # noqa: E402
from app_pages import page as _page  # noqa: E402
from data.test_shards import write_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOSSES = ("loss", "val_loss", "val_loss_4x", "val_loss_random")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl", n_docs=120)


def _toml(path: Path, data: str, **model) -> Path:
    m = {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32, "position_encoding": "fire"} | model
    lines = ["[model]"] + [f"{k} = {json.dumps(v)}" for k, v in m.items()]
    lines += ["[train]", f"data = {json.dumps(data)}", "batch_size = 8", "max_steps = 12", "lr = 3e-3"]
    lines += ["warmup_steps = 2", "eval_interval = 6", "eval_batches = 1", "checkpoint_interval = 6", 'device = "cpu"']
    path.write_text("\n".join(lines) + "\n")
    return path


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _same_losses(a: list[dict], b: list[dict], tol: float = 0.0) -> float:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        for k in LOSSES:
            assert (k in ra) == (k in rb), k
            if k in ra:
                worst = max(worst, abs(ra[k] - rb[k]))
    assert worst <= tol, worst
    return worst


def test_a_byte_run_from_shards_equals_the_run_from_the_corpus_step_for_step(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "shards", chunk_bytes=30_000)
    for name, data in (("corpus", str(corpus)), ("shards", str(tmp_path / "shards"))):
        mc, tc = load_config(_toml(tmp_path / f"{name}.toml", data))
        train(mc, tc, tmp_path / name, progress=False)
    _same_losses(_log(tmp_path / "corpus"), _log(tmp_path / "shards"))  # bit for bit
    a, b = (json.loads((tmp_path / n / "config.json").read_text())["training"] for n in ("corpus", "shards"))
    assert a["data_fingerprint"] == b["data_fingerprint"] and b["tokenizer"]["key"] == "byte"
    assert not (tmp_path / "shards" / "tokenizer.json").exists()


@pytest.mark.slow
def test_two_gloo_processes_on_shards_equal_one(corpus, tmp_path):
    prepare(str(corpus), BYTE_TOKENIZER, tmp_path / "shards", chunk_bytes=30_000)
    cfg = _toml(tmp_path / "cfg.toml", str(tmp_path / "shards"))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fireviz"]
    cmd += ["train", "--config", str(cfg), "--out", str(tmp_path / "ddp"), "--no-progress"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mc, tc = load_config(cfg)
    train(mc, tc, tmp_path / "one", progress=False)
    _same_losses(_log(tmp_path / "ddp"), _log(tmp_path / "one"), tol=1e-5)  # float summation order only


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, corpus) -> dict:
    """A tokenizer of 300 tokens learned on the corpus, its shards, and a model trained on them."""
    root = tmp_path_factory.mktemp("bpe")
    assert (
        fireviz_main(["tokenizer", "train", "--vocab-size", "300", "--data", str(corpus), "--out", str(root / "tok")])
        == 0
    )
    args = ["prepare", "--data", str(corpus), "--tokenizer", str(root / "tok"), "--out", str(root / "shards")]
    assert fireviz_main(args + ["--no-progress"]) == 0
    mc, tc = load_config(_toml(root / "cfg.toml", str(root / "shards"), vocab_size=300, seq_len=24))
    train(mc, tc, root / "ckpts" / "bpe", progress=False)
    mc, tc = load_config(
        _toml(root / "t5.toml", str(root / "shards"), vocab_size=300, seq_len=24, position_encoding="t5")
    )
    train(mc, tc, root / "ckpts" / "bpe-t5", progress=False)
    return {"root": root, "ckpt": root / "ckpts" / "bpe", "t5": root / "ckpts" / "bpe-t5", "corpus": corpus}


def test_a_vocabulary_smaller_than_the_tokenizers_ids_is_refused_before_anything_is_written(bpe, tmp_path):
    mc, tc = load_config(_toml(tmp_path / "cfg.toml", str(bpe["root"] / "shards")))
    with pytest.raises(TrainingError, match="model.vocab_size=300"):
        train(mc, tc, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_bpe_checkpoint_stores_its_tokenizer_and_refuses_one_changed_since(bpe, tmp_path):
    from fireviz.checkpoints import Checkpoint

    ckpt = Checkpoint.resolve(bpe["ckpt"])
    assert ckpt.tokenizer.key == json.loads((bpe["ckpt"] / "config.json").read_text())["training"]["tokenizer"]["key"]
    assert ckpt.tokenizer.num_ids == 300 and ckpt.config.vocab_size == 300
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in bpe["ckpt"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    tj = broken / "tokenizer.json"
    tj.write_text(tj.read_text().replace('"<s>"', '"<S>"', 1))
    with pytest.raises(CheckpointError, match="restore the tokenizer files"):
        Checkpoint.resolve(broken)
    for f in broken.glob("tokenizer*.json"):
        f.unlink()
    with pytest.raises(CheckpointError, match="holds no tokenizer files"):
        Checkpoint.resolve(broken)


def test_bits_per_byte_of_a_bpe_model_are_its_summed_loss_over_the_bytes_its_targets_cover(bpe, monkeypatch, tmp_path):
    from fireviz.checkpoints import Checkpoint
    from fireviz.data import load_documents, split_documents
    from fireviz.eval import EvalCache, EvalSettings, evaluate

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = Checkpoint.resolve(bpe["ckpt"])
    n = 24
    settings = EvalSettings.make(str(bpe["corpus"]), [n], mode="nonoverlapping", token_budget=10**9)
    (res,) = evaluate([ckpt], settings, cache=EvalCache(enabled=False))
    entry = res["per_length"][0]
    docs = sorted(split_documents(load_documents(bpe["corpus"]), "validation"), key=lambda d: d.id)
    model = ckpt.load()
    nats, n_bytes = 0.0, 0
    with torch.no_grad():
        for d in docs:  # every window of n tokens at 0, n, 2n, …: the first token is context only
            td = ckpt.tokenizer.encode(d)
            ids, cover = torch.from_numpy(td.ids), td.token_bytes()
            for a in range(0, len(ids) - n + 1, n):
                logp = torch.log_softmax(model(ids[None, a : a + n]).double(), -1)[0, :-1]
                nats -= float(logp.gather(1, ids[a + 1 : a + n, None]).sum())
                n_bytes += int(cover[a + 1 : a + n].sum())
    assert entry["bytes_scored"] == n_bytes > 0
    assert math.isclose(entry["bits_per_byte"], nats / n_bytes / math.log(2), rel_tol=1e-5)


def test_a_bpe_model_goes_through_eval_biases_and_fit_on_the_command_line(bpe, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    ck = str(bpe["ckpt"])
    args = ["eval", ck, "--data", str(bpe["corpus"]), "--lengths", "24,48", "--out", str(tmp_path / "r.json")]
    assert fireviz_main(args + ["--quiet"]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    rows = res["results"] if isinstance(res, dict) and "results" in res else res
    assert all(math.isfinite(e["bits_per_byte"]) for e in rows[0]["per_length"])
    ctx = ["eval", ck, "--data", str(bpe["corpus"]), "--mode", "context", "--lengths", "8,full", "--split", "all"]
    ctx += ["--prefix-tokens", "96", "--context-targets", "16", "--stride", "8"]
    assert fireviz_main(ctx + ["--out", str(tmp_path / "c.json"), "--quiet"]) == 0  # in its own tokens
    crow = json.loads((tmp_path / "c.json").read_text())
    crow = (crow["results"] if isinstance(crow, dict) and "results" in crow else crow)[0]
    assert len(crow["per_length"]) == 2 and all("bytes_scored" in e for e in crow["per_length"])
    text = tmp_path / "t.txt"
    text.write_text(" ".join(json.loads(line)["text"] for line in bpe["corpus"].read_text().splitlines()[:20]))
    assert fireviz_main(["biases", ck, "--text", str(text), "--out", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["dilution"]["tokens"] == 24 * 16
    short = tmp_path / "short.txt"  # 600 bytes hold 16 × 24 byte tokens, not 384 of its BPE tokens
    short.write_text(text.read_text()[:600])
    assert fireviz_main(["biases", ck, "--text", str(short), "--out", str(tmp_path / "s.json")]) == 2
    assert "tokens" in capsys.readouterr().err
    fit = [
        "fit",
        "--target",
        str(bpe["t5"]),
        "--layer",
        "0",
        "--max-len",
        "48",
        "--steps",
        "5",
        "--out",
        str(tmp_path / "f.json"),
    ]
    assert fireviz_main(fit + ["--quiet"]) == 0
    assert (tmp_path / "b.json").is_file() and (tmp_path / "f.json").is_file()


@pytest.mark.slow
def test_a_bpe_model_goes_through_every_app_page(bpe, tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(bpe["root"] / "ckpts"))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    _ok(_page("app.py"))
    at = _page("1_Learned_biases.py", ckpt=["bpe", "bpe-t5"])
    _ok(at)
    assert len(at.get("plotly_chart")) >= 1
    at = _page("2_Fit_FIRE.py", target="checkpoint", ckpt="bpe-t5", max_len="24", steps="0", width="8")
    _ok(at)
    at.button(key="fit_go").click()
    end = time.time() + 120
    while len(at.get("plotly_chart")) < 2 and time.time() < end:
        time.sleep(0.5)
        at.run()
    _ok(at)
    assert len(at.get("plotly_chart")) >= 2  # the fitted curve against the checkpoint's learned T5 bias
    _ok(_page("4_Training_runs.py", ckpt=["bpe"]))
    at = _page("5_Attention.py", ckpt=["bpe"], atext="prose", alen="40")
    _ok(at)
    assert len(at.get("plotly_chart")) >= 1 and "own tokenizer" in " ".join(m.value for m in at.markdown)
    at = _page("3_Length_generalization.py", ckpt=["bpe"], len=["24", "48"])
    _ok(at)
    at = _click_and_wait(at, "Run", lambda a: len(a.get("plotly_chart")) >= 1)
    _ok(at)
    assert "tokens per byte" in " ".join(c.value for c in at.caption)


def test_token_ids_of_the_stored_tokenizer_are_what_the_model_trained_on(bpe):
    from fireviz.checkpoints import Checkpoint
    from fireviz.data import load_documents, split_documents
    from fireviz.data.shards import TokenShards

    shards = TokenShards(bpe["root"] / "shards")
    tok = Checkpoint.resolve(bpe["ckpt"]).tokenizer
    first = sorted(split_documents(load_documents(bpe["corpus"]), "validation"), key=lambda d: d.id)[0]
    assert np.array_equal(shards.documents("validation")[0][:].numpy(), tok.encode(first).ids)
