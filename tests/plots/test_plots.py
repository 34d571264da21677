"""fireviz.plots: every figure built from a tiny model or synthetic data; asserts on trace values."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from plotly_data import decode, shapes, traces

from fireviz import plots as P
from fireviz.analysis import biases as A
from fireviz.analysis import text_attention as TA
from fireviz.model.gpt import GPT, GPTConfig

SEQ = 16


def tiny(encoding: str, **opts) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=SEQ, position_encoding=encoding, encoding_options=opts)
    ).eval()


@pytest.fixture(scope="module")
def fire_report() -> dict:
    m = tiny("fire")
    with torch.no_grad():
        for layer in range(2):
            lin1, lin2 = m.encoding(layer).mlp[0], m.encoding(layer).mlp[2]
            for t in (lin1.weight, lin1.bias, lin2.weight, lin2.bias):
                t.zero_()
            lin1.weight[0, 0] = 1.0
            lin2.weight[0, 0], lin2.weight[1, 0] = -3.0, 2.0  # head 0 local, head 1 anti-local
    return A.bias_report(m, checkpoint="fire-tiny", matrix_window=(0, 40, 2)).to_dict()


def test_decode_helper_roundtrip():
    fig = go.Figure(
        [
            go.Scatter(x=np.arange(4), y=np.array([1.5, np.nan, 3.0, 4.0], dtype=np.float32)),
            go.Heatmap(z=np.arange(6.0).reshape(2, 3)),
        ]
    )
    t = traces(fig)
    np.testing.assert_array_equal(t[0]["x"], [0, 1, 2, 3])
    np.testing.assert_array_equal(t[0]["y"], np.array([1.5, np.nan, 3.0, 4.0], dtype=np.float32))
    assert t[1]["z"].shape == (2, 3) and t[1]["z"][1, 2] == 5.0
    assert decode([1, None]).dtype == np.float64


# -- biases ------------------------------------------------------------------------------------
def test_bias_grid_values_and_marks(fire_report):
    fig = P.bias_grid_figure(fire_report)
    ts = traces(fig)
    qpos = fire_report["query_positions"]
    assert len(ts) == 2 * 2 * len(qpos)
    by_meta = {(t["meta"]["layer"], t["meta"]["head"], t["meta"]["query_position"]): t for t in ts}
    for lay in fire_report["layers"]:
        for c in lay["curves"]:
            for h in range(2):
                t = by_meta[(lay["layer"], h, c["query_position"])]
                np.testing.assert_array_equal(t["x"], np.arange(c["query_position"] + 1))
                np.testing.assert_allclose(t["y"], c["bias"][h], rtol=1e-6)
    # head 0 falls, head 1 rises, with the FIRE formula's values at the far end (x = 1)
    far = by_meta[(0, 0, SEQ - 1)]["y"][-1]
    assert far == pytest.approx(-3.0, abs=1e-4) and by_meta[(1, 1, SEQ - 1)]["y"][-1] == pytest.approx(2.0, abs=1e-4)
    marks = shapes(fig, P.TRAIN_MARK)
    assert len(marks) == 4 and {m["x0"] for m in marks} == {SEQ}
    assert len({m["xref"] for m in marks}) == 4  # one per panel
    layout = fig.to_dict()["layout"]
    assert "tokens" in layout["xaxis3"]["title"]["text"] and "logits" in layout["yaxis"]["title"]["text"]
    titles = [a["text"] for a in layout["annotations"]]
    assert "L0 H0 · local" in titles and "L1 H1 · anti-local" in titles


def test_bias_grid_subset_and_subsampling(fire_report):
    fig = P.bias_grid_figure(fire_report, query_positions=[8 * SEQ - 1], max_points=20)
    ts = traces(fig)
    assert len(ts) == 4 and all(t["meta"]["query_position"] == 8 * SEQ - 1 for t in ts)
    x = ts[0]["x"]
    assert x[0] == 0 and x[-1] == 8 * SEQ - 1 and np.all(np.diff(x) > 0)
    np.testing.assert_array_equal(x[:64], np.arange(64))  # short distances stay exact
    full = np.array(fire_report["layers"][0]["curves"][-1]["bias"][0])
    np.testing.assert_allclose(ts[0]["y"], full[x], rtol=1e-6)
    with pytest.raises(ValueError):
        P.bias_grid_figure(fire_report, query_positions=[3])


def test_bias_grid_on_a_log_distance_axis(fire_report):
    """From distance 1 (0 has no place on a log axis), log-spaced when subsampled, every axis log,
    the training length still marked; the values are the report's."""
    q = 8 * SEQ - 1
    full = np.array(fire_report["layers"][0]["curves"][-1]["bias"][0])
    for max_points, exact in ((None, True), (40, False)):
        fig = P.bias_grid_figure(fire_report, query_positions=[q], max_points=max_points, x_axis="log_distance")
        x = traces(fig)[0]["x"]
        assert x[0] == 1 and x[-1] == q and np.all(np.diff(x) > 0)
        if exact:
            np.testing.assert_array_equal(x, np.arange(1, q + 1))
        else:  # the first 64 distances exact, then even steps in log distance
            np.testing.assert_array_equal(x[:63], np.arange(1, 64))
            steps = np.diff(np.log(x[x > 64]))
            assert steps.max() < 3 * np.median(steps)
        np.testing.assert_allclose(traces(fig)[0]["y"], full[x], rtol=1e-6)
        layout = fig.to_dict()["layout"]
        axes = [k for k in layout if k.startswith("xaxis")]
        assert len(axes) == 4 and all(layout[k]["type"] == "log" for k in axes)
        assert "log scale" in layout["xaxis3"]["title"]["text"] and layout["meta"]["x_axis"] == "log_distance"
        assert {m["x0"] for m in shapes(fig, P.TRAIN_MARK)} == {SEQ}
    with pytest.raises(ValueError, match="x_axis"):
        P.bias_grid_figure(fire_report, x_axis="normalized")


