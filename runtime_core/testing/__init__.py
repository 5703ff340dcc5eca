"""The toolkit for provider authors: the conformance kit and the package scaffold.

* :class:`ConformanceKit` checks any installed provider against the plugin contract
  and the ONNX backend node cases (see :mod:`runtime_core.testing.kit`);
* the pytest plugin (registered as ``runtime_core`` in the ``pytest11`` group) adds
  ``pytest --runtime-provider NAME``; :class:`runtime_core.testing.suite.ProviderConformance`
  is the same suite as a class to subclass in a provider's own tests;
* :func:`runtime_core.testing.scaffold.new_provider` (``runtime-core new-provider``)
  writes a complete provider package that passes the kit out of the box.

Importing this package is cheap and does not import pytest.
"""

from __future__ import annotations

from .compare import DEFAULT_TOLERANCES, Mismatch, assert_same
from .kit import CaseResult, ConformanceFailure, ConformanceKit, ScanEntry

__all__ = [
    "DEFAULT_TOLERANCES",
    "CaseResult",
    "ConformanceFailure",
    "ConformanceKit",
    "Mismatch",
    "ScanEntry",
    "assert_same",
]
