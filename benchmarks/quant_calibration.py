"""Calibration memory and time: MinMax vs Percentile (and Entropy) on a BERT-base-width encoder.

Each method runs in its own process (peak RSS = VmHWM of that process: the model, the session and
one batch's activations). Run:
    python benchmarks/quant_calibration.py [--layers 4] [--samples 128] [--seq 128] [--repeat 3]
``cpu_seconds`` (all of the process's threads) is the figure to compare on a shared machine,
where wall time follows the load. (torch is a benchmark-only dependency; methods "ort:MinMax", "ort:Percentile" run onnxruntime's
calibrator on the same model and data, for comparison.)
"""
import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings


def export(path, layers, seq):
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True, activation="gelu")
    enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    b = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(enc, (torch.randn(1, seq, 768),), b, dynamo=False, opset_version=17, input_names=["x"])
    open(path, "wb").write(b.getvalue())


def peak_mib():
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the
    forking parent (here the exporter, with torch loaded) across exec."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(path, method, samples, seq):
    import numpy as np

    from runtime_core.quantization import CalibrationMethod, create_calibrator
    from runtime_core.quantization.quantize import STATIC_OPS, load_model

    class Reader:
        def __init__(self):
            self.i = 0
            self.r = np.random.default_rng(0)

        def __len__(self):
            return samples

        def get_next(self):
            if self.i >= samples:
                return None
            self.i += 1
            return {"x": self.r.normal(0, 1, (1, seq, 768)).astype(np.float32)}

    rss0 = peak_mib()
    t, c = time.perf_counter(), time.process_time()
    if method.startswith("ort:"):  # onnxruntime's calibrator on the same model, for comparison
        from onnxruntime.quantization import CalibrationMethod as OM
        from onnxruntime.quantization import create_calibrator as oc

        with tempfile.TemporaryDirectory() as d:
            cal = oc(path, list(STATIC_OPS), os.path.join(d, "aug.onnx"), getattr(OM, method[4:]))
            cal.collect_data(Reader())
            ranges = cal.compute_data().data
    else:
        cal = create_calibrator(load_model(path), STATIC_OPS, getattr(CalibrationMethod, method), progress=False)
        cal.collect_data(Reader())
        ranges = cal.compute_data()
    dt, dc = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"method": method, "seconds": dt, "cpu_seconds": dc, "tensors": len(ranges),
                      "peak_rss_mib": peak_mib(), "peak_rss_before_calibration_mib": rss0}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--methods", default="MinMax,Percentile,Entropy")
    ap.add_argument("--repeat", type=int, default=1, help="runs per method, methods alternating; medians printed")
    ap.add_argument("--child", nargs=2)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.samples, a.seq)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "enc.onnx")
        export(p, a.layers, a.seq)
        runs: dict[str, list] = {}
        for _ in range(a.repeat):  # alternating, so that a change in machine load hits every method
            for m in a.methods.split(","):
                out = subprocess.run([sys.executable, __file__, "--child", p, m, "--samples", str(a.samples),
                                      "--seq", str(a.seq)], check=True, capture_output=True, text=True).stdout
                print(out.strip(), flush=True)
                runs.setdefault(m, []).append(json.loads(out.strip().splitlines()[-1]))
        if a.repeat > 1:
            first = next(iter(runs.values()))
            base = statistics.median(r["seconds"] for r in first)
            cbase = statistics.median(r["cpu_seconds"] for r in first)
            for m, rs in runs.items():
                t = statistics.median(r["seconds"] for r in rs)
                c = statistics.median(r["cpu_seconds"] for r in rs)
                print(json.dumps({"method": m, "median_seconds": t, "runs": len(rs), "ratio_to_first": t / base,
                                  "median_cpu_seconds": c, "cpu_ratio_to_first": c / cbase,
                                  "peak_rss_mib": max(r["peak_rss_mib"] for r in rs)}))


if __name__ == "__main__":
    main()
