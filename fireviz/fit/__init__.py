"""Fitting FIRE to other relative-position biases (Theorem 3.1 of the FIRE paper, made numerical)."""
