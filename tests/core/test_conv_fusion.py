"""ConvActivationFusion: Conv (+ residual Add) + activation -> com.microsoft.FusedConv, where it
applies and where it must not; the FusedConv kernel against onnxruntime's own."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime_core as rt
from oracle import assert_close, cpu_policy, make_model, record_plan_kinds, run_oracle  # noqa: F401 - a fixture

L = rt.GraphOptimizationLevel
MS = "com.microsoft"
CPU = ["CPUExecutionProvider"]
RNG = np.random.default_rng(11)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


X = f32(2, 3, 9, 9)
W = f32(4, 3, 3, 3)
B = f32(4)


def opts(level):
    so = rt.SessionOptions()
    so.graph_optimization_level = level
    return so


def optimized(model, feeds, level=L.ORT_ENABLE_EXTENDED):
    """The optimized graph's (op type, node) list; asserts outputs equal ORT_DISABLE_ALL and
    onnxruntime's."""
    data = model.SerializeToString()
    ref = rt.InferenceSession(data, opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, feeds)
    s = rt.InferenceSession(data, opts(level), providers=CPU)
    got = s.run(None, feeds)
    assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert_close(got, run_oracle(model, feeds), rtol=1e-4, atol=1e-4)
    return [n.op_type for n in s._graph.nodes], s._graph.nodes


def conv(out="c", ins=("x", "w", "b"), **kw):
    kw.setdefault("pads", [1, 1, 1, 1])
    return helper.make_node("Conv", list(ins), [out], **kw)


ACTIVATIONS = [
    ("Relu", {}, {}, 17, "Relu", []),
    ("Tanh", {}, {}, 17, "Tanh", []),
    ("Sigmoid", {}, {}, 17, "Sigmoid", []),
    ("LeakyRelu", {"alpha": 0.2}, {}, 17, "LeakyRelu", [0.2]),
    ("LeakyRelu", {}, {}, 17, "LeakyRelu", [0.01]),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}, 17, "HardSigmoid", [0.3, 0.4]),
    ("HardSwish", {}, {}, 17, "HardSwish", []),
    ("Clip", {}, {"lo": np.float32(0), "hi": np.float32(6)}, 17, "Clip", [0.0, 6.0]),
    ("Clip", {}, {"lo": np.float32(-1)}, 17, "Clip", [-1.0, float(np.finfo(np.float32).max)]),
    ("Clip", {"min": 0.0, "max": 6.0}, {}, 6, "Clip", [0.0, 6.0]),
]


@pytest.mark.parametrize("op,attrs,bounds,opset,act,params", ACTIVATIONS)
def test_conv_activation_becomes_fused_conv(op, attrs, bounds, opset, act, params):
    ins = ["c"] + list(bounds)
    if list(bounds) == ["lo"]:
        ins = ["c", "lo"]
    nodes = [conv(), helper.make_node(op, ins, ["y"], **attrs)]
    m = make_model(nodes, {"x": X}, ["y"], opset=opset, initializers={"w": W, "b": B, **bounds})
    ops, graph_nodes = optimized(m, {"x": X})
    assert ops == ["FusedConv"]
    node = graph_nodes[0]
    assert node.domain == MS and node.attrs["activation"] in (act, act.encode())
    np.testing.assert_allclose(list(node.attrs.get("activation_params") or []), params, rtol=1e-6)
    # at the basic level the pattern stays as it is
    assert optimized(m, {"x": X}, L.ORT_ENABLE_BASIC)[0] == ["Conv", op]


