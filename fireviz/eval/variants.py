"""A checkpoint as evaluated: zero-shot RoPE scaling (PI, YaRN) and FIRE's normalizer cap.

``rope_scaled_model`` rebuilds a RoPE checkpoint as RoPE-PI (Chen et al. 2023) or YaRN (Peng
et al. 2023) with the factor length / training length, on the same weights;
``apply_normalizer_cap`` evaluates FIRE with ψ(min(max(L, i), N)).
"""

from __future__ import annotations

from fireviz.encodings import check_normalizer_cap, fire_modules
from fireviz.eval.windows import EvaluationError
from fireviz.model import GPT, GPTConfig, load_state_checked

#: zero-shot RoPE extensions evaluate can apply
ROPE_SCALINGS = ("pi", "yarn")


def rope_scaled_model(model: GPT, scaling: str, length: int) -> tuple[GPT, dict]:
    """The same RoPE weights with zero-shot PI (Chen et al. 2023) or YaRN (Peng et al. 2023).

    Factor ``s = max(1, length / seq_len)``; ``"pi"`` builds ``rope_pi`` with
    ``rope_scaling_factor = s``; ``"yarn"`` builds ``yarn`` with the same factor and
    ``original_max_position_embeddings = seq_len`` (its attention factor scales q and k
    once each). RoPE has no encoding parameters, so the state dict loads unchanged.

    Returns: ``(model in eval mode on the same device, {"position_encoding", "encoding_options"})``.
    Raises: EvaluationError if ``model`` is not a plain-RoPE checkpoint or ``scaling`` is unknown.
    """
    cfg = model.config
    if scaling not in ROPE_SCALINGS:
        raise EvaluationError(f"rope_scaling must be one of {', '.join(ROPE_SCALINGS)} or None (got {scaling!r})")
    if cfg.position_encoding != "rope":
        raise EvaluationError(
            f"rope_scaling={scaling!r} needs a RoPE checkpoint; this one uses "
            f"position_encoding={cfg.position_encoding!r}"
        )
    factor = max(1.0, length / cfg.seq_len)
    opts = {k: v for k, v in cfg.encoding_options.items() if k == "rope_theta"}
    opts["rope_scaling_factor"] = factor
    name = "rope_pi" if scaling == "pi" else "yarn"
    if name == "yarn":
        opts["original_max_position_embeddings"] = cfg.seq_len
    fields_ = {k: getattr(cfg, k) for k in GPTConfig.__dataclass_fields__}
    fields_.update(position_encoding=name, encoding_options=opts)
    device = next(model.parameters()).device
    scaled = GPT(GPTConfig(**fields_))  # fresh init is overwritten by the checkpoint's weights
    load_state_checked(
        scaled, {k: v.to("cpu") for k, v in model.state_dict().items()}, source="the RoPE checkpoint's weights"
    )
    scaled.to(device)
    return scaled.eval(), {"position_encoding": name, "encoding_options": opts}


def apply_normalizer_cap(model: GPT, cap: int | None) -> int | None:
    """Set FIRE's normalizer cap ψ(min(max(L, i), cap)) (tokens) on every FIRE module of ``model``.

    Returns: the cap in effect — ``cap`` for a FIRE/FIRE-S checkpoint, None for any other
      (its bias has no normalizer, so its numbers are the uncapped ones). ``cap=None``
      restores the checkpoint's own setting.
    Raises: EvaluationError for a cap that is not an integer >= 1.
    """
    try:
        cap = check_normalizer_cap(cap)
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    modules = fire_modules(model)
    if not modules:
        return None
    own = model.config.encoding_options.get("normalizer_cap")
    for m in modules:
        m.normalizer_cap = float(cap) if cap is not None else (None if own is None else float(own))
    return cap
