"""Position encodings: exact reference values (tests/reference/encodings.json: numbers
computed independently from each encoding's paper and reference implementation) and
properties (hypothesis)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fireviz.encodings.fire as fire_module
from fireviz.encodings import (
    ENCODING_NAMES,
    FIRE,
    ALiBi,
    KerpleLog,
    KerplePower,
    RotaryEmbedding,
    Sandwich,
    T5RelativeBias,
    alibi_slopes,
    build_encoding,
    relative_position_bucket,
    rope_inv_freq,
    sandwich_kernel,
    yarn_inv_freq,
)
from fireviz.model.gpt import GPT, GPTConfig

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "encodings.json"


@pytest.fixture(scope="module")
def ref():
    return json.loads(REFERENCE.read_text())


def test_reference_file_holds_every_section_the_tests_read(ref):
    # the suite runs from the repository alone: every reference section it uses is in the file
    assert {
        "alibi_slopes",
        "fire_normalized_distance",
        "kerple",
        "rope_inv_freq",
        "rope_pi",
        "t5_relative_position_bucket",
        "yarn",
    } <= set(ref)


def additive(name, heads=4, head_dim=8, **kw):
    enc = build_encoding(name, heads, head_dim, **kw)
    assert enc.kind == "additive"
    return enc


ADDITIVE = ["t5", "alibi", "kerple_log", "kerple_power", "sandwich", "fire", "fire_s"]
TOEPLITZ = ["t5", "alibi", "kerple_log", "kerple_power", "sandwich"]


# ---------------------------------------------------------------- reference values
def test_t5_bucket_first_distances(ref):
    r = ref["t5_relative_position_bucket"]
    for bucket, first_distance in r["causal_first_distance_of_each_bucket"].items():
        d = torch.tensor([first_distance])
        assert relative_position_bucket(-d, False, 32, 128).item() == int(bucket)
        if first_distance > 0:  # the distance before belongs to the previous bucket
            assert relative_position_bucket(-(d - 1), False, 32, 128).item() == int(bucket) - 1


def test_t5_bucket_examples(ref):
    ex = ref["t5_relative_position_bucket"]["causal_examples"]
    d = torch.tensor([int(k) for k in ex])
    got = relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128)
    assert got.tolist() == list(ex.values())
    # future keys (positive relative position) share bucket 0 in the causal scheme
    assert relative_position_bucket(torch.tensor([5]), False).item() == 0


def test_t5_bidirectional_splits_buckets():
    rel = torch.arange(-200, 201)
    b = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert b.min() == 0 and b.max() == 31
    assert (b[rel > 0] >= 16).all() and (b[rel <= 0] < 16).all()


def test_alibi_slopes_reference(ref):
    for n, slopes in ref["alibi_slopes"].items():
        assert alibi_slopes(int(n)).tolist() == pytest.approx(slopes, abs=1e-5)


def test_kerple_reference(ref):
    r = ref["kerple"]
    d = torch.tensor(r["distances"])
    power = KerplePower(1, init_r1=0.5, init_r2=1.5).bias_by_distance(d)[0]
    log = KerpleLog(1, init_r1=1.0, init_r2=0.5).bias_by_distance(d)[0]
    assert power.tolist() == pytest.approx(r["power_r1_0.5_r2_1.5"], abs=1e-5)
    assert log.tolist() == pytest.approx(r["log_r1_1_r2_0.5"], abs=1e-5)


def test_sandwich_reference(ref):
    r = ref["sandwich_S"]
    for d, value in r["values"].items():
        assert sandwich_kernel(torch.tensor([float(d)]), r["dbar"]).item() == pytest.approx(value, abs=1e-4)


def test_sandwich_per_head_compression():
    enc = Sandwich(4, dbar=128)
    d = torch.tensor([0, 10])
    b = enc.bias_by_distance(d)
    s10 = sandwich_kernel(torch.tensor([10.0]), 128).item() - 64
    assert b[:, 0].tolist() == [0.0] * 4
    ratios = [8 * h / 4 for h in range(1, 5)]
    assert b[:, 1].tolist() == pytest.approx([s10 / r for r in ratios], rel=1e-6)


def test_fire_normalized_distance_reference(ref):
    r = ref["fire_normalized_distance"]
    fire = FIRE(2, init_c=r["c"], init_L=r["L"], eps=r["eps"])
    for key, value in r["values"].items():
        i, j = (int(v) for v in key.split(","))
        x = fire.normalized_distance(torch.tensor([i]), torch.tensor([j]))
        assert x.item() == pytest.approx(value, abs=1e-5)


def test_rope_inv_freq_reference(ref):
    r = ref["rope_inv_freq"]
    f = rope_inv_freq(r["head_dim"], r["base"])
    assert f[r["indices"]].tolist() == pytest.approx(r["values"], rel=1e-6)


def test_rope_pi_reference(ref):
    r = ref["rope_pi"]
    enc = build_encoding("rope_pi", 1, r["head_dim"], rope_theta=r["base"], rope_scaling_factor=r["factor"])
    assert enc.inv_freq[:2].tolist() == pytest.approx(r["inv_freq_0_1"], abs=1e-5)


def test_yarn_reference(ref):
    r = ref["yarn"]
    inv, factor = yarn_inv_freq(
        r["head_dim"], r["base"], r["factor"], r["original_max_position"], r["beta_fast"], r["beta_slow"]
    )
    assert factor == pytest.approx(r["mscale"], abs=1e-6)
    theta = rope_inv_freq(r["head_dim"], r["base"])
    low, high = r["low"], r["high"]
    # below `low`: extrapolated (unchanged); above `high`: interpolated by the factor
    assert torch.allclose(inv[: low + 1], theta[: low + 1])
    assert torch.allclose(inv[high:], theta[high:] / r["factor"])
    assert (
        (inv[low + 1 : high] < theta[low + 1 : high]) & (inv[low + 1 : high] > theta[low + 1 : high] / r["factor"])
    ).all()
    for s, m in r["mscale_by_factor"].items():
        assert yarn_inv_freq(r["head_dim"], r["base"], float(s), r["original_max_position"])[1] == pytest.approx(
            m, abs=1e-6
        )


def test_yarn_attention_factor_applied_once():
    # q and k each scaled by m, so a zero-angle logit scales by exactly m² (= 1/t in the paper).
    enc = build_encoding("yarn", 1, 16, rope_scaling_factor=4.0, original_max_position_embeddings=64)
    x = torch.randn(1, 1, 1, 16)
    pos = torch.tensor([0])
    q, k = enc.rotate(x, pos), enc.rotate(x, pos)
    m = 0.1 * math.log(4.0) + 1
    assert (q * k).sum().item() == pytest.approx(m * m * (x * x).sum().item(), rel=1e-5)


# ---------------------------------------------------------------- shapes and finiteness
@pytest.mark.parametrize("name", ENCODING_NAMES)
@pytest.mark.parametrize(
    "q_len,k_len,q_offset", [(1, 8192, None), (16, 16, None), (1, 1, 0), (5, 9, 100), (7, 3, 8192), (600, 600, None)]
)
def test_every_encoding_shapes_and_finite(name, q_len, k_len, q_offset):
    enc = build_encoding(name, 4, 8)
    if enc.kind == "additive":
        b = enc.bias(q_len, k_len, q_offset)
        assert b.shape == (4, q_len, k_len) and b.dtype == torch.float32
        assert torch.isfinite(b).all()
    elif enc.kind == "rotary":
        x = torch.randn(2, 4, q_len, 8)
        start = q_offset if q_offset is not None else k_len - q_len
        y = enc.rotate(x, torch.arange(start, start + q_len))
        assert y.shape == x.shape and torch.isfinite(y).all()
        with pytest.raises(TypeError):
            enc.bias(q_len, k_len)
    else:
        with pytest.raises(TypeError):
            enc.bias(q_len, k_len)


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown position encoding 'fir'"):
        build_encoding("fir", 4, 8)
    with pytest.raises(ValueError, match="does not take option"):
        build_encoding("alibi", 4, 8, mlp_width=3)
    with pytest.raises(ValueError, match="even head_dim"):
        build_encoding("rope", 4, 7)
    with pytest.raises(ValueError, match="q_offset"):
        build_encoding("alibi", 4, 8).bias(5, 3)
    with pytest.raises(ValueError, match="r1 > 0 and r2 > 0"):
        KerpleLog(2, init_r1=1.0, init_r2=0.0)
    with pytest.raises(ValueError, match="init_r1 needs one number or 4"):
        KerpleLog(4, init_r1=[1.0, 2.0])
    assert KerpleLog(2, init_r1=[1.0, 2.0], init_r2=0.5).r1.tolist() == [1.0, 2.0]
    for bad in (0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="ALiBi slope must be a finite number > 0"):
            ALiBi(2, slope=bad)
    with pytest.raises(ValueError, match="piecewise_linear needs mlp_depth=1"):
        build_encoding("fire", 2, 8, mlp_depth=2).piecewise_linear()


def test_alignment_bottom_right():
    enc = ALiBi(2)
    b = enc.bias(3, 10)  # queries at 7, 8, 9
    assert b[0, 2, 9].item() == 0.0 and b[0, 0, 7].item() == 0.0
    assert b[0, 0, 0].item() == pytest.approx(-7 * alibi_slopes(2)[0].item())


# ---------------------------------------------------------------- properties
@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(TOEPLITZ),
    q_len=st.integers(1, 20),
    k_len=st.integers(1, 20),
    offset=st.integers(0, 300),
    shift=st.integers(1, 500),
)
def test_toeplitz_translation_invariance(name, q_len, k_len, offset, shift):
    torch.manual_seed(0)
    enc = additive(name)
    a = enc.bias(q_len, k_len, offset)
    # shifting every query and key by `shift` leaves b unchanged: take the rows of a longer bias
    b = enc.bias(q_len, k_len + shift, offset + shift)[:, :, shift:]
    assert torch.allclose(a, b, atol=1e-6)


def test_fire_is_not_translation_invariant():
    torch.manual_seed(0)
    fire = FIRE(2, init_L=8.0)
    torch.nn.init.normal_(fire.mlp[0].weight)
    a = fire.bias(4, 4, 20)
    b = fire.bias(4, 4 + 50, 20 + 50)[:, :, 50:]
    assert not torch.allclose(a, b, atol=1e-3)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(ADDITIVE), k_len=st.integers(2, 40), data=st.data())
def test_offset_consistency(name, k_len, data):
    """Rows of the full bias equal the bias of a query slice with the matching offset."""
    torch.manual_seed(1)
    enc = additive(name, init_L=10.0) if name.startswith("fire") else additive(name)
    full = enc.bias(k_len, k_len, 0)
    start = data.draw(st.integers(0, k_len - 1))
    stop = data.draw(st.integers(start + 1, k_len))
    part = enc.bias(stop - start, k_len, start)
    assert torch.allclose(full[:, start:stop], part, atol=1e-6)
    # default offset: last queries
    assert torch.allclose(full[:, -(stop - start) :], enc.bias(stop - start, k_len), atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(ADDITIVE), q_len=st.integers(1, 30), k_len=st.integers(1, 3000), offset=st.integers(0, 20000)
)
def test_no_nan_any_length_or_offset(name, q_len, k_len, offset):
    enc = additive(name)
    assert torch.isfinite(enc.bias(q_len, k_len, offset)).all()


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["rope", "rope_pi", "yarn"]),
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    shift=st.integers(0, 5000),
)
def test_rotary_score_depends_only_on_m_minus_n(name, m, n, shift):
    opts = (
        {"rope_scaling_factor": 4.0, "original_max_position_embeddings": 512}
        if name == "yarn"
        else ({"rope_scaling_factor": 4.0} if name == "rope_pi" else {})
    )
    enc = build_encoding(name, 1, 16, **opts)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    s1 = (enc.rotate(q, torch.tensor([m])) * enc.rotate(k, torch.tensor([n]))).sum()
    s2 = (enc.rotate(q, torch.tensor([m + shift])) * enc.rotate(k, torch.tensor([n + shift]))).sum()
    assert s1.item() == pytest.approx(s2.item(), abs=2e-3)  # float32 angles up to 1e4 rad


def test_rotary_angles_float32_under_bf16_autocast():
    enc = RotaryEmbedding(1, 16)
    pos = torch.tensor([4000, 4001])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = enc.cos_sin(pos)
    assert cos.dtype == torch.float32
    assert cos[0, 0].item() == pytest.approx(math.cos(4000.0), abs=1e-3)
    x = torch.randn(1, 1, 2, 16, dtype=torch.bfloat16)
    assert enc.rotate(x, pos).dtype == torch.bfloat16


# ---------------------------------------------------------------- FIRE specifics
def random_fire(heads=3, seed=0, **kw):
    torch.manual_seed(seed)
    fire = FIRE(heads, **kw)
    for p in fire.mlp.parameters():
        torch.nn.init.normal_(p)
    return fire


@pytest.mark.parametrize(
    "kw",
    [
        {"init_L": 20.0},
        {"init_L": 20.0, "normalizer_cap": 60.0},
        {"init_L": 80.0, "normalizer_cap": 30.0},
        {"progressive_interpolation": False},
        {"log_transform": False, "init_L": 20.0},
        {"learn_threshold": False},
        {"mlp_depth": 2, "init_L": 20.0},
        {"mlp_width": 1, "init_L": 5.0},
    ],
)
@pytest.mark.parametrize("q_len,k_len,q_offset", [(100, 100, 0), (7, 100, None), (30, 40, 500), (1, 1, 0), (50, 20, 3)])
def test_fire_fast_path_equals_formula(kw, q_len, k_len, q_offset, fire_path):
    fire = random_fire(**kw)
    fast = fire.bias(q_len, k_len, q_offset)
    slow = fire.bias_reference(q_len, k_len, q_offset)
    assert torch.allclose(fast, slow, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the inference path writes blocks in place with a fused multiply-add
        assert torch.allclose(fire.bias(q_len, k_len, q_offset), slow, atol=1e-5, rtol=1e-5)
        # the attention mask: the same values, −inf exactly at future keys
        off = k_len - q_len if q_offset is None else q_offset
        future = torch.arange(k_len)[None, :] > torch.arange(off, off + q_len)[:, None]
        masked = fire.masked_bias(q_len, k_len, q_offset)
        assert torch.isneginf(masked[:, future]).all() and torch.isfinite(masked[:, ~future]).all()
        assert torch.allclose(masked[:, ~future], slow[:, ~future], atol=1e-5, rtol=1e-5)


@pytest.fixture(params=["compiled", "torch"])
def fire_path(request, monkeypatch):
    """Run a FIRE test on the compiled (numba) kernels and on the plain torch path."""
    if request.param == "torch":
        monkeypatch.setattr(fire_module, "_row_kernel", lambda: None)
    elif fire_module._row_kernel() is None:
        pytest.skip("numba is not installed: the compiled FIRE kernels are off")
    return request.param


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    "kw,q_len,k_len,q_offset",
    [
        ({"init_L": 20.0, "normalizer_cap": 50.0}, 70, 70, 0),
        ({"init_L": 20.0, "init_c": -0.3}, 30, 90, 60),
        ({"progressive_interpolation": False}, 40, 40, 0),
        ({"init_L": 80.0, "normalizer_cap": 30.0}, 20, 50, 40),
    ],
)
def test_fire_fast_path_gradients_equal_formula(fire_path, masked, kw, q_len, k_len, q_offset):
    fire = random_fire(**kw)
    g = torch.randn(3, q_len, k_len)
    future = torch.arange(k_len)[None, :] > torch.arange(q_offset, q_offset + q_len)[:, None]
    grads = []
    for fn in ((fire.masked_bias if masked else fire.bias), fire.bias_reference):
        fire.zero_grad()
        b = fn(q_len, k_len, q_offset)
        if masked:  # the −inf entries carry no gradient; compare on the causal pairs
            b = b.masked_fill(future, 0.0)
            g = g.masked_fill(future, 0.0)
        (b * g).sum().backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in fire.parameters()])
    for a, b in zip(*grads, strict=True):  # sums over thousands of pairs: compare relative to the gradient's size
        if a is None or b is None:  # a parameter the configuration leaves unused (L without interpolation)
            assert a is None or not a.any()
            assert b is None or not b.any()
            continue
        assert torch.allclose(a, b, atol=1e-5 * b.abs().max().item() + 1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", ["t5", "alibi", "kerple_log", "kerple_power", "sandwich", "fire", "fire_s"])
def test_masked_bias_is_bias_with_future_masked(name):
    enc = build_encoding(name, 3, 8)
    for q_len, k_len, off in [(9, 9, 0), (4, 12, 8), (5, 7, 30)]:
        future = torch.arange(k_len)[None, :] > torch.arange(off, off + q_len)[:, None]
        expect = enc.bias(q_len, k_len, off).masked_fill(future, float("-inf"))
        got = enc.masked_bias(q_len, k_len, off)
        assert torch.equal(got, expect)
        assert got.is_contiguous()  # row-major: SDPA reads a transposed mask ~4× slower
        params = [p for p in enc.parameters() if p.requires_grad]
        if params:  # learned biases: the same gradient through either form
            w = torch.randn(expect.shape).masked_fill(future, 0.0)
            g_expect = torch.autograd.grad((expect.masked_fill(future, 0.0) * w).sum(), params, allow_unused=True)
            g_got = torch.autograd.grad((got.masked_fill(future, 0.0) * w).sum(), params, allow_unused=True)
            for a, b in zip(g_got, g_expect, strict=True):
                assert (a is None and b is None) or torch.allclose(a, b, atol=1e-6)


def test_fire_long_context_memory_is_blocked():
    fire = FIRE(8)
    b = fire.bias(1, 8192)
    assert b.shape == (8, 1, 8192)
    x = fire.normalized_distance(torch.tensor([8191]), torch.arange(8192))
    assert x.min() >= 0 and x.max() <= 1.0 + 1e-6


def test_fire_normalizer_cap_flattens_beyond_cap():
    fire = random_fire(init_L=16.0, normalizer_cap=32.0)
    # rows beyond the cap share the normalizer ψ(cap): the bias becomes Toeplitz there
    a = fire.bias(1, 101, 100)[:, 0, -20:]  # query 100, distances 19..0
    b = fire.bias(1, 201, 200)[:, 0, -20:]  # query 200, same distances
    assert torch.allclose(a, b)
    uncapped = random_fire(init_L=16.0)
    assert not torch.allclose(uncapped.bias(1, 101, 100)[:, 0, -20:], uncapped.bias(1, 201, 200)[:, 0, -20:])


def test_fire_ablation_options_change_the_input():
    base = FIRE(1, init_L=16.0)
    i, j = torch.tensor([100]), torch.tensor([40])
    assert base.normalized_distance(i, j).item() == pytest.approx(math.log1p(6.0) / math.log1p(10.0), rel=1e-5)
    no_pi = FIRE(1, progressive_interpolation=False)
    assert no_pi.normalized_distance(i, j).item() == pytest.approx(math.log1p(6.0), rel=1e-5)
    no_log = FIRE(1, log_transform=False, init_L=16.0)
    assert no_log.normalized_distance(i, j).item() == pytest.approx(60 / (100 + 1e-6), rel=1e-5)
    no_threshold = FIRE(1, learn_threshold=False)
    assert no_threshold.normalized_distance(torch.tensor([5]), torch.tensor([0])).item() == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="mlp_depth"):
        FIRE(1, mlp_depth=3)


def test_kerple_power_gradient_finite_at_zero_distance():
    enc = KerplePower(2)
    enc.bias(8, 8).sum().backward()
    assert torch.isfinite(enc.r1.grad).all() and torch.isfinite(enc.r2.grad).all()


def test_kerple_constraints_applied_in_forward():
    enc = KerplePower(2, init_r1=1.0, init_r2=1.0)
    with torch.no_grad():
        enc.r1.fill_(-3.0)
        enc.r2.fill_(5.0)
    r1, r2 = enc.constrained()
    assert r1.tolist() == pytest.approx([0.01, 0.01]) and r2.tolist() == pytest.approx([2.0, 2.0])


def test_t5_bias_uses_table():
    enc = T5RelativeBias(2, num_buckets=8, max_distance=20)
    with torch.no_grad():
        enc.relative_attention_bias.copy_(torch.arange(16.0).view(8, 2))
    b = enc.bias(1, 4, 3)  # query at 3, distances 3, 2, 1, 0
    buckets = relative_position_bucket(-torch.tensor([3, 2, 1, 0]), False, 8, 20)
    assert b[0, 0].tolist() == (buckets * 2).float().tolist()


def test_numba_kernels_leave_torch_thread_count_alone():
    """numba's OpenMP layer used to raise torch's thread count to every CPU on its first launch
    (a process asked for 1 thread then ran on all of them); the kernels must put it back."""
    import subprocess
    import sys

    code = """
