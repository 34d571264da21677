"""What defines a model: ``GPTConfig`` (saved as config.json next to the weights) and its bounds.

``fireviz.model.gpt`` builds a ``GPT`` from it; ``fireviz.model.state`` reads one back from a saved
config.json (``config_from_dict``). The byte-level vocabulary is fixed here too: ids 0..255
are bytes, ``BOS_ID`` = 256 starts a document.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from fireviz.data import BOS_ID, BYTE_VOCAB_SIZE  # noqa: F401  (BOS_ID re-exported for fireviz.model)
from fireviz.encodings import build_encoding, encoding_names, encoding_options, encoding_spec

#: Format of the config.json fireviz writes: 2 = ``encoding_options`` complete (every option of
#: the encoding named, defaults included); files without the field are format 1.
CONFIG_FORMAT = 2

#: Largest value of each size field of ``GPTConfig`` (far beyond any model fireviz trains; a
#: config.json past them is refused before anything is allocated).
CONFIG_LIMITS = {
    "n_layer": 1024,
    "n_head": 1024,
    "d_model": 1 << 16,
    "seq_len": 1 << 24,
    "vocab_size": 1 << 20,
    "attn_query_block": 1 << 20,
}
#: Most parameters a ``GPT`` may have (≈ 68B: nothing fireviz trains comes near).
MAX_PARAMETERS = 1 << 36


#: numbers (parameters + buffers) up to which ``GPTConfig.validate`` builds the position encoding
#: for real to check its option values; a larger one is checked by shape only (on the meta device),
#: its values when the model is built
THROWAWAY_BUILD_MAX = 1 << 20


@dataclass
class GPTConfig:
    """Everything that defines a model (saved as config.json next to the weights).

    Attributes:
      n_layer, n_head, d_model: transformer shape; d_model divisible by n_head.
      seq_len: training length in tokens (bytes); FIRE's default init_L is seq_len/4.
      vocab_size: 257 = 256 bytes + BOS.
      dropout: residual/attention dropout probability during training.
      position_encoding: a registered encoding (``fireviz.encodings.encoding_names()``).
      encoding_options: keyword options for ``build_encoding`` (e.g. ``{"init_L": 128}``).
      absolute_position_embedding: add a learned absolute embedding (max seq_len positions).
      attn_query_block: queries per attention call; longer inputs go block by block so a
        forward pass needs memory ∝ block × length (tokens).
      training: provenance written by the trainer (settings, data, tokens seen); not used
        by the model itself.
      config_format: 2 for a config.json the trainer writes (``to_json_dict``: ``encoding_options``
        names every option, see ``complete_encoding_options``); 1 (or absent) for older files and
        ``save_pretrained``, whose unset options take their defaults.
    Raises (``validate``): ValueError naming the bad field.
    """

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    seq_len: int = 512
    vocab_size: int = BYTE_VOCAB_SIZE
    dropout: float = 0.0
    position_encoding: str = "fire"
    encoding_options: dict = field(default_factory=dict)
    absolute_position_embedding: bool = False
    attn_query_block: int = 1024
    training: dict = field(default_factory=dict)
    config_format: int = 1

    def validate(self) -> "GPTConfig":
        """Check every field; returns self. Raises ValueError with the field and the fix.

        Sizes are bounded (``CONFIG_LIMITS``; at most ``MAX_PARAMETERS`` parameters) before
        anything is built, so a config.json with absurd sizes is refused, not allocated. Encoding
        options: each encoding checks its values; none may be NaN/inf, a true/false option takes
        only true or false and no other takes one (``_check_option_values``)."""
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size", "attn_query_block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"GPTConfig.{name} must be an integer (got {v!r} of type {type(v).__name__})")
            if v < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1 (got {v})")
            if v > CONFIG_LIMITS[name]:
                raise ValueError(f"GPTConfig.{name} = {v} is more than fireviz takes ({CONFIG_LIMITS[name]:,})")
        if self.vocab_size < BYTE_VOCAB_SIZE:  # every token id the data can hold must have a row
            raise ValueError(
                f"GPTConfig.vocab_size = {self.vocab_size} is less than the byte vocabulary needs "
                f"({BYTE_VOCAB_SIZE}: 256 bytes + BOS); set vocab_size to {BYTE_VOCAB_SIZE} or more"
            )
        n_params = 12 * self.n_layer * self.d_model**2 + self.vocab_size * self.d_model
        if n_params > MAX_PARAMETERS:
            raise ValueError(
                f"this config has ~{n_params:,} parameters, more than the {MAX_PARAMETERS:,} fireviz builds "
                "(n_layer, d_model or vocab_size is far too large)"
            )
        if not isinstance(self.absolute_position_embedding, bool):
            raise ValueError(
                f"GPTConfig.absolute_position_embedding must be true or false "
                f"(got {self.absolute_position_embedding!r})"
            )
        if not isinstance(self.encoding_options, dict) or not isinstance(self.training, dict):
            raise ValueError(
                "GPTConfig.encoding_options and .training must be dicts (JSON objects); "
                f"got {type(self.encoding_options).__name__} and {type(self.training).__name__}"
            )
        if not isinstance(self.position_encoding, str):
            raise ValueError(f"GPTConfig.position_encoding must be a name (got {self.position_encoding!r})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1) (got {self.dropout!r})")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.position_encoding not in encoding_names():
            raise ValueError(
                f"unknown position_encoding {self.position_encoding!r}; choose one of {', '.join(encoding_names())}"
            )
        bad = set(self.encoding_options) - encoding_options(self.position_encoding)
        if bad:
            raise ValueError(
                f"position_encoding {self.position_encoding!r} does not take option(s) "
                f"{sorted(bad)}; allowed: {sorted(encoding_options(self.position_encoding))}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if isinstance(self.config_format, bool) or self.config_format not in (1, CONFIG_FORMAT):
            raise ValueError(f"GPTConfig.config_format must be 1 or {CONFIG_FORMAT} (got {self.config_format!r})")
        # option *values* are checked by the encoding itself, by a throwaway build (RNG untouched):
        # first on the meta device (shapes only, nothing allocated), then for real only when that
        # is small: an mlp_width of 1e8 in a config.json cost 2.5 GB on every scan (issue #38)
        opts = self.resolved_encoding_options()
        try:
            with torch.random.fork_rng(devices=[]):
                try:
                    with torch.device("meta"):
                        shapes = build_encoding(self.position_encoding, self.n_head, self.head_dim, **opts)
                    size = sum(t.numel() for t in list(shapes.parameters()) + list(shapes.buffers()))
                except (TypeError, ValueError, RuntimeError, NotImplementedError):
                    size = 0  # a check that reads a tensor's value: the real build says what is wrong
                if size <= THROWAWAY_BUILD_MAX:
                    build_encoding(self.position_encoding, self.n_head, self.head_dim, **opts)
        except (TypeError, ValueError, RuntimeError, OverflowError, MemoryError) as e:
            raise ValueError(
                f"encoding_options {self.encoding_options} are invalid for {self.position_encoding!r}: {e}"
            ) from None
        _check_option_values(self.position_encoding, self.encoding_options)  # what the encoding let through
        return self

    @property
    def head_dim(self) -> int:
        """Channels per attention head: d_model // n_head (validate() requires divisibility)."""
        return self.d_model // self.n_head

    def complete_encoding_options(self) -> dict:
        """Every option of the encoding with the value this model uses: its spec's defaults,
        then the training-length ones (``resolved_encoding_options``). What config.json holds."""
        return {**encoding_spec(self.position_encoding).defaults, **self.resolved_encoding_options()}

    def to_json_dict(self) -> dict:
        """The config as written to config.json: every field, ``encoding_options`` complete,
        ``config_format = CONFIG_FORMAT``."""
        return {**asdict(self), "encoding_options": self.complete_encoding_options(), "config_format": CONFIG_FORMAT}

    def resolved_encoding_options(self) -> dict:
        """``encoding_options`` plus fireviz's defaults tied to the training length.

        From the encoding's spec (``EncodingSpec.defaults_from_seq_len``): FIRE ``init_L =
        seq_len / 4`` (the paper's 512 at 2048); YaRN ``original_max_position_embeddings = seq_len``.
        """
        opts = dict(self.encoding_options)
        spec = encoding_spec(self.position_encoding)
        if spec.defaults_from_seq_len is not None:  # e.g. FIRE's init_L, YaRN's training length
            for k, v in spec.defaults_from_seq_len(self.seq_len).items():
                opts.setdefault(k, v)
        return opts


def _leaves(value):
    """The scalars inside an option value (itself, or the items of nested lists / tuples / dicts)."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


def _check_option_values(encoding: str, options: dict) -> None:
    """What every encoding option shares, checked after the encoding's own checks (which name
    their problems better): an option whose default is true/false takes only true or false; any
    other takes no true/false; no number is NaN or infinite. Raises: ValueError naming the option."""
    defaults = encoding_spec(encoding).defaults
    for name, value in options.items():
        leaves = list(_leaves(value))
        if isinstance(defaults.get(name), bool):
            if not isinstance(value, bool):
                raise ValueError(f"encoding_options.{name} of {encoding!r} must be true or false (got {value!r})")
            continue
        if any(isinstance(v, bool) for v in leaves):
            raise ValueError(f"encoding_options.{name} of {encoding!r} takes a number, not true/false (got {value!r})")
        if any(isinstance(v, float) and not math.isfinite(v) for v in leaves):
            raise ValueError(f"encoding_options.{name} of {encoding!r} must be finite (got {value!r})")
