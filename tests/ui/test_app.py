"""AppTests: each page driven through its main widgets, asserting on what it shows.

The app is pointed at tiny checkpoints (tests/conftest.py: fire, alibi, rope; 2 layers × 2
heads, trained length 32) through FIREVIZ_CHECKPOINTS_DIR, and at a fresh evaluation cache.
Figures are compared with the library's own numbers, so a page that drew the wrong curve fails.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import fireviz.checkpoints as fireviz_checkpoints
from fireviz import ui
from fireviz.analysis import biases as analysis
from fireviz.analysis import text_attention
from fireviz.checkpoints import Checkpoint
from fireviz.checkpoints import catalog as checkpoints
from fireviz.checkpoints import records as run_records
from fireviz.eval import evaluation as evaluate
from fireviz.eval.cache import default_cache_dir
from fireviz.eval.settings import EvalSettings
from fireviz.model.gpt import GPT, CheckpointError
from fireviz.ui import jobs

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60  # seconds per script run: tiny models, but CPUs are shared


def said(element) -> str:
    """An error's text as the user reads it: the Markdown escapes of ``ui.plain`` taken out."""
    return re.sub(r"\\(.)", r"\1", element.value)


def page(name: str, **query) -> AppTest:
    at = AppTest.from_file(str(ROOT / name), default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = v
    return at


def figures(at: AppTest) -> list[dict]:
    """The plotly figures a run drew, as JSON dicts."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def arr(v) -> np.ndarray:
    """A plotly array (plain list or base64 typed array) as numpy."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape(v["shape"]) if isinstance(v.get("shape"), list) else a
    return np.asarray(v, dtype=float)


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def run_until(at: AppTest, done, timeout: float = 90.0) -> AppTest:
    """Re-run the page (as the page's polling fragment would) until ``done(at)`` or timeout."""
    end = time.time() + timeout
    at.run()
    while not done(at) and time.time() < end:
        no_exception(at)
        time.sleep(0.25)
        at.run()
    no_exception(at)
    assert done(at), "the page never showed the finished result"
    return at


# -- Home ---------------------------------------------------------------------------------------
def test_home_lists_checkpoints_with_headline_numbers(app_env):
    at = page("app.py").run()
    no_exception(at)
    df = at.dataframe[0].value
    assert sorted(df["checkpoint"]) == ["alibi", "fire", "rope"]
    fire = df[df["checkpoint"] == "fire"].iloc[0]
    # from fire/results_prose.json: 1.5 and 2.5 nats/token at 32 and 256 tokens → bits per byte
    assert fire["bpb @ 32"] == pytest.approx(1.5 / math.log(2), abs=1e-4)
    assert fire["bpb @ 256"] == pytest.approx(2.5 / math.log(2), abs=1e-4)
    assert fire["parameters"] == checkpoints.read_checkpoint(app_env / "fire").num_parameters
    alibi = df[df["checkpoint"] == "alibi"].iloc[0]  # no results JSON: last val_loss of the log
    last = [r for r in checkpoints.read_train_log(app_env / "alibi") if "val_loss" in r][-1]
    assert alibi["val loss (nats/token)"] == pytest.approx(last["val_loss"], abs=1e-4)
    assert fire["progress"] == "step 20"  # config training.steps; no max_steps recorded
    assert any("bpb = bits per byte" in said(c) for c in at.caption)
    at.switch_page("pages/4_Training_runs.py").run()  # the navigation reaches every page
    no_exception(at)
    assert figures(at)


def test_headline_ignores_zero_shot_rope_variants():
    own = {
        "settings": {"data": "prose", "rope_scaling": None},
        "per_length": [{"length": 512, "bits_per_byte": 2.0}, {"length": 4096, "bits_per_byte": 3.0}],
    }
    yarn = {
        "settings": {"data": "prose", "rope_scaling": "yarn"},
        "per_length": [{"length": 512, "bits_per_byte": 2.0}, {"length": 4096, "bits_per_byte": 2.5}],
    }
    head = checkpoints.headline_numbers(512, {"results.json": [own, yarn]}, [])
    assert head["bpb @ 4096"] == 3.0  # the checkpoint's own number, not YaRN's


def test_headline_shows_only_plain_numbers_made_on_these_weights():
    """Issue #38: a capped FIRE row, a context-use row (its lengths are context lengths) or a row
    made on other weights never stands in for the checkpoint's own number."""
    sha = "a" * 64

    def row(bpb_512, bpb_4096, **settings):
        return {
            "checkpoint_sha256": settings.pop("sha", sha),
            "settings": {"data": "prose", "mode": "same_text", **settings},
            "per_length": [{"length": 512, "bits_per_byte": bpb_512}, {"length": 4096, "bits_per_byte": bpb_4096}],
        }

    own = row(1.955, 2.128)
    capped = row(1.955, 1.953, normalizer_cap=512)
    context = row(1.90, 1.89, mode="context")
    stale = row(1.0, 1.0, sha="b" * 64)
    train_split = row(0.5, 0.5, split="train")
    bf16 = row(0.7, 0.7, precision="bfloat16")
    failed = row(0.1, 0.1)
    for e in failed["per_length"]:
        e["error"] = "not computed"
    others = [capped, context, stale, train_split, bf16, failed]
    for order in ([own, *others], [*others, own], [others[2], own, *others[3:], *others[:2]]):
        head = checkpoints.headline_numbers(512, {"results.json": order}, [], sha)
        assert (head["bpb @ 512"], head["bpb @ 4096"]) == (1.955, 2.128)
    log = [{"step": 10, "val_loss": 1.25}]
    assert checkpoints.headline_numbers(512, {"results.json": [stale]}, log, sha)["source"] == "train_log step 10"


def test_headline_numbers_are_not_rounded_before_display():
    """Rounding to 4 places and then showing 3 turned 1.95054 into 1.950 (README: 1.951)."""
    own = {"settings": {"data": "prose"}, "per_length": [{"length": 512, "bits_per_byte": 1.95054}]}
    assert checkpoints.headline_numbers(512, {"results.json": own}, [])["bpb @ 512"] == 1.95054


def test_seed_runs_are_named_and_sorted_after_seed_zero(tmp_path):
    from conftest import make_tiny_checkpoint

    assert checkpoints.seed_run("fire_seed2") == ("fire", 2)
    assert checkpoints.seed_base("fire_seed2") == "fire" and checkpoints.seed_base("fire_seedling") == "fire_seedling"
    assert checkpoints.seed_run("kerple_power_seed10") == ("kerple_power", 10)
    for name in ("fire", "fire_seed0", "fire_seedling", "seed1", "fire_seed-1"):
        assert checkpoints.seed_run(name) is None, name
    names = ["alibi", "fire", "fire_seed1", "fire_seed2", "kerple_power", "kerple_power_seed1", "rope"]
    assert checkpoints.seed0_first(names)[:4] == ["alibi", "fire", "kerple_power", "rope"]
    assert sorted(checkpoints.seed0_first(names)) == names
    folder = make_tiny_checkpoint(tmp_path / "fire_seed3", "fire", seed=3)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["training"]["settings"] = {"seed": 3}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert checkpoints.read_checkpoint(folder).summary_row()["training seed"] == 3


def test_length_generalization_pools_training_seeds(tmp_path, monkeypatch):
    """With "pool" on, fire and fire_seed1 are one line: the mean perplexity ± sample std."""
    from conftest import make_tiny_checkpoint

    root = tmp_path / "root"
    for name, enc, seed in (("fire", "fire", 0), ("fire_seed1", "fire", 11), ("alibi", "alibi", 1)):
        make_tiny_checkpoint(root / name, enc, seed=seed)
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    at = page(
        "pages/3_Length_generalization.py",
        domain="upload",
        ckpt=["fire", "fire_seed1", "alibi"],
        len=["16", "32"],
        budget="256",
        pool="true",
        mode="nonoverlapping",
    ).run()
    at.sidebar.file_uploader(key="lengen_upload").upload("tiny.jsonl", _tiny_jsonl()).run()
    no_exception(at)
    assert at.sidebar.checkbox(key="lengen_pool").value is True
    at.button(key="lengen_run").click()
    run_until(at, lambda a: len(a.get("plotly_chart")) == 3)  # perplexity, paired difference, loss by position
    ppl = figures(at)[0]
    lines = [t for t in ppl["data"] if t.get("mode") == "lines+markers"]
    assert [(t["meta"]["group"], t["meta"]["n"]) for t in lines] == [("fire", 2), ("alibi", 1)]
    assert lines[0]["name"] == "fire (mean ± std, 2 seeds)"
    upload = next(Path(p) for p in (Path(default_cache_dir()) / "uploads").rglob("tiny.jsonl"))
    ref = evaluate.evaluate_many(
        [str(root / "fire"), str(root / "fire_seed1")],
        str(upload),
        [16, 32],
        mode="nonoverlapping",
        token_budget=256,
        split="all",
        device="cpu",
    )
    ppls = np.array([[e["perplexity"] for e in r["per_length"]] for r in ref])
    assert not np.allclose(ppls[0], ppls[1])  # two different models
    fire = lines[0]
    np.testing.assert_allclose(arr(fire["y"]), np.exp(np.log(ppls).mean(0)), rtol=1e-9)  # exp(mean nats)
    np.testing.assert_allclose(arr(fire["error_y"]["array"]), ppls.std(0, ddof=1), rtol=1e-9)
    table = at.dataframe[0].value
    bpb = np.array([[e["bits_per_byte"] for e in r["per_length"]] for r in ref])
    fire_rows = table[table["group"] == "fire"]
    np.testing.assert_allclose(fire_rows["bits_per_byte"], bpb.mean(0), rtol=1e-9)
    np.testing.assert_allclose(fire_rows["bits_per_byte_std"], bpb.std(0, ddof=1), rtol=1e-9)
    assert set(table[table["group"] == "fire"]["n"]) == {2} and set(table[table["group"] == "alibi"]["n"]) == {1}
    assert any("Seeds pooled" in said(c) for c in at.caption)
    assert any("window seed 0" in said(c) for c in at.caption)
    # off: one line per checkpoint again; without a second seed chosen the sidebar says which exist
    hint = page("pages/3_Length_generalization.py", ckpt=["alibi", "fire_seed1"]).run()
    assert not hint.sidebar.checkbox and any("fire, fire_seed1" in c.value for c in hint.sidebar.caption)
    # extra seeds alone pool too (under the encoding's name)
    assert ui.pool_seeds([{"checkpoint": "fire_seed1"}, {"checkpoint": "fire_seed2"}])[1]["label"] == "fire"
    at.sidebar.checkbox(key="lengen_pool").uncheck().run()
    no_exception(at)
    assert {t["meta"]["group"] for t in figures(at)[0]["data"] if t.get("mode") == "lines+markers"} == {
        "fire",
        "fire_seed1",
        "alibi",
    }
    assert not [c for c in at.dataframe[0].value.columns if c.endswith("_std")]  # nothing pooled: no std columns


def test_length_generalization_shows_shipped_results_without_run(tmp_path, monkeypatch):
    """On an empty cache the page shows a checkpoint's own results.json at once, without Run and
    without a background job — all three of RoPE, RoPE + PI and RoPE + YaRN (each looked up
    directly, evaluate.cached_results)."""
    from conftest import make_tiny_checkpoint

    root = tmp_path / "root"
    make_tiny_checkpoint(root / "rope", "rope", seed=2)
    kw = dict(mode="nonoverlapping", token_budget=256, device="cpu", cache_dir=tmp_path / "publisher")
    shipped = [
        evaluate.evaluate_many([str(root / "rope")], "prose", [64], rope_scaling=s, **kw)[0]
        for s in (None, "pi", "yarn")
    ]
    (root / "rope" / "results.json").write_text(json.dumps(shipped))
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "empty-cache"))
    at = page(
        "pages/3_Length_generalization.py",
        ckpt="rope",
        len="64",
        budget="256",
        scaling=["pi", "yarn"],
        mode="nonoverlapping",
    )
    before = len(jobs.default_queue("evaluate").jobs())
    at.run()  # one run: the lookup is direct, nothing to wait for
    no_exception(at)
    assert len(jobs.default_queue("evaluate").jobs()) == before  # nothing was submitted
    table = at.dataframe[0].value
    assert list(table["group"]) == ["rope", "rope + pi", "rope + yarn"]
    expected = [r["per_length"][0]["bits_per_byte"] for r in shipped]
    np.testing.assert_allclose(table["bits_per_byte"], expected, rtol=1e-12)
    assert len(set(expected)) == 3  # at 2× the training length the three differ: each from its own row
    assert any("3 from the checkpoints' shipped results.json" in said(c) for c in at.caption)
    assert not list((tmp_path / "empty-cache").glob("*.json"))  # read in place, not copied


