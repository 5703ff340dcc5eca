"""``onnxruntime.capi`` for the shim: the exception module suites import."""

from . import onnxruntime_pybind11_state  # noqa: F401
