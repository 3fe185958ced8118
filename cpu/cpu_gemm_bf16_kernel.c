/* cpu_gemm_bf16_kernel: the bf16 mode's column kernel, one variant per
 * compilation (cpu/meson.build: -DCPU_GEMM_VARIANT=generic|avx2|avx512bf16),
 * exported as cpu_gemm_bf16_cols_<variant>. Every variant computes the canonical order of
 * cpu_gemm_modes.h ("bf16": VDPBF16PS's pairs, DAZ in, FTZ out), so all
 * return the same bits; the generic one is the definition written out, the
 * simple twin the others are tested against (tests/ops/test_gemm_bf16.c).
 *
 * Layouts (all variants): y [M][ldy] f32, xb [M][K] bf16 (the activations
 * already rounded, cpu_bf16_round_rows), w [N][K] bf16; columns [n0, n1).
 *
 * The avx2 variant (AVX2 + FMA; no dot instruction): a 32-byte load of 16
 * bf16 at 32c (or 32c + 16) holds, per 32-bit lane, the pair of lane l
 * (l = 0..7, or 8..15): the even element 32c + 2l in the low half, the odd
 * 32c + 2l + 1 in the high half. As f32, odd = v & 0xFFFF0000 and
 * even = v << 16 (exact); then acc = fma(odd_x, odd_w, acc),
 * acc = fma(even_x, even_w, acc): the definition's two steps, lane for
 * lane. DAZ and FTZ are MXCSR's bits, set on entry of the column function
 * (with round to nearest, all exceptions masked) and the caller's MXCSR
 * restored on exit; they also cover the tree's additions. The tail of K is
 * a zero-padded copy of the last partial chunk, so its padded pairs are
 * real fmas of 0 * 0, as defined.
 *   M = 1 (batch-1 decode): a 1 x 6 tile, both halves of its 6 outputs in
 * 12 ymm, w streamed once with prefetch (as the exact kernel's).
 *   M > 1: a block of rows of x is split once per column call (odd f32,
 * then even f32, per half chunk: bf_split_rows) into a 128 KiB stack
 * buffer, and 4 x 3 register tiles walk k as the exact AVX2 tile does
 * (low halves over a k chunk, then high halves), converting only w. Where
 * K > 4096 (8 split rows no longer fit) the tiles convert x as they go.
 *
 * Tininess: x86 decides it after rounding (to 24 bits, unbounded
 * exponent), so an fma whose exact result lies in [FLT_MIN - 2^-150,
 * FLT_MIN - 2^-151) is flushed although its gradual-underflow rounding is
 * FLT_MIN; the generic kernel does the same (bf_fma_ftz), so the two agree
 * there too (tests/ops/test_gemm_bf16.c test_tininess_after_rounding).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_gemm_kernel.h"

/* The batch-1 tiles' prefetch hint (__builtin_prefetch locality: 1 =
 * prefetcht2, into L2), overridable for tuning. On a 2-core Zen 5
 * (2026-11-27, gemm_bench 1 decode 8 cputime, interleaved builds) 0
 * (prefetchnta) and 3 (prefetcht0) measured within the noise of 1 for
 * every kernel (bench/RESULTS.md). */
#ifndef BF_PF_LOCALITY
#define BF_PF_LOCALITY 1
#endif

#if !defined(CPU_GEMM_VARIANT)
#error "cpu_gemm_bf16_kernel.c is compiled with -DCPU_GEMM_VARIANT=avx512bf16|avx2|generic (cpu/meson.build)"
#endif
#define BF_CAT2(a, b) a##b
#define BF_CAT(a, b) BF_CAT2(a, b)
#define BF_COLS_FN BF_CAT(cpu_gemm_bf16_cols_, CPU_GEMM_VARIANT)

/* which variant: compare the macro's spelling (as cpu_gemm_kernel.c) */
#define BF_ID_avx512bf16 1
#define BF_ID_avx2 2
#define BF_ID_generic 3
#define BF_ID BF_CAT(BF_ID_, CPU_GEMM_VARIANT)
#if BF_ID != BF_ID_avx2 && BF_ID != BF_ID_generic && BF_ID != BF_ID_avx512bf16
#error "unknown CPU_GEMM_VARIANT for cpu_gemm_bf16_kernel.c (expected avx512bf16, avx2 or generic)"
#endif

#if BF_ID == BF_ID_generic