def test_length_generalization_device_choice_with_a_gpu(app_env, monkeypatch):
    """With a GPU the page offers GPU or CPU; on CPU the float32 numbers (the bundled ones) apply."""
    monkeypatch.setattr(checkpoints, "default_device", lambda: "cuda")
    at = page("pages/3_Length_generalization.py", ckpt="fire", len="32", budget="256", device="cpu").run()
    no_exception(at)
    radio = at.sidebar.radio(key="lengen_device")
    assert radio.options == ["GPU (bf16 autocast)", "CPU (float32)"] and radio.value == "cpu"
    assert any("on cpu" in said(c) for c in at.caption)
    assert at.query_params["device"] == "cpu"


def test_headline_reads_only_evaluate_results_not_other_json():
    """A JSON of another shape in the folder (here a loss in nats) is not taken for bits per byte."""
    other = {"runs": [{"per_length": [{"length": 512, "loss": 1.0}]}], "settings": {"data": "prose"}}
    log = [{"step": 10, "val_loss": 1.25}]
    head = checkpoints.headline_numbers(512, {"notes.json": other}, log)
    assert head == {"val loss (nats/token)": 1.25, "source": "train_log step 10"}


def test_truncated_checkpoint_is_skipped_with_the_reason(tmp_path, monkeypatch):
    from conftest import make_tiny_checkpoint

    good = make_tiny_checkpoint(tmp_path / "root" / "good", "alibi")
    bad = make_tiny_checkpoint(tmp_path / "root" / "bad", "fire")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["training"]["settings"] = {"max_steps": 100}
    (bad / "config.json").write_text(json.dumps(cfg))
    assert checkpoints.read_checkpoint(bad).summary_row()["progress"] == "step 20 / 100 (interim)"
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    infos, problems = checkpoints.scan_checkpoints(tmp_path / "root")
    assert [i.name for i in infos] == [good.name] and "truncated" in problems[str(bad)]
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(tmp_path / "root"))
    at = page("app.py").run()
    no_exception(at)
    assert list(at.dataframe[0].value["checkpoint"]) == ["good"]
    assert any("bad" in w.value and "truncated" in w.value for w in at.warning)


