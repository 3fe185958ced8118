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
 * The padded tail is a real fused multiply-add of 0 * 0 in every variant
 * (it can turn an accumulator of -0 into +0, so skipping it would not be
 * the same order). The generic variant exists for machines without FMA
 * (x86-64 before Haswell / Zen, some Atom-class chips; there each fma is
 * emulated exactly in double arithmetic: correct, a few times slower than
 * the vector kernels) and for non-x86 builds (where fmaf is one
 * instruction and the lanes vectorize).
 */
#include <stdint.h>
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
/* Sixteen v_hsum at once, bit-identical to v_hsum: every output lane sees
 * the same pairings in the same order, (l, l+8), (l, l+4), (l, l+2),
 * (l, l+1) — IEEE addition is commutative, so operand order does not
 * matter. Lane 4c+j of the result is the sum of a[4j+c]. */
#define GEMM_HSUM16 1
static inline vf v_hsum16(const vf *a)
{
    vf r[8], q[4], p[2];
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xDD));
}

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
 * 380 (L2 has more miss buffers than L1). A hint only: no value changes. */
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
/* The AVX2 tile. Each output needs two ymm accumulators (lanes 0-7 and
 * 8-15), and 16 ymm registers hold only 12 accumulators beside the
 * operands; a 2 x 3 tile of both halves would need 5 loads per 6 FMAs.
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
