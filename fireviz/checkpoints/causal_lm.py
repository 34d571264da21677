"""A published causal LM as a checkpoint: a folder written by ``transformers``, or its Hub id (issue #36).

:class:`CausalLMCheckpoint` stands behind the same interface as a fireviz :class:`Checkpoint`
(``name``, ``path``, ``folder``, ``sha256``, ``config.seq_len``, ``config.position_encoding``,
``kind``, ``tokenizer``, ``load(device)``), so evaluation takes either. Its model is loaded with
``transformers.AutoModelForCausalLM`` from safetensors only (a pickle-only folder is refused),
float32, with the model's own attention implementation; its text is its own tokenizer's
(``fireviz.data.tokenizers.HFTokenizer``). Its identity ``sha256`` covers every file that
decides a number: config.json, the weights and the tokenizer's files.

Zero-shot RoPE scaling (:data:`HF_ROPE_SCALINGS`: linear = position interpolation, dynamic NTK,
yarn, llama3, and longrope for a model that ships its factors) is applied as transformers defines it, by writing ``rope_parameters`` (transformers
≥ 5; older folders' ``rope_scaling`` and ``rope_theta`` are read by transformers itself) with
``factor = length / original maximum`` (at least 1) before the weights load.

``transformers`` is imported only here, and only when such a folder is opened.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fireviz.checkpoints.gguf_header import check_gguf_header
from fireviz.checkpoints.hub import hub_file, hub_has_file, looks_like_hub_id
from fireviz.checkpoints.hub_config import HubModelError
from fireviz.core import FileFormatError, file_state, read_json
from fireviz.data import DataError
from fireviz.data.tokenizers import BYTE_TOKENIZER, ByteTokenizer, HFTokenizer, check_tokenizer_files, files_sha256
from fireviz.model import CheckpointError

#: zero-shot RoPE scalings for a published model, as transformers names its rope_type
HF_ROPE_SCALINGS = ("linear", "dynamic", "yarn", "llama3", "longrope")
#: fireviz's own names that mean the same (``pi`` is position interpolation: transformers' linear)
_ALIASES = {"pi": "linear"}
#: the files of a tokenizer (their bytes are part of the identity)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)
#: position encodings by ``model_type`` (what the evaluation says and what RoPE scaling may apply to)
_ALIBI_TYPES = ("bloom", "mpt", "falcon_alibi")
_LEARNED_TYPES = ("gpt2", "opt", "gpt_bigcode", "biogpt", "gpt_neo", "openai-gpt", "ctrl", "xglm")
#: rotary models whose sin/cos table is built once for max_position_embeddings and that apply no
#: ``rope_parameters``: nothing is run past that length, and they are not scaled
_FIXED_ROTARY_TYPES = ("gptj", "codegen")


def is_gguf_file(path: str | os.PathLike) -> bool:
    """True for a file that starts with GGUF's magic bytes (llama.cpp's model format). Raises nothing."""
    try:
        p = Path(path).expanduser()
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError, TypeError):
        return False


def is_causal_lm_folder(folder: str | os.PathLike) -> bool:
    """True for a folder whose config.json was written by ``transformers`` for a causal LM
    (``model_type`` and an architecture ``…ForCausalLM`` or ``…LMHeadModel``). Raises nothing."""
    cfg_path = Path(folder).expanduser() / "config.json"
    if not cfg_path.is_file():
        return False
    try:
        cfg = read_json(cfg_path)
    except (OSError, ValueError, FileFormatError):
        return False
    archs = cfg.get("architectures") or [] if isinstance(cfg, dict) else []
    return (
        isinstance(cfg, dict)
        and "model_type" in cfg
        and "position_encoding" not in cfg
        and any(isinstance(a, str) and (a.endswith("ForCausalLM") or a.endswith("LMHeadModel")) for a in archs)
    )


@dataclass(frozen=True)
class CausalLMConfig:
    """What evaluation reads of a published model's config.json.

    Attributes: ``model_type``; ``seq_len`` its original maximum (tokens: ``rope_parameters``'
      ``original_max_position_embeddings`` where a scaling is built in, else
      ``max_position_embeddings`` / ``n_positions``); ``position_encoding`` (``"rope"``,
      ``"alibi"``, ``"learned"``); ``absolute_position_embedding`` (learned positions: nothing
      beyond ``seq_len`` is evaluated); ``raw`` the config dict.
    """

    model_type: str
    seq_len: int
    position_encoding: str
    absolute_position_embedding: bool
    raw: dict = field(repr=False, compare=False)
    #: for the memory estimate before work (``fireviz.model.memory.forward_bytes``): attention
    #: scores taken as materialised per head (eager / SDPA's math path), no query blocks
    additive_attention: ClassVar[bool] = True
    attn_query_block: ClassVar[int] = 1 << 30

    def _int(self, *keys: str) -> int:
        for k in keys:
            if isinstance(self.raw.get(k), int) and self.raw[k] > 0:
                return int(self.raw[k])
        return 1

    @property
    def rope_scalable(self) -> bool:
        """Whether zero-shot RoPE scaling applies: a rotary model whose transformers code builds its
        table from ``rope_parameters`` (not GPT-J/CodeGen's fixed table)."""
        return self.position_encoding == "rope" and self.model_type not in _FIXED_ROTARY_TYPES

    @property
    def n_layer(self) -> int:
        return self._int("num_hidden_layers", "n_layer", "num_layers")

    @property
    def d_model(self) -> int:
        return self._int("hidden_size", "n_embd", "d_model")

    @property
    def n_head(self) -> int:
        return self._int("num_attention_heads", "n_head", "num_heads")

    @property
    def vocab_size(self) -> int:
        return self._int("vocab_size")


def _config(cfg: dict, where: str) -> CausalLMConfig:
    model_type = str(cfg.get("model_type"))
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    length = None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(cfg.get(key), int) and cfg[key] > 1:
            length = int(cfg[key])
            break
    if isinstance(rope, dict) and isinstance(rope.get("original_max_position_embeddings"), int):
        length = int(rope["original_max_position_embeddings"])
    elif isinstance(cfg.get("original_max_position_embeddings"), int) and rope:  # Phi-3 keeps it at the top
        length = int(cfg["original_max_position_embeddings"])
    if model_type in _ALIBI_TYPES or cfg.get("alibi") or (cfg.get("attn_config") or {}).get("alibi"):
        encoding = "alibi"
        length = length or 2048
    elif model_type in _LEARNED_TYPES:
        encoding = "learned"
    else:
        encoding = "rope"
    if length is None:
        raise CheckpointError(
            f"{where}: config.json names no maximum length (max_position_embeddings or n_positions); "
            "add the model's training length there"
        )
    # positions in a table of fixed size (learned, or a rotary table built once): none past it
    fixed = encoding == "learned" or model_type in _FIXED_ROTARY_TYPES
    return CausalLMConfig(model_type, length, encoding, fixed, cfg)


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors weights of a folder (one file or shards). Raises: CheckpointError for a
    folder with only pickle weights (never loaded) or none."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles:
        raise CheckpointError(
            f"{folder} holds only pickle weights ({', '.join(sorted(pickles)[:3])}); fireviz loads weights from "
            "safetensors only (a pickle can run code): convert them, e.g. save_pretrained(..., "
            "safe_serialization=True)"
        )
    raise CheckpointError(f"{folder} has no model.safetensors (or shards); it is not a model folder")


_MODELS_LOCK = threading.Lock()


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files a folder holds (:data:`TOKENIZER_FILES` that exist)."""
    return [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]


def _folder_identity(folder: Path) -> str:
    """sha256 over config.json, the safetensors weights and the tokenizer's files (by name and
    bytes). Raises: CheckpointError for pickle-only weights, no tokenizer, an unreadable file."""
    weights = _weight_files(folder)
    tok_files = tokenizer_files(folder)
    if not tok_files:
        raise CheckpointError(
            f"{folder} has no tokenizer (tokenizer.json); save it beside the model with tokenizer.save_pretrained(folder)"
        )
    try:
        return files_sha256([folder / "config.json", *weights, *tok_files])
    except OSError as e:
        raise CheckpointError(f"cannot read {folder}: {e}") from e


def download_causal_lm(repo_id: str, revision: str | None = None) -> Path:
    """A published causal LM's files from the Hugging Face Hub into its cache (file by file through
    ``fireviz.checkpoints.hub.hub_file``: config.json, model.safetensors or the shards its index
    names, the tokenizer's files) → the snapshot folder (``…/snapshots/<commit>``). Never a pickle.
    Raises: CheckpointError (``hub.HubModelError``): offline and not cached, no such repo, gated,
      not a causal LM, or weights in pickle files only."""
    config = hub_file(repo_id, "config.json", revision)
    assert config is not None  # required
    folder = config.parent
    if not is_causal_lm_folder(folder):
        raise HubModelError(f"{repo_id} is not a causal LM written by transformers (config.json names no …ForCausalLM)")
    if hub_file(repo_id, "model.safetensors", revision, required=False) is None:
        index = hub_file(repo_id, "model.safetensors.index.json", revision, required=False)
        if index is None:
            pickled = hub_has_file(repo_id, "pytorch_model.bin", revision)
            raise HubModelError(
                f"{repo_id} has no safetensors weights"
                + (" (only pytorch_model.bin, a pickle, which fireviz never loads)" if pickled else "")
                + "; pick a repo with model.safetensors"
            )
        for shard in sorted(set((read_json(index).get("weight_map") or {}).values())):
            hub_file(repo_id, str(shard), revision)
    for name in TOKENIZER_FILES + ("generation_config.json",):
        hub_file(repo_id, name, revision, required=False)
    return folder


#: ref → (its files' state, the CausalLMCheckpoint resolved from them): a GGUF header and a
#: published folder's sha256 are read once per process and file state (issue #48: the header was
#: read twice per page run, and every 5 s by the app's short-lived cache)
_RESOLVED: dict[str, tuple[tuple, CausalLMCheckpoint]] = {}
_RESOLVED_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class CausalLMCheckpoint:
    """A published causal LM in a local folder written by ``transformers``, resolved once.

    Attributes: ``name`` (the folder's name), ``path`` (as given), ``folder``, ``config``
      (:class:`CausalLMConfig`), ``sha256`` (config.json, weights and tokenizer files, by name
      and bytes), ``source`` ``"local"``, ``kind`` ``"transformers"``; ``tokenizer`` (property)
      its :class:`fireviz.data.tokenizers.HFTokenizer`.
    """

    name: str
    path: str
    folder: Path
    config: CausalLMConfig
    sha256: str
    source: str = "local"
    repo_id: str | None = None
    gguf_file: str | None = None
    kind: ClassVar[str] = "transformers"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CausalLMCheckpoint) and (self.path, self.sha256) == (other.path, other.sha256)

    def __hash__(self) -> int:
        return hash((self.path, self.sha256))

    @classmethod
    def resolve(cls, ref: str | os.PathLike | CausalLMCheckpoint) -> CausalLMCheckpoint:
        """The published model in folder ``ref`` (``~`` expanded).
        Raises: CheckpointError naming the problem and the fix: not a transformers causal-LM
          folder, pickle-only weights, no tokenizer, a config without a maximum length."""
        if isinstance(ref, CausalLMCheckpoint):
            return ref
        local = Path(ref).expanduser()
        state = file_state(local)
        with _RESOLVED_LOCK:
            known = _RESOLVED.get(str(ref))
        if state is not None and known is not None and known[0] == state:
            return known[1]  # frozen: shared safely
        ckpt = cls._resolve(ref)
        if state is not None:
            with _RESOLVED_LOCK:
                _RESOLVED[str(ref)] = (state, ckpt)
        return ckpt

    @classmethod
    def _resolve(cls, ref: str | os.PathLike) -> CausalLMCheckpoint:
        """:meth:`resolve`, from the files. Raises: CheckpointError."""
        if is_gguf_file(ref):
            return cls._resolve_gguf(Path(ref).expanduser(), str(ref))
        folder = Path(ref).expanduser()
        repo_id = None
        if not folder.exists() and looks_like_hub_id(str(ref)):
            folder, repo_id = download_causal_lm(str(ref)), str(ref)
        if not is_causal_lm_folder(folder):
            raise CheckpointError(
                f"{ref} is not a folder written by transformers for a causal LM (config.json with model_type "
                "and a …ForCausalLM architecture); save one with model.save_pretrained(folder)"
            )
        cfg = read_json(folder / "config.json")
        sha256 = _folder_identity(folder)
        return cls(
            name=str(ref).rsplit("/", 1)[-1] if repo_id else folder.resolve().name,
            path=str(ref),
            folder=folder,
            config=_config(cfg, str(folder)),
            sha256=sha256,
            source="hub" if repo_id else "local",
            repo_id=repo_id,
        )

    @classmethod
    def _resolve_gguf(cls, path: Path, ref: str) -> CausalLMCheckpoint:
        """A GGUF file (llama.cpp's format): its config and tokenizer from its metadata, read by
        transformers (dequantised to float32 when loaded) once :func:`check_gguf_header` has bounded
        it; its identity is the file's sha256."""
        import struct

        from transformers import AutoConfig

        check_gguf_header(path)  # every count and length bounded before transformers builds objects
        try:
            cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True).to_dict()
            sha256 = files_sha256([path])
        except (OSError, ValueError, KeyError, ImportError, struct.error) as e:
            raise CheckpointError(f"transformers cannot read the GGUF file {path}: {type(e).__name__}: {e}") from e
        return cls(
            name=path.stem,
            path=ref,
            folder=path.parent,
            config=_config(cfg, str(path)),
            sha256=sha256,
            gguf_file=path.name,
        )

    def _identity_now(self) -> str:
        return files_sha256([self.folder / self.gguf_file]) if self.gguf_file else _folder_identity(self.folder)

    @property
    def tokenizer(self) -> HFTokenizer:
        """The model's own tokenizer (loaded once per identity). Raises: CheckpointError."""
        return _tokenizer(self)

    def load(self, device: str | torch.device = "cpu", rope_scaling: str | None = None, length: int | None = None):
        """The model as a :class:`CausalLMModule` (ids ``(B, T)`` int64 → logits ``(B, T, vocab)``
        float32) on ``device``, in eval mode; with ``rope_scaling`` (:data:`HF_ROPE_SCALINGS`) its
        RoPE scaled zero-shot for windows of ``length`` tokens (factor ``length / seq_len``, at
        least 1). Raises: CheckpointError (the files changed since :meth:`resolve`, or transformers
        cannot build the model); ValueError for a scaling that does not apply."""
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # fireviz shows its own progress

        try:
            changed = self._identity_now() != self.sha256
        except OSError as e:
            raise CheckpointError(f"cannot read {self.name} ({self.folder}): {e}") from e
        if changed:
            raise CheckpointError(f"{self.name} changed since it was opened ({self.folder}); open it again")
        source: Path = self.folder
        gguf: dict = {"use_safetensors": True}
        try:
            if self.gguf_file:  # de-quantised once per file: later loads read the cached safetensors folder
                cached = _dequantised_gguf(self)
                source, gguf = (cached, gguf) if cached is not None else (self.folder, {"gguf_file": self.gguf_file})
            config = AutoConfig.from_pretrained(source, local_files_only=True, **_config_kwargs(gguf))
            extra = {}
            if rope_scaling is not None:
                extra = scale_rope(config, self.config, rope_scaling, length or self.config.seq_len)
            with _MODELS_LOCK:
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    source,
                    config=config,
                    dtype=torch.float32,
                    local_files_only=True,
                    output_loading_info=True,
                    **gguf,
                )
            model, info = loaded
        except ValueError as e:
            if rope_scaling is not None and "rope" in str(e).lower():
                raise
            raise CheckpointError(f"transformers cannot load {self.folder}: {type(e).__name__}: {e}") from e
        except Exception as e:  # a corrupt file, a config transformers cannot build: one error, naming it
            raise CheckpointError(f"transformers cannot load {self.folder}: {type(e).__name__}: {e}") from e
        _refuse_incomplete(self.folder, info)
        if rope_scaling is not None:
            _check_scaled(model, self.config, extra["rope_scaling"]["rope_type"])
        module: nn.Module = model
        return CausalLMModule(module.to(device).eval(), extra, self.config)


