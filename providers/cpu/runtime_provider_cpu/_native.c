/* runtime_provider_cpu._native: the few CPU kernels that numpy cannot express without one
 * full memory pass per step.
 *
 * depthwise2d: a 2-D depthwise convolution (one input and one output channel per group) in
 * float32, with the bias and a clip activation (Relu, Clip/ReLU6, or none) fused into the
 * same pass. numpy needs one multiply and one add over the whole image per kernel tap (18
 * passes for a 3x3 kernel); here each channel is padded once into a small scratch plane that
 * stays in cache and every output pixel is finished in registers.
 *
 * Every buffer is checked against the shape it is said to have before anything is read, and
 * the GIL is released while the kernel runs. Called from runtime_provider_cpu.ops.nn, which
 * makes the arrays C-contiguous float32 first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one x86-64-v3 (AVX2 + FMA) build and one baseline build, picked at load time by the CPU */
#define RC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define RC_CLONES
#endif

static inline float clipf(float v, float lo, float hi)
{
    /* NaN stays NaN (both comparisons are false), as numpy's maximum / clip keep it */
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/* one channel: xp is the padded plane [Hp, Wp]; y the output plane [OH, OW] */
RC_CLONES
static void dw_plane(const float *restrict xp, Py_ssize_t Wp, const float *restrict wk,
                     Py_ssize_t KH, Py_ssize_t KW, float bias, float *restrict y,
                     Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw,
                     Py_ssize_t dh, Py_ssize_t dw, float lo, float hi)
{
    if (KH == 3 && KW == 3 && dh == 1 && dw == 1 && (sw == 1 || sw == 2)) {
        const float w0 = wk[0], w1 = wk[1], w2 = wk[2], w3 = wk[3], w4 = wk[4], w5 = wk[5],
                    w6 = wk[6], w7 = wk[7], w8 = wk[8];
        for (Py_ssize_t oy = 0; oy < OH; oy++) {
            const float *r0 = xp + oy * sh * Wp, *r1 = r0 + Wp, *r2 = r1 + Wp;
            float *row = y + oy * OW;
            if (sw == 1) {
                for (Py_ssize_t ox = 0; ox < OW; ox++) {
                    float v = bias + w0 * r0[ox] + w1 * r0[ox + 1] + w2 * r0[ox + 2]
                              + w3 * r1[ox] + w4 * r1[ox + 1] + w5 * r1[ox + 2]
                              + w6 * r2[ox] + w7 * r2[ox + 1] + w8 * r2[ox + 2];
                    row[ox] = clipf(v, lo, hi);
                }
            } else {
                /* stride 2 reads every other column; splitting the rows into even and odd
                   columns first was measured no faster (the input read dominates) */
                for (Py_ssize_t ox = 0; ox < OW; ox++) {
                    const Py_ssize_t i = 2 * ox;
                    float v = bias + w0 * r0[i] + w1 * r0[i + 1] + w2 * r0[i + 2]
                              + w3 * r1[i] + w4 * r1[i + 1] + w5 * r1[i + 2]
                              + w6 * r2[i] + w7 * r2[i + 1] + w8 * r2[i + 2];
                    row[ox] = clipf(v, lo, hi);
                }
            }
        }
        return;
    }
    /* any other kernel: one multiply-add per tap over an output row that stays in L1 */
    for (Py_ssize_t oy = 0; oy < OH; oy++) {
        float *row = y + oy * OW;
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = bias;
        for (Py_ssize_t ky = 0; ky < KH; ky++) {
            const float *src = xp + (oy * sh + ky * dh) * Wp;
            for (Py_ssize_t kx = 0; kx < KW; kx++) {
                const float wv = wk[ky * KW + kx];
                const float *s = src + kx * dw;
                if (sw == 1) {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox];
                } else {
                    for (Py_ssize_t ox = 0; ox < OW; ox++)
                        row[ox] += wv * s[ox * sw];
                }
            }
        }
        for (Py_ssize_t ox = 0; ox < OW; ox++)
            row[ox] = clipf(row[ox], lo, hi);
    }
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t n_floats,
                      const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->len != n_floats * (Py_ssize_t)sizeof(float) || view->itemsize != sizeof(float)) {
        PyErr_Format(PyExc_ValueError,
                     "depthwise2d: %s holds %zd bytes of %zd-byte items, expected %zd float32",
                     what, view->len, view->itemsize, n_floats);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *depthwise2d(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *bo, *yo;
    Py_ssize_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    float lo, hi;
    if (!PyArg_ParseTuple(args, "OOOO(nnnn)(nn)(nn)(nn)(nn)(nn)ff:depthwise2d", &xo, &wo, &bo, &yo,
                          &N, &C, &H, &W, &OH, &OW, &KH, &KW, &sh, &sw, &dh, &dw, &pt, &pl, &lo, &hi))
        return NULL;
    if (N < 0 || C < 0 || H < 0 || W < 0 || OH < 0 || OW < 0 || KH < 1 || KW < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: negative or zero size, stride or dilation");
        return NULL;
    }
    /* the padded extent every output reads: rows [-pt, Hp - pt), columns [-pl, Wp - pl) */
    const Py_ssize_t Hp = OH ? (OH - 1) * sh + (KH - 1) * dh + 1 : 0;
    const Py_ssize_t Wp = OW ? (OW - 1) * sw + (KW - 1) * dw + 1 : 0;
    Py_buffer xv, wv, bv, yv;
    if (get_buffer(xo, &xv, 0, N * C * H * W, "X") < 0)
        return NULL;
    if (get_buffer(wo, &wv, 0, C * KH * KW, "W") < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    int has_b = bo != Py_None;
    if (has_b && get_buffer(bo, &bv, 0, C, "B") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&wv);
        return NULL;
    }
    if (get_buffer(yo, &yv, 1, N * C * OH * OW, "Y") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&wv);
        if (has_b)
            PyBuffer_Release(&bv);
        return NULL;
    }
    float *plane = NULL;
    if (Hp * Wp > 0) {
        plane = (float *)malloc((size_t)(Hp * Wp) * sizeof(float));
        if (!plane) {
            PyBuffer_Release(&xv);
            PyBuffer_Release(&wv);
            if (has_b)
                PyBuffer_Release(&bv);
            PyBuffer_Release(&yv);
            return PyErr_NoMemory();
        }
    }
    const float *x = (const float *)xv.buf, *w = (const float *)wv.buf;
    const float *b = has_b ? (const float *)bv.buf : NULL;
    float *y = (float *)yv.buf;
    /* the input rows and columns that land inside the padded plane */
    const Py_ssize_t r0 = pt, r1 = pt + H < Hp ? pt + H : Hp;   /* plane rows holding input */
    const Py_ssize_t c0 = pl, c1 = pl + W < Wp ? pl + W : Wp;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < N && plane; n++) {
        for (Py_ssize_t c = 0; c < C; c++) {
            const float *xc = x + (n * C + c) * H * W;
            if (r0 < r1 && c0 < c1) {
                memset(plane, 0, (size_t)(r0 * Wp) * sizeof(float));
                for (Py_ssize_t r = r0; r < r1; r++) {
                    float *dst = plane + r * Wp;
                    memset(dst, 0, (size_t)c0 * sizeof(float));
                    memcpy(dst + c0, xc + (r - pt) * W, (size_t)(c1 - c0) * sizeof(float));
                    memset(dst + c1, 0, (size_t)(Wp - c1) * sizeof(float));
                }
                memset(plane + r1 * Wp, 0, (size_t)((Hp - r1) * Wp) * sizeof(float));
            } else {
                memset(plane, 0, (size_t)(Hp * Wp) * sizeof(float));
            }
            dw_plane(plane, Wp, w + c * KH * KW, KH, KW, b ? b[c] : 0.0f,
                     y + (n * C + c) * OH * OW, OH, OW, sh, sw, dh, dw, lo, hi);
        }
    }
    Py_END_ALLOW_THREADS
    free(plane);
    PyBuffer_Release(&xv);
    PyBuffer_Release(&wv);
    if (has_b)
        PyBuffer_Release(&bv);
    PyBuffer_Release(&yv);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"depthwise2d", depthwise2d, METH_VARARGS,
     "depthwise2d(x, w, b, y, (N, C, H, W), (OH, OW), (KH, KW), (sh, sw), (dh, dw), (pt, pl), lo, hi)\n"
     "Depthwise 2-D convolution of C-contiguous float32 buffers into y, clipped to [lo, hi]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "Fused CPU kernels of runtime-provider-cpu.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
