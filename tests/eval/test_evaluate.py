"""fireviz.evaluate: window selection, scoring against a hand computation, cache, CLI, bad input."""

from __future__ import annotations

import io
import json
import math
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fireviz.checkpoints as fireviz_checkpoints
import fireviz.eval.evaluation as ev
from fireviz.checkpoints import catalog as checkpoints
from fireviz.cli import eval as eval_cli
from fireviz.data.corpus import DataError, document_tokens, is_validation, load_documents
from fireviz.eval import cache as eval_cache
from fireviz.eval import device as eval_device
from fireviz.eval import missing_interval_note, stats, windows
from fireviz.eval import settings as eval_settings
from fireviz.model.gpt import BOS_ID, GPT, CheckpointError, GPTConfig
from fireviz.model.state import load_state_checked

# the repository's reference values (tests/reference/encodings.json; see tests/encodings/test_encodings.py)
REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "encodings.json"
# Document sizes in tokens (bytes + BOS). Lengths 8 and 16 see several documents; 64 sees one.
DOC_TOKENS = [41, 34, 16, 9, 5, 64, 23]


def _text(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefgh ijklmnop\nqrstuvwxyz.,") for _ in range(n_bytes))


def _write_jsonl(path: Path, sizes: list[int], prefix: str = "d") -> Path:
    with open(path, "w") as f:
        for i, n in enumerate(sizes):
            f.write(json.dumps({"id": f"{prefix}{i:02d}", "text": _text(n - 1, seed=i)}) + "\n")
    return path


def _tiny(encoding: str, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, position_encoding=encoding, **kw)).eval()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Tiny checkpoints: FIRE (query blocks of 8 to exercise the blocked path), RoPE, ALiBi."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for enc, kw in (("fire", {"attn_query_block": 8}), ("rope", {}), ("alibi", {})):
        model = _tiny(enc, seed=len(out), **kw)
        with torch.no_grad():  # sharp attention and a non-trivial bias, so positions matter
            for p in model.encodings.parameters():
                p.add_(0.3 * torch.randn_like(p))
            for block in model.blocks:
                block.attn.qkv.weight.mul_(10.0)
            model.wte.weight.mul_(10.0)
        model.save_pretrained(root / enc)
        out[enc] = root / enc
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write_jsonl(tmp_path_factory.mktemp("data") / "tiny.jsonl", DOC_TOKENS)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "default-cache"))  # never the user's cache
    return tmp_path / "cache"


def _targets(windows, length):
    """Document positions scored by (start, first_target) windows."""
    return [s + p for s, f in windows for p in range(f, length)]


