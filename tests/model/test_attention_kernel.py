"""The compiled biased-attention backward (fireviz/model/csrc/biased_attention.cpp) and its loader.

The kernel's gradients against the torch backward it replaces and against autograd through
SDPA's math path in float64; the work split by head and batch group at several thread counts;
the loader's fallback (one warning, exact torch path), its off switch and its stale-lock repair.
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import fireviz.model.attention as attention_module
from fireviz.model import attention_kernel


def _compiler_available() -> bool:
    return any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "c++"))


def test_the_kernel_is_built_where_a_compiler_is():
    """Where the machine has a C++ compiler the kernel builds (.ci/run installs g++, requirements
    ninja): a silent fallback would hide a 1.3× slower training step."""
    if os.environ.get("FIREVIZ_NO_CPP_KERNEL", "") not in ("", "0"):
        assert attention_kernel.backward_kernel() is None
    elif _compiler_available():
        assert attention_kernel.backward_kernel() is not None, "g++ is on the PATH but the kernel did not build"
    else:
        with pytest.warns(RuntimeWarning, match="C\\+\\+ compiler"):
            attention_kernel.backward_kernel._kernel = None
            assert attention_kernel.backward_kernel() is None


def _inputs(B, H, Tq, Tk, D, learned, strided, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    if strided:  # views of one [B, T, 3, H, D] projection, as the model's attention gets them
        qkv = torch.randn(B, Tk, 3, H, D, generator=g, dtype=torch.float64)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        q = q[:, :, Tk - Tq :]
    else:
        q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
        k, v = torch.randn(2, B, H, Tk, D, generator=g, dtype=torch.float64)
    future = torch.arange(Tk)[None, :] > torch.arange(Tk - Tq, Tk)[:, None]
    mask = (torch.randn(H, Tq, Tk, generator=g, dtype=torch.float64) * scale).masked_fill(future, float("-inf"))
    dout = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    return q, k, v, mask, dout


def _grads(fn, q, k, v, mask, dout, learned, dtype):
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    m = mask.detach().to(dtype).requires_grad_(learned)
    out = fn(*leaves, m)
    wrt = leaves + ([m] if learned else [])
    return [out.detach().double()] + [g.double() for g in torch.autograd.grad(out, wrt, dout.to(dtype))]


def _math_path(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _assert_matches_float64_math_path(got, q, k, v, mask, dout, learned=True):
    """``got`` (from ``_grads``) against autograd through SDPA's math path in float64."""
    exact = _grads(_math_path, q, k, v, mask, dout, learned, torch.float64)
    assert len(got) == len(exact) == (5 if learned else 4)
    for c, e in zip(got, exact, strict=True):
        e = torch.nan_to_num(e, neginf=0.0)
        assert torch.allclose(c, e, atol=2e-5, rtol=1e-4), (c - e).abs().max()


def _compiled_kernel():
    kernel = attention_kernel.backward_kernel()
    if kernel is None:
        pytest.fail("the compiled backward is not available (see test_the_kernel_is_built_where_a_compiler_is)")
    return kernel


@pytest.mark.parametrize("learned", [True, False])
@pytest.mark.parametrize(
    "B,H,Tq,Tk,D,chunk,threads,strided",
    [
        (3, 2, 17, 17, 8, 4, 2, False),
        (2, 1, 5, 23, 7, 2, 2, True),  # one head on two threads: batch groups with their own buffer
        (5, 3, 40, 40, 32, 32, 3, True),
        (2, 5, 9, 9, 1, 128, 1, False),
        (4, 2, 33, 50, 65, 8, 8, True),  # more threads than pairs
    ],
)
def test_kernel_backward_equals_the_torch_backward_and_the_math_path(
    B, H, Tq, Tk, D, chunk, threads, strided, learned, monkeypatch
):
    _compiled_kernel()
    monkeypatch.setattr(attention_module, "BACKWARD_CHUNK", chunk)
    monkeypatch.setattr(attention_module, "FORWARD_CHUNK", chunk)
    q, k, v, mask, dout = _inputs(B, H, Tq, Tk, D, learned, strided)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        compiled = _grads(attention_module.BiasedAttention.apply, q, k, v, mask, dout, learned, torch.float32)
        monkeypatch.setattr(attention_module, "backward_kernel", lambda: None)
        plain = _grads(attention_module.BiasedAttention.apply, q, k, v, mask, dout, learned, torch.float32)
    finally:
        torch.set_num_threads(threads_before)
    _assert_matches_float64_math_path(compiled, q, k, v, mask, dout, learned)
    for c, p in zip(compiled, plain, strict=True):
        assert torch.allclose(c, p, atol=2e-5, rtol=1e-4), (c - p).abs().max()


def test_kernel_with_underflowing_probabilities():
    """ALiBi-like far keys (log-probabilities far below −60) give exactly zero there and the
    same gradients as the math path."""
    _compiled_kernel()
    B, H, T, D = 2, 2, 64, 16
    q, k, v, _, dout = _inputs(B, H, T, T, D, True, False, seed=1)
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double()
    mask = (-torch.tensor([4.0, 30.0], dtype=torch.float64)[:, None, None] * dist).masked_fill(dist < 0, float("-inf"))
    compiled = _grads(attention_module.BiasedAttention.apply, q, k, v, mask, dout, True, torch.float32)
    _assert_matches_float64_math_path(compiled, q, k, v, mask, dout)
    assert (compiled[-1][1][dist[None, 0].expand(T, T) > 3] == 0).all()  # far keys of the steep head: P = 0


