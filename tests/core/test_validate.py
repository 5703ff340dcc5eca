"""Attribute validation at session creation (runtime_core/graph/validate.py): every case
onnxruntime refuses is refused here too, with a typed error naming the node and the
attribute; and onnx's C++ shape inference cannot take the process down."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime_core as rt
from runtime_core.errors import InputError, InvalidModelError, RuntimeCoreError

F = TensorProto.FLOAT


def _model(node, inputs, inits, opset=17, outputs=("y",)):
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, F, ["a", "b", "c", "d"]) for o in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _conv(**attrs):
    w = np.ones((2, 1, 3, 3), np.float32)
    b = attrs.pop("_bias", None)
    ins = ["x", "w"] + (["b"] if b is not None else [])
    inits = {"w": w, **({"b": b} if b is not None else {})}
    return _model(helper.make_node("Conv", ins, ["y"], name="conv0", **attrs), [("x", [1, 1, 7, 7])], inits)


def _pool(op="MaxPool", **attrs):
    attrs.setdefault("kernel_shape", [3, 3])
    return _model(helper.make_node(op, ["x"], ["y"], name="pool0", **attrs), [("x", [1, 1, 7, 7])], {})


def _lstm(op="LSTM", dirs=1, hidden=4, **attrs):
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    w = np.ones((dirs, gates * hidden, 3), np.float32) * 0.1
    r = np.ones((dirs, gates * hidden, hidden), np.float32) * 0.1
    attrs.setdefault("hidden_size", hidden)
    node = helper.make_node(op, ["x", "w", "r"], ["y"], name="rnn0", **attrs)
    return _model(node, [("x", [5, 2, 3])], {"w": w, "r": r})


CASES = {
    "conv-negative-pads": (_conv(pads=[-1, 0, 0, 0]), "pads"),
    "conv-zero-strides": (_conv(strides=[0, 1]), "strides"),
    "conv-negative-strides": (_conv(strides=[1, -2]), "strides"),
    "conv-zero-dilation": (_conv(dilations=[0, 1]), "dilations"),
    "conv-negative-dilation": (_conv(dilations=[1, -1]), "dilations"),
    "conv-bias-m1": (_conv(_bias=np.ones((2, 1), np.float32)), "'B'"),
    "maxpool-negative-pads": (_pool(pads=[0, -1, 0, 0]), "pads"),
    "maxpool-pads-eq-kernel": (_pool(pads=[3, 0, 0, 0]), "pads"),
    "maxpool-pads-gt-kernel": (_pool(pads=[0, 0, 0, 5]), "pads"),
    "maxpool-zero-strides": (_pool(strides=[0, 1]), "strides"),
    "maxpool-zero-dilation": (_pool(dilations=[1, 0]), "dilations"),
    "maxpool-extent-past-int64": (_pool(kernel_shape=[3, 2**63 - 1], pads=[1, 1, 1, 1]), "kernel_shape"),
    "averagepool-pads-eq-kernel": (_pool("AveragePool", pads=[0, 3, 0, 0]), "pads"),
    "lrn-size-0": (_model(helper.make_node("LRN", ["x"], ["y"], name="pool0", size=0), [("x", [1, 1, 7, 7])], {}),
                   "size"),
    "lstm-layout-minus1": (_lstm(layout=-1), "layout"),
    "gru-layout-minus1": (_lstm("GRU", layout=-1), "layout"),
    "lstm-hidden-0": (_lstm(hidden=0), "hidden_size"),
    "lstm-hidden-2p31": (_lstm(hidden_size=2**31), "hidden_size"),
    "gru-hidden-0": (_lstm("GRU", hidden=0), "hidden_size"),
    "rnn-hidden-2p31": (_lstm("RNN", hidden_size=2**31), "hidden_size"),
    "lstm-two-dirs-forward": (_lstm(dirs=2), "direction"),
    "gru-one-dir-bidirectional": (_lstm("GRU", dirs=1, direction="bidirectional"), "direction"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_at_creation_like_onnxruntime(case):
    """We refuse at creation, before any kernel or onnx's shape inference reads the value."""
    model, attr = CASES[case]
    x = np.ones((5, 2, 3) if case.split("-")[0] in ("lstm", "gru", "rnn") else (1, 1, 7, 7), np.float32)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error classes
        # onnxruntime refuses some at creation, the others (bias, directions, ...) at the first run
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with pytest.raises(InvalidModelError) as info:
        rt.InferenceSession(model)
    msg = str(info.value)
    assert attr in msg, msg
    assert "'conv0'" in msg or "'pool0'" in msg or "'rnn0'" in msg, msg


