"""GPU verification: tests, conformance with [cuda, cpu], BERT-base b8 benchmark, summary.

    python providers/cuda/scripts/gpu_check.py      (what `nox -s gpu` runs after installing)

Writes gpu_summary.json (and .txt) to $OUT when set, else to the current folder.
"""
import json, os, subprocess, sys, time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(os.environ.get("OUT") or ".")
summary = {}


def sh(name, cmd, timeout):
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT / "tests")
        summary[name] = {"rc": p.returncode, "seconds": round(time.time() - t, 1),
                         "tail": (p.stdout + p.stderr)[-3000:]}
    except subprocess.TimeoutExpired as e:
        summary[name] = {"rc": "timeout", "seconds": timeout, "tail": str(e.stdout or "")[-3000:]}
    print(name, summary[name]["rc"], flush=True)


def bert(batch=8, seq=128, d=768, heads=12, ff=3072, layers=12, seed=0):
    """A BERT-base-sized encoder built with onnx.helper (no torch needed)."""
    r = np.random.default_rng(seed)
    inits, nodes = [], []
    W = lambda n, *s: inits.append(numpy_helper.from_array((r.standard_normal(s) * 0.02).astype(np.float32), n)) or n  # noqa
    C = lambda n, v: inits.append(numpy_helper.from_array(np.asarray(v), n)) or n  # noqa
    C("shp", np.array([batch, seq, heads, d // heads], np.int64)); C("shp2", np.array([batch, seq, d], np.int64))
    C("scale", np.float32(1 / np.sqrt(d // heads))); C("half", np.float32(0.5)); C("one", np.float32(1.0))
    C("rs2", np.float32(1 / np.sqrt(2)))
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        def lin(inp, n, k, m):
            nodes.append(helper.make_node("MatMul", [inp, W(p + n + "_w", k, m)], [p + n + "_mm"]))
            nodes.append(helper.make_node("Add", [p + n + "_mm", W(p + n + "_b", m)], [p + n]))
            return p + n
        heads_ = []
        for n in ("q", "k", "v"):
            t = lin(x, n, d, d)
            nodes.append(helper.make_node("Reshape", [t, "shp"], [t + "_r"]))
            nodes.append(helper.make_node("Transpose", [t + "_r"], [t + "_t"], perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]))
            heads_.append(t + "_t")
        nodes += [helper.make_node("MatMul", heads_[:2], [p + "s"]), helper.make_node("Mul", [p + "s", "scale"], [p + "ss"]),
                  helper.make_node("Softmax", [p + "ss"], [p + "a"], axis=-1),
                  helper.make_node("MatMul", [p + "a", heads_[2]], [p + "ctx"]),
                  helper.make_node("Transpose", [p + "ctx"], [p + "ct"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [p + "ct", "shp2"], [p + "cr"])]
        o = lin(p + "cr", "o", d, d)
        nodes += [helper.make_node("Add", [o, x], [p + "r1"]),
                  helper.make_node("LayerNormalization", [p + "r1", W(p + "g1", d), W(p + "b1", d)], [p + "n1"], axis=-1, epsilon=1e-5)]
        h = lin(p + "n1", "f1", d, ff)
        nodes += [helper.make_node("Mul", [h, "rs2"], [p + "g0"]), helper.make_node("Erf", [p + "g0"], [p + "g1e"]),
                  helper.make_node("Add", [p + "g1e", "one"], [p + "g2"]), helper.make_node("Mul", [h, p + "g2"], [p + "g3"]),
                  helper.make_node("Mul", [p + "g3", "half"], [p + "gelu"])]
        f2 = lin(p + "gelu", "f2", ff, d)
        nodes += [helper.make_node("Add", [f2, p + "n1"], [p + "r2"]),
                  helper.make_node("LayerNormalization", [p + "r2", W(p + "g2n", d), W(p + "b2n", d)], [p + "out"], axis=-1, epsilon=1e-5)]
        x = p + "out"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    g = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def bench():
    import runtime_core as rt
    res = {}
    data = bert()
    x = np.random.default_rng(1).standard_normal((8, 128, 768)).astype(np.float32)

    def timeit(run, n):
        run(); run()
        ts = []
        for _ in range(n):
            t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
        return float(np.median(ts) * 1e3)

    s_cuda = rt.InferenceSession(data, providers=["cuda", "cpu"])
    place = {}
    for n in s_cuda.get_partition_report().nodes:
        place[n.provider] = place.get(n.provider, 0) + 1
    res["placement"] = place
    y_cuda = s_cuda.run(None, {"x": x})[0]
    res["ours_cuda_ms"] = timeit(lambda: s_cuda.run(None, {"x": x}), 20)
    b = s_cuda.io_binding(); v = rt.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    b.bind_ortvalue_input("x", v); b.bind_output("y", "cuda")
    res["ours_cuda_iobinding_ms"] = timeit(lambda: s_cuda.run_with_iobinding(b), 20)
    so = rt.SessionOptions(); so.intra_op_num_threads = os.cpu_count()
    s_cpu = rt.InferenceSession(data, so, providers=["cpu"])
    y_cpu = s_cpu.run(None, {"x": x})[0]
    res["ours_cpu_ms"] = timeit(lambda: s_cpu.run(None, {"x": x}), 3)
    res["max_abs_diff_cuda_vs_cpu"] = float(np.abs(y_cuda - y_cpu).max())
    res["speedup_cuda_vs_cpu"] = res["ours_cpu_ms"] / res["ours_cuda_ms"]
    try:
        import onnxruntime as ort
        if "CUDAExecutionProvider" in ort.get_available_providers():
            s_ort = ort.InferenceSession(data, providers=["CUDAExecutionProvider"])
            res["onnxruntime_gpu_ms"] = timeit(lambda: s_ort.run(None, {"x": x}), 20)
            res["ratio_ours_vs_ort_gpu"] = res["ours_cuda_ms"] / res["onnxruntime_gpu_ms"]
        else:
            res["onnxruntime_gpu"] = f"not available (providers {ort.get_available_providers()})"
    except ImportError:
        res["onnxruntime_gpu"] = "onnxruntime not installed"
    return res


if __name__ == "__main__":
    import runtime_core as rt
    summary["providers"] = [p for p in rt.get_provider_info() if p["alias"] == "cuda"]
    for p in summary["providers"]:
        p.pop("cls", None)
    py = sys.executable

    def save():
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "gpu_summary.json").write_text(json.dumps(summary, indent=1, default=str))

    # most important first, the summary written after each step (the device time is short)
    try:
        summary["bert_base_b8"] = bench()
    except Exception as exc:  # noqa: BLE001
        summary["bert_base_b8"] = {"error": f"{type(exc).__name__}: {exc}"}
    save()
    for prov in ("cuda,cpu", "cpu"):
        sh(f"conformance_{prov}", [py, "-m", "runtime_core.cli", "conformance", "--providers", prov,
                                   "--per-provider", "--quiet"], 180)
        save()
    sh("pytest_cuda", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "providers/cuda", "plugins", "core"], 200)
    save()
    print(json.dumps({k: (v if k != "pytest_cuda" and not k.startswith("conformance") else
                          {"rc": v["rc"], "tail": v["tail"][-600:]}) for k, v in summary.items()}, indent=1, default=str))
