/* linear (y = a w, w packed once or a chunk at a time) and pointwise_lanes (a 1x1 convolution)
 * on 12 x 32 register tiles over the kernel threads, the epilogue in registers. */
#include "native.h"

/* ---------------------------------------------------------------------------------------
 * linear: y (R x N) = a (R x K) w (K x N) (+ bias), w packed once as [ceil(N / 32)][K][32]
 * (ops/nn._pack_linear, 64-byte aligned), or given as it is (K x N) and packed a chunk at a
 * time. The rows of a are first packed in 12-row panels [ceil(R / 12)][K][12] (zeros past
 * R), shared by the threads; then each unit (a 32-column
 * panel of y and a block of row panels) sums K in chunks of at most LN_KC terms whose 32 KB
 * of weights stay in L1 while every row panel of the block passes over them, 12 rows x 32
 * columns in 24 AVX-512 accumulators, each step two weight vectors and 12 broadcasts
 * (prepacked as MLAS does; threaded OpenBLAS was slower and its workers spun through the
 * nodes between two GEMMs: docs/performance.md).
 * --------------------------------------------------------------------------------------- */

/* c[p][0 .. 32) = sum over k of ap[k * 12 + p] * wp[k * ldw + ...], plus (init ? bias (or 0) :
 * what c[p] holds), then e's epilogue when given; and npf rows of 128 bytes from pf (pfs
 * bytes apart) asked into L2, one a step */
/* one term k of a tile: two weight vectors, NP broadcasts, 2 NP multiply-adds */
#define LN_STEP(NP, k)                                                                           \
    do {                                                                                         \
        const v16f w0_ = *(const v16f_u *)(wp + ldw * (k));                                      \
        const v16f w1_ = *(const v16f_u *)(wp + ldw * (k) + 16);                                 \
        for (int p_ = 0; p_ < NP; p_++) {                                                        \
            const v16f x_ = cv_bcast(ap[LN_RP * (k) + p_]);                                      \
            acc[p_][0] += x_ * w0_;                                                              \
            acc[p_][1] += x_ * w1_;                                                              \
        }                                                                                        \
    } while (0)

/* a tile's end: what c holds or the bias added, the epilogue, the stores */
#define LN_EPILOGUE(NP)                                                                          \
    do {                                                                                         \
        if (!init)                                                                               \
            for (int p = 0; p < NP; p++) {                                                       \
                acc[p][0] += *(const v16f_u *)(c + p * ldc);                                     \
                acc[p][1] += *(const v16f_u *)(c + p * ldc + 16);                                \
            }                                                                                    \
        if (e) {                                                                                 \
            const v16f lo = cv_bcast(e->lo), hi = cv_bcast(e->hi);                               \
            for (int p = 0; p < NP; p++)                                                         \
                for (int v = 0; v < 2; v++) {                                                    \
                    v16f t = acc[p][v] + cv_bcast(e->rb ? e->rb[p] : 0.0f);                      \
                    if (init && bias)                                                            \
                        t += *(const v16f_u *)(bias + 16 * v);                                   \
                    if (e->z)                                                                    \
                        t += *(const v16f_u *)(e->z + p * e->ldz + 16 * v);                      \
                    t = v16_clip(t, lo, hi);                                                     \
                    *(v16f_u *)(c + p * ldc + 16 * v) = e->act ? rc_act16(t, e->act) : t;        \
                }                                                                                \
        } else if (!init || !bias)                                                               \
            for (int p = 0; p < NP; p++) {                                                       \
                *(v16f_u *)(c + p * ldc) = acc[p][0];                                            \
                *(v16f_u *)(c + p * ldc + 16) = acc[p][1];                                       \
            }                                                                                    \
        else                                                                                     \
            for (int p = 0; p < NP; p++) {                                                       \
                *(v16f_u *)(c + p * ldc) = acc[p][0] + *(const v16f_u *)bias;                    \
                *(v16f_u *)(c + p * ldc + 16) = acc[p][1] + *(const v16f_u *)(bias + 16);        \
            }                                                                                    \
    } while (0)

/* the Linear's own tiles: as LN_TILE, but the npf rows of 128 bytes asked into L2 are spread
   evenly over the kn steps, one every kn / npf steps (at least one a step): asked in a burst,
   one a step, the requests for weights that come from L3 or memory waited on the core's few
   line fill buffers, and a Linear whose weights were not in L2 ran 8-12% slower than the
   same call repeated (docs/performance.md) */
#define LN_PTILE(NP)                                                                             \
    CV_CLONES static void ln_ptile##NP(const float *restrict ap, const float *restrict wp,         \
                                       Py_ssize_t kn, Py_ssize_t ldw, float *restrict c,           \
                                       Py_ssize_t ldc, const float *restrict bias, int init,       \
                                       const char *pf, Py_ssize_t pfs, Py_ssize_t npf,             \
                                       const ln_epi *e)                                            \
    {                                                                                            \
        v16f acc[NP][2];                                                                         \
        for (int p = 0; p < NP; p++) {                                                           \
            acc[p][0] = (v16f){0};                                                               \
            acc[p][1] = (v16f){0};                                                               \
        }                                                                                        \
        /* up to 8 rows 4 steps a pass, a prefetch of per rows every evb passes; more rows a   \
           step a pass, one row every evb steps (GCC's unrolled loop spilled their             \
           accumulators) */                                                                    \
        const Py_ssize_t q = NP <= 8 ? 4 : 1, nb = kn / q;                                       \
        Py_ssize_t left = nb > 0 && npf > 0 ? npf : 0;                                           \
        const Py_ssize_t per = left > nb ? (left + nb - 1) / nb : 1;                             \
        const Py_ssize_t evb = left > 0 && left < nb ? nb / left : 1;                            \
        Py_ssize_t cnt = 1, k = 0;                                                               \
        _Pragma("GCC unroll 1") for (; k + q <= kn; k += q) {                                    \
            if (left > 0 && --cnt == 0) {                                                        \
                for (Py_ssize_t i = 0; i < per && i < left; i++) {                               \
                    __builtin_prefetch(pf, 0, 2);                                                \
                    __builtin_prefetch(pf + 64, 0, 2);                                           \
                    pf += pfs;                                                                   \
                }                                                                                \
                left -= per;                                                                     \
                cnt = evb;                                                                       \
            }                                                                                    \
            LN_STEP(NP, k);                                                                      \
            if (NP <= 8) {                                                                       \
                LN_STEP(NP, k + 1);                                                              \
                LN_STEP(NP, k + 2);                                                              \
                LN_STEP(NP, k + 3);                                                              \
            }                                                                                    \
        }                                                                                        \
        _Pragma("GCC unroll 1") for (; k < kn; k++) LN_STEP(NP, k);                              \
        LN_EPILOGUE(NP);                                                                         \
    }

