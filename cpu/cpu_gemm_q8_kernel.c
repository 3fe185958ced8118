/* cpu_gemm_q8_kernel: the int8 mode's (W8A8) column kernel, one variant per
 * compilation (cpu/meson.build: -DCPU_GEMM_VARIANT=generic|avx2|avx512vnni),
 * exported as cpu_gemm_q8_cols_<variant>. Every variant computes the canonical order of
 * cpu_gemm_modes.h ("int8"), so all return the same bits; the generic one is
 * the definition written out, the simple twin the others are tested
 * against (tests/ops/test_gemm_q8.c).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_gemm_kernel.h"
#include "cpu_wt.h"

/* The batch-1 tiles' prefetch hint (1 = prefetcht2, into L2), overridable
 * for tuning; 0 and 3 measured within the noise of 1 on a Zen 5
 * (2026-11-27, bench/RESULTS.md). */
#ifndef Q8_PF_LOCALITY
#define Q8_PF_LOCALITY 1
#endif

#if !defined(CPU_GEMM_VARIANT)
#error "cpu_gemm_q8_kernel.c is compiled with -DCPU_GEMM_VARIANT=avx512vnni|avx2|generic (cpu/meson.build)"
#endif
#define Q8_CAT2(a, b) a##b
#define Q8_CAT(a, b) Q8_CAT2(a, b)
#define Q8_COLS_FN Q8_CAT(cpu_gemm_q8_cols_, CPU_GEMM_VARIANT)
/* which variant: compare the macro's spelling */
#define Q8_ID_avx512vnni 1
#define Q8_ID_avx2 2
#define Q8_ID_generic 3
#define Q8_ID Q8_CAT(Q8_ID_, CPU_GEMM_VARIANT)
#if Q8_ID != Q8_ID_avx2 && Q8_ID != Q8_ID_generic && Q8_ID != Q8_ID_avx512vnni
#error "unknown CPU_GEMM_VARIANT for cpu_gemm_q8_kernel.c (expected avx512vnni, avx2 or generic)"
#endif
#if Q8_ID == Q8_ID_avx2 && (!defined(__AVX2__) || !defined(__FMA__))
#error "the avx2 variant is compiled with -mavx2 -mfma"
#endif

_Static_assert(CPU_I8_GROUP == 32, "the int8 mode's order is defined on blocks of 32");

