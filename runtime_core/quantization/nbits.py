"""4-bit weight-only quantization of MatMul weights into ``com.microsoft::MatMulNBits``
(onnxruntime's MatMulNBitsQuantizer, default round-to-nearest algorithm).

Each constant B [K, N] is cut into blocks of ``block_size`` rows per column. Asymmetric:
scale = (max - min) / 15 over the block's range widened to hold 0, zero point
round(-min / scale) in [0, 15]. Symmetric: scale = v / -8 where v is the block's value of
largest magnitude, zero point 8. Values are stored two per byte (low nibble first) as
[N, K / block_size, block_size / 2], scales as [N, K / block_size], zero points packed the
same way along the block axis."""

from __future__ import annotations

import os

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import InvalidArgumentError
from ._common import MS_DOMAIN, ModelView, QuantFormat
from ._quantizer import topological_sort

__all__ = ["quantize_blockwise_4bit", "MatMulNBitsQuantizer", "quantize_matmul_nbits"]


def _pack(v: np.ndarray, fill: int = 0) -> np.ndarray:
    """Pairs of 4-bit values along the last axis into bytes (low nibble first); an odd count
    is padded with ``fill``."""
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.full(v.shape[:-1] + (1,), fill, v.dtype)], axis=-1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def quantize_blockwise_4bit(w: np.ndarray, block_size: int, symmetric: bool, unpacked: bool = False):
    """(packed [N, blocks, block_size/2], scales [N, blocks], packed zero points [N, ceil(blocks/2)]);
    with ``unpacked`` the 4-bit values [N, blocks, block_size] and zero points [N, blocks] instead."""
    k, n = w.shape
    blocks = (k + block_size - 1) // block_size
    pad = blocks * block_size - k
    wp = np.pad(w.astype(np.float32), ((0, pad), (0, 0))) if pad else w.astype(np.float32)
    b = wp.T.reshape(n, blocks, block_size)
    if symmetric:
        mx, mn = b.max(axis=2), b.min(axis=2)
        v = np.where(np.abs(mx) > np.abs(mn), mx, mn)
        scale = (v / np.float32(-8.0)).astype(np.float32)
        zp = np.full(scale.shape, 8, np.float32)
    else:
        mn = np.minimum(b.min(axis=2), 0).astype(np.float32)
        mx = np.maximum(b.max(axis=2), 0).astype(np.float32)
        scale = ((mx - mn) / np.float32(15.0)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zfp = np.where(scale != 0, np.float32(0) - mn / scale, mn).astype(np.float32)
        zp = np.clip(np.where(zfp < 0, 0, np.where(zfp > 15, 15, np.floor(np.abs(zfp) + 0.5) * np.sign(zfp))), 0, 15)
    with np.errstate(divide="ignore"):
        recip = np.where(scale != 0, np.float32(1.0) / scale, np.float32(0)).astype(np.float32)
    x = b * recip[..., None] + zp[..., None].astype(np.float32)
    q = np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), 0, 15).astype(np.uint8)  # roundf: half away from 0
    if pad:  # rows past K are never read; left 0 as onnxruntime's packer leaves them
        q.reshape(n, blocks * block_size)[:, k:] = 0
    if unpacked:
        return q, scale.astype(w.dtype), zp.astype(np.uint8)
    packed = _pack(q)
    zpacked = _pack(zp.astype(np.uint8), fill=8)  # onnxruntime pads with the default zero point
    return packed, scale.astype(w.dtype), zpacked