# ---------------------------------------------------------------------------------------------
# window selection: the token-count property
# ---------------------------------------------------------------------------------------------
def test_reference_token_count():
    ref = json.loads(REFERENCE.read_text())["perplexity_token_count"]
    wins = windows.sliding_windows(ref["N"], ref["window"], ref["stride"])
    targets = _targets(wins, ref["window"])
    assert len(targets) == ref["scored_tokens"] == 9
    assert sorted(targets) == list(range(1, ref["N"]))
    assert wins == [(0, 1), (2, 2), (4, 2), (6, 2)]


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 300), st.integers(2, 64), st.data())
def test_sliding_scores_every_token_once(n_tokens, window, data):
    window = min(window, n_tokens)
    stride = data.draw(st.integers(1, window - 1)) if window > 2 else 1
    wins = windows.sliding_windows(n_tokens, window, stride)
    targets = _targets(wins, window)
    assert sorted(targets) == list(range(1, n_tokens)), "every token 1..N-1 exactly once"
    assert all(0 <= s and s + window <= n_tokens and 1 <= f < window for s, f in wins)
    # each later window scores at most `stride` new targets; only the tail may score fewer
    assert all(window - f == stride for _, f in wins[1:-1])


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.integers(1, 8), st.integers(0, 39))
def test_nonoverlapping_count_and_stride_equal_window(window, k, extra):
    n_tokens = window * k + extra % window
    wins = windows.nonoverlapping_windows(n_tokens, window)
    assert len(wins) == n_tokens // window
    targets = _targets(wins, window)
    assert len(targets) == len(set(targets)) == (n_tokens // window) * (window - 1)
    sliding = windows.sliding_windows(n_tokens, window, window)
    if n_tokens % window == 0:
        assert sliding == wins
    else:  # the same windows plus one tail window scoring only new targets
        assert sliding[:-1] == wins and set(_targets(sliding[-1:], window)).isdisjoint(targets)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 120), min_size=1, max_size=12),
    st.integers(2, 40),
    st.integers(1, 40),
    st.one_of(st.none(), st.integers(1, 600)),
    st.integers(0, 3),
)
def test_plan_token_budget_and_coverage(sizes, length, stride, budget, seed):
    ids = [f"doc{i}" for i in range(len(sizes))]
    eligible = [i for i, n in enumerate(sizes) if n >= length]
    if not eligible:
        with pytest.raises(ev.EvaluationError, match="no document has"):
            windows.plan_windows(ids, sizes, length, token_budget=budget, seed=seed)
        return
    # non-overlapping: whole windows until the budget, n-1 targets each
    plan = windows.plan_windows(ids, sizes, length, token_budget=budget, seed=seed)
    scored = len(plan) * (length - 1)
    available = sum(sizes[i] // length for i in eligible) * (length - 1)
    if budget is None:
        assert scored == available
    else:  # the fewest whole windows that reach the budget, or all of them
        assert scored == min(available, math.ceil(budget / (length - 1)) * (length - 1))
    assert all(w.doc in eligible and w.start % length == 0 and w.start + length <= sizes[w.doc] for w in plan)
    assert len({(w.doc, w.start) for w in plan}) == len(plan)
    assert plan == windows.plan_windows(ids, sizes, length, token_budget=budget, seed=seed)  # deterministic
    # sliding: every selected document's tokens 1..P-1 scored exactly once (P = its scored prefix)
    stride = min(stride, length)
    plan = windows.plan_windows(ids, sizes, length, mode="sliding", stride=stride, token_budget=budget, seed=seed)
    by_doc: dict[int, list[int]] = {}
    for w in plan:
        assert w.doc in eligible and w.start + length <= sizes[w.doc]
        by_doc.setdefault(w.doc, []).extend(w.start + p for p in range(w.first_target, length))
    for targets in by_doc.values():
        if stride < length:
            assert sorted(targets) == list(range(1, max(targets) + 1))
        assert len(targets) == len(set(targets))
    total = sum(len(t) for t in by_doc.values())
    if budget is None:
        assert set(by_doc) == set(eligible)
        if stride < length:
            assert total == sum(sizes[i] - 1 for i in eligible)
    elif stride < length:
        assert total >= min(budget, sum(sizes[i] - 1 for i in eligible))
        assert total < budget + length  # the last document is cut to meet the budget


def test_plan_depends_on_seed_not_order():
    sizes = [50, 70, 90, 65, 80]
    ids = ["e", "a", "d", "b", "c"]
    plan = windows.plan_windows(ids, sizes, 8, token_budget=30, seed=0)
    other = windows.plan_windows(ids, sizes, 8, token_budget=30, seed=1)
    assert plan != other
    # the same documents in another file order select the same (doc id, start) windows
    perm = [3, 0, 4, 1, 2]
    shuffled = windows.plan_windows([ids[i] for i in perm], [sizes[i] for i in perm], 8, token_budget=30, seed=0)
    assert sorted((ids[w.doc], w.start) for w in plan) == sorted((ids[perm[w.doc]], w.start) for w in shuffled)


def test_position_buckets():
    assert windows.position_buckets(8, 16) == ([1, 2, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 8])
    starts, ends = windows.position_buckets(8192, 16)
    assert starts[0] == 1 and ends[-1] == 8192 and len(starts) == 16 and starts[1:] == ends[:-1]


# ---------------------------------------------------------------------------------------------
# numbers equal a hand computation
# ---------------------------------------------------------------------------------------------
def _hand_nll(model: GPT, window: torch.Tensor) -> torch.Tensor:
    """Per-target nats for one window [n]: targets at window positions 1..n-1."""
    with torch.no_grad():
        logits = model(window[None])[0]
    return F.cross_entropy(logits[:-1], window[1:], reduction="none").double()


@pytest.mark.slow
@pytest.mark.parametrize("enc", ["fire", "rope", "alibi"])
def test_nonoverlapping_equals_hand_computation(ckpts, corpus, cache, enc):
    model = GPT.from_pretrained(str(ckpts[enc])).eval()
    docs = sorted(load_documents(corpus), key=lambda d: d.id)
    for length in (8, 32):
        nll = []
        by_pos = [[] for _ in range(length)]
        for d in docs:
            toks = document_tokens(d)
            for start in range(0, len(toks) - length + 1, length):
                x = _hand_nll(model, toks[start : start + length])
                nll.append(x)
                for p in range(1, length):
                    by_pos[p].append(float(x[p - 1]))
        expected = float(torch.cat(nll).mean())
        r = ev.evaluate_checkpoint(
            ckpts[enc],
            corpus,
            [length],
            mode="nonoverlapping",
            token_budget=None,
            split="all",
            device="cpu",
            cache_dir=cache,
            position_buckets=4,
        )
        e = r["per_length"][0]
        assert e["nats_per_token"] == pytest.approx(expected, rel=1e-6)
        assert e["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
        assert e["bits_per_byte"] == pytest.approx(expected / math.log(2), rel=1e-6)
        assert e["tokens_scored"] == sum(len(v) for v in nll) == len(nll) * (length - 1)
        assert e["windows"] == len(nll)
        lbp = e["loss_by_position"]
        for s, t, nats, count in zip(lbp["bucket_starts"], lbp["bucket_ends"], lbp["nats"], lbp["tokens"], strict=True):
            vals = [v for p in range(s, t) for v in by_pos[p]]
            assert count == len(vals) and nats == pytest.approx(sum(vals) / len(vals), rel=1e-6)


def test_sliding_equals_hand_computation(ckpts, tmp_path, cache):
    # One document of 13 tokens, window 8, stride 3: windows [0,8) → targets 1..7,
    # [3,11) → 8,9,10 (window positions 5..7), [5,13) → 11,12 (window positions 6,7).
    path = _write_jsonl(tmp_path / "one.jsonl", [13])
    model = GPT.from_pretrained(str(ckpts["fire"])).eval()
    toks = document_tokens(load_documents(path)[0])
    parts = [_hand_nll(model, toks[0:8]), _hand_nll(model, toks[3:11])[4:], _hand_nll(model, toks[5:13])[5:]]
    expected = torch.cat(parts)
    assert len(expected) == 12
    r = ev.evaluate_checkpoint(
        ckpts["fire"],
        path,
        [8],
        mode="sliding",
        stride=3,
        token_budget=None,
        split="all",
        device="cpu",
        cache_dir=cache,
        position_buckets=7,
    )
    e = r["per_length"][0]
    assert (e["tokens_scored"], e["windows"]) == (12, 3)
    assert e["nats_per_token"] == pytest.approx(float(expected.mean()), rel=1e-6)
    assert e["loss_by_position"]["tokens"] == [1, 1, 1, 1, 2, 3, 3]  # positions 1..7
    last = float((parts[0][6] + parts[1][2] + parts[2][1]) / 3)  # window position 7 in each window
    assert e["loss_by_position"]["nats"][-1] == pytest.approx(last, rel=1e-6)


def test_token_count_end_to_end_both_modes(ckpts, corpus, cache):
    kw = dict(token_budget=None, split="all", device="cpu", cache_dir=cache)
    r = ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8, 16], mode="sliding", stride=5, **kw)
    for e in r["per_length"]:
        assert e["tokens_scored"] == sum(n - 1 for n in DOC_TOKENS if n >= e["length"])
    r = ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8, 16], mode="nonoverlapping", **kw)
    for e in r["per_length"]:
        n = e["length"]
        assert e["tokens_scored"] == sum(k // n for k in DOC_TOKENS if k >= n) * (n - 1)


def test_sliding_stride_window_equals_nonoverlapping(ckpts, tmp_path, cache):
    path = _write_jsonl(tmp_path / "mult.jsonl", [16, 32, 24, 8, 40])  # multiples of the window
    kw = dict(token_budget=None, split="all", device="cpu", cache_dir=cache)
    a = ev.evaluate_checkpoint(ckpts["fire"], path, [8], mode="nonoverlapping", **kw)["per_length"][0]
    b = ev.evaluate_checkpoint(ckpts["fire"], path, [8], mode="sliding", stride=8, **kw)["per_length"][0]
    for key in ("tokens_scored", "windows"):
        assert a[key] == b[key]
    assert b["nats_per_token"] == pytest.approx(a["nats_per_token"], rel=1e-9)
    assert b["loss_by_position"]["nats"] == pytest.approx(a["loss_by_position"]["nats"], rel=1e-9)
    c = ev.evaluate_checkpoint(ckpts["fire"], path, [8], mode="sliding", stride=4, **kw)["per_length"][0]
    assert c["tokens_scored"] == sum(n - 1 for n in (16, 32, 24, 8, 40)) > a["tokens_scored"]


def test_result_shape_and_paired_windows(ckpts, corpus, cache, monkeypatch):
    seen = {}
    real = ev.score_windows

    def spy(model, doc_tokens, windows, length, **kw):
        seen.setdefault(model.config.position_encoding, []).append(
            [(w.start, doc_tokens(w.doc)[w.start : w.start + length].tolist(), w.first_target) for w in windows]
        )
        return real(model, doc_tokens, windows, length, **kw)

    monkeypatch.setattr(ev, "score_windows", spy)
    calls = []
    results = ev.evaluate_many(
        [ckpts["fire"], ckpts["rope"]],
        corpus,
        [8, 16],
        mode="nonoverlapping",
        token_budget=30,
        split="all",
        device="cpu",
        cache_dir=cache,
        progress=lambda d, t, m: calls.append((d, t)),
    )
    assert seen["fire"] == seen["rope"]  # identical windows for every checkpoint at a length
    for start, toks, _ in seen["fire"][0] + seen["fire"][1]:  # BOS opens a window iff it opens a document
        assert (toks[0] == BOS_ID) == (start == 0) and BOS_ID not in toks[1:]
    assert calls[-1][0] == calls[-1][1] > 0 and all(d <= t for d, t in calls)
    for r in results:
        assert set(r) >= {
            "checkpoint",
            "checkpoint_sha256",
            "position_encoding",
            "train_seq_len",
            "settings",
            "data_fingerprint",
            "fireviz_version",
            "device",
            "seconds",
            "per_length",
        }
        assert r["settings"]["bos"].startswith("each document starts with BOS (id 256)")
        assert {"lengths", "mode", "stride", "token_budget", "seed", "rope_scaling", "data", "split"} <= set(
            r["settings"]
        )
        assert r["device"] == "cpu" and r["train_seq_len"] == 16 and len(r["checkpoint_sha256"]) == 64
        for e in r["per_length"]:
            assert 30 <= e["tokens_scored"] < 30 + e["length"]
        json.dumps(r, allow_nan=False)
    assert results[0]["per_length"][0]["nats_per_token"] != results[1]["per_length"][0]["nats_per_token"]


# ---------------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------------
def _counting(monkeypatch):
    calls = []
    real = ev.score_windows

    def counted(model, doc_tokens, windows, length, **kw):
        calls.append(length)
        return real(model, doc_tokens, windows, length, **kw)

    monkeypatch.setattr(ev, "score_windows", counted)
    return calls


def test_cache_hit_without_recomputation(ckpts, corpus, cache, monkeypatch):
    calls = _counting(monkeypatch)
    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    first = ev.evaluate_checkpoint(ckpts["rope"], corpus, [8, 16], **kw)
    assert calls == [8, 16] and not any(e["cached"] for e in first["per_length"])
    again = ev.evaluate_checkpoint(ckpts["rope"], corpus, [8, 16], **kw)
    assert calls == [8, 16], "a repeated request must not recompute"
    assert all(e["cached"] for e in again["per_length"])

    def strip(r):
        return [{k: v for k, v in e.items() if k not in ("cached", "source")} for e in r["per_length"]]

    assert strip(again) == strip(first)
    ev.evaluate_checkpoint(ckpts["rope"], corpus, [8, 16, 32], **kw)  # a new length reuses the others
    assert calls == [8, 16, 32]
    ev.evaluate_checkpoint(ckpts["rope"], corpus, [8], **{**kw, "seed": 5})  # other settings: recompute
    assert calls == [8, 16, 32, 8]
    ev.evaluate_checkpoint(ckpts["rope"], corpus, [8], **kw, use_cache=False)
    assert calls == [8, 16, 32, 8, 8]


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "wrong_key",
        "missing_field",
        "truncated",
        "bool_tokens",
        "string_bucket",
        "inconsistent_bpb",
        "negative_loss",
        "consistent_edit",
        "unsigned",
    ],
)
def test_corrupt_cache_entry_is_recomputed(ckpts, corpus, cache, monkeypatch, damage):
    calls = _counting(monkeypatch)
    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    first = ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)["per_length"][0]
    (entry,) = list(cache.glob("*.json"))
    text = entry.read_text()
    obj = json.loads(text)
    if damage == "consistent_edit":  # every number moved together (issue #50: 2.066 -> 2.788 bpb was served)
        obj["result"] = _rescaled(obj["result"], obj["result"]["nats_per_token"] * 1.35)
        entry.write_text(json.dumps(obj))
    elif damage == "unsigned":  # an entry from before entries were signed, or with its mac removed
        del obj["mac"]
        entry.write_text(json.dumps(obj))
    elif damage == "garbage":
        entry.write_text("{not json")
    elif damage == "wrong_key":
        obj["key"] = "0" * 64
        obj["result"]["nats_per_token"] = 0.123  # a poisoned number must not come back
        entry.write_text(json.dumps(obj))
    elif damage == "missing_field":
        del obj["result"]["tokens_scored"]
        entry.write_text(json.dumps(obj))
    elif damage in ("bool_tokens", "string_bucket", "inconsistent_bpb", "negative_loss"):
        r = obj["result"]
        if damage == "bool_tokens":
            r["tokens_scored"] = True
        elif damage == "string_bucket":
            r["loss_by_position"]["nats"][0] = "x"
        elif damage == "inconsistent_bpb":
            r["bits_per_byte"] = 0.5  # no longer nats / ln 2
        else:
            r["nats_per_token"], r["perplexity"], r["bits_per_byte"] = -1.0, math.exp(-1.0), -1.0 / math.log(2)
        entry.write_text(json.dumps(obj))
    else:
        entry.write_text(text[: len(text) // 2])
    again = ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)["per_length"][0]
    assert calls == [8, 8] and again["cached"] is False
    assert again["nats_per_token"] == pytest.approx(first["nats_per_token"], rel=1e-12)
    assert ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)["per_length"][0]["cached"] is True


def _rescaled(e: dict, nats: float) -> dict:
    """A per-length entry whose mean loss is ``nats``, its per-document losses and interval scaled to match."""
    k = nats / e["nats_per_token"]
    pd = {**e["per_document"], "nats": [v * k for v in e["per_document"]["nats"]]}
    ci = [v * k for v in e["ci95"]] if e.get("ci95") else e.get("ci95")
    return {
        **e,
        "nats_per_token": nats,
        "perplexity": math.exp(nats),
        "bits_per_byte": nats / math.log(2),
        "per_document": pd,
        "ci95": ci,
    }


