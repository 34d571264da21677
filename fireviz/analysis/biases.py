"""Learned position biases of a trained model: curves, matrices, locality.

What this module answers, for a ``fireviz.model.gpt.GPT`` (usually a checkpoint folder):

* ``bias_report(model)`` – for every layer and head the additive bias b(i, j) in logits at a
  few query positions i (tokens, 0-based), as curves over the distance d = i − j, plus a
  query × key matrix on a grid (FIRE depends on the absolute query position i through its
  normalizer ψ(max(L, i)), Li et al. 2024 eq. 3–4, so one curve per i is not the whole
  story). For FIRE also the MLP input ψ(i − j)/ψ(max(L, i)) of each curve, which shows
  progressive interpolation squeezing a growing distance range into [0, 1] (§3.2).
  Rotary encodings have no bias; they get the RoPE position kernel instead (RoFormer, Su
  et al. 2021, §3.4.3, long-term decay). NoPE has neither. What decides the numbers is one
  frozen ``BiasSettings`` (``run_bias_report(model, settings)``); the readouts of one
  encoding are ``fireviz.analysis.primitives``.
* ``classify_locality(distance, bias)`` – ``local`` / ``anti-local`` / ``mixed`` with the
  scores behind it (see ``LOCALITY_RULES``).
* Attention measured on a text (dilution, per-head patterns) is ``fireviz.analysis.text_attention``.
* The command line (``python -m fireviz biases CKPT …``) is ``fireviz.cli.biases``.

Conventions: positions and distances in tokens (bytes: the tokenizer is byte-level);
biases in logits (added to q·k/√d_head before softmax); attention shares are probabilities.
The default query positions are i = m·seq_len − 1 for m = 1, 2, 4, 8 (16 for dilution):
the last query of an m·seq_len-token window, so the first curve covers exactly the
distances 0 … seq_len − 1 seen in training. Never imports Streamlit.
"""

from __future__ import annotations

import dataclasses
import math
from copy import deepcopy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence, TypeVar

import numpy as np
import torch

from fireviz.analysis.locality import (
    LOCALITY_CLASSES,
    LOCALITY_RULES,
    LocalityScore,
    _r,
    _round_significant,
    classify_locality,
)
from fireviz.analysis.primitives import (
    FIRE_INPUT_DISTANCES,
    bias_curve,
    bias_matrix,
    fire_mlp_curves,
    fire_normalized_input,
    rotary_kernel_curve,
)
from fireviz.core import as_int, is_int
from fireviz.encodings import ToeplitzBias, check_normalizer_cap, fire_modules
from fireviz.model import GPT, bias_matrix_bytes, bias_report_bytes, check_fits, fire_curve_bytes

if TYPE_CHECKING:
    from fireviz.checkpoints.hub_families import PublishedModel

_Model = TypeVar("_Model", bound=torch.nn.Module)  # a GPT or a published model's encodings

#: Multiples of the training length used for the default bias query positions.
DEFAULT_BIAS_MULTIPLES: tuple[int, ...] = (1, 2, 4, 8)
#: Multiples of the training length used for the default attention-dilution positions.
DEFAULT_DILUTION_MULTIPLES: tuple[int, ...] = (1, 2, 4, 8, 16)
#: Most grid points per axis of the default query × key bias matrix.
DEFAULT_MATRIX_POINTS = 128
#: Most points of FIRE's f_θ curve on its input [0, 1] (``BiasSettings.mlp_grid_points``).
MAX_MLP_GRID_POINTS = 100_000