def test_rotary_and_nope_grids():
    rep = A.bias_report(tiny("rope"), query_positions=[20]).to_dict()
    fig = P.bias_grid_figure(rep)
    (t,) = traces(fig)
    d = np.arange(21)
    theta = 10000.0 ** -(np.arange(4) / 4)  # head_dim 8: θ_k = 10000^(−2k/8)
    np.testing.assert_allclose(t["y"], np.cos(d[:, None] * theta).mean(1), rtol=1e-6, atol=1e-7)
    assert "kernel" in fig.layout.title.text and shapes(fig, P.TRAIN_MARK)[0]["x0"] == SEQ
    nope = P.bias_grid_figure(A.bias_report(tiny("nope")))
    assert len(nope.data) == 0 and "no position bias" in nope.layout.title.text


def test_head_bias_figure_distance_and_normalized(fire_report):
    fig = P.head_bias_figure(fire_report, layer=1, head=0)
    ts = traces(fig)
    assert [t["meta"]["query_position"] for t in ts] == fire_report["query_positions"]
    np.testing.assert_allclose(ts[2]["y"], fire_report["layers"][1]["curves"][2]["bias"][0], rtol=1e-6)
    assert shapes(fig, P.TRAIN_MARK)[0]["x0"] == SEQ
    fig = P.head_bias_figure(fire_report, layer=1, head=0, x_axis="normalized")
    ts = traces(fig)
    for t in ts[:-1]:  # every curve lies on f(x) = −3x over x in [0, 1]
        assert t["x"].min() == 0 and t["x"].max() == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(t["y"], -3.0 * t["x"], atol=1e-5)
    assert ts[-1]["meta"]["mlp"] and ts[-1]["x"].size == 201
    np.testing.assert_allclose(ts[-1]["y"], -3.0 * ts[-1]["x"], atol=1e-6)
    alibi = A.bias_report(tiny("alibi"), query_positions=[15]).to_dict()
    with pytest.raises(ValueError, match="not FIRE"):
        P.head_bias_figure(alibi, 0, 0, x_axis="normalized")
    with pytest.raises(ValueError):
        P.head_bias_figure(fire_report, 0, 5)


def test_bias_heatmap(fire_report):
    fig = P.bias_heatmap_figure(fire_report, layer=0, head=1)
    (t,) = traces(fig)
    grid = np.arange(0, 40, 2)
    np.testing.assert_array_equal(t["x"], grid)
    np.testing.assert_array_equal(t["y"], grid)
    ref = np.array(fire_report["layers"][0]["matrix"]["bias"][1], dtype=np.float64)
    assert t["z"].shape == (20, 20)
    np.testing.assert_allclose(t["z"], ref, rtol=1e-6, equal_nan=True)
    assert np.isnan(t["z"][0, 1]) and not np.isnan(t["z"][1, 0])  # future key blank
    marks = shapes(fig, P.TRAIN_MARK)
    assert {(m["type"], m.get("x0"), m.get("y0")) for m in marks} == {("line", SEQ, 0), ("line", 0, SEQ)}
    assert "query position i" in fig.layout.title.subtitle.text
    alibi = P.bias_heatmap_figure(A.bias_report(tiny("alibi")), 0, 0)
    assert alibi.layout.title.subtitle.text == "alibi depends on i − j only: constant along each diagonal"
    assert alibi.data[0].zmid is None  # all ≤ 0: sequential colours, not one dark half of RdBu
    (a,) = traces(alibi)  # what the subtitle says: one value per distance i − j
    by_distance: dict = {}
    for qi, q in enumerate(a["y"]):
        for ki, k in enumerate(a["x"]):
            if not np.isnan(a["z"][qi, ki]):
                by_distance.setdefault(q - k, []).append(a["z"][qi, ki])
    assert len(by_distance) > 3 and all(np.ptp(v) < 1e-5 for v in by_distance.values())
    with pytest.raises(ValueError):
        P.bias_heatmap_figure(A.bias_report(tiny("rope")), 0, 0)


