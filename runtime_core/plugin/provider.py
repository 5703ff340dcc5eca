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
    session's provider options for it (a ``dict`` of ``str`` to ``str``). The session's
    other settings (optimization level, log severity, threads, arena: plugin API 1.4) reach
    it as ``GraphView.settings`` and ``Partition.settings``, a :class:`SessionSettings`.

    Device values outside a session (``OrtValue`` and ``IOBinding``; all optional,
    added compatibly, with the defaults below):

    * ``device_id`` (instance attribute, default ``0``): which device of its
      ``device_type`` this instance uses. ``OrtValue.ortvalue_from_numpy(a, "opencl", 1)``
      names a device by ``device_type`` (or alias) and this number;
    * :meth:`for_device`: the instance the core uses for device values created
      outside a session (cached per process);
    * :meth:`holds`: whether a tensor made by another instance with the same
      ``device_type`` and ``device_id`` can be passed to this instance's
      executables as is. When it can, a bound device input reaches the partition
      that reads it without any copy, and a partition output bound to that device
      is returned without any copy;
    * :meth:`tensor_info`: shape and dtype of a device tensor (by default its
      ``shape`` and ``dtype`` attributes);
    * :meth:`copy_into`: write into an existing device tensor (``bind_ortvalue_output``,
      ``OrtValue.update_inplace``); without it those are declined;
    * ``dlpack_device_type`` with :meth:`to_dlpack` / :meth:`from_dlpack`: DLPack
      export and import; :meth:`data_ptr` / :meth:`tensor_from_pointer`: raw device
      pointers (``IOBinding.bind_input(..., buffer_ptr)``). A provider that cannot do
      one of these raises ``NotImplementedError`` with the reason; the core turns it
      into a typed error.

    Layout (optional, plugin API 1.1; not defined on this base class, so the optimizer
    skips its trial partition when no provider defines it): a method
    ``preferred_layout(node: NodeView) -> "NHWC" | None``. At ``ORT_ENABLE_ALL`` each 4-D
    ``Conv`` / ``MaxPool`` / ``AveragePool`` / ``GlobalAveragePool`` this provider would
    run and answers ``"NHWC"`` for becomes ``runtime_core.nhwc::<Op>`` between two
    Transposes (consecutive ones cancel); the provider must then claim those ops
    (channels-last activations, ONNX weights, attribute ``since_version``). The CPU
    provider has reference kernels for them.

    Partition shaping (optional, plugin API 1.4): ``min_partition_size`` (an int, default 1)
    makes the core give back to the providers after this one (the CPU provider last) every
    node of a partition of this provider with fewer nodes; a method
    ``review_partitions(partitions: Sequence[Partition]) -> Iterable[str]`` is shown this
    provider's proposed partitions once every node has a provider (before any ``compile``)
    and returns the names of nodes to give back (a node of a group claim gives back its whole
    group). Given-back nodes are declined with a reason starting ``"given back"``, offered
    to the next providers, and the graph is cut again until nobody gives anything back;
    ``review_partitions`` may therefore be called more than once (and by the optimizer's
    trial partition), so it must answer from what it is shown. Neither is defined on this
    base class: a provider without them is not asked.
    """

    name: str = ""
    alias: str = ""
    version: str = "0"
    distribution: str = ""
    plugin_api: str = ">=1.0,<2"
    device_type: str = "cpu"
    device_id: int = 0
    dlpack_device_type: int | None = None  # DLPack's DLDeviceType of its memory (2 = CUDA), if any

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
        """Say which of the offered nodes this provider runs, and why it declines the rest.

        Called once per session, with a :class:`GraphView` of the nodes that no
        higher-priority provider took (so possibly not the whole graph). Return a
        :class:`Capability`: ``claims`` holds single :class:`NodeView` objects (the core
        merges neighbouring claims into convex partitions) or sequences of them (a
        group to compile as one unit; the core rejects a group that is not convex);
        ``declined`` maps the name of every other offered node to a human reason (op,
        opset version, dtype, attribute or shape). Must not raise; must not claim a
        node twice, a node it was not offered, or a node it also declines.
        """
        raise NotImplementedError

    def compile(self, partition: Partition):
        """Turn a claimed, convex partition into an executable.

        The result has ``run(inputs: list) -> list``: inputs in ``partition.inputs``
        order, already on this provider's device; outputs in ``partition.outputs``
        order, left on the device. ``run`` must be safe to call from several
        threads at once. An input may be a tensor of a caller's bound ``OrtValue``,
        made by another instance of this provider that :meth:`holds` accepted;
        ``run`` must not write into its inputs, and an output that the caller
        binds to this device is handed over as is (so it may share memory with
        an input, never with the executable's own constants).

        Cancellation (plugin API 1.3, optional): when ``run`` accepts a keyword ``stop``
        (looked at once, when the partition compiles), a run made with ``RunOptions``
        passes ``stop``, a zero-argument callable that raises
        ``runtime_core.errors.RunTerminatedError`` once ``RunOptions.terminate`` is set.
        ``run`` calls it between its steps and between the parts of anything long (loop
        iterations, subgraph nodes), and lets the error propagate (or chains it: the core
        finds it among the causes). Without ``stop`` the core checks only between partitions.
        ``stop.flag`` is a one-byte writable buffer that becomes nonzero once the run is to
        end and stays so for that run: compiled code polls it without the GIL between the
        parts of one long kernel and may then skip the rest (the core raises
        ``RunTerminatedError`` after the step and discards its outputs).

        Run-time fusions (plugin API 1.3, optional): an executable's ``fusions()`` returns
        ``(kind, node names)`` for each group of nodes it has come to run as one since it
        was compiled; ``get_partition_report()`` shows them.

        Kernel choices (plugin API 1.4, optional): an executable's ``kernels()`` returns
        ``(node name, kernel)`` for each node whose kernel it chose among several (measured on
        this machine, say); ``get_partition_report()`` shows them.
        """
        raise NotImplementedError

    # -- device memory ------------------------------------------------------
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype):
        """Return an uninitialised device tensor of ``shape`` and ``dtype`` (for IO binding)."""
        return np.empty(shape, dtype)

    def copy_to_device(self, array: np.ndarray):
        """Copy a host numpy array to this provider's device and return the device tensor.

        ``array`` may be non-contiguous, read-only, zero-size or 0-d; ``copy_to_host`` of
        the result must give back the same dtype, shape and bits, and a provider with
        its own memory must not keep a reference into ``array``. The core calls this
        only at partition boundaries where the producer's ``device_type`` differs from
        this provider's (the default, for host memory, returns ``array`` itself).
        """
        return array

    def copy_to_host(self, tensor) -> np.ndarray:
        """Copy a device tensor back to a host numpy array."""
        return np.asarray(tensor)

    def synchronize(self) -> None:
        """Block until all work queued by this provider has finished."""
        return None

    # -- device values outside a session (optional; see the class docstring) ---------
    @classmethod
    def for_device(cls, device_id: int = 0) -> "ExecutionProvider":
        """An instance on device ``device_id``, for ``OrtValue``s made outside a session.

        The default accepts only device ``0`` (``cls({})``); a provider with several
        devices overrides it. Raise ``ValueError`` naming the valid ids otherwise.
        """
        if int(device_id) != 0:
            raise ValueError(f"{cls.name} has a single device (device_id 0), not {device_id}")
        return cls({})

    def holds(self, tensor) -> bool:
        """Whether ``tensor`` (made by an instance with this ``device_type`` and
        ``device_id``) can be given to this instance's executables without a copy."""
        return True

    def tensor_info(self, tensor) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of a device tensor, without copying it to the host."""
        return tuple(int(d) for d in tensor.shape), np.dtype(tensor.dtype)

    def copy_into(self, dst, src) -> None:
        """Write ``src`` (a host array, or a tensor on this device) into the existing
        device tensor ``dst`` of the same shape and dtype."""
        raise NotImplementedError(f"{self.name} cannot write into an existing device tensor")

    def to_dlpack(self, tensor, stream=None):
        """Export a device tensor as a DLPack capsule without copying it."""
        raise NotImplementedError(f"{self.name} does not support DLPack export")

    def from_dlpack(self, obj):
        """Import an object implementing ``__dlpack__`` (or a capsule) as a device tensor
        sharing its memory."""
        raise NotImplementedError(f"{self.name} does not support DLPack import")

    def data_ptr(self, tensor) -> int:
        """The raw device pointer (or handle) of a device tensor."""
        raise NotImplementedError(f"{self.name} does not expose raw device pointers")

    def tensor_from_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype):
        """Wrap device memory at ``ptr`` (from :meth:`data_ptr` or another library) as a
        tensor of ``shape`` and ``dtype``, without copying."""
        raise NotImplementedError(f"{self.name} cannot wrap raw device pointers")

    def get_options(self) -> dict[str, str]:
        """The effective provider options (for ``get_provider_options()``)."""
        return {k: str(v) for k, v in self.options.items()}
