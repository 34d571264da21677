"""A model's saved state, checked: config.json into a ``GPTConfig``, safetensors weights into a ``GPT``.

Everything ``GPT.from_pretrained`` (``fireviz.model.gpt``) checks before and while it loads a
checkpoint folder lives here, each check raising :class:`CheckpointError` with the problem
and the fix: the folder and its config.json (``check_checkpoint_ref``, ``config_from_dict``),
the load options (``check_load_options``), the weights file (``folder_weights``) and the
weights themselves (``load_checked``, ``load_state_checked``: every tensor present, none
extra, shapes equal, the tied embedding pair equal bit for bit). ``fireviz.checkpoints.catalog`` is
the door the rest of fireviz loads through; nothing here unpickles.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fireviz.core import FileFormatError, parse_json, read_json
from fireviz.encodings import encoding_names, encoding_spec
from fireviz.model.config import CONFIG_FORMAT, GPTConfig


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing, corrupt, truncated or disagrees with its config."""


#: config.json fields that change what a model computes: a saved config must name every one
#: (a missing ``seq_len`` would silently move FIRE's threshold, a missing
#: ``position_encoding`` would load as FIRE). ``dropout``, ``attn_query_block`` and
#: ``training`` do not change the numbers and may be absent (defaults apply).
REQUIRED_CONFIG_FIELDS = (
    "n_layer",
    "n_head",
    "d_model",
    "seq_len",
    "vocab_size",
    "position_encoding",
    "encoding_options",
    "absolute_position_embedding",
)


def config_from_dict(data: object, source: str = "config.json") -> GPTConfig:
    """A validated :class:`GPTConfig` from a saved config.json's parsed JSON.

    Args: ``data`` the parsed JSON; ``source`` names it in errors.
    Returns: the config (``validate`` passed).
    Raises: CheckpointError naming the problem: not an object, an unknown field, a missing
      field of ``REQUIRED_CONFIG_FIELDS``, or a bad value.
    """
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{source} is not a JSON object (it holds a {type(data).__name__}); a config.json "
            "maps GPTConfig fields to values — restore it or train the checkpoint again"
        )
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CheckpointError(
            f"{source} has unknown field(s) {unknown}; a fireviz config.json holds only {sorted(known)}"
        )
    missing = [k for k in REQUIRED_CONFIG_FIELDS if k not in data]
    if missing:
        raise CheckpointError(
            f"{source} does not name {', '.join(missing)}, which decide what the model computes; "
            "add the value(s) the model was trained with (see GPTConfig) or train it again"
        )
    fmt = data.get("config_format", 1)
    if fmt not in (1, CONFIG_FORMAT) or isinstance(fmt, bool):
        raise CheckpointError(f"{source} has config_format {fmt!r}; this fireviz reads formats 1 and {CONFIG_FORMAT}")
    if (
        fmt == CONFIG_FORMAT
        and isinstance(data.get("encoding_options"), dict)
        and isinstance(data.get("position_encoding"), str)
        and data["position_encoding"] in encoding_names()
    ):
        absent = sorted(set(encoding_spec(data["position_encoding"]).defaults) - set(data["encoding_options"]))
        if absent:  # format 2 names every option: a missing one was deleted, not defaulted
            raise CheckpointError(
                f"{source} does not name encoding option(s) {', '.join(absent)} of "
                f"{data['position_encoding']} (config_format {CONFIG_FORMAT} lists every option, "
                "as trained); restore them or train the checkpoint again"
            )
    try:
        return GPTConfig(**data).validate()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source} is invalid: {e}") from None


