"""quantize_dynamic, quantize_static and quant_pre_process: onnxruntime.quantization's
entry points with the same arguments and meanings."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import onnx

from ..errors import InvalidArgumentError, ModelFileNotFoundError
from ._common import CalibrationMethod, ModelView, QuantFormat, QuantType
from ._quantizer import Settings, topological_sort
from .calibrate import create_calibrator
from .qdq import QDQQuantizer
from .qoperator import QOperatorQuantizer, gemm_to_matmul
from ..graph.validate import infer_shapes  # the one door to onnx's shape inference

logger = logging.getLogger("runtime_core.quantization")

#: op types quantize_dynamic rewrites by default (onnxruntime's IntegerOps registry)
DYNAMIC_OPS = ("Conv", "MatMul", "Attention", "LSTM", "Gather", "Transpose", "EmbedLayerNormalization")
#: op types quantize_static rewrites by default (onnxruntime's QLinearOps and QDQ registries)
STATIC_OPS = ("ArgMax", "Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "Clip", "LeakyRelu", "Sigmoid", "MaxPool",
              "GlobalAveragePool", "Split", "Pad", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Resize",
              "AveragePool", "Concat", "Softmax", "Where", "Gather", "Transpose", "EmbedLayerNormalization",
              "ConvTranspose", "Slice", "GatherElements", "InstanceNormalization", "LayerNormalization",
              "BatchNormalization", "TopK", "CumSum")
PRE_PROCESS_KEY = "onnx.quant.pre_process"

_CALIB_KEYS = {"CalibTensorRangeSymmetric": "symmetric", "CalibMovingAverage": "moving_average",
               "CalibMovingAverageConstant": "averaging_constant", "CalibPercentile": "percentile",
               "CalibNumBins": "num_bins", "CalibNumQuantizedBins": "num_quantized_bins",
               "CalibScenario": "scenario"}


def load_model(model_input) -> onnx.ModelProto:
    """The model as a shape-inferred ModelProto (a path or a ModelProto, never modified)."""
    if isinstance(model_input, onnx.ModelProto):
        model = copy.deepcopy(model_input)
    else:
        p = Path(os.fspath(model_input))
        if not p.is_file():
            raise ModelFileNotFoundError(f"model file {str(p)!r} does not exist")
        try:
            model = onnx.load(str(p))
        except Exception as e:
            raise InvalidArgumentError(f"cannot read {str(p)!r} as an ONNX model: {e}") from e
    try:
        return infer_shapes(model)
    except Exception as e:  # shape inference is a help, not a requirement
        logger.warning("shape inference failed (%s); element types come from the graph's declarations", e)
        return model


def _qtype(t, what: str) -> QuantType:
    if isinstance(t, QuantType):
        return t
    if isinstance(t, str):
        return QuantType.from_string(t)
    raise InvalidArgumentError(f"{what} must be a QuantType (QInt8, QUInt8, ...), got {t!r}")


def _names(x, what: str) -> set[str]:
    if x is None:
        return set()
    if isinstance(x, str) or not all(isinstance(i, str) for i in x):
        raise InvalidArgumentError(f"{what} must be a list of names, got {x!r}")
    return set(x)


def _update_opset(model: onnx.ModelProto, types: tuple[int, ...]) -> onnx.ModelProto:
    """16-bit and 4-bit Q/DQ need opset 21, per-axis scales opset 13; older models are
    converted with onnx's version converter."""
    wide = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    need = 21 if wide & set(types) else 13
    cur = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if cur >= need:
        return model
    try:
        from onnx import version_converter

        return infer_shapes(version_converter.convert_version(model, need), data_prop=False)
    except Exception as e:
        raise InvalidArgumentError(f"the model's opset {cur} is below the {need} these quantization types need, "
                                   f"and onnx could not convert it: {e}") from e


def _save(model: onnx.ModelProto, out, use_external_data_format: bool) -> None:
    topological_sort(model.graph)
    del model.graph.value_info[:]  # stale after the rewrite; a later load infers them again
    model.producer_name = "runtime_core.quantization"
    if use_external_data_format:
        onnx.save_model(model, os.fspath(out), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=Path(os.fspath(out)).name + ".data")
    else:
        onnx.save_model(model, os.fspath(out))


def _check_out(model_output) -> None:
    if isinstance(model_output, onnx.ModelProto) or model_output is None:
        raise InvalidArgumentError("model_output must be a file path")
    parent = Path(os.fspath(model_output)).resolve().parent
    if not parent.is_dir():
        raise InvalidArgumentError(f"the folder of model_output {str(parent)!r} does not exist")