def _config_kwargs(load_kwargs: dict) -> dict:
    """The ``AutoConfig.from_pretrained`` keywords of a model load's ``load_kwargs`` (``gguf_file`` only)."""
    return {"gguf_file": load_kwargs["gguf_file"]} if "gguf_file" in load_kwargs else {}


def gguf_cache_dir() -> Path:
    """``$FIREVIZ_CACHE_DIR/gguf`` if set, else ``~/.cache/fireviz/gguf``: GGUF files de-quantised to
    float32 safetensors folders, one per file sha256. A trusted folder, like the evaluation cache:
    delete it to make fireviz de-quantise again."""
    env = os.environ.get("FIREVIZ_CACHE_DIR")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "fireviz") / "gguf"


def _dequantised_gguf(ckpt: CausalLMCheckpoint) -> Path | None:
    """The float32 safetensors folder (written by ``save_pretrained``) of the GGUF file of ``ckpt``,
    keyed by its sha256: built on the first load (transformers de-quantises the file once, ~4 min
    for a 135M-parameter Q4 file on 2 cores; issue #48), read directly afterwards. None when the
    cache cannot be written (a read-only home): the caller then loads the GGUF file itself.
    Written into a temporary folder and renamed, so a killed process leaves no half folder."""
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM

    folder = gguf_cache_dir() / ckpt.sha256
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    except OSError:
        return None
    try:
        with _MODELS_LOCK:
            model = AutoModelForCausalLM.from_pretrained(
                ckpt.folder, gguf_file=ckpt.gguf_file, dtype=torch.float32, local_files_only=True
            )
        # save_pretrained refuses a model transformers read from GGUF (its quantizer says "not
        # serializable"): the float32 tensors and the config are written as transformers' folder
        # format by hand (safetensors' save_model keeps one copy of tied tensors)
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        del model
        try:
            os.replace(tmp, folder)
        except OSError:  # another process built it meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return folder
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_TOKENIZERS: dict[str, HFTokenizer] = {}