def check_checkpoint_ref(pretrained_model_name_or_path: str | os.PathLike) -> None:
    """``GPT.from_pretrained``'s first check of what it was given (a folder or a Hub repo id).

    A local folder's config.json must be a readable file holding a valid config
    (``config_from_dict``); a folder without one is left to the loader (which names what is
    missing). A path that can only be local (absolute, ``./``, ``../``, ``~``, no ``/`` or more
    than one, or under an existing local folder) and does not exist is refused at once instead
    of being tried as a Hub repo id (which retries the network for ~20 s when offline).
    Raises: CheckpointError naming the problem.
    """
    path = os.fspath(pretrained_model_name_or_path)
    if os.path.isdir(path):
        cfg = Path(path) / "config.json"
        if (cfg.is_symlink() or cfg.exists()) and not cfg.is_file():
            raise CheckpointError(
                f"{path}: config.json is a broken link or not a file; restore it or train the checkpoint again"
            )
        if cfg.exists():
            try:
                data = read_json(cfg)
            except FileFormatError as e:
                raise CheckpointError(str(e)) from e
            config_from_dict(data, str(cfg))
    elif (
        os.path.isabs(path)
        or path.startswith((".", "~"))
        or path.count("/") != 1  # "fire": a bundled name or a typo, not a Hub repo id 'owner/name'
        or os.path.exists(path)
        or os.path.isdir(path.split("/")[0])  # "checkpoints/fier": a local folder's child, not a Hub id
    ):
        hint = (
            " (the bundled checkpoints are folders under checkpoints/, e.g. checkpoints/fire)"
            if "/" not in path
            else ""
        )
        raise CheckpointError(
            f"{path} is not a checkpoint folder (no such directory){hint}; give a folder "
            "with config.json and model.safetensors, or a Hub repo id 'owner/name'"
        )


def check_load_options(strict: bool, model_kwargs: dict, map_location) -> torch.device:
    """The keyword arguments ``GPT.from_pretrained`` passes on, checked before any file is read.

    Returns: the device ``map_location`` names. Raises: ValueError for ``strict=False`` (fireviz
    loads strictly only), a model setting other than huggingface_hub's own ``config`` (the model
    is what config.json says), or a ``map_location`` that is not a usable device.
    """
    if not strict:
        raise ValueError(
            "fireviz checkpoints load strictly only (strict=False would leave weights "
            "at their random init without a word); drop strict=False"
        )
    extra = sorted(set(model_kwargs) - {"config"})
    if extra:
        raise ValueError(
            f"from_pretrained takes no model settings ({', '.join(extra)}): the model is what "
            "config.json says; build GPT(GPTConfig(...)) for another shape"
        )
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"map_location={map_location!r} is not a device ({e}); use 'cpu' or 'cuda'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"map_location={map_location!r} but this torch has no CUDA device; use 'cpu'")
    return device


def folder_weights(folder: str) -> str:
    """The path of a checkpoint folder's ``model.safetensors``. Raises: CheckpointError if it is absent."""
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.exists(weights):
        raise CheckpointError(
            f"{folder} has no model.safetensors: not a fireviz checkpoint folder "
            "(save one with GPT.save_pretrained or `python -m fireviz train`)"
        )
    return weights


#: safetensors metadata key of model.safetensors that records the position encoding and its
#: resolved options the weights were trained with (issue #50), compared with config.json on load
ENCODING_METADATA_KEY = "fireviz_encoding"


#: encoding options that change how trained weights are evaluated, not what they are: left out of
#: the record's comparison, so a config.json edited to cap FIRE's normalizer (the documented way to
#: evaluate a capped FIRE from a folder) still loads, as a new identity
EVALUATION_OPTIONS = frozenset({"normalizer_cap"})


class EncodingRecordWarning(UserWarning):
    """A checkpoint's weights carry no encoding record (saved before fireviz wrote one): its encoding
    is taken from config.json alone. Said once per weights file and process."""


_SAID_NO_RECORD: set[str] = set()


def encoding_record(config: GPTConfig) -> str:
    """What model.safetensors records of ``config``'s encoding (its metadata
    ``ENCODING_METADATA_KEY``): JSON ``{"position_encoding", "encoding_options"}``, every option with
    the value the model uses (as config.json holds them), keys sorted."""
    return json.dumps(
        {"position_encoding": config.position_encoding, "encoding_options": config.complete_encoding_options()},
        sort_keys=True,
    )