def quantize_dynamic(model_input, model_output, op_types_to_quantize=None, per_channel=False, reduce_range=False,
                     weight_type=QuantType.QInt8, nodes_to_quantize=None, nodes_to_exclude=None,
                     use_external_data_format=False, extra_options=None) -> None:
    """Quantize weights to ``weight_type`` and compute activation scales at run time
    (DynamicQuantizeLinear + MatMulInteger / ConvInteger), as onnxruntime's quantize_dynamic.

    ``extra_options``: WeightSymmetric, ActivationSymmetric, MatMulConstBOnly (default True),
    ForceQuantizeNoInputCheck. Attention, LSTM and EmbedLayerNormalization are left in float."""
    _check_out(model_output)
    extra = dict(extra_options or {})
    wt = _qtype(weight_type, "weight_type")
    if wt not in (QuantType.QInt8, QuantType.QUInt8):
        raise InvalidArgumentError(f"quantize_dynamic supports weight_type QInt8 or QUInt8, got {wt}")
    model = load_model(model_input)
    s = Settings.from_options(extra, static=False, per_channel=bool(per_channel), reduce_range=bool(reduce_range),
                              weight_type=wt.tensor_type, activation_type=onnx.TensorProto.UINT8,
                              op_types=set(op_types_to_quantize or DYNAMIC_OPS),
                              nodes_to_quantize=_names(nodes_to_quantize, "nodes_to_quantize"),
                              nodes_to_exclude=_names(nodes_to_exclude, "nodes_to_exclude"))
    mv = ModelView(model)
    gemm_to_matmul(mv)
    QOperatorQuantizer(mv, s, None).run()
    _save(mv.model, model_output, use_external_data_format)


def _calibrate(model, reader, op_types, method, providers, extra):
    calib_opts = {k2: extra[k1] for k1, k2 in _CALIB_KEYS.items() if k1 in extra}
    cal = create_calibrator(model, op_types, method, providers, calib_opts,
                            progress=bool(extra.get("CalibProgress", True)))
    stride = extra.get("CalibStridedMinMax")
    if stride:
        n = len(reader)
        if n % stride:
            raise InvalidArgumentError(f"CalibStridedMinMax {stride} does not divide the {n} calibration samples")
        for start in range(0, n, stride):
            reader.set_range(start_index=start, end_index=start + stride)
            cal.collect_data(reader)
    else:
        cal.collect_data(reader)
    return cal.compute_data()


def quantize_static(model_input, model_output, calibration_data_reader=None, quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=None, per_channel=False, reduce_range=False,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_quantize=None,
                    nodes_to_exclude=None, use_external_data_format=False,
                    calibrate_method=CalibrationMethod.MinMax, calibration_providers=None, extra_options=None,
                    calibration_cache_path=None) -> None:
    """Calibrate activation ranges on runtime_core sessions, then write a model with
    quantized weights and activations, as onnxruntime's quantize_static.

    ``quant_format``: QDQ (Quantize/DequantizeLinear pairs) or QOperator (QLinearConv,
    QLinearMatMul, QGemm, QLinearAdd/Mul). ``calibrate_method``: MinMax, Entropy,
    Percentile or Distribution. ``extra_options`` as onnxruntime's (ActivationSymmetric,
    WeightSymmetric, CalibMovingAverage, CalibMovingAverageConstant, CalibTensorRangeSymmetric,
    CalibPercentile, CalibStridedMinMax, ForceQuantizeNoInputCheck, MatMulConstBOnly,
    AddQDQPairToWeight, OpTypesToExcludeOutputQuantization, QDQOpTypePerChannelSupportToAxis,
    QDQKeepRemovableActivations, UseQDQContribOps, MinimumRealRange), plus CalibProgress
    (default True: a progress bar on calibrations longer than 2 s)."""
    _check_out(model_output)
    extra = dict(extra_options or {})
    at, wt = _qtype(activation_type, "activation_type"), _qtype(weight_type, "weight_type")
    if not isinstance(quant_format, QuantFormat):
        quant_format = QuantFormat.from_string(str(quant_format))
    if not isinstance(calibrate_method, CalibrationMethod):
        raise InvalidArgumentError(f"calibrate_method must be a CalibrationMethod, got {calibrate_method!r}")
    if at == QuantType.QInt8 and wt == QuantType.QUInt8:
        raise InvalidArgumentError("activation_type QInt8 with weight_type QUInt8 is not supported "
                                   "(as in onnxruntime); use QUInt8 activations or QInt8 weights")
    wide = {QuantType.QInt16, QuantType.QUInt16, QuantType.QInt4, QuantType.QUInt4}
    if (at in wide or wt in wide) and quant_format != QuantFormat.QDQ:
        raise InvalidArgumentError("16-bit and 4-bit types need quant_format=QuantFormat.QDQ")
    if calibration_data_reader is None and not (calibration_cache_path and Path(calibration_cache_path).is_file()):
        raise InvalidArgumentError("quantize_static needs a calibration_data_reader "
                                   "(or an existing calibration_cache_path)")
    op_types = list(op_types_to_quantize or STATIC_OPS)
    model = load_model(model_input)
    model = _update_opset(model, (at.tensor_type, wt.tensor_type))
    if calibration_cache_path and Path(calibration_cache_path).is_file():
        ranges = load_ranges(calibration_cache_path)
    else:
        ranges = _calibrate(model, calibration_data_reader, op_types, calibrate_method, calibration_providers, extra)
        if calibration_cache_path:
            save_ranges(ranges, calibration_cache_path)
    s = Settings.from_options(extra, static=True, per_channel=bool(per_channel), reduce_range=bool(reduce_range),
                              weight_type=wt.tensor_type, activation_type=at.tensor_type, op_types=set(op_types),
                              nodes_to_quantize=_names(nodes_to_quantize, "nodes_to_quantize"),
                              nodes_to_exclude=_names(nodes_to_exclude, "nodes_to_exclude"))
    mv = ModelView(model)
    if quant_format == QuantFormat.QDQ:
        QDQQuantizer(mv, s, ranges).run()
        mv.ensure_ms_opset()
    else:
        QOperatorQuantizer(mv, s, ranges).run()
    _save(mv.model, model_output, use_external_data_format)


