"""What a session keeps in memory: one packed copy of a weight that many nodes read (ALBERT's
one layer run 12 times), one fused constant for equal fusions of weight-sharing layers, no
result-sized temporaries in a batched 1x1 convolution, no SciPy BLAS for a tree ensemble, and
a QLinearConv weight kept as its packed copy only (no rearranged one beside it)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from oracle import assert_close, compiled_partitions, cpu_session, make_model, record_plan_kinds, run_oracle

RNG = np.random.default_rng(20261206)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.native
@pytest.mark.parametrize("trans", [False, True])
def test_shared_weight_is_packed_once(trans, spy_native, cpu_policy, linear_tiles):
    """Four MatMul (or Gemm transB) nodes read one initializer: every call of the compiled
    Linear gets the same packed array, not one per node."""
    packed = []
    spy_native("linear", lambda args: packed.append(args[1]))
    cpu_policy(linear_kernel="packed")
    D = 48
    w = rnd(D, D) * np.float32(0.2)
    nodes, cur = [], "x"
    for i in range(4):
        nodes.append(helper.make_node("Gemm", [cur, "w"], [f"h{i}"], transB=1) if trans
                     else helper.make_node("MatMul", [cur, "w"], [f"h{i}"]))
        cur = f"h{i}"
    x = rnd(5, D)
    model = make_model(nodes, {"x": x}, [cur], initializers={"w": w})
    sess = cpu_session(model)
    want = run_oracle(model, {"x": x})
    for _ in range(2):
        assert_close(sess.run(None, {"x": x}), want, rtol=1e-4, atol=1e-4)
    assert len(packed) == 8
    assert len({id(p) for p in packed}) == 1


def test_shared_store_drops_a_copy_no_plan_holds():
    """``fast.packing.shared``: the same (array, layout) gives the same copy while someone
    holds it; another layout or array another copy; once no one holds it, it is made again."""
    from runtime_provider_cpu.fast.packing import shared

    class Ctx:
        weights: dict = {}

    ctx, made = Ctx(), []

    def make(w, k):
        made.append(k)
        return np.ascontiguousarray(w.T) * k

    a, b = rnd(3, 4), rnd(3, 4)
    p1 = shared(ctx, a, "t", lambda: make(a, 1))
    assert shared(ctx, a, "t", lambda: make(a, 2)) is p1
    assert shared(ctx, a, "u", lambda: make(a, 3)) is not p1
    assert shared(ctx, b, "t", lambda: make(b, 4)) is not p1
    del p1
    shared(ctx, a, "t", lambda: make(a, 5))
    assert made == [1, 3, 4, 5]


def test_add_const_reuses_an_equal_constant_a_pass_added():
    """Fusing each of several layers that share weights adds one constant, not one a layer;
    different contents, or a constant removed since, get a new one."""
    from runtime_core.graph.ir import Graph
    from runtime_core.optimizer.editor import Editor

    x = rnd(2, 3)
    graph = Graph(make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": x}, ["y"]))
    w = rnd(64, 96)
    first = Editor(graph, "a").add_const(w, "fused")
    assert Editor(graph, "b").add_const(w.copy(), "fused") == first  # another pass, equal contents
    w2 = w.copy()
    w2[-1, -1] += 1
    other = Editor(graph, "b").add_const(w2, "fused")
    assert other != first
    assert Editor(graph, "c").add_const(w.astype(np.float64), "fused") not in (first, other)
    del graph.initializers[first]
    again = Editor(graph, "c").add_const(w, "fused")  # made anew (the name may be free again)
    assert again in graph.initializers and np.array_equal(graph.initializers[again], w)


def test_fused_gemms_of_a_shared_weight_keep_one_weight():
    """Gemm(transB=1) between flattening Reshapes becomes MatMul by a transposed copy of B:
    three such Gemms reading one B keep one transposed copy (and match onnxruntime)."""
    import runtime_core as rt

    D, N = 24, 40
    w = rnd(N, D)
    nodes, cur = [], "x"
    for i in range(3):
        nodes += [helper.make_node("Reshape", [cur, "flat"], [f"f{i}"]),
                  helper.make_node("Gemm", [f"f{i}", "w", "c"], [f"g{i}"], transB=1),
                  helper.make_node("Reshape", [f"g{i}", "back"], [f"o{i}"]),
                  helper.make_node("MatMul", [f"o{i}", "down"], [f"d{i}"])]
        cur = f"d{i}"
    x = rnd(2, 3, D)
    inits = {"w": w, "c": rnd(N), "down": rnd(N, D), "flat": np.array([-1, D], np.int64),
             "back": np.array([2, 3, N], np.int64)}
    model = make_model(nodes, {"x": x}, [cur], initializers=inits)
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    sess = rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    assert_close(sess.run(None, {"x": x}), run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-4)
    graph = sess._graph
    fused = [n for n in graph.nodes if n.op_type == "MatMul" and n.inputs[1] not in ("down",)]
    assert len(fused) == 3, [n.op_type for n in graph.nodes]
    assert len({n.inputs[1] for n in fused}) == 1
    assert sum(1 for a in graph.initializers.values() if a.shape == (D, N)) == 1


@pytest.mark.native
@pytest.mark.parametrize("with_z", [False, True])
def test_batched_pointwise_conv_on_the_im2col_plan(with_z, monkeypatch, cpu_policy):
    """A 1x1 stride-1 convolution of a batch on the library plan (one GEMM per image into
    the result, bias, sum and clip after it) matches onnxruntime."""
    cpu_policy(conv_kernel="im2col")
    kinds = record_plan_kinds(monkeypatch)
    x, w, b = rnd(3, 8, 9, 7), rnd(12, 8, 1, 1), rnd(12)
    feeds = {"x": x}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"])]
    out = "c"
    if with_z:
        feeds["z"] = rnd(3, 12, 9, 7)
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        out = "s"
    nodes.append(helper.make_node("Relu", [out], ["y"]))
    model = make_model(nodes, feeds, ["y"], initializers={"w": w, "b": b})
    sess = cpu_session(model)
    want = run_oracle(model, feeds)
    for _ in range(2):
        assert_close(sess.run(None, feeds), want, rtol=1e-4, atol=1e-4)
    assert kinds and set(kinds) == {"im2col"}


def test_tree_ensemble_session_does_not_import_scipy(tmp_path):
    """A partition of tree-ensemble ops never reaches a matrix product: compiling it leaves
    SciPy's BLAS (about 14 MiB resident) unimported; a MatMul partition imports it."""
    from runtime_provider_cpu.fast.sgemm import uses_blas

    assert not uses_blas([("ai.onnx.ml", "TreeEnsembleClassifier"), ("", "Cast")])
    assert uses_blas([("ai.onnx.ml", "TreeEnsembleClassifier"), ("", "MatMul")])
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml", n_targets=1,
                            nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
                            nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                            target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
                            target_weights=[1.0, 2.0])
    g = helper.make_graph([node], "trees", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    path = tmp_path / "trees.onnx"
    path.write_bytes(m.SerializeToString())
    code = ("import sys, numpy as np, runtime_core as rt\n"
            f"s = rt.InferenceSession({str(path)!r}, providers=['cpu'])\n"
            "y = s.run(None, {'X': np.array([[0.0, 0], [1, 0]], np.float32)})[0]\n"
            "assert y.ravel().tolist() == [1.0, 2.0], y\n"
            "print('scipy.linalg' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def _arrays(v):
    """The numpy arrays held in a node cache's value (tuples and dicts walked)."""
    if isinstance(v, np.ndarray):
        yield v
    elif isinstance(v, (tuple, list)):
        for x in v:
            yield from _arrays(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _arrays(x)


@pytest.mark.parametrize("kernel", [(3, 3), (1, 1)])
def test_qlinear_conv_keeps_only_the_packed_weight(kernel, monkeypatch):
    """A constant QLinearConv weight is packed once, on the first run; the node keeps that
    packed copy and no [C*KH*KW, M] rearrangement of the weight, and later runs (other inputs)
    still match the numpy path bit for bit."""
    from runtime_provider_cpu.ops import quant

    if quant._native is None:
        pytest.skip("the compiled extension is not built here")
    packs = []
    real = quant._native

    class Spy:
        def __getattr__(self, attr):
            return getattr(real, attr)

        @staticmethod
        def qgemm_pack(*args):
            packs.append(args[2])
            return real.qgemm_pack(*args)

    rng = np.random.default_rng(31)
    M, C = 40, 24
    w = rng.integers(-128, 128, (M, C) + kernel).astype(np.int8)
    pads = [k // 2 for k in kernel] * 2
    consts = {"sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8), "w": w,
              "sw": rng.uniform(0.002, 0.02, (M,)).astype(np.float32), "zw": np.zeros(M, np.int8),
              "sy": np.array(0.5, np.float32), "zy": np.array(128, np.uint8),
              "B": rng.integers(-5000, 5000, (M,)).astype(np.int32)}
    xs = [rng.integers(0, 256, (1, C, 9, 10)).astype(np.uint8) for _ in range(3)]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "B"], ["y"], pads=pads)
    model = make_model([node], {"x": xs[0]}, ["y"], opset=10, initializers=consts)
    monkeypatch.setattr(quant, "_native", None)
    ref = cpu_session(model)
    want = [ref.run(None, {"x": x})[0] for x in xs]
    monkeypatch.setattr(quant, "_native", Spy())
    sess = cpu_session(model)
    for x, y in zip(xs, want):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], y)
    assert packs == [(C * kernel[0] * kernel[1], M)]
    held = [a for exe in compiled_partitions(sess) for st in exe.steps if st[1].node.op_type == "QLinearConv"
            for a in _arrays(st[1].cache)]
    # the session's own constant (the cache's key) aside, one weight-sized array: the packed copy
    big = [a for a in held if a.nbytes >= w.nbytes and a.shape != w.shape]
    assert len(big) == 1 and big[0].ndim == 1, [(a.shape, a.dtype) for a in big]


