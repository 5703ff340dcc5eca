"""The pass framework, the pass list and the original basic passes.

Each pass is a small class with a ``name``, the ``level`` it belongs to and an
``apply(graph) -> int`` that returns how many rewrites it made. Passes whose
level is above the session's level, or whose name is listed in the config entry
``optimization.disable_specified_optimizers`` (comma-separated), do not run.

Levels are onnxruntime's: BASIC (1) passes preserve every value bit for bit
(constant and shape folding, CSE, redundant Cast/Transpose/Reshape/Dropout
removal); EXTENDED (2) passes fuse subgraphs into single ops (a standard ONNX op
where the opset has one, else a ``com.microsoft`` op with a CPU kernel in
``runtime_provider_cpu/ops/fused.py``); ALL (99) adds nothing yet. The passes of
one level run in order, repeatedly, until none changes anything.
"""

from __future__ import annotations

from onnx import numpy_helper

from ..graph.attrs import attr_value
from ..graph.ir import Graph
from .base import ALL, BASIC, EXTENDED, FROZEN, Pass, logger  # noqa: F401 - re-exported


class ConstantToInitializer(Pass):
    """``Constant`` nodes become initializers, so providers see them as constants."""

    name = "ConstantToInitializer"

    def apply(self, graph: Graph) -> int:
        keep, changed = [], 0
        for n in graph.nodes:
            if n.op_type == "Constant" and n.domain == "" and len(n.proto_attrs) == 1:
                a = n.proto_attrs[0]
                if a.name == "value":
                    graph.initializers[n.outputs[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    import numpy as np

                    dt = np.float32 if "float" in a.name else np.int64
                    graph.initializers[n.outputs[0]] = np.array(attr_value(a), dtype=dt)
                elif a.name in ("value_string", "value_strings"):
                    import numpy as np

                    graph.initializers[n.outputs[0]] = np.array(attr_value(a), dtype=object)
                else:
                    keep.append(n)
                    continue
                changed += 1
            else:
                keep.append(n)
        graph.nodes = keep
        return changed


class IdentityElimination(Pass):
    """Drop ``Identity`` nodes by renaming their readers (not when the output is a graph output)."""

    name = "IdentityElimination"

    def apply(self, graph: Graph) -> int:
        outputs = set(graph.output_names)
        implicit = {i for n in graph.nodes for i in n.implicit_inputs}
        rename: dict[str, str] = {}
        keep = []
        for n in graph.nodes:
            if (n.op_type == "Identity" and n.domain == "" and n.inputs and n.inputs[0]
                    and n.outputs[0] not in outputs and n.outputs[0] not in implicit):
                src = n.inputs[0]
                rename[n.outputs[0]] = rename.get(src, src)
                continue
            keep.append(n)
        for n in keep:
            n.inputs = [rename.get(i, i) for i in n.inputs]
        graph.nodes = keep
        return len(rename)


class DeadNodeElimination(Pass):
    """Remove nodes none of whose outputs is read or is a graph output."""

    name = "DeadNodeElimination"

    def apply(self, graph: Graph) -> int:
        removed = 0
        while True:
            needed = set(graph.output_names)
            for n in graph.nodes:
                needed.update(n.all_inputs())
            keep = [n for n in graph.nodes if any(o in needed for o in n.outputs if o)]
            if len(keep) == len(graph.nodes):
                break
            removed += len(graph.nodes) - len(keep)
            graph.nodes = keep
        used = set(graph.input_names) | set(graph.output_names)
        for n in graph.nodes:
            used.update(n.all_inputs())
        for name in [k for k in graph.initializers if k not in used]:
            del graph.initializers[name]
        return removed


from .basic import (  # noqa: E402 - the basic passes import Pass from base
    CastElimination,
    CommonSubexpressionElimination,
    ConstantFolding,
    DropoutElimination,
    ReshapeElimination,
    ShapeFolding,
    TransposeElimination,
)
from .fusions import EXTENDED_PASSES  # noqa: E402
from .shapes import fill_missing_shapes  # noqa: E402

OPTIMIZERS: list[Pass] = [
    ConstantToInitializer(), IdentityElimination(), DropoutElimination(), ShapeFolding(), ConstantFolding(),
    CastElimination(), TransposeElimination(), ReshapeElimination(), CommonSubexpressionElimination(),
    DeadNodeElimination(),
    *EXTENDED_PASSES,
]
_dce_after_fusions = DeadNodeElimination()
_dce_after_fusions.level = EXTENDED  # what fusions leave unread (shape computations) goes too
OPTIMIZERS.append(_dce_after_fusions)
from .layout import PROVIDERS, LayoutTransformation  # noqa: E402

OPTIMIZERS.append(LayoutTransformation())

#: how often the passes of one level are repeated at most while they still change something
MAX_ROUNDS = 6


def optimize(graph: Graph, level: int, disabled: set[str] | None = None, *, providers: list | None = None
             ) -> dict[str, int]:
    """Run every enabled pass of ``level`` or below; returns rewrites per pass that ran.

    Passes are grouped by level (BASIC, then EXTENDED, then ALL); each group runs in
    order, again and again, until a round changes nothing (at most ``MAX_ROUNDS``).
    Before the fusions, shapes onnx inference could not give are propagated
    (``shapes.fill_missing_shapes``) so that their shape preconditions can be checked.

    ``providers`` (the session's provider instances, CPU last), when given, makes the
    fusions provider-aware the way onnxruntime's are: the graph is partitioned once after
    the basic passes and nodes another provider takes are left out of every fusion (the
    fused ops are the CPU provider's). Without it, fusions apply everywhere.
    """
    disabled = disabled or set()
    done: dict[str, int] = {}
    prov_token = PROVIDERS.set(tuple(providers or ()))
    try:
        return _optimize(graph, level, disabled, providers, done)
    finally:
        PROVIDERS.reset(prov_token)


def _optimize(graph: Graph, level: int, disabled: set[str], providers, done: dict[str, int]) -> dict[str, int]:
    levels = sorted({p.level for p in OPTIMIZERS})
    for lv in levels:
        if lv > level:
            break
        group = [p for p in OPTIMIZERS if p.level == lv and p.name not in disabled]
        if not group:
            continue
        token = FROZEN.set(_frozen_nodes(graph, providers) if lv > BASIC else frozenset())
        try:
            for _ in range(MAX_ROUNDS):
                changed = 0
                for p in group:
                    if lv > BASIC:
                        fill_missing_shapes(graph)
                    n = p.apply(graph)
                    done[p.name] = done.get(p.name, 0) + n
                    changed += n
                    if n:
                        logger.debug("pass %s: %d rewrite(s)", p.name, n)
                if not changed:
                    break
        finally:
            FROZEN.reset(token)
    return done


def _frozen_nodes(graph: Graph, providers: list | None) -> frozenset:
    """Names of the nodes a provider other than the CPU one would run (trial partition)."""
    if not providers or all(getattr(p, "alias", None) == "cpu" for p in providers):
        return frozenset()
    from ..partition import partition_graph

    try:
        _, report = partition_graph(graph, providers)
    except Exception as exc:  # noqa: BLE001 - the session's own partition reports it properly
        logger.debug("trial partition failed (%s: %s); fusions apply to no node", type(exc).__name__, exc)
        return frozenset(n.name for n in graph.nodes)
    cpu = {p.name for p in providers if getattr(p, "alias", None) == "cpu"}
    return frozenset(n.name for n in report.nodes if n.provider not in cpu)
