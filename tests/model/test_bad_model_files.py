"""Bad input (issue 21) in a model's own files (fireviz.model): configs without the fields that
do not change the numbers are taken, tied tensors that disagree are refused, a NaN in the tied
matrix is named as such."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from fireviz.model.gpt import GPT, CheckpointError
from fireviz.model.state import config_from_dict


# -- complete configs, tied tensors ----------------------------------------------------------------
def test_config_from_dict_takes_absent_fields_that_do_not_change_the_numbers():
    cfg = {
        "n_layer": 1,
        "n_head": 1,
        "d_model": 8,
        "seq_len": 16,
        "vocab_size": 257,
        "position_encoding": "nope",
        "encoding_options": {},
        "absolute_position_embedding": False,
    }
    assert config_from_dict(cfg).dropout == 0.0


def test_tied_tensors_that_disagree_are_refused(root):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    key = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    state["wte.weight"] = state[key].clone()
    state["lm_head.weight"] = state[key] + 1.0
    save_file(state, str(w))
    with pytest.raises(CheckpointError, match="different values"):
        GPT.from_pretrained(str(root / "victim"))
    state["lm_head.weight"] = state["wte.weight"].clone()  # both present and equal: fine
    save_file(state, str(w))
    GPT.from_pretrained(str(root / "victim"))


# -- found by an adversarial review ------------------------------------------------------------------
def test_a_nan_in_the_tied_matrix_is_named_not_called_a_disagreement(root):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    k = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    t = state[k].clone()
    t[0, 0] = float("nan")
    state["wte.weight"], state["lm_head.weight"] = t, t.clone()
    save_file(state, str(w))
    from fireviz.model.state import nonfinite_parameters

    assert "wte.weight" in nonfinite_parameters(GPT.from_pretrained(str(root / "victim")))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "bool"])
def test_float_parameters_stored_as_integers_or_bools_are_refused(root, dtype):
    """Issue #38: integer or bool tensors are not cast and evaluated as if trained; one message
    names the tensor, its dtype and the fix. The file is left as it is; float16 still loads."""
    import hashlib

    import torch

    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    name = sorted(k for k, t in state.items() if t.is_floating_point())[-1]
    bad = dict(state)
    bad[name] = (state[name] * 100).to(getattr(torch, dtype))
    save_file(bad, str(w))
    before = hashlib.sha256(w.read_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match=rf"{name}: torch\.{dtype} for torch\.float32.*restore the file"):
        GPT.from_pretrained(str(root / "victim"))
    assert hashlib.sha256(w.read_bytes()).hexdigest() == before
    save_file({k: t.half() if t.is_floating_point() else t for k, t in state.items()}, str(w))
    GPT.from_pretrained(str(root / "victim"))


@pytest.mark.parametrize("vocab_size", [1, 100, 256])
def test_a_vocabulary_smaller_than_the_bytes_is_refused_on_validation(vocab_size):
    """Issue #38: vocab_size < 257 (256 bytes + BOS) passed validation and failed later with a
    traceback; it is refused where the config is checked, naming the field and the fix."""
    from fireviz.model.config import GPTConfig

    with pytest.raises(ValueError, match=rf"vocab_size = {vocab_size} is less than .*set vocab_size to 257"):
        GPTConfig(vocab_size=vocab_size).validate()
    GPTConfig(vocab_size=257).validate()
