"""Shared fixtures: tiny checkpoints on disk and an environment that points the app at them.

The tests are grouped by the fireviz package they test (tests/<package>/; tests/project/ holds
the repository-wide ones); the helper modules next to this file (hub_server, hub_folders,
plotly_data, bad_content) and this one (``from conftest import make_tiny_checkpoint``) are
importable from every folder: tests/ is put on ``sys.path`` below.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

from fireviz.model.gpt import GPT, GPTConfig

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # the helper modules, whatever folder a test module lives in
    sys.path.insert(0, str(TESTS))

# The app's job queues compute in the job thread under test, so settings a test monkeypatches
# (e.g. the interval floor below) reach the work; the worker-process path has its own tests
# (tests/core/test_worker.py, tests/ui/test_job_worker.py).
os.environ.setdefault("FIREVIZ_JOB_WORKER", "thread")
# the evaluation cache's signing secret (fireviz.eval.cache.cache_secret_path): one per test session,
# never the user's own in ~/.config
os.environ.setdefault(
    "FIREVIZ_CACHE_KEY_FILE", os.path.join(__import__("tempfile").mkdtemp(prefix="fireviz-test-"), "eval-cache.key")
)

#: Encodings of the tiny checkpoints (additive learned, additive fixed, rotary).
TINY_ENCODINGS = ("fire", "alibi", "rope")
TINY_SEQ_LEN = 32


def run_interleaved(worker, args) -> None:
    """Run ``worker(a)`` for each ``a`` in ``args`` on its own thread, all at once, with the
    interpreter switching threads every 10 µs (so their passes interleave); returns when all end."""
    threads = [threading.Thread(target=worker, args=(a,)) for a in args]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)


def make_tiny_checkpoint(
    folder: Path, encoding: str, seq_len: int = TINY_SEQ_LEN, seed: int = 0, log_steps: int = 20, results: bool = False
) -> Path:
    """Write a 2-layer, 2-head, width-32 checkpoint with a synthetic train_log.jsonl.

    The log mimics fireviz.train: step, tokens, loss, lr, tokens_per_s every step, and
    val_loss / val_loss_4x every 5th step. With ``results`` a small evaluation results JSON
    (per_length at seq_len and 8·seq_len on prose) is written too.
    """
    torch.manual_seed(seed)
    cfg = GPTConfig(
        n_layer=2,
        n_head=2,
        d_model=32,
        seq_len=seq_len,
        position_encoding=encoding,
        training={"tokens": log_steps * 4 * seq_len, "data": {"domain": "prose"}, "steps": log_steps},
    )
    model = GPT(cfg)
    if encoding == "fire":  # make the heads differ so curves are not all alike
        with torch.no_grad():
            for enc in model.encodings:
                enc.mlp[-1].weight.copy_(
                    torch.tensor([[2.0] * enc.mlp_width, [-2.0] * enc.mlp_width])[:, : enc.mlp_width] / enc.mlp_width
                )
    model.save_pretrained(folder)
    with open(folder / "train_log.jsonl", "w") as f:
        for step in range(1, log_steps + 1):
            rec = {
                "step": step,
                "tokens": step * 4 * seq_len,
                "loss": 5.5 * math.exp(-step / 10) + 1.0,
                "lr": 1e-3,
                "tokens_per_s": 1000.0,
            }
            if step % 5 == 0:
                rec["val_loss"] = 5.6 * math.exp(-step / 10) + 1.1
                rec["val_loss_4x"] = rec["val_loss"] + 0.5
            f.write(json.dumps(rec) + "\n")
    if results:
        per_length = [
            {
                "length": n,
                "nats_per_token": v,
                "perplexity": math.exp(v),
                "bits_per_byte": v / math.log(2),
                "tokens_scored": 100,
                "windows": 4,
            }
            for n, v in ((seq_len, 1.5), (8 * seq_len, 2.5))
        ]
        from fireviz.checkpoints import checkpoint_sha256  # the rows name the weights they were made on

        row = {
            "checkpoint": folder.name,
            "checkpoint_sha256": checkpoint_sha256(folder),
            "settings": {"data": "prose"},
            "per_length": per_length,
        }
        (folder / "results_prose.json").write_text(json.dumps(row))
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    tiny models on a shared 2-core machine run ~10× faster so, and subprocesses given
    OMP_NUM_THREADS=1 then match in-process runs bitwise."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoints_dir(tmp_path_factory) -> Path:
    """A folder holding tiny checkpoints ``fire`` (with results JSON), ``alibi`` and ``rope``."""
    root = tmp_path_factory.mktemp("checkpoints")
    for i, enc in enumerate(TINY_ENCODINGS):
        make_tiny_checkpoint(root / enc, enc, seed=i, results=(enc == "fire"))
    return root


@pytest.fixture
def root(tmp_path) -> Path:
    """Two good checkpoints (``good``, ``victim``) under one root."""
    r = tmp_path / "root"
    make_tiny_checkpoint(r / "good", "alibi", results=True)
    make_tiny_checkpoint(r / "victim", "fire", results=True)
    return r


@pytest.fixture
def app_env(tiny_checkpoints_dir, tmp_path, monkeypatch) -> Path:
    """Point the app at the tiny checkpoints (FIREVIZ_CHECKPOINTS_DIR) and a fresh eval cache
    (FIREVIZ_CACHE_DIR). Returns the checkpoints folder."""
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(tiny_checkpoints_dir))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "eval_cache"))
    return tiny_checkpoints_dir


@pytest.fixture(autouse=True)
def small_corpora_get_intervals(monkeypatch):
    """The test corpora hold 3–7 documents; the product gives no interval below
    ``stats.MIN_INTERVAL_DOCUMENTS`` (10). Tests of the interval arithmetic lower the
    floor to 2; ``tests/eval/test_evaluate.py::test_too_few_documents_get_no_interval`` checks the real one."""
    import fireviz.eval.stats as stats

    monkeypatch.setattr(stats, "MIN_INTERVAL_DOCUMENTS", 2)


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """A fresh Hugging Face cache and fireviz cache under ``tmp_path``, online, no token: the Hub path
    against the loopback server (``tests/hub_server.py``). Returns ``tmp_path``."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "fireviz_cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    return tmp_path