def test_bias_heatmap_color_limit():
    """color_limit saturates the colours, never the data; a limit the bias stays within changes nothing."""
    rep = {
        "kind": "additive",
        "encoding": "kerple_power",
        "train_seq_len": 4,
        "layers": [
            {
                "layer": 0,
                "matrix": {
                    "query_positions": [0, 4, 8],
                    "key_positions": [0, 4, 8],
                    "bias": [
                        [[0.0, None, None], [-50.0, 0.0, None], [-900.0, -50.0, 0.0]],
                        [[2.0, None, None], [-30.0, 2.0, None], [-60.0, -30.0, 2.0]],
                    ],
                },
            }
        ],
    }
    full = P.bias_heatmap_figure(rep, 0, 0)
    assert full.data[0].zmin is None and full.data[0].colorscale[0][1] == "#440154"  # Viridis, full range
    clipped = P.bias_heatmap_figure(rep, 0, 0, color_limit=20)
    (t,) = traces(clipped)
    assert (clipped.data[0].zmin, clipped.data[0].zmax) == (-20.0, 0.0)
    assert np.nanmin(t["z"]) == -900.0  # data untouched
    assert "saturated at |b| ≥ 20" in clipped.data[0].colorbar.title.text
    both = P.bias_heatmap_figure(rep, 0, 1, color_limit=10)  # both signs: symmetric around 0
    assert (both.data[0].zmin, both.data[0].zmax) == (-10.0, 10.0)
    wide = P.bias_heatmap_figure(rep, 0, 0, color_limit=1000)  # within the limit: as without it
    assert wide.data[0].zmin is None and wide.data[0].colorbar.title.text == "bias (logits)"
    for bad in (0, -5, float("nan"), "20", True):
        with pytest.raises(ValueError, match="color_limit"):
            P.bias_heatmap_figure(rep, 0, 0, color_limit=bad)
    assert P.bias_heatmap_figure(rep, 0, 0, color_limit=np.int64(20)).data[0].zmin == -20.0


def test_dilution_figure():
    res = {
        "checkpoint": "c",
        "query_positions": [15, 31, 255],
        "near": 8,
        "rows": 2,
        "train_seq_len": SEQ,
        "share": [[[0.9, 0.5, 0.2], [0.3, 0.3, 0.3]]],
    }
    fig = P.dilution_figure(res)
    ts = traces(fig)
    assert [t["name"] for t in ts] == ["L0 H0", "L0 H1"]
    np.testing.assert_allclose(ts[0]["y"], [0.9, 0.5, 0.2])
    np.testing.assert_array_equal(ts[0]["x"], [15, 31, 255])
    assert fig.layout.xaxis.type == "log" and shapes(fig, P.TRAIN_MARK)[0]["x0"] == SEQ


