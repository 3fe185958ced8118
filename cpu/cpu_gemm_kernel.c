/* cpu_gemm_kernel: one instruction-set variant of the GEMM column kernel,
 * compiled once per variant (cpu/meson.build builds this file into one small
 * static library per ISA, each with its own -m flags and
 * -DCPU_GEMM_VARIANT=<name>); cpu_gemm.c picks one at run time. Only the
 * function cpu_gemm_cols_<name> is exported; everything else is static, so
 * no code compiled for a wider ISA can leak into a path a narrower machine
 * runs.
 *
 * The canonical reduction order (cpu_gemm.h), identical in every variant:
 *   acc[l] = 0 for the 16 lanes l = 0..15;
 *   for k0 = 0, 16, 32, ... < K, for every lane l:
 *       acc[l] = fma(x[k0 + l], w[k0 + l], acc[l])     (x, w read as 0 past K)
 *   s8[i] = acc[i] + acc[i + 8]   (i < 8)
 *   s4[i] = s8[i]  + s8[i + 4]    (i < 4)
 *   s2[i] = s4[i]  + s4[i + 2]    (i < 2)
 *   y     = s2[0]  + s2[1]
 * Index equations of a tile: it covers rows m..m+mr-1 of x and rows
 * n..n+nr-1 of w (= columns of y); acc[i][j][h] is vector h of the VPS
 * vectors of VL lanes (VPS * VL = 16) that hold the 16 lanes of output
 * y[m+i][n+j]: lane l lives in vector l / VL, element l % VL.
 *
 *   variant  vectors             VPS x VL  tile MR x NR   needs
 *   avx512   one zmm             1 x 16    4 x 6          AVX-512F (+ FMA)
 *   avx2     two ymm             2 x 8     4 x 3          AVX2 + FMA
 *   generic  16 scalar floats    16 x 1    2 x 4          fmaf() only
 * At M = 1 every variant runs a 1 x GEMV_NR register tile instead (6, 6, 4
 * columns): AVX2's 4 x 3 tile would leave 3 FMA chains per half there.
 * From M = 16 (24 where K > 1024) AVX2 runs neither tile but the
 * lane-major path (pk_cols below): a ymm holds lane l of 8 outputs of one
 * row (8 columns), x is broadcast, 4 x 24 outputs per register tile, x and
 * w packed per lane; the same fmas per lane and the same tree. The 4 x 3
 * tile reads 4 x vectors and 3 w vectors per 12 FMAs, and an x vector from
 * L2 serves only 3 columns: 0.67 bytes of L2 traffic per flop held it at
 * ~53% of OpenBLAS's sgemm at M = 128 (~95 GFLOP/s on 2 Zen 3 cores).
 * The padded tail is a real fused multiply-add of 0 * 0 in every variant
 * (it can turn an accumulator of -0 into +0, so skipping it would not be
 * the same order). The generic variant exists for machines without FMA
 * (x86-64 before Haswell / Zen, some Atom-class chips; there each fma is
 * emulated exactly in double arithmetic: correct, a few times slower than
 * the vector kernels) and for non-x86 builds (where fmaf is one
 * instruction and the lanes vectorize).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm_kernel.h"
#include "cpu_wt.h"

#define GEMM_LANES 16

#if !defined(CPU_GEMM_VARIANT)
#error "cpu_gemm_kernel.c is compiled with -DCPU_GEMM_VARIANT=avx512|avx2|generic (cpu/meson.build)"
#endif
#define GEMM_CAT2(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define GEMM_COLS_FN GEMM_CAT(cpu_gemm_cols_, CPU_GEMM_VARIANT)

/* which variant: compare the macro's spelling */
#define GEMM_ID_avx512 1
#define GEMM_ID_avx2 2
#define GEMM_ID_generic 3
#define GEMM_ID GEMM_CAT(GEMM_ID_, CPU_GEMM_VARIANT)

#if GEMM_ID == GEMM_ID_avx512
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "the avx512 variant is compiled with -mavx512f -mfma"
#endif
#include <immintrin.h>
#include "cpu_tree_avx512.h"
#define VL 16
#define VPS 1
#define MR 4
#define NR 6
typedef __m512 vf;
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
/* elements [0, n) of p, zeros after (n may be <= 0 or >= VL) */
static inline vf v_load_tail(const float *p, int32_t n)
{
    return n >= VL ? v_load(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << (n > 0 ? n : 0)) - 1u), p);
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
/* VL bf16 at p widened (a 16-bit shift: exact) */
static inline vf v_load_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* VL int8 at p times s (int -> f32 exact, then one f32 multiply) */
static inline vf v_load_i8(const int8_t *p, float s)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))),
                         _mm512_set1_ps(s));
}
/* the canonical tree over the 16 lanes of a[0] */
static inline float v_hsum(const vf *a)
{
    __m256 lo = _mm512_castps512_ps256(a[0]);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);                                                /* (l, l+8) */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* (l, l+4) */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                               /* (l, l+2) */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                          /* (0, 1) */
    return _mm_cvtss_f32(s1);
}
/* Sixteen v_hsum at once, bit-identical to v_hsum (cpu_tree_avx512.h) */
#define GEMM_HSUM16 1
static inline vf v_hsum16(const vf *a) { return cpu_tree16_zmm(a); }

#elif GEMM_ID == GEMM_ID_avx2
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the avx2 variant is compiled with -mavx2 -mfma"
#endif
#include <immintrin.h>
#define VL 8
#define VPS 2
#define MR 4
#define NR 3
/* k chunk of the half-by-half walk (gemm_tile below), a multiple of 16: its
 * 4 x rows and 3 w rows (14 KiB) stay in a 32 KiB L1 between the two halves */