#define LN_TILE(NP)                                                                              \
    CV_CLONES static void ln_tile##NP(const float *restrict ap, const float *restrict wp,          \
                                      Py_ssize_t kn, Py_ssize_t ldw, float *restrict c,            \
                                      Py_ssize_t ldc,                                              \
                                      const float *restrict bias, int init, const char *pf,        \
                                      Py_ssize_t pfs, Py_ssize_t npf, const ln_epi *e)             \
    {                                                                                            \
        /* from zeros, what c holds (or the bias) added at the end: the accumulators stay in \
           registers (loaded before the loop, GCC moved them through the stack) */              \
        v16f acc[NP][2];                                                                         \
        for (int p = 0; p < NP; p++) {                                                           \
            acc[p][0] = (v16f){0};                                                               \
            acc[p][1] = (v16f){0};                                                               \
        }                                                                                        \
        /* the steps that prefetch first, then the rest without the test; tiles of up to 8   \
           rows unrolled by 4 (more rows: GCC's unrolled loop rotated and spilled the 24      \
           accumulators, docs/performance.md) */                                              \
        const Py_ssize_t kp = npf < 0 ? 0 : npf < kn ? npf : kn;                                 \
        Py_ssize_t k = 0;                                                                        \
        for (; k < kp; k++) {                                                                    \
            __builtin_prefetch(pf, 0, 2);                                                        \
            __builtin_prefetch(pf + 64, 0, 2);                                                   \
            pf += pfs;                                                                           \
            LN_STEP(NP, k);                                                                      \
        }                                                                                        \
        if (NP <= 8) {                                                                           \
            _Pragma("GCC unroll 4") for (; k < kn; k++) LN_STEP(NP, k);                          \
        } else                                                                                   \
            for (; k < kn; k++)                                                                  \
                LN_STEP(NP, k);                                                                  \
        LN_EPILOGUE(NP);                                                                         \
    }
LN_TILE(1)
LN_TILE(2)
LN_TILE(3)
LN_TILE(4)
LN_TILE(5)
LN_TILE(6)
LN_TILE(7)
LN_TILE(8)
LN_TILE(9)
LN_TILE(10)
LN_TILE(11)
LN_TILE(12)
const ln_tile_f ln_tiles[LN_RP + 1] = {NULL, ln_tile1, ln_tile2, ln_tile3, ln_tile4,
                                              ln_tile5, ln_tile6, ln_tile7, ln_tile8, ln_tile9,
                                              ln_tile10, ln_tile11, ln_tile12};
LN_PTILE(1)
LN_PTILE(2)
LN_PTILE(3)
LN_PTILE(4)
LN_PTILE(5)
LN_PTILE(6)
LN_PTILE(7)
LN_PTILE(8)
LN_PTILE(9)
LN_PTILE(10)
LN_PTILE(11)
LN_PTILE(12)
static const ln_tile_f ln_ptiles[LN_RP + 1] = {NULL, ln_ptile1, ln_ptile2, ln_ptile3, ln_ptile4,
                                               ln_ptile5, ln_ptile6, ln_ptile7, ln_ptile8, ln_ptile9,
                                               ln_ptile10, ln_ptile11, ln_ptile12};

#if DWF_OK
/* GCC's code for the 12-row tile, unrolled, moved the next step's loads into registers the 24
   accumulators needed and spilled them (and the loop's pointer steps and branch, once a step,
   took issue slots of the two FMA ports): here passes of eight steps in asm, the accumulators
   its operands, the two weight vectors and the broadcast three fixed registers that the core
   renames; the weights (ldw 32) and the rows addressed by constant offsets, so that a pass has
   three scalar instructions besides its 192 multiply-adds (a scalar instruction may issue on
   an FMA port) */
#define LN_ASM_FMA(S, p, a0, a1)                                                                 \
    "vbroadcastss " #p "*4+" #S "*48(%[a]), %%zmm2\n\t"                                          \
    "vfmadd231ps %%zmm2, %%zmm0, %%zmm" #a0 "\n\t"                                               \
    "vfmadd231ps %%zmm2, %%zmm1, %%zmm" #a1 "\n\t"
/* a step's weights asked into L1 16 steps ahead (LN_ASM_WPF; or not, LN_ASM_NOPF): the row
   panels' order (ln_part_panels) streams them from L2, or from L3 on its first panel */
#define LN_ASM_WPF(S) "prefetcht0 " #S "*128+2048(%[w])\n\tprefetcht0 " #S "*128+2112(%[w])\n\t"
#define LN_ASM_NOPF(S)
#define LN_ASM_STEP(S, PF)                                                                       \
    PF(S)                                                                                        \
    "vmovups " #S "*128(%[w]), %%zmm0\n\t"                                                       \
    "vmovups " #S "*128+64(%[w]), %%zmm1\n\t"                                                    \
    LN_ASM_FMA(S, 0, 8, 9) LN_ASM_FMA(S, 1, 10, 11) LN_ASM_FMA(S, 2, 12, 13)                     \
    LN_ASM_FMA(S, 3, 14, 15) LN_ASM_FMA(S, 4, 16, 17) LN_ASM_FMA(S, 5, 18, 19)                   \
    LN_ASM_FMA(S, 6, 20, 21) LN_ASM_FMA(S, 7, 22, 23) LN_ASM_FMA(S, 8, 24, 25)                   \
    LN_ASM_FMA(S, 9, 26, 27) LN_ASM_FMA(S, 10, 28, 29) LN_ASM_FMA(S, 11, 30, 31)
/* a pass, MID between its halves */
#define LN_ASM_PASS(PF, MID)                                                                     \
    LN_ASM_STEP(0, PF) LN_ASM_STEP(1, PF) LN_ASM_STEP(2, PF) LN_ASM_STEP(3, PF)                  \
    MID LN_ASM_STEP(4, PF) LN_ASM_STEP(5, PF) LN_ASM_STEP(6, PF) LN_ASM_STEP(7, PF)              \
    "add $1024, %[w]\n\t"                                                                        \
    "add $384, %[a]\n\t"
/* a prefetch point: the next row (two: pf2 set) of the rows at pf asked into L2 */
#define LN_ASM_RPF                                                                               \
    "prefetcht1 (%[pf])\n\t"                                                                     \
    "prefetcht1 64(%[pf])\n\t"                                                                   \
    "prefetcht1 (%[pf], %[pf2])\n\t"                                                             \
    "prefetcht1 64(%[pf], %[pf2])\n\t"                                                           \
    "add %[pfstep], %[pf]\n\t"
