"""scripts/publish_results.py's table helpers on synthetic results (the real ones are checked
against the shipped files in test_bundled_checkpoints.py)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "publish_results.py"


@pytest.fixture(scope="module")
def pub():
    spec = importlib.util.spec_from_file_location("publish_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(label: str, bpb: list[float], rope_scaling=None) -> dict:
    return {
        "label": label,
        "settings": {"rope_scaling": rope_scaling},
        "per_length": [
            {"length": n, "bits_per_byte": b, "perplexity": 2.0**b}
            for n, b in zip([128, 256, 512, 1024, 2048, 4096, 8192], bpb, strict=True)
        ],
    }


def test_seed_groups_pair_extra_seeds_with_their_seed_zero_run(pub):
    names = ["alibi", "fire", "fire_s", "fire_seed1", "fire_seed2", "fire_s_seed1", "kerple_power_seed3", "rope"]
    assert pub.seed_groups(names) == {
        "fire": ["fire", "fire_seed1", "fire_seed2"],
        "fire_s": ["fire_s", "fire_s_seed1"],
    }
    assert pub.seed_groups(["fire", "rope", "fire_seed0x"]) == {}


def test_seed_table_is_mean_and_sample_sd_over_seeds(pub):
    runs = [
        run("fire", [2.0] * 7),
        run("fire_seed1", [2.2] * 6 + [3.0]),
        run("fire_seed2", [2.4] * 7),
        run("rope", [9.0] * 7),
        run("rope", [1.0] * 7, rope_scaling="pi"),
    ]
    rows = pub.fmt_seed_table(runs)
    assert len(rows) == 3 and rows[2].startswith("| fire | 3 | ")
    cells = [c.strip() for c in rows[2].strip("|").split("|")][2:]
    assert cells[0] == "2.200 ± 0.200"
    sd = statistics.stdev([2.0, 3.0, 2.4])
    assert cells[6] == f"{statistics.mean([2.0, 3.0, 2.4]):.3f} ± {sd:.3f}"
    assert pub.fmt_seed_table([run("fire", [2.0] * 7)]) == []


def test_validation_table_labels_follow_the_training_length(pub):
    logs = {
        "fire": [
            {"step": 0, "tokens": 0, "val_loss": 5.5, "val_loss_4x": 5.6},
            {"step": 250, "tokens": 2048000, "val_loss": 2.25, "val_loss_4x": 2.5},
        ]
    }
    rows = pub.fmt_validation_table(logs, seq_len=256)
    assert "val @256 (nats/token)" in rows[0] and "val @1024" in rows[0]
    assert rows[2] == "| fire | 250 | 2,048,000 | 2.250 | 2.500 | -3.250 (from step 0) |"


def test_replace_generated_rewrites_only_between_markers(pub):
    text = "a\n<!-- generated:t -->\nold\n<!-- /generated:t -->\nb\n"
    assert (
        pub.replace_generated(text, "t", ["new", "rows"])
        == "a\n<!-- generated:t -->\nnew\nrows\n<!-- /generated:t -->\nb\n"
    )
    with pytest.raises(SystemExit, match="generated:missing"):
        pub.replace_generated(text, "missing", [])


def test_labels_name_every_scaled_rope_row(pub):
    def res(name, scaling):
        return {"checkpoint": name, "settings": {"rope_scaling": scaling}}

    assert [pub.label(res("rope", s)) for s in (None, "pi", "yarn")] == [
        "rope",
        "rope_pi (zero-shot)",
        "yarn (zero-shot)",
    ]
    labels = [pub.label(res("rope_seed1", s)) for s in (None, "pi", "yarn")]
    assert labels == ["rope_seed1", "rope_seed1 + pi (zero-shot)", "rope_seed1 + yarn (zero-shot)"]
    assert pub.label(res("alibi", None)) == "alibi"


def test_read_results_tolerates_missing_and_corrupt_files(pub, tmp_path):
    assert pub.read_results(tmp_path) == []
    (tmp_path / "results.json").write_text("{not json")
    assert pub.read_results(tmp_path) == []
    good = {"checkpoint": "fire", "settings": {"data": "code", "rope_scaling": None}}
    (tmp_path / "results.json").write_text(json.dumps([good, 3, {"checkpoint": "fire"}, {"settings": {}}]))
    assert pub.read_results(tmp_path) == [good]


def result(data: str, sha: str = "w1", budget: int = 16384, scaling=None, bpb: float = 2.0) -> dict:
    return {
        "checkpoint": "rope",
        "checkpoint_path": "/elsewhere/checkpoints/rope",
        "checkpoint_sha256": sha,
        "label": "old label",
        "per_length": [{"length": 128, "bits_per_byte": bpb}],
        "settings": {
            "data": data,
            "rope_scaling": scaling,
            "mode": "nonoverlapping",
            "token_budget": budget,
            "seed": 0,
            "split": "validation",
            "lengths": [128],
        },
    }


def test_merge_results_keeps_other_domains_only_when_made_on_the_same_weights_and_settings(pub):
    old = [result("prose", bpb=9.0), result("latex"), result("code"), result("latex", scaling="pi")]
    fresh = [result("prose", bpb=1.0)]
    rows, dropped = pub.merge_results(old, fresh)
    assert [(r["settings"]["data"], r["settings"]["rope_scaling"]) for r in rows] == [
        ("prose", None),
        ("latex", None),
        ("latex", "pi"),
        ("code", None),
    ]
    assert rows[0]["per_length"][0]["bits_per_byte"] == 1.0 and dropped == []  # the fresh prose row wins
    assert {r["checkpoint_path"] for r in rows} == {"checkpoints/rope"}
    assert [r["label"] for r in rows] == ["rope", "rope", "rope_pi (zero-shot)", "rope"]
    # other weights, or another token budget: the old rows go
    rows, dropped = pub.merge_results([result("latex", sha="w0"), result("code", budget=512)], fresh)
    assert [r["settings"]["data"] for r in rows] == ["prose"] and len(dropped) == 2


def test_validation_rows_keep_only_numeric_evaluations():
    from fireviz.checkpoints.records import validation_rows

    log = [
        {"step": 0, "val_loss": 5.5, "val_loss_4x": 5.6},
        {"step": 1, "loss": 5.0},
        {"step": 2, "val_loss": None},
        {"step": 3, "val_loss": True},
        {"step": 4, "val_loss": 4.0},
    ]
    assert [r["step"] for r in validation_rows(log)] == [0, 4]
    assert validation_rows([]) == []


def test_merge_results_keeps_the_recorded_time_of_a_row_answered_from_the_cache(pub):
    """Re-publishing unchanged numbers leaves results.json as it was: a fresh row whose every
    length came from the cache keeps the old row's seconds; a recomputed one records its own."""
    old = result("prose")
    old["seconds"] = 812.5
    cached = result("prose")
    cached["seconds"] = 3.7
    cached["per_length"][0]["cached"] = True
    rows, _ = pub.merge_results([old], [cached])
    assert rows[0]["seconds"] == 812.5
    fresh = result("prose")
    fresh["seconds"] = 640.0
    fresh["per_length"][0]["cached"] = False
    rows, _ = pub.merge_results([old], [fresh])
    assert rows[0]["seconds"] == 640.0
    other = result("prose", sha="w2")  # other weights: nothing to keep
    other["seconds"] = 2.0
    other["per_length"][0]["cached"] = True
    rows, _ = pub.merge_results([old], [other])
    assert rows[0]["seconds"] == 2.0


