"""Model folders with the file layout ``transformers`` writes (config fields, tensor names), for the
published-model tests (tests/checkpoints/test_hub.py), the documented commands' loopback Hub
(tests/project/test_readme_commands.py) and benchmarks/hub_fetch.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def t5_folder(
    path: Path,
    model_type: str = "t5",
    layers: int = 2,
    dec_layers: int = 3,
    heads: int = 4,
    buckets: int = 32,
    max_distance: int = 128,
    d_model: int = 64,
    vocab: int = 300,
    shards: int = 1,
    seed: int = 0,
    encoder_attention_type: str | None = None,
) -> Path:
    """A T5/mT5/UMT5/LongT5 folder as ``save_pretrained`` writes it (config fields, tensor names)."""
    g = torch.Generator().manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": model_type,
        "d_model": d_model,
        "d_kv": d_model // heads,
        "d_ff": 4 * d_model,
        "num_layers": layers,
        "num_decoder_layers": dec_layers,
        "num_heads": heads,
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": max_distance,
        "vocab_size": vocab,
        "is_encoder_decoder": True,
        "feed_forward_proj": "relu",
        "n_positions": 512,
        "torch_dtype": "float32",
    }
    if encoder_attention_type:
        cfg["encoder_attention_type"] = encoder_attention_type
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    t = {
        "shared.weight": torch.randn(vocab, d_model, generator=g),
        "lm_head.weight": torch.randn(vocab, d_model, generator=g),
    }
    for stack, n in (("encoder", layers), ("decoder", dec_layers)):
        for i in range(n):
            attn = "SelfAttention"
            if model_type == "longt5" and stack == "encoder":
                attn = (
                    "TransientGlobalSelfAttention"
                    if encoder_attention_type == "transient-global"
                    else "LocalSelfAttention"
                )
            pre = f"{stack}.block.{i}.layer.0.{attn}"
            for w in "qkvo":
                t[f"{pre}.{w}.weight"] = torch.randn(d_model, d_model, generator=g)
            if i == 0 or model_type == "umt5":
                t[f"{pre}.relative_attention_bias.weight"] = torch.randn(buckets, heads, generator=g)
            t[f"{stack}.block.{i}.layer.0.layer_norm.weight"] = torch.ones(d_model)
            ff = 2 if stack == "decoder" else 1
            t[f"{stack}.block.{i}.layer.{ff}.DenseReluDense.wi.weight"] = torch.randn(4 * d_model, d_model, generator=g)
            t[f"{stack}.block.{i}.layer.{ff}.DenseReluDense.wo.weight"] = torch.randn(d_model, 4 * d_model, generator=g)
        t[f"{stack}.final_layer_norm.weight"] = torch.ones(d_model)
    names = sorted(t)
    if shards == 1:
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        wmap = {}
        for s in range(shards):
            part = names[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: t[k] for k in part}, str(path / fname), metadata={"format": "pt"})
            wmap.update({k: fname for k in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return path