/* a subnormal reads (daz) or rounds (ftz) to zero of its sign */
static inline float bf_flush(float v)
{
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

/* element k of a bf16 row, 0 past K, daz'd */
static inline float bf_at(const uint16_t *row, int32_t k, int32_t K)
{
    if (k >= K)
        return 0.0f;
    const uint32_t bits = (uint32_t)row[k] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return bf_flush(f);
}

/* ftz(fma(a, b, c)) with x86's tininess after rounding: a result that
 * rounds (gradually) to +-FLT_MIN is still tiny when its exact value is
 * below FLT_MIN - 2^-151 (rounding it to 24 bits with an unbounded
 * exponent would give less than FLT_MIN). Only then is the exact value
 * needed, and it is exact in double there: every nonzero term is then
 * below 2^-124 and a multiple of 2^-176 (bf16 products, f32 partial sums),
 * which 53 bits hold. */
static inline float bf_fma_ftz(float a, float b, float c)
{
    const float r = fmaf(a, b, c);
    if (fabsf(r) != FLT_MIN)
        return bf_flush(r);
    const double e = (double)a * (double)b + (double)c;
    return fabs(e) < (double)FLT_MIN - 0x1p-151 ? copysignf(0.0f, r) : r;
}

/* The definition: one output at a time, the sixteen lanes in scalars. */
static float bf16_dot_ref(const uint16_t *xr, const uint16_t *wr, int32_t K)
{
    float acc[16] = {0};
    for (int32_t k0 = 0; k0 < K; k0 += 32)
        for (int l = 0; l < 16; l++) {
            const int32_t odd = k0 + 2 * l + 1, even = k0 + 2 * l;
            acc[l] = bf_fma_ftz(bf_at(xr, odd, K), bf_at(wr, odd, K), acc[l]);
            acc[l] = bf_fma_ftz(bf_at(xr, even, K), bf_at(wr, even, K), acc[l]);
        }
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = bf_flush(acc[i] + acc[i + 8]);
    for (int i = 0; i < 4; i++)
        s4[i] = bf_flush(s8[i] + s8[i + 4]);
    for (int i = 0; i < 2; i++)
        s2[i] = bf_flush(s4[i] + s4[i + 2]);
    return bf_flush(s2[0] + s2[1]);
}

void BF_COLS_FN(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M, int32_t K, int32_t n0,
                int32_t n1)
{
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = n0; n < n1; n++)
            y[(int64_t)m * ldy + n] = bf16_dot_ref(xb + (int64_t)m * K, w + (int64_t)n * K, K);
}
#endif /* generic */

#if BF_ID == BF_ID_avx2
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the avx2 variant is compiled with -mavx2 -mfma"
#endif
#include <immintrin.h>

#define BF_CHUNK 32 /* k per chunk: 16 lanes x 1 pair */
#define BF_HALF 16  /* bf16 per ymm load: the pairs of 8 lanes */
#define BF_MR 4     /* register tile: rows of x */
#define BF_NR 3     /* register tile: rows of w (columns of y) */
#define BF_GEMV_NR 6
/* floats of split x rows (bf_split_rows) per column call: 128 KiB on the
 * stack, a block of rows that stays in L2. The split tiles run where at
 * least BF_XS_MIN_ROWS rows fit (K <= 4096): with fewer, w is streamed
 * again for every few rows and the tiles that convert x as they go (with
 * blocks of 512 KiB of bf16 rows) are as fast. Measured, 1 thread, CPU
 * time, 768 x K at M = 64 (Zen 3, loaded): split / converting 58 / 44
 * GFLOP/s at K = 768, 55 / 44 at 2048, 50 / 43 at 4096 (8 rows), 40 / 43 at
 * 8192 (4 rows). */
#define BF_XS_FLOATS 32768
#ifndef BF_XS_MIN_ROWS
#define BF_XS_MIN_ROWS 8
#endif
_Static_assert(BF_XS_MIN_ROWS >= BF_MR, "a block of split rows holds at least one row tile");
/* Bytes of w per column panel of the split path: the panel stays in L2 and
 * each row tile's split x rows (4 x K f32: 12 KiB at K = 768) in L1 while
 * the panel's tiles pass, instead of x streaming from L2 for every column
 * tile. Measured (1 thread, CPU time, loaded Zen 3, 6 interleaved runs):
 * 2304 x 768 at M = 64 mean 59.7 vs 54.3 GFLOP/s; 4096 x 768 at M = 256
 * and 768 x 2048 at M = 256 unchanged within the noise. */
#ifndef BF_PANEL_BYTES
#define BF_PANEL_BYTES (128 * 1024)
#endif
/* k chunk of the half-by-half walk (bf_tile), a multiple of BF_CHUNK: its
 * 4 x rows (16 KiB split, 8 KiB bf16) and 3 w rows (6 KiB) stay in L1
 * between the two halves */
#define BF_KC 1024
/* MXCSR: all exceptions masked (0x1F80), round to nearest even (RC = 0),
 * DAZ (bit 6), FTZ (bit 15) */
