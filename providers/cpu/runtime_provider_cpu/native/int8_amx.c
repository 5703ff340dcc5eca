/* The int8 GEMM on AMX tiles (Sapphire Rapids and later): u8 A x s8 B with int32 sums by
 * TDPBUSD, as MLAS's QgemmU8S8KernelAmx.
 *
 * B needs no repacking: a 16-column panel of qgemm_pack's layout ([Kq][16][4] bytes) is AMX's B
 * operand as it stands, 16 groups of K (a tile's 16 rows of 64 bytes) 64 bytes apart. A is
 * stored row-major by the caller, Ks = ceil(Kq / 16) steps of 64 bytes a row; where Kq is not a
 * multiple of 16 the last step reads B's last 16 groups (rows Kq - 16 .. Kq - 1, inside the panel)
 * and A's last 64 bytes hold the t = Kq % 16 remaining groups at their end, zeros before them
 * (rc_amx_a_offset), so the groups read twice count once. Kq < 16 does not run here.
 *
 * The OS must grant the tile data state: ARCH_REQ_XCOMP_PERM (Linux 5.16+), asked once at load
 * (rc_amx_init); refused, or no AMX-INT8 in CPUID, or no XTILECFG/XTILEDATA in XCR0, and
 * rc_amx is 0 (cpu_isa() says which of the three). */
#include "native.h"

extern int rc_qg_amx;
/* 1: the tile path runs; 0: not (rc_amx_why says why) */
int rc_amx;
const char *rc_amx_why = "not an x86-64 Linux build";

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_OK 1
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#else
#define AMX_OK 0
#endif

void rc_amx_init(void)
{
#if AMX_OK
    unsigned a, b, c, d, sub_max;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) {
        rc_amx_why = "no OSXSAVE";
        return;
    }
    if (!__get_cpuid_count(7, 0, &sub_max, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) {
        rc_amx_why = "no AMX-TILE / AMX-INT8 in CPUID";
        return;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        rc_amx_why = "the OS does not enable the tile state (XCR0 bits 17, 18)";
        return;
    }
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0
        || syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) != 0 || !(bits & (1ul << XFEATURE_XTILEDATA))) {
        rc_amx_why = "the OS refused the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
        return;
    }
    rc_amx = rc_qg_amx = 1;
    rc_amx_why = "granted";
#endif
}

Py_ssize_t rc_amx_a_stride(Py_ssize_t Kq) { return (Kq + 15) / 16 * 64; }

/* where A's group g (bytes 4g .. 4g + 3 of a row) sits in its AMX row (see the top) */
Py_ssize_t rc_amx_a_offset(Py_ssize_t Kq, Py_ssize_t g)
{
    const Py_ssize_t full = Kq / 16 * 16;
    return g < full ? 4 * g : 4 * (g + 16 - (Kq - full));
}

#if AMX_OK
/* palette 1: tiles 0-3 the 2 x 2 int32 accumulators (16 rows of 16 sums), 4-5 A (16 rows of 64
 * bytes), 6-7 B (16 groups of K of 16 columns x 4 bytes) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

__attribute__((target("amx-tile"))) void rc_amx_begin(void)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    __asm__ volatile("" : : "m"(cfg) : "memory"); /* GCC's ldtilecfg names no memory: keep the stores */
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void rc_amx_end(void) { _tile_release(); }

/* c[32][32] (int32, 128 bytes a row) = rows [0, 16 * r16) of A (a, lda bytes a row, as at the
 * top) x the two 16-column panels b0, b1 (Kq groups each); r16 1 or 2; rc_amx_begin before */
__attribute__((target("amx-tile,amx-int8"))) void rc_amx_tile(const uint8_t *a, Py_ssize_t lda, const int8_t *b0,
                                                               const int8_t *b1, Py_ssize_t Kq, int r16, int32_t *c)
{
    const Py_ssize_t Ks = (Kq + 15) / 16;
    __asm__ volatile("" ::: "memory"); /* GCC's tile macros name no memory: A is written before */
    _tile_zero(0);
    _tile_zero(1);
    if (r16 == 2) {
        _tile_zero(2);
        _tile_zero(3);
        for (Py_ssize_t s = 0; s < Ks; s++) {
            const Py_ssize_t q = s + 1 < Ks || Kq % 16 == 0 ? s * 16 : Kq - 16;
            _tile_loadd(4, a + s * 64, lda);
            _tile_loadd(6, b0 + q * 64, 64);
            _tile_loadd(7, b1 + q * 64, 64);
            _tile_loadd(5, a + 16 * lda + s * 64, lda);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
        _tile_stored(2, c + 16 * 32, 128);
        _tile_stored(3, c + 16 * 32 + 16, 128);
    } else {
        for (Py_ssize_t s = 0; s < Ks; s++) {
            const Py_ssize_t q = s + 1 < Ks || Kq % 16 == 0 ? s * 16 : Kq - 16;
            _tile_loadd(4, a + s * 64, lda);
            _tile_loadd(6, b0 + q * 64, 64);
            _tile_loadd(7, b1 + q * 64, 64);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
        }
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    __asm__ volatile("" ::: "memory"); /* and c is read after */
}
#else
void rc_amx_begin(void) {}
void rc_amx_end(void) {}
void rc_amx_tile(const uint8_t *a, Py_ssize_t lda, const int8_t *b0, const int8_t *b1, Py_ssize_t Kq, int r16,
                 int32_t *c)
{
    (void)a, (void)lda, (void)b0, (void)b1, (void)Kq, (void)r16, (void)c;
}
#endif

/* rows [r0, r1) of a byte A (M x K, rows past M zeros) as the tiles read them: dst lda bytes a row,
 * bytes ^ flip (0x80: an s8 A as u8), groups where rc_amx_a_offset puts them, zeros elsewhere;
 * rs[m] their sums */
RC_CLONES void rc_amx_pack_rows(const uint8_t *restrict a, Py_ssize_t M, Py_ssize_t K, Py_ssize_t Kq, Py_ssize_t lda,
                                uint8_t flip, Py_ssize_t r0, Py_ssize_t r1, uint8_t *restrict dst,
                                int32_t *restrict rs)
{
    const Py_ssize_t full = Kq / 16 * 64 < K ? Kq / 16 * 64 : K, tail_at = rc_amx_a_offset(Kq, Kq / 16 * 16);
    for (Py_ssize_t m = r0; m < r1; m++) {
        uint8_t *restrict d = dst + m * lda;
        memset(d, 0, (size_t)lda);
        uint32_t s = 0;
        if (m < M) {
            const uint8_t *restrict row = a + m * K;
            for (Py_ssize_t k = 0; k < full; k++) {
                d[k] = row[k] ^ flip;
                s += d[k];
            }
            for (Py_ssize_t k = full; k < K; k++) {
                d[tail_at + k - full] = row[k] ^ flip;
                s += d[tail_at + k - full];
            }
        }
        rs[m] = (int32_t)s;
    }
}

/* whether qgemm (int8.c) runs its non-convolution products on the tiles: 1 where rc_amx, from
 * RC_AMX_QG_ROWS rows; qgemm_amx(0) turns it off (tests compare the two) */
int rc_qg_amx;

/* qgemm_amx(force=-1) -> whether qgemm uses the AMX tiles (force 0: off, 1: on where they run) */
PyObject *rc_py_qgemm_amx(PyObject *self, PyObject *args)
{
    int force = -1;
    if (!PyArg_ParseTuple(args, "|i:qgemm_amx", &force))
        return NULL;
    if (force >= 0)
        rc_qg_amx = force != 0 && rc_amx;
    return PyBool_FromLong(rc_qg_amx);
}
