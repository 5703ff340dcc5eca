"""What the OpenCL provider declines, and the reasons it gives (no device needed here)."""

from __future__ import annotations

import numpy as np
import pytest

from opencl_helpers import node_view, requires_package, requires_pocl, vi

pytestmark = requires_package

F = np.float32


def reason(node):
    from runtime_provider_opencl import ops  # noqa: F401
    from runtime_provider_opencl.plugin import decline_reason
    from runtime_provider_opencl.registry import REGISTRY

    return decline_reason(node, REGISTRY.get(node.op_type))


def relu(x_shape=(2, 8), dtype=F, since=14, y_shape=None):
    return node_view("Relu", [vi("x", x_shape, dtype)], [vi("y", y_shape or x_shape, dtype)], since=since)


def test_supported_nodes_have_no_reason():
    assert reason(relu()) is None
    mm = node_view("MatMul", [vi("a", (2, 3)), vi("b", (3, 4))], [vi("y", (2, 4))])
    assert reason(mm) is None


@pytest.mark.parametrize("node", [
    relu(("N", 8)), relu((None, 8)), relu(("N", 8), dtype=np.float16), relu(None),
    node_view("MatMul", [vi("a", ("B", "T", 16)), vi("b", (16, 4))], [vi("y", None)]),
    node_view("Conv", [vi("x", ("N", 3, "H", "W")), vi("w", (8, 3, 3, 3))], [vi("y", ("N", 8, None, None))],
              since=11, attrs={"auto_pad": "NOTSET", "group": 1, "pads": [1, 1, 1, 1]}),
    node_view("Reshape", [vi("x", ("N", 4, 4)), vi("s", (2,), np.int64)], [vi("y", None)], since=14,
              attrs={"allowzero": 0}),
])
def test_symbolic_dims_are_claimed_and_specialized_at_run_time(node):
    assert reason(node) is None


@pytest.mark.parametrize("node,expect", [
    (node_view("NonZero", [vi("x", (3,))], [vi("y", (1, 3), np.int64)]),
     "op NonZero is not implemented by the OpenCL provider"),
    (node_view("FusedGemm", [vi("x", (3,))], [vi("y", (3,))], domain="com.microsoft"),
     "op com.microsoft::FusedGemm is not implemented"),
    (node_view("Add", [vi("a", (3,)), vi("b", (3,))], [vi("y", (3,))], since=6),
     "Add version 6 (opset 6) is not implemented; the OpenCL provider has versions 7, 13, 14"),
    (node_view("Add", [vi("a", (3,), np.int64), vi("b", (3,), np.int64)], [vi("y", (3,), np.int64)]),
     "int64; OpenCL kernels here take float32, float16 (integer tensors, such as shape computations, "
     "stay on CPU)"),
    (relu(dtype=np.float64), "is float64; OpenCL kernels here take float32, float16"),
    (relu(dtype=None), "has an unknown element type"),
    (node_view("Softmax", [vi("x", None)], [vi("y", None)], attrs={"axis": -1}),
     "unknown shape, not even its rank"),
    (relu((0, 8)), "is empty (0, 8)"),
    (node_view("Gelu", [vi("x", (3,))], [vi("y", (3,))], since=20, attrs={"approximate": "erf?"}),
     "Gelu approximate='erf?'"),
    (node_view("LayerNormalization", [vi("x", (2, 4)), vi("s", (4,))], [vi("y", (2, 4))], since=17,
               attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 0}), "stash_type=0"),
    (node_view("Conv", [vi("x", (1, 1, 4, 4, 4)), vi("w", (1, 1, 2, 2, 2))], [vi("y", (1, 1, 3, 3, 3))],
               since=11, attrs={"auto_pad": "NOTSET", "group": 1}), "only 1-D and 2-D convolutions"),
    (node_view("Clip", [vi("x", (3,)), vi("lo", ()), None], [vi("y", (3,))], since=13),
     "Clip min is not a constant initializer"),
    (node_view("MatMul", [vi("a", (2, 3)), vi("b", (4, 5))], [vi("y", (2, 5))]),
     "MatMul inner dimensions differ"),
    (node_view("Concat", [vi("a", (2, 3)), vi("b", (2, 3), np.bool_)], [vi("y", (4, 3))], attrs={"axis": 0}),
     "Concat inputs have several dtypes"),
    (node_view("Unsqueeze", [vi("s", (2,), np.int64), vi("axes", (1,), np.int64)], [vi("y", (1, 2), np.int64)]),
     "int64; OpenCL kernels here take float32, float16, bool (integer tensors, such as shape computations, "
     "stay on CPU)"),
    (node_view("MaxPool", [vi("x", (1, 1, 4, 4))], [vi("y", (1, 1, 2, 2)), vi("i", (1, 1, 2, 2), np.int64)],
               since=12, attrs={"kernel_shape": [2, 2], "strides": [2, 2]}), "output 1 'i' is int64"),
    (node_view("BatchNormalization", [vi("x", (2, 3, 4)), vi("s", (3,)), vi("b", (3,)), vi("m", (3,)),
                                      vi("v", (3,))], [vi("y", (2, 3, 4))], since=15,
               attrs={"epsilon": 1e-5, "training_mode": 1}), "training_mode=1"),
    (node_view("Reshape", [vi("x", ("N", 4)), vi("s", (2,), np.float32)], [vi("y", None)], since=14),
     "Reshape shape is not an int64 tensor"),
    (node_view("Conv", [vi("x", ("N", 1, 4, 4, 4)), vi("w", (1, 1, 2, 2, 2))], [vi("y", None)],
               since=11, attrs={"auto_pad": "NOTSET", "group": 1}), "only 1-D and 2-D convolutions"),
])
def test_declines_with_a_precise_reason(node, expect):
    why = reason(node)
    assert why is not None and expect in why, why


def test_every_registered_op_has_versions_the_installed_onnx_knows():
    import onnx.defs

    from runtime_provider_opencl import ops  # noqa: F401
    from runtime_provider_opencl.registry import REGISTRY

    known = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "":
            known.setdefault(s.name, set()).add(s.since_version)
    for op_type, spec in REGISTRY.items():
        assert set(spec.versions) <= known[op_type] | {v for v in spec.versions if v > max(known[op_type])}, op_type


@requires_pocl
def test_provider_level_declines(provider, monkeypatch):
    from opencl_helpers import graph_view

    x, r, s = vi("x", (2, 3)), vi("r", (2, 3)), vi("s", (2,), np.int64)
    relu_node = node_view("Relu", [x], [r], since=14, name="relu")
    shape_of_r = node_view("Shape", [r], [s], since=15, attrs={"start": 0, "end": None}, name="shape_r")
    shape_of_x = node_view("Shape", [x], [vi("s2", (2,), np.int64)], since=15,
                           attrs={"start": 0, "end": None}, name="shape_x")
    cap = provider.get_capability(graph_view(relu_node, shape_of_r, shape_of_x))
    assert [n.name for n in cap.claims] == ["relu", "shape_r"]
    assert "Shape of a value that is not computed on OpenCL stays on CPU" in cap.declined["shape_x"]
    monkeypatch.setattr(provider.dev, "max_alloc", 16)
    cap = provider.get_capability(graph_view(relu_node))
    assert "over the device's largest allocation (16 bytes)" in cap.declined["relu"]