def test_home_without_checkpoints_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(tmp_path / "empty"))
    at = page("app.py").run()
    no_exception(at)
    assert any("python -m fireviz train" in i.value for i in at.info)
    assert not at.dataframe


# -- Learned biases -----------------------------------------------------------------------------
def test_biases_grid_matches_the_library(app_env):
    at = page("pages/1_Learned_biases.py", ckpt="fire").run()
    no_exception(at)
    fig = figures(at)[0]
    model = fireviz_checkpoints.load_model(app_env / "fire")
    rep = analysis.bias_report(model).to_dict()
    # the grid has one line per (layer, head, query position); check every one against the library
    assert len(fig["data"]) == 2 * 2 * len(rep["query_positions"])
    for tr in fig["data"]:
        m = tr["meta"]
        curve = next(c for c in rep["layers"][m["layer"]]["curves"] if c["query_position"] == m["query_position"])
        np.testing.assert_allclose(
            arr(tr["y"]), np.asarray(curve["bias"][m["head"]])[arr(tr["x"]).astype(int)], rtol=1e-5, atol=1e-6
        )
    # locality table: one row per layer × head, same classes as the library
    table = at.dataframe[1].value
    expected = analysis.locality_table([rep])
    assert list(table["locality"]) == [r["locality"] for r in expected]
    assert list(table["rank_correlation"]) == pytest.approx([r["rank_correlation"] for r in expected])


def test_a_t5_grid_opens_on_a_log_distance_axis(tmp_path, monkeypatch):
    """T5's buckets change within 128 tokens and are flat beyond: its grid opens on the log axis
    (issue #40), which the sidebar can switch back; other encodings open on the linear one."""
    from conftest import make_tiny_checkpoint

    for enc in ("t5", "alibi"):
        make_tiny_checkpoint(tmp_path / enc, enc)
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(tmp_path))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for ckpt, want in (("t5", "log"), ("alibi", None)):
        at = page("pages/1_Learned_biases.py", ckpt=ckpt).run()
        no_exception(at)
        grid = figures(at)[0]
        assert grid["layout"]["xaxis"].get("type") == want
        assert min(arr(grid["data"][0]["x"])) == (1 if want else 0)
    at = page("pages/1_Learned_biases.py", ckpt="t5", x="distance").run()
    assert figures(at)[0]["layout"]["xaxis"].get("type") is None


def test_biases_one_head_view_from_the_url_and_two_checkpoints(app_env):
    at = page("pages/1_Learned_biases.py", ckpt=["fire", "alibi"], view="head", layer="1", head="1", pos="31,63").run()
    no_exception(at)
    figs = figures(at)
    assert len(figs) == 5  # per checkpoint: curves + heatmap, side by side; FIRE also f_θ's input
    curves = [f for f in figs if f["data"][0]["type"] == "scatter" and "query_position" in f["data"][0]["meta"]]
    assert len(curves) == 2
    assert {tr["meta"]["query_position"] for f in curves for tr in f["data"]} == {31, 63}
    assert all(tr["meta"]["layer"] == 1 and tr["meta"]["head"] == 1 for f in curves for tr in f["data"])
    # ALiBi head 1 of 2: slope 2^-8 → bias −d/256 at every query position
    alibi = next(f for f in curves if "alibi" in f["layout"]["title"]["text"])
    tr = alibi["data"][0]
    np.testing.assert_allclose(arr(tr["y"]), -arr(tr["x"]) * 2.0**-8, atol=1e-6)
    assert at.query_params["view"] == "head" and at.query_params["layer"] == "1"
    # switching the layer widget writes the URL
    at.sidebar.selectbox(key="biases_layer").set_value(0).run()
    assert at.query_params["layer"] == "0"
    assert at.query_params["ckpt"] == ["fire", "alibi"]


def test_biases_heatmap_colour_limit_from_the_url(app_env):
    """clip=5 saturates the heatmap's colours at −5 logits; the plotted bias keeps its values."""
    at = page("pages/1_Learned_biases.py", ckpt="alibi", view="head", layer="0", head="0").run()
    no_exception(at)
    heat = next(f for f in figures(at) if f["data"][0]["type"] == "heatmap")["data"][0]
    assert "zmin" not in heat and np.nanmin(arr(heat["z"])) < -5  # ALiBi head 0: slope 1/16 out to 255 tokens
    at.sidebar.selectbox(key="biases_clip").set_value(5).run()
    no_exception(at)
    assert at.query_params["clip"] == "5"
    heat2 = next(f for f in figures(at) if f["data"][0]["type"] == "heatmap")["data"][0]
    assert heat2["zmin"] == -5 and "saturated" in heat2["colorbar"]["title"]["text"]
    np.testing.assert_array_equal(arr(heat2["z"]), arr(heat["z"]))


@pytest.mark.parametrize("bad", ["inf", "-1e400", "nan", "20.9", "abc", ""])
def test_a_bad_url_value_falls_back_to_the_default(app_env, bad):
    """A stale or hand-edited link still opens: each bad value is dropped, the page runs."""
    at = page("pages/1_Learned_biases.py", ckpt="alibi", view="head", layer=bad, clip=bad).run()
    no_exception(at)
    assert at.sidebar.selectbox(key="biases_clip").value == 0 and at.sidebar.selectbox(key="biases_layer").value == 0
    at = page("pages/4_Training_runs.py", smooth=bad).run()
    no_exception(at)
    assert at.sidebar.selectbox(key="train_smooth").value == 50


def test_biases_bad_query_positions_is_a_clear_error(app_env):
    at = page("pages/1_Learned_biases.py", ckpt="fire").run()
    at.sidebar.text_input(key="biases_pos").set_value("12, abc").run()
    no_exception(at)
    assert any("abc" in said(e) and "comma-separated" in said(e) for e in at.error)


def test_learned_biases_opens_on_fire(app_env):
    """A new user's first view of Learned biases was RoPE's "no additive bias": it opens on FIRE."""
    at = page("pages/1_Learned_biases.py").run()
    no_exception(at)
    assert at.sidebar.multiselect[0].value == ["fire"]
    assert not any("No additive bias" in said(i) for i in at.info)


def test_rotary_first_then_additive_summary_and_caption(app_env):
    at = page("pages/1_Learned_biases.py", ckpt=["rope", "alibi"]).run()
    no_exception(at)
    assert len(figures(at)) == 2  # the rotary kernel and the alibi grid, stacked full width
    summary = at.dataframe[0].value
    rope = summary[summary["checkpoint"] == "rope"].iloc[0]
    assert rope["share_local"] == "—" and rope["classify_at"] == "—" and "kernel" in rope["note"]
    alibi = summary[summary["checkpoint"] == "alibi"].iloc[0]
    assert str(alibi["classify_at"]) == "31" and alibi["share_local"].endswith("%")
    captions = " ".join(said(c) for c in at.caption)
    assert "i = 31 tokens" in captions and "None" not in captions and "{" not in captions
    assert "position kernel, not an additive bias" in captions


