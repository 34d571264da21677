"""The built-in position encodings, one :class:`~fireviz.encodings.registry.EncodingSpec` each.

Each entry is the whole story of an encoding for the rest of fireviz: how it is built, its
options, its layer sharing, what it takes from the training length, and (for biases of
``i − j`` only) how it becomes a target of ``fireviz.fit.fitting`` — with the target builders here,
next to the spec they belong to.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fireviz.core import FileFormatError, as_float, read_json
from fireviz.encodings.alibi import ALiBi
from fireviz.encodings.fire import FIRE
from fireviz.encodings.kerple import KERPLE_MIN, KERPLE_POWER_MAX, KerpleLog, KerplePower
from fireviz.encodings.nope import NoPE
from fireviz.encodings.registry import EncodingSpec, FitParam, _plain, parse_numbers, register_encoding
from fireviz.encodings.rope import RotaryEmbedding
from fireviz.encodings.sandwich import Sandwich
from fireviz.encodings.t5 import T5RelativeBias


# -- builders --------------------------------------------------------------------------------------
def _rope_builder(kind: str | None):
    def build(num_heads: int, head_dim: int, **options) -> RotaryEmbedding:
        scaling = None
        if kind is not None:
            scaling = {"type": kind, "factor": float(options.get("rope_scaling_factor", 1.0))}
            if kind == "yarn":
                scaling["original_max_position_embeddings"] = options.get("original_max_position_embeddings")
                scaling["beta_fast"] = options.get("beta_fast", 32)
                scaling["beta_slow"] = options.get("beta_slow", 1)
        return RotaryEmbedding(num_heads, head_dim, rope_theta=options.get("rope_theta", 10000.0), rope_scaling=scaling)

    return build


def _heads_only(cls):
    return lambda num_heads, head_dim, **options: cls(num_heads, **options)


def _defaults(cls) -> dict:
    """The keyword defaults of ``cls.__init__`` (after num_heads): the options' values when unset."""
    import inspect

    return {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if k not in ("self", "num_heads") and p.default is not inspect.Parameter.empty
    }


_ROPE_DEFAULTS = {"rope_theta": 10000.0}


# -- fit targets (Theorem 3.1: FIRE can represent each of these) -----------------------------------
def per_head(value, num_heads: int, what: str) -> torch.Tensor:
    """A scalar or a list of ``num_heads`` numbers as float32 ``[num_heads]``.
    Raises: ValueError for another count."""
    t = torch.as_tensor(value, dtype=torch.float32).flatten()
    if t.numel() == 1:
        return t.expand(num_heads).clone()
    if t.numel() != num_heads:
        raise ValueError(f"{what} needs 1 or num_heads={num_heads} values (got {t.numel()})")
    return t


def t5_bucket_values(profile, num_buckets: int, num_heads: int, seed: int = 0) -> torch.Tensor:
    """Per-bucket T5 bias values, float32 ``[num_buckets, num_heads]`` (logits).

    ``profile``:
      * ``"random"``: a seeded draw N(0, 1) per bucket and head (torch.Generator(seed));
        the hardest case (an unstructured step function of distance).
      * ``"decay"``: ``v[b, h] = −4 · (h + 1)/num_heads · b/(num_buckets − 1)``: each head
        loses up to 4(h+1)/H logits linearly in the bucket id, the shape trained T5 biases
        tend to take (Raffel et al. 2020, §2.1 describe the buckets, not the values).
      * numbers: ``[num_buckets]`` (one profile for all heads) or ``[num_buckets, num_heads]``.
    Raises: ValueError for an unknown profile name, a wrong shape or non-finite values.
    """
    if isinstance(profile, str):
        if profile == "random":
            g = torch.Generator().manual_seed(int(seed))
            return torch.randn(num_buckets, num_heads, generator=g)
        if profile == "decay":
            b = torch.arange(num_buckets, dtype=torch.float32)[:, None] / (num_buckets - 1)
            h = torch.arange(1, num_heads + 1, dtype=torch.float32)[None, :] / num_heads
            return -4.0 * h * b
        raise ValueError(
            f"unknown T5 value profile {profile!r}; use 'random', 'decay' or a list of "
            f"{num_buckets} numbers (one per bucket)"
        )
    v = torch.as_tensor(profile, dtype=torch.float32)
    if v.dim() == 1 and v.numel() == num_buckets:
        v = v[:, None].expand(num_buckets, num_heads)
    if tuple(v.shape) != (num_buckets, num_heads):
        raise ValueError(
            f"T5 values must have shape [num_buckets={num_buckets}] or "
            f"[num_buckets, num_heads]=[{num_buckets}, {num_heads}] (got {tuple(v.shape)})"
        )
    if not torch.isfinite(v).all():
        raise ValueError("T5 values must be finite")
    return v.clone()


