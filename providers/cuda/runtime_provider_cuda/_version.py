"""The single source of runtime-provider-cuda's version."""

__version__ = "0.1.0"
