"""FIRE's CUDA bias path (``FIRE.masked_bias_segments``, fireviz/encodings/fire_segments.py, issue 49)
against the plain formula in float64: values and the gradients of c, L and every MLP weight."""

from __future__ import annotations

import math

import pytest
import torch

from fireviz.encodings.fire import FIRE
from fireviz.encodings.fire_segments import segment_bias

#: float64 throughout: the two sides differ by rounding only (~1e-15 relative); an index or a
#: breakpoint off by one is O(0.01) or more
VALUE_TOL = 1e-11
GRAD_TOL = 1e-9


def plain_masked(f: FIRE, q_len: int, k_len: int, q_offset: int, P: int) -> torch.Tensor:
    """Li et al. 2024 eq. 3–4 literally, in float64, −inf at future keys: [H, q_len, k_len]."""
    return f.masked_bias_reference(q_len, k_len, q_offset, P)


def test_the_reference_is_the_formula_written_out():
    """The reference itself, against eq. 3–4 spelled out for one pair with its own arithmetic."""
    f = fire64(0, init_L=4.0, normalizer_cap=7)
    ref = f.masked_bias_reference(3, 12, 9, 2)  # query i = 9 + 2 + r, key j = 2 + k
    c, L = float(f.c.detach()), float(f.threshold().detach())
    for r, k in ((0, 0), (1, 5), (2, 11)):
        i, j = 11 + r, 2 + k
        x = math.log1p(c * (i - j)) / (math.log1p(c * min(max(L, i), 7)) + f.eps)
        w1, b1 = f.mlp[0].weight[:, 0].tolist(), f.mlp[0].bias.tolist()
        hidden = [max(0.0, w * x + b) for w, b in zip(w1, b1, strict=True)]
        for h in range(3):
            want = float(f.mlp[2].bias[h].detach()) + sum(
                float(f.mlp[2].weight[h, u].detach()) * hidden[u] for u in range(len(hidden))
            )
            assert abs(float(ref[h, r, k].detach()) - want) < 1e-12
    assert torch.isinf(ref[:, 0, 10]).all() and torch.isfinite(ref[:, 0, 9]).all()


def fire64(seed: int, heads: int = 3, width: int = 8, depth: int = 1, zero_units: bool = False, **kw) -> FIRE:
    torch.manual_seed(seed)
    f = FIRE(heads, mlp_width=width, mlp_depth=depth, **kw).double()
    with torch.no_grad():
        for p in f.mlp.parameters():  # breakpoints of both signs inside [0, 1], heads that differ
            p.normal_(0.0, 1.0)
        f.c.fill_(0.3)
        if zero_units:  # units with w = 0: constant on (b > 0) or off (b < 0)
            f.mlp[0].weight[:2, 0] = 0.0
            f.mlp[0].bias[0], f.mlp[0].bias[1] = 0.7, -0.4
    return f


def grads(f: FIRE, bias: torch.Tensor, upstream: torch.Tensor) -> dict[str, torch.Tensor]:
    f.zero_grad(set_to_none=True)
    finite = torch.isfinite(bias)
    (bias.masked_fill(~finite, 0.0) * upstream).sum().backward()
    return {n: p.grad.clone() for n, p in f.named_parameters() if p.grad is not None}