def _t5_target(num_heads: int, num_buckets=32, max_distance=128, values="random", seed=0):
    B, max_distance, seed = int(num_buckets), int(max_distance), int(seed)
    enc = T5RelativeBias(num_heads, num_buckets=B, max_distance=max_distance, bidirectional=False)  # validates
    v = t5_bucket_values(values, B, num_heads, seed)
    with torch.no_grad():
        enc.relative_attention_bias.copy_(v)
    shown = values if isinstance(values, str) else v.tolist()
    return enc.requires_grad_(False), {"num_buckets": B, "max_distance": max_distance, "values": shown, "seed": seed}


def _alibi_target(num_heads: int, slope=None):
    enc = ALiBi(num_heads, slope=None if slope is None else float(slope))
    return enc, {"slope": None if slope is None else float(slope), "slopes": enc.slopes.tolist()}


def _kerple_r(value, default_draw: torch.Tensor, num_heads: int, what: str, upper: float | None) -> torch.Tensor:
    r = default_draw if value is None else per_head(value, num_heads, what)
    if not torch.isfinite(r).all() or (r <= 0).any():
        raise ValueError(f"Kerple needs {what} > 0 for every head (got {r.tolist()}); e.g. {what}=0.5")
    if (r < KERPLE_MIN).any():
        raise ValueError(
            f"Kerple's reference code clamps {what} to >= {KERPLE_MIN} (got {r.tolist()}); "
            f"pass {what} >= {KERPLE_MIN} so the target is exactly what you asked for"
        )
    if upper is not None and (r > upper).any():
        raise ValueError(
            f"Kerple-power needs 0 < {what} <= {upper} (got {r.tolist()}); the kernel "
            "|d|^r2 is conditionally positive definite only there (Chi et al. 2022, §4.2)"
        )
    return r


def _kerple_target(cls, upper: float | None):
    def target(num_heads: int, r1=None, r2=None, seed=0):
        seed = int(seed)
        g = torch.Generator().manual_seed(seed)
        # the reference init's ranges (KERPLE's code; the classes' init_r1_max, init_r2_max): Kerple-log
        # r1 ~ U(0, 2), r2 ~ U(0, 1); Kerple-power r1 (the scale) ~ U(0, 1), r2 (the exponent) ~ U(0, 2)
        draw_r1 = (torch.rand(num_heads, generator=g) * cls.init_r1_max).clamp(min=KERPLE_MIN)
        draw_r2 = (torch.rand(num_heads, generator=g) * cls.init_r2_max).clamp(min=KERPLE_MIN)
        r1 = _kerple_r(r1, draw_r1, num_heads, "r1", None)
        r2 = _kerple_r(r2, draw_r2, num_heads, "r2", upper)
        enc = cls(num_heads, init_r1=r1.tolist(), init_r2=r2.tolist()).requires_grad_(False)
        return enc, {"r1": r1.tolist(), "r2": r2.tolist(), "seed": seed}

    return target


def _sandwich_target(num_heads: int, dbar=128):
    enc = Sandwich(num_heads, dbar=int(dbar))  # validates dbar
    return enc, {"dbar": int(dbar), "compression": enc.compression.tolist()}