# -- query positions ---------------------------------------------------------------------------
def default_query_positions(seq_len: int, multiples: Iterable[int] = DEFAULT_BIAS_MULTIPLES) -> list[int]:
    """Query positions i = m·seq_len − 1 (0-based, tokens) for each multiple m.

    i = seq_len − 1 is the last query of a training window, so its curve spans exactly the
    distances 0 … seq_len − 1 seen in training; i = 8·seq_len − 1 the last query of a
    window eight times longer.
    Returns: sorted list of ints. Raises: ValueError if seq_len < 1 or a multiple < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1 token (got {seq_len})")
    mults = sorted(set(int(m) for m in multiples))
    if not mults or mults[0] < 1:
        raise ValueError(f"multiples must be integers >= 1 (got {list(multiples)})")
    return [m * seq_len - 1 for m in mults]


def parse_positions(text: str) -> list[int]:
    """Parse ``"512,4096"`` into sorted unique query positions (tokens, 0-based).

    Raises: ValueError naming the bad item for empty input, non-integers or negatives.
    """
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"no query positions in {text!r}; give comma-separated integers like 511,4095")
    out = []
    for t in items:
        try:
            out.append(int(t))
        except ValueError:
            raise ValueError(f"query position {t!r} is not an integer (tokens, 0-based)") from None
    return _check_positions(out)


def _check_positions(positions: Iterable[int], what: str = "query_positions") -> list[int]:
    """Sorted unique positions (integers >= 0, tokens). Raises: ValueError naming ``what`` for a string
    (text goes through ``parse_positions``), an item not an integer >= 0 (bool, float), or none."""
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Iterable):
        raise ValueError(
            f"{what} must be a list of integers (tokens, 0-based), not {positions!r}; text such as "
            "'511,4095' goes through parse_positions"
        )
    pos = sorted({as_int(p, "query position", lo=0, hint="positions are 0-based token indices") for p in positions})
    if not pos:
        raise ValueError(f"{what} is empty")
    return pos


def _check_window(window) -> tuple[int, int, int]:
    vals = None if isinstance(window, (str, bytes)) or not isinstance(window, Iterable) else tuple(window)
    if vals is None or len(vals) != 3 or not all(map(is_int, vals)):
        raise ValueError(f"matrix window needs three integers (start, stop, stride) (got {window!r})")
    start, stop, stride = (int(v) for v in vals)
    if start < 0 or stop <= start or stride < 1:
        raise ValueError(f"matrix window (start, stop, stride) needs 0 <= start < stop and stride >= 1 (got {window})")
    return start, stop, stride


def _default_classify_at(positions: Sequence[int]) -> int:
    if positions[0] < 1:
        raise ValueError(
            f"the smallest query position is {positions[0]}, where a query sees only itself; the "
            "locality classification needs one >= 1 (e.g. --query-positions 511,4095)"
        )
    return int(positions[0])


@dataclass(frozen=True)
class BiasSettings:
    """Everything that decides a bias report's numbers, validated on construction (``make`` or
    ``BiasSettings(...)``: the same checks, which also turn lists into sorted tuples).

    Fields (positions in tokens, 0-based; integers are ints or numpy ints, never bools, floats
    or strings — text goes through ``parse_positions``):
      query_positions: sorted, unique, each >= 0; None = ``default_query_positions(seq_len)``
        (m·seq_len − 1 for m = 1, 2, 4, 8), filled in per model by :meth:`resolve`.
      classify_at: query position (>= 1) of the headline per-head locality; None = the
        smallest query position (filled in by :meth:`resolve`).
      matrix_window: ``(start, stop, stride)`` of the query × key grid (same on both axes), or
        None = 0 … the largest query position with at most ``DEFAULT_MATRIX_POINTS`` per axis.
      normalizer_cap: FIRE only: every curve with ψ(min(max(L, i), cap)), cap in tokens
        (1 … ``MAX_NORMALIZER_CAP``), or None; ignored for encodings without a normalizer.
      mlp_grid_points: FIRE only: points (2 … ``MAX_MLP_GRID_POINTS``) of the f_θ curve on its input [0, 1].
    :meth:`describe` is the JSON description (cache and job key), :meth:`caption` the positions in words.
    """

    query_positions: tuple[int, ...] | None = None
    classify_at: int | None = None
    matrix_window: tuple[int, int, int] | None = None
    normalizer_cap: int | None = None
    mlp_grid_points: int = 201

    @classmethod
    def make(
        cls,
        query_positions: Sequence[int] | None = None,
        *,
        classify_at: int | None = None,
        matrix_window: tuple[int, int, int] | None = None,
        normalizer_cap: int | None = None,
        mlp_grid_points: int = 201,
    ) -> "BiasSettings":
        """Validated settings (the arguments of :func:`bias_report`).

        Raises: ValueError naming the argument for query positions that are not a non-empty list
          of integers >= 0, a smallest one of 0 without ``classify_at``, ``classify_at`` not an
          integer >= 1, a matrix window not three integers with ``0 <= start < stop``, ``stride >=
          1``, a normalizer cap outside 1 … MAX_NORMALIZER_CAP, or ``mlp_grid_points`` not an integer
          in 2 … ``MAX_MLP_GRID_POINTS``. What would not fit in memory ``run_bias_report`` refuses.
        """
        # __post_init__ validates the positions and turns them into a sorted tuple
        return cls(query_positions, classify_at, matrix_window, normalizer_cap, mlp_grid_points)  # type: ignore[arg-type]

    def __post_init__(self):
        positions = None if self.query_positions is None else tuple(_check_positions(self.query_positions))
        classify_at = self.classify_at
        if classify_at is not None:
            classify_at = as_int(classify_at, "classify_at", lo=1, hint="a curve needs two distances (tokens)")
        elif positions is not None:
            _default_classify_at(positions)  # the smallest given position must be one a curve classifies
        grid = as_int(
            self.mlp_grid_points, "mlp_grid_points", 2, MAX_MLP_GRID_POINTS, "points of FIRE's f_θ curve on [0, 1]"
        )
        checked = {
            "query_positions": positions,
            "classify_at": classify_at,
            "matrix_window": None if self.matrix_window is None else _check_window(self.matrix_window),
            "normalizer_cap": check_normalizer_cap(self.normalizer_cap),
            "mlp_grid_points": grid,
        }
        for name, value in checked.items():  # frozen: the checked values replace what was given
            object.__setattr__(self, name, value)

    def replace(self, **changes) -> "BiasSettings":
        """These settings with some fields changed, validated again, e.g. ``replace(normalizer_cap=512)``.
        Raises: ValueError for a name that is not a setting, or a bad value (as ``make``)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"BiasSettings has no setting(s) {unknown}; the settings are {', '.join(self.describe())}")
        return dataclasses.replace(self, **changes)

    def resolve(self, seq_len: int) -> "BiasSettings":
        """The settings for a model of training length ``seq_len`` (tokens): default query
        positions and ``classify_at`` filled in. Raises: ValueError as ``make`` (and for seq_len < 1)."""
        positions = self.query_positions or tuple(default_query_positions(seq_len))  # never empty once made
        classify_at = self.classify_at if self.classify_at is not None else _default_classify_at(positions)
        return dataclasses.replace(self, query_positions=positions, classify_at=classify_at)

    def describe(self) -> dict:
        """The settings as JSON (``query_positions`` and ``matrix_window`` as lists or null; the
        cache and job key's settings)."""
        return {
            "query_positions": None if self.query_positions is None else list(self.query_positions),
            "classify_at": self.classify_at,
            "matrix_window": None if self.matrix_window is None else list(self.matrix_window),
            "normalizer_cap": self.normalizer_cap,
            "mlp_grid_points": self.mlp_grid_points,
        }

    def caption(self) -> str:
        """The positions in words, e.g. ``"Query positions i = 511, 4095 tokens"``, then the
        locality position when it is not the smallest, the matrix grid and the cap when set."""
        if self.query_positions is None:
            parts = ["Query positions i = m·L − 1 for m = " + ", ".join(map(str, DEFAULT_BIAS_MULTIPLES))]
        else:
            parts = [f"Query positions i = {', '.join(map(str, self.query_positions))} tokens"]
        if self.classify_at is not None and self.classify_at != (self.query_positions or (None,))[0]:
            parts.append(f"locality classified at i = {self.classify_at} tokens")
        if self.matrix_window is not None:
            parts.append("matrix grid {}:{}:{} tokens".format(*self.matrix_window))
        if self.normalizer_cap is not None:
            parts.append(f"FIRE's normalizer capped at {self.normalizer_cap} tokens")
        return "; ".join(parts)


