"""The GPT decoder and its attention: config, the model, attention paths (SDPA, compiled backward, FlexAttention), captured attention, the checked safetensors state."""
