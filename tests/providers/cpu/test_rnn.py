"""LSTM / GRU / RNN against onnxruntime: directions, layouts, lengths, states, options."""

import itertools

import numpy as np
import pytest

from oracle import check_node

rng = np.random.default_rng(3)
SEQ, BATCH, IN, H = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def weights(op, ndir, dtype, bias=True, peep=False):
    g = GATES[op]
    init = {"W": (rng.standard_normal((ndir, g * H, IN)) * 0.5).astype(dtype),
            "R": (rng.standard_normal((ndir, g * H, H)) * 0.5).astype(dtype)}
    if bias:
        init["B"] = (rng.standard_normal((ndir, 2 * g * H)) * 0.1).astype(dtype)
    return init


@pytest.fixture(params=[pytest.param("native", marks=pytest.mark.native), "numpy"])
def loop(request, monkeypatch):
    """Run the unmasked float32 recurrences through the compiled loop, then through the
    numpy loop (the one builds without a C compiler get)."""
    from runtime_provider_cpu.ops import rnn

    if request.param == "native":
        assert rnn._native is not None, "runtime_provider_cpu._native did not build"
    else:
        monkeypatch.setattr(rnn, "_native", None)
    return request.param


CASES = [c for c in itertools.product(["LSTM", "GRU", "RNN"], ["forward", "reverse", "bidirectional"], [0, 1],
                                     [True, False], [7, 14, 22])
         if not (c[2] == 1 and c[4] < 14)]  # the layout attribute exists from opset 14


@pytest.mark.parametrize("op,direction,layout,lens,opset", CASES)
def test_recurrent(op, direction, layout, lens, opset, loop):
    ndir = 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((SEQ, BATCH, IN) if layout == 0 else (BATCH, SEQ, IN)).astype(np.float32)
    init = weights(op, ndir, np.float32)
    names = ["W", "R", "B"]
    if lens:
        init["seq"] = np.array([5, 2, 4], np.int32)
        names.append("seq")
        hshape = (ndir, BATCH, H) if layout == 0 else (BATCH, ndir, H)
        init["h0"] = rng.standard_normal(hshape).astype(np.float32)
        names.append("h0")
        if op == "LSTM":
            init["c0"] = rng.standard_normal(hshape).astype(np.float32)
            names.append("c0")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    kw = {"direction": direction, "hidden_size": H}
    if opset >= 14:
        kw["layout"] = layout
    ordered = {k: init[k] for k in names}
    if layout == 0:
        check_node(op, {"x": x}, outs, opset=opset, initializers=ordered, rtol=1e-4, atol=1e-5, **kw)
        return
    # onnxruntime has no layout=1: compare with its layout-0 result on transposed tensors
    from oracle import assert_close, run_oracle, run_ours

    ours, _ = run_ours(_model(op, x, ordered, outs=outs, opset=opset, **kw), {"x": x})
    t0 = {k: (np.swapaxes(v, 0, 1) if k in ("h0", "c0") else v) for k, v in ordered.items()}
    kw0 = dict(kw, layout=0)
    x0 = np.swapaxes(x, 0, 1).copy()
    ref = run_oracle(_model(op, x0, t0, outs=outs, opset=opset, **kw0), {"x": x0})
    ref = [np.transpose(ref[0], (2, 0, 1, 3))] + [np.swapaxes(r, 0, 1) for r in ref[1:]]
    assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def _model(op, x, init, outs=("Y", "Y_h"), opset=14, **kw):
    from onnx import helper

    from oracle import make_model

    kw.setdefault("hidden_size", H)
    node = helper.make_node(op, ["x"] + list(init), list(outs), **kw)
    return make_model([node], {"x": x}, list(outs), opset=opset, initializers=init)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_activations_and_clip(op):
    # float32: onnxruntime is the oracle (the reference evaluator ignores custom activations)
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    init = weights(op, 1, np.float32)
    acts = {"LSTM": ["HardSigmoid", "LeakyRelu", "Tanh"], "GRU": ["Sigmoid", "Softsign"],
            "RNN": ["Relu"]}[op]
    kw = {"activations": acts, "clip": 1.5, "hidden_size": H}
    if op == "LSTM":
        kw["activation_alpha"] = [0.3, 0.05]
        kw["activation_beta"] = [0.4]
    check_node(op, {"x": x}, ["Y", "Y_h"], opset=14, initializers=init, rtol=1e-4, atol=1e-5, **kw)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float64_matches_float32(op):
    from oracle import run_ours

    x = rng.standard_normal((SEQ, BATCH, IN))
    init64 = weights(op, 2, np.float64)
    outs = []
    for dt in (np.float64, np.float32):
        init = {k: v.astype(dt) for k, v in init64.items()}
        m = _model(op, x.astype(dt), init, direction="bidirectional")
        outs.append(run_ours(m, {"x": x.astype(dt)})[0])
    assert outs[0][0].dtype == np.float64
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)