def test_rotary_checkpoint_shows_the_kernel_not_a_bias(app_env):
    at = page("pages/1_Learned_biases.py", ckpt="rope").run()
    no_exception(at)
    fig = figures(at)[0]
    assert fig["data"][0]["meta"]["kernel"] is True
    assert arr(fig["data"][0]["y"])[0] == pytest.approx(1.0)  # cos(0) averaged over frequencies


def test_add_checkpoint_bad_path_and_offline_hub_id(app_env, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)  # deterministic "offline", whatever the network
    at = page("pages/4_Training_runs.py").run()
    at.sidebar.text_input(key="train_add_ref").set_value("/no/such/folder")
    at.sidebar.button(key="train_add_btn").click().run()
    no_exception(at)
    assert any("/no/such/folder" in said(e) for e in at.sidebar.error)
    at.sidebar.text_input(key="train_add_ref").set_value("nobody-xyz/not-a-fireviz-repo")
    at.sidebar.button(key="train_add_btn").click().run()
    no_exception(at)
    msg = " ".join(said(e) for e in at.sidebar.error)
    assert "nobody-xyz/not-a-fireviz-repo" in msg and "Hugging Face Hub" in msg and "cache" in msg
    assert figures(at), "the page stays up and still draws the bundled checkpoints' curves"


def test_add_checkpoint_by_local_folder(app_env, tmp_path):
    from conftest import make_tiny_checkpoint

    extra = make_tiny_checkpoint(tmp_path / "elsewhere", "t5", log_steps=7)
    at = page("pages/4_Training_runs.py").run()
    at.sidebar.text_input(key="train_add_ref").set_value(str(extra))
    at.sidebar.button(key="train_add_btn").click().run()
    at.sidebar.multiselect(key="train_ckpt").set_value([str(extra)]).run()
    no_exception(at)
    fig = figures(at)[0]
    loss = [tr for tr in fig["data"] if tr["meta"]["series"] == "loss"]
    assert len(loss) == 1 and len(arr(loss[0]["y"])) == 7


# -- Fit FIRE -----------------------------------------------------------------------------------
def test_fit_alibi_live_and_download(app_env):
    at = page("pages/2_Fit_FIRE.py", target="alibi", heads="2", max_len="16", steps="0", width="8").run()
    no_exception(at)
    at.button(key="fit_go").click()
    run_until(at, lambda a: len(a.get("plotly_chart")) == 2)
    fig = figures(at)[0]
    target = next(tr for tr in fig["data"] if tr["meta"]["series"] == "target")
    d = arr(target["x"])
    np.testing.assert_allclose(arr(target["y"]), -(0.5**4) * d, atol=1e-6)  # head 0 of 2: slope 2^-4
    fitted = next(tr for tr in fig["data"] if tr["meta"]["series"] == "fitted")
    assert np.max(np.abs(arr(fitted["y"]) - arr(target["y"]))) < 1e-3  # ALiBi is linear in d: FIRE fits it
    labels = [m.label for m in at.metric]
    assert any("relative RMSE" in lab for lab in labels)
    assert all(len(lab) <= 22 for lab in labels)  # short enough for a quarter-width tile
    rmse = next(m for m in at.metric if m.label == "relative RMSE")
    assert rmse.value.endswith("%")  # as the CLI: relative RMSE in percent
    assert next(m for m in at.metric if m.label == "fit time").value.endswith(" s")
    (mark,) = [sh for sh in fig["layout"]["shapes"] if sh.get("label", {}).get("text")]
    assert mark["label"]["text"] == "fitted 0–15"  # max_len 16: distances 0 … 15
    captions = " ".join(said(c) for c in at.caption)
    assert "{" not in captions and "slopes 0.0625, 0.00391" in captions
    # the same fit again: the finished job is reused and said to be cached
    at.button(key="fit_go").click().run()
    no_exception(at)
    assert next(m for m in at.metric if m.label == "fit time").value == "cached"
    # labels are short; the tooltip is the file name (as plain text: ui.plain's escapes taken out)
    names = [re.sub(r"\\(.)", r"\1", b.proto.help) for b in at.get("download_button")]
    assert any("fire_fit_alibi_L16.safetensors" in n for n in names) and any(n.endswith(".json") for n in names), names
    assert not any("settings have changed" in i.value for i in at.info)
    # settings changed without a new Fit: the old result stays, marked as such
    at.number_input(key="fit_width").set_value(16).run()
    no_exception(at)
    assert any("Showing the last fit (ALiBi" in i.value and "Press **Fit**" in i.value for i in at.info)


def test_fit_bad_kerple_parameter_is_a_clear_error(app_env):
    at = page("pages/2_Fit_FIRE.py", target="kerple_log", r1="-1", steps="0").run()
    at.button(key="fit_go").click().run()
    no_exception(at)
    assert any("r1" in said(e) and "Cannot fit" in said(e) for e in at.error)
    at = page("pages/2_Fit_FIRE.py", target="kerple_log", r1="0.5,x", steps="0").run()
    no_exception(at)
    assert any("r1 must be a number or comma-separated numbers" in said(e) for e in at.error)


# -- Length generalization ----------------------------------------------------------------------
def _tiny_jsonl() -> bytes:
    docs = [{"id": f"d{k}", "text": ("The quick brown fox jumps over the lazy dog. " * (8 + k))} for k in range(4)]
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def test_length_generalization_default_lengths_are_a_quarter_to_16x_the_training_length(app_env):
    at = page("pages/3_Length_generalization.py", ckpt="fire").run()
    no_exception(at)
    assert at.sidebar.multiselect(key="lengen_len").value == [8, 16, 32, 64, 128, 256, 512]


def test_job_error_text_strips_the_checkpoint_error_prefix():
    from fireviz import ui

    assert ui.job_error_text("CheckpointError: x is truncated; copy it again") == (
        "x is truncated; copy it again",
        True,
    )
    assert ui.job_error_text("ValueError: bad stride") == ("ValueError: bad stride", False)


def test_length_generalization_bad_upload_is_a_clear_error(app_env):
    at = page("pages/3_Length_generalization.py", domain="upload", ckpt="fire").run()
    no_exception(at)
    at.sidebar.file_uploader(key="lengen_upload").upload("bad.jsonl", b'{"id": 1, "txt": "no text field"}\n').run()
    no_exception(at)
    assert any("bad.jsonl" in said(e) and "'text'" in said(e) for e in at.error)


