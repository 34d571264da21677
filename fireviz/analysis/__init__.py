"""Analysis of learned biases and of attention on text: curves, locality, dilution."""
