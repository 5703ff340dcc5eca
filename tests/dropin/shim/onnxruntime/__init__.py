"""A stand-in ``onnxruntime`` package that is runtime_core: put this folder first on
PYTHONPATH and an onnxruntime script runs on runtime-core unchanged (tests/dropin).

``import onnxruntime`` gives ``runtime_core``; ``onnxruntime.X`` is ``runtime_core.X`` where
runtime_core has it (and an ImportError where it has not, as a user would see)."""

import importlib
import importlib.abc
import importlib.util
import sys

import runtime_core
import runtime_core.capi.onnxruntime_pybind11_state

_PREFIX = __name__ + "."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``onnxruntime.X`` as the already imported (or importable) ``runtime_core.X``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        real = "runtime_core." + fullname[len(_PREFIX):]
        try:
            found = importlib.util.find_spec(real)
        except ImportError:
            return None
        return importlib.util.spec_from_loader(fullname, self) if found is not None else None

    def create_module(self, spec):
        return importlib.import_module("runtime_core." + spec.name[len(_PREFIX):])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = runtime_core
sys.modules[_PREFIX + "capi"] = runtime_core.capi
sys.modules[_PREFIX + "capi.onnxruntime_pybind11_state"] = runtime_core.capi.onnxruntime_pybind11_state
