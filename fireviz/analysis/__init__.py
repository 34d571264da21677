"""Analysis of learned biases and of attention on text: curves, locality, dilution."""

from fireviz.analysis.biases import BiasSettings, locality_table, parse_positions, run_bias_report
from fireviz.analysis.dilution_settings import DEFAULT_NEAR, DilutionSettings
from fireviz.analysis.text_attention import attention_dilution, text_tokens

__all__ = [
    "BiasSettings",
    "DEFAULT_NEAR",
    "DilutionSettings",
    "attention_dilution",
    "locality_table",
    "parse_positions",
    "run_bias_report",
    "text_tokens",
]