@pytest.mark.parametrize("case", ["conv", "pool", "lstm"])
def test_valid_attributes_still_run(case):
    """The rules refuse only the invalid: the nearest valid models load and match onnxruntime."""
    model = {"conv": lambda: _conv(pads=[1, 0, 0, 2], strides=[2, 1], dilations=[1, 2],
                                   _bias=np.ones(2, np.float32)),
             "pool": lambda: _pool(pads=[2, 2, 2, 2], strides=[1, 2]),
             "lstm": lambda: _lstm(dirs=2, direction="bidirectional", layout=0)}[case]()
    x = np.random.default_rng(0).standard_normal((5, 2, 3) if case == "lstm" else (1, 1, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = rt.InferenceSession(model).run(None, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _seq_model(op):
    gates = {"LSTM": 4, "GRU": 3}[op]
    w = np.ones((1, gates * 4, 3), np.float32) * 0.1
    r = np.ones((1, gates * 4, 4), np.float32) * 0.1
    node = helper.make_node(op, ["x", "w", "r", "", "lens"], ["y"], name="rnn0", hidden_size=4)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [5, 2, 3]),
                                        helper.make_tensor_value_info("lens", TensorProto.INT32, [2])],
                          [helper.make_tensor_value_info("y", F, ["a", "b", "c", "d"])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("lens", [[6, 2], [-1, 2], [5, 2**31 - 1]])
def test_sequence_lens_outside_0_T_refused_at_run(op, lens):
    model = _seq_model(op)
    x = np.ones((5, 2, 3), np.float32)
    feeds = {"x": x, "lens": np.array(lens, np.int32)}
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error classes
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = rt.InferenceSession(model)
    with pytest.raises(RuntimeCoreError) as info:
        sess.run(None, feeds)
    assert "sequence_lens" in str(info.value)
    # the session keeps working with valid lengths, matching onnxruntime
    ok = {"x": x, "lens": np.array([5, 3], np.int32)}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, ok)[0]
    np.testing.assert_allclose(sess.run(None, ok)[0], want, rtol=1e-5, atol=1e-6)


def _child(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a child interpreter: a crash fails the test instead of killing pytest."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False,
                          timeout=300)


def test_layernorm_axis_2p31_is_a_typed_error_not_a_crash():
    proc = _child("""
        import numpy as np, onnx, runtime_core as rt
        from onnx import helper, numpy_helper, TensorProto as TP
        node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean"], name="ln", axis=2 ** 31)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 8, 7])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["a", "b", "c"]),
                               helper.make_tensor_value_info("mean", TP.FLOAT, ["e", "f", "g"])],
                              [numpy_helper.from_array(np.ones(7, np.float32), "g")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
        try:
            rt.InferenceSession(m.SerializeToString())
        except rt.errors.InvalidModelError as e:
            print("typed:", e)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "typed:" in proc.stdout and "'ln'" in proc.stdout and "'axis'" in proc.stdout, proc.stdout


def test_decision_path_tree_runs_like_onnxruntime():
    """skl2onnx's decision_path models crash onnx 1.23.2's shape inference in-process
    (TreeEnsemble* before ml opset 3 feeding LabelEncoder); the loader infers them in a child."""
    proc = _child("""
        import numpy as np, onnxruntime as ort, runtime_core as rt
        from sklearn.tree import DecisionTreeClassifier
        from skl2onnx import to_onnx
        rng = np.random.RandomState(0)
        X = rng.rand(60, 3).astype(np.float32); y = (X[:, 0] + X[:, 1] > 1).astype(np.int64)
        m = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)
        onx = to_onnx(m, X[:1], options={id(m): {"decision_path": True, "zipmap": False}},
                      target_opset={"": 17, "ai.onnx.ml": 2}).SerializeToString()
        got = rt.InferenceSession(onx).run(None, {"X": X})
        want = ort.InferenceSession(onx, providers=["CPUExecutionProvider"]).run(None, {"X": X})
        assert len(got) == len(want) == 3
        for a, b in zip(got, want):
            assert a.shape == b.shape and (a == b).all(), (a, b)
        print("match", got[2][:2].ravel().tolist())
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "match" in proc.stdout


def test_crash_prone_models_only_go_to_a_child():
    from runtime_core.graph import validate

    calls = []
    orig = validate._infer_in_child
    validate._infer_in_child = lambda m, why: calls.append(why) or orig(m, why)
    try:
        rt.InferenceSession(_conv())
    finally:
        validate._infer_in_child = orig
    assert calls == []  # a normal model is inferred in-process: no start-up cost


def test_feed_errors_stay_input_errors():
    with pytest.raises(InputError):
        rt.InferenceSession(_conv()).run(None, {"x": np.ones((1, 1, 7), np.float32)})


def test_einsum_equations_that_hang_onnx_inference_are_refused():
    """onnx's shape inference (and onnxruntime's) loops forever on these equations."""
    proc = _child("""
        import onnx, runtime_core as rt
        from onnx import helper, TensorProto as TP
        for eq in ["a-", b"\\xff\\xfe", "ab->a->b", "a.b"]:
            n = helper.make_node("Einsum", ["x"], ["y"], name="e0", equation=eq)
            g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 2])],
                                  [helper.make_tensor_value_info("y", TP.FLOAT, ["a"])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
            try:
                rt.InferenceSession(m.SerializeToString())
            except rt.errors.InvalidModelError as e:
                assert "'e0'" in str(e) and "'equation'" in str(e), e
                print("typed")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["typed"] * 4, proc.stdout


def test_split_num_outputs_unlike_the_outputs_is_refused():
    """onnx's shape inference aborts the process on this (onnxruntime too): refused before it."""
    proc = _child("""
        import onnx, runtime_core as rt
        from onnx import helper, TensorProto as TP
        n = helper.make_node("Split", ["x"], ["a", "b", "c", "d"], name="s0", num_outputs=3, axis=0)
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [7])],
                              [helper.make_tensor_value_info(o, TP.FLOAT, ["n"]) for o in "abcd"])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]); m.ir_version = 8
        try:
            rt.InferenceSession(m.SerializeToString())
        except rt.errors.InvalidModelError as e:
            assert "'s0'" in str(e) and "'num_outputs'" in str(e), e
            print("typed")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["typed"], proc.stdout


def test_gathernd_negative_batch_dims_is_refused_before_onnx_inference():
    """onnx 1.23.2's shape inference crashes (SIGSEGV) on batch_dims = -2**31 (onnxruntime 1.32 as well)."""
    proc = _child("""
        import onnx, runtime_core as rt
        from onnx import helper, TensorProto as TP
        for b in (-2**31, -1, 2):
            n = helper.make_node("GatherND", ["d", "i"], ["y"], name="g0", batch_dims=b)
            g = helper.make_graph([n], "g", [helper.make_tensor_value_info("d", TP.FLOAT, [2, 2, 2]),
                                             helper.make_tensor_value_info("i", TP.INT64, [2, 1])],
                                  [helper.make_tensor_value_info("y", TP.FLOAT, ["a", "b"])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]); m.ir_version = 8
            try:
                rt.InferenceSession(m.SerializeToString())
            except rt.errors.InvalidModelError as e:
                assert "'g0'" in str(e) and "'batch_dims'" in str(e), e
                print("typed")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["typed"] * 3, proc.stdout


def test_int_attributes_outside_int32_are_inferred_in_a_child():
    """The safety net for the class: onnx's inference narrows int attributes, and crashed on
    several ops at such values; these models are inferred where a crash cannot kill us."""
    from runtime_core.graph import validate

    node = helper.make_node("Softmax", ["x"], ["y"], name="s0", axis=2**40)
    m = onnx.load_from_string(_model(node, [("x", [1, 1, 7, 7])], {}, opset=13))
    assert "outside int32" in validate.crash_prone(m)
    x = np.ones((1, 1, 7, 7), np.float32)
    # (onnxruntime 1.32 narrows the axis to int32, 0 here, and computes: we say the axis is wrong)
    with pytest.raises(RuntimeCoreError, match="axis"):
        rt.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    # Slice-1's INT64_MAX ends are ordinary: no child process for them
    sl = helper.make_node("Slice", ["x"], ["y"], starts=[0], ends=[2**63 - 1], axes=[3])
    assert validate.crash_prone(onnx.load_from_string(_model(sl, [("x", [1, 1, 7, 7])], {}, opset=9))) is None


def test_onnx_shape_inference_is_called_only_through_validate():
    # every caller goes through graph.validate.infer_shapes, so a crash-prone model is inferred
    # in a child process wherever the core infers shapes (the loader, bodies, the type check)
    import pathlib

    root = pathlib.Path(rt.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "shape_inference.infer_shapes(" in p.read_text())
    assert callers == ["graph/validate.py"], callers


def test_tree_ensembles_are_typed_in_process():
    """ml opset <= 2 tree ensembles crash onnx's inference when something reads their output: they
    are typed by their schema instead and the rest is inferred in-process (no child process)."""
    from onnx import TensorProto as TP
    from onnx import helper

    from runtime_core.graph import validate

    tree = helper.make_node(
        "TreeEnsembleClassifier", ["X"], ["label", "scores"], domain="ai.onnx.ml", name="t",
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_values=[0.5, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1], class_weights=[1.0, 1.0],
        classlabels_int64s=[0, 1], post_transform="NONE")
    cast = helper.make_node("Cast", ["scores"], ["s64"], to=TP.DOUBLE)
    g = helper.make_graph([tree, cast], "g", [helper.make_tensor_value_info("X", TP.FLOAT, ["N", 2])],
                          [helper.make_tensor_value_info("label", TP.INT64, None),
                           helper.make_tensor_value_info("s64", TP.DOUBLE, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    assert validate.crash_prone(m) is not None
    calls = []
    orig = validate._infer_in_child
    validate._infer_in_child = lambda model, why, *rest: calls.append(why) or orig(model, why, *rest)
    try:
        sess = rt.InferenceSession(m.SerializeToString())
    finally:
        validate._infer_in_child = orig
    assert calls == []
    inferred = validate.infer_shapes(m)
    types = {vi.name: vi.type.tensor_type for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    assert types["scores"].elem_type == TP.FLOAT and types["scores"].shape.dim[0].dim_param == "N"
    assert types["s64"].elem_type == TP.DOUBLE and types["s64"].shape.dim[0].dim_param == "N"
    x = np.array([[0.2, 0.0], [0.9, 0.0]], np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = sess.run(None, {"X": x})
    assert (got[0] == want[0]).all() and np.allclose(got[1], want[1])


def _layernorm(axis: int) -> onnx.ModelProto:
    n = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], axis=axis)
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                     helper.make_tensor_value_info("s", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "mean")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_inference_child_is_reused_and_survives_a_crash():
    """Crash-prone models share one long-lived inference child (start-up paid once); when onnx
    crashes in it, the model comes back uninferred and the next call gets a fresh child."""
    from runtime_core.graph import validate

    def shape(m):
        return [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]

    wide = _layernorm(-1)
    wide.graph.node[0].attribute.append(helper.make_attribute("stash_type", 2**40))  # crash-prone, harmless
    assert validate.crash_prone(wide)
    assert shape(validate.infer_shapes(wide)) == [2, 3]
    pid = validate._SERVER._proc.pid
    assert shape(validate.infer_shapes(wide)) == [2, 3] and validate._SERVER._proc.pid == pid
    crash = _layernorm(2**31)  # onnx's C++ inference dies on this axis
    assert validate.infer_shapes(crash) is crash
    assert shape(validate.infer_shapes(wide)) == [2, 3] and validate._SERVER._proc.pid != pid
