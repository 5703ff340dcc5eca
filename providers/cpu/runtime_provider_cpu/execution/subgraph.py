"""Subgraphs (If / Loop / Scan / SequenceMap bodies) compiled into nested executables.

The core hands each body over as a view (``NodeView.subgraphs``, plugin API 1.3: node views
with resolved attributes and inferred types, nested bodies in their own ``subgraphs``), so
this package never reads a subgraph's protobuf. A body is compiled once, when the partition
holding its node compiles, into a nested :class:`~.executable.CPUExecutable` whose inputs are
the body's formal inputs followed by the outer-scope values it reads.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..registry import SCOPE
from .step import STOP


def with_outer(fn, n_explicit: int, names: tuple):
    """Call ``fn`` with the explicit inputs positionally and the implicit ones as ``outer``."""
    def call(ctx, *args, **attrs):
        return fn(ctx, *args[:n_explicit], outer=dict(zip(names, args[n_explicit:])), **attrs)
    return call


def _bodies(node) -> dict:
    """The node's subgraph views by attribute (empty for a view without them)."""
    return dict(getattr(node, "subgraphs", None) or {})


def compile_subgraphs(ctx, node, check_kernels) -> None:
    """Fill ``ctx.subgraphs`` with a :class:`Subgraph` per body of ``node``."""
    for attr, body in _bodies(node).items():
        ctx.subgraphs[attr] = Subgraph(body, check_kernels=check_kernels, parent=ctx)


def subgraph_decline_reason(node, decline) -> str | None:
    """Why a control-flow node cannot run: the first node of its subgraphs (nested ones
    included) that ``decline(view)`` refuses, named with its op. ``None`` when all can run."""
    graphs = getattr(node, "subgraphs", None)
    if graphs is None:
        return f"{node.op_type} has subgraphs, and the core offered no views of them (plugin API < 1.3)"
    for attr in graphs:
        try:
            body = graphs[attr]
        except Exception as exc:  # noqa: BLE001 - a malformed body is declined, not raised
            return f"{node.op_type} subgraph {attr!r} cannot be read: {type(exc).__name__}: {exc}"
        # what a kernel's check may look up while it runs (Gradient: no enclosing graph here)
        token = SCOPE.set((dict(body.opsets), body.value))
        try:
            for view in body.nodes:
                why = decline(view)
                if why:
                    return (f"{node.op_type} subgraph {attr!r} node {view.name!r} "
                            f"({view.domain or 'ai.onnx'}::{view.op_type}): {why}")
        finally:
            SCOPE.reset(token)
    return None


class Subgraph:
    """A compiled body: ``run(inputs, outer)`` returns its outputs as a list.

    ``inputs`` are the values of the body's formal inputs in order; ``outer`` maps
    outer-scope names to values (a superset of what this body reads is fine).
    """

    def __init__(self, body, check_kernels: bool | None = None, parent=None):
        from .executable import CPUExecutable  # a body is a partition like any other

        self.body = body
        self.name = body.name
        self.input_names = list(body.inputs)
        self.output_names = list(body.outputs)
        self.outer_names = list(body.outer_inputs)
        self.output_info = [body.value(o) for o in self.output_names]
        part = SimpleNamespace(nodes=body.nodes, inputs=tuple(self.input_names) + tuple(self.outer_names),
                               outputs=tuple(self.output_names), constants=body.constants, value=body.value,
                               # the enclosing node's session settings (``parent``: its KernelContext)
                               intra_op_num_threads=getattr(parent, "threads", 0),
                               max_tensor_bytes=getattr(parent, "max_tensor_bytes", 0),
                               config={"session.cpu.autotune": "1" if getattr(parent, "tune", True) else "0"})
        self.executable = CPUExecutable(part, check_kernels=check_kernels)

    def run(self, inputs, outer: dict) -> list:
        if len(inputs) != len(self.input_names):
            raise ValueError(f"subgraph {self.name!r} takes {len(self.input_names)} inputs "
                             f"({', '.join(self.input_names)}), got {len(inputs)}")
        try:
            extra = [outer[n] for n in self.outer_names]
        except KeyError as exc:
            raise ValueError(f"subgraph {self.name!r} reads {exc.args[0]!r} from the outer scope, "
                             "which is not bound") from None
        return self.executable.run(list(inputs) + extra, stop=STOP.get())
