"""Training: settings, the loop, its step, schedule and resumable state."""