def test_lstm_peepholes_and_input_forget():
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    init = weights("LSTM", 1, np.float32)
    init["seq"] = np.array([], np.int32)  # placeholder removed below
    del init["seq"]
    names = dict(init)
    names[""] = None
    for_node = {"W": init["W"], "R": init["R"], "B": init["B"]}
    p = (rng.standard_normal((1, 3 * H)) * 0.3).astype(np.float32)
    from onnx import helper

    from oracle import assert_close, make_model, run_oracle, run_ours
    for input_forget in (0, 1):
        node = helper.make_node("LSTM", ["x", "W", "R", "B", "", "", "", "P"], ["Y", "Y_h", "Y_c"],
                                hidden_size=H, input_forget=input_forget)
        m = make_model([node], {"x": x}, ["Y", "Y_h", "Y_c"], opset=14, initializers={**for_node, "P": p})
        ours, _ = run_ours(m, {"x": x})
        assert_close(ours, run_oracle(m, {"x": x}), rtol=1e-4, atol=1e-5)


def test_gru_linear_before_reset(loop):
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    check_node("GRU", {"x": x}, ["Y", "Y_h"], opset=14, initializers=weights("GRU", 2, np.float32),
               hidden_size=H, direction="bidirectional", linear_before_reset=1, rtol=1e-4, atol=1e-5)


def test_only_final_state_wanted(loop):
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    check_node("LSTM", {"x": x}, ["", "Y_h"], opset=14, initializers=weights("LSTM", 1, np.float32),
               hidden_size=H, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,direction,lbr", [("LSTM", "bidirectional", 0), ("GRU", "bidirectional", 0),
                                              ("GRU", "reverse", 1), ("RNN", "bidirectional", 0)])
