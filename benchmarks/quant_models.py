"""Quantized whole models, runtime-core against onnxruntime, by the protocol of
``runtime-core bench --compare onnxruntime`` (``runtime_core.bench_protocol``: each runtime alone
in a fresh process per round, alternating, median of the per-round ratios, OPENBLAS pins removed).

Five float models are built at benchmark time (torch exports with random weights, the builders of
``benchmarks/models.py``) and each is quantized twice, by onnxruntime's quantization tool and by
``runtime_core.quantization`` with the same settings (calibration data random, seeded):

* ``bert_base_dyn_b1``: BERT-base-sized encoder, ``quantize_dynamic`` int8 weights, batch 1;
* ``bert_tiny_dyn_b8``: BERT-tiny-sized encoder, ``quantize_dynamic`` int8 weights, batch 8;
* ``resnet18_qdq_b1``: ResNet-18, ``quantize_static`` QDQ, int8 per-channel weights, batch 1;
* ``mobilenet_v2_qdq_b1``: MobileNetV2, ``quantize_static`` QDQ, int8 per-channel weights, batch 1;
* ``gpt2_nbits_b1``: GPT-2-small-sized decoder, MatMul weights as 4-bit ``MatMulNBits``
  (block 32, symmetric), batch 1, 128 tokens;
* ``gpt2_nbits_int8_b1``: the same with ``accuracy_level=4`` (int8 compute: activations quantized
  per block, int8 dot products, as onnxruntime's CompInt8);
* ``gpt2_nbits_s1``: the same decoder exported for one token (the decode step's matmul shapes,
  without a KV cache), 4-bit block 32 symmetric, float compute.

Both runtimes run both quantizers' models (a row per model and quantizer). Run::

    python benchmarks/quant_models.py [--cache DIR] [--rounds 3] [--threads 2] [--float] [NAME ...]

``--float`` adds the float originals (a quantized model should beat its float original on
runtime-core). Models are built once into the cache folder (``$RUNTIME_CORE_BENCH_CACHE``/quant by
default); delete it to rebuild. torch and onnxruntime are benchmark-only dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models as float_models  # noqa: E402  (benchmarks/models.py: the float builders)

CALIB_SAMPLES = 8


def _reader_class(base):
    """A CalibrationDataReader (onnxruntime's or ours: ``base``) of seeded random samples shaped
    like the model's benchmark feeds (standard normal floats, as the feeds themselves)."""

    class Reader(base):
        def __init__(self, feeds: dict):
            self.feeds, self.i = feeds, 0
            self.rng = np.random.default_rng(0)

        def get_next(self):
            if self.i >= CALIB_SAMPLES:
                return None
            self.i += 1
            return {k: self.rng.standard_normal(v.shape).astype(v.dtype) for k, v in self.feeds.items()}

    return Reader


def _dynamic(tool, src: Path, dst: Path, feeds: dict) -> None:
    q = _tool(tool)
    q.quantize_dynamic(str(src), str(dst), weight_type=q.QuantType.QInt8)


def _static_qdq(tool, src: Path, dst: Path, feeds: dict) -> None:
    q = _tool(tool)
    q.quantize_static(str(src), str(dst), _reader_class(q.CalibrationDataReader)(feeds),
                      quant_format=q.QuantFormat.QDQ, per_channel=True, activation_type=q.QuantType.QInt8,
                      weight_type=q.QuantType.QInt8, calibrate_method=q.CalibrationMethod.MinMax)


def _nbits(tool, src: Path, dst: Path, feeds: dict, accuracy_level: int | None = None) -> None:
    if tool == "ort":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    else:
        from runtime_core.quantization import MatMulNBitsQuantizer
    import onnx

    q = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=32, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    q.model.save_model_to_file(str(dst))


def _nbits_int8(tool, src: Path, dst: Path, feeds: dict) -> None:
    _nbits(tool, src, dst, feeds, accuracy_level=4)


def _tool(tool):
    if tool == "ort":
        import onnxruntime.quantization as q
    else:
        import runtime_core.quantization as q
    return q


#: name -> (float builder name in benchmarks/models.py, quantizer, description)
MODELS = {
    "bert_base_dyn_b1": ("bert_base", _dynamic, "BERT-base-sized, quantize_dynamic int8, b1 s128"),
    "bert_tiny_dyn_b8": ("bert_tiny_b8", _dynamic, "BERT-tiny-sized, quantize_dynamic int8, b8 s128"),
    "resnet18_qdq_b1": ("resnet18", _static_qdq, "ResNet-18, quantize_static QDQ per-channel int8, b1"),
    "mobilenet_v2_qdq_b1": ("mobilenet_v2", _static_qdq, "MobileNetV2, quantize_static QDQ per-channel int8, b1"),
    "gpt2_nbits_b1": ("gpt2_small", _nbits, "GPT-2-small-sized, MatMulNBits 4-bit block 32 symmetric, b1 s128"),
    "gpt2_nbits_int8_b1": ("gpt2_small", _nbits_int8,
                           "GPT-2-small-sized, MatMulNBits 4-bit block 32 symmetric accuracy_level=4, b1 s128"),
    "gpt2_nbits_s1": ("gpt2_small_s1", _nbits, "GPT-2-small-sized, MatMulNBits 4-bit block 32 symmetric, b1 s1"),
}
TOOLS = ("ort", "ours")

#: rows whose outputs may differ from onnxruntime's by more than the protocol's default: with
#: accuracy_level=4 each runtime quantizes A to int8 per block, and a float difference far below
#: 1e-6 upstream can flip a code by one step (onnxruntime differs from itself by 2e-3 on this model
#: between its BASIC and ALL optimization levels)
#:
#: The other rows' differences were traced layer by layer (issue 31: every node output made a graph
#: output, onnxruntime at ORT_DISABLE_ALL against runtime-core with its optimizer off) and are the
#: same rounding effect, not a rule of ours that differs (tests/providers/cpu/test_quant.py pins
#: QuantizeLinear's and DynamicQuantizeLinear's ties bit-exact against onnxruntime):
#:
#: * QDQ rows: the first difference is one int8 code of one element, at a QuantizeLinear whose float
#:   input (a Conv's, its sums in another order) is one ulp from a tie (x / scale = 70.5000000 against
#:   70.5000076); the same input gives the same codes on both runtimes. At the output (Gemm ->
#:   QuantizeLinear -> DequantizeLinear) it ends as exactly one step of the output's scale, 0 or 1 step
#:   and never more: 0.00775 (MobileNetV2) / 0.0075 (ResNet-18) of the largest magnitude, on the bench
#:   feeds and 3 seeded ones, both quantizers' models. onnxruntime differs from itself by the same one
#:   step (ORT_ENABLE_ALL against ORT_DISABLE_ALL: 0.0078 / 0.0075 on 3 of those 4 feeds). 1e-2 passes
#:   one output step (the largest magnitude is ~130 steps) and fails two.
#: * bert_base_dyn_b1: the first difference is one uint8 code of 98304 in layer 0's first
#:   DynamicQuantizeLinear: the LayerNormalization before it differs in the last ulp (4.8e-7), so the
#:   scale is 1 ulp apart and x / scale = -20.5 rounds to even on one side, -20.500001 away on the
#:   other. Twelve layers of float residuals, softmax and GELU, each with DynamicQuantizeLinears of
#:   its own, grow that to 0.016-0.021 of the largest magnitude; onnxruntime against itself
#:   (ORT_ENABLE_ALL, which fuses into DynamicQuantizeMatMul / SkipLayerNorm, against ORT_DISABLE_ALL)
#:   0.017-0.021 on the same 4 feeds, our optimizer on against off 0.016-0.021 (and each runtime
#:   0.025-0.030 from the float model on the bench feeds). 5e-2 is ~2.4x the largest measured
#:   spread; so loose a bound cannot see a rounding rule of its own, which the unit tests check
#:   bit-exact instead.
#: bert_tiny_dyn_b8 (2 layers) passes the default.
TOLERANCE = {"gpt2_nbits_int8_b1": 1e-2, "bert_base_dyn_b1": 5e-2, "resnet18_qdq_b1": 1e-2,
             "mobilenet_v2_qdq_b1": 1e-2}


#: float models of these rows that benchmarks/models.py does not list (its own table stays as is)
EXTRA_FLOAT = {"gpt2_small_s1": lambda: float_models.gpt2_small(seq=1)}


def _build_float(fname: str, cache: Path) -> tuple[Path, Path]:
    if fname not in EXTRA_FLOAT:
        return float_models.build(fname, cache)
    model, feeds = cache / f"{fname}.onnx", cache / f"{fname}.npz"
    if not (model.exists() and feeds.exists()):
        data, inputs = EXTRA_FLOAT[fname]()
        tmp = model.with_suffix(".onnx.tmp")
        tmp.write_bytes(data)
        np.savez(feeds, **inputs)
        os.replace(tmp, model)
    return model, feeds


def build(name: str, cache: Path, with_float: bool = False) -> list[tuple]:
    """Build ``name``'s float model and both quantizers' models into ``cache`` (unless there);
    returns the protocol's ``(label, model path, feeds path[, tolerance])`` rows."""
    fname, quantize, _ = MODELS[name]
    fmodel, feeds_path = _build_float(fname, cache)
    rows = [(f"{fname} (float)", str(fmodel), str(feeds_path))] if with_float else []
    with np.load(feeds_path) as f:
        feeds = {k: f[k] for k in f.files}
    for tool in TOOLS:
        out = cache / f"{name}.{tool}.onnx"
        if not out.exists():
            tmp = cache / f"{name}.{tool}.tmp.onnx"
            quantize(tool, fmodel, tmp, feeds)
            os.replace(tmp, out)
        rows.append((f"{name} ({'onnxruntime' if tool == 'ort' else 'runtime-core'}-quantized)", str(out),
                     str(feeds_path), *([TOLERANCE[name]] if name in TOLERANCE else [])))
    return rows


def main(argv=None) -> int:
    from runtime_core import bench_protocol as bp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"models (default: all): {', '.join(MODELS)}")
    p.add_argument("--cache", default=str(float_models.DEFAULT_CACHE / "quant"), help="cache folder (default %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--tools", default="ort,ours", help="whose quantized models to run (default %(default)s)")
    p.add_argument("--float", action="store_true", help="also run the float originals")
    p.add_argument("--build-only", action="store_true", help="build the models and stop")
    p.add_argument("--json", help="write the report as JSON to this file")
    args = p.parse_args(argv)
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    tools = {t.strip() for t in args.tools.split(",")}
    if not tools or tools - set(TOOLS):
        p.error(f"--tools takes a comma-separated subset of {', '.join(TOOLS)}")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        for row in build(name, cache, args.float):
            label, model = row[0], row[1]
            if "(float)" in label and any(r[0] == label for r in rows):
                continue  # one float original serves several quantized rows
            if "(float)" in label or any(f".{t}.onnx" in model for t in tools):
                rows.append(row)
    if args.build_only:
        for label, model, *_ in rows:
            print(f"{label}: {model}")
        return 0

    def show(head, mc):
        print(bp.format_rows([mc]).splitlines()[1], flush=True)

    print("\n".join(f"{n}: {MODELS[n][2]}" for n in names), flush=True)
    rep = bp.compare(rows, threads=args.threads, rounds=args.rounds, warmup=args.warmup, repeat=args.repeat,
                     min_time=args.min_time, on_model=show)
    print()
    print(bp.format_report(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep.to_dict(), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