def test_residual_add_and_relu_become_one_fused_conv_with_z():
    z = f32(2, 4, 9, 9)
    nodes = [conv(), helper.make_node("Add", ["z", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = make_model(nodes, {"x": X, "z": z}, ["y"], initializers={"w": W, "b": B})
    ops, graph_nodes = optimized(m, {"x": X, "z": z})
    assert ops == ["FusedConv"]
    assert graph_nodes[0].inputs == ["x", "w", "b", "z"]


def test_residual_add_alone_becomes_fused_conv_without_activation():
    z = f32(2, 4, 9, 9)
    nodes = [conv(ins=("x", "w")), helper.make_node("Add", ["c", "z"], ["y"])]
    m = make_model(nodes, {"x": X, "z": z}, ["y"], initializers={"w": W})
    ops, graph_nodes = optimized(m, {"x": X, "z": z})
    assert ops == ["FusedConv"]
    assert graph_nodes[0].inputs == ["x", "w", "", "z"]
    assert graph_nodes[0].attrs.get("activation") is None


def test_resnet_block_shape_two_convs_add_relu():
    """conv -> relu -> conv, + the block input, -> relu: two FusedConvs, the second with Z."""
    x = f32(1, 4, 8, 8)
    w1, w2 = f32(4, 4, 3, 3), f32(4, 4, 3, 3)
    nodes = [conv("c1", ("x", "w1")), helper.make_node("Relu", ["c1"], ["r1"]),
             conv("c2", ("r1", "w2")), helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    m = make_model(nodes, {"x": x}, ["y"], initializers={"w1": w1, "w2": w2})
    assert optimized(m, {"x": x})[0] == ["FusedConv", "FusedConv"]


@pytest.mark.parametrize("case", ["fed_clip_bound", "conv_read_twice", "broadcast_z", "float64",
                                  "conv_is_output", "add_of_two_inputs"])
def test_not_fused(case):
    inits = {"w": W, "b": B}
    feeds = {"x": X}
    outs = ["y"]
    if case == "fed_clip_bound":
        nodes = [conv(), helper.make_node("Clip", ["c", "lo"], ["y"])]
        feeds["lo"] = np.array(0.5, np.float32)
        want = ["Conv", "Clip"]
    elif case == "conv_read_twice":
        nodes = [conv(), helper.make_node("Relu", ["c"], ["y"]), helper.make_node("Neg", ["c"], ["y2"])]
        outs = ["y", "y2"]
        want = ["Conv", "Relu", "Neg"]
    elif case == "broadcast_z":
        feeds["z"] = f32(1, 4, 1, 1)  # fed, so ConvAddFusion cannot fold it into the bias either
        nodes = [conv(), helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        want = ["Conv", "Add", "Relu"]
    elif case == "float64":
        feeds = {"x": X.astype(np.float64)}
        inits = {"w": W.astype(np.float64), "b": B.astype(np.float64)}
        nodes = [conv(), helper.make_node("Relu", ["c"], ["y"])]
        want = ["Conv", "Relu"]
    elif case == "conv_is_output":
        nodes = [conv(), helper.make_node("Relu", ["c"], ["y"])]
        outs = ["y", "c"]
        want = ["Conv", "Relu"]
    else:
        feeds["z"] = f32(2, 4, 9, 9)
        feeds["z2"] = f32(2, 4, 9, 9)
        nodes = [helper.make_node("Add", ["z", "z2"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        want = ["Add", "Relu"]
    m = make_model(nodes, feeds, outs, initializers=inits)
    assert optimized(m, feeds)[0] == want


def test_saved_model_with_fused_conv_runs_in_onnxruntime(tmp_path):
    z = f32(2, 4, 9, 9)
    nodes = [conv(), helper.make_node("Add", ["c", "z"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    m = make_model(nodes, {"x": X, "z": z}, ["y"],
                   initializers={"w": W, "b": B, "lo": np.float32(0), "hi": np.float32(1.5)})
    so = opts(L.ORT_ENABLE_ALL)
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    opt = onnx.load(so.optimized_model_filepath)
    assert [(x.domain, x.op_type) for x in opt.graph.node] == [(MS, "FusedConv")]
    feeds = {"x": X, "z": z}
    assert_close(run_oracle(opt, feeds), run_oracle(m, feeds), rtol=1e-5, atol=1e-5)


# -- the kernel itself, against onnxruntime's FusedConv ----------------------------------------

def fused_conv_model(attrs, with_z=True, group=1, w=W, x=X, strides=(1, 1), pads=(1, 1, 1, 1)):
    ins = ["x", "w", "b"] + (["z"] if with_z else [])
    node = helper.make_node("FusedConv", ins, ["y"], domain=MS, pads=list(pads), strides=list(strides),
                            group=group, **attrs)
    feeds = {"x": x}
    oh = (x.shape[2] + pads[0] + pads[2] - w.shape[2]) // strides[0] + 1
    ow = (x.shape[3] + pads[1] + pads[3] - w.shape[3]) // strides[1] + 1
    if with_z:
        feeds["z"] = f32(x.shape[0], w.shape[0], oh, ow)
    m = make_model([node], feeds, [], initializers={"w": w, "b": f32(w.shape[0])}, extra_opsets={MS: 1})
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.shape[0], w.shape[0], oh, ow]))
    return m, feeds


@pytest.mark.parametrize("attrs", [
    {"activation": "Relu"},
    {"activation": "Clip", "activation_params": [-0.5, 0.5]},
    {"activation": "LeakyRelu", "activation_params": [0.1]},
    {"activation": "HardSigmoid", "activation_params": [0.2, 0.5]},
    {"activation": "Sigmoid"},
    {"activation": "Tanh"},
    {},
])
@pytest.mark.parametrize("with_z", [True, False])
def test_fused_conv_kernel_matches_onnxruntime(attrs, with_z):
    m, feeds = fused_conv_model(attrs, with_z)
    ours = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, feeds)
    assert_close(ours, run_oracle(m, feeds), rtol=1e-4, atol=1e-5)


def test_fused_conv_kernel_depthwise_and_strided():
    x = f32(1, 6, 11, 11)
    m, feeds = fused_conv_model({"activation": "Relu"}, True, group=6, w=f32(6, 1, 3, 3), x=x, strides=(2, 2))
    ours = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU).run(None, feeds)
    assert_close(ours, run_oracle(m, feeds), rtol=1e-4, atol=1e-5)


def test_fused_conv_with_an_unknown_activation_is_declined_with_the_reason():
    m, feeds = fused_conv_model({"activation": "Swish"}, False)
    with pytest.raises(rt.errors.RuntimeCoreError, match="activation 'Swish' is not one of"):
        rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU)


def test_fused_conv_with_missing_activation_params_is_declined():
    m, feeds = fused_conv_model({"activation": "Clip"}, False)
    with pytest.raises(rt.errors.RuntimeCoreError, match="Clip needs 2 activation_params"):
        rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU)


def test_fused_conv_with_a_z_of_another_shape_raises_at_run():
    m, feeds = fused_conv_model({"activation": "Relu"}, True)
    feeds["z"] = f32(2, 4, 3, 3)
    # the model's declared Z shape is what the run checks first; a free-shaped Z reaches the kernel
    for i, d in enumerate(m.graph.input[1].type.tensor_type.shape.dim):
        d.dim_param = f"z{i}"
    s = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU)
    with pytest.raises(rt.errors.ExecutionError, match="Z of shape"):
        s.run(None, feeds)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("kind", ["pointwise", "depthwise", "dense3x3"])
@pytest.mark.parametrize("attrs", [{"activation": "Relu"},
                                   {"activation": "Clip", "activation_params": [0.0, 6.0]},
                                   {"activation": "Clip", "activation_params": [-0.25, 0.3]}])
@pytest.mark.parametrize("batch", [1, 2])
def test_fused_conv_clip_in_the_epilogue(kind, attrs, with_z, native, batch, monkeypatch, cpu_policy):
    # the bias, Z and Relu / Clip are applied in the convolution's epilogue (compiled: in one
    # pass; without the extension: numpy's in-place adds and clip); batch 2 checks the
    # per-image epilogue, batch 1 the node's plan (1x1 and depthwise straight to the kernels;
    # the dense 3x3 one, 8 x 9 terms a sum, to the direct kernel at any batch)
    from runtime_provider_cpu.fast import policy

    kernel = {"pointwise": "pointwise", "depthwise": "depthwise", "dense3x3": "direct"}[kind]
    if native:
        assert policy.NATIVE is not None, "runtime_provider_cpu._native did not build"
        # the kernel under test forced (the choice is otherwise measured), AVX-512 or not
        cpu_policy(direct=True, conv_kernel=kernel)
    else:
        cpu_policy(native=None)
    planned = record_plan_kinds(monkeypatch)
    x = f32(batch, 8, 9, 9) * 3
    if kind == "pointwise":
        m, feeds = fused_conv_model(attrs, with_z, w=f32(5, 8, 1, 1), x=x, pads=(0, 0, 0, 0))
    elif kind == "depthwise":
        m, feeds = fused_conv_model(attrs, with_z, group=8, w=f32(8, 1, 3, 3), x=x, strides=(2, 2))
    else:
        m, feeds = fused_conv_model(attrs, with_z, w=f32(4, 8, 3, 3), x=x)
    sess = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU)
    ours = sess.run(None, feeds)
    ref = run_oracle(m, feeds)
    assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    assert_close(sess.run(None, feeds), ref, rtol=1e-4, atol=1e-5)  # a second run, planned
    if kind == "dense3x3":  # the compiled direct convolution: any batch, Z in its epilogue
        expect_plan = native
    else:
        expect_plan = native and batch == 1 and (kind == "pointwise" or (kind == "depthwise" and not with_z))
    if expect_plan:
        assert planned == [kernel, kernel], planned
    else:  # the library path (im2col + GEMM), the forced kernel, or the per-image epilogue (no plan)
        assert set(planned) <= {"im2col", "im2col_sgemm"} | ({kernel} if native else set()), planned
    lo = attrs.get("activation_params", [0.0])[0]
    assert (ref[0] == lo).any() and (ours[0] == lo).any()  # the clip bound is reached


def test_bias_clip_checks_buffers():
    from runtime_provider_cpu.fast import policy

    nat = policy.NATIVE
    assert nat is not None, "runtime_provider_cpu._native did not build"
    y = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    b = np.array([1, 0, -1], np.float32)
    with pytest.raises(ValueError, match="B"):
        nat.bias_clip(y, b[:2], (3, 4), 0.0, 3.0)
    with pytest.raises(ValueError, match="Y"):
        nat.bias_clip(y.astype(np.float64), b, (3, 4), 0.0, 3.0)
    with pytest.raises(ValueError, match="negative"):
        nat.bias_clip(y, b, (-3, 4), 0.0, 3.0)
    with pytest.raises(ValueError, match="Z"):
        nat.bias_clip(y, b, (3, 4), 0.0, 3.0, y[:2])
    z = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    ref = np.clip(y + b[:, None] + z, 0.0, 3.0)
    nat.bias_clip(y, b, (3, 4), 0.0, 3.0, z)
    np.testing.assert_array_equal(y, ref)
    nat.bias_clip(y, None, (3, 4), 1.0, 2.0)
    np.testing.assert_array_equal(y, np.clip(ref, 1.0, 2.0))


@pytest.mark.parametrize("kind", ["pointwise", "depthwise"])
def test_conv_plan_follows_weights_fed_at_run_time(kind):
    # the node's plan keeps weights prepared from the arrays it saw; weights that are a graph
    # input (a new array every run) must never be served from an earlier run's plan
    C = 6
    group, wshape, pads = (1, (4, C, 1, 1), [0, 0, 0, 0]) if kind == "pointwise" else (C, (C, 1, 3, 3), [1, 1, 1, 1])
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=pads)
    x = f32(1, C, 5, 7)
    m = make_model([node], {"x": x, "w": np.zeros(wshape, np.float32)}, ["y"], opset=13)
    sess = rt.InferenceSession(m.SerializeToString(), opts(L.ORT_DISABLE_ALL), providers=CPU)
    for seed in range(3):
        feeds = {"x": x, "w": np.random.default_rng(seed).standard_normal(wshape).astype(np.float32)}
        assert_close(sess.run(None, feeds), run_oracle(m, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", ["HardSwish", "Sigmoid", "HardSigmoid"])
def test_activation_after_the_plan_survives_binding_and_pair_fusion(act):
    # an inverted-residual pair (1x1 expansion + Relu, 3x3 depthwise + act): from the second
    # run the steps are bound and may be fused (fast/pairs.py); the activation applied after
    # the depthwise plan must stay in every run
    x = f32(1, 16, 20, 20)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"]), helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["d"], group=32, pads=[1, 1, 1, 1]),
             helper.make_node(act, ["d"], ["y"])]
    m = make_model(nodes, {"x": x}, ["y"], opset=17,
                   initializers={"w1": f32(32, 16, 1, 1), "b1": f32(32), "w2": f32(32, 1, 3, 3), "b2": f32(32)})
    ref = run_oracle(m, {"x": x})
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)
    assert [n.op_type for n in s._graph.nodes] == ["FusedConv", "FusedConv"]
    for _ in range(3):
        assert_close(s.run(None, {"x": x}), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.native
def test_native_activate_matches_numpy():
    # every vector tail length, NaN and both clip bounds of the hard forms
    from runtime_provider_cpu.fast.policy import NATIVE as nat

    assert nat is not None
    for n in (0, 1, 7, 8, 9, 31, 100):
        x = (RNG.standard_normal(n) * 6).astype(np.float32)
        if n > 3:
            x[3] = np.nan
        x64 = x.astype(np.float64)
        hs = np.clip(x64 * 0.2 + 0.4, 0, 1)
        sig = 1 / (1 + np.exp(-x64))
        for kind, ab, ref in ((0, (1 / 6, 0.5), x64 * np.clip(x64 / 6 + 0.5, 0, 1)), (1, (0.2, 0.4), hs),
                              (2, (), sig), (3, (), x64 * sig)):
            y = np.full(n, 7.0, np.float32)
            nat.activate(x, y, n, kind, *ab)
            np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-6, err_msg=f"kind {kind} n {n}")
            z = x.copy()
            nat.activate(z, z, n, kind, *ab)  # in place
            np.testing.assert_array_equal(z, y)
    with pytest.raises(ValueError):
        nat.activate(np.zeros(4, np.float32), np.zeros(4, np.float32), 4, 9)
    with pytest.raises((ValueError, TypeError)):
        nat.activate(np.zeros(4, np.float32), np.zeros(3, np.float32), 4, 0)


@pytest.mark.parametrize("swap", [False, True])
def test_conv_times_its_sigmoid_becomes_fused_conv_silu(swap):
    # SiLU as the exporters write it (EfficientNet): c * Sigmoid(c), c read only by the two
    ins = ["s", "c"] if swap else ["c", "s"]
    nodes = [conv(), helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ins, ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], opset=17, initializers={"w": W, "b": B})
    ops, graph_nodes = optimized(m, {"x": X})
    assert ops == ["FusedConv"]
    assert graph_nodes[0].attrs["activation"] in ("SiLU", b"SiLU")
    s = rt.InferenceSession(m.SerializeToString(), providers=CPU)  # the bound plan on later runs
    ref = run_oracle(m, {"x": X})
    for _ in range(3):
        assert_close(s.run(None, {"x": X}), ref, rtol=1e-4, atol=1e-5)