def test_initial_states_without_lengths(op, direction, lbr, loop):
    # the unmasked recurrences run a separate in-place loop: the initial states must seed it
    ndir = 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    init = weights(op, ndir, np.float32)
    init["seq"] = np.full(BATCH, SEQ, np.int32)  # all full length: no masking needed
    init["h0"] = rng.standard_normal((ndir, BATCH, H)).astype(np.float32)
    if op == "LSTM":
        init["c0"] = rng.standard_normal((ndir, BATCH, H)).astype(np.float32)
    kw = {"linear_before_reset": lbr} if op == "GRU" else {}
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    check_node(op, {"x": x}, outs, opset=14, initializers=init, rtol=1e-4, atol=1e-5, direction=direction,
               hidden_size=H, **kw)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float16(op):
    x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float16)
    init = {k: v.astype(np.float16) for k, v in weights(op, 1, np.float32).items()}
    check_node(op, {"x": x}, ["Y", "Y_h"], opset=14, initializers=init, rtol=2e-2, atol=2e-2, hidden_size=H)


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_recurrence_cache_and_saturation(op, lbr, loop):
    # the fast loops prepare R once per node when it is an initializer; when R is a graph
    # input every run must use the R it is given. Pre-activations of a few hundred saturate every
    # sigmoid and tanh (exp overflows to inf on purpose: no warning may escape).
    import warnings

    from oracle import assert_close, make_model, run_oracle

    from runtime_core import InferenceSession

    kw = {"linear_before_reset": lbr} if op == "GRU" else {}
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    for r_is_input in (False, True):
        init = weights(op, 2, np.float32)
        x = rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32)
        feeds = {"x": x, "R": init.pop("R")} if r_is_input else {"x": x}
        node_ins = ["x", "W", "R", "B"]
        from onnx import helper

        node = helper.make_node(op, node_ins, outs, hidden_size=H, direction="bidirectional", **kw)
        model = make_model([node], feeds, outs, opset=14, initializers=init)
        sess = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for run in range(3):
            scale = 400.0 if run == 2 else 1.0
            feeds = {"x": (rng.standard_normal((SEQ, BATCH, IN)) * scale).astype(np.float32)}
            if r_is_input:
                feeds["R"] = (rng.standard_normal((2, GATES[op] * H, H)) * 0.5).astype(np.float32)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ours = sess.run(None, feeds)
            assert_close(ours, run_oracle(model, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
@pytest.mark.parametrize("hidden,batch", [(16, 1), (37, 4), (70, 2), (20, 7), (33, 11), (24, 17), (8, 257)])
@pytest.mark.native
def test_native_recurrence_shapes(op, lbr, hidden, batch, monkeypatch):
    # hidden sizes that fill, miss and overrun the 16-unit chunks; batches that fill a block of
    # rows, pad one and need a second or third; a batch past NATIVE_MAX_BATCH takes the numpy loop.
    # Both directions go to one compiled call.
    from onnx import helper
    from oracle import assert_close, make_model, run_oracle, run_ours
    from runtime_provider_cpu.ops import rnn

    assert rnn._native is not None, "runtime_provider_cpu._native did not build"
    calls = []
    real = rnn._native.recurrence
    monkeypatch.setattr(rnn, "_native", type("N", (), {
        "RECURRENCE_UNITS": rnn._native.RECURRENCE_UNITS,
        "recurrence": staticmethod(lambda *a: calls.append(a[:3]) or real(*a))}))
    g, seq, inp = GATES[op], 23, 9
    init = {"W": (rng.standard_normal((2, g * hidden, inp)) * 0.4).astype(np.float32),
            "R": (rng.standard_normal((2, g * hidden, hidden)) * 0.4).astype(np.float32),
            "B": (rng.standard_normal((2, 2 * g * hidden)) * 0.2).astype(np.float32),
            "seq": np.full(batch, seq, np.int32),
            "h0": rng.standard_normal((2, batch, hidden)).astype(np.float32)}
    outs = ["Y", "Y_h"]
    kw = {"linear_before_reset": lbr} if op == "GRU" else {}
    if op == "LSTM":
        init["c0"] = rng.standard_normal((2, batch, hidden)).astype(np.float32)
        outs.append("Y_c")
    node = helper.make_node(op, ["x", "W", "R", "B", "seq", "h0"] + (["c0"] if op == "LSTM" else []), outs,
                            hidden_size=hidden, direction="bidirectional", **kw)
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    model = make_model([node], {"x": x}, outs, opset=14, initializers=init)
    ours, _ = run_ours(model, {"x": x})
    assert_close(ours, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
    if batch <= rnn.NATIVE_MAX_BATCH:
        assert calls == [(op == "LSTM", bool(lbr), False)]
    else:
        assert calls == []


@pytest.mark.kernel
@pytest.mark.native
def test_native_recurrence_checks_buffers():
    from runtime_provider_cpu.ops import rnn

    nat = rnn._native
    assert nat is not None, "runtime_provider_cpu._native did not build"
    u = nat.RECURRENCE_UNITS
    seq, nd, b, h = 3, 2, 2, 20
    nc = -(-h // u)
    xw = np.zeros((seq, b, nd * 3 * h), np.float32)
    p1 = np.zeros(nd * nc * h * 3 * u, np.float32)
    h0 = np.zeros((nd, b, h), np.float32)
    ys = np.full((seq, nd, b, h), 7.0, np.float32)
    rbn = np.zeros((nd, h), np.float32)
    dims = (seq, nd, b, h, nd * 3 * h)

    def call(xw=xw, xb=None, p1=p1, rbn=rbn, ys=ys, dims=dims):
        nat.recurrence(False, True, False, xw, xb, p1, None, rbn, h0, None, ys, dims, False, 2)

    with pytest.raises(ValueError, match="p1"):
        call(p1=p1[:-1])
    with pytest.raises(ValueError, match="xw"):
        call(xw=xw[:-1])
    with pytest.raises(ValueError, match="xb"):
        call(xb=np.zeros(3 * h, np.float32))  # one direction's biases for two directions
    with pytest.raises(ValueError, match="pass None"):  # linear_before_reset=1 needs rbn
        call(rbn=None)
    with pytest.raises(ValueError, match="ys"):
        call(ys=ys.astype(np.float64))
    with pytest.raises(ValueError, match="read-only"):  # ys must be writable
        ro = ys.copy()
        ro.flags.writeable = False
        call(ys=ro)
    with pytest.raises(ValueError, match="negative"):
        call(dims=(-1, nd, b, h, nd * 3 * h))
    with pytest.raises(ValueError, match="directions"):
        call(dims=(seq, 3, b, h, nd * 3 * h))
    with pytest.raises(ValueError, match="cannot hold"):  # rows too short for every direction's gates
        call(dims=(seq, nd, b, h, 3 * h))
    assert (ys == 7.0).all()  # nothing was written by any refused call
    # zero input and state with zero weights: z = r = 0.5, n = 0, so every state stays 0
    call()
    assert (ys == 0.0).all()


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_stacked_bidirectional_as_exported(op, lbr, threads, loop):
    # two bidirectional layers joined as TorchScript exports them: Transpose(0, 2, 1, 3) and a
    # Reshape to [seq, batch, 2H] (the compiled loop's Y is a view of a batch-major buffer, so
    # both are views); one thread runs the directions one after the other, two in parallel
    from onnx import helper

    from oracle import assert_close, cpu_session, make_model, run_oracle

    g, seq, batch, inp, hid = GATES[op], 9, 5, 7, 20
    init = {}
    nodes = []
    src = "x"
    for layer, width in enumerate((inp, 2 * hid)):
        init[f"W{layer}"] = (rng.standard_normal((2, g * hid, width)) * 0.4).astype(np.float32)
        init[f"R{layer}"] = (rng.standard_normal((2, g * hid, hid)) * 0.4).astype(np.float32)
        init[f"B{layer}"] = (rng.standard_normal((2, 2 * g * hid)) * 0.2).astype(np.float32)
        kw = {"linear_before_reset": lbr} if op == "GRU" else {}
        nodes += [helper.make_node(op, [src, f"W{layer}", f"R{layer}", f"B{layer}"], [f"Y{layer}", f"H{layer}"],
                                   hidden_size=hid, direction="bidirectional", **kw),
                  helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"T{layer}", "shape"], [f"S{layer}"])]
        src = f"S{layer}"
    init["shape"] = np.array([seq, batch, 2 * hid], np.int64)
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    outs = ["S1", "H0", "H1"]
    model = make_model(nodes, {"x": x}, outs, opset=14, initializers=init)
    ours = cpu_session(model, threads=threads).run(None, {"x": x})
    assert_close(ours, run_oracle(model, {"x": x}), rtol=1e-4, atol=1e-5)