def _refuse_incomplete(folder: Path, info: dict) -> None:
    """Raises: CheckpointError when the weights miss tensors the model needs (transformers would
    fill them with random values) or hold tensors of other shapes."""
    missing = list(info.get("missing_keys") or [])
    mismatched = [str(k[0]) if isinstance(k, (tuple, list)) else str(k) for k in info.get("mismatched_keys") or []]
    if missing or mismatched:
        what = (f"missing {', '.join(sorted(missing)[:3])}" if missing else "") + (
            f"{'; ' if missing else ''}other shapes for {', '.join(mismatched[:3])}" if mismatched else ""
        )
        raise CheckpointError(
            f"{folder}: the weights do not fit the model its config.json describes ({what}); transformers would "
            "fill those with random values — restore the weights (nothing was evaluated)"
        )


def _check_scaled(model: nn.Module, info: CausalLMConfig, rope_type: str) -> None:
    """Raises: CheckpointError unless the model built its rotary embedding from ``rope_parameters``
    (transformers' ROPE_INIT_FUNCTIONS: a module with ``rope_type``), so a scaled row is scaled."""
    types = {getattr(m, "rope_type", None) for m in model.modules()} - {None}
    if rope_type not in types:
        raise CheckpointError(
            f"rope scaling {rope_type!r} does not apply to {info.model_type}: its transformers code builds its "
            "rotary table without rope_parameters, so a scaled row would be the unscaled model"
        )