def test_published_results_json_is_a_read_only_cache(ckpts, corpus, tmp_path, cache, monkeypatch):
    """A checkpoint folder's results.json answers a request with the same weights, data and
    settings (how shipped checkpoints show numbers on a fresh machine), and nothing else; it is
    read in place each time, never copied into the cache."""
    import shutil

    folder = tmp_path / "alibi"
    shutil.copytree(ckpts["alibi"], folder)
    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu")
    published = ev.evaluate_checkpoint(folder, corpus, [8, 16], cache_dir=tmp_path / "publisher", **kw)
    assert published["settings"]["format"] == eval_settings.EVAL_FORMAT_VERSION
    (folder / "results.json").write_text(json.dumps([published]))
    calls = _counting(monkeypatch)
    fresh = ev.evaluate_checkpoint(folder, corpus, [8, 16], cache_dir=cache, **kw)
    assert calls == [] and all(e["cached"] for e in fresh["per_length"])

    def strip(r):
        return [{k: v for k, v in e.items() if k not in ("cached", "source")} for e in r["per_length"]]

    assert strip(fresh) == strip(published) and {e["source"] for e in fresh["per_length"]} == {"results.json"}
    assert not list(cache.glob("*.json"))  # read in place, never copied into the cache
    # publish_results.py never reads what it rewrites; then the cache answers
    assert ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=cache, use_published=False, **kw)["per_length"][0][
        "source"
    ] == "computed" and calls == [8]
    assert ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=cache, **kw)["per_length"][0]["source"] == "cache"
    ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=tmp_path / "c2", **{**kw, "seed": 3})  # other settings
    ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=tmp_path / "c3", use_cache=False, **kw)  # --no-cache
    assert calls == [8, 8, 8]
    # a stale results.json (other format version, or other weights) is never read
    stale = {**published, "settings": {**published["settings"], "format": eval_settings.EVAL_FORMAT_VERSION - 1}}
    (folder / "results.json").write_text(json.dumps([stale]))
    ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=tmp_path / "c4", **kw)
    assert calls == [8, 8, 8, 8]
    # a results.json corrected after a first look takes effect at once (nothing stale was cached);
    # its numbers agree with themselves (the per-document losses and interval scaled with the mean)
    poisoned = {**published, "per_length": [_rescaled(e, 0.123) for e in published["per_length"]]}
    (folder / "results.json").write_text(json.dumps(poisoned))

    def look(c):
        return ev.evaluate_checkpoint(folder, corpus, [8], cache_dir=tmp_path / c, **kw)["per_length"][0]

    assert look("c5")["nats_per_token"] == 0.123
    (folder / "results.json").write_text(json.dumps([published]))
    assert look("c5")["nats_per_token"] == published["per_length"][0]["nats_per_token"]
    (folder / "results.json").write_text(json.dumps(poisoned))
    with torch.no_grad():  # retrain: other weights, so the sha256 no longer matches
        model = GPT.from_pretrained(str(folder))
        model.wte.weight.mul_(1.5)
        model.save_pretrained(folder)
    again = look("c6")
    assert calls == [8, 8, 8, 8, 8] and again["nats_per_token"] != 0.123 and again["source"] == "computed"
    (folder / "results.json").write_text("{not json")  # unreadable: ignored, not an error
    assert look("c7")["cached"] is False


def test_cache_key_changes_with_checkpoint_and_data(ckpts, corpus, tmp_path, cache, monkeypatch):
    calls = _counting(monkeypatch)
    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)
    other = _write_jsonl(tmp_path / "other.jsonl", DOC_TOKENS, prefix="x")
    ev.evaluate_checkpoint(ckpts["fire"], other, [8], **kw)
    ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8], **kw)
    assert calls == [8, 8, 8]


def test_cached_results_compute_nothing_and_return_what_evaluate_cached(ckpts, corpus, cache, monkeypatch):
    """The direct cache lookup: on an empty cache every length is not computed yet (no model
    runs, nothing is written); after an evaluation it returns exactly what evaluate_many
    returns from the cache, paired differences included; a length that cannot be evaluated
    keeps its reason; capped FIRE is looked up under the capped key."""
    from fireviz.eval import plan as eval_plan

    def no_forward(*a, **k):
        raise AssertionError("cached_results must not score anything")

    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    paths = [ckpts["fire"], ckpts["alibi"]]
    monkeypatch.setattr(ev, "score_windows", no_forward)
    monkeypatch.setattr(GPT, "forward", no_forward)
    empty = ev.cached_results(paths, corpus, [8, 16, 128], **kw)
    assert [r["checkpoint"] for r in empty] == ["fire", "alibi"]
    for r in empty:
        assert [e.get("not_computed") for e in r["per_length"][:2]] == [True, True]
        assert r["per_length"][0]["error"] == ev.NOT_COMPUTED
        assert "no document has 128 tokens" in r["per_length"][2]["error"] and not r["per_length"][2].get(
            "not_computed"
        )
    assert not cache.exists() or not list(cache.glob("*.json"))
    monkeypatch.undo()
    computed = ev.evaluate_many(paths, corpus, [8, 16], **kw)
    again = ev.evaluate_many(paths, corpus, [8, 16], **kw)  # from the cache
    monkeypatch.setattr(ev, "score_windows", no_forward)
    monkeypatch.setattr(GPT, "forward", no_forward)
    looked = ev.cached_results(paths, corpus, [8, 16], **kw)
    for r, a in zip(looked, again, strict=True):
        assert {k: v for k, v in r.items() if k != "seconds"} == {k: v for k, v in a.items() if k != "seconds"}
        assert all(e["cached"] and e["source"] == "cache" for e in r["per_length"])
    assert looked[1]["per_length"][0]["paired_delta_bpb"] == computed[1]["per_length"][0]["paired_delta_bpb"]
    assert looked[0]["per_length"][1]["nats_per_token"] == computed[0]["per_length"][1]["nats_per_token"]
    # the same data and checkpoints again: the documents are not read again (memoized per file state)
    loads = []
    monkeypatch.setattr(eval_plan, "load_documents", lambda d: loads.append(d) or [])
    ev.cached_results(paths, corpus, [8, 16], **kw)
    assert loads == []
    monkeypatch.undo()
    capped = ev.cached_results(paths, corpus, [16], normalizer_cap=4, **kw)
    assert capped[0]["normalizer_cap"] == 4 and capped[0]["per_length"][0].get("not_computed")  # FIRE: its own key
    assert capped[1]["normalizer_cap"] is None and capped[1]["per_length"][0]["cached"]  # ALiBi: the plain entry
    with pytest.raises(ev.EvaluationError, match="needs a RoPE checkpoint"):
        ev.cached_results(paths, corpus, [8], rope_scaling="pi", **kw)


def test_cached_results_give_no_number_for_nan_weights(ckpts, corpus, tmp_path, cache):
    import shutil

    from safetensors.torch import load_file, save_file

    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    good = ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8], **kw)
    victim = tmp_path / "victim"
    shutil.copytree(ckpts["alibi"], victim)
    state = load_file(str(victim / "model.safetensors"))
    k = "wte.weight" if "wte.weight" in state else "lm_head.weight"  # the tied matrix is kept under one name
    state[k][0, 0] = float("nan")
    save_file(state, str(victim / "model.safetensors"))
    assert ev.cached_results([victim], corpus, [8], **kw)[0]["per_length"][0]["not_computed"]  # nothing to refuse
    forged = {**good, "checkpoint_sha256": checkpoints.checkpoint_sha256(victim)}  # a matching results.json
    (victim / "results.json").write_text(json.dumps([forged]))
    with pytest.raises(ev.NonFiniteLossError, match="NaN/inf"):
        ev.cached_results([victim], corpus, [8], **kw)


def test_evaluation_documents_are_read_again_when_the_file_changes(tmp_path):
    from fireviz.eval import plan as eval_plan

    path = _write_jsonl(tmp_path / "d.jsonl", [20, 30])
    docs, split, fp = eval_plan.load_eval_documents(path, "all")
    assert split == "all" and [d.id for d in docs] == ["d00", "d01"]
    assert eval_plan.load_eval_documents(path, "all")[0] is docs  # unchanged: the same documents
    _write_jsonl(path, [20, 30, 40])
    docs2, _, fp2 = eval_plan.load_eval_documents(path, "all")
    assert len(docs2) == 3 and fp2 != fp


# ---------------------------------------------------------------------------------------------
# zero-shot RoPE extensions
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scaling,name", [("pi", "rope_pi"), ("yarn", "yarn")])
def test_rope_scaling_equals_rebuilt_model(ckpts, corpus, cache, scaling, name):
    base = GPT.from_pretrained(str(ckpts["rope"])).eval()
    kw = dict(token_budget=None, split="all", device="cpu", cache_dir=cache)
    r = ev.evaluate_checkpoint(ckpts["rope"], corpus, [16, 64], rope_scaling=scaling, **kw)
    plain = ev.evaluate_checkpoint(ckpts["rope"], corpus, [16, 64], **kw)
    at16, at64 = r["per_length"]
    assert at16["position_encoding"] == at64["position_encoding"] == name
    assert (
        at16["encoding_options"]["rope_scaling_factor"] == 1.0
        and at64["encoding_options"]["rope_scaling_factor"] == 4.0
    )
    # factor 1 is plain RoPE; factor 4 changes the numbers
    assert at16["nats_per_token"] == pytest.approx(plain["per_length"][0]["nats_per_token"], rel=1e-6)
    assert abs(at64["nats_per_token"] - plain["per_length"][1]["nats_per_token"]) > 1e-3
    opts = {"rope_scaling_factor": 4.0}
    if name == "yarn":
        opts["original_max_position_embeddings"] = 16
    cfg = GPTConfig(**{**base.config.__dict__, "position_encoding": name, "encoding_options": opts})
    hand = GPT(cfg).eval()
    load_state_checked(hand, base.state_dict())
    if name == "yarn":
        assert hand.encodings[0].attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    (doc,) = [d for d in load_documents(corpus) if d.num_tokens >= 64]
    expected = float(_hand_nll(hand, document_tokens(doc)[:64]).mean())
    assert at64["nats_per_token"] == pytest.approx(expected, rel=1e-6)
    assert r["settings"]["rope_scaling"] == scaling and r["position_encoding"] == "rope"


