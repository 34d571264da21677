"""scripts/ship_checkpoint.py: the shipped copy stores float16 weights and a gzip log, loads to
float32 exactly as stored, and fireviz reads it everywhere a checkpoint is read."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_checkpoint

from fireviz.checkpoints import catalog as checkpoints
from fireviz.checkpoints import checkpoint_sha256
from fireviz.core.files import read_safetensors
from fireviz.model.gpt import GPT

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ship_checkpoint", ROOT / "scripts" / "ship_checkpoint.py")
ship_checkpoint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ship_checkpoint)


def test_shipped_copy_is_float16_loads_exactly_and_keeps_the_log(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src", "fire")
    assert ship_checkpoint.main([str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    tensors, meta = read_safetensors(dst / "model.safetensors")
    assert all(t.dtype == torch.float16 for t in tensors.values() if t.is_floating_point())
    assert meta["fireviz_stored_dtype"] == "float16" and len(meta["fireviz_converted_from_sha256"]) == 64
    assert (dst / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert not (dst / "train_log.jsonl").exists()
    assert gzip.decompress((dst / "train_log.jsonl.gz").read_bytes()) == (src / "train_log.jsonl").read_bytes()
    assert checkpoints.read_train_log(dst) == checkpoints.read_train_log(src)
    info = checkpoints.read_checkpoint(dst)
    assert info.headline and info.num_parameters == checkpoints.read_checkpoint(src).num_parameters
    model = GPT.from_pretrained(str(dst))
    for k, p in model.state_dict().items():  # float32 in memory, exactly the stored float16 values
        if k in tensors:
            assert p.dtype == torch.float32 and torch.equal(p, tensors[k].float())
    x = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        assert (model(x) - GPT.from_pretrained(str(src))(x)).abs().max() < 0.05


def test_shipping_refuses_overflow_and_the_same_folder(tmp_path, capsys):
    src = make_tiny_checkpoint(tmp_path / "src", "alibi")
    assert ship_checkpoint.main([str(src), str(src)]) == 2
    with pytest.raises(ValueError, match="overflows"):
        ship_checkpoint.convert({"w": torch.tensor([1e6])}, torch.float16)


def test_a_corrupt_gzip_log_costs_only_the_log(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "c", "alibi")
    (src / "train_log.jsonl").unlink()
    (src / "train_log.jsonl.gz").write_bytes(b"\x1f\x8bnot gzip")
    info = checkpoints.read_checkpoint(src)
    assert "gzip" in info.problems["train_log.jsonl"]
    assert checkpoint_sha256(src)
