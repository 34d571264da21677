"""fireviz.analysis: bias curves/matrices, rotary kernel, locality, attention dilution, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fireviz.model.gpt as model_mod
from fireviz.analysis import biases as A
from fireviz.analysis import locality
from fireviz.analysis import text_attention as TA
from fireviz.analysis.primitives import fire_input_vs_query
from fireviz.checkpoints import Checkpoint
from fireviz.cli import biases as biases_cli
from fireviz.cli import main as cli_main
from fireviz.model.gpt import GPT, GPTConfig

SEQ = 32  # training length of the tiny models (tokens)


def tiny(encoding: str, n_layer: int = 2, n_head: int = 4, seed: int = 0, **opts) -> GPT:
    torch.manual_seed(seed)
    return GPT(
        GPTConfig(
            n_layer=n_layer, n_head=n_head, d_model=32, seq_len=SEQ, position_encoding=encoding, encoding_options=opts
        )
    ).eval()


SLOPE = 4.0  # logits per unit of FIRE's normalized input


def set_fire_heads(model: GPT, slope: float = SLOPE) -> None:
    """Hand-set every layer's FIRE MLP: head 0 local (−slope·x), head 1 anti-local (+slope·x),
    head 2 V-shaped (mixed), head 3 flat (zero)."""
    with torch.no_grad():
        for layer in range(model.config.n_layer):
            mlp = model.encoding(layer).mlp
            lin1, lin2 = mlp[0], mlp[2]
            lin1.weight.zero_()
            lin1.bias.zero_()
            lin2.weight.zero_()
            lin2.bias.zero_()
            lin1.weight[0, 0], lin1.bias[0] = 1.0, 0.0  # u0 = relu(x)
            lin1.weight[1, 0], lin1.bias[1] = 1.0, -0.5  # u1 = relu(x − 0.5)
            lin2.weight[0, 0] = -slope
            lin2.weight[1, 0] = slope
            lin2.weight[2, 0], lin2.weight[2, 1] = -slope, 2 * slope


@pytest.fixture
def fire_model() -> GPT:
    m = tiny("fire")
    set_fire_heads(m)
    return m


def fire_x(d: np.ndarray, i: int, c: float = 0.1, L: float = SEQ / 4, eps: float = 1e-6) -> np.ndarray:
    """ψ(d)/ψ(max(L, i)) by hand (Li et al. 2024 eq. 3–4)."""
    return np.log1p(c * d) / (math.log1p(c * max(L, i)) + eps)


# -- bias curves -------------------------------------------------------------------------------
def test_default_query_positions():
    assert A.default_query_positions(512) == [511, 1023, 2047, 4095]
    assert A.default_query_positions(SEQ, A.DEFAULT_DILUTION_MULTIPLES)[-1] == 16 * SEQ - 1
    with pytest.raises(ValueError):
        A.default_query_positions(0)


def test_fire_curves_match_formula_and_stretch(fire_model):
    rep = A.bias_report(fire_model)
    assert rep.query_positions == [SEQ - 1, 2 * SEQ - 1, 4 * SEQ - 1, 8 * SEQ - 1]
    for i in rep.query_positions:
        curve = rep.layers[1].curves[i]
        assert curve.shape == (4, i + 1) and curve.dtype == np.float32
        d = np.arange(i + 1)
        x = fire_x(d, i)
        np.testing.assert_allclose(rep.layers[1].normalized_input[i], x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(curve[0], -SLOPE * x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(curve[1], SLOPE * x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(curve[2], -SLOPE * x + 2 * SLOPE * np.maximum(x - 0.5, 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(curve[3], 0.0)
    # progressive interpolation stretches the curve: the same distance gets a smaller input
    d = 20
    xs = [rep.layers[0].normalized_input[i][d] for i in rep.query_positions]
    assert all(a > b for a, b in zip(xs, xs[1:], strict=False))
    # the f_θ grid is f itself
    f = rep.layers[0].fire
    np.testing.assert_allclose(f["mlp_bias"][0], -SLOPE * f["mlp_x"], atol=1e-6)
    assert f["threshold_L"] == pytest.approx(SEQ / 4)


def test_hand_set_fire_heads_are_classified(fire_model):
    rep = A.bias_report(fire_model)
    for layer in rep.layers:
        assert [s.locality for s in layer.locality] == ["local", "anti-local", "mixed", "mixed"]
        assert layer.locality[0].rank_correlation == pytest.approx(-1.0)
        assert layer.locality[0].peak_distance == 0
        assert layer.locality[1].rank_correlation == pytest.approx(1.0)
        assert layer.locality[1].peak_distance == SEQ - 1 and layer.locality[1].peak_fraction == pytest.approx(1.0)
        assert layer.locality[3].reason.startswith("flat")
        # interpolation keeps the shape, so the class holds at every query position
        for i, scores in layer.locality_by_query_position.items():
            assert [s.locality for s in scores] == ["local", "anti-local", "mixed", "mixed"], i
    rows = A.locality_table([rep])
    assert len(rows) == 2 * 4 and rows[1]["locality"] == "anti-local"
    (summary,) = A.locality_summary(
        [
            rep,
        ]
    )
    assert (summary["n_local"], summary["n_anti_local"], summary["n_mixed"]) == (2, 2, 4)
    assert summary["share_local"] == pytest.approx(0.25)


def test_alibi_report_locality_and_matrix():
    m = tiny("alibi", n_head=2)
    rep = A.bias_report(m, query_positions=[15, 40], matrix_window=(0, 48, 3))
    slopes = m.encoding(0).slopes.numpy()
    np.testing.assert_allclose(rep.layers[0].curves[40], -slopes[:, None] * np.arange(41)[None], rtol=1e-6)
    assert all(s.locality == "local" for lay in rep.layers for s in lay.locality)
    mat = rep.layers[0].matrix
    grid = np.arange(0, 48, 3)
    assert mat.shape == (2, 16, 16)
    dist = grid[:, None] - grid[None, :]
    assert np.isnan(mat[:, dist < 0]).all()
    np.testing.assert_allclose(
        mat[:, dist >= 0], (-slopes[:, None] * dist[dist >= 0][None]).astype(np.float32), rtol=1e-6
    )


def test_fire_matrix_equals_reference_formula(fire_model):
    enc = fire_model.encoding(0)
    qs, ks = [0, 5, 9, 31, 100, 200], [0, 3, 9, 50, 150, 200]
    mat = A.bias_matrix(enc, qs, ks)
    ref = enc.bias_reference(201, 201, 0).detach().numpy()
    for r, i in enumerate(qs):
        for c, j in enumerate(ks):
            if j > i:
                assert np.isnan(mat[:, r, c]).all()
            else:
                np.testing.assert_allclose(mat[:, r, c], ref[:, i, j], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("encoding", ["t5", "kerple_log", "sandwich"])
def test_matrix_of_other_additive_encodings_equals_bias(encoding):
    enc = tiny(encoding, seed=3).encoding(0)
    with torch.no_grad():
        for p in enc.parameters():  # make T5's zero-initialised table non-trivial
            p.add_(torch.randn_like(p))
    qs, ks = [0, 7, 33, 90], [0, 5, 33, 60, 90]
    full = enc.bias(91, 91, 0).detach().numpy()
    mat = A.bias_matrix(enc, qs, ks)
    for r, i in enumerate(qs):
        for c, j in enumerate(ks):
            if j > i:
                assert np.isnan(mat[:, r, c]).all()
            else:
                np.testing.assert_allclose(mat[:, r, c], full[:, i, j], rtol=1e-5, atol=1e-6)


def test_matrix_of_a_non_toeplitz_bias_goes_row_by_row(fire_model):
    from fireviz.encodings import PositionEncoding

    class RowOnly(PositionEncoding):  # an additive encoding known only through bias(): the base bias_at
        kind = "additive"

        def __init__(self):
            super().__init__(4)

        def bias(self, q_len, k_len, q_offset=None):
            return fire_model.encoding(0).bias(q_len, k_len, q_offset)

    qs, ks = [3, 50, 120], [0, 3, 60, 120]
    np.testing.assert_allclose(
        A.bias_matrix(RowOnly(), qs, ks),
        A.bias_matrix(fire_model.encoding(0), qs, ks),
        rtol=1e-5,
        atol=1e-6,
        equal_nan=True,
    )


def test_rotary_kernel_and_nope_report():
    rep = A.bias_report(tiny("rope", n_head=8), query_positions=[7, 100])  # head_dim 4: θ = [1, 0.01]
    assert rep.kind == "rotary" and rep.kernel is not None and rep.classify_at is None
    d = np.arange(101)
    np.testing.assert_allclose(rep.kernel["value"], (np.cos(d) + np.cos(0.01 * d)) / 2, rtol=1e-6, atol=1e-7)
    assert "RoFormer" in rep.kernel["label"] and rep.kernel["value"][0] == pytest.approx(1.0)
    assert all(not lay.curves and not lay.locality for lay in rep.layers)
    pi = A.bias_report(tiny("rope_pi", n_head=8, rope_scaling_factor=4.0), query_positions=[100])
    np.testing.assert_allclose(pi.kernel["value"], (np.cos(d / 4) + np.cos(0.0025 * d)) / 2, rtol=1e-6, atol=1e-7)
    nope = A.bias_report(tiny("nope")).to_dict()
    assert nope["kernel"] is None and "no position bias" in nope["note"]
    assert all(not lay["curves"] and not lay["heads"] for lay in nope["layers"])
    with pytest.raises(TypeError):
        A.bias_curve(tiny("nope").encoding(0), 5)


def test_report_to_dict_is_strict_json(fire_model):
    d = A.bias_report(fire_model, query_positions=[31, 63]).to_dict()
    text = json.dumps(d, allow_nan=False)  # NaN must have become null
    back = json.loads(text)
    c = back["layers"][0]["curves"][1]
    assert c["query_position"] == 63 and len(c["distance"]) == 64 and len(c["bias"]) == 4
    assert back["layers"][0]["heads"][0]["locality"] == "local"
    assert back["layers"][0]["matrix"]["bias"][0][0][1] is None  # key 1 is in the future of query 0


def test_bad_positions_raise(fire_model):
    with pytest.raises(ValueError):
        A.bias_report(fire_model, query_positions=[])
    with pytest.raises(ValueError):
        A.bias_report(fire_model, query_positions=[-1, 5])
    with pytest.raises(ValueError):
        A.bias_report(fire_model, matrix_window=(10, 5, 1))
    for bad in ("", "a,1", "-3", " , "):
        with pytest.raises(ValueError):
            A.parse_positions(bad)
    assert A.parse_positions("4095, 511,511") == [511, 4095]


# -- locality classifier -----------------------------------------------------------------------
def test_spearman_known_value():
    assert locality.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 − 6·4/(5·24)
    assert locality.spearman([1, 2, 3], [7, 7, 7]) == 0.0


@pytest.mark.parametrize(
    "curve,expected",
    [
        (lambda d: -0.1 * d, "local"),
        (lambda d: 0.02 * d, "anti-local"),
        (lambda d: (np.log1p(d) - np.log1p(255) / 2) ** 2, "mixed"),  # U in log distance
        (lambda d: np.where(d < 16, 2.0 - d / 8, 0.0), "local"),  # steep, then exactly flat
        (lambda d: np.minimum(d, 100) * 0.01, "anti-local"),  # rises to a plateau
        (lambda d: 0.001 * np.sin(d), "mixed"),  # flat (range < 0.01 logits)
    ],
)
def test_classify_locality_shapes(curve, expected):
    d = np.arange(256)
    assert A.classify_locality(d, curve(d)).locality == expected


def test_classify_locality_scores_and_errors():
    d = np.arange(100)
    s = A.classify_locality(d, np.exp(-(((d - 30) / 5.0) ** 2)), query_position=99)
    assert s.peak_distance == 30 and s.peak_fraction == pytest.approx(math.log(31) / math.log(100))
    assert s.bias_range == pytest.approx(1.0, abs=1e-6) and s.query_position == 99
    # the thresholds are rules, not constants baked in
    assert A.classify_locality(d, -0.1 * d, rules={"rank_correlation": 1.01}).locality == "mixed"
    with pytest.raises(ValueError):
        A.classify_locality([0, 1, 2], [1.0, 2.0])
    with pytest.raises(ValueError):
        A.classify_locality([0, 2, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        A.classify_locality([0, 1, 2], [1.0, float("nan"), 3.0])


# -- attention dilution ------------------------------------------------------------------------
def reference_shares(model: GPT, tokens: torch.Tensor, positions, near: int, rows: int, monkeypatch) -> np.ndarray:
    """Shares from the model's own attention calls: wrap SDPA and form the n×n probabilities."""
    sdpa = model_mod.F.scaled_dot_product_attention
    probs = []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
        T, S = s.shape[-2:]
        if is_causal:
            attn_mask = torch.ones(T, S, dtype=torch.bool).tril()
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:
            s = s + attn_mask
        probs.append(torch.softmax(s, -1)[0])  # [H, T, S]
        return sdpa(q, k, v, attn_mask=attn_mask if not is_causal else None, dropout_p=dropout_p, is_causal=is_causal)

    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        model(tokens[None, : max(positions) + 1])
    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", sdpa)
    out = np.zeros((len(probs), probs[0].shape[0], len(positions)))
    for layer, p in enumerate(probs):
        for c, i in enumerate(positions):
            vals = [p[:, r, max(0, r - near + 1) : r + 1].sum(-1) for r in range(max(0, i - rows + 1), i + 1)]
            out[layer, :, c] = torch.stack(vals).mean(0).numpy()
    return out


