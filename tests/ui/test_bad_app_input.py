"""Bad input never takes the app down (issue 21): refused uploads are deleted and their names
cannot escape their folder, every page renders the other checkpoints whatever one checkpoint's
files hold, and adding a server path does not tell which paths exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bad_content import NESTED, _content, _pristine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireviz.data import corpus as data

ROOT = Path(__file__).resolve().parents[2]


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

    from fireviz.ui import plain

    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "config.json").write_text("{}")
    (tmp_path / "a_file.txt").write_text("x")
    messages = []
    for ref in (str(tmp_path / "no" / "such"), str(tmp_path / "exists"), str(tmp_path), str(tmp_path / "a_file.txt")):
        at = AppTest.from_file(str(ROOT / "pages" / "4_Training_runs.py"), default_timeout=60).run()
        at.sidebar.text_input(key="train_add_ref").set_value(ref)
        at.sidebar.button(key="train_add_btn").click().run()
        assert not at.exception
        messages.append(" ".join(e.value for e in at.sidebar.error).replace(plain(ref), "REF"))
    assert len(set(messages)) == 1 and "no readable checkpoint there" in messages[0]


# -- progress for every long call -------------------------------------------------------------------
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
def test_upload_names_cannot_escape_their_folder(tmp_path, monkeypatch):
    from fireviz import ui

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("..", ".", "../../x.txt", ".hidden.txt"):
        path = ui.save_upload(name, b"hello world")
        assert (
            path.is_file()
            and (tmp_path / "cache" / "eval" / "uploads") in path.parents
            and not path.name.startswith(".")
        )


# -- attacker-controlled text -------------------------------------------------------------------
_MARKDOWN_CHARS = "\\`*_{}[]()<>#+-.!|~$:&\"'=^%"


@settings(deadline=None)  # the first example imports Streamlit
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(list(_MARKDOWN_CHARS) + ["\n"]), max_size=60))
def test_plain_text_leaves_no_markdown_character_unescaped(text):
    """Issue #38: every character Markdown or HTML could read is backslash-escaped (so a name or a
    message from a URL or a file is shown as the text it is), and removing the escapes gives the
    text back (line breaks as spaces)."""
    from fireviz.ui import plain

    out = plain(text)
    i, back = 0, []
    while i < len(out):
        ch = out[i]
        assert ch != "\n"
        if ch == "\\":  # an escape: always followed by the character it escapes
            assert i + 1 < len(out) and out[i + 1] in _MARKDOWN_CHARS, (text, out)
            back.append(out[i + 1])
            i += 2
            continue
        assert ch not in _MARKDOWN_CHARS, (text, out)
        back.append(ch)
        i += 1
    assert "".join(back) == " ".join(text.splitlines())


def test_a_shared_link_cannot_draw_markdown_in_an_error(app_env):
    """A ``?ckpt=`` (or the Fit page's ``?pub=``) carrying Markdown — an image, a link, a code span
    that closes early — is shown escaped in the error, never as Markdown."""
    from streamlit.testing.v1 import AppTest

    from fireviz.ui import plain

    payload = "x` ![i](http://127.0.0.1:9/p.png) [sign in again](http://127.0.0.1:9/) **b** <img src=x>"
    for page, params in (
        ("pages/4_Training_runs.py", {"ckpt": payload}),
        ("pages/2_Fit_FIRE.py", {"target": "checkpoint", "pub": payload}),
    ):
        at = AppTest.from_file(str(ROOT / page), default_timeout=60)
        for k, v in params.items():
            at.query_params[k] = v
        at.run()
        assert not at.exception
        shown = " ".join(e.value for e in [*at.error, *at.sidebar.error, *at.warning, *at.sidebar.warning])
        assert plain(payload) in shown, (page, shown)  # said, escaped
        for raw in ("![", "](", payload):  # no image, no link: each special character escaped
            assert raw not in shown, (page, shown)


def _zeros_compressed(mb: int, xz: bool = False) -> bytes:
    """``mb`` MiB of zero bytes, gzip- or xz-compressed a piece at a time (never held whole)."""
    import lzma
    import zlib

    c = lzma.LZMACompressor(preset=0) if xz else zlib.compressobj(1, zlib.DEFLATED, 31)
    piece = bytes(1 << 20)
    return b"".join(c.compress(piece) for _ in range(mb)) + c.flush()


def test_a_compressed_upload_is_bounded_by_what_it_expands_to(tmp_path, monkeypatch):
    """Issue #38: the upload cap bounds the compressed bytes only; a small .gz or .xz (one member,
    a bomb hidden in a later member or stream, or named .txt) that expands past
    MAX_UNCOMPRESSED_MB is refused before anything is stored, in bounded memory (measured: each
    bomb expands to 96 MiB); ordinary compressed text is taken."""
    import gzip
    import lzma
    import resource

    from fireviz import ui
    from fireviz.eval import uploads

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(uploads, "MAX_UNCOMPRESSED_MB", 8)
    good = b'{"text": "hello"}\n'
    bombs = {
        "a.jsonl.gz": _zeros_compressed(96),
        "b.jsonl.gz": gzip.compress(good) + _zeros_compressed(96),  # a second member
        "c.jsonl.xz": lzma.compress(good) + _zeros_compressed(96, xz=True),  # a second stream
        "d.txt": _zeros_compressed(96),  # known by its magic bytes
    }
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    for name, blob in bombs.items():
        assert len(blob) < 1 << 20
        with pytest.raises(data.DataError, match="expands to more than 8 MB"):
            ui.save_upload(name, blob)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 48 << 10  # < 48 MiB, not 96
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # nothing stored
    for name, blob in {"ok.jsonl.gz": gzip.compress(good * 3), "ok.jsonl.xz": lzma.compress(good)}.items():
        assert ui.save_upload(name, blob).exists()


def test_a_very_long_upload_name_is_stored_under_a_shorter_one(tmp_path, monkeypatch):
    """Issue #38: a 252-character name (the file system's limit is 255 bytes, and an atomic write's
    temporary name adds to it) is stored shortened with its extension, never an OSError."""
    from fireviz import ui

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    path = ui.save_upload("n" * 246 + ".jsonl", b'{"text": "hello"}\n')
    assert path.exists() and path.name.endswith(".jsonl") and len(path.name) <= 100
    for k, name in enumerate(["漢" * 99 + ".txt", "𝟘" * 90 + ".txt", "é" * 300 + ".jsonl"]):  # bytes, not characters
        data = b'{"text": "hello"}\n' if name.endswith(".jsonl") else b"hello world %d" % k
        stored = ui.save_upload(name, data)
        assert stored.exists() and len(stored.name.encode()) <= 100 and stored.suffix == Path(name).suffix


# -- non-finite weights (issue #38): listed with their own message, no number, every page renders ----
@pytest.mark.parametrize("pick, value", [(-1, float("nan")), (3, float("inf")), (7, float("-inf"))])
def test_nonfinite_weights_fail_alone_with_their_own_message(root, monkeypatch, tmp_path, pick, value):
    """Any float tensor holding NaN/±inf: Home lists the checkpoint without numbers and with a
    warning naming the tensor (not its results' or training log's numbers), every page renders, the
    other checkpoint keeps its numbers, the file is left untouched; a layer whose attention the bad
    tensor reaches says so instead of drawing a blank heatmap."""
    import hashlib

    import torch
    from safetensors.torch import load_file, save_file
    from streamlit.testing.v1 import AppTest

    from fireviz.analysis import text_attention
    from fireviz.checkpoints import Checkpoint, read_checkpoint

    weights = root / "victim" / "model.safetensors"
    state = load_file(weights)
    name = sorted(k for k in state if state[k].is_floating_point())[pick]
    state[name] = state[name].clone().view(-1).index_fill(0, torch.tensor([0]), value).view(state[name].shape)
    save_file(state, weights)
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    info = read_checkpoint(root / "victim")
    assert info.headline == {} and name in info.problems["model.safetensors"]
    assert read_checkpoint(root / "good").headline  # the other checkpoint keeps its numbers
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    for page in ["app.py"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py")):
        at = AppTest.from_file(str(ROOT / page), default_timeout=60).run()
        assert not at.exception, (page, [e.value for e in at.exception])
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    table = at.dataframe[0].value.set_index("checkpoint")
    bpb = [c for c in table.columns if c.startswith("bpb")]
    assert table.loc["victim", bpb].isna().all() and table.loc["good", bpb].notna().all()
    said = [w.value for w in at.warning if w.value.startswith("victim")]
    assert len(said) == 1 and "NaN/inf" in said[0] and "restore or retrain" in said[0]
    model = Checkpoint.resolve(str(root / "victim")).load()
    tokens = torch.arange(2, 30)
    reached = []
    for layer in range(model.config.n_layer):
        try:
            text_attention.attention_pattern(model, tokens, layer, checkpoint="victim")
        except ValueError as e:
            assert name in str(e) and "restore or retrain" in str(e)
            reached.append(layer)
    if reached:  # from the first layer the bad tensor reaches, every later one is refused
        assert reached == list(range(reached[0], model.config.n_layer))
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before


# -- weights that are not the config's model (issue #38): no number, their own message ------------------
@pytest.mark.parametrize("damage", ["reshape", "drop", "extra", "to_int"])
def test_weights_that_do_not_fit_the_config_show_no_number_and_say_why(root, monkeypatch, tmp_path, damage):
    """A tensor of another shape, one missing, one the model lacks, or a float parameter stored as
    integers: Home lists the checkpoint with a warning naming the tensor and no numbers (its
    results and training log describe a model these weights are not), the other checkpoint keeps
    its numbers, and the file is left untouched."""
    import hashlib

    import torch
    from safetensors.torch import load_file, save_file
    from streamlit.testing.v1 import AppTest

    from fireviz.checkpoints import read_checkpoint

    weights = root / "victim" / "model.safetensors"
    state = load_file(weights)
    name = sorted(k for k in state if k.endswith("ln_f.weight") or k.endswith("ln_1.weight"))[-1]
    if damage == "reshape":
        state[name] = torch.cat([state[name], state[name][:1]])
    elif damage == "drop":
        del state[name]
    elif damage == "extra":
        name = "blocks.0.spare.weight"
        state[name] = torch.zeros(3)
    else:
        state[name] = state[name].round().to(torch.int32)
    save_file(state, weights)
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    info = read_checkpoint(root / "victim")
    assert info.headline == {} and name in info.problems["model.safetensors"]
    assert "restore or retrain" in info.problems["model.safetensors"]
    assert read_checkpoint(root / "good").headline
    monkeypatch.setenv("FIREVIZ_CHECKPOINTS_DIR", str(root))
    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value.set_index("checkpoint")
    bpb = [c for c in table.columns if c.startswith("bpb")]
    assert table.loc["victim", bpb].isna().all() and table.loc["good", bpb].notna().all()
    said = [w.value.replace("\\", "") for w in at.warning if w.value.startswith("victim")]  # shown as text
    assert len(said) == 1 and name in said[0]
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before
