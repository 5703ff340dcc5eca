"""``IOBinding``: inputs and outputs bound to devices for ``run_with_iobinding`` (ORT-compatible).

Inputs are bound as ``OrtValue``s (host arrays are wrapped without a copy). A
device input reaches the partition that reads it without a copy when that
partition runs on the same device; outputs bound to a device stay there. So a
loop that feeds ``get_outputs()`` back as the next run's inputs makes no host
copies when the whole model runs on one device; ``get_transfer_stats()`` says
which copies a run made.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from ..errors import InputNameError, InputShapeError, InputTypeError, InvalidArgumentError, OutputNameError
from ..execution.cancel import make_stop
from ..execution.executor import TransferStats, device_of, transfer
from .ortvalue import ONLY_TENSORS, OrtValue, host_array_from_pointer, provider_call, to_dtype

__all__ = ["IOBinding", "SessionIOBinding"]


def _nearest(name: str, options) -> str:
    close = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(repr(d) if isinstance(d, str) else ("?" if d is None else str(d))
                           for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_bound_input(spec, value: OrtValue) -> None:
    """Check a device ``OrtValue`` against a model input's type and static dims (no copy)."""
    name = spec.name
    if spec.kind not in ("tensor", "optional"):
        raise InputTypeError(f"input {name!r} expects {spec.type_str}, got a tensor on "
                             f"{value.device_name()}; {ONLY_TENSORS}")
    got = value._dtype
    if spec.dtype is not None and got != spec.dtype:
        raise InputTypeError(f"input {name!r} expects {spec.type_str} (numpy {spec.dtype}), got an "
                             f"OrtValue of {value.data_type()} on {value.device_name()}")
    shape = tuple(value.shape())
    if spec.shape is not None:
        if len(shape) != len(spec.shape):
            raise InputShapeError(f"input {name!r} expects rank {len(spec.shape)} with shape "
                                  f"{_fmt_shape(spec.shape)}, got rank {len(shape)} with shape {shape}")
        for axis, (d, g) in enumerate(zip(spec.shape, shape)):
            if isinstance(d, int) and d != g:
                raise InputShapeError(f"input {name!r} dim {axis} must be {d} (expected shape "
                                      f"{_fmt_shape(spec.shape)}), got {g} (shape {shape})")


@dataclass
class _OutputBinding:
    provider: object  # provider instance whose device holds the result; None: host
    value: OrtValue | None = None  # a preallocated destination