@pytest.mark.parametrize("encoding", ["fire", "rope", "alibi", "yarn", "nope"])
def test_dilution_matches_model_attention(encoding, monkeypatch):
    opts = {"rope_scaling_factor": 2.0} if encoding == "yarn" else {}
    m = tiny(encoding, seed=1, **opts)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (200,), generator=gen)
    positions = [3, 31, 80, 150]
    res = TA.attention_dilution(m, tokens, positions, near=8, rows=4)
    ref = reference_shares(m, tokens, positions, 8, 4, monkeypatch)
    assert res.share.shape == (2, 4, 4)
    np.testing.assert_allclose(res.share, ref, rtol=1e-4, atol=1e-5)
    assert all(not b.attn._forward_pre_hooks for b in m.blocks)  # hooks removed


def test_dilution_uniform_attention_is_exact():
    m = tiny("nope")
    with torch.no_grad():
        for b in m.blocks:
            b.attn.qkv.weight.zero_()  # all scores 0: uniform over the i + 1 visible keys
    m.train()
    res = TA.attention_dilution(m, torch.zeros(300, dtype=torch.long), [10, 63, 255], near=16, rows=1)
    expected = [1.0, 16 / 64, 16 / 256]
    np.testing.assert_allclose(res.share, np.broadcast_to(expected, res.share.shape), rtol=1e-6)
    assert m.training  # mode restored