def check_encoding_record(config: GPTConfig, metadata: dict | None, source: str) -> None:
    """Compare the encoding recorded in a weights file's metadata with ``config`` (config.json).

    Tensor names alone cannot tell kerple_log from kerple_power, or alibi from nope: a config.json
    relabelled to another encoding of the same tensors would load and score silently. Weights
    without a record (older checkpoints) are taken as config.json says, with an
    :class:`EncodingRecordWarning` once per ``source``.
    Raises: CheckpointError when the record and config.json disagree, or the record is not JSON."""
    stored = (metadata or {}).get(ENCODING_METADATA_KEY)
    if stored is None:
        if source not in _SAID_NO_RECORD:
            _SAID_NO_RECORD.add(source)
            warnings.warn(
                f"{source} carries no record of its encoding (saved before fireviz wrote one); its encoding "
                f"{config.position_encoding!r} is taken from config.json",
                EncodingRecordWarning,
                stacklevel=3,
            )
        return
    try:
        record = parse_json(str(stored), f"the encoding record of {source}", max_values=10_000)
    except FileFormatError as e:
        raise CheckpointError(f"{e}; the weights file is corrupt — restore it or retrain") from e
    want = json.loads(encoding_record(config))
    if not _same_encoding(record, want, config):
        said = f"{record.get('position_encoding')!r}" if isinstance(record, dict) else "something else"
        raise CheckpointError(
            f"config.json of {source} says the encoding is {want['position_encoding']!r} "
            f"({json.dumps(want['encoding_options'], sort_keys=True)[:200]}) but its weights were trained with "
            f"{said} ({json.dumps(record.get('encoding_options') if isinstance(record, dict) else record)[:200]}): "
            "config.json was edited or belongs to other weights — restore the checkpoint's own config.json"
        )


def _same_encoding(record, want: dict, config: GPTConfig) -> bool:
    """Whether a stored record names ``want``'s encoding and options. An option the record lacks
    (added to fireviz after the weights were saved) must hold its default."""
    if not isinstance(record, dict) or record.get("position_encoding") != want["position_encoding"]:
        return False
    stored = record.get("encoding_options")
    if not isinstance(stored, dict):
        return False
    defaults = json.loads(json.dumps(encoding_spec(config.position_encoding).defaults))
    have = {k: v for k, v in want["encoding_options"].items() if k not in EVALUATION_OPTIONS}
    stored = {k: v for k, v in stored.items() if k not in EVALUATION_OPTIONS}
    return all(have.get(k) == v for k, v in stored.items()) and all(
        k in stored or defaults.get(k) == v for k, v in have.items()
    )


def _safetensors_metadata(weights: str | bytes) -> dict:
    """The ``__metadata__`` of a safetensors file (path) or its bytes; {} when it has none."""
    if isinstance(weights, bytes):
        n = int.from_bytes(weights[:8], "little")
        header = parse_json(weights[8 : 8 + n].decode("utf-8"), "a safetensors header")
        meta = header.get("__metadata__") if isinstance(header, dict) else None
    else:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            meta = f.metadata()
    return dict(meta) if isinstance(meta, dict) else {}