def test_length_generalization_runs_in_background_once_and_matches_evaluate(app_env):
    q = jobs.default_queue("evaluate")
    at = page(
        "pages/3_Length_generalization.py",
        domain="upload",
        ckpt=["fire", "alibi"],
        len=["16", "32", "64"],
        budget="256",
        mode="nonoverlapping",
    ).run()
    at.sidebar.file_uploader(key="lengen_upload").upload("tiny.jsonl", _tiny_jsonl()).run()
    no_exception(at)
    before = len(q.jobs())
    at.button(key="lengen_run").click()
    run_until(at, lambda a: len(a.get("plotly_chart")) == 3)
    assert len(q.jobs()) == before + 1
    ppl = figures(at)[0]
    assert {tr["name"] for tr in ppl["data"]} == {"fire", "alibi"}
    assert ppl["layout"]["yaxis"]["type"] == "log"
    caption = " ".join(said(c) for c in at.caption)
    assert "device cpu" in caption and "token budget 256" in caption
    table = at.dataframe[0].value
    np.testing.assert_allclose(table["bits_per_byte"], table["nats_per_token"] / math.log(2))
    # the same numbers as the library (now all from the on-disk cache the job wrote)
    upload = next(Path(p) for p in (Path(default_cache_dir()) / "uploads").rglob("tiny.jsonl"))
    ref = evaluate.evaluate_many(
        [str(app_env / "fire"), str(app_env / "alibi")],
        str(upload),
        [16, 32, 64],
        mode="nonoverlapping",
        token_budget=256,
        split="all",
        device="cpu",
    )
    for r in ref:
        assert all(e["cached"] for e in r["per_length"])
        tr = next(t for t in ppl["data"] if t["name"] == r["checkpoint"])
        np.testing.assert_allclose(arr(tr["y"]), [e["perplexity"] for e in r["per_length"]], rtol=1e-9)
        np.testing.assert_array_equal(arr(tr["x"]), [16, 32, 64])
    # a second tab (new session) with the same settings finds the finished job: no new run
    tab2 = page(
        "pages/3_Length_generalization.py",
        domain="upload",
        ckpt=["fire", "alibi"],
        len=["16", "32", "64"],
        budget="256",
        mode="nonoverlapping",
    ).run()
    tab2.sidebar.file_uploader(key="lengen_upload").upload("tiny.jsonl", _tiny_jsonl()).run()
    no_exception(tab2)
    assert len(tab2.get("plotly_chart")) == 3
    tab2.button(key="lengen_run").click().run()
    assert len(q.jobs()) == before + 1, "pressing Run again must not start the same evaluation twice"


# -- Training runs ------------------------------------------------------------------------------
def test_training_runs_plot_the_logs(app_env):
    at = page("pages/4_Training_runs.py").run()
    no_exception(at)
    assert at.sidebar.multiselect(key="train_ckpt").value == ["rope", "alibi", "fire"]  # the paper's order
    fig = figures(at)[0]
    log = checkpoints.read_train_log(app_env / "fire")
    tr = next(t for t in fig["data"] if t["meta"] == {"run": "fire", "series": "val_loss"})
    np.testing.assert_allclose(arr(tr["y"]), [r["val_loss"] for r in log if "val_loss" in r])
    np.testing.assert_allclose(arr(tr["x"]), [r["tokens"] for r in log if "val_loss" in r])
    train = next(t for t in fig["data"] if t["meta"]["run"] == "fire" and t["meta"]["series"] == "loss")
    assert train["meta"]["smooth"] == 50  # default: trailing mean over 50 logged steps (all 20 here)
    np.testing.assert_allclose(arr(train["y"])[-1], np.mean([r["loss"] for r in log]))
    raw = page("pages/4_Training_runs.py", smooth="1").run()
    train = next(t for t in figures(raw)[0]["data"] if t["meta"]["run"] == "fire" and t["meta"]["series"] == "loss")
    np.testing.assert_allclose(arr(train["y"]), [r["loss"] for r in log])
    df = at.dataframe[0].value
    assert len(df) == 3
    row = df[df["checkpoint"] == "fire"].iloc[0]  # the last record, the last evaluation, the last 100 steps' mean loss
    last_eval = [r for r in log if r.get("val_loss") is not None][-1]
    n = run_records.SUMMARY_STEPS
    assert (
        row["steps"] == log[-1]["step"] and "training seed" in df.columns
    )  # None here: no train.seed in the tiny config
    assert row[f"train loss (last {n} steps)"] == pytest.approx(np.mean([r["loss"] for r in log[-n:]]))
    assert row["last val loss"] == pytest.approx(last_eval["val_loss"])


def test_training_summary_row_without_evaluations():
    info = checkpoints.CheckpointInfo(
        name="x", path="/x", source="local", config={}, position_encoding="fire", num_parameters=1, seq_len=64
    )
    row = run_records.training_summary_row(info, [{"step": 5, "tokens": 320, "loss": 2.0, "lr": 1e-3}])
    assert row["steps"] == 5 and row["last val loss"] is None and row["last val loss @ 4×"] is None
    assert run_records.training_summary_row(info, [])["steps"] is None
    log = [{"step": k, "loss": float(k), "tokens_per_s": 10.0 * k} for k in range(1, 11)]
    row = run_records.training_summary_row(info, log, last_steps=4)  # steps 7..10
    assert row["train loss (last 4 steps)"] == 8.5 and row["tokens/s (median, last 4 steps)"] == 85.0
    assert run_records.training_summary_row(info, log, last_steps=1)["train loss (last step)"] == 10.0
    log[8]["loss"] = math.nan  # a non-finite loss is skipped, not spread over the mean
    assert run_records.training_summary_row(info, log, last_steps=4)["train loss (last 4 steps)"] == pytest.approx(
        25 / 3
    )
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="last_steps"):
            run_records.training_summary_row(info, log, last_steps=bad)


# -- the library pieces under the pages ----------------------------------------------------------
def test_job_queue_runs_each_key_once_fifo_and_cancels():
    q = jobs.JobQueue(name="test")
    order, calls = [], []

    def work(tag, n=3):
        def f(progress, should_stop):
            calls.append(tag)
            for k in range(n):
                if should_stop():
                    raise jobs.JobCancelled()
                progress(k + 1, n, f"{tag} {k}")
                time.sleep(0.05)
            order.append(tag)
            return tag

        return f

    a = q.submit({"job": "a"}, work("a"))
    assert q.submit({"job": "a"}, work("a-again")) is a  # same key: the existing job
    b = q.submit({"job": "b"}, work("b"))
    c = q.submit({"job": "c"}, work("c", n=1000))
    assert q.wait(b.key, 10).status == jobs.DONE
    q.wait(c.key, 0.3)
    assert q.cancel(c.key)
    assert q.wait(c.key, 10).status == jobs.CANCELLED
    assert order == ["a", "b"] and calls == ["a", "b", "c"]
    assert a.snapshot()["result"] == "a" and a.fraction == 1.0
    d = q.submit({"job": "d"}, lambda p, s: 1 / 0)
    assert q.wait(d.key, 10).status == jobs.ERROR and "ZeroDivisionError" in d.error
    assert q.submit({"job": "c"}, work("c2", n=1)) is not c  # a cancelled job is run again


def test_checkpoint_discovery_and_errors(tiny_checkpoints_dir, tmp_path):
    infos = checkpoints.list_checkpoints(tiny_checkpoints_dir)
    assert [i.name for i in infos] == ["alibi", "fire", "rope"]
    assert infos[1].training_tokens == 20 * 4 * 32 and infos[1].data == "prose"
    assert checkpoints.resolve_checkpoint("fire", tiny_checkpoints_dir).path == str(tiny_checkpoints_dir / "fire")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        checkpoints.read_checkpoint(tmp_path / "half")
    with pytest.raises(CheckpointError, match="neither"):
        checkpoints.resolve_checkpoint("not a name!", tiny_checkpoints_dir)
    assert checkpoints.list_checkpoints(tmp_path / "missing") == []


