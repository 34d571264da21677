"""Evaluation: perplexity / bits per byte versus length, windows, scoring, intervals, the cache."""
