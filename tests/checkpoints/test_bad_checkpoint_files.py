"""Bad input (issue 21) in a checkpoint folder's files: a broken, incomplete or absurd config,
results JSON or train log costs only its own checkpoint (the others stay listed), is reported
and never rewritten; property tests write arbitrary JSON and bytes into those files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bad_content import NESTED, _content, _pristine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireviz.checkpoints import catalog as checkpoints
from fireviz.model.gpt import GPT, CheckpointError


def _names(root: Path) -> list[str]:
    infos, _ = checkpoints.scan_checkpoints(root)
    return [i.name for i in infos]


# -- the app's scan: a broken file costs only its own checkpoint ----------------------------
@pytest.mark.parametrize("file", ["config.json", "results_prose.json", "train_log.jsonl"])
def test_deeply_nested_json_affects_only_its_checkpoint(root, file):
    victim = root / "victim" / file
    victim.write_text(NESTED)
    infos, problems = checkpoints.scan_checkpoints(root)
    by = {i.name: i for i in infos}
    assert "good" in by and by["good"].headline
    if file == "config.json":
        assert "victim" not in by and "nests 100000 levels" in problems[str(root / "victim")]
    else:
        assert "victim" in by and "nests 100000 levels" in by["victim"].problems[file]
    assert victim.read_text() == NESTED  # reported, never rewritten


def test_results_with_wrong_types_or_nonfinite_numbers_are_left_out(root):
    res = root / "victim" / "results_prose.json"
    for text, match in (
        ('{"settings": {"data": ["prose"]}, "per_length": []}', "settings.data is not a string"),
        ('{"settings": {"data": "prose"}, "per_length": [{"length": 32, "bits_per_byte": NaN}]}', "non-finite"),
        ('{"settings": {"data": "prose"}, "per_length": [{"length": "32"}]}', "length is not"),
        ('{"settings": {"data": "prose"}, "per_length": [{"length": 32, "ci95": [1]}]}', "ci95"),
    ):
        res.write_text(text)
        info = checkpoints.read_checkpoint(root / "victim")
        assert match in info.problems["results_prose.json"] and info.results == {}
        assert "bpb" not in " ".join(info.headline)  # no headline from a refused file
        assert "good" in _names(root)


def test_train_log_with_a_non_number_step_is_left_out(root):
    (root / "victim" / "train_log.jsonl").write_text('{"step": [1], "loss": 1.0}\n')
    info = checkpoints.read_checkpoint(root / "victim")
    assert "step" in info.problems["train_log.jsonl"]


# -- complete configs, tied tensors ----------------------------------------------------------------
@pytest.mark.parametrize("field", ["seq_len", "position_encoding", "n_layer", "encoding_options"])
def test_a_config_missing_a_field_that_changes_the_numbers_is_refused(root, field):
    p = root / "victim" / "config.json"
    cfg = json.loads(p.read_text())
    del cfg[field]
    p.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"does not name {field}"):
        checkpoints.read_checkpoint(root / "victim")
    with pytest.raises(CheckpointError, match=f"does not name {field}"):
        GPT.from_pretrained(str(root / "victim"))
    assert "good" in _names(root)


# -- properties: arbitrary content never escapes as a foreign error ---------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(file=st.sampled_from(["config.json", "results_prose.json", "train_log.jsonl"]), content=_content)
def test_any_content_in_one_checkpoints_file_leaves_the_others_listed(tmp_path_factory, file, content):
    base = tmp_path_factory.mktemp("prop")
    shutil.copytree(_pristine(tmp_path_factory), base / "root")
    target = base / "root" / "victim" / file
    target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    infos, problems = checkpoints.scan_checkpoints(base / "root")  # raises nothing
    assert "good" in [i.name for i in infos]
    for i in infos:
        [r for r in i.summary_row().values()]  # every cell builds
    try:
        checkpoints.read_checkpoint(base / "root" / "victim")
    except CheckpointError:
        pass
    try:
        GPT.from_pretrained(str(base / "root" / "victim"))
    except CheckpointError:
        pass


# -- found by an adversarial review ------------------------------------------------------------------
def test_a_fifo_or_folder_named_like_a_json_file_is_refused_not_waited_on(root):
    import os

    os.mkfifo(root / "victim" / "results_x.json")
    (root / "victim" / "results_y.json").mkdir()
    info = checkpoints.read_checkpoint(root / "victim")  # returns: a FIFO is never opened
    assert "not a regular file" in info.problems["results_x.json"] and "results_y.json" in info.problems


@pytest.mark.parametrize(
    "field, value", [("n_head", 2**30), ("d_model", 2**30), ("vocab_size", 10**12), ("n_layer", 10**12)]
)
def test_absurd_sizes_in_a_config_are_refused_before_allocating(root, field, value):
    p = root / "victim" / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), field: value}))
    infos, problems = checkpoints.scan_checkpoints(root)
    assert [i.name for i in infos] == ["good"] and "more than fireviz takes" in problems[str(root / "victim")]
    with pytest.raises(CheckpointError):
        GPT.from_pretrained(str(root / "victim"))


def test_results_with_a_negative_loss_are_refused(root):
    (root / "victim" / "results_prose.json").write_text(
        json.dumps({"settings": {"data": "prose"}, "per_length": [{"length": 32, "bits_per_byte": -1.0}]})
    )
    info = checkpoints.read_checkpoint(root / "victim")
    assert "bits_per_byte = -1.0" in info.problems["results_prose.json"] and not info.headline.get("bpb @ 32")


def test_a_symlinked_checkpoint_is_named_by_its_link(tmp_path):
    """Issue #38: a link named ``other`` to a folder named ``fire`` lists as ``other`` (a second
    "fire" would hide the real one, and picking "fire" could load the link's model)."""
    from conftest import make_tiny_checkpoint

    root = tmp_path / "root"
    make_tiny_checkpoint(root / "fire", "fire")
    make_tiny_checkpoint(tmp_path / "elsewhere" / "fire", "rope")
    (root / "other").symlink_to(tmp_path / "elsewhere" / "fire", target_is_directory=True)
    infos, problems = checkpoints.scan_checkpoints(root)
    assert not problems
    by_name = {i.name: i for i in infos}
    assert sorted(by_name) == ["fire", "other"]
    assert (by_name["fire"].position_encoding, by_name["other"].position_encoding) == ("fire", "rope")
    assert checkpoints.read_checkpoint(root / "other").name == "other"


