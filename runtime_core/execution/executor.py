"""The execution plan: compiled partitions, boundary copies and value lifetimes.

Built once per session. ``run`` walks a flat list of steps; each step is either a
partition's executable or one device copy. Values are keyed by name on the host
and ``name@device`` elsewhere, and dropped after their last reader.

A run may also be given inputs that already live on a device (an ``IOBinding``'s
device ``OrtValue``s) and told to leave outputs on a device. A device input goes
straight to the partition that reads it when that partition's provider
:func:`accepts <same_device>` the tensor (the plan's host-to-device copy of it is
skipped); it is copied only for consumers elsewhere. An output wanted on the
device that produced it is returned as is (the plan's device-to-host copy of it
is skipped). Every host<->device copy a run makes is counted in a
:class:`TransferStats`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import ExecutionError, OutOfMemoryError, RunTerminatedError
from ..partition.report import CopyEntry, FusionEntry
from .cancel import accepts_stop, find_terminated, in_chain, terminated_error

logger = logging.getLogger("runtime_core.execution")

HOST = "cpu"


def _key(name: str, device: str) -> str:
    return name if device == HOST else f"{name}@{device}"


def device_of(provider) -> str:
    """The ``device_type`` of a provider instance (``None`` means host memory)."""
    return HOST if provider is None else getattr(provider, "device_type", HOST)


def provider_label(provider) -> str:
    """How copies name a place: the provider's name, or ``host``."""
    return "host" if provider is None else getattr(provider, "name", "host")


def same_device(owner, consumer, tensor) -> bool:
    """Whether ``tensor``, made by provider ``owner``, can be used as is by ``consumer``.

    True for the same instance, for host memory on both sides, and for two
    instances of one ``device_type`` and ``device_id`` when ``consumer.holds(tensor)``
    agrees (a provider without ``holds`` accepts such tensors).
    """
    if owner is consumer:
        return True
    dev = device_of(owner)
    if dev != device_of(consumer):
        return False
    if dev == HOST:
        return True
    if int(getattr(owner, "device_id", 0) or 0) != int(getattr(consumer, "device_id", 0) or 0):
        return False
    holds = getattr(consumer, "holds", None)
    return True if holds is None else bool(holds(tensor))


def _owned(v, feeds: dict, earlier: list):
    """``v``, or a copy of it when the caller would otherwise share memory it does not own: a
    feed (an Identity or Reshape of an input), a constant (read-only: a Gather or Slice view of
    a weight) or an output returned before it. onnxruntime returns every output in its own
    buffer, so writing into one changes nothing else."""
    if not isinstance(v, np.ndarray):
        return v
    if not v.flags.writeable:
        return v.copy()
    # an array that allocated its memory shares it with no other array that allocated its own:
    # only the same object or a view (base set) needs numpy's test (~1 us a pair)
    own = v.flags.owndata
    for other in (*feeds.values(), *earlier):
        if other is v:
            return v.copy()
        if isinstance(other, np.ndarray) and not (own and other.base is None) and np.may_share_memory(v, other):
            return v.copy()
    return v


