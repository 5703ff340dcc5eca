"""Attention-family kernels against onnxruntime, for cases the ONNX backend suite does not cover.

(``run_oracle`` falls back to onnx's reference evaluator where onnxruntime lacks the op.)
"""

import numpy as np
import pytest
from onnx import helper

from oracle import assert_close, check_node, make_model, run_oracle, run_ours

rng = np.random.default_rng(7)


def _run_both(op, inputs, outputs, opset, rtol=1e-5, atol=1e-6, domain="", extra_opsets=None, **attrs):
    """One node whose omitted optional inputs are given as ``None`` in ``inputs``."""
    names = [k if v is not None else "" for k, v in inputs.items()]
    while names and not names[-1]:
        names.pop()
    feeds = {k: v for k, v in inputs.items() if v is not None}
    node = helper.make_node(op, names, list(outputs), domain=domain, **attrs)
    model = make_model([node], feeds, [o for o in outputs if o], opset=opset, extra_opsets=extra_opsets)
    ours, sess = run_ours(model, feeds)
    assert all(n.provider == "CPUExecutionProvider" for n in sess.get_partition_report().nodes)
    ref = run_oracle(model, feeds)
    assert_close(ours, ref, rtol, atol)
    return ours


def _r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_gqa_cross_causal_past_float_mask(dtype):
    # GQA (6 query heads on 2 KV heads), cross lengths, a rank-3 float mask, past cache, causal
    B, Hq, Hkv, Sq, Skv, P, D, Dv = 2, 6, 2, 3, 4, 2, 8, 5
    inputs = {"Q": _r(B, Hq, Sq, D, dtype=dtype), "K": _r(B, Hkv, Skv, D, dtype=dtype),
              "V": _r(B, Hkv, Skv, Dv, dtype=dtype), "mask": _r(1, Sq, P + Skv, dtype=dtype),
              "pk": _r(B, Hkv, P, D, dtype=dtype), "pv": _r(B, Hkv, P, Dv, dtype=dtype)}
    _run_both("Attention", inputs, ["Y", "pk_out", "pv_out"], 23, is_causal=1, scale=0.3)


def test_attention_3d_bool_mask_broadcast_rows():
    # 3D inputs, a (B, 1, S, T) boolean mask, qk output after softmax
    B, S, Hq, Hkv, D = 2, 5, 4, 2, 4
    mask = np.ones((B, 1, S, S), bool)
    mask[1, ..., 3:] = False
    mask[0, 0, 2, :] = False  # a fully masked row gives a zero row
    inputs = {"Q": _r(B, S, Hq * D), "K": _r(B, S, Hkv * D), "V": _r(B, S, Hkv * D), "mask": mask}
    _run_both("Attention", inputs, ["Y", "", "", "qk"], 23, q_num_heads=Hq, kv_num_heads=Hkv,
              qk_matmul_output_mode=3)


def test_attention_24_nonpad_without_causal():
    # external cache: nonpad_kv_seqlen masks the padded keys of each batch entry
    B, H, Sq, T, D = 3, 2, 2, 6, 8
    inputs = {"Q": _r(B, H, Sq, D), "K": _r(B, H, T, D), "V": _r(B, H, T, D), "mask": None,
              "pk": None, "pv": None, "nonpad": np.array([6, 3, 1], np.int64)}
    _run_both("Attention", inputs, ["Y"], 24)


