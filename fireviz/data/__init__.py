"""Text in, tokens out: bundled corpora, the train/validation split, training windows, synthetic tasks."""
