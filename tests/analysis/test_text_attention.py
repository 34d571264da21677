"""Attention patterns on a text (fireviz.analysis.text_attention.attention_pattern) and their page.

The probabilities are checked against the model's own attention output (probabilities · V
through the output projection equals what the attention module returns), the bias share
against its definition in the two limits (no content logit: 1; a zero bias: 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_interleaved
from streamlit.testing.v1 import AppTest

import fireviz.checkpoints as fireviz_checkpoints
from fireviz.analysis import text_attention as TA
from fireviz.checkpoints import Checkpoint
from fireviz.model.gpt import GPT, GPTConfig
from fireviz.plots import attention as AP

ROOT = Path(__file__).resolve().parents[2]


def tiny(encoding: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=32, position_encoding=encoding)).eval()


def _tokens(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.tensor([256]), torch.randint(0, 256, (n - 1,), generator=g)])


@pytest.mark.parametrize("encoding", ["fire", "alibi", "t5", "kerple_log", "rope", "nope"])
def test_probabilities_reproduce_the_attention_modules_output(encoding):
    model = tiny(encoding)
    toks = _tokens(80)  # past the training length 32
    layer = 1
    seen = {}
    attn = model.blocks[layer].attn
    h1 = attn.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    h2 = attn.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
    with torch.no_grad():
        model(toks[None])
    h1.remove()
    h2.remove()
    pat = TA.attention_pattern(model, toks, layer)
    x = seen["x"]
    v = attn.qkv(x).view(1, 80, 3, 4, 8)[:, :, 2].permute(0, 2, 1, 3)[0]  # [H, T, hd]
    y = torch.from_numpy(pat.probs) @ v.detach()
    out = attn.proj(y.transpose(0, 1).reshape(80, 32))
    torch.testing.assert_close(out, seen["out"][0].detach(), atol=1e-5, rtol=1e-4)
    assert np.allclose(pat.probs.sum(-1), 1, atol=1e-5) and np.all(np.triu(pat.probs[0], 1) == 0)
    if encoding in ("rope", "nope"):
        assert pat.bias_share is None and pat.bias_share_by_query is None
    else:
        assert pat.bias_share.shape == (4,) and np.all((pat.bias_share >= 0) & (pat.bias_share <= 1))
        assert np.isnan(pat.bias_share_by_query[:, 0]).all()


def test_bias_share_is_one_without_content_and_zero_without_bias():
    model = tiny("alibi")
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[:32].zero_()  # queries 0: every content logit is 0
    assert np.allclose(TA.attention_pattern(model, _tokens(40), 0).bias_share, 1.0)
    fire = tiny("fire")
    with torch.no_grad():
        for p in fire.encoding(0).mlp.parameters():
            p.zero_()  # f_θ ≡ 0: no bias at all
    assert np.allclose(TA.attention_pattern(fire, _tokens(40), 0).bias_share, 0.0)


def test_the_cap_changes_fire_past_the_cap_only_and_bad_input_is_refused():
    model = tiny("fire")
    toks = _tokens(100)
    plain = TA.attention_pattern(model, toks, 0)
    capped = TA.attention_pattern(model, toks, 0, normalizer_cap=40)
    assert capped.normalizer_cap == 40 and plain.normalizer_cap is None
    np.testing.assert_allclose(capped.probs[:, :41], plain.probs[:, :41], atol=1e-6)  # queries i <= 40: same
    assert np.abs(capped.probs[:, 60:] - plain.probs[:, 60:]).max() > 1e-4
    assert TA.attention_pattern(tiny("alibi"), toks, 0, normalizer_cap=40).normalizer_cap is None  # no normalizer
    with pytest.raises(ValueError, match="out of range"):
        TA.attention_pattern(model, toks, 2)
    with pytest.raises(ValueError, match="2 to"):
        TA.attention_pattern(model, torch.zeros(TA.MAX_PATTERN_TOKENS + 1, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="1-D integer"):
        TA.attention_pattern(model, toks.float(), 0)
    d = plain.to_dict()
    assert json.loads(json.dumps(d))["layer"] == 0 and len(d["probs"]) == 4


def test_pattern_figure_draws_the_probabilities_and_block_means_long_texts():
    model = tiny("t5")
    pat = TA.attention_pattern(model, _tokens(600), 0).to_dict()
    fig = AP.attention_pattern_figure(pat, max_cells=100)
    assert fig.layout.meta["block"] == 6 and len(fig.data) == 4
    probs = np.asarray(pat["probs"])
    z = np.asarray(fig.data[2].z, dtype=float)
    np.testing.assert_allclose(z[3, 1], probs[2, 18:24, 6:12].mean())  # a block below the diagonal
    short = AP.attention_pattern_figure(TA.attention_pattern(model, _tokens(50), 0), heads=[1])
    np.testing.assert_allclose(
        np.nan_to_num(np.asarray(short.data[0].z, dtype=float)),
        TA.attention_pattern(model, _tokens(50), 0).probs[1],
        atol=1e-6,
    )  # 6 digits
    # the log colour scale (issue #40: heatmaps nearly all dark): log10 of the same numbers, floored
    logged = AP.attention_pattern_figure(TA.attention_pattern(model, _tokens(50), 0), heads=[1], log_color=True)
    want = TA.attention_pattern(model, _tokens(50), 0).probs[1]
    got = np.asarray(logged.data[0].z, dtype=float)
    below = np.tril(np.ones_like(want, dtype=bool))
    np.testing.assert_allclose(got[below], np.log10(np.maximum(want[below], AP.LOG_FLOOR)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(logged.data[0].customdata, dtype=float)[below], want[below], atol=1e-6)
    assert logged.layout.coloraxis.cmin == np.log10(AP.LOG_FLOOR) and logged.layout.coloraxis.cmax == 0.0
    share = AP.bias_share_figure([pat])
    assert [t.meta["head"] for t in share.data] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="additive"):
        AP.bias_share_figure([TA.attention_pattern(tiny("rope"), _tokens(50), 0)])


def test_attention_page_draws_the_pattern_and_the_capped_shares(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(ROOT / "checkpoints"))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "pages/5_Attention.py"), default_timeout=120)
    at.query_params.update({"ckpt": "fire", "cap": "256", "alen": "400", "layer": "1"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    assert figs[0]["layout"]["title"]["text"] == "fire: attention on the text, layer 1"
    from fireviz.data import corpus as data

    doc = data.split_documents(data.load_documents("prose"), "validation")[0]
    want = TA.attention_pattern(
        fireviz_checkpoints.load_model(ROOT / "checkpoints/fire"), data.document_tokens(doc)[:400], 1
    )
    table = at.dataframe[0].value
    np.testing.assert_allclose(table["bias share"].to_numpy(), want.bias_share, atol=1e-6)  # 6 digits kept
    assert "bias share, cap 256" in table.columns
    at.radio[0].set_value("capped").run()
    assert (
        not at.exception
        and "normalizer capped at 256" in json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["title"]["text"]
    )


def test_two_sessions_draw_patterns_from_one_shared_model_at_once():
    """The app shares one loaded model per checkpoint between sessions: patterns and dilution
    computed from two threads at once equal the ones computed alone."""

    model = tiny("fire")
    toks = [_tokens(48, seed=s) for s in (1, 2)]
    alone = [TA.attention_pattern(model, toks[k], k % 2).probs for k in (0, 1)]
    capped_alone = TA.attention_pattern(model, toks[0], 1, normalizer_cap=20).probs
    dil_alone = TA.attention_dilution(model, toks[1], [15, 40], near=4, rows=2).share
    errors, same = [], []

    def session(k):
        try:
            for _ in range(8):
                same.append(np.array_equal(TA.attention_pattern(model, toks[k], k % 2).probs, alone[k]))
                if k == 0:
                    same.append(
                        np.array_equal(TA.attention_pattern(model, toks[0], 1, normalizer_cap=20).probs, capped_alone)
                    )
                else:
                    same.append(
                        np.array_equal(TA.attention_dilution(model, toks[1], [15, 40], near=4, rows=2).share, dil_alone)
                    )
        except Exception as e:  # noqa: BLE001 - any error fails the test below
            errors.append(e)

    run_interleaved(session, (0, 1))
    assert not errors and len(same) == 32 and all(same)
    assert not model.training and all(b.attn.capture is None for b in model.blocks)


def test_dilution_arguments_and_a_missing_checkpoint_are_clear_errors(tmp_path):
    from fireviz.model.gpt import CheckpointError

    model = tiny("alibi")
    toks = _tokens(40)
    for near, rows in ((1.5, 2), (4, True), ("4", 2), (0, 2)):
        with pytest.raises(ValueError, match="near and rows must be integers >= 1"):
            TA.attention_dilution(model, toks, [20], near=near, rows=rows)
    assert TA.attention_dilution(model, toks, [20], near=np.int64(4), rows=2).near == 4
    with pytest.raises(CheckpointError):  # a missing checkpoint: said where it is resolved, once
        Checkpoint.resolve(str(tmp_path / "missing"))
    for f in (
        lambda: TA.dilution_cache_path(str(tmp_path), toks, [20], 4, 2, None, cache_dir=tmp_path),
        lambda: TA.cached_attention_dilution(tmp_path / "fire", toks, [20], near=4, rows=2, cache_dir=tmp_path),
    ):
        with pytest.raises(TypeError, match="Checkpoint.resolve"):  # a path string is not a checkpoint
            f()