# -- the fit targets' parameters (checked by fireviz.fit.targets.make_target, offered as `fit` flags
# and Fit FIRE widgets; the encodings then check their own domains: T5's max_distance against its
# buckets, a slope > 0, Kerple's r1, r2 >= 0.01, an even dbar) ------------------------------------
#: Largest ALiBi slope and Kerple r1 / r2 a target takes: a bias falling 10⁴ logits per token
#: (or per log-token) is one-hot attention long before; beyond float32 it would not even be finite.
MAX_TARGET_SCALE = 10_000
#: Most T5 buckets and largest T5 max_distance / Sandwich dbar a target takes (Sandwich's kernel
#: costs dbar/2 cosines per distance).
MAX_T5_BUCKETS = 1 << 14
MAX_T5_DISTANCE = 1 << 40
MAX_DBAR = 4096


def _t5_values(value):
    """T5 bucket values: "random" | "decay" | a list of finite numbers (per bucket) or of such lists (per bucket and head)."""
    value = _plain(value)
    if isinstance(value, str):
        return value  # the profile names are checked by t5_bucket_values
    hint = "give 'random', 'decay', one number per bucket, or per bucket a list of one per head"
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"values must be 'random', 'decay' or a non-empty list of numbers (got {value!r}); {hint}")
    return [
        [as_float(x, "T5 value", hint=hint) for x in v]
        if isinstance(v, (list, tuple))
        else as_float(v, "T5 value", hint=hint)
        for v in value
    ]


def _t5_values_text(text: str, what: str):
    """T5 bucket values as typed: random | decay | comma-separated numbers (one per bucket) | file.json."""
    if text in ("random", "decay"):
        return text
    if text.endswith(".json"):
        try:
            return read_json(Path(text))
        except FileFormatError as e:
            raise ValueError(f"{what}: cannot read {text} ({e}); give random, decay, numbers, or a JSON file") from None
    vals = parse_numbers(text, what)
    return [vals] if isinstance(vals, float) else vals


_T5_FIT = (
    FitParam("num_buckets", "number of buckets", "int", 32, lo=2, hi=MAX_T5_BUCKETS, url_key="buckets"),
    FitParam(
        "max_distance",
        "max distance in tokens, beyond which distances share the last bucket",
        "int",
        128,
        lo=2,
        hi=MAX_T5_DISTANCE,
        hint="tokens; distances beyond share the last bucket",
        url_key="max_distance",
    ),
    FitParam(
        "values",
        "bucket values in logits: random (seeded N(0, 1)), decay, numbers per bucket or file.json",
        "choice",
        "random",
        choices=("random", "decay"),
        cli_flag="t5-values",
        url_key="values",
        validate=_t5_values,
        parse=_t5_values_text,
    ),
    FitParam("seed", "seed of the random bucket values", "seed", 0, cli_flag="target-seed", url_key="tseed"),
)
_ALIBI_FIT = (
    FitParam(
        "slope",
        "slope in logits per token, one for every head (default: the standard per-head slopes 2^(−8h/H))",
        "float",
        None,
        hi=MAX_TARGET_SCALE,
        hint="omit it for the standard per-head slopes alibi_slopes(num_heads)",
        url_key="slope",
        step=0.01,
        unset=0.0,
    ),
)


def _kerple_fit(name: str, r2_help: str) -> tuple[FitParam, ...]:
    hint = f"{name} takes one number for every head or one per head"

    def scale(what: str, help: str) -> FitParam:
        return FitParam(what, help, "numbers", None, hi=MAX_TARGET_SCALE, hint=hint, url_key=what)

    return (
        scale("r1", "r1, one number or one per head (default: a seeded draw)"),
        scale("r2", r2_help),
        FitParam("seed", "seed of the r1, r2 draws", "seed", 0, cli_flag="target-seed", url_key="tseed"),
    )


_SANDWICH_FIT = (
    FitParam(
        "dbar",
        "d̄, dimension of the sinusoids (even)",
        "int",
        128,
        lo=2,
        hi=MAX_DBAR,
        hint="an even number, e.g. 128",
        url_key="dbar",
        step=2,
    ),
)

