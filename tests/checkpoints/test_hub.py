"""Published models (issue 19): T5-family bias tables, ALiBi slopes and RoPE kernels read from
folders with the layout ``transformers`` writes, and from a loopback server that answers the
Hub's file endpoints (no internet here). References are written from the original formulas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hub_folders import t5_folder
from hub_server import COMMIT, HubServer
from safetensors.torch import save_file

from fireviz.analysis import biases as analysis
from fireviz.checkpoints import hub, hub_families, hub_rope
from fireviz.cli import biases as biases_cli
from fireviz.encodings import alibi_slopes

REF = json.loads((Path(__file__).resolve().parents[1] / "reference" / "encodings.json").read_text())


# -- fixtures with the real file layout (t5_folder: tests/hub_folders.py) -----------------------------
def hf_t5_bias(
    table: torch.Tensor, q: int, k: int, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    """HF ``T5Attention.compute_bias`` (its ``_relative_position_bucket``, float32 log as there), [H, q, k]."""
    context = torch.arange(q, dtype=torch.long)[:, None]
    memory = torch.arange(k, dtype=torch.long)[None, :]
    relative_position = memory - context
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, if_large)
    return table[relative_buckets].permute(2, 0, 1).numpy()


def _matrix(out: dict, layer: int) -> np.ndarray:
    return np.array(
        [[[np.nan if v is None else v for v in row] for row in h] for h in out["layers"][layer]["matrix"]["bias"]]
    )


# -- T5 family: the acceptance command -----------------------------------------------------------
@pytest.mark.parametrize("model_type", ["t5", "umt5"])
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_biases_cli_on_a_t5_folder_matches_the_original_bias(tmp_path, model_type, stack, capsys):
    folder = t5_folder(tmp_path / "m", model_type=model_type)
    out = tmp_path / "b.json"
    assert biases_cli.main([str(folder), "--stack", stack, "--matrix", "0:64", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    from safetensors.torch import load_file

    w = load_file(str(folder / "model.safetensors"))
    n_layers = 2 if stack == "encoder" else 3
    assert d["n_layer"] == n_layers and d["n_head"] == 4 and len(d["layers"]) == n_layers
    for layer in range(n_layers):
        block = layer if model_type == "umt5" else 0
        table = w[f"{stack}.block.{block}.layer.0.SelfAttention.relative_attention_bias.weight"]
        ref = hf_t5_bias(table, 64, 64, stack == "encoder", 32, 128)
        got = _matrix(d, layer)
        if stack == "decoder":  # causal: the report leaves future keys empty
            future = np.triu(np.ones((64, 64), bool), 1)
            assert np.isnan(got[:, future]).all()
            got, ref = got[:, ~future], ref[:, ~future]
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert "wrote" in capsys.readouterr().out


def test_t5_buckets_match_the_published_first_distances():
    """The reference's first distance of each causal bucket, through the fireviz encoding
    built by the hub reader and through the HF-formula reference above."""
    ref = {int(k): v for k, v in REF["t5_relative_position_bucket"]["causal_first_distance_of_each_bucket"].items()}
    table = torch.arange(32, dtype=torch.float32)[:, None]  # bias = bucket id
    hf = hf_t5_bias(table, 200, 200, False, 32, 128)[0, 199, ::-1]  # row of query 199 by distance
    from fireviz.encodings import T5RelativeBias

    e = T5RelativeBias(1)
    with torch.no_grad():
        e.relative_attention_bias.copy_(table)
    ours = e.bias_by_distance(torch.arange(200))[0].detach().numpy()
    for b, first in ref.items():
        assert hf[first] == b and ours[first] == b and (first == 0 or ours[first - 1] == b - 1)


def test_sharded_longt5_and_shape_mismatch(tmp_path):
    f = t5_folder(tmp_path / "lt", model_type="longt5", shards=3, encoder_attention_type="transient-global")
    m = hub.load_published(str(f), stack="encoder")
    assert m.config.family.startswith("LongT5") and m.config.n_layer == 2 and m.encoding(0).bidirectional
    cfg = json.loads((f / "config.json").read_text())
    (f / "config.json").write_text(json.dumps({**cfg, "num_heads": 8}))
    with pytest.raises(hub.HubModelError, match="shape"):
        hub.load_published(str(f), stack="encoder")


# -- ALiBi and RoPE families: config.json only -----------------------------------------------------
def test_bloom_and_mpt_alibi_slopes(tmp_path):
    for h in (16, 12, 112):
        assert torch.allclose(alibi_slopes(h), torch.tensor(_bloom_slopes(h)), rtol=1e-6)
    (tmp_path / "bloom").mkdir()
    (tmp_path / "bloom" / "config.json").write_text(
        json.dumps({"model_type": "bloom", "n_head": 12, "n_layer": 2, "hidden_size": 96, "seq_length": 2048})
    )
    m = hub.load_published(str(tmp_path / "bloom"))
    assert m.config.position_encoding == "alibi" and torch.allclose(m.encoding(0).slopes, alibi_slopes(12))
    (tmp_path / "mpt").mkdir()
    (tmp_path / "mpt" / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mpt",
                "n_heads": 12,
                "n_layers": 2,
                "d_model": 96,
                "max_seq_len": 2048,
                "attn_config": {"alibi": True, "alibi_bias_max": 8},
            }
        )
    )
    m = hub.load_published(str(tmp_path / "mpt"))
    assert torch.allclose(m.encoding(0).slopes, torch.tensor(_mpt_slopes(12, 8)), rtol=1e-6)
    out = tmp_path / "b.json"
    assert biases_cli.main([str(tmp_path / "mpt"), "--matrix", "0:8", "--out", str(out)]) == 0
    got = _matrix(json.loads(out.read_text()), 0)
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    ref = -np.array(_mpt_slopes(12, 8))[:, None, None] * (i - j)
    ok = j <= i
    np.testing.assert_allclose(got[:, ok], np.broadcast_to(ref, got.shape)[:, ok], atol=1e-6)


def _bloom_slopes(n: int) -> list[float]:
    """BLOOM's build_alibi_tensor slopes (HF modeling_bloom), written from its formula."""
    closest = 2 ** math.floor(math.log2(n))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base**p for p in range(1, closest + 1)]
    if closest != n:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra_base**p for p in range(1, 1 + 2 * (n - closest), 2)]
    return slopes