def test_length_generalization_same_text_intervals_paired_and_cap(app_env):
    """The default protocol scores the same text at every length; the table carries 95 %
    intervals, the paired figure the differences against the chosen reference, and the cap
    control adds capped FIRE rows computed with evaluate's normalizer_cap."""
    at = page(
        "pages/3_Length_generalization.py",
        domain="upload",
        ckpt=["fire", "alibi"],
        len=["16", "32", "64"],
        cap="16",
        ref="alibi",
    ).run()
    at.sidebar.file_uploader(key="lengen_upload").upload("tiny.jsonl", _tiny_jsonl()).run()
    no_exception(at)
    assert at.sidebar.radio(key="lengen_mode").value == "same_text"
    at.button(key="lengen_run").click()
    run_until(
        at,
        lambda a: (
            len(a.get("plotly_chart")) == 3
            and bool(a.dataframe)
            and "fire cap 16" in set(a.dataframe[0].value["group"])
        ),
    )
    table = at.dataframe[0].value
    assert list(dict.fromkeys(table["group"])) == ["fire", "alibi", "fire cap 16"]
    assert (table["ci95_low"] <= table["bits_per_byte"]).all() and (table["bits_per_byte"] <= table["ci95_high"]).all()
    assert table["documents"].nunique() == 1
    caption = " ".join(said(c) for c in at.caption)
    assert "same text at every length: the first 64 tokens of" in caption
    upload = next(Path(p) for p in (Path(default_cache_dir()) / "uploads").rglob("tiny.jsonl"))
    plain = evaluate.evaluate_many(
        [str(app_env / "fire"), str(app_env / "alibi")],
        str(upload),
        [16, 32, 64],
        split="all",
        device="cpu",
        reference=1,
    )
    capped = evaluate.evaluate_many(
        [str(app_env / "fire")], str(upload), [16, 32, 64], split="all", device="cpu", normalizer_cap=16
    )[0]
    assert all(e["cached"] for r in plain + [capped] for e in r["per_length"][1:])  # what the page's jobs computed
    # capped rows only beyond the cap (at 16 they would equal, and hide, the plain ones)
    assert list(table[table["group"] == "fire cap 16"]["length"]) == [32, 64]
    np.testing.assert_allclose(
        table[table["group"] == "fire cap 16"]["bits_per_byte"],
        [e["bits_per_byte"] for e in capped["per_length"][1:]],
        rtol=1e-12,
    )
    assert at.selectbox(key="lengen_ref").value == "alibi"
    paired = figures(at)[1]
    assert paired["layout"]["meta"]["reference"] == "alibi"
    fire = next(t for t in paired["data"] if t.get("meta", {}).get("group") == "fire")
    np.testing.assert_allclose(arr(fire["y"]), [e["paired_delta_bpb"] for e in plain[0]["per_length"]], rtol=1e-9)
    np.testing.assert_allclose(
        arr(fire["y"]) + arr(fire["error_y"]["array"]), [e["paired_ci95"][1] for e in plain[0]["per_length"]], rtol=1e-9
    )
    assert at.query_params["ref"] == "alibi" and at.query_params["cap"] == "16"


