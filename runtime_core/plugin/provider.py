"""The provider class contract, as an optional base class.

A provider is a class registered through the ``runtime_core_register_providers``
hook. The core relies only on the attributes and methods below (duck typing), so a
provider that must not import runtime-core can implement them without this base
class; third-party providers are encouraged to subclass it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .contract import Capability, GraphView, Partition, ProbeResult


class ExecutionProvider:
    """Base class of execution providers.

    Identity (class attributes, all required):

    * ``name``: the ORT-style name, e.g. ``"CUDAExecutionProvider"``;
    * ``alias``: the short name, equal to the entry-point name, e.g. ``"cuda"``;
    * ``version``: the provider's own version string;
    * ``distribution``: the pip distribution that ships it;
    * ``plugin_api``: a PEP 440 specifier of the plugin API versions it supports,
      e.g. ``">=1.0,<2"``; the core skips the provider when its
      :data:`runtime_core.plugin.API_VERSION` is outside this range;
    * ``device_type``: the kind of memory its tensors live in (``"cpu"`` for host
      memory). Values move between providers of different ``device_type`` through
      :meth:`copy_to_host` / :meth:`copy_to_device`; the core inserts those copies at
      partition boundaries only.

    Instances are created once per session as ``cls(options)``, with the
    session's provider options for it (a ``dict`` of ``str`` to ``str``).
    """

    name: str = ""
    alias: str = ""
    version: str = "0"
    distribution: str = ""
    plugin_api: str = ">=1.0,<2"
    device_type: str = "cpu"

    def __init__(self, options: Mapping[str, Any] | None = None):
        self.options = dict(options or {})

    @classmethod
    def probe(cls) -> ProbeResult:
        """Report whether the provider can run on this machine.

        Cheap and never raises: import the heavy library here (lazily), look for
        devices, and return ``ProbeResult(available, reason, devices)`` with a
        human reason when unavailable. Called once per process at plugin load.
        """
        return ProbeResult(True, "", [])

    def get_capability(self, graph: GraphView) -> Capability:
        """Say which of the offered nodes this provider runs, and why it declines the rest."""
        raise NotImplementedError

    def compile(self, partition: Partition):
        """Turn a claimed, convex partition into an executable.

        The result has ``run(inputs: list) -> list``: inputs in ``partition.inputs``
        order, already on this provider's device; outputs in ``partition.outputs``
        order, left on the device. ``run`` must be safe to call from several
        threads at once.
        """
        raise NotImplementedError

    # -- device memory ------------------------------------------------------
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype):
        """Return an uninitialised device tensor of ``shape`` and ``dtype``."""
        return np.empty(shape, dtype)

    def copy_to_device(self, array: np.ndarray):
        """Copy a host numpy array to this provider's device and return the device tensor."""
        return array

    def copy_to_host(self, tensor) -> np.ndarray:
        """Copy a device tensor back to a host numpy array."""
        return np.asarray(tensor)

    def synchronize(self) -> None:
        """Block until all work queued by this provider has finished."""
        return None

    def get_options(self) -> dict[str, str]:
        """The effective provider options (for ``get_provider_options()``)."""
        return {k: str(v) for k, v in self.options.items()}
