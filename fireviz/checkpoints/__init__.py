"""Checkpoints: find, describe and load fireviz checkpoints (local, bundled, Hub) and read published models' position encodings."""