_FIRE_OPTIONS = frozenset(
    {
        "mlp_width",
        "init_c",
        "init_L",
        "eps",
        "progressive_interpolation",
        "log_transform",
        "learn_threshold",
        "mlp_depth",
        "normalizer_cap",
    }
)

BUILTIN_SPECS = (
    EncodingSpec(
        "nope", _heads_only(NoPE), sharing="static", summary="no position encoding (causal mask only)", kind="none"
    ),
    EncodingSpec(
        "rope",
        _rope_builder(None),
        frozenset({"rope_theta"}),
        "static",
        summary="rotary (RoFormer)",
        kind="rotary",
        defaults=dict(_ROPE_DEFAULTS),
    ),
    EncodingSpec(
        "rope_pi",
        _rope_builder("pi"),
        frozenset({"rope_theta", "rope_scaling_factor"}),
        "static",
        summary="rotary with position interpolation",
        kind="rotary",
        defaults={**_ROPE_DEFAULTS, "rope_scaling_factor": 1.0},
    ),
    EncodingSpec(
        "yarn",
        _rope_builder("yarn"),
        frozenset({"rope_theta", "rope_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow"}),
        "static",
        defaults_from_seq_len=lambda L: {"original_max_position_embeddings": L},
        summary="rotary with YaRN",
        kind="rotary",
        defaults={
            **_ROPE_DEFAULTS,
            "rope_scaling_factor": 1.0,
            "original_max_position_embeddings": None,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    ),
    EncodingSpec(
        "t5",
        _heads_only(T5RelativeBias),
        frozenset({"num_buckets", "max_distance", "bidirectional", "init_std"}),
        fit_params=_T5_FIT,
        fit_target=_t5_target,
        summary="T5 learned bucketed bias",
        defaults=_defaults(T5RelativeBias),
    ),
    EncodingSpec(
        "alibi",
        _heads_only(ALiBi),
        frozenset({"slope"}),
        "static",
        fit_params=_ALIBI_FIT,
        fit_target=_alibi_target,
        summary="ALiBi linear bias",
        defaults=_defaults(ALiBi),
    ),
    EncodingSpec(
        "kerple_log",
        _heads_only(KerpleLog),
        frozenset({"init_r1", "init_r2"}),
        fit_params=_kerple_fit("kerple_log", "r2, one number or one per head (default: a seeded draw)"),
        fit_target=_kerple_target(KerpleLog, None),
        summary="Kerple logarithmic",
        defaults=_defaults(KerpleLog),
    ),
    EncodingSpec(
        "kerple_power",
        _heads_only(KerplePower),
        frozenset({"init_r1", "init_r2", "reference_init"}),
        fit_params=_kerple_fit(
            "kerple_power",
            f"r2 (exponent, at most {KERPLE_POWER_MAX:g}), one number or one per head (default: a seeded draw)",
        ),
        fit_target=_kerple_target(KerplePower, KERPLE_POWER_MAX),
        summary="Kerple power",
        defaults=_defaults(KerplePower),
    ),
    EncodingSpec(
        "sandwich",
        _heads_only(Sandwich),
        frozenset({"dbar"}),
        "static",
        fit_params=_SANDWICH_FIT,
        fit_target=_sandwich_target,
        summary="Sandwich",
        defaults=_defaults(Sandwich),
    ),
    EncodingSpec(
        "fire",
        _heads_only(FIRE),
        _FIRE_OPTIONS,
        defaults_from_seq_len=lambda L: {"init_L": L / 4},
        normalizer=True,
        summary="FIRE, one MLP per layer",
        defaults=_defaults(FIRE),
    ),
    EncodingSpec(
        "fire_s",
        _heads_only(FIRE),
        _FIRE_OPTIONS,
        "shared",
        defaults_from_seq_len=lambda L: {"init_L": L / 4},
        normalizer=True,
        summary="FIRE-S, one MLP shared by all layers",
        defaults=_defaults(FIRE),
    ),
)

for _spec in BUILTIN_SPECS:
    register_encoding(_spec, replace=True)