#define BF_MXCSR (0x1F80u | 0x0040u | 0x8000u)
/* As the exact kernel's batch-1 tiles (cpu_gemm_kernel.c GEMM_PF_BYTES):
 * each row of w is prefetched this far ahead into L2, one line per chunk. */
#ifndef BF_PF_BYTES
#define BF_PF_BYTES 16384
#endif

_Static_assert(BF_KC % BF_CHUNK == 0, "the walk's k chunk holds whole pair chunks");

/* 16 bf16 at p: lane l's pair, even element low, odd high */
static inline __m256i bf_load(const uint16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* the odd elements as f32 (bits unchanged: exact) */
static inline __m256 bf_odd(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}
/* the even elements as f32 */
static inline __m256 bf_even(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

/* lanes 0..7 in a[0], 8..15 in a[1]: the canonical tree (each add ftz'd by MXCSR) */
static inline float bf_hsum(__m256 lo, __m256 hi)
{
    __m256 s8 = _mm256_add_ps(lo, hi);                                                /* (l, l+8) */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* (l, l+4) */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                               /* (l, l+2) */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                          /* (0, 1) */
    return _mm_cvtss_f32(s1);
}

/* The last partial chunk of n = K % 32 elements of a row at p, zero-padded
 * to a whole chunk: the definition reads 0 past K. */
static inline void bf_pad_tail(uint16_t dst[BF_CHUNK], const uint16_t *p, int32_t n)
{
    memset(dst, 0, BF_CHUNK * sizeof *dst);
    memcpy(dst, p, (size_t)n * sizeof *dst);
}

/* One half of one chunk for an mr x nr tile: x row i at xp + i * xs, w row
 * j at wp + j * ws (16 bf16 each). All odd fmas, then all even ones: each
 * accumulator takes its odd pair element before its even one, as defined.
 * 12 accumulators + 3 w + 1 x + the mask are 17 ymm: GCC spills a few
 * accumulators (the K > 4096 path only; bf_half_step_xs below does not). */
static inline __attribute__((always_inline)) void bf_half_step(__m256 a[BF_MR][BF_NR], const uint16_t *xp,
                                                               int64_t xs, const uint16_t *wp, int64_t ws,
                                                               const int mr, const int nr)
{
    __m256 wv[BF_NR];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++)
        wv[j] = bf_odd(bf_load(wp + j * ws));
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m256 xv = bf_odd(bf_load(xp + i * xs));
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++)
        wv[j] = bf_even(bf_load(wp + j * ws));
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m256 xv = bf_even(bf_load(xp + i * xs));
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
    }
}

/* bf_half_step for x already split (bf_split_rows): x row i's odd
 * elements at xp + i * xs, its even ones 8 floats further. Registers: 12
 * accumulators, 3 w, 1 x — so w's odd elements come from two shifts
 * ((v >> 16) << 16 = v & 0xFFFF0000) rather than from an and with a mask
 * that would take a 17th register; each x load then feeds 3 fmas. Measured
 * (1 thread, CPU time, 2304 x 768 and 768 x 2048 at M = 64, interleaved):
 * ~1.15x the variant that folds the x loads into the fmas and keeps the mask. */
static inline __attribute__((always_inline)) void bf_half_step_xs(__m256 a[BF_MR][BF_NR], const float *xp, int64_t xs,
                                                                  const uint16_t *wp, int64_t ws, const int mr,
                                                                  const int nr)
{
    __m256 wv[BF_NR];
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++)
        wv[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(bf_load(wp + j * ws), 16), 16));
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m256 xv = _mm256_load_ps(xp + i * xs);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++)
        wv[j] = bf_even(bf_load(wp + j * ws));
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        const __m256 xv = _mm256_load_ps(xp + i * xs + 8);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
    }
}

/* Rows [0, rows) of xb [.][K] bf16 -> xs [rows][kpad] f32, "split": per
 * chunk c and half h, at 32c + 16h, the 8 odd elements of the half's pairs
 * as f32, then its 8 even ones; zeros past K (kpad = K rounded up to 32).
 * Only a relayout (the bits of each bf16, widened exactly): a tile then
 * converts only w and loads x as f32 ready for its fmas. */