#define LN_ASM_ZERO(r) "vpxord %%zmm" #r ", %%zmm" #r ", %%zmm" #r "\n\t"
#define LN_ASM_OUT(r, i) "vmovups %%zmm" #r ", " #i "*64(%[o])\n\t"
/* row p of the tile: c = the accumulators + src (the bias, or what c holds), both rows on */
#define LN_ASM_ROW(r0, r1)                                                                       \
    "vaddps (%[src]), %%zmm" #r0 ", %%zmm" #r0 "\n\t"                                            \
    "vaddps 64(%[src]), %%zmm" #r1 ", %%zmm" #r1 "\n\t"                                          \
    "vmovups %%zmm" #r0 ", (%[c])\n\t"                                                           \
    "vmovups %%zmm" #r1 ", 64(%[c])\n\t"                                                         \
    "add %[srcs], %[src]\n\t"                                                                    \
    "add %[ldcb], %[c]\n\t"
/* the tile: n passes with a prefetch point each, n2 with two, then nplain passes, then nsteps
   single steps; the sums to o (mode 0) or added to src into c */
#define LN_ASM_TILE(PF)                                                                          \
    __asm__ volatile(                                                                            \
        LN_ASM_ZERO(8) LN_ASM_ZERO(9) LN_ASM_ZERO(10) LN_ASM_ZERO(11) LN_ASM_ZERO(12)            \
        LN_ASM_ZERO(13) LN_ASM_ZERO(14) LN_ASM_ZERO(15) LN_ASM_ZERO(16) LN_ASM_ZERO(17)          \
        LN_ASM_ZERO(18) LN_ASM_ZERO(19) LN_ASM_ZERO(20) LN_ASM_ZERO(21) LN_ASM_ZERO(22)          \
        LN_ASM_ZERO(23) LN_ASM_ZERO(24) LN_ASM_ZERO(25) LN_ASM_ZERO(26) LN_ASM_ZERO(27)          \
        LN_ASM_ZERO(28) LN_ASM_ZERO(29) LN_ASM_ZERO(30) LN_ASM_ZERO(31)                          \
        "test %[n], %[n]\n\t"                                                                    \
        "jz 10f\n\t"                                                                             \
        "9:\n\t"                                                                                 \
        LN_ASM_RPF                                                                               \
        LN_ASM_PASS(PF, "")                                                                      \
        "dec %[n]\n\t"                                                                           \
        "jnz 9b\n\t"                                                                             \
        "10:\n\t"                                                                                \
        "mov %[n2], %[n]\n\t"                                                                    \
        "test %[n], %[n]\n\t"                                                                    \
        "jz 2f\n\t"                                                                              \
        "1:\n\t"                                                                                 \
        LN_ASM_RPF                                                                               \
        LN_ASM_PASS(PF, LN_ASM_RPF)                                                              \
        "dec %[n]\n\t"                                                                           \
        "jnz 1b\n\t"                                                                             \
        "2:\n\t"                                                                                 \
        "mov %[nplain], %[n]\n\t"                                                                \
        "test %[n], %[n]\n\t"                                                                    \
        "jz 4f\n\t"                                                                              \
        "3:\n\t"                                                                                 \
        LN_ASM_PASS(PF, "")                                                                      \
        "dec %[n]\n\t"                                                                           \
        "jnz 3b\n\t"                                                                             \
        "4:\n\t"                                                                                 \
        "mov %[nsteps], %[n]\n\t"                                                                \
        "test %[n], %[n]\n\t"                                                                    \
        "jz 6f\n\t"                                                                              \
        "5:\n\t"                                                                                 \
        LN_ASM_STEP(0, LN_ASM_NOPF)                                                              \
        "add $128, %[w]\n\t"                                                                     \
        "add $48, %[a]\n\t"                                                                      \
        "dec %[n]\n\t"                                                                           \
        "jnz 5b\n\t"                                                                             \
        "6:\n\t"                                                                                 \
        "cmpq $0, %[mode]\n\t"                                                                   \
        "jne 7f\n\t"                                                                             \
        LN_ASM_OUT(8, 0) LN_ASM_OUT(9, 1) LN_ASM_OUT(10, 2) LN_ASM_OUT(11, 3) LN_ASM_OUT(12, 4)  \
        LN_ASM_OUT(13, 5) LN_ASM_OUT(14, 6) LN_ASM_OUT(15, 7) LN_ASM_OUT(16, 8)                  \
        LN_ASM_OUT(17, 9) LN_ASM_OUT(18, 10) LN_ASM_OUT(19, 11) LN_ASM_OUT(20, 12)               \
        LN_ASM_OUT(21, 13) LN_ASM_OUT(22, 14) LN_ASM_OUT(23, 15) LN_ASM_OUT(24, 16)              \
        LN_ASM_OUT(25, 17) LN_ASM_OUT(26, 18) LN_ASM_OUT(27, 19) LN_ASM_OUT(28, 20)              \
        LN_ASM_OUT(29, 21) LN_ASM_OUT(30, 22) LN_ASM_OUT(31, 23)                                 \
        "jmp 8f\n\t"                                                                             \
        "7:\n\t"                                                                                 \
        LN_ASM_ROW(8, 9) LN_ASM_ROW(10, 11) LN_ASM_ROW(12, 13) LN_ASM_ROW(14, 15)                \
        LN_ASM_ROW(16, 17) LN_ASM_ROW(18, 19) LN_ASM_ROW(20, 21) LN_ASM_ROW(22, 23)              \
        LN_ASM_ROW(24, 25) LN_ASM_ROW(26, 27) LN_ASM_ROW(28, 29) LN_ASM_ROW(30, 31)              \
        "8:\n\t"                                                                                 \
        : [a] "+r"(a), [w] "+r"(w), [n] "+r"(n), [pf] "+r"(pf), [src] "+r"(src), [c] "+r"(cp)    \
        : [pf2] "r"(pf2), [o] "r"(&acc[0][0]), [pfstep] "rm"(pfstep), [nplain] "rm"(nplain),     \
          [n2] "rm"(n2),                                                                         \
          [nsteps] "rm"(nsteps), [mode] "rm"(mode), [srcs] "rm"(srcs), [ldcb] "rm"(ldcb)         \
        : "xmm0", "xmm1", "xmm2", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",   \
          "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",       \
          "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "cc", "memory")

static const float ln_zero32[32] __attribute__((aligned(64)));

/* ln_ptile12 on AVX-512 machines (rc_conv_fast) for packed weights (ldw 32; any other goes to
   ln_ptile12), in asm (LN_ASM_TILE), the weights asked ahead with wpf: the npf prefetched rows
   (pfs bytes apart) asked in the first passes, one or two a pass, past twice the passes two
   each half pass (more is left to the hardware's prefetcher: asked in bursts, 128 rows of a
   cold Linear ran 3% slower); without an epilogue (e) the tile's sums
   plus the bias or what c holds are stored from the registers, else by LN_EPILOGUE */