def test_fire_interpolation_dilutes_a_local_head(fire_model):
    with torch.no_grad():
        for b in fire_model.blocks:
            b.attn.qkv.weight.zero_()  # attention = softmax of the bias alone
    set_fire_heads(fire_model, slope=20.0)
    positions = A.default_query_positions(SEQ, A.DEFAULT_DILUTION_MULTIPLES)
    res = TA.attention_dilution(fire_model, torch.zeros(16 * SEQ, dtype=torch.long), near=8, rows=1)
    assert res.query_positions == positions
    local = res.share[0, 0]
    assert all(a > b for a, b in zip(local, local[1:], strict=False))  # stretched bias spreads attention thin
    for c, i in enumerate(positions):
        w = np.exp(-20.0 * fire_x(np.arange(i + 1), i))
        assert local[c] == pytest.approx(w[:8].sum() / w.sum(), rel=1e-4)
    assert res.share[0, 1, -1] < 8 / (16 * SEQ)  # anti-local head avoids the nearest keys


def test_dilution_input_errors(fire_model):
    with pytest.raises(ValueError, match="longer text"):
        TA.attention_dilution(fire_model, torch.zeros(100, dtype=torch.long), [150])
    with pytest.raises(ValueError):
        TA.attention_dilution(fire_model, torch.zeros(100), [50])
    with pytest.raises(ValueError):
        TA.attention_dilution(fire_model, torch.zeros(100, dtype=torch.long), [50], near=0)