static void bf_split_rows(float *xs, const uint16_t *xb, int32_t rows, int32_t K, int32_t kpad)
{
    const int32_t kfull = K / BF_CHUNK * BF_CHUNK;
    for (int32_t r = 0; r < rows; r++) {
        const uint16_t *src = xb + (int64_t)r * K;
        float *dst = xs + (int64_t)r * kpad;
        uint16_t t[BF_CHUNK] __attribute__((aligned(32)));
        for (int32_t k = 0; k < kpad; k += BF_CHUNK) {
            const uint16_t *c = src + k;
            if (k >= kfull) {
                bf_pad_tail(t, c, K - kfull);
                c = t;
            }
            for (int h = 0; h < 2; h++) {
                const __m256i v = bf_load(c + h * BF_HALF);
                _mm256_store_ps(dst + k + h * BF_HALF, bf_odd(v));
                _mm256_store_ps(dst + k + h * BF_HALF + 8, bf_even(v));
            }
        }
    }
}

/* The mr x nr register tile: rows x[0..mr) (stride K) times rows
 * w[0..nr) (stride K) into y[i][j] (stride ldy). Two ymm per output (lanes
 * 0-7, 8-15) would need 24 accumulators; as the exact AVX2 tile does, k is
 * walked in chunks of BF_KC: within a chunk the low halves of all outputs
 * accumulate over it in registers, then the high halves over the same
 * chunk (still in L1), the other half waiting in acc_mem. Every lane still
 * takes its chunks in increasing order: the canonical order, scheduled. */
static inline __attribute__((always_inline)) void bf_tile(float *y, int64_t ldy, const void *xv,
                                                          const uint16_t *w, int32_t K, const int mr,
                                                          const int nr, const int xsplit)
{
    float acc_mem[2][BF_MR][BF_NR][8] __attribute__((aligned(32)));
    uint16_t xt[BF_MR][BF_CHUNK] __attribute__((aligned(32)));
    uint16_t wt[BF_NR][BF_CHUNK] __attribute__((aligned(32)));
    const uint16_t *x = xv;        /* bf16 rows, stride K */
    const float *xf = xv;          /* or split rows (xsplit), stride kpad, already padded */
    const int32_t kfull = K / BF_CHUNK * BF_CHUNK, kpad = (K + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
    if (kfull < K) {
#pragma GCC unroll 4
        for (int i = 0; i < mr && !xsplit; i++)
            bf_pad_tail(xt[i], x + (int64_t)i * K + kfull, K - kfull);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            bf_pad_tail(wt[j], w + (int64_t)j * K + kfull, K - kfull);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++)
                _mm256_store_ps(acc_mem[h][i][j], _mm256_setzero_ps());
    for (int32_t kc = 0; kc < K; kc += BF_KC) {
        const int32_t ke = kc + BF_KC < kfull ? kc + BF_KC : kfull;
        const int tail = kc + BF_KC >= K && kfull < K; /* this chunk ends in the padded one */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 a[BF_MR][BF_NR];
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++)
                    a[i][j] = _mm256_load_ps(acc_mem[h][i][j]);
            for (int32_t k = kc; k < ke; k += BF_CHUNK) {
                if (xsplit)
                    bf_half_step_xs(a, xf + k + h * BF_HALF, kpad, w + k + h * BF_HALF, K, mr, nr);
                else
                    bf_half_step(a, x + k + h * BF_HALF, K, w + k + h * BF_HALF, K, mr, nr);
            }
            if (tail && xsplit)
                bf_half_step_xs(a, xf + kfull + h * BF_HALF, kpad, wt[0] + h * BF_HALF, BF_CHUNK, mr, nr);
            else if (tail)
                bf_half_step(a, xt[0] + h * BF_HALF, BF_CHUNK, wt[0] + h * BF_HALF, BF_CHUNK, mr, nr);
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++)
                    _mm256_store_ps(acc_mem[h][i][j], a[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
            y[(int64_t)i * ldy + j] = bf_hsum(_mm256_load_ps(acc_mem[0][i][j]), _mm256_load_ps(acc_mem[1][i][j]));
}

/* One chunk of the batch-1 tile: both halves of nr outputs, x at xp, w row
 * j at wp + j * ws. */
static inline __attribute__((always_inline)) void bf_gemv_step(__m256 a[BF_GEMV_NR][2], const uint16_t *xp,
                                                               const uint16_t *wp, int64_t ws, const int nr)
{
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i xr = bf_load(xp + h * BF_HALF);
        const __m256 xo = bf_odd(xr), xe = bf_even(xr);
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++) {
            const __m256i wr = bf_load(wp + j * ws + h * BF_HALF);
            a[j][h] = _mm256_fmadd_ps(xo, bf_odd(wr), a[j][h]);
            a[j][h] = _mm256_fmadd_ps(xe, bf_even(wr), a[j][h]);
        }
    }
}

/* The batch-1 tile: one row of x, nr <= 6 rows of w, all 2 * nr
 * accumulators in registers; w streams from memory once, each row
 * prefetched BF_PF_BYTES ahead (one 64-byte line = one chunk per row). */