def paired_run(label: str, deltas: list[float] | None, half: float = 0.004, reference: str = "alibi") -> dict:
    """A same-text row paired against ``reference`` (``deltas`` per length; None: the reference itself)."""
    r = run(label, [2.0] * 7)
    r["paired_reference"] = reference
    for e, d in zip(r["per_length"], deltas or [None] * 7, strict=True):
        if d is not None:
            e["paired_delta_bpb"], e["paired_ci95"] = d, [d - half, d + half]
    return r


def test_paired_seed_table_gives_the_reference_its_own_seed_spread(pub):
    """The reference's row: its seeds' differences against it and 0 for itself, so its seed spread
    stands beside every other row's."""
    runs = [
        paired_run("alibi", None),
        paired_run("alibi_seed1", [0.01] * 7),
        paired_run("alibi_seed2", [-0.02] * 7, half=0.006),
        paired_run("fire", [0.10] * 7),
        paired_run("fire_seed1", [0.14] * 7),
    ]
    rows = {
        r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
        for r in pub.fmt_paired_seed_table(runs)[2:]
    }
    assert set(rows) == {"alibi", "fire"}
    mean, sd = statistics.mean([0.0, 0.01, -0.02]), statistics.stdev([0.0, 0.01, -0.02])
    assert rows["alibi"][1] == "3" and rows["alibi"][2] == f"{mean:+.3f} ± {sd:.3f} (text ±0.005)"
    assert rows["fire"][2] == f"+0.120 ± {statistics.stdev([0.10, 0.14]):.3f} (text ±0.004)"


