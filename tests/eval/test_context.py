"""Mode "context" (context use): fixed targets — the last K of each document's first M tokens —
scored with c … c + s − 1 tokens of context at every context length c (full, c = M − K: the whole
prefix); its plan, cache key, scoring against a direct computation, the paired difference against
full context, the CLI and one clear error per bad setting."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fireviz.eval.evaluation as ev
from fireviz.checkpoints import load_model
from fireviz.cli import eval as eval_cli
from fireviz.data.corpus import document_tokens, load_documents
from fireviz.eval import cache as eval_cache
from fireviz.eval import windows
from fireviz.eval.settings import EvalSettings
from fireviz.model.gpt import GPT, GPTConfig

#: documents (tokens, BOS included): 12 hold M = 32 tokens (bootstrap intervals need 10), one does not
DOC_TOKENS = [33, 40, 32, 45, 36, 50, 34, 38, 41, 47, 35, 60, 20]
M, K, S = 32, 8, 3  # K not a multiple of S: the last block of targets is a partial one


def _text(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefgh ijklmnop\nqrstuvwxyz.,") for _ in range(n_bytes))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "ctx.jsonl"
    with open(path, "w") as f:
        for i, n in enumerate(DOC_TOKENS):
            f.write(json.dumps({"id": f"d{i:02d}", "text": _text(n - 1, seed=i)}) + "\n")
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Tiny checkpoints with sharp attention (positions matter): ALiBi, and FIRE with query blocks of 8."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for k, (enc, kw) in enumerate((("alibi", {}), ("fire", {"attn_query_block": 8}))):
        torch.manual_seed(k)
        model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, position_encoding=enc, **kw)).eval()
        with torch.no_grad():
            for p in model.encodings.parameters():
                p.add_(0.3 * torch.randn_like(p))
            for block in model.blocks:
                block.attn.qkv.weight.mul_(10.0)
            model.wte.weight.mul_(10.0)
        model.save_pretrained(root / enc)
        out[enc] = root / enc
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "default-cache"))  # never the user's cache
    return tmp_path / "cache"


def _context_kw(**kw) -> dict:
    return dict(mode="context", prefix_tokens=M, context_targets=K, stride=S, split="all", device="cpu", **kw)


# ---------------------------------------------------------------------------------------------
# the plan: the same targets at every context length, each with c … c + s − 1 tokens before it
# ---------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 90), min_size=1, max_size=8),
    prefix=st.integers(4, 80),
    targets=st.integers(1, 40),
    stride=st.integers(1, 12),
    contexts=st.lists(st.integers(2, 80), min_size=1, max_size=4),
    budget=st.none() | st.integers(1, 200),
)
def test_context_plan_scores_identical_targets_at_every_context_length(
    sizes, prefix, targets, stride, contexts, budget
):
    ids = [f"d{i:02d}" for i in range(len(sizes))]
    if not 1 <= targets <= prefix - 2:
        with pytest.raises(windows.EvaluationError, match="context_targets .* does not fit the prefix"):
            windows.plan_context(ids, sizes, contexts, prefix_tokens=prefix, targets=targets, stride=stride)
        return
    full = prefix - targets
    contexts = [c for c in contexts if c + max(stride, targets) <= prefix] + [full]
    if max(sizes) < prefix:
        with pytest.raises(windows.EvaluationError, match="no document has"):
            windows.plan_context(ids, sizes, contexts, prefix_tokens=prefix, targets=targets, stride=stride)
        return
    plan = windows.plan_context(
        ids, sizes, contexts, prefix_tokens=prefix, targets=targets, stride=stride, token_budget=budget
    )
    assert plan.full == full and plan.documents_skipped == sum(1 for n in sizes if n < prefix)
    assert all(sizes[d] >= prefix for d in plan.documents)
    if budget is None:
        assert len(plan.documents) == len(sizes) - plan.documents_skipped
    expected = sorted((d, t) for d in plan.documents for t in range(prefix - targets, prefix))
    for c in dict.fromkeys(contexts):
        n = plan.window_tokens[c]
        assert n == (prefix if c == full else c + stride)
        scored = []
        for w in plan.windows[c]:
            assert 0 <= w.start and w.start + n <= prefix  # inside the document's first M tokens
            for p in range(w.first_target, n):  # window position p: p tokens of context before it
                scored.append((w.doc, w.start + p))
                if c == full:
                    assert w.start == 0  # the whole prefix
                else:
                    assert c <= p < c + stride
        assert sorted(scored) == expected  # every target exactly once, the same set at every c


def test_context_windows_by_hand():
    """M = 32, K = 8, s = 3: blocks 24–26, 27–29 and the partial 30–31."""
    assert windows.context_windows(32, 8, 3, 4) == (7, [(20, 4), (23, 4), (25, 5)])
    assert windows.context_windows(32, 8, 3, 24) == (32, [(0, 24)])  # full: the whole prefix
    assert windows.context_windows(32, 8, 4, 10) == (14, [(14, 10), (18, 10)])


# ---------------------------------------------------------------------------------------------
# settings and the cache key
# ---------------------------------------------------------------------------------------------
def _key(lengths, n, prefix, **kw):
    s = EvalSettings.make("prose", lengths, device="cpu", **kw)
    return eval_cache.cache_key("0" * 64, "f" * 64, s.length_settings(n, prefix, None, False))


def test_context_settings_defaults_and_cache_key():
    s = EvalSettings.make("prose", None, mode="context", device="cpu")
    assert s.lengths == (128, 256, 512, 1024, 2048, 4096, 8192 - 256)
    assert (s.prefix_tokens, s.context_targets, s.stride, s.token_budget) == (8192, 256, 64, None)
    assert EvalSettings.make("prose", [512, "full"], mode="context", device="cpu").lengths == (512, 7936)
    # the key of mode context: its own, with M and K in it
    ctx = _key([128], 128, 8192, mode="context")
    assert ctx == "20bb41e72a0d3f733bbb8b723fdc299ac117b161debcab778cd340dfaf1fade0"
    assert ctx != _key([128, 8192], 128, 8192)  # same_text at 128 with the same prefix
    assert ctx != _key([128], 128, 8192, mode="context", context_targets=128)
    assert ctx != _key([128], 128, 8192, mode="context", stride=32)
    assert ctx != _key([128], 128, 4096, mode="context", prefix_tokens=4096)
    # the keys the other modes wrote before mode context existed (test_evaluate pins them all)
    assert _key([128, 256], 128, 8192) == "2f1ad076f1661bc70e01ce52a551654bb91405fdd890484a1ed77e298569d62d"
    sliding = dict(mode="sliding", stride=64, token_budget=1000, seed=3, position_buckets=8, split="all")
    assert _key([128, 256], 128, None, **sliding) == "ada48e9ca2b202a74e841e7d0b637de83c6fe071740ba108b34809fc401b4631"
    same = EvalSettings.make("prose", [128], device="cpu").describe()
    assert "context_targets" not in same and "context_targets" in s.describe()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(lengths=[8192]), "context length 8192 does not fit: its windows of c + s = 8256 tokens"),
        (dict(lengths=[8000]), "context length 8000 does not fit: the first targets, at position M − K = 7936"),
        (
            dict(lengths=[16], prefix_tokens=64, context_targets=8, stride=64),
            "context length 16 does not fit: its windows of c + s = 80",
        ),
        (dict(context_targets=8191), "context_targets (--context-targets) K = 8191 does not fit the prefix M = 8192"),
        (dict(context_targets=0), "context_targets (--context-targets) must be an integer >= 1"),
        (dict(context_targets=2.5), "context_targets (--context-targets) must be an integer >= 1"),
        (dict(stride=0), "stride must be an integer >= 1"),
        (dict(prefix_tokens=2), "prefix_tokens (--prefix-tokens) must be an integer >= 3"),
        (dict(mode="same_text", context_targets=64), "context_targets applies to mode='context'"),
        (dict(mode="same_text", lengths=[128, "full"]), "the length 'full' (the whole prefix M − K) is a context"),
        (dict(seed=3), "seed=3 changes nothing in mode='context'"),
    ],
)
def test_bad_context_settings_are_one_clear_error(kw, message):
    kw = {"mode": "context", **kw}
    lengths = kw.pop("lengths", None)
    with pytest.raises(ev.EvaluationError, match=re.escape(message)):
        EvalSettings.make("prose", lengths, device="cpu", **kw)


def test_bad_context_settings_are_refused_before_any_work(ckpts, corpus, cache):
    with pytest.raises(ev.EvaluationError, match=re.escape("context length 40 does not fit")):
        ev.evaluate_many([ckpts["alibi"]], corpus, [4, 40], cache_dir=cache, **_context_kw())
    assert not cache.exists()
    with pytest.raises(ev.EvaluationError, match="no document has 100 tokens"):
        ev.evaluate_many([ckpts["alibi"]], corpus, [4], cache_dir=cache, **{**_context_kw(), "prefix_tokens": 100})


# ---------------------------------------------------------------------------------------------
# end to end: per-document losses equal a direct computation; − full; pairing; cache; CLI
# ---------------------------------------------------------------------------------------------
def _direct(model: GPT, corpus: Path, c: int) -> dict[str, tuple[float, int, list[int]]]:
    """Per document: summed nats of its targets M − K … M − 1 and their count, scored by hand on
    the windows of context length ``c`` (each target with c … c + s − 1 tokens before it; full: all)."""
    out = {}
    for d in sorted(load_documents(corpus), key=lambda d: d.id):
        toks = document_tokens(d)
        if len(toks) < M:
            continue
        nats, positions = 0.0, []
        for t0 in range(M - K, M, S):  # blocks of S targets, the last one partial
            t1 = min(t0 + S, M)
            start = 0 if c == M - K else t1 - c - S
            window = toks[start:t1] if c != M - K else toks[:M]
            with torch.no_grad():
                logits = model(window[None])[0]
            nll = F.cross_entropy(logits[:-1].float(), window[1:], reduction="none")
            for t in range(t0, t1):
                p = t - start  # window position of target t: p tokens before it
                assert p >= c and (c == M - K or p < c + S)
                nats += float(nll[p - 1])
                positions.append(t)
        out[d.id] = (nats, len(positions), positions)
    return out


def test_context_end_to_end_equals_a_direct_computation(ckpts, corpus, cache, monkeypatch):
    contexts = [4, 10, M - K]
    r = ev.evaluate_many([ckpts["alibi"], ckpts["fire"]], corpus, [4, 10, "full"], cache_dir=cache, **_context_kw())
    s = r[0]["settings"]
    assert s["mode"] == "context" and s["lengths"] == contexts
    assert (s["prefix_tokens"], s["context_targets"], s["full_context"], s["stride"]) == (M, K, M - K, S)
    assert (s["documents_scored"], s["documents_skipped"]) == (12, 1)
    for res, name in zip(r, ("alibi", "fire"), strict=True):
        model = load_model(ckpts[name]).eval()
        entries = {e["length"]: e for e in res["per_length"]}
        for c in contexts:
            e = entries[c]
            direct = _direct(model, corpus, c)
            assert e["per_document"]["doc"] == list(direct)
            assert e["per_document"]["tokens"] == [v[1] for v in direct.values()] == [K] * 12
            assert e["per_document"]["nats"] == pytest.approx([v[0] for v in direct.values()], rel=1e-5, abs=1e-6)
            assert e["tokens_scored"] == 12 * K and e["documents"] == 12
            assert e["window_tokens"] == (M if c == M - K else c + S)
            assert e["windows"] == 12 * (1 if c == M - K else math.ceil(K / S))
            lo, hi = e["ci95"]
            assert lo <= e["bits_per_byte"] <= hi
        # − full: bpb at c minus bpb at full, paired over documents; none at full itself
        assert "full_delta_bpb" not in entries[M - K]
        for c in contexts[:-1]:
            e = entries[c]
            assert e["full_context"] == M - K
            assert e["full_delta_bpb"] == pytest.approx(e["bits_per_byte"] - entries[M - K]["bits_per_byte"], abs=1e-9)
            lo, hi = e["full_ci95"]
            assert lo <= e["full_delta_bpb"] <= hi
    # paired against the reference checkpoint as in the other modes
    for a, b in zip(r[0]["per_length"], r[1]["per_length"], strict=True):
        assert b["paired_reference"] == "alibi"
        assert b["paired_delta_bpb"] == pytest.approx(b["bits_per_byte"] - a["bits_per_byte"], abs=1e-9)
    json.dumps(r, allow_nan=False)
    # a second run is served from the cache, − full and pairing recomputed from it
    monkeypatch.setattr(ev, "score_windows", lambda *a, **k: pytest.fail("scored again"))
    again = ev.evaluate_many([ckpts["alibi"], ckpts["fire"]], corpus, [4, 10, "full"], cache_dir=cache, **_context_kw())
    assert all(e["cached"] and e["source"] == "cache" for res in again for e in res["per_length"])
    assert [e.get("full_delta_bpb") for e in again[1]["per_length"]] == [
        e.get("full_delta_bpb") for e in r[1]["per_length"]
    ]
    found = ev.cached_results(
        [ckpts["alibi"], ckpts["fire"]], corpus, [4, 10, "full"], cache_dir=cache, **_context_kw()
    )
    assert found[1]["per_length"][0]["full_delta_bpb"] == r[1]["per_length"][0]["full_delta_bpb"]
    # the same_text entries of these documents are other keys: nothing of mode context is served there
    plain = ev.cached_results([ckpts["alibi"]], corpus, [4, 10], cache_dir=cache, split="all", device="cpu")
    assert all(e.get("not_computed") for e in plain[0]["per_length"])


def test_context_progress_counts_every_target_and_cancel_stops(ckpts, corpus, cache):
    seen = []
    ev.evaluate_many(
        [ckpts["alibi"]],
        corpus,
        [4, "full"],
        cache_dir=cache,
        progress=lambda d, t, m: seen.append((d, t)),
        **_context_kw(),
    )
    assert seen[-1][0] == seen[-1][1]  # done: every target counted
    with pytest.raises(ev.EvaluationCancelled):
        ev.evaluate_many([ckpts["fire"]], corpus, [4], cache_dir=cache, should_stop=lambda: True, **_context_kw())


def test_cli_context_table(ckpts, corpus, tmp_path, cache, capsys):
    args = [str(ckpts["alibi"]), str(ckpts["fire"]), "--data", str(corpus), "--split", "all", "--mode", "context"]
    args += ["--prefix-tokens", str(M), "--context-targets", str(K), "--stride", str(S), "--lengths", "4,full"]
    assert eval_cli.main(args + ["--cache-dir", str(cache), "--quiet", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "context use — the last K = 8 of the first M = 32 tokens (positions 24 … 31) of each of 12 documents" in out
    assert "(1 shorter one skipped): 96 targets, the same at every context length c" in out
    head = next(line for line in out.splitlines() if line.startswith("checkpoint"))
    assert "context c" in head and "− full [95 %]" in head and "− alibi [95 %]" in head
    saved = json.loads((tmp_path / "r.json").read_text())
    fire4 = saved[1]["per_length"][0]
    row = next(line for line in out.splitlines() if line.startswith("fire ") and " 4 " in line)
    assert f"{fire4['bits_per_byte']:.3f}" in row and f"{fire4['full_delta_bpb']:+.4f}" in row
    assert f"{fire4['paired_delta_bpb']:+.4f}" in row
    assert "24 (full)" in out
    assert eval_cli.main(args[:-2] + ["--lengths", "40", "--cache-dir", str(cache), "--quiet"]) == 2
    assert "context length 40 does not fit" in capsys.readouterr().err
    help_text = eval_cli.build_parser().format_help()
    assert "--context-targets" in help_text and "context answers only whether more context helps" in help_text


# ---------------------------------------------------------------------------------------------
# the Length generalization page: the context-use curve beside the same-text curve
# ---------------------------------------------------------------------------------------------
def test_page_draws_context_use_beside_same_text(app_env):
    import time

    from plotly_data import decode
    from streamlit.testing.v1 import AppTest

    docs = [{"id": f"d{k}", "text": _text(40 + 3 * k, seed=k)} for k in range(5)]
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "pages/3_Length_generalization.py"))
    at.default_timeout = 60
    query = dict(domain="upload", ckpt=["alibi", "fire"], len=["8", "16", "32"], mode="context")
    query.update(ctx=["4", "8", "full"], ctxm="32", ctxk="8", cstride="4")
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.sidebar.file_uploader(key="lengen_upload").upload(
        "ctx.jsonl", "".join(json.dumps(d) + "\n" for d in docs).encode()
    ).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.radio(key="lengen_mode").value == "context"
    at.button(key="lengen_run").click()
    end = time.time() + 120
    at.run()
    while not (len(at.get("plotly_chart")) >= 3 and at.dataframe) and time.time() < end:
        assert not at.exception, [e.value for e in at.exception]
        time.sleep(0.25)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    titles = [f["layout"]["title"]["text"] for f in figs]
    assert titles[0].startswith("Perplexity vs evaluation length") and titles[1].startswith("Context use")
    xs = sorted({int(x) for tr in figs[1]["data"] for x in decode(tr["x"])})
    assert xs == [4, 8, 24]
    captions = [c.value for c in at.caption]
    assert CONTEXT_SENTENCE in captions and SAME_TEXT_SENTENCE in captions  # one sentence under each curve
    table = at.dataframe[0].value
    assert set(table["context"]) == {"4", "8", "full (24)"}
    assert table[table["context"] == "full (24)"]["minus_full"].isna().all()
    upload = next(Path(p) for p in (Path(eval_cache.default_cache_dir()) / "uploads").rglob("ctx.jsonl"))
    direct = ev.evaluate_many(
        [str(app_env / "alibi"), str(app_env / "fire")],
        str(upload),
        [4, 8, "full"],
        mode="context",
        prefix_tokens=32,
        context_targets=8,
        stride=4,
        split="all",
        device="cpu",
    )
    assert all(e["cached"] for r in direct for e in r["per_length"])  # what the page's job computed
    fire = table[table["checkpoint"] == "fire"]
    assert list(fire["bits_per_byte"]) == pytest.approx([e["bits_per_byte"] for e in direct[1]["per_length"]])
    assert fire["minus_full"].iloc[0] == pytest.approx(direct[1]["per_length"][0]["full_delta_bpb"])


SAME_TEXT_SENTENCE = "Same text: how the score of a text changes when it is cut into windows of n tokens."
CONTEXT_SENTENCE = "Context use: how the score of fixed targets changes with c tokens of context before them."
