"""The GPT: offsets proven by incremental decoding, blocked attention, checkpoints."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import run_interleaved

import fireviz.model.attention as attention_module
from fireviz.encodings import ENCODING_NAMES
from fireviz.model.gpt import BOS_ID, GPT, CheckpointError, GPTConfig, KVCache


def tiny(name, seq_len=16, block=1024, **kw):
    torch.manual_seed(0)
    opts = {}
    if name in ("rope_pi", "yarn"):
        opts["rope_scaling_factor"] = 2.0
    if name.startswith("fire"):
        opts["init_L"] = 6.0  # queries beyond L exercise the non-Toeplitz rows
    cfg = GPTConfig(
        n_layer=2,
        n_head=2,
        d_model=32,
        seq_len=seq_len,
        position_encoding=name,
        encoding_options=opts,
        attn_query_block=block,
        **kw,
    )
    model = GPT(cfg).eval()
    if name in ("fire", "fire_s"):
        for enc in model.encodings:  # make the bias matter
            torch.nn.init.normal_(enc.mlp[0].weight)
            torch.nn.init.normal_(enc.mlp[0].bias)
    return model


@pytest.mark.parametrize("name", ENCODING_NAMES)
def test_incremental_decoding_equals_full_forward(name):
    model = tiny(name)
    idx = torch.randint(0, 257, (2, 24))
    full = model(idx)
    cache = KVCache(2)
    pieces = [
        model(idx[:, :7], cache),
        model(idx[:, 7:8], cache),
        model(idx[:, 8:20], cache),
        model(idx[:, 20:], cache),
    ]
    assert cache.length == 24
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)


@pytest.mark.parametrize("name", ENCODING_NAMES)
def test_query_blocks_equal_one_block(name):
    one = tiny(name)
    blocked = tiny(name, block=5)
    idx = torch.randint(0, 257, (2, 23))
    assert torch.allclose(one(idx), blocked(idx), atol=1e-5)


@pytest.mark.parametrize("name", ["nope", "rope", "t5", "alibi", "fire", "kerple_log", "sandwich"])
def test_appending_tokens_does_not_change_earlier_outputs(name):
    model = tiny(name)
    idx = torch.randint(0, 257, (1, 30))
    assert torch.allclose(model(idx[:, :12]), model(idx)[:, :12], atol=1e-5)


@pytest.mark.parametrize("name", ["fire", "t5", "kerple_power", "fire_s", "alibi", "sandwich"])
def test_chunked_bias_backward_equals_math_path(name, monkeypatch):
    """Training gradients through BiasedAttention (learned biases, and static ones, which take
    it too on CPU) equal autograd through SDPA's math path."""
    model = tiny(name).train()
    idx = torch.randint(0, 257, (3, 17))

    def grads():
        model.zero_grad()
        F.cross_entropy(model(idx[:, :-1]).reshape(-1, 257), idx[:, 1:].reshape(-1)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    monkeypatch.setattr(attention_module, "BACKWARD_CHUNK", 4)
    monkeypatch.setattr(attention_module, "FORWARD_CHUNK", 8)
    fast = grads()
    monkeypatch.setattr(
        attention_module.BiasedAttention,
        "apply",
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )
    slow = grads()
    assert fast.keys() == slow.keys()
    enc_params = [n for n in slow if n.startswith("encodings.")]
    learned = name not in ("alibi", "sandwich")
    assert bool(enc_params) == learned and all(slow[n].abs().sum() > 0 for n in enc_params)  # the bias learns
    for n in slow:
        assert torch.allclose(fast[n], slow[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.parametrize("learned", [True, False])
@pytest.mark.parametrize("Tq,Tk,chunk", [(17, 17, 4), (5, 23, 2), (9, 9, 128), (40, 40, 32)])
def test_biased_attention_backward_equals_math_path(learned, Tq, Tk, chunk, monkeypatch):
    """The chunked backward against autograd through SDPA's math path, queries the last Tq
    of Tk positions; a learned mask (gradient wanted) and a static one (none computed); the
    forward's query chunks too (the chunk size for both)."""
    monkeypatch.setattr(attention_module, "BACKWARD_CHUNK", chunk)
    monkeypatch.setattr(attention_module, "FORWARD_CHUNK", chunk)
    torch.manual_seed(0)
    B, H, D = 3, 2, 8
    q = torch.randn(B, H, Tq, D, requires_grad=True)
    k, v = torch.randn(B, H, Tk, D, requires_grad=True), torch.randn(B, H, Tk, D, requires_grad=True)
    future = torch.arange(Tk)[None, :] > torch.arange(Tk - Tq, Tk)[:, None]
    mask = torch.randn(H, Tq, Tk).masked_fill(future, float("-inf")).requires_grad_(learned)
    g = torch.randn(B, H, Tq, D)
    results = []
    for fn in (
        attention_module.BiasedAttention.apply,
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    ):
        for t in (q, k, v, mask):
            t.grad = None
        out = fn(q, k, v, mask)
        out.backward(g)
        results.append([out.detach()] + [t.grad.clone() for t in (q, k, v, mask) if t.requires_grad])
    assert len(results[0]) == (5 if learned else 4)
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def _explicit_attention(q, k, v, mask):
    """softmax(q·kᵀ/√d + mask)·v in float64, the reference for the routing tests."""
    scores = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5 + mask.double()
    return torch.softmax(scores, -1) @ v.double()


@pytest.mark.parametrize(
    "Tq,Tk,pattern",
    [(100, 100, "none"), (40, 40, "anti"), (43, 10, "causal"), (7, 7, "broadcast")],
)
def test_attention_routes_masks_it_cannot_chunk_to_sdpa(Tq, Tk, pattern):
    """Only a [heads, Tq, Tk] causal mask with Tq <= Tk that the caller vouches for takes the
    chunked BiasedAttention; a bidirectional or anti-causal mask, more queries than keys, a
    broadcast mask — or any mask without causal=True — get SDPA, and exact gradients."""
    torch.manual_seed(0)
    H = 1 if pattern == "broadcast" else 2
    q = torch.randn(2, 2, Tq, 8, requires_grad=True)
    k, v = torch.randn(2, 2, Tk, 8, requires_grad=True), torch.randn(2, 2, Tk, 8, requires_grad=True)
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    mask = torch.randn(H, Tq, Tk)
    if pattern == "anti":
        mask = mask.masked_fill(j < i, float("-inf"))
    elif pattern in ("causal", "broadcast"):
        mask = mask.masked_fill(j > i, float("-inf"))
    mask.requires_grad_(True)
    g = torch.randn(2, 2, Tq, 8)
    for causal in (False, True):
        if causal and pattern in ("none", "anti"):
            continue  # a caller vouching for a non-causal mask breaks the contract
        out = attention_module.attention(q, k, v, mask, causal=causal)
        ref = _explicit_attention(q, k, v, mask)
        grads = torch.autograd.grad(out, (q, k, v, mask), g)
        ref_grads = torch.autograd.grad(ref, (q, k, v, mask), g.double())
        assert torch.allclose(out.double(), ref, atol=1e-5)
        for a, b in zip(grads, ref_grads, strict=True):
            assert torch.allclose(a.double(), b.double(), atol=1e-4), (pattern, causal)


def test_biased_attention_refuses_a_second_derivative():
    """BiasedAttention's backward is not differentiable: create_graph=True then double
    backward raises instead of returning a second derivative that treats lse as a constant."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.randn(2, 9, 9).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    out = attention_module.attention(q, k, v, mask.requires_grad_(True), causal=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)  # a gradient penalty's first step
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


@pytest.mark.parametrize("name", ["fire", "fire_s", "t5"])
def test_compiled_kernels_equal_torch_path(name, monkeypatch):
    """Logits and gradients with the numba kernels equal those of the plain torch path."""
    import fireviz.encodings.fire as fire_module

    if fire_module._row_kernel() is None:
        pytest.skip("numba is not installed: the compiled kernel is off")
    model = tiny(name).train()
    idx = torch.randint(0, 257, (2, 19))

    def run():
        model.zero_grad()
        logits = model(idx[:, :-1])
        F.cross_entropy(logits.reshape(-1, 257), idx[:, 1:].reshape(-1)).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast_logits, fast = run()
    monkeypatch.setattr(fire_module, "_row_kernel", lambda: None)
    slow_logits, slow = run()
    assert torch.allclose(fast_logits, slow_logits, atol=1e-5)
    assert fast.keys() == slow.keys()
    for n in slow:
        assert torch.allclose(fast[n], slow[n], atol=1e-6, rtol=1e-4), n


def test_shared_and_per_layer_encodings():
    assert len(tiny("fire").encodings) == 2
    assert len(tiny("fire_s").encodings) == 1
    assert len(tiny("t5").encodings) == 2
    assert len(tiny("alibi").encodings) == 1


def test_generate_uses_cache_consistently():
    model = tiny("fire")
    prompt = torch.tensor([[BOS_ID, 72, 105]])
    out = model.generate(prompt, 6, temperature=0)
    assert out.shape == (1, 9) and torch.equal(out[:, :3], prompt)
    # greedy continuation agrees with the argmax of full forward passes
    seq = prompt
    for _ in range(6):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    for kwargs in (
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_k": 0},
        {"top_k": 2.5},
        {"max_new_tokens": -1},
    ):
        with pytest.raises(ValueError, match="generate needs"):
            model.generate(prompt, **{"max_new_tokens": 2, **kwargs})
    with pytest.raises(ValueError, match=r"idx\[None\]"):
        model.generate(prompt[0], 2)


def test_save_load_round_trip(tmp_path):
    model = tiny("fire")
    model.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors"} <= {p.name for p in tmp_path.iterdir()}
    loaded = GPT.from_pretrained(tmp_path)
    idx = torch.randint(0, 257, (1, 20))
    assert torch.equal(loaded(idx), model(idx))
    assert loaded.lm_head.weight.data_ptr() == loaded.wte.weight.data_ptr()
    assert json.loads((tmp_path / "config.json").read_text())["position_encoding"] == "fire"


def test_corrupt_checkpoint_refused_and_untouched(tmp_path):
    tiny("alibi").save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        GPT.from_pretrained(tmp_path)
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before


def test_shape_mismatch_refused(tmp_path):
    tiny("alibi").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_model"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        GPT.from_pretrained(tmp_path)


def test_missing_weights_and_bad_config(tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        GPT.from_pretrained(tmp_path)
    tiny("alibi").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["position_encoding"] = "alibii"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown position_encoding 'alibii'"):
        GPT.from_pretrained(tmp_path)


def test_from_pretrained_refuses_non_strict_loading(tmp_path):
    tiny("alibi").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load strictly only"):
        GPT.from_pretrained(tmp_path, strict=False)


def test_config_errors():
    with pytest.raises(ValueError, match="not divisible"):
        GPT(GPTConfig(d_model=30, n_head=4))
    with pytest.raises(ValueError, match="unknown position_encoding"):
        GPT(GPTConfig(position_encoding="xpos"))
    with pytest.raises(ValueError, match="does not take option"):
        GPT(GPTConfig(position_encoding="alibi", encoding_options={"init_L": 3}))


def test_absolute_embeddings_refuse_past_training_length():
    model = tiny("nope", absolute_position_embedding=True)
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="absolute position embeddings cover 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_out_of_vocabulary_ids_refused():
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 257\)"):
        tiny("nope")(torch.tensor([[300]]))


def test_fire_default_threshold_is_quarter_training_length():
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=512, position_encoding="fire"))
    assert model.encoding(0).threshold().item() == pytest.approx(128.0)


def test_from_pretrained_names_bad_config_files_and_arguments(tmp_path):
    """A damaged config.json, a model keyword, a bad device or a missing local folder: each a
    CheckpointError/ValueError naming the problem, never a raw AttributeError/TypeError."""
    tiny("alibi").save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    good = cfg_path.read_text()
    for text, match in (
        ("[1]", "not a JSON object"),
        ("{bad", "not valid JSON"),
        (json.dumps({**json.loads(good), "n_layer": "1"}), "n_layer must be an integer"),
    ):
        cfg_path.write_text(text)
        with pytest.raises(CheckpointError, match=match):
            GPT.from_pretrained(tmp_path)
    cfg_path.write_text(good)
    with pytest.raises(ValueError, match="takes no model settings"):
        GPT.from_pretrained(tmp_path, n_layer=5)
    with pytest.raises(ValueError, match="not a device"):
        GPT.from_pretrained(tmp_path, map_location="bogus")
    with pytest.raises(CheckpointError, match="no such directory"):
        GPT.from_pretrained(tmp_path / "missing")


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"d_model": 16.0}, "d_model must be an integer"),
        ({"n_layer": True}, "n_layer must be an integer"),
        ({"absolute_position_embedding": "no"}, "true or false"),
        ({"encoding_options": None}, "must be dicts"),
        ({"dropout": "0.1"}, "dropout must be a number"),
        ({"position_encoding": "fire", "encoding_options": {"init_L": 0}}, "init_L"),
        ({"position_encoding": "kerple_log", "encoding_options": {"init_r1": float("nan")}}, "r1 > 0"),
        ({"position_encoding": "rope", "encoding_options": {"rope_theta": float("nan")}}, "rope_theta"),
    ],
)
def test_config_validate_checks_types_and_option_values(fields, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**fields).validate()


def test_config_validate_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    GPTConfig(position_encoding="kerple_log").validate()  # builds (and drops) an encoding that draws r1, r2
    assert torch.equal(state, torch.get_rng_state())


# -- attention probabilities handed out by the model (GPT.capture_attention) -------------------
def _attn_io(model, layer):
    """Hooks keeping ``layer``'s attention input x and output of each call: ``(seen, remove)``."""
    seen = {"x": [], "out": []}
    attn = model.blocks[layer].attn
    handles = [
        attn.register_forward_pre_hook(lambda m, a: seen["x"].append(a[0])),
        attn.register_forward_hook(lambda m, a, out: seen["out"].append(out)),
    ]
    return seen, lambda: [h.remove() for h in handles]


def _through_values(attn, x, probs):
    """probs [B, H, Q, keys] · V through the output projection: [B, Q, d_model]."""
    B, T, d = x.shape
    v = attn.qkv(x).view(B, T, 3, attn.n_head, attn.head_dim)[:, :, 2].transpose(1, 2)  # [B, H, T, hd]
    return attn.proj((probs @ v).transpose(1, 2).reshape(B, probs.shape[2], d))


@pytest.mark.parametrize("name", ["fire", "rope", "alibi", "nope", "kerple_log", "t5"])
@pytest.mark.parametrize("block", [1024, 7])  # one attention call with a precomputed mask, or query blocks
def test_captured_probabilities_reproduce_the_modules_output_and_leave_the_forward_unchanged(name, block):
    model = tiny(name, block=block)
    idx = torch.randint(0, 257, (2, 23), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(idx)
        seen, remove = _attn_io(model, 1)
        with model.capture_attention(layers=[1]) as cap:
            captured = model(idx)
        remove()
    assert torch.equal(plain, captured)  # bit for bit: the capture computes beside the forward
    rec = cap[1]
    assert rec.probs.shape == (2, 2, 23, 23) and rec.probs.dtype == torch.float32 and 0 not in cap.records
    assert rec.queries.tolist() == list(range(23)) and rec.content is None and rec.bias is None
    torch.testing.assert_close(rec.probs.sum(-1), torch.ones(2, 2, 23))
    assert torch.equal(rec.probs.triu(1), torch.zeros_like(rec.probs))  # causal
    attn = model.blocks[1].attn
    with torch.no_grad():
        torch.testing.assert_close(_through_values(attn, seen["x"][0], rec.probs), seen["out"][0], atol=1e-5, rtol=1e-4)
        some = model.attention_probs(idx, layers=[0, 1], queries=[3, 11, 10, 22], logits=True)
    assert some[1].queries.tolist() == [3, 10, 11, 22]
    torch.testing.assert_close(some[1].probs, rec.probs[:, :, [3, 10, 11, 22]])
    logits = some[0].content + (some[0].bias if some[0].bias is not None else 0.0)
    if some[0].bias is None:  # rotary / NoPE: the causal mask is the only addition
        assert name in ("rope", "nope")
        logits = logits.masked_fill(torch.arange(23)[None, :] > some[0].queries[:, None], float("-inf"))
    torch.testing.assert_close(some[0].probs, torch.softmax(logits, -1))
    assert all(b.attn.capture is None for b in model.blocks)


def test_capture_with_a_kv_cache_records_the_new_queries_over_all_keys():
    model = tiny("fire")
    idx = torch.randint(0, 257, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model.attention_probs(idx, layers=1)[1].probs
        cache = KVCache(2)
        model(idx[:, :12], cache)
        with model.capture_attention(layers=1) as cap:
            model(idx[:, 12:], cache)
    assert cap[1].queries.tolist() == list(range(12, 20)) and cap[1].probs.shape == (1, 2, 8, 20)
    torch.testing.assert_close(cap[1].probs, full[:, :, 12:], atol=1e-6, rtol=1e-5)


def test_attention_probs_stops_after_the_last_layer_asked_for_and_restores_the_mode():
    model = tiny("alibi").train()
    idx = torch.randint(0, 257, (1, 16))
    ran = []
    handles = [b.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, b in enumerate(model.blocks)]
    handles.append(model.ln_f.register_forward_hook(lambda m, a, o: ran.append("ln_f")))
    cap = model.attention_probs(idx, layers=0)
    assert ran == [0] and list(cap.records) == [0] and model.training
    for h in handles:
        h.remove()
    model.eval()
    with torch.no_grad():  # the residual stream is the forward's own, bit for bit
        assert torch.equal(model.lm_head(model.ln_f(model.hidden_states(idx))), model(idx))
        assert torch.equal(model.hidden_states(idx, 0), model.blocks[0](model.wte(idx), model.encoding(0), 0))
    for bad in (2, -1, True, [0]):
        with pytest.raises(ValueError, match="block index"):
            model.hidden_states(idx, bad)


def test_capture_state_is_cleaned_up_after_an_exception_and_bad_requests_are_refused():
    model = tiny("rope")
    idx = torch.randint(0, 257, (1, 10))

    def clean():
        return all(b.attn.capture is None for b in model.blocks)

    with pytest.raises(KeyError):
        with model.capture_attention(layers=[0, 1]):
            assert not clean()
            raise KeyError("the caller's own error")
    assert clean()
    with pytest.raises(ValueError, match="token ids"), model.capture_attention():
        model(torch.full((1, 4), 300))  # refused by the forward pass itself
    assert clean()
    with pytest.raises(ValueError, match="query positions 0..9"), model.capture_attention(queries=[4, 12]):
        model(idx)  # a query the pass does not hold: refused in layer 0's attention call
    assert clean()
    with pytest.raises(RuntimeError, match="already capturing"), model.capture_attention():
        with model.capture_attention(layers=1):
            pass
    assert clean()
    for bad in ({"layers": [2]}, {"layers": []}, {"layers": [True]}, {"queries": [-1]}, {"queries": [1.5]}):
        with pytest.raises(ValueError):
            with model.capture_attention(**bad):
                pass
    assert clean()
    model.train()  # a capture under training: gradients flow through the forward as before
    with model.capture_attention() as cap:
        F.cross_entropy(model(idx[:, :-1]).reshape(-1, 257), idx[:, 1:].reshape(-1)).backward()
    assert not cap[0].probs.requires_grad and model.blocks[0].attn.qkv.weight.grad is not None and clean()


# -- captures and threads, edge inputs (the app shares one model per checkpoint between sessions) --
def test_two_threads_capture_one_model_at_once_each_recording_only_its_own_passes():
    import threading

    model = tiny("alibi")
    xs = [torch.randint(0, 257, (1, n), generator=torch.Generator().manual_seed(n)) for n in (9, 14)]
    refs = [model.attention_probs(x, layers=[0, 1]) for x in xs]
    errors, results = [], {0: [], 1: []}

    def worker(k):
        try:
            for _ in range(60):
                cap = model.attention_probs(xs[k], layers=[0, 1])
                results[k].append(all(torch.equal(cap[i].probs, refs[k][i].probs) for i in (0, 1)))
        except Exception as e:  # noqa: BLE001 - any error fails the test below
            errors.append(e)

    run_interleaved(worker, (0, 1))
    assert not errors and all(results[0]) and all(results[1]) and len(results[0]) == len(results[1]) == 60
    assert all(b.attn.capture is None for b in model.blocks)

    # A capture open in thread A: thread B's plain pass (and B's own capture) neither conflict nor get recorded.
    opened, b_done = threading.Event(), threading.Event()
    seen = {}

    def other_thread():
        opened.wait(10)
        with torch.no_grad():
            seen["plain"] = model(xs[1])
        with model.capture_attention(layers=0) as mine:  # a capture of the same model at the same time
            with torch.no_grad():
                model(xs[1])
        seen["b"], seen["b_capture_in_a"] = mine, None
        b_done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with model.capture_attention(layers=[0, 1]) as cap:
        opened.set()
        assert b_done.wait(10)
        assert cap.records == {}  # B's passes were not recorded here
        with torch.no_grad():
            model(xs[0])
    t.join()
    assert cap[0].probs.shape == (1, 2, 9, 9) and seen["b"][0].probs.shape == (1, 2, 14, 14)
    torch.testing.assert_close(seen["b"][0].probs, refs[1][0].probs)
    with torch.no_grad():
        assert torch.equal(seen["plain"], model(xs[1]))
    with model.capture_attention(), pytest.raises(RuntimeError, match="already capturing attention in this thread"):
        model.attention_probs(xs[0])  # nesting within one thread stays an error


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"layers": 1.0}, r"layers must be block indices .* \(got 1.0 of type float\)"),
        ({"layers": torch.tensor([0.0, 1.0])}, r"layers must be .*got a 1-D torch.float32 Tensor"),
        ({"layers": torch.tensor([[0, 1]])}, r"layers must be .*got a 2-D"),
        ({"layers": "01"}, r"layers must be .*'01' of type str"),
        ({"layers": True}, r"layers must be .*True of type bool"),
        ({"layers": [0, 2]}, r"layers must be block indices in 0..1, at least one \(got layer 2\)"),
        ({"layers": []}, r"layers .*an empty selection"),
        ({"queries": [10**30]}, r"queries must be query positions, integers in 0..2\*\*63 − 1"),
        ({"queries": [1.5]}, r"queries must be .*1.5 of type float"),
        ({"queries": "3"}, r"queries must be .*of type str"),
        ({"queries": torch.tensor([[1, 2]])}, r"queries must be .*got a 2-D"),
        ({"queries": 5.0}, r"queries must be .*5.0 of type float"),
        ({"logits": "no"}, r"logits must be True or False \(got 'no' of type str\)"),
        ({"logits": 1}, r"logits must be True or False"),
    ],
)
def test_capture_arguments_of_the_wrong_kind_are_one_clear_value_error(kwargs, match):
    model = tiny("fire")
    idx = torch.randint(0, 257, (1, 8))
    with pytest.raises(ValueError, match=match):
        model.attention_probs(idx, **kwargs)
    with pytest.raises(ValueError, match=match):
        with model.capture_attention(**kwargs):
            pass
    assert all(b.attn.capture is None for b in model.blocks)


def test_capture_takes_ints_tensors_arrays_and_iterables_and_checks_idx():
    import numpy as np

    model = tiny("rope")
    idx = torch.randint(0, 257, (2, 12), generator=torch.Generator().manual_seed(5))
    ref = model.attention_probs(idx)
    for layers in (1, np.int64(1), torch.tensor(1), torch.tensor([1]), np.array([1]), range(1, 2), {1}, iter([1])):
        cap = model.attention_probs(idx, layers=layers)
        assert list(cap.records) == [1] and torch.equal(cap[1].probs, ref[1].probs)
    for queries in (5, [5], torch.tensor(5), torch.tensor([5]), np.array([5]), range(5, 6), np.int32(5)):
        rec = model.attention_probs(idx, layers=[0, 1], queries=queries)[0]
        assert rec.queries.tolist() == [5]
        torch.testing.assert_close(rec.probs, ref[0].probs[:, :, 5:6])  # one row's GEMM: rounding
    assert model.attention_probs(idx.int(), layers=0)[0].probs.shape == (2, 2, 12, 12)  # int32 ids too
    for bad, match in (
        (idx[0], r"idx must be token ids, an int64 tensor \[batch, pos\] \(got a 1-D .*idx\[None\]"),
        (idx.float(), "idx must be token ids.*torch.float32"),
        (idx[:, :0], r"idx holds no tokens \(shape \(2, 0\)\)"),
        (idx.tolist(), "idx must be token ids.*got list"),
    ):
        with pytest.raises(ValueError, match=match):
            model.attention_probs(bad)
    cap = model.attention_probs(idx, layers=[0])
    with pytest.raises(KeyError, match=r"layer 1 was not captured: this capture records layers \[0\]"):
        cap[1]
    with model.capture_attention(layers=[0, 1]) as open_cap:
        with pytest.raises(KeyError, match="layer 1 has not run under this capture yet"):
            open_cap[1]


def test_records_hold_the_probabilities_before_dropout_and_say_so():
    model = tiny("alibi", dropout=0.5).train()
    idx = torch.randint(0, 257, (1, 10))
    with model.capture_attention(layers=0) as cap:
        model(idx)
    assert cap[0].dropout == 0.5 and model.training
    torch.testing.assert_close(cap[0].probs.sum(-1), torch.ones(1, 2, 10))  # before dropout: rows sum to 1
    assert model.attention_probs(idx, layers=0)[0].dropout == 0.0 and model.training  # eval for the pass
    model.eval()
    assert model.attention_probs(idx, layers=0)[0].dropout == 0.0 and not model.training


@pytest.mark.parametrize(
    "fields,match",
    [
        (
            {"position_encoding": "fire", "encoding_options": {"progressive_interpolation": float("nan")}},
            "true or false",
        ),
        ({"position_encoding": "fire", "encoding_options": {"log_transform": 1}}, "true or false"),
        ({"position_encoding": "t5", "encoding_options": {"bidirectional": "no"}}, "true or false"),
        (
            {"position_encoding": "fire", "encoding_options": {"init_c": float("nan")}},
            "init_c of 'fire' must be finite",
        ),
        ({"position_encoding": "fire", "encoding_options": {"normalizer_cap": float("inf")}}, "must be finite"),
        ({"position_encoding": "t5", "encoding_options": {"max_distance": float("nan")}}, "max_distance"),
        ({"position_encoding": "fire", "encoding_options": {"init_L": True}}, "not true/false"),
        ({"position_encoding": "fire", "encoding_options": {"normalizer_cap": True}}, "not true/false"),
        ({"config_format": True}, "config_format must be 1 or 2"),
        ({"config_format": float("nan")}, "config_format must be 1 or 2"),
        ({"config_format": 10**30}, "config_format must be 1 or 2"),
    ],
)
def test_config_validate_refuses_nan_inf_and_bools_in_encoding_options(fields, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**fields).validate()
    assert GPTConfig(position_encoding="fire", encoding_options={"init_L": 128, "log_transform": False}).validate()


@pytest.mark.parametrize("ref", ["fire", "no_such_checkpoint"])
def test_from_pretrained_refuses_a_bare_name_at_once_without_the_hub(ref, tmp_path, monkeypatch):
    """A bare name is a typo or a bundled checkpoint's name, never a Hub repo id ('owner/name'):
    refused at once, naming the bundled folders, instead of ~20 s of offline Hub retries."""
    import huggingface_hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    with pytest.raises(CheckpointError, match=r"not a checkpoint folder .*checkpoints/, e\.g\. checkpoints/fire"):
        GPT.from_pretrained(ref)


def test_from_pretrained_refuses_a_missing_child_of_a_local_folder(tmp_path, monkeypatch):
    import huggingface_hub

    (tmp_path / "checkpoints").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    with pytest.raises(CheckpointError, match="checkpoints/fier is not a checkpoint folder"):
        GPT.from_pretrained("checkpoints/fier")


@pytest.mark.parametrize("name", ["fire", "fire_s", "alibi", "t5", "kerple_power", "sandwich"])
def test_blocked_inference_reuses_one_mask_buffer_with_the_same_output(name, monkeypatch):
    """Without autograd the query blocks' masks are views of one buffer per layer call
    (fireviz.scratch): the output is that of one block, bit for bit that of fresh masks."""
    import contextlib

    import fireviz.model.gpt as model_module
    from fireviz.core import scratch

    one, blocked = tiny(name, block=1024), tiny(name, block=6)
    blocked.load_state_dict(one.state_dict())
    idx = torch.randint(0, 257, (2, 40))
    views = []
    real_output = scratch.mask_output

    def counting_output(shape, device="cpu"):
        out = real_output(shape, device)
        views.append(out._base is not None)
        return out

    monkeypatch.setattr(scratch, "mask_output", counting_output)
    for module in ("fireviz.encodings.base", "fireviz.encodings.fire"):
        monkeypatch.setattr(f"{module}.mask_output", counting_output)
    with torch.no_grad():
        expected, reused = one(idx), blocked(idx)
        monkeypatch.setattr(model_module, "reuse_mask_memory", lambda *a, **k: contextlib.nullcontext())
        fresh = blocked(idx)
    assert any(views), "no mask went into the reused buffer"
    assert torch.allclose(expected, reused, atol=1e-5)
    assert torch.equal(reused, fresh)


def test_mask_output_reuses_only_without_autograd_and_per_thread():
    import threading

    from fireviz.core import scratch

    assert scratch.mask_output((2, 3)).shape == (2, 3)  # no buffer: a new tensor
    with scratch.reuse_mask_memory(12):
        with torch.no_grad():
            a = scratch.mask_output((2, 3))
            b = scratch.mask_output((3, 4))
            assert a._base is not None and a.data_ptr() == b.data_ptr()  # the same memory
            assert scratch.mask_output((13,))._base is None  # too large: its own
        assert scratch.mask_output((2, 3))._base is None  # autograd on: never shared
        seen = []

        def other_thread():
            with torch.no_grad():
                seen.append(scratch.mask_output((2, 3))._base)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert seen == [None]  # another thread has no buffer
    with torch.no_grad():
        assert scratch.mask_output((2, 3))._base is None  # the block ended