DWF_TARGET __attribute__((always_inline)) static inline void
ln_asm12(const float *restrict ap, const float *restrict wp, Py_ssize_t kn, Py_ssize_t ldw, float *restrict c,
         Py_ssize_t ldc, const float *restrict bias, int init, const char *pf, Py_ssize_t pfs, Py_ssize_t npf,
         const ln_epi *e, int wpf)
{
    enum { NP = LN_RP };
    if (ldw != 32) {
        ln_ptile12(ap, wp, kn, ldw, c, ldc, bias, init, pf, pfs, npf, e);
        return;
    }
    v16f acc[NP][2];
    const Py_ssize_t passes = kn / 8;
    const Py_ssize_t left = npf > 0 && passes > 0 ? npf : 0;
    /* rows a prefetch point asks (two: pf2 set); points a pass (two: n2 passes, else n) */
    const Py_ssize_t two = left > passes, twice = left > 2 * passes;
    Py_ssize_t n = twice ? 0 : (left + two) / (1 + two), n2 = twice ? (left + 3) / 4 : 0;
    if (n2 > passes)
        n2 = passes;
    const Py_ssize_t nplain = passes - n - n2, nsteps = kn - 8 * passes;
    const Py_ssize_t pf2 = two ? pfs : 0, pfstep = two ? 2 * pfs : pfs;
    /* mode 0: the sums to acc for the C epilogue; else c = sums + src (rows srcs bytes apart) */
    const Py_ssize_t mode = e ? 0 : 1;
    const float *src = init ? (bias ? bias : ln_zero32) : c;
    const Py_ssize_t srcs = init ? 0 : ldc * (Py_ssize_t)sizeof(float), ldcb = ldc * (Py_ssize_t)sizeof(float);
    const float *a = ap, *w = wp;
    float *cp = c;
    if (wpf)
        LN_ASM_TILE(LN_ASM_WPF);
    else
        LN_ASM_TILE(LN_ASM_NOPF);
    if (mode == 0)
        LN_EPILOGUE(NP);
}

DWF_TARGET static void ln_ptile12_asm(const float *restrict ap, const float *restrict wp, Py_ssize_t kn,
                                      Py_ssize_t ldw, float *restrict c, Py_ssize_t ldc,
                                      const float *restrict bias, int init, const char *pf, Py_ssize_t pfs,
                                      Py_ssize_t npf, const ln_epi *e)
{
    ln_asm12(ap, wp, kn, ldw, c, ldc, bias, init, pf, pfs, npf, e, 0);
}

DWF_TARGET static void ln_ptile12_asmw(const float *restrict ap, const float *restrict wp, Py_ssize_t kn,
                                       Py_ssize_t ldw, float *restrict c, Py_ssize_t ldc,
                                       const float *restrict bias, int init, const char *pf, Py_ssize_t pfs,
                                       Py_ssize_t npf, const ln_epi *e)
{
    ln_asm12(ap, wp, kn, ldw, c, ldc, bias, init, pf, pfs, npf, e, 1);
}
#endif


typedef struct {
    const float *a, *wp, *bias;
    float *ap, *y;
    Py_ssize_t R, K, N, kc, bp; /* bp: row panels a unit */
    int packed;                 /* wp packed [ceil(N / 32)][K][32], else w itself, K x N */
    int by_rows;                /* units row block by row block (else column panel by panel) */
    const ln_epi *epi;          /* a clip (Relu) on the last chunk, while the tile is in registers */
    int panels;                 /* units of row panels, each packed by its part and taken over every
                                   column panel with the whole K (ln_part_panels) */
} ln_job;

/* the weights of column panel cb, terms [k0, k0 + kn), from an unpacked K x N w into buf
 * [kn][32] (zeros past N) */
static void ln_pack_w(const ln_job *j, Py_ssize_t cb, Py_ssize_t k0, Py_ssize_t kn, float *restrict buf)
{
    const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
    const float *w = j->wp + k0 * j->N + n0;
    for (Py_ssize_t k = 0; k < kn; k++) {
        if (nn == 32)
            memcpy(buf + k * 32, w + k * j->N, 32 * sizeof(float));
        else {
            memcpy(buf + k * 32, w + k * j->N, (size_t)nn * sizeof(float));
            memset(buf + k * 32 + nn, 0, (size_t)(32 - nn) * sizeof(float));
        }
    }
}

#if DWF_OK
/* a whole panel's first K - K % 16 terms, 16 at a time: the 12 rows' vectors (and 4 of zeros)
   transposed in registers, each term's 12 floats one store (the scalar loop below was 6-8% of
   a Linear's time at K = 768-1536: docs/performance.md); returns the terms done */
DWF_TARGET static Py_ssize_t ln_pack12_avx512(float *restrict dst, const float *restrict src, Py_ssize_t K)
{
    Py_ssize_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 r[16];
        for (int p = 0; p < LN_RP; p++)
            r[p] = _mm512_loadu_ps(src + p * K + k);
        for (int p = LN_RP; p < 16; p++)
            r[p] = _mm512_setzero_ps();
        rc_tr16_ps(r);
        /* in order, each store's last 4 lanes rewritten by the next; the last one masked */
        for (int i = 0; i < 15; i++)
            _mm512_storeu_ps(dst + (k + i) * LN_RP, r[i]);
        _mm512_mask_storeu_ps(dst + (k + 15) * LN_RP, (__mmask16)0x0fff, r[15]);
    }
    return k;
}
#endif

/* row panel q of a [R][K] into dst [K][12], zeros past R */
static void ln_pack_panel(float *restrict dst, const float *restrict a, Py_ssize_t R, Py_ssize_t K, Py_ssize_t q)
{
    const Py_ssize_t r0 = q * LN_RP, nr = R - r0 < LN_RP ? R - r0 : LN_RP;
    const float *src = a + r0 * K;
    if (nr == LN_RP) {
        Py_ssize_t k0 = 0;
#if DWF_OK
        if (rc_conv_fast)
            k0 = ln_pack12_avx512(dst, src, K);
#endif
        if (rc_ln_tiles == ln_tiles_avx2)
            k0 = ln_pack12_avx2(dst, src, K);
        /* 12 rows read side by side, the panel written in order */
        for (Py_ssize_t k = k0; k < K; k++)
            for (int p = 0; p < LN_RP; p++)
                dst[k * LN_RP + p] = src[p * K + k];
        return;
    }
    for (Py_ssize_t k = 0; k < K; k++)
        for (int p = 0; p < LN_RP; p++)
            dst[k * LN_RP + p] = p < nr ? src[p * K + k] : 0.0f;
}

