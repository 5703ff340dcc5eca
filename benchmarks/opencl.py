"""OpenCL provider benchmark record: ours on [opencl, cpu] vs ours on [cpu] (and onnxruntime
CPU for reference) on the model families of the OpenCL model tests.

    python benchmarks/opencl.py [--repeat 20] [--batch 8] [--platform "Portable Computing Language"]
                                [--threads 2] [NAME ...]

Models (built at run time with torch, exported with the TorchScript exporter at opset 17 with a
dynamic batch axis, seeded): ``rescnn`` (ResNet-style CNN with BatchNorm and residuals, 32x32),
``depthwise`` (MobileNet-style, 32x32), ``bert`` (2-layer BERT-style encoder, d=64, seq 10),
``vit`` (ViT-style, 16x16 image, patch 4, d=32, 2 blocks). The run batch (``--batch``) differs
from the export batch, so the OpenCL partitions run specialized for a symbolic batch.

Each runtime is warmed up (3 runs: the first OpenCL run builds the specialization), then the
runtimes are timed interleaved, ``--repeat`` runs each; the table shows the median. This is a
record, not a target: on PoCL (a CPU OpenCL device sharing the same cores) OpenCL is expected
to be slower than the numpy/BLAS CPU provider.
"""

from __future__ import annotations

import argparse
import collections
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "providers" / "opencl"))

HEAVY = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization", "Softmax"}
NAMES = ["rescnn", "depthwise", "bert", "vit"]


def build(name: str, batch: int):
    """(model bytes, feeds at ``batch``)."""
    if name == "vit":
        from vit_builder import export_vit

        data, _, _ = export_vit("torchscript", 17)
        x = np.random.default_rng(0).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        return data, {"x": x}
    import importlib.util

    # tests/models/builders.py by path (benchmarks/models.py shadows the tests' models package)
    spec = importlib.util.spec_from_file_location("rc_test_builders", ROOT / "tests" / "models" / "builders.py")
    B = sys.modules.get("rc_test_builders")
    if B is None:
        B = importlib.util.module_from_spec(spec)
        sys.modules["rc_test_builders"] = B  # (dataclasses look their module up)
        spec.loader.exec_module(B)
    e = B.export_torch(name, "torchscript", 17)
    feeds = {}
    for k, v in e.feeds.items():
        reps = -(-batch // v.shape[0])
        feeds[k] = np.concatenate([v] * reps, axis=0)[:batch]
    return e.model, feeds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=NAMES)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--platform", default="Portable Computing Language")
    a = p.parse_args(argv)

    import onnxruntime as ort

    import runtime_core as rt

    so = rt.SessionOptions()
    so.intra_op_num_threads = a.threads
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = a.threads
    oso.log_severity_level = 3
    rows = []
    for name in a.names:
        data, feeds = build(name, a.batch)
        t0 = time.perf_counter()
        ocl = rt.InferenceSession(data, so, providers=[("opencl", {"platform": a.platform}), "cpu"])
        create_ocl = time.perf_counter() - t0
        t0 = time.perf_counter()
        cpu = rt.InferenceSession(data, so, providers=["cpu"])
        create_cpu = time.perf_counter() - t0
        ref = ort.InferenceSession(data, oso, providers=["CPUExecutionProvider"])
        rep = ocl.get_partition_report()
        heavy = [n for n in rep.nodes if n.op_type in HEAVY]
        on = sum(n.provider == "OpenCLExecutionProvider" for n in heavy)
        runners = {"opencl": lambda: ocl.run(None, feeds), "cpu": lambda: cpu.run(None, feeds),
                   "ort": lambda: ref.run(None, feeds)}
        t0 = time.perf_counter()
        first = runners["opencl"]()
        first_ocl = time.perf_counter() - t0
        err = max(float(np.max(np.abs(x - y))) for x, y in zip(first, runners["ort"]()))
        for r in runners.values():
            for _ in range(2):
                r()
        times = collections.defaultdict(list)
        for _ in range(a.repeat):
            for k, r in runners.items():
                t0 = time.perf_counter()
                r()
                times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((name, med, on, len(heavy), len(rep.partitions), create_ocl, create_cpu, first_ocl, err))
        print(f"{name}: opencl {med['opencl']:.2f} ms, cpu {med['cpu']:.2f} ms, ort {med['ort']:.2f} ms "
              f"(heavy on OpenCL {on}/{len(heavy)}, {len(rep.partitions)} partitions, max |diff| {err:.1e})",
              flush=True)
    import pyopencl as cl

    dev = next(d.name for p_ in cl.get_platforms() if a.platform.lower() in p_.name.lower()
               for d in p_.get_devices())
    lines = [f"`python benchmarks/opencl.py --repeat {a.repeat} --batch {a.batch} --threads {a.threads}`; "
             f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, OpenCL device {dev!r}.", "",
             "| model (batch %d) | ours [opencl, cpu] ms | ours [cpu] ms | onnxruntime CPU ms | opencl / cpu "
             "| heavy nodes on OpenCL | partitions | session creation opencl / cpu s | first OpenCL run s "
             "| max abs diff vs ort |" % a.batch,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, med, on, tot, parts, c_o, c_c, first, err in rows:
        lines.append(f"| {name} | {med['opencl']:.2f} | {med['cpu']:.2f} | {med['ort']:.2f} | "
                     f"{med['opencl'] / med['cpu']:.2f} | {on}/{tot} | {parts} | {c_o:.2f} / {c_c:.2f} | "
                     f"{first:.2f} | {err:.1e} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
