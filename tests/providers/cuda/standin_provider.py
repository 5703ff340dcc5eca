"""A test-only provider: the CUDA provider's code on the numpy stand-in for cupy.

``CUDAStandInExecutionProvider`` is the real :class:`CUDAExecutionProvider` (capability,
executable, fusion, fast paths, copies, OrtValue support) with its back end swapped for
:class:`~runtime_provider_cuda.standin.StandInBackend`. It is registered only by the tests
(:func:`register`), under its own name and device type, so it can never pass for CUDA.
"""

from __future__ import annotations

from importlib import metadata

from runtime_core.plugin import ENTRY_POINT_GROUP, ProbeResult, hookimpl, reload_plugins
from runtime_provider_cuda.plugin import CUDAExecutionProvider
from runtime_provider_cuda.standin import StandInBackend


class StandInCUDAProvider(CUDAExecutionProvider):
    name = "CUDAStandInExecutionProvider"
    alias = "cudastandin"
    distribution = "tests"
    device_type = "cudastandin"
    dlpack_device_type = None

    @classmethod
    def probe(cls):
        return ProbeResult(True, "", ["numpy stand-in for cupy (tests only)"])

    def _make_backend(self):
        return StandInBackend(self.device_id)

    @classmethod
    def for_device(cls, device_id=0):
        return cls({"device_id": str(device_id)})

    def to_dlpack(self, tensor, stream=None):
        raise NotImplementedError("the stand-in has no DLPack device")

    def from_dlpack(self, obj):
        raise NotImplementedError("the stand-in has no DLPack device")


@hookimpl
def runtime_core_register_providers(registrar):
    registrar.register(StandInCUDAProvider)


def register():
    """Rescan the installed plugins plus this module's provider; returns the registry."""
    eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    eps.append(metadata.EntryPoint(name="cudastandin", value="standin_provider", group=ENTRY_POINT_GROUP))
    return reload_plugins(eps)
