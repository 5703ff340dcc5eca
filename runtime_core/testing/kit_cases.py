"""What the conformance kit records about each case, and the models and samples it builds.

:class:`ScanEntry` is what a provider said about one case's model, :class:`CaseResult` how
running it went; the helpers build the fallback-chain model of a one-node case, the
feeds of the concurrency check and the arrays of the copy check. Split from
:mod:`runtime_core.testing.kit`, which re-exports the public names.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

__all__ = ["CHAIN", "CPU_NAME", "FAILED", "FULL", "NOT_EXERCISED", "PARTIAL", "PASSED", "CaseResult",
           "ConformanceFailure", "ScanEntry"]

FULL, PARTIAL, CHAIN = "claimed", "partial", "chain"
PASSED, FAILED, NOT_EXERCISED = "passed", "failed", "not exercised"
CPU_NAME = "CPUExecutionProvider"


class ConformanceFailure(AssertionError):
    """The provider under test broke a rule of the plugin contract; the message says which."""


@dataclass
class ScanEntry:
    """What the provider said about the nodes of one case's model."""

    case: Any
    nodes: list = field(default_factory=list)          # NodeViews of the model, topological
    claimed: list = field(default_factory=list)        # names of claimed nodes, in claim order
    groups: list = field(default_factory=list)         # lists of names claimed as one group
    declined: dict = field(default_factory=dict)       # name -> reason given
    violations: list = field(default_factory=list)     # capability-contract violations
    unexplained: list = field(default_factory=list)    # unclaimed nodes without a reason
    error: str = ""                                    # the core could not load the model
    cpu_declined: dict = field(default_factory=dict)   # unclaimed nodes the CPU provider declines
    random: str = ""                                   # a node whose result is random (not compared)

    @property
    def id(self) -> str:
        """The case id (``folder/name``)."""
        return self.case.id

    @property
    def name(self) -> str:
        """The case name."""
        return self.case.name

    @property
    def full(self) -> bool:
        """Every node of the model is claimed."""
        return bool(self.nodes) and not self.error and len(set(self.claimed)) == len(self.nodes)

    @property
    def partial(self) -> bool:
        """Some, not all, nodes are claimed."""
        return not self.error and 0 < len(set(self.claimed)) < len(self.nodes)

    @property
    def runnable(self) -> bool:
        """The CPU provider takes every node the provider leaves (so the case can run)."""
        return not self.cpu_declined


@dataclass
class CaseResult:
    """The outcome of running one case (``kind`` is ``claimed``, ``partial`` or ``chain``)."""

    case: str
    kind: str
    outcome: str
    message: str = ""
    reference: str = ""
    location: str = ""   # where the case's model and data are (set for a failure)


def case_location(case, chained: bool = False) -> str:
    """Where ``case``'s model and data sets are, to load and run it alone."""
    dirs = [str(d) for d in getattr(case, "data_dirs", [])]
    data = (dirs[0] if len(dirs) == 1 else f"{len(dirs)} folders: {', '.join(dirs)}") if dirs else "none"
    how = " (the kit chained its node three times in memory)" if chained else ""
    return f"model: {case.model_path}{how}; data sets (input_K.pb / output_K.pb): {data}"


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _member_name(m) -> str | None:
    if isinstance(m, str):
        return m
    return getattr(m, "name", None)


def _successors(nodes) -> list[set[int]]:
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    succ: list[set[int]] = [set() for _ in nodes]
    for i, n in enumerate(nodes):
        for v in list(n.inputs) + list(n.implicit_inputs):
            p = producer.get(v)
            if v and p is not None and p != i:
                succ[p].add(i)
    return succ


def _non_convex_witness(group: set[int], succ: list[set[int]]) -> int | None:
    from ..partition.partitioner import non_convex_witness

    return non_convex_witness(group, succ)


def _tensor_dtypes(node) -> set:
    out = set()
    for vi in tuple(node.input_info) + tuple(node.output_info):
        if vi is not None and vi.kind == "tensor" and vi.dtype is not None:
            out.add(np.dtype(vi.dtype))
    return out


# -- helpers ---------------------------------------------------------------------------
def _compare_expected(expected: list, got: list, rtol: float, atol: float) -> None:
    """The official comparison of the ONNX backend suite (its own rules, where available)."""
    try:
        from ..conformance.compare import compare_outputs
    except ImportError:  # pragma: no cover - older checkouts without the conformance compare
        compare_outputs = None
    if compare_outputs is not None:
        compare_outputs(expected, got, rtol, atol)
        return
    if len(expected) != len(got):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for e, a in zip(expected, got):
        if isinstance(e, list):
            _compare_expected(e, a, rtol, atol)
        elif e is None:
            assert a is None, f"expected an empty optional, got {type(a).__name__}"
        else:
            e = np.asarray(e)
            a = np.asarray(a)
            if e.dtype.kind in "OUS":
                np.testing.assert_array_equal(a, e)
            else:
                np.testing.assert_allclose(a.astype(np.float64) if a.dtype.kind not in "fc" else a,
                                           e.astype(np.float64) if e.dtype.kind not in "fc" else e,
                                           rtol=rtol, atol=atol)


