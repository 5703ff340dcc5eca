"""runtime-provider-numexpr: elementwise chains fused into single numexpr programs.

An example third-party execution provider for runtime-core, shipped as its own
distribution. See ``plugin.py`` for the provider class, ``ops.py`` for the ops it
takes and ``fusion.py`` for how a partition becomes numexpr programs.
"""

from ._version import __version__
from .plugin import NumexprExecutionProvider

__all__ = ["NumexprExecutionProvider", "__version__"]