static inline __attribute__((always_inline)) void bf_gemv_tile(float *y, const uint16_t *x, const uint16_t *w,
                                                               int32_t K, const int nr)
{
    __m256 a[BF_GEMV_NR][2];
#pragma GCC unroll 6
    for (int j = 0; j < nr; j++)
        a[j][0] = a[j][1] = _mm256_setzero_ps();
    const int32_t kfull = K / BF_CHUNK * BF_CHUNK;
    for (int32_t k = 0; k < kfull; k += BF_CHUNK) {
        if (BF_PF_BYTES > 0)
#pragma GCC unroll 6
            for (int j = 0; j < nr; j++)
                __builtin_prefetch((const char *)(w + (int64_t)j * K + k) + BF_PF_BYTES, 0, BF_PF_LOCALITY);
        bf_gemv_step(a, x + k, w + k, K, nr);
    }
    if (kfull < K) {
        uint16_t xt[BF_CHUNK] __attribute__((aligned(32)));
        uint16_t wt[BF_GEMV_NR][BF_CHUNK] __attribute__((aligned(32)));
        bf_pad_tail(xt, x + kfull, K - kfull);
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++)
            bf_pad_tail(wt[j], w + (int64_t)j * K + kfull, K - kfull);
        bf_gemv_step(a, xt, wt[0], BF_CHUNK, nr);
    }
#pragma GCC unroll 6
    for (int j = 0; j < nr; j++)
        y[j] = bf_hsum(a[j][0], a[j][1]);
}

/* x: bf16 rows, or split rows (bf_split_rows) for the tiles of bf_tiles[1] */
typedef void (*bf_tile_fn)(float *y, int64_t ldy, const void *x, const uint16_t *w, int32_t K);

#define BF_TILE_DEF1(xsplit, mr, nr)                                                                          \
    static void bf_tile_##xsplit##_##mr##_##nr(float *y, int64_t ldy, const void *x, const uint16_t *w,       \
                                               int32_t K)                                                    \
    {                                                                                                         \
        bf_tile(y, ldy, x, w, K, mr, nr, xsplit);                                                             \
    }
#define BF_TILE_DEF(mr, nr) BF_TILE_DEF1(0, mr, nr) BF_TILE_DEF1(1, mr, nr)
#define BF_TILE_ROW_DEF(mr) BF_TILE_DEF(mr, 1) BF_TILE_DEF(mr, 2) BF_TILE_DEF(mr, 3)
BF_TILE_ROW_DEF(1)
BF_TILE_ROW_DEF(2)
BF_TILE_ROW_DEF(3)
BF_TILE_ROW_DEF(4)
#define BF_TILE_ROW(xsplit, mr) {NULL, bf_tile_##xsplit##_##mr##_1, bf_tile_##xsplit##_##mr##_2, bf_tile_##xsplit##_##mr##_3}
#define BF_TILE_TABLE(xsplit)                                                                                 \
    {{NULL}, BF_TILE_ROW(xsplit, 1), BF_TILE_ROW(xsplit, 2), BF_TILE_ROW(xsplit, 3), BF_TILE_ROW(xsplit, 4)}
/* bf_tiles[xsplit][mr][nr] for 1 <= mr <= BF_MR, 1 <= nr <= BF_NR */
static const bf_tile_fn bf_tiles[2][BF_MR + 1][BF_NR + 1] = {BF_TILE_TABLE(0), BF_TILE_TABLE(1)};

#define BF_GEMV_DEF(nr)                                                                                   \
    static void bf_gemv_##nr(float *y, int64_t ldy, const void *x, const uint16_t *w, int32_t K)         \
    {                                                                                                     \
        (void)ldy;                                                                                        \
        bf_gemv_tile(y, x, w, K, nr);                                                                     \
    }
BF_GEMV_DEF(1)
BF_GEMV_DEF(2)
BF_GEMV_DEF(3)
BF_GEMV_DEF(4)
BF_GEMV_DEF(5)
BF_GEMV_DEF(6)
/* bf_gemvs[nr] for 1 <= nr <= BF_GEMV_NR */
static const bf_tile_fn bf_gemvs[BF_GEMV_NR + 1] = {NULL,     bf_gemv_1, bf_gemv_2, bf_gemv_3,
                                                    bf_gemv_4, bf_gemv_5, bf_gemv_6};

/* The tiles are called through the tables (never inlined here), so no
 * floating-point operation can be scheduled across the MXCSR writes. */
