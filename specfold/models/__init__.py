"""Model side of specfold: family spec table, checkpoint loading, the native transformer."""
from specfold.models.spec import ModelSpec, resolve_spec
from specfold.models.transformer import Transformer
from specfold.models.cache import PrefixCache

__all__ = ["ModelSpec", "resolve_spec", "Transformer", "PrefixCache"]