class TransferStats:
    """Host<->device copies: how many each way and their bytes.

    A session keeps one for all its runs (``InferenceSession.get_transfer_stats()``);
    each run fills its own, which also lists every copy in ``copies`` as
    :class:`~runtime_core.partition.report.CopyEntry` (``value``, ``src``, ``dst``,
    ``bytes``), and is then merged into the session's. A copy between two devices
    goes through the host and counts one transfer each way. ``device_to_device``
    counts copies within one device (writing into a preallocated output).
    """

    FIELDS = ("to_device", "to_host", "bytes_to_device", "bytes_to_host",
              "device_to_device", "bytes_device_to_device")

    def __init__(self, keep_copies: bool = True):
        self._lock = threading.Lock()
        self._keep = keep_copies
        self._zero()

    def reset(self) -> None:
        """Set every count to zero and forget the listed copies."""
        with self._lock:
            self._zero()

    def _zero(self) -> None:
        # plain stores, not a loop over FIELDS: every run makes one of these
        self.to_device = self.to_host = self.bytes_to_device = self.bytes_to_host = 0
        self.device_to_device = self.bytes_device_to_device = 0
        self.runs = 0
        self.copies: list[CopyEntry] = []

    @property
    def transfers(self) -> int:
        """Host<->device transfers, both directions."""
        return self.to_device + self.to_host

    def record(self, value: str, src, dst, host_nbytes: int | None, *,
               to_host: bool, to_device: bool) -> None:
        """Count one copy of ``value`` (``src``/``dst`` are provider instances or ``None``)."""
        n = int(host_nbytes or 0)
        with self._lock:
            if to_host:
                self.to_host += 1
                self.bytes_to_host += n
            if to_device:
                self.to_device += 1
                self.bytes_to_device += n
            if not to_host and not to_device:
                self.device_to_device += 1
                self.bytes_device_to_device += n
            if self._keep:
                self.copies.append(CopyEntry(value=value, src=provider_label(src),
                                             dst=provider_label(dst), bytes=host_nbytes))

    def merge(self, other: "TransferStats") -> None:
        """Add the counts (and, when these keep them, the copies) of ``other``."""
        with other._lock:
            runs = other.runs
            if not (other.copies or other.to_device or other.to_host or other.device_to_device):
                counts = None  # a host-only run (the common case) adds only itself
            else:
                counts = {f: getattr(other, f) for f in self.FIELDS}
                copies = list(other.copies)
        with self._lock:
            if counts is None:
                self.runs += runs
                return
            for f, n in counts.items():
                setattr(self, f, getattr(self, f) + n)
            self.runs += runs
            if self._keep:
                self.copies.extend(copies)

    def snapshot(self) -> "TransferStats":
        """A copy that later runs do not change."""
        out = TransferStats(self._keep)
        with self._lock:
            for f in self.FIELDS:
                setattr(out, f, getattr(self, f))
            out.runs = self.runs
            out.copies = list(self.copies)
        return out

    def to_dict(self) -> dict:
        """JSON-ready form."""
        d = {f: getattr(self, f) for f in self.FIELDS}
        d["runs"] = self.runs
        d["copies"] = [{"value": c.value, "src": c.src, "dst": c.dst, "bytes": c.bytes}
                       for c in self.copies]
        return d

    def __repr__(self) -> str:
        return ("TransferStats(" + ", ".join(f"{f}={getattr(self, f)}" for f in self.FIELDS)
                + f", runs={self.runs})")


def transfer(value: str, src, dst, v, stats: TransferStats | None):
    """Move ``v`` (held by provider ``src``; ``None`` is the host) to ``dst`` through the
    host, counting each host<->device leg in ``stats``. Returns the value on ``dst``."""
    to_host = device_of(src) != HOST
    to_device = device_of(dst) != HOST
    try:
        if src is not None:
            v = src.copy_to_host(v)
        nbytes = getattr(v, "nbytes", None)
        if dst is not None:
            v = dst.copy_to_device(v)
    except Exception as exc:
        raise ExecutionError(f"copying {value!r} from {provider_label(src)} to {provider_label(dst)} "
                             f"failed: {type(exc).__name__}: {exc}") from exc
    if stats is not None and (to_host or to_device):
        stats.record(value, src, dst, nbytes, to_host=to_host, to_device=to_device)
    if to_host or to_device:
        logger.debug("copied %r from %s to %s (%s bytes)", value, provider_label(src),
                     provider_label(dst), nbytes)
    return v


@dataclass
class _RunStep:
    part_id: int
    provider: object
    executable: object
    in_keys: tuple
    out_keys: tuple
    frees: tuple = ()
    takes_stop: bool = False  # ``executable.run`` accepts ``stop=`` (plugin API 1.3)


@dataclass
class _CopyStep:
    value: str
    src: object
    dst: object
    src_key: str
    dst_key: str
    frees: tuple = ()


