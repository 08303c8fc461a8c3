"""Decoding: unmask rules, the one advance loop, draft policies, verifiers, and the method registry."""