void ln_pack_part(void *arg, int part, int parts)
{
    const ln_pack_job *j = (const ln_pack_job *)arg;
    const Py_ssize_t np_ = (j->R + LN_RP - 1) / LN_RP;
    for (Py_ssize_t q = np_ * part / parts; q < np_ * (part + 1) / parts; q++)
        ln_pack_panel(j->ap + q * j->K * LN_RP, j->a, j->R, j->K, q);
}

/* unit u's column panel and row block: blocks split for the threads' sake one after another
   on a column panel (its weights then still in L2), blocks split to fit L2 (by_rows) each over
   every column panel (its packed rows then still in L2) */
static inline void ln_unit(const ln_job *j, Py_ssize_t u, Py_ssize_t cols, Py_ssize_t nb, Py_ssize_t *cb,
                           Py_ssize_t *qb)
{
    if (j->by_rows) {
        *qb = u / cols;
        *cb = u - *qb * cols;
    } else {
        *cb = u / nb;
        *qb = u - *cb * nb;
    }
}

/* j->panels: the part's row panels one by one, each packed into the part's own slot of j->ap
   (in L1 for its tiles) and taken over every column panel, its chunks of K one after another
   on the same tile of c (in L1 between them; the same sums as the column panels' order): the
   weights, at most three quarters of L2, stream from there as many times as there are row
   panels, asked 16 steps ahead (ln_ptile12_asmw) */
static void ln_part_panels(const ln_job *j, int part, int parts, const ln_tile_f *tiles)
{
    const Py_ssize_t np_ = (j->R + LN_RP - 1) / LN_RP, cols = (j->N + 31) / 32, K = j->K;
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float btail[32];
    float *ap = j->ap + (Py_ssize_t)part * K * LN_RP;
    for (Py_ssize_t q = np_ * part / parts; q < np_ * (part + 1) / parts; q++) {
        ln_pack_panel(ap, j->a, j->R, K, q);
        const Py_ssize_t r0 = q * LN_RP, nr = j->R - r0 < LN_RP ? j->R - r0 : LN_RP;
        for (Py_ssize_t cb = 0; cb < cols; cb++) {
            const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
            const float *bias = ln_panel_bias(j->bias, n0, nn, btail);
            /* the last panel of an N not a multiple of 32: through a whole-width tile */
            float *c = nn == 32 ? j->y + r0 * j->N + n0 : tail;
            const Py_ssize_t ldc = nn == 32 ? j->N : 32;
            for (Py_ssize_t k0 = 0; k0 < K; k0 += j->kc) {
                const Py_ssize_t kn = K - k0 < j->kc ? K - k0 : j->kc;
                tiles[nr](ap + k0 * LN_RP, j->wp + (cb * K + k0) * 32, kn, 32, c, ldc, bias, k0 == 0, NULL, 0, 0,
                          k0 + kn == K ? j->epi : NULL);
            }
            if (nn < 32)
                for (Py_ssize_t p = 0; p < nr; p++)
                    memcpy(j->y + (r0 + p) * j->N + n0, tail + p * 32, sizeof(float) * nn);
        }
    }
}

static void ln_part(void *arg, int part, int parts)
{
    const ln_job *j = (const ln_job *)arg;
    const Py_ssize_t np_ = (j->R + LN_RP - 1) / LN_RP, nb = (np_ + j->bp - 1) / j->bp;
    const Py_ssize_t cols = (j->N + 31) / 32, units = cols * nb;
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float btail[32];
    /* a chunk of unpacked weights, packed here (kc <= LN_KC; the caller's work buffer
       holds the packed rows of a) */
    float wbuf[LN_KC * 32] __attribute__((aligned(64)));
    ln_tile_f tiles[LN_RP + 1];
    if (rc_ln_tiles) /* without AVX-512: linear_avx2.c's */
        memcpy(tiles, rc_ln_tiles, sizeof(tiles));
    else {
        memcpy(tiles, j->packed ? ln_ptiles : ln_tiles, sizeof(tiles));
#if DWF_OK
        if (j->packed && rc_conv_fast)
            tiles[LN_RP] = j->panels ? ln_ptile12_asmw : ln_ptile12_asm;
#endif
    }
    if (j->panels) {
        ln_part_panels(j, part, parts, tiles);
        return;
    }
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        Py_ssize_t cb, qb;
        ln_unit(j, u, cols, nb, &cb, &qb);
        const Py_ssize_t q0 = qb * j->bp;
        const Py_ssize_t q1 = q0 + j->bp < np_ ? q0 + j->bp : np_;
        const Py_ssize_t n0 = cb * 32, nn = j->N - n0 < 32 ? j->N - n0 : 32;
        const float *bias = ln_panel_bias(j->bias, n0, nn, btail);
        for (Py_ssize_t k0 = 0; k0 < j->K; k0 += j->kc) {
            const Py_ssize_t kn = j->K - k0 < j->kc ? j->K - k0 : j->kc;
            const float *wp = j->wp + (cb * j->K + k0) * 32;
            /* unpacked weights: this chunk packed here, and the next one (the next panel's
               first after the last) asked into L2 by the first row panel, a row a step:
               its rows are 128 bytes N floats apart, which the hardware's prefetcher does
               not follow */
            const char *pf = NULL;
            Py_ssize_t npf = 0;
            if (!j->packed) {
                ln_pack_w(j, cb, k0, kn, wbuf);
                wp = wbuf;
                if (k0 + kn < j->K) {
                    pf = (const char *)(j->wp + (k0 + kn) * j->N + n0);
                    npf = j->K - k0 - kn < j->kc ? j->K - k0 - kn : j->kc;
                } else if (cb + 1 < cols) {
                    pf = (const char *)(j->wp + n0 + 32);
                    npf = j->kc < j->K ? j->kc : j->K;
                }
            }
            /* packed weights: the next chunk (or the next unit's first), contiguous, asked
               into L2 a share by every row panel (rc_pf_share, rows of 128 bytes), spread
               over its steps (ln_ptiles): large weights come from L3 or memory every run */
            const char *nx = NULL;
            Py_ssize_t nbytes = 0;
            if (j->packed) {
                if (k0 + kn < j->K) {
                    nx = (const char *)(wp + kn * 32);
                    nbytes = (Py_ssize_t)sizeof(float) * 32 * (j->K - k0 - kn < j->kc ? j->K - k0 - kn : j->kc);
                } else if (u + 1 < units * (part + 1) / parts) {
                    Py_ssize_t cn, qn;
                    ln_unit(j, u + 1, cols, nb, &cn, &qn);
                    nx = (const char *)(j->wp + cn * j->K * 32);
                    nbytes = (Py_ssize_t)sizeof(float) * 32 * (j->kc < j->K ? j->kc : j->K);
                }
            }
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t r0 = q * LN_RP, nr = j->R - r0 < LN_RP ? j->R - r0 : LN_RP;
                const float *ap = j->ap + (q * j->K + k0) * LN_RP;
                float *c = j->y + r0 * j->N + n0;
                const char *qpf = pf;
                Py_ssize_t qnpf = q == q0 ? npf : 0, pfs = (Py_ssize_t)sizeof(float) * j->N;
                if (nx) {
                    qnpf = rc_pf_share(nx, nbytes, q1 - q0, q - q0, 128, &qpf);
                    pfs = 128;
                }
                const ln_epi *e = k0 + kn == j->K ? j->epi : NULL;
                if (nn == 32) {
                    tiles[nr](ap, wp, kn, 32, c, j->N, bias, k0 == 0, qpf, pfs, qnpf, e);
                    continue;
                }
                /* the last panel of an N not a multiple of 32: through a whole-width tile */
                if (k0 > 0)
                    for (Py_ssize_t p = 0; p < nr; p++)
                        memcpy(tail + p * 32, c + p * j->N, sizeof(float) * nn);
                tiles[nr](ap, wp, kn, 32, tail, 32, bias, k0 == 0, qpf, pfs, qnpf, e);
                for (Py_ssize_t p = 0; p < nr; p++)
                    memcpy(c + p * j->N, tail + p * 32, sizeof(float) * nn);
            }
        }
    }
}