def test_rope_scaling_needs_rope_checkpoint(ckpts, corpus, cache):
    with pytest.raises(ev.EvaluationError, match="needs a RoPE checkpoint"):
        ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], rope_scaling="pi", split="all", cache_dir=cache)
    with pytest.raises(ev.EvaluationError, match="rope_scaling must be"):
        ev.evaluate_checkpoint(ckpts["rope"], corpus, [8], rope_scaling="ntk", split="all", cache_dir=cache)


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_length_longer_than_every_document_is_reported(ckpts, corpus, cache):
    r = ev.evaluate_checkpoint(ckpts["fire"], corpus, [8, 65, 500], token_budget=40, split="all", cache_dir=cache)
    ok, too_long, way_too_long = r["per_length"]
    assert ok["tokens_scored"] > 0
    assert (
        set(too_long) == {"length", "error"} and "no document has 65 tokens (the longest has 64)" in too_long["error"]
    )
    assert way_too_long["length"] == 500 and "error" in way_too_long


def test_stride_larger_than_window_is_reported(ckpts, corpus, cache):
    r = ev.evaluate_checkpoint(
        ckpts["fire"], corpus, [8, 16], mode="sliding", stride=12, token_budget=40, split="all", cache_dir=cache
    )
    bad, good = r["per_length"]
    assert "stride 12 is larger than the window (8 tokens)" in bad["error"]
    assert good["tokens_scored"] >= 40
    with pytest.raises(ev.EvaluationError, match="larger than the window"):
        windows.sliding_windows(20, 8, 9)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(mode="sliding"), "needs a stride"),
        (dict(stride=4), "only to mode='sliding'"),
        (dict(mode="sliding", stride=0), "stride must be an integer >= 1"),
        (dict(mode="rolling"), "mode must be one of"),
        (dict(token_budget=0), "token_budget must be"),
        (dict(split="test"), "split must be one of"),
        (dict(lengths=[1]), "length must be an integer >= 2"),
    ],
)
def test_bad_settings(ckpts, corpus, cache, kw, match):
    lengths = kw.pop("lengths", [8])
    with pytest.raises(ev.EvaluationError, match=match):
        ev.evaluate_checkpoint(ckpts["fire"], corpus, lengths, cache_dir=cache, **{"split": "all", **kw})


def test_bad_data(ckpts, tmp_path, cache):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "a", "text": ""}) + "\n" + json.dumps({"id": "b", "text": ""}) + "\n")
    with pytest.raises(DataError, match="contains no text"):
        ev.evaluate_checkpoint(ckpts["fire"], empty, [8], cache_dir=cache)
    with pytest.raises(DataError, match="use one of prose, latex, code"):
        ev.evaluate_checkpoint(ckpts["fire"], "poetry", [8], cache_dir=cache)
    small = _write_jsonl(tmp_path / "small.jsonl", [20, 30], prefix="a")
    assert not any(is_validation(d.id) for d in load_documents(small))
    with pytest.raises(DataError, match="split='all'"):  # validation split of two documents is empty
        ev.evaluate_checkpoint(ckpts["fire"], small, [8], cache_dir=cache)


def test_bad_checkpoint(ckpts, corpus, tmp_path, cache):
    with pytest.raises(CheckpointError, match="not found"):
        ev.evaluate_checkpoint(tmp_path / "nope", corpus, [8], split="all", cache_dir=cache)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json or model.safetensors"):
        ev.evaluate_checkpoint(tmp_path / "empty", corpus, [8], split="all", cache_dir=cache)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((ckpts["fire"] / "config.json").read_text())
    weights = (ckpts["fire"] / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(CheckpointError, match="is truncated .* train the checkpoint again"):
        ev.evaluate_checkpoint(broken, corpus, [8], split="all", cache_dir=cache)
    (broken / "model.safetensors").write_bytes(weights)
    (broken / "config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ev.evaluate_checkpoint(broken, corpus, [8], split="all", cache_dir=cache)
    cfg = json.loads((ckpts["fire"] / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "d_model": 64}))
    with pytest.raises(CheckpointError, match="does not match its config.json"):
        ev.evaluate_checkpoint(broken, corpus, [8], split="all", cache_dir=cache)


def test_device_and_cancel(ckpts, corpus, cache):
    if torch.cuda.is_available():
        assert eval_device.resolve_device("cuda").type == "cuda"
    else:
        with pytest.raises(ev.EvaluationError, match="no CUDA GPU"):
            ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], device="cuda", split="all", cache_dir=cache)
    assert eval_device.resolve_device("cpu").type == "cpu"
    with pytest.raises(ev.EvaluationError, match="unknown device"):
        eval_device.resolve_device("tpu-ish")
    with pytest.raises(ev.EvaluationCancelled):
        ev.evaluate_checkpoint(
            ckpts["fire"],
            corpus,
            [8],
            token_budget=None,
            split="all",
            cache_dir=cache,
            batch_tokens=8,
            should_stop=lambda: True,
        )
    assert not list(cache.glob("*.json"))  # nothing finished, nothing cached


def test_absolute_embedding_past_training_length(tmp_path, corpus, cache):
    model = _tiny("nope", absolute_position_embedding=True)
    model.save_pretrained(tmp_path / "ape")
    r = ev.evaluate_checkpoint(tmp_path / "ape", corpus, [16, 32], split="all", cache_dir=cache)
    assert r["per_length"][0]["tokens_scored"] > 0
    assert "absolute position embeddings cover 16 tokens" in r["per_length"][1]["error"]


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def test_cli_writes_its_json_even_when_the_reader_closes_the_pipe(ckpts, corpus, tmp_path, cache, monkeypatch):
    """A breaker's finding: `fireviz eval … --out r.json | head -1` lost r.json, printed before written."""

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    out = tmp_path / "results.json"
    argv = [str(ckpts["fire"]), "--data", str(corpus), "--split", "all", "--lengths", "8,16"]
    with pytest.raises(BrokenPipeError):
        eval_cli.main(argv + ["--cache-dir", str(cache), "--out", str(out), "--device", "cpu", "--quiet"])
    assert [r["checkpoint"] for r in json.loads(out.read_text())] == ["fire"]