class _Saved:
    """What onnxruntime's quantizer exposes as ``.model``: the ModelProto and a saver."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model

    def save_model_to_file(self, path, use_external_data_format: bool = False) -> None:
        if use_external_data_format:
            onnx.save_model(self.model, os.fspath(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(os.fspath(path)) + ".data")
        else:
            onnx.save_model(self.model, os.fspath(path))


class MatMulNBitsQuantizer:
    """onnxruntime's MatMulNBitsQuantizer (4 bits, default algorithm, QOperator form):
    ``q = MatMulNBitsQuantizer(model, block_size=32); q.process(); q.model.save_model_to_file(p)``."""

    def __init__(self, model, bits: int = 4, block_size: int = 128, is_symmetric: bool = False,
                 accuracy_level: int | None = None, nodes_to_exclude=None, nodes_to_include=None,
                 quant_format: QuantFormat = QuantFormat.QOperator, **unused):
        if bits != 4:
            raise InvalidArgumentError(f"only 4-bit weight quantization is built, got bits={bits}")
        if block_size < 16 or block_size & (block_size - 1):
            raise InvalidArgumentError(f"block_size must be a power of two >= 16, got {block_size}")
        if isinstance(model, onnx.ModelProto):
            m = onnx.ModelProto()
            m.CopyFrom(model)
        else:
            m = onnx.load(os.fspath(model))
        self.model = _Saved(m)
        self.block_size, self.is_symmetric, self.accuracy_level = block_size, bool(is_symmetric), accuracy_level
        self.nodes_to_exclude = set(nodes_to_exclude or [])
        self.nodes_to_include = set(nodes_to_include) if nodes_to_include else None
        if not isinstance(quant_format, QuantFormat):
            raise InvalidArgumentError(f"quant_format must be a QuantFormat, got {quant_format!r}")
        self.quant_format = quant_format

    def process(self) -> None:
        mv = ModelView(self.model.model)
        new = []
        done: dict[str, tuple[str, str, str | None]] = {}
        for node in mv.graph.node:
            ok = (node.op_type == "MatMul" and node.name not in self.nodes_to_exclude
                  and (self.nodes_to_include is None or node.name in self.nodes_to_include)
                  and mv.is_initializer(node.input[1]))
            w = mv.array(node.input[1]) if ok else None
            if w is None or w.ndim != 2 or w.dtype not in (np.float32, np.float16):
                new.append(node)
                continue
            b = node.input[1]
            if self.quant_format == QuantFormat.QDQ:
                new.extend(self._qdq(mv, node, w, done))
                continue
            if b not in done:
                packed, scales, zps = quantize_blockwise_4bit(w, self.block_size, self.is_symmetric)
                qn = mv.add_initializer(numpy_helper.from_array(packed, b + "_Q4"))
                sn = mv.add_initializer(numpy_helper.from_array(scales, b + "_scales"))
                zn = None if self.is_symmetric else mv.add_initializer(numpy_helper.from_array(zps, b + "_zero_points"))
                done[b] = (qn, sn, zn)
            qn, sn, zn = done[b]
            kw: dict[str, Any] = {"K": int(w.shape[0]), "N": int(w.shape[1]), "bits": 4, "block_size": self.block_size}
            if self.accuracy_level:
                kw["accuracy_level"] = int(self.accuracy_level)
            new.append(helper.make_node("MatMulNBits", [node.input[0], qn, sn] + ([zn] if zn else []),
                                        [node.output[0]], node.name + "_Q4" if node.name else "",
                                        domain=MS_DOMAIN, **kw))
        del mv.graph.node[:]
        mv.graph.node.extend(new)
        mv.drop_unused_initializers()
        mv.ensure_ms_opset()
        if self.quant_format == QuantFormat.QDQ:
            for o in mv.model.opset_import:
                if o.domain in ("", "ai.onnx") and o.version < 21:
                    o.version = 21  # blocked 4-bit DequantizeLinear; the other ops' meaning is unchanged here
        topological_sort(mv.graph)

    def _qdq(self, mv: ModelView, node, w: np.ndarray, done: dict) -> list:
        """DequantizeLinear (blocked along K, 4-bit) -> MatMul: standard ONNX (opset 21)."""
        b = node.input[1]
        k, n = w.shape
        if b not in done:
            q, scales, zps = quantize_blockwise_4bit(w, self.block_size, self.is_symmetric, unpacked=True)
            vals = q.reshape(n, -1)[:, :k].T  # [K, N]
            qt = onnx.TensorProto.INT4 if self.is_symmetric else onnx.TensorProto.UINT4
            if self.is_symmetric:
                vals = vals.astype(np.int8) - 8
            qn = mv.add_initializer(helper.make_tensor(b + "_DQ_Q4", qt, [k, n], vals.reshape(-1).tolist()))
            sn = mv.add_initializer(numpy_helper.from_array(np.ascontiguousarray(scales.T), b + "_DQ_scales"))
            zn = None
            if not self.is_symmetric:
                zn = mv.add_initializer(helper.make_tensor(b + "_DQ_zero_points", qt, list(zps.T.shape),
                                                           zps.T.reshape(-1).tolist()))
            done[b] = (qn, sn, zn)
        qn, sn, zn = done[b]
        return [helper.make_node("DequantizeLinear", [qn, sn] + ([zn] if zn else []), [qn + "_output"],
                                 node.name + "_DQ_Q4" if node.name else "", axis=0, block_size=self.block_size),
                helper.make_node("MatMul", [node.input[0], qn + "_output"], [node.output[0]],
                                 node.name + "_matmul_Q4" if node.name else "")]


def quantize_matmul_nbits(model_input, model_output, block_size: int = 128, is_symmetric: bool = False,
                          accuracy_level: int | None = None, nodes_to_exclude=None,
                          quant_format: QuantFormat = QuantFormat.QOperator) -> None:
    """Rewrite every MatMul with a constant 2-D float B into a 4-bit MatMulNBits (QOperator) or
    a blocked 4-bit DequantizeLinear -> MatMul (QDQ, runs on runtime_core) and save."""
    q = MatMulNBitsQuantizer(model_input, 4, block_size, is_symmetric, accuracy_level, nodes_to_exclude,
                             quant_format=quant_format)
    q.process()
    q.model.save_model_to_file(model_output)