class ExecutionPlan:
    """Everything ``run`` needs, decided at session creation."""

    def __init__(self, graph, planned, providers, executables):
        self.steps: list = []
        self.copies: list[CopyEntry] = []
        location: dict[str, object] = {}  # value -> provider instance holding it
        host_provider = next((p for p in providers if getattr(p, "device_type", HOST) == HOST), None)
        materialized: set[str] = set()
        feed_names = set(graph.input_names)
        for name in feed_names:
            location[name] = None  # host memory, fed by the caller
            materialized.add(name)

        dev = device_of

        def ensure(name: str, dst) -> str:
            src = location[name]
            k = _key(name, dev(dst))
            if k not in materialized:
                self.steps.append(_CopyStep(name, src, dst, _key(name, dev(src)), k))
                materialized.add(k)
                vi = graph.value_info(name)
                self.copies.append(CopyEntry(
                    value=name, src=getattr(src, "name", "host") if src is not None else "host",
                    dst=getattr(dst, "name", "host") if dst is not None else "host", bytes=vi.nbytes))
            return k

        for pp, exe in zip(planned, executables):
            part = pp.partition
            prov = providers[pp.provider_pos]
            in_keys = tuple(ensure(i, prov) for i in part.inputs)
            out_keys = []
            for o in part.outputs:
                location[o] = prov
                k = _key(o, dev(prov))
                materialized.add(k)
                out_keys.append(k)
            self.steps.append(_RunStep(part.id, prov, exe, in_keys, tuple(out_keys),
                                       takes_stop=accepts_stop(exe.run)))
        self.const_outputs = {o: graph.initializers[o] for o in graph.output_names
                              if o in graph.initializers and o not in location}
        self.output_keys = {}
        # where each output is produced: (provider or None, its key there)
        self.output_source: dict[str, tuple] = {}
        # the trailing copy step that exists only to bring an output to the host
        self._output_copy_step: dict[str, int] = {}
        for o in graph.output_names:
            if o in self.const_outputs:
                continue
            src = location[o]
            self.output_source[o] = (src, _key(o, dev(src)))
            if dev(src) != HOST:
                fresh = o not in materialized
                self.output_keys[o] = ensure(o, None)
                if fresh:
                    self._output_copy_step[o] = len(self.steps) - 1
            else:
                self.output_keys[o] = o
        # lifetimes: drop every key after its last reader, keep outputs where they are made
        keep = set(self.output_keys.values()) | {k for _, k in self.output_source.values()}
        last: dict[str, int] = {}
        for idx, st in enumerate(self.steps):
            reads = st.in_keys if isinstance(st, _RunStep) else (st.src_key,)
            for k in reads:
                last[k] = idx
        frees: dict[int, list[str]] = {}
        for k, idx in last.items():
            if k not in keep:
                frees.setdefault(idx, []).append(k)
        for idx, st in enumerate(self.steps):
            st.frees = tuple(frees.get(idx, ()))
        # for device-resident feeds: the plan's host-to-device copies of each feed, and
        # every step (or output) that reads the feed's host copy
        self._feed_copy_steps: dict[str, list[int]] = {}
        self._host_readers: dict[str, set] = {}
        for idx, st in enumerate(self.steps):
            reads = st.in_keys if isinstance(st, _RunStep) else (st.src_key,)
            for k in reads:
                if k in feed_names:
                    self._host_readers.setdefault(k, set()).add(idx)
            if isinstance(st, _CopyStep) and st.src is None and st.value in feed_names:
                self._feed_copy_steps.setdefault(st.value, []).append(idx)
        for o, k in self.output_keys.items():
            if k in feed_names:
                self._host_readers.setdefault(k, set()).add(-1)  # the output itself
        self.host_provider = host_provider

    def fusions(self) -> list[FusionEntry]:
        """What each executable runs as one step now (its optional ``fusions()``, plugin API
        1.3); an executable whose ``fusions()`` fails is left out (and logged)."""
        out: list[FusionEntry] = []
        for st in self.steps:
            if type(st) is not _RunStep:
                continue
            get = getattr(st.executable, "fusions", None)
            if not callable(get):
                continue
            try:
                found = [(str(kind), [str(n) for n in names]) for kind, names in get()]
            except Exception as exc:  # noqa: BLE001 - a report must not fail on a provider's extra
                logger.warning("%s.fusions() failed for partition %d: %s", st.provider.name, st.part_id, exc)
                continue
            out.extend(FusionEntry(st.part_id, st.provider.name, kind, names) for kind, names in found)
        return out

    def output_device(self, name: str):
        """The provider instance whose partition produces output ``name`` (``None``: host)."""
        src = self.output_source.get(name)
        return None if src is None else src[0]

    def run(self, feeds: dict, output_names: list[str], *, device_feeds: dict | None = None,
            placements: dict | None = None, stats: TransferStats | None = None, stop=None,
            own: bool = True) -> list:
        """Run the plan once and return the outputs in ``output_names`` order.

        ``feeds`` are host arrays. ``device_feeds`` maps input names to
        ``(provider, tensor)`` pairs already on a device. ``placements`` maps output
        names to the provider instance whose device should hold them (``None`` or
        absent: host). Copies made are counted in ``stats``. ``stop`` (see
        :mod:`.cancel`) is called before each step and handed to the executables that
        take it; a :class:`RunTerminatedError` it raises ends the run. ``own``: copy a host
        output that shares memory with a feed, a constant or another output (``_owned``).
        """
        env = dict(feeds)
        skip: set[int] = set()
        steps = self.steps
        if device_feeds:
            for name, (owner, tensor) in device_feeds.items():
                for idx in self._feed_copy_steps.get(name, ()):
                    st = steps[idx]
                    if same_device(owner, st.dst, tensor):
                        env[st.dst_key] = tensor
                        skip.add(idx)
                readers = self._host_readers.get(name, set()) - skip
                want = placements.get(name) if placements else None
                if want is not None and same_device(owner, want, tensor):
                    readers.discard(-1)  # an input passed through as an output, kept on device
                if readers:
                    env[name] = transfer(name, owner, None, tensor, stats)
        if placements:
            for name, want in placements.items():
                if want is None or name not in self._output_copy_step:
                    continue
                if device_of(self.output_source[name][0]) == device_of(want):
                    skip.add(self._output_copy_step[name])
        for idx, st in enumerate(steps):
            if idx in skip:
                continue
            if stop is not None:
                stop()
            if type(st) is _RunStep:
                try:
                    if stop is not None and st.takes_stop:
                        outs = st.executable.run([env[k] for k in st.in_keys], stop=stop)
                    else:
                        outs = st.executable.run([env[k] for k in st.in_keys])
                except RunTerminatedError:
                    raise
                except Exception as exc:
                    term = find_terminated(exc) if stop is not None else None
                    if term is not None:  # a provider wrapped the error its ``stop`` raised
                        raise RunTerminatedError(str(term)) from exc
                    if stop is not None and getattr(stop, "terminated", False):
                        # a kernel cut short by the flag left garbage that a later one choked on
                        raise terminated_error() from exc
                    node = getattr(exc, "node_name", None)
                    where = f" at node {node!r} ({getattr(exc, 'op_type', '?')})" if node else ""
                    # the size cap and numpy both raise MemoryError, which providers may wrap
                    cls = OutOfMemoryError if in_chain(exc, MemoryError) else ExecutionError
                    raise cls(f"{st.provider.name} failed in partition {st.part_id}{where}: {exc}") from exc
                if len(outs) != len(st.out_keys):
                    raise ExecutionError(
                        f"{st.provider.name} partition {st.part_id} returned {len(outs)} values, "
                        f"expected {len(st.out_keys)}")
                for k, v in zip(st.out_keys, outs):
                    env[k] = v
            else:
                env[st.dst_key] = transfer(st.value, st.src, st.dst, env[st.src_key], stats)
            for k in st.frees:
                env.pop(k, None)
        if stop is not None:
            stop()  # the last kernel may have been cut short by the flag: its output is garbage
        result = []
        for name in output_names:
            want = placements.get(name) if placements else None
            if device_of(want) == HOST:
                want = None
            if name in self.const_outputs:
                v = self.const_outputs[name].copy()
                result.append(v if want is None else transfer(name, None, want, v, stats))
                continue
            src, natural = self.output_source[name]
            host_key = self.output_keys[name]
            if want is None:
                result.append((_owned(env[host_key], feeds, result) if own else env[host_key]) if host_key in env
                              else transfer(name, src, None, env[natural], stats))
                continue
            if src is None and device_feeds and name in device_feeds:
                src, v = device_feeds[name]  # an input passed through as an output
            else:
                v = env.get(natural)
            if device_of(src) != HOST and same_device(src, want, v):
                result.append(v)
                continue
            host = env[host_key] if host_key in env else transfer(name, src, None, v, stats)
            result.append(transfer(name, None, want, host, stats))
        return result