#define GEMM_KC 512
typedef __m256 vf;
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vf v_load_tail(const float *p, int32_t n)
{
    static const int32_t mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    if (n >= VL)
        return v_load(p);
    if (n <= 0)
        return v_zero();
    return _mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(mask + VL - n)));
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_load_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf v_load_i8(const int8_t *p, float s)
{
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                         _mm256_set1_ps(s));
}
/* lanes 0..7 in a[0], 8..15 in a[1]: the canonical tree */
static inline float v_hsum(const vf *a)
{
    __m256 s8 = _mm256_add_ps(a[0], a[1]);                                            /* (l, l+8) */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* (l, l+4) */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                               /* (l, l+2) */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                          /* (0, 1) */
    return _mm_cvtss_f32(s1);
}

#elif GEMM_ID == GEMM_ID_generic
#include <math.h>
#define VL 1
#define VPS 16
#define MR 2
#define NR 4
typedef float vf;
static inline vf v_zero(void) { return 0.0f; }
static inline vf v_load(const float *p) { return *p; }
static inline vf v_load_tail(const float *p, int32_t n) { return n > 0 ? *p : 0.0f; }
#if defined(FP_FAST_FMAF)
/* fmaf is one instruction here (aarch64, or x86 built with -mfma) */
static inline vf v_fma(vf a, vf b, vf c) { return fmaf(a, b, c); }
#else
/* fmaf without FMA hardware, exactly (glibc's software fmaf is exact too,
 * but switches the rounding mode on every call: ~50x slower). a*b is exact
 * in double (24 + 24 bits); p + c is rounded to double and its error
 * recovered exactly by TwoSum (Knuth); the double is then made round-to-odd
 * (an inexact result gets an odd last bit), and one rounding of a
 * round-to-odd value with >= 2 extra bits is the correctly rounded result
 * (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
 * algorithms using rounding to odd", IEEE TC 2008). Overflow cannot happen
 * in double for float inputs; inf and NaN pass through the plain sum. */