# -- perplexity / loss ---------------------------------------------------------------------------
def ppl_result(ckpt, label, ppls, train=SEQ, stride=8):
    return {
        "checkpoint": ckpt,
        "label": label,
        "train_seq_len": train,
        "settings": {"mode": "sliding", "stride": stride, "token_budget": 1000, "seed": 0, "domain": "prose"},
        "per_length": [
            {
                "length": n,
                "perplexity": p,
                "nats_per_token": math.log(p),
                "bits_per_byte": math.log(p) / math.log(2),
                "tokens_scored": 100,
                "windows": 3,
                "loss_by_position": {"bucket_starts": [0, n // 2], "nats": [math.log(p) + 0.1, math.log(p) - 0.1]},
            }
            for n, p in zip((16, 64, 256), ppls, strict=True)
        ],
    }


def test_perplexity_groups_seeds_with_error_bars():
    results = [
        ppl_result("fire-s0", "fire", [3.0, 4.0, 8.0]),
        ppl_result("fire-s1", "fire", [5.0, 6.0, 10.0]),
        ppl_result("rope-s0", "rope", [3.5, 20.0, 90.0]),
    ]
    fig = P.perplexity_figure(results)
    fire, rope = traces(fig)
    np.testing.assert_array_equal(fire["x"], [16, 64, 256])
    # exp(mean nats): the perplexity of the mean loss (geometric mean), consistent with mean bits per byte
    np.testing.assert_allclose(fire["y"], [math.sqrt(15.0), math.sqrt(24.0), math.sqrt(80.0)])
    np.testing.assert_allclose(fire["error_y"]["array"], [math.sqrt(2)] * 3)  # sample std of two seeds
    assert fire["meta"] == {"group": "fire", "n": 2} and "2 seeds" in fire["name"]
    np.testing.assert_allclose(rope["y"], [3.5, 20.0, 90.0])
    assert "error_y" not in rope or "array" not in rope["error_y"]
    layout = fig.to_dict()["layout"]
    assert layout["yaxis"]["type"] == "log" and "tokens" in layout["xaxis"]["title"]["text"]
    assert shapes(fig, P.TRAIN_MARK)[0]["x0"] == SEQ
    assert "stride 8" in layout["title"]["subtitle"]["text"] and "mode sliding" in layout["title"]["subtitle"]["text"]
    rows = P.group_perplexity(results)
    bpb = [math.log(3) / math.log(2), math.log(5) / math.log(2)]
    assert rows[0] == {
        "group": "fire",
        "length": 16,
        "bits_per_byte": pytest.approx(sum(bpb) / 2),
        "bits_per_byte_std": pytest.approx(abs(bpb[1] - bpb[0]) / math.sqrt(2)),
        "perplexity": pytest.approx(math.sqrt(15.0)),
        "perplexity_std": pytest.approx(math.sqrt(2)),
        "nats_per_token": pytest.approx((math.log(3) + math.log(5)) / 2),
        "n": 2,
        "train_seq_len": SEQ,
        # no per-document losses in these results: no interval, and what was scored is passed on
        "ci95_low": None,
        "ci95_high": None,
        "documents": None,
        "windows": results[0]["per_length"][0].get("windows"),
        "tokens_scored": results[0]["per_length"][0].get("tokens_scored"),
    }
    assert (
        rows[-1]["group"] == "rope"
        and rows[-1]["bits_per_byte_std"] is None
        and rows[-1]["perplexity"] == pytest.approx(90.0)
    )
    # grouping by checkpoint instead: three lines, no error bars
    by_ckpt = traces(P.perplexity_figure(results, group_key="checkpoint"))
    assert [t["meta"]["group"] for t in by_ckpt] == ["fire-s0", "fire-s1", "rope-s0"]
    mixed = P.perplexity_figure([results[0], ppl_result("x", "x", [1.0, 2.0, 3.0], stride=4)])
    assert "stride varies" in mixed.layout.title.subtitle.text
    with pytest.raises(ValueError):
        P.perplexity_figure([])
    with pytest.raises(ValueError):
        P.group_perplexity([{"checkpoint": "a", "per_length": [{"length": 4}]}])


def test_perplexity_uses_evaluate_settings_skips_errors_and_ticks_at_lengths():
    res = ppl_result("fire-s0", "fire", [3.0, 4.0, 8.0])
    res["settings"] = {
        "data": "latex",
        "split": "validation",
        "mode": "nonoverlapping",
        "stride": None,
        "token_budget": 4096,
        "seed": 0,
    }
    res["per_length"].append({"length": 100000, "error": "no document has 100000 tokens"})
    fig = P.perplexity_figure([res])
    (trace,) = traces(fig)
    np.testing.assert_array_equal(trace["x"], [16, 64, 256])  # the error row is not drawn
    caption = fig.layout.title.subtitle.text
    assert "data latex" in caption and "split validation" in caption and "stride" not in caption
    assert "window seed 0" in caption  # the evaluation's seed, not the checkpoint's training seed
    assert list(fig.layout.xaxis.tickvals) == [16, 64, 256]
    # the log y-axis is labelled inside a short range (perplexity 3–5: every digit), coarser on a long one
    assert P._log_ticks(3.3, 4.6) == [3.4, 3.6, 3.8, 4.0, 4.2, 4.4, 4.6]
    assert P._log_ticks(3.6, 4.0) == [3.6, 3.7, 3.8, 3.9, 4.0]  # a short range is labelled inside
    # the top of the range is labelled where the last digit tick sits well below it (issue #48:
    # labels stopped at 10 while the curves reached 19–25)
    assert P._log_ticks(3.3, 19.0) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 19.0]
    assert P._log_ticks(1.9, 25.0)[-1] == 20.0  # 20 is near enough the top: nothing added
    assert P._log_ticks(1.0, 1000.0) == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
    assert P._log_ticks(0.0, 5.0) == []
    # log y labelled at round values, every digit on this short range (ten labels at most)
    assert list(fig.layout.yaxis.ticktext) == ["3", "4", "5", "6", "7", "8"]


def test_loss_by_position():
    results = [ppl_result("a", "fire", [3.0, 4.0, 8.0]), ppl_result("b", "rope", [3.0, 4.0, 8.0], train=32)]
    fig = P.loss_by_position_figure(results, lengths=[64])
    ts = traces(fig)
    assert [t["meta"] for t in ts] == [{"group": "fire", "length": 64}, {"group": "rope", "length": 64}]
    np.testing.assert_array_equal(ts[0]["x"], [0, 32])
    np.testing.assert_allclose(ts[0]["y"], [math.log(4) + 0.1, math.log(4) - 0.1])
    assert sorted(m["x0"] for m in shapes(fig, P.TRAIN_MARK)) == [SEQ, 32]
    assert "nats/token" in fig.layout.yaxis.title.text
    assert len(P.loss_by_position_figure(results[0]).data) == 3  # a single result, every length
    # colours as in perplexity_figure (by name, first seen), lengths by dash; pooled runs share a colour
    ppl_colors = [t.line.color for t in P.perplexity_figure(results).data]
    both = P.loss_by_position_figure(results, lengths=[16, 64])
    assert [t.line.color for t in both.data] == [ppl_colors[0]] * 2 + [ppl_colors[1]] * 2
    assert [t.line.dash for t in both.data] == ["solid", "dash"] * 2
    pooled = P.loss_by_position_figure(results, lengths=[64], color_groups={"rope": "fire"})
    assert pooled.data[0].line.color == pooled.data[1].line.color
    with pytest.raises(ValueError):
        P.loss_by_position_figure(results, lengths=[999])


# -- fit / training ----------------------------------------------------------------------------
def test_fit_figure():
    d = np.arange(10)
    target = np.stack([-0.5 * d, -np.log1p(d)])
    fitted = target + np.linspace(0, 0.3, 10)
    fig = P.fit_figure(
        {"distance": d.tolist(), "target": target.tolist(), "fitted": fitted.tolist(), "max_len": 6}, head=1
    )
    t, f, r = traces(fig)
    assert [x["meta"]["series"] for x in (t, f, r)] == ["target", "fitted", "residual"]
    np.testing.assert_allclose(t["y"], target[1])
    np.testing.assert_allclose(f["y"], fitted[1])
    np.testing.assert_allclose(r["y"], -np.linspace(0, 0.3, 10), atol=1e-12)
    assert r["yaxis"] == "y2"
    marks = shapes(fig, P.FIT_RANGE_MARK)
    assert len(marks) == 2 and all(m["x0"] == 0 and m["x1"] == 6 for m in marks)
    # 1-D arrays and an explicit residual
    fig = P.fit_figure(
        {"distance": [0, 1, 2], "target": [0, -1, -2], "fitted": [0, -1, -1], "residual": [9, 9, 9], "max_len": 2}
    )
    np.testing.assert_allclose(traces(fig)[2]["y"], [9, 9, 9])
    with pytest.raises(ValueError):
        P.fit_figure({"distance": [0, 1], "target": [0, 1, 2], "fitted": [0, 1, 2], "max_len": 1})
    with pytest.raises(ValueError):
        P.fit_figure({"distance": [0, 1], "target": [0, 1]})


def test_training_curves():
    log = [{"step": s, "tokens": 1000 * s, "loss": 3.0 / s, "lr": 1e-3 * s, "tokens_per_s": 5.0} for s in (1, 2, 3, 4)]
    log[1].update(val_loss=2.0, val_loss_4x=2.5)
    log[3].update(val_loss=1.0, val_loss_4x=1.8)
    fig = P.training_curves_figure({"fire": log, "rope": log[:2]})
    ts = {(t["meta"]["run"], t["meta"]["series"]): t for t in traces(fig)}
    np.testing.assert_array_equal(ts[("fire", "loss")]["x"], [1000, 2000, 3000, 4000])
    np.testing.assert_allclose(ts[("fire", "loss")]["y"], [3.0, 1.5, 1.0, 0.75])
    np.testing.assert_allclose(ts[("fire", "val_loss")]["y"], [2.0, 1.0])
    np.testing.assert_array_equal(ts[("fire", "val_loss_4x")]["x"], [2000, 4000])
    np.testing.assert_allclose(ts[("rope", "lr")]["y"], [1e-3, 2e-3])
    lo, hi = fig.layout.yaxis.range
    assert lo < 0.75 and hi > 3.0  # short logs: everything in view
    # a long log: the y range leaves out the first steps' spike (≈ 6 nats), keeps the rest
    long = [{"step": s, "tokens": s, "loss": 1.0 + 5.0 * math.exp(-s / 5)} for s in range(1, 101)]
    lo, hi = P.training_curves_figure({"x": long}).layout.yaxis.range
    assert lo < 1.0 and 2.5 < hi < 3.5
    # a validation point mid-run above that (NoPE at 4× length climbs while training) stays in view
    bumpy = [dict(r) for r in long]
    bumpy[59].update(val_loss=1.5, val_loss_4x=4.2)
    bumpy[99].update(val_loss=1.4, val_loss_4x=3.9)
    assert P.training_curves_figure({"x": bumpy}).layout.yaxis.range[1] > 4.2
    assert [t["name"] for t in traces(fig) if t["showlegend"] is not False] == ["fire", "rope"]
    assert fig.layout.xaxis2.title.text == "tokens seen" and "nats/token" in fig.layout.yaxis.title.text
    steps = P.training_curves_figure([{"step": 5, "loss": 2.0}])
    np.testing.assert_array_equal(traces(steps)[0]["x"], [5])
    assert steps.layout.xaxis2.title.text == "step"
    with pytest.raises(ValueError):
        P.training_curves_figure([])
    # smoothing: trailing mean of the train loss over `smooth` logged steps; validation points untouched
    sm = {(t["meta"]["run"], t["meta"]["series"]): t for t in traces(P.training_curves_figure({"fire": log}, smooth=2))}
    np.testing.assert_allclose(sm[("fire", "loss")]["y"], [3.0, 2.25, 1.25, 0.875])
    assert sm[("fire", "loss")]["meta"]["smooth"] == 2 and "smooth" not in ts[("fire", "loss")]["meta"]
    np.testing.assert_allclose(sm[("fire", "val_loss")]["y"], [2.0, 1.0])
    np.testing.assert_array_equal(sm[("fire", "loss")]["x"], [1000, 2000, 3000, 4000])
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="smooth"):
            P.training_curves_figure({"fire": log}, smooth=bad)
    # one non-finite loss is skipped by the windows that hold it, not spread over the rest of the curve
    holed = [dict(r) for r in log]
    holed[1]["loss"] = math.nan
    y = [t for t in traces(P.training_curves_figure({"fire": holed}, smooth=2)) if t["meta"]["series"] == "loss"][0][
        "y"
    ]
    np.testing.assert_allclose(y, [3.0, 3.0, 1.0, 0.875])