void BF_COLS_FN(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M, int32_t K, int32_t n0,
                int32_t n1)
{
    /* x rows split for the tiles: 128 KiB, a block of rows in L2 */
    float xs[BF_XS_FLOATS] __attribute__((aligned(32)));
    const int32_t kpad = (K + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
    const unsigned int caller_csr = _mm_getcsr();
    _mm_setcsr(BF_MXCSR);
    if (M == 1) { /* batch-1 decode: stream w once, BF_GEMV_NR rows at a time */
        for (int32_t n = n0; n < n1; n += BF_GEMV_NR) {
            const int32_t nr = n1 - n < BF_GEMV_NR ? n1 - n : BF_GEMV_NR;
            bf_gemvs[nr](y + n, ldy, xb, w + (int64_t)n * K, K);
        }
    } else if (kpad > 0 && (int64_t)kpad * BF_XS_MIN_ROWS <= BF_XS_FLOATS) {
        /* A block of mc rows of x, split (bf_split_rows) into xs (in L2);
         * then per panel of w, per row tile, the panel's column tiles. */
        const int32_t mc = BF_XS_FLOATS / kpad / BF_MR * BF_MR;
        for (int32_t mb = 0; mb < M; mb += mc) {
            const int32_t me = mb + mc < M ? mb + mc : M;
            bf_split_rows(xs, xb + (int64_t)mb * K, me - mb, K, kpad);
            /* panels of nc columns of w (BF_PANEL_BYTES, in L2); per row
             * tile, its split x rows stay in L1 while the panel's tiles pass */
            int32_t nc = (int32_t)(BF_PANEL_BYTES / ((int64_t)K * 2)) / BF_NR * BF_NR;
            nc = nc < BF_NR ? BF_NR : nc;
            for (int32_t np = n0; np < n1; np += nc) {
                const int32_t ne = np + nc < n1 ? np + nc : n1;
                for (int32_t m = mb; m < me; m += BF_MR) {
                    const int32_t mr = me - m < BF_MR ? me - m : BF_MR;
                    for (int32_t n = np; n < ne; n += BF_NR) {
                        const int32_t nr = ne - n < BF_NR ? ne - n : BF_NR;
                        bf_tiles[1][mr][nr](y + (int64_t)m * ldy + n, ldy, xs + (int64_t)(m - mb) * kpad,
                                            w + (int64_t)n * K, K);
                    }
                }
            }
        }
    } else {
        /* K too long for BF_XS_MIN_ROWS split rows in xs: the tiles
         * convert x as they read it (same bits) */
        int32_t mc = (int32_t)((512 * 1024 / 2) / (K > 0 ? K : 1));
        mc = mc / BF_MR * BF_MR;
        if (mc < BF_MR)
            mc = BF_MR;
        for (int32_t mb = 0; mb < M; mb += mc) {
            const int32_t me = mb + mc < M ? mb + mc : M;
            for (int32_t n = n0; n < n1; n += BF_NR) {
                const int32_t nr = n1 - n < BF_NR ? n1 - n : BF_NR;
                for (int32_t m = mb; m < me; m += BF_MR) {
                    const int32_t mr = me - m < BF_MR ? me - m : BF_MR;
                    bf_tiles[0][mr][nr](y + (int64_t)m * ldy + n, ldy, xb + (int64_t)m * K, w + (int64_t)n * K, K);
                }
            }
        }
    }
    _mm_setcsr(caller_csr);
}
#endif /* avx2 */

#if BF_ID == BF_ID_avx512bf16
/* The avx512bf16 variant: the definition is VDPBF16PS's own per-lane order
 * (cpu_gemm_modes.h; tests/ops/test_gemm_bf16.c test_vdpbf16ps_pinned
 * pins the instruction against it), so one zmm accumulator per output
 * holds its 16 lanes and each chunk of 32 k is one instruction:
 *   acc = _mm512_dpbf16_ps(acc, x[32c .. 32c + 31], w[32c .. 32c + 31])
 * (dword l of the 64-byte loads is the pair of lane l: element 2l low,
 * 2l + 1 high; the instruction takes the odd product first, DAZ in, FTZ
 * out, RNE, whatever MXCSR says; a product of two bf16 is commutative, so
 * which operand is x does not matter). The tail of K is a masked load
 * (zeros past K: a real dot of 0 * 0 pairs, as defined). The 16-lane tree
 * of cpu_gemm.h then runs with MXCSR's DAZ and FTZ set (on entry of the
 * column function, the caller's MXCSR restored on exit, as the avx2
 * variant does), which makes each of its additions ftz'd as defined.
 *   M = 1 (batch-1 decode): a 1 x BZ_GEMV_NR tile streams w once, each row
 * prefetched BZ_PF_BYTES ahead (one 64-byte line = one chunk per row).
 *   M > 1: BZ_MR x BZ_NR register tiles (4 x 6: 24 accumulators, 6 w and 1
 * x in the 32 zmm, as cpu_gemm_kernel.c's exact AVX-512 tile), a block of
 * rows of x in L2 while the tiles of BZ_NR rows of w (in L1) pass. The
 * tiles of 8 or more accumulators reduce them 16 at a time through one
 * shuffle network (cpu_tree_avx512.h, as cpu_gemm_kernel.c's v_hsum16:
 * every output lane sees the same pairs in the same order as the tree). */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512BF16__)
