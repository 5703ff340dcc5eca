"""The ORT-compatible session API."""

from .options import ExecutionMode, GraphOptimizationLevel, RunOptions, SessionOptions
from .session import InferenceSession, ModelMetadata, NodeArg, ProviderFallbackWarning

__all__ = ["ExecutionMode", "GraphOptimizationLevel", "InferenceSession", "ModelMetadata",
           "NodeArg", "ProviderFallbackWarning", "RunOptions", "SessionOptions"]
