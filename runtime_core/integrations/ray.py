"""Batch inference with Ray Data and online serving with Ray Serve (extra ``runtime-core[ray]``).

``Predictor`` is a callable class for ``Dataset.map_batches``: Ray builds one per actor, so the
model is loaded once per actor. ``deployment`` wraps a session in a Ray Serve application that
speaks the Open Inference Protocol v2 JSON body. Ray is imported on first use, never at import of
``runtime_core``. The rules (column mapping, batch dims, ZipMap outputs, errors) are in docs/ray.md.
"""

from __future__ import annotations

import copy
import difflib
import os
import pickle
import socket
import sys
from typing import Any

import numpy as np

from ..errors import (ExecutionError, InputError, InputNameError, InputShapeError, InputTypeError,
                      InvalidArgumentError, RuntimeCoreError)

__all__ = ["Predictor", "deployment", "partition_reports", "resources_for", "decode_infer_request",
           "encode_infer_response"]

_TENSOR_DTYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_, "tensor(string)": np.object_,
}
# Open Inference Protocol v2 datatypes (the names `runtime-core serve` uses too)
_OIP_TO_NP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
_NP_TO_OIP = {np.dtype(v).str: k for k, v in _OIP_TO_NP.items() if v is not np.object_}
_GPU_PROVIDERS = {"cuda", "cudaexecutionprovider"}
# each Predictor's partition report: one internal-KV entry per actor incarnation, keyed by the Ray
# namespace (a named registry actor was one more Python process to start per job)
_REPORT_NAMESPACE = "runtime_core"
_REPORT_PREFIX = "partition_report"

# No telemetry, ever: ray.init's own local cluster turns Ray's usage stats off, but a driver that
# joins a running cluster leaves them on, and Ray Data then starts a usage-collecting actor for it;
# set before the user's ray.init (an explicit RAY_USAGE_STATS_ENABLED=1 wins).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _ray():
    try:
        import ray
    except ImportError as e:  # the extra is not installed
        raise ImportError("runtime_core.integrations.ray needs Ray: pip install 'runtime-core[ray]'") from e
    return ray


def _running_ray():
    """Ray, when this process is connected to a cluster; else None, without importing Ray (a
    Predictor used in-process never pays for ``import ray``: ~0.3 CPU s)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def _provider_names(providers) -> list[str]:
    return [str(p[0] if isinstance(p, (tuple, list)) else p) for p in (providers or [])]


def resources_for(providers=None, num_cpus: float = 1) -> dict:
    """The Ray resource request for an actor whose session uses ``providers``: ``num_cpus``, plus
    ``num_gpus=1`` when a GPU provider (CUDA) is asked for. Pass it to ``map_batches(**...)`` or as
    Serve ``ray_actor_options`` so that Ray places the actor on a device it owns."""
    res: dict[str, float] = {"num_cpus": num_cpus}
    if any(n.lower() in _GPU_PROVIDERS for n in _provider_names(providers)):
        res["num_gpus"] = 1
    return res


def _actor_cpus() -> int | None:
    """The CPUs Ray assigned to the calling actor or task, or None outside Ray."""
    ray = _running_ray()
    if ray is None:
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # the driver has no assigned resources
        return None
    return max(1, int(cpus)) if cpus else None


def _make_session(model, providers, sess_options, provider_options):
    from .. import InferenceSession, SessionOptions

    if isinstance(sess_options, dict):  # a dict of SessionOptions attributes travels as plain data
        opts = SessionOptions()
        for k, v in sess_options.items():
            if not hasattr(opts, k):
                raise InvalidArgumentError(f"sess_options has no attribute {k!r}")
            setattr(opts, k, v)
        sess_options = opts
    elif sess_options is None:
        sess_options = SessionOptions()
    else:  # the thread count below must not change the caller's object
        sess_options = copy.copy(sess_options)
    threads = int(sess_options.intra_op_num_threads or 0)
    if threads == 0:  # size the pool from the actor's share, not the whole node
        cpus = _actor_cpus()
        if cpus:
            sess_options.intra_op_num_threads = cpus
    return InferenceSession(model, sess_options=sess_options, providers=providers,
                            provider_options=provider_options)


def _report_prefix() -> str:
    """The internal-KV key prefix of this Ray namespace's partition reports."""
    return f"{_REPORT_PREFIX}:{_ray().get_runtime_context().namespace}:"