class IOBinding:
    """Inputs and outputs of one session bound to devices (ONNX Runtime's ``IOBinding``).

    Made by ``InferenceSession.io_binding()`` and run by
    ``InferenceSession.run_with_iobinding(binding)``. Device names are resolved
    like ``OrtValue``'s (``"cpu"``, ``"opencl"``, ``"cuda"``), preferring the
    session's own provider instances. Outputs are returned in the order they were
    first bound.
    """

    def __init__(self, session):
        """Bind to ``session`` (use ``session.io_binding()``)."""
        self._session = session
        self._inputs: dict[str, OrtValue] = {}
        self._outputs: dict[str, _OutputBinding] = {}
        self._results: list[OrtValue] = []
        self._result_names: list[str] = []
        self._transfers = TransferStats()

    # -- names and devices ---------------------------------------------------------
    def _input_name(self, name) -> str:
        specs = self._session._specs
        if name not in specs:
            expected = list(specs)
            raise InputNameError(f"{name!r} is not an input of this model{_nearest(name, expected)} "
                                 f"(expected inputs: {', '.join(expected) or 'none'})")
        return name

    def _output_name(self, name) -> str:
        known = self._session._output_names
        if name not in known:
            raise OutputNameError(f"output {name!r} is not an output of this model{_nearest(name, known)} "
                                  f"(outputs: {', '.join(known)})")
        return name

    def _device(self, device_type, device_id):
        return self._session._resolve_device(device_type, device_id)

    def _from_pointer(self, provider, ptr, element_type, shape) -> OrtValue:
        dtype = to_dtype(element_type)
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        dims = tuple(int(d) for d in shape)
        if provider is None:
            return OrtValue(host_array_from_pointer(ptr, dims, dtype))
        tensor = provider_call(provider, "tensor_from_pointer", int(ptr), dims, dtype,
                               what="wrap a raw device pointer")
        return OrtValue(tensor, provider)

    # -- inputs --------------------------------------------------------------------
    def bind_cpu_input(self, name, arr_on_cpu) -> None:
        """Bind input ``name`` to a host numpy array (no copy; keep it unchanged until the run)."""
        self._inputs[self._input_name(name)] = OrtValue.ortvalue_from_numpy(arr_on_cpu)

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr) -> None:
        """Bind input ``name`` to memory at ``buffer_ptr`` on a device, of ``element_type``
        (a numpy type or an ONNX element type int) and ``shape``. Host pointers are
        wrapped with ctypes; a device pointer only where its provider can wrap one
        (otherwise an ``UnsupportedDeviceOperationError`` with the reason)."""
        name = self._input_name(name)
        self._inputs[name] = self._from_pointer(self._device(device_type, device_id), buffer_ptr,
                                                element_type, shape)

    def bind_ortvalue_input(self, name, ortvalue) -> None:
        """Bind input ``name`` to an ``OrtValue`` (host or device; never copied here)."""
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgumentError(f"bind_ortvalue_input({name!r}, ...) takes an OrtValue, got "
                                       f"{type(ortvalue).__name__} (use bind_cpu_input for numpy arrays)")
        self._inputs[self._input_name(name)] = ortvalue

    def synchronize_inputs(self) -> None:
        """Wait until the devices of the bound inputs have finished their queued work."""
        for p in {id(v._provider): v._provider for v in self._inputs.values() if v._provider}.values():
            sync = getattr(p, "synchronize", None)
            if sync is not None:
                sync()

    def clear_binding_inputs(self) -> None:
        """Forget every bound input."""
        self._inputs.clear()

    # -- outputs -------------------------------------------------------------------
    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None) -> None:
        """Bind output ``name`` to a device: the run leaves it there (allocating it), or
        writes it into memory at ``buffer_ptr`` when given (then ``element_type`` and
        ``shape`` are required)."""
        name = self._output_name(name)
        provider = self._device(device_type, device_id)
        if buffer_ptr is None:
            self._outputs[name] = _OutputBinding(provider)
            return
        if element_type is None or shape is None:
            raise InvalidArgumentError("`element_type` and `shape` are to be provided if pre-allocated "
                                       f"memory is provided (output {name!r})")
        value = self._from_pointer(provider, buffer_ptr, element_type, shape)
        self._outputs[name] = _OutputBinding(value._provider, value)

    def bind_ortvalue_output(self, name, ortvalue) -> None:
        """Bind output ``name`` to a preallocated ``OrtValue``: each run writes the result
        into its memory (its shape and type must match the result)."""
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgumentError(f"bind_ortvalue_output({name!r}, ...) takes an OrtValue, got "
                                       f"{type(ortvalue).__name__}")
        self._outputs[self._output_name(name)] = _OutputBinding(ortvalue._provider, ortvalue)

    def synchronize_outputs(self) -> None:
        """Wait until the devices of the last run's outputs have finished writing them."""
        for p in {id(v._provider): v._provider for v in self._results if v._provider}.values():
            sync = getattr(p, "synchronize", None)
            if sync is not None:
                sync()

    def clear_binding_outputs(self) -> None:
        """Forget every bound output (and the last run's results)."""
        self._outputs.clear()
        self._results = []
        self._result_names = []

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, as ``OrtValue``s where they were bound (device
        outputs are not copied to the host)."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        """Same as :meth:`get_outputs` (ORT's vector type is a list here)."""
        return self.get_outputs()

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The last run's outputs as new host numpy arrays (device outputs are copied,
        and the copies are counted)."""
        out = []
        stats = TransferStats()
        for name, v in zip(self._result_names, self._results):
            if v._provider is None:
                out.append(np.array(v._value, copy=True))
            else:
                out.append(transfer(name, v._provider, None, v._value, stats))
        self._session._transfers.merge(stats)
        self._transfers.merge(stats)
        return out

    def get_transfer_stats(self) -> TransferStats:
        """runtime-core extension: the host<->device copies of the last
        ``run_with_iobinding`` (and of ``copy_outputs_to_cpu`` since), each listed in
        ``copies``."""
        return self._transfers.snapshot()

    # -- running (called by InferenceSession.run_with_iobinding) --------------------
    def _run(self, run_options=None) -> None:
        stop = make_stop(run_options)  # a flag set already: refused before anything runs
        try:
            self._run_bound(stop)
        finally:
            if stop is not None:
                stop.close()

    def _run_bound(self, stop) -> None:
        sess = self._session
        if not self._outputs:
            raise InvalidArgumentError("At least one output should be requested: bind outputs with "
                                       "bind_output or bind_ortvalue_output before run_with_iobinding")
        host_feeds = {}
        device_feeds = {}
        for name, v in self._inputs.items():
            if v._provider is None:
                host_feeds[name] = v._value
            else:
                check_bound_input(sess._specs[name], v)
                device_feeds[name] = (v._provider, v._value)
        names = list(self._outputs)
        placements = {}
        for name, ob in self._outputs.items():
            want = ob.provider
            if ob.value is not None and want is not None:
                # a preallocated device output: leave the result on its device only if it is
                # made there; otherwise it is written from the host copy
                if device_of(sess._plan.output_device(name)) != device_of(want):
                    want = None
            placements[name] = want
        stats = TransferStats()
        stats.runs = 1
        self._results, self._result_names = [], []
        self._transfers = stats
        try:
            outs = sess._execute(host_feeds, names, device_feeds=device_feeds, placements=placements,
                                 stats=stats, stop=stop)
            results = []
            for name, v in zip(names, outs):
                ob = self._outputs[name]
                got = OrtValue(v, placements[name])
                sess._check_output_type(name, got._dtype)
                if ob.value is not None:
                    got = self._write_into(name, ob.value, got, stats)
                results.append(got)
        finally:
            sess._transfers.merge(stats)
        self._results, self._result_names = results, names

    @staticmethod
    def _write_into(name: str, dst: OrtValue, src: OrtValue, stats: TransferStats) -> OrtValue:
        if src._dtype != dst._dtype or tuple(src._shape) != tuple(dst._shape):
            raise InvalidArgumentError(
                f"output {name!r} is {src.data_type()} of shape {src.shape()}, but the OrtValue bound to "
                f"it is {dst.data_type()} of shape {dst.shape()}; bind one of the result's shape and type, "
                "or bind_output(name, device) to let the run allocate it")
        if dst._provider is None:
            np.copyto(dst._value, src.numpy())
            return dst
        on_device = src._provider is not None
        provider_call(dst._provider, "copy_into", dst._value, src._value,
                      what=f"write output {name!r} into a preallocated device tensor")
        nbytes = dst.tensor_size_in_bytes()
        stats.record(name, src._provider, dst._provider, nbytes, to_host=False, to_device=not on_device)
        return dst

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}@{v.device_name()}" for n, v in self._inputs.items())
        outs = ", ".join(f"{n}@{'cpu' if o.provider is None else device_of(o.provider)}"
                         for n, o in self._outputs.items())
        return f"IOBinding(inputs=[{ins}], outputs=[{outs}])"


SessionIOBinding = IOBinding
"""ORT's name of the native binding class; the same class here."""
