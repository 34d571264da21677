"""Published causal LMs (issue #36): tiny random models written by transformers itself, with a BPE
tokenizer trained on bundled text; fireviz's numbers checked against transformers' own loss."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from causal_lm_folders import write_causal_lm  # noqa: E402

from fireviz.checkpoints import CausalLMCheckpoint, resolve_any  # noqa: E402
from fireviz.cli.eval import main as eval_main  # noqa: E402
from fireviz.data import load_documents  # noqa: E402
from fireviz.eval import EvalCache, EvalSettings, evaluate  # noqa: E402
from fireviz.eval.plan import load_eval_documents  # noqa: E402
from fireviz.model import CheckpointError  # noqa: E402

pytest.importorskip("transformers")

DOCS = 10  # documents of the bundled prose validation split the tests score


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    return {
        "llama": write_causal_lm(root / "llama", "llama"),
        "llama_nobos": write_causal_lm(root / "llama_nobos", "llama", add_bos=False),
        # larger weights: attention that depends on position enough for a scaling to show
        "llama_sharp": write_causal_lm(root / "llama_sharp", "llama", initializer_range=0.3),
        "neox": write_causal_lm(root / "neox", "neox"),
        "mistral": write_causal_lm(root / "mistral", "mistral"),
        "bloom": write_causal_lm(root / "bloom", "bloom"),
        "gpt2": write_causal_lm(root / "gpt2", "gpt2"),
    }


def _evaluate(ckpts, lengths, tmp_path, **settings):
    s = EvalSettings.make("prose", lengths, token_budget=DOCS * (max(lengths) - 1), **settings)
    return evaluate([resolve_any(c) for c in ckpts], s, cache=EvalCache(tmp_path / "cache"))


def _hf_reference(folder: Path, doc_ids: list[str], M: int, bos: bool):
    """Per document: transformers' own summed loss (nats) over the first M tokens of the text as
    its tokenizer encodes it (BOS first when ``bos``), and the UTF-8 bytes of tokens 1 … M − 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    docs = {d.id: d for d in load_eval_documents("prose", "validation")[0]}
    nats, nbytes = [], []
    for i in doc_ids:
        text = docs[i].text
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        if bos:
            ids, offsets = [tok.bos_token_id] + ids, [(0, 0)] + offsets
        x = torch.tensor([ids[:M]])
        with torch.no_grad():
            loss = model(input_ids=x, labels=x).loss.item()  # mean over the M − 1 targets
        nats.append(loss * (M - 1))
        first = offsets[1][0] if bos else offsets[0][1]  # bytes before the first target: none with BOS
        nbytes.append(len(text[: offsets[M - 1][1]].encode()) - len(text[:first].encode()))
    return nats, nbytes


@pytest.mark.parametrize("bos", [None, "none"])
def test_per_document_losses_equal_transformers_own_loss(folders, tmp_path, bos):
    """One length M = the text: one window per document, so fireviz's per-document loss is
    transformers' loss on the first M tokens (≤ 1e-5 nats per token), for the model's own BOS
    convention and for none; bits per byte is the summed loss over the targets' UTF-8 bytes."""
    M = 48
    (r,) = _evaluate([folders["llama"]], [M], tmp_path, bos_mode=bos)
    e = r["per_length"][0]
    pd = e["per_document"]
    nats, nbytes = _hf_reference(folders["llama"], pd["doc"], M, bos=bos is None)
    assert pd["tokens"] == [M - 1] * len(pd["doc"])
    np.testing.assert_allclose(np.array(pd["nats"]) / (M - 1), np.array(nats) / (M - 1), atol=1e-5)
    assert pd["bytes"] == nbytes
    assert e["bits_per_byte"] == pytest.approx(sum(pd["nats"]) / sum(nbytes) / math.log(2), rel=1e-12)
    assert e["tokens_per_byte"] == pytest.approx(sum(pd["tokens"]) / sum(nbytes))
    assert r["checkpoint_kind"] == "transformers" and r["position_encoding"] == "rope"


