"""``runtime_core.backend``: the ``onnx.backend.base.Backend`` interface over :class:`InferenceSession`.

So that the official suite runs against runtime-core::

    import onnx.backend.test
    import runtime_core.backend
    globals().update(onnx.backend.test.BackendTest(runtime_core.backend, __name__).test_cases)

``device`` is ONNX's device string (``"CPU"``, ``"CUDA"``, ...); the providers used
are ``providers=`` when given, else the provider whose device type the string names
followed by the CPU provider. Session options may be passed as ``sess_options=``.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .graph.validate import infer_shapes
from .session import InferenceSession, SessionOptions

__all__ = ["RuntimeCoreBackend", "RuntimeCoreRep", "is_compatible", "prepare", "run", "run_model", "run_node",
           "supports_device"]


def _device_providers(device: str) -> list[str]:
    from .plugin.registry import get_registry

    kind = str(device or "CPU").split(":")[0].upper()
    if kind == "CPU":
        return ["cpu"]
    found = [r.name for r in get_registry().loaded()
             if r.available and (str(getattr(r, "device_type", "") or "").upper() == kind
                                 or str(r.alias).upper() == kind)]
    return found + ["cpu"]


class RuntimeCoreRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (graph-input order) or a dict."""

    def __init__(self, session: InferenceSession):
        self.session = session
        self._input_names = [i.name for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs, **kwargs):  # noqa: D401 - onnx's interface
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feed = dict(zip(self._input_names, list(inputs)))
        outs = self.session.run(None, feed)
        return namedtupledict("Outputs", self._output_names)(*outs)


class RuntimeCoreBackend(Backend):
    """The ONNX backend over runtime-core's sessions."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> RuntimeCoreRep:
        providers = kwargs.pop("providers", None) or _device_providers(device)
        opts = kwargs.pop("sess_options", None) or SessionOptions()
        data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = InferenceSession(data, sess_options=opts, providers=providers)
        return RuntimeCoreRep(sess)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on ``inputs`` (a list matched to ``node.input``, or a dict)."""
        if isinstance(inputs, dict):
            named = dict(inputs)
        else:
            named = dict(zip([n for n in node.input if n], list(inputs)))
        vis = [onnx.helper.make_tensor_value_info(
            n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.asarray(v).shape)
            for n, v in named.items()]
        outs = [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o]
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        graph = onnx.helper.make_graph([node], "run_node", vis, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        try:
            model = infer_shapes(model, data_prop=False)  # a child process for crash-prone ops
        except Exception:  # noqa: BLE001 - the session reports what is wrong with the node
            pass
        return cls.prepare(model, device, **kwargs).run(named)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = Device(device).type if device else DeviceType.CPU
        if kind == DeviceType.CPU:
            return True
        return len(_device_providers(device)) > 1


prepare = RuntimeCoreBackend.prepare
run = RuntimeCoreBackend.run_model
run_model = RuntimeCoreBackend.run_model
run_node = RuntimeCoreBackend.run_node
supports_device = RuntimeCoreBackend.supports_device
is_compatible = RuntimeCoreBackend.is_compatible