#define LN_ABYTES (3 << 19) /* 1.5 MB of packed rows a row block */

/* the products of j on up to threads threads (j->ap packed; j->kc and j->bp set here) */
Py_ssize_t ln_row_block(Py_ssize_t np_, Py_ssize_t cols, Py_ssize_t units)
{
    if (cols >= units)
        return np_;
    Py_ssize_t nb = (units + cols - 1) / cols;
    if (nb > np_)
        nb = np_;
    return (np_ + nb - 1) / nb;
}

#define LN_PANEL_K 1024 /* most terms of the row panels' order (a packed row panel of 48 KB) */

/* this core's L2 in bytes (1 MB where the C library does not say) */
static Py_ssize_t ln_l2_bytes(void)
{
    static Py_ssize_t l2;
    if (!l2) {
        long v = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
        v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        l2 = v > 0 ? (Py_ssize_t)v : (Py_ssize_t)1 << 20;
    }
    return l2;
}

/* how j runs on up to *threads threads: its order (j->panels, or column panels x row blocks
   with j->kc and j->bp), the parts returned */
static int ln_plan(ln_job *j, int *threads)
{
    const Py_ssize_t cols = (j->N + 31) / 32, np_ = (j->R + LN_RP - 1) / LN_RP;
    const double flops = 2.0 * (double)j->R * (double)j->K * (double)j->N;
    /* the row panels' order where the packed weights fit in three quarters of L2 and each
       thread has 16 row panels or more to read them: 1576 x 768 x 192 1.1-1.25x the column
       panels' (no packing pass, the packed rows in L1), 128 rows of weights that come from L3
       0.85-0.95x (docs/performance.md) */
    j->panels = j->packed && cols * j->K * 128 <= ln_l2_bytes() / 4 * 3 && j->K <= LN_PANEL_K &&
                np_ >= 16 * (Py_ssize_t)*threads;
    /* K in chunks of at most LN_KC terms, as even as they go (in either order: the same sums) */
    const Py_ssize_t nk = (j->K + LN_KC - 1) / LN_KC;
    j->kc = (j->K + nk - 1) / nk;
    if (j->panels) {
        j->bp = 1;
        return rc_parts_fine(flops, 2.5e5, np_, threads);
    }
    /* 16 units a thread, so that an odd count does not leave one thread a whole unit more
       (ConvNeXt's 96 columns made 9 units for 2 threads: 5 against 4) */
    j->bp = ln_row_block(np_, cols, 16 * (Py_ssize_t)*threads);
    /* blocks of no more row panels than fit LN_ABYTES (in L2 beside the weights' stream), where
       a's panels pass that by more than a quarter: 1024 rows of K = 512 had each column panel
       read the whole packed a, 2 MB, from L3 again; 128 rows of K = 3072 (1.5 MB) read their
       weights once rather than twice */
    const Py_ssize_t cap = LN_ABYTES / ((Py_ssize_t)sizeof(float) * LN_RP * j->K);
    if (j->bp > cap + cap / 4) {
        const Py_ssize_t nb = (np_ + (cap > 1 ? cap : 1) - 1) / (cap > 1 ? cap : 1);
        j->bp = (np_ + nb - 1) / nb;
        j->by_rows = 1;
    }
    const Py_ssize_t units = cols * ((np_ + j->bp - 1) / j->bp);
    return rc_parts_fine(flops, 2.5e5, units, threads);
}

