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
