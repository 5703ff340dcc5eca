"""Calibration: run a model on runtime_core sessions and choose a range per activation.

The model is augmented with an extra graph output for every tensor to calibrate and run
once per batch that the data reader yields. Each batch's values are folded into a small
per-tensor state and dropped: MinMax keeps a running min and max (or running means with
``moving_average``); Entropy, Percentile and Distribution keep one histogram per tensor,
merged batch by batch and widened (with the same bin width) when a batch's range exceeds
it. Memory is bounded by one batch's activations plus the histograms, whatever the number
of samples. The range rules are onnxruntime's (same bin counts, percentile, KL search).
"""

from __future__ import annotations

import abc
import copy
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..errors import InvalidArgumentError
from ._common import FLOAT_TYPES, CalibrationMethod

__all__ = ["CalibrationDataReader", "TensorRange", "Calibrator", "create_calibrator", "tensors_to_calibrate"]


class CalibrationDataReader(metaclass=abc.ABCMeta):
    """Yields input feeds (``{input name: array}``) one batch at a time; ``None`` ends.

    Any object with a ``get_next()`` method counts as a reader (as in onnxruntime)."""

    @classmethod
    def __subclasshook__(cls, subclass):
        return (hasattr(subclass, "get_next") and callable(subclass.get_next)) or NotImplemented

    @abc.abstractmethod
    def get_next(self) -> dict | None:
        """The next feed dict, or ``None`` when the data is exhausted."""
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        result = self.get_next()
        if result is None:
            raise StopIteration
        return result

    def __len__(self) -> int:
        raise NotImplementedError

    def set_range(self, start_index: int, end_index: int) -> None:
        raise NotImplementedError


@dataclass
class TensorRange:
    """The range chosen for one tensor, and (for histogram methods) its histogram."""

    lowest: np.ndarray
    highest: np.ndarray
    hist: np.ndarray | None = None
    hist_edges: np.ndarray | None = None
    avg: np.ndarray | None = None
    std: np.ndarray | None = None

    @property
    def range_value(self) -> tuple[np.ndarray, np.ndarray]:
        return self.lowest, self.highest


def tensors_to_calibrate(model: onnx.ModelProto, op_types: Iterable[str] | None) -> list[str]:
    """Float inputs and outputs (not initializers) of the nodes whose type is in ``op_types``
    (every node when empty), in graph order."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)
             if vi.type.HasField("tensor_type")}
    inits = {t.name for t in model.graph.initializer}
    ops = set(op_types or ())
    seen: dict[str, None] = {}
    for n in model.graph.node:
        if ops and n.op_type not in ops:
            continue
        for t in list(n.input) + list(n.output):
            if t and t not in inits and types.get(t) in FLOAT_TYPES:
                seen.setdefault(t, None)
    return list(seen)


# Ops whose output holds exactly the input's values, rearranged: the same multiset, so the same
# min, max and histogram (every collector is order-blind); the output's range is the input's.
_DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                            "DepthToSpace", "SpaceToDepth"})
# Ops that can give different values for the same inputs.
_NONDETERMINISTIC = frozenset({"RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def value_aliases(model: onnx.ModelProto, tensors: Sequence[str]) -> dict[str, str]:
    """{tensor: the calibrated tensor it rearranges}: the output of a data-movement op
    (Reshape, Transpose, ...) whose data input, or that input's own source, is calibrated."""
    wanted = set(tensors)
    out: dict[str, str] = {}
    for n in model.graph.node:  # graph order is topological: a source is resolved before its users
        if n.op_type in _DATA_MOVEMENT and n.domain in ("", "ai.onnx") and n.input and n.output:
            src = out.get(n.input[0], n.input[0])
            if src in wanted and n.output[0] in wanted and n.output[0] != src:
                out[n.output[0]] = src
    return out


def constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors computed from initializers and Constant nodes only (not from anything fed):
    the same values in every batch."""
    fed = {i.name for i in model.graph.input}
    const = {t.name for t in model.graph.initializer if t.name not in fed}  # a fed initializer is a default
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type in _NONDETERMINISTIC or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            continue  # unknown ops, random ops and subgraphs (which may read outer values) are not assumed constant
        if n.op_type == "Constant" or (n.input and all(not i or i in const for i in n.input)):
            const.update(o for o in n.output if o)
    return const


class _Progress:
    """tqdm when installed, else one rewritten stderr line; silent for calibrations that end
    within ``delay`` seconds."""

    def __init__(self, total: int | None, enabled: bool, delay: float = 2.0):
        self.total, self.enabled, self.delay = total, enabled, delay
        self.start = time.monotonic()
        self.n = 0
        self.bar: Any = None
        self.shown = False

    def update(self) -> None:
        self.n += 1
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return
        if self.bar is None and not self.shown:
            try:
                from tqdm import tqdm  # optional: only for a nicer bar
                self.bar = tqdm(total=self.total, initial=self.n, desc="calibrating", unit="batch")
                return
            except ImportError:
                self.bar = False
        if self.bar:
            self.bar.update(1)
        else:
            of = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\rcalibrating: {self.n}{of} batches, {time.monotonic() - self.start:.0f} s")
            sys.stderr.flush()
            self.shown = True

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        elif self.shown:
            sys.stderr.write("\n")


class _MinMax:
    def __init__(self, symmetric: bool, moving_average: bool, averaging_constant: float):
        self.symmetric, self.moving_average, self.c = symmetric, moving_average, averaging_constant
        self.lo: dict[str, Any] = {}
        self.hi: dict[str, Any] = {}
        self.memo: dict[str, tuple] = {}
        self.count = 0

    def collect(self, name: str, a: np.ndarray, constant: bool = False) -> None:
        """Fold one batch's ``a`` in; ``constant``: ``a`` is the same every batch, so its
        extremes are taken once (the update itself still runs: the moving average moves)."""
        if constant and name in self.memo:
            lo, hi = self.memo[name]
        elif a.size == 0:
            lo = hi = np.array(0, dtype=a.dtype)
        else:
            lo, hi = np.nanmin(a), np.nanmax(a)
        if constant:
            self.memo[name] = (lo, hi)
        if name not in self.lo:
            self.lo[name], self.hi[name] = lo, hi
        elif self.moving_average:  # running mean of the per-batch extremes (onnxruntime's nanmean)
            k = self.count
            self.lo[name] = self.lo[name] + (lo - self.lo[name]) / (k + 1)
            self.hi[name] = self.hi[name] + (hi - self.hi[name]) / (k + 1)
        else:
            self.lo[name], self.hi[name] = min(self.lo[name], lo), max(self.hi[name], hi)

    def end_batch(self) -> None:
        self.count += 1

    def result(self) -> dict[str, TensorRange]:
        out = {}
        for k in self.lo:
            lo, hi = np.float32(self.lo[k]), np.float32(self.hi[k])
            if self.symmetric:
                m = max(abs(lo), abs(hi))
                lo, hi = -m, m
            out[k] = TensorRange(np.array(lo, np.float32), np.array(hi, np.float32))
        return out


class _Histogram:
    """One histogram per tensor, merged batch by batch (onnxruntime's bin layout)."""

    def __init__(self, method: str, symmetric: bool, num_bins: int, num_quantized_bins: int,
                 percentile: float, scenario: str):
        self.method, self.symmetric, self.num_bins = method, symmetric, num_bins
        self.num_quantized_bins, self.percentile, self.scenario = num_quantized_bins, percentile, scenario
        self.h: dict[str, list] = {}
        self.binner = _Binner()
        self.memo: dict[str, tuple] = {}

    def end_batch(self) -> None:
        pass

    def collect(self, name: str, a: np.ndarray, constant: bool = False) -> None:
        """Fold one batch's ``a`` in; ``constant``: ``a`` is the same every batch, so its
        extremes and its counts for a given bin layout are computed once and reused."""
        memo = self.memo.get(name) if constant else None
        if memo is None:
            a, lo, hi = _flat_without_nan(a)
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise InvalidArgumentError(
                    f"tensor {name!r} holds an infinite value in this calibration batch (range {lo} to "
                    f"{hi}): a histogram cannot be made of it; leave its node out (nodes_to_exclude), "
                    f"check the calibration data, or calibrate with CalibrationMethod.MinMax")
            if constant:
                self.memo[name] = (lo, hi, {})
        else:
            lo, hi = memo[0], memo[1]
        b = self.binner if not constant else _MemoBinner(self.binner, self.memo[name][2])
        if self.method == "percentile" and self.symmetric:
            self._collect_abs(name, a, lo, hi, b)
        else:
            self._collect_signed(name, a, lo, hi, b)

    def _collect_abs(self, name, a, lo, hi, b) -> None:
        amax = np.float32(max(abs(lo), abs(hi)))
        old = self.h.get(name)
        if old is None:
            # anchored at 0 so that later, smaller values still land in a bin
            width = np.float32(amax / self.num_bins) if amax > 0 else np.float32(1.0)
            self.h[name] = [b.count(a, 0.0, width, self.num_bins, absolute=True),
                            (np.arange(self.num_bins + 1, dtype=np.float32) * width), lo, hi]
            return
        hist0, edges, lo0, hi0 = old
        if amax > edges[-1]:  # grow to the right with the same bin width
            width = edges[1] - edges[0]
            extra = np.arange(edges[-1] + width, amax + width, width, dtype=np.float32)
            edges = np.hstack((edges, extra))
            hist0 = np.concatenate([hist0, np.zeros(len(extra), hist0.dtype)])
        hist0 += b.count(a, 0.0, edges[1] - edges[0], len(hist0), absolute=True)
        self.h[name] = [hist0, edges, min(lo0, lo), max(hi0, hi)]

    def _collect_signed(self, name, a, lo, hi, b) -> None:
        th = np.float32(max(abs(lo), abs(hi)))
        old = self.h.get(name)
        if old is None:
            self.h[name] = [b.count(a, -th, 2 * th / self.num_bins, self.num_bins),
                            np.linspace(-th, th, self.num_bins + 1, dtype=np.float32), lo, hi, th]
            return
        hist0, edges0, lo0, hi0, th0 = old
        if th <= th0:
            hist0 += b.count(a, -th0, 2 * th0 / len(hist0), len(hist0))
            self.h[name] = [hist0, edges0, min(lo0, lo), max(hi0, hi), th0]
            return
        if th0 == 0:
            hist = b.count(a, -th, 2 * th / len(hist0), len(hist0)) + hist0
            nbins = len(hist0)
        else:  # widen symmetrically by whole bins of the old width, then add the old counts in the middle
            stride = 2 * th0 / len(hist0)
            half = int((th - th0) // stride + 1)
            nbins = len(hist0) + 2 * half
            th = np.float32(half * stride + th0)
            hist = b.count(a, -th, 2 * th / nbins, nbins)
            hist[half: nbins - half] += hist0
        self.h[name] = [hist, np.linspace(-th, th, nbins + 1, dtype=np.float32), min(lo0, lo), max(hi0, hi), th]

    def result(self) -> dict[str, TensorRange]:
        out = {}
        for name, h in self.h.items():
            hist, edges = h[0], h[1]
            if self.method == "percentile":
                lo, hi = self._percentile(hist, edges, h[2], h[3])
            elif self.method == "entropy":
                lo, hi = _entropy_threshold(hist, edges, self.num_quantized_bins, h[2], h[3])
            else:
                avg, std = _avg_std(hist, edges, 1 if self.scenario == "same" else 1.0 / 3.0)
                out[name] = TensorRange(np.array(edges.min(), np.float32), np.array(edges.max(), np.float32),
                                        hist, edges, avg, std)
                continue
            out[name] = TensorRange(np.array(lo, np.float32), np.array(hi, np.float32), hist, edges)
        return out

    def _percentile(self, hist, edges, vmin, vmax):
        cdf = np.cumsum(hist / hist.sum())
        if self.symmetric:
            i = np.searchsorted(cdf, self.percentile / 100.0)
            lo, hi = -edges[i], edges[i]
        else:
            cut = (100.0 - self.percentile) / 200.0
            lo, hi = edges[np.searchsorted(cdf, cut)], edges[np.searchsorted(cdf, 1.0 - cut)]
        return max(lo, vmin), min(hi, vmax)


def _flat_without_nan(a: np.ndarray) -> tuple[np.ndarray, Any, Any]:
    """``a`` as flat float32 with NaNs left out (as onnxruntime's nanmin/nanmax do), its min, its max."""
    a = a.reshape(-1)
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    if a.size == 0:
        return a, np.float32(0), np.float32(0)
    lo, hi = a.min(), a.max()
    if np.isnan(lo) or np.isnan(hi):
        a = a[~np.isnan(a)]
        lo, hi = (a.min(), a.max()) if a.size else (np.float32(0), np.float32(0))
    return a, lo, hi


class _MemoBinner:
    """A constant tensor's counts, kept per bin layout: its values never change between batches."""

    def __init__(self, binner: _Binner, counts: dict):
        self.binner, self.counts = binner, counts

    def count(self, a, lo, width, nbins, absolute=False):
        key = (lo, width, nbins, absolute)
        if key not in self.counts:
            self.counts[key] = self.binner.count(_flat_without_nan(a)[0], lo, width, nbins, absolute)
        return self.counts[key].copy()  # the caller adds into it


_CHUNK = 1 << 15  # elements per pass: the float and index work buffers stay in the L2 cache


class _Binner:
    """Bin counting with work buffers reused across tensors and batches: each chunk goes
    through abs/subtract, scale, clip and the integer cast in place, so a tensor costs one
    read of its values instead of a fresh temporary per step."""

    def __init__(self, chunk: int = _CHUNK):
        self.chunk = chunk
        self.f = np.empty(chunk, np.float32)
        self.i = np.empty(chunk, np.int32)  # float32 to int32 casts several times faster than to int64

    def count(self, a: np.ndarray, lo, width, nbins: int, absolute: bool = False) -> np.ndarray:
        """Counts of ``a`` (of ``|a|`` with ``absolute``) in ``nbins`` bins of ``width`` from
        ``lo`` (the last bin closed, values outside clamped to the end bins); the same float32
        arithmetic as a whole-array subtract, scale, clip and cast, so the same counts."""
        if a.size == 0 or width <= 0:
            h = np.zeros(nbins, np.int64)
            h[nbins // 2 if lo < 0 else 0] += a.size  # a zero range: every value is 0
            return h
        scale, lo32 = np.float32(1.0 / width), np.float32(lo)
        h = np.zeros(nbins, np.int64)
        for s in range(0, a.size, self.chunk):
            x = a[s: s + self.chunk]
            f, i = self.f[: x.size], self.i[: x.size]
            if absolute:
                np.abs(x, out=f)
                if lo:
                    f -= lo32
            elif lo:
                np.subtract(x, lo32, out=f)
            else:
                f[...] = x
            f *= scale
            np.clip(f, 0, nbins - 1, out=f)
            np.copyto(i, f, casting="unsafe")  # truncation toward zero, as astype
            h += np.bincount(i, minlength=nbins)[:nbins]
        return h


def _smooth(p: np.ndarray, eps: float = 0.0001) -> np.ndarray | None:
    zeros = p == 0
    nz = p.size - zeros.sum()
    if not nz:
        return None
    eps1 = eps * float(zeros.sum()) / float(nz)
    return p.astype(np.float32) + np.where(zeros, eps, -eps1).astype(np.float32)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum()
    return float(np.sum(np.where(p > 0, p * np.log(p / q), 0.0)))


def _entropy_threshold(hist, edges, nq, vmin, vmax):
    """The symmetric threshold whose nq-bin quantization loses the least KL divergence."""
    nbins = hist.size
    zero = nbins // 2
    half = nq // 2
    best, best_kl = (edges[0], edges[-1]), np.inf
    csum = np.concatenate(([0], np.cumsum(hist)))
    for i in range(half, zero + 1):
        s, e = zero - i, min(zero + i + 1, nbins)
        sliced = hist[s:e]
        p = sliced.astype(np.int64).copy()
        p[0] += csum[s]
        p[-1] += csum[-1] - csum[e]
        nonzero = (p != 0).astype(np.int64)
        m = sliced.size // nq
        body = sliced[: nq * m].reshape(nq, m)
        qbins = body.sum(axis=1)
        qbins[-1] += sliced[nq * m:].sum()
        norms = nonzero[: nq * m].reshape(nq, m).sum(axis=1)
        q = np.zeros(p.size, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(norms != 0, qbins / np.maximum(norms, 1), 0).astype(np.int64)
        q[: nq * m] = np.repeat(per, m)
        ps, qs = _smooth(p), _smooth(q)
        div = np.inf if ps is None or qs is None else _kl(ps, qs)
        if div < best_kl:
            best_kl, best = div, (edges[s], edges[e])
    return max(best[0], vmin), min(best[1], vmax)


def _avg_std(hist, edges, power):
    values = (edges[:-1] + edges[1:]) * 0.5
    if power == 1:
        avg = (hist * values).sum() / hist.sum()
        std = ((hist * values ** 2).sum() / hist.sum() - avg ** 2) ** 0.5
    else:
        values = np.sign(values) * np.abs(values) ** power
        avg = (hist * values).sum() / hist.sum()
        std = ((hist * values ** 2).sum() / hist.sum() - avg ** 2) ** 0.5
    return np.array(avg, np.float32), np.array(std, np.float32)


@dataclass
class Calibrator:
    """Runs calibration batches through a runtime_core session of the augmented model."""

    model: onnx.ModelProto
    tensors: Sequence[str]
    collector: Any
    providers: Sequence | None = None
    progress: bool = True
    batches: int = field(default=0, init=False)

    def __post_init__(self):
        from ..session import GraphOptimizationLevel, InferenceSession, SessionOptions

        # a rearranged tensor takes its source's range, so it is neither fetched nor binned
        self.aliases = value_aliases(self.model, self.tensors)
        self.output_names = [t for t in self.tensors if t not in self.aliases]
        constant = constant_tensors(self.model)
        self.constant = [t in constant for t in self.output_names]
        aug = copy.deepcopy(self.model)
        have = {o.name for o in aug.graph.output}
        vis = {vi.name: vi for vi in list(aug.graph.value_info) + list(aug.graph.input)}
        for t in self.output_names:
            if t not in have:
                aug.graph.output.append(copy.deepcopy(vis[t]) if t in vis else
                                        onnx.helper.make_empty_tensor_value_info(t))
        so = SessionOptions()
        so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # every calibrated value stays
        self.session = InferenceSession(aug.SerializeToString(), so, providers=list(self.providers or ["cpu"]))
        self.session._own_outputs = False  # the collectors only read the outputs: no copies of shared ones

    def collect_data(self, reader) -> None:
        """Run every batch ``reader`` yields and fold it into the per-tensor state."""
        try:
            total = len(reader)
        except (TypeError, NotImplementedError):
            total = None
        bar = _Progress(total, self.progress)
        try:
            while True:
                feed = reader.get_next()
                if not feed:
                    break
                values = self.session.run(self.output_names, feed)
                for name, v, const in zip(self.output_names, values, self.constant):
                    self.collector.collect(name, np.asarray(v), const)
                self.collector.end_batch()
                self.batches += 1
                bar.update()
        finally:
            bar.close()

    def compute_data(self) -> dict[str, TensorRange]:
        """The range of every calibrated tensor."""
        if not self.batches:
            raise InvalidArgumentError("the calibration data reader yielded no batch; "
                                       "give it at least one input feed")
        res = self.collector.result()
        return {t: (res[t] if t not in self.aliases else copy.deepcopy(res[self.aliases[t]]))
                for t in self.tensors if self.aliases.get(t, t) in res}


def create_calibrator(model: onnx.ModelProto, op_types_to_calibrate: Iterable[str] | None = None,
                      calibrate_method: CalibrationMethod = CalibrationMethod.MinMax, providers=None,
                      extra_options: dict | None = None, progress: bool = True) -> Calibrator:
    """A calibrator for ``model`` (shape-inferred) with onnxruntime's per-method defaults;
    ``extra_options`` keys as onnxruntime's create_calibrator (symmetric, moving_average,
    averaging_constant, num_bins, num_quantized_bins, percentile, scenario)."""
    o = dict(extra_options or {})
    c: Any
    if calibrate_method == CalibrationMethod.MinMax:
        c = _MinMax(bool(o.get("symmetric", False)), bool(o.get("moving_average", False)),
                    float(o.get("averaging_constant", 0.01)))
        if not 0 <= c.c <= 1:
            raise InvalidArgumentError(f"CalibMovingAverageConstant must be in [0, 1], got {c.c}")
    elif calibrate_method == CalibrationMethod.Entropy:
        c = _Histogram("entropy", bool(o.get("symmetric", False)), int(o.get("num_bins", 128)),
                       int(o.get("num_quantized_bins", 128)), 0.0, "same")
    elif calibrate_method == CalibrationMethod.Percentile:
        pct = float(o.get("percentile", 99.999))
        if not 0 <= pct <= 100:
            raise InvalidArgumentError(f"CalibPercentile must be in [0, 100], got {pct}")
        c = _Histogram("percentile", bool(o.get("symmetric", True)), int(o.get("num_bins", 2048)), 128, pct, "same")
    elif calibrate_method == CalibrationMethod.Distribution:
        scen = o.get("scenario", "same")
        if scen not in ("same", "p3"):
            raise InvalidArgumentError(f"scenario must be 'same' or 'p3', got {scen!r}")
        c = _Histogram("distribution", False, int(o.get("num_bins", 2048)), 128, 0.0, scen)
    else:
        raise InvalidArgumentError(f"unknown calibration method {calibrate_method!r}; expected one of "
                                   f"{', '.join(m.name for m in CalibrationMethod)}")
    return Calibrator(model, tensors_to_calibrate(model, op_types_to_calibrate), c, providers, progress)