def _tokenizer(ckpt: CausalLMCheckpoint) -> HFTokenizer:
    with _MODELS_LOCK:
        tok = _TOKENIZERS.get(ckpt.sha256)
    if tok is None:
        from transformers import AutoTokenizer

        try:
            if not ckpt.gguf_file:  # a GGUF file's tokenizer is in its metadata, bounded by check_gguf_header
                check_tokenizer_files(tokenizer_files(ckpt.folder), ckpt.name)
        except DataError as e:
            raise CheckpointError(str(e)) from e
        try:
            extra = {"gguf_file": ckpt.gguf_file} if ckpt.gguf_file else {}
            hf = AutoTokenizer.from_pretrained(ckpt.folder, local_files_only=True, **extra)
        except Exception as e:  # a corrupt or incomplete tokenizer file: one error, naming it
            raise CheckpointError(
                f"transformers cannot load the tokenizer of {ckpt.folder}: {type(e).__name__}: {e}"
            ) from e
        try:
            tok = HFTokenizer(hf, key=_tokenizer_key(ckpt), name=ckpt.name)
        except DataError as e:
            raise CheckpointError(str(e)) from e
        if tok.vocab_size > ckpt.config.vocab_size > 1:
            raise CheckpointError(
                f"{ckpt.name}: its tokenizer has {tok.vocab_size:,} tokens but the model's embedding only "
                f"{ckpt.config.vocab_size:,} (config.json vocab_size): they do not belong together"
            )
        with _MODELS_LOCK:
            _TOKENIZERS[ckpt.sha256] = tok
    return tok


