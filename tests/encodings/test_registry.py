"""One spec per encoding (issue 20): a toy additive encoding defined in this file plus one
registry entry trains, evaluates, gets a bias report and is a fit target — no other file touched."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from fireviz.analysis import biases as analysis
from fireviz.cli import fit as fit_cli
from fireviz.cli import train as train_cli
from fireviz.encodings import (
    ENCODING_NAMES,
    EncodingSpec,
    FitParam,
    ToeplitzBias,
    build_encoding,
    encoding_names,
    encoding_spec,
    register_encoding,
    unregister_encoding,
)
from fireviz.eval import evaluation as evaluate
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


def _typed_target(num_heads: int, w=0.25, heads_w=None, shape="linear", seed=0):
    enc = ToyLinear(num_heads, init_w=0.0 if shape == "flat" else w).requires_grad_(False)
    if heads_w is not None and shape != "flat":
        enc.w.copy_(torch.as_tensor(heads_w, dtype=torch.float32).expand(num_heads))
    return enc, {"w": w, "heads_w": heads_w, "shape": shape, "seed": seed, "slopes": enc.w.tolist()}


#: the toy with typed fit parameters: each kind, a seed whose flag would be the fit's own --seed
TYPED = EncodingSpec(
    "toy_typed",
    lambda H, hd, **o: ToyLinear(H, **o),
    frozenset({"init_w"}),
    fit_params=(
        FitParam("w", "slope in logits per token", "float", 0.25, lo=0.0, hi=10.0, hint="e.g. w=0.5"),
        FitParam("heads_w", "slopes, one number or one per head (default: w)", "numbers", None, lo=0.0),
        FitParam("shape", "linear or flat", "choice", "linear", choices=("linear", "flat")),
        FitParam("seed", "a seed it ignores", "seed", 0),
    ),
    fit_target=_typed_target,
    summary="toy: typed linear bias",
)


@pytest.fixture
def typed_toy():
    register_encoding(TYPED)
    yield
    unregister_encoding("toy_typed")


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

    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "pages/2_Fit_FIRE.py"), default_timeout=60)
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


# -- fit parameters: the spec answers for them (issue #34) --------------------------------------
def test_a_spec_given_bare_names_has_untyped_fit_params_passed_unchecked(toy):
    assert TOY.fit_params == (FitParam("w"),) and TOY.fit_params[0].kind == "any"
    assert fit_targets.target_params("toy_linear") == {"w"}
    assert fit.make_target("toy_linear", 2, w="0.5").params == {"w": 0.5}  # unchecked: its builder reads it
    assert "--w W toy_linear: w (a JSON value)" in " ".join(fit_cli._parser().format_help().split())
    args = fit_cli._parser().parse_args(["--target", "toy_linear", "--w", "0.3", "--max-len", "16"])
    assert fit_cli._target_from_args(args) == ("toy_linear", 8, {"w": 0.3})
    with pytest.raises(ValueError, match="name a parameter twice"):
        EncodingSpec("twice", TOY.build, fit_params=(FitParam("w"), "w"), fit_target=_toy_target)
    with pytest.raises(ValueError, match="kind must be one of"):
        FitParam("w", kind="number")
    with pytest.raises(ValueError, match="a choice needs its choices"):
        FitParam("w", kind="choice")


def _fit(*args: str) -> list[str]:
    return ["--max-len", "16", "--heads", "2", "--steps", "1", "--quiet", *args]


def test_typed_fit_params_are_checked_and_become_fit_flags(typed_toy, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^w must be a finite number in 0.0..10.0 \(got 20\); e.g. w=0.5$"):
        fit.make_target("toy_typed", 2, w=20)
    for bad, match in [
        ({"w": True}, "w must be a finite number"),
        ({"heads_w": []}, "heads_w is an empty list"),
        ({"heads_w": [0.5, -1]}, r"heads_w must be a finite number >= 0.0 \(got -1\)"),
        ({"shape": "round"}, r"shape must be 'linear' or 'flat' \(got 'round'\)"),
        ({"seed": -1}, "seed must be an integer in 0.."),
    ]:
        with pytest.raises(ValueError, match=match):
            fit.make_target("toy_typed", 2, **bad)
    assert fit.make_target("toy_typed", 2, heads_w=np.array([0.5, 1])).params["slopes"] == [0.5, 1.0]

    text = " ".join(fit_cli._parser().format_help().split())
    assert "--w W toy_typed: slope in logits per token (default 0.25)" in text
    assert "--heads-w HEADS_W toy_typed: slopes, one number or one per head (default: w)" in text
    assert "--shape {linear,flat} toy_typed: linear or flat (default linear)" in text
    assert "kerple_log, kerple_power: seed of the r1, r2 draws (default 0); toy_typed: a seed it ignores" in text
    out = tmp_path / "fit.json"
    argv = ["--target", "toy_typed", "--w", "0.5", "--heads-w", "0.5,1", "--shape", "linear", "--target-seed", "3"]
    assert fit_cli.main(_fit(*argv, "--out", str(out))) == 0
    assert json.loads(out.read_text())["target_params"] == {
        "w": 0.5,
        "heads_w": [0.5, 1.0],
        "shape": "linear",
        "seed": 3,
        "slopes": [0.5, 1.0],
    }
    capsys.readouterr()
    for argv, message in [
        (["--target", "toy_typed", "--w", "20"], "w must be a finite number in 0.0..10.0 (got 20.0); e.g. w=0.5"),
        (["--target", "toy_typed", "--heads-w", "a"], "--heads-w must be a number or comma-separated numbers"),
        (["--target", "alibi", "--w", "1"], "--w applies to toy_typed, not --target alibi"),
        (["--target", "toy_typed", "--slope", "1"], "--slope applies to alibi, not --target toy_typed"),
    ]:
        assert fit_cli.main(_fit(*argv)) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"fireviz fit: error: {message}") and err.count("\n") == 1, err
    assert fit_cli.main(_fit("--target", "toy_typed", "--shape", "round")) == 2  # argparse: not a choice
    assert "invalid choice: 'round'" in capsys.readouterr().err


def test_the_builtin_fit_flags_keep_their_names_and_meaning():
    parser = fit_cli._parser()
    t5 = ["--target", "t5", "--num-buckets", "8", "--max-distance", "16", "--t5-values", "decay", "--target-seed", "3"]
    settings = fit_cli.settings_from_args(parser.parse_args([*t5, "--max-len", "16", "--heads", "2"]))
    assert settings.target.params == {"num_buckets": 8, "max_distance": 16, "values": "decay", "seed": 3}
    values = fit_cli.settings_from_args(
        parser.parse_args(["--target", "t5", "--num-buckets", "2", "--t5-values", "1,2", "--max-len", "8"])
    )
    assert values.target.params["values"] == [[1.0, 1.0] * 4, [2.0, 2.0] * 4]  # per bucket, for each of 8 heads
    cases = {
        ("alibi", "--slope", "0.5"): {"slope": 0.5},
        ("kerple_power", "--r1", "1,2", "--r2", "0.5"): {"r1": [1.0, 2.0], "r2": 0.5},
        ("sandwich", "--dbar", "64"): {"dbar": 64},
    }
    for (target, *flags), params in cases.items():
        args = parser.parse_args(["--target", target, *flags, "--max-len", "16", "--heads", "2"])
        assert fit_cli._target_from_args(args) == (target, 2, params)
    args = parser.parse_args(
        ["--target", "checkpoint", "--checkpoint", "x", "--layer", "1", "--stack", "encoder", "--max-len", "8"]
    )
    assert fit_cli._target_from_args(args) == ("checkpoint", None, {"path": "x", "layer": 1, "stack": "encoder"})
    text = " ".join(parser.format_help().split())
    assert "--r1 R1 kerple_log, kerple_power: r1, one number or one per head" in text


def test_the_fit_page_makes_widgets_from_the_typed_fit_params(typed_toy):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    def fit_page(**query) -> AppTest:
        at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "pages/2_Fit_FIRE.py"), default_timeout=60)
        for k, v in query.items():
            at.query_params[k] = v
        return at.run()

    at = fit_page(target="toy_typed", p_w="0.5", p_shape="flat", p_seed="7")
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox[0].value == "toy_typed"
    assert at.number_input(key="fit_p_w").value == 0.5 and at.number_input(key="fit_p_seed").value == 7
    assert at.selectbox(key="fit_p_shape").value == "flat" and at.text_input(key="fit_p_heads_w").value == ""
    assert "slope in logits per token" in at.number_input(key="fit_p_w").label
    at = fit_page(target="toy_typed", p_heads_w="0.5,x")
    shown = [re.sub(r"\\(.)", r"\1", e.value) for e in at.error]  # ui.plain's escapes taken out
    assert any("heads_w must be a number or comma-separated numbers" in m for m in shown)
    # the built-ins' widgets keep their URL keys, so shared links open as before
    at = fit_page(target="t5", buckets="8", max_distance="16", values="decay", tseed="3")
    assert not at.exception, [e.value for e in at.exception]
    assert [at.number_input(key=f"fit_{k}").value for k in ("buckets", "max_distance", "tseed")] == [8, 16, 3]
    assert at.selectbox(key="fit_values").value == "decay"
    at = fit_page(target="alibi", slope="0")
    assert (
        at.number_input(key="fit_slope").value == 0.0
        and "0 leaves the default" in at.number_input(key="fit_slope").label
    )
