"""The version of runtime-provider-numexpr (the one place it is written)."""

__version__ = "0.1.0"
