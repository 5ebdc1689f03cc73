"""Placeholder: the fast engine is being written (owned by the engine engineer)."""
