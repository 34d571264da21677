"""Memory before work (issue 21): fireviz.model.memory's estimates grow with length and batch,
refuse training, a fit or a bias report that cannot fit, and let normal work through."""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny_checkpoint

from fireviz.cli import train as train_cli
from fireviz.model.gpt import GPT


# -- memory before work ---------------------------------------------------------------------------
def test_forward_bytes_grows_with_length_and_batch():
    from fireviz.model import memory
    from fireviz.model.gpt import GPTConfig

    for enc in ("fire", "rope"):
        cfg = GPTConfig(position_encoding=enc)
        sizes = [memory.forward_bytes(cfg, 1, n) for n in (512, 1024, 4096, 16384)]
        assert sizes == sorted(sizes) and memory.forward_bytes(cfg, 2, 512) > sizes[0]


# -- progress for every long call -------------------------------------------------------------------
def test_training_fit_and_bias_report_refuse_what_cannot_fit(tmp_path, monkeypatch, capsys):
    from fireviz.analysis import biases as analysis
    from fireviz.fit import fitting as fit
    from fireviz.model import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 10 << 20)
    with pytest.raises(ValueError, match="needs about .* more than the 10 MiB available"):
        fit.fit_fire("alibi", 4096, num_heads=8, steps=1)
    model = GPT.from_pretrained(str(make_tiny_checkpoint(tmp_path / "c", "alibi")))
    with pytest.raises(ValueError, match="bias report up to query position"):
        analysis.bias_report(model, query_positions=[10_000_000])
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "abcd " * 1000}) + "\n" for i in range(12)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\nseq_len = 1024\nposition_encoding = "alibi"\n[train]\ndata = "{p}"\nmax_steps = 2\nbatch_size = 16\n'
    )
    rc = train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc != 0 and not (tmp_path / "run" / "model.safetensors").exists()
    assert "a training step (micro-batch 16 × seq_len 1024) needs about" in capsys.readouterr().err


def test_the_estimates_let_normal_work_through():
    from fireviz.model import memory
    from fireviz.model.gpt import GPTConfig

    cfg = GPTConfig(position_encoding="fire")
    assert memory.train_step_bytes(cfg, 16, 512, 900_000) < 4 << 30  # the shipped recipe: well under 24 GB
    assert memory.fit_bytes(8, 512) < 256 << 20
    assert memory.forward_bytes(cfg, 1, 8192) < 1 << 30
