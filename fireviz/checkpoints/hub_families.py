"""Published models' position encodings from their config.json: the families fireviz reads.

``build_published(cfg, src, read, stack)`` turns a transformers config.json (and, for
T5-family models, the bias tables that ``read`` fetches) into a :class:`PublishedModel`;
``fireviz.checkpoints.hub`` finds the files (a folder or the Hub, ranged reads, its cache) and
``fireviz.checkpoints.hub_rope`` computes RoPE frequencies. Every size read is bounded and every field
type-checked: a malformed config raises :class:`HubModelError`.


Families and their semantics (as the original implementations compute them):

* **T5, mT5, ByT5, Flan-T5, LongT5** (``model_type`` t5 / mt5 / longt5): one learned table
  ``[num_buckets, heads]`` in block 0 of each stack, shared by all its layers; **UMT5**
  (umt5): one table per layer. Buckets: ``relative_position_bucket`` (Raffel et al. 2020
  §2.1; HF ``T5Attention._relative_position_bucket``), bidirectional in the encoder, causal
  in the decoder; ``stack`` picks one (default decoder). The encoder's bias covers keys after
  the query too (``bidirectional``).
* **ALiBi**: BLOOM and Falcon with ``alibi: true`` (Press et al. 2022 slopes, BLOOM's
  ``build_alibi_tensor``), MPT with ``attn_config.alibi`` (MPT's ``gen_slopes`` with
  ``alibi_bias_max``). Shown as ``−m_h·(i − j)``; BLOOM adds ``m_h·j``, which differs by a
  per-query constant that softmax removes.
* **RoPE** (Llama, Mistral, Qwen, Gemma, Phi, GPT-NeoX, Falcon without ALiBi, …):
  ``rope_theta``, ``partial_rotary_factor`` (``rotary_pct``), ``head_dim``, and
  ``rope_scaling`` / ``rope_parameters`` of type default, linear, dynamic, yarn, llama3 or
  longrope, with frequencies as Hugging Face's ``ROPE_INIT_FUNCTIONS`` define them (dynamic
  NTK shown at ``factor × max_position_embeddings``; longrope with its long factors). The
  view is fireviz's RoPE position kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from fireviz.checkpoints.hub_config import MAX_HEADS, MAX_LAYERS, HubModelError, config_int, config_number
from fireviz.checkpoints.hub_rope import rope_frequencies
from fireviz.encodings import ALiBi, T5RelativeBias, alibi_slopes
from fireviz.encodings.rope import RotaryEmbedding

STACKS = ("decoder", "encoder")
T5_TYPES = ("t5", "mt5", "longt5", "umt5")
ROPE_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "gpt_neox",
    "falcon",
    "stablelm",
    "olmo",
    "olmo2",
    "cohere",
    "starcoder2",
    "granite",
    "deepseek_v3",
    "internlm2",
    "exaone",
)
ABSOLUTE_TYPES = (
    "gpt2",
    "gpt_neo",
    "opt",
    "bert",
    "roberta",
    "distilbert",
    "xglm",
    "bart",
    "mbart",
    "whisper",
    "biogpt",
    "codegen_abs",
)
#: Longest training length used for the default view (query positions m·seq_len − 1).
MAX_VIEW_SEQ_LEN = 16384


@dataclass
class PublishedConfig:
    """What the analysis needs of a published model (the ``GPTConfig`` fields it reads).

    Attributes: n_layer, n_head; seq_len (training context in tokens, for the default view;
      at most ``MAX_VIEW_SEQ_LEN``); position_encoding ("t5", "alibi" or "rope"); family
      (e.g. "T5 (shared table)", "UMT5", "BLOOM", "MPT", "Llama"); model_type; source (repo id
      or folder); revision (commit sha, or None for a folder); stack ("decoder"/"encoder" for
      T5-family models, else None); rope (the RoPE settings used, for RoPE models).
    """

    n_layer: int
    n_head: int
    seq_len: int
    position_encoding: str
    family: str
    model_type: str
    source: str
    revision: str | None = None
    stack: str | None = None
    rope: dict = field(default_factory=dict)


class PublishedModel(nn.Module):
    """A published model's position encodings, with the interface fireviz's analysis reads:
    ``config`` (a :class:`PublishedConfig`) and ``encoding(layer)``. No other weights."""

    bytes_read: int  # weight-file bytes read to build it (set by ``hub.load_published``)
    causal_lm: bool = False  # config.json names a …ForCausalLM architecture (set by ``hub.load_published``)

    def __init__(self, config: PublishedConfig, encodings: Sequence[nn.Module]):
        super().__init__()
        self.config = config
        self.encodings = nn.ModuleList(encodings)

    def encoding(self, layer: int) -> nn.Module:
        """The position encoding of ``layer`` (a shared table repeats)."""
        return self.encodings[layer if len(self.encodings) > 1 else 0]

    @property
    def label(self) -> str:
        """``source (family[, stack])`` for legends and captions."""
        stack = f", {self.config.stack}" if self.config.stack else ""
        rev = f" @ {self.config.revision[:10]}" if self.config.revision else ""
        return f"{self.config.source}{rev} ({self.config.family}{stack})"


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8.0) -> torch.Tensor:
    """MPT's ALiBi slopes (``gen_slopes`` of mosaicml llm-foundry / HF ``modeling_mpt``):
    with H' = 2^⌈log2 H⌉, m = 1/2^(k·max/H') for k = 1..H'; for H' ≠ H the odd-indexed then
    even-indexed slopes, first H. Returns float32 ``[num_heads]``."""
    if not (math.isfinite(alibi_bias_max) and alibi_bias_max > 0):
        raise HubModelError(f"MPT alibi_bias_max must be a finite number > 0 (got {alibi_bias_max})")
    hp = 2 ** math.ceil(math.log2(num_heads))
    m = torch.arange(1, hp + 1, dtype=torch.float64) * (float(alibi_bias_max) / hp)
    slopes = 1.0 / torch.pow(2.0, m)
    if hp != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes.float()


def _t5(cfg: dict, src, read, stack: str, model_type: str) -> PublishedModel:
    if stack not in STACKS:
        raise HubModelError(f"stack must be one of {', '.join(STACKS)} (got {stack!r})")
    heads = config_int(cfg, "num_heads", hi=MAX_HEADS)
    layers = (
        config_int(cfg, "num_decoder_layers", "num_layers", hi=MAX_LAYERS)
        if stack == "decoder"
        else config_int(cfg, "num_layers", hi=MAX_LAYERS)
    )
    buckets = config_int(cfg, "relative_attention_num_buckets", default=32, lo=2, hi=1 << 16)
    max_distance = config_int(cfg, "relative_attention_max_distance", default=128, lo=2)
    per_layer = model_type == "umt5"
    attn = "SelfAttention"
    if model_type == "longt5" and stack == "encoder":
        attn = (
            "TransientGlobalSelfAttention"
            if cfg.get("encoder_attention_type") == "transient-global"
            else "LocalSelfAttention"
        )
    names = [
        f"{stack}.block.{i}.layer.0.{attn}.relative_attention_bias.weight"
        for i in (range(layers) if per_layer else [0])
    ]
    tensors = read(names)
    encs = []
    for n in names:
        t = tensors[n]
        if tuple(t.shape) != (buckets, heads):
            raise HubModelError(
                f"{src.source}: {n} has shape {tuple(t.shape)}, not [num_buckets={buckets}, "
                f"num_heads={heads}] as config.json says"
            )
        e = T5RelativeBias(heads, num_buckets=buckets, max_distance=max_distance, bidirectional=(stack == "encoder"))
        with torch.no_grad():
            e.relative_attention_bias.copy_(t)
        encs.append(e.requires_grad_(False))
    family = {"t5": "T5", "mt5": "mT5", "longt5": "LongT5", "umt5": "UMT5"}[model_type]
    family += " (one table per layer)" if per_layer else " (one table shared by all layers)"
    if model_type == "longt5" and stack == "encoder":  # its encoder attends within a local window only
        radius = config_int(cfg, "local_radius", default=127)
        family += (
            f"; encoder attention is local (keys within ±{radius} tokens"
            + (", plus transient global tokens" if attn.startswith("Transient") else "")
            + "): the bias beyond that distance is never used"
        )
    seq = min(config_int(cfg, "n_positions", default=512), MAX_VIEW_SEQ_LEN)
    return PublishedModel(
        PublishedConfig(layers, heads, seq, "t5", family, model_type, src.source, src.revision, stack), encs
    )


def _alibi(cfg: dict, src, family: str, slopes: torch.Tensor, layers: int, seq: int) -> PublishedModel:
    e = ALiBi(len(slopes))
    e.slopes = slopes.float()
    return PublishedModel(
        PublishedConfig(
            layers,
            len(slopes),
            min(seq, MAX_VIEW_SEQ_LEN),
            "alibi",
            family,
            str(cfg["model_type"]),
            src.source,
            src.revision,
        ),
        [e],
    )


def _rope(cfg: dict, src, family: str) -> PublishedModel:

    inv, att, settings = rope_frequencies(cfg)
    heads = config_int(cfg, "num_attention_heads", "n_head", "num_heads", hi=MAX_HEADS)
    layers = config_int(cfg, "num_hidden_layers", "n_layer", "num_layers", hi=MAX_LAYERS)
    e = RotaryEmbedding(heads, settings["rotary_dim"])
    e.inv_freq = inv
    e.attention_factor = att
    seq = min(int(settings["original_max_position_embeddings"]), MAX_VIEW_SEQ_LEN)
    return PublishedModel(
        PublishedConfig(
            layers, heads, seq, "rope", family, str(cfg["model_type"]), src.source, src.revision, rope=settings
        ),
        [e],
    )


def build_published(cfg: dict, src, read, stack: str) -> PublishedModel:
    """The :class:`PublishedModel` a transformers ``cfg`` (config.json) describes.

    Args: ``src`` where the files come from (its ``source`` and ``revision`` are recorded);
      ``read(names)`` returns the named weight tensors (T5-family bias tables only);
      ``stack`` "decoder" or "encoder" (T5-family models).
    Raises: HubModelError for an architecture fireviz does not read, one without a relative
      position encoding (learned absolute positions), or a bad config field or tensor.
    """
    mt = str(cfg.get("model_type", "")).lower()
    if mt in T5_TYPES:
        return _t5(cfg, src, read, stack, mt)
    for k in ("alibi",):
        if k in cfg and not isinstance(cfg[k], bool):
            raise HubModelError(f"config.json field alibi must be true or false (got {str(cfg[k])[:20]!r})")
    if mt == "bloom":
        h = config_int(cfg, "n_head", "num_attention_heads", hi=MAX_HEADS)
        return _alibi(
            cfg,
            src,
            "BLOOM",
            alibi_slopes(h),
            config_int(cfg, "n_layer", "num_hidden_layers", hi=MAX_LAYERS),
            config_int(cfg, "seq_length", "max_position_embeddings", default=2048),
        )
    if mt == "mpt":
        ac = cfg["attn_config"] if isinstance(cfg.get("attn_config"), dict) else {}
        if "alibi" in ac and not isinstance(ac["alibi"], bool):
            raise HubModelError("config.json field attn_config.alibi must be true or false")
        if not ac.get("alibi"):
            raise HubModelError(
                f"{src.source}: this MPT model has attn_config.alibi false (learned absolute "
                "positions): no relative position bias to show"
            )
        h = config_int(cfg, "n_heads", "num_attention_heads", hi=MAX_HEADS)
        return _alibi(
            cfg,
            src,
            "MPT",
            mpt_alibi_slopes(h, config_number(ac, "alibi_bias_max", 8.0, where="attn_config")),
            config_int(cfg, "n_layers", "num_hidden_layers", hi=MAX_LAYERS),
            config_int(cfg, "max_seq_len", default=2048),
        )
    if mt in ("falcon", "refinedweb", "refinedwebmodel") and cfg.get("alibi"):
        h = config_int(cfg, "num_attention_heads", "n_head", hi=MAX_HEADS)
        return _alibi(
            cfg,
            src,
            "Falcon (ALiBi)",
            alibi_slopes(h),
            config_int(cfg, "num_hidden_layers", "n_layer", hi=MAX_LAYERS),
            config_int(cfg, "max_position_embeddings", default=2048),
        )
    if mt in ABSOLUTE_TYPES:
        raise HubModelError(
            f"{src.source} is a {mt} model with learned absolute position embeddings: it has no "
            "relative position bias or rotary kernel to show"
        )
    if mt in ROPE_TYPES or any(k in cfg for k in ("rope_theta", "rope_scaling", "rope_parameters", "rotary_emb_base")):
        return _rope(cfg, src, mt.replace("_", "-").title().replace("-", " ") or "RoPE")
    raise HubModelError(
        f"{src.source}: model_type {mt or '(none)'!r} is not an architecture fireviz reads; it reads "
        "T5/mT5/ByT5/UMT5/LongT5, BLOOM, MPT and Falcon (ALiBi), and RoPE models (Llama, Mistral, "
        "Qwen, Gemma, Phi, …)"
    )