def test_cli_end_to_end(ckpts, corpus, tmp_path, cache, capsys):
    out = tmp_path / "results.json"
    from fireviz.cli import main as cli_main

    rc = cli_main(
        [
            "eval",
            str(ckpts["fire"]),
            str(ckpts["rope"]),
            "--data",
            str(corpus),
            "--split",
            "all",
            "--lengths",
            "8,16,100",
            "--mode",
            "sliding",
            "--stride",
            "4",
            "--token-budget",
            "40",
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    assert (
        "bits per byte [95 % bootstrap interval" in captured.out and "fire" in captured.out and "error" in captured.out
    )
    results = json.loads(out.read_text())
    assert [r["checkpoint"] for r in results] == ["fire", "rope"]
    assert [("error" in e) for e in results[0]["per_length"]] == [False, False, True]
    assert results[0]["settings"]["stride"] == 4 and results[0]["settings"]["mode"] == "sliding"
    table = eval_cli.format_table(results)
    assert f"{results[1]['per_length'][1]['bits_per_byte']:.3f}" in table


@pytest.mark.parametrize(
    "args,match",
    [
        (["--data", "poetry"], "not found"),
        (["--data", "EMPTY"], "no text"),
        (["--lengths", "500"], "no document has 500 tokens"),
        (["--mode", "sliding", "--stride", "20", "--lengths", "8,16"], "larger than the window"),
        (["CKPT_MISSING"], "not found"),
        (["--rope-scaling", "pi"], "needs a RoPE checkpoint"),
        (["--stride", "4"], "only to mode='sliding'"),
        (["--batch-tokens", "0"], "batch_tokens must be an integer >= 1"),
        (["--out", "OUT_DIR"], "is a folder"),
        (["--out", "OUT_UNDER_FILE"], "which is a file"),
        (["--out", ""], "--out is empty; give a file path"),
    ],
)
def test_cli_bad_input(ckpts, corpus, tmp_path, cache, capsys, args, match):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": ""}) + "\n")
    args = [
        {
            "EMPTY": str(empty),
            "CKPT_MISSING": str(tmp_path / "missing"),
            "OUT_DIR": str(tmp_path),
            "OUT_UNDER_FILE": str(empty / "r.json"),
        }.get(a, a)
        for a in args
    ]
    base = [str(ckpts["fire"]), "--data", str(corpus), "--split", "all", "--lengths", "8", "--cache-dir", str(cache)]
    if "--data" in args:
        base = base[:1] + base[3:]
    rc = eval_cli.main(base + args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("fireviz eval: error:") and match in err[0]


def test_default_cache_dir_from_environment(ckpts, corpus, cache, tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8], token_budget=20, split="all")
    assert len(list((tmp_path / "default-cache" / "eval").glob("*.json"))) == 1  # the root's eval/, as hub/
    assert ev.evaluate_checkpoint(ckpts["alibi"], corpus, [8], token_budget=20, split="all")["per_length"][0]["cached"]
    assert calls == [8]


# ---------------------------------------------------------------------------------------------
# same text at every length, intervals, paired differences, the FIRE normalizer cap
# ---------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 120), min_size=1, max_size=12),
    lengths=st.lists(st.integers(2, 130), min_size=1, max_size=5),
    budget=st.none() | st.integers(1, 500),
    seed=st.integers(0, 3),
)
def test_same_text_plan_scores_one_fixed_text(sizes, lengths, budget, seed):
    ids = [f"d{i:02d}" for i in range(len(sizes))]
    if min(lengths) > max(sizes):
        with pytest.raises(ev.EvaluationError, match="no document has"):
            windows.plan_same_text(ids, sizes, lengths, token_budget=budget, seed=seed)
        return
    plan = windows.plan_same_text(ids, sizes, lengths, token_budget=budget, seed=seed)
    M = plan.prefix_tokens
    assert M == max(n for n in lengths if n <= max(sizes))
    assert plan.documents_skipped == sum(1 for n in sizes if n < M)
    assert all(sizes[d] >= M for d in plan.documents) and plan.documents == tuple(sorted(plan.documents))
    if budget is None:
        assert len(plan.documents) == len(sizes) - plan.documents_skipped
    else:
        assert len(plan.documents) == min(len(sizes) - plan.documents_skipped, max(1, -(-budget // (M - 1))))
    for n in lengths:
        planned = plan.windows[n]
        if n > M:
            assert isinstance(planned, str) and "no document has" in planned
            continue
        assert {w.doc for w in planned} == set(plan.documents)  # the same documents at every length
        for d in plan.documents:
            targets = _targets([(w.start, w.first_target) for w in planned if w.doc == d], n)
            assert sorted(targets) == list(range(1, M))  # every target of the prefix, once, at every length
            assert all(w.start + n <= M for w in planned if w.doc == d)


def test_same_text_is_the_default_and_scores_the_same_text(ckpts, corpus, cache):
    r = ev.evaluate_many(
        [ckpts["alibi"], ckpts["fire"]], corpus, [8, 16, 32], split="all", device="cpu", cache_dir=cache
    )
    s = r[0]["settings"]
    assert s["mode"] == "same_text" and s["token_budget"] is None and s["prefix_tokens"] == 32
    assert s["documents_scored"] == sum(1 for n in DOC_TOKENS if n >= 32) == 3
    assert s["documents_skipped"] == 4
    for res in r:
        entries = res["per_length"]
        assert {e["documents"] for e in entries} == {3}
        assert len({tuple(e["per_document"]["doc"]) for e in entries}) == 1
        assert {e["tokens_scored"] for e in entries} == {3 * 31}  # the same targets at every length
        for e in entries:
            assert e["prefix_tokens"] == 32 and e["documents_skipped"] == 4
            assert sum(e["per_document"]["tokens"]) == e["tokens_scored"]
            nats = sum(e["per_document"]["nats"]) / e["tokens_scored"]
            assert nats == pytest.approx(e["nats_per_token"], rel=1e-9)
            lo, hi = e["ci95"]
            assert lo <= e["bits_per_byte"] <= hi
    # paired against the first checkpoint; the reference itself has none
    assert all("paired_delta_bpb" not in e for e in r[0]["per_length"])
    for a, b in zip(r[0]["per_length"], r[1]["per_length"], strict=True):
        assert b["paired_reference"] == "alibi"
        assert b["paired_delta_bpb"] == pytest.approx(b["bits_per_byte"] - a["bits_per_byte"], abs=1e-9)
        lo, hi = b["paired_ci95"]
        assert lo <= b["paired_delta_bpb"] <= hi
    json.dumps(r, allow_nan=False)


def test_prefix_tokens_scores_one_column_of_a_longer_evaluation(ckpts, corpus, cache, tmp_path):
    """--lengths 8 --prefix-tokens 32 is exactly the 8 column of an 8…32 evaluation (and its cache entry)."""
    full = ev.evaluate_many([ckpts["fire"]], corpus, [8, 16, 32], split="all", device="cpu", cache_dir=cache)
    fresh = tmp_path / "fresh-cache"
    one = ev.evaluate_many([ckpts["fire"]], corpus, [8], split="all", device="cpu", cache_dir=fresh, prefix_tokens=32)
    a, b = full[0]["per_length"][0], one[0]["per_length"][0]
    assert b["prefix_tokens"] == 32 and one[0]["settings"]["prefix_tokens"] == 32
    assert b["per_document"] == a["per_document"] and b["bits_per_byte"] == a["bits_per_byte"]
    assert b["tokens_scored"] == 3 * 31 and b["documents_skipped"] == 4
    # the lookup finds it under the full run's key: one entry, not two
    found = ev.cached_results([ckpts["fire"]], corpus, [8], cache_dir=cache, split="all", prefix_tokens=32)
    assert found[0]["per_length"][0]["bits_per_byte"] == a["bits_per_byte"]
    # and without the prefix the 8 column alone is other text (the first 8 tokens of more documents)
    alone = ev.evaluate_many([ckpts["fire"]], corpus, [8], split="all", device="cpu", cache_dir=fresh)
    assert alone[0]["per_length"][0]["tokens_scored"] != b["tokens_scored"]


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(prefix_tokens=4), "prefix_tokens (--prefix-tokens) 4 is shorter than the length 8"),
        (dict(prefix_tokens=1), "prefix_tokens (--prefix-tokens) must be an integer >= 2"),
        (dict(prefix_tokens=True), "prefix_tokens (--prefix-tokens) must be an integer >= 2"),
        (dict(prefix_tokens=16.5), "prefix_tokens (--prefix-tokens) must be an integer >= 2"),
        (dict(prefix_tokens=10**9), "no document has 1000000000 tokens"),
        (dict(prefix_tokens=32, mode="nonoverlapping"), "prefix_tokens applies to mode='same_text'"),
    ],
)
def test_bad_prefix_tokens_is_one_clear_error(ckpts, corpus, cache, kw, message):
    with pytest.raises(ev.EvaluationError, match=re.escape(message)):
        ev.evaluate_many([ckpts["fire"]], corpus, [8], split="all", device="cpu", cache_dir=cache, **kw)


def test_same_text_equals_hand_computation(ckpts, corpus, cache):
    model = GPT.from_pretrained(str(ckpts["rope"])).eval()
    docs = sorted(load_documents(corpus), key=lambda d: d.id)
    M, n = 34, 16  # 34 = a document's size: windows [0,16), [15,31) and the tail [18,34)
    nll = []
    for d in docs:
        toks = document_tokens(d)
        if len(toks) < M:
            continue
        for start in (0, 15):  # overlapping by one token: targets 1..15, then 16..30
            nll.append(_hand_nll(model, toks[start : start + n]))
        tail = _hand_nll(model, toks[18:34])  # scores document positions 31..33 (window positions 13..15)
        nll.append(tail[-3:])
    r = ev.evaluate_checkpoint(ckpts["rope"], corpus, [n, M], split="all", device="cpu", cache_dir=cache)
    e = r["per_length"][0]
    assert e["tokens_scored"] == sum(len(x) for x in nll) and e["windows"] == 3 * 3
    assert e["nats_per_token"] == pytest.approx(float(torch.cat(nll).mean()), rel=1e-6)


def test_bootstrap_interval_and_paired_difference_properties():
    rng = random.Random(0)
    tokens = [rng.randint(50, 200) for _ in range(30)]
    nats = [t * (1.0 + rng.random()) for t in tokens]
    lo, hi = stats.bootstrap_ci95(nats, tokens)
    mean = sum(nats) / sum(tokens) / math.log(2)
    assert lo < mean < hi and hi - lo > 0
    assert stats.bootstrap_ci95(nats, tokens) == [lo, hi]  # deterministic
    assert stats.bootstrap_ci95([5.0], [10]) is None  # one document: no interval (a zero width would look certain)
    a = {"per_document": {"doc": [str(i) for i in range(30)], "nats": nats, "tokens": tokens}}
    shifted = {"per_document": {**a["per_document"], "nats": [x + 0.1 * t for x, t in zip(nats, tokens, strict=True)]}}
    d = stats.paired_difference(shifted, a)  # a constant per-token shift: no spread at all
    assert d["paired_delta_bpb"] == pytest.approx(0.1 / math.log(2))
    assert d["paired_ci95"] == [pytest.approx(0.1 / math.log(2))] * 2
    noisy = {"per_document": {**a["per_document"], "nats": [x + rng.gauss(0, 1) for x in nats]}}
    lo, hi = stats.paired_difference(noisy, a)["paired_ci95"]
    assert hi - lo < (stats.bootstrap_ci95(nats, tokens)[1] - stats.bootstrap_ci95(nats, tokens)[0])  # pairing helps
    other_docs = {"per_document": {**a["per_document"], "doc": ["x"] * 30}}
    assert stats.paired_difference(other_docs, a) is None  # different text is never paired
    with pytest.raises(ev.EvaluationError):
        stats.bootstrap_ci95([1.0, 2.0], [1])


def test_reference_choice_and_errors(ckpts, corpus, cache):
    kw = dict(split="all", device="cpu", cache_dir=cache)
    r = ev.evaluate_many([ckpts["alibi"], ckpts["fire"]], corpus, [8], reference="fire", **kw)
    assert "paired_delta_bpb" in r[0]["per_length"][0] and "paired_delta_bpb" not in r[1]["per_length"][0]
    assert r[0]["per_length"][0]["paired_reference"] == "fire"
    with pytest.raises(ev.EvaluationError, match="not one of the evaluated checkpoints"):
        ev.evaluate_many([ckpts["alibi"], ckpts["fire"]], corpus, [8], reference="t5", **kw)


def test_normalizer_cap_is_a_setting_of_its_own(ckpts, corpus, cache, monkeypatch):
    calls = _counting(monkeypatch)
    kw = dict(split="all", device="cpu", cache_dir=cache)
    plain = ev.evaluate_checkpoint(ckpts["fire"], corpus, [32], **kw)["per_length"][0]
    capped = ev.evaluate_checkpoint(ckpts["fire"], corpus, [32], normalizer_cap=4, **kw)
    e = capped["per_length"][0]
    assert calls == [32, 32]  # cached separately: the capped run was computed, not read
    assert capped["normalizer_cap"] == 4 and e["normalizer_cap"] == 4 and capped["settings"]["normalizer_cap"] == 4
    assert e["nats_per_token"] != plain["nats_per_token"]
    assert ev.evaluate_checkpoint(ckpts["fire"], corpus, [32], normalizer_cap=4, **kw)["per_length"][0]["cached"]
    # by hand: the same model with the cap set in its config gives the same number
    model = GPT.from_pretrained(str(ckpts["fire"])).eval()
    for m in model.encodings:
        m.normalizer_cap = 4.0
    toks = [document_tokens(d) for d in sorted(load_documents(corpus), key=lambda d: d.id)]
    nll = torch.cat([_hand_nll(model, t[:32]) for t in toks if len(t) >= 32])
    assert e["nats_per_token"] == pytest.approx(float(nll.mean()), rel=1e-6)
    # a checkpoint without a normalizer is evaluated as it is, from the plain cache entry
    alibi = ev.evaluate_checkpoint(ckpts["alibi"], corpus, [32], **kw)["per_length"][0]
    again = ev.evaluate_checkpoint(ckpts["alibi"], corpus, [32], normalizer_cap=4, **kw)
    assert again["normalizer_cap"] is None and again["per_length"][0]["cached"]
    assert again["per_length"][0]["nats_per_token"] == alibi["nats_per_token"]
    with pytest.raises(ev.EvaluationError, match="normalizer_cap"):
        ev.evaluate_checkpoint(ckpts["fire"], corpus, [32], normalizer_cap=0, **kw)


def test_paired_table_names_a_capped_reference_as_evaluated(ckpts, corpus, cache):
    r = ev.evaluate_many(
        [ckpts["fire"], ckpts["alibi"]], corpus, [32], split="all", device="cpu", cache_dir=cache, normalizer_cap=4
    )
    assert "vs fire (normalizer cap 4) on the same windows" in eval_cli.format_table(r)
    r = ev.evaluate_many([ckpts["alibi"], ckpts["fire"]], corpus, [32], split="all", device="cpu", cache_dir=cache)
    assert "vs alibi on the same windows" in eval_cli.format_table(r)


def test_cli_prints_what_was_scored_and_the_paired_table(ckpts, corpus, tmp_path, cache, capsys):
    out = tmp_path / "r.json"
    rc = eval_cli.main(
        [
            str(ckpts["alibi"]),
            str(ckpts["fire"]),
            "--data",
            str(corpus),
            "--split",
            "all",
            "--lengths",
            "8,16,32",
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "same_text: the first 32 tokens of each of 3 documents at every length (4 shorter documents skipped)" in text
    for label in ("documents", "windows", "tokens scored", "paired difference in bits per byte vs alibi"):
        assert label in text
    results = json.loads(out.read_text())
    for e in results[1]["per_length"]:
        assert {"ci95", "paired_delta_bpb", "paired_ci95", "documents", "windows", "tokens_scored"} <= set(e)
        assert f"{e['paired_delta_bpb']:+.3f} [{e['paired_ci95'][0]:+.3f}, {e['paired_ci95'][1]:+.3f}]" in text
    rc = eval_cli.main(
        [
            str(ckpts["fire"]),
            "--data",
            str(corpus),
            "--split",
            "all",
            "--lengths",
            "32",
            "--normalizer-cap",
            "4",
            "--cache-dir",
            str(cache),
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert rc == 0 and "fire cap 4" in capsys.readouterr().out


def test_published_capped_rows_never_answer_a_plain_request(ckpts, corpus, tmp_path, cache):
    import shutil

    folder = tmp_path / "fire"
    shutil.copytree(ckpts["fire"], folder)
    kw = dict(split="all", device="cpu")
    capped = ev.evaluate_checkpoint(folder, corpus, [32], normalizer_cap=4, cache_dir=tmp_path / "pub", **kw)
    (folder / "results.json").write_text(json.dumps([capped]))
    plain = ev.evaluate_checkpoint(folder, corpus, [32], cache_dir=cache, **kw)["per_length"][0]
    assert plain["source"] == "computed" and plain["nats_per_token"] != capped["per_length"][0]["nats_per_token"]
    again = ev.evaluate_checkpoint(folder, corpus, [32], normalizer_cap=4, cache_dir=tmp_path / "c2", **kw)
    assert again["per_length"][0]["source"] == eval_cache.PUBLISHED_RESULTS


def test_review_edges(ckpts, corpus, tmp_path, cache, capsys):
    """Edges found in review: a reference path beats a folder name shared by two checkpoints,
    a single document has no interval, a huge cap is one clear error, the cache folder must
    be a folder, entries without per-document losses are recomputed unless a lookup accepts
    them."""
    import shutil

    a, b = tmp_path / "a" / "final", tmp_path / "b" / "final"
    shutil.copytree(ckpts["fire"], a)
    shutil.copytree(ckpts["alibi"], b)
    kw = dict(split="all", device="cpu", cache_dir=cache)
    r = ev.evaluate_many([a, b], corpus, [8], reference=str(b), **kw)
    assert "paired_delta_bpb" in r[0]["per_length"][0] and "paired_delta_bpb" not in r[1]["per_length"][0]
    table = eval_cli.format_table(r)  # two folders named final: the table names their paths
    assert str(a) in table and f"vs {b}" in table
    with pytest.raises(ev.EvaluationError, match="names 2 of the checkpoints"):
        ev.evaluate_many([a, b], corpus, [8], reference="final", **kw)
    one = _write_jsonl(tmp_path / "one.jsonl", [40])
    r = ev.evaluate_many([ckpts["fire"], ckpts["alibi"]], one, [8], **kw)
    assert r[0]["per_length"][0]["ci95"] is None and r[1]["per_length"][0]["paired_ci95"] is None
    assert (
        eval_cli.main(
            [
                str(ckpts["fire"]),
                "--data",
                str(one),
                "--split",
                "all",
                "--lengths",
                "8",
                "--cache-dir",
                str(cache),
                "--quiet",
            ]
        )
        == 0
    )  # printed without an interval, no traceback
    assert (
        eval_cli.main(
            [
                str(ckpts["fire"]),
                "--data",
                str(corpus),
                "--split",
                "all",
                "--lengths",
                "8",
                "--normalizer-cap",
                "1" + "0" * 320,
                "--quiet",
            ]
        )
        == 2
    )
    assert "normalizer_cap must be an integer number of tokens in 1.." in capsys.readouterr().err
    blocker = tmp_path / "cachefile"
    blocker.write_text("x")
    with pytest.raises(ev.EvaluationError, match="is a file"):
        ev.evaluate_many([ckpts["fire"]], corpus, [8], split="all", device="cpu", cache_dir=blocker)
    # an entry without per_document (made before intervals): shown by a lookup, recomputed by a run
    first = ev.evaluate_many([ckpts["rope"]], corpus, [8], **kw)[0]["per_length"][0]
    entry = next((cache).glob("*.json"))
    for path in cache.glob("*.json"):
        obj = json.loads(path.read_text())
        if obj["checkpoint_sha256"] == checkpoints.checkpoint_sha256(ckpts["rope"]):
            for k in ("per_document", "ci95", "documents"):
                obj["result"].pop(k, None)
            obj["mac"] = eval_cache.entry_mac(obj["key"], obj["result"])  # as this user's fireviz would have signed it
            path.write_text(json.dumps(obj))
    looked = ev.evaluate_many([ckpts["rope"]], corpus, [8], require_intervals=False, **kw)[0]["per_length"][0]
    assert looked["cached"] and "ci95" not in looked
    assert ev.cached_results([ckpts["rope"]], corpus, [8], **kw)[0]["per_length"][0] == looked  # the page's lookup
    assert ev.cached_results([ckpts["rope"]], corpus, [8], require_intervals=True, **kw)[0]["per_length"][0][
        "not_computed"
    ]
    again = ev.evaluate_many([ckpts["rope"]], corpus, [8], **kw)[0]["per_length"][0]
    assert not again["cached"] and again["ci95"] == first["ci95"]
    assert entry.exists()


def test_too_few_documents_get_no_interval(ckpts, tmp_path, cache, monkeypatch, capsys):
    monkeypatch.setattr(stats, "MIN_INTERVAL_DOCUMENTS", 10)  # the product's floor
    few = _write_jsonl(tmp_path / "few.jsonl", [40] * 9)
    many = _write_jsonl(tmp_path / "many.jsonl", [40] * 10)
    kw = dict(split="all", device="cpu", cache_dir=cache)
    r = ev.evaluate_many([ckpts["fire"], ckpts["alibi"]], few, [8], **kw)
    assert r[0]["per_length"][0]["ci95"] is None and r[1]["per_length"][0]["paired_ci95"] is None
    assert "paired_delta_bpb" in r[1]["per_length"][0]
    assert "no interval at 8: fewer than 10 documents" in eval_cli.format_table(r)
    # the app says the same reason (a new user read "press Run to recompute" for fresh results)
    note = missing_interval_note(r)
    assert "fewer than 10 documents" in note and "older fireviz" not in note
    old = [{"per_length": [{k: v for k, v in e.items() if k != "per_document"} for e in x["per_length"]]} for x in r]
    assert "older fireviz" in missing_interval_note(old) and "fewer than" not in missing_interval_note(old)
    r = ev.evaluate_many([ckpts["fire"], ckpts["alibi"]], many, [8], **kw)
    assert r[0]["per_length"][0]["ci95"] is not None and r[1]["per_length"][0]["paired_ci95"] is not None
    assert missing_interval_note(r) is None
    # a mistyped path under an existing folder fails at once (no Hub lookup)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    with pytest.raises(CheckpointError, match="not found"):
        checkpoints.checkpoint_files("local/nosuch")  # looks like owner/name, but local/ exists here


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=8),
    length=st.integers(2, 600),
    budget=st.one_of(st.none(), st.integers(1, 5000)),
    seed=st.integers(0, 3),
)
def test_nonoverlapping_plan_is_the_same_draw_as_the_list_of_every_candidate(sizes, length, budget, seed):
    """plan_windows finds candidate k from cumulative counts (no list of every window): the
    windows drawn are exactly those of shuffling the full candidate list, as published."""
    import math

    ids = [f"d{i}" for i in range(len(sizes))]
    eligible = sorted((i for i, n in enumerate(sizes) if n >= length), key=lambda i: (ids[i], i))
    if not eligible:
        with pytest.raises(ev.EvaluationError):
            windows.plan_windows(ids, sizes, length, token_budget=budget, seed=seed)
        return
    candidates = [(d, s) for d in eligible for s, _ in windows.nonoverlapping_windows(sizes[d], length)]
    want, scored, cap = [], 0, math.inf if budget is None else budget
    for k in torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed)).tolist():
        if scored >= cap:
            break
        want.append(windows.Window(*candidates[k], 1))
        scored += length - 1
    got = windows.plan_windows(ids, sizes, length, token_budget=budget, seed=seed)
    assert got == sorted(want, key=lambda w: (w.doc, w.start))


def test_split_none_is_the_validation_split_under_one_cache_key():
    """split=None (the library's default) and "validation" (the CLI's) are one text, so one key:
    a number computed from the command line is found by the app and the publishing script."""
    from fireviz.eval.settings import EvalSettings

    a, b = EvalSettings.make("prose", [128]), EvalSettings.make("prose", [128], split="validation")
    assert a.split == b.split == "validation"
    assert a.length_settings(128, 8192, None, False) == b.length_settings(128, 8192, None, False)
    assert EvalSettings.make("synthetic:copy", [16]).split == "synthetic"
    with pytest.raises(ev.EvaluationError, match="split must be one of validation, train, all"):
        EvalSettings.make("prose", [128], split="test")


# ---------------------------------------------------------------------------------------------
# review: one clear error per bad input, one key per computation, one read per identity
# ---------------------------------------------------------------------------------------------
def test_cache_keys_of_canonical_settings_never_change():
    """The on-disk cache outlives fireviz versions: these keys are what earlier runs wrote."""
    from fireviz.eval.settings import EvalSettings

    def key(data, lengths, args, **kw):
        return eval_cache.cache_key("0" * 64, "f" * 64, EvalSettings.make(data, lengths, **kw).length_settings(*args))

    assert key("prose", [128, 256], (128, 8192, None, False), device="cpu") == (
        "2f1ad076f1661bc70e01ce52a551654bb91405fdd890484a1ed77e298569d62d"
    )
    sliding = dict(mode="sliding", stride=64, token_budget=1000, seed=3, position_buckets=8, split="all")
    assert key("prose", [128, 256], (128, None, None, False), device="cpu", **sliding) == (
        "ada48e9ca2b202a74e841e7d0b637de83c6fe071740ba108b34809fc401b4631"
    )
    capped = dict(mode="nonoverlapping", normalizer_cap=512)
    assert key("prose", [128, 256], (256, None, 512, False), device="cpu", **capped) == (
        "d709bd1f273034c85a9915f54602e301067c2df161694af6d5d7a01659b18d1b"
    )
    assert key("synthetic:copy", [64], (64, None, None, False), device="cpu") == (
        "e041a9cb0c14f46459bcdc4227dda2fbed1f4b15cbf95702a7711d1ed92a604d"
    )
    # numpy integers are ints: the same key (before, np.int64 broke the key's JSON)
    np_kw = dict(sliding, stride=np.int64(64), token_budget=np.int64(1000), seed=np.int64(3))
    np_kw["position_buckets"] = np.int32(8)
    assert key("prose", np.array([128, 256]), (128, None, None, False), device="cpu", **np_kw) == (
        "ada48e9ca2b202a74e841e7d0b637de83c6fe071740ba108b34809fc401b4631"
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(mode="sliding", stride=2.0), "stride must be an integer >= 1 .got 2.0."),
        (dict(mode="sliding", stride="abc"), "stride must be an integer"),
        (dict(mode="sliding", stride=True), "stride must be an integer"),
        (dict(seed=1.7), "seed must be an integer .* .got 1.7."),
        (dict(seed=True), "seed must be an integer .* .got True."),
        (dict(seed="abc"), "seed must be an integer"),
        (dict(seed=2**70), "seed must be an integer"),
        (dict(position_buckets=8.5), "position_buckets must be an integer >= 1 .got 8.5."),
        (dict(position_buckets="8"), "position_buckets must be an integer"),
        (dict(position_buckets=float("nan")), "position_buckets must be an integer"),
        (dict(batch_tokens=True), "batch_tokens must be an integer"),
        (dict(lengths=[float("nan")]), "length must be an integer >= 2 tokens .got nan."),
        (dict(lengths=[float("inf")]), "length must be an integer >= 2 tokens .got inf."),
        (dict(lengths=[128.0]), "length must be an integer"),
        (dict(lengths=["128"]), "length must be an integer"),
        (dict(lengths=128), "lengths must be a list of integers"),
        (dict(lengths="128"), "lengths must be a list of integers"),
        (dict(data=None), "data must be a domain"),
        (dict(data=5), "data must be a domain"),
        (dict(data="synthetic:copy", split="all"), "has no 'all' split"),
    ],
)
def test_every_setting_is_an_integer_or_one_clear_error(kw, match):
    """Never rounded, never a raw TypeError/ValueError from deep inside: EvaluationError naming it."""
    from fireviz.eval.settings import EvalSettings

    data, lengths = kw.pop("data", "prose"), kw.pop("lengths", [128])
    with pytest.raises(ev.EvaluationError, match=match):
        EvalSettings.make(data, lengths, **kw)


