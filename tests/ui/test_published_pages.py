"""A published causal LM (a folder written by transformers) in the app (issue #36): its length curve
beside a fireviz checkpoint's, its attention on text, its dilution — with no exception."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app_pages import click_and_wait as _click_and_wait  # noqa: E402
from app_pages import ok as _ok  # noqa: E402
from app_pages import page as _page  # noqa: E402
from causal_lm_folders import write_causal_lm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published_app")
    return {"llama": write_causal_lm(root / "llama", "llama"), "gpt2": write_causal_lm(root / "gpt2", "gpt2")}


def test_length_page_draws_a_published_model_beside_a_fireviz_one_on_one_text(app_env, published):
    at = _page("3_Length_generalization.py", ckpt=[str(published["llama"]), "alibi"], len=["16", "48"])
    _ok(at)
    at = _click_and_wait(at, "Run", lambda a: len(a.get("plotly_chart")) >= 3)
    _ok(at)
    assert len(at.get("plotly_chart")) >= 3  # the curve, the paired differences, loss by position
    captions = " ".join(c.value for c in at.caption)
    assert "for every checkpoint" in captions and "tokens per byte" in captions
    assert "no per-document losses" not in captions  # the paired differences are drawn


def test_attention_page_draws_a_published_models_pattern_in_its_own_tokens(app_env, published):
    at = _page("5_Attention.py", ckpt=[str(published["llama"])], alen="40")
    _ok(at)
    assert len(at.get("plotly_chart")) == 1
    assert "own tokenizer" in " ".join(m.value for m in at.markdown)


def test_learned_positions_run_on_the_attention_page_and_are_said_on_the_bias_page(app_env, published):
    at = _page("5_Attention.py", ckpt=[str(published["gpt2"])])
    _ok(at)
    assert len(at.get("plotly_chart")) == 1
    at = _page("1_Learned_biases.py", ckpt=[str(published["gpt2"]), "alibi"])
    assert not at.exception
    assert any("learned absolute positions" in i.value for i in at.info)


def test_dilution_of_a_published_model_is_measured_in_its_own_tokens(app_env, published):
    at = _page("1_Learned_biases.py", ckpt=[str(published["llama"])])
    _ok(at)
    at = _click_and_wait(at, "Measure dilution", lambda a: any("each point averages" in c.value for c in a.caption))
    _ok(at)
    assert any("multiples of its own length" in c.value for c in at.caption)


def test_a_gguf_file_added_in_the_picker_runs_on_the_attention_page(app_env, published, tmp_path):
    from causal_lm_folders import write_gguf

    gguf = write_gguf(tmp_path / "tiny.gguf", published["llama"])
    at = _page("5_Attention.py", ckpt=[str(gguf)], alen="30")
    _ok(at)
    assert len(at.get("plotly_chart")) == 1
    assert "own tokenizer" in " ".join(m.value for m in at.markdown)


def test_dilution_of_a_published_rope_model_is_drawn_with_and_without_a_scaling(app_env, published):
    at = _page("1_Learned_biases.py", ckpt=[str(published["llama"])], dscale="yarn")
    _ok(at)
    at = _click_and_wait(at, "Measure dilution", lambda a: any("each point averages" in c.value for c in a.caption))
    _ok(at)
    assert any("'+ yarn'" in c.value for c in at.caption)