def test_metadata_stuffed_into_the_weights_header_costs_bounded_memory(tmp_path):
    """Issue #38: a 50 MB metadata string made every scan cost ~6 GB. A header beyond
    MAX_SAFETENSORS_HEADER (2 MiB; a 1,000-tensor model needs ~150 KB) is refused by its length,
    unread; one just below it is read in bounded memory (the JSON depth check no longer keeps regex
    state per character)."""
    import resource
    import struct

    from conftest import make_tiny_checkpoint

    folder = make_tiny_checkpoint(tmp_path / "root" / "stuffed", "alibi")
    w = folder / "model.safetensors"
    blob = w.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])

    def stuffed(size: int) -> bytes:
        h = dict(header, __metadata__={"note": "x" * size})
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + blob[8 + n :]

    w.write_bytes(stuffed(checkpoints.MAX_SAFETENSORS_HEADER - (64 << 10)))  # just under the cap
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    info = checkpoints.read_checkpoint(folder)
    assert info.name == "stuffed"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 64 << 10  # < 64 MiB
    w.write_bytes(stuffed(checkpoints.MAX_SAFETENSORS_HEADER))
    with pytest.raises(CheckpointError, match="more than the .* a checkpoint's tensor list needs"):
        checkpoints.read_checkpoint(folder)


@pytest.mark.parametrize(
    "encoding, option",
    [
        ("fire", {"mlp_width": 100_000_000}),
        ("t5", {"num_buckets": 200_000_000, "max_distance": 1_000_000_000}),
        ("fire_s", {"mlp_width": 60_000_000}),
    ],
)
def test_a_huge_encoding_option_in_config_json_costs_nothing_to_scan(tmp_path, encoding, option):
    """Issue #38: ``"mlp_width": 100000000`` in a config.json cost 2.5 GB on every scan (the
    config's check built the encoding for real). The check builds it on the meta device first: the
    scan reads it in bounded memory, loading it is refused from the weights' header alone (their
    shapes do not match), files untouched, and the checkpoint beside it still lists."""
    import hashlib
    import resource

    from conftest import make_tiny_checkpoint

    root = tmp_path / "root"
    bad = make_tiny_checkpoint(root / "huge", encoding)
    make_tiny_checkpoint(root / "fine", "alibi")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["encoding_options"].update(option)
    (bad / "config.json").write_text(json.dumps(cfg))
    before = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in bad.iterdir()}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    listed = {c.name for c in checkpoints.list_checkpoints(root)}
    assert checkpoints.read_checkpoint(bad).name == "huge"
    with pytest.raises(CheckpointError, match="does not match its config.json"):
        checkpoints.checked_config(bad)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 256 << 10  # < 256 MiB (was 1.5–3.4 GB)
    assert {"fine", "huge"} <= listed
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in bad.iterdir()} == before


def test_a_huge_sandwich_dbar_is_refused_in_bounded_memory():
    """A breaker's finding: Sandwich's d̄ has no parameters to size on the meta device, so a
    config.json's dbar = 1e8 was built for real (1.5 GB per scan). d̄ is a model dimension: above
    MAX_DBAR it is refused by name, before anything is allocated."""
    import resource

    from fireviz.encodings.sandwich import MAX_DBAR
    from fireviz.model.gpt import GPTConfig

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for dbar in (100_000_000, MAX_DBAR + 2):
        with pytest.raises(ValueError, match=f"dbar must be an even integer in 2 … {MAX_DBAR}"):
            GPTConfig(position_encoding="sandwich", encoding_options={"dbar": dbar}).validate()
    GPTConfig(position_encoding="sandwich", encoding_options={"dbar": MAX_DBAR}).validate()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 128 << 10