def test_a_single_checkpoint_string_is_refused_not_read_letter_by_letter(ckpts, corpus, cache):
    for call in (ev.evaluate_many, ev.cached_results):
        with pytest.raises(ev.EvaluationError, match="checkpoints must be a list .* .got the single str"):
            call(str(ckpts["fire"]), corpus, [8], split="all", cache_dir=cache)
        with pytest.raises(ev.EvaluationError, match="got the single PosixPath"):
            call(ckpts["fire"], corpus, [8], split="all", cache_dir=cache)
        with pytest.raises(ev.EvaluationError, match="checkpoints must be a list"):
            call(None, corpus, [8], split="all", cache_dir=cache)
    with pytest.raises(ev.EvaluationError, match="unknown evaluation setting.*use_cache"):
        ev.cached_results([ckpts["fire"]], corpus, [8], split="all", use_cache=False)
    with pytest.raises(ev.EvaluationError, match="reference must be a checkpoint's index"):
        ev.cached_results([ckpts["fire"], ckpts["alibi"]], corpus, [8], split="all", reference=True)


def test_describe_is_one_key_per_computation():
    from fireviz.eval.settings import EvalSettings
    from fireviz.ui import jobs

    a = EvalSettings.make("prose", [256, 128], device="cpu", token_budget="auto", batch_tokens=1024)
    b = EvalSettings.make("prose", [128, 256, 128], device="cpu", token_budget=None, split="validation")
    assert a.describe() == b.describe() and json.loads(json.dumps(a.describe())) == a.describe()
    assert "batch_tokens" not in a.describe() and a.describe()["precision"] == "float32"
    drawn = dict(device="cpu", mode="nonoverlapping", token_budget=1024)
    assert (
        EvalSettings.make("prose", [128], **drawn).describe()
        != EvalSettings.make("prose", [128], seed=1, **drawn).describe()
    )
    with pytest.raises(ev.EvaluationError, match="seed=1 changes nothing in mode=.same_text."):
        EvalSettings.make("prose", [128, 256], device="cpu", seed=1)  # every document scored: no draw
    assert EvalSettings.make("prose", [128], device="cpu", seed=1, token_budget=4096).seed == 1
    from fireviz.checkpoints import Checkpoint

    ck = [Checkpoint(name="x", path="x", folder=Path("x"), config=GPTConfig(), sha256="f" * 64)]
    spellings = [{"device": "cpu", "token_budget": "auto"}, {"device": "cpu", "token_budget": None}, {"device": "cpu"}]
    if not torch.cuda.is_available():  # "auto" is the CPU here: the same numbers
        spellings += [{}, {"device": "auto", "token_budget": "auto", "split": None}]
    made = [EvalSettings.make("prose", [128], **s) for s in spellings]
    keys = {jobs.job_key(jobs.evaluation_description(ck, s)) for s in made}
    assert len(keys) == 1
    other = jobs.evaluation_description(ck, made[0], reference=1)
    assert jobs.job_key(other) not in keys  # another reference pairs other differences
    assert jobs.job_key(jobs.evaluation_description(ck, made[0], reference=0)) in keys
    assert jobs.evaluation_description(ck, made[0])["checkpoints"] == [{"path": "x", "sha256": "f" * 64}]