@pytest.mark.native
def test_sgemm_loads_cython_blas_without_scipy_linalg():
    """SciPy's sgemm for the compiled kernels comes from ``cython_blas`` loaded alone: a float
    session that decides on it leaves ``scipy.linalg`` (its LAPACK wrappers, about 14 MiB
    resident) unimported, and a later ``from scipy.linalg import cython_blas`` is that module."""
    pytest.importorskip("scipy")
    code = ("import sys, numpy as np, runtime_core as rt\n"
            "from runtime_provider_cpu.fast import sgemm\n"
            "assert sgemm.sgemm_ready(), sgemm.SGEMM_REASON\n"
            "mod = sgemm.cython_blas()\n"
            "assert 'sgemm' in mod.__pyx_capi__\n"
            "loaded = 'scipy.linalg' in sys.modules\n"
            "from scipy.linalg import cython_blas\n"
            "print(loaded, cython_blas is mod)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False True"


@pytest.mark.native
def test_naming_the_choice_cache_does_not_load_openssl(tmp_path, linear_tiles):  # a choice to measure
    """A session that measures a kernel choice and writes it to the cache file leaves hashlib
    (OpenSSL, about 3.5 MiB resident) unimported: the file name is a checksum, not a digest."""
    code = ("import os, sys, numpy as np, runtime_core as rt\n"
            "from onnx import helper, TensorProto\n"
            "n = helper.make_node('MatMul', ['a', 'w'], ['y'])\n"
            "w = helper.make_tensor('w', TensorProto.FLOAT, [64, 48], np.ones(64 * 48, np.float32))\n"
            "g = helper.make_graph([n], 'g', [helper.make_tensor_value_info('a', TensorProto.FLOAT, [16, 64])],\n"
            "                      [helper.make_tensor_value_info('y', TensorProto.FLOAT, [16, 48])], [w])\n"
            "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]); m.ir_version = 8\n"
            "before = 'hashlib' in sys.modules or '_hashlib' in sys.modules\n"
            "from runtime_provider_cpu.fast import autotune\n"
            "autotune.NOISY_SHARE = float('inf')  # written even beside busy processes\n"
            "s = rt.InferenceSession(m.SerializeToString(), providers=['cpu'])\n"
            "y = s.run(None, {'a': np.ones((16, 64), np.float32)})[0]\n"
            "assert np.all(y == 64), y\n"
            "files = [f for f in os.listdir(os.environ['RUNTIME_CORE_AUTOTUNE_DIR']) if f.startswith('autotune-')]\n"
            "print(len(files), before, 'hashlib' in sys.modules or '_hashlib' in sys.modules)\n")
    env = dict(os.environ, RUNTIME_CORE_AUTOTUNE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    files, before, after = out.stdout.strip().splitlines()[-1].split()
    # where a dependency already loaded hashlib on import (older releases at the lowest bounds
    # do), the session cannot be seen not to; otherwise it must leave it unloaded
    assert files == "1" and (after == "False" or before == "True"), out.stdout
