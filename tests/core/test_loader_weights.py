"""The loader's weight split: large main-graph initializers are read straight into numpy
arrays (never into protobuf), the rest of the model is parsed and checked as before, and a
malformed initializer is an ``InvalidModelError`` naming it, from a path or from bytes."""

import os
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from oracle import make_model
from runtime_core.errors import InvalidModelError, ModelLoadError, UnsupportedModelError
from runtime_core.graph import Graph, load_model
from runtime_core.graph.loader import STRIP_BYTES, load

CPU = ["CPUExecutionProvider"]
BIG = 2048  # elements: over STRIP_BYTES for every dtype of at least 2 bytes (and 1-byte ones at 8192)

PLAIN = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
         np.int64, np.uint64, np.bool_, np.complex64, np.complex128]


def _values(dtype, n):
    rng = np.random.default_rng(1)
    if dtype == np.bool_:
        return rng.random(n) > 0.5
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(0, 100, n).astype(dtype)


def identity_of(t: onnx.TensorProto, ir_version=10, listed=False) -> onnx.ModelProto:
    """y = Identity(t) (t an initializer; also a graph input when ``listed``)."""
    out = helper.make_tensor_value_info("y", t.data_type if t.data_type in (1, 11) else TensorProto.FLOAT,
                                        [max(d, 0) for d in t.dims])
    ins = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))] if listed else []
    g = helper.make_graph([helper.make_node("Identity", [t.name], ["y"])], "g", ins, [out], initializer=[t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = ir_version
    return m


def sources(m: onnx.ModelProto, tmp_path):
    """The model as a path and as bytes (both loader routes)."""
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    return [str(p), m.SerializeToString()]


@pytest.mark.parametrize("dtype", PLAIN, ids=lambda d: np.dtype(d).name)
def test_large_weights_are_split_off_and_equal_to_onnx(dtype, tmp_path):
    n = BIG * 4 if np.dtype(dtype).itemsize == 1 else BIG
    big = numpy_helper.from_array(_values(dtype, n).reshape(-1, 4), "big")
    small = numpy_helper.from_array(_values(dtype, 4), "small")
    m = identity_of(big)
    m.graph.initializer.append(small)
    for src in sources(m, tmp_path):
        model, weights, _ = load(src)
        assert set(weights) == {"big"}  # the small one stays in protobuf (shape inference reads it)
        arr = weights["big"]
        want = numpy_helper.to_array(big)
        assert arr.dtype == want.dtype and arr.shape == want.shape
        np.testing.assert_array_equal(arr, want)
        assert not arr.flags.writeable  # as numpy_helper.to_array's arrays over protobuf bytes
        stripped = next(t for t in model.graph.initializer if t.name == "big")
        assert not stripped.HasField("raw_data") and list(stripped.dims) == list(big.dims)
        assert stripped.data_type == big.data_type
        g = Graph(model, weights=weights)
        assert g.initializers["big"] is arr
        np.testing.assert_array_equal(g.initializers["small"], numpy_helper.to_array(small))
        # load_model: the whole model again, every weight in protobuf
        full, _ = load_model(src)
        t = next(t for t in full.graph.initializer if t.name == "big")
        assert t.raw_data == big.raw_data


def test_session_runs_on_split_weights_and_saves_them(tmp_path):
    """MatMul + Add -> Gemm on large weights; the optimized model file carries every weight."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
                   {"x": x}, ["y"], initializers={"w": w, "b": b})
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = rt.InferenceSession(str(p), so, providers=CPU)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x @ w + b, rtol=1e-5, atol=1e-5)
    saved = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(saved)
    inits = {t.name: numpy_helper.to_array(t) for t in saved.graph.initializer}
    assert any(v.shape == (64, 64) and np.array_equal(v, w) for v in inits.values())
    again = rt.InferenceSession(so.optimized_model_filepath, providers=CPU).run(None, {"x": x})[0]
    np.testing.assert_allclose(again, x @ w + b, rtol=1e-5, atol=1e-5)


def test_large_initializer_listed_as_graph_input_stays_overridable(tmp_path):
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    x = np.ones((64, 64), np.float32)
    m = make_model([helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("Add", ["x", "nw"], ["y"])],
                   {"x": x}, ["y"], initializers={"w": w})
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 64]))
    for ir in (3, 10):  # IR 3: every initializer must be a graph input (the checker still says so)
        m.ir_version = ir
        for src in sources(m, tmp_path):
            s = rt.InferenceSession(src, providers=CPU)
            assert [i.name for i in s.get_overridable_initializers()] == ["w"]
            assert [i.name for i in s.get_inputs()] == ["x"]
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], x - w)
            assert [n.op_type for n in s._graph.nodes] == ["Neg", "Add"]  # not folded: a feed may replace w


def test_ir3_initializer_missing_from_the_inputs_is_still_refused(tmp_path):
    m = identity_of(numpy_helper.from_array(np.ones(BIG, np.float32), "big"), ir_version=3)
    for src in sources(m, tmp_path):
        with pytest.raises(InvalidModelError, match="big.*not in graph input"):
            rt.InferenceSession(src, providers=CPU)


def test_duplicate_large_initializer_names_are_refused(tmp_path):
    t = numpy_helper.from_array(np.ones(BIG, np.float32), "big")
    m = identity_of(t)
    m.graph.initializer.append(t)
    for src in sources(m, tmp_path):
        with pytest.raises(InvalidModelError, match="big initializer name is not unique"):
            rt.InferenceSession(src, providers=CPU)


def _malformed(kind: str) -> onnx.TensorProto:
    t = numpy_helper.from_array(np.arange(BIG, dtype=np.float32), "bad_weight")
    if kind == "short":
        t.raw_data = t.raw_data[:-4]
    elif kind == "long":
        t.raw_data = t.raw_data + b"\0" * 4
    elif kind == "ragged":
        t.raw_data = t.raw_data[:-1]
    elif kind == "negative_dim":
        t.dims[0] = -BIG
    elif kind == "string":
        t.data_type = TensorProto.STRING
    elif kind == "undefined":
        t.data_type = TensorProto.UNDEFINED
    elif kind == "unknown_type":
        t.data_type = 999
    elif kind == "two_value_fields":
        t.float_data.append(1.0)
    elif kind == "zero_elements":
        del t.dims[:]
        t.dims.extend([0, BIG])
    return t


MALFORMED = ["short", "long", "ragged", "negative_dim", "string", "undefined", "unknown_type", "two_value_fields",
             "zero_elements"]


@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_large_initializer_is_an_invalid_model_naming_it(kind, tmp_path):
    t = _malformed(kind)
    assert len(t.raw_data) > STRIP_BYTES
    for src in sources(identity_of(t), tmp_path):
        with pytest.raises(InvalidModelError, match="bad_weight"):
            rt.InferenceSession(src, providers=CPU)


def test_versions_are_checked_before_initializers(tmp_path):
    m = identity_of(_malformed("long"))
    m.ir_version = onnx.IR_VERSION + 5
    for src in sources(m, tmp_path):
        with pytest.raises(UnsupportedModelError, match="IR version"):
            rt.InferenceSession(src, providers=CPU)


def test_truncated_model_file_is_an_invalid_model(tmp_path):
    """Cut anywhere (inside a weight, a node, a length prefix), a file is refused with a typed
    error, as protobuf's own parse would refuse it."""
    t = numpy_helper.from_array(np.arange(BIG, dtype=np.float32).reshape(-1, 8), "w")
    data = identity_of(t).SerializeToString()
    p = tmp_path / "cut.onnx"
    cuts = sorted({1, 2, 5, 9, 17, 33, len(data) // 3, len(data) // 2, len(data) - 40, len(data) - 9,
                   len(data) - 3, len(data) - 1})
    for cut in cuts:
        p.write_bytes(data[:cut])
        for src in (str(p), data[:cut]):
            with pytest.raises((InvalidModelError, UnsupportedModelError)):
                rt.InferenceSession(src, providers=CPU)


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, wire: int, payload: bytes) -> bytes:
    tag = _varint(num << 3 | wire)
    return tag + (_varint(len(payload)) + payload if wire == 2 else payload)


def test_tensor_fields_in_any_order_and_packed_dims(tmp_path):
    """Protobuf allows any field order and packed repeated fields: raw_data before dims and
    type, packed dims; the split reads it as protobuf does."""
    w = np.arange(BIG, dtype=np.float32).reshape(32, -1)
    dims = b"".join(_varint(d) for d in w.shape)
    tensor = (_field(9, 2, w.tobytes()) + _field(8, 2, b"w") + _field(1, 2, dims)
              + _field(2, 0, _varint(TensorProto.FLOAT)))
    as_onnx = TensorProto()
    as_onnx.ParseFromString(tensor)
    np.testing.assert_array_equal(numpy_helper.to_array(as_onnx), w)
    m = identity_of(numpy_helper.from_array(np.zeros(1, np.float32), "placeholder"))
    del m.graph.initializer[:]
    m.graph.output[0].type.tensor_type.shape.Clear()
    for d in w.shape:
        m.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    m.graph.node[0].input[0] = "w"
    g = m.graph.SerializeToString() + _field(5, 2, tensor)  # the initializer after everything else
    rest = onnx.ModelProto()
    rest.CopyFrom(m)
    rest.ClearField("graph")
    data = rest.SerializeToString() + _field(7, 2, g)
    for src in (data, str(_write(tmp_path / "order.onnx", data))):
        model, weights, _ = load(src)
        assert set(weights) == {"w"}
        np.testing.assert_array_equal(weights["w"], w)
        np.testing.assert_array_equal(rt.InferenceSession(src, providers=CPU).run(None, {})[0], w)


def _write(p, data):
    p.write_bytes(data)
    return p


def test_external_data_large_tensor_with_offset_and_length(tmp_path):
    w = np.arange(BIG, dtype=np.float32).reshape(64, -1)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\x07" * 12 + w.tobytes() + b"\x09" * 8)

    def model_with(length):
        t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(w.shape),
                        data_location=TensorProto.EXTERNAL)
        for k, v in (("location", "weights.bin"), ("offset", "12"), ("length", str(length))):
            t.external_data.add(key=k, value=v)
        p = folder / f"m{length}.onnx"
        p.write_bytes(identity_of(t).SerializeToString())
        return p

    p = model_with(w.nbytes)
    model, weights, _ = load(str(p))
    np.testing.assert_array_equal(weights["w"], w)
    t = model.graph.initializer[0]
    assert t.data_location == TensorProto.DEFAULT and not t.external_data and not t.HasField("raw_data")
    np.testing.assert_array_equal(rt.InferenceSession(str(p), providers=CPU).run(None, {})[0], w)
    full, _ = load_model(str(p))
    np.testing.assert_array_equal(numpy_helper.to_array(full.graph.initializer[0]), w)
    # a length that does not match the tensor's type and dims: typed errors naming it
    for length in (w.nbytes - 4, w.nbytes + 4):
        with pytest.raises(InvalidModelError, match="'?w'?"):
            rt.InferenceSession(str(model_with(length)), providers=CPU)