def test_silu_stays_apart_where_the_conv_output_has_another_reader():
    nodes = [conv(), helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["y"])]
    m = make_model(nodes, {"x": X}, ["y"], opset=17, initializers={"w": W, "b": B})
    ops, _ = optimized(m, {"x": X})
    assert "Sigmoid" in ops and "Mul" in ops


@pytest.mark.parametrize("act", ["HardSwish", "SiLU", "Relu"])
@pytest.mark.parametrize("residual", [False, True])
def test_optimized_model_file_loads_in_onnxruntime(tmp_path, act, residual):
    # FusedConv with our own activations (HardSwish, SiLU) runs here, but onnxruntime's FusedConv
    # refuses them: the written optimized model has them as Conv (+ Add) + the activation again;
    # onnxruntime's own activations stay fused
    import onnxruntime as ort

    nodes = [conv()]
    c = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["cz"]))
        c = "cz"
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", [c], ["s"]), helper.make_node("Mul", [c, "s"], ["y"])]
    else:
        nodes.append(helper.make_node(act, [c], ["y"]))
    z = f32(*run_oracle(make_model([conv()], {"x": X}, ["c"], opset=17, initializers={"w": W, "b": B}),
                        {"x": X})[0].shape)
    feeds = {"x": X, **({"z": z} if residual else {})}
    m = make_model(nodes, feeds, ["y"], opset=17, initializers={"w": W, "b": B})
    ref = run_oracle(m, feeds)
    so = rt.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = rt.InferenceSession(m.SerializeToString(), so, providers=CPU)
    ours = [n.attrs.get("activation") for n in s._graph.nodes if n.op_type == "FusedConv"]
    ours = [a.decode() if isinstance(a, bytes) else a for a in ours]
    assert_close(s.run(None, feeds), ref, rtol=1e-4, atol=1e-5)
    written = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(written)
    fused = [n for n in written.graph.node if n.op_type == "FusedConv"]
    written_acts = [a.s.decode() for n in fused for a in n.attribute if a.name == "activation"]
    assert not set(written_acts) & {"HardSwish", "SiLU"}
    if act == "Relu":
        assert written_acts == ["Relu"]  # onnxruntime runs this one fused
    elif not (residual and act == "SiLU"):  # (SiLU after a residual Add is not fused)
        assert act in ours  # fused here, standard ops in the file
    loaded = ort.InferenceSession(so.optimized_model_filepath, providers=["CPUExecutionProvider"])
    assert_close(loaded.run(None, feeds), ref, rtol=1e-4, atol=1e-5)
