"""Single source of the runtime-core package version."""

__version__ = "0.1.0"