def _rl(a: np.ndarray, digits: int = 6):
    """Nested lists of rounded floats (NaN → None) from an array."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return _r(float(a), digits)
    r = _round_significant(a, digits)  # = _r of each element, vectorized
    missing = np.isnan(r)
    if not missing.any():
        return r.tolist()
    o = r.astype(object)
    o[missing] = None
    return o.tolist()


@dataclass
class LayerBiases:
    """Biases of one layer. Arrays are numpy; ``to_dict`` makes JSON.

    Attributes:
      layer: index.
      curves: ``{i: float32 [heads, i + 1]}`` bias (logits) at distances 0 … i for each query
        position i (tokens); for a bidirectional encoding (a T5 encoder) ``[heads, 2i + 1]`` at
        distances −i … i (keys i + i … 0), with ``curve_distances[i]`` naming them.
      normalized_input: FIRE only, ``{i: float32 [i + 1]}`` the MLP input ψ(d)/ψ(max(L, i)).
      matrix: float32 ``[heads, q, k]`` bias on ``matrix_query_positions × matrix_key_positions``
        (NaN at future keys), or None.
      locality: per head, the ``LocalityScore`` at the report's ``classify_at`` position.
      locality_by_query_position: ``{i: [LocalityScore per head]}``.
      fire: FIRE only: ``{"c", "threshold_L" (tokens), "mlp_x" [G], "mlp_bias" [heads, G]}``
        f_θ on a grid of its input in [0, 1].
    """

    layer: int
    curves: dict[int, np.ndarray] = field(default_factory=dict)
    curve_distances: dict[int, np.ndarray] = field(default_factory=dict)
    normalized_input: dict[int, np.ndarray] = field(default_factory=dict)
    matrix: np.ndarray | None = None
    matrix_query_positions: list[int] = field(default_factory=list)
    matrix_key_positions: list[int] = field(default_factory=list)
    locality: list[LocalityScore] = field(default_factory=list)
    locality_by_query_position: dict[int, list[LocalityScore]] = field(default_factory=dict)
    fire: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (see ``BiasReport.to_dict`` for the layout)."""
        out: dict[str, Any] = {"layer": self.layer, "curves": []}
        for i, arr in self.curves.items():
            dist = self.curve_distances.get(i)
            c = {
                "query_position": int(i),
                "bias": _rl(arr),
                "distance": list(range(arr.shape[1])) if dist is None else [int(x) for x in dist],
            }
            if i in self.normalized_input:
                c["normalized_input"] = _rl(self.normalized_input[i])
            out["curves"].append(c)
        out["matrix"] = (
            None
            if self.matrix is None
            else {
                "query_positions": list(map(int, self.matrix_query_positions)),
                "key_positions": list(map(int, self.matrix_key_positions)),
                "bias": _rl(self.matrix, 9),
            }
        )
        out["heads"] = []
        for h, s in enumerate(self.locality):
            row = {"head": h, **s.to_dict()}
            row["locality_by_query_position"] = {
                str(i): v[h].locality for i, v in self.locality_by_query_position.items()
            }
            out["heads"].append(row)
        if self.fire is not None:
            out["fire"] = {
                "c": _r(self.fire["c"]),
                "threshold_L": _r(self.fire["threshold_L"]),
                "mlp_x": _rl(self.fire["mlp_x"]),
                "mlp_bias": _rl(self.fire["mlp_bias"]),
            }
            if "input_vs_query" in self.fire:
                out["fire"]["input_vs_query"] = self.fire["input_vs_query"]
        return out