def test_bad_settings_are_refused_before_a_job_is_queued(ckpts, corpus):
    from fireviz.checkpoints import Checkpoint
    from fireviz.eval.settings import EvalSettings
    from fireviz.ui import jobs

    q = jobs.JobQueue(name="review")
    for asked, match in (
        ({"mode": "bogus"}, "mode must be one of"),
        ({"modee": "same_text"}, "unknown evaluation setting"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"progress": print}, "unknown evaluation setting"),
    ):
        with pytest.raises(ev.EvaluationError, match=match):
            EvalSettings.make(str(corpus), [8], **asked)  # the settings are built (and refused) at the edge
    s = EvalSettings.make(str(corpus), [8])
    alibi = Checkpoint.resolve(ckpts["alibi"])
    with pytest.raises(ev.EvaluationError, match="reference must be"):
        jobs.submit_evaluation([alibi], s, reference=object(), queue_=q)
    with pytest.raises(ev.EvaluationError, match="got the single str"):
        jobs.submit_evaluation(str(ckpts["alibi"]), s, queue_=q)
    with pytest.raises(ev.EvaluationError, match="takes Checkpoint objects"):
        jobs.submit_evaluation([str(ckpts["alibi"])], s, queue_=q)
    assert q.jobs() == []


def test_identity_and_weights_come_from_one_read(ckpts, corpus, tmp_path, cache, monkeypatch):
    """A weights file replaced between finding a checkpoint and reading it (a trainer writing
    interim checkpoints) gives the numbers of the weights read under *their* identity."""
    import hashlib
    import shutil

    from fireviz.checkpoints import catalog as ckpt_door
    from fireviz.checkpoints import checkpoint as ckpt_object

    a = tmp_path / "a"
    shutil.copytree(ckpts["alibi"], a)
    for folder in (a, ckpts["rope"], ckpts["fire"]):
        model, sha = fireviz_checkpoints.load_model_with_identity(folder)
        raw = (folder / "model.safetensors").read_bytes() + (folder / "config.json").read_bytes()
        assert sha == ckpt_door.checkpoint_sha256(folder) == hashlib.sha256(raw).hexdigest()
        assert fireviz_checkpoints.Checkpoint.resolve(folder).sha256 == sha
    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    b = tmp_path / "b"
    shutil.copytree(ckpts["alibi"], b)
    with torch.no_grad():  # other weights, same shapes
        other = GPT.from_pretrained(str(b))
        other.wte.weight.mul_(1.5)
        other.save_pretrained(b)
    truth_a = ev.evaluate_checkpoint(a, corpus, [8], **{**kw, "cache_dir": tmp_path / "t"})["per_length"][0]
    truth_b = ev.evaluate_checkpoint(b, corpus, [8], **{**kw, "cache_dir": tmp_path / "t"})["per_length"][0]
    sha_a = ckpt_door.checkpoint_sha256(a)
    real = ckpt_object._files_sha256

    def racing(config, weights):
        out = real(config, weights)
        if weights.parent == a:  # the trainer's os.replace lands here, after the identity was taken
            shutil.copy(b / "model.safetensors", a / "model.tmp")
            (a / "model.tmp").replace(a / "model.safetensors")
        return out

    monkeypatch.setattr(ckpt_object, "_files_sha256", racing)
    ckpt = fireviz_checkpoints.Checkpoint.resolve(a)
    monkeypatch.setattr(ckpt_object, "_files_sha256", real)
    assert ckpt.sha256 == sha_a  # its identity names a's bytes, which are gone: refused, nothing scored
    settings = ev.EvalSettings.make(corpus, [8], **{k: v for k, v in kw.items() if k != "cache_dir"})
    with pytest.raises(CheckpointError, match="changed since it was opened"):
        ev.evaluate([ckpt], settings, cache=ev.EvalCache(cache))
    shutil.copy(ckpts["alibi"] / "model.safetensors", a / "model.safetensors")  # a's weights back
    assert ckpt_door.checkpoint_sha256(a) == sha_a
    back = ev.cached_results([a], corpus, [8], **{k: v for k, v in kw.items() if k != "cache_dir"}, cache_dir=cache)
    assert back[0]["per_length"][0].get("not_computed")  # b's numbers are never served for a
    assert truth_a["nats_per_token"] != truth_b["nats_per_token"]


