"""Verifiers: turn a batch of branch states into logits (dense; folded in fold.py)."""
