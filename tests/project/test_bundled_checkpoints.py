"""The checkpoints shipped in checkpoints/ (issue #8): complete, one recipe, loadable, and the
published numbers are what evaluating them gives.

These read the repository's own files; the fixtures in conftest.py are not used.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from fireviz.checkpoints import checkpoint_sha256
from fireviz.checkpoints.catalog import read_train_log
from fireviz.encodings import has_normalizer
from fireviz.eval import evaluation as evaluate
from fireviz.model.config import GPTConfig
from fireviz.model.gpt import GPT

ROOT = Path(__file__).resolve().parents[2]
CKPTS = ROOT / "checkpoints"
#: One checkpoint per encoding the issue names; extra folders (other seeds) may exist.
ENCODINGS = ("nope", "rope", "t5", "alibi", "kerple_log", "kerple_power", "sandwich", "fire", "fire_s")
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192]
DOMAINS = {"prose", "latex", "code"}
#: Variants of the shared recipe (issue #18), as (train settings, encoding options) that differ:
#: checkpoints/fire_offset is encoding fire trained with train.random_position_offset=7680.
VARIANTS = {
    "offset": ({"random_position_offset": 7680}, {}),
    "offset_nopi": ({"random_position_offset": 7680}, {"progressive_interpolation": False}),
    # issue #35: position parameters in their own AdamW group at 10 × lr; FIRE's L starting at 512
    "L512_plr10": ({"position_lr_multiplier": 10}, {"init_L": 512}),
    "plr10": ({"position_lr_multiplier": 10}, {}),
    # issue #51: the two arms that separate init_L from the learning rate (init_L 128 is the default)
    "L512": ({}, {"init_L": 512}),
    "L128_plr10": ({"position_lr_multiplier": 10}, {}),
}
#: <encoding>[_<variant>][_seed<N>]: checkpoints/fire_seed1 is encoding fire trained with train.seed=1,
#: checkpoints/fire_offset_seed1 the offset variant with seed 1.
FOLDER = re.compile(
    r"^(?P<encoding>[a-z0-9_]+?)(?:_(?P<variant>offset|offset_nopi|L512_plr10|L512|L128_plr10|plr10))?(?:_seed(?P<seed>[1-9][0-9]*))?$"
)
#: The recipe every shipped model shares (configs/tiny.toml); seed may differ in seed folders.
SHARED_SETTINGS = (
    "batch_size",
    "grad_accum",
    "max_steps",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "data",
)


def shipped() -> list[Path]:
    return sorted(p for p in CKPTS.iterdir() if (p / "model.safetensors").is_file())


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def results(folder: Path) -> list[dict]:
    return json.loads((folder / "results.json").read_text())


def test_every_encoding_is_shipped_with_its_files():
    names = {p.name for p in shipped()}
    assert set(ENCODINGS) <= names, f"missing checkpoints: {sorted(set(ENCODINGS) - names)}"
    for folder in shipped():
        for f in ("config.json", "model.safetensors", "train_log.jsonl.gz", "README.md", "results.json"):
            assert (folder / f).is_file(), f"{folder.name} lacks {f}"
        assert not (folder / "train_log.jsonl").exists(), f"{folder.name}: one log, the compressed one"
        assert (folder / "model.safetensors").stat().st_size <= 5 * 2**20
        assert not list(folder.glob("trainer_state.*")), f"{folder.name}: trainer state is not shipped"
    total = sum(f.stat().st_size for f in CKPTS.rglob("*") if f.is_file())
    assert total <= 60 * 2**20, f"checkpoints/ is {total / 2**20:.1f} MiB (limit 60)"


def test_one_recipe_and_one_token_budget():
    cfgs = {p.name: config(p) for p in shipped()}
    ref = cfgs["fire"]
    for name, cfg in cfgs.items():
        tr = cfg["training"]
        assert (cfg["n_layer"], cfg["n_head"], cfg["d_model"], cfg["seq_len"]) == (4, 4, 128, 512), name
        assert cfg["n_layer"] >= 4 and cfg["n_head"] >= 4 and 0.5e6 < tr["num_parameters"] < 1.5e6, name
        assert tr["data"] == "prose" and tr["data_split"] == "train", name
        assert tr["data_fingerprint"] == ref["training"]["data_fingerprint"], name
        for key in SHARED_SETTINGS:
            assert tr["settings"][key] == ref["training"]["settings"][key], (name, key)
        m = FOLDER.match(name)
        assert m and m["encoding"] in ENCODINGS, f"{name}: not <encoding>[_<variant>][_seed<N>]"
        assert cfg["position_encoding"] == m["encoding"] and tr["settings"]["seed"] == int(m["seed"] or 0), name
        check_variant(name, cfg, *VARIANTS.get(m["variant"], ({}, {})))
        # every model saw the same number of training tokens
        assert tr["tokens_seen"] == ref["training"]["tokens_seen"] == tr["steps"] * 16 * 512, name


def check_variant(name: str, cfg: dict, settings: dict, options: dict) -> None:
    """The checkpoint differs from the shared recipe exactly by its variant's settings and encoding
    options, and its card's command names each of them."""
    tr = cfg["training"]["settings"]
    assert tr.get("random_position_offset", 0) == settings.get("random_position_offset", 0), name
    assert tr.get("position_lr_multiplier", 1) == settings.get("position_lr_multiplier", 1), name
    defaults = GPTConfig(position_encoding=cfg["position_encoding"], seq_len=cfg["seq_len"]).complete_encoding_options()
    assert {**defaults, **cfg["encoding_options"]} == {**defaults, **options}, name
    made_by = next(
        line for line in (CKPTS / name / "README.md").read_text(encoding="utf-8").splitlines() if "made by" in line
    )
    for key, value in settings.items():
        assert f"--set train.{key}={value}" in made_by, (name, key)
    for key, value in options.items():
        assert f"--set model.encoding_options.{key}={json.dumps(value)}" in made_by, (name, key)
    assert made_by.count("--set") == 2 + len(settings) + len(options) + bool(tr["seed"]), name


