"""Tiny random published causal LMs written by ``transformers`` itself, each with a BPE tokenizer
the tests train on bundled text (no internet): Llama (with or without BOS, RoPE scaling types),
GPT-NeoX with partial rotary, Mistral with a sliding window, BLOOM (ALiBi), GPT-2 (learned positions)."""

from __future__ import annotations

from pathlib import Path

import torch

from fireviz.data import load_documents
from fireviz.data.tokenizers import train_bpe

VOCAB = 300


def save_tokenizer(folder: Path, add_bos: bool = True) -> None:
    """A byte-level BPE tokenizer (vocab 300, <s> = 0, </s> = 1) trained on 30 bundled prose documents
    by ``fireviz.data.tokenizers.train_bpe``, saved into ``folder`` (BOS added when ``add_bos``)."""
    train_bpe(load_documents("prose")[:30], VOCAB, folder, add_bos=add_bos)


def write_causal_lm(folder: Path, kind: str = "llama", seed: int = 0, add_bos: bool = True, **config) -> Path:
    """A tiny random ``kind`` model (llama, neox, mistral, bloom, gptneo, gptj, gpt2) saved as safetensors with
    its tokenizer into ``folder``; ``config`` overrides the model config's fields."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=config.pop("vocab_size", VOCAB), bos_token_id=0, eos_token_id=1)
    # the shape the Llama family shares (NeoX: no key-value heads of its own)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    shape.update(max_position_embeddings=64, **common)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **shape, **config))
    elif kind == "neox":
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(rotary_pct=0.25, **shape, **config))
    elif kind == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=2, sliding_window=16, **shape, **config))
    elif kind == "bloom":
        cfg = tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **common, **config)
        model = tf.BloomForCausalLM(cfg)
    elif kind == "gptneo":  # learned absolute positions, like GPT-2
        cfg = tf.GPTNeoConfig(
            hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global"], 2]], max_position_embeddings=64,
            **common, **config,
        )  # fmt: skip
        model = tf.GPTNeoForCausalLM(cfg)
    elif kind == "gptj":  # rotary, with its sin/cos table built once for n_positions
        cfg = tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, **common, **config)
        model = tf.GPTJForCausalLM(cfg)
    elif kind == "phi3":  # LongRoPE: its own short and long factors, original length 32
        cfg = tf.Phi3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=128, original_max_position_embeddings=32, pad_token_id=0,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0, 2.0, 4.0, 8.0],
                          "original_max_position_embeddings": 32},
            **common, **config,
        )  # fmt: skip
        model = tf.Phi3ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common, **config)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(kind)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder, add_bos=add_bos)
    return folder


def write_gguf(path: Path, llama_folder: Path) -> Path:
    """The tiny Llama of ``llama_folder`` (``write_causal_lm(..., "llama")``) as one float32 GGUF
    file, as llama.cpp's converter writes it: its tensor names, q/k rows permuted for its RoPE,
    the config and the BPE tokenizer in the metadata."""
    import json

    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((llama_folder / "config.json").read_text())
    tok = json.loads((llama_folder / "tokenizer.json").read_text())
    state = load_file(str(llama_folder / "model.safetensors"))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def permute(w, n):  # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_rope_freq_base(float((cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv_: kv_[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in ("<s>", "</s>") else 1 for t, _ in vocab])
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if "lm_head.weight" in state:
        names["lm_head.weight"] = "output.weight"
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        t = state[hf].float().numpy()
        if ".attn_q." in gg:
            t = permute(t, heads)
        elif ".attn_k." in gg:
            t = permute(t, kv)
        w.add_tensor(gg, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