static inline vf v_fma(vf a, vf b, vf c)
{
    const double p = (double)a * (double)b, cd = (double)c;
    double s = p + cd;
    if (!isfinite(s))
        return (float)s;
    const double bv = s - p, err = (p - (s - bv)) + (cd - bv); /* TwoSum: p + cd = s + err exactly */
    if (err != 0.0) {
        uint64_t bits;
        memcpy(&bits, &s, sizeof bits);
        if (!(bits & 1u)) /* even: step to the odd neighbour on the side of the exact sum */
            bits = (err > 0.0) == (s > 0.0) ? bits + 1u : bits - 1u;
        memcpy(&s, &bits, sizeof s);
    }
    return (float)s;
}
#endif
static inline vf v_load_bf16(const uint16_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline vf v_load_i8(const int8_t *p, float s) { return (float)*p * s; }
static inline float v_hsum(const vf *a)
{
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++)
        s8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#else
#error "unknown CPU_GEMM_VARIANT (expected avx512, avx2 or generic)"
#endif

_Static_assert(VL * VPS == GEMM_LANES, "a variant holds exactly the 16 canonical lanes");

/* How a tile reads w (cpu_wt.h): f32, bf16 (widened in registers), int8 in
 * whole blocks (K % 32 == 0: a VL-lane load never crosses a block, one
 * scale per load), int8 element by element (any K). Every way yields, lane
 * for lane, cpu_wt_get()'s value, so the canonical order runs on the same
 * numbers whatever the type's layout. */
enum { WK_F32 = 0, WK_BF16, WK_I8, WK_I8_ANY, WK_COUNT };

/* Where row j of a tile starts: for f32 / bf16 its first element, for
 * whole int8 blocks its first block (e_row is a multiple of 32 there). */
static inline __attribute__((always_inline)) const unsigned char *w_row(const void *w, int64_t e_row, const int wk)
{
    if (wk == WK_F32)
        return (const unsigned char *)((const float *)w + e_row);
    if (wk == WK_BF16)
        return (const unsigned char *)((const uint16_t *)w + e_row);
    if (wk == WK_I8)
        return (const unsigned char *)w + (uint64_t)e_row / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
    return (const unsigned char *)w;
}

/* VL weights k .. k+VL-1 of a row (row = w_row(w, e_row)) */
static inline __attribute__((always_inline)) vf w_load(const void *w, const unsigned char *row, int64_t e_row,
                                                       int32_t k, const int wk)
{
    if (wk == WK_F32)
        return v_load((const float *)row + k);
    if (wk == WK_BF16)
        return v_load_bf16((const uint16_t *)row + k);
    if (wk == WK_I8) {
        const unsigned char *blk = row + (uint32_t)k / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
        float s;
        memcpy(&s, blk, sizeof s);
        return v_load_i8((const int8_t *)(blk + 4 + (uint32_t)k % CPU_I8_GROUP), s);
    }
    float t[VL];
    for (int l = 0; l < VL; l++)
        t[l] = cpu_wt_get(w, CPU_WT_I8, e_row + k + l);
    return v_load(t);
}

/* Batch-1 decode streams w from memory once, one tile of NR rows after the
 * other: NR short streams of K elements each. How many cache lines are in
 * flight then limits the bandwidth, and a bf16 or int8 tile issues more
 * instructions per line than an f32 one (it also converts), so without
 * help it keeps fewer lines in flight and gains little from its smaller
 * size. Tiles of one row of x therefore prefetch each row GEMM_PF_BYTES
 * ahead of the element they read into L2 (w is one contiguous [N][K]
 * array: the NR streams of a tile together cover, one line each, the tile
 * about 16 KiB further on). Measured on this 2-core Zen 4 (4096 x 768 at
 * M = 1, 2 threads, 12 matrices in rotation, interleaved A/B under load):
 * no prefetch f32 / bf16 / int8 ~880 / 730 / 560 us; 4 KiB into L1 ~900 /
 * 660 / 430; 8 KiB into L2 ~690 / 420 / 380; 16 KiB into L2 ~600 / 370 /
 * 380 (L2 has more miss buffers than L1). A hint only: no value changes.
 * On a Zen 5 (2026-11-27, gemm_bench 1 decode 8 cputime) locality 0
 * (prefetchnta) and 3 (prefetcht0) measured within the noise of 1, as did
 * two steps per iteration for bf16 / int8 (bench/RESULTS.md). */
#ifndef GEMM_PF_BYTES
#define GEMM_PF_BYTES 16384
#endif
#ifndef GEMM_PF_LOCALITY
#define GEMM_PF_LOCALITY 1 /* prefetcht2 */
#endif
static inline __attribute__((always_inline)) void w_prefetch(const unsigned char *row, int32_t k, const int wk)
{
    if (GEMM_PF_BYTES <= 0 || wk == WK_I8_ANY)
        return;
    const size_t off = wk == WK_F32 ? (size_t)k * 4u
                     : wk == WK_BF16 ? (size_t)k * 2u
                                     : (size_t)k / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
    __builtin_prefetch(row + off + GEMM_PF_BYTES, 0, GEMM_PF_LOCALITY); /* into L2 (prefetcht2) */
}

/* weights [k, k + n) of a row, zeros after (n may be <= 0 or >= VL) */
static inline __attribute__((always_inline)) vf w_load_tail(const void *w, const unsigned char *row, int64_t e_row,
                                                            int32_t k, int32_t n, const int wk)
{
    if (wk == WK_F32)
        return v_load_tail((const float *)row + k, n);
    float t[VL];
    for (int l = 0; l < VL; l++)
        t[l] = l < n ? cpu_wt_get(w, wk == WK_BF16 ? CPU_WT_BF16 : CPU_WT_I8, e_row + k + l) : 0.0f;
    return v_load(t);
}

#if GEMM_ID == GEMM_ID_avx2
/* The AVX2 tile for 2 <= M < 16 (24 where K > 1024; pk_cols takes larger M). Each output
 * needs two ymm accumulators (lanes 0-7 and 8-15), and 16 ymm registers
 * hold only 12 accumulators beside the operands; a 2 x 3 tile of both
 * halves would need 5 loads per 6 FMAs.
 * Instead the 4 x 3 tile walks k in chunks of GEMM_KC: within a chunk, the
 * low halves of all 12 outputs accumulate over the whole chunk (12 ymm in
 * registers, 7 loads per 12 FMAs), then the high halves do the same over
 * the same chunk (its x and w rows are still in L1); the other half's
 * accumulators wait in acc_mem. Every lane still takes its k in increasing
 * order, so this is the canonical order, only scheduled differently. */
static inline __attribute__((always_inline)) void
gemm_tile(float *y, int64_t ldy, const float *x, const void *w, int64_t e0, int32_t K, const int mr, const int nr,
          const int wk)
{
    float acc_mem[VPS][MR][NR][VL] __attribute__((aligned(32)));
    const unsigned char *row[NR];
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
        row[j] = w_row(w, e0 + (int64_t)j * K, wk);
#pragma GCC unroll 2
    for (int h = 0; h < VPS; h++)
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                _mm256_store_ps(acc_mem[h][i][j], v_zero());
    const int32_t kfull = K / GEMM_LANES * GEMM_LANES;
    for (int32_t kc = 0; kc < K; kc += GEMM_KC) {
        const int32_t ke = kc + GEMM_KC < kfull ? kc + GEMM_KC : kfull;
        const int tail = kc + GEMM_KC >= K && kfull < K; /* this chunk ends in the padded step */
#pragma GCC unroll 2
        for (int h = 0; h < VPS; h++) {
            vf a[MR][NR];
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    a[i][j] = _mm256_load_ps(acc_mem[h][i][j]);
            for (int32_t k = kc; k < ke; k += GEMM_LANES) {
                if (mr == 1 && h == 0 &&
                    (wk == WK_F32 || (wk == WK_BF16 && k % 32 == 0) || (wk == WK_I8 && k % 32 == 0)))
#pragma GCC unroll 8
                    for (int j = 0; j < nr; j++)
                        w_prefetch(row[j], k, wk);
                vf wv[NR];
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    wv[j] = w_load(w, row[j], e0 + (int64_t)j * K, k + h * VL, wk);
#pragma GCC unroll 8
                for (int i = 0; i < mr; i++) {
                    vf xv = v_load(x + (int64_t)i * K + k + h * VL);
#pragma GCC unroll 8
                    for (int j = 0; j < nr; j++)
                        a[i][j] = v_fma(xv, wv[j], a[i][j]);
                }
            }
            if (tail) {
                const int32_t rem = K - kfull - h * VL; /* lanes of this half inside K */
                vf wv[NR];
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    wv[j] = w_load_tail(w, row[j], e0 + (int64_t)j * K, kfull + h * VL, rem, wk);
#pragma GCC unroll 8
                for (int i = 0; i < mr; i++) {
                    vf xv = v_load_tail(x + (int64_t)i * K + kfull + h * VL, rem);
#pragma GCC unroll 8
                    for (int j = 0; j < nr; j++)
                        a[i][j] = v_fma(xv, wv[j], a[i][j]);
                }
            }
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    _mm256_store_ps(acc_mem[h][i][j], a[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            const vf pair[2] = {_mm256_load_ps(acc_mem[0][i][j]), _mm256_load_ps(acc_mem[1][i][j])};
            y[(int64_t)i * ldy + j] = v_hsum(pair);
        }
}
#endif

/* Columns of the batch-1 tile (gemv_tile below): AVX2 holds both halves of
 * 6 outputs in 12 ymm registers when there is one row of x. */
#if GEMM_ID == GEMM_ID_avx2
#define GEMV_NR 6
#else
#define GEMV_NR NR
#endif
#define TILE_NR (GEMV_NR > NR ? GEMV_NR : NR)

/* One register tile; mr, nr are compile-time constants at every call site,
 * and the loops over them are unrolled (also at -O2) so that acc and wv live
 * in registers. The tile of every variant but AVX2's (whose gemm_tile above
 * keeps half the accumulators in memory), and AVX2's batch-1 tile. */
static inline __attribute__((always_inline)) void
gemm_tile_regs(float *y, int64_t ldy, const float *x, const void *w, int64_t e0, int32_t K, const int mr,
               const int nr, const int wk)
{
    vf acc[MR][TILE_NR][VPS];
    const unsigned char *row[TILE_NR];
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++)
        row[j] = w_row(w, e0 + (int64_t)j * K, wk);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
#pragma GCC unroll 16
            for (int h = 0; h < VPS; h++)
                acc[i][j][h] = v_zero();
    int32_t k = 0;
    for (; k + GEMM_LANES <= K; k += GEMM_LANES) {
        /* a line per 64 bytes read (f32 every step, bf16 every other), int8
         * every 36 bytes (one block) so that no line of its 72-byte pairs is skipped */
        if (mr == 1 && (wk == WK_F32 || (wk == WK_BF16 && k % 32 == 0) || (wk == WK_I8 && k % 32 == 0)))
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                w_prefetch(row[j], k, wk);
#pragma GCC unroll 16
        for (int h = 0; h < VPS; h++) {
            vf wv[TILE_NR];
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                wv[j] = w_load(w, row[j], e0 + (int64_t)j * K, k + h * VL, wk);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) {
                vf xv = v_load(x + (int64_t)i * K + k + h * VL);
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    acc[i][j][h] = v_fma(xv, wv[j], acc[i][j][h]);
            }
        }
    }
    if (k < K) {
        const int32_t rem = K - k; /* 1..15 lanes left, the rest read as 0 */
#pragma GCC unroll 16
        for (int h = 0; h < VPS; h++) {
            vf wv[TILE_NR];
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                wv[j] = w_load_tail(w, row[j], e0 + (int64_t)j * K, k + h * VL, rem - h * VL, wk);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) {
                vf xv = v_load_tail(x + (int64_t)i * K + k + h * VL, rem - h * VL);
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    acc[i][j][h] = v_fma(xv, wv[j], acc[i][j][h]);
            }
        }
    }
#if defined(GEMM_HSUM16)
    if (mr * nr >= 8) {
        /* the reductions of up to 16 accumulators share one shuffle network */
#pragma GCC unroll 2
        for (int g = 0; g < mr * nr; g += 16) {
            vf in[16];
            float out[16];
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                const int a = g + l; /* accumulator a = row a / nr, column a % nr */
                in[4 * (l % 4) + l / 4] = a < mr * nr ? acc[a / nr][a % nr][0] : v_zero();
            }
            _mm512_storeu_ps(out, v_hsum16(in));
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                const int a = g + l;
                if (a < mr * nr)
                    y[(int64_t)(a / nr) * ldy + a % nr] = out[l];
            }
        }
        return;
    }