def test_validation_curve_reaches_the_shipped_weights():
    for folder in shipped():
        tr = config(folder)["training"]
        log = read_train_log(folder)
        vals = [r for r in log if "val_loss" in r]
        assert vals[0]["step"] == 0 and vals[-1]["step"] == tr["steps"], folder.name
        assert log[-1]["step"] == tr["steps"], f"{folder.name}: log runs past the weights"
        assert all(math.isfinite(r["val_loss"]) and math.isfinite(r["val_loss_4x"]) for r in vals)
        assert vals[-1]["val_loss"] < vals[0]["val_loss"] - 2.0, f"{folder.name} did not learn"


@pytest.mark.parametrize("name", [p.name for p in shipped()])
def test_loads_with_from_pretrained_and_results_match_the_weights(name):
    folder = CKPTS / name
    model = GPT.from_pretrained(str(folder))
    assert model.config.position_encoding == config(folder)["position_encoding"]
    assert sum(p.numel() for p in model.parameters()) == config(folder)["training"]["num_parameters"]
    sha = checkpoint_sha256(folder)
    res = [r for r in results(folder) if r["settings"]["mode"] != "context"]  # context use: its own test
    assert {r["settings"]["data"] for r in res} == DOMAINS
    for r in res:
        assert r["checkpoint_sha256"] == sha, f"{name}: results.json was computed on other weights"
        s = r["settings"]
        # the published protocol: the same text at every length, every qualifying document
        assert (s["mode"], s["token_budget"], s["seed"], s["split"]) == ("same_text", None, 0, "validation")
        per = r["per_length"]
        assert [e["length"] for e in per] == LENGTHS
        assert len({e["documents"] for e in per}) == 1 and per[0]["documents"] >= 10, (name, s["data"])
        assert len({e["tokens_scored"] for e in per}) == 1, (name, s["data"])  # exactly the same targets
        for e in per:
            assert e["ci95"][0] < e["bits_per_byte"] < e["ci95"][1], (name, s["data"], e["length"])
            if name != "alibi":  # every row paired against the reference on the same documents
                lo, hi = e["paired_ci95"]
                assert lo <= e["paired_delta_bpb"] <= hi, (name, s["data"], e["length"])
    if config(folder)["position_encoding"] == "rope":  # also evaluated zero-shot as RoPE-PI and YaRN
        assert {r["settings"]["rope_scaling"] for r in res} == {None, "pi", "yarn"}
    # FIRE also with its normalizer capped where training stopped; a run trained at random offsets
    # up to 8192 has no capped row (the cap would change nothing at these lengths)
    offset = config(folder)["training"]["settings"].get("random_position_offset", 0)
    caps = {r["settings"].get("normalizer_cap") for r in res}
    if has_normalizer(model.config.position_encoding):
        assert caps == ({None} if offset + 512 >= max(LENGTHS) else {None, 512 + offset}), name
    else:
        assert caps == {None}, name