/* The definition: one output at a time, the eight lanes in scalars. */
static inline float q8_dot_ref(const unsigned char *xr, const unsigned char *wr, int32_t nb)
{
    float acc[8] = {0};
    for (int32_t b = 0; b < nb; b++) {
        const unsigned char *xb = xr + (size_t)b * CPU_I8_BLOCK_BYTES, *wb = wr + (size_t)b * CPU_I8_BLOCK_BYTES;
        float sx, sw;
        memcpy(&sx, xb, sizeof sx);
        memcpy(&sw, wb, sizeof sw);
        const float d = sx * sw;
        const int8_t *qx = (const int8_t *)(xb + 4), *qw = (const int8_t *)(wb + 4);
        for (int j = 0; j < 8; j++) {
            int32_t p = 0;
            for (int i = 0; i < 4; i++)
                p += (int32_t)qx[4 * j + i] * (int32_t)qw[4 * j + i];
            acc[j] = fmaf((float)p, d, acc[j]);
        }
    }
    float s4[4], s2[2];
    for (int i = 0; i < 4; i++)
        s4[i] = acc[i] + acc[i + 4];
    for (int i = 0; i < 2; i++)
        s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

#if Q8_ID == Q8_ID_avx2
/* The AVX2 kernel: the same order as q8_dot_ref, eight lanes in one ymm.
 * For one pair (row of x, row of w) and block b, with qx, qw the 32 int8:
 *   ax  = |qx|                       (vpabsb; |q| <= 127, the quantizer clamps)
 *   sw  = qw * sign(qx)              (vpsignb: 0 where qx = 0)
 *   p16 = ax[2t] * sw[2t] + ax[2t+1] * sw[2t+1]   (vpmaddubsw, u8 x s8; at most
 *         2 * 127 * 127 = 32258 in magnitude, so its int16 saturation never acts)
 *   p32 = p16[2j] + p16[2j+1]        (vpmaddwd with ones) = p_b[j] exactly
 * then acc = fma((float)p32, sx_b * sw_b, acc) (vcvtdq2ps is exact below 2^24;
 * the scale product is one vmulps of two broadcasts, the same rounding as
 * the definition's scalar sx * sw) and the 8-lane tree of q8_dot_ref.
 * (-128 would break the sign trick; cpu_wt.c's quantizer never writes it.)
 *
 * Per pair and block that is 6 vector ops (psignb, pmaddubsw, pmaddwd,
 * cvtdq2ps, mulps, fma) for 32 multiply-adds, against 4 FMAs for f32; 5
 * where q8_tile_s forms the scale products 8 blocks per vmulps.
 *
 * Tiles: Q8_MR rows of x x Q8_NR rows of w, 4 x 3 (12 accumulators, 3 w
 * blocks; |qx| and the broadcast sx per row of the tile and block, the sign
 * and the products per pair). At M = 1 (batch-1 decode, bound by the
 * weight stream) a 1 x Q8_GEMV_NR tile reads each block of w once and
 * prefetches each row Q8_PF_BYTES ahead into L2, as cpu_gemm_kernel.c's
 * GEMV tiles do. Measured on a 2-core Zen 3 (EPYC VM, shared), one thread,
 * best of 8 interleaved rounds, ns per pair and block at M = 64, N = 768,
 * K = 768: tiles 4 x 3 0.80, 4 x 4 0.78, 4 x 2 0.86, 2 x 4 0.86, 3 x 3
 * 0.87; forming a chunk's scale products 8 blocks per vmulps first inside
 * each tile (and a broadcast load per pair) 0.97 against 0.93 without;
 * with the scales gathered once per row block and column tile instead
 * (q8_tile_s) 0.75 against 0.80: kept for M >= 16. At M = 1,
 * N = 32000: GEMV_NR 4 / 6 / 8 2.86 / 2.77 / 2.60 (6 kept: equal at
 * N = 4096, 1.02 / 1.00 / 1.02, and whole in the pool's 12-column shares),
 * and 4.02 without the prefetch. */
#include <immintrin.h>

#ifndef Q8_MR /* overridable for tuning: 1..4 */
#define Q8_MR 4
#endif
#ifndef Q8_NR /* 1..4 */
#define Q8_NR 3
#endif
#ifndef Q8_GEMV_NR /* 1..8 */
#define Q8_GEMV_NR 6
#endif
#define Q8_TILE_NR 8 /* the widest tile in the tables below */
/* bytes of x rows per row block (Q8_COLS_FN); 32 KiB to 256 KiB measured
 * alike (0.81-0.84 ns per pair and block at M = 256, N = 768 and 2304) */
#ifndef Q8_MC_BYTES
#define Q8_MC_BYTES (256 * 1024)
#endif
/* prefetch distance of the batch-1 tile (cpu_gemm_kernel.c GEMM_PF_BYTES) */
#ifndef Q8_PF_BYTES
#define Q8_PF_BYTES 16384
#endif

/* The block's scale in all lanes: vbroadcastss from memory (a load). With
 * memcpy + _mm256_set1_ps instead, GCC rewrites each pair's
 * mul(set1(sx), set1(sw)) as vmulss + a vbroadcastss shuffle, two vector
 * ops per pair instead of one (measured ~15% slower at M = 64). The same
 * product either way: one f32 multiply per lane. */
static inline __m256 q8_bcast_scale(const unsigned char *blk)
{
    return _mm256_broadcast_ss((const float *)(const void *)blk);
}

static inline __m256i q8_load_ints(const unsigned char *blk)
{
    return _mm256_loadu_si256((const __m256i *)(blk + 4));
}

/* (float)p_b[j] for the 8 lanes of one pair */
static inline __m256 q8_block_products(__m256i ax, __m256i qx, __m256i qw, __m256i ones)
{
    const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(qw, qx));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
}