def test_kernel_refuses_bad_inputs_with_an_error():
    kernel = _compiled_kernel()
    q = torch.randn(1, 2, 4, 8)
    mask = torch.zeros(2, 4, 4)
    lse = torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError, match="float32 CPU only"):
        kernel.biased_attention_backward(q.double(), q, q, mask, q, lse, q, True, 32, -60.0)
    with pytest.raises(RuntimeError, match=r"mask must be \[heads, Tq, Tk\]"):
        kernel.biased_attention_backward(q, q, q, mask[:1], q, lse, q, True, 32, -60.0)
    with pytest.raises(RuntimeError, match="bad key shape or chunk"):
        kernel.biased_attention_backward(q, q, q, mask, q, lse, q, True, 0, -60.0)


def test_a_failed_build_warns_once_and_the_torch_backward_takes_over(monkeypatch):
    def no_compiler():
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr(attention_kernel.backward_kernel, "_kernel", None)
    monkeypatch.setattr(attention_kernel.backward_kernel, "_build", no_compiler)
    monkeypatch.delenv("FIREVIZ_NO_CPP_KERNEL", raising=False)
    with pytest.warns(RuntimeWarning, match="c\\+\\+: not found.*exact torch backward.*g\\+\\+"):
        assert attention_kernel.backward_kernel() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attention_kernel.backward_kernel() is None  # no second warning
    q, k, v, mask, dout = _inputs(2, 2, 9, 9, 4, True, False)
    got = _grads(attention_module.BiasedAttention.apply, q, k, v, mask, dout, True, torch.float32)
    _assert_matches_float64_math_path(got, q, k, v, mask, dout)


def test_the_off_switch(monkeypatch):
    monkeypatch.setenv("FIREVIZ_NO_CPP_KERNEL", "1")
    assert attention_kernel.backward_kernel() is None


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path, monkeypatch):
    """A build killed part-way leaves torch's lock file, on which torch's next build would wait
    forever; the loader's own flock (released by the kernel when its holder dies) replaces it."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: kwargs["build_directory"])
    directory = attention_kernel.build_directory()
    assert directory.startswith(str(tmp_path)) and attention_kernel.build_name() in directory
    os.makedirs(directory)
    open(os.path.join(directory, "lock"), "w").close()
    assert attention_kernel._build() == directory
    assert not os.path.exists(os.path.join(directory, "lock"))
    assert attention_kernel._build() == directory  # the flock was released


def test_a_built_library_is_imported_without_ninja(monkeypatch):
    """The cached build is imported directly (its name keys source, flags, CPU, Python and torch):
    no rebuild from another checkout's path or another ninja's records, no compiler needed."""
    import torch.utils.cpp_extension as cpp_extension

    _compiled_kernel()

    def no_build(**kwargs):
        raise AssertionError("rebuilt although the library exists")

    monkeypatch.setattr(cpp_extension, "load", no_build)
    monkeypatch.setenv("PATH", "/nonexistent")
    module = attention_kernel._build()
    assert hasattr(module, "biased_attention_backward")


def test_kernel_edge_inputs():
    """Operands BLAS cannot read in place (a row stride below D: dout of a sum over time, keys
    expanded along time, one query as a transposed view) are copied, not misread; an empty batch
    gives a zero mask gradient."""
    _compiled_kernel()
    B, H, T, D = 2, 2, 6, 4
    q, k, v, mask, _ = _inputs(B, H, T, T, D, True, False, seed=3)
    biased, sdpa = attention_module.BiasedAttention.apply, F.scaled_dot_product_attention
    cases = [  # (fast, reference, output length)
        (
            lambda q, k, v, m: biased(q, k, v, m).sum(2, keepdim=True),  # dout has row stride 0
            lambda q, k, v, m: sdpa(q, k, v, attn_mask=m).sum(2, keepdim=True),
            1,
        ),
        (
            lambda q, k, v, m: biased(q, k[:, :, :1].expand(-1, -1, T, -1), v, m),  # keys of row stride 0
            lambda q, k, v, m: sdpa(q, k[:, :, :1].expand(-1, -1, T, -1), v, attn_mask=m),
            T,
        ),
    ]
    for fast, reference, rows in cases:
        dout = torch.randn(B, H, rows, D, dtype=torch.float64)
        got = _grads(fast, q, k, v, mask, dout, True, torch.float32)
        ref = _grads(reference, q, k, v, mask, dout, True, torch.float64)
        for c, e in zip(got, ref, strict=True):
            assert torch.allclose(c, torch.nan_to_num(e, neginf=0.0), atol=2e-5, rtol=1e-4)
    q1 = torch.randn(B, H, D, 1).transpose(2, 3).requires_grad_(True)  # one query, row stride 1 < D
    k1, v1 = torch.randn(B, H, 3, D, requires_grad=True), torch.randn(B, H, 3, D, requires_grad=True)
    m1 = torch.randn(H, 1, 3, requires_grad=True)
    got = torch.autograd.grad(attention_module.BiasedAttention.apply(q1, k1, v1, m1).sum(), (q1, k1, v1, m1))
    ref = torch.autograd.grad(F.scaled_dot_product_attention(q1, k1, v1, attn_mask=m1).sum(), (q1, k1, v1, m1))
    for c, e in zip(got, ref, strict=True):
        assert torch.allclose(c, e, atol=1e-5, rtol=1e-4)
    empty = torch.randn(0, H, T, D, requires_grad=True)
    m0 = mask.float().requires_grad_(True)
    out = attention_module.BiasedAttention.apply(empty, empty, empty, m0)
    (dmask,) = torch.autograd.grad(out.sum(), (m0,), allow_unused=True)
    assert dmask is None or torch.equal(dmask, torch.zeros_like(dmask))