def partition_reports() -> dict[str, dict]:
    """Each Predictor actor's partition report in this Ray namespace, keyed by actor id (a restarted
    actor reports again under its new incarnation's key): ``{"host", "pid", "providers",
    "intra_op_num_threads", "report": report.to_dict()}``. Reports live in the cluster's internal
    key-value store (the GCS), so publishing one starts no process."""
    _ray()
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():  # no cluster connected: nothing was published
        return {}
    prefix = _report_prefix()
    out = {}
    for key in internal_kv._internal_kv_list(prefix, namespace=_REPORT_NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=_REPORT_NAMESPACE)
        if value is not None:  # deleted meanwhile
            out[key.decode()[len(prefix):]] = pickle.loads(value)
    return out


def _check_rows(name: str, col, dtype, row_shape, lo: int) -> tuple[np.ndarray | None, list[tuple[int, str]]]:
    """The column as one array of ``dtype`` with rows of ``row_shape`` (None entries: any size), and
    the rows that do not fit, each with its reason. ``lo`` is the first row's index in the batch."""
    arr = None
    if not (isinstance(col, np.ndarray) and col.dtype == object):
        arr = np.asarray(col)
    bad: list[tuple[int, str]] = []
    if arr is None:  # per-row objects: ragged tensors, mixed types
        rows = []
        for i, v in enumerate(col):
            a = np.asarray(v)
            reason = _row_problem(a, dtype, row_shape)
            if reason:
                bad.append((lo + i, reason))
            rows.append(a)
        if bad:
            return None, bad
        shapes = {r.shape for r in rows}
        if len(shapes) > 1:  # each row fits the model, but they disagree on a symbolic dim
            first = rows[0].shape
            return None, [(lo + i, f"shape {r.shape} differs from row {lo}'s {first}")
                          for i, r in enumerate(rows) if r.shape != first]
        arr = np.stack(rows) if rows else np.empty((0,), dtype=dtype)
    reason = _row_problem(arr[0] if len(arr) else arr, dtype, row_shape) if arr.ndim else "a scalar, not a column"
    if reason:
        return None, [(lo + i, reason) for i in range(len(arr))]
    if dtype is not np.object_ and arr.dtype != dtype:
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr), []


def _row_problem(a: np.ndarray, dtype, row_shape) -> str:
    if dtype is np.object_:
        if a.dtype.kind not in "OUS":
            return f"element type {a.dtype}, expected strings"
    elif not np.can_cast(a.dtype, dtype, casting="same_kind"):
        return f"element type {a.dtype} does not convert to {np.dtype(dtype)} (same-kind casting)"
    if row_shape is not None:
        if a.ndim != len(row_shape):
            return f"row shape {a.shape}, expected {_fmt(row_shape)}"
        for got, want in zip(a.shape, row_shape):
            if isinstance(want, int) and got != want:
                return f"row shape {a.shape}, expected {_fmt(row_shape)}"
    return ""


