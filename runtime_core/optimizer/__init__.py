"""Graph optimization levels and passes (ORT's meaning of each level)."""

from .pipeline import OPTIMIZERS, optimize

__all__ = ["OPTIMIZERS", "optimize"]
