"""Model quantization with onnxruntime.quantization's names and meanings: change the import
and a quantization script runs here, calibrating on runtime_core sessions.

See docs/quantization.md."""

from ._common import CalibrationMethod, QuantFormat, QuantType
from .calibrate import CalibrationDataReader, TensorRange, create_calibrator
from .float16 import convert_float_to_float16
from .nbits import MatMulNBitsQuantizer, quantize_matmul_nbits
from .report import TensorError, accuracy_report, format_report
from .quantize import load_ranges, quant_pre_process, quantize_dynamic, quantize_static, save_ranges

__all__ = ["quantize_dynamic", "quantize_static", "quant_pre_process", "CalibrationDataReader",
           "QuantFormat", "QuantType", "CalibrationMethod", "TensorRange", "create_calibrator",
           "save_ranges", "load_ranges", "accuracy_report", "format_report", "TensorError",
           "MatMulNBitsQuantizer", "quantize_matmul_nbits", "convert_float_to_float16"]
