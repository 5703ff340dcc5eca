/* Depthwise int8 convolution (QLinearConv with group == C, one output channel per group) on
 * NCHW planes. Each plane is widened once into zero-padded int16 phase planes of (x - zero
 * point) (padding then contributes 0, as zero-point padding does): sh x sw planes, the padded
 * pixel (r, c) in plane (r % sh, c % sw) at (r / sh, c / sw), so that every tap of a strided
 * kernel reads unit-stride rows. With the output rows laid at the phase planes' pitch, a tap is
 * one long multiply-add over the whole plane (a few columns past OW computed and dropped), and
 * the rows are requantized as the numpy path does it: saturate(rint((float)(acc + bias) *
 * mult[c]) + yz). Bit for bit the numpy path's while sum |x - xz| |w - wz| fits in int32
 * (KH * KW < 33000: always for real kernels). */
#include "native.h"

typedef struct {
    const uint8_t *x;      /* N x C x H x W bytes (int8 or uint8) */
    const uint8_t *w;      /* C x KH x KW bytes */
    const int32_t *wz;     /* C, or NULL */
    const int32_t *bias;   /* C, or NULL */
    const float *mult;     /* C */
    uint8_t *y;            /* N x C x OH x OW bytes */
    int16_t *work;         /* parts x wstride int16: phase planes, weights, the accumulator */
    Py_ssize_t wstride;
    Py_ssize_t N, C, H, W, KH, KW, OH, OW, sh, sw, dh, dw, pt, pl, PH, PW;
    Py_ssize_t PHs, PWs, phase; /* a phase plane's rows, pitch and items (with a pitch of slack) */
    int xsigned, wsigned, ysigned, xz, yz;
} qdw_job;

/* acc[q] += wv * r[q] over the plane's n outputs at the phase pitch */
RC_CLONES static void qdw_tap(int32_t *restrict acc, const int16_t *restrict r, int32_t wv, Py_ssize_t n)
{
    for (Py_ssize_t q = 0; q < n; q++)
        acc[q] += (int32_t)r[q] * wv;
}

/* y[o] = saturate(rint((float)(acc[o] + bias) * mult) + yz) as uint8 or int8 */
RC_CLONES static void qdw_store(const int32_t *restrict acc, uint8_t *restrict y, Py_ssize_t n, uint32_t bias,
                                float mult, float yz, float lo, float hi, int ysigned)
{
    for (Py_ssize_t o = 0; o < n; o++) {
        float t = rintf((float)(int32_t)((uint32_t)acc[o] + bias) * mult) + yz;
        t = t < lo ? lo : (t > hi ? hi : t);
        y[o] = ysigned ? (uint8_t)(int8_t)(int32_t)t : (uint8_t)(int32_t)t;
    }
}

/* the plane (x - xz) as int16 into the zeroed phase planes p */
RC_CLONES static void qdw_fill(const uint8_t *restrict x, int16_t *restrict p, const qdw_job *j)
{
    memset(p, 0, sizeof(int16_t) * (size_t)(j->sh * j->sw * j->phase));
    const int16_t xz = (int16_t)j->xz, flip = j->xsigned ? 128 : 0;
    const Py_ssize_t wn = j->W < j->PW - j->pl ? j->W : j->PW - j->pl;
    for (Py_ssize_t h = 0; h < j->H; h++) {
        const Py_ssize_t r = h + j->pt;
        if (r >= j->PH)
            break;
        const uint8_t *xr = x + h * j->W;
        int16_t *pr = p + (r % j->sh) * j->sw * j->phase + (r / j->sh) * j->PWs;
        if (j->sw == 1) {
            pr += j->pl;
            for (Py_ssize_t i = 0; i < wn; i++)  /* an s8 byte read as (b ^ 0x80) - 128 */
                pr[i] = (int16_t)((int16_t)(uint8_t)(xr[i] ^ (uint8_t)flip) - flip - xz);
        } else
            for (Py_ssize_t ph = 0; ph < j->sw; ph++) {  /* column phase ph: no division per pixel */
                Py_ssize_t i = ((ph - j->pl) % j->sw + j->sw) % j->sw;
                int16_t *d = pr + ph * j->phase + (i + j->pl) / j->sw;
                for (; i < wn; i += j->sw)
                    *d++ = (int16_t)((int16_t)(uint8_t)(xr[i] ^ (uint8_t)flip) - flip - xz);
            }
    }
}

static void qdw_part(void *arg, int part, int parts)
{
    const qdw_job *j = (const qdw_job *)arg;
    const Py_ssize_t planes = j->N * j->C, p0 = planes * part / parts, p1 = planes * (part + 1) / parts;
    const Py_ssize_t KK = j->KH * j->KW, nq = j->OH * j->PWs;
    int16_t *pad = j->work + (Py_ssize_t)part * j->wstride;
    int16_t *wc = pad + j->sh * j->sw * j->phase;
    int32_t *acc = (int32_t *)(wc + ((KK + 1) & ~(Py_ssize_t)1));
    const float lo = j->ysigned ? -128.0f : 0.0f, hi = j->ysigned ? 127.0f : 255.0f;
    for (Py_ssize_t pl = p0; pl < p1; pl++) {
        const Py_ssize_t c = pl % j->C;
        qdw_fill(j->x + pl * j->H * j->W, pad, j);
        const int32_t wz = j->wz ? j->wz[c] : 0;
        const uint8_t *wr = j->w + c * KK;
        for (Py_ssize_t k = 0; k < KK; k++)
            wc[k] = (int16_t)((j->wsigned ? (int32_t)(int8_t)wr[k] : (int32_t)wr[k]) - wz);
        memset(acc, 0, sizeof(int32_t) * (size_t)nq);
        for (Py_ssize_t i = 0; i < j->KH; i++)
            for (Py_ssize_t t = 0; t < j->KW; t++) {
                const Py_ssize_t r = i * j->dh, q = t * j->dw;
                const int16_t *src = pad + ((r % j->sh) * j->sw + q % j->sw) * j->phase + (r / j->sh) * j->PWs
                                     + q / j->sw;
                qdw_tap(acc, src, wc[i * j->KW + t], nq);
            }
        const uint32_t b = j->bias ? (uint32_t)j->bias[c] : 0u;
        uint8_t *y = j->y + pl * j->OH * j->OW;
        for (Py_ssize_t oh = 0; oh < j->OH; oh++)
            qdw_store(acc + oh * j->PWs, y + oh * j->OW, j->OW, b, j->mult[c], (float)j->yz, lo, hi, j->ysigned);
    }
}

