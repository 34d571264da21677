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

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from fireviz.core import as_float, as_int, as_seed
from fireviz.encodings.base import PositionEncoding

SHARING = ("static", "shared", "per_layer")
#: how an encoding's position information enters attention: an additive bias on the logits
#: (T5, ALiBi, Kerple, Sandwich, FIRE), rotated queries and keys (RoPE and its scalings), or
#: nothing but the causal mask (NoPE)
KINDS = ("additive", "rotary", "none")
#: the value kinds of a fit-target parameter (``FitParam.kind``)
FIT_PARAM_KINDS = ("int", "float", "numbers", "choice", "seed", "text", "any")


def parse_numbers(text: str, what: str) -> list[float] | float:
    """``"0.5"`` → 0.5, ``"0.5, 1,2"`` → [0.5, 1.0, 2.0]: a per-head parameter as typed on the
    command line or in the app (Kerple r1/r2, T5 bucket values).

    Raises: ValueError naming ``what`` for text that is empty or not comma-separated numbers.
    """
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"{what} must be a number or comma-separated numbers (got {text!r}); example: 0.5 or 0.5,1,1.5,2"
        ) from None
    if not vals:
        raise ValueError(f"{what} is empty; give a number or comma-separated numbers")
    return vals[0] if len(vals) == 1 else vals


def _plain(value):
    """A numpy array (or tensor) as nested lists, so its items are checked one by one; else ``value``."""
    return value.tolist() if isinstance(value, (np.ndarray, torch.Tensor)) else value


def _either(choices: tuple) -> str:
    """``('a', 'b', 'c')`` → ``"'a', 'b' or 'c'"``."""
    shown = [repr(c) for c in choices]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