def _fmt(shape) -> str:
    return "(" + ", ".join("?" if not isinstance(d, int) else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _arrow_table(cols: dict):
    """Output columns as a pyarrow Table: 1-D numeric columns without a copy, ``[N, ...]`` columns
    as Ray's tensor extension (what Ray makes of them). Ray's own conversion of a dict of numpy
    columns infers each column's type value by value (``pa.infer_type``), ~0.6 CPU s per 1M rows of
    5 numeric columns, 4% of the LightGBM example's scoring."""
    import pyarrow as pa

    arrays = {}
    for name, col in cols.items():
        col = np.asarray(col) if not isinstance(col, np.ndarray) else col
        if col.ndim == 1 and col.dtype != object:
            arrays[name] = pa.array(col)  # numbers, zero-copy
        elif col.ndim > 1:
            from ray.data.extensions import ArrowTensorArray

            arrays[name] = ArrowTensorArray.from_numpy(col)
        else:  # an object column (strings, None, mixed bad rows, per-row arrays): Ray's own rules
            from ray.data.block import BlockAccessor

            arrays[name] = BlockAccessor.batch_to_block({name: col}).column(name)
    return pa.table(arrays)


def _ranges(rows: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'"""
    out, start, prev = [], None, None
    for r in sorted(rows):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def _without_zipmap(model) -> tuple[Any, list[str] | None, dict[str, tuple[str, list]]]:
    """``model`` with each ZipMap that makes a graph output removed and its input (the [N, K]
    probability tensor) made a graph output instead: ZipMap builds one Python dict per row, which
    costs as much as a few hundred trees. Returns (model for the session, the original graph
    outputs, {ZipMap output: (tensor output, classes)}); the model unchanged when there is nothing
    to do or it cannot be read here (the session then reports why with its own typed error)."""
    import onnx

    try:
        if isinstance(model, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(model))
        elif isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model), load_external_data=False)
        else:
            return model, None, {}
    except Exception:  # not a model: InferenceSession says so with a typed error
        return model, None, {}
    g = proto.graph
    outs = [o.name for o in g.output]
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in g.initializer):  # must stay beside its file
        return model, outs, {}
    consumed = {i for node in g.node for i in node.input}
    zipmaps: dict[str, tuple[str, list]] = {}
    for node in g.node:
        if (node.op_type == "ZipMap" and node.domain == "ai.onnx.ml" and len(node.output) == 1
                and node.output[0] in outs and node.output[0] not in consumed):
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            classes = ([c.decode() if isinstance(c, bytes) else c for c in attrs.get("classlabels_strings", [])]
                       or [int(c) for c in attrs.get("classlabels_int64s", [])])
            if classes:
                zipmaps[node.output[0]] = (node.input[0], classes)
    if not zipmaps:
        return model, outs, {}
    kept = [node for node in g.node if not (node.op_type == "ZipMap" and node.output and node.output[0] in zipmaps)]
    del g.node[:]
    g.node.extend(kept)
    new_outputs, seen = [], set()
    for o in g.output:
        if o.name in zipmaps:
            tensor = zipmaps[o.name][0]
            o = onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None)
        if o.name not in seen:
            seen.add(o.name)
            new_outputs.append(o)
    del g.output[:]
    g.output.extend(new_outputs)
    return proto.SerializeToString(), outs, zipmaps


class BatchRowError(InputError):
    """Rows of a Ray batch do not fit the model (element type or shape). ``rows`` are the bad rows'
    indices in the batch, ``ids`` their values in the Predictor's ``id_column`` (if it has one)."""

    def __init__(self, message: str, rows: list[int], ids: list | None = None):
        super().__init__(message)
        self.rows = rows
        self.ids = ids


class BatchRowTypeError(BatchRowError, InputTypeError):
    """Rows whose element type does not convert to the input's."""


class BatchRowShapeError(BatchRowError, InputShapeError):
    """Rows whose shape contradicts the input's."""