/* qdwconv(x, x_signed, xz, w, w_signed, wz, bias, mult, y, y_signed, yz,
 *         (N, C, H, W), (KH, KW), (OH, OW), (sh, sw), (dh, dw), (pt, pl), threads) */
PyObject *rc_py_qdwconv(PyObject *self, PyObject *args)
{
    PyObject *xo, *wo, *wzo, *bo, *mo, *yo;
    int xs, ws, ys, xz, yz, threads;
    qdw_job j;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OpiOpOOOOpi(nnnn)(nn)(nn)(nn)(nn)(nn)i:qdwconv", &xo, &xs, &xz, &wo, &ws, &wzo, &bo,
                          &mo, &yo, &ys, &yz, &j.N, &j.C, &j.H, &j.W, &j.KH, &j.KW, &j.OH, &j.OW, &j.sh, &j.sw,
                          &j.dh, &j.dw, &j.pt, &j.pl, &threads))
        return NULL;
    if (j.N < 1 || j.C < 1 || j.H < 1 || j.W < 1 || j.KH < 1 || j.KW < 1 || j.OH < 1 || j.OW < 1 || j.sh < 1
        || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.pt < 0 || j.pl < 0 || j.KH * j.KW >= 33000
        || xz < (xs ? -128 : 0) || xz > (xs ? 127 : 255) || yz < (ys ? -128 : 0) || yz > (ys ? 127 : 255)) {
        PyErr_SetString(PyExc_ValueError, "qdwconv: sizes, strides and dilations must be positive, pads not "
                                          "negative, KH * KW < 33000 and the zero points in their types' ranges");
        return NULL;
    }
    rc_sz sz = {NULL};
    j.PH = sz_extent(&sz, "the padded height", j.OH, j.sh, j.KH, j.dh);
    j.PW = sz_extent(&sz, "the padded width", j.OW, j.sw, j.KW, j.dw);
    const Py_ssize_t xn = sz_mul4(&sz, "X's size", j.N, j.C, j.H, j.W);
    const Py_ssize_t yn = sz_mul4(&sz, "Y's size", j.N, j.C, j.OH, j.OW);
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", j.C, j.KH, j.KW);
    j.PHs = (j.PH + j.sh - 1) / j.sh;
    j.PWs = (j.PW + j.sw - 1) / j.sw;
    /* a phase plane, with a row of slack: the dropped columns of the last output row read past it */
    j.phase = sz_mul(&sz, "the work size", j.PHs + 1, j.PWs);
    /* the phase planes, the weights (even count: the accumulator stays 4-byte aligned), the
     * accumulator of OH rows at the phase pitch */
    j.wstride = sz_add(&sz, "the work size",
                       sz_add(&sz, "the work size", sz_mul3(&sz, "the work size", j.sh, j.sw, j.phase),
                              ((j.KH * j.KW + 1) & ~(Py_ssize_t)1)),
                       sz_mul3(&sz, "the work size", j.OH, j.PWs, 2));
    j.wstride = (j.wstride + 31) & ~(Py_ssize_t)31; /* each part's area on its own cache lines */
    if (sz_check(&sz, "qdwconv", PyExc_ValueError) < 0)
        return NULL;
    const Py_ssize_t planes = j.N * j.C;
    const int parts = rc_parts(2.0 * (double)yn * (double)(j.KH * j.KW), 2.5e5, planes, &threads);
    const Py_ssize_t workn = sz_mul3(&sz, "the work size", parts, j.wstride, 2);
    if (sz_check(&sz, "qdwconv", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[6];
    const rc_buf spec[6] = {{xo, xn, 1, 0, 0, "x"}, {wo, wn, 1, 0, 0, "w"}, {wzo, j.C, 4, 0, 1, "wz"},
                            {bo, j.C, 4, 0, 1, "bias"}, {mo, j.C, RC_F32, 0, 0, "mult"}, {yo, yn, 1, 1, 0, "y"}};
    if (get_buffers("qdwconv", spec, v, 6) < 0)
        return NULL;
    j.x = (const uint8_t *)v[0].buf;
    j.w = (const uint8_t *)v[1].buf;
    j.wz = (const int32_t *)v[2].buf;
    j.bias = (const int32_t *)v[3].buf;
    j.mult = (const float *)v[4].buf;
    j.y = (uint8_t *)v[5].buf;
    j.xsigned = xs, j.wsigned = ws, j.ysigned = ys, j.xz = xz, j.yz = yz;
    j.work = (int16_t *)rc_work((size_t)workn);
    const int oom = j.work == NULL;
    if (!oom) {
        Py_BEGIN_ALLOW_THREADS
        rc_parallel(qdw_part, &j, parts, threads);
        Py_END_ALLOW_THREADS
        rc_work_done(j.work, (size_t)workn);
    }
    release_buffers(v, 6);
    if (oom)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}