def _mpt_slopes(n: int, alibi_bias_max: float) -> list[float]:
    """MPT's gen_slopes (HF modeling_mpt), written from its formula."""
    hp = 2 ** math.ceil(math.log2(n))
    m = [(k + 1) * alibi_bias_max / hp for k in range(hp)]
    s = [1.0 / 2**x for x in m]
    if hp != n:
        s = (s[1::2] + s[::2])[:n]
    return s


def _llama(scaling: dict | None, **extra) -> dict:
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        **extra,
    }
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    return cfg


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rope_configs_give_their_kernel(tmp_path, scaling):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(_llama(scaling)))
    out = tmp_path / "b.json"
    assert biases_cli.main([str(tmp_path / "m"), "--query-positions", "100,1000", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["kind"] == "rotary" and len(d["kernel"]["value"]) == 1001 and abs(d["kernel"]["value"][0] - 1) < 1e-6


def test_llama3_frequencies_follow_the_reference_formula():
    inv, att, s = hub_rope.rope_frequencies(
        _llama(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            }
        )
    )
    base = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    wavelen = 2 * np.pi / base
    expect = np.where(wavelen < 8192 / 4, base, np.where(wavelen > 8192 / 1, base / 8, np.nan))
    medium = np.isnan(expect)
    smooth = (8192 / wavelen[medium] - 1) / (4 - 1)
    expect[medium] = (1 - smooth) * base[medium] / 8 + smooth * base[medium]
    np.testing.assert_allclose(inv.numpy(), expect, rtol=1e-12)
    assert att == 1.0 and s["rotary_dim"] == 64


def test_partial_rotary_and_rope_parameters():
    inv, _, s = hub_rope.rope_frequencies(
        {
            "model_type": "phi",
            "hidden_size": 256,
            "num_attention_heads": 4,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        }
    )
    assert s["rotary_dim"] == 32 and inv.shape == (16,)
    np.testing.assert_allclose(inv.numpy(), 1.0 / 10000.0 ** (np.arange(0, 32, 2) / 32), rtol=1e-12)
    ref = REF["yarn"]
    _, att, _ = hub_rope.rope_frequencies(
        _llama(
            {
                "rope_type": "yarn",
                "factor": ref["factor"],
                "original_max_position_embeddings": ref["original_max_position"],
            }
        )
    )
    assert att == pytest.approx(ref["mscale"], abs=5e-7)  # the reference gives 7 digits


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"model_type": "gpt2", "n_head": 4, "n_layer": 2}, "absolute position"),
        ({"model_type": "mamba"}, "not an architecture fireviz reads"),
        ({"model_type": "mpt", "n_heads": 4, "n_layers": 1, "attn_config": {}}, "alibi false"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "rope_scaling": {"rope_type": "weird"},
            },
            "rope_type 'weird'",
        ),
    ],
)
def test_unsupported_models_are_one_clear_error(tmp_path, cfg, match, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hub.HubModelError, match=match):
        hub.load_published(str(tmp_path / "m"))
    assert biases_cli.main([str(tmp_path / "m")]) == 2
    assert match.split("'")[0] in capsys.readouterr().err