#error "the avx512bf16 variant is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16"
#endif
#include <immintrin.h>
#include "cpu_tree_avx512.h"

#define BZ_CHUNK 32 /* k per VDPBF16PS: 16 lanes x 1 pair */
#ifndef BZ_MR
#define BZ_MR 4
#endif
#ifndef BZ_NR
#define BZ_NR 6
#endif
#ifndef BZ_GEMV_NR
#define BZ_GEMV_NR 6
#endif
#define BZ_TILE_NR 6 /* the widest tile in the tables below */
_Static_assert(BZ_MR >= 1 && BZ_MR <= 4 && BZ_NR >= 1 && BZ_NR <= 6 && BZ_GEMV_NR >= 1 && BZ_GEMV_NR <= 6,
               "the tile tables below cover up to 4 x 6 and 1 x 6");
/* bytes of bf16 x rows per row block */
#ifndef BZ_MC_BYTES
#define BZ_MC_BYTES (256 * 1024)
#endif
/* prefetch distance of the batch-1 tile (as the avx2 variant's BF_PF_BYTES) */
#ifndef BZ_PF_BYTES
#define BZ_PF_BYTES 16384
#endif
/* MXCSR: all exceptions masked (0x1F80), round to nearest even, DAZ (bit
 * 6), FTZ (bit 15): for the tree's additions */
#define BZ_MXCSR (0x1F80u | 0x0040u | 0x8000u)

/* 32 bf16 at p; the first n only (zeros after) when n < 32 */
static inline __m512bh bz_load(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512((const void *)p); }
static inline __m512bh bz_load_tail(const uint16_t *p, int32_t n)
{
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1ull << n) - 1u), (const void *)p);
}

/* the canonical tree over the 16 lanes of a (each addition ftz'd by MXCSR) */
static inline float bz_hsum(__m512 a)
{
    const __m256 lo = _mm512_castps512_ps256(a);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);                                                /* (l, l+8) */
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* (l, l+4) */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                               /* (l, l+2) */
    const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));                          /* (0, 1) */
    return _mm_cvtss_f32(s1);
}

/* Sixteen bz_hsum at once: the shared network (cpu_tree_avx512.h) */
static inline __m512 bz_hsum16(const __m512 *a) { return cpu_tree16_zmm(a); }

/* The mr x nr register tile: rows x[0..mr) (stride K) times rows w[0..nr)
 * (stride K) into y[i][j] (stride ldy); mr, nr are constants at every call
 * site. pf: prefetch w ahead (the batch-1 tile). */
static inline __attribute__((always_inline)) void bz_tile(float *y, int64_t ldy, const uint16_t *x,
                                                          const uint16_t *w, int32_t K, const int mr, const int nr,
                                                          const int pf)
{
    __m512 acc[4][BZ_TILE_NR];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm512_setzero_ps();
    const int32_t kfull = K / BZ_CHUNK * BZ_CHUNK;
    for (int32_t k = 0; k < kfull; k += BZ_CHUNK) {
        __m512bh wv[BZ_TILE_NR];
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++) {
            if (pf)
                __builtin_prefetch((const char *)(w + (int64_t)j * K + k) + BZ_PF_BYTES, 0, BF_PF_LOCALITY);
            wv[j] = bz_load(w + (int64_t)j * K + k);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const __m512bh xv = bz_load(x + (int64_t)i * K + k);
#pragma GCC unroll 6
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
        }
    }
    if (kfull < K) { /* the last partial chunk, zero-padded */
        const int32_t rem = K - kfull; /* 1 .. 31 */
        __m512bh wv[BZ_TILE_NR];
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++)
            wv[j] = bz_load_tail(w + (int64_t)j * K + kfull, rem);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const __m512bh xv = bz_load_tail(x + (int64_t)i * K + kfull, rem);