def test_validation_curves():
    log = [{"step": s, "tokens": 1000 * s, "loss": 3.0 / s, "lr": 1e-3} for s in (1, 2, 3, 4)]
    log[1].update(val_loss=2.0, val_loss_4x=2.5)
    log[3].update(val_loss=1.0)  # a row without the 4× value is kept on the left only
    fig = P.validation_curves_figure(
        {"fire": log, "rope": [{"step": 5, "tokens": 50, "val_loss": 5.5, "val_loss_4x": 5.6}]}, seq_len=512
    )
    ts = {(t["meta"]["run"], t["meta"]["series"]): t for t in traces(fig)}
    assert set(ts) == {("fire", "val_loss"), ("fire", "val_loss_4x"), ("rope", "val_loss"), ("rope", "val_loss_4x")}
    np.testing.assert_array_equal(ts[("fire", "val_loss")]["x"], [2000, 4000])
    np.testing.assert_allclose(ts[("fire", "val_loss")]["y"], [2.0, 1.0])
    np.testing.assert_allclose(ts[("fire", "val_loss_4x")]["y"], [2.5])
    assert ts[("fire", "val_loss_4x")]["xaxis"] == "x2" and ts[("fire", "val_loss")]["showlegend"]
    assert not ts[("fire", "val_loss_4x")]["showlegend"]  # one legend entry per run
    assert [a.text for a in fig.layout.annotations] == ["validation @ 512 tokens", "validation @ 2048 tokens (4×)"]
    with pytest.raises(ValueError, match="val_loss"):
        P.validation_curves_figure({"fire": [{"step": 1, "loss": 2.0}]})
    init = {"fire": [{"step": 0, "tokens": 0, "val_loss": 5.5}, {"step": 9, "tokens": 90, "val_loss": 2.0}]}
    assert list(traces(P.validation_curves_figure(init))[0]["x"]) == [90]
    assert list(traces(P.validation_curves_figure(init, skip_initial=False))[0]["x"]) == [0, 90]


