"""Fitting FIRE to other relative-position biases (Theorem 3.1 of the FIRE paper, made numerical)."""

from fireviz.fit.fitting import DEFAULT_LR, DEFAULT_STEPS, FitSettings, fit_fire, run_fit
from fireviz.fit.result import BEYOND_FACTOR
from fireviz.fit.targets import make_target, parse_numbers, target_names

__all__ = [
    "BEYOND_FACTOR",
    "DEFAULT_LR",
    "DEFAULT_STEPS",
    "FitSettings",
    "fit_fire",
    "make_target",
    "parse_numbers",
    "run_fit",
    "target_names",
]