def _tokenizer_key(ckpt: CausalLMCheckpoint) -> str:
    """What tells this tokenizer from another: the sha256 of its own files (two models that ship
    the same tokenizer read the same tokens), or of the GGUF file that holds it."""
    if ckpt.gguf_file:
        return ckpt.sha256
    return files_sha256(tokenizer_files(ckpt.folder))


#: tokenizers loaded by :func:`load_tokenizer`, per the sha256 of their files
_LOADED_TOKENIZERS: dict[str, HFTokenizer] = {}


def load_tokenizer(ref: str | os.PathLike, revision: str | None = None) -> ByteTokenizer | HFTokenizer:
    """A tokenizer to prepare token shards with (issue #37), resolved once at the edge.

    Args: ``ref`` — ``"byte"`` (fireviz's bytes, BOS 256); a folder holding a Hugging Face
      tokenizer (tokenizer.json and its config: what ``python -m fireviz tokenizer train`` or
      ``tokenizer.save_pretrained`` writes, a published model's folder); a ``tokenizer.json`` file;
      or a Hub id (its tokenizer files alone are fetched, through ``fireviz.checkpoints.hub``).
    Returns: ``BYTE_TOKENIZER`` or an :class:`HFTokenizer` whose ``key`` is the sha256 of its files
      (two copies of one tokenizer are one tokenizer) and ``files`` those files.
    Raises: CheckpointError naming the problem: nothing there, no tokenizer.json (a slow,
      Python-only tokenizer reports no byte offsets), a file transformers cannot read, offline."""
    if str(ref) == "byte":
        return BYTE_TOKENIZER
    path = Path(str(ref)).expanduser()
    if path.is_file():  # a bare tokenizer.json: read by the tokenizers library alone
        if path.name != "tokenizer.json":
            raise CheckpointError(
                f"{path} is not named tokenizer.json; a tokenizer file is stored and found by that name (in shards "
                "and checkpoints): rename or copy it to tokenizer.json, or give its folder"
            )
        folder, files = path.parent, [path]
    elif path.is_dir():
        folder, files = path, tokenizer_files(path)
    elif looks_like_hub_id(str(ref)):
        first = hub_file(str(ref), "tokenizer.json", revision, required=False)  # offline: said at once
        found = [hub_file(str(ref), name, revision, required=False) for name in TOKENIZER_FILES[1:]] if first else []
        files = [f for f in [first, *found] if f is not None]
        folder = files[0].parent if files else path
    else:
        raise CheckpointError(
            f"tokenizer {str(ref)!r} not found; give byte, a folder holding tokenizer.json, a tokenizer.json file or a "
            "Hub id (owner/name; python -m fireviz tokenizer train writes a folder)"
        )
    if not any(f.name == "tokenizer.json" for f in files):
        raise CheckpointError(
            f"{ref}: no tokenizer.json there (a fast tokenizer is needed, for its byte offsets); save one with "
            "tokenizer.save_pretrained(folder) or train one with python -m fireviz tokenizer train"
        )
    key = files_sha256(files)
    if key not in _LOADED_TOKENIZERS:
        _LOADED_TOKENIZERS[key] = _hf_tokenizer(folder, files, key, str(ref))
    return _LOADED_TOKENIZERS[key]