def results_table(section: str, after: str = "") -> dict[str, list[str]]:
    """The first table of ``## section`` in checkpoints/RESULTS.md (after the text ``after``), by row name."""
    text = (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = body.split(after, 1)[1].splitlines() if after else body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return {r[0]: r[1:] for r in rows[2:]}


def test_results_table_is_the_results():
    table = results_table("prose")
    published = {
        r["label"]: r
        for p in shipped()
        for r in results(p)
        if r["settings"]["data"] == "prose" and r["settings"]["mode"] != "context"
    }
    assert set(table) == set(published)
    for label, cells in table.items():
        assert cells == [
            f"{e['bits_per_byte']:.3f}" + (f" [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]" if "ci95" in e else "")
            for e in published[label]["per_length"]
        ], label


def test_results_seed_table_is_the_seed_runs():
    """Where extra seeds are shipped, RESULTS.md's prose seed-noise table is their mean ± sample sd."""
    names = [p.name for p in shipped()]
    groups: dict[str, list[str]] = {}
    for name in names:
        if (m := FOLDER.match(name)) and m["seed"]:
            base = name.rsplit("_seed", 1)[0]
            groups.setdefault(base, [base]).append(name)
    if not groups:
        assert "Seed noise (prose)" not in (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
        return
    table = results_table("prose", after="Seed noise (prose)")
    assert set(table) == set(groups)
    for enc, members in groups.items():
        rows = [
            next(
                r
                for r in results(CKPTS / n)
                if r["settings"]["data"] == "prose"
                and not r["settings"]["rope_scaling"]
                and r["settings"]["mode"] != "context"
            )
            for n in members
        ]
        assert table[enc][0] == str(len(members))
        for k, n in enumerate(LENGTHS):
            vals = [next(e["bits_per_byte"] for e in r["per_length"] if e["length"] == n) for r in rows]
            assert table[enc][1 + k] == f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f}", (enc, n)


def test_results_validation_table_is_the_logs():
    table = results_table("Validation during training")
    assert set(table) == {p.name for p in shipped()}
    for folder in shipped():
        last = [r for r in read_train_log(folder) if "val_loss" in r][-1]
        step, tokens, v512, v2048 = table[folder.name][:4]
        assert (int(step), int(tokens.replace(",", ""))) == (last["step"], last["tokens"])
        assert (v512, v2048) == (f"{last['val_loss']:.3f}", f"{last['val_loss_4x']:.3f}")


@pytest.mark.parametrize("name", ["fire", "rope"])
def test_evaluation_reproduces_the_published_row(name, tmp_path):
    """The published row is its per-document losses (mean bits per byte = Σ nats / Σ tokens / ln 2),
    and the evaluation, without the cache, gives those per-document losses again: on four of its
    documents (their exact JSONL lines from data/prose.jsonl.xz, so the same ids and split), at two
    of the seven lengths of the published 128…8192 evaluation (``--prefix-tokens 8192``)."""
    import lzma

    folder = CKPTS / name
    shipped_row = next(
        r
        for r in results(folder)
        if r["settings"]["data"] == "prose"
        and r["settings"]["mode"] == "same_text"
        and not r["settings"]["rope_scaling"]
        and not r["settings"].get("normalizer_cap")
    )
    published = {e["length"]: e for e in shipped_row["per_length"]}
    for e in published.values():  # the row is exactly its documents' losses
        doc = e["per_document"]
        assert sum(doc["tokens"]) == e["tokens_scored"]
        assert e["bits_per_byte"] == pytest.approx(math.fsum(doc["nats"]) / sum(doc["tokens"]) / math.log(2), rel=1e-12)
    lengths = [128, 1024]
    ids = published[128]["per_document"]["doc"][:4]
    with lzma.open(ROOT / "data" / "prose.jsonl.xz", "rt", encoding="utf-8") as f:
        lines = {json.loads(line)["id"]: line for line in f if line.strip()}
    data = tmp_path / "four.jsonl"
    data.write_text("".join(lines[i] for i in ids), encoding="utf-8")
    fresh = evaluate.evaluate_many(
        [str(folder)],
        str(data),
        lengths,
        mode="same_text",
        prefix_tokens=8192,
        seed=0,
        device="cpu",
        use_cache=False,
        cache_dir=tmp_path,
    )[0]
    for e in fresh["per_length"]:
        want = published[e["length"]]["per_document"]
        got = e["per_document"]
        assert got["doc"] == ids and got["tokens"] == want["tokens"][:4], (name, e["length"])
        # float32 losses summed over 8,191 targets per document: relative error far below 1e-5
        assert got["nats"] == pytest.approx(want["nats"][:4], rel=1e-5), (name, e["length"])


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "kerple_power_seed1", "kerple_power_seed2"])
def test_retrained_kerple_parameters_all_moved(name):
    """The Kerple checkpoints were retrained with the constraint that keeps gradients: every r1
    and r2 ends away from its value at step 0 (the frozen runs kept one r2 bit-identical to it)
    and inside the constraint, and the log's last values are the stored weights."""
    from safetensors.torch import load_file

    folder = CKPTS / name
    logged = [r["position_parameters"] for r in read_train_log(folder) if "position_parameters" in r]
    first, last = logged[0], logged[-1]
    weights = load_file(folder / "model.safetensors")
    r2_max = 2.0 if config(folder)["position_encoding"] == "kerple_power" else math.inf
    for p in ("r1", "r2"):
        for layer, values in last[p].items():
            for head, v in enumerate(values):
                assert abs(v - first[p][layer][head]) > 1e-3, (name, p, layer, head)
                assert 0.01 < v < (r2_max if p == "r2" else math.inf), (name, p, layer, head)
            stored = weights[f"encodings.{layer}.{p}"].float().tolist()
            assert stored == pytest.approx(values, rel=1e-3), (name, p, layer)


