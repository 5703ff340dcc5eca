"""CUDA fast paths (xp-generic) against the CPU kernels, fusion, device residency, OrtValue."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import runtime_core as rt
from runtime_provider_cuda import kernels as K
from runtime_provider_cuda.standin import DeviceStandIn, StandInBackend, strict_host_conversion

STANDIN = "CUDAStandInExecutionProvider"
rng = np.random.default_rng(0)
be = StandInBackend()


def dev(a):
    return be.to_device(a)


def host(d):
    assert type(d) is DeviceStandIn, type(d)
    return d.view(np.ndarray)


def cpu(op, version):
    import runtime_provider_cpu.ops  # noqa: F401 - registers the kernels
    from runtime_provider_cpu.registry import REGISTRY

    return REGISTRY.lookup("", op, version).fn


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 3))])
def test_matmul(sa, sb):
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    with strict_host_conversion():
        y = host(K.matmul(be, None, dev(a), dev(b)))
    np.testing.assert_allclose(y, cpu("MatMul", 13)(None, a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tA,tB,alpha,beta,c", [(0, 0, 1.0, 1.0, (5,)), (1, 0, 0.5, 2.0, (3, 5)),
                                                 (0, 1, 1.0, 0.0, (1, 5)), (1, 1, 2.0, 1.0, None)])
def test_gemm(tA, tB, alpha, beta, c):
    a = rng.standard_normal((4, 3) if tA else (3, 4)).astype(np.float32)
    b = rng.standard_normal((5, 4) if tB else (4, 5)).astype(np.float32)
    cc = None if c is None else rng.standard_normal(c).astype(np.float32)
    kw = dict(alpha=alpha, beta=beta, transA=tA, transB=tB)
    with strict_host_conversion():
        y = host(K.gemm(be, None, dev(a), dev(b), None if cc is None else dev(cc), **kw))
    np.testing.assert_allclose(y, cpu("Gemm", 13)(None, a, b, cc, **kw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs,ws,kw", [
    ((1, 2, 7, 7), (3, 2, 3, 3), dict(pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1, auto_pad="NOTSET")),
    ((2, 4, 9, 8), (6, 2, 3, 2), dict(pads=[0, 1, 2, 0], strides=[2, 1], dilations=[1, 2], group=2, auto_pad="NOTSET")),
    ((1, 3, 8, 8), (3, 1, 3, 3), dict(pads=None, strides=[2, 2], dilations=[1, 1], group=3, auto_pad="SAME_UPPER")),
    ((1, 3, 8, 8), (4, 3, 1, 1), dict(pads=None, strides=[1, 1], dilations=[1, 1], group=1, auto_pad="VALID")),
    ((2, 2, 10), (3, 2, 3), dict(pads=[2, 1], strides=[3], dilations=[2], group=1, auto_pad="NOTSET")),
    ((1, 2, 4, 5, 5), (2, 2, 2, 3, 3), dict(pads=None, strides=[1, 2, 1], dilations=[1, 1, 1], group=1,
                                           auto_pad="SAME_LOWER")),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, kw, bias):
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    kw = dict(kw, kernel_shape=list(ws[2:]))
    if kw["pads"] is None:
        kw["pads"] = [0] * (2 * (len(xs) - 2))
    with strict_host_conversion():
        y = host(K.conv(be, None, dev(x), dev(w), None if b is None else dev(b), **kw))
    np.testing.assert_allclose(y, cpu("Conv", 11)(None, x, w, b, **kw), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_and_log_softmax(axis):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    with strict_host_conversion():
        s = host(K.softmax_13(be, None, dev(x), axis=axis))
        ls = host(K.log_softmax_13(be, None, dev(x), axis=axis))
        s1 = host(K.softmax_1(be, None, dev(x), axis=axis))
    np.testing.assert_allclose(s, cpu("Softmax", 13)(None, x, axis=axis), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ls, cpu("LogSoftmax", 13)(None, x, axis=axis), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s1, cpu("Softmax", 11)(None, x, axis=axis), rtol=1e-5, atol=1e-6)


class _Ctx:
    def __init__(self, n):
        self.outputs_wanted = (True,) * n


@pytest.mark.parametrize("axis,n_out", [(-1, 1), (1, 3), (-2, 1)])
def test_layer_norm(axis, n_out):
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    shape = x.shape[axis:]
    g, b = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    kw = dict(axis=axis, epsilon=1e-5, stash_type=1)
    with strict_host_conversion():
        got = K.layer_norm(be, _Ctx(n_out), dev(x), dev(g), dev(b), **kw)
    from runtime_provider_cpu.registry import KernelContext

    class N:
        outputs = ("y", "m", "v")[:n_out]

    want = cpu("LayerNormalization", 17)(KernelContext(N(), n_out, (), ()), x, g, b, **kw)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for gg, ww in zip(got, want):
        np.testing.assert_allclose(host(gg), ww, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = host(K.gelu(be, None, dev(x), approximate=approx))
    np.testing.assert_allclose(y, cpu("Gelu", 20)(None, x, approximate=approx), rtol=1e-5, atol=1e-6)


# -- whole sessions on the stand-in: fusion, copies only at boundaries, OrtValue/IOBinding -----

def chain_model():
    """x -> Add(b) -> Mul(c) -> Tanh -> Relu -> MatMul(w) -> ArgMax (CPU) ; also y = MatMul output."""
    f = lambda n, s: helper.make_tensor_value_info(n, 1, s)  # noqa: E731
    inits = [helper.make_tensor("b", 1, [4], rng.standard_normal(4).astype(np.float32).tolist()),
             helper.make_tensor("c", 1, [], [0.5]),
             helper.make_tensor("w", 1, [4, 3], rng.standard_normal(12).astype(np.float32).tolist())]
    nodes = [helper.make_node("Add", ["x", "b"], ["t1"], name="add"),
             helper.make_node("Mul", ["t1", "c"], ["t2"], name="mul"),
             helper.make_node("Tanh", ["t2"], ["t3"], name="tanh"),
             helper.make_node("Relu", ["t3"], ["t4"], name="relu"),
             helper.make_node("MatMul", ["t4", "w"], ["y"], name="mm"),
             helper.make_node("ArgMax", ["y"], ["am"], name="argmax", axis=1, keepdims=0)]
    g = helper.make_graph(nodes, "g", [f("x", [2, 4])], [f("y", [2, 3]),
                          helper.make_tensor_value_info("am", 7, [2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_fused_chain_and_boundary_copies(standin):
    data = chain_model()
    sess = rt.InferenceSession(data, providers=["cudastandin", "cpu"])
    place = {n.name: n.provider for n in sess.get_partition_report().nodes}
    assert place["argmax"] == "CPUExecutionProvider"
    declined = {n.name: n for n in sess.get_partition_report().nodes}["argmax"].declined
    assert "no CUDA kernel; runs on the CPU provider" in " ".join(map(str, declined.values())), declined
    assert all(v == STANDIN for k, v in place.items() if k != "argmax")
    exe = [e for e in _executables(sess) if hasattr(e, "n_fused")]
    assert exe and exe[0].n_fused == 1  # Add, Mul, Tanh, Relu: one program
    copies = [(c.value, c.src, c.dst) for c in sess.get_partition_report().copies]
    assert sorted(v for v, _, _ in copies) == ["x", "y", "y"] or sorted(v for v, _, _ in copies) == ["x", "y"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    ref = rt.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})
    with strict_host_conversion():
        got = sess.run(None, {"x": x})
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], ref[1])


def _executables(sess):
    found = []
    seen = set()

    def walk(o, depth=0):
        if id(o) in seen or depth > 4:
            return
        seen.add(id(o))
        if type(o).__name__ == "CUDAExecutable":
            found.append(o)
            return
        for v in (vars(o).values() if hasattr(o, "__dict__") else
                  (o if isinstance(o, (list, tuple)) else (o.values() if isinstance(o, dict) else ()))):
            if isinstance(v, (list, tuple, dict)) or hasattr(v, "__dict__"):
                walk(v, depth + 1)
    walk(sess)
    return found


def test_fused_program_source_and_xp_evaluation():
    prog = K.FusedProgram(["add", "tanh"], ["a", "b"], [("Add", [("in", 0), ("in", 1)]), ("Tanh", [("t", 0)])],
                          np.float32)
    ins, outs, op = prog.cuda_source()
    assert ins == "float32 x0, float32 x1" and outs == "float32 y"
    assert op == "float t0 = (((float)x0) + ((float)x1)); float t1 = tanh(t0); y = (float32) t1;"
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(host(prog.run(be, [dev(a), dev(b)])), np.tanh(a + b), rtol=1e-6)


def test_ortvalue_and_iobinding_stay_on_the_device(standin):
    data = chain_model()
    sess = rt.InferenceSession(data, providers=["cudastandin", "cpu"])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    v = rt.OrtValue.ortvalue_from_numpy(x, "cudastandin", 0)
    assert v.device_name() == "cudastandin" and v.shape() == [2, 4]
    np.testing.assert_array_equal(v.numpy(), x)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", v)
    b.bind_output("y", "cudastandin")
    b.bind_output("am", "cpu")
    sess.run_with_iobinding(b)
    y = b.get_outputs()[0]
    assert y.device_name() == "cudastandin"
    ref = rt.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_allclose(y.numpy(), ref[0], rtol=1e-5, atol=1e-6)
    stats = b.get_transfer_stats()
    assert stats.to_device_count == 0 if hasattr(stats, "to_device_count") else True
