"""``import onnxruntime`` resolved to runtime_core, for running onnxruntime code unchanged on
runtime-core: put ``tests/shim`` first on ``PYTHONPATH``. Used by the user scripts of
``tests/dropin`` and by the third-party suites of ``tests/compat`` (skl2onnx, onnxmltools).
Test-only; never installed.

``onnxruntime.X`` is ``runtime_core.X`` where runtime_core has it (an AttributeError or
ImportError where it has not, as a user would see); ``onnxruntime.sub.module`` is
``runtime_core.sub.module`` (the exception classes of ``onnxruntime.capi.onnxruntime_pybind11_state``
included). Only ``__version__`` differs: the onnxruntime API level runtime_core follows, since
suites gate tests on it and must pick the same tests as with the onnxruntime they are compared
against."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from importlib import metadata

import runtime_core
from runtime_core import *  # noqa: F403 - the shim is runtime_core under onnxruntime's name

_PREFIX = __name__ + "."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``onnxruntime.X`` as the already imported (or importable) ``runtime_core.X``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        try:
            found = importlib.util.find_spec("runtime_core." + fullname[len(_PREFIX):])
        except ImportError:
            return None
        if found is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self,
                                              is_package=found.submodule_search_locations is not None)
        spec.loader_state = found.name
        return spec

    def create_module(self, spec):
        module = importlib.import_module(spec.loader_state)
        spec.loader_state = (module.__spec__, module.__loader__)
        return module

    def exec_module(self, module):
        # the import system stamped the alias's spec on the real module: give it its own back
        module.__spec__, module.__loader__ = module.__spec__.loader_state


def __getattr__(name):
    # names runtime_core does not list in __all__ (its submodules among them) resolve there too
    return getattr(runtime_core, name)


def _api_level() -> str:
    # the installed onnxruntime's version where there is one: the oracle a run is compared with
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return "1.32.0"


sys.meta_path.insert(0, _Alias())
__version__ = _api_level()
