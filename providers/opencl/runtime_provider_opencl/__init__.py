"""The OpenCL execution provider of runtime-core.

Importing this package is cheap: pyopencl is imported by ``probe()`` and on first
use of a device, never at import time. The provider class is
:class:`runtime_provider_opencl.plugin.OpenCLExecutionProvider`; device tensors are
:class:`runtime_provider_opencl.tensor.OpenCLTensor`.
"""

from ._version import __version__

__all__ = ["__version__"]
