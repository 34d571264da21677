"""Shared foundations below every stage: argument checks, atomic files and hashing, compiled-kernel loading, reused scratch memory, memory estimates, torch.distributed plumbing."""