/* s4[i] = acc[i] + acc[i + 4], s2[i] = s4[i] + s4[i + 2], y = s2[0] + s2[1] */
static inline float q8_tree(__m256 acc)
{
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* y[i][j] for rows i < mr of xq and rows j < nr of w (both q8 rows of
 * row_bytes); mr, nr are constants at every call site (the loops unroll and
 * the accumulators stay in registers). pf: prefetch w ahead (batch 1). */
static inline __attribute__((always_inline)) void q8_tile(float *y, int64_t ldy, const unsigned char *xq,
                                                          const unsigned char *w, size_t row_bytes, int32_t nb,
                                                          const int mr, const int nr, const int pf)
{
    __m256 acc[4][Q8_TILE_NR];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (int32_t b = 0; b < nb; b++) {
        const size_t off = (size_t)b * CPU_I8_BLOCK_BYTES;
        __m256i qw[Q8_TILE_NR];
        __m256 sw[Q8_TILE_NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            const unsigned char *wb = w + (size_t)j * row_bytes + off;
            if (pf)
                __builtin_prefetch(wb + Q8_PF_BYTES, 0, Q8_PF_LOCALITY);
            qw[j] = q8_load_ints(wb);
            sw[j] = q8_bcast_scale(wb);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const unsigned char *xb = xq + (size_t)i * row_bytes + off;
            const __m256i qx = q8_load_ints(xb), ax = _mm256_abs_epi8(qx);
            const __m256 sx = q8_bcast_scale(xb);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm256_fmadd_ps(q8_block_products(ax, qx, qw[j], ones), _mm256_mul_ps(sx, sw[j]),
                                            acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            y[(int64_t)i * ldy + j] = q8_tree(acc[i][j]);
}

/* q8_tile for M > 1 with the scale products formed 8 blocks per vmulps:
 * xs, ws are the tile's scales gathered out of the blocks (rows of nbp
 * floats, nbp = nb rounded up to 8, zeros past nb), once per row block
 * and once per column tile (Q8_COLS_FN); per group of 8 blocks the tile
 * forms d = sx_b * sw_b for each pair with one vmulps (the same f32
 * product per lane), and each pair then reads its d with a broadcast load:
 * 5 vector ops per pair and block instead of 6 (~7% faster at M >= 64;
 * gathering per tile instead, the first try below, cost more stores than
 * it saved). */
static inline __attribute__((always_inline)) void q8_tile_s(float *y, int64_t ldy, const unsigned char *xq,
                                                            const unsigned char *w, size_t row_bytes, int32_t nb,
                                                            const float *xs, const float *ws, int32_t nbp,
                                                            const int mr, const int nr)
{
    __m256 acc[4][Q8_TILE_NR];
    float dd[4][Q8_TILE_NR][8] __attribute__((aligned(32)));
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (int32_t b0 = 0; b0 < nb; b0 += 8) {
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                _mm256_store_ps(dd[i][j], _mm256_mul_ps(_mm256_load_ps(xs + (size_t)i * (size_t)nbp + b0),
                                                        _mm256_load_ps(ws + (size_t)j * (size_t)nbp + b0)));
        const int32_t be = b0 + 8 < nb ? b0 + 8 : nb;
        for (int32_t b = b0; b < be; b++) {
            const size_t off = (size_t)b * CPU_I8_BLOCK_BYTES;
            __m256i qw[Q8_TILE_NR];
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                qw[j] = q8_load_ints(w + (size_t)j * row_bytes + off);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) {
                const __m256i qx = q8_load_ints(xq + (size_t)i * row_bytes + off), ax = _mm256_abs_epi8(qx);
#pragma GCC unroll 8
                for (int j = 0; j < nr; j++)
                    acc[i][j] = _mm256_fmadd_ps(q8_block_products(ax, qx, qw[j], ones),
                                                _mm256_broadcast_ss(&dd[i][j][b - b0]), acc[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            y[(int64_t)i * ldy + j] = q8_tree(acc[i][j]);
}

/* dst [rows][nbp] = the scales of rows q8 rows, zeros past nb */
static void q8_gather_scales(float *dst, const unsigned char *q, size_t row_bytes, int32_t rows, int32_t nb,
                             int32_t nbp)
{
    for (int32_t r = 0; r < rows; r++)
        for (int32_t b = 0; b < nbp; b++) {
            float s = 0.0f;
            if (b < nb)
                memcpy(&s, q + (size_t)r * row_bytes + (size_t)b * CPU_I8_BLOCK_BYTES, sizeof s);
            dst[(size_t)r * (size_t)nbp + (size_t)b] = s;
        }
}

typedef void (*q8_tile_s_fn)(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w,
                             size_t row_bytes, int32_t nb, const float *xs, const float *ws, int32_t nbp);
#define Q8_TILE_S_DEF(mr, nr)                                                                                  \
    static void q8_tile_s_##mr##_##nr(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, \
                                      size_t row_bytes, int32_t nb, const float *xs, const float *ws,         \
                                      int32_t nbp)                                                             \
    {                                                                                                          \
        q8_tile_s(y, ldy, xq, w, row_bytes, nb, xs, ws, nbp, mr, nr);                                          \
    }
#define Q8_TILE_S_ROW(mr) Q8_TILE_S_DEF(mr, 1) Q8_TILE_S_DEF(mr, 2) Q8_TILE_S_DEF(mr, 3) Q8_TILE_S_DEF(mr, 4)
Q8_TILE_S_ROW(1) Q8_TILE_S_ROW(2) Q8_TILE_S_ROW(3) Q8_TILE_S_ROW(4)
#define Q8_TILE_S_ENTRY(mr)                                                                                    \
    {NULL, q8_tile_s_##mr##_1, q8_tile_s_##mr##_2, q8_tile_s_##mr##_3, q8_tile_s_##mr##_4}
static const q8_tile_s_fn q8_tiles_s[5][5] = {{NULL}, Q8_TILE_S_ENTRY(1), Q8_TILE_S_ENTRY(2), Q8_TILE_S_ENTRY(3),
                                              Q8_TILE_S_ENTRY(4)};

/* the gathered scales' buffers (stack, per call): x rows of a row block,
 * w rows of a column tile; K past Q8_SCALES_MAX_BLOCKS * 32 runs q8_tile.
 * Below Q8_GATHER_MIN_M rows a column tile's gather is shared by too few
 * row tiles to pay: q8_tile there too. Measured (one thread, ns per pair
 * and block, q8_tile_s against q8_tile): M = 256 0.74 / 0.81, M = 64 0.75
 * / 0.80, M = 16 0.77 / 0.80, M = 8 0.80 / 0.81, M = 4 0.87 / 0.84. */
#define Q8_SCALES_MAX_BLOCKS 1024
#ifndef Q8_GATHER_MIN_M
#define Q8_GATHER_MIN_M 16
#endif
#define Q8_XS_FLOATS (4 * Q8_SCALES_MAX_BLOCKS)

typedef void (*q8_tile_fn)(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, size_t row_bytes,
                           int32_t nb);
#define Q8_TILE_DEF(mr, nr, pf)                                                                                \
    static void q8_tile_##mr##_##nr##_##pf(float *y, int64_t ldy, const unsigned char *xq,                     \
                                           const unsigned char *w, size_t row_bytes, int32_t nb)              \
    {                                                                                                          \
        q8_tile(y, ldy, xq, w, row_bytes, nb, mr, nr, pf);                                                     \
    }
_Static_assert(Q8_MR >= 1 && Q8_MR <= 4 && Q8_NR >= 1 && Q8_NR <= 4 && Q8_GEMV_NR >= 1 && Q8_GEMV_NR <= 8,
               "the tile tables below cover up to 4 x 4 and 1 x 8");
#define Q8_TILE_ROW(mr) Q8_TILE_DEF(mr, 1, 0) Q8_TILE_DEF(mr, 2, 0) Q8_TILE_DEF(mr, 3, 0) Q8_TILE_DEF(mr, 4, 0)
Q8_TILE_ROW(1) Q8_TILE_ROW(2) Q8_TILE_ROW(3) Q8_TILE_ROW(4)
Q8_TILE_DEF(1, 1, 1) Q8_TILE_DEF(1, 2, 1) Q8_TILE_DEF(1, 3, 1) Q8_TILE_DEF(1, 4, 1)
Q8_TILE_DEF(1, 5, 1) Q8_TILE_DEF(1, 6, 1) Q8_TILE_DEF(1, 7, 1) Q8_TILE_DEF(1, 8, 1)
/* q8_tiles[mr][nr] (the tables are complete; Q8_MR, Q8_NR pick the part used), q8_gemv_tiles[nr] */
#define Q8_TILE_ENTRY(mr) {NULL, q8_tile_##mr##_1_0, q8_tile_##mr##_2_0, q8_tile_##mr##_3_0, q8_tile_##mr##_4_0}
static const q8_tile_fn q8_tiles[5][5] = {{NULL}, Q8_TILE_ENTRY(1), Q8_TILE_ENTRY(2), Q8_TILE_ENTRY(3),
                                          Q8_TILE_ENTRY(4)};
static const q8_tile_fn q8_gemv_tiles[9] = {NULL,          q8_tile_1_1_1, q8_tile_1_2_1, q8_tile_1_3_1,
                                            q8_tile_1_4_1, q8_tile_1_5_1, q8_tile_1_6_1, q8_tile_1_7_1,
                                            q8_tile_1_8_1};

void Q8_COLS_FN(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M, int32_t K,
                int32_t n0, int32_t n1)
{
    const int32_t nb = K / CPU_I8_GROUP;
    const size_t row_bytes = (size_t)nb * CPU_I8_BLOCK_BYTES;
    if (M == 1) { /* batch-1 decode: stream w once */
        for (int32_t n = n0; n < n1; n += Q8_GEMV_NR) {
            const int32_t nr = n1 - n < Q8_GEMV_NR ? n1 - n : Q8_GEMV_NR;
            q8_gemv_tiles[nr](y + n, ldy, xq, w + (size_t)n * row_bytes, row_bytes, nb);
        }
        return;
    }
    /* A block of mc rows of x (about 256 KiB) stays in L2 while the row
     * tiles of the block pass over each tile of Q8_NR rows of w (in L1). */
    int32_t mc = (int32_t)((size_t)Q8_MC_BYTES / (row_bytes > 0 ? row_bytes : 1));
    mc = mc / Q8_MR * Q8_MR;
    if (mc < Q8_MR)
        mc = Q8_MR;
    const int32_t nbp = (nb + 7) / 8 * 8;
    const int gathered = nbp <= Q8_SCALES_MAX_BLOCKS && M >= Q8_GATHER_MIN_M;
    float xs[Q8_XS_FLOATS] __attribute__((aligned(32))), ws[Q8_NR * Q8_SCALES_MAX_BLOCKS] __attribute__((aligned(32)));
    if (gathered && mc * nbp > Q8_XS_FLOATS)
        mc = Q8_XS_FLOATS / nbp / Q8_MR * Q8_MR; /* >= Q8_MR: nbp <= Q8_XS_FLOATS / 4 */
    for (int32_t mb = 0; mb < M; mb += mc) {
        const int32_t me = mb + mc < M ? mb + mc : M;
        if (gathered)
            q8_gather_scales(xs, xq + (size_t)mb * row_bytes, row_bytes, me - mb, nb, nbp);
        for (int32_t n = n0; n < n1; n += Q8_NR) {
            const int32_t nr = n1 - n < Q8_NR ? n1 - n : Q8_NR;
            if (gathered)
                q8_gather_scales(ws, w + (size_t)n * row_bytes, row_bytes, nr, nb, nbp);
            for (int32_t m = mb; m < me; m += Q8_MR) {
                const int32_t mr = me - m < Q8_MR ? me - m : Q8_MR;
                if (gathered)
                    q8_tiles_s[mr][nr](y + (int64_t)m * ldy + n, ldy, xq + (size_t)m * row_bytes,
                                       w + (size_t)n * row_bytes, row_bytes, nb, xs + (size_t)(m - mb) * (size_t)nbp,
                                       ws, nbp);
                else
                    q8_tiles[mr][nr](y + (int64_t)m * ldy + n, ldy, xq + (size_t)m * row_bytes,
                                     w + (size_t)n * row_bytes, row_bytes, nb);
            }
        }
    }
}

/* x [M][K] f32 -> q8 rows (K % 32 == 0), the same bytes as cpu_wt.c's
 * i8_block (cpu_q8_quantize_rows, its definition), 8 lanes at a time:
 *   amax: vmaxps(|v|, m) keeps m where |v| is NaN, as i8_block's
 *         `fabsf(v) > amax ? fabsf(v) : amax` does; max is exact, so the
 *         lane order of the final max does not matter;
 *   scale = amax / 127 (one f32 division, scalar as there); 0 -> ints 0;
 *   q = round(v / scale) in the current rounding mode (vdivps, vroundps =
 *       nearbyintf), clamped with vminps/vmaxps ordered so that a NaN q
 *       stays NaN (`q > 127 ? 127 : ...` leaves it too);
 *   byte = the low byte of vcvttps2dq(q): the int for |q| <= 127, 0 for NaN
 *       (0x80000000), which is what `(int8_t)q` compiles to on x86-64
 *       (cvttss2si, then the low byte) for the NaN of a NaN or inf input.
 * tests/ops/test_gemm_q8.c compares the two on random and edge values. */
void cpu_q8_quantize_rows_avx2(unsigned char *xq, const float *x, int32_t M, int32_t K)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    /* the low byte of each int32, lanes 0-3 of each 128-bit half */
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                                               12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gather = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int64_t nblocks = (int64_t)M * (K / CPU_I8_GROUP);
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const float *v = x + blk * CPU_I8_GROUP;
        unsigned char *out = xq + blk * CPU_I8_BLOCK_BYTES;
        __m256 vv[4], m = _mm256_setzero_ps();
        for (int g = 0; g < 4; g++) {
            vv[g] = _mm256_loadu_ps(v + 8 * g);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vv[g]), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float scale = _mm_cvtss_f32(m4) / 127.0f;
        memcpy(out, &scale, sizeof scale);
        if (!(scale > 0.0f)) {
            memset(out + 4, 0, CPU_I8_GROUP);
            continue;
        }
        const __m256 vs = _mm256_set1_ps(scale);
        __m256i q[4];
        for (int g = 0; g < 4; g++) {
            __m256 r = _mm256_round_ps(_mm256_div_ps(vv[g], vs), _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
            r = _mm256_max_ps(lo, _mm256_min_ps(hi, r)); /* NaN in the second operand passes through */
            /* 8 int32 -> their low bytes in bytes 0-3 of each half, then lanes 0 and 4 side by side */
            q[g] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(_mm256_cvttps_epi32(r), low_bytes), gather);
        }
        for (int g = 0; g < 4; g++)
            _mm_storel_epi64((__m128i *)(out + 4 + 8 * g), _mm256_castsi256_si128(q[g]));
    }
}

#elif Q8_ID == Q8_ID_avx512vnni
/* The avx512vnni kernel: the same order as q8_dot_ref, each zmm holding
 * the eight lanes of two outputs (lanes 0-7: column 2t of a tile, 8-15:
 * column 2t + 1; the same row of x), so that one instruction of each kind
 * serves two outputs and each output's float ops stay its own, in order.
 * For one row of x and a pair of rows of w, block b:
 *   xu = qx ^ 0x80 = qx + 128 as u8, broadcast to both halves
 *   nc = -(128 * sum_{i<4} qw[4j + i]) per dword j (per pair and block,
 *        shared by the tile's rows: vpdpbusd of 128s and qw, negated)
 *   p  = vpdpbusd(nc, xu, qw) = nc + sum_i (qx + 128) * qw = p_b[j]
 *        exactly (|p| <= 4 * 128 * 127: no wrap; vpdpbusd does not saturate)
 *   acc = fma((float)p, sx_b * sw_b, acc)   (vcvtdq2ps exact below 2^24;
 *        sx_b * sw_b one vmulps of sx broadcast and the pair's two sw
 *        broadcast to their halves: the definition's one f32 product)
 * then per half the 8-lane tree of q8_dot_ref. The +128 offset needs no
 * sign trick (AVX-512 has no vpsignb), and -128 would be exact too. MXCSR
 * is the caller's, as for the other variants.
 *
 * Tiles: Q8Z_MR rows of x x Q8Z_NR rows of w (4 x 6: 12 accumulators, 3
 * pairs of w with their nc and sw); an odd last column reads its row into
 * both halves and stores one. At M = 1 a 1 x Q8Z_GEMV_NR tile reads each
 * block of w once and prefetches each row Q8_PF_BYTES ahead into L2. */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__) || !defined(__AVX2__) ||       \
    !defined(__FMA__)
#error "the avx512vnni variant is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma"
#endif
#include <immintrin.h>

#ifndef Q8Z_MR /* 1..4 */
#define Q8Z_MR 4
#endif
#ifndef Q8Z_NR /* 1..6 */
#define Q8Z_NR 6
#endif
#ifndef Q8Z_GEMV_NR /* 1..8 */
#define Q8Z_GEMV_NR 6
#endif
#define Q8Z_TILE_NP 4 /* pairs of w rows in the widest tile below (1 x 8) */
_Static_assert(Q8Z_MR >= 1 && Q8Z_MR <= 4 && Q8Z_NR >= 1 && Q8Z_NR <= 6 && Q8Z_GEMV_NR >= 1 && Q8Z_GEMV_NR <= 8,
               "the tile tables below cover up to 4 x 6 and 1 x 8");
#ifndef Q8_MC_BYTES /* bytes of x rows per row block */
#define Q8_MC_BYTES (256 * 1024)
#endif
#ifndef Q8_PF_BYTES /* prefetch distance of the batch-1 tile */
#define Q8_PF_BYTES 16384
#endif

/* s4[i] = acc[i] + acc[i + 4], s2[i] = s4[i] + s4[i + 2], y = s2[0] + s2[1] */
static inline float q8z_tree(__m256 acc)
{
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

static inline float q8z_scale(const unsigned char *blk)
{
    float s;
    memcpy(&s, blk, sizeof s);
    return s;
}

/* y[i][j] for rows i < mr of xq and rows j < nr of w (both q8 rows of
 * row_bytes); mr, nr are constants at every call site. pf: prefetch w ahead
 * (batch 1). */
static inline __attribute__((always_inline)) void q8z_tile(float *y, int64_t ldy, const unsigned char *xq,
                                                           const unsigned char *w, size_t row_bytes, int32_t nb,
                                                           const int mr, const int nr, const int pf)
{
    const int np = (nr + 1) / 2; /* pairs of w rows: rows 2t (low half) and 2t + 1 (high half) */
    __m512 acc[4][Q8Z_TILE_NP];
    const __m512i b80 = _mm512_set1_epi8((char)0x80); /* 128 as u8; also the offset's xor */
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < np; t++)
            acc[i][t] = _mm512_setzero_ps();
    for (int32_t b = 0; b < nb; b++) {
        const size_t off = (size_t)b * CPU_I8_BLOCK_BYTES;
        __m512i qw[Q8Z_TILE_NP], nc[Q8Z_TILE_NP];
        __m512 sw[Q8Z_TILE_NP];
#pragma GCC unroll 4
        for (int t = 0; t < np; t++) {
            /* an odd last column: its row in both halves (the high one is not stored) */
            const unsigned char *w0 = w + (size_t)(2 * t) * row_bytes + off;
            const unsigned char *w1 = w + (size_t)(2 * t + 1 < nr ? 2 * t + 1 : 2 * t) * row_bytes + off;
            if (pf) {
                __builtin_prefetch(w0 + Q8_PF_BYTES, 0, Q8_PF_LOCALITY);
                if (2 * t + 1 < nr)
                    __builtin_prefetch(w1 + Q8_PF_BYTES, 0, Q8_PF_LOCALITY);
            }
            qw[t] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + 4))),
                                       _mm256_loadu_si256((const __m256i *)(w1 + 4)), 1);
            nc[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), b80, qw[t]));
            sw[t] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(q8z_scale(w0))),
                                                        _mm256_castps_pd(_mm256_set1_ps(q8z_scale(w1))), 1));
        }
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const unsigned char *xb = xq + (size_t)i * row_bytes + off;
            const __m512i xu =
                _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb + 4))), b80);
            const __m512 sx = _mm512_set1_ps(q8z_scale(xb));
