"""OpenCL op implementations, imported by name (registration is explicit, per module)."""

from . import elementwise, layout, linalg, nn  # noqa: F401