def test_training_runs_plot_position_parameters(tmp_path, monkeypatch):
    from conftest import make_tiny_checkpoint

    root = tmp_path / "root"
    make_tiny_checkpoint(root / "kerple_log", "kerple_log", seed=3)
    rows = [
        {
            "step": 0,
            "tokens": 0,
            "val_loss": 5.0,
            "position_parameters": {"r1": {"0": [1.0, 2.0]}, "r2": {"0": [0.5, 0.25]}},
        },
        {"step": 1, "tokens": 64, "loss": 4.0},
        {
            "step": 2,
            "tokens": 128,
            "loss": 3.9,
            "val_loss": 3.5,
            "position_parameters": {"r1": {"0": [1.1, 2.1]}, "r2": {"0": [0.6, 0.01]}},
        },
    ]
    (root / "kerple_log" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    at = page("pages/4_Training_runs.py").run()
    no_exception(at)
    fig = figures(at)[1]
    tr = next(t for t in fig["data"] if t["meta"] == {"run": "kerple_log", "parameter": "r2", "layer": 0, "head": 1})
    np.testing.assert_allclose(arr(tr["y"]), [0.25, 0.01])
    np.testing.assert_allclose(arr(tr["x"]), [0, 128])


# -- Learned biases: the FIRE mechanism ---------------------------------------------------------
def test_learned_biases_normalizer_cap_fire_input_and_dilution(app_env):
    """The cap control overlays capped curves (at a query past the cap they equal the uncapped
    curve of the query at the cap, for distances below it), the fixed-distance figure follows
    f_θ's input, and the dilution panel measures in the background what analysis computes."""
    at = page(
        "pages/1_Learned_biases.py", ckpt="fire", view="head", layer="1", head="0", pos="32,255", cap="32", dnear="4"
    ).run()
    no_exception(at)
    assert at.sidebar.number_input(key="biases_cap").value == 32
    figs = figures(at)
    curves = {
        (t["meta"]["query_position"], t["meta"]["capped"]): t
        for t in figs[0]["data"]
        if "query_position" in t.get("meta", {})
    }
    assert set(curves) == {(32, None), (255, None), (32, 32), (255, 32)}
    plain_32, capped_255, plain_255 = (arr(curves[k]["y"]) for k in ((32, None), (255, 32), (255, None)))
    np.testing.assert_array_equal(capped_255[:32], plain_32[:32])  # distances 0..31 < cap
    assert not np.allclose(plain_255[:32], plain_32[:32])  # uncapped, the curve stretches
    fire_input = next(f for f in figs if "fixed distances" in f["layout"]["title"]["text"])
    lines = {(t["meta"]["distance"], t["meta"]["capped"]): t for t in fire_input["data"]}
    assert set(d for d, _ in lines) == set(analysis.FIRE_INPUT_DISTANCES)
    q = arr(lines[(1, None)]["x"])
    y_plain, y_capped = arr(lines[(1, None)]["y"]), arr(lines[(1, 32)]["y"])
    past = q >= 32
    np.testing.assert_allclose(y_capped[past], y_capped[past][0])  # capped: constant past the cap
    assert y_plain[past][-1] < y_plain[past][0]  # uncapped: falls as the normalizer grows
    model = GPT.from_pretrained(str(app_env / "fire"))
    enc = model.encodings[1]
    import torch

    expected = (
        (enc.psi(torch.tensor([1.0])) / enc.normalizer(torch.tensor(q.astype(np.int64)))).detach().double().numpy()
    )
    np.testing.assert_allclose(y_plain, expected, rtol=1e-5)
    # dilution: not measured yet → Measure → the panel's figure matches the library
    assert any("Not measured yet" in said(c) for c in at.caption)
    at.button(key="biases_dilution_run").click()
    run_until(at, lambda a: any("nearest 4 keys" in f["layout"]["title"]["text"] for f in figures(a)), timeout=120)
    dil = next(f for f in figures(at) if "nearest 4 keys" in f["layout"]["title"]["text"])
    from fireviz.data.corpus import document_tokens, load_documents, split_documents

    doc = next(d for d in split_documents(load_documents("prose"), "validation") if d.num_tokens >= 16 * 32)
    direct = text_attention.attention_dilution(model, document_tokens(doc), near=4)
    capped = text_attention.attention_dilution(model, document_tokens(doc), near=4, normalizer_cap=32)
    tr = {(t["meta"]["layer"], t["meta"]["normalizer_cap"]): t for t in dil["data"]}
    np.testing.assert_allclose(arr(tr[(1, None)]["y"]), direct.share[1].mean(0), rtol=1e-5)
    np.testing.assert_allclose(arr(tr[(1, 32)]["y"]), capped.share[1].mean(0), rtol=1e-5)
    np.testing.assert_array_equal(arr(tr[(0, None)]["x"]), direct.query_positions)


def test_length_generalization_takes_any_length_from_the_url_and_the_widget(app_env):
    at = page("pages/3_Length_generalization.py", ckpt="fire", len=["48", "3000", "abc", "1"]).run()
    no_exception(at)
    assert at.sidebar.multiselect(key="lengen_len").value == [48, 3000]  # bad URL values dropped, any length kept
    ms = at.sidebar.multiselect(key="lengen_len")
    ms.set_value([48, "3,000", "100"]).run()
    no_exception(at)
    assert at.sidebar.multiselect(key="lengen_len").value == [48, 100, 3000]
    assert [str(v) for v in at.query_params["len"]] == ["48", "100", "3000"]  # shareable
    at.sidebar.multiselect(key="lengen_len").set_value([48, "12x"]).run()
    no_exception(at)
    assert any("Not a length: 12x" in said(e) for e in at.sidebar.error)


def test_parse_lengths():
    from fireviz import ui

    assert ui.parse_lengths([3000, "1,536", " 64 ", "0", "x", True], 2, 1 << 20) == ([64, 1536, 3000], ["0", "x", True])


def test_fit_shared_url_opens_on_the_finished_fit(app_env):
    query = dict(target="alibi", heads="2", max_len="16", steps="0", width="8")
    at = page("pages/2_Fit_FIRE.py", **query).run()
    at.button(key="fit_go").click()
    run_until(at, lambda a: len(a.get("plotly_chart")) == 2)
    other = page("pages/2_Fit_FIRE.py", **query).run()  # a new session from the same link: no click
    no_exception(other)
    assert len(other.get("plotly_chart")) == 2
    assert next(m for m in other.metric if m.label == "fit time").value == "cached"


def test_fit_stop_asks_the_job_to_stop_and_the_page_then_draws_the_stopped_fit(app_env):
    """Stop only asks the running fit to stop (the panel says so and its button is disabled); the
    page draws the stopped fit once the job has finished (the poll's whole-page rerun)."""
    from fireviz.ui import jobs

    # a stopped fit still measures its best parameters (~2 s here at 1024 tokens, width 256), so the
    # job is running when the page draws right after the click
    query = dict(target="alibi", heads="16", max_len="1024", steps="5000", width="256", seed="7")
    job = jobs.submit_fit("alibi", {}, 1024, 16, 256, 5000, seed=7)
    at = page("pages/2_Fit_FIRE.py", **query)
    run_until(at, lambda a: any("step " in p.text for p in a.get("progress")))  # optimising
    at.button(key=f"fit_cancel_{job.key}").click().run()
    no_exception(at)
    assert job.cancel_requested
    assert job.status == jobs.RUNNING  # still in its step: the panel says it is stopping
    assert "stopping" in at.get("progress")[0].text
    assert at.button(key=f"fit_cancel_{job.key}").disabled
    run_until(at, lambda a: any("Stopped after" in w.value for w in a.warning))
    assert job.status == jobs.CANCELLED


@pytest.mark.slow
def test_fit_stop_during_the_closed_form_start(app_env):
    from fireviz.ui import jobs

    job = jobs.submit_fit("alibi", {}, 512, 256, 32, 50, seed=11)
    deadline = time.time() + 60
    while job.status == jobs.QUEUED and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # inside the closed-form start (256 heads: seconds)
    assert job.snapshot()["status"] == jobs.RUNNING
    jobs.default_queue("fit").cancel(job.key)
    while job.status not in jobs.FINISHED and time.time() < deadline:
        time.sleep(0.05)
    assert job.status == jobs.CANCELLED
    res = job.snapshot()["result"]
    assert res is not None and res.stopped and res.steps_run == 0


def test_length_generalization_after_a_cancel_draws_the_finished_lengths(app_env):
    from fireviz.ui import jobs

    fire = str(app_env / "fire")
    settings = {
        "mode": "nonoverlapping",
        "stride": None,
        "token_budget": 256,
        "seed": 0,
        "split": "validation",
        "device": "cpu",
        "rope_scaling": None,
    }
    evaluate.evaluate_many([fire], "prose", [16], **settings)  # length 16 finished (cached) before the cancel
    job = jobs.submit_evaluation([Checkpoint.resolve(fire)], EvalSettings.make("prose", [16, 32], **settings))
    jobs.default_queue("evaluate").cancel(job.key)
    deadline = time.time() + 60
    while job.status not in jobs.FINISHED and time.time() < deadline:
        time.sleep(0.05)
    assert job.status == jobs.CANCELLED
    at = page("pages/3_Length_generalization.py", ckpt="fire", len=["16", "32"], mode="nonoverlapping", budget="256")
    run_until(at, lambda a: bool(a.get("plotly_chart")))
    assert any("cancelled" in w.value for w in at.warning)
    assert not any("not been evaluated yet" in i.value for i in at.info)
    assert any("Not computed yet at 32" in i.value for i in at.info)
    ppl = figures(at)[0]
    xs = sorted({int(x) for tr in ppl["data"] for x in arr(tr["x"])})
    assert xs == [16]
    assert any("finished (16 tokens) are drawn below" in w.value for w in at.warning)


def test_a_cancel_that_finished_nothing_says_so_once(app_env):
    from fireviz.ui import jobs

    settings = {"mode": "nonoverlapping", "stride": None, "token_budget": 256, "seed": 0, "split": "validation"}
    settings.update(device="cpu", rope_scaling=None)
    job = jobs.submit_evaluation(
        [Checkpoint.resolve(str(app_env / "alibi"))], EvalSettings.make("prose", [24], **settings)
    )
    jobs.default_queue("evaluate").cancel(job.key)
    assert jobs.default_queue("evaluate").wait(job.key, 60).status == jobs.CANCELLED
    at = page("pages/3_Length_generalization.py", ckpt="alibi", len=["24"], mode="nonoverlapping", budget="256")
    run_until(at, lambda a: any("cancelled" in w.value for w in a.warning))
    no_exception(at)
    said = [w.value for w in at.warning] + [i.value for i in at.info]
    assert [m for m in said if "cancelled" in m] == [
        "The evaluation was cancelled before any length finished, so nothing is drawn. Press **Run** to start it again."
    ]
    assert not any("not been evaluated yet" in m or "Not computed yet" in m for m in said)
    assert not at.get("plotly_chart")


def test_length_generalization_finds_the_job_however_its_settings_were_spelled(app_env):
    """One computation is one job (``EvalSettings.describe``): a job submitted with other spellings
    of the page's settings (no stride or seed, lengths in another order, a batch size) is the
    page's job, so Run starts nothing; bad settings are refused before anything is queued."""
    fire = str(app_env / "fire")
    q = jobs.default_queue("evaluate")
    spelled = {"mode": "nonoverlapping", "token_budget": 256, "device": "cpu", "batch_tokens": 512}
    job = jobs.submit_evaluation([Checkpoint.resolve(fire)], EvalSettings.make("prose", [32, 16], **spelled))
    as_the_page = {"mode": "nonoverlapping", "stride": None, "token_budget": 256, "seed": 0, "split": "validation"}
    as_the_page.update(device="cpu", rope_scaling=None)
    page_settings = EvalSettings.make("prose", [16, 32], **as_the_page)
    assert jobs.find_evaluation([Checkpoint.resolve(fire)], page_settings) is job
    assert q.wait(job.key, 120).status == jobs.DONE
    before = len(q.jobs())
    at = page("pages/3_Length_generalization.py", ckpt="fire", len=["16", "32"], mode="nonoverlapping", budget="256")
    run_until(at, lambda a: bool(a.get("plotly_chart")))
    at.button(key="lengen_run").click().run()
    no_exception(at)
    assert len(q.jobs()) == before, "the same computation must not be queued again"
    xs = sorted({int(x) for tr in figures(at)[0]["data"] for x in arr(tr["x"])})
    assert xs == [16, 32]
    with pytest.raises(evaluate.EvaluationError, match="mode must be one of"):
        EvalSettings.make("prose", [16], **{**as_the_page, "mode": "bogus"})  # refused at the edge, before a job
    assert len(q.jobs()) == before


def test_clearing_every_checkpoint_says_so_and_clears_the_url(app_env):
    at = page("pages/1_Learned_biases.py", ckpt="fire").run()
    no_exception(at)
    at.sidebar.multiselect(key="biases_ckpt").set_value([]).run()
    no_exception(at)
    assert any("No checkpoint chosen" in i.value for i in at.info)
    assert "ckpt" not in at.query_params


# -- Learned biases / Attention: the cached model and results follow both files of a checkpoint --
def test_learned_biases_and_attention_reload_when_config_json_changes(tiny_checkpoints_dir, tmp_path, monkeypatch):
    """One identity (``ui.picker.checkpoint_sha256``: the weights + config sha256 the evaluation
    keys on): editing only config.json (same weights, same weights mtime) reloads the model and
    recomputes the bias report and the attention pattern."""
    import shutil

    import torch

    from fireviz.encodings import fire_modules
    from fireviz.ui import picker

    folder = tmp_path / "fire"
    shutil.copytree(tiny_checkpoints_dir / "fire", folder)
    info = checkpoints.read_checkpoint(folder)
    first = ui.load_model(info)
    assert ui.load_model(str(folder)) is first  # cached: one model per checkpoint state
    identity = picker.checkpoint_sha256(info)
    assert identity == checkpoints.checkpoint_sha256(folder)
    tokens = torch.tensor([256] + list(b"a text of some forty bytes, for the heads"), dtype=torch.long)
    report, pattern = ui.bias_report(info, [8, 20]), ui.attention_pattern(info, tokens, 1)
    weights_mtime = (folder / "model.safetensors").stat().st_mtime_ns
    cfg = json.loads((folder / "config.json").read_text())
    cfg["encoding_options"] = {**cfg.get("encoding_options", {}), "normalizer_cap": 4}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights_mtime
    assert picker.checkpoint_sha256(info) != identity
    second = ui.load_model(info)
    assert second is not first and {m.normalizer_cap for m in fire_modules(second)} == {4.0}
    assert {m.normalizer_cap for m in fire_modules(first)} == {None}  # the old model is left as it was
    info = checkpoints.read_checkpoint(folder)
    assert ui.bias_report(info, [8, 20]) != report
    assert ui.attention_pattern(info, tokens, 1)["probs"] != pattern["probs"]

    real = Checkpoint.resolve

    def rewritten_while_loading(ref):  # a trainer's next checkpoint lands mid-load
        (folder / "config.json").write_text(json.dumps({**cfg, "encoding_options": {"normalizer_cap": 128}}))
        return real(ref)

    (folder / "config.json").write_text(json.dumps({**cfg, "encoding_options": {"normalizer_cap": 16}}))
    monkeypatch.setattr(Checkpoint, "resolve", rewritten_while_loading)
    with pytest.raises(CheckpointError, match="changed while it was loading"):
        ui.load_model(info)
    monkeypatch.setattr(Checkpoint, "resolve", real)
    assert {m.normalizer_cap for m in fire_modules(ui.load_model(info))} == {128.0}
    import dataclasses

    gone = dataclasses.replace(info, path=str(tmp_path / "gone"))  # a folder deleted after the scan
    for call in (lambda: ui.bias_report(gone, [8]), lambda: ui.attention_pattern(gone, tokens, 0)):
        with pytest.raises(CheckpointError):
            call()


def test_the_default_selection_is_one_plain_run_per_encoding_nope_last():
    """Issue #40: not the alphabet's first nine names (no RoPE, T5 or Sandwich), but the plain run
    of every encoding in the paper's order, NoPE last; then variants; then extra seeds."""
    from fireviz.encodings import encoding_names

    names = {
        "alibi": "alibi", "alibi_seed1": "alibi", "fire": "fire", "fire_offset": "fire", "fire_s": "fire_s",
        "fire_seed1": "fire", "kerple_log": "kerple_log", "kerple_power": "kerple_power", "nope": "nope",
        "rope": "rope", "sandwich": "sandwich", "t5": "t5", "t5_plr10": "t5", "my_run": "alibi",
    }  # fmt: skip
    from fireviz.checkpoints import overview_first

    order = overview_first(names, encoding_names())
    assert order[:9] == ["rope", "t5", "alibi", "kerple_log", "kerple_power", "sandwich", "fire", "fire_s", "nope"]
    assert order[9:] == ["fire_offset", "my_run", "t5_plr10", "alibi_seed1", "fire_seed1"]
    assert sorted(order) == sorted(names)


def _follow_default_app():
    import streamlit as st

    from fireviz import ui

    group = st.selectbox("group", ["prose", "copy"], key="g")
    default = "prose" if group == "prose" else "synthetic:copy"
    k = ui.url_state("t", "domain", default, options=["prose", "latex", "synthetic:copy"])
    ui.follow_default("t", "domain", default)
    st.selectbox("domain", ["prose", "latex", "synthetic:copy"], key=k)


def test_a_widget_follows_its_default_when_the_group_changes_it():
    """Issue #40: switching the group to copy left Data on prose. A value seeded from the URL
    stands on the first run; when the default itself changes (another group), the widget takes
    the new default; a choice made under an unchanged default stays."""
    at = AppTest.from_function(_follow_default_app, default_timeout=30)
    at.query_params["domain"] = "latex"
    at.run()
    assert at.selectbox(key="t_domain").value == "latex"  # the link's value, on the first run
    at.selectbox(key="g").set_value("copy").run()
    assert at.selectbox(key="t_domain").value == "synthetic:copy"  # the new group's own data
    at.selectbox(key="t_domain").set_value("prose").run()
    at.run()
    assert at.selectbox(key="t_domain").value == "prose"  # a choice under the same default stays
    at.selectbox(key="g").set_value("prose").run()
    assert at.selectbox(key="t_domain").value == "prose"
