"""``runtime-core quantize IN OUT --mode dynamic|static [--calib DIR] [--report] ...``

``--calib DIR``: a folder of ``.npz`` files, each one feed (one array per model input,
stored under the input's name: ``numpy.savez(path, input_ids=..., attention_mask=...)``),
read in file-name order."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["register", "NpzDataReader"]


def register(sub) -> None:
    """Add the ``quantize`` subcommand."""
    sp = sub.add_parser("quantize", help="quantize a model (onnxruntime.quantization compatible)")
    sp.add_argument("input", help="float model (.onnx)")
    sp.add_argument("output", help="where to write the quantized model")
    sp.add_argument("--mode", choices=["dynamic", "static"], default="dynamic")
    sp.add_argument("--calib", metavar="DIR", help="folder of .npz feeds (one per batch, arrays named after the "
                                                  "model inputs): calibration data for --mode static and the "
                                                  "feeds of --report")
    sp.add_argument("--format", choices=["qdq", "qoperator"], default="qdq", help="static format (default qdq)")
    sp.add_argument("--per-channel", action="store_true", help="quantize weights per output channel")
    sp.add_argument("--reduce-range", action="store_true", help="7-bit weights")
    sp.add_argument("--weight-type", choices=["QInt8", "QUInt8", "QInt16", "QUInt16", "QInt4", "QUInt4"],
                    default="QInt8")
    sp.add_argument("--activation-type", choices=["QInt8", "QUInt8", "QInt16", "QUInt16"], default=None,
                    help="static activations (default QInt8 for qdq, QUInt8 for qoperator)")
    sp.add_argument("--calibrate-method", choices=["MinMax", "Entropy", "Percentile", "Distribution"],
                    default="MinMax")
    sp.add_argument("--op-types", help="comma-separated op types to quantize (default: all supported)")
    sp.add_argument("--exclude", help="comma-separated node names to leave in float")
    sp.add_argument("--report", action="store_true", help="print the per-tensor accuracy table, worst first")
    sp.add_argument("--report-limit", type=int, default=20, help="rows of --report (default 20)")
    sp.set_defaults(fn=cmd_quantize)


class NpzDataReader:
    """A CalibrationDataReader over a folder of .npz files (file-name order)."""

    def __init__(self, folder: str, input_names: list[str]):
        from ..cli_args import UsageError

        self.files = sorted(Path(folder).glob("*.npz"))
        if not self.files:
            raise UsageError(f"--calib {folder}: no .npz files in this folder")
        self.input_names = input_names
        self.i = 0

    def __len__(self) -> int:
        return len(self.files)

    def rewind(self) -> None:
        self.i = 0

    def get_next(self):
        import numpy as np

        from ..cli_args import UsageError

        if self.i >= len(self.files):
            return None
        f = self.files[self.i]
        self.i += 1
        try:
            with np.load(f, allow_pickle=False) as z:
                feed = {k: z[k] for k in z.files}
        except Exception as e:
            raise UsageError(f"--calib: cannot read {f}: {e}") from e
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise UsageError(f"--calib: {f.name} lacks input(s) {', '.join(missing)} "
                             f"(it holds {', '.join(feed) or 'nothing'})")
        return {n: feed[n] for n in self.input_names}


def cmd_quantize(args, out) -> int:
    import onnx

    from ..cli_args import UsageError, check_output_file, check_readable
    from . import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from .report import accuracy_report, format_report

    check_readable(args.input, "input model")
    check_output_file(args.output, "output", not_same_as=args.input)
    if args.calib and not os.path.isdir(args.calib):
        raise UsageError(f"--calib {args.calib}: not a folder")
    if args.mode == "static" and not args.calib:
        raise UsageError("--mode static needs --calib DIR (a folder of .npz feeds)")
    if args.report and not args.calib:
        raise UsageError("--report needs --calib DIR (the feeds to compare on)")
    m = onnx.load(args.input, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    ops = [s.strip() for s in args.op_types.split(",") if s.strip()] if args.op_types else None
    excl = [s.strip() for s in args.exclude.split(",") if s.strip()] if args.exclude else None
    reader = NpzDataReader(args.calib, names) if args.calib else None
    if args.mode == "dynamic":
        quantize_dynamic(args.input, args.output, op_types_to_quantize=ops, per_channel=args.per_channel,
                         reduce_range=args.reduce_range, weight_type=QuantType[args.weight_type],
                         nodes_to_exclude=excl)
    else:
        fmt = QuantFormat.QDQ if args.format == "qdq" else QuantFormat.QOperator
        act = args.activation_type or ("QInt8" if fmt == QuantFormat.QDQ else "QUInt8")
        quantize_static(args.input, args.output, reader, quant_format=fmt, op_types_to_quantize=ops,
                        per_channel=args.per_channel, reduce_range=args.reduce_range,
                        activation_type=QuantType[act], weight_type=QuantType[args.weight_type],
                        nodes_to_exclude=excl, calibrate_method=CalibrationMethod[args.calibrate_method])
    before, after = os.path.getsize(args.input), os.path.getsize(args.output)
    out.write(f"{args.input} ({before / 1e6:.2f} MB) -> {args.output} ({after / 1e6:.2f} MB), "
              f"{args.mode}{'' if args.mode == 'dynamic' else ' ' + args.format}\n")
    if args.report and reader is not None:
        reader.rewind()
        rows = accuracy_report(args.input, args.output, reader)
        out.write(format_report(rows, args.report_limit))
    sys.stdout.flush()
    return 0
