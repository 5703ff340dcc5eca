"""runtime-provider-cuda: the CUDA execution provider of runtime-core, on CuPy.

Importing this package is cheap: cupy is imported only by ``probe()`` and by a
provider instance. See :mod:`runtime_provider_cuda.plugin`.
"""

from ._version import __version__

__all__ = ["__version__"]
