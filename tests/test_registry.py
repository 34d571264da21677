"""One spec per encoding (issue 20): a toy additive encoding defined in this file plus one
registry entry trains, evaluates, gets a bias report and is a fit target — no other file touched."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from fireviz.analysis import biases as analysis
from fireviz.cli import fit as fit_cli
from fireviz.cli import train as train_cli
from fireviz.encodings import (
    ENCODING_NAMES,
    EncodingSpec,
    ToeplitzBias,
    build_encoding,
    encoding_names,
    encoding_spec,
    register_encoding,
    unregister_encoding,
)
from fireviz.eval import evaluate
from fireviz.fit import fitting as fit
from fireviz.fit import targets as fit_targets
from fireviz.model.gpt import GPT, GPTConfig


class ToyLinear(ToeplitzBias):
    """``b_h(d) = −w_h·|d|`` with a learned slope per head (ALiBi with learned slopes)."""

    def __init__(self, num_heads: int, init_w: float = 0.1):
        super().__init__(num_heads)
        self.w = nn.Parameter(torch.full((num_heads,), float(init_w)))

    def bias_by_distance(self, d: torch.Tensor) -> torch.Tensor:
        return -self.w.view(-1, *([1] * d.dim())) * d.abs().float()


def _toy_target(num_heads: int, w=0.25):
    return ToyLinear(num_heads, init_w=float(w)).requires_grad_(False), {"w": float(w)}


TOY = EncodingSpec(
    "toy_linear",
    lambda H, hd, **o: ToyLinear(H, **o),
    frozenset({"init_w"}),
    fit_params=frozenset({"w"}),
    fit_target=_toy_target,
    summary="toy: learned linear bias",
)


@pytest.fixture
def toy():
    register_encoding(TOY)
    yield
    unregister_encoding("toy_linear")


def test_a_toy_encoding_trains_evaluates_reports_and_fits(toy, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": "the river stone of the delta " * 12}) + "\n" for i in range(30))
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nn_layer = 2\nn_head = 2\nd_model = 16\nseq_len = 32\nposition_encoding = "toy_linear"\n'
        f'[train]\ndata = "{data}"\nmax_steps = 3\nwarmup_steps = 1\nbatch_size = 4\neval_interval = 3\n'
        "checkpoint_interval = 3\neval_batches = 1\n"
    )
    assert train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    model = GPT.from_pretrained(str(tmp_path / "run"))
    assert isinstance(model.encoding(0), ToyLinear) and model.encoding(0) is not model.encoding(1)  # per layer
    assert not torch.equal(model.encoding(0).w, torch.full((2,), 0.1))  # it learned
    r = evaluate.evaluate_many(
        [str(tmp_path / "run")],
        str(data),
        [16, 64],
        split="all",
        use_cache=False,
        mode="nonoverlapping",
        token_budget=200,
    )[0]
    assert all(math.isfinite(e["bits_per_byte"]) for e in r["per_length"])
    rep = analysis.bias_report(model, [31]).to_dict()
    assert rep["kind"] == "additive" and rep["layers"][0]["heads"][0]["locality"] == "local"
    res = fit.fit_fire(fit.make_target("toy_linear", 2, w=0.5), 32, steps=5)
    assert res.relative_rmse < 0.01  # linear in d: FIRE fits it (Theorem 3.1)
    assert "toy_linear" in fit_targets.target_names() and "toy_linear" in fit_targets.fittable_encodings()
    t = fit.make_target("checkpoint", path=str(tmp_path / "run"), layer=1)
    assert t.params["encoding"] == "toy_linear"
    assert (
        fit_cli.main(
            ["--target", "toy_linear", "--heads", "2", "--param", "w=0.3", "--max-len", "16", "--steps", "2", "--quiet"]
        )
        == 0
    )


def test_an_unregistered_name_never_falls_through_to_fire():
    with pytest.raises(ValueError, match="unknown position encoding 'fire_x'"):
        build_encoding("fire_x", 2, 8)
    with pytest.raises(ValueError, match="unknown position_encoding"):
        GPTConfig(position_encoding="fire_x").validate()


def test_every_builtin_has_one_spec_and_the_specs_decide_sharing():
    assert set(ENCODING_NAMES) <= set(encoding_names())
    for name in ENCODING_NAMES:
        spec = encoding_spec(name)
        m = GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=32, position_encoding=name))
        assert (len(m.encodings) == 1) == spec.one_module, name
        assert (spec.sharing == "static") == (sum(p.numel() for p in m.encodings.parameters()) == 0), name


def test_register_refuses_a_duplicate_and_a_bad_name():
    with pytest.raises(ValueError, match="already registered"):
        register_encoding(encoding_spec("alibi"))
    with pytest.raises(ValueError, match="lower-case identifier"):
        register_encoding(EncodingSpec("Bad Name", lambda H, hd: None))


def test_the_fit_page_offers_a_registered_target_by_its_summary(toy):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "pages/2_Fit_FIRE.py"), default_timeout=60)
    at.query_params["target"] = "toy_linear"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    box = at.selectbox[0]
    assert box.value == "toy_linear" and "toy: learned linear bias" in box.options


def test_the_spec_says_how_position_enters_attention_and_memory_follows_it():
    """kind comes from the spec, never from the name: a registered rotary encoding is costed
    without a [heads, n, n] bias, a registered additive one with it."""
    from fireviz.encodings import KINDS, encoding_spec
    from fireviz.model import memory

    kinds = {name: encoding_spec(name).kind for name in ("nope", "rope", "rope_pi", "yarn", "t5", "alibi", "fire")}
    assert kinds == {
        "nope": "none",
        "rope": "rotary",
        "rope_pi": "rotary",
        "yarn": "rotary",
        "t5": "additive",
        "alibi": "additive",
        "fire": "additive",
    }
    with pytest.raises(ValueError, match="kind must be one of"):
        EncodingSpec("bad_kind", TOY.build, kind="multiplicative")
    rotary = EncodingSpec(
        "toy_rotary", encoding_spec("rope").build, encoding_spec("rope").options, "static", kind="rotary"
    )
    register_encoding(rotary)
    register_encoding(TOY)
    try:
        cfg = dict(n_layer=2, n_head=4, d_model=32, seq_len=64)
        as_rotary = memory.forward_bytes(GPTConfig(position_encoding="toy_rotary", **cfg), 1, 4096)
        as_rope = memory.forward_bytes(GPTConfig(position_encoding="rope", **cfg), 1, 4096)
        as_additive = memory.forward_bytes(GPTConfig(position_encoding="toy_linear", **cfg), 1, 4096)
        assert as_rotary == as_rope < as_additive
        assert set(KINDS) == {"additive", "rotary", "none"}
    finally:
        unregister_encoding("toy_rotary")
        unregister_encoding("toy_linear")
