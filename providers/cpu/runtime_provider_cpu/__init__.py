"""runtime-provider-cpu: the numpy execution provider of runtime-core.

Importing this package is cheap; kernels load with ``runtime_provider_cpu.plugin``.
"""

from ._version import __version__

__all__ = ["__version__"]
