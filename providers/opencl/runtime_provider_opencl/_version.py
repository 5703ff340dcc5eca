"""Single source of the runtime-provider-opencl package version."""

__version__ = "0.1.0"
