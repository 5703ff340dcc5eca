"""Test helpers: build one-node or small models and compare runtime-core with onnxruntime.

onnxruntime is a test oracle only. Where it lacks an op or a type,
``onnx.reference.ReferenceEvaluator`` is the oracle instead.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime_core as rt


def np_to_elem(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dtype)


def make_model(nodes, inputs: dict, outputs, *, opset: int = 17, initializers: dict | None = None,
               extra_opsets: dict | None = None, output_types: dict | None = None,
               ir_version: int | None = None) -> onnx.ModelProto:
    """``inputs``: name -> example array (its dtype and shape become the input type).

    ``outputs``: list of names; their types are left for inference unless given in
    ``output_types`` (name -> elem type).
    """
    initializers = initializers or {}
    ins = [helper.make_tensor_value_info(n, np_to_elem(a.dtype), list(np.shape(a))) for n, a in inputs.items()]
    outs = []
    for o in outputs:
        et = (output_types or {}).get(o)
        outs.append(helper.make_tensor_value_info(o, et, None) if et is not None
                    else onnx.ValueInfoProto(name=o))
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    g = helper.make_graph(list(nodes), "g", ins, outs, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    for dom, ver in (extra_opsets or {}).items():
        opsets.append(helper.make_opsetid(dom, ver))
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = ir_version or min(onnx.IR_VERSION, 10)
    if any(not o.type.WhichOneof("value") for o in m.graph.output):
        inferred = onnx.shape_inference.infer_shapes(m)  # fills the untyped graph outputs
        for o, io in zip(m.graph.output, inferred.graph.output):
            has_shape = io.type.HasField("tensor_type") and io.type.tensor_type.HasField("shape")
            if not o.type.WhichOneof("value") and has_shape:  # the checker needs a shape field
                o.type.CopyFrom(io.type)
    if any(not o.type.WhichOneof("value") for o in m.graph.output):
        _type_outputs_with_ort(m)
    return m


_ORT_ELEM = {"float": TensorProto.FLOAT, "double": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
             "int64": TensorProto.INT64, "int32": TensorProto.INT32, "int8": TensorProto.INT8,
             "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL, "string": TensorProto.STRING,
             "int16": TensorProto.INT16, "uint16": TensorProto.UINT16, "uint32": TensorProto.UINT32,
             "uint64": TensorProto.UINT64, "bfloat16": TensorProto.BFLOAT16}


def _type_outputs_with_ort(m) -> None:
    """onnx's inference left outputs untyped (e.g. function ops): take onnxruntime's types,
    else the first input's element type (the checker needs a type; values are still compared)."""
    types = {}
    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for o in s.get_outputs():
            if o.type.startswith("tensor(") and o.type[7:-1] in _ORT_ELEM:
                types[o.name] = (_ORT_ELEM[o.type[7:-1]], o.shape)
    except Exception:  # noqa: BLE001 - onnxruntime cannot load it either
        pass
    first = m.graph.input[0].type.tensor_type.elem_type if m.graph.input else TensorProto.FLOAT
    for o in m.graph.output:
        if not o.type.WhichOneof("value"):
            elem, shape = types.get(o.name, (first, None))
            if shape is None:
                first_shape = m.graph.input[0].type.tensor_type.shape if m.graph.input else None
                shape = [None] * len(first_shape.dim) if first_shape is not None else []
            o.type.CopyFrom(helper.make_tensor_type_proto(
                elem, [d if isinstance(d, (int, str)) else None for d in shape]))


def run_ours(model, feeds, providers=None, **kw):
    sess = rt.InferenceSession(model.SerializeToString(), providers=providers or ["CPUExecutionProvider"], **kw)
    return sess.run(None, feeds), sess


def cpu_session(model, threads=2):
    """A session of ``model`` on the CPU provider alone, ``threads`` intra-op threads."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = threads
    return rt.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


def record_plan_kinds(monkeypatch, check=None) -> list:
    """The kinds of the CPU provider's conv plans as they run (``ConvPlan.fast_call``, which
    ``run`` on a first run and the bound step after it both call), in a list; ``check(plan)``
    on each."""
    from runtime_provider_cpu.fast.plan import ConvPlan

    seen = []
    real_fast = ConvPlan.fast_call

    def fast_call(self):
        call = real_fast(self)

        def recorded(x, z):
            seen.append(self.kind)
            if check is not None:
                check(self)
            return call(x, z)
        return recorded

    monkeypatch.setattr(ConvPlan, "fast_call", fast_call)
    return seen


def compiled_partitions(sess) -> list:
    """The executables of a session's partitions (the profiler's wrapper unwrapped): for
    tests that look at how a provider compiled its part."""
    out = []
    for st in sess._plan.steps:
        exe = getattr(st, "executable", None)
        if exe is not None:
            out.append(getattr(exe, "_exe", exe))  # unwrap the profiler's wrapper
    return out


def run_oracle(model, feeds):
    """onnxruntime when it can run the model, else onnx's reference evaluator."""
    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return s.run(None, feeds)
    except Exception:  # noqa: BLE001 - ORT lacks the op/type: use the reference
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)


def assert_close(ours, ref, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(ref), f"{len(ours)} outputs vs {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref)):
        if isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b)
            assert_close(a, b, rtol, atol)
            continue
        a = np.asarray(a)
        b = np.asarray(b)
        assert a.shape == b.shape, f"output {i}: shape {a.shape} vs oracle {b.shape}"
        if b.dtype.kind in "OUS":
            assert a.dtype.kind in "OUS", f"output {i}: dtype {a.dtype} vs {b.dtype}"
            assert a.tolist() == b.tolist()
            continue
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs oracle {b.dtype}"
        if b.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")


def check_node(op_type, inputs: dict, outputs=("y",), *, opset=17, domain="", initializers=None,
               rtol=1e-5, atol=1e-6, extra_opsets=None, **attrs):
    """Run one node on runtime-core and the oracle; assert same outputs. Returns ours."""
    node_inputs = list(inputs) + list(initializers or {})
    node = helper.make_node(op_type, node_inputs, list(outputs), domain=domain, **attrs)
    if domain and domain not in (extra_opsets or {}):
        extra_opsets = {**(extra_opsets or {}), domain: 1 if domain != "ai.onnx.ml" else 3}
    model = make_model([node], inputs, [o for o in outputs if o], opset=opset,
                       initializers=initializers, extra_opsets=extra_opsets)
    ours, sess = run_ours(model, dict(inputs))
    rep = sess.get_partition_report()
    assert all(n.provider == "CPUExecutionProvider" for n in rep.nodes)
    ref = run_oracle(model, dict(inputs))
    assert_close(ours, ref, rtol, atol)
    return ours


@pytest.fixture
def cpu_policy():
    """``cpu_policy(**changes)``: installs the CPU provider's current tuning policy with these
    changes (``runtime_provider_cpu.fast.policy.Policy`` fields) for the rest of the test, and
    returns it; the policy before the test is put back after it. Plans are made on a node's
    first run, so change the policy before the session's first run. (A test module imports
    it from here to use it.)"""
    from runtime_provider_cpu.fast import policy

    saved = policy.current()

    def install(**changes):
        p = policy.current().replace(**changes)
        policy.install(p)
        return p

    yield install
    policy.install(saved)