import torch
import fireviz.encodings.fire as F
from fireviz.model import GPT, GPTConfig
assert torch.get_num_threads() == 1
if F._row_kernel() is None:
    raise SystemExit("numba kernels unavailable")
torch.manual_seed(0)
m = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=64, position_encoding="fire"))
x = torch.randint(0, 256, (2, 64))
torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
assert m.encodings[0].mlp[-1].weight.grad.abs().sum() > 0
print("threads", torch.get_num_threads())
"""
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"}
    env.pop("FIRE_NO_NUMBA", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "threads 1"


def test_bias_lengths_must_be_integers():
    enc = build_encoding("alibi", 2, 8)
    for args, match in (
        ((2.5, 4), "q_len must be an integer"),
        ((True, 4), "q_len must be an integer"),
        ((2, 4, 1.5), "q_offset must be an integer"),
        ((2, 4, -1), "must be >= 0"),
        ((5, 3), "q_len=5 > k_len=3"),
    ):
        with pytest.raises(ValueError, match=match):
            enc.bias(*args)
    assert enc.bias(2, 4, 1).shape == (2, 2, 4)


# ---------------------------------------------------------------- Kerple keeps its gradient
@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_kerple_gradient_below_the_bound(cls):
    """A parameter below its bound still gets a gradient (the clamp was in the graph before)."""
    enc = cls(1, init_r1=1.0, init_r2=0.005)
    enc.bias(8, 8).sum().backward()
    assert enc.r2.grad is not None and enc.r2.grad.abs().item() > 0
    assert enc.constrained()[1].item() == pytest.approx(0.01)  # the value used is still the constrained one


@pytest.mark.parametrize("cls", [KerpleLog, KerplePower])
def test_kerple_recovers_from_below_the_bound(cls):
    """Fitted toward r2 = 0.5 from 0.005 (below 0.01) with Adam, lr 0.01, 300 steps and the
    trainer's projection after each step, r2 gets past 0.4 (it stayed at 0.005 when clamped)."""
    enc = cls(1, init_r1=1.0, init_r2=0.005)
    with torch.no_grad():
        target = cls(1, init_r1=1.0, init_r2=0.5).bias(64, 64)
    enc.r1.requires_grad_(False)  # r1 is the right one: only r2 has to move
    opt = torch.optim.Adam([enc.r2], lr=0.01)
    for _ in range(300):
        opt.zero_grad()
        (enc.bias(64, 64) - target).pow(2).mean().backward()
        opt.step()
        enc.project_()
        assert enc.r2.item() >= 0.01  # the projection keeps the raw parameter feasible
    assert enc.constrained()[1].item() > 0.4