def test_cached_results_refuse_what_evaluate_many_refuses(ckpts, corpus, tmp_path, cache, monkeypatch):
    """Junk, truncated or mismatched weights are a CheckpointError in the lookup too (from the
    safetensors header: no weights are loaded), with evaluate_many's message."""
    import shutil

    kw = dict(mode="nonoverlapping", token_budget=40, split="all", device="cpu", cache_dir=cache)
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["alibi"], bad)
    weights = (bad / "model.safetensors").read_bytes()
    config = json.loads((bad / "config.json").read_text())
    cases = [
        ("model.safetensors", b"junk", "is not a readable safetensors file"),
        ("model.safetensors", weights[: len(weights) // 2], "is truncated"),
        ("config.json", json.dumps({**config, "n_layer": 3}).encode(), "does not match its config.json: missing"),
        ("config.json", json.dumps({**config, "d_model": 64}).encode(), "does not match its config.json"),
    ]
    for name, content, match in cases:
        (bad / "model.safetensors").write_bytes(weights)
        (bad / "config.json").write_text(json.dumps(config))
        (bad / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=match) as computed:
            ev.evaluate_many([bad], corpus, [8], **kw)
        monkeypatch.setattr(fireviz_checkpoints.Checkpoint, "load", lambda *a, **k: pytest.fail("weights loaded"))
        with pytest.raises(CheckpointError, match=match) as looked_up:
            ev.cached_results([bad], corpus, [8], **kw)
        monkeypatch.undo()
        assert str(looked_up.value) == str(computed.value)  # one message per problem
    # a good checkpoint with nothing cached: looked up without loading its weights
    monkeypatch.setattr(fireviz_checkpoints.Checkpoint, "load", lambda *a, **k: pytest.fail("weights loaded"))
    assert ev.cached_results([ckpts["rope"]], corpus, [8], **kw)[0]["per_length"][0]["not_computed"]


def test_an_unusable_cache_folder_is_refused_before_any_work(ckpts, corpus, tmp_path, cache, capsys, monkeypatch):
    calls = _counting(monkeypatch)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    base = [str(ckpts["alibi"]), "--data", str(corpus), "--split", "all", "--lengths", "8", "--quiet"]
    for folder, match in ((a_file, "is a file"), (a_file / "x" / "y", f"lies under {a_file}, which is a file")):
        assert eval_cli.main(base + ["--cache-dir", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0] and "--no-cache" in err[0]
    real_access = ev.os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(ev.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    with pytest.raises(ev.EvaluationError, match="cannot be created: .*locked is not writable"):
        ev.evaluate_many([ckpts["alibi"]], corpus, [8], split="all", cache_dir=locked / "cache")
    assert calls == []  # nothing was scored
    # the lookup only reads: a read-only cache is fine for it
    assert ev.cached_results([ckpts["alibi"]], corpus, [8], split="all", cache_dir=locked)[0]["per_length"]


def test_a_tampered_cache_entry_is_not_served(ckpts, corpus, cache, monkeypatch):
    """An entry whose numbers were changed together (mean halved, perplexity and bpb to match)
    no longer adds up with its per-document losses, or falls outside its interval: recomputed."""
    calls = _counting(monkeypatch)
    kw = dict(mode="nonoverlapping", token_budget=None, split="all", device="cpu", cache_dir=cache)
    first = ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)["per_length"][0]
    (entry,) = cache.glob("*.json")
    original = json.loads(entry.read_text())
    assert eval_cache._valid_entry(original["result"], 8)  # what fireviz writes passes
    halved = _rescaled(original["result"], original["result"]["nats_per_token"] / 2)
    halved["per_document"] = original["result"]["per_document"]  # the per-document losses left alone
    cases = [halved]
    if original["result"]["ci95"]:  # an interval that does not hold the value
        lo, hi = original["result"]["ci95"]
        cases.append({**original["result"], "ci95": [hi + 0.5, hi + 1.0]})
    for tampered in cases:
        entry.write_text(json.dumps({**original, "result": tampered}))
        assert not eval_cache._valid_entry(tampered, 8)
        assert ev.cached_results([ckpts["fire"]], corpus, [8], **kw)[0]["per_length"][0].get("not_computed")
        again = ev.evaluate_checkpoint(ckpts["fire"], corpus, [8], **kw)["per_length"][0]
        assert again["source"] == "computed" and again["nats_per_token"] == first["nats_per_token"]
    assert calls == [8] * (1 + len(cases))


def test_two_folders_of_one_name_keep_their_paths_in_every_table(ckpts, tmp_path, cache):
    """A new user's `eval runs/alibi checkpoints/alibi`: the first table named the rows by path,
    the paired table called the second one "alibi" against a reference "runs/alibi"."""
    import shutil

    a = shutil.copytree(ckpts["alibi"], tmp_path / "runs" / "alibi")
    b = shutil.copytree(ckpts["rope"], tmp_path / "other" / "alibi")  # another model, the same folder name
    corpus = _write_jsonl(tmp_path / "c.jsonl", [40] * 12)
    r = ev.evaluate_many([str(a), str(b)], corpus, [8, 16], split="all", device="cpu", cache_dir=cache)
    table = eval_cli.format_table(r)
    paired = table[table.index("paired difference") :]
    assert f"vs {a}" in paired.splitlines()[0]
    row = next(line for line in paired.splitlines() if "rope" in line)
    assert row.split()[0] == str(b)


def test_one_document_holding_most_tokens_is_said():
    """A new user's sliding example scored 3 documents, 80 % of the tokens from one table file,
    with no word; the CLI and the app now say so (more than half the tokens from one document)."""
    from fireviz.eval import dominant_document_note

    def result(tokens):
        docs = [f"d{i}" for i in range(len(tokens))]
        pd = {"doc": docs, "nats": [1.0] * len(tokens), "tokens": tokens}
        return {"per_length": [{"length": 128, "per_document": pd}, {"length": 512, "error": "no windows"}]}

    note = dominant_document_note([result([10, 80, 10])])
    assert note is not None and "128: 80 % from 'd1'" in note and "512" not in note
    assert dominant_document_note([result([30, 30, 40])]) is None
    assert dominant_document_note([result([50, 50])]) is None  # exactly half is not "most"
    assert dominant_document_note([{"per_length": [{"length": 8, "bits_per_byte": 1.0}]}]) is None


def test_the_reference_is_the_folder_a_path_names_however_it_is_spelled(ckpts, tmp_path, cache, monkeypatch):
    """A breaker's finding: --reference y/alibi (not evaluated) was taken to mean x/alibi (same
    folder name), and ./y/alibi or an absolute path for an evaluated y/alibi was refused."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(ckpts["alibi"], tmp_path / "x" / "alibi")
    shutil.copytree(ckpts["rope"], tmp_path / "y" / "alibi")
    corpus = _write_jsonl(tmp_path / "c.jsonl", [40] * 12)
    kw = dict(split="all", device="cpu", cache_dir=cache)
    with pytest.raises(ev.EvaluationError, match="not one of the evaluated checkpoints"):
        ev.evaluate_many(["x/alibi"], corpus, [8], reference="y/alibi", **kw)
    for spelled in ("./y/alibi", "y/alibi/", str(tmp_path / "y" / "alibi")):
        r = ev.evaluate_many(["x/alibi", "y/alibi"], corpus, [8], reference=spelled, **kw)
        assert r[0]["per_length"][0]["paired_reference"] == "y/alibi" and "paired_delta_bpb" in r[0]["per_length"][0]
        assert "paired_delta_bpb" not in r[1]["per_length"][0]  # y/alibi is the reference
