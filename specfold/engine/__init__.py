"""The engine: per-request state, the scheduler and the packed model call (SPEC §8)."""