def save_ranges(ranges: dict, path) -> None:
    """Write calibrated ranges as JSON ({tensor: [lowest, highest]})."""
    import json

    data = {k: [float(v.range_value[0]), float(v.range_value[1])] for k, v in ranges.items()}
    Path(os.fspath(path)).write_text(json.dumps(data, indent=1))


def load_ranges(path) -> dict:
    """Read ranges written by :func:`save_ranges`."""
    import json

    import numpy as np

    from .calibrate import TensorRange

    try:
        data = json.loads(Path(os.fspath(path)).read_text())
        return {k: TensorRange(np.array(v[0], np.float32), np.array(v[1], np.float32)) for k, v in data.items()}
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise InvalidArgumentError(f"calibration cache {str(path)!r} is not a range file written by "
                                   f"quantize_static: {e}") from e


def quant_pre_process(input_model=None, output_model_path=None, skip_optimization=False,
                      skip_onnx_shape=False, skip_symbolic_shape=False, auto_merge=False, int_max=2**31 - 1,
                      guess_output_rank=False, verbose=0, save_as_external_data=False,
                      all_tensors_to_one_file=False, external_data_location=None,
                      external_data_size_threshold=1024, **deprecated) -> None:
    """Prepare a float model for quantization: runtime_core's BASIC optimizations (constant
    folding, redundant node removal: nothing that fuses ops away from what the quantizer
    recognises) and ONNX shape inference, then mark the model as pre-processed.

    The symbolic-shape arguments of onnxruntime's version are accepted and ignored
    (onnx's shape inference with data propagation is used)."""
    if input_model is None and "input_model_path" in deprecated:
        input_model = deprecated.pop("input_model_path")
    if input_model is None or output_model_path is None:
        raise InvalidArgumentError("quant_pre_process needs input_model and output_model_path")
    model = load_model(input_model)
    if not skip_optimization:
        import tempfile

        from ..session import GraphOptimizationLevel, InferenceSession, SessionOptions

        with tempfile.TemporaryDirectory(prefix="rtq.") as d:
            so = SessionOptions()
            so.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.optimized_model_filepath = os.path.join(d, "opt.onnx")
            InferenceSession(model.SerializeToString(), so, providers=["cpu"])
            model = onnx.load(so.optimized_model_filepath)
    if not skip_onnx_shape:
        model = infer_shapes(model)
    props = {p.key: p.value for p in model.metadata_props}
    props[PRE_PROCESS_KEY] = "onnxruntime.quant"
    onnx.helper.set_model_props(model, props)
    if save_as_external_data:
        onnx.save_model(model, os.fspath(output_model_path), save_as_external_data=True,
                        all_tensors_to_one_file=all_tensors_to_one_file, location=external_data_location,
                        size_threshold=external_data_size_threshold)
    else:
        onnx.save_model(model, os.fspath(output_model_path))