# -- export ------------------------------------------------------------------------------------
def test_csv_and_json_export(fire_report):
    fig = P.perplexity_figure([ppl_result("a", "fire", [3.0, 4.0, 8.0]), ppl_result("b", "fire", [5.0, 6.0, 10.0])])
    rows = list(csv.DictReader(io.StringIO(P.figure_to_csv(fig))))
    assert [float(r["y"]) for r in rows] == pytest.approx([math.sqrt(15.0), math.sqrt(24.0), math.sqrt(80.0)])
    assert [int(r["x"]) for r in rows] == [16, 64, 256] and rows[0]["group"] == "fire"
    assert float(rows[0]["error_y"]) == pytest.approx(math.sqrt(2))
    assert "z" not in rows[0] and list(rows[0])[-3:] == ["x", "y", "error_y"]  # no heatmap: no z column
    data = json.loads(P.figure_to_json(fig))
    assert data["traces"][0]["y"] == pytest.approx([math.sqrt(15.0), math.sqrt(24.0), math.sqrt(80.0)])
    assert data["markers"][0]["x0"] == SEQ

    heat = P.bias_heatmap_figure(fire_report, 0, 0)
    rows = list(csv.DictReader(io.StringIO(P.figure_to_csv(heat))))
    assert len(rows) == 20 * 20
    z = np.array(fire_report["layers"][0]["matrix"]["bias"][0], dtype=np.float64)
    cell = next(r for r in rows if r["x"] == "4" and r["y"] == "10")  # key 4, query 10 (grid index 2, 5)
    assert float(cell["z"]) == pytest.approx(z[5, 2], rel=1e-6)
    assert next(r for r in rows if r["x"] == "10" and r["y"] == "4")["z"] == ""  # future key
    data = json.loads(P.figure_to_json(heat))
    assert data["traces"][0]["z"][0][1] is None and data["traces"][0]["meta"] == {"layer": 0, "head": 0}

    grid = P.bias_grid_figure(fire_report, query_positions=[SEQ - 1])
    rows = list(csv.DictReader(io.StringIO(P.figure_to_csv(grid))))
    assert len(rows) == 4 * SEQ and {"layer", "head", "query_position"} <= set(rows[0])
    assert "z" not in rows[0] and "error_y" not in rows[0]  # line figure without error bars
    r = next(r for r in rows if r["layer"] == "0" and r["head"] == "0" and r["x"] == str(SEQ - 1))
    assert float(r["y"]) == pytest.approx(-3.0, abs=1e-4)


def _doc_result(name, group, nats_by_doc, tokens, length=16):
    docs = [f"d{i}" for i in range(len(tokens))]
    mean = sum(nats_by_doc) / sum(tokens)
    from fireviz.eval.stats import bootstrap_ci95

    entry = {
        "length": length,
        "nats_per_token": mean,
        "perplexity": math.exp(mean),
        "bits_per_byte": mean / math.log(2),
        "tokens_scored": sum(tokens),
        "windows": len(tokens),
        "documents": len(tokens),
        "per_document": {"doc": docs, "nats": list(nats_by_doc), "tokens": list(tokens)},
        "ci95": bootstrap_ci95(nats_by_doc, tokens),
    }
    return {
        "checkpoint": name,
        "label": group,
        "train_seq_len": SEQ,
        "settings": {"mode": "same_text"},
        "per_length": [entry],
    }


