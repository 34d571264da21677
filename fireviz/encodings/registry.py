"""One spec per position encoding: the single place that says what an encoding is.

An :class:`EncodingSpec` names the encoding and declares how to build it, the options it
takes, whether one module serves every layer (``static``: no parameters; ``shared``: learned
but shared, FIRE-S) or each layer has its own (``per_layer``), the options it derives from the
model's training length, whether it has FIRE's normalizer, and — for a bias that depends on
``i − j`` only — how to build it as a target for ``fireviz.fit.fitting`` (Theorem 3.1) with which
parameters. The model, the trainer, evaluation, the bias report, the fit and the app read
these specs; nothing falls through to a default encoding. ``register_encoding`` adds one:
a new encoding is its class plus one spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from fireviz.encodings.base import PositionEncoding

SHARING = ("static", "shared", "per_layer")
#: how an encoding's position information enters attention: an additive bias on the logits
#: (T5, ALiBi, Kerple, Sandwich, FIRE), rotated queries and keys (RoPE and its scalings), or
#: nothing but the causal mask (NoPE)
KINDS = ("additive", "rotary", "none")


@dataclass(frozen=True)
class EncodingSpec:
    """What fireviz needs to know about one position encoding.

    Attributes:
      name: the config value (``GPTConfig.position_encoding``).
      build: ``build(num_heads, head_dim, **options) -> PositionEncoding``.
      options: the keyword options ``build`` takes (others are refused by name).
      sharing: ``"static"`` (no parameters: one module for all layers), ``"shared"`` (learned,
        one module for all layers) or ``"per_layer"`` (one module per layer).
      defaults_from_seq_len: ``f(seq_len) -> {option: value}``, options tied to the training
        length (FIRE's ``init_L = seq_len/4``), applied unless the config sets them.
      normalizer: True for FIRE-like encodings with a normalizer cap (``normalizer_cap``).
      fit_params: parameters of this encoding as a fit target, or None if it cannot be one.
      fit_target: ``f(num_heads, **params) -> (encoding module, params as used)``: the target
        with its parameters resolved (seeded draws, defaults), for ``fireviz.fit.fitting.make_target``.
      kind: ``"additive"`` (a bias added to the attention logits; the default), ``"rotary"``
        (queries and keys rotated by position; no bias) or ``"none"`` (the causal mask only).
        Memory estimates, the Attention page and the bias views read it, never the name.
      summary: one line for help texts.
      defaults: the value of each option when a config does not set it (None: derived, e.g.
        from the training length). A saved config.json (``config_format`` 2) names every option
        listed here, so a deleted option is an error, never a silent default.
    """

    name: str
    build: Callable[..., PositionEncoding]
    options: frozenset = field(default_factory=frozenset)
    sharing: str = "per_layer"
    defaults_from_seq_len: Callable[[int], dict] | None = None
    normalizer: bool = False
    fit_params: frozenset | None = None
    fit_target: Callable[..., tuple] | None = None
    summary: str = ""
    defaults: dict = field(default_factory=dict)
    kind: str = "additive"

    def __post_init__(self):
        if self.sharing not in SHARING:
            raise ValueError(f"EncodingSpec {self.name!r}: sharing must be one of {SHARING} (got {self.sharing!r})")
        if set(self.defaults) - set(self.options):
            raise ValueError(
                f"EncodingSpec {self.name!r}: defaults for options it does not take: "
                f"{sorted(set(self.defaults) - set(self.options))}"
            )
        if self.kind not in KINDS:
            raise ValueError(f"EncodingSpec {self.name!r}: kind must be one of {KINDS} (got {self.kind!r})")
        if (self.fit_params is None) != (self.fit_target is None):
            raise ValueError(f"EncodingSpec {self.name!r}: give fit_params and fit_target together, or neither")

    @property
    def additive(self) -> bool:
        """True when the encoding adds a bias to the attention logits (``kind == "additive"``)."""
        return self.kind == "additive"

    @property
    def one_module(self) -> bool:
        """True when one module serves every layer (static or shared)."""
        return self.sharing in ("static", "shared")


_REGISTRY: dict[str, EncodingSpec] = {}


def register_encoding(spec: EncodingSpec, replace: bool = False) -> EncodingSpec:
    """Add ``spec`` to the registry (``replace=True`` to redefine a name). Returns it.
    Raises: ValueError for a name already registered (without ``replace``) or not a plain
    lower-case identifier."""
    if not (spec.name.isidentifier() and spec.name == spec.name.lower()):
        raise ValueError(f"encoding name {spec.name!r} must be a lower-case identifier (e.g. 'my_bias')")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"encoding {spec.name!r} is already registered; pass replace=True to redefine it")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_encoding(name: str) -> None:
    """Remove ``name`` from the registry (tests of a toy encoding clean up with it)."""
    _REGISTRY.pop(name, None)


def encoding_names() -> tuple[str, ...]:
    """Every registered encoding name, in registration order."""
    return tuple(_REGISTRY)


def encoding_spec(name: str) -> EncodingSpec:
    """The spec of ``name``. Raises: ValueError naming the registered encodings."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown position encoding {name!r}; choose one of {', '.join(_REGISTRY)}") from None


def has_normalizer(name: object) -> bool:
    """True if ``name`` is a registered encoding with FIRE's normalizer (``EncodingSpec.normalizer``);
    False for any other value, registered or not."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    return bool(spec and spec.normalizer)


def fit_target_names() -> tuple[str, ...]:
    """Registered encodings that can be fit targets (``fit_target`` set), in registration order."""
    return tuple(n for n, s in _REGISTRY.items() if s.fit_target is not None)