def test_pickled_only_and_missing_tensor(tmp_path):
    f = t5_folder(tmp_path / "m")
    (f / "model.safetensors").rename(f / "pytorch_model.bin")
    with pytest.raises(hub.HubModelError, match="never loads pickled"):
        hub.load_published(str(f))
    g = t5_folder(tmp_path / "g")
    from safetensors.torch import load_file

    w = load_file(str(g / "model.safetensors"))
    del w["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    save_file(w, str(g / "model.safetensors"))
    with pytest.raises(hub.HubModelError, match="has no tensor decoder.block.0"):
        hub.load_published(str(g))


# -- the Hub path, for real, against a loopback server ---------------------------------------------
def test_hub_reads_only_the_header_and_the_bias_tensors(hub_env, monkeypatch):
    big = t5_folder(hub_env / "repo", d_model=256, vocab=4000, layers=2, dec_layers=2)
    size = (big / "model.safetensors").stat().st_size
    with HubServer({"google/t5-tiny": big}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        m = hub.load_published("google/t5-tiny", stack="encoder")
        weights = server.bytes_sent("model.safetensors")
        (n,) = np.frombuffer((big / "model.safetensors").read_bytes()[:8], dtype="<u8")
        table = 32 * 4 * 4
        assert m.config.revision == COMMIT and m.config.source == "google/t5-tiny"
        assert weights <= 8 + int(n) + table + 1 + 64, (weights, size)  # header + the table (+ the existence probe)
        assert weights < size / 100
        # the same commit again: served from the cache, nothing more read from the weights
        before = server.bytes_sent("model.safetensors")
        hub.load_published("google/t5-tiny", stack="encoder")
        assert server.bytes_sent("model.safetensors") == before
    # offline, from the caches alone
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    m2 = hub.load_published("google/t5-tiny", stack="encoder")
    assert torch.equal(m2.encoding(0).relative_attention_bias, m.encoding(0).relative_attention_bias)


def test_hub_sharded_gated_missing_and_offline(hub_env, monkeypatch):
    sharded = t5_folder(hub_env / "sharded", model_type="umt5", shards=2)
    gated = t5_folder(hub_env / "gated")
    with HubServer({"org/umt5-tiny": sharded, "org/gated": gated}, gated=("org/gated",)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        m = hub.load_published("org/umt5-tiny")
        assert m.config.n_layer == 3 and len(m.encodings) == 3
        with pytest.raises(hub.HubModelError, match="gated or private"):
            hub.load_published("org/gated")
        with pytest.raises(hub.HubModelError, match="org/nothing"):
            hub.load_published("org/nothing")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubModelError, match="cache"):
        hub.load_published("org/never-fetched")
    with pytest.raises(hub.HubModelError, match="owner/name"):
        hub.load_published("not a repo id")


# -- the app -----------------------------------------------------------------------------------------
def test_app_shows_a_hub_models_bias_grid_from_the_url(hub_env, monkeypatch, app_env):
    import base64

    from streamlit.testing.v1 import AppTest

    repo = t5_folder(hub_env / "repo", layers=2, dec_layers=2, heads=2)
    from safetensors.torch import load_file

    table = load_file(str(repo / "model.safetensors"))[
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ]
    root = Path(__file__).resolve().parents[2]
    with HubServer({"google/t5-tiny": repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        at = AppTest.from_file(str(root / "pages" / "1_Learned_biases.py"), default_timeout=60)
        at.query_params["ckpt"] = "google/t5-tiny"
        at.query_params["pos"] = "31"
        at.query_params["x"] = "distance"  # a T5 grid opens on the log axis, from distance 1
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("published T5" in m.value for m in at.markdown)
        figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
        assert figs, "a bias grid is drawn"
        ys = []
        for tr in figs[0]["data"]:
            y = tr.get("y")
            if isinstance(y, dict) and "bdata" in y:
                y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"]))
            if y is not None and len(y) == 32:
                ys.append(np.asarray(y, dtype=float))
        ref = hf_t5_bias(table, 32, 32, False, 32, 128)[:, 31, ::-1]  # query 31, by distance 0..31
        assert any(np.allclose(y, ref[h], atol=1e-5) for y in ys for h in range(2))
        # the encoder stack from the sidebar: a bidirectional heatmap in the one-head view
        at.sidebar.radio(key="biases_stack").set_value("encoder")
        at.sidebar.radio(key="biases_view").set_value("head").run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("bidirectional" in c.value for c in at.caption)
        # other pages do not take it, and say where it belongs
        lg = AppTest.from_file(str(root / "pages" / "4_Training_runs.py"), default_timeout=60)
        lg.query_params["ckpt"] = "google/t5-tiny"
        lg.run()
        assert not lg.exception and any("published model" in i.value for i in lg.sidebar.info)


def test_fit_fire_to_a_published_t5_decoder_layer(tmp_path, capsys):
    from fireviz.cli import fit as fit_cli
    from fireviz.fit import fitting as fit

    folder = t5_folder(tmp_path / "m", model_type="umt5", heads=2)
    out = tmp_path / "fit.json"
    assert (
        fit_cli.main(
            ["--target", str(folder), "--layer", "1", "--max-len", "64", "--steps", "20", "--quiet", "--out", str(out)]
        )
        == 0
    )
    d = json.loads(out.read_text())
    assert d["target_params"]["layer"] == 1 and d["target_params"]["published"].startswith("UMT5")
    assert d["relative_rmse"] < 0.2  # FIRE represents T5's bucketed bias inside the fitted range (Thm 3.1)
    t = fit.make_target("checkpoint", None, path=str(folder), layer=1, stack="encoder")
    assert t.encoding.bidirectional and t.num_heads == 2
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text(json.dumps(_llama(None)))
    assert fit_cli.main(["--target", str(tmp_path / "r"), "--max-len", "64"]) == 2
    assert "Toeplitz" in capsys.readouterr().err


def test_app_fits_fire_to_a_hub_model(hub_env, monkeypatch, app_env):
    import time

    from streamlit.testing.v1 import AppTest

    repo = t5_folder(hub_env / "repo", layers=1, dec_layers=2, heads=2)
    root = Path(__file__).resolve().parents[2]
    with HubServer({"google/t5-tiny": repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        at = AppTest.from_file(str(root / "pages" / "2_Fit_FIRE.py"), default_timeout=60)
        for k, v in dict(
            target="checkpoint", pub="google/t5-tiny", layer="1", max_len="32", steps="5", width="8"
        ).items():
            at.query_params[k] = v
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("published T5" in c.value for c in at.caption)
        at.button(key="fit_go").click()
        end = time.time() + 90
        at.run()
        while len(at.get("plotly_chart")) < 2 and time.time() < end:
            assert not at.exception, [e.value for e in at.exception]
            time.sleep(0.25)
            at.run()
        assert len(at.get("plotly_chart")) >= 2, "the fit finished and was drawn"
        assert any(m.label == "relative RMSE" for m in at.metric)


def test_encoder_curves_have_distances_of_both_signs(tmp_path):
    folder = t5_folder(tmp_path / "m", heads=2)
    enc = analysis.bias_report(hub.load_published(str(folder), stack="encoder"), [20]).to_dict()
    dec = analysis.bias_report(hub.load_published(str(folder), stack="decoder"), [20]).to_dict()
    ce, cd = enc["layers"][0]["curves"][0], dec["layers"][0]["curves"][0]
    assert ce["distance"] == list(range(-20, 21)) and cd["distance"] == list(range(21))
    from safetensors.torch import load_file

    t = load_file(str(folder / "model.safetensors"))[
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ]
    ref = hf_t5_bias(t, 41, 41, True, 32, 128)[:, 20, ::-1]  # query 20, keys 40 … 0 = distances −20 … 20
    np.testing.assert_allclose(np.array(ce["bias"]), ref, atol=1e-5)
    from fireviz import plots

    fig = plots.bias_grid_figure(enc)
    assert min(min(tr.x) for tr in fig.data if tr.x is not None) == -20


def test_a_gated_repo_reads_with_hf_token(hub_env, monkeypatch):
    gated = t5_folder(hub_env / "gated")
    with HubServer({"org/gated": gated}, gated=("org/gated",)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        m = hub.load_published("org/gated")
        assert m.config.n_layer == 3


def test_longrope_and_dynamic_frequencies():
    dim = 64
    base = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    long_factor = list(np.linspace(1.0, 8.0, dim // 2))
    cfg = {
        "model_type": "phi3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * (dim // 2), "long_factor": long_factor},
    }
    inv, att, _ = hub_rope.rope_frequencies(cfg)
    np.testing.assert_allclose(inv.numpy(), base / np.array(long_factor), rtol=1e-12)
    assert att == pytest.approx(math.sqrt(1 + math.log(131072 / 4096) / math.log(4096)))
    cfg = _llama({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=4096, rope_theta=10000.0)
    inv, _, _ = hub_rope.rope_frequencies(cfg)
    new_base = 10000.0 * ((2.0 * 8192 / 4096) - 1.0) ** (dim / (dim - 2))
    np.testing.assert_allclose(inv.numpy(), 1.0 / new_base ** (np.arange(0, dim, 2) / dim), rtol=1e-12)


# -- found by an adversarial review ------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg, match",
    [
        (_llama({"rope_type": "linear", "factor": 0}), "must be a finite number > 0"),
        (_llama({"rope_type": "linear", "factor": -2}), "must be a finite number > 0"),
        (_llama({"rope_type": "dynamic", "factor": 0.5}), "must be >= 1"),
        (_llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0}), "must be a finite number > 0"),
        (_llama({"rope_type": "longrope", "long_factor": [0.0] * 32}), "finite numbers > 0"),
        (_llama(None, rope_scaling=["linear"]), "must be an object or null"),
        (_llama(None, num_attention_heads=0), "outside 1"),
        (_llama(None, rope_theta=None, rotary_emb_base="x"), "finite number"),
        (_llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}), "outside 1"),
        (
            {"model_type": "mpt", "n_heads": 4, "n_layers": 2, "attn_config": {"alibi": True, "alibi_bias_max": -8}},
            "finite number > 0",
        ),
        (
            {"model_type": "mpt", "n_heads": 4, "n_layers": 2, "attn_config": {"alibi": True, "alibi_bias_max": None}},
            None,
        ),
        (
            {
                "model_type": "falcon",
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "alibi": "false",
                "hidden_size": 64,
            },
            "true or false",
        ),
        ({"model_type": "bloom", "n_head": 4, "n_layer": 0}, "outside 1"),
        ({"model_type": "bloom", "n_head": 4, "n_layer": 10**9}, "outside 1"),
    ],
)
def test_bad_published_configs_are_one_clear_error(tmp_path, cfg, match):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    if match is None:  # null means the default (8)
        assert torch.allclose(
            hub.load_published(str(tmp_path / "m")).encoding(0).slopes, hub_families.mpt_alibi_slopes(4, 8.0)
        )
        return
    with pytest.raises(hub.HubModelError, match=match):
        hub.load_published(str(tmp_path / "m"))


def _shift_offsets(path: Path, tensor: str, by: int) -> None:
    raw = path.read_bytes()
    n = int(np.frombuffer(raw[:8], dtype="<u8")[0])
    header = json.loads(raw[8 : 8 + n])
    a, b = header[tensor]["data_offsets"]
    header[tensor]["data_offsets"] = [a + by, b + by]
    new = json.dumps(header).encode()
    new += b" " * (n - len(new)) if len(new) <= n else b""
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n :])


def test_weights_whose_offsets_do_not_tile_the_data_are_refused(tmp_path):
    f = t5_folder(tmp_path / "m")
    _shift_offsets(f / "model.safetensors", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 4)
    with pytest.raises(hub.HubModelError, match="do not tile|corrupt|longer|truncated"):
        hub.load_published(str(f))


def test_a_shard_index_cannot_point_outside_the_repo(tmp_path):
    f = t5_folder(tmp_path / "m", shards=2)
    idx = json.loads((f / "model.safetensors.index.json").read_text())
    k = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    idx["weight_map"][k] = "../other/model.safetensors"
    (f / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(hub.HubModelError, match="not a .safetensors file of this repo"):
        hub.load_published(str(f))