def test_intervals_and_paired_differences_of_single_and_pooled_runs():
    tokens = [100, 120, 80, 150, 90, 110]
    base = [t * (1.0 + 0.1 * k) for k, t in enumerate(tokens)]
    a = _doc_result("alibi", "alibi", base, tokens)
    f0 = _doc_result("fire", "fire", [x + 0.05 * t for x, t in zip(base, tokens, strict=True)], tokens)
    f1 = _doc_result(
        "fire_seed1",
        "fire",
        [x + 0.15 * t + (k % 2) for k, (x, t) in enumerate(zip(base, tokens, strict=True))],
        tokens,
    )
    rows = {r["group"]: r for r in P.group_perplexity([a, f0, f1])}
    assert (rows["alibi"]["ci95_low"], rows["alibi"]["ci95_high"]) == tuple(a["per_length"][0]["ci95"])
    assert (
        rows["fire"]["n"] == 2 and rows["fire"]["ci95_low"] < rows["fire"]["bits_per_byte"] < rows["fire"]["ci95_high"]
    )
    paired = P.paired_difference_rows([a, f0, f1], reference="alibi")
    assert [(r["group"], r["length"], r["n"]) for r in paired] == [("fire", 16, 2)]
    pooled = [
        (x0 + x1) / 2
        for x0, x1 in zip(
            f0["per_length"][0]["per_document"]["nats"], f1["per_length"][0]["per_document"]["nats"], strict=True
        )
    ]
    expected = (sum(pooled) - sum(base)) / sum(tokens) / math.log(2)
    assert paired[0]["paired_delta_bpb"] == pytest.approx(expected)
    assert paired[0]["ci95_low"] <= expected <= paired[0]["ci95_high"]
    # the seed spread beside the text interval: std of the two seeds' bits per byte; one reference seed
    bpb = [sum(r["per_length"][0]["per_document"]["nats"]) / sum(tokens) / math.log(2) for r in (f0, f1)]
    assert paired[0]["seed_std"] == pytest.approx(abs(bpb[0] - bpb[1]) / math.sqrt(2))
    assert (paired[0]["reference_n"], paired[0]["reference_seed_std"]) == (1, None)
    a1 = _doc_result("alibi_seed1", "alibi", [x + 0.02 * t for x, t in zip(base, tokens, strict=True)], tokens)
    two_refs = P.paired_difference_rows([a, a1, f0, f1], reference="alibi")[0]
    ref_bpb = [sum(r["per_length"][0]["per_document"]["nats"]) / sum(tokens) / math.log(2) for r in (a, a1)]
    assert two_refs["reference_n"] == 2
    assert two_refs["reference_seed_std"] == pytest.approx(abs(ref_bpb[0] - ref_bpb[1]) / math.sqrt(2))
    assert two_refs["paired_delta_bpb"] == pytest.approx(expected - (ref_bpb[1] - ref_bpb[0]) / 2)
    fig = P.paired_difference_figure([a, f0, f1], reference="alibi")
    tr = fig.data[0]
    assert tr.meta == {"group": "fire", "reference": "alibi", "n": 2}
    np.testing.assert_allclose(np.asarray(tr.y) + np.asarray(tr.error_y.array), [paired[0]["ci95_high"]])
    np.testing.assert_allclose(np.asarray(tr.y) - np.asarray(tr.error_y.arrayminus), [paired[0]["ci95_low"]])
    with pytest.raises(ValueError, match="not one of the groups"):
        P.paired_difference_rows([a, f0], reference="t5")
    other = _doc_result("rope", "rope", base[:-1], tokens[:-1])  # other documents: never paired
    assert P.paired_difference_rows([a, other]) == []
    with pytest.raises(ValueError, match="no paired differences"):
        P.paired_difference_figure([a, other])
    # a single run's perplexity error bars are its interval, 2^bpb
    single = P.perplexity_figure([a])
    ci = a["per_length"][0]["ci95"]
    y = single.data[0].y[0]
    assert single.data[0].error_y.array[0] == pytest.approx(2 ** ci[1] - y)
    assert single.data[0].error_y.arrayminus[0] == pytest.approx(y - 2 ** ci[0])


def test_position_parameters_figure():
    logs = {
        "kerple_power": [
            {
                "step": 0,
                "tokens": 0,
                "val_loss": 5.0,
                "position_parameters": {
                    "r1": {"0": [1.0, 2.0], "1": [0.5, 0.5]},
                    "r2": {"0": [0.5, 0.01], "1": [1.0, 2.0]},
                },
            },
            {"step": 1, "tokens": 10, "loss": 4.0},
            {
                "step": 2,
                "tokens": 20,
                "val_loss": 3.0,
                "position_parameters": {
                    "r1": {"0": [1.5, 2.5], "1": [0.5, 0.6]},
                    "r2": {"0": [0.6, 0.02], "1": [1.0, 1.9]},
                },
            },
        ],
        "fire": [
            {"step": 0, "tokens": 0, "position_parameters": {"c": {"0": [0.1]}, "L": {"0": [128.0]}}},
            {"step": 5, "tokens": 50, "position_parameters": {"c": {"0": [0.2]}, "L": {"0": [200.0]}}},
        ],
        "alibi": [{"step": 0, "tokens": 0, "val_loss": 5.0}],
    }
    fig = P.position_parameters_figure(logs)
    by = {(t.meta["run"], t.meta["parameter"], t.meta["layer"], t.meta["head"]): t for t in fig.data}
    assert len(by) == 8 + 2
    np.testing.assert_allclose(by[("kerple_power", "r2", 0, 1)].y, [0.01, 0.02])
    np.testing.assert_allclose(by[("kerple_power", "r2", 0, 1)].x, [0, 20])
    np.testing.assert_allclose(by[("fire", "L", 0, None)].y, [128.0, 200.0])
    assert by[("fire", "c", 0, None)].hovertext[0] == "fire c · layer 0"
    assert by[("fire", "L", 0, None)].hovertext[0] == "fire L · layer 0"
    assert by[("kerple_power", "r2", 0, 1)].hovertext[0] == "kerple_power r2 · layer 0 · head 1"
    assert sorted(t.name for t in fig.data if t.showlegend) == ["fire", "kerple_power"]  # one entry per run
    with pytest.raises(ValueError, match="no run logged"):
        P.position_parameters_figure({"alibi": logs["alibi"]})


