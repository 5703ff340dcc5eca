"""The pass list and ``optimize``, which runs it.

Each pass is a small class with a ``name``, the ``level`` it belongs to and an
``apply(graph) -> int`` that returns how many rewrites it made; most are rewrite rules
(``rewrite.py``) and consecutive rules of one level are walked together, once per
round. Passes whose level is above the session's level, or whose name is listed in the
config entry ``optimization.disable_specified_optimizers`` (comma-separated), do not run.

Levels are onnxruntime's: BASIC (1) passes preserve every value bit for bit
(``cleanup.py``, ``folding.py``: constant and shape folding, ``elimination.py``: CSE,
redundant Cast/Transpose/Reshape/Dropout removal); EXTENDED (2) passes fuse subgraphs
into single ops (a standard ONNX op where the opset has one, else a ``com.microsoft`` op
the CPU provider implements, or a ``runtime_core.fused`` one that only it runs, written back
as standard ops in a saved model: ``portable.py``; ``linear_fusions.py``, ``gelu_fusions.py``,
``norm_fusions.py``, ``attention.py``, ``qdq_fusions.py``, ``dynq_fusions.py``); ALL (99) adds the channels-last layout for
providers that ask for it (``layout.py``) and the transposes and scales folded into products of
computed tensors (``matmul_fusions.py``). The passes of one level run in order,
repeatedly, until none changes anything.
"""

from __future__ import annotations

from typing import Mapping

from ..graph.ir import Graph
from .attention import AttentionFusion
from .cleanup import ConstantToInitializer, DeadNodeElimination, IdentityElimination
from .editor import BASIC, EXTENDED, FROZEN, Pass, logger
from .dynq_fusions import DynamicQuantizeMatMulFusion
from .nbits_fusions import MatMulNBitsBiasFusion
from .elimination import (
    CastElimination,
    CommonSubexpressionElimination,
    DropoutElimination,
    ReshapeElimination,
    TransposeElimination,
)
from .fallback import CURRENT as FALLBACK
from .fallback import FallbackProvider
from .folding import MAX_BYTES, ConstantFolding, ShapeFolding, max_bytes_from_config
from .gelu_fusions import BiasGeluFusion, FastGeluFusion, GeluFusion
from .layout import PROVIDERS, LayoutTransformation
from .matmul_fusions import MatMulTransposeFusion, ScaledDotProductFusion
from .linear_fusions import (
    Conv1dAs2dFusion,
    ConvActivationFusion,
    ConvAddFusion,
    ConvBatchNormFusion,
    ConvMulFusion,
    FlattenedGemmFusion,
    LayerScaleFusion,
    MatMulActivationFusion,
    MatMulAddFusion,
    SqueezeExciteFusion,
)
from .norm_fusions import LayerNormFusion, RMSNormFusion, SkipLayerNormFusion, SkipSimplifiedLayerNormFusion
from .qdq_fusions import (
    QDQAddFusion,
    QDQConvFusion,
    QDQGemmFusion,
    QDQGlobalAveragePoolFusion,
    QDQMatMulFusion,
    QDQMaxPoolFusion,
)
from .rewrite import RewriteRule, walk
from .shapes import fill_missing_shapes, refine_symbols

#: the fusions in the order they are offered a node: the flattened Gemm first (the MatMul +
#: Add it leaves feeds the others), activations (BiasGelu needs Gelu), LayerNorm before SkipLN,
#: attention before SkipLN (its output feeds the residual Add)
EXTENDED_PASSES: list[Pass] = [
    FlattenedGemmFusion(), Conv1dAs2dFusion(), ConvBatchNormFusion(), ConvAddFusion(), ConvMulFusion(), ConvActivationFusion(),
    SqueezeExciteFusion(),
    GeluFusion(), FastGeluFusion(), LayerNormFusion(), RMSNormFusion(), AttentionFusion(), SkipLayerNormFusion(),
    SkipSimplifiedLayerNormFusion(), BiasGeluFusion(),
    LayerScaleFusion(), MatMulAddFusion(), QDQConvFusion(), QDQMatMulFusion(), QDQGemmFusion(),
    QDQAddFusion(), QDQGlobalAveragePoolFusion(), QDQMaxPoolFusion(), DynamicQuantizeMatMulFusion(), MatMulNBitsBiasFusion(),
]

_dce_after_fusions = DeadNodeElimination()
_dce_after_fusions.level = EXTENDED  # what fusions leave unread (shape computations) goes too

OPTIMIZERS: list[Pass] = [
    ConstantToInitializer(), IdentityElimination(), DropoutElimination(), ShapeFolding(), ConstantFolding(),
    CastElimination(), TransposeElimination(), ReshapeElimination(), CommonSubexpressionElimination(),
    DeadNodeElimination(),
    *EXTENDED_PASSES,
    _dce_after_fusions,
    MatMulActivationFusion(),
    MatMulTransposeFusion(),
    ScaledDotProductFusion(),
    LayoutTransformation(),
]

#: how often the passes of one level are repeated at most while they still change something
MAX_ROUNDS = 6


def optimize(graph: Graph, level: int, disabled: set[str] | None = None, *, providers: list | None = None,
             config: Mapping[str, str] | None = None) -> dict[str, int]:
    """Run every enabled pass of ``level`` or below; returns rewrites per pass that ran.

    Passes are grouped by level (BASIC, then EXTENDED, then ALL); each group runs in
    order, again and again, until a round changes nothing (at most ``MAX_ROUNDS``).
    Before the fusions, shapes onnx inference could not give are propagated
    (``shapes.fill_missing_shapes``) so that their shape preconditions can be checked.

    ``providers`` (the session's provider instances, CPU last), when given, makes the
    fusions provider-aware the way onnxruntime's are: the graph is partitioned once after
    the basic passes and nodes another provider takes are left out of every fusion (the
    fused ops are the CPU provider's). Without it, fusions apply everywhere.

    ``config`` holds the session config entries (``optimization.constant_folding_max_bytes``).
    Folding and "may a fusion emit this node" are asked of the registered CPU provider
    (``fallback.py``), whichever passes run.
    """
    disabled = disabled or set()
    done: dict[str, int] = {}
    cap = max_bytes_from_config(config)  # a bad entry raises before anything is set
    tokens = [(PROVIDERS, PROVIDERS.set(tuple(providers or ()))), (MAX_BYTES, MAX_BYTES.set(cap)),
              (FALLBACK, FALLBACK.set(FallbackProvider.from_registry()))]
    try:
        return _optimize(graph, level, disabled, providers, done)
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


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
                for step in _steps(group):
                    if lv > BASIC:
                        fill_missing_shapes(graph)
                        if refine_symbols(graph):
                            fill_missing_shapes(graph)
                    counts = walk(graph, step) if isinstance(step, list) else {step.name: step.apply(graph)}
                    for name, n in counts.items():
                        done[name] = done.get(name, 0) + n
                        changed += n
                        if n:
                            logger.debug("pass %s: %d rewrite(s)", name, n)
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


def _steps(group: list[Pass]) -> list:
    """The passes of a level in order, consecutive rewrite rules gathered into one walk."""
    steps: list = []
    for p in group:
        if isinstance(p, RewriteRule):
            if not steps or not isinstance(steps[-1], list):
                steps.append([])
            steps[-1].append(p)
        else:
            steps.append(p)
    return steps