def _hf_tokenizer(folder: Path, files: list[Path], key: str, name: str) -> HFTokenizer:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        check_tokenizer_files(files, name)  # sizes and entries bounded before anything parses them
    except DataError as e:
        raise CheckpointError(str(e)) from e
    try:
        if any(f.name == "tokenizer_config.json" for f in files):
            hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        else:  # a bare tokenizer.json: no config names its BOS, so the one its own template adds
            hf = PreTrainedTokenizerFast(tokenizer_file=str(files[0]))
            if hf.bos_token is None:
                hf.bos_token = _template_bos(files[0])
    except Exception as e:  # a corrupt or incomplete tokenizer file: one error, naming it
        raise CheckpointError(f"transformers cannot load the tokenizer in {folder}: {type(e).__name__}: {e}") from e
    try:
        return HFTokenizer(hf, key=key, name=name, files=tuple(files))
    except DataError as e:
        raise CheckpointError(str(e)) from e


def _template_bos(path: Path) -> str | None:
    """The special token a tokenizer.json's post-processor puts first (its BOS), if any."""
    try:
        proc = (read_json(path, expect=dict).get("post_processor") or {}).get("single") or []
        first = proc[0].get("SpecialToken", {}).get("id") if proc and isinstance(proc[0], dict) else None
        return first if isinstance(first, str) else None
    except (FileFormatError, AttributeError, TypeError):
        return None


