"""Single source of the runtime-provider-cpu package version."""

__version__ = "0.1.0"