@dataclass(frozen=True)
class FitParam:
    """One parameter of an encoding as a fit target: what it means, how a value is checked, and
    how the ``fit`` command line (a flag) and the Fit FIRE page (a widget) offer it.

    Attributes:
      name: the keyword of ``EncodingSpec.fit_target`` (and of ``fireviz.fit.fitting.make_target``).
      help: one line with units, for ``--help`` and the app's widget label.
      kind: ``"int"``, ``"float"``, ``"numbers"`` (one number for every head or one per head),
        ``"choice"`` (one of ``choices``), ``"seed"`` (an integer 0 … 2⁶⁴ − 1), ``"text"`` (a
        non-empty string) or ``"any"`` (untyped: passed through unchecked; JSON on the command line).
      default: the value used when the parameter is not given, as shown to users; None: drawn or
        derived (and None is then accepted as "not given").
      lo, hi: bounds of an int / float / numbers value (None: unbounded on that side).
      choices: the values of a ``choice`` (the app offers these).
      hint: the fix appended to an error message (after ``"; "``).
      cli_flag: the ``fit`` command line's flag without ``--`` (default: ``name`` with ``-`` for ``_``).
      url_key: the Fit FIRE page's URL key (default ``p_<name>``).
      step: the app's step of an int / float widget (e.g. 2 for an even d̄).
      unset: the value of the app's number widget that means "not given" (ALiBi: slope 0 = the
        standard slopes), also its lowest value when ``lo`` is None; None: an empty box.
      validate: ``f(value) -> value`` replacing the kind's check (for messages of its own).
      parse: ``f(text, what) -> value`` replacing the kind's reading of a command-line value.
    """

    name: str
    help: str = ""
    kind: str = "any"
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    hint: str = ""
    cli_flag: str | None = None
    url_key: str | None = None
    step: float | None = None
    unset: float | None = None
    validate: Callable[[Any], Any] | None = None
    parse: Callable[[str, str], Any] | None = None

    def __post_init__(self):
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ValueError(f"FitParam name {self.name!r} must be an identifier (a keyword of the fit target)")
        if self.kind not in FIT_PARAM_KINDS:
            raise ValueError(f"FitParam {self.name!r}: kind must be one of {FIT_PARAM_KINDS} (got {self.kind!r})")
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"FitParam {self.name!r}: a choice needs its choices, e.g. choices=('a', 'b')")

    @property
    def flag(self) -> str:
        """The command-line flag, without ``--``."""
        return self.cli_flag or self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The Fit FIRE page's URL key."""
        return self.url_key or f"p_{self.name}"

    def check(self, value):
        """``value`` as the target takes it (a plain int / float / list / str).

        Raises: ValueError naming the parameter, the values it takes and the fix (``hint``)."""
        if self.validate is not None:
            return self.validate(value)
        if self.kind == "any" or (value is None and self.default is None):
            return value
        if self.kind == "int":
            return as_int(value, self.name, self.lo, self.hi, self.hint)
        if self.kind == "seed":
            return as_seed(value, self.name)
        if self.kind == "float":
            return as_float(value, self.name, self.lo, self.hi, hint=self.hint)
        if self.kind == "numbers":
            return self._numbers(value)
        if self.kind == "choice":
            if not (isinstance(value, Hashable) and value in self.choices):
                self._fail(f"{self.name} must be {_either(self.choices)} (got {value!r})")
            return value
        if not isinstance(value, str) or not value.strip():  # text
            self._fail(f"{self.name} must be a non-empty string (got {value!r})")
        return value

    def _fail(self, problem: str):
        raise ValueError(problem + (f"; {self.hint}" if self.hint else ""))

    def _numbers(self, value):
        value = _plain(value)
        if isinstance(value, (list, tuple)):
            if not value:
                self._fail(f"{self.name} is an empty list")
            return [as_float(v, self.name, self.lo, self.hi, hint=self.hint) for v in value]
        return as_float(value, self.name, self.lo, self.hi, hint=self.hint)

    def from_text(self, text: str, what: str | None = None):
        """The value of ``text`` as typed on the command line or in the app, not yet checked:
        an int, a float, numbers (``parse_numbers``), JSON for an untyped parameter (a bare word
        stays text), else the text. Raises: ValueError naming ``what`` (default: the name)."""
        what = what or self.name
        if self.parse is not None:
            return self.parse(text, what)
        try:
            if self.kind in ("int", "seed"):
                return int(text)
            if self.kind == "float":
                return float(text)
        except ValueError:
            wanted = "a number" if self.kind == "float" else "an integer"
            raise ValueError(f"{what} must be {wanted} (got {text!r})") from None
        if self.kind == "numbers":
            return parse_numbers(text, what)
        if self.kind == "any":
            try:
                return json.loads(text)
            except ValueError:
                return text
        return text


def fit_params_of(params) -> tuple[FitParam, ...]:
    """``EncodingSpec.fit_params`` as a tuple of :class:`FitParam`: bare names (a frozenset of
    names, as specs gave them before ``FitParam``) become untyped parameters, sorted by name.
    Raises: ValueError for a string, an item that is neither, or a name given twice."""
    if isinstance(params, (str, FitParam)):
        raise ValueError(f"fit_params must be a tuple of FitParam or a set of names (got {params!r})")
    items = sorted(params, key=str) if isinstance(params, (set, frozenset)) else list(params)
    out = []
    for p in items:
        if isinstance(p, str):
            p = FitParam(p)
        if not isinstance(p, FitParam):
            raise ValueError(f"fit_params items must be FitParam or names (got {p!r})")
        out.append(p)
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"fit_params name a parameter twice: {names}")
    return tuple(out)


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
      fit_params: parameters of this encoding as a fit target (a tuple of :class:`FitParam`:
        checked by ``make_target``, offered as ``fit`` flags and Fit FIRE widgets), or None if it
        cannot be one. A set of bare names is taken too: untyped parameters, passed unchecked.
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
    fit_params: tuple[FitParam, ...] | frozenset | None = None
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
        if self.fit_params is not None:
            try:
                object.__setattr__(self, "fit_params", fit_params_of(self.fit_params))
            except ValueError as e:
                raise ValueError(f"EncodingSpec {self.name!r}: {e}") from None

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