def test_head_bias_log_distance_and_fire_input_figures():
    import torch

    from fireviz.analysis import biases as analysis
    from fireviz.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=32, position_encoding="fire")).eval()
    rep = analysis.bias_report(model, [31, 127]).to_dict()
    capped = analysis.bias_report(model, [31, 127], normalizer_cap=32).to_dict()
    fig = P.head_bias_figure(rep, 0, 1, x_axis="log_distance", capped=capped)
    assert fig.layout.xaxis.type == "log"
    assert all(min(t.x) >= 1 for t in fig.data)  # distance 0 left out of a log axis
    assert sorted((t.meta["query_position"], t.meta["capped"] or 0) for t in fig.data) == [
        (31, 0),
        (31, 32),
        (127, 0),
        (127, 32),
    ]
    fi = P.fire_input_figure(rep, 0, capped=capped)
    assert {(t.meta["distance"], t.meta["capped"]) for t in fi.data} == {
        (d, c) for d in analysis.FIRE_INPUT_DISTANCES for c in (None, 32)
    }
    assert fi.layout.shapes[0].x1 == 32  # the training positions, shaded
    with pytest.raises(ValueError, match="x_axis"):
        P.head_bias_figure(rep, 0, 0, x_axis="bogus")
    alibi = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=32, position_encoding="alibi")).eval()
    with pytest.raises(ValueError, match="no FIRE input"):
        P.fire_input_figure(analysis.bias_report(alibi, [31]).to_dict(), 0)
    toks = torch.randint(0, 256, (600,))
    d = [
        TA.attention_dilution(model, toks, [31, 127, 511], near=4, checkpoint="fire"),
        TA.attention_dilution(model, toks, [31, 127, 511], near=4, checkpoint="fire", normalizer_cap=32),
    ]
    dfig = P.dilution_compare_figure(d)
    assert [(t.meta["checkpoint"], t.meta["layer"], t.meta["normalizer_cap"]) for t in dfig.data] == [
        ("fire", 0, None),
        ("fire", 0, 32),
    ]
    np.testing.assert_allclose(dfig.data[0].y, d[0].share[0].mean(0), rtol=1e-5)  # to_dict: 6 digits


def test_perplexity_figure_marks_chance_only_near_it():
    from fireviz import plots

    def result(bpb):
        per = [
            {
                "length": n,
                "nats_per_token": b * math.log(2),
                "perplexity": 2**b,
                "bits_per_byte": b,
                "tokens_scored": 100,
                "windows": 2,
            }
            for n, b in zip((128, 256), bpb, strict=True)
        ]
        return {
            "checkpoint": "x",
            "position_encoding": "fire",
            "train_seq_len": 128,
            "settings": {"data": "code"},
            "per_length": per,
        }

    near = plots.perplexity_figure([result([6.5, 7.9])])
    marks = [sh for sh in near.layout.shapes if sh.name == plots.UNIFORM_MARK]
    assert len(marks) == 1 and marks[0].y0 == 256.0
    far = plots.perplexity_figure([result([2.0, 2.1])])
    assert not [sh for sh in far.layout.shapes if sh.name == plots.UNIFORM_MARK]


@pytest.mark.slow
def test_svg_and_pdf_exports_of_the_perplexity_and_bias_grid_figures_hold_the_traces(tmp_path):
    import xml.etree.ElementTree as ET

    from pypdf import PdfReader

    from fireviz import plots
    from fireviz.analysis import biases as analysis
    from fireviz.model.gpt import GPT, GPTConfig

    def result(name, bpb):
        per = [
            {
                "length": n,
                "nats_per_token": b * math.log(2),
                "perplexity": 2**b,
                "bits_per_byte": b,
                "tokens_scored": 100,
                "windows": 2,
            }
            for n, b in zip((128, 256, 512), bpb, strict=True)
        ]
        return {
            "checkpoint": name,
            "position_encoding": "fire",
            "train_seq_len": 128,
            "settings": {"data": "prose"},
            "per_length": per,
        }

    ppl = plots.perplexity_figure([result("alpha_run", [2.0, 1.9, 1.95]), result("beta_run", [2.1, 2.0, 2.2])])
    torch.manual_seed(0)
    grid = plots.bias_grid_figure(
        analysis.bias_report(
            GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=32, position_encoding="alibi")), [31]
        ).to_dict()
    )
    for fig, names in ((ppl, ["alpha_run", "beta_run"]), (grid, ["i = 31"])):
        svg = plots.write_figure(fig, tmp_path / "f.svg")
        root = ET.fromstring(svg.read_bytes())
        text = " ".join(t for t in root.itertext())
        assert all(n in text for n in names), text[:300]
        n_lines = sum(1 for el in root.iter() if el.tag.endswith("path") and "js-line" in (el.get("class") or ""))
        assert n_lines >= len([tr for tr in fig.data if tr.mode and "lines" in tr.mode])
        pdf = plots.write_figure(fig, tmp_path / "f.pdf")
        reader = PdfReader(str(pdf))
        assert len(reader.pages) == 1 and all(n in reader.pages[0].extract_text() for n in names)
    png = plots.export_figure(ppl, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "ppls", [[4.409, 4.421, 4.443], [4.4105, 4.4107, 4.4109], [3.3, 4.0, 19.0], [1.5, 40.0, 300.0]]
)
def test_the_perplexity_axis_shows_numbers_inside_its_range(ppls):
    """A new user's figure at perplexity 4.409–4.443 had no y-axis numbers: the ticks were chosen
    for a padded range but plotly drew a narrower one. At least two labelled ticks lie inside the
    drawn range, and so does every point."""
    fig = P.perplexity_figure([ppl_result("a", "alibi", ppls)])
    lo, hi = (10**v for v in fig.layout.yaxis.range)
    ticks = [t for t in fig.layout.yaxis.tickvals if lo <= t <= hi]
    assert len(ticks) >= 2, (ticks, lo, hi)
    assert all(lo <= p <= hi for p in ppls)