def test_a_bos_on_every_window_replaces_each_windows_first_token(folders, tmp_path, monkeypatch):
    """bos_mode 'window': every window the model reads starts with BOS; at the length that is the
    whole text (one window per document) that equals BOS at the document start."""
    seen = []
    real = CausalLMCheckpoint.load

    def spy(self, *a, **k):
        module = real(self, *a, **k)
        forward = module.forward
        module.forward = lambda ids: seen.append(ids[:, 0].clone()) or forward(ids)
        return module

    monkeypatch.setattr(CausalLMCheckpoint, "load", spy)
    (every,) = _evaluate([folders["llama"]], [16, 48], tmp_path / "w", bos_mode="window")
    assert seen and all(bool((first == 0).all()) for first in seen)  # id 0 is <s>
    (start,) = _evaluate([folders["llama"]], [16, 48], tmp_path / "d", bos_mode="document")
    whole = {e["length"]: e for e in every["per_length"]}, {e["length"]: e for e in start["per_length"]}
    assert whole[0][48]["per_document"]["nats"] == pytest.approx(whole[1][48]["per_document"]["nats"], abs=1e-9)
    assert whole[0][16]["bits_per_byte"] != pytest.approx(whole[1][16]["bits_per_byte"], abs=1e-6)
    assert every["settings"]["bos_mode"] == "window"


def test_a_published_model_and_a_fireviz_one_pair_on_the_same_bytes(folders, tiny_checkpoints_dir, tmp_path):
    """Different tokenizers, one text: every document's targets cover the same bytes to within
    one token, and the paired difference is the per-document bits-per-byte difference weighted by
    the reference's bytes."""
    results = _evaluate([tiny_checkpoints_dir / "alibi", folders["llama"]], [16, 48], tmp_path)
    ref, llama = ({e["length"]: e for e in r["per_length"]} for r in results)
    for n in (16, 48):
        a, b = llama[n]["per_document"], ref[n]["per_document"]
        assert a["doc"] == b["doc"] and len(a["doc"]) == DOCS
        assert all(abs(x - y) <= 16 for x, y in zip(a["bytes"], b["bytes"], strict=True))  # ≤ one BPE token
        w = np.array(b["bytes"], dtype=float)
        per_doc = np.array(a["nats"]) / np.array(a["bytes"]) - np.array(b["nats"]) / np.array(b["bytes"])
        expected = float((per_doc * w).sum() / w.sum() / math.log(2))
        assert llama[n]["paired_delta_bpb"] == pytest.approx(expected, rel=1e-9)
        lo, hi = llama[n]["paired_ci95"]
        assert lo <= llama[n]["paired_delta_bpb"] <= hi
        assert llama[n]["tokens_per_byte"] < 1 and ref[n]["tokens_per_byte"] == 1.0
    # the same text at every length, for each checkpoint
    assert llama[16]["per_document"]["bytes"] == llama[48]["per_document"]["bytes"]
    assert ref[16]["per_document"]["bytes"] == ref[48]["per_document"]["bytes"]


@pytest.mark.parametrize("scaling", ["linear", "dynamic", "yarn", "llama3"])
def test_rope_scaling_changes_numbers_beyond_the_original_length_only(folders, tmp_path, scaling):
    """Within the original 64 tokens the factor is 1 and each method leaves the model as it is;
    at 128 tokens it changes the numbers."""
    (plain,) = _evaluate([folders["llama_sharp"]], [32, 128], tmp_path / "plain")
    (scaled,) = _evaluate([folders["llama_sharp"]], [32, 128], tmp_path / scaling, rope_scaling=scaling)
    p, s = ({e["length"]: e for e in r["per_length"]} for r in (plain, scaled))
    assert s[32]["per_document"]["nats"] == pytest.approx(p[32]["per_document"]["nats"], abs=1e-6)
    assert abs(s[128]["bits_per_byte"] - p[128]["bits_per_byte"]) > 5e-4
    assert s[128]["rope_scaling"]["rope_type"] == scaling and s[128]["rope_scaling"]["factor"] == 2.0