def test_text_tokens():
    t = TA.text_tokens("hé")
    assert t.tolist() == [256, 104, 0xC3, 0xA9] and t.dtype == torch.long


# -- CLI ---------------------------------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path, fire_model):
    folder = tmp_path / "fire-tiny"
    fire_model.save_pretrained(folder)
    return folder


def test_cli_writes_biases_json(checkpoint, tmp_path, capsys):
    out = tmp_path / "res" / "biases.json"
    text = tmp_path / "doc.txt"
    text.write_text("the quick brown fox " * 20)
    rc = cli_main(
        [
            "biases",
            str(checkpoint),
            "--query-positions",
            "31,255",
            "--out",
            str(out),
            "--text",
            str(text),
            "--dilution-positions",
            "31,63,300",
            "--near",
            "8",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    d = json.loads(out.read_text())
    assert d["checkpoint"] == "fire-tiny" and d["query_positions"] == [31, 255] and d["classify_at"] == 31
    for layer in d["layers"]:
        assert [h["locality"] for h in layer["heads"]] == ["local", "anti-local", "mixed", "mixed"]
        assert layer["heads"][0]["rank_correlation"] == pytest.approx(-1.0)
        assert layer["heads"][1]["locality_by_query_position"] == {"31": "anti-local", "255": "anti-local"}
        assert [c["query_position"] for c in layer["curves"]] == [31, 255]
    assert d["dilution"]["query_positions"] == [31, 63, 300]
    assert np.array(d["dilution"]["share"]).shape == (2, 4, 3)
    printed = capsys.readouterr().out
    assert "anti-local" in printed and str(out) in printed
    # the table names its units and shows every query position asked for (a new user saw 31 only)
    assert "peak = distance of the largest bias (tokens)" in printed and "range = max - min bias (logits)" in printed
    header = next(line for line in printed.splitlines() if line.lstrip().startswith("layer"))
    assert header.split()[-1] == "@255"
    head1 = next(line for line in printed.splitlines() if line.split()[:2] == ["0", "1"])
    assert head1.split()[2] == "anti-local" and head1.split()[-1] == "anti-local"


def test_cli_default_out_is_in_the_current_folder_not_the_checkpoint(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in checkpoint.iterdir())
    assert biases_cli.main([str(checkpoint), "--query-positions", "31"]) == 0
    out = tmp_path / f"biases_{checkpoint.name}.json"
    assert json.loads(out.read_text())["layers"][0]["heads"][0]["locality"] == "local"
    assert sorted(p.name for p in checkpoint.iterdir()) == before


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["{missing}"], "not found"),
        (["{ckpt}", "--query-positions", "12,abc"], "not an integer"),
        (["{ckpt}", "--query-positions", "-5"], "query position must be an integer >= 0"),
        (["{ckpt}", "--query-positions", "0"], "needs one >= 1"),
        (["{ckpt}", "--matrix", "9:3"], "matrix window"),
        (["{ckpt}", "--text", "{missing}"], "cannot read"),
        (["{ckpt}", "--text", "{short}"], "longer text"),
        ([], "required"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, needle, checkpoint, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    argv = [a.format(ckpt=checkpoint, missing=tmp_path / "nope", short=short) for a in argv]
    assert biases_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("fireviz biases: error:")


# ---------------------------------------------------------------- the normalizer cap, f_θ's input
def test_bias_report_with_a_normalizer_cap_leaves_the_model_alone():
    model = tiny("fire")
    set_fire_heads(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain = A.bias_report(model, [32, 200]).to_dict()
    capped = A.bias_report(model, [32, 200], normalizer_cap=32).to_dict()
    assert capped["normalizer_cap"] == 32 and plain["normalizer_cap"] is None
    assert all(m.normalizer_cap is None for m in model.encodings)  # computed on a copy
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for lp, lc in zip(plain["layers"], capped["layers"], strict=True):
        c32, c200 = (next(c for c in lc["curves"] if c["query_position"] == i) for i in (32, 200))
        p32 = next(c for c in lp["curves"] if c["query_position"] == 32)
        assert c32["bias"] == p32["bias"]  # at the cap nothing changes
        assert [row[:32] for row in c200["bias"]] == [row[:32] for row in p32["bias"]]
    assert A.bias_report(tiny("alibi"), [32], normalizer_cap=32).normalizer_cap is None  # no normalizer
    with pytest.raises(ValueError, match="normalizer_cap"):
        A.bias_report(model, [32], normalizer_cap=0)


def test_fire_input_vs_query_is_psi_over_the_normalizer():
    model = tiny("fire")
    enc = model.encodings[0]
    out = fire_input_vs_query(enc, distances=[1, 64], query_positions=[0, 10, 64, 1000])
    assert out["distances"] == [1, 64] and out["query_positions"] == [0, 10, 64, 1000]
    assert out["input"][1][:2] == [None, None]  # no key 64 tokens back from query 10
    L = float(enc.threshold().detach())
    for d, row in zip(out["distances"], out["input"], strict=True):
        for i, v in zip(out["query_positions"], row, strict=True):
            if d <= i:
                c = float(enc.c.detach())
                assert v == pytest.approx(math.log1p(c * d) / (math.log1p(c * max(L, i)) + enc.eps), rel=1e-5)
    with pytest.raises(ValueError):
        fire_input_vs_query(enc, distances=[0])


def test_cached_attention_dilution_reads_back_and_recomputes_a_damaged_entry(tmp_path):
    model = tiny("fire")
    set_fire_heads(model)
    folder = tmp_path / "fire"
    model.save_pretrained(folder)
    ckpt = Checkpoint.resolve(str(folder))
    tokens = torch.randint(0, 256, (700,))
    kw = dict(near=4, cache_dir=tmp_path / "cache")
    assert TA.cached_attention_dilution(ckpt, tokens, [31, 63, 255], compute=False, **kw) is None
    first = TA.cached_attention_dilution(ckpt, tokens, [31, 63, 255], **kw)
    again = TA.cached_attention_dilution(ckpt, tokens, [31, 63, 255], compute=False, **kw)
    assert first["cached"] is False and again["cached"] is True and again["share"] == first["share"]
    direct = TA.attention_dilution(GPT.from_pretrained(str(folder)), tokens, [31, 63, 255], near=4).to_dict()
    assert first["share"] == direct["share"]
    capped = TA.cached_attention_dilution(ckpt, tokens, [31, 63, 255], normalizer_cap=32, **kw)
    assert capped["normalizer_cap"] == 32 and capped["share"] != first["share"]
    path = TA.dilution_cache_path(ckpt, tokens, [31, 63, 255], 4, 8, None, tmp_path / "cache")
    path.write_text("[" * 50000 + "]" * 50000)  # damaged: recomputed, never shown
    assert TA.cached_attention_dilution(ckpt, tokens, [31, 63, 255], **kw)["cached"] is False


def test_biases_cli_normalizer_cap(tmp_path, capsys):
    model = tiny("fire")
    set_fire_heads(model)
    model.save_pretrained(tmp_path / "fire")
    out = tmp_path / "b.json"
    assert (
        cli_main(
            [
                "biases",
                str(tmp_path / "fire"),
                "--query-positions",
                "32,200",
                "--normalizer-cap",
                "32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "normalizer capped at 32" in capsys.readouterr().out
    assert json.loads(out.read_text())["normalizer_cap"] == 32
    assert cli_main(["biases", str(tmp_path / "fire"), "--normalizer-cap", "0"]) == 2
    assert "normalizer_cap must be an integer number of tokens in 1.." in capsys.readouterr().err


def test_cli_prints_the_dilution_it_measured_and_fireviz_has_a_version(checkpoint, tmp_path, capsys):
    from fireviz import __version__, cli

    text = tmp_path / "t.txt"
    text.write_text("the river stone of the delta " * 40)
    assert (
        biases_cli.main(
            [
                str(checkpoint),
                "--query-positions",
                "31",
                "--text",
                str(text),
                "--dilution-positions",
                "31,63",
                "--out",
                str(tmp_path / "b.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "attention share on the nearest 16 keys" in out and "      31       63" in out
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"fireviz {__version__}"


# ---------------------------------------------------------------- BiasSettings: the report's one unit
def test_bias_settings_validate_resolve_and_describe(fire_model):
    s = A.BiasSettings.make([63, 31, 31])
    assert s.query_positions == (31, 63) and s.classify_at is None
    assert s.describe() == {
        "query_positions": [31, 63],
        "classify_at": None,
        "matrix_window": None,
        "normalizer_cap": None,
        "mlp_grid_points": 201,
    }
    assert s.caption() == "Query positions i = 31, 63 tokens"
    assert s.resolve(SEQ).classify_at == 31 and A.BiasSettings.make().resolve(SEQ).query_positions == (31, 63, 127, 255)
    capped = s.replace(normalizer_cap=32)
    assert capped.normalizer_cap == 32 and capped.query_positions == s.query_positions and s.normalizer_cap is None
    assert "capped at 32 tokens" in capped.caption()
    with pytest.raises(ValueError, match="normalizer_cap"):
        s.replace(normalizer_cap=0)
    with pytest.raises(AttributeError):
        s.classify_at = 3  # frozen
    # the settings are the call: run_bias_report(model, settings) is bias_report with the same arguments
    w = A.BiasSettings.make([15, 40], classify_at=20, matrix_window=(0, 48, 3), mlp_grid_points=11)
    assert (
        A.run_bias_report(fire_model, w, "x").to_dict()
        == A.bias_report(
            fire_model, [15, 40], classify_at=20, matrix_window=(0, 48, 3), checkpoint="x", mlp_grid_points=11
        ).to_dict()
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"query_positions": []}, "query_positions is empty"),
        ({"query_positions": [-1, 5]}, "query position must be an integer >= 0"),
        ({"query_positions": [0, 5]}, "needs one >= 1"),
        ({"classify_at": 0}, "classify_at must be an integer >= 1"),
        ({"matrix_window": (10, 5, 1)}, "matrix window"),
        ({"matrix_window": (0, 5)}, "three integers"),
        ({"normalizer_cap": 0}, "normalizer_cap"),
        ({"mlp_grid_points": 1}, "mlp_grid_points"),
    ],
)
def test_bias_settings_refuse_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        A.BiasSettings.make(**kwargs)


# ---------------------------------------------------------------- bad input: one clear error, never a changed value
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"query_positions": "511"}, r"list of integers .* not '511'.*parse_positions"),
        ({"query_positions": "511,4095"}, "parse_positions"),
        ({"query_positions": 511}, "list of integers"),
        ({"query_positions": [10.7, 20]}, r"query position must be an integer >= 0 \(got 10.7\)"),
        ({"query_positions": [True, False], "classify_at": 1}, r"query position .* \(got (True|False)\)"),
        ({"query_positions": [math.nan]}, r"\(got nan\)"),
        ({"query_positions": [math.inf]}, r"\(got inf\)"),
        ({"query_positions": ["a"]}, r"\(got 'a'\)"),
        ({"query_positions": ["12"]}, r"\(got '12'\)"),
        ({"query_positions": torch.tensor([5, 10])}, "query position must be an integer"),
        ({"classify_at": 2.9}, r"classify_at must be an integer >= 1 \(got 2.9\)"),
        ({"classify_at": True}, r"classify_at must be an integer >= 1 \(got True\)"),
        ({"classify_at": "3"}, r"classify_at must be an integer"),
        ({"matrix_window": (0.5, 10.9, 1.5)}, "three integers"),
        ({"matrix_window": "019"}, "three integers"),
        ({"matrix_window": "0:10:1"}, "three integers"),
        ({"matrix_window": (False, True, True)}, "three integers"),
        ({"matrix_window": (0, math.nan, 1)}, "three integers"),
        ({"normalizer_cap": True}, "normalizer_cap"),
        ({"mlp_grid_points": 2.0}, "mlp_grid_points must be an integer in 2..100000"),
        ({"mlp_grid_points": 3 * 10**6}, r"mlp_grid_points must be an integer in 2..100000 \(got 3000000\)"),
    ],
)
def test_bias_settings_take_integers_only(kwargs, match):
    with pytest.raises(ValueError, match=match):
        A.BiasSettings.make(**kwargs)


def test_bias_settings_accept_numpy_ints_and_validate_direct_construction():
    s = A.BiasSettings.make(np.array([40, 5, 5]), classify_at=np.int64(7), matrix_window=np.array([0, 48, 3]))
    assert s.query_positions == (5, 40) and s.classify_at == 7 and s.matrix_window == (0, 48, 3)
    assert all(type(v) is int for v in (*s.query_positions, s.classify_at, *s.matrix_window))
    assert A.BiasSettings.make(mlp_grid_points=np.int64(50)).describe()["mlp_grid_points"] == 50
    # constructing the dataclass directly runs the same checks (and normalises lists)
    direct = A.BiasSettings(query_positions=[63, 31, 31])
    assert direct == A.BiasSettings.make([31, 63]) and hash(direct) == hash(A.BiasSettings.make([31, 63]))
    for bad in ({"query_positions": (-4,)}, {"query_positions": (0,)}, {"mlp_grid_points": 1}):
        with pytest.raises(ValueError):
            A.BiasSettings(**bad)
    with pytest.raises(ValueError, match="no setting"):
        direct.replace(foo=1)
    assert direct.replace(query_positions=None).query_positions is None
    assert A.parse_positions("511, 4095") == [511, 4095]  # text goes through parse_positions


def _peak_bytes(f) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        f()
    except ValueError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_report_sizes_are_refused_before_anything_is_built(fire_model, monkeypatch):
    from fireviz.model import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 200 << 20)
    # a 10⁶-point window (a 36 MB list of positions if it were built) is refused by arithmetic alone
    s = A.BiasSettings.make([31], matrix_window=(0, 10**6, 1))
    with pytest.raises(memory.InsufficientMemoryError, match="1,000,000 × 1,000,000 bias matrix"):
        A.run_bias_report(fire_model, s)
    assert _peak_bytes(lambda: A.run_bias_report(fire_model, s)) < 4 << 20
    huge = A.BiasSettings.make([31], matrix_window=(0, 10**12, 1))  # no list of 10¹² positions either
    with pytest.raises(memory.InsufficientMemoryError, match="bias matrix"):
        A.run_bias_report(fire_model, huge)
    # FIRE's f_θ grid: refused when its estimate is more than what is available
    enc = fire_model.encoding(0)
    need = memory.fire_curve_bytes(4, enc.mlp_width, A.MAX_MLP_GRID_POINTS, enc.mlp_depth)
    assert need > memory.bias_matrix_bytes(4, A.DEFAULT_MATRIX_POINTS) and need > memory.bias_report_bytes(4, 2, 127)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": need - 1)
    with pytest.raises(memory.InsufficientMemoryError, match="f_θ on 100,000 points"):
        A.run_bias_report(fire_model, A.BiasSettings.make([31, 127], mlp_grid_points=A.MAX_MLP_GRID_POINTS))


def test_dilution_settings_validate_resolve_and_describe():
    from fireviz.analysis.dilution_settings import DilutionSettings

    s = DilutionSettings.make([127, 31, 31], near=np.int64(4))
    assert s.query_positions == (31, 127) and s.near == 4 and type(s.near) is int and s.rows == 8
    assert s.describe() == {"query_positions": [31, 127], "near": 4, "rows": 8, "normalizer_cap": None}
    assert DilutionSettings(query_positions=[127, 31]) == DilutionSettings.make([31, 127], near=16)
    d = DilutionSettings.make().resolve(SEQ)
    assert d.query_positions == tuple(A.default_query_positions(SEQ, A.DEFAULT_DILUTION_MULTIPLES))
    assert DilutionSettings.make().tokens_needed(SEQ) == 16 * SEQ and s.resolve(SEQ) is s
    for kwargs, match in (
        ({"near": 0}, r"near must be an integer >= 1 \(got 0\)"),
        ({"near": 1.5}, "near must be an integer"),
        ({"near": True}, "near must be an integer"),
        ({"rows": 0}, "rows must be an integer >= 1"),
        ({"query_positions": "31"}, "parse_positions"),
        ({"query_positions": []}, "query_positions is empty"),
        ({"normalizer_cap": 0}, "normalizer_cap"),
    ):
        with pytest.raises(ValueError, match=match):
            DilutionSettings.make(**kwargs)


def test_biases_cli_prints_the_librarys_message_and_checks_before_loading(checkpoint, tmp_path, capsys):
    from fireviz.encodings import check_normalizer_cap

    with pytest.raises(ValueError) as caught:
        check_normalizer_cap(0)
    assert biases_cli.main([str(checkpoint), "--normalizer-cap", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == f"fireviz biases: error: {caught.value}"
    # --near is the dilution settings' to check, before the (missing) checkpoint is looked for
    assert biases_cli.main([str(tmp_path / "missing"), "--near", "0"]) == 2
    err = capsys.readouterr().err
    assert "near must be an integer >= 1" in err and "not found" not in err
    # a folder that is not a checkpoint: the loader's own message, on one line
    (tmp_path / "empty").mkdir()
    assert biases_cli.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json" in err[0]
    assert not (tmp_path / "x.json").exists()
    # output paths too, before the (missing) checkpoint: a figure format write_figure lacks, a folder
    from fireviz.plots.export import figure_path_problem

    assert biases_cli.main([str(tmp_path / "missing"), "--figure", str(tmp_path / "grid.jpg")]) == 2
    assert capsys.readouterr().err.strip() == f"fireviz biases: error: {figure_path_problem(tmp_path / 'grid.jpg')}"
    assert ".html" in figure_path_problem(tmp_path / "grid.jpg")
    assert biases_cli.main([str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder; give a file path such as" in err and "not found" not in err


def test_biases_cli_checks_its_default_output_before_the_work(checkpoint, tmp_path, monkeypatch, capsys):
    """No --out: ./biases_<name>.json is checked up front too (a folder of that name is refused
    before the checkpoint is read, with the default named as such)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"biases_{checkpoint.name}.json").mkdir()
    assert biases_cli.main([str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "the default output" in err and "is a folder" in err
    assert biases_cli.main([str(checkpoint), "--out", ""]) == 2  # an empty --out is not "the default"
    assert "--out is empty" in capsys.readouterr().err
    assert (
        biases_cli.main([str(checkpoint), "--out", str(tmp_path / "r.json"), "--figure", f"{tmp_path}/grid.png/"]) == 2
    )  # not a file named grid.png
    assert "names a folder (it ends in /)" in capsys.readouterr().err and not (tmp_path / "grid.png").exists()


def test_rounded_lists_equal_per_value_formatting():
    """The vectorized rounding of bias reports is bit-identical to ``float(f"{v:.{d}g}")`` per value
    (NaN/inf → None, −0.0 kept), on ties, powers of ten and their neighbours, and wide exponents."""
    from fireviz.analysis.biases import _rl
    from fireviz.analysis.locality import _r

    rng = np.random.default_rng(0)
    a = rng.standard_normal(60_000) * 10.0 ** rng.integers(-30, 30, 60_000)
    a[::97] = np.nan
    a[1::91] = np.inf
    a[2::89] = -np.inf
    a[3::83] = 0.0
    a[4::79] = -0.0
    a[5::7] = np.round(a[5::7], 3)  # decimal ties
    p10 = 10.0 ** rng.integers(-12, 12, a[6::5].size)
    a[6::5] = p10 * rng.choice([-1.0, 1.0], p10.size)
    a[7::11] = np.nextafter(10.0 ** rng.integers(-12, 12, a[7::11].size), 0)
    a[8::13] = -rng.random(a[8::13].size) * 30  # an ALiBi curve's range
    for digits in (6, 9):
        got = _rl(a.reshape(300, 200), digits)
        want = [[_r(v, digits) for v in row] for row in a.reshape(300, 200)]
        flat_got = [x for row in got for x in row]
        flat_want = [x for row in want for x in row]
        assert [None if x is None else (x, math.copysign(1, x)) for x in flat_got] == [
            None if x is None else (x, math.copysign(1, x)) for x in flat_want
        ]


def test_cli_text_reads_only_the_bytes_the_dilution_needs(checkpoint, tmp_path, capsys):
    """Issue #38: ``biases --text`` read the whole file (1.1 GB for 50 MB; MemoryError on /dev/zero).
    It reads BOS + bytes up to the largest query position: /dev/zero works, and a large file gives
    the same numbers as its prefix."""
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.write(("the quick brown fox " * 20).encode())
        f.write(b"x" * (64 << 20))  # 64 MB more that the measurement never reaches
    prefix = tmp_path / "prefix.txt"
    prefix.write_bytes(big.read_bytes()[:400])
    outs = {}
    for name, path in (("big", big), ("prefix", prefix), ("zero", Path("/dev/zero"))):
        out = tmp_path / f"{name}.json"
        argv = ["biases", str(checkpoint), "--out", str(out), "--text", str(path), "--dilution-positions", "31,300"]
        assert cli_main(argv) == 0, capsys.readouterr().err
        outs[name] = json.loads(out.read_text())["dilution"]["share"]
    assert outs["big"] == outs["prefix"] and np.isfinite(np.array(outs["zero"], dtype=float)).all()
