"""Which optimizer passes a session disables: ``disabled_optimizers=`` and the config entry.

onnxruntime's ``InferenceSession(..., disabled_optimizers=...)`` takes its graph transformer
and rewrite-rule names and ignores names it does not know. Ours: a name of one of our passes
disables it; an onnxruntime name for the same rewrite disables ours (``ORT_ALIASES``); an
onnxruntime name we have no pass for disables nothing (there is nothing to run); any other
name is a typo, refused with the names that exist, since silently ignoring it would leave on
the pass the user meant to turn off.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable

from ..errors import InvalidArgumentError

logger = logging.getLogger("runtime_core.optimizer")

#: onnxruntime's name -> ours, where both name the same rewrite
ORT_ALIASES: dict[str, str] = {
    "EliminateIdentity": "IdentityElimination",
    "EliminateDropout": "DropoutElimination",
    "ConvBNFusion": "ConvBatchNormFusion",
    "SimplifiedLayerNormFusion": "RMSNormFusion",
    "ShapeToInitializer": "ShapeFolding",
    "MatmulTransposeFusion": "MatMulTransposeFusion",
    "MatMulScaleFusion": "MatMulTransposeFusion",  # ours folds the scalar scales too
    "MatMulIntegerToFloatFusion": "DynamicQuantizeMatMulFusion",
    "GemmActivationFusion": "MatMulActivationFusion",
}

#: onnxruntime 1.32's other transformer / rule names: accepted, nothing here to disable
ORT_ONLY: frozenset[str] = frozenset("""
    Avx2WeightS8ToU8Transformer BiasDropoutFusion BiasSkipLayerNormFusion BiasSoftmaxFusion
    CastChainElimination CastFloat16Transformer ConstantSharing ConvAddActivationFusion
    DQMatMulNBitsFusion DivMulFusion DoubleQDQPairsRemover EliminateSlice EmbedLayerNormFusion
    ExpandElimination FreeDimensionOverrideTransformer FuseFp16InitializerToFp32NodeTransformer
    FuseReluClip GatherToSliceFusion GemmSumFusion GemmTransposeFusion
    GqaValueLayoutTransformer GroupQueryAttentionFusion GroupQueryAttentionPreNormFusion
    InsertCastTransformer LabelEncoderFusion MatMulNBitsMlpFusion
    MatMulNBitsQLoRAFusion MatMulNBitsQkvFusion
    MemcpyTransformer NchwcTransformer NhwcTransformer NoopElimination NotWhereFusion
    PreShapeNodeElimination QDQFinalCleanupTransformer QDQPropagationTransformer
    QDQS8ToU8Transformer QDQSelectorActionTransformer QuickGeluFusion RemoveDuplicateCastTransformer
    ReshapeFusion SliceConcatToSpaceToDepthFusion SwiGluFusion TransposeOptimizer UnsqueezeElimination
    Level1_RuleBasedTransformer Level2_RuleBasedTransformer
""".split())


def _names_of(value, source: str) -> list[str]:
    """The names in a list/set/tuple of str, or a comma-separated str (the config entry's form)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [s.strip() for s in value.split(",") if s.strip()]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, bytearray, dict)):
        raise InvalidArgumentError(f"{source} must be a list or set of optimizer names, got "
                                   f"{type(value).__name__}")
    names = list(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InvalidArgumentError(f"{source} must hold optimizer names (str), got {bad[0]!r} "
                                   f"({type(bad[0]).__name__})")
    return [n.strip() for n in names if n.strip()]


def disabled_passes(kwarg, config_entry: str | None, known: Iterable[str]) -> set[str]:
    """Our pass names to skip, from ``disabled_optimizers=`` and the config entry.

    ``known`` is every pass name the pipeline has. Raises :class:`InvalidArgumentError`
    for a wrong type or a name neither we nor onnxruntime have (with the nearest name).
    """
    known = set(known)
    out: set[str] = set()
    for source, value in (("disabled_optimizers", kwarg),
                          ("optimization.disable_specified_optimizers", config_entry)):
        for name in _names_of(value, source):
            if name in known:
                out.add(name)
            elif name in ORT_ALIASES:
                out.add(ORT_ALIASES[name])
            elif name in ORT_ONLY:
                logger.debug("%s: onnxruntime's %s has no counterpart here; nothing to disable", source, name)
            else:
                near = difflib.get_close_matches(name, sorted(known | set(ORT_ALIASES)), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise InvalidArgumentError(
                    f"{source}: unknown optimizer {name!r}{hint}; the passes are: {', '.join(sorted(known))}")
    return out
