"""``InferenceSession``: load -> optimize -> partition -> compile -> plan -> run."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from types import FrameType

import numpy as np
import onnx

from ..errors import (
    ExecutionError,
    FallbackRefusedError,
    InputTypeError,
    InvalidArgumentError,
    InvalidModelError,
    InvalidProtobufError,
    ModelFileNotFoundError,
    PluginError,
    ProviderOptionsError,
    ProviderUnavailableError,
    RuntimeCoreError,
    UnknownProviderError,
)
from ..execution import ExecutionPlan
from ..execution.cancel import make_stop
from ..execution.executor import TransferStats
from ..graph import Graph
from ..graph.loader import load
from ..graph.types import dtype_of, shape_of, type_kind, type_string
from ..optimizer import OPTIMIZERS, optimize
from ..partition import partition_graph
from ..plugin.registry import DEFAULT_PROVIDERS_CONFIG, FALLBACK_ALIAS, default_providers, get_registry
from .inputs import InputSpec, check_output_names, validate_feeds
from .iobinding import IOBinding, check_bound_input
from .optimizers import disabled_passes
from .options import (RunOptions, SessionOptions, default_thread_count, inter_op_threads,
                      session_settings)
from .ortvalue import OrtValue, resolve_device
from .profiling import Profiler
from .typecheck import apply_free_dimension_overrides, check_types

logger = logging.getLogger("runtime_core.session")

DISABLE_FALLBACK = "session.disable_cpu_ep_fallback"
DISABLE_OPTIMIZERS = "optimization.disable_specified_optimizers"
#: bytes; kernels whose output size comes from input values refuse larger outputs
MAX_TENSOR_BYTES = "session.max_tensor_bytes"
#: "1" (default): the CPU provider measures its compiled kernels against the library calls on
#: this machine and keeps the faster per shape (cached on disk); "0": the library calls
CPU_AUTOTUNE = "session.cpu.autotune"
#: "1": a CPU partition on several threads measures, once its runs slow down (other processes on
#: the cores), whether its kernels run faster on the calling thread alone; "0" (default): pooled
CPU_SOLO_CHOICE = "session.cpu.solo_choice"
#: a count: the runs (of any session) in flight past which a CPU run of this session waits its
#: turn before it starts; "0": no limit; unset: the cores the process may use
CPU_MAX_RUNS = "session.cpu.max_concurrent_runs"


def _check_cpu_autotune(opts: SessionOptions) -> None:
    """A typed error for a ``session.cpu.autotune`` or ``session.cpu.solo_choice`` other than
    "0" or "1", or a ``session.cpu.max_concurrent_runs`` other than a count."""
    for key in (CPU_AUTOTUNE, CPU_SOLO_CHOICE):
        raw = (opts.get_config(key, "") or "").strip()
        if raw not in ("", "0", "1"):
            raise InvalidArgumentError(f"session config entry {key!r} must be '0' or '1', got {raw!r}")
    raw = (opts.get_config(CPU_MAX_RUNS, "") or "").strip()
    if raw and (not raw.isdigit() or int(raw) > 1 << 20):
        raise InvalidArgumentError(f"session config entry {CPU_MAX_RUNS!r} must be a count of runs (0: no limit), "
                                   f"got {raw!r}")


def _max_tensor_bytes(opts: SessionOptions) -> int:
    """The session's tensor-size cap (0: the provider's default), or a typed error."""
    raw = (opts.get_config(MAX_TENSOR_BYTES, "") or "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) <= 0:
        raise InvalidArgumentError(f"session config entry {MAX_TENSOR_BYTES!r} must be a positive number of "
                                   f"bytes, got {raw!r}")
    return int(raw)


def _kernel_choices(plan) -> dict[str, str]:
    """Node name -> the kernel its executable chose on this machine (an executable's optional
    ``kernels()``, plugin API 1.4); one whose ``kernels()`` fails is left out (and logged)."""
    out: dict[str, str] = {}
    for st in getattr(plan, "steps", ()):
        get = getattr(getattr(st, "executable", None), "kernels", None)
        if not callable(get):
            continue
        try:
            out.update((str(n), str(k)) for n, k in get())
        except Exception as exc:  # noqa: BLE001 - a report must not fail on a provider's extra
            logger.warning("kernels() of partition %s failed: %s", getattr(st, "part_id", "?"), exc)
    return out


class ProviderFallbackWarning(UserWarning):
    """A requested provider is unknown or unavailable; the session runs without it."""


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first frame outside runtime_core
    (the user's line that created the session), however deep the call came from."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _load_source(path_or_bytes):
    """:func:`load`, with onnxruntime's error classes: a missing file is NoSuchFile, bytes
    that are not protobuf InvalidProtobuf (both still :class:`ModelLoadError`)."""
    if isinstance(path_or_bytes, (str, os.PathLike)) and not os.path.lexists(path_or_bytes):
        raise ModelFileNotFoundError(f"model file {os.fspath(path_or_bytes)!r} does not exist")
    try:
        return load(path_or_bytes)
    except InvalidModelError as exc:
        # protobuf's DecodeError, recognised by name: protobuf is onnx's dependency, not ours
        if any(c.__name__ == "DecodeError" and c.__module__.startswith("google.protobuf")
               for c in type(exc.__cause__).__mro__):
            raise InvalidProtobufError(str(exc)) from exc.__cause__
        raise


@dataclass
class NodeArg:
    """ORT's NodeArg: ``name``, ``type`` (``'tensor(float)'``), ``shape`` (ints, dim names, None)."""

    name: str
    type: str
    shape: list | None

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