def load_checked(cls: type, config: dict | GPTConfig | None, weights: str | bytes, model_id: str, map_location="cpu"):
    """A ``cls`` (the GPT class) built from ``config`` with the weights of a safetensors file: the one
    loader (``GPT.from_pretrained`` and ``fireviz.checkpoints.Checkpoint.load`` both call it).

    Args: ``config`` config.json's parsed JSON (checked by ``config_from_dict``) or a
      ``GPTConfig``; ``weights`` a local path, or the file's bytes (read once by the caller, who
      hashed them); ``model_id`` the folder, file or repo id, named in errors; ``map_location``
      the device the tensors are loaded onto (bytes: CPU).
    Returns: the model, every tensor loaded strictly (``load_state_checked``).
    Raises: CheckpointError for no config, an invalid config, a model too large for this
      machine's memory, an unreadable (corrupt, truncated) weights file, or weights that do not
      match the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load, load_file

    if isinstance(config, dict):
        config = config_from_dict(config, f"config.json of {model_id}")
    if config is None:
        raise CheckpointError(f"{model_id} has no config.json")
    try:
        model = cls(config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"config.json of {model_id} is invalid: {e}") from e
    except (RuntimeError, MemoryError) as e:  # the allocator: a model too large for this machine
        raise CheckpointError(f"the model of {model_id} does not fit in memory ({str(e).splitlines()[0][:200]})") from e
    source = model_id if isinstance(weights, bytes) else weights
    try:
        state = load(weights) if isinstance(weights, bytes) else load_file(weights, device=str(map_location))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{source} is corrupt or truncated ({e}); it was left untouched — restore it or retrain"
        ) from e
    load_state_checked(model, state, source=source)
    try:
        metadata = _safetensors_metadata(weights)
    except (FileFormatError, UnicodeDecodeError, OSError, ValueError) as e:
        raise CheckpointError(f"{source}: its header metadata cannot be read ({e}); restore it or retrain") from e
    check_encoding_record(config, metadata, str(source))
    return model


def nonfinite_parameters(model: nn.Module) -> list[str]:
    """Names of ``model``'s parameters and buffers holding NaN or ±inf (state_dict order); [] if none."""
    return [k for k, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a numpy array (no copy, but for bfloat16, which numpy lacks)."""
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def nonfinite_tensors(weights: str | os.PathLike) -> list[str]:
    """Names of the floating-point tensors of a safetensors file that hold NaN or ±inf, in file
    order; [] if none. Reads one tensor at a time (memory: the largest tensor, not the model).
    Raises: CheckpointError if the file cannot be read as safetensors (it is left untouched)."""
    from safetensors import SafetensorError, safe_open

    bad = []
    try:
        with safe_open(str(weights), framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                # numpy's single-threaded check: torch's threaded isfinite cost ~11 ms a tensor on a
                # busy 2-core machine (10 s for the bundled checkpoints' first scan, issue #48)
                if t.is_floating_point() and not bool(np.isfinite(_as_numpy(t)).all()):
                    bad.append(k)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{weights} is not a readable safetensors file ({e}); copy, download or train the checkpoint again"
        ) from e
    return bad


def load_state_checked(model: nn.Module, state: dict[str, torch.Tensor], source: str = "weights") -> None:
    """Strictly load ``state`` into ``model``, tolerating the tied ``lm_head.weight`` alias.

    Raises: CheckpointError naming missing/unexpected keys or mismatched shapes.
    """
    own = model.state_dict()
    state = dict(state)
    for a, b in (("lm_head.weight", "wte.weight"), ("wte.weight", "lm_head.weight")):
        if a not in state and b in state:  # safetensors keeps one name of a tied pair
            state[a] = state[b]
    tied = ("wte.weight", "lm_head.weight")
    if (
        all(k in state for k in tied)
        and all(k in own for k in tied)
        and own[tied[0]].data_ptr() == own[tied[1]].data_ptr()
    ):
        ta, tb = state[tied[0]], state[tied[1]]
        same = (
            ta.shape == tb.shape
            and ta.dtype == tb.dtype
            and torch.equal(  # bit for bit: NaN equals itself
                ta.contiguous().view(torch.uint8), tb.contiguous().view(torch.uint8)
            )
        )
        if not same:
            raise CheckpointError(
                f"{source} holds wte.weight and lm_head.weight with different values, but the model "
                "ties them (one matrix); keep one of the two tensors in the file or train again"
            )
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    # a float parameter stored as an integer or bool tensor would be cast and evaluated as if
    # trained (issue #38): refuse it; float16/bfloat16/float64 upcast or round exactly as intended
    wrong_kind = [
        f"{k}: {state[k].dtype} for {own[k].dtype}"
        for k in own
        if k in state and own[k].is_floating_point() and not state[k].is_floating_point()
    ]
    if wrong_kind:
        raise CheckpointError(
            f"{source} stores floating-point parameters as integer or bool tensors ({', '.join(wrong_kind[:5])}): "
            "not weights fireviz wrote; restore the file or train again"
        )
    mismatched = [
        f"{k}: file {tuple(state[k].shape)} vs config {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}")
        if mismatched:
            parts.append(f"shape mismatch {mismatched[:5]}")
        raise CheckpointError(f"{source} does not match its config.json: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)
