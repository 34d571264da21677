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