def test_kerple_projection_and_parameters():
    enc = KerplePower(2, init_r1=1.0, init_r2=1.0)
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([-3.0, 0.5]))
        enc.r2.copy_(torch.tensor([5.0, 0.001]))
    before = enc.bias(4, 4)
    enc.project_()
    assert enc.r1.tolist() == pytest.approx([0.01, 0.5]) and enc.r2.tolist() == pytest.approx([2.0, 0.01])
    assert torch.equal(enc.bias(4, 4), before)  # projection does not change the bias the model uses
    assert enc.position_parameters() == {"r1": pytest.approx([0.01, 0.5]), "r2": pytest.approx([2.0, 0.01])}
    log = KerpleLog(1, init_r1=1.0, init_r2=3.0)
    log.project_()
    assert log.r2.item() == 3.0  # the log variant has no upper bound on r2


# ---------------------------------------------------------------- RoPE under a cast of the model
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "scaling",
    [None, {"type": "pi", "factor": 4.0}, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}],
)
def test_rope_angles_exact_after_casting_the_model(dtype, scaling):
    """model.to(bf16/fp16) must not round the frequencies: cos/sin at 8191 and 65535 within
    1e-3 of float64 (before the fix bf16 was off by 1.4 at 8191)."""
    from fireviz.encodings import rope_inv_freq, yarn_inv_freq

    head_dim = 32
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=2 * head_dim, seq_len=64, position_encoding="rope")).to(dtype)
    enc = RotaryEmbedding(2, head_dim, rope_scaling=scaling).to(dtype)
    for e in (enc, model.encodings[0] if scaling is None else enc):
        assert e.inv_freq.dtype == torch.float64
        if scaling is None:
            inv = rope_inv_freq(head_dim, 10000.0, torch.float64)
        elif scaling["type"] == "pi":
            inv = rope_inv_freq(head_dim, 10000.0, torch.float64) / 4.0
        else:
            inv = yarn_inv_freq(head_dim, 10000.0, 4.0, 512, dtype=torch.float64)[0]
        factor = e.attention_factor
        pos = torch.tensor([8191, 65535])
        ang = pos.double()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], -1)
        cos, sin = e.cos_sin(pos)
        assert (cos.double() - ang.cos() * factor).abs().max().item() < 1e-3
        assert (sin.double() - ang.sin() * factor).abs().max().item() < 1e-3
    x = torch.randn(1, 2, 2, head_dim).to(dtype)
    out = enc.rotate(x, torch.tensor([8191, 65535]))
    assert out.dtype == dtype
    model(torch.zeros(1, 8, dtype=torch.long))  # the cast model still runs


