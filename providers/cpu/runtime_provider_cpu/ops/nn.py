"""The compiled extension under the names ``plugin.py`` and ``ops/ml.py`` import from here.

The nn kernels live by family (``matmul``, ``conv``, ``pool``, ``norm``, ``softmax``,
``dropout``, ``resize``, ``roi``, ...) and their fast paths in ``runtime_provider_cpu.fast``;
which compiled kernels run is the installed policy's (``fast/policy.py``).
"""

from __future__ import annotations

from ..fast.policy import NATIVE as _native  # noqa: F401 - None in a build without a C compiler
from ..fast.policy import NATIVE_ERROR  # noqa: F401
