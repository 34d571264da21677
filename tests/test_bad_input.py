"""Bad input never takes the app down and never gives a wrong number silently (issue 21).

One test per case of the issue's table that this module covers, and property tests that
write arbitrary JSON and bytes into a checkpoint folder's files.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from fireviz.checkpoints import catalog as checkpoints
from fireviz.cli import eval as eval_cli
from fireviz.cli import train as train_cli
from fireviz.core.files import FileFormatError, json_depth, parse_json, read_json, read_jsonl
from fireviz.data import corpus as data
from fireviz.eval import evaluate
from fireviz.fit import targets as fit_targets
from fireviz.model.gpt import GPT, CheckpointError
from fireviz.model.state import config_from_dict

ROOT = Path(__file__).resolve().parent.parent
NESTED = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def root(tmp_path) -> Path:
    """Two good checkpoints (``good``, ``victim``) under one root."""
    r = tmp_path / "root"
    make_tiny_checkpoint(r / "good", "alibi", results=True)
    make_tiny_checkpoint(r / "victim", "fire", results=True)
    return r


def _names(root: Path) -> list[str]:
    infos, _ = checkpoints.scan_checkpoints(root)
    return [i.name for i in infos]


# -- one reader --------------------------------------------------------------------------------
def test_json_depth_ignores_brackets_in_strings_and_needs_no_recursion():
    assert json_depth('{"a": "[[[[", "b": [1, {"c": "}}"}]}') == 3
    assert json_depth('"\\"[["') == 0
    assert json_depth(NESTED) == 100_000


@pytest.mark.parametrize(
    "text, match",
    [
        (NESTED, "nests 100000 levels"),
        ("[NaN]", "non-finite"),
        ("[-Infinity]", "non-finite"),
        ("[1e999]", "out of float range"),
        ("{", "not valid JSON"),
    ],
)
def test_parse_json_refuses_deep_nonfinite_and_broken(text, match):
    with pytest.raises(FileFormatError, match=match):
        parse_json(text, "x.json")


def test_read_json_bounds_size_and_type(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"a": 1}')
    assert read_json(p, expect=dict) == {"a": 1}
    with pytest.raises(FileFormatError, match="not the list"):
        read_json(p, expect=list)
    with pytest.raises(FileFormatError, match="more than the 4 read"):
        read_json(p, max_bytes=4)
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(FileFormatError, match="cannot read"):
        read_json(p)
    assert p.read_bytes() == b'{"a": "\xff"}'  # left untouched


def test_read_jsonl_keeps_nan_only_when_asked_and_drops_a_torn_tail(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"loss": NaN}\n{"loss": 1.0}\n{"loss": 2')
    recs = read_jsonl(p, allow_nonfinite=True)
    assert math.isnan(recs[0]["loss"]) and recs[1] == {"loss": 1.0} and len(recs) == 2
    with pytest.raises(FileFormatError, match=":1 "):
        read_jsonl(p)


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


def test_eval_cli_on_a_nested_config_is_one_error_not_a_traceback(root, capsys, tmp_path):
    (root / "victim" / "config.json").write_text(NESTED)
    rc = eval_cli.main(
        [str(root / "victim"), "--data", str(_small_text(tmp_path)), "--split", "all", "--lengths", "16", "--no-cache"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "nests 100000 levels" in err and "Traceback" not in err


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


def test_config_from_dict_takes_absent_fields_that_do_not_change_the_numbers():
    cfg = {
        "n_layer": 1,
        "n_head": 1,
        "d_model": 8,
        "seq_len": 16,
        "vocab_size": 257,
        "position_encoding": "nope",
        "encoding_options": {},
        "absolute_position_embedding": False,
    }
    assert config_from_dict(cfg).dropout == 0.0


def test_tied_tensors_that_disagree_are_refused(root):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    key = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    state["wte.weight"] = state[key].clone()
    state["lm_head.weight"] = state[key] + 1.0
    save_file(state, str(w))
    with pytest.raises(CheckpointError, match="different values"):
        GPT.from_pretrained(str(root / "victim"))
    state["lm_head.weight"] = state["wte.weight"].clone()  # both present and equal: fine
    save_file(state, str(w))
    GPT.from_pretrained(str(root / "victim"))


# -- numeric policy ------------------------------------------------------------------------------
def _small_text(tmp_path: Path) -> Path:
    p = tmp_path / "text.jsonl"
    p.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "text": "the quick brown fox jumps over the lazy dog " * 3}) + "\n"
            for i in range(3)
        )
    )
    return p


def test_nan_weights_are_reported_by_name_never_cached_and_fail_the_cli(root, tmp_path, capsys):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    name = next(k for k in state if k.endswith("ln_1.weight"))
    state[name][0] = float("nan")
    save_file(state, str(w))
    cache = tmp_path / "cache"
    with pytest.raises(evaluate.NonFiniteLossError, match=f"the weights contain NaN/inf in {name}"):
        evaluate.evaluate_many([str(root / "victim")], str(_small_text(tmp_path)), [16], split="all", cache_dir=cache)
    assert not any(cache.rglob("*.json")) if cache.exists() else True
    for extra in ([], ["--no-cache"]):
        rc = eval_cli.main(
            [
                str(root / "victim"),
                "--data",
                str(_small_text(tmp_path)),
                "--split",
                "all",
                "--lengths",
                "16",
                "--cache-dir",
                str(cache),
            ]
            + extra
        )
        assert rc != 0 and name in capsys.readouterr().err


# -- bytes are bytes --------------------------------------------------------------------------------
def test_latin1_text_is_tokenized_as_its_raw_bytes(tmp_path):
    raw = "café — naïve ".encode("latin-1", errors="replace") * 5
    p = tmp_path / "latin1.txt"
    p.write_bytes(raw)
    with pytest.warns(data.RawBytesWarning, match="raw bytes"):
        docs = data.load_documents(p)
    toks = data.document_tokens(docs[0])
    assert bytes(toks[1:].tolist()) == raw and docs[0].num_tokens == len(raw) + 1
    stream = data.TokenStream(docs)
    assert bytes(stream.tokens[1:].astype("uint8").tobytes()) == raw


def test_invalid_utf8_and_lone_surrogates_in_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"id": "a", "text": "x\\ud800y"}\n{"id": "b\xff", "text": "ok \xe9 bytes"}\n')
    with pytest.warns(data.RawBytesWarning):
        docs = data.load_documents(p)
    assert bytes(data.document_tokens(docs[0])[1:].tolist()) == b"x\xed\xa0\x80y"  # surrogatepass bytes
    assert bytes(data.document_tokens(docs[1])[1:].tolist()) == b"ok \xe9 bytes"
    data.data_fingerprint(docs)
    data.is_validation(docs[1].id)


def test_valid_utf8_warns_nothing_and_is_unchanged(tmp_path):
    p = tmp_path / "u.txt"
    p.write_text("naïve café ✓", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.RawBytesWarning)
        docs = data.load_documents(p)
    assert bytes(data.document_tokens(docs[0])[1:].tolist()) == "naïve café ✓".encode()


def test_train_and_eval_take_a_lone_surrogate(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "ab\ud800cd " * 20}) + "\n" for i in range(3)))
    with pytest.warns(data.RawBytesWarning):
        docs = data.load_documents(p)
    data.TokenStream(docs, min_tokens=17).batch(torch.tensor([0, 3]), 17)


# -- uploads ------------------------------------------------------------------------------------
def test_a_refused_upload_is_deleted(tmp_path, monkeypatch):
    from fireviz import ui

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(data.DataError):
        ui.save_upload("bad.jsonl", b'{"no_text": 1}\n')
    assert not list((tmp_path / "cache").rglob("bad.jsonl"))
    with pytest.raises(data.DataError, match="MB"):
        ui.save_upload("big.txt", b"x" * ((ui.MAX_UPLOAD_MB << 20) + 1))
    path = ui.save_upload("latin.txt", "café".encode("latin-1"))  # raw bytes are accepted
    assert path.read_bytes() == "café".encode("latin-1")


def test_streamlit_upload_limit_matches_the_library():
    import tomllib

    from fireviz import ui

    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["maxUploadSize"] == ui.MAX_UPLOAD_MB


# -- properties: arbitrary content never escapes as a foreign error ---------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12,
)
_key_json = st.fixed_dictionaries(
    {},
    optional={
        k: _json
        for k in (
            "settings",
            "per_length",
            "data",
            "length",
            "bits_per_byte",
            "n_layer",
            "seq_len",
            "position_encoding",
            "step",
            "loss",
            "val_loss",
            "tokens",
            "ci95",
        )
    },
)
_content = st.one_of(
    st.binary(max_size=200),
    _json.map(json.dumps),
    _key_json.map(json.dumps),
    st.just(NESTED),
    st.just('{"settings": {"data": "prose"}, "per_length": [{"length": 1e999}]}'),
)


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


_PRISTINE: dict = {}


def _pristine(factory) -> Path:
    if "root" not in _PRISTINE:
        r = factory.mktemp("pristine") / "root"
        make_tiny_checkpoint(r / "good", "alibi", results=True)
        make_tiny_checkpoint(r / "victim", "fire", results=True)
        _PRISTINE["root"] = r
    return _PRISTINE["root"]


@pytest.mark.parametrize(
    "file, content, refused",
    [
        ("config.json", NESTED, True),
        ("results_prose.json", NESTED, True),
        ("train_log.jsonl", NESTED, True),
        ("results_prose.json", '{"settings": {"data": ["prose"]}, "per_length": []}', True),
        (
            "train_log.jsonl",
            '{"step": 1, "loss": NaN, "val_loss": NaN}\n',
            False,
        ),  # a diverged run: shown, not a number
        ("config.json", b"\xff\xfe\x00garbage", True),
    ],
)
def test_every_page_renders_the_other_checkpoints(root, monkeypatch, tmp_path, file, content, refused):
    from streamlit.testing.v1 import AppTest

    target = root / "victim" / file
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for name in ["app.py"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py")):
        at = AppTest.from_file(str(ROOT / name), default_timeout=60).run()
        assert not at.exception, (name, [e.value for e in at.exception])
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert "good" in list(at.dataframe[0].value["checkpoint"])
    assert any("victim" in w.value for w in at.warning) == refused


def test_adding_a_server_path_does_not_tell_which_paths_exist(app_env, tmp_path):
    from streamlit.testing.v1 import AppTest

    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "config.json").write_text("{}")
    (tmp_path / "a_file.txt").write_text("x")
    messages = []
    for ref in (str(tmp_path / "no" / "such"), str(tmp_path / "exists"), str(tmp_path), str(tmp_path / "a_file.txt")):
        at = AppTest.from_file(str(ROOT / "pages" / "4_Training_runs.py"), default_timeout=60).run()
        at.sidebar.text_input(key="train_add_ref").set_value(ref)
        at.sidebar.button(key="train_add_btn").click().run()
        assert not at.exception
        messages.append(" ".join(e.value for e in at.sidebar.error).replace(ref, "REF"))
    assert len(set(messages)) == 1 and "no readable fireviz checkpoint" in messages[0]


# -- memory before work ---------------------------------------------------------------------------
def test_a_length_that_cannot_fit_in_memory_is_refused_before_work(root, tmp_path, monkeypatch):
    from fireviz.model import memory

    cfg = GPT.from_pretrained(str(root / "good")).config
    need_16 = memory.forward_bytes(cfg, 1, 16)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": need_16 + 1)
    calls = []
    monkeypatch.setattr(
        evaluate, "score_windows", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError)
    )
    text = tmp_path / "long.jsonl"
    text.write_text(json.dumps({"id": "a", "text": "x" * 5000}) + "\n")
    r = evaluate.evaluate_many([str(root / "good")], str(text), [4096], split="all", use_cache=False, batch_tokens=16)[
        0
    ]
    err = r["per_length"][0]["error"]
    assert "needs about" in err and "available" in err and "largest length that fits is about" in err
    largest = int(err.split("largest length that fits is about ")[1].split(" ")[0].replace(",", ""))
    assert memory.forward_bytes(cfg, max(1, 16 // largest), largest) <= need_16 + 1
    assert memory.forward_bytes(cfg, max(1, 16 // (largest + 1)), largest + 1) > need_16 + 1
    assert not calls  # nothing was scored


def test_forward_bytes_grows_with_length_and_batch():
    from fireviz.model import memory
    from fireviz.model.gpt import GPTConfig

    for enc in ("fire", "rope"):
        cfg = GPTConfig(position_encoding=enc)
        sizes = [memory.forward_bytes(cfg, 1, n) for n in (512, 1024, 4096, 16384)]
        assert sizes == sorted(sizes) and memory.forward_bytes(cfg, 2, 512) > sizes[0]


# -- progress for every long call -------------------------------------------------------------------
def test_fit_refuses_absurd_head_counts_and_reports_its_start(capsys):
    from fireviz.cli import fit as fit_cli
    from fireviz.fit import fitting as fit

    rc = fit_cli.main(["--target", "alibi", "--max-len", "64", "--heads", "100000"])
    err = capsys.readouterr().err
    assert rc == 2 and "100000" in err and f"{fit_targets.MAX_FIT_HEADS}" in err
    seen, stops = [], iter([False, False, True])
    r = fit.fit_fire(
        "alibi",
        64,
        num_heads=2,
        steps=5,
        start_progress=lambda d, t: seen.append((d, t)),
        should_stop=lambda: next(stops, True),
    )
    assert seen[:3] == [(1, 9), (2, 9), (3, 9)] and r.stopped and r.steps_run == 0  # Stop works in the start
    assert math.isfinite(r.relative_rmse)


def test_document_tokens_slices_equal_the_int64_tokens():
    doc = data.Document("d", "héllo wörld " * 7)
    full, lazy = data.document_tokens(doc), data.DocumentTokens(doc)
    assert len(lazy) == len(full) == doc.num_tokens
    for a, b in ((0, 1), (0, 9), (1, 9), (5, len(full)), (len(full) - 3, len(full) + 10), (4, 4)):
        assert torch.equal(lazy[a:b], full[a:b]), (a, b)


def test_eval_counts_documents_too_short_and_takes_lone_surrogates(root, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": ("ab\ud800cd " * 20)[: 60 + 40 * i]}) + "\n" for i in range(4))
    )
    with pytest.warns(data.RawBytesWarning):
        r = evaluate.evaluate_many(
            [str(root / "good")], str(p), [100], split="all", use_cache=False, mode="nonoverlapping"
        )[0]
    e = r["per_length"][0]
    assert e["documents_skipped"] == 1 and e["documents"] == 3 and math.isfinite(e["bits_per_byte"])
    assert "documents too short" in eval_cli.format_table([r])


def test_train_takes_a_lone_surrogate(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "ab\ud800cd " * 40}) + "\n" for i in range(12)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\nn_layer = 1\nn_head = 1\nd_model = 8\nseq_len = 16\nposition_encoding = "alibi"\n'
        f'[train]\ndata = "{p}"\nmax_steps = 2\nbatch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", data.RawBytesWarning)
        rc = train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 0 and (tmp_path / "run" / "model.safetensors").exists()


def test_training_fit_and_bias_report_refuse_what_cannot_fit(tmp_path, monkeypatch, capsys):
    from fireviz.analysis import biases as analysis
    from fireviz.fit import fitting as fit
    from fireviz.model import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 10 << 20)
    with pytest.raises(ValueError, match="needs about .* more than the 10 MiB available"):
        fit.fit_fire("alibi", 4096, num_heads=8, steps=1)
    model = GPT.from_pretrained(str(make_tiny_checkpoint(tmp_path / "c", "alibi")))
    with pytest.raises(ValueError, match="bias report up to query position"):
        analysis.bias_report(model, query_positions=[10_000_000])
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "abcd " * 1000}) + "\n" for i in range(12)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\nseq_len = 1024\nposition_encoding = "alibi"\n[train]\ndata = "{p}"\nmax_steps = 2\nbatch_size = 16\n'
    )
    rc = train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc != 0 and not (tmp_path / "run" / "model.safetensors").exists()
    assert "a training step (micro-batch 16 × seq_len 1024) needs about" in capsys.readouterr().err


def test_the_estimates_let_normal_work_through():
    from fireviz.model import memory
    from fireviz.model.gpt import GPTConfig

    cfg = GPTConfig(position_encoding="fire")
    assert memory.train_step_bytes(cfg, 16, 512, 900_000) < 4 << 30  # the shipped recipe: well under 24 GB
    assert memory.fit_bytes(8, 512) < 256 << 20
    assert memory.forward_bytes(cfg, 1, 8192) < 1 << 30


def test_the_train_hint_the_app_and_errors_show_runs(tmp_path, monkeypatch):
    import shlex

    monkeypatch.chdir(ROOT)
    words = shlex.split(checkpoints.TRAIN_HINT.replace("<encoding>", "alibi"))
    assert words[:4] == ["python", "-m", "fireviz", "train"]
    args = words[4:]
    args[args.index("--out") + 1] = str(tmp_path / "my_run")  # never into the repository's checkpoints/
    args += [
        "--set",
        "train.max_steps=2",
        "--set",
        "train.warmup_steps=1",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.checkpoint_interval=2",
        "--set",
        "train.batch_size=2",
        "--set",
        "model.seq_len=64",
        "--no-progress",
    ]
    assert train_cli.main(args) == 0
    assert checkpoints.read_checkpoint(tmp_path / "my_run").position_encoding == "alibi"


@pytest.mark.slow
def test_eval_memory_grows_little_with_one_long_single_line_document(tmp_path, root):
    """One 24 MB single-line text file: peak RSS does not grow with it (windows read where they
    lie, fireviz.data.corpus.FileBytes), not the 18 bytes per byte of int64 tokens plus copies."""
    import subprocess
    import sys

    code = (
        "import resource, sys; from fireviz.eval import evaluate; "
        "evaluate.evaluate_many([sys.argv[1]], sys.argv[2], [256], split='all', mode='nonoverlapping', "
        "token_budget=4096, use_cache=False); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    peaks: dict[int, int] = {}
    for mb in (1, 24):
        p = tmp_path / f"doc{mb}.txt"
        p.write_text(("river stone of the delta " * (mb * 2**20 // 25 + 1))[: mb * 2**20])
    for mb in (1, 24, 1, 24):  # the lower of two runs each: a first run's peak can be ~40 MB higher by chance
        out = subprocess.run(
            [sys.executable, "-c", code, str(root / "good"), str(tmp_path / f"doc{mb}.txt")],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        peaks[mb] = min(peaks.get(mb, 1 << 62), int(out.stdout.strip().splitlines()[-1]))
    per_byte = (peaks[24] - peaks[1]) / (23 * 2**20)
    assert per_byte < 0.5, f"{per_byte:.2f} bytes of memory per document byte (a text file is read where windows lie)"


@pytest.mark.parametrize("kind", ["txt", "txt.gz", "jsonl"])
def test_documents_on_disk_read_the_same_tokens_as_in_memory(tmp_path, monkeypatch, kind):
    """A plain file is read on demand, a compressed one spooled, a big JSONL line spooled:
    every slice, the fingerprint (so every cache key), the split and the text are those of
    the same document held in memory."""
    import gzip
    import json as _json

    from fireviz.data import corpus as data

    monkeypatch.setattr(data, "SPOOL_BYTES", 1000)  # spool anything over 1000 bytes
    text = "Grüße, ✓ straße " * 400 + "\udcff end"  # non-ASCII, and one raw byte (0xff, surrogateescape'd)
    raw = data.text_bytes(text)
    p = tmp_path / f"doc.{kind}"
    if kind == "txt":
        p.write_bytes(raw)
    elif kind == "txt.gz":
        p.write_bytes(gzip.compress(raw))
    else:
        p.write_text(_json.dumps({"id": "doc.txt", "text": text}) + "\n")
    with pytest.warns(data.RawBytesWarning):
        (doc,) = data.load_documents(p)
    if kind != "jsonl":
        assert doc.id == p.name
        doc = data.Document(doc.id, raw=doc.raw_bytes())
    mem = data.Document(doc.id, text)
    assert doc.on_disk and not mem.on_disk and doc == mem and len(doc) == len(raw)
    assert data.data_fingerprint([doc]) == data.data_fingerprint([mem])
    assert data.text_bytes(doc.text) == raw
    a, b = data.DocumentTokens(doc), data.DocumentTokens(mem)
    for lo, hi in [(0, 7), (5, 900), (len(a) - 3, len(a)), (3, 3)]:
        assert torch.equal(a[lo:hi], b[lo:hi])
    assert torch.equal(data.document_tokens(doc), data.document_tokens(mem))
    assert np.array_equal(data.TokenStream([doc]).tokens, data.TokenStream([mem]).tokens)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(file=st.sampled_from(["config.json", "results_prose.json", "train_log.jsonl"]), content=_content)
def test_any_content_in_one_file_every_page_still_renders(tmp_path_factory, monkeypatch, file, content):
    from streamlit.testing.v1 import AppTest

    base = tmp_path_factory.mktemp("pages")
    shutil.copytree(_pristine(tmp_path_factory), base / "root")
    target = base / "root" / "victim" / file
    target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(base / "root"))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(base / "cache"))
    for name in ["app.py"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py")):
        at = AppTest.from_file(str(ROOT / name), default_timeout=60).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        if name == "app.py":
            assert "good" in list(at.dataframe[0].value["checkpoint"])


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


def test_nan_weights_give_no_number_even_from_a_matching_results_json(root, tmp_path):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    k = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    state[k][0, 0] = float("nan")
    save_file(state, str(w))
    sha = evaluate.checkpoint_sha256(root / "victim")
    text = _small_text(tmp_path)
    fp = data.data_fingerprint(data.load_documents(text))
    (root / "victim" / "results.json").write_text(
        json.dumps(
            [{"checkpoint_sha256": sha, "data_fingerprint": fp, "settings": {"data": str(text)}, "per_length": []}]
        )
    )
    with pytest.raises(evaluate.NonFiniteLossError, match=k):
        evaluate.evaluate_many([str(root / "victim")], str(text), [16], split="all", cache_dir=tmp_path / "c")


def test_a_nan_in_the_tied_matrix_is_named_not_called_a_disagreement(root):
    w = root / "victim" / "model.safetensors"
    state = load_file(str(w))
    k = "wte.weight" if "wte.weight" in state else "lm_head.weight"
    t = state[k].clone()
    t[0, 0] = float("nan")
    state["wte.weight"], state["lm_head.weight"] = t, t.clone()
    save_file(state, str(w))
    from fireviz.model.state import nonfinite_parameters

    assert "wte.weight" in nonfinite_parameters(GPT.from_pretrained(str(root / "victim")))


def test_data_files_with_giant_numbers_or_corrupt_gzip_are_data_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "text": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(data.DataError, match="not valid JSON"):
        data.load_documents(p)
    g = tmp_path / "d.jsonl.gz"
    g.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    with pytest.raises(data.DataError, match="cannot read"):
        data.load_documents(g)


def test_upload_names_cannot_escape_their_folder(tmp_path, monkeypatch):
    from fireviz import ui

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("..", ".", "../../x.txt", ".hidden.txt"):
        path = ui.save_upload(name, b"hello world")
        assert path.is_file() and (tmp_path / "cache" / "uploads") in path.parents and not path.name.startswith(".")


def test_results_with_a_negative_loss_are_refused(root):
    (root / "victim" / "results_prose.json").write_text(
        json.dumps({"settings": {"data": "prose"}, "per_length": [{"length": 32, "bits_per_byte": -1.0}]})
    )
    info = checkpoints.read_checkpoint(root / "victim")
    assert "bits_per_byte = -1.0" in info.problems["results_prose.json"] and not info.headline.get("bpb @ 32")


def test_a_trained_config_names_every_encoding_option_and_refuses_a_deleted_one(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": "abcd " * 300}) + "\n" for i in range(12)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\nn_layer = 1\nn_head = 2\nd_model = 16\nseq_len = 32\nposition_encoding = "t5"\n'
        f'encoding_options = {{max_distance = 20}}\n[train]\ndata = "{p}"\nmax_steps = 2\nwarmup_steps = 1\n'
        "batch_size = 2\neval_interval = 2\ncheckpoint_interval = 2\neval_batches = 1\n"
    )
    assert train_cli.main(["--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["config_format"] == 2
    assert saved["encoding_options"] == {
        "num_buckets": 32,
        "max_distance": 20,
        "bidirectional": False,
        "init_std": 0.02,
    }
    before = GPT.from_pretrained(str(tmp_path / "run"))
    assert before.encoding(0).max_distance == 20
    del saved["encoding_options"]["max_distance"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="does not name encoding option.*max_distance"):
        GPT.from_pretrained(str(tmp_path / "run"))
    with pytest.raises(CheckpointError, match="max_distance"):
        checkpoints.read_checkpoint(tmp_path / "run")
    saved["config_format"] = 1  # an older file: unset options take their defaults, as they always did
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    assert GPT.from_pretrained(str(tmp_path / "run")).encoding(0).max_distance == 128


def test_a_text_file_changed_or_deleted_while_in_use_is_refused_and_nothing_is_cached(tmp_path, root):
    """The fingerprint is taken when the data is read; a file that changes afterwards must not be
    scored as other text under it (nor cached)."""
    import os

    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 60)
    cache = tmp_path / "cache"

    def rewrite(done, total, message):
        if "L=128" in message:  # the first length is finished: now the file changes (same size)
            text.write_bytes(text.read_bytes()[::-1])
            os.utime(text, ns=(1, 1))

    with pytest.raises(data.DataError, match="changed"):
        evaluate.evaluate_many(
            [root / "good"],
            str(text),
            [64, 128],
            mode="nonoverlapping",
            token_budget=320,
            split="all",
            cache_dir=cache,
            progress=rewrite,
        )
    assert len(list(cache.glob("*.json"))) == 1  # the length scored before the change, nothing after
    docs = data.load_documents(text)
    text.unlink()
    with pytest.raises(data.DataError, match="deleted"):
        data.DocumentTokens(docs[0])[0:10]
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(data.DataError, match="not a regular file"):
        data.load_documents(fifo)


def test_a_data_folder_takes_every_text_kind_with_paths_as_ids_and_one_spool(tmp_path, monkeypatch):
    import gzip

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.txt").write_text("first document " * 10)
    (tmp_path / "b" / "x.txt").write_text("second document " * 10)
    (tmp_path / "c.md").write_text("# notes " * 10)
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(b"compressed text " * 10))
    docs = data.load_documents(tmp_path)
    assert [d.id for d in docs] == ["a/x.txt", "b/x.txt", "c.md", "d.txt.gz"]
    monkeypatch.setattr(data, "SPOOL_BYTES", 100)
    (tmp_path / "e.jsonl").write_text(
        "".join(json.dumps({"id": f"j{k}", "text": f"doc {k} " * 50}) + "\n" for k in range(30))
    )
    big = data.load_documents(tmp_path / "e.jsonl")
    assert all(d.on_disk for d in big) and len({id(d.raw_bytes().fileobj) for d in big}) == 1  # one descriptor
    assert [d.text for d in big] == [f"doc {k} " * 50 for k in range(30)]


# -- the checkpoint doors agree (review) -----------------------------------------------------------
def _door_errors(ref) -> dict[str, tuple[str, str]]:
    """``{door: (exception type, message)}`` of every checkpoint door asked for ``ref``."""
    doors = {
        "resolve_checkpoint": lambda: checkpoints.resolve_checkpoint(str(ref), local_files_only=True),
        "read_checkpoint": lambda: checkpoints.read_checkpoint(ref),
        "checkpoint_files": lambda: checkpoints.checkpoint_files(ref),
        "checkpoint_sha256": lambda: checkpoints.checkpoint_sha256(ref),
        "load_model": lambda: checkpoints.load_model(ref),
        "load_model_or_published": lambda: checkpoints.load_model_or_published(str(ref)),
        "load_model_with_identity": lambda: checkpoints.load_model_with_identity(ref),
        "checked_config": lambda: checkpoints.checked_config(ref),
    }
    out = {}
    for name, door in doors.items():
        with pytest.raises(CheckpointError) as e:
            door()
        out[name] = (type(e.value).__name__, str(e.value))
    return out


def test_every_checkpoint_door_says_one_message_per_problem(root, tmp_path, monkeypatch):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text((root / "good" / "config.json").read_text())
    (tmp_path / "a_file").write_text("x")
    for ref, words in (
        (tmp_path / "missing", ["not found", "neither a checkpoint name under", "an existing folder"]),
        (tmp_path / "no_weights", ["has no model.safetensors", "not a fireviz checkpoint folder"]),
        (tmp_path / "a_file", ["is a file, not a checkpoint folder"]),
        ("typo_name", ["not found", str(root)]),
    ):
        said = _door_errors(ref)
        assert len(set(said.values())) == 1, said  # one type, one message
        kind, message = next(iter(said.values()))
        assert kind == "CheckpointNotFoundError" and all(w in message for w in words), message


def test_a_bundled_name_is_a_checkpoint_at_every_door(root, tmp_path, monkeypatch):
    """``python -m fireviz eval good`` means the checkpoint ``good`` under the root, as the app's
    box does; an existing local folder of that name comes first; ``~`` is expanded everywhere."""
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.chdir(tmp_path)
    sha = checkpoints.checkpoint_sha256(root / "good")
    assert checkpoints.checkpoint_sha256("good") == sha
    assert checkpoints.checkpoint_files("good") == (root / "good" / "config.json", root / "good" / "model.safetensors")
    assert checkpoints.load_model("good").config.position_encoding == "alibi"
    assert checkpoints.load_model_or_published("good").config.position_encoding == "alibi"
    assert checkpoints.load_model_with_identity("good")[1] == sha
    assert checkpoints.read_checkpoint("good").path == checkpoints.resolve_checkpoint("good").path
    for door in (checkpoints.checkpoint_files, checkpoints.resolve_checkpoint, checkpoints.load_model):
        with pytest.raises(checkpoints.CheckpointNotFoundError, match="not found"):
            door("./good")  # spelled as a path: that path only, never the bundled name
    shutil.copytree(root / "victim", tmp_path / "good")  # a local folder named like it: the path wins
    assert checkpoints.checkpoint_sha256("good") == checkpoints.checkpoint_sha256(root / "victim")
    assert checkpoints.resolve_checkpoint("good").path == checkpoints.read_checkpoint(tmp_path / "good").path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert checkpoints.checkpoint_sha256("~/good") == checkpoints.checkpoint_sha256(tmp_path / "good")
    assert checkpoints.checked_config("~/good") == checkpoints.load_model("~/good").config
    with pytest.raises(CheckpointError, match="a checkpoint is a folder path, a checkpoint name"):
        checkpoints.checkpoint_files(5)


def test_cli_eval_takes_a_bundled_name(root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"id": f"d{k}", "text": "abc " * 20}) + "\n" for k in range(3)))
    argv = ["good", "--data", str(text), "--split", "all", "--lengths", "16", "--quiet"]
    assert eval_cli.main(argv + ["--cache-dir", str(tmp_path / "c")]) == 0
    assert "good" in capsys.readouterr().out
    assert eval_cli.main(["typo_name"] + argv[1:] + ["--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint 'typo_name' not found" in err[0]