# ---------------------------------------------------------------- position_offset (randomized positions)
@pytest.mark.parametrize("kw", [{}, {"normalizer_cap": 40.0}, {"progressive_interpolation": False}, {"mlp_depth": 2}])
@pytest.mark.parametrize("grad", [False, True])
def test_fire_position_offset_is_the_block_of_a_longer_sequence(kw, grad):
    """A window at absolute offset P sees the bias of rows/keys P… of the full sequence:
    the distances stay, the normalizer takes the absolute query position."""
    fire = random_fire(heads=2, init_L=16.0, **kw)
    P, T = 37, 24
    full = fire.bias_reference(P + T, P + T, 0)[:, P:, P:]
    with torch.set_grad_enabled(grad):
        b = fire.bias(T, T, 0, position_offset=P)
        m = fire.masked_bias(T, T, 0, position_offset=P)
    torch.testing.assert_close(b, full, atol=1e-5, rtol=1e-5)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    torch.testing.assert_close(m.masked_fill(future, 0.0), full.masked_fill(future, 0.0), atol=1e-5, rtol=1e-5)
    assert torch.isinf(m[:, future]).all()
    if grad:
        b.sum().backward()
        assert fire.c.grad is not None and torch.isfinite(fire.c.grad)
    with pytest.raises(ValueError, match="position_offset"):
        fire.bias(T, T, 0, position_offset=-1)


