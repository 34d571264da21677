"""The encoding a checkpoint was trained with is recorded in model.safetensors and compared with
config.json on load (issue #50): a config relabelled to another encoding of the same tensor names
is refused in one line, not scored silently."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import make_tiny_checkpoint

from fireviz.checkpoints import Checkpoint
from fireviz.model import ENCODING_METADATA_KEY, CheckpointError, EncodingRecordWarning


def _relabel(folder, encoding: str, **options) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg["position_encoding"] = encoding
    cfg["encoding_options"] = options or cfg.get("encoding_options", {})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


@pytest.mark.parametrize("trained,relabelled", [("kerple_log", "kerple_power"), ("alibi", "nope"), ("nope", "alibi")])
def test_a_checkpoint_relabelled_to_another_encoding_with_the_same_tensors_is_refused(tmp_path, trained, relabelled):
    folder = tmp_path / trained
    make_tiny_checkpoint(folder, trained)
    weights = (folder / "model.safetensors").read_bytes()
    Checkpoint.resolve(folder).load()  # as saved: loads
    _relabel(folder, relabelled)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.resolve(folder).load()
    said = str(e.value)
    assert f"says the encoding is {relabelled!r}" in said and f"trained with {trained!r}" in said, said
    assert "\n" not in said
    assert (folder / "model.safetensors").read_bytes() == weights  # left untouched


def test_changed_encoding_options_are_refused_too(tmp_path):
    folder = tmp_path / "fire"
    make_tiny_checkpoint(folder, "fire")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["encoding_options"] = {**(cfg.get("encoding_options") or {}), "init_L": 999.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="init_L"):
        Checkpoint.resolve(folder).load()


def test_weights_saved_without_a_record_load_from_config_json_said_once(tmp_path):
    """Older checkpoints (the shipped ones among them, whose weights are not rewritten): the
    encoding is config.json's, and a warning says so once per weights file."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "old"
    make_tiny_checkpoint(folder, "alibi")
    path = folder / "model.safetensors"
    save_file(load_file(str(path)), str(path), metadata={"format": "pt"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Checkpoint.resolve(folder).load()
        Checkpoint.resolve(folder).load()
    said = [w for w in seen if issubclass(w.category, EncodingRecordWarning)]
    assert len(said) == 1 and "taken from config.json" in str(said[0].message)


def test_save_pretrained_writes_the_record(tmp_path):
    from safetensors import safe_open

    make_tiny_checkpoint(tmp_path / "k", "kerple_power")
    with safe_open(str(tmp_path / "k" / "model.safetensors"), framework="pt") as f:
        record = json.loads(f.metadata()[ENCODING_METADATA_KEY])
    assert record["position_encoding"] == "kerple_power" and isinstance(record["encoding_options"], dict)
    assert torch.is_tensor(Checkpoint.resolve(tmp_path / "k").load().lm_head.weight)


def test_the_same_model_saved_twice_is_the_same_bytes(tmp_path):
    """safetensors orders metadata keys as a Rust HashMap does (differently per save): with two keys
    (format and the encoding record) the header is put in sorted order after each save."""
    from fireviz.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=16, position_encoding="fire"))
    blobs = set()
    for k in range(6):
        model.save_pretrained(tmp_path / f"m{k}")
        blobs.add((tmp_path / f"m{k}" / "model.safetensors").read_bytes())
    assert len(blobs) == 1
    assert torch.equal(GPT.from_pretrained(str(tmp_path / "m0")).lm_head.weight, model.lm_head.weight)