def scale_rope(config: Any, info: CausalLMConfig, scaling: str, length: int) -> dict:
    """Write zero-shot RoPE scaling into a transformers ``config`` (its ``rope_parameters``):
    ``scaling`` in :data:`HF_ROPE_SCALINGS` (or ``pi`` = linear), ``factor = max(1, length /
    info.seq_len)``, ``original_max_position_embeddings = info.seq_len`` (yarn, llama3, dynamic);
    llama3 with Meta's ``low_freq_factor`` 1 and ``high_freq_factor`` 4; longrope with the model's own
    ``short_factor`` / ``long_factor`` (refused without them). Source: transformers'
    ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``. A built-in scaling of the config is replaced.
    Returns: ``{"rope_scaling": {...}}``, the parameters applied (saved with the numbers).
    Raises: ValueError for a model without RoPE or an unknown scaling."""
    name = _ALIASES.get(scaling, scaling)
    if name not in HF_ROPE_SCALINGS:
        raise ValueError(f"rope scaling must be one of {', '.join(HF_ROPE_SCALINGS)} (or pi) (got {scaling!r})")
    if info.position_encoding != "rope":
        raise ValueError(
            f"rope scaling {scaling!r} needs a RoPE model; {info.model_type} uses {info.position_encoding}"
        )
    factor = max(1.0, float(length) / info.seq_len)
    base = dict(getattr(config, "rope_parameters", None) or {})
    theta = base.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    params: dict = {"rope_type": name, "factor": factor, "rope_theta": theta}
    if name in ("yarn", "llama3", "dynamic", "longrope"):
        params["original_max_position_embeddings"] = info.seq_len
    if name == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if name == "longrope":  # its per-frequency factors are searched for a model, not derived: the model's own
        if not (isinstance(base.get("short_factor"), list) and isinstance(base.get("long_factor"), list)):
            raise ValueError(
                f"rope scaling 'longrope' needs the model's own short_factor and long_factor (Phi-3 ships them); "
                f"{info.model_type}'s config has none — use yarn, dynamic, linear or llama3"
            )
        params.update(short_factor=base["short_factor"], long_factor=base["long_factor"])
    if "partial_rotary_factor" in base:
        params["partial_rotary_factor"] = base["partial_rotary_factor"]
    config.rope_parameters = params
    if name != "dynamic":  # dynamic grows past max_position_embeddings by itself
        config.max_position_embeddings = max(int(getattr(config, "max_position_embeddings", 0) or 0), int(length))
    return {"rope_scaling": params}


@dataclass
class AttentionRecord:
    """One layer's attention of a published model: ``probs`` float32 ``[batch, heads, queries,
    keys]`` as its attention computes them (softmax over keys, causal and any sliding-window mask
    applied); ``content`` and ``bias`` None (a published model's logits are not split into content
    and position parts)."""

    probs: torch.Tensor
    content: torch.Tensor | None = None
    bias: torch.Tensor | None = None