#pragma GCC unroll 4
            for (int t = 0; t < np; t++) {
                const __m512i p = _mm512_dpbusd_epi32(nc[t], xu, qw[t]);
                acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sx, sw[t]), acc[i][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int t = 0; t < np; t++) {
            y[(int64_t)i * ldy + 2 * t] = q8z_tree(_mm512_castps512_ps256(acc[i][t]));
            if (2 * t + 1 < nr)
                y[(int64_t)i * ldy + 2 * t + 1] =
                    q8z_tree(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][t]), 1)));
        }
}

typedef void (*q8z_tile_fn)(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w,
                            size_t row_bytes, int32_t nb);
#define Q8Z_TILE_DEF(mr, nr, pf)                                                                               \
    static void q8z_tile_##mr##_##nr##_##pf(float *y, int64_t ldy, const unsigned char *xq,                    \
                                            const unsigned char *w, size_t row_bytes, int32_t nb)             \
    {                                                                                                          \
        q8z_tile(y, ldy, xq, w, row_bytes, nb, mr, nr, pf);                                                    \
    }
#define Q8Z_TILE_ROW(mr)                                                                                       \
    Q8Z_TILE_DEF(mr, 1, 0) Q8Z_TILE_DEF(mr, 2, 0) Q8Z_TILE_DEF(mr, 3, 0) Q8Z_TILE_DEF(mr, 4, 0)                \
    Q8Z_TILE_DEF(mr, 5, 0) Q8Z_TILE_DEF(mr, 6, 0)
