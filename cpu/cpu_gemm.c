/* cpu_gemm: see cpu_gemm.h for the reduction-order contract.
 *
 * Index equations. A tile covers rows m..m+mr-1 of x and rows n..n+nr-1 of
 * w (= columns of y); acc[i][j] is a vector of VL lanes with
 *   acc[i][j][l] = fma(x[m+i][k+l], w[n+j][k+l], acc[i][j][l])  for k = 0, VL, 2VL, ...
 * and y[m+i][n+j] = hsum(acc[i][j]) (fixed tree, see v_hsum). Every tile
 * shape (mr, nr) runs exactly this per-element sequence.
 */
#include "cpu_gemm.h"

#include <string.h>

#if defined(__AVX512F__) && !defined(PG_GEMM_FORCE_AVX2) && !defined(PG_GEMM_FORCE_GENERIC)
#include <immintrin.h>
#define GEMM_ISA "avx512"
#define VL 16
#define MR 4
#define NR 6
typedef __m512 vf;
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vf v_load_tail(const float *p, int32_t n)
{
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float v_hsum(vf a)
{
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
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
#elif defined(__AVX2__) && defined(__FMA__) && !defined(PG_GEMM_FORCE_GENERIC)
#include <immintrin.h>
#define GEMM_ISA "avx2"
#define VL 8
#define MR 4
#define NR 3
typedef __m256 vf;
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vf v_load_tail(const float *p, int32_t n)
{
    static const int32_t mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(mask + 8 - n)));
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float v_hsum(vf a)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#else
/* Portable: GCC vector extensions, 4 lanes, multiply then add. */
#define GEMM_ISA "generic"
#define VL 4
#define MR 4
#define NR 3
typedef float vf __attribute__((vector_size(16)));
static inline vf v_zero(void) { vf z = {0.0f, 0.0f, 0.0f, 0.0f}; return z; }
static inline vf v_load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline vf v_load_tail(const float *p, int32_t n)
{
    vf v = v_zero();
    memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}
static inline vf v_fma(vf a, vf b, vf c) { return a * b + c; }
static inline float v_hsum(vf a) { return (a[0] + a[2]) + (a[1] + a[3]); }
#endif

#define TILE_MAX_NR 6

/* One register tile; mr, nr are compile-time constants at every call site,
 * and the loops over them are unrolled (also at -O2) so that acc and wv live
 * in registers. */
static inline __attribute__((always_inline)) void
gemm_tile(float *y, int64_t ldy, const float *x, const float *w, int32_t K, const int mr, const int nr)
{
    vf acc[MR][TILE_MAX_NR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            acc[i][j] = v_zero();
    int32_t k = 0;
    for (; k + VL <= K; k += VL) {
        vf wv[TILE_MAX_NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            wv[j] = v_load(w + (int64_t)j * K + k);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            vf xv = v_load(x + (int64_t)i * K + k);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                acc[i][j] = v_fma(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        int32_t rem = K - k;
        vf wv[TILE_MAX_NR];
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            wv[j] = v_load_tail(w + (int64_t)j * K + k, rem);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            vf xv = v_load_tail(x + (int64_t)i * K + k, rem);
#pragma GCC unroll 8
            for (int j = 0; j < nr; j++)
                acc[i][j] = v_fma(xv, wv[j], acc[i][j]);
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
                in[4 * (l % 4) + l / 4] = a < mr * nr ? acc[a / nr][a % nr] : v_zero();
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

typedef void (*gemm_tile_fn)(float *y, int64_t ldy, const float *x, const float *w, int32_t K);

#define GEMM_DEF(mr, nr)                                                                    \
    static void gemm_tile_##mr##_##nr(float *y, int64_t ldy, const float *x, const float *w, \
                                      int32_t K)                                            \
    {                                                                                       \
        gemm_tile(y, ldy, x, w, K, mr, nr);                                                 \
    }
#define GEMM_DEF_ROW(nr) GEMM_DEF(1, nr) GEMM_DEF(2, nr) GEMM_DEF(3, nr) GEMM_DEF(4, nr)
GEMM_DEF_ROW(1)
GEMM_DEF_ROW(2)
GEMM_DEF_ROW(3)
#if NR >= 6
GEMM_DEF_ROW(4)
GEMM_DEF_ROW(5)
GEMM_DEF_ROW(6)
#endif

#define GEMM_ROW(mr)                                                                          \
    {NULL, gemm_tile_##mr##_1, gemm_tile_##mr##_2, gemm_tile_##mr##_3, GEMM_ROW_WIDE(mr)}
#if NR >= 6
#define GEMM_ROW_WIDE(mr) gemm_tile_##mr##_4, gemm_tile_##mr##_5, gemm_tile_##mr##_6
#else
#define GEMM_ROW_WIDE(mr) NULL, NULL, NULL
#endif
/* gemm_tiles[mr][nr] */
static const gemm_tile_fn gemm_tiles[MR + 1][TILE_MAX_NR + 1] = {
    {NULL}, GEMM_ROW(1), GEMM_ROW(2), GEMM_ROW(3), GEMM_ROW(4),
};

int32_t cpu_gemm_lanes(void)
{
    return VL;
}

const char *cpu_gemm_isa(void)
{
    return GEMM_ISA;
}

void cpu_gemm_cols(float *y, int64_t ldy, const float *x, const float *w,
                   int32_t M, int32_t K, int32_t n0, int32_t n1)
{
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
            const float *wn = w + (int64_t)n * K;
            for (int32_t m = mb; m < me; m += MR) {
                int32_t mr = me - m < MR ? me - m : MR;
                gemm_tiles[mr][nr](y + (int64_t)m * ldy + n, ldy, x + (int64_t)m * K, wn, K);
            }
        }
    }
}

typedef struct gemm_job {
    float *y;
    int64_t ldy;
    const float *x, *w;
    int32_t M, N, K;
} gemm_job;

static void gemm_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const gemm_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range(j->N, worker, n_workers, NR, &lo, &hi);
    if (lo < hi)
        cpu_gemm_cols(j->y, j->ldy, j->x, j->w, j->M, j->K, (int32_t)lo, (int32_t)hi);
}

void cpu_gemm(cpu_pool *pool, float *y, int64_t ldy, const float *x, const float *w,
              int32_t M, int32_t N, int32_t K)
{
    gemm_job job = {y, ldy, x, w, M, N, K};
    /* Below ~64k multiply-adds a second thread costs more than it saves. */
    double work = (double)M * (double)N * (double)K;
    if (!pool || work < 65536.0 || N < 2 * NR) {
        gemm_worker(&job, 0, 1);
        return;
    }
    cpu_pool_run(pool, 0, gemm_worker, &job);
}