@dataclass
class ModelMetadata:
    """ORT's ModelMetadata."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict = field(default_factory=dict)


def _node_arg(vi: onnx.ValueInfoProto) -> NodeArg:
    shape = shape_of(vi.type)
    return NodeArg(vi.name, type_string(vi.type), None if shape is None else list(shape))


def _requested(providers, provider_options) -> list[tuple[str, dict]]:
    if providers is None:
        return []
    if isinstance(providers, str):
        providers = [providers]
    out = []
    for i, p in enumerate(providers):
        if isinstance(p, (tuple, list)):
            if len(p) != 2 or not isinstance(p[0], str) or not isinstance(p[1], dict):
                raise ProviderOptionsError(f"providers[{i}] must be a name or a (name, options dict) pair, got {p!r}")
            out.append((p[0], dict(p[1])))
        elif isinstance(p, str):
            out.append((p, {}))
        else:
            raise ProviderOptionsError(f"providers[{i}] must be a provider name, got {type(p).__name__}")
    if provider_options is not None:
        if len(provider_options) != len(out):
            raise ProviderOptionsError(
                f"provider_options has {len(provider_options)} entries but providers has {len(out)}; "
                "give one options dict per provider")
        out = [(n, {**o, **dict(po or {})}) for (n, o), po in zip(out, provider_options)]
    return out


class InferenceSession:
    """Load an ONNX model and run it on the installed providers (ORT-compatible).

    Keyword ``disabled_optimizers``: as onnxruntime's, a list or set of optimizer names that
    do not run (with the config entry ``optimization.disable_specified_optimizers``; see
    :mod:`runtime_core.session.optimizers` for the names taken)."""

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None, providers=None,
                 provider_options=None, **kwargs):
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        opts = self._sess_options
        threads = inter_op_threads(opts)  # validates execution_mode and the thread counts
        intra = int(opts.intra_op_num_threads or 0) or default_thread_count()
        self._profiler = Profiler(opts.profile_file_prefix) if opts.enable_profiling else None
        strict = opts.get_config(DISABLE_FALLBACK, "0") == "1"
        self._max_tensor_bytes = max_tensor_bytes = _max_tensor_bytes(opts)
        _check_cpu_autotune(opts)
        self._source = path_or_bytes  # set_providers and overridden initializers rebuild from it
        self._fallback = self.__dict__.get("_fallback", True)  # set_providers passes it on
        self._override_sess: InferenceSession | None = None
        #: an overriding session's initializer values, fed where a run does not feed them
        self._defaults: dict = {}
        self._override_lock = threading.Lock()
        model, weights, self._model_dir = _load_source(path_or_bytes)  # large weights stay out of protobuf
        check_types(model, weights)  # onnxruntime refuses a node whose type contradicts the graph's
        apply_free_dimension_overrides(model, opts)
        if self._profiler is not None:
            self._profiler.mark("model_loading_array" if isinstance(path_or_bytes, (bytes, bytearray))
                                else "model_loading_uri")
        self._model_path = path_or_bytes if isinstance(path_or_bytes, str) else None
        self._meta = ModelMetadata(
            producer_name=model.producer_name, graph_name=model.graph.name, domain=model.domain,
            description=model.doc_string, graph_description=model.graph.doc_string,
            version=model.model_version,
            custom_metadata_map={p.key: p.value for p in model.metadata_props})
        graph = Graph(model, weights=weights)
        del weights  # the graph owns them now: arrays a pass replaces are freed
        feed_vis = graph.feed_inputs()
        self._inputs = [_node_arg(v) for v in feed_vis]
        self._outputs = [_node_arg(v) for v in graph.outputs]
        self._overridable = [_node_arg(v) for v in graph.inputs if v.name in graph.initializers]
        self._overridable_names = {v.name for v in self._overridable}
        self._requested_providers = (providers, provider_options)
        self._specs = {v.name: InputSpec(v.name, dtype_of(v.type), shape_of(v.type), type_kind(v.type),
                                         type_string(v.type), type_kind(v.type) == "optional")
                       for v in feed_vis}
        self._output_names = graph.output_names
        self._output_dtypes = {v.name: dtype_of(v.type) for v in graph.outputs
                               if type_kind(v.type) == "tensor"}

        # onnxruntime's kwarg; kept so that set_providers and initializer overrides rebuild alike
        self._disabled_optimizers = kwargs.get("disabled_optimizers")
        disabled = disabled_passes(self._disabled_optimizers, opts.get_config(DISABLE_OPTIMIZERS, ""),
                                   (p.name for p in OPTIMIZERS))
        self._providers, unavailable = self._make_providers(providers, provider_options, strict)
        self.optimizations = optimize(graph, int(opts.graph_optimization_level), disabled,
                                      providers=self._providers, config=opts.config_entries)
        if opts.optimized_model_filepath:
            from ..optimizer.portable import portable_model  # nodes only we run, as standard ops

            onnx.save(portable_model(graph.to_model()), opts.optimized_model_filepath)

        planned, report = partition_graph(graph, self._providers, session_settings(opts, intra))
        report.providers = [p.name for p in self._providers]
        report.unavailable = unavailable
        if strict and any(p.alias != FALLBACK_ALIAS for p in self._providers):
            fell = [n for n in report.nodes if self._providers_by_name[n.provider].alias == FALLBACK_ALIAS]
            if fell:
                lines = "; ".join(f"{n.name} ({n.op_type}): " + ", ".join(
                    f"{p}: {r}" for p, r in n.declined.items()) for n in fell[:10])
                raise FallbackRefusedError(
                    f"{DISABLE_FALLBACK}=1 and {len(fell)} node(s) would fall back to "
                    f"CPUExecutionProvider: {lines}")
        # ORT_PARALLEL: each provider may run independent nodes concurrently (threads > 1);
        # enable_cpu_mem_arena is a hint every partition carries
        for pp in planned:
            pp.partition = dataclasses.replace(pp.partition, inter_op_num_threads=max(threads, 1),
                                               cpu_mem_arena=bool(opts.enable_cpu_mem_arena),
                                               intra_op_num_threads=intra, max_tensor_bytes=max_tensor_bytes,
                                               config=opts.config_entries)
        executables = []
        for pp in planned:
            prov = self._providers[pp.provider_pos]
            try:
                executables.append(prov.compile(pp.partition))
            except RuntimeCoreError:
                raise
            except Exception as exc:
                raise PluginError(f"{prov.name}.compile failed for partition {pp.partition.id} "
                                  f"({len(pp.partition.nodes)} nodes): {type(exc).__name__}: {exc}") from exc
        if self._profiler is not None:  # per-node timing only when profiling (no cost otherwise)
            executables = self._profiler.wrap(planned, self._providers, executables, graph)
        self._plan = ExecutionPlan(graph, planned, self._providers, executables)
        report.copies = list(self._plan.copies)
        self._report = report
        self._graph = graph
        self._transfers = TransferStats(keep_copies=False)  # host<->device copies of all runs
        # outputs sharing memory with a feed, a weight or each other are copied for the caller;
        # an internal reader that only reads them (calibration) turns that off
        self._own_outputs = True
        if self._profiler is not None:
            self._profiler.mark("session_initialization")
        logger.info("session ready:\n%s", report.summary())

    # -- providers -------------------------------------------------------------
    def _make_providers(self, providers, provider_options, strict):
        registry = get_registry()
        requested = _requested(providers, provider_options)
        if not requested:  # onnxruntime's CPU package: CPU only, unless the user opts in
            requested = [(n, {}) for n in default_providers(
                self._sess_options.get_config(DEFAULT_PROVIDERS_CONFIG))]
        unavailable: dict[str, str] = {}
        chosen = []
        for name, options in requested:
            rec = registry.lookup(name)
            if rec is None or rec.status != "loaded" or not rec.available:
                if rec is None:
                    known = ", ".join(f"{r.name} ({r.alias})" for r in registry.loaded()) or "none"
                    why = f"no installed plugin provides {name!r} (installed: {known})"
                elif rec.status != "loaded":
                    why = f"its plugin failed to load ({rec.status}): {rec.reason}"
                else:
                    why = rec.reason or "probe() reported it unavailable"
                if strict:
                    cls = UnknownProviderError if rec is None else ProviderUnavailableError
                    raise FallbackRefusedError(
                        f"{DISABLE_FALLBACK}=1 and requested provider {name!r} is unavailable: {why}") from cls(why)
                if not self._fallback:
                    cls = UnknownProviderError if rec is None else ProviderUnavailableError
                    raise cls(f"requested provider {name!r} is unavailable and fallback is disabled "
                              f"(disable_fallback()): {why}")
                warnings.warn(f"provider {name!r} is unavailable and is skipped: {why}",
                              ProviderFallbackWarning, stacklevel=_user_stacklevel())
                unavailable[name] = why
                continue
            if any(c[0] is rec for c in chosen):
                continue
            chosen.append((rec, options))
        if not any(rec.alias == FALLBACK_ALIAS for rec, _ in chosen):
            cpu = registry.lookup(FALLBACK_ALIAS)
            if cpu is None or cpu.status != "loaded":
                why = cpu.reason if cpu else "runtime-provider-cpu is not installed"
                raise ProviderUnavailableError(
                    f"the CPU fallback provider is not available ({why}); reinstall runtime-provider-cpu")
            chosen.append((cpu, {}))
        instances = []
        for rec, options in chosen:
            try:
                inst = rec.cls(options)
            except RuntimeCoreError:
                raise
            except Exception as exc:
                raise ProviderOptionsError(f"{rec.name} rejected its options {options!r}: "
                                           f"{type(exc).__name__}: {exc}") from exc
            instances.append(inst)
        self._providers_by_name = {p.name: p for p in instances}
        return instances, unavailable

    # -- ORT API ----------------------------------------------------------------
    def set_providers(self, providers=None, provider_options=None) -> None:
        """Rebuild the session on ``providers`` (ORT's ``set_providers``); ``None``: the default
        providers (see :func:`runtime_core.plugin.registry.default_providers`).

        As in onnxruntime, a name no installed plugin provides raises
        :class:`UnknownProviderError`; an installed but unavailable one is skipped with a
        :class:`ProviderFallbackWarning`, or raises after :meth:`disable_fallback`. On error the
        session is unchanged."""
        registry = get_registry()
        for name, _ in _requested(providers, provider_options):
            if registry.lookup(name) is None:
                known = ", ".join(f"{r.name} ({r.alias})" for r in registry.loaded()) or "none"
                raise UnknownProviderError(f"unknown provider {name!r}: no installed plugin provides it "
                                           f"(installed: {known})")
        new = type(self).__new__(type(self))
        new._fallback = self._fallback  # __init__ keeps it
        type(self).__init__(new, self._source, self._sess_options, providers, provider_options,
                            disabled_optimizers=self._disabled_optimizers)
        self.__dict__.update(new.__dict__)

    def disable_fallback(self) -> None:
        """After this, :meth:`set_providers` refuses an unavailable provider instead of
        skipping it with a warning (onnxruntime's ``disable_fallback``)."""
        self._fallback = False

    def enable_fallback(self) -> None:
        """Undo :meth:`disable_fallback` (the default: unavailable providers are skipped)."""
        self._fallback = True

    def get_inputs(self) -> list[NodeArg]:
        """Inputs a caller feeds (initializers excluded)."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers that are also graph inputs: ``run`` may feed them by name."""
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return self._meta

    def get_providers(self) -> list[str]:
        """Providers this session uses, in priority order (CPU last)."""
        return [p.name for p in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {p.name: (p.get_options() if hasattr(p, "get_options") else {}) for p in self._providers}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def get_partition_report(self):
        """Where each node runs, who declined it and why, every device copy, and the nodes
        fused since the session was made (``report.fusions``: after the first run)."""
        self._report.fusions = self._plan.fusions()
        self._report.kernels = _kernel_choices(self._plan)
        return self._report

    def get_graph_nodes(self) -> list:
        """The nodes of the optimized graph that :meth:`get_partition_report` describes (same
        names), in graph order, as read-only ``runtime_core.plugin.NodeView`` objects: inputs and
        outputs by value name, resolved attributes, and If/Loop/Scan bodies in ``subgraphs``
        (for pictures of the graph, such as the partition page). A new list on each call."""
        cache: dict = {}
        return [self._graph.node_view(n, i, cache) for i, n in enumerate(self._graph.nodes)]

    def validate_inputs(self, input_feed, output_names=None) -> dict:
        """Check ``input_feed`` (and ``output_names``, when given) as :meth:`run` would, without
        running: the feeds as ``run`` would use them (native, C-contiguous numpy arrays; an
        optional input not fed is None), or the same typed error. For callers that check a
        request before queueing it (the server's dynamic batcher)."""
        if output_names is not None:
            check_output_names(output_names, self._output_names)
        if not hasattr(input_feed, "items"):
            raise InputTypeError(f"input_feed must be a dict of input name to array, "
                                 f"got {type(input_feed).__name__}")
        if self._overridable_names and not self._overridable_names.isdisjoint(input_feed.keys()):
            sess = self._overriding_session()
            return sess.validate_inputs({**{k: v for k, v in sess._defaults.items() if k not in input_feed},
                                         **input_feed})
        return validate_feeds(input_feed, self._specs, self._max_tensor_bytes)

    def run(self, output_names, input_feed, run_options: RunOptions | None = None) -> list:
        """Run the model; returns numpy arrays in ``output_names`` order (all outputs if None).

        Feeds are numpy arrays or ``OrtValue``s; a device ``OrtValue`` reaches the
        partitions on its device without a copy. Setting ``run_options.terminate`` (from
        another thread) ends the run between nodes with ``RunTerminatedError``; a run
        whose flag is already set is refused at once.
        """
        stop = make_stop(run_options)  # a flag set already: refused before anything runs
        names = check_output_names(output_names, self._output_names)
        stats = TransferStats()
        stats.runs = 1
        try:
            outs = self._execute(input_feed, names, stats=stats, stop=stop)
        finally:
            if stop is not None:
                stop.close()
            self._transfers.merge(stats)
        for name, value in zip(names, outs):
            self._check_output_type(name, getattr(value, "dtype", None))
        return outs

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options: RunOptions | None = None
                            ) -> list[OrtValue]:
        """Run with ``OrtValue`` (or numpy) feeds; returns host ``OrtValue``s (ORT's
        ``run_with_ort_values``). Use an :class:`IOBinding` to keep outputs on a device."""
        return [OrtValue(v) for v in self.run(output_names, input_dict_ort_values, run_options)]

    def io_binding(self) -> IOBinding:
        """A new :class:`IOBinding` for :meth:`run_with_iobinding`."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run with the inputs and outputs bound in ``iobinding``; read the results with
        ``iobinding.get_outputs()`` (device outputs stay on their device)."""
        if not isinstance(iobinding, IOBinding):
            raise InvalidArgumentError(f"run_with_iobinding takes an IOBinding from io_binding(), got "
                                       f"{type(iobinding).__name__}")
        if iobinding._session is not self:
            raise InvalidArgumentError("IOBinding must be used with the session that created it "
                                       "(make one with this session's io_binding())")
        iobinding._run(run_options)

    def end_profiling(self) -> str:
        """Write the profile (ORT's Chrome-trace JSON) and stop profiling; returns the file's
        path, or ``""`` when ``SessionOptions.enable_profiling`` was off (as ORT does)."""
        prof = self._profiler
        if prof is None or not prof.enabled:
            return ""
        return prof.end()

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (``time.time_ns()`` clock; 0 when profiling is off)."""
        return self._profiler.start_wall_ns if self._profiler is not None else 0

    def get_transfer_stats(self) -> TransferStats:
        """runtime-core extension: host<->device copies (counts and bytes) made by every run
        of this session so far, boundary copies included (a snapshot)."""
        return self._transfers.snapshot()

    def reset_transfer_stats(self) -> None:
        """Set the counts of :meth:`get_transfer_stats` back to zero."""
        self._transfers.reset()

    # -- internals shared with IOBinding --------------------------------------------
    def _resolve_device(self, device_type, device_id=0):
        """The provider instance for a device name (this session's first), ``None`` for host."""
        return resolve_device(device_type, device_id, self._providers)

    def _execute(self, input_feed, names, *, device_feeds=None, placements=None, stats=None,
                 stop=None) -> list:
        """Validate feeds and run the plan (``input_feed`` may hold ``OrtValue``s); ``stop``:
        the run's cancellation check (``execution.cancel.make_stop``)."""
        if not hasattr(input_feed, "items"):
            raise InputTypeError(f"input_feed must be a dict of input name to array, "
                                 f"got {type(input_feed).__name__}")
        if self._overridable_names and not self._overridable_names.isdisjoint(input_feed.keys()):
            sess = self._overriding_session()
            input_feed = {**{k: v for k, v in sess._defaults.items() if k not in input_feed}, **input_feed}
            return sess._execute(input_feed, names, device_feeds=device_feeds, placements=placements,
                                 stats=stats)
        device_feeds = dict(device_feeds or {})
        host = {}
        for name, value in input_feed.items():
            if isinstance(value, OrtValue) and name in self._specs:
                if value._provider is None:
                    value = value._value
                else:
                    check_bound_input(self._specs[name], value)
                    device_feeds[name] = (value._provider, value._value)
                    continue
            host[name] = value
        specs = self._specs if not device_feeds else {
            n: s for n, s in self._specs.items() if n not in device_feeds}
        feeds = validate_feeds(host, specs, self._max_tensor_bytes)
        if self._profiler is not None:
            return self._profiler.run_model(self._plan.run, feeds, names, device_feeds=device_feeds or None,
                                            placements=placements, stats=stats, stop=stop,
                                            own=self._own_outputs)
        return self._plan.run(feeds, names, device_feeds=device_feeds or None, placements=placements,
                              stats=stats, stop=stop, own=self._own_outputs)

    def _overriding_session(self) -> InferenceSession:
        """A session of the same model whose overridable initializers are plain inputs with
        their values as defaults (built on the first run that feeds one): the main plan
        may have folded those initializers as constants."""
        with self._override_lock:
            if self._override_sess is None:
                self._override_sess = self._make_overriding_session()
        return self._override_sess

    def _make_overriding_session(self) -> InferenceSession:
        from ..graph.loader import load_model
        from .typecheck import initializers_as_inputs

        model, _ = load_model(self._source)
        defaults = initializers_as_inputs(model, self._overridable_names)
        so = copy.copy(self._sess_options)
        so._config = dict(self._sess_options._config)
        so.optimized_model_filepath = ""
        so.enable_profiling = False
        providers, provider_options = self._requested_providers
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProviderFallbackWarning)  # already said once
            sess = InferenceSession(model, so, providers=providers, provider_options=provider_options,
                                    disabled_optimizers=self._disabled_optimizers)
        sess._defaults = defaults
        return sess

    def _check_output_type(self, name: str, got) -> None:
        want = self._output_dtypes.get(name)
        if want is not None and got is not None and got != want and not (
                want == np.dtype(object) and got.kind in "OUS"):
            # the model declares a type its nodes do not produce (onnxruntime refuses such models)
            raise ExecutionError(f"output {name!r} is declared {want} by the model, but its producer "
                                 f"computed {got}; the model's output type is wrong")
