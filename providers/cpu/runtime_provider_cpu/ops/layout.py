"""Reference kernels of the ``runtime_core.nhwc`` ops (the layout pass of ORT_ENABLE_ALL).

``runtime_core.nhwc::<Op>`` is the ai.onnx op ``<Op>`` at schema version
``since_version`` (an attribute) on channels-last activations: input and output are
NHWC, weights keep the ONNX layout. The core emits these only for nodes whose provider
asks for NHWC; these kernels let the CPU provider run them anywhere (transpose, run the
ai.onnx kernel, transpose back).
"""

from __future__ import annotations

import numpy as np
import onnx.defs

from ..registry import REGISTRY, kernel

NHWC = "runtime_core.nhwc"
_TO_NCHW, _TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _base(node):
    ver = node.attrs.get("since_version")
    spec = REGISTRY.lookup("", node.op_type, int(ver)) if ver is not None else None
    return spec, ver


def _check(node):
    spec, ver = _base(node)
    if ver is None:
        return f"{NHWC}::{node.op_type} needs its since_version attribute"
    if spec is None:
        return f"{NHWC}::{node.op_type}: ai.onnx::{node.op_type}-{ver} is not implemented by the CPU provider"
    info = node.input_info[0] if node.input_info else None
    if info is not None and info.shape is not None and len(info.shape) != 4:
        return f"{NHWC}::{node.op_type} takes 4-D NHWC input, got rank {len(info.shape)}"
    return None


def _nhwc(op: str):
    def k(ctx, x, *rest, since_version, **attrs):
        spec = REGISTRY.lookup("", op, int(since_version))
        names = onnx.defs.get_schema(op, int(since_version), "").attributes
        kw = {a: attrs.get(a) for a in names}
        y = spec.fn(ctx, np.transpose(x, _TO_NCHW), *rest, **kw)
        return np.ascontiguousarray(np.transpose(y, _TO_NHWC))

    k.__name__ = f"nhwc_{op.lower()}"
    return kernel(op, 1, domain=NHWC, check=_check)(k)


for _op in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool"):
    _nhwc(_op)
