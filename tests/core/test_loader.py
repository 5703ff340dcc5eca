"""Loader: paths and bytes, checker, version ranges, functions, safe external data."""

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import (
    ExternalDataError,
    InvalidModelError,
    ModelLoadError,
    RuntimeCoreError,
    UnsupportedModelError,
)

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def identity_model(**kw):
    return make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": X}, ["y"], **kw)


def test_path_bytes_and_pathlike(tmp_path):
    m = identity_model()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    for src in (str(p), p, m.SerializeToString()):
        out = rt.InferenceSession(src, providers=["cpu"]).run(None, {"x": X})[0]
        np.testing.assert_array_equal(out, X)


def test_missing_file_and_garbage(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        rt.InferenceSession(str(tmp_path / "nope.onnx"))
    (tmp_path / "bad.onnx").write_bytes(b"\x00not a model at all\xff" * 3)
    with pytest.raises(InvalidModelError):
        rt.InferenceSession(str(tmp_path / "bad.onnx"))
    with pytest.raises(ModelLoadError, match="expected a path"):
        rt.InferenceSession(12345)


def test_checker_failure_is_typed():
    m = identity_model()
    m.graph.node[0].input[0] = "undefined_value"
    with pytest.raises(InvalidModelError, match="undefined_value"):
        rt.InferenceSession(m.SerializeToString())


def test_ir_version_out_of_range_names_versions():
    m = identity_model()
    m.ir_version = onnx.IR_VERSION + 5
    with pytest.raises(UnsupportedModelError, match=rf"IR version {onnx.IR_VERSION + 5}.*3 to {onnx.IR_VERSION}"):
        rt.InferenceSession(m.SerializeToString())


def test_opset_out_of_range_names_versions():
    m = identity_model()
    m.opset_import[0].version = 99
    with pytest.raises(UnsupportedModelError, match=r"opset 99 .*ai\.onnx.* 1 to \d+"):
        rt.InferenceSession(m.SerializeToString())


def test_model_local_functions_are_inlined():
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Identity", ["a"], ["t"]), helper.make_node("Identity", ["t"], ["b"])],
                              [helper.make_opsetid("", 17)])
    node = helper.make_node("Twice", ["x"], ["y"], domain="local")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                          functions=[fn])
    m.ir_version = 10
    sess = rt.InferenceSession(m.SerializeToString())
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], X)
    assert {n.op_type for n in sess.get_partition_report().nodes} == {"Identity"}


def external_model(tmp_path: Path, location: str):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = numpy_helper.from_array(w, "w")
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    t.external_data.add(key="location", value=location)
    g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    p = tmp_path / "model" / "m.onnx"
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(m.SerializeToString())
    return p, w


def test_external_data_inside_folder_loads(tmp_path):
    p, w = external_model(tmp_path, "weights.bin")
    (p.parent / "weights.bin").write_bytes(w.tobytes())
    np.testing.assert_array_equal(rt.InferenceSession(str(p)).run(None, {})[0], w)


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "symlinked_dir", "hardlink", "missing"])
def test_unsafe_external_data_is_refused_before_opening(tmp_path, kind, monkeypatch):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.zeros(6, np.float32).tobytes())
    loc = {"absolute": str(secret), "dotdot": "../secret.bin", "symlink": "link.bin",
           "symlinked_dir": "sub/secret.bin", "hardlink": "hard.bin", "missing": "nothere.bin"}[kind]
    p, _ = external_model(tmp_path, loc)
    if kind == "symlink":
        os.symlink(secret, p.parent / "link.bin")
    if kind == "symlinked_dir":
        os.symlink(tmp_path, p.parent / "sub")
    if kind == "hardlink":
        os.link(secret, p.parent / "hard.bin")
    opened = []
    real_open = open

    def spy(file, *a, **k):
        if str(file).endswith(".bin"):
            opened.append(file)
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(ExternalDataError) as ei:
        rt.InferenceSession(str(p))
    assert "'w'" in str(ei.value)
    assert opened == []


def test_external_data_from_bytes_is_refused(tmp_path):
    p, _ = external_model(tmp_path, "weights.bin")
    with pytest.raises(ExternalDataError, match="bytes"):
        rt.InferenceSession(p.read_bytes())


def test_errors_share_one_hierarchy():
    for cls in (ModelLoadError, InvalidModelError, UnsupportedModelError, ExternalDataError):
        assert issubclass(cls, RuntimeCoreError)


def test_long_repeated_attributes_decode_to_shared_values():
    """Long ints / floats / strings attributes (tree ensembles) hold one object per distinct
    value, with the same values as a plain decode: the zeros keep their signs, NaNs stay NaN."""
    from runtime_core.graph.attrs import attr_value

    n = 1000
    floats = [0.0, -0.0, 1.5, float("nan"), -2.25] * (n // 5)
    ints = [7, 123456789, -3, 123456789] * (n // 4)
    strings = ["BRANCH_LEQ", "LEAF", "BRANCH_LT"] * (n // 3)
    fa = attr_value(helper.make_attribute("f", floats))
    ia = attr_value(helper.make_attribute("i", ints))
    sa = attr_value(helper.make_attribute("s", strings))
    assert [type(v) for v in fa] == [float] * n and ia == ints and sa == strings
    got = np.array(fa)
    want = np.array(floats, dtype=np.float32).astype(np.float64)  # FLOATS are float32 on the wire
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert len({id(v) for v in ia}) == 3 and len({id(v) for v in sa}) == 3
    assert len({id(v) for v in fa if v == v}) == 4  # 0.0, -0.0, 1.5, -2.25; each NaN its own
    # short lists decode as before: one object per entry
    assert attr_value(helper.make_attribute("s", ["a", "b"])) == ["a", "b"]