#endif
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            y[(int64_t)i * ldy + j] = v_hsum(acc[i][j]);
}
#if GEMM_ID != GEMM_ID_avx2
#define gemm_tile gemm_tile_regs
#endif

typedef void (*gemm_tile_fn)(float *y, int64_t ldy, const float *x, const void *w, int64_t e0, int32_t K);

#define GEMM_DEF1(wk, mr, nr)                                                                             \
    static void gemm_tile_##wk##_##mr##_##nr(float *y, int64_t ldy, const float *x, const void *w, int64_t e0, \
                                             int32_t K)                                                   \
    {                                                                                                     \
        gemm_tile(y, ldy, x, w, e0, K, mr, nr, wk);                                                       \
    }
#define GEMM_DEF(mr, nr) GEMM_DEF1(WK_F32, mr, nr) GEMM_DEF1(WK_BF16, mr, nr) GEMM_DEF1(WK_I8, mr, nr) \
    GEMM_DEF1(WK_I8_ANY, mr, nr)

/* gemm_tiles[wk][mr][nr] for 1 <= mr <= MR, 1 <= nr <= NR */
#if MR == 4 && NR == 6
#define GEMM_DEF_ROW(mr) GEMM_DEF(mr, 1) GEMM_DEF(mr, 2) GEMM_DEF(mr, 3) GEMM_DEF(mr, 4) GEMM_DEF(mr, 5) GEMM_DEF(mr, 6)
#define GEMM_ROW(wk, mr)                                                                                  \
    {NULL, gemm_tile_##wk##_##mr##_1, gemm_tile_##wk##_##mr##_2, gemm_tile_##wk##_##mr##_3,                 \
     gemm_tile_##wk##_##mr##_4, gemm_tile_##wk##_##mr##_5, gemm_tile_##wk##_##mr##_6}
GEMM_DEF_ROW(1)
GEMM_DEF_ROW(2)
GEMM_DEF_ROW(3)
GEMM_DEF_ROW(4)
#define GEMM_TABLE(wk) {{NULL}, GEMM_ROW(wk, 1), GEMM_ROW(wk, 2), GEMM_ROW(wk, 3), GEMM_ROW(wk, 4)}
#elif MR == 4 && NR == 3
#define GEMM_DEF_ROW(mr) GEMM_DEF(mr, 1) GEMM_DEF(mr, 2) GEMM_DEF(mr, 3)
#define GEMM_ROW(wk, mr) {NULL, gemm_tile_##wk##_##mr##_1, gemm_tile_##wk##_##mr##_2, gemm_tile_##wk##_##mr##_3}
GEMM_DEF_ROW(1)
GEMM_DEF_ROW(2)
GEMM_DEF_ROW(3)
GEMM_DEF_ROW(4)
#define GEMM_TABLE(wk) {{NULL}, GEMM_ROW(wk, 1), GEMM_ROW(wk, 2), GEMM_ROW(wk, 3), GEMM_ROW(wk, 4)}
#elif MR == 2 && NR == 4
#define GEMM_DEF_ROW(mr) GEMM_DEF(mr, 1) GEMM_DEF(mr, 2) GEMM_DEF(mr, 3) GEMM_DEF(mr, 4)
#define GEMM_ROW(wk, mr)                                                                                  \
    {NULL, gemm_tile_##wk##_##mr##_1, gemm_tile_##wk##_##mr##_2, gemm_tile_##wk##_##mr##_3,                 \
     gemm_tile_##wk##_##mr##_4}
GEMM_DEF_ROW(1)
GEMM_DEF_ROW(2)
#define GEMM_TABLE(wk) {{NULL}, GEMM_ROW(wk, 1), GEMM_ROW(wk, 2)}
#else
#error "add the tile table for this MR x NR"
#endif
static const gemm_tile_fn gemm_tiles[WK_COUNT][MR + 1][NR + 1] = {
    GEMM_TABLE(WK_F32), GEMM_TABLE(WK_BF16), GEMM_TABLE(WK_I8), GEMM_TABLE(WK_I8_ANY)};

/* The batch-1 tiles: one row of x, nr <= GEMV_NR rows of w, all
 * accumulators in registers (gemm_tile_regs). */
#define GEMV_DEF1(wk, nr)                                                                                 \
    static void gemv_tile_##wk##_##nr(float *y, int64_t ldy, const float *x, const void *w, int64_t e0,   \
                                      int32_t K)                                                          \
    {                                                                                                     \
        gemm_tile_regs(y, ldy, x, w, e0, K, 1, nr, wk);                                                   \
    }
#define GEMV_DEF(nr) GEMV_DEF1(WK_F32, nr) GEMV_DEF1(WK_BF16, nr) GEMV_DEF1(WK_I8, nr) GEMV_DEF1(WK_I8_ANY, nr)
#if GEMV_NR == 6
GEMV_DEF(1) GEMV_DEF(2) GEMV_DEF(3) GEMV_DEF(4) GEMV_DEF(5) GEMV_DEF(6)
#define GEMV_ROW(wk)                                                                                      \
    {NULL, gemv_tile_##wk##_1, gemv_tile_##wk##_2, gemv_tile_##wk##_3, gemv_tile_##wk##_4, gemv_tile_##wk##_5, \
     gemv_tile_##wk##_6}
#elif GEMV_NR == 4
GEMV_DEF(1) GEMV_DEF(2) GEMV_DEF(3) GEMV_DEF(4)
#define GEMV_ROW(wk) {NULL, gemv_tile_##wk##_1, gemv_tile_##wk##_2, gemv_tile_##wk##_3, gemv_tile_##wk##_4}
#else
#error "add the batch-1 tile table for this GEMV_NR"
#endif
static const gemm_tile_fn gemv_tiles[WK_COUNT][GEMV_NR + 1] = {GEMV_ROW(WK_F32), GEMV_ROW(WK_BF16), GEMV_ROW(WK_I8),
                                                               GEMV_ROW(WK_I8_ANY)};

#if GEMM_ID == GEMM_ID_avx2
/* The AVX2 lane-major path (M >= PK_MIN_M). Lane l of the canonical order
 * (cpu_gemm.h) is a dot product of its own: the fmas over k = l, l+16, ...
 * (S = ceil(K / 16) steps, zero-padded past K) from +0, and the 16 lanes
 * meet only in the final tree. So the product is 16 independent GEMMs of
 * depth S, y = tree over l of x_l @ w_l^T with x_l = x[:, l::16], and each
 * of those runs as an ordinary outer-product GEMM: the ymm elements of an
 * accumulator are 8 columns of y (the same lane), x elements are broadcast,
 * and an element of x is used for 24 columns, not 3 as in gemm_tile above
 * (which is bound by reading x from L2 twice per k: 0.67 bytes per flop).
 *
 *   x block packed: xp [mc/4][16][S][4]   xp[t][l][s][i] = x[m0+4t+i][16s+l]
 *   w panel packed: wp [16][S][24]        wp[l][s][c]    = w[n+c][16s+l]
 * (zeros past K, past the block's rows and past the panel's columns; w
 * widened to f32 while packing, so bf16 and int8 weights are converted
 * once per panel instead of once per row tile.) The 4 x 24 register tile
 * (pk_tile): 12 ymm accumulators, 3 w loads and 4 broadcasts per 12 FMAs,
 * the lane slice of the w panel (S x 96 bytes) in L1 across the row tiles
 * of the block, x streaming from L2 at 16 bytes per 12 FMAs.
 *
 * The tree without a 16-lane buffer: the lanes run in the order
 * pk_order = 0 8 4 12 2 10 6 14 1 9 5 13 3 11 7 15, the leaves of the tree
 * left to right, and a tile's result after the p-th lane is merged with the
 * partial sums on a stack of at most 4 slots: as many additions as p has
 * trailing one bits (lane 8 adds lane 0's slot: s8[0]; lane 12 adds lane
 * 4's, then s8[0]: s4[0]; ... lane 15 ends in y = s2[0] + s2[1]). Each sum
 * pairs exactly the operands of the canonical tree (an IEEE addition is
 * commutative), so every output gets the same bits as gemm_tile's.
 * Buffers: x block + one w panel + 4 slots per row tile, up to ~2.3 MiB,
 * kept per thread between calls (pk_scratch): malloc'd per call they were
 * returned to the kernel and faulted in again, 2 MiB at a time (perf,
 * `pagedgen perplexity`: ~1.5% of the samples zeroing pages); where the
 * allocation fails the call falls back to gemm_tile.
 * Measured (gemm_bench 1 ms=... cputime, Zen 3, 1 thread, loaded machine):
 * at M = 128 gemm_tile ran at 0.60-0.75x OpenBLAS sgemm on the 110m
 * shapes, this path at 0.92-1.0x (70-80 GFLOP/s of a ~90 ceiling); bf16
 * and int8 weights gain alike (they are widened once per panel). */
#define PK_MR 4  /* rows of x per register tile */
#define PK_NV 3  /* ymm of columns per register tile */
#define PK_NR 24 /* = PK_NV * VL columns: the w panel */
/* Bytes of packed x per row block (mc = PK_X_BYTES / (64 S) rows, a
 * multiple of 4). The x lane slices stream sequentially (16 bytes per 12
 * FMAs), so the block may live in L3; what a small block costs is packing
 * (and fetching) every w panel again for each block. Measured (1 thread,
 * CPU time, Zen 3, 96-column calls, 768 x 2048 at M = 128): 192 KiB
 * (24 rows) 47, 512 KiB (64 rows) 62, 2 MiB 69 GFLOP/s; 2304 x 768 alike
 * within the noise (65-69). */
#ifndef PK_X_BYTES
#define PK_X_BYTES (2048 * 1024)
#endif
/* The lane-major path runs from PK_MIN_M rows (PK_MIN_M_LONG_K where K >
 * 1024): below that, packing each w panel (and fetching it from L3 in a
 * phase of its own, not overlapped with FMAs as gemm_tile's loads are)
 * costs more than the outer product saves. Measured as above at M = 16:
 * 2304 x 768 gemm_tile 47-54 / lane-major 47-48; 768 x 2048 40-51 / 37-41;
 * at M = 24 and 32 the lane-major path is ahead on both (50 / 47, 45 / 39). */
#ifndef PK_MIN_M
#define PK_MIN_M 16
#endif
#ifndef PK_MIN_M_LONG_K
#define PK_MIN_M_LONG_K 24
#endif
static const unsigned char pk_order[GEMM_LANES] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* 4 x 8 transpose of r[0..3] (8 lanes of 4 rows), stored as 4 floats per
 * lane: lane j at dst + j * lane_stride */
static inline __attribute__((always_inline)) void pk_store_x4(float *dst, int64_t lane_stride, const vf r[PK_MR])
{
    /* u[j] holds rows 0..3 of lane j (low 128 bits) and of lane j + 4 (high) */
    const vf t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const vf t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const vf u[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                     _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        _mm_storeu_ps(dst + j * lane_stride, _mm256_castps256_ps128(u[j]));
        _mm_storeu_ps(dst + (j + 4) * lane_stride, _mm256_extractf128_ps(u[j], 1));
    }
}

/* xp [ceil(rows/4)][16][S][4] from x rows [0, rows) of length K: whole
 * tiles over whole 16-lane steps in a branch-free loop, the partial step
 * at the end of K and a partial tile (zero rows) through v_load_tail */
static void pk_pack_x(float *xp, const float *x, int32_t rows, int32_t K, int32_t S)
{
    const int64_t lane_stride = (int64_t)S * PK_MR; /* floats from lane l to lane l + 1 */
    for (int32_t t = 0; t * PK_MR < rows; t++) {
        float *dst = xp + (int64_t)t * GEMM_LANES * S * PK_MR;
        const float *x0 = x + (int64_t)t * PK_MR * K;
        const int32_t s_whole = (t + 1) * PK_MR <= rows ? K / GEMM_LANES : 0;
        for (int32_t s = 0; s < s_whole; s++)
#pragma GCC unroll 2
            for (int h = 0; h < VPS; h++) {
                const int32_t k = s * GEMM_LANES + h * VL;
                vf r[PK_MR];
#pragma GCC unroll 4
                for (int i = 0; i < PK_MR; i++)
                    r[i] = v_load(x0 + (int64_t)i * K + k);
                pk_store_x4(dst + h * VL * lane_stride + (int64_t)s * PK_MR, lane_stride, r);
            }
        for (int32_t s = s_whole; s < S; s++)
            for (int h = 0; h < VPS; h++) {
                const int32_t k = s * GEMM_LANES + h * VL;
                vf r[PK_MR];
                for (int i = 0; i < PK_MR; i++)
                    r[i] = t * PK_MR + i < rows ? v_load_tail(x0 + (int64_t)i * K + k, K - k) : v_zero();
                pk_store_x4(dst + h * VL * lane_stride + (int64_t)s * PK_MR, lane_stride, r);
            }
    }
}

/* 8 x 8 transpose of r in place: r[j] becomes element j of the 8 inputs */
static inline __attribute__((always_inline)) void pk_transpose8(vf r[VL])
{
    const vf t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const vf t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const vf t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const vf t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const vf u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const vf u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const vf u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const vf u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* wp [16][S][24]: columns [0, ncols) of the panel of w rows starting at
 * element e0 (w [N][K] of kind wk), groups of 8 columns up to
 * ceil(ncols / 8) (the later groups are never read). Whole groups over
 * whole 16-lane steps take the branch-free loop; a group's partial step at
 * the end of K and a partial group go through w_load_tail. */
static inline __attribute__((always_inline)) void pk_pack_w(float *wp, const void *w, int64_t e0, int32_t ncols,
                                                            int32_t K, int32_t S, const int wk)
{
    const int64_t lane_stride = (int64_t)S * PK_NR; /* floats from lane l to lane l + 1 */
    const int32_t s_full = ncols >= VL ? K / GEMM_LANES : 0;
    for (int g = 0; g * VL < ncols; g++) {
        const int64_t e_g = e0 + (int64_t)g * VL * K;
        const int32_t s_whole = (g + 1) * VL <= ncols ? s_full : 0; /* steps of the branch-free loop */
        const unsigned char *row[VL];
#pragma GCC unroll 8
        for (int c = 0; c < VL; c++)
            row[c] = w_row(w, e_g + (int64_t)c * K, wk);
        for (int32_t s = 0; s < s_whole; s++)
#pragma GCC unroll 2
            for (int h = 0; h < VPS; h++) {
                const int32_t k = s * GEMM_LANES + h * VL;
                vf r[VL];
#pragma GCC unroll 8
                for (int c = 0; c < VL; c++)
                    r[c] = w_load(w, row[c], e_g + (int64_t)c * K, k, wk);
                pk_transpose8(r);
                float *dst = wp + (int64_t)h * VL * lane_stride + (int64_t)s * PK_NR + g * VL;
#pragma GCC unroll 8
                for (int j = 0; j < VL; j++)
                    _mm256_storeu_ps(dst + j * lane_stride, r[j]);
            }
        for (int32_t s = s_whole; s < S; s++)
            for (int h = 0; h < VPS; h++) {
                const int32_t k = s * GEMM_LANES + h * VL;
                vf r[VL];
                for (int c = 0; c < VL; c++)
                    r[c] = g * VL + c < ncols ? w_load_tail(w, row[c], e_g + (int64_t)c * K, k, K - k, wk) : v_zero();
                pk_transpose8(r);
                float *dst = wp + (int64_t)h * VL * lane_stride + (int64_t)s * PK_NR + g * VL;
                for (int j = 0; j < VL; j++)
                    _mm256_storeu_ps(dst + j * lane_stride, r[j]);
            }
    }
}

/* One lane of one register tile: mr rows x nv * 8 columns over the S steps
 * of lane slices xl [S][4] and wl [S][24], then the p-th step of the tree
 * (pk_order): merged with the slots on top of the tile's stack (slot d at
 * slots + d * slot_stride, [4][24] each), pushed, or (p = 15) written to
 * y [mr][ldy], columns [0, ncols). */
static inline __attribute__((always_inline)) void pk_tile(const float *xl, const float *wl, int32_t S, float *slots,
                                                          int64_t slot_stride, int p, float *y, int64_t ldy,
                                                          int32_t ncols, const int mr, const int nv)
{
    vf acc[PK_MR][PK_NV];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
        for (int j = 0; j < nv; j++)
            acc[i][j] = v_zero();
#pragma GCC unroll 2
    for (int32_t s = 0; s < S; s++) {
        vf wv[PK_NV];
#pragma GCC unroll 3
        for (int j = 0; j < nv; j++)
            wv[j] = _mm256_loadu_ps(wl + (int64_t)s * PK_NR + j * VL);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const vf b = _mm256_broadcast_ss(xl + (int64_t)s * PK_MR + i);
#pragma GCC unroll 3
            for (int j = 0; j < nv; j++)
                acc[i][j] = v_fma(b, wv[j], acc[i][j]);
        }
    }
    const int depth = __builtin_popcount((unsigned)p), merges = __builtin_ctz(~(unsigned)p);
    for (int t = 1; t <= merges; t++) {
        const float *sl = slots + (int64_t)(depth - t) * slot_stride;
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
            for (int j = 0; j < nv; j++)
                acc[i][j] = _mm256_add_ps(_mm256_loadu_ps(sl + i * PK_NR + j * VL), acc[i][j]);
    }
    if (p == GEMM_LANES - 1) {
        static const int32_t mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
            for (int j = 0; j < nv; j++) {
                float *dst = y + (int64_t)i * ldy + j * VL;
                if (j < nv - 1 || ncols >= nv * VL)
                    _mm256_storeu_ps(dst, acc[i][j]);
                else
                    _mm256_maskstore_ps(dst, _mm256_loadu_si256((const __m256i *)(mask + VL - (ncols - j * VL))),
                                        acc[i][j]);
            }
        return;
    }
    float *sl = slots + (int64_t)(depth - merges) * slot_stride;
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
        for (int j = 0; j < nv; j++)
            _mm256_storeu_ps(sl + i * PK_NR + j * VL, acc[i][j]);
}

typedef void (*pk_tile_fn)(const float *xl, const float *wl, int32_t S, float *slots, int64_t slot_stride, int p,
                           float *y, int64_t ldy, int32_t ncols);
#define PK_DEF(mr, nv)                                                                                    \
    static void pk_tile_##mr##_##nv(const float *xl, const float *wl, int32_t S, float *slots,            \
                                    int64_t slot_stride, int p, float *y, int64_t ldy, int32_t ncols)     \
    {                                                                                                     \
        pk_tile(xl, wl, S, slots, slot_stride, p, y, ldy, ncols, mr, nv);                                 \
    }
#define PK_DEF_ROW(mr) PK_DEF(mr, 1) PK_DEF(mr, 2) PK_DEF(mr, 3)
PK_DEF_ROW(1)
PK_DEF_ROW(2)
PK_DEF_ROW(3)
PK_DEF_ROW(4)
#define PK_ROW(mr) {NULL, pk_tile_##mr##_1, pk_tile_##mr##_2, pk_tile_##mr##_3}
/* pk_tiles[mr][nv] for 1 <= mr <= PK_MR, 1 <= nv <= PK_NV */
static const pk_tile_fn pk_tiles[PK_MR + 1][PK_NV + 1] = {{NULL}, PK_ROW(1), PK_ROW(2), PK_ROW(3), PK_ROW(4)};

#define PK_PACK_W_DEF(wk)                                                                                 \
    static void pk_pack_w_##wk(float *wp, const void *w, int64_t e0, int32_t ncols, int32_t K, int32_t S) \
    {                                                                                                     \
        pk_pack_w(wp, w, e0, ncols, K, S, wk);                                                            \
    }
PK_PACK_W_DEF(WK_F32)
PK_PACK_W_DEF(WK_BF16)
PK_PACK_W_DEF(WK_I8)
PK_PACK_W_DEF(WK_I8_ANY)
typedef void (*pk_pack_w_fn)(float *wp, const void *w, int64_t e0, int32_t ncols, int32_t K, int32_t S);
static const pk_pack_w_fn pk_pack_ws[WK_COUNT] = {pk_pack_w_WK_F32, pk_pack_w_WK_BF16, pk_pack_w_WK_I8,
                                                 pk_pack_w_WK_I8_ANY};

/* This thread's pk_cols buffer of at least n floats, or NULL. The buffer
 * lives as long as the thread (freed by the key's destructor when a pool
 * thread exits; the main thread's stays reachable until exit). */
static pthread_key_t pk_key;
static pthread_once_t pk_key_once = PTHREAD_ONCE_INIT;
typedef struct pk_scratch_buf {
    size_t cap;
    float *p;
} pk_scratch_buf;
static void pk_scratch_free(void *v)
{
    pk_scratch_buf *b = v;
    free(b->p);
    free(b);
}
static void pk_key_make(void)
{
    (void)pthread_key_create(&pk_key, pk_scratch_free);
}
static float *pk_scratch(size_t n)
{
    (void)pthread_once(&pk_key_once, pk_key_make);
    pk_scratch_buf *b = pthread_getspecific(pk_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(pk_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->cap < n) {
        free(b->p);
        b->p = malloc(n * sizeof(float));
        b->cap = b->p ? n : 0;
    }
    return b->p;
}

/* Columns [n0, n1) of y for all M rows on the lane-major path; 0 on
 * success, -1 (nothing written) where its buffers cannot be allocated. */
static int pk_cols(float *y, int64_t ldy, const float *x, const void *w, int wk, int32_t M, int32_t K, int32_t n0,
                   int32_t n1)
{
    const int32_t S = (K + GEMM_LANES - 1) / GEMM_LANES;
    /* rows per block: as many as PK_X_BYTES hold, the blocks evened out */
    int32_t mc = (int32_t)(PK_X_BYTES / ((int64_t)S * GEMM_LANES * (int64_t)sizeof(float)));
    mc = mc < 2 * PK_MR ? 2 * PK_MR : mc / PK_MR * PK_MR;
    const int32_t blocks = (M + mc - 1) / mc;
    mc = ((M + blocks - 1) / blocks + PK_MR - 1) / PK_MR * PK_MR;
    const int32_t tiles = mc / PK_MR;
    const size_t x_floats = (size_t)mc * GEMM_LANES * S, w_floats = (size_t)GEMM_LANES * S * PK_NR;
    const int64_t slot_stride = (int64_t)tiles * PK_MR * PK_NR;
    float *buf = pk_scratch(x_floats + w_floats + 4 * (size_t)slot_stride);
    if (!buf)
        return -1;
    float *xp = buf, *wp = xp + x_floats, *slots = wp + w_floats;
    for (int32_t mb = 0; mb < M; mb += mc) {
        const int32_t rows = M - mb < mc ? M - mb : mc;
        pk_pack_x(xp, x + (int64_t)mb * K, rows, K, S);
        for (int32_t n = n0; n < n1; n += PK_NR) {
            const int32_t ncols = n1 - n < PK_NR ? n1 - n : PK_NR, nv = (ncols + VL - 1) / VL;
            pk_pack_ws[wk](wp, w, (int64_t)n * K, ncols, K, S);
            for (int p = 0; p < GEMM_LANES; p++) {
                const int l = pk_order[p];
                for (int32_t t = 0; t * PK_MR < rows; t++) {
                    const int32_t mr = rows - t * PK_MR < PK_MR ? rows - t * PK_MR : PK_MR;
                    pk_tiles[mr][nv](xp + ((int64_t)t * GEMM_LANES + l) * S * PK_MR, wp + (int64_t)l * S * PK_NR,
                                     S, slots + (int64_t)t * PK_MR * PK_NR, slot_stride, p,
                                     y + (int64_t)(mb + t * PK_MR) * ldy + n, ldy, ncols);
                }
            }
        }
    }
    return 0;
}
#endif

void GEMM_COLS_FN(float *y, int64_t ldy, const float *x, const void *w, int32_t wt, int32_t M, int32_t K, int32_t n0,
                  int32_t n1)
{
    const int wk = wt == CPU_WT_BF16 ? WK_BF16
                 : wt == CPU_WT_I8   ? (K % CPU_I8_GROUP == 0 ? WK_I8 : WK_I8_ANY)
                                     : WK_F32;
    if (M == 1) { /* batch-1 decode: stream w once, GEMV_NR rows at a time */
        for (int32_t n = n0; n < n1; n += GEMV_NR) {
            const int32_t nr = n1 - n < GEMV_NR ? n1 - n : GEMV_NR;
            gemv_tiles[wk][nr](y + n, ldy, x, w, (int64_t)n * K, K);
        }
        return;
    }
#if GEMM_ID == GEMM_ID_avx2
    if (M >= (K > 1024 ? PK_MIN_M_LONG_K : PK_MIN_M) && pk_cols(y, ldy, x, w, wk, M, K, n0, n1) == 0)
        return;
#endif
    /* A block of mc rows of x (about 512 KiB) stays in L2 while each tile
     * of NR rows of w (<= NR * K * 4 bytes) sits in L1 and the row tiles of
     * the block pass over it; w is streamed from memory once per block
     * (once in all for M <= mc). */
    int32_t mc = (int32_t)((512 * 1024 / 4) / (K > 0 ? K : 1));
    mc = mc / MR * MR;
    if (mc < MR)
        mc = MR;
    for (int32_t mb = 0; mb < M; mb += mc) {
        int32_t me = mb + mc < M ? mb + mc : M;
        for (int32_t n = n0; n < n1; n += NR) {
            int32_t nr = n1 - n < NR ? n1 - n : NR;
            const int64_t e0 = (int64_t)n * K;
            for (int32_t m = mb; m < me; m += MR) {
                int32_t mr = me - m < MR ? me - m : MR;
                gemm_tiles[wk][mr][nr](y + (int64_t)m * ldy + n, ldy, x + (int64_t)m * K, w, e0, K);
            }
        }
    }
}
