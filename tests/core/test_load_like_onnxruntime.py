"""Models and feeds onnxruntime takes and the strict onnx checker does not: graph inputs and
outputs without a shape or type, value_info without a type, model-local functions importing
another opset, dict feeds for maps, object arrays for strings. Real defects stay typed errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import runtime_core as rt
from runtime_core.errors import InputTypeError, InvalidModelError, UnsupportedModelError

ort = pytest.importorskip("onnxruntime")
_OrtInvalidArgument = ort.capi.onnxruntime_pybind11_state.InvalidArgument


def _shapeless(name, elem=T.FLOAT):
    vi = h.make_tensor_value_info(name, elem, None)
    vi.type.tensor_type.ClearField("shape")
    return vi


def _both(model: onnx.ModelProto, feeds):
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = rt.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)
    return got


def test_shapeless_io_and_untyped_value_info_load():
    g = h.make_graph([h.make_node("Relu", ["X"], ["Z"]), h.make_node("ReduceSum", ["Z"], ["Y"], keepdims=0)],
                     "g", [_shapeless("X")], [_shapeless("Y")], value_info=[onnx.ValueInfoProto(name="Z")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)  # what the strict checker says
    _both(model, {"X": np.arange(-3, 3, dtype=np.float32).reshape(2, 3)})


def test_outputs_declared_by_name_only_load():
    g = h.make_graph([h.make_node("Relu", ["X"], ["Z"]), h.make_node("Neg", ["Z"], ["Y"])], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, [None, 2])],
                     [onnx.ValueInfoProto(name="Y"), onnx.ValueInfoProto(name="Z")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    _both(model, {"X": np.array([[1, -2]], np.float32)})


def test_shapeless_subgraph_io_load():
    body = h.make_graph([h.make_node("Neg", ["X"], ["B"])], "then", [], [_shapeless("B")])
    other = h.make_graph([h.make_node("Identity", ["X"], ["E"])], "else", [], [_shapeless("E")])
    g = h.make_graph([h.make_node("If", ["C"], ["Y"], then_branch=body, else_branch=other)], "g",
                     [h.make_tensor_value_info("C", T.BOOL, []), h.make_tensor_value_info("X", T.FLOAT, [2])],
                     [_shapeless("Y")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    for c in (True, False):
        _both(model, {"C": np.array(c), "X": np.array([1, -2], np.float32)})


def test_real_defects_still_typed_errors_naming_the_value():
    untyped_input = h.make_graph([h.make_node("Relu", ["X"], ["Y"])], "g", [onnx.ValueInfoProto(name="X")],
                                 [_shapeless("Y")])
    with pytest.raises(InvalidModelError):
        rt.InferenceSession(h.make_model(untyped_input, opset_imports=[h.make_opsetid("", 17)]).SerializeToString())
    undefined = h.make_graph([h.make_node("Relu", ["nowhere"], ["Y"])], "g", [_shapeless("X")], [_shapeless("Y")])
    with pytest.raises(InvalidModelError, match="nowhere"):
        rt.InferenceSession(h.make_model(undefined, opset_imports=[h.make_opsetid("", 17)]).SerializeToString())


def test_input_type_the_schema_refuses_is_invalid_model_naming_node_and_value():
    # skl2onnx writes map(string, bool) for DictVectorizer; onnxruntime says InvalidGraph "Type Error"
    map_bool = h.make_value_info("feats", h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(T.BOOL, [1])))
    node = h.make_node("DictVectorizer", ["feats"], ["Y"], domain="ai.onnx.ml", string_vocabulary=["a", "b"])
    g = h.make_graph([node], "g", [map_bool], [h.make_tensor_value_info("Y", T.BOOL, [1, 2])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)])
    with pytest.raises(Exception, match="(?i)type error"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidModelError, match=r"Type Error: Type 'map\(string,tensor\(bool\)\)' of input "
                                                r"parameter \(feats\) of operator \(DictVectorizer\)"):
        rt.InferenceSession(model.SerializeToString())


# -- model-local functions importing another opset -------------------------------------------------

def _fn_model(fn, model_opsets):
    g = h.make_graph([h.make_node(fn.name, ["X"], ["Y"], domain=fn.domain)], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, [None, 2])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [None, 2])])
    return h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in model_opsets.items()], functions=[fn])


def test_function_at_older_default_opset_is_inlined():
    # skl2onnx's KNN imputer: functions at opset 21 inside a model at 22
    fn = h.make_function("local", "nan_to_zero", ["a"], ["b"], [
        h.make_node("IsNaN", ["a"], ["n"]),
        h.make_node("Constant", [], ["z"], value=h.make_tensor("z", T.FLOAT, [], [0.0])),
        h.make_node("Where", ["n", "z", "a"], ["b"])], opset_imports=[h.make_opsetid("", 21)])
    model = _fn_model(fn, {"": 22, "local": 1})
    _both(model, {"X": np.array([[1, np.nan], [np.nan, -3]], np.float32)})


def test_function_at_other_ml_opset_is_inlined_when_its_ops_did_not_change():
    fn = h.make_function("local", "norm", ["a"], ["b"],
                         [h.make_node("Normalizer", ["a"], ["b"], domain="ai.onnx.ml", norm="L1")],
                         opset_imports=[h.make_opsetid("ai.onnx.ml", 2), h.make_opsetid("", 21)])
    model = _fn_model(fn, {"": 22, "ai.onnx.ml": 3, "local": 1})
    _both(model, {"X": np.array([[1, 3], [2, 2]], np.float32)})


def test_function_whose_op_changed_is_refused_naming_it():
    fn = h.make_function("local", "rs", ["a"], ["b"], [h.make_node("ReduceSum", ["a"], ["b"], axes=[1], keepdims=1)],
                         opset_imports=[h.make_opsetid("", 12)])
    model = _fn_model(fn, {"": 22, "local": 1})
    with pytest.raises((InvalidModelError, UnsupportedModelError), match="ReduceSum"):
        rt.InferenceSession(model.SerializeToString())


# -- feeds -----------------------------------------------------------------------------------

def _dict_vectorizer(value_elem):
    mt = h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(value_elem, [1]))
    node = h.make_node("DictVectorizer", ["feats"], ["Y"], domain="ai.onnx.ml", string_vocabulary=["a", "b", "c"])
    out = T.FLOAT if value_elem == T.FLOAT else value_elem
    g = h.make_graph([node], "g", [h.make_value_info("feats", mt)], [h.make_tensor_value_info("Y", out, [1, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)])


@pytest.mark.parametrize("feed", [{"a": 1.5, "c": 2}, {"b": True, "zz": 3.0}, {"a": np.float64(0.25)}])
def test_dict_feeds_a_map_input(feed):
    _both(_dict_vectorizer(T.FLOAT), {"feats": feed})


@pytest.mark.parametrize("bad", [{1: 2.0}, {"a": "x"}, [{"a": 1.0}], np.array([1.0])])
def test_bad_map_feed_is_input_type_error(bad):
    sess = rt.InferenceSession(_dict_vectorizer(T.FLOAT).SerializeToString())
    with pytest.raises(InputTypeError, match="feats"):
        sess.run(None, {"feats": bad})
    with pytest.raises((RuntimeError, ValueError, TypeError, _OrtInvalidArgument)):  # onnxruntime refuses them too
        ort.InferenceSession(_dict_vectorizer(T.FLOAT).SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, {"feats": bad})


def test_int64_map_values_as_numpy_arrays_are_refused_as_by_onnxruntime():
    # onnxruntime reads a dict of numpy arrays as map(string,tensor(float)) and refuses it for an
    # int64 map (skl2onnx's dict_vectorizer_pipeline_int relies on that)
    model = _dict_vectorizer(T.INT64).SerializeToString()
    feed = {"a": np.array(1, np.int64), "c": np.array(2, np.int64)}
    with pytest.raises(_OrtInvalidArgument):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"feats": feed})
    with pytest.raises(InputTypeError, match="numpy array is not an int64 value"):
        rt.InferenceSession(model).run(None, {"feats": feed})
    # Python ints: onnxruntime's binding feeds no int64 map at all; we do
    (got,) = rt.InferenceSession(model).run(None, {"feats": {"a": 1, "c": 2}})
    np.testing.assert_array_equal(got, np.array([[1, 0, 2]], np.int64))


def test_list_of_dicts_feeds_a_sequence_of_maps():
    # no standard op reads seq(map) (ZipMap writes it) and onnxruntime cannot feed a graph output
    # straight from its input: the pass-through graph checks the conversion itself
    st = h.make_sequence_type_proto(h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))
    g = h.make_graph([], "g", [h.make_value_info("S", st)], [h.make_value_info("S", st)])
    sess = rt.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString())
    (got,) = sess.run(None, {"S": [{1: 0.5, np.int64(2): 1}, {3: True}, {}]})
    assert got == [{1: 0.5, 2: 1.0}, {3: 1.0}, {}]
    assert all(type(k) is int and type(v) is float for d in got for k, v in d.items())
    with pytest.raises(InputTypeError, match="'S'"):
        sess.run(None, {"S": [{"a": 1.0}]})
    with pytest.raises(InputTypeError, match="'S'"):
        sess.run(None, {"S": {1: 1.0}})


def test_object_array_to_string_tensor_elementwise_str():
    g = h.make_graph([h.make_node("Identity", ["X"], ["Y"])], "g", [h.make_tensor_value_info("X", T.STRING, None)],
                     [h.make_tensor_value_info("Y", T.STRING, None)])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    sessions = [ort.InferenceSession(data, providers=["CPUExecutionProvider"]), rt.InferenceSession(data)]
    feeds = [np.array([b"ab", 1.5, None, np.nan, "x", 3, True, np.float32(2.5)], dtype=object),
             np.array([b"ab", "cé".encode()]), np.array([["1.5", "é"]]), np.array([[1.5, 2.0]], dtype=object),
             np.array("nan", dtype=object)]
    for x in feeds:
        want, got = (s.run(None, {"X": x})[0] for s in sessions)
        assert got.shape == want.shape and got.tolist() == want.tolist()


def test_label_encoder_finds_nan_key_from_object_feed():
    # skl2onnx's OrdinalEncoder with encoded_missing_value: the key is the string 'nan'
    node = h.make_node("LabelEncoder", ["X"], ["Y"], domain="ai.onnx.ml", keys_strings=["a", "nan"],
                       values_int64s=[1, 42], default_int64=-1)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("X", T.STRING, [None])],
                     [h.make_tensor_value_info("Y", T.INT64, [None])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 2)])
    got = _both(model, {"X": np.array(["a", np.nan, "b"], dtype=object)})
    assert got[0].tolist() == [1, 42, -1]


def _sparse_model(idx):
    values = h.make_tensor("C", T.FLOAT, [3], [3.0, 1.0, 2.0])
    sparse = h.make_sparse_tensor(values, h.make_tensor("C_i", T.INT64, [3], idx), [2, 3])
    g = h.make_graph([h.make_node("Add", ["X", "C"], ["Y"])], "g", [h.make_tensor_value_info("X", T.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [2, 3])], sparse_initializer=[sparse])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_sparse_initializer_with_unordered_indices_loads():
    # the checker wants COO indices in order; onnxruntime takes them as given (skl2onnx writes such).
    # Only loading is checked here: running a sparse initializer fails on this branch for another
    # reason (onnx 1.23's reference SparseTensor has .shape, the core reads .dense_shape)
    from runtime_core.graph.loader import load

    model = _sparse_model([5, 0, 2])
    with pytest.raises(onnx.checker.ValidationError, match="sorted"):
        onnx.checker.check_model(model)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    loaded = load(model.SerializeToString()).model
    assert list(loaded.graph.sparse_initializer[0].indices.int64_data) == [5, 0, 2]  # the model is unchanged
    with pytest.raises(InvalidModelError):  # a repeated index stays a defect
        load(_sparse_model([2, 0, 2]).SerializeToString())


def test_main_graph_without_a_name_loads_a_subgraph_without_one_does_not():
    # onnxmltools' convert_lightgbm(model, "", ...) writes graph.name = ""; the checker requires a
    # name on every graph, onnxruntime on subgraphs only
    def model_of(main_name, branch_name):
        body = h.make_graph([h.make_node("Neg", ["X"], ["B"])], branch_name, [],
                            [h.make_tensor_value_info("B", T.FLOAT, [2])])
        other = h.make_graph([h.make_node("Identity", ["X"], ["E"])], "else", [],
                             [h.make_tensor_value_info("E", T.FLOAT, [2])])
        g = h.make_graph([h.make_node("If", ["C"], ["Y"], then_branch=body, else_branch=other)], main_name,
                         [h.make_tensor_value_info("C", T.BOOL, []), h.make_tensor_value_info("X", T.FLOAT, [2])],
                         [h.make_tensor_value_info("Y", T.FLOAT, [2])])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    model = model_of("", "then")
    with pytest.raises(onnx.checker.ValidationError, match="name"):
        onnx.checker.check_model(model)  # what the strict checker says
    for c in (True, False):
        _both(model, {"C": np.array(c), "X": np.array([1, -2], np.float32)})
    assert model.graph.name == ""  # the caller's model is left as it was
    data = model_of("g", "").SerializeToString()
    with pytest.raises(Exception, match="name"):
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidModelError, match="name"):
        rt.InferenceSession(data)
