"""Issue #51: every comparison the docs make is checkpoints/claims.json, computed from the shipped
results.json files by the stated rule, and the docs quote it rather than typing numbers.

These read the repository's own files (docs/claims.toml, checkpoints/*/results.json,
checkpoints/claims.json, checkpoints/RESULTS.md, docs/findings.md)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from fireviz.eval import claims as cl

ROOT = Path(__file__).resolve().parents[2]
CKPTS = ROOT / "checkpoints"
SPECS = ROOT / "docs" / "claims.toml"
FINDINGS = ROOT / "docs" / "findings.md"
#: a comparative number: an explicit sign and at least three decimals (a difference in bits per byte)
SIGNED = re.compile(r"(?<![\w.])[+−-]\d+\.\d{3,}")


def shipped_results() -> dict[str, list[dict]]:
    return {
        p.name: json.loads((p / "results.json").read_text())
        for p in sorted(CKPTS.iterdir())
        if (p / "model.safetensors").is_file() and (p / "results.json").is_file()
    }


@pytest.fixture(scope="module")
def published() -> dict:
    return json.loads((CKPTS / "claims.json").read_text())


@pytest.fixture(scope="module")
def recomputed() -> tuple[list[dict], list[str]]:
    return cl.compute_claims(cl.read_claim_specs(SPECS), shipped_results(), skip_missing=True)


def test_claims_json_is_what_the_results_give(published, recomputed):
    claims, pending = recomputed
    assert published["pending"] == pending
    assert [c["id"] for c in published["claims"]] == [c["id"] for c in claims]
    for mine, theirs in zip(claims, published["claims"], strict=True):
        assert set(mine) == set(theirs), mine["id"]
        for k, v in mine.items():
            if isinstance(v, float):
                assert theirs[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (mine["id"], k)
            elif isinstance(v, list) and v and isinstance(v[0], float):
                assert theirs[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (mine["id"], k)
            else:
                assert theirs[k] == v, (mine["id"], k)


def test_no_claim_is_resolved_beyond_what_its_seeds_support(published):
    for c in published["claims"]:
        na, nb = c["seeds"]
        assert (na, nb) == (len(c["a"]), len(c["b"])), c["id"]
        if na >= 2 and nb >= 2:
            assert c["verdict"] == ("resolved" if c["p"] < 0.05 else "suggestive" if c["p"] < 0.2 else "unresolved")
        else:
            lo, hi = c["interval"]
            excludes = not lo <= 0 <= hi
            big = abs(c["difference"]) >= c["threshold"] >= cl.SINGLE_SEED_RESOLVED_BPB
            assert c["verdict"] == ("resolved" if excludes and big else "suggestive" if excludes else "unresolved")


def test_every_claim_is_quoted_and_every_quote_is_a_claim(published):
    text = FINDINGS.read_text(encoding="utf-8")
    quoted = cl.quoted_claim_ids(text)
    specs = [s.id for s in cl.read_claim_specs(SPECS)]
    assert set(quoted) == set(specs), (sorted(set(specs) - set(quoted)), sorted(set(quoted) - set(specs)))


def test_the_docs_quote_the_computed_numbers(published):
    text = FINDINGS.read_text(encoding="utf-8")
    assert cl.quote_claims(text, published["claims"], published["pending"]) == text, (
        "docs/findings.md's claim quotes are not claims.json's: run python scripts/publish_results.py --claims-only"
    )


def test_every_other_comparative_number_in_findings_is_in_the_results_tables():
    """A signed difference outside the claim quotes (e.g. one seed against ALiBi seed 0) must be a
    cell of checkpoints/RESULTS.md, not typed by hand."""
    text = cl.CLAIM_QUOTE.sub("", FINDINGS.read_text(encoding="utf-8"))
    table = (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
    cells = {m.replace("−", "-") for m in SIGNED.findall(table)}
    stray = sorted({m for m in SIGNED.findall(text) if m.replace("−", "-") not in cells})
    assert not stray, f"docs/findings.md quotes differences that no table holds: {stray}"


def test_results_md_lists_the_claims(published):
    spec = importlib.util.spec_from_file_location("publish_results", ROOT / "scripts" / "publish_results.py")
    pub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pub)
    section = "\n".join(pub.claims_section(published))
    assert section in (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