def test_a_partial_context_table_names_the_checkpoints_it_lacks(pub):
    def ctx(name):
        return {
            "checkpoint": name,
            "label": name,
            "settings": {
                "mode": "context",
                "data": "prose",
                "context_targets": 256,
                "prefix_tokens": 8192,
                "stride": 64,
                "full_context": 7936,
            },
            "per_length": [{"length": c, "bits_per_byte": 1.9} for c in (128, 7936)],
        }

    folders = [Path("alibi"), Path("fire"), Path("rope")]
    by_ckpt = {"alibi": [ctx("alibi")], "fire": [], "rope": [ctx("rope")]}
    rows = pub.context_rows(folders, by_ckpt)
    assert [r["checkpoint"] for r in rows["prose"]] == ["alibi", "rope"]
    assert pub.missing_context(folders, rows["prose"]) == ["fire"]


def test_a_seed_group_that_mixes_kerple_inits_is_said(pub, tmp_path):
    """Kerple-power's seed 0 was retrained with the reference init, its seeds 1 and 2 were not: the
    seed tables' note says so (and says nothing when every seed drew the same way)."""
    from conftest import make_tiny_checkpoint

    folders = [make_tiny_checkpoint(tmp_path / n, "kerple_power") for n in ("kerple_power", "kerple_power_seed1")]
    folders.append(make_tiny_checkpoint(tmp_path / "alibi", "alibi"))
    assert pub.seed_recipe_notes(folders) == []  # neither names the reference init: both drew the old way
    cfg_path = tmp_path / "kerple_power" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["encoding_options"] = {**cfg.get("encoding_options", {}), "reference_init": True}
    cfg_path.write_text(json.dumps(cfg))
    (note,) = pub.seed_recipe_notes(folders)
    assert note.startswith("kerple_power: kerple_power drew its init as the KERPLE reference code")
    assert "kerple_power_seed1 with fireviz 0.1's reversed init" in note


def test_the_context_tables_start_inside_the_training_length(pub):
    """Issue #51: the published context lengths hold 448, whose windows (c + s = 512) are the
    training length; the tables' text says where the windows pass it."""
    from fireviz.eval import DEFAULT_CONTEXT_STRIDE

    assert pub.CONTEXT_BASELINE + DEFAULT_CONTEXT_STRIDE == 512
    assert pub.CONTEXT_LENGTHS[-1] == "full" and pub.CONTEXT_LENGTHS[:-1] == sorted(pub.CONTEXT_LENGTHS[:-1])
    assert 448 in pub.CONTEXT_LENGTHS and 512 in pub.CONTEXT_LENGTHS
    text = pub.context_baseline_text({"stride": 64}, 512)
    assert "c = 448 is the largest context" in text and "from c = 512 on" in text


def test_the_claims_table_names_each_claim_and_the_pending_ones(pub):
    claim = {
        "id": "x_vs_y",
        "statement": "x minus y",
        "a": ["x"],
        "b": ["y", "y_seed1"],
        "difference": -0.0123,
        "interval": [-0.02, -0.004],
        "seeds": [1, 2],
        "verdict": "suggestive",
    }
    rows = pub.fmt_claims_table({"claims": [claim], "pending": ["later"]})
    assert (
        rows[2]
        == "| `x_vs_y` | x minus y | −0.012 [−0.020, −0.004] bpb (1 vs 2 seeds, interval over documents: suggestive) |"
    )
    assert "later" in rows[-1]