class CausalLMModule(nn.Module):
    """A transformers causal LM as evaluation and the attention views run it:
    ``forward(ids (B, T) int64) → logits (B, T, vocab) float32``; :meth:`attention_probs` as
    ``fireviz.model.GPT.attention_probs``; ``config`` its :class:`CausalLMConfig`; ``extra`` the
    RoPE scaling applied (empty without)."""

    def __init__(self, model: nn.Module, extra: dict | None = None, config: CausalLMConfig | None = None):
        super().__init__()
        self.model = model
        self.extra = extra or {}
        self.config = config
        self._lock = threading.Lock()

    def _check_length(self, ids: torch.Tensor) -> None:
        cfg = self.config
        if cfg is not None and cfg.absolute_position_embedding and ids.shape[-1] > cfg.seq_len:
            raise ValueError(
                f"{cfg.model_type} has learned absolute positions for {cfg.seq_len} tokens; {ids.shape[-1]} "
                f"tokens cannot be run — give at most {cfg.seq_len}"
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits float32 ``(B, T, vocab)`` of ids ``(B, T)``. Raises: ValueError past learned
        positions; CheckpointError (one line) when transformers' code fails on them."""
        self._check_length(ids)
        try:
            return self.model(input_ids=ids, use_cache=False).logits.float()
        except (IndexError, ZeroDivisionError, RuntimeError) as e:  # transformers' code on these tokens
            kind = self.config.model_type if self.config is not None else "the model"
            raise CheckpointError(
                f"{kind} cannot run {ids.shape[-1]} tokens here ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"
            ) from e

    def set_attention_backend(self, backend: str) -> None:
        """Kept for the evaluation's interface: a published model keeps its own attention."""

    def _attention_modules(self) -> list[nn.Module]:
        """Each decoder layer's attention module, in layer order (transformers names them
        ``…Attention``: LlamaAttention, GPTNeoXAttention, BloomAttention, GPT2Attention, …)."""
        mods = [m for _, m in self.model.named_modules() if type(m).__name__.endswith("Attention")]
        return [m for m in mods if not any(m is not o and m in list(o.modules()) for o in mods)]

    def attention_probs(self, idx: torch.Tensor, layers=None, queries=None, logits: bool = False) -> dict:
        """One pass over ``idx`` ``[batch, T]`` (int64) with the eager attention of transformers,
        recording ``layers``' probabilities (default all) for the ``queries`` rows only (default
        all): ``{layer: AttentionRecord}``. Memory: one layer's ``[batch, heads, T, T]`` at a time
        (each is cut to its rows as the layer finishes). ``logits`` is accepted and gives no split.
        Raises: ValueError for a layer out of range, or a model whose attention returns no weights."""
        self._check_length(idx)
        mods = self._attention_modules()
        want = set(range(len(mods))) if layers is None else {int(layers)} if isinstance(layers, int) else set(layers)
        if not want <= set(range(len(mods))):
            raise ValueError(f"layers {sorted(want)} out of range: the model has layers 0..{len(mods) - 1}")
        rows = None if queries is None else torch.as_tensor(list(queries) if not torch.is_tensor(queries) else queries)
        out: dict[int, AttentionRecord] = {}

        def hook_for(i: int):
            def hook(module, args, output):
                weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
                if weights is None:
                    raise ValueError(f"{type(module).__name__} returned no attention weights")
                if i in want:
                    w = weights if rows is None else weights[:, :, rows.to(weights.device)]
                    out[i] = AttentionRecord(w.detach().float().clone())
                return (output[0], None) + tuple(output[2:])  # the T × T weights go now

            return hook

        with self._lock:  # the attention implementation is switched for this pass (shared models)
            hf: Any = self.model
            before = getattr(hf.config, "_attn_implementation", None)
            hf.set_attn_implementation("eager")
            hooks = [m.register_forward_hook(hook_for(i)) for i, m in enumerate(mods) if i <= max(want)]
            try:
                with torch.no_grad():
                    self.model(input_ids=idx, use_cache=False)
            finally:
                for h in hooks:
                    h.remove()
                if before and before != "eager":
                    hf.set_attn_implementation(before)
        return out


__all__ = [
    "HF_ROPE_SCALINGS",
    "CausalLMCheckpoint",
    "CausalLMConfig",
    "AttentionRecord",
    "CausalLMModule",
    "is_causal_lm_folder",
    "is_gguf_file",
    "scale_rope",
]