@pytest.mark.parametrize("name", TOEPLITZ)
def test_toeplitz_biases_ignore_the_position_offset(name):
    enc = build_encoding(name, 2, 16)
    assert torch.equal(enc.bias(8, 8, 0, position_offset=500), enc.bias(8, 8, 0))
    assert torch.equal(enc.masked_bias(8, 8, 0, position_offset=500), enc.masked_bias(8, 8, 0))


def test_model_position_offset():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 12))
    for enc, moves in (("fire", True), ("rope", False), ("alibi", False), ("nope", False)):
        m = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, position_encoding=enc)).eval()
        diff = (m(x, position_offset=100) - m(x)).abs().max().item()
        # RoPE: q·k depends on m − n only, so a shift changes the logits by rounding alone
        assert (diff > 1e-4) == moves, (enc, diff)
    m = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, position_encoding="fire")).eval()
    with pytest.raises(ValueError, match="position_offset"):
        m(x, position_offset=-3)
    from fireviz.model.gpt import KVCache

    with pytest.raises(ValueError, match="KV cache"):
        m(x, cache=KVCache(1), position_offset=4)


@pytest.mark.parametrize("name", ["fire", "fire_s", "alibi", "t5", "kerple_log", "kerple_power", "sandwich"])
def test_bias_at_equals_bias_on_any_grid(name):
    """``bias_at`` (the formula on the grid pairs only) gives ``bias``'s numbers, NaN at future keys."""
    from fireviz.encodings import build_encoding

    torch.manual_seed(0)
    enc = build_encoding(name, num_heads=3, head_dim=8)
    qs, ks = [0, 5, 63, 200, 777], [0, 1, 5, 64, 199, 200, 1000]
    grid = enc.bias_at(qs, ks)
    full = enc.bias(1001, 1001, 0)  # queries 0…1000 over keys 0…1000
    for r, i in enumerate(qs):
        for c, j in enumerate(ks):
            if j > i:
                assert torch.isnan(grid[:, r, c]).all()
            else:
                torch.testing.assert_close(grid[:, r, c], full[:, i, j].float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=">= 0"):
        enc.bias_at([-1], [0])


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (5, 5), (3, 9), (9, 3), (16, 40)])
def test_toeplitz_rows_backward_equals_autograd_through_the_gather(q_len, k_len):
    """The diagonal-sum backward of ToeplitzBias.masked_bias's gather equals autograd's
    scatter through the plain indexing, for square, wide and tall grids."""
    from fireviz.encodings.base import _toeplitz_rows, _ToeplitzRows

    torch.manual_seed(0)
    table = torch.randn(3, q_len + k_len - 1, requires_grad=True)
    grad = torch.randn(3, q_len, k_len)
    direct = _ToeplitzRows.apply(table, q_len, k_len)
    (g_direct,) = torch.autograd.grad(direct, table, grad)
    plain = _toeplitz_rows(table, q_len, k_len)
    (g_plain,) = torch.autograd.grad(plain, table, grad)
    assert torch.equal(direct, plain)
    assert torch.allclose(g_direct, g_plain, atol=1e-5)
    i, j = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
    expected = torch.zeros_like(table).index_add_(1, (i - j + k_len - 1).flatten(), grad.flatten(1))
    assert torch.allclose(g_direct, expected, atol=1e-5)