RANDOM_OPS = frozenset({"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
                        "Multinomial", "Bernoulli"})


def _is_random(node) -> bool:
    """Nodes whose outputs are random draws: two sessions cannot be compared on them."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in RANDOM_OPS:
        return True
    # Dropout in training mode (a training_mode input) draws its mask
    return node.op_type == "Dropout" and len(node.inputs) > 2 and bool(node.inputs[2])


def _chain_input(node) -> int | None:
    """The index of an input with the exact (static) type of the node's only output, or None."""
    if len(node.outputs) != 1 or not node.outputs[0]:
        return None
    out = node.output_info[0]
    if out is None or out.kind != "tensor" or out.dtype is None or out.static_shape is None:
        return None
    if node.implicit_inputs:
        return None
    for k, vi in enumerate(node.input_info):
        if vi is None or vi.kind != "tensor" or vi.is_constant:
            continue
        if vi.dtype == out.dtype and vi.static_shape == out.static_shape:
            return k
    return None


def _chain_model(model: onnx.ModelProto, view) -> tuple[onnx.ModelProto, list[str]]:
    """The model's one node three times over: output k feeds input ``_chain_input`` of k+1."""
    k = _chain_input(view)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    (proto,) = list(g.node)
    out = proto.output[0]
    # the chained copies' outputs have the original output's type: say so (onnx cannot infer
    # every op, and a provider that needs types would decline the copies)
    declared = next((vi.type for vi in list(g.output) + list(g.value_info)
                     if vi.name == out and vi.type.WhichOneof("value")), None)
    del g.node[:]
    del g.value_info[:]
    names = []
    prev = None
    for i in range(3):
        n = onnx.NodeProto()
        n.CopyFrom(proto)
        n.name = f"{view.name}__kit{i}"
        if prev is not None:
            n.input[k] = prev
        n.output[0] = out if i == 2 else f"{out}__kit{i}"
        prev = n.output[0]
        names.append(n.name)
        g.node.append(n)
        if i < 2 and declared is not None:
            g.value_info.add(name=prev).type.CopyFrom(declared)
    return m, names


def _flipped(inputs: list) -> list:
    """The same feeds with every float tensor's elements in reverse order (same values, other places)."""
    out = []
    for v in inputs:
        if isinstance(v, np.ndarray) and v.dtype.kind in "fc" and v.size > 1:
            v = np.ascontiguousarray(v.reshape(-1)[::-1].reshape(v.shape))
        out.append(v)
    return out


def _copy_samples(dtype: np.dtype) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    if dtype.kind in "OUS":
        base = np.array(["a", "", "longer string", "ünïcode", "x"] * 12, dtype=object).reshape(3, 4, 5)
        base = base.astype(dtype) if dtype.kind != "O" else base
    elif dtype.kind == "b":
        base = rng.random((3, 4, 5)) > 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        base = rng.integers(info.min, info.max, size=(3, 4, 5), dtype=dtype, endpoint=True)
        base.reshape(-1)[:2] = (info.min, info.max)
    else:
        try:
            vals = rng.standard_normal((3, 4, 5)) * 100
            base = vals.astype(dtype)
            if dtype.kind == "c":
                base = (vals + 1j * vals[::-1]).astype(dtype)
            specials = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(dtype)
            base.reshape(-1)[:4] = specials
        except (TypeError, ValueError):
            base = np.zeros((3, 4, 5), dtype)
    # every sample owns its memory (views of their own copy), so changing one changes no other
    samples = [
        ("shape [3, 4, 5]", base.copy()),
        ("scalar", base.reshape(-1)[:1].reshape(()).copy()),
        ("shape [0]", base.reshape(-1)[:0].copy()),
        ("shape [2, 0, 3]", np.empty((2, 0, 3), base.dtype)),
        ("shape [1]", base.reshape(-1)[1:2].copy()),
        ("transposed (not contiguous)", base.copy().transpose(2, 0, 1)),
        ("strided slice", base.copy()[:, ::2, 1:]),
    ]
    if dtype.kind not in "OUS":
        ro = base.copy()
        ro.setflags(write=False)
        samples.append(("read-only", ro))
    return samples


@contextlib.contextmanager
def _helper_registered():
    """Register the kit's helper provider for the duration (then rescan the installed plugins)."""
    from ..plugin.registry import reload_plugins
    from .split import entry_points_with_split

    reload_plugins(entry_points_with_split())
    try:
        yield
    finally:
        reload_plugins()