#pragma GCC unroll 6
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
        }
    }
    if (mr * nr >= 8) {
        /* the trees of up to 16 accumulators share one shuffle network */
#pragma GCC unroll 2
        for (int g = 0; g < mr * nr; g += 16) {
            __m512 in[16];
            float out[16];
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                const int a = g + l; /* accumulator a = row a / nr, column a % nr */
                in[4 * (l % 4) + l / 4] = a < mr * nr ? acc[a / nr][a % nr] : _mm512_setzero_ps();
            }
            _mm512_storeu_ps(out, bz_hsum16(in));
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                const int a = g + l;
                if (a < mr * nr)
                    y[(int64_t)(a / nr) * ldy + a % nr] = out[l];
            }
        }
        return;
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 6
        for (int j = 0; j < nr; j++)
            y[(int64_t)i * ldy + j] = bz_hsum(acc[i][j]);
}

typedef void (*bz_tile_fn)(float *y, int64_t ldy, const uint16_t *x, const uint16_t *w, int32_t K);
#define BZ_TILE_DEF(mr, nr, pf)                                                                               \
    static void bz_tile_##mr##_##nr##_##pf(float *y, int64_t ldy, const uint16_t *x, const uint16_t *w,       \
                                           int32_t K)                                                        \
    {                                                                                                         \
        bz_tile(y, ldy, x, w, K, mr, nr, pf);                                                                 \
    }
#define BZ_TILE_ROW(mr)                                                                                       \
    BZ_TILE_DEF(mr, 1, 0) BZ_TILE_DEF(mr, 2, 0) BZ_TILE_DEF(mr, 3, 0) BZ_TILE_DEF(mr, 4, 0)                   \
    BZ_TILE_DEF(mr, 5, 0) BZ_TILE_DEF(mr, 6, 0)
BZ_TILE_ROW(1)
BZ_TILE_ROW(2)
BZ_TILE_ROW(3)
BZ_TILE_ROW(4)
BZ_TILE_DEF(1, 1, 1) BZ_TILE_DEF(1, 2, 1) BZ_TILE_DEF(1, 3, 1) BZ_TILE_DEF(1, 4, 1) BZ_TILE_DEF(1, 5, 1)
BZ_TILE_DEF(1, 6, 1)
#define BZ_TILE_ENTRY(mr)                                                                                     \
    {NULL, bz_tile_##mr##_1_0, bz_tile_##mr##_2_0, bz_tile_##mr##_3_0, bz_tile_##mr##_4_0, bz_tile_##mr##_5_0, \
     bz_tile_##mr##_6_0}
/* bz_tiles[mr][nr] (complete tables; BZ_MR, BZ_NR pick the part used), bz_gemv_tiles[nr] */
static const bz_tile_fn bz_tiles[5][7] = {{NULL}, BZ_TILE_ENTRY(1), BZ_TILE_ENTRY(2), BZ_TILE_ENTRY(3),
                                          BZ_TILE_ENTRY(4)};
static const bz_tile_fn bz_gemv_tiles[7] = {NULL,         bz_tile_1_1_1, bz_tile_1_2_1, bz_tile_1_3_1,
                                            bz_tile_1_4_1, bz_tile_1_5_1, bz_tile_1_6_1};

/* The tiles are called through the tables (never inlined here), so no
 * floating-point operation can be scheduled across the MXCSR writes. */
void BF_COLS_FN(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M, int32_t K, int32_t n0,
                int32_t n1)
{
    const unsigned int caller_csr = _mm_getcsr();
    _mm_setcsr(BZ_MXCSR);
    if (M == 1) { /* batch-1 decode: stream w once, BZ_GEMV_NR rows at a time */
        for (int32_t n = n0; n < n1; n += BZ_GEMV_NR) {
            const int32_t nr = n1 - n < BZ_GEMV_NR ? n1 - n : BZ_GEMV_NR;
            bz_gemv_tiles[nr](y + n, ldy, xb, w + (int64_t)n * K, K);
        }
    } else {
        /* A block of mc rows of x stays in L2 while the row tiles of the
         * block pass over each tile of BZ_NR rows of w (in L1). */
        int32_t mc = (int32_t)((int64_t)BZ_MC_BYTES / (2 * (int64_t)(K > 0 ? K : 1)));
        mc = mc / BZ_MR * BZ_MR;
        if (mc < BZ_MR)
            mc = BZ_MR;
        for (int32_t mb = 0; mb < M; mb += mc) {
            const int32_t me = mb + mc < M ? mb + mc : M;
            for (int32_t n = n0; n < n1; n += BZ_NR) {
                const int32_t nr = n1 - n < BZ_NR ? n1 - n : BZ_NR;
                for (int32_t m = mb; m < me; m += BZ_MR) {
                    const int32_t mr = me - m < BZ_MR ? me - m : BZ_MR;
                    bz_tiles[mr][nr](y + (int64_t)m * ldy + n, ldy, xb + (int64_t)m * K, w + (int64_t)n * K, K);
                }
            }
        }
    }
    _mm_setcsr(caller_csr);
}
#endif /* avx512bf16 */
