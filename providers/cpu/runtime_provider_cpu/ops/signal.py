"""CPU kernels: signal processing (DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix).

Design notes
------------
* Transforms use ``numpy.fft`` (pocketfft): float32 signals are transformed in complex64,
  float64 in complex128; float16 and bfloat16 are computed in float32 and cast back. The
  ONNX layout keeps complex numbers as a trailing ``[..., 2]`` (real, imaginary) axis
  (``[..., 1]`` for a real signal); outputs have the input's element type.
* DFT: ``onesided=1, inverse=0`` is an RFFT (``rfft``; a complex input, which the spec
  does not support, is transformed in full and its first ``n//2 + 1`` bins are kept, as
  onnx's reference does); ``onesided=1, inverse=1`` is an IRFFT (``irfft``: complex
  input, real ``[..., 1]`` output, default length ``2 * (n - 1)``). DFT-17 takes ``axis``
  as an attribute (default 1), DFT-20 as an optional input (default -2).
* STFT frames are a strided ``sliding_window_view`` (no copy) multiplied by the window,
  then one batched FFT over the frame axis.
* Windows are computed in float64 and cast to ``output_datatype`` (integer types
  truncate, as a C cast does). MelWeightMatrix follows the spec's reference arithmetic:
  ``num_mel_bins + 2`` mel points evenly spaced (step = range / (num_mel_bins + 2)),
  mapped to FFT bins with ``floor((dft_length + 1) * hz / sample_rate)``, triangles of
  peak 1 built with one broadcast comparison.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..limits import check_alloc
from ..registry import kernel

try:
    import ml_dtypes as _mld

    _BF16 = np.dtype(_mld.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
    _BF16 = None

_FLOAT = frozenset({"float16", "float32", "float64", "bfloat16"})
# ONNX TensorProto element types -> numpy (the CPU provider does not import onnx)
_ELEM = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
         9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
if _BF16 is not None:
    _ELEM[16] = _BF16
_WINDOW_OUT = frozenset({1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 16})


def _scalar_int(t, what: str) -> int:
    a = np.asarray(t)
    if a.size != 1:
        raise ValueError(f"{what} must be a scalar, got shape {a.shape}")
    return int(a.reshape(-1)[0])


def _work_dtype(dt) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def _as_signal(x: np.ndarray):
    """``[..., 1|2]`` ONNX layout -> (numpy real or complex array, is_complex)."""
    c = x.shape[-1] if x.ndim else 0
    if c not in (1, 2):
        raise ValueError(f"the last dimension must be 1 (real) or 2 (complex), got shape {x.shape}")
    w = x if x.dtype == _work_dtype(x.dtype) else x.astype(_work_dtype(x.dtype))
    if c == 1:
        return w[..., 0], False
    sig = np.empty(w.shape[:-1], dtype=np.complex128 if w.dtype == np.float64 else np.complex64)
    sig.real = w[..., 0]
    sig.imag = w[..., 1]
    return sig, True


def _to_onnx_complex(y: np.ndarray, dt) -> np.ndarray:
    out = np.empty((*y.shape, 2), dtype=np.dtype(dt) if np.dtype(dt) in (np.float32, np.float64)
                   else _work_dtype(dt))
    out[..., 0] = y.real
    out[..., 1] = y.imag
    return out if out.dtype == dt else out.astype(dt)


# ---------------------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------------------

def _dft(ctx, x, dft_length, axis, inverse, onesided):
    r = x.ndim
    if r < 2:
        raise ValueError(f"DFT input must have rank >= 2, got shape {x.shape}")
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ValueError(f"DFT axis {axis} is out of the accepted range [-{r}, -2] U [0, {r - 2}]")
    ax = axis % r
    dt = x.dtype
    sig, is_complex = _as_signal(x)
    dim = x.shape[ax]
    if dft_length is not None:
        n = _scalar_int(dft_length, "dft_length")
    elif inverse and onesided:
        n = 2 * (dim - 1)
    else:
        n = dim
    if n < 1:
        raise ValueError(f"dft_length must be positive, got {n}")
    out_shape = list(x.shape[:-1])
    out_shape[ax] = n // 2 + 1 if onesided and not inverse else n
    check_alloc(ctx, "DFT", out_shape, 16)  # dft_length sets the size; numpy's FFT is complex128
    if inverse and onesided:
        if not is_complex:
            raise ValueError("DFT with onesided=1, inverse=1 (IRFFT) needs a complex input [..., 2]")
        y = np.fft.irfft(sig, n=n, axis=ax)
        out = y[..., None]
        return out if out.dtype == dt else out.astype(dt)
    if inverse:
        y = np.fft.ifft(sig, n=n, axis=ax)
    elif onesided and not is_complex:
        y = np.fft.rfft(sig, n=n, axis=ax)
    else:
        y = np.fft.fft(sig, n=n, axis=ax)
        if onesided:
            y = np.take(y, np.arange(n // 2 + 1), axis=ax)
    return _to_onnx_complex(y, dt)


@kernel("DFT", 17, dtypes=_FLOAT)
def dft_17(ctx, x, dft_length=None, *, axis, inverse, onesided):
    return _dft(ctx, x, dft_length, int(axis), bool(inverse), bool(onesided))


@kernel("DFT", 20, dtypes=_FLOAT)
def dft_20(ctx, x, dft_length=None, axis=None, *, inverse, onesided):
    ax = -2 if axis is None else _scalar_int(axis, "axis")
    return _dft(ctx, x, dft_length, ax, bool(inverse), bool(onesided))


# ---------------------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------------------

@kernel("STFT", 17, dtypes=_FLOAT)
def stft(ctx, signal, frame_step, window=None, frame_length=None, *, onesided):
    if signal.ndim != 3:
        raise ValueError(f"STFT signal must be [batch, length, 1|2], got shape {signal.shape}")
    step = _scalar_int(frame_step, "frame_step")
    if step < 1:
        raise ValueError(f"frame_step must be positive, got {step}")
    if window is not None and window.ndim != 1:
        raise ValueError(f"STFT window must be 1-D, got shape {window.shape}")
    if frame_length is not None:
        L = _scalar_int(frame_length, "frame_length")
        if window is not None and window.shape[0] != L:
            raise ValueError(f"window length {window.shape[0]} != frame_length {L}")
    elif window is not None:
        L = int(window.shape[0])
    else:
        L = int(signal.shape[1])
    n = signal.shape[1]
    if L < 1 or L > n:
        raise ValueError(f"frame_length {L} must be in [1, signal_length={n}]")
    frames = (n - L) // step + 1
    # frame_step and frame_length set how many frames of how many bins come out (complex128)
    check_alloc(ctx, "STFT", (signal.shape[0], frames, L // 2 + 1 if onesided else L, 2), 8)
    dt = signal.dtype
    sig, is_complex = _as_signal(signal)
    fr = sliding_window_view(sig, L, axis=1)[:, ::step][:, :frames]  # [batch, frames, L]
    if window is not None:
        w = window.astype(_work_dtype(dt))
        fr = fr * w
    if onesided:
        if is_complex:
            raise ValueError("STFT with onesided=1 needs a real signal [..., 1]")
        y = np.fft.rfft(fr, n=L, axis=-1)
    else:
        y = np.fft.fft(fr, n=L, axis=-1)
    return _to_onnx_complex(y, dt)


# ---------------------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------------------

def _check_window(node):
    odt = node.attrs.get("output_datatype")
    if odt not in _WINDOW_OUT or odt not in _ELEM:
        return f"output_datatype={odt} is not a supported window output type"
    return None


def _window_points(ctx, what, size, periodic):
    N = _scalar_int(size, "size")
    if N < 0:
        raise ValueError(f"window size must be >= 0, got {N}")
    check_alloc(ctx, what, (N,), 8)  # the size input sets the length (computed in float64)
    n = np.arange(N, dtype=np.float64)
    denom = N if periodic else N - 1
    return n, denom


def _window_out(y: np.ndarray, output_datatype) -> np.ndarray:
    dt = np.dtype(_ELEM[output_datatype])
    return y.astype(dt)


@kernel("HannWindow", 17, check=_check_window)
def hann_window(ctx, size, *, output_datatype, periodic):
    n, d = _window_points(ctx, "HannWindow", size, periodic)
    with np.errstate(all="ignore"):
        y = np.sin(np.pi * n / d) ** 2
    return _window_out(y, output_datatype)


@kernel("HammingWindow", 17, check=_check_window)
def hamming_window(ctx, size, *, output_datatype, periodic):
    n, d = _window_points(ctx, "HammingWindow", size, periodic)
    alpha = 25.0 / 46.0
    with np.errstate(all="ignore"):
        y = alpha - (1.0 - alpha) * np.cos(2.0 * np.pi * n / d)
    return _window_out(y, output_datatype)


@kernel("BlackmanWindow", 17, check=_check_window)
def blackman_window(ctx, size, *, output_datatype, periodic):
    n, d = _window_points(ctx, "BlackmanWindow", size, periodic)
    with np.errstate(all="ignore"):
        t = 2.0 * np.pi * n / d
        y = 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2.0 * t)
    return _window_out(y, output_datatype)


# ---------------------------------------------------------------------------------------
# MelWeightMatrix
# ---------------------------------------------------------------------------------------

@kernel("MelWeightMatrix", 17, check=_check_window)
def mel_weight_matrix(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                      *, output_datatype):
    M = _scalar_int(num_mel_bins, "num_mel_bins")
    D = _scalar_int(dft_length, "dft_length")
    sr = _scalar_int(sample_rate, "sample_rate")
    lo = float(np.asarray(lower_edge_hertz, dtype=np.float64).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz, dtype=np.float64).reshape(-1)[0])
    if M < 1 or D < 1 or sr < 1:
        raise ValueError("num_mel_bins, dft_length and sample_rate must be positive")
    nbins = D // 2 + 1
    check_alloc(ctx, "MelWeightMatrix", (nbins, M + 2), 8)  # the sizes come from the input values
    lo_mel = 2595.0 * math.log10(1.0 + lo / 700.0)
    hi_mel = 2595.0 * math.log10(1.0 + hi / 700.0)
    step = (hi_mel - lo_mel) / (M + 2)
    mel = np.arange(M + 2, dtype=np.float64) * step + lo_mel
    hz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    fb = np.floor((D + 1) * hz / sr).astype(np.int64)
    l, c, h = fb[:-2], fb[1:-1], fb[2:]
    need = int(max(c.max(), (h - 1).max()))
    if fb.min() < 0 or need >= nbins:
        raise ValueError(f"the mel band edges map to FFT bins outside [0, {nbins}) "
                         f"(lower_edge_hertz={lo}, upper_edge_hertz={hi}, sample_rate={sr})")
    j = np.arange(nbins, dtype=np.int64)[:, None]
    with np.errstate(all="ignore"):
        rise = np.where(c > l, (j - l) / np.maximum(c - l, 1), 1.0)
        fall = (h - j) / np.maximum(h - c, 1)
    out = np.zeros((nbins, M), dtype=np.float64)
    out = np.where((j >= l) & (j <= c), rise, out)
    out = np.where((j >= c) & (j < h), fall, out)
    return out.astype(_ELEM[output_datatype])