CASES = {
    # name: (q_len, k_len, q_offset, position_offset, FIRE options)
    "all rows below L (Toeplitz)": (9, 9, 0, 0, {"init_L": 40.0}),
    "all rows above L": (10, 10, 0, 0, {"init_L": 0.5}),
    "L inside the rows": (16, 16, 0, 0, {"init_L": 6.0}),
    "queries not at 0 (a KV-cache block)": (5, 13, 8, 0, {"init_L": 6.0}),
    "position offset": (7, 7, 0, 11, {"init_L": 6.0}),
    "offset and queries before the last key": (4, 12, 3, 5, {"init_L": 9.0}),
    "normalizer cap above L": (14, 14, 0, 0, {"init_L": 3.0, "normalizer_cap": 9}),
    "normalizer cap below L": (12, 12, 0, 0, {"init_L": 8.0, "normalizer_cap": 5}),
    "cap, offset and a query block": (6, 20, 14, 4, {"init_L": 7.0, "normalizer_cap": 16}),
    "no progressive interpolation": (8, 8, 0, 0, {"progressive_interpolation": False}),
    "no log transform": (8, 8, 0, 0, {"log_transform": False, "init_L": 3.0}),
    "L not learned": (8, 8, 0, 2, {"learn_threshold": False}),
    "one query": (1, 9, 8, 0, {"init_L": 3.0}),
}


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_bias_and_gradients_equal_the_float64_formula(case, depth):
    q_len, k_len, q_offset, P, opts = CASES[case]
    f = fire64(len(case), depth=depth, zero_units=depth == 1, **opts)
    got = f.masked_bias_segments(q_len, k_len, q_offset, P)
    ref = plain_masked(f, q_len, k_len, q_offset, P)
    assert got.shape == ref.shape == (3, q_len, k_len) and got.dtype == torch.float64
    assert torch.equal(torch.isinf(got), torch.isinf(ref)) and bool((got[torch.isinf(got)] < 0).all())
    finite = torch.isfinite(ref)
    assert (got[finite] - ref[finite]).abs().max() <= VALUE_TOL * ref[finite].abs().max().clamp_min(1.0)
    upstream = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    g_got, g_ref = grads(f, got, upstream), grads(f, ref, upstream)
    expected = {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"} | ({"c"} if f.log_transform else set())
    if opts.get("learn_threshold", True) and opts.get("progressive_interpolation", True):
        expected.add("L_multiplier")
    assert expected <= set(g_ref), sorted(g_ref)
    assert set(g_got) == set(g_ref)
    for name, g in g_ref.items():
        err = (g_got[name] - g).abs().max() / g.abs().max().clamp_min(1e-3)
        assert err <= GRAD_TOL, (name, float(err))


def test_L_gradient_is_not_trivially_zero():
    """Rows on both sides of L: L's gradient is that of the normalizer ψ(L) of the rows below it."""
    f = fire64(3, init_L=6.0)
    g = grads(f, f.masked_bias_segments(16, 16, 0), torch.ones(3, 16, 16, dtype=torch.float64))
    assert g["L_multiplier"].abs() > 1e-6


def test_every_width_and_tied_breakpoints():
    """Breakpoints that coincide (two units with the same −b/w) and a width of 1 and 32."""
    for width in (1, 2, 32):
        f = fire64(width, width=width, init_L=4.0)
        if width >= 2:
            with torch.no_grad():
                f.mlp[0].weight[1, 0] = 2 * f.mlp[0].weight[0, 0]
                f.mlp[0].bias[1] = 2 * f.mlp[0].bias[0]
        got, ref = f.masked_bias_segments(11, 11, 0), plain_masked(f, 11, 11, 0, 0)
        finite = torch.isfinite(ref)
        assert (got[finite] - ref[finite]).abs().max() <= VALUE_TOL * ref[finite].abs().max().clamp_min(1.0)


def test_float32_matches_the_model_path():
    """In float32 (a model's dtype) the CUDA path equals the CPU path of ``masked_bias`` to rounding."""
    torch.manual_seed(0)
    f = FIRE(4, init_L=20.0)
    with torch.no_grad():
        f.mlp[2].weight.normal_(0, 1.0)
    a, b = f.masked_bias_segments(64, 64, 0), f.masked_bias(64, 64, 0)
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    fin = torch.isfinite(b)
    assert (a[fin] - b[fin]).abs().max() < 1e-5


def test_segment_bias_equals_the_mlp_for_any_normalizers():
    """The core function alone: arbitrary positive normalizers (not FIRE's), keys past the queries."""
    g = torch.Generator().manual_seed(0)
    W, H, R, K, q_offset = 6, 2, 4, 13, 5
    w1, b1 = torch.randn(W, dtype=torch.float64, generator=g), torch.randn(W, dtype=torch.float64, generator=g)
    w2, b2 = torch.randn(H, W, dtype=torch.float64, generator=g), torch.randn(H, dtype=torch.float64, generator=g)
    d = torch.arange(q_offset - K + 1, q_offset + R, dtype=torch.float64)
    psi = torch.log1p(0.4 * d.abs())
    norm = torch.tensor([0.3, 1.0, 2.5, 7.0], dtype=torch.float64)
    got = segment_bias(psi, norm, q_offset, w1, b1, w2, b2)
    for r in range(R):
        for j in range(K):
            i = q_offset + r
            if j > i:
                assert torch.isinf(got[:, r, j]).all() and (got[:, r, j] < 0).all()
                continue
            x = math.log1p(0.4 * (i - j)) / float(norm[r])
            want = b2 + w2 @ torch.relu(w1 * x + b1)
            assert (got[:, r, j] - want).abs().max() < 1e-12
    with pytest.raises(ValueError, match="q_offset \\+ q_len <= k_len"):
        segment_bias(psi[:-3], norm, q_offset + 3, w1, b1, w2, b2)


def test_masked_bias_segments_refuses_queries_past_the_keys():
    with pytest.raises(ValueError, match="q_offset \\+ q_len <= k_len"):
        FIRE(2).masked_bias_segments(4, 5, 3)


def test_no_graph_break_under_dynamo():
    """Dynamo traces the path whole (no .item(), no data-dependent shape): one graph, no break."""
    f = FIRE(2, init_L=8.0)

    def step(f):
        return f.masked_bias_segments(32, 32, 0).masked_fill(torch.eye(32, dtype=torch.bool), 0).sum()

    explanation = torch._dynamo.explain(step)(f)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_a_model_on_the_cuda_path_trains_as_on_the_cpu_path(monkeypatch):
    """The wiring: with the CUDA path switched on for the CPU, a GPT's loss and every gradient
    (FIRE's c, L and MLP included) equal those of the CPU's own path (float32 rounding)."""
    import torch.nn.functional as F

    from fireviz.encodings import fire as fire_module
    from fireviz.model.gpt import GPT, GPTConfig

    def loss_and_grads(model, x):
        model.zero_grad(set_to_none=True)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=48, encoding_options={"init_L": 12.0}, attn_query_block=32)
    model = GPT(cfg).train()
    with torch.no_grad():
        for e in model.encodings:
            e.mlp[2].weight.normal_(0, 1.0)
    x = torch.randint(0, 256, (2, 49), generator=torch.Generator().manual_seed(1))
    ref_loss, ref = loss_and_grads(model, x)
    monkeypatch.setattr(fire_module, "SEGMENT_PATH_DEVICES", {"cuda", "cpu"})
    loss, got = loss_and_grads(model, x)
    assert abs(float(loss - ref_loss)) < 1e-5
    assert set(got) == set(ref) and "encodings.0.L_multiplier" in got
    for name, g in ref.items():
        assert (got[name] - g).abs().max() <= 1e-4 * g.abs().max().clamp_min(1e-3), name