#: the published context lengths c: the defaults plus 448, the largest inside the training length (issue #51)
CONTEXT_LENGTHS = [128, 256, 448, 512, 1024, 2048, 4096, 7936]


def context_rows(domain: str) -> dict[str, dict]:
    return {
        p.name: r
        for p in shipped()
        for r in results(p)
        if r["settings"]["mode"] == "context" and r["settings"]["data"] == domain
    }


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_published_context_use_rows_score_the_same_targets_and_are_the_results_table(domain):
    """Issue #35: the context-use rows a results.json holds were made on exactly its weights with
    the protocol's settings (the last 256 of the first 8192 tokens; the same targets at every c),
    and RESULTS.md's "Context use" table is exactly those rows and names every checkpoint without
    one."""
    rows = context_rows(domain)
    text = (CKPTS / "RESULTS.md").read_text(encoding="utf-8")
    if not rows:
        assert f"## Context use: {domain}" not in text
        return
    for name, r in rows.items():
        s = r["settings"]
        assert r["checkpoint_sha256"] == checkpoint_sha256(CKPTS / name), name
        assert (s["context_targets"], s["prefix_tokens"], s["stride"], s["split"]) == (256, 8192, 64, "validation")
        per = r["per_length"]
        assert [e["length"] for e in per] == CONTEXT_LENGTHS, name
        assert len({e["tokens_scored"] for e in per}) == 1 and per[0]["documents"] >= 10, name  # the same targets
        for e in per[:-1]:  # every c but full: its difference against full context, on the same targets
            lo, hi = e["full_ci95"]
            assert lo <= e["full_delta_bpb"] <= hi, (name, e["length"])
    table = results_table(f"Context use: {domain}")
    assert set(table) == set(rows)
    for name, cells in table.items():
        assert cells == [
            f"{e['bits_per_byte']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]" for e in rows[name]["per_length"]
        ]
    missing = sorted(p.name for p in shipped() if p.name not in rows)
    if missing:
        assert f"({len(missing)} of {len(missing) + len(rows)}): " + ", ".join(missing) in text
