/* runtime_provider_cpu._native: the few CPU kernels that numpy cannot express without one
 * full memory pass per step, in plain C against the CPython API (no numpy headers). This file
 * holds the module table and the buffer checks every entry point makes; the kernels are one
 * file per routine family beside it (setup.py lists them, native.h declares what they share).
 * Every buffer is checked against the shape it is said to have before anything is read, and
 * the GIL is released while the kernels run. Called from runtime_provider_cpu.ops.nn, .ops.rnn,
 * .ops.fused, .ops.elementwise and .ops.ml, which make the arrays C-contiguous and of the
 * kernel's type first. Measurements behind the design: providers/cpu/docs/performance.md. */
#include "native.h"

#include <pthread.h>

/* one C-contiguous buffer of n items of itemsize bytes (writable when asked), else a
 * ValueError naming it (and nothing held) */
int get_items(const char *fn, PyObject *obj, Py_buffer *view, int writable, Py_ssize_t n,
                     Py_ssize_t itemsize, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    Py_ssize_t bytes;
    if (n < 0 || __builtin_mul_overflow(n, itemsize, &bytes) || view->len != bytes || view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s holds %zd bytes of %zd-byte items, expected %zd items of %zd bytes",
                     fn, what, view->len, view->itemsize, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}


void release_buffers(Py_buffer *v, int k)
{
    for (int i = 0; i < k; i++)
        if (v[i].obj != NULL)
            PyBuffer_Release(&v[i]);
}

int sz_check(const rc_sz *s, const char *fn, PyObject *exc)
{
    if (!s->what)
        return 0;
    PyErr_Format(exc, "%s: %s overflows (sizes, strides, dilations or pads too large)", fn, s->what);
    return -1;
}

/* every buffer of spec[0..k) into v (an absent optional one: buf NULL); on a failure those
 * already held are released and -1 is returned with the error set */
int get_buffers(const char *fn, const rc_buf *spec, Py_buffer *v, int k)
{
    for (int i = 0; i < k; i++) {
        if (spec[i].optional && spec[i].obj == Py_None) {
            v[i].obj = NULL;
            v[i].buf = NULL;
            continue;
        }
        if (get_items(fn, spec[i].obj, &v[i], spec[i].writable, spec[i].n, spec[i].itemsize,
                      spec[i].name) < 0) {
            v[i].obj = NULL;
            release_buffers(v, i);
            return -1;
        }
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"qgemm_packed_size", rc_py_qgemm_packed_size, METH_VARARGS,
     "qgemm_packed_size((K, N)) -> bytes qgemm_pack writes for a K x N int8 B."},
    {"qgemm_pack", rc_py_qgemm_pack, METH_VARARGS,
     "qgemm_pack(b, packed, (K, N), b_signed)\nB (K x N uint8/int8) packed for qgemm."},
    {"qgemm", rc_py_qgemm, METH_VARARGS,
     "qgemm(a, a_signed, za, packed, b_signed, zb, y, (M, K, N), mode, mult, yz, threads, bias=None,\n"
     "      y_planes=0, conv=None)\n"
     "sum_k (a - za)(b - zb[n]) (+ bias[n]) of 8-bit A (M x K) and packed B into y: int32 (mode 0), or\n"
     "saturate(rint(acc * mult[n]) + yz) as uint8 (mode 1) / int8 (mode 2). zb may be None. With y_planes P, Y is\n"
     "(M / P) x N x P (NCHW). With conv (C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl), a is NCHW images and\n"
     "A their im2col rows (pixel (n, oh, ow), items (kh, kw, c), taps outside the image za), never stored whole."},
    {"qconv_nchw", rc_py_qconv_nchw, METH_VARARGS,
     "qconv_nchw(b, b_signed, bz, w, w_signed, wz, y, (N, M, K, P), mult, bias, y_signed, yz, threads)\n"
     "A convolution as W (M x K bytes) times each image's K x P bytes (NCHW planes or im2col rows), requantized\n"
     "per output channel as qgemm's epilogue, into y (N x M x P). wz (int32 [M]) and bias (int32 [M]) may be None."},
    {"qim2col_rows", rc_py_qim2col_rows, METH_VARARGS,
     "qim2col_rows(x, cols, (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw), (pt, pl), pad, threads)\n"
     "im2col of NCHW bytes as K x P rows a image for qconv_nchw: row (c, kh, kw), taps outside the image = pad."},
    {"qadd_lut", rc_py_qadd_lut, METH_VARARGS,
     "qadd_lut(a, b, ta, tb, zc, y, y_signed, n, threads, affine=None)\n"
     "y = saturate(rint(ta[a] + tb[b] + zc)) for n bytes: QLinearAdd through per-code float32 tables.\n"
     "affine (ra, za, rb, zb): the tables' form (code - z) * r; where they are exactly that, AVX-512 computes them."},
    {"qquantize", rc_py_qquantize, METH_VARARGS,
     "qquantize(x, y, n, scale, zp, y_signed, threads)\n"
     "y = saturate(rint(x / scale) + zp) (NaN -> 0) for n float32: per-tensor QuantizeLinear to int8/uint8."},
    {"qtranspose", rc_py_qtranspose, METH_VARARGS,
     "qtranspose(x, y, (N, C, P)): N images of C planes of P bytes (NCHW) into y as N x P x C (NHWC)."},
    {"qim2col", rc_py_qim2col, METH_VARARGS,
     "qim2col(x, cols, (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw), (pt, pl), pad, threads)\n"
     "im2col rows of NCHW bytes: row (n, oh, ow), items in (kh, kw, c) order, taps outside the image = pad."},
    {"qgemm_path", rc_py_qgemm_path, METH_VARARGS,
     "qgemm_path(force=-1) -> the inner loop this CPU runs (force, for tests: 0 portable, 1 avx2, 2 avx512vnni, "
     "3 avxvnni, 4 vnni256-evex, where this CPU runs it)."},
    {"qgemm_amx", rc_py_qgemm_amx, METH_VARARGS,
     "qgemm_amx(force=-1) -> whether qgemm runs products (not conv) of 16+ rows and K > 60 on the AMX tiles\n"
     "(force, for tests: 0 off, 1 on where AMX_INT8 is 'granted')."},
    {"qgemm_dispatch", rc_py_qgemm_dispatch, METH_VARARGS,
     "qgemm_dispatch(avx512vnni, avx_vnni, avx2) -> the inner loop dispatch picks on a CPU with these flags."},
    {"dyn_quantize", rc_py_dyn_quantize, METH_VARARGS,
     "dyn_quantize(x, y, n) -> (scale, zero_point): DynamicQuantizeLinear of n float32 into uint8 y."},
    {"dqmm", rc_py_dqmm, METH_VARARGS,
     "dqmm(a, a_kind, a_scale, a_zp, packed, b_signed, zb, b_scale, bias, y, (M, K, N), threads, tile=-1)\n"
     "-> (a_scale, a_zp)\n"
     "y (M x N float32) = float(sum_k (a - a_zp)(b - zb[n])) * (a_scale * b_scale[n]) + bias[n] against B packed by\n"
     "qgemm_pack; a_kind 0: a float32, quantized as DynamicQuantizeLinear (a_scale, a_zp computed), 1 uint8, 2 int8.\n"
     "zb and bias may be None. tile: 1 the AMX tiles (where AMX_INT8 is 'granted' and K > 60), 0 the VNNI tile,\n"
     "-1 AMX from 16 rows where it runs."},
    {"dqmm_path", rc_py_dqmm_path, METH_VARARGS,
     "dqmm_path(force=-1) -> dqmm's quantizing loop and tile on this CPU (force: 0 portable, 1 avx512, 2 avx512vnni,\n"
     "for tests)."},
    {"qdwconv", rc_py_qdwconv, METH_VARARGS,
     "qdwconv(x, x_signed, xz, w, w_signed, wz, bias, mult, y, y_signed, yz, (N, C, H, W), (KH, KW), (OH, OW),\n"
     "        (sh, sw), (dh, dw), (pt, pl), threads, method=1)\n"
     "Depthwise int8 convolution of NCHW bytes: y = saturate(rint((sum (x - xz)(w[c] - wz[c]) + bias[c]) * mult[c])\n"
     "+ yz), padding at the zero point. wz and bias may be None. method 1: 16-channel blocks (KH * KW <= 256,\n"
     "else planes; their rows on AVX-512 where CONV_FAST); 2: the same blocks, portable rows; 0: whole planes\n"
     "(tests tie the three)."},
    {"nbits_matmul", rc_py_nbits_matmul, METH_VARARGS,
     "nbits_matmul(a, b, scales, zero_points, zp_float, bias, y, (M, K, N, block_size), threads, panels=None)\n"
     "MatMulNBits (4 bits): y (M x N) = a (M x K) w^T (+ bias) in float32, w[n, k] = (q - z) * s per block of\n"
     "block_size (16 to 256, a power of two) along K, q the codes of b [N][ceil(K / block_size)][block_size / 2]\n"
     "(low nibble first); zero_points None (8), packed 4-bit uint8 [N][ceil(blocks / 2)], or float32 like the\n"
     "scales (zp_float); bias None or [N]. Dequantizes in cache: no float copy of w. panels: None, or b's codes\n"
     "as nbits_pack_panels writes them, read by the path of more than NBITS_DOT_ROWS rows."},
    {"nbits_pack_panels", rc_py_nbits_pack_panels, METH_VARARGS,
     "nbits_pack_panels(b, out, (N, K, block_size))\n"
     "nbits_matmul's codes b repacked for its panel path: out uint8 [ceil(N / 32)][blocks * block_size][16],\n"
     "byte i of a term holding column 32p + i's code (low nibble) and 32p + 16 + i's (high), 0 past N."},
    {"nbits_path", rc_py_nbits_path, METH_VARARGS,
     "nbits_path(force=-1) -> nbits_matmul's per-column loop here, \"avx512\" or \"portable\" (force 1: the\n"
     "portable clones, also for the repacked panels' fill; 0: the CPU's choice; for tests)."},
    {"nbits_int8_matmul", rc_py_nbits_int8_matmul, METH_VARARGS,
     "nbits_int8_matmul(a, bp, sb, zs, bias, y, (M, K, N, block_size), threads)\n"
     "MatMulNBits with accuracy_level 4 (onnxruntime's CompInt8): a's rows quantized to int8 per block (scale\n"
     "amax / 127), y = sum over blocks of sa * sb * sum(aq * q) - sa * sum(aq) * z * sb (+ bias), against B packed\n"
     "by ops/quant_contrib.py: bp [ceil(N / 16)][Kp / 8][64] bytes, sb and zs = z * sb [ceil(N / 16)][blocks][16]."},
    {"nbits_int8_path", rc_py_nbits_int8_path, METH_VARARGS,
     "nbits_int8_path(force=-1) -> nbits_int8_matmul's loop here, \"avx512vnni\", \"avxvnni\", \"avx2\" or\n"
     "\"portable\" (force 0 portable, 1 avx2, 2 avx512vnni, 3 avxvnni, 4 vnni256-evex where this CPU runs it,\n"
     "else the CPU's choice; for tests)."},
    {"depthwise2d", rc_py_depthwise2d, METH_VARARGS,
     "depthwise2d(x, w, b, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl), lo, hi,\n"
     "            threads=1, fast=1, lanes=False, act=-1, alpha=1/6, beta=0.5)\n"
     "Depthwise 2-D convolution of C-contiguous float32 buffers into y, clipped to [lo, hi], then act.\n"
     "fast: 0 the portable 8-float rows, 1 the default (the direct rows on AVX-512), 2 the\n"
     "phase planes, 3 the direct rows (AVX-512; elsewhere as 1). lanes: 1 the kernel with 16 channels in\n"
     "the vector lanes where it applies; 2 the same with w packed [ceil(C / 16)][KH * KW][16] (ValueError\n"
     "where that kernel does not apply)."},
    {"bias_clip", rc_py_bias_clip, METH_VARARGS,
     "bias_clip(y, b, (M, P), lo, hi, z=None)\n"
     "y[m, p] = clip(y[m, p] + b[m] + z[m, p], lo, hi) in place over C-contiguous float32 buffers\n"
     "(b and z may be None)."},
    {"recurrence", rc_py_recurrence, METH_VARARGS,
     "recurrence(lstm, linear_before_reset, reverse, xw, xb, p1, p2, rbn, h0, c, ys,\n"
     "           (seq, ndir, B, H, xld), batch_major, threads)\n"
     "The LSTM (gates i, o, f, c) or GRU (z, r, h) time loop with default activations over\n"
     "C-contiguous float32 buffers, every direction (ndir 2: forward then reverse, in parallel;\n"
     "ndir 1: reverse says which): xw [seq, B, xld] holds direction d's input terms from column\n"
     "d * gates * H, xb (or None) their biases [ndir, gates * H]; p1/p2 are the recurrence\n"
     "weights packed by unit chunks of RECURRENCE_UNITS, per direction. Writes every hidden\n"
     "state into ys [seq, ndir, B, H] ([seq, B, ndir, H] with batch_major) (and the last cell\n"
     "states into c [ndir, B, H])."},
    {"gelu_erf", rc_py_gelu_erf, METH_VARARGS,
     "gelu_erf(x, b, y, (rows, d), tanh_form=False)\n"
     "y = Gelu(x + b) (erf form, or with tanh_form its tanh approximation; b a vector of the d\n"
     "columns, or None) over C-contiguous float32 buffers; y may be x."},
    {"activate", rc_py_activate, METH_VARARGS,
     "activate(x, y, n, kind, alpha=1/6, beta=0.5)\n"
     "y = act(x) over n C-contiguous float32 (y may be x): kind 0 HardSwish (x * hardsigmoid),\n"
     "1 HardSigmoid clip(alpha x + beta, 0, 1), 2 Sigmoid, 3 SiLU (x * sigmoid(x))."},
    {"squeeze_excite", rc_py_squeeze_excite, METH_VARARGS,
     "squeeze_excite(x, w1, b1, w2, b2, y, (N, C, CR, HW), lo, hi, act, act_alpha, act_beta, gate, gate_alpha,\n"
     "gate_beta, threads)\n"
     "y = x * gate(w2 act(clip(w1 mean_hw(x) + b1, lo, hi)) + b2) over C-contiguous float32 (y may be x):\n"
     "w1 [CR][C], w2 [C][CR], b1 / b2 or None; act and gate as activate's kinds, -1 none."},
    {"nchwc_reorder", rc_py_nchwc_reorder, METH_VARARGS,
     "nchwc_reorder(x, y, (N, C, HW), to_blocked, threads)\n"
     "x NCHW [N][C][HW] to y blocked [N][ceil(C/16)][HW][16] (lanes past C zero), or back (to_blocked False)."},
    {"nchwc_pointwise", rc_py_nchwc_pointwise, METH_VARARGS,
     "nchwc_pointwise(x, wp, b, z, y, (N, CIB, COB, P), lo, hi, act, alpha, beta, threads)\n"
     "A 1x1 convolution of blocked x [N][CIB][P][16] into y [N][COB][P][16]: wp the weights as\n"
     "[ceil(COB/2)][CIB*16][32] (the last group [CIB*16][16] when COB is odd), b [COB*16], z None or y's\n"
     "shape (added before the clip to [lo, hi] and the activation: activate's kinds, -1 none). NCHWC only."},
    {"nchwc_depthwise", rc_py_nchwc_depthwise, METH_VARARGS,
     "nchwc_depthwise(x, w, b, y, (N, CB, H, W), (KH, KW), (sh, sw), (pt, pl), (OH, OW), lo, hi, act, alpha, beta,\n"
     "                threads)\n"
     "A depthwise convolution of blocked x [N][CB][H][W][16] into y [N][CB][OH][OW][16], w [CB][KH*KW][16],\n"
     "b [CB*16], dilation 1; the clip and activation as nchwc_pointwise's. NCHWC only."},
    {"nchwc_se", rc_py_nchwc_se, METH_VARARGS,
     "nchwc_se(x, w1, b1, w2, b2, y, (N, CB, C, CR, HW), lo, hi, act, alpha, beta, gate, alpha, beta, threads)\n"
     "Squeeze-excite of blocked x [N][CB][HW][16] as squeeze_excite's (y may be x); w1 None: y [N][C] the\n"
     "means (GlobalAveragePool). NCHWC only."},
    {"nchwc_expand_dw", rc_py_nchwc_expand_dw, METH_VARARGS,
     "nchwc_expand_dw(x, we, be, wd, bd, y, (N, CIB, COB, H, W), (KH, KW), (sh, sw), (pt, pl), (OH, OW),\n"
     "                (lo, hi, act, alpha, beta), (lo, hi, act, alpha, beta), threads)\n"
     "nchwc_depthwise(nchwc_pointwise(x)) without the expanded tensor: we, be as nchwc_pointwise's wp, b,\n"
     "wd, bd as nchwc_depthwise's w, b; the first epilogue the 1x1's, the second the depthwise's. NCHWC only."},
    {"conv2d", rc_py_conv2d, METH_VARARGS,
     "conv2d(x, wp, b, z, y, (N, C, H, W), (M, KH, KW), (sh, sw), (dh, dw), (pt, pl), (OH, OW), lo, hi, threads,\n"
     "       lanes=False, extra=None, act=None)\n"
     "Dense 2-D convolution (group 1) of C-contiguous float32 NCHW buffers into y, plus b and z,\n"
     "clipped to [lo, hi]; wp are the weights packed by CONV_MR output channels\n"
     "([ceil(M / CONV_MR)][C * KH * KW][CONV_MR], zeros past M). Up to threads threads.\n"
     "lanes: output channels in the vector lanes, wp packed by CONV_LANES channels instead and\n"
     "64-byte aligned (for outputs a few columns wide: no column past OW is computed).\n"
     "extra = (wp2, b2, z2, y2, M2, ty, tx, lo2, hi2, lanes2): also a 1x1 convolution of the same\n"
     "strides and output size from the same padded input at window position (ty, tx), packed\n"
     "as its own tiling reads it ([..][C][..]), into y2 (a 1x1 strided shortcut beside a 3x3).\n"
     "act = (kind, alpha, beta): the first convolution's activation after its clip (activate's\n"
     "kinds, -1 none), in the epilogue."},
#if DWF_OK
    {"conv_maxpool", rc_py_conv_maxpool, METH_VARARGS,
     "conv_maxpool(x, wp, b, y, (C, H, W), (M, KH, KW), (sh, sw), (pt, pl), (OH, OW), lo, hi, (POH, POW), threads)\n"
     "One image's dense convolution (conv2d's packing and position tiles, dilation 1, strides 1\n"
     "or 2), plus b, clipped to [lo, hi], then its 3x3 stride-2 MaxPool padded by 1 into y\n"
     "(M x POH x POW), the convolution's output never written whole. AVX-512 only (CONV_FAST)."},
    {"expand_dw", rc_py_expand_dw, METH_VARARGS,
     "expand_dw(w, x, b, lo1, hi1, wd, bd, y, (M, C, H, W), (OH, OW, s, pt, pl), lo, hi, threads,\n"
     "          k=3, act1=(-1, 1/6, 0.5), act=(-1, 1/6, 0.5))\n"
     "One image's 1x1 convolution e = act1(clip(w x + b, lo1, hi1)) (w packed as pointwise_lanes\n"
     "reads it, x C x H x W) and then y = act(clip(depthwise kxk(e, wd, stride s, pads pt, pl) + bd,\n"
     "lo, hi)) (k 3, 5 or 7; wd M x 1 x k x k, y M x OH x OW), e never written whole; act1 and act\n"
     "(kind, alpha, beta) as activate's kinds, -1 none. AVX-512 only (CONV_FAST)."},
#endif
    {"winograd3x3", rc_py_winograd3x3, METH_VARARGS,
     "winograd3x3(x, u, b, z, y, (N, C, H, W), M, (pt, pl), (OH, OW), lo, hi, threads, lanes=False)\n"
     "Dense 3x3 stride-1 convolution (group 1, dilation 1) of C-contiguous float32 NCHW buffers\n"
     "into y as Winograd F(2x2, 3x3), plus b and z, clipped to [lo, hi]; u are the transformed\n"
     "weights G g G^T packed [16][ceil(M / CONV_MR)][C][CONV_MR], zeros past M. lanes: output\n"
     "channels in the vector lanes, u packed [16][ceil(M / CONV_LANES)][C][CONV_LANES] instead\n"
     "and 64-byte aligned."},
    {"gemm_rows", rc_py_gemm_rows, METH_VARARGS,
     "gemm_rows(a, b, y, (R, K, N), trans, threads)\n"
     "y[R][N] = a[R][K] @ B in float32 for a few rows, B = b[N][K] transposed (trans) or\n"
     "b[K][N]; C-contiguous buffers; up to threads threads."},
    {"set_sgemm", rc_py_set_sgemm, METH_O,
     "set_sgemm(capsule) -> path\n"
     "Take the sgemm of scipy.linalg.cython_blas.__pyx_capi__ for pointwise; returns the path of\n"
     "the library it lives in (or None). Its callers keep that library at one thread."},
    {"pointwise", rc_py_pointwise, METH_VARARGS,
     "pointwise(w, x, b, z, y, (M, K, P), lo, hi, threads)\n"
     "y[M][P] = clip(w[M][K] @ x[K][P] + b (+ z), lo, hi) in float32, blocks of y split between\n"
     "the kernel threads, each one single-threaded sgemm (set_sgemm's) and its epilogue."},
    {"layer_norm_cf", rc_py_layer_norm_cf, METH_VARARGS,
     "layer_norm_cf(x, gamma, beta, y, mean, inv_std_var, (n, d, p), eps, threads)\n"
     "LayerNormalization over the d channels of channels-first float32 x [n][d][p], y written\n"
     "[n][p][d] (beta, mean and inv_std_var [n][p] may be None; y must not be x)."},
    {"skip_layer_norm", rc_py_skip_layer_norm, METH_VARARGS,
     "skip_layer_norm(x, skip, gamma, beta, bias, y, mean, inv_std_var, sum, (rows, d, skip_rows), eps, rms=False)\n"
     "SkipLayerNormalization of C-contiguous float32 rows (skip, beta, bias and the outputs mean,\n"
     "inv_std_var and sum may be None: without skip, LayerNormalization; skip row r % skip_rows\n"
     "goes with row r; y may be x or skip). rms: SkipSimplifiedLayerNormalization (no centering,\n"
     "mean written as 0)."},
    {"maxpool2d", rc_py_maxpool2d, METH_VARARGS,
     "maxpool2d(x, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl), threads)\n"
     "MaxPool values of C-contiguous float32 NCHW x into y (taps in the padding skipped)."},
    {"row_means", rc_py_row_means, METH_VARARGS,
     "row_means(x, y, (rows, n), threads=1)\n"
     "y[r] = the mean of row r of the C-contiguous float32 x read as rows x n (GlobalAveragePool)."},
    {"linear", rc_py_linear, METH_VARARGS,
     "linear(a, w, bias, y, (R, K, N), threads, packed=True, lo=-inf, hi=inf)\n"
     "y (R x N) = clip(a (R x K) w (+ bias), lo, hi) in float32 on the kernel threads, w packed as\n"
     "[ceil(N / 32)][K][32] (64-byte aligned, zeros past N), or (packed false) w itself, K x N."},
    {"pointwise_lanes", rc_py_pointwise_lanes, METH_VARARGS,
     "pointwise_lanes(wp, x, b, z, y, (M, C, P), lo, hi, threads, act=-1, alpha=1/6, beta=0.5, N=1)\n"
     "y (M x P) = act(clip(w x + b (+ z), lo, hi)) in float32 on the kernel threads, w packed in\n"
     "12-row panels [ceil(M / 12)][C][12] (zeros past M); N images: x N x C x P, y and z N x M x P."},
    {"pointwise_rows", rc_py_pointwise_rows, METH_VARARGS,
     "pointwise_rows(wp, x, b, z, y, (M, C, H, W), (sh, sw), lo, hi, threads, act=-1, alpha=1/6, beta=0.5, N=1)\n"
     "A 1x1 convolution (no pads) of N images x (N x C x H x W), strides sh, sw: y (N x M x OH x OW)\n"
     "= act(clip(w x + b (+ z), lo, hi)) in float32 on the kernel threads, the positions in 12-row\n"
     "panels, w packed as linear's [ceil(M / 32)][C][32] (64-byte aligned, zeros past M)."},
    {"mha", rc_py_mha, METH_VARARGS,
     "mha(qkv, (B, S, W, oq, ok, ov), (H, dq, dv), scale, causal, mask, mask_dims, bias, bias_dims, y, threads,\n"
     "    tiles=False)\n"
     "Multi-head attention from the projected (B, S, W) float32 qkv (heads' columns from oq, ok,\n"
     "ov): softmax(q k^T * scale + mask [causal cut] + bias) v into y (B, S, H * dv); mask and bias\n"
     "(or None) are float32 (db, dh, ds, S) with each d 1 or full. Single-threaded sgemm calls\n"
     "(set_sgemm's) on the kernel threads, a unit a (batch, head, block of rows); with tiles (on an\n"
     "AVX-512 CPU, dv a multiple of 32) the Linear's 12 x 32 tiles instead, a unit 12 query rows."},
    {"bmm", rc_py_bmm, METH_VARARGS,
     "bmm(a, b, y, (batch, M, K, N, a_batched, b_batched), transA, transB, alpha, threads)\n"
     "y[i] (M x N) = alpha * op(a[i]) op(b[i]) for C-contiguous float32 row-major matrices (op: the\n"
     "transpose where asked, read in place; a or b without a batch broadcast), on the kernel\n"
     "threads, a unit a (matrix, block of rows), each a single-threaded sgemm (set_sgemm's)."},
    {"sdpa", rc_py_sdpa, METH_VARARGS,
     "sdpa(q, k, v, (BH, S, d), scale, bias, bias_dims, y, threads)\n"
     "softmax(q k^T * scale + bias) v for each of BH heads of C-contiguous float32 (BH, S, d) q, k,\n"
     "v into y (BH, S, d); bias (or None) float32 (db, 1, ds, S), db 1 or BH, ds 1 or S. A unit a\n"
     "(head, block of rows) on the kernel threads, single-threaded sgemm calls (set_sgemm's)."},
    {"cpu_isa", rc_py_cpu_isa, METH_NOARGS, "cpu_isa() -> {flag: bool}: the ISA extensions CPUID reports here."},
    {"fma_peak", rc_py_fma_peak, METH_VARARGS,
     "fma_peak(threads, iters) -> (flops, lanes, seconds)\n"
     "This CPU's float32 multiply-add rate, measured: threads threads each run iters steps of 12\n"
     "independent FMA chains in the widest vectors it has (lanes floats); flop/s of all together,\n"
     "each thread timed by its own CPU time (other processes on the cores do not lower it)."},
    {"softmax", rc_py_softmax, METH_VARARGS,
     "softmax(z, (rows, t), inf_nan=0, threads=1)\n"
     "The softmax of every row of t floats of the C-contiguous float32 buffer z, in place, on up to\n"
     "threads threads; inf_nan: a row holding +inf becomes NaN (the Softmax op's arithmetic)."},
    {"pool_stats", rc_py_pool_stats, METH_NOARGS,
     "pool_stats() -> (workers, last_threads, runs, skipped, started, stalls, jobs, alone, job_ns,\n"
     "wait_ns, load_alone, gate_waited, gate_wait_ns, gate_admitted, gate_queued)\n"
     "The kernel thread pool's started workers, how many threads ran the last pooled job, the\n"
     "runs in flight (run_enter scopes), the parts skipped for a stop flag and the parts of\n"
     "jobs asking for several threads (run alone or not) started so far, and the stalls seen\n"
     "(a caller waiting on workers so long that it would have done the job sooner alone); the\n"
     "jobs opened to workers, those no worker ran a part of, their wall time and their callers'\n"
     "waits on workers after their own parts (ns), and the jobs run on their caller alone for\n"
     "the machine's load (pool_load_rule); the runs that waited for the gate (run_enter) so\n"
     "far and their waits (ns), and the runs holding a slot of it and waiting for one now."},
    {"pool_load_rule", (PyCFunction)(void (*)(void))rc_py_pool_load_rule, METH_VARARGS | METH_KEYWORDS,
     "pool_load_rule(on=None, others=None) -> (on, others) before\n"
     "Whether a pool job runs on its caller alone while other processes' runnable threads fill\n"
     "the cores (at least one a core, fewer than two; RUNTIME_CORE_CPU_POOL_LOAD=0 turns it\n"
     "off), and how many of them to assume (-1: read /proc/loadavg, at most every 10 ms; a\n"
     "count: tests). None leaves a setting as it is."},
    {"pool_load_full", rc_py_pool_load_full, METH_NOARGS,
     "pool_load_full() -> whether a pool job opened now would run on its caller alone for the\n"
     "machine's load (the count read now)."},
    {"pool_probe", rc_py_pool_probe, METH_VARARGS,
     "pool_probe(counts, threads, stall_us, part_us=0) -> parts that pool workers ran\n"
     "A pool job of one part an int32 of counts, each adding 1 to its own after sleeping part_us;\n"
     "a part a worker runs first sleeps stall_us more (a worker descheduled mid-part): for the\n"
     "tests of the pool."},
    {"run_solo", rc_py_run_solo, METH_O,
     "run_solo(on) -> before\n"
     "Whether the pool jobs this thread opens run on it alone (True) or on the pool (False);\n"
     "returns the setting before."},
    {"run_enter", (PyCFunction)(void (*)(void))rc_py_run_enter, METH_VARARGS | METH_KEYWORDS,
     "run_enter(flag, limit=-1, joined=False) -> scope, or None\n"
     "Until run_exit(scope), this thread's kernels skip their parts not started once flag's\n"
     "first byte is nonzero (flag: a writable buffer, or None to keep the enclosing scope's);\n"
     "a thread's outermost scope counts as a run in flight, which the pool shares its cores with.\n"
     "An outermost scope not joined (a thread working for a run already admitted) first waits,\n"
     "the GIL released and first come first served, while limit runs are in flight (-1:\n"
     "run_gate's; 0: no limit); None when flag was set while it waited (nothing entered)."},
    {"run_gate", rc_py_run_gate, METH_VARARGS,
     "run_gate(limit=None) -> the limit before\n"
     "The runs in flight (run_enter, limit -1) past which a run waits: by default the cores the\n"
     "process may use, or RUNTIME_CORE_CPU_MAX_RUNS; 0: no limit. None reads it."},
    {"sgemm", rc_py_sgemm, METH_VARARGS,
     "sgemm(a, b, y, (M, K, N), threads, trans_b=False)\n"
     "y[M][N] = a[M][K] @ b[K][N] in float32 (C-contiguous; b given as [N][K] with trans_b) as tiles of y\n"
     "on the kernel threads,\n"
     "each one single-threaded sgemm (set_sgemm's)."},
    {"run_exit", rc_py_run_exit, METH_O,
     "run_exit(scope)\n"
     "End the innermost run_enter scope of this thread."},
    {"tree_leaves", rc_py_tree_leaves, METH_VARARGS,
     "tree_leaves(X, nodes, roots, out, (n, c, L, t), itemsize, depth, mode, nan_check)\n"
     "The node every row of X reaches in every tree (out[tree, row]) over C-contiguous buffers:\n"
     "X of the item size (4: float32, 8: float64), nodes L packed nodes (16 or 24 bytes: see\n"
     "rc_node_f / rc_node_d), roots and out int64."},
    {"tree_sums", rc_py_tree_sums, METH_VARARGS,
     "tree_sums(X, nodes, roots, reached, weights, sums, (n, c, L, t, k), itemsize, depth, mode, nan_check,\n"
     "threads)\n"
     "tree_leaves into reached (t x n int64), then sums[row, :] = the weights[node, :] (L x k, the\n"
     "item size's float) of the node the row reaches, added tree after tree; rows split over up to\n"
     "threads threads of the kernel pool where the walk is long enough to pay for them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "Fused CPU kernels of runtime-provider-cpu.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    pthread_atfork(NULL, NULL, rc_pool_forked);
    rc_cpu_init();
    if (rc_isa_cap < 0) {
        PyErr_Format(PyExc_ValueError, "RUNTIME_CORE_CPU_ISA=%s: expected avx512, avx2 or baseline (or unset)",
                     getenv("RUNTIME_CORE_CPU_ISA"));
        return NULL;
    }
    rc_int8_init();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "RECURRENCE_UNITS", RC_U) < 0 ||
              PyModule_AddIntConstant(m, "CONV_MR", CV_MR) < 0 ||
              PyModule_AddIntConstant(m, "CONV_LANES", CT_MR) < 0 ||
              PyModule_AddIntConstant(m, "CONV_FAST", rc_conv_fast) < 0 ||
              PyModule_AddIntConstant(m, "NCHWC", rc_nchwc_ok()) < 0 ||
              PyModule_AddIntConstant(m, "NBITS_DOT_ROWS", RC_NBITS_DOT_ROWS) < 0 ||
              PyModule_AddIntConstant(m, "NBITS_INT8_FAST", rc_nbits_int8_fast()) < 0 ||
              PyModule_AddStringConstant(m, "AMX_INT8", rc_amx_why) < 0 ||
              PyModule_AddStringConstant(m, "CPU_ISA", rc_isa_name) < 0 ||
              PyModule_AddStringConstant(m, "LINEAR_TILES", !rc_ln_tiles ? "avx512"
                                         : rc_ln_tiles == ln_tiles_avx2 ? "avx2" : "baseline") < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