def test_a_fifo_is_read_as_a_stream(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    import threading

    w = np.arange(BIG, dtype=np.float32)
    data = identity_of(numpy_helper.from_array(w, "w")).SerializeToString()
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(data))
    writer.start()
    try:
        out = rt.InferenceSession(str(fifo), providers=CPU).run(None, {})[0]
    finally:
        writer.join(timeout=10)
    np.testing.assert_array_equal(out, w)


def test_model_proto_input_and_missing_file(tmp_path):
    w = np.arange(BIG, dtype=np.float32)
    m = identity_of(numpy_helper.from_array(w, "w"))
    model, weights, base = load(m)
    assert base is None and set(weights) == {"w"}
    assert m.graph.initializer[0].HasField("raw_data")  # the caller's model is left as it was
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(str(tmp_path / "nope.onnx"))
    with pytest.raises(ModelLoadError, match="directory"):
        load(str(tmp_path))


def test_float_payload_is_little_endian_as_onnx_stores_it():
    """raw_data is little-endian: the split reads it so whatever the bytes' alignment."""
    vals = [1.5, -2.25, 3.0, 1e-3] * (BIG // 4)
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[len(vals)], raw_data=struct.pack(f"<{len(vals)}f",
                                                                                                   *vals))
    m = identity_of(t)
    m.producer_name = "x" * 3  # shifts the payload's offset in the file off 4-byte alignment
    _, weights, _ = load(m.SerializeToString())
    np.testing.assert_array_equal(weights["w"], np.array(vals, np.float32))
    assert weights["w"].ctypes.data % weights["w"].dtype.alignment == 0
