"""onnxruntime's ``capi`` names, so that ``from onnxruntime.capi... import ...`` lines keep
working after ``onnxruntime`` is replaced by ``runtime_core``.

Only :mod:`.onnxruntime_pybind11_state` (the exception classes) lives here; the errors of
:mod:`runtime_core.errors` subclass them.
"""

from . import onnxruntime_pybind11_state

__all__ = ["onnxruntime_pybind11_state"]
