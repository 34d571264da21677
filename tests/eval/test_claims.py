"""fireviz.eval.claims: the t distribution against tabulated values, Welch's and the paired
t-test against hand-computed references, and the verdict rule on synthetic results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fireviz.eval import claims as cl

# Student's t: two-sided 95 % quantiles t_{0.975, df} (any statistics table; e.g. Abramowitz &
# Stegun table 26.10) and CDF values with closed forms (df = 1: Cauchy; df = 2: t / sqrt(2 (2 + t²)))
T975 = {1: 12.7062047361747, 2: 4.30265272974946, 3: 3.18244630528371, 5: 2.57058183661474, 10: 2.22813885198627,
        30: 2.04227245630124}  # fmt: skip


@pytest.mark.parametrize("df, q", sorted(T975.items()))
def test_t_quantiles_match_the_tables(df, q):
    assert cl.student_t_ppf(0.975, df) == pytest.approx(q, rel=1e-9)
    assert cl.student_t_ppf(0.025, df) == pytest.approx(-q, rel=1e-9)
    assert cl.student_t_cdf(q, df) == pytest.approx(0.975, abs=1e-9)


@pytest.mark.parametrize("t", [-30.0, -2.5, -0.3, 0.0, 0.7, 4.0])
def test_t_cdf_matches_closed_forms_at_df_1_and_2(t):
    assert cl.student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
    assert cl.student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


def test_t_cdf_tends_to_the_normal_and_refuses_bad_input():
    assert cl.student_t_cdf(1.959963984540054, 1e7) == pytest.approx(0.975, abs=1e-6)
    with pytest.raises(ValueError, match="df > 0"):
        cl.student_t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="0 < q < 1"):
        cl.student_t_ppf(1.0, 3)
    with pytest.raises(ValueError, match="a, b > 0"):
        cl.regularized_incomplete_beta(1.0, 1.0, 1.5)


def test_incomplete_beta_against_closed_forms():
    for x in (0.1, 0.5, 0.93):
        assert cl.regularized_incomplete_beta(1.0, 1.0, x) == pytest.approx(x, abs=1e-14)  # uniform
        assert cl.regularized_incomplete_beta(2.0, 1.0, x) == pytest.approx(x * x, abs=1e-14)
        assert cl.regularized_incomplete_beta(1.0, 3.0, x) == pytest.approx(1 - (1 - x) ** 3, abs=1e-14)


def test_welch_matches_a_hand_computed_reference():
    # a = (1, 2, 3), b = (4, 5, 7): means 2 and 16/3, variances 1 and 7/3; se² = 1/3 + 7/9 = 10/9
    # df = (10/9)² / ((1/3)²/2 + (7/9)²/2) = 3.448…; t = −(10/3) / sqrt(10/9) = −3.1623
    r = cl.welch_t_test([1, 2, 3], [4, 5, 7])
    se = math.sqrt(10 / 9)
    df = (10 / 9) ** 2 / ((1 / 3) ** 2 / 2 + (7 / 9) ** 2 / 2)
    assert r.difference == pytest.approx(-10 / 3)
    assert r.t == pytest.approx(-10 / 3 / se)
    assert r.df == pytest.approx(df)
    assert r.p == pytest.approx(2 * cl.student_t_cdf(-10 / 3 / se, df))
    half = cl.student_t_ppf(0.975, df) * se
    assert r.interval == pytest.approx((-10 / 3 - half, -10 / 3 + half))
    assert 0.04 < r.p < 0.045  # R: t.test(c(1,2,3), c(4,5,7)) gives p = 0.04191


def test_paired_t_is_the_one_sample_test_of_the_differences():
    d = [0.5, 0.7, 0.4, 0.9]
    r = cl.paired_t_test(d)
    se = np.std(d, ddof=1) / 2
    assert r.t == pytest.approx(np.mean(d) / se)
    assert r.df == 3
    with pytest.raises(ValueError, match=">= 2"):
        cl.paired_t_test([1.0])
    with pytest.raises(ValueError, match=">= 2"):
        cl.welch_t_test([1.0], [2.0, 3.0])


# -- claims on synthetic results -----------------------------------------------------------------

DOCS = [f"d{k}" for k in range(20)]


def _row(name: str, per_doc_bpb: dict[int, np.ndarray], domain="prose", mode="same_text", **variant) -> dict:
    """A results.json row whose per-document losses give these bits per byte (100 tokens each)."""
    per_length = []
    for n, bpb in per_doc_bpb.items():
        tokens = [100] * len(DOCS)
        nats = (np.asarray(bpb) * math.log(2) * 100).tolist()
        per_length.append(
            {
                "length": n,
                "bits_per_byte": float(np.sum(nats) / np.sum(tokens) / math.log(2)),
                "per_document": {"doc": DOCS, "nats": nats, "tokens": tokens},
            }
        )
    settings = {"data": domain, "mode": mode, "normalizer_cap": None, "rope_scaling": None, **variant}
    return {"checkpoint": name, "settings": settings, "per_length": per_length}


def _results(levels: dict[str, float], rng=None) -> dict[str, list[dict]]:
    rng = rng or np.random.default_rng(0)
    text = rng.normal(2.0, 0.2, len(DOCS))  # documents differ in difficulty; every model shares it
    return {
        name: [_row(name, {512: text + level + rng.normal(0, 0.001, len(DOCS)), 8192: text + level + 0.01})]
        for name, level in levels.items()
    }


def spec(id="c", a=("x",), b=("y",), length=512, **kw) -> cl.ClaimSpec:
    return cl.ClaimSpec(id=id, statement="s", domain="prose", mode="same_text", length=length, a=a, b=b, **kw)


def test_two_arms_of_several_seeds_are_tested_over_seed_means():
    res = _results({"x": 0.0, "x_seed1": 0.01, "x_seed2": -0.01, "y": 0.2, "y_seed1": 0.21, "y_seed2": 0.19})
    c = cl.compute_claim(spec(a=("x", "x_seed1", "x_seed2"), b=("y", "y_seed1", "y_seed2")), res)
    ref = cl.welch_t_test(c["values_a"], c["values_b"])
    assert c["difference"] == pytest.approx(np.mean(c["values_a"]) - np.mean(c["values_b"]))
    assert c["p"] == pytest.approx(ref.p) and c["interval"] == pytest.approx(list(ref.interval))
    assert c["seeds"] == [3, 3] and c["verdict"] == "resolved" and "Welch" in c["test"]


def test_a_difference_inside_the_seed_spread_is_not_resolved():
    res = _results({"x": 0.0, "x_seed1": 0.03, "y": 0.01, "y_seed1": 0.025})
    c = cl.compute_claim(spec(a=("x", "x_seed1"), b=("y", "y_seed1")), res)
    assert c["verdict"] == "unresolved" and c["p"] > cl.P_SUGGESTIVE


def test_one_seed_is_resolved_only_far_beyond_any_seed_spread():
    res = _results({"x": 0.0, "y": 0.05, "z": 0.3})
    small = cl.compute_claim(spec(a=("x",), b=("y",)), res)
    big = cl.compute_claim(spec(a=("z",), b=("x",)), res)
    assert small["interval"][1] < 0 and small["verdict"] == "suggestive"  # clear on this text, one seed
    assert big["verdict"] == "resolved" and big["difference"] == pytest.approx(0.3, abs=0.002)
    same = cl.compute_claim(spec(a=("x",), b=("x",), length=8192, length_b=512), res)
    assert same["difference"] == pytest.approx(0.01, abs=0.002) and same["seeds"] == [1, 1]


def test_the_single_seed_threshold_grows_with_the_measured_seed_spread():
    res = _results({"x": 0.0, "x_seed1": 0.2, "y": 0.15})  # a seed group spread by 0.2
    assert cl.seed_spread(res, "prose", "same_text") == pytest.approx(np.std([0.0, 0.2], ddof=1), abs=0.002)
    c = cl.compute_claim(spec(a=("y",), b=("x", "x_seed1")), res)  # 0.05 beyond the mean: not resolved
    assert c["threshold"] == pytest.approx(3 * cl.seed_spread(res, "prose", "same_text"))
    assert c["verdict"] != "resolved"


def test_one_arm_at_two_lengths_pairs_its_seeds():
    res = _results({"x": 0.0, "x_seed1": 0.02, "x_seed2": 0.04})
    c = cl.compute_claim(
        spec(a=("x", "x_seed1", "x_seed2"), b=("x", "x_seed1", "x_seed2"), length=8192, length_b=512), res
    )
    assert "paired t-test" in c["test"] and c["difference"] == pytest.approx(0.01, abs=0.002)


def test_claims_name_what_is_missing_and_can_wait_for_it():
    res = _results({"x": 0.0, "y": 0.1})
    with pytest.raises(cl.ClaimError, match="no results for checkpoint 'w'"):
        cl.compute_claim(spec(a=("w",)), res)
    with pytest.raises(cl.ClaimError, match="no length 1024"):
        cl.compute_claim(spec(length=1024), res)
    with pytest.raises(cl.ClaimError, match="normalizer_cap"):
        cl.compute_claim(spec(variant_a={"normalizer_cap": 512}), res)
    done, left = cl.compute_claims([spec(id="ok"), spec(id="later", a=("w",))], res, skip_missing=True)
    assert [c["id"] for c in done] == ["ok"] and left == ["later"]


def test_quotes_are_rewritten_from_the_claims_and_unknown_ids_refused():
    res = _results({"x": 0.0, "y": 0.3})
    c = cl.compute_claim(spec(id="xy"), res)
    text = "X is ahead: <!-- claim:xy -->old numbers<!-- /claim -->; <!-- claim:p -->?<!-- /claim -->."
    out = cl.quote_claims(text, [c], pending=["p"])
    assert cl.format_claim(c) in out and "old numbers" not in out and cl.PENDING_TEXT in out
    assert cl.quote_claims(out, [c], pending=["p"]) == out
    assert cl.quoted_claim_ids(out) == ["xy", "p"]
    with pytest.raises(cl.ClaimError, match="'p'"):
        cl.quote_claims(text, [c])


def test_specs_are_read_and_checked(tmp_path):
    good = tmp_path / "c.toml"
    good.write_text('[[claim]]\nid = "a"\nstatement = "s"\ndomain = "prose"\nmode = "context"\nlength = "full"\n'
                    'a = ["x"]\nb = ["y"]\nlength_b = 448\nvariant_a = { normalizer_cap = 512 }\n')  # fmt: skip
    (s,) = cl.read_claim_specs(good)
    assert s.length == "full" and s.length_b == 448 and s.variant_a == {"normalizer_cap": 512}
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('mode = "context"', 'mode = "sliding"'))
    with pytest.raises(cl.ClaimError, match="mode 'sliding'"):
        cl.read_claim_specs(bad)
    bad.write_text(good.read_text() + good.read_text())
    with pytest.raises(cl.ClaimError, match="duplicate"):
        cl.read_claim_specs(bad)