def test_attention_float16_softcap_mask():
    B, H, Sq, T, D = 1, 2, 4, 7, 16
    inputs = {"Q": _r(B, H, Sq, D, dtype=np.float16), "K": _r(B, H, T, D, dtype=np.float16),
              "V": _r(B, H, T, D, dtype=np.float16), "mask": _r(Sq, T, dtype=np.float16)}
    _run_both("Attention", inputs, ["Y"], 23, softcap=1.5, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_normalization_broadcast_scale(dtype):
    x = _r(2, 3, 4, 5, dtype=dtype)
    check_node("RMSNormalization", {"x": x}, initializers={"s": _r(4, 1, dtype=dtype)}, opset=23,
               axis=-2, epsilon=1e-3)


def test_rotary_embedding_4d_position_ids_partial_interleaved_fp16():
    B, H, S, D, rd, maxpos = 2, 3, 5, 8, 4, 11
    ang = rng.uniform(0, 3, (maxpos, rd // 2))
    inputs = {"x": _r(B, H, S, D, dtype=np.float16), "cos": np.cos(ang).astype(np.float16),
              "sin": np.sin(ang).astype(np.float16),
              "pos": rng.integers(0, maxpos, (B, S)).astype(np.int64)}
    check_node("RotaryEmbedding", inputs, opset=23, interleaved=1, rotary_embedding_dim=rd,
               rtol=1e-3, atol=1e-3)


def test_swiglu_float64():
    check_node("SwiGLU", {"a": _r(3, 7, dtype=np.float64), "b": _r(3, 7, dtype=np.float64)}, opset=28,
               alpha=1.7)


@pytest.mark.parametrize("mode,axis", [("linear", 1), ("circular", 2), ("circular", -1)])
def test_tensor_scatter_axes(mode, axis):
    past = _r(2, 6, 5, 7)
    ax = axis % 4
    ushape = list(past.shape)
    ushape[ax] = 3
    upd = _r(*ushape)
    wi = np.array([1, past.shape[ax] - 3 if mode == "linear" else past.shape[ax] - 1], np.int64)
    check_node("TensorScatter", {"past": past, "upd": upd, "wi": wi}, opset=24, mode=mode, axis=axis)


def test_tensor_scatter_int64_no_indices():
    past = rng.integers(-9, 9, (3, 4, 2)).astype(np.int64)
    upd = rng.integers(-9, 9, (3, 2, 2)).astype(np.int64)
    check_node("TensorScatter", {"past": past, "upd": upd}, opset=24)


def test_causal_conv_with_state_bias_past_silu_long_kernel():
    B, C, L, k = 2, 3, 4, 6  # the input is shorter than the kernel
    inputs = {"x": _r(B, C, L), "w": _r(C, 1, k), "b": _r(C), "past": _r(B, C, k - 1)}
    _run_both("CausalConvWithState", inputs, ["y", "state"], 27, activation="silu")


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_gqa_rules(rule):
    B, T, Hq, Hkv, dk, dv = 2, 5, 4, 2, 3, 4
    k = _r(B, T, Hkv, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    inputs = {"q": _r(B, T, Hq * dk), "k": k.reshape(B, T, Hkv * dk), "v": _r(B, T, Hkv * dv),
              "past": _r(B, Hkv, dk, dv) * 0.1,
              "decay": (-np.abs(_r(B, T, Hkv * dk)) * 0.3) if rule in ("gated", "gated_delta") else None,
              "beta": (1 / (1 + np.exp(-_r(B, T, 1)))).astype(np.float32)
              if rule in ("delta", "gated_delta") else None}
    _run_both("LinearAttention", inputs, ["y", "state"], 27, q_num_heads=Hq, kv_num_heads=Hkv,
              update_rule=rule, rtol=1e-4, atol=1e-5)


def test_flex_attention_gqa_softmax_precision_double():
    Q, K, V = _r(1, 4, 3, 8), _r(1, 2, 5, 8), _r(1, 2, 5, 6)
    _run_both("FlexAttention", {"Q": Q, "K": K, "V": V}, ["Y"], 26, domain="ai.onnx.preview",
              extra_opsets={"ai.onnx.preview": 1}, softmax_precision=11, scale=0.5)


def _flex_model(feeds, **mods):
    import onnx

    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", **mods)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
                          [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["b", "h", "l", "e"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)])
    model.ir_version = 10
    return model


def _mod(nodes, name, inits=()):
    import onnx

    dims = ["b", "h", "l", "s"]
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, dims)],
                             [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, dims)],
                             initializer=list(inits))


def test_flex_attention_runs_score_and_prob_modifiers():
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    feeds = {"Q": _r(2, 4, 3, 8), "K": _r(2, 2, 5, 8), "V": _r(2, 2, 5, 6)}
    # score_mod: a soft cap (tanh) scaled by a constant; prob_mod: squares the probabilities
    score = _mod([helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Mul", ["t", "c"], ["o"])], "score",
                 [numpy_helper.from_array(np.array(3.0, np.float32), "c")])
    prob = _mod([helper.make_node("Mul", ["s", "s"], ["o"])], "prob")
    model = _flex_model(feeds, score_mod=score, prob_mod=prob)
    ours, _ = run_ours(model, feeds)
    ref = ReferenceEvaluator(model).run(None, feeds)
    assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_flex_attention_modifier_with_an_unsupported_op_is_declined():
    from runtime_core.errors import PartitionError

    feeds = {"Q": _r(1, 1, 2, 4), "K": _r(1, 1, 2, 4), "V": _r(1, 1, 2, 4)}
    body = _mod([helper.make_node("Frobnicate", ["s"], ["o"], domain="acme")], "mod")
    model = _flex_model(feeds, score_mod=body)
    model.opset_import.append(helper.make_opsetid("acme", 1))
    with pytest.raises(PartitionError, match="score_mod.*Frobnicate"):
        run_ours(model, feeds)