def test_kerple_power_init_follows_the_reference_code_and_can_reproduce_the_old_draw():
    """KERPLE's reference code draws bias_p ~ U(0, 2) (the power variant's exponent r2) and
    bias_a ~ U(0, 1) (its scale r1); fireviz 0.1 drew them the other way round, which
    ``reference_init=False`` reproduces for the checkpoints trained before the fix."""
    from fireviz.encodings import KerpleLog, KerplePower

    torch.manual_seed(0)
    u1, u2 = torch.rand(64), torch.rand(64)
    torch.manual_seed(0)
    new = KerplePower(64)
    assert torch.equal(new.r1.detach(), u1 * 1.0) and torch.equal(new.r2.detach(), u2 * 2.0)
    assert new.r1.max() < 1 and new.r2.max() > 1.5  # scale in (0, 1), exponent in (0, 2)
    torch.manual_seed(0)
    old = KerplePower(64, reference_init=False)
    assert torch.equal(old.r1.detach(), u1 * 2.0) and torch.equal(old.r2.detach(), u2 * 1.0)
    torch.manual_seed(0)
    log = KerpleLog(64)  # the log variant: multiplier r1 ~ U(0, 2), inner scale r2 ~ U(0, 1), as before
    assert torch.equal(log.r1.detach(), u1 * 2.0) and torch.equal(log.r2.detach(), u2 * 1.0)
    with pytest.raises(ValueError, match="reference_init"):
        KerplePower(4, reference_init="yes")