@pytest.mark.parametrize("kind", ["neox", "mistral", "bloom"])
def test_other_architectures_evaluate_beyond_their_length(folders, tmp_path, kind):
    """GPT-NeoX (partial rotary), Mistral (sliding window), BLOOM (ALiBi) score at and beyond 64."""
    (r,) = _evaluate([folders[kind]], [32, 128], tmp_path)
    assert all("error" not in e and math.isfinite(e["bits_per_byte"]) for e in r["per_length"])
    assert r["position_encoding"] == ("alibi" if kind == "bloom" else "rope")


def test_learned_positions_are_refused_beyond_their_length(folders, tmp_path):
    (r,) = _evaluate([folders["gpt2"]], [32, 128], tmp_path)
    by = {e["length"]: e for e in r["per_length"]}
    assert "error" not in by[32]
    assert "absolute position embeddings cover 64 tokens" in by[128]["error"]


def test_a_tokenizer_without_bos_is_refused_a_bos_in_one_line(folders, tmp_path):
    """The no-BOS tokenizer still has <s>; its default adds none, and that is what it scores."""
    ckpt = resolve_any(folders["llama_nobos"])
    assert not ckpt.tokenizer.adds_bos
    (r,) = _evaluate([ckpt], [48], tmp_path)
    assert r["per_length"][0]["per_document"]["tokens"][0] == 47


def test_pickle_only_folders_and_scalings_that_do_not_apply_are_refused(folders, tmp_path):
    bad = tmp_path / "pickled"
    bad.mkdir()
    for f in folders["llama"].iterdir():
        if f.suffix != ".safetensors":
            (bad / f.name).write_bytes(f.read_bytes())
    (bad / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="safetensors only"):
        resolve_any(bad)
    from fireviz.eval import EvaluationError

    with pytest.raises(EvaluationError, match="needs a RoPE"):
        _evaluate([folders["bloom"]], [32], tmp_path, rope_scaling="yarn")