def test_a_breakpoint_exactly_at_a_key():
    """x = i − j exactly (no log, no normalizer) and units switching at x = 3: ReLU's gradient at 0
    is 0, so a unit exactly at its breakpoint counts as off on both sides (w > 0 and w < 0)."""
    f = fire64(0, width=4, log_transform=False, progressive_interpolation=False)
    with torch.no_grad():
        f.mlp[0].weight[:, 0] = torch.tensor([1.0, -1.0, 2.0, -0.5], dtype=torch.float64)
        f.mlp[0].bias[:] = torch.tensor([-3.0, 3.0, -4.0, 1.0], dtype=torch.float64)  # x = 3, 3, 2, 2
    got, ref = f.masked_bias_segments(8, 8, 0), plain_masked(f, 8, 8, 0, 0)
    finite = torch.isfinite(ref)
    assert (got[finite] - ref[finite]).abs().max() < 1e-12
    upstream = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    g_got, g_ref = grads(f, got, upstream), grads(f, ref, upstream)
    for name, g in g_ref.items():
        assert (g_got[name] - g).abs().max() < 1e-10, name


def test_a_shared_mask_built_once_gives_the_blocks_the_same_gradients(monkeypatch):
    """FIRE-S on CUDA in training: one whole mask per pass, sliced per query block
    (``gpt.WHOLE_MASK_DEVICES``), gives the loss and gradients of a mask built per block."""
    import torch.nn.functional as F

    from fireviz.encodings import fire as fire_module
    from fireviz.model import gpt as gpt_module
    from fireviz.model.gpt import GPT, GPTConfig

    monkeypatch.setattr(fire_module, "SEGMENT_PATH_DEVICES", {"cuda", "cpu"})
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=3, n_head=2, d_model=32, seq_len=40, position_encoding="fire_s", attn_query_block=16)
    model = GPT(cfg).train()
    x = torch.randint(0, 256, (2, 41), generator=torch.Generator().manual_seed(1))
    calls = []
    original = fire_module.FIRE.masked_bias_segments

    def counting(self, *args, **kwargs):
        calls.append(args[:3])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(fire_module.FIRE, "masked_bias_segments", counting)

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref = loss_and_grads()
    assert len(calls) == 3 * 3  # per layer and block: 3 layers × 3 blocks of ≤ 16 queries
    calls.clear()
    monkeypatch.setattr(gpt_module, "WHOLE_MASK_DEVICES", {"cuda", "cpu"})
    loss, got = loss_and_grads()
    assert calls == [(40, 40, 0)]  # once per pass, all queries
    assert abs(float(loss - ref_loss)) < 1e-6
    for name, g in ref.items():
        assert (got[name] - g).abs().max() <= 1e-5 * g.abs().max().clamp_min(1e-3), name


@pytest.mark.slow  # Inductor compiles forward and backward: about a minute on 2 loaded cores
def test_inductor_compiles_the_path_whole_with_the_same_gradients():
    """torch.compile(fullgraph=True) lowers the path (scatter_add, cumsum, searchsorted) forward
    and backward, with eager's gradients (float32; the CPU stands in for the CUDA lowering)."""
    torch.manual_seed(0)
    f = FIRE(4, init_L=100.0)
    with torch.no_grad():
        f.mlp[2].weight.normal_(0, 1.0)
    g = torch.randn(4, 96, 160, generator=torch.Generator().manual_seed(3))

    def step(f, g):
        b = f.masked_bias_segments(96, 160, 64, 5)
        return (torch.where(torch.isinf(b), 0.0, b) * g).sum()

    step(f, g).backward()
    ref = {n: p.grad.clone() for n, p in f.named_parameters()}
    f.zero_grad(set_to_none=True)
    torch.compile(step, fullgraph=True)(f, g).backward()
    assert ref["L_multiplier"].abs() > 0  # rows on both sides of L
    for n, p in f.named_parameters():
        assert (p.grad - ref[n]).abs().max() <= 1e-4 * ref[n].abs().max().clamp_min(1e-3), n