@dataclass
class BiasReport:
    """Everything ``bias_report`` measures for one model.

    Attributes: ``checkpoint`` name (or None), ``encoding`` name, ``kind`` (additive | rotary |
    none), ``train_seq_len`` (tokens), ``n_layer``, ``n_head``, ``query_positions`` (tokens,
    0-based), ``classify_at`` (the query position of the headline locality), ``layers``
    (``LayerBiases`` per layer, empty curves for non-additive kinds), ``kernel`` (rotary only:
    ``{"distance": [D], "value": [D], "attention_factor", "label"}``), ``note``,
    ``normalizer_cap`` (tokens; FIRE computed with a capped normalizer, else None).
    """

    checkpoint: str | None
    encoding: str
    kind: str
    train_seq_len: int
    n_layer: int
    n_head: int
    query_positions: list[int]
    classify_at: int | None
    layers: list[LayerBiases]
    kernel: dict | None = None
    note: str = ""
    normalizer_cap: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict: the attributes above, ``locality_rules``, and per layer
        ``curves`` = [{query_position, distance [i+1], bias [heads][i+1], normalized_input?}],
        ``matrix`` = {query_positions, key_positions, bias [heads][q][k] (null = future key;
        9 significant digits, float32-exact)},
        ``heads`` = [{head, locality, rank_correlation, peak_distance, peak_fraction,
        bias_range, query_position, reason, locality_by_query_position}], ``fire``?.
        Other floats are rounded to 6 significant digits (float32 precision is ~7)."""
        kernel = None
        if self.kernel is not None:
            kernel = {
                "distance": [int(x) for x in self.kernel["distance"]],
                "value": _rl(self.kernel["value"]),
                "attention_factor": _r(self.kernel["attention_factor"]),
                "label": self.kernel["label"],
            }
        return {
            "checkpoint": self.checkpoint,
            "encoding": self.encoding,
            "kind": self.kind,
            "train_seq_len": self.train_seq_len,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "query_positions": list(self.query_positions),
            "classify_at": self.classify_at,
            "units": {"position": "tokens (0-based)", "distance": "tokens", "bias": "logits"},
            "locality_rules": dict(LOCALITY_RULES),
            "note": self.note,
            "kernel": kernel,
            "normalizer_cap": self.normalizer_cap,
            "layers": [layer.to_dict() for layer in self.layers],
        }


def _matrix_grid(max_position: int, window: tuple[int, int, int] | None) -> range:
    """Positions of the query × key grid: ``range(*window)`` (validated by ``BiasSettings``), or
    0 … ``max_position`` with at most ``DEFAULT_MATRIX_POINTS`` points. A ``range``: its size
    is known (and checked) before a list of positions is built."""
    if window is None:
        stride = max(1, math.ceil((max_position + 1) / DEFAULT_MATRIX_POINTS))
        return range(0, max_position + 1, stride)
    return range(*window)


@torch.no_grad()
def bias_report(
    model: GPT,
    query_positions: Sequence[int] | None = None,
    classify_at: int | None = None,
    matrix_window: tuple[int, int, int] | None = None,
    checkpoint: str | None = None,
    mlp_grid_points: int = 201,
    normalizer_cap: int | None = None,
) -> BiasReport:
    """Biases of every layer and head of ``model`` (a ``fireviz.model.gpt.GPT``):
    ``run_bias_report(model, BiasSettings.make(query_positions, …), checkpoint)``.

    Args: as :class:`BiasSettings` (query positions i in tokens, 0-based, default m·seq_len − 1
      for m = 1, 2, 4, 8; ``classify_at`` the headline locality's query position, default the
      smallest; ``matrix_window`` (start, stop, stride) of the query × key grid, default 0 … the
      largest query position in at most 128 points per axis; FIRE's ``mlp_grid_points`` and
      ``normalizer_cap`` — every curve with ψ(min(max(L, i), cap)), as ``fireviz eval
      --normalizer-cap`` evaluates, on a copy: the model given is never changed), and
      ``checkpoint``, the name stored in the report.
    Returns: ``BiasReport``; see :func:`run_bias_report`.
    Raises: ValueError as ``BiasSettings.make`` and ``run_bias_report``.
    """
    settings = BiasSettings.make(
        query_positions,
        classify_at=classify_at,
        matrix_window=matrix_window,
        normalizer_cap=normalizer_cap,
        mlp_grid_points=mlp_grid_points,
    )
    return run_bias_report(model, settings, checkpoint)


@torch.no_grad()
def run_bias_report(model: GPT | PublishedModel, settings: BiasSettings, checkpoint: str | None = None) -> BiasReport:
    """The bias report of ``model`` (a ``GPT`` or a published model's encodings) as ``settings`` say.

    ``checkpoint`` is the name stored in the report. Returns: ``BiasReport`` (query positions and
    ``classify_at`` resolved for the model: ``settings.resolve(seq_len)``); FIRE layers also
    carry ``fire["input_vs_query"]`` (:func:`fire_input_vs_query`, up to 16× the training
    length). Additive encodings get curves/matrix/locality; rotary ones the ``rotary_kernel``
    over distances 0 … max query position (Su et al. 2021 §3.4.3) and no per-head locality;
    NoPE neither (``note`` says so).
    Raises: ValueError for a default smallest query position of 0 (seq_len 1), or curves, a bias
      matrix or FIRE's f_θ grid that would not fit in memory (estimated before anything is built).
    """
    s = settings.resolve(model.config.seq_len)
    model = _capped_copy(model, s.normalizer_cap)
    report = _bias_report(model, s, checkpoint)
    report.normalizer_cap = s.normalizer_cap if s.normalizer_cap is not None and fire_modules(model) else None
    return report


def _capped_copy(model: _Model, cap: int | None) -> _Model:
    # A copy, never the caller's model: the app shares one loaded model between sessions.
    if cap is None or not fire_modules(model):
        return model
    cap = check_normalizer_cap(cap)
    assert cap is not None  # it was not None before the check
    copy = deepcopy(model)
    for m in fire_modules(copy):
        m.normalizer_cap = float(cap)
    return copy


def _bias_report(model, s: BiasSettings, checkpoint) -> BiasReport:
    """The report for resolved settings ``s``: memory checked first, then every layer."""

    cfg = model.config
    assert s.query_positions is not None and s.classify_at is not None  # resolved settings
    positions = list(s.query_positions)
    all_positions = sorted(set(positions) | {s.classify_at})
    check_fits(  # memory before work: one bias row [heads, i + 1] per query position
        bias_report_bytes(cfg.n_head, cfg.n_layer, max(all_positions)),
        "cpu",
        f"the bias report up to query position {max(all_positions):,}",
        "ask for smaller query positions",
    )
    enc0 = model.encoding(0)
    kind = enc0.kind
    report = BiasReport(
        checkpoint=checkpoint,
        encoding=cfg.position_encoding,
        kind=kind,
        train_seq_len=int(cfg.seq_len),
        n_layer=int(cfg.n_layer),
        n_head=int(cfg.n_head),
        query_positions=positions,
        classify_at=s.classify_at if kind == "additive" else None,
        layers=[],
    )
    if kind != "additive":
        return _without_bias(report, enc0)
    grid: Sequence[int] = _matrix_grid(positions[-1], s.matrix_window)
    n = len(grid)  # arithmetic: nothing is built before the check
    hint = "give a coarser --matrix START:STOP:STRIDE"
    check_fits(bias_matrix_bytes(cfg.n_head, n), "cpu", f"a {n:,} × {n:,} bias matrix", hint)
    if hasattr(enc0, "normalized_distance"):
        check_fits(
            fire_curve_bytes(cfg.n_head, enc0.mlp_width, s.mlp_grid_points, enc0.mlp_depth),
            "cpu",
            f"FIRE's f_θ on {s.mlp_grid_points:,} points",
            "ask for fewer mlp_grid_points",
        )
    grid = list(grid)
    fire_max_position = max(16 * cfg.seq_len, positions[-1])
    for layer in range(cfg.n_layer):
        enc = model.encoding(layer)
        lb = _layer_curves(enc, layer, positions, s.classify_at)
        lb.matrix = bias_matrix(enc, grid, grid)
        lb.matrix_query_positions = lb.matrix_key_positions = grid
        if hasattr(enc, "normalized_distance"):
            lb.fire = fire_mlp_curves(enc, s.mlp_grid_points, fire_max_position, FIRE_INPUT_DISTANCES)
        report.layers.append(lb)
    return report


def _without_bias(report: BiasReport, enc0) -> BiasReport:
    """A report of a non-additive encoding: the RoPE kernel (rotary) or a note (NoPE); empty layers."""
    if report.kind == "rotary":
        report.kernel = rotary_kernel_curve(enc0, report.query_positions[-1])
        report.note = (
            "rotary encoding: no additive bias; the RoPE position kernel is given instead, with no per-head locality"
        )
    else:
        report.note = (
            f"{report.encoding} ({report.kind}) has no position bias and no kernel: order comes from the causal mask"
        )
    report.layers = [LayerBiases(layer=ly) for ly in range(report.n_layer)]
    return report


def _layer_curves(enc, layer: int, positions: list[int], classify_at: int) -> LayerBiases:
    """One layer's curves (and FIRE's input) at ``positions``, and its per-head locality at
    every position >= 1 and at ``classify_at``."""
    lb = LayerBiases(layer=layer)
    is_fire = hasattr(enc, "normalized_distance")
    two_sided = bool(getattr(enc, "bidirectional", False)) and isinstance(enc, ToeplitzBias)
    for i in sorted(set(positions) | {classify_at}):
        curve = bias_curve(enc, i)
        if i in positions and two_sided:  # keys after the query too: distances −i … −1 before 0 … i
            with torch.no_grad():
                after = enc.bias_by_distance(torch.arange(-i, 0, device=enc.device)).float().cpu().numpy()
            lb.curves[i] = np.concatenate([after, curve], axis=1)
            lb.curve_distances[i] = np.arange(-i, i + 1)
        elif i in positions:
            lb.curves[i] = curve
            if is_fire:
                lb.normalized_input[i] = fire_normalized_input(enc, i)
        if i >= 1:
            dist = np.arange(i + 1)
            lb.locality_by_query_position[i] = [classify_locality(dist, curve[h], i) for h in range(curve.shape[0])]
    lb.locality = lb.locality_by_query_position[classify_at]
    lb.locality_by_query_position = {i: v for i, v in lb.locality_by_query_position.items() if i in positions}
    return lb


def locality_table(reports: Sequence[BiasReport | dict]) -> list[dict]:
    """One row per (checkpoint, layer, head): checkpoint, encoding, layer, head, locality,
    rank_correlation, peak_distance (tokens), peak_fraction, bias_range (logits), query_position.

    Accepts ``BiasReport`` objects or their ``to_dict()``. Non-additive reports give no rows.
    """
    rows = []
    for rep in reports:
        d = rep.to_dict() if hasattr(rep, "to_dict") else rep
        for layer in d["layers"]:
            for h in layer.get("heads", []):
                rows.append(
                    {
                        "checkpoint": d.get("checkpoint"),
                        "encoding": d.get("encoding"),
                        "layer": layer["layer"],
                        "head": h["head"],
                        "locality": h["locality"],
                        "rank_correlation": h["rank_correlation"],
                        "peak_distance": h["peak_distance"],
                        "peak_fraction": h["peak_fraction"],
                        "bias_range": h["bias_range"],
                        "query_position": h["query_position"],
                    }
                )
    return rows


def locality_summary(reports: Sequence[BiasReport | dict]) -> list[dict]:
    """Per-checkpoint summary: checkpoint, encoding, kind, heads (count), n_local,
    n_anti_local, n_mixed, share_local, share_anti_local (fractions of heads, None when the
    encoding has no bias), classify_at (tokens)."""
    out = []
    for rep in reports:
        d = rep.to_dict() if hasattr(rep, "to_dict") else rep
        heads = [h["locality"] for layer in d["layers"] for h in layer.get("heads", [])]
        n = len(heads)
        counts = {c: heads.count(c) for c in LOCALITY_CLASSES}
        out.append(
            {
                "checkpoint": d.get("checkpoint"),
                "encoding": d.get("encoding"),
                "kind": d.get("kind"),
                "heads": n,
                "n_local": counts["local"],
                "n_anti_local": counts["anti-local"],
                "n_mixed": counts["mixed"],
                "share_local": counts["local"] / n if n else None,
                "share_anti_local": counts["anti-local"] / n if n else None,
                "classify_at": d.get("classify_at"),
            }
        )
    return out