PyObject *rc_py_linear(PyObject *self, PyObject *args)
{
    PyObject *ao, *wo, *bo, *yo;
    Py_ssize_t R, K, N;
    int threads, packed = 1;
    float lo = -INFINITY, hi = INFINITY;
    if (!PyArg_ParseTuple(args, "OOOO(nnn)i|pff:linear", &ao, &wo, &bo, &yo, &R, &K, &N, &threads, &packed, &lo,
                          &hi))
        return NULL;
    if (!(lo <= hi)) {
        PyErr_SetString(PyExc_ValueError, "linear: the clip bounds must satisfy lo <= hi");
        return NULL;
    }
    if (R < 1 || K < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "linear: sizes must be positive");
        return NULL;
    }
    const Py_ssize_t cols = N / 32 + (N % 32 != 0), np_ = R / LN_RP + (R % LN_RP != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t an = sz_mul(&sz, "A's size", R, K), yn = sz_mul(&sz, "Y's size", R, N);
    const Py_ssize_t wn = packed ? sz_mul3(&sz, "W's size", cols, K, 32) : sz_mul(&sz, "W's size", K, N);
    if (sz_check(&sz, "linear", PyExc_ValueError) < 0)
        return NULL;
    sz_mul4(&sz, "the packed rows", np_, K, LN_RP, RC_F32);
    if (sz_check(&sz, "linear", PyExc_MemoryError) < 0)
        return NULL;
    Py_buffer v[4];
    const rc_buf spec[4] = {{ao, an, RC_F32, 0, 0, "A"}, {wo, wn, RC_F32, 0, 0, "W"},
                            {bo, N, RC_F32, 0, 1, "bias"}, {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("linear", spec, v, 4) < 0)
        return NULL;
    if (packed && ((uintptr_t)v[1].buf & 63) != 0) {
        release_buffers(v, 4);
        PyErr_SetString(PyExc_ValueError, "linear: packed weights must be 64-byte aligned");
        return NULL;
    }
    /* no epilogue without bounds: the plain stores */
    const ln_epi epi = {NULL, NULL, 0, lo, hi};
    ln_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf, NULL,
                (float *)v[3].buf, R, K, N, 0, np_, packed, 0, isinf(lo) && isinf(hi) ? NULL : &epi, 0};
    /* a job run on its caller alone (run_solo, the machine's load) planned as for one thread: two
       threads' row blocks, run alone, read every column panel's weights once more a block
       (BERT-base's 128 x 768 x 3072 4.08 against 3.90 ms) */
    threads = rc_job_threads(threads);
    const int parts = ln_plan(&j, &threads);
    /* the packed rows: all of them, or a panel a part (j.panels) */
    const size_t apn = sizeof(float) * (size_t)(j.panels ? parts : np_) * (size_t)K * LN_RP;
    /* the caller's kept work buffer (the parts below use none): a fresh allocation of this
       size faulted its pages in again on many calls */
    float *ap = (float *)rc_work(apn);
    if (!ap) {
        release_buffers(v, 4);
        return PyErr_NoMemory();
    }
    j.ap = ap;
    int pth = threads;
    const int pparts = rc_parts((double)R * (double)K * 8.0, 2.5e5, np_, &pth);
    Py_BEGIN_ALLOW_THREADS
    if (!j.panels) {
        ln_pack_job pj = {j.a, j.ap, R, K};
        rc_parallel(ln_pack_part, &pj, pparts, pth);
    }
    rc_parallel(ln_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    rc_work_done(ap, apn);
    release_buffers(v, 4);
    Py_RETURN_NONE;
}

/* pointwise_lanes's work: a unit is a group of G 32-position column panels x a block of row
 * panels; per chunk of the channels, every row panel of the block passes over the group's
 * panels one after another. The group's chunk of x is copied into xb (L1) first, or, for a
 * unit of at most PL_INPLACE row panels, read in place (a column panel's rows P floats apart);
 * the last, short column panel is always copied, zero-padded, into a whole-width one. */
#define PL_XB 8192 /* floats of x a unit's chunk holds: 32 KB, in L1 beside the weights */
#define PL_INPLACE 2 /* most row panels of a unit that reads x in place */
typedef struct {
    const float *wp, *x, *b, *z;
    float *y;
    Py_ssize_t M, C, P, kc, G, ngroups, bp, nqb;
    float lo, hi;
    const rc_act *act; /* after the clip, or NULL */
    Py_ssize_t N;      /* images: x N x C x P, y and z N x M x P, units over all of them */
} pl_job;

/* rows of nn floats (at most 32) from src, ld apart, into dst [rows][32], zeros past nn */
void pl_pack32(float *restrict dst, const float *restrict src, Py_ssize_t rows, Py_ssize_t ld, Py_ssize_t nn)
{
    /* a whole row is a constant-size copy (two vector moves), not a libc call */
    if (nn == 32)
        for (Py_ssize_t k = 0; k < rows; k++)
            memcpy(dst + k * 32, src + k * ld, 32 * sizeof(float));
    else
        for (Py_ssize_t k = 0; k < rows; k++) {
            memcpy(dst + k * 32, src + k * ld, (size_t)nn * sizeof(float));
            memset(dst + k * 32 + nn, 0, (size_t)(32 - nn) * sizeof(float));
        }
}

static void pl_part(void *arg, int part, int parts)
{
    const pl_job *j0 = (const pl_job *)arg;
    const Py_ssize_t P = j0->P, C = j0->C, np_ = (j0->M + LN_RP - 1) / LN_RP, cols = (P + 31) / 32;
    const Py_ssize_t per = j0->ngroups * j0->nqb, units = per * j0->N, tn = P - (cols - 1) * 32;
    float tail[LN_RP * 32] __attribute__((aligned(64)));
    float xb[PL_XB] __attribute__((aligned(64))); /* the group's chunk of x, [G][kn][32] */
    pl_job img = *j0; /* the unit's image: x, y and z moved to it */
    const pl_job *j = &img;
    const ln_tile_f *tiles = rc_ln_tiles ? rc_ln_tiles : ln_tiles; /* without AVX-512: linear_avx2.c's */
    for (Py_ssize_t u = units * part / parts; u < units * (part + 1) / parts; u++) {
        const Py_ssize_t n = u / per, ui = u - n * per;
        img.x = j0->x + n * C * P;
        img.y = j0->y + n * j0->M * P;
        img.z = j0->z ? j0->z + n * j0->M * P : NULL;
        const Py_ssize_t g = ui / j->nqb, qb = ui - g * j->nqb;
        const Py_ssize_t cb0 = g * j->G, cb1 = cb0 + j->G < cols ? cb0 + j->G : cols;
        const Py_ssize_t q0 = qb * j->bp, q1 = q0 + j->bp < np_ ? q0 + j->bp : np_;
        if (q0 >= q1)
            continue;
        /* a unit of at most PL_INPLACE row panels reads x's whole column panels in place: the
           copy into xb cost more than the few tiles it served saved (M <= 24 at one thread,
           docs/performance.md) */
        const int inplace = q1 - q0 <= PL_INPLACE;
        for (Py_ssize_t k0 = 0; k0 < C; k0 += j->kc) {
            const Py_ssize_t kn = C - k0 < j->kc ? C - k0 : j->kc;
            const int last = k0 + kn == C;
            for (Py_ssize_t cb = cb0; cb < cb1; cb++) {
                const Py_ssize_t n0 = cb * 32, nn = P - n0 < 32 ? P - n0 : 32;
                if (!inplace || nn < 32)
                    pl_pack32(xb + (cb - cb0) * kn * 32, j->x + k0 * P + n0, kn, P, nn);
            }
            for (Py_ssize_t q = q0; q < q1; q++) {
                const Py_ssize_t r0 = q * LN_RP, nr = j->M - r0 < LN_RP ? j->M - r0 : LN_RP;
                const float *ap = j->wp + (q * C + k0) * LN_RP;
                for (Py_ssize_t cb = cb0; cb < cb1; cb++) {
                    const Py_ssize_t n0 = cb * 32;
                    const int inx = inplace && n0 + 32 <= P;
                    const float *xs = inx ? j->x + k0 * P + n0 : xb + (cb - cb0) * kn * 32;
                    float *c = j->y + r0 * P + n0;
                    /* the first row panel's tiles ask the x this panel needs next into L2 (its
                       next chunk, or the next group's first), a row a step: rows P floats
                       apart, which the hardware's prefetcher does not follow */
                    const char *pf = NULL;
                    Py_ssize_t npf = 0;
                    if (q > q0 && q + 1 < q1 && cb == cb0) {
                        /* the other row panels' first tiles ask the next panel's weights of
                           this chunk into L2: panels C * 12 floats apart, each a fresh
                           stream from memory for large weights) */
                        pf = (const char *)(j->wp + ((q + 1) * C + k0) * LN_RP);
                        npf = (kn * LN_RP * (Py_ssize_t)sizeof(float) + 127) / 128;
                    } else if (q == q0 && !last) {
                        pf = (const char *)(j->x + (k0 + kn) * P + n0);
                        npf = C - k0 - kn < j->kc ? C - k0 - kn : j->kc;
                    } else if (q == q0 && cb + j->G < cols) {
                        pf = (const char *)(j->x + n0 + j->G * 32);
                        npf = j->kc;
                    }
                    if (n0 + 32 <= P) {
                        ln_epi e = {j->b ? j->b + r0 : NULL, j->z ? j->z + r0 * P + n0 : NULL, P, j->lo,
                                    j->hi, j->act};
                        tiles[nr](ap, xs, kn, inx ? P : 32, c, P, NULL, k0 == 0, pf, q > q0 ? 128 : sizeof(float) * P,
                                     npf, last ? &e : NULL);
                        continue;
                    }
                    if (k0 > 0)
                        for (Py_ssize_t p = 0; p < nr; p++)
                            memcpy(tail + p * 32, c + p * P, sizeof(float) * tn);
                    tiles[nr](ap, xs, kn, 32, tail, 32, NULL, k0 == 0, NULL, 0, 0, NULL);
                    for (Py_ssize_t p = 0; p < nr; p++)
                        memcpy(c + p * P, tail + p * 32, sizeof(float) * tn);
                    if (last) {
                        bias_clip_block(c, P, j->b ? j->b + r0 : NULL, j->z ? j->z + r0 * P + n0 : NULL,
                                        nr, tn, j->lo, j->hi);
                        act_block(c, P, nr, tn, j->act);
                    }
                }
            }
        }
    }
}

/* pointwise_lanes: a 1x1 convolution of one image, y (M x P) = w (M x C) x (C x P), with
 * linear's tiles: w (constant) packed once in 12-row panels (_pack_rows), x packed 32
 * positions x a chunk of channels at a time, bias, residual and clip in the epilogue while
 * the tile is in cache. */
PyObject *rc_py_pointwise_lanes(PyObject *self, PyObject *args)
{
    PyObject *wo, *xo, *bo, *zo, *yo;
    Py_ssize_t M, C, P, N = 1;
    float lo, hi;
    int threads;
    rc_act act = {-1, 1.0f / 6.0f, 0.5f};
    if (!PyArg_ParseTuple(args, "OOOOO(nnn)ffi|iffn:pointwise_lanes", &wo, &xo, &bo, &zo, &yo, &M, &C, &P, &lo,
                          &hi, &threads, &act.act, &act.alpha, &act.beta, &N))
        return NULL;
    if (act.act < -1 || act.act > 3) {
        PyErr_SetString(PyExc_ValueError, "pointwise_lanes: activation kind not in -1..3");
        return NULL;
    }
    act.act += 1; /* activate's kind -> rc_act's */
    if (M < 1 || C < 1 || P < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "pointwise_lanes: sizes must be positive");
        return NULL;
    }
    const Py_ssize_t np_ = M / LN_RP + (M % LN_RP != 0);
    rc_sz sz = {NULL};
    const Py_ssize_t wn = sz_mul3(&sz, "W's size", np_, C, LN_RP), xn = sz_mul3(&sz, "X's size", N, C, P);
    const Py_ssize_t yn = sz_mul3(&sz, "Y's size", N, M, P);
    sz_add(&sz, "Y's size", P, 64 * 32); /* the column panels' arithmetic */
    if (sz_check(&sz, "pointwise_lanes", PyExc_ValueError) < 0)
        return NULL;
    Py_buffer v[5];
    const rc_buf spec[5] = {{wo, wn, RC_F32, 0, 0, "W"}, {xo, xn, RC_F32, 0, 0, "X"},
                            {bo, M, RC_F32, 0, 1, "B"}, {zo, yn, RC_F32, 0, 1, "Z"},
                            {yo, yn, RC_F32, 1, 0, "Y"}};
    if (get_buffers("pointwise_lanes", spec, v, 5) < 0)
        return NULL;
    threads = rc_job_threads(threads); /* run alone: grouped as for one thread (rc_py_linear) */
    const Py_ssize_t cols = (P + 31) / 32, nk = (C + LN_KC - 1) / LN_KC, kc = (C + nk - 1) / nk;
    /* each row of y written in runs of G panels, the group's chunk of x in L1: a panel at a
       time, MobileNetV2's 96 x 112 x 112 expansion wrote 96 rows of 128 bytes at once, which
       the hardware's prefetcher does not follow */
    Py_ssize_t G = PL_XB / (kc * 32);
    if (G < 1)
        G = 1;
    /* groups enough for the threads: 8 a thread where the positions allow (a batch's images
       are units of their own) */
    const Py_ssize_t want = (8 * (Py_ssize_t)threads + N - 1) / N;
    if (G > (cols + want - 1) / want)
        G = (cols + want - 1) / want;
    if (G < 1)
        G = 1;
    const Py_ssize_t ngroups = (cols + G - 1) / G;
    const Py_ssize_t wantq = (4 * (Py_ssize_t)threads + N - 1) / N;
    Py_ssize_t nqb = ngroups >= wantq ? 1 : (wantq + ngroups - 1) / ngroups;
    if (nqb > np_)
        nqb = np_;
    const Py_ssize_t bp = (np_ + nqb - 1) / nqb;
    nqb = (np_ + bp - 1) / bp;
    pl_job j = {(const float *)v[0].buf, (const float *)v[1].buf, (const float *)v[2].buf,
                (const float *)v[3].buf, (float *)v[4].buf, M, C, P, kc, G, ngroups, bp, nqb, lo, hi,
                act.act ? &act : NULL, N};
    const int parts = rc_parts(2.0 * (double)N * (double)M * (double)C * (double)P, 2.5e5, N * ngroups * nqb,
                               &threads);
    Py_BEGIN_ALLOW_THREADS
    rc_parallel(pl_part, &j, parts, threads);
    Py_END_ALLOW_THREADS
    release_buffers(v, 5);
    Py_RETURN_NONE;
}
