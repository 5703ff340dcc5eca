"""Independently built models (PyTorch, exported at test time WITH a dynamic batch axis) on
["opencl", "cpu"]: CNN (ResNet-style with BatchNorm and residuals), depthwise CNN
(MobileNet-style), BERT-style encoder and ViT-style model. Each is compared with
onnxruntime at rtol = atol = 1e-3 at two batch sizes, and >= 95% of its heavy nodes
(Conv/MatMul/Gemm/BatchNormalization/LayerNormalization/Softmax, and any fused contrib op
that would hold one) must run on OpenCL under the default optimization level."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from oracle import assert_close

from opencl_helpers import OCL, ocl, requires_pocl

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/ (for models.builders)

pytestmark = requires_pocl

HEAVY = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization", "Softmax"}
# contrib ops the optimizer could fuse heavy nodes into (only the CPU provider has them)
FUSED = {"Attention", "MultiHeadAttention", "SkipLayerNormalization", "FusedConv", "FusedGemm", "FusedMatMul",
         "EmbedLayerNormalization"}
MODELS = [("rescnn", "torchscript", 17), ("depthwise", "torchscript", 17), ("bert", "torchscript", 17),
          ("bert", "dynamo", 18), ("vit", "torchscript", 17), ("vit", "dynamo", 18)]


def export(name, exporter, opset):
    """``(model bytes, [feeds at two batch sizes])``."""
    if name == "vit":
        from vit_builder import export_vit

        data, feeds, _ = export_vit(exporter, opset, export_batch=2, run_batch=3)
        x2 = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
        return data, [feeds, {"x": x2}]
    from models import builders as B

    e = B.export_torch(name, exporter, opset)
    return e.model, [e.feeds, e.export_feeds]


def heavy_share(report):
    """(heavy nodes on OpenCL, heavy nodes) in the partition report."""
    heavy = [n for n in report.nodes if n.op_type in HEAVY or n.op_type in FUSED]
    return sum(n.provider == OCL for n in heavy), len(heavy)


@pytest.mark.parametrize("name,exporter,opset", MODELS, ids=[f"{m}-{e}{o}" for m, e, o in MODELS])
def test_model_on_opencl_matches_onnxruntime(name, exporter, opset):
    import onnx
    import onnxruntime as ort

    import runtime_core as rt

    try:
        data, feed_sets = export(name, exporter, opset)
    except Exception as exc:  # noqa: BLE001 - an exporter that cannot handle the model
        pytest.skip(f"{exporter} export failed: {type(exc).__name__}: {exc}")
    proto = onnx.load_from_string(data)
    first = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert first.dim_param and not first.HasField("dim_value"), "the batch axis must be dynamic"

    sess = rt.InferenceSession(data, providers=[ocl(), "cpu"])
    on_ocl, total = heavy_share(sess.get_partition_report())
    assert total > 0
    share = on_ocl / total
    print(f"{name} {exporter}{opset}: {on_ocl}/{total} heavy nodes on OpenCL ({share:.0%})")
    assert share >= 0.95, str(sess.get_partition_report())

    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    batches = set()
    for feeds in feed_sets:
        batches.add(next(iter(feeds.values())).shape[0])
        ours = sess.run(None, feeds)
        assert_close(ours, ref.run(None, feeds), 1e-3, 1e-3)
    assert len(batches) == 2  # two specializations of the same partitions