class Predictor:
    """A ``Dataset.map_batches`` callable class that scores batches with one session per actor.

    ``ds.map_batches(Predictor, fn_constructor_kwargs={"model": path_or_bytes, "providers": [...],
    "sess_options": ...}, concurrency=N, batch_size=B)``

    - ``model``: a path or the model's bytes; ``providers``/``provider_options``/``sess_options`` as
      for ``InferenceSession`` (``sess_options`` may be a dict of SessionOptions attributes). When it
      sets no ``intra_op_num_threads``, the session uses as many threads as CPUs Ray gave the actor.
    - ``input_columns``: ``{input name: column}``; by default an input reads the column of its own
      name. A model with one input of rank 2 and no column of that name reads a ``[N, F]`` matrix
      stacked from ``feature_columns`` (default: every column but ``id_column``, in batch order).
    - ``keep_columns``: True (default) keeps the batch's columns beside the outputs, False drops
      them, a list keeps those.
    - ``zipmap``: how a sequence-of-maps output (ZipMap probabilities) becomes columns: ``"columns"``
      (default) one float column ``{output}_{class}`` per class, ``"array"`` one ``[N, K]`` column in
      the maps' class order.
    - ``on_error``: ``"raise"`` (default) raises :class:`BatchRowError` naming the bad rows; ``"column"``
      scores the good rows and writes each bad row's reason to ``error_column`` (empty string when
      fine), its outputs null (NaN for floats) — every row comes back either way.
    - ``output_format``: None (default) answers in the batch's form (dict of numpy, pandas or pyarrow);
      ``"numpy"``, ``"pandas"`` or ``"pyarrow"`` (a ``pyarrow.Table``, which Ray Data takes as the
      block as it is, with no per-value type inference: the cheapest for numeric outputs).
    """

    def __init__(self, model, providers=None, sess_options=None, provider_options=None, *,
                 input_columns: dict[str, str] | None = None, feature_columns: list[str] | None = None,
                 keep_columns: bool | list[str] = True, output_names: list[str] | None = None,
                 zipmap: str = "columns", on_error: str = "raise", error_column: str = "error",
                 id_column: str | None = None, publish_report: bool = True, output_format: str | None = None):
        if output_format not in (None, "numpy", "pandas", "pyarrow"):
            raise InvalidArgumentError(f"output_format must be None, 'numpy', 'pandas' or 'pyarrow', got {output_format!r}")
        self._output_format = output_format
        if on_error not in ("raise", "column"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'column', got {on_error!r}")
        if zipmap not in ("columns", "array"):
            raise InvalidArgumentError(f"zipmap must be 'columns' or 'array', got {zipmap!r}")
        model, graph_outputs, self._zipmaps = _without_zipmap(model)
        self.session = _make_session(model, providers, sess_options, provider_options)
        self._inputs = {i.name: i for i in self.session.get_inputs()}
        for i in self._inputs.values():
            if i.type not in _TENSOR_DTYPES or not i.shape:
                raise InvalidArgumentError(f"input {i.name!r} is {i.type} of shape {i.shape}: Predictor feeds "
                                           "tensors whose first dim is the row dim")
        self._outputs = list(output_names or graph_outputs or [o.name for o in self.session.get_outputs()])
        # what the session is asked for: a ZipMap output is read as the probability tensor it zipped
        self._fetch = [self._zipmaps[o][0] if o in self._zipmaps else o for o in self._outputs]
        self._input_columns = dict(input_columns or {})
        unknown = [k for k in self._input_columns if k not in self._inputs]
        if unknown:
            raise InputNameError(f"input_columns names {unknown}, not inputs of the model "
                                 f"(inputs: {', '.join(self._inputs)})")
        self._feature_columns = feature_columns
        self._keep = keep_columns
        self._zipmap = zipmap
        self._on_error = on_error
        self._error_column = error_column
        self._id_column = id_column
        # a fixed first dim shared by every input: batches are split/padded to it
        firsts = {i.shape[0] for i in self._inputs.values()}
        self._fixed = next(iter(firsts)) if len(firsts) == 1 and isinstance(next(iter(firsts)), int) else None
        if self._fixed is None and any(isinstance(d, int) for d in firsts):
            raise InvalidArgumentError(f"inputs disagree on the row dim ({firsts}); Predictor needs one")
        self.report = self._report_info()
        if publish_report:
            self._publish()

    def _report_info(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "providers": self.session.get_providers(),
                "intra_op_num_threads": int(self.session._sess_options.intra_op_num_threads or 0),
                "report": self.session.get_partition_report().to_dict()}

    def _publish(self) -> None:
        """Store the report in the cluster's internal key-value store (one GCS call, no process to
        wait for), before the actor takes its first batch; nothing to do outside Ray."""
        ray = _running_ray()
        if ray is None:
            return
        from ray.experimental import internal_kv

        ctx = ray.get_runtime_context()
        key = ctx.get_actor_id() or f"pid-{os.getpid()}"
        key = f"{key}:{ctx.get_worker_id()}"  # a restarted actor keeps its id but gets a new worker
        internal_kv._internal_kv_put(_report_prefix() + key, pickle.dumps(self.report), namespace=_REPORT_NAMESPACE)

    # -- columns -> feeds ------------------------------------------------------------------------
    def _columns_for(self, batch: dict) -> dict[str, Any]:
        """{input name: a column, or a list of scalar columns to stack as [N, F]}"""
        out: dict[str, Any] = {}
        for name, spec in self._inputs.items():
            col = self._input_columns.get(name, name)
            if col in batch:
                out[name] = col
            elif len(self._inputs) == 1 and len(spec.shape) == 2:
                feats = self._feature_columns or [c for c in batch if c != self._id_column]
                missing = [c for c in feats if c not in batch]
                if missing:
                    raise InputNameError(f"feature_columns {missing} are not in the batch (columns: {list(batch)})")
                if isinstance(spec.shape[1], int) and spec.shape[1] != len(feats):
                    raise InputShapeError(f"input {name!r} takes {spec.shape[1]} features per row; the batch has "
                                          f"{len(feats)} feature columns {feats} (set feature_columns)")
                out[name] = feats
            else:
                raise InputNameError(f"no column {col!r} for input {name!r} (columns: {list(batch)}; "
                                     f"map inputs with input_columns)")
        return out

    def _feeds(self, batch: dict, cols: dict[str, Any], n: int) -> tuple[dict, dict[int, str]]:
        feeds, bad = {}, {}
        for name, col in cols.items():
            spec = self._inputs[name]
            dtype = _TENSOR_DTYPES[spec.type]
            if isinstance(col, list):  # [N, F] from scalar columns: each column checked alone
                parts = []
                for c in col:
                    arr, rows = _check_rows(c, batch[c], dtype, (), 0)
                    for r, why in rows:
                        bad.setdefault(r, f"column {c!r}: {why}")
                    parts.append(arr)
                if all(p is not None for p in parts):
                    feeds[name] = np.ascontiguousarray(np.stack(parts, axis=1)) if parts else None
                continue
            arr, rows = _check_rows(col, batch[col], dtype, spec.shape[1:], 0)
            for r, why in rows:
                bad.setdefault(r, f"column {col!r} (input {name!r}): {why}")
            feeds[name] = arr
        return feeds, bad

    # -- running ---------------------------------------------------------------------------------
    def _run(self, feeds: dict, n: int) -> list:
        if self._fixed is None or n == self._fixed:
            return self.session.run(self._fetch, feeds)
        b, pieces = self._fixed, []
        for s in range(0, n, b):  # split into runs of the fixed size; pad the last with its last row
            chunk = {k: v[s:s + b] for k, v in feeds.items()}
            m = len(next(iter(chunk.values())))
            if m < b:
                chunk = {k: np.concatenate([v, np.repeat(v[-1:], b - m, axis=0)]) for k, v in chunk.items()}
            res = self.session.run(self._fetch, chunk)
            for o, r in zip(self._outputs, res):
                if not hasattr(r, "__len__") or len(r) != b:
                    raise ExecutionError(f"output {o!r} has {len(r) if hasattr(r, '__len__') else 'no'} rows for a "
                                         f"fixed batch of {b}; Predictor cannot split it back into rows")
            pieces.append([r[:m] for r in res])
        return [np.concatenate([p[i] for p in pieces]) if isinstance(pieces[0][i], np.ndarray)
                else sum((list(p[i]) for p in pieces), []) for i in range(len(self._outputs))]

    def _output_columns(self, results: list, n: int) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        for name, r in zip(self._outputs, results):
            if name in self._zipmaps:  # the [N, K] probabilities the ZipMap would have made maps of
                classes = self._zipmaps[name][1]
                if not (isinstance(r, np.ndarray) and r.ndim == 2 and r.shape == (n, len(classes))):
                    raise ExecutionError(f"output {name!r}: the ZipMap's input has shape {np.shape(r)}, "
                                         f"not ({n}, {len(classes)}) for {n} rows and classes {classes}")
                cols.update(self._zipmap_columns(name, classes, r.astype(np.float32, copy=False)))
            elif isinstance(r, np.ndarray):
                if r.ndim == 0 or len(r) != n:
                    raise ExecutionError(f"output {name!r} has shape {r.shape}, not one row per input row ({n})")
                cols[name] = r
            elif isinstance(r, list) and (not r or isinstance(r[0], dict)):  # ZipMap: a sequence of maps
                if len(r) != n:
                    raise ExecutionError(f"output {name!r} has {len(r)} maps for {n} rows")
                keys = list(r[0]) if r else []
                mat = np.array([[m[k] for k in keys] for m in r], dtype=np.float32).reshape(n, len(keys))
                cols.update(self._zipmap_columns(name, keys, mat))
            else:
                cols[name] = np.array(list(r) if r is not None else [None] * n, dtype=object)
        return cols

    def _zipmap_columns(self, name: str, classes: list, mat: np.ndarray) -> dict[str, np.ndarray]:
        if self._zipmap == "array":
            return {name: mat}
        return {f"{name}_{k}": np.ascontiguousarray(mat[:, j]) for j, k in enumerate(classes)}

    def __call__(self, batch):
        form = "numpy" if isinstance(batch, dict) else "pyarrow" if hasattr(batch, "column_names") else "pandas"
        if form == "pyarrow":  # batch_format="pyarrow": Ray's own Arrow -> numpy (zero-copy for numbers)
            from ray.data.block import BlockAccessor

            data = BlockAccessor.for_block(batch).to_batch_format("numpy")
        elif form == "pandas":  # a pandas.DataFrame batch: columns as numpy, the answer as a DataFrame again
            data = {c: batch[c].to_numpy() for c in batch.columns}
        else:
            data = batch
        n = len(next(iter(data.values()))) if data else 0
        cols = self._columns_for(data)
        feeds, bad = self._feeds(data, cols, n)
        if bad and self._on_error == "raise":
            # the ids as Python values only for an error: a list per batch costs a few ms per 25,000 rows
            ids = np.asarray(data[self._id_column]).tolist() if self._id_column in data else None
            rows = sorted(bad)
            which = f" ({self._id_column} {[ids[r] for r in rows[:10]]})" if ids is not None else ""
            first = bad[rows[0]]
            cls = BatchRowTypeError if "element type" in first or "strings" in first else BatchRowShapeError
            raise cls(f"{len(rows)} bad row(s) in a batch of {n}: rows {_ranges(rows)}{which}; row {rows[0]}: {first}",
                      rows, [ids[r] for r in rows] if ids is not None else None)
        out: dict[str, Any] = {}
        if self._keep is True:
            out.update(data)
        elif self._keep:
            out.update({c: data[c] for c in self._keep})
        if bad:
            good = np.array([i for i in range(n) if i not in bad], dtype=np.int64)
            out.update(self._scored_subset(data, cols, good, n))
            errs = np.array([bad.get(i, "") for i in range(n)], dtype=object)
            out[self._error_column] = errs
        else:
            try:
                out.update(self._output_columns(self._run(feeds, n), n))
            except RuntimeCoreError as e:
                if self._on_error == "raise":
                    raise type(e)(f"{e} (batch of {n} rows, rows 0-{n - 1})") from e
                out.update(self._null_outputs(n))
                out[self._error_column] = np.array([f"{type(e).__name__}: {e}"] * n, dtype=object)
            else:
                if self._on_error == "column":
                    out[self._error_column] = np.array([""] * n, dtype=object)
        fmt = self._output_format or form
        if fmt == "pyarrow":
            return _arrow_table(out)
        if fmt == "pandas":
            import pandas as pd
            return pd.DataFrame({k: (list(v) if isinstance(v, np.ndarray) and v.ndim > 1 else v)
                                 for k, v in out.items()})
        return out

    def _scored_subset(self, data: dict, cols: dict, good: np.ndarray, n: int) -> dict:
        """Score only the ``good`` rows and scatter them back into ``n`` rows (bad rows null)."""
        res = self._null_outputs(n)
        if len(good) == 0:
            return res
        sub = {c: (np.asarray(data[c], dtype=object)[good] if np.asarray(data[c]).dtype == object
                   else np.asarray(data[c])[good]) for c in set(sum(([c] if isinstance(c, str) else c
                                                                      for c in cols.values()), []))}
        feeds, bad = self._feeds(sub, cols, len(good))
        assert not bad, bad  # every row here was checked good
        scored = self._output_columns(self._run(feeds, len(good)), len(good))
        for k, v in scored.items():
            full = res.get(k)
            if full is None or full.shape[1:] != v.shape[1:] or (full.dtype != v.dtype and v.dtype.kind != "f"):
                full = np.empty((n,) + v.shape[1:], dtype=v.dtype if v.dtype.kind == "f" else object)
                full[...] = np.nan if v.dtype.kind == "f" else None
            full[good] = v
            res[k] = full
        return res

    def _null_outputs(self, n: int) -> dict:
        """Null columns for every output whose shape is known without running (others appear once scored)."""
        res = {}
        for name, (_, classes) in self._zipmaps.items():
            if name in self._outputs:
                res.update(self._zipmap_columns(name, classes, np.full((n, len(classes)), np.nan, np.float32)))
        for o in self.session.get_outputs():
            if o.name not in self._outputs or o.type not in _TENSOR_DTYPES:
                continue
            tail = tuple(d for d in (o.shape or [None])[1:])
            if any(not isinstance(d, int) for d in tail):
                continue
            dt = _TENSOR_DTYPES[o.type]
            if np.dtype(dt).kind == "f":
                res[o.name] = np.full((n,) + tail, np.nan, dtype=dt)
            else:
                arr = np.empty((n,) + tail, dtype=object)
                arr[...] = None
                res[o.name] = arr
        return res


# -- Open Inference Protocol v2 JSON ---------------------------------------------------------------
def decode_infer_request(body: dict, inputs: dict) -> tuple[dict, list[str] | None]:
    """An OIP v2 infer body -> (feeds, requested output names or None). ``inputs`` maps each model
    input name to its NodeArg. Raises typed input errors for malformed bodies."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise InvalidArgumentError('the request body must be a JSON object with an "inputs" list')
    feeds = {}
    for t in body["inputs"]:
        if not isinstance(t, dict) or not {"name", "shape", "datatype", "data"} <= set(t):
            raise InvalidArgumentError('each input needs "name", "shape", "datatype" and "data"')
        name, dt = t["name"], t["datatype"]
        if name not in inputs:
            close = difflib.get_close_matches(str(name), list(inputs), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputNameError(f"{name!r} is not an input of this model{hint} (inputs: {', '.join(inputs)})")
        if dt not in _OIP_TO_NP:
            raise InputTypeError(f"input {name!r}: datatype {dt!r} is not one of {', '.join(_OIP_TO_NP)}")
        try:
            arr = np.asarray(t["data"], dtype=_OIP_TO_NP[dt]).reshape([int(d) for d in t["shape"]])
        except (ValueError, TypeError) as e:
            raise InputShapeError(f"input {name!r}: data does not fill shape {t['shape']} as {dt}: {e}") from e
        feeds[name] = arr
    outs = body.get("outputs")
    names = [o["name"] for o in outs] if outs else None
    return feeds, names


def _oip_tensor(name: str, value) -> dict:
    if isinstance(value, list) and (not value or isinstance(value[0], dict)):  # ZipMap: [N, K] with the classes
        keys = list(value[0]) if value else []
        mat = np.array([[m[k] for k in keys] for m in value], dtype=np.float32).reshape(len(value), len(keys))
        return {"name": name, "shape": list(mat.shape), "datatype": "FP32", "data": mat.ravel().tolist(),
                "parameters": {"classes": [k if isinstance(k, str) else int(k) for k in keys]}}
    arr = np.asarray(value)
    if arr.dtype.kind in "OUS":
        return {"name": name, "shape": list(arr.shape), "datatype": "BYTES", "data": [str(x) for x in arr.ravel()]}
    return {"name": name, "shape": list(arr.shape), "datatype": _NP_TO_OIP[arr.dtype.str], "data": arr.ravel().tolist()}


def encode_infer_response(model_name: str, names: list[str], values: list) -> dict:
    """Outputs -> the OIP v2 infer response body."""
    return {"model_name": model_name, "outputs": [_oip_tensor(n, v) for n, v in zip(names, values)]}


class _ServedModel:
    """The Serve replica: one session, OIP v2 routes, and ``@serve.batch`` over requests."""

    def __init__(self, model, name, providers, sess_options, provider_options, max_batch_size, batch_wait_timeout_s):
        self.session = _make_session(model, providers, sess_options, provider_options)
        self.name = name
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        # requests are concatenated along dim 0 only when every input's dim 0 is dynamic
        self.concat = all(i.shape and not isinstance(i.shape[0], int) for i in self.inputs.values())
        self._batch_sizes: dict[int, int] = {}

    def partition_report(self) -> dict:
        """This replica's partition report (``handle.partition_report.remote()``)."""
        return self.session.get_partition_report().to_dict()

    def batch_sizes(self) -> dict[int, int]:
        """How many ``@serve.batch`` batches of each size (requests per batch) this replica has run
        (``handle.batch_sizes.remote()``): the evidence for tuning ``max_batch_size`` and the wait."""
        return dict(self._batch_sizes)

    def _metadata(self) -> dict:
        def t(a):
            return {"name": a.name, "datatype": next((k for k, v in _OIP_TO_NP.items()
                                                      if _TENSOR_DTYPES.get(a.type) is v), a.type),
                    "shape": [d if isinstance(d, int) else -1 for d in (a.shape or [])]}
        return {"name": self.name, "platform": "onnx", "inputs": [t(a) for a in self.session.get_inputs()],
                "outputs": [t(a) for a in self.session.get_outputs()]}

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        parts = [p for p in request.url.path.split("/") if p]
        if parts in (["v2", "health", "ready"], ["v2", "health", "live"]):
            return JSONResponse({})
        if len(parts) < 3 or parts[:2] != ["v2", "models"]:
            return JSONResponse({"error": f"no route {request.url.path}"}, status_code=404)
        if parts[2] != self.name:
            return JSONResponse({"error": f"model {parts[2]!r} not found (models: {self.name})"}, status_code=404)
        if len(parts) == 3 and request.method == "GET":
            return JSONResponse(self._metadata())
        if len(parts) == 4 and parts[3] == "ready":
            return JSONResponse({})
        if not (len(parts) == 4 and parts[3] == "infer" and request.method == "POST"):
            return JSONResponse({"error": f"no route {request.method} {request.url.path}"}, status_code=404)
        try:
            body = await request.json()
        except ValueError as e:
            return JSONResponse({"error": f"the body is not JSON: {e}"}, status_code=400)
        try:
            feeds, names = decode_infer_request(body, self.inputs)
            names = names or self.output_names
            for n in names:
                if n not in self.output_names:
                    raise InvalidArgumentError(f"output {n!r} is not an output of this model "
                                               f"(outputs: {', '.join(self.output_names)})")
            values = await self.infer_batch((feeds, names))
            if isinstance(values, BaseException):
                raise values
        except InvalidArgumentError as e:
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
        except RuntimeCoreError as e:
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
        return JSONResponse(encode_infer_response(self.name, names, values))

    def _run_one(self, feeds, names):
        try:
            return self.session.run(names, feeds)
        except RuntimeCoreError as e:
            return e

    async def infer_batch(self, items: list) -> list:
        """One session run for a batch of requests whose inputs agree in everything but dim 0;
        a request that does not fit (or a batch run that fails) is run alone, so that one bad
        request never fails the others."""
        self._batch_sizes[len(items)] = self._batch_sizes.get(len(items), 0) + 1
        if not self.concat or len(items) == 1:
            return [self._run_one(f, n) for f, n in items]
        groups: dict[tuple, list[int]] = {}
        for i, (feeds, _) in enumerate(items):
            key = tuple(sorted((k, v.dtype.str, v.shape[1:]) for k, v in feeds.items()
                               if isinstance(v, np.ndarray) and v.ndim))
            ok = len(key) == len(feeds) and len({v.shape[0] for v in feeds.values()}) == 1
            groups.setdefault(key if ok else ("alone", i), []).append(i)
        out: list = [None] * len(items)
        for key, idx in groups.items():
            if key[0] == "alone" or len(idx) == 1:
                for i in idx:
                    out[i] = self._run_one(*items[i])
                continue
            names = sorted({n for i in idx for n in items[i][1]}, key=self.output_names.index)
            feeds = {k: np.concatenate([items[i][0][k] for i in idx]) for k in items[idx[0]][0]}
            res = self._run_one(feeds, names)
            counts = [len(next(iter(items[i][0].values()))) for i in idx]
            total = sum(counts)
            splittable = not isinstance(res, BaseException) and all(
                len(r) == total for r in res)
            if not splittable:
                for i in idx:
                    out[i] = self._run_one(*items[i])
                continue
            s = 0
            for i, c in zip(idx, counts):
                out[i] = [res[names.index(n)][s:s + c] for n in items[i][1]]
                s += c
        return out


def deployment(model, name: str | None = None, providers=None, *, sess_options=None, provider_options=None,
               max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01, num_replicas: int = 1,
               ray_actor_options: dict | None = None):
    """A Ray Serve application serving ``model`` (path or bytes) under ``/v2/models/{name}/infer``
    with the Open Inference Protocol v2 JSON body; concurrent requests are batched by
    ``@serve.batch`` (up to ``max_batch_size`` requests, waiting at most ``batch_wait_timeout_s``).
    ``serve.run(deployment(...), route_prefix="/")`` starts it. ``name`` defaults to the file's stem
    (``"model"`` for bytes). Replicas ask Ray for ``resources_for(providers)`` unless
    ``ray_actor_options`` says otherwise."""
    _ray()
    from ray import serve

    if name is None:
        name = os.path.splitext(os.path.basename(str(model)))[0] if isinstance(model, (str, os.PathLike)) else "model"
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if max_batch_size < 1 or batch_wait_timeout_s < 0 or num_replicas < 1:
        raise InvalidArgumentError("max_batch_size and num_replicas must be >= 1 and batch_wait_timeout_s >= 0")
    cls = type("RuntimeCoreModel", (_ServedModel,), {
        "infer_batch": serve.batch(max_batch_size=max_batch_size,
                                   batch_wait_timeout_s=batch_wait_timeout_s)(_ServedModel.infer_batch)})
    dep = serve.deployment(cls, name=f"runtime-core-{name}", num_replicas=num_replicas,
                           ray_actor_options=ray_actor_options or resources_for(providers))
    return dep.bind(model, name, providers, sess_options, provider_options, max_batch_size, batch_wait_timeout_s)
