"""FlexAttention with the bias inside the kernel (issue 22): the same logits as the SDPA path
(≤ 1e-4) on CPU, at lengths that are and are not multiples of its 128-token blocks."""

from __future__ import annotations

import pytest
import torch

from fireviz.model import flex
from fireviz.model.gpt import GPT, GPTConfig

pytestmark = pytest.mark.slow  # each shape compiles once (tens of seconds on 2 shared cores)


@pytest.fixture(scope="module")
def available():
    assert flex.flex_available(), f"FlexAttention does not compile here: {flex.unavailable_reason()}"


@pytest.mark.parametrize("encoding", ["fire", "alibi", "t5", "kerple_power", "rope", "nope"])
@pytest.mark.parametrize("length", [200])
def test_flex_matches_the_sdpa_path(available, encoding, length):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=64, position_encoding=encoding)).eval()
    if encoding == "fire":  # heads that differ, and a normalizer that moves past L
        with torch.no_grad():
            for e in model.encodings:
                e.mlp[2].weight.normal_(0, 1.0)
    x = torch.randint(0, 256, (1, length))
    with torch.no_grad():
        ref = model(x)
        got = model.set_attention_backend("flex")(x)
        model.set_attention_backend("sdpa")
    assert (got - ref).abs().max() < 1e-4


def test_flex_fire_at_a_block_multiple_and_with_a_cap(available):
    torch.manual_seed(1)
    model = GPT(
        GPTConfig(
            n_layer=1,
            n_head=2,
            d_model=32,
            seq_len=64,
            position_encoding="fire",
            encoding_options={"normalizer_cap": 96},
        )
    ).eval()
    x = torch.randint(0, 256, (1, 256))
    with torch.no_grad():
        ref = model(x)
        got = model.set_attention_backend("flex")(x)
    assert (got - ref).abs().max() < 1e-4


def test_no_fused_form_is_a_clear_error():
    from fireviz.encodings import FIRE

    with pytest.raises(flex.FlexUnavailable, match="mlp_depth 1"):
        flex.score_mod_for(FIRE(2, mlp_depth=2), 8, 8, 0)
    with pytest.raises(ValueError, match="'sdpa' or 'flex'"):
        GPT(GPTConfig(n_layer=1, n_head=1, d_model=8, seq_len=16)).set_attention_backend("xla")


@pytest.mark.parametrize("encoding", ["alibi", "fire"])
def test_a_new_query_offset_compiles_nothing_again(available, encoding, monkeypatch):
    """q_offset enters the score_mod and the causal mask as a tensor: with the recompile limit at 2,
    six offsets of one shape still run (a Python int would compile six variants, and past the limit
    causal_flex raises rather than take PyTorch's dense fallback), each equal to the SDPA path."""
    from fireviz.encodings import build_encoding
    from fireviz.model.attention import attention, causal_attention_mask

    torch._dynamo.reset()  # the limit counts every variant of flex_attention in the process
    monkeypatch.setattr(flex, "RECOMPILE_LIMIT", 2)
    torch.manual_seed(2)
    enc = build_encoding(encoding, 2, 8)
    k = torch.randn(1, 2, 64, 8)
    v = torch.randn(1, 2, 64, 8)
    for offset in (0, 8, 16, 24, 40, 48):
        q = torch.randn(1, 2, 16, 8)
        with torch.no_grad():
            got = flex.causal_flex(q, k, v, enc, q_offset=offset)
            mask = causal_attention_mask(enc, 16, 64, offset, q.device)
            ref = attention(q, k, v, mask, 0.0, causal=True)
        assert (got - ref).abs().max() < 1e-4, offset


def test_the_flex_backend_falls_back_to_sdpa_where_it_cannot_run(available):
    """A breaker's findings: with backend "flex", a gradient on CPU in eval mode raised PyTorch's
    NotImplementedError, FIRE with mlp_depth 2 raised FlexUnavailable, and KV-cache decoding compiled
    again at every step. Each now takes the SDPA path, with the same numbers."""
    from fireviz.model.gpt import KVCache

    torch.manual_seed(3)
    cfg = dict(n_layer=1, n_head=2, d_model=16, seq_len=32)
    x = torch.randint(0, 256, (1, 40))
    model = GPT(GPTConfig(position_encoding="alibi", **cfg)).eval()
    model.set_attention_backend("flex")(x).sum().backward()  # eval mode, autograd on, CPU
    deep = GPT(GPTConfig(position_encoding="fire", encoding_options={"mlp_depth": 2}, **cfg)).eval()
    with torch.no_grad():
        ref = deep(x)
        assert torch.equal(deep.set_attention_backend("flex")(x), ref)
        cache = KVCache(1)
        steps = [model(x[:, :8], cache=cache)] + [model(x[:, i : i + 1], cache=cache) for i in range(8, 12)]
        full = model.set_attention_backend("sdpa")(x[:, :12])
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-4
    with pytest.raises(ValueError, match="q_offset must lie in"):
        flex.causal_flex(torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 64, 8), torch.zeros(1, 2, 64, 8), q_offset=60)