def test_cli_prints_both_rows_in_bits_per_byte_with_their_paired_difference(
    folders, tiny_checkpoints_dir, tmp_path, capsys
):
    """The acceptance command's shape: a transformers folder and a fireviz checkpoint, two lengths."""
    code = eval_main(
        [
            str(folders["llama"]),
            str(tiny_checkpoints_dir / "alibi"),
            "--data",
            "prose",
            "--lengths",
            "16,48",
            "--token-budget",
            "400",
            "--cache-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "one text for every checkpoint" in out and "tok/B" in out
    table = out.split("bits per byte [95 % bootstrap interval")[1]
    assert "llama" in table and "alibi" in table
    assert "paired difference in bits per byte vs llama on the same text" in out


def test_documents_are_tokenized_with_byte_ends_that_cover_the_text():
    """Every document: byte ends non-decreasing and ending at its UTF-8 size (lossless BPE)."""
    from transformers import AutoTokenizer

    from fireviz.data.tokenizers import HFTokenizer

    folder = Path(__file__).parent  # any folder: the tokenizer is built in memory
    del folder
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        from causal_lm_folders import save_tokenizer

        save_tokenizer(Path(tmp))
        tok = HFTokenizer(AutoTokenizer.from_pretrained(tmp), key="t")
    for doc in load_documents("prose")[:5] + load_documents("code")[:3]:
        td = tok.encode(doc)
        ends = td.byte_ends
        assert (np.diff(ends) >= 0).all() and ends[-1] == len(doc.raw_bytes()[:])
        assert td.token_bytes().sum() == len(doc.raw_bytes()[:])


# -- the Hub path, against the loopback server the hub tests use ------------------------------------
def test_a_hub_id_fetches_safetensors_and_tokenizer_and_scores_as_the_folder(folders, hub_env, monkeypatch):
    from hub_server import HubServer

    pickled = hub_env / "pickled"
    pickled.mkdir()
    for f in folders["llama"].iterdir():
        if f.suffix != ".safetensors":
            (pickled / f.name).write_bytes(f.read_bytes())
    (pickled / "pytorch_model.bin").write_bytes(b"never read")
    with HubServer({"org/tiny-llama": folders["llama"], "org/pickled": pickled}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        ckpt = resolve_any("org/tiny-llama")
        assert isinstance(ckpt, CausalLMCheckpoint) and ckpt.source == "hub" and ckpt.repo_id == "org/tiny-llama"
        assert ckpt.sha256 == resolve_any(folders["llama"]).sha256  # the same files: one identity
        fetched = {entry[2] for entry in server.log}
        assert "model.safetensors" in fetched and "tokenizer.json" in fetched
        with pytest.raises(CheckpointError, match="pickle"):
            CausalLMCheckpoint.resolve("org/pickled")
        assert not any(entry[2] == "pytorch_model.bin" and entry[0] == "GET" for entry in server.log)
    s = EvalSettings.make("prose", [48], token_budget=DOCS * 47)
    (hub_row,) = evaluate([ckpt], s, cache=EvalCache(hub_env / "c1"))
    (folder_row,) = evaluate([resolve_any(folders["llama"])], s, cache=EvalCache(hub_env / "c2"))
    assert hub_row["per_length"][0]["per_document"] == folder_row["per_length"][0]["per_document"]


def test_context_use_runs_in_a_published_models_own_tokens_and_is_refused_across_tokenizers(
    folders, tiny_checkpoints_dir, tmp_path
):
    """Mode context: the same targets at every context length, in the model's tokens; the
    differences against its own full context are paired on the same bytes. Across tokenizers the
    protocol has no one token axis: refused in one line."""
    from fireviz.eval import EvaluationError

    s = EvalSettings.make(
        "prose", [8, 16, "full"], mode="context", prefix_tokens=64, context_targets=16, stride=8, token_budget=160
    )
    (r,) = evaluate([resolve_any(folders["llama"])], s, cache=EvalCache(tmp_path))
    entries = {e["length"]: e for e in r["per_length"]}
    assert set(entries) == {8, 16, 48}
    assert len({e["bytes_scored"] for e in entries.values()}) == 1  # the same targets at every c
    assert {e["tokens_scored"] for e in entries.values()} == {160}
    for c in (8, 16):
        pd, full = entries[c]["per_document"], entries[48]["per_document"]
        expected = (sum(pd["nats"]) - sum(full["nats"])) / sum(pd["bytes"]) / math.log(2)
        assert entries[c]["full_delta_bpb"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(EvaluationError, match="share one tokenizer"):
        evaluate(
            [resolve_any(folders["llama"]), resolve_any(tiny_checkpoints_dir / "alibi")], s, cache=EvalCache(tmp_path)
        )


@pytest.mark.slow
def test_torchrun_splits_the_batches_and_gives_one_process_numbers_bit_for_bit(folders, tiny_checkpoints_dir, tmp_path):
    """Two gloo processes score alternate batches and exchange their sums, which both add in batch
    order: every number (per-document losses, bits per byte, paired differences) equals one
    process's exactly — the batches are the same windows, so even float32 rows agree."""
    import json
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    args = [str(folders["llama"]), str(tiny_checkpoints_dir / "alibi"), "--data", "prose", "--lengths", "16,48"]
    args += ["--token-budget", "1000", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    two, one = tmp_path / "two", tmp_path / "one"
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fireviz", "eval"]
    proc = subprocess.run(
        run + args + ["--cache-dir", str(two), "--out", str(two / "out.json")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("bits per byte [95 %") == 1  # the first process prints, the other does not
    assert eval_main(args + ["--cache-dir", str(one), "--out", str(one / "out.json")]) == 0
    a, b = (json.loads((d / "out.json").read_text()) for d in (two, one))
    for x, y in zip(a, b, strict=True):
        for e, f in zip(x["per_length"], y["per_length"], strict=True):
            for k in ("bits_per_byte", "per_document", "ci95", "paired_delta_bpb", "tokens_scored", "windows"):
                assert e.get(k) == f.get(k), (x["checkpoint"], e["length"], k)


def test_the_length_figure_draws_a_published_model_per_byte_with_its_own_marker(
    folders, tiny_checkpoints_dir, tmp_path
):
    from fireviz import plots

    results = _evaluate([tiny_checkpoints_dir / "alibi", folders["llama"]], [16, 48], tmp_path)
    fig = plots.perplexity_figure(results)
    by = {t.meta["group"]: t for t in fig.data if t.meta and "group" in t.meta}
    assert (
        by["llama"].marker.symbol == "diamond" and by["llama"].meta["published"] and "(published)" in by["llama"].name
    )
    assert not by["alibi"].meta.get("published") and by["alibi"].marker.symbol is None
    llama = {e["length"]: e for e in results[1]["per_length"]}
    assert list(by["llama"].y) == pytest.approx([2 ** llama[n]["bits_per_byte"] for n in (16, 48)])
    assert "per byte" in fig.layout.yaxis.title.text


@pytest.mark.parametrize(
    "layout",
    [
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 2.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 2.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            }
        },
    ],
    ids=["rope_scaling", "rope_parameters"],
)
def test_a_built_in_scaling_in_either_config_layout_is_read_and_replaced(tmp_path, layout):
    """A config that ships a scaling (Llama 3.2's llama3, in the old ``rope_scaling`` layout or
    transformers 5's ``rope_parameters``): its original length is the one it names, and a
    zero-shot scaling asked for replaces the built-in one (factor = length / that original)."""
    import json

    folder = write_causal_lm(tmp_path / "m", "llama", initializer_range=0.3)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg.pop("rope_parameters", None)
    cfg.update(layout)
    (folder / "config.json").write_text(json.dumps(cfg))
    ckpt = resolve_any(folder)
    assert ckpt.config.seq_len == 32
    s = EvalSettings.make("prose", [128], token_budget=DOCS * 127, rope_scaling="dynamic")
    (r,) = evaluate([ckpt], s, cache=EvalCache(tmp_path / "c"))
    e = r["per_length"][0]
    assert e["rope_scaling"]["rope_type"] == "dynamic" and e["rope_scaling"]["factor"] == 4.0
    assert e["rope_scaling"]["original_max_position_embeddings"] == 32
    (plain,) = evaluate(
        [ckpt], EvalSettings.make("prose", [128], token_budget=DOCS * 127), cache=EvalCache(tmp_path / "c")
    )
    assert plain["per_length"][0]["bits_per_byte"] != pytest.approx(e["bits_per_byte"], abs=1e-5)


def test_a_gguf_file_scores_as_the_model_it_was_converted_from(folders, tmp_path):
    """llama.cpp's format: the tiny Llama written as one float32 GGUF file (its tensor names, q/k
    permuted, the tokenizer in the metadata) gives the folder's per-document losses."""
    from causal_lm_folders import write_gguf

    gguf = write_gguf(tmp_path / "tiny-llama.gguf", folders["llama"])
    ckpt = resolve_any(gguf)
    assert isinstance(ckpt, CausalLMCheckpoint) and ckpt.gguf_file == "tiny-llama.gguf"
    assert ckpt.config.model_type == "llama" and ckpt.config.seq_len == 64
    s = EvalSettings.make("prose", [48], token_budget=DOCS * 47)
    (g,) = evaluate([ckpt], s, cache=EvalCache(tmp_path / "c1"))
    (f,) = evaluate([resolve_any(folders["llama"])], s, cache=EvalCache(tmp_path / "c2"))
    a, b = g["per_length"][0]["per_document"], f["per_length"][0]["per_document"]
    assert a["doc"] == b["doc"] and a["tokens"] == b["tokens"] and a["bytes"] == b["bytes"]
    np.testing.assert_allclose(a["nats"], b["nats"], rtol=1e-6)


def test_a_gguf_file_is_dequantised_once_and_then_read_from_the_cache(folders, tmp_path, monkeypatch):
    """Issue #48: a GGUF file was de-quantised by transformers on every load (minutes for a 135M Q4
    file). The first load writes a float32 safetensors folder keyed by the file's sha256; a later
    load reads it without touching the GGUF reader, and gives the same logits."""
    import torch
    from causal_lm_folders import write_gguf

    from fireviz.checkpoints.causal_lm import gguf_cache_dir

    monkeypatch.setenv("FIREVIZ_CACHE_DIR", str(tmp_path / "cache"))
    gguf = write_gguf(tmp_path / "tiny-llama.gguf", folders["llama"])
    ckpt = resolve_any(gguf)
    ids = torch.arange(3, 40).reshape(1, -1)
    first = ckpt.load()(ids)
    cached = gguf_cache_dir() / ckpt.sha256
    assert (cached / "model.safetensors").is_file() and (cached / "config.json").is_file()
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(".building-")]  # no half folder left

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def no_gguf(*a, **k):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", no_gguf)
    torch.testing.assert_close(resolve_any(gguf).load()(ids), first, rtol=0, atol=0)


def test_text_that_is_not_utf8_or_names_special_tokens_is_scored_as_text(folders, tmp_path):
    """Bytes that are not UTF-8 reach the model as U+FFFD and count as the bytes they are; a
    literal "<s>" (LaTeX has them) is text, never a BOS in mid-document."""
    from fireviz.data import Document
    from fireviz.data.tokenizers import HFTokenizer  # noqa: F401  (the class under test)

    tok = resolve_any(folders["llama"]).tokenizer
    raw = b"caf\xe9 <s>x</s> \xff\xfeend \xe2\x9c\x93"
    doc = Document("d", raw.decode("utf-8", errors="surrogateescape"))
    td = tok.encode(doc, bos="none")
    assert int(td.token_bytes().sum()) == len(raw) and td.byte_ends[-1] == len(raw)
    assert 0 not in td.ids.tolist() and 1 not in td.ids.tolist()  # <s> and </s> stay text
    data = tmp_path / "odd.txt"
    data.write_bytes((raw + b" The text goes on. ") * 40)
    s = EvalSettings.make(str(data), [32], split="all", mode="nonoverlapping", token_budget=200)
    (r,) = evaluate([resolve_any(folders["llama"])], s, cache=EvalCache(tmp_path / "c"))
    assert math.isfinite(r["per_length"][0]["bits_per_byte"])


@pytest.mark.parametrize("kind", ["gptneo", "gptj"])
def test_fixed_position_tables_are_refused_past_their_length_and_not_scaled(tmp_path, kind):
    """GPT-Neo (learned positions) and GPT-J (a rotary table built once, no rope_parameters): an
    error entry past their 64 positions, never a crash; a RoPE scaling GPT-J would ignore is refused."""
    from fireviz.eval import EvaluationError

    ckpt = resolve_any(write_causal_lm(tmp_path / kind, kind))
    (r,) = _evaluate([ckpt], [32, 128], tmp_path / "c")
    by = {e["length"]: e for e in r["per_length"]}
    assert "error" not in by[32] and "cover 64 tokens" in by[128]["error"]
    if kind == "gptj":
        with pytest.raises(EvaluationError, match="fixed rotary table without rope_parameters"):
            _evaluate([ckpt], [32], tmp_path / "s", rope_scaling="linear")


def test_weights_missing_tensors_and_a_tokenizer_too_big_are_refused(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "missing"
    bad.mkdir()
    for f in folders["llama"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    state = load_file(str(bad / "model.safetensors"))
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing model.layers.0.mlp.up_proj.weight"):
        resolve_any(bad).load()
    small = write_causal_lm(tmp_path / "small", "llama", vocab_size=200)
    with pytest.raises(CheckpointError, match="tokenizer has 300 tokens"):
        _ = resolve_any(small).tokenizer


def test_a_tokenizer_file_is_part_of_the_identity_and_a_shared_tokenizer_is_one_text(folders, tmp_path):
    import json

    folder = write_causal_lm(tmp_path / "m", "llama")
    before = resolve_any(folder).sha256
    (folder / "added_tokens.json").write_text(json.dumps({" the": 300}))
    assert resolve_any(folder).sha256 != before
    # llama and neox ship the same tokenizer files: one text in their tokens, the context protocol runs
    s = EvalSettings.make(
        "prose", [8, "full"], mode="context", prefix_tokens=64, context_targets=16, stride=8, token_budget=160
    )
    a, b = evaluate([resolve_any(folders["llama"]), resolve_any(folders["neox"])], s, cache=EvalCache(tmp_path / "c"))
    assert a["per_length"][0]["per_document"]["bytes"] == b["per_length"][0]["per_document"]["bytes"]
    assert "paired_delta_bpb" in b["per_length"][0]


def test_longrope_takes_the_models_own_factors_and_is_refused_without_them(folders, tmp_path):
    """LongRoPE's per-frequency factors are searched for a model: a Phi-3-style config ships them
    (original length 32, built for 128) and ``longrope`` rescales it for the length asked — at 64,
    factor 2 instead of the built-in 4, so the numbers change; a model without them is refused."""
    from fireviz.eval import EvaluationError

    phi = resolve_any(write_causal_lm(tmp_path / "phi3", "phi3", initializer_range=0.3))
    assert phi.config.seq_len == 32 and phi.config.rope_scalable
    (plain,) = _evaluate([phi], [64], tmp_path / "p")
    (scaled,) = _evaluate([phi], [64], tmp_path / "s", rope_scaling="longrope")
    e = scaled["per_length"][0]
    assert e["rope_scaling"]["rope_type"] == "longrope" and e["rope_scaling"]["factor"] == 2.0
    assert e["rope_scaling"]["long_factor"] == [1.0, 2.0, 4.0, 8.0]
    assert e["bits_per_byte"] != pytest.approx(plain["per_length"][0]["bits_per_byte"], abs=1e-6)
    with pytest.raises(EvaluationError, match="short_factor and long_factor"):
        _evaluate([folders["llama"]], [32], tmp_path / "l", rope_scaling="longrope")


def test_the_bos_convention_asked_for_is_on_the_figure(folders, tmp_path):
    from fireviz import plots

    results = _evaluate([folders["llama"]], [16, 48], tmp_path, bos_mode="window")
    assert "BOS window" in plots.perplexity_figure(results).layout.title.subtitle.text


def test_dilution_with_a_zero_shot_scaling_is_its_own_measurement(folders, tmp_path):
    from fireviz.analysis import text_attention
    from fireviz.data import load_documents

    ckpt = resolve_any(folders["llama_sharp"])
    doc = max(load_documents("prose")[:20], key=lambda d: d.num_tokens)
    tokens, positions, _ = text_attention.published_dilution_input(ckpt, doc, multiples=(1, 2, 4))
    plain = text_attention.cached_attention_dilution(ckpt, tokens, positions, near=4, rows=2, cache_dir=tmp_path)
    yarn = text_attention.cached_attention_dilution(
        ckpt, tokens, positions, near=4, rows=2, cache_dir=tmp_path, rope_scaling="yarn"
    )
    assert plain["checkpoint"] == "llama_sharp" and yarn["checkpoint"] == "llama_sharp + yarn"
    assert positions == [63, 127, 255] and yarn["rope_scaling"] == "yarn"
    assert not np.allclose(np.asarray(plain["share"])[..., -1], np.asarray(yarn["share"])[..., -1])
    again = text_attention.cached_attention_dilution(
        ckpt, tokens, positions, near=4, rows=2, cache_dir=tmp_path, rope_scaling="yarn", compute=False
    )
    assert again is not None and again["cached"] and again["share"] == yarn["share"]
