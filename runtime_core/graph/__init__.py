"""Model loading and the core's graph representation."""

from .ir import Graph, Node
from .loader import load_model

__all__ = ["Graph", "Node", "load_model"]