Q8Z_TILE_ROW(1) Q8Z_TILE_ROW(2) Q8Z_TILE_ROW(3) Q8Z_TILE_ROW(4)
Q8Z_TILE_DEF(1, 1, 1) Q8Z_TILE_DEF(1, 2, 1) Q8Z_TILE_DEF(1, 3, 1) Q8Z_TILE_DEF(1, 4, 1)
Q8Z_TILE_DEF(1, 5, 1) Q8Z_TILE_DEF(1, 6, 1) Q8Z_TILE_DEF(1, 7, 1) Q8Z_TILE_DEF(1, 8, 1)
#define Q8Z_TILE_ENTRY(mr)                                                                                     \
    {NULL,                 q8z_tile_##mr##_1_0, q8z_tile_##mr##_2_0, q8z_tile_##mr##_3_0,                      \
     q8z_tile_##mr##_4_0, q8z_tile_##mr##_5_0, q8z_tile_##mr##_6_0}
/* q8z_tiles[mr][nr] (complete tables; Q8Z_MR, Q8Z_NR pick the part used), q8z_gemv_tiles[nr] */
static const q8z_tile_fn q8z_tiles[5][7] = {{NULL}, Q8Z_TILE_ENTRY(1), Q8Z_TILE_ENTRY(2), Q8Z_TILE_ENTRY(3),
                                            Q8Z_TILE_ENTRY(4)};
static const q8z_tile_fn q8z_gemv_tiles[9] = {NULL,           q8z_tile_1_1_1, q8z_tile_1_2_1, q8z_tile_1_3_1,
                                              q8z_tile_1_4_1, q8z_tile_1_5_1, q8z_tile_1_6_1, q8z_tile_1_7_1,
                                              q8z_tile_1_8_1};

void Q8_COLS_FN(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M, int32_t K,
                int32_t n0, int32_t n1)
{
    const int32_t nb = K / CPU_I8_GROUP;
    const size_t row_bytes = (size_t)nb * CPU_I8_BLOCK_BYTES;
    if (M == 1) { /* batch-1 decode: stream w once */
        for (int32_t n = n0; n < n1; n += Q8Z_GEMV_NR) {
            const int32_t nr = n1 - n < Q8Z_GEMV_NR ? n1 - n : Q8Z_GEMV_NR;
            q8z_gemv_tiles[nr](y + n, ldy, xq, w + (size_t)n * row_bytes, row_bytes, nb);
        }
        return;
    }
    /* A block of mc rows of x (about Q8_MC_BYTES) stays in L2 while the row
     * tiles of the block pass over each tile of Q8Z_NR rows of w (in L1). */
    int32_t mc = (int32_t)((size_t)Q8_MC_BYTES / (row_bytes > 0 ? row_bytes : 1));
    mc = mc / Q8Z_MR * Q8Z_MR;
    if (mc < Q8Z_MR)
        mc = Q8Z_MR;
    for (int32_t mb = 0; mb < M; mb += mc) {
        const int32_t me = mb + mc < M ? mb + mc : M;
        for (int32_t n = n0; n < n1; n += Q8Z_NR) {
            const int32_t nr = n1 - n < Q8Z_NR ? n1 - n : Q8Z_NR;
            for (int32_t m = mb; m < me; m += Q8Z_MR) {
                const int32_t mr = me - m < Q8Z_MR ? me - m : Q8Z_MR;
                q8z_tiles[mr][nr](y + (int64_t)m * ldy + n, ldy, xq + (size_t)m * row_bytes,
                                  w + (size_t)n * row_bytes, row_bytes, nb);
            }
        }
    }
}

#else /* the generic variant: the definition itself */

void Q8_COLS_FN(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M, int32_t K,
                int32_t n0, int32_t n1)
{
    const int32_t nb = K / CPU_I8_GROUP;
    const size_t row_bytes = (size_t)nb * CPU_I8_BLOCK_BYTES;
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = n0; n < n1; n++)
            y[(int64_t)m * ldy + n] = q8_dot_ref(xq + (size_t)m * row_bytes, w + (size_t)n * row_bytes, nb);
}
#endif
