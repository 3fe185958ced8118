/* test_gemm_bf16: the bf16 matmul mode (cpu/cpu_gemm_modes.h "bf16").
 *   - the definition pinned by hand-computed cases (the odd element of a
 *     pair before the even one, DAZ on inputs, FTZ on results);
 *   - the avx2 column kernel vs the generic one (= the definition) bit for
 *     bit on fresh random inputs (M 1..70, N off the tiles, K 1..4096, odd
 *     K, K % 32 != 0) and on edge values (subnormal bf16, partial sums in
 *     the subnormal range, +-0, inf, large cancellations), with guard
 *     columns in y and column splits;
 *   - x86's tininess after rounding, which the definition follows: the
 *     window where it differs from tininess before rounding, both kernels;
 *   - cpu_gemm_mode with pools of 1 and 2 threads and row subsets: every
 *     row bit-identical to the same row in any batch, any variant;
 *   - VDPBF16PS itself vs the definition, where the CPU has AVX512_BF16;
 *   - there too, the avx512bf16 kernel (VDPBF16PS, one zmm per output) vs
 *     the generic one bit for bit: its tile edges (M 1..5, 7, 16, 33; N
 *     off 6; K off 32: the masked tail), random shapes, edge values, the
 *     hand cases and the tininess window (SKIP, said so, elsewhere).
 * Outputs compare with memcmp, except that a NaN only has to be a NaN at
 * the same place (payloads and signs of NaN are not part of the order). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_gemm.h"
#include "cpu_gemm_kernel.h"
#include "cpu_gemm_modes.h"
#include "cpu_pool.h"
#include "test_support.h"

#if defined(PG_GEMM_X86)
#include <immintrin.h>
#endif

static float bf16_f32(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f, which must be a bf16 value, as bf16 bits */
static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    assert_true((u & 0xFFFFu) == 0);
    return (uint16_t)(u >> 16);
}

static int same_bits(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static int have_avx2(void)
{
    return cpu_gemm_variant_available(CPU_GEMM_AVX2);
}

/* Random bf16 values of one class. Normal values keep exponents >= -67,
 * so that every product of two normals is a multiple of 2^-148 and no fma
 * lands in the window of test_tininess_after_rounding (its window holds no such
 * multiple); tiny ones (2^-67 .. 2^-60) make products and partial sums
 * near and below FLT_MIN (FTZ), subnormal bf16 test DAZ, large ones
 * (2^40 .. 2^50) big terms that cancel (make_cancellations). Infinities
 * are placed one at a time (sprinkle_inf): a class of them would make
 * every long dot product inf or NaN, and such outputs compare nothing. */
enum { V_UNIT, V_TINY, V_SUBNORMAL, V_ZERO, V_INF, V_LARGE, V_MIXED };
static uint16_t rand_bf16(pg_test_rng *rng, int cls)
{
    const uint16_t sign = (uint16_t)((pg_test_rng_next(rng) & 1u) << 15);
    const uint16_t mant = (uint16_t)(pg_test_rng_next(rng) & 0x7Fu);
    if (cls == V_MIXED) {
        const int r = pg_test_rng_int(rng, 0, 99);
        cls = r < 60 ? V_UNIT : r < 80 ? V_TINY : r < 90 ? V_SUBNORMAL : r < 97 ? V_ZERO : V_LARGE;
    }
    switch (cls) {
    case V_UNIT: /* 2^-8 .. 2 */
        return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 127 - 8, 127) << 7) | mant;
    case V_TINY:
        return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 127 - 67, 127 - 60) << 7) | mant;
    case V_SUBNORMAL:
        return sign | (uint16_t)(mant ? mant : 1u);
    case V_ZERO:
        return sign;
    case V_INF:
        return sign | 0x7F80u;
    default: /* V_LARGE */
        return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 127 + 40, 127 + 50) << 7) | mant;
    }
}

static uint16_t *bf16_buf(pg_test_rng *rng, size_t n, int cls)
{
    uint16_t *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rand_bf16(rng, cls);
    return p;
}

/* one +-inf in each of `count` random places */
static void sprinkle_inf(pg_test_rng *rng, uint16_t *p, size_t n, int count)
{
    for (int i = 0; i < count && n > 0; i++)
        p[pg_test_rng_next(rng) % n] = rand_bf16(rng, V_INF);
}

/* Large cancellations: row n of w = row n - 1 negated past its first
 * quarter (every other pair), so sums of big terms cancel to small ones. */
static void make_cancellations(uint16_t *x, uint16_t *w, int32_t M, int32_t N, int32_t K)
{
    for (int32_t n = 1; n < N; n += 2)
        for (int32_t k = K / 4; k < K; k++)
            w[(size_t)n * K + k] = w[(size_t)(n - 1) * K + k] ^ (k % 4 < 2 ? 0x8000u : 0u);
    for (int32_t m = 0; m < M; m++)
        for (int32_t k = 0; k + 1 < K; k += 2)
            x[(size_t)m * K + k + 1] = x[(size_t)m * K + k] ^ 0x8000u;
}

/* The kernel under test: the avx2 one by default, the avx512bf16 one in
 * test_avx512bf16_matches_definition. */
typedef struct kernel_under_test {
    cpu_gemm_bf16_cols_fn fn;
    const char *name;
} kernel_under_test;

/* y_generic and y_<kernel> [M][ldy] over columns [n0, n1), compared; the
 * other columns (guards past N included) must stay untouched */
/* returns how many of the outputs compared are finite (the tests' own power check) */
static long compare_kernel(const kernel_under_test *kt, const uint16_t *x, const uint16_t *w, int32_t M, int32_t N,
                           int32_t K, int32_t n0, int32_t n1, int64_t ldy, const char *what)
{
    long finite = 0;
    float *yg = malloc((size_t)M * ldy * sizeof *yg), *ya = malloc((size_t)M * ldy * sizeof *ya);
    assert_non_null(yg);
    assert_non_null(ya);
    for (size_t i = 0; i < (size_t)M * ldy; i++)
        yg[i] = ya[i] = -1234.5f;
    cpu_gemm_bf16_cols_generic(yg, ldy, x, w, M, K, n0, n1);
    if (kt->fn)
        kt->fn(ya, ldy, x, w, M, K, n0, n1);
    for (int32_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldy; n++) {
            const float g = yg[(size_t)m * ldy + n], a = ya[(size_t)m * ldy + n];
            if (n < n0 || n >= n1) {
                if (g != -1234.5f || a != -1234.5f)
                    fail_msg("%s M=%d N=%d K=%d cols [%d,%d): y[%d][%lld] outside the columns written (%s)", what,
                             (int)M, (int)N, (int)K, (int)n0, (int)n1, (int)m, (long long)n, kt->name);
            } else if (!same_bits(g, a)) {
                fail_msg("%s M=%d N=%d K=%d cols [%d,%d): y[%d][%lld]: expected %a (generic), got %a (%s)", what,
                         (int)M, (int)N, (int)K, (int)n0, (int)n1, (int)m, (long long)n, (double)g, (double)a,
                         kt->name);
            } else {
                finite += isfinite(g);
            }
        }
    free(yg);
    free(ya);
    return finite;
}

#if defined(PG_GEMM_X86)
static const kernel_under_test avx2_kernel = {cpu_gemm_bf16_cols_avx2, "avx2"};
#else
static const kernel_under_test avx2_kernel = {NULL, "none"};
#endif

/* compare_kernel with the avx2 kernel, ldy = N + 3 */
static long compare_kernels(const uint16_t *x, const uint16_t *w, int32_t M, int32_t N, int32_t K, int32_t n0,
                            int32_t n1, const char *what)
{
    return compare_kernel(&avx2_kernel, x, w, M, N, K, n0, n1, N + 3, what);
}

/* Single outputs through the generic kernel (the definition) */
static float def_dot(const uint16_t *x, const uint16_t *w, int32_t K)
{
    float y;
    cpu_gemm_bf16_cols_generic(&y, 1, x, w, 1, K, 0, 1);
    return y;
}

/* One hand-computed case: K elements of x and w (the rest 0), y expected
 * bit for bit from the generic kernel and, where it runs, the avx2 one. */
typedef struct hand_case {
    const char *what;
    int32_t K;
    int n;           /* positions set */
    int32_t k[4];
    float xv[4], wv[4];
    float y;         /* expected */
} hand_case;

static void check_hand_case(const hand_case *c)
{
    uint16_t x[64] = {0}, w[64] = {0};
    for (int i = 0; i < c->n; i++) {
        x[c->k[i]] = bf16_of(c->xv[i]);
        w[c->k[i]] = bf16_of(c->wv[i]);
    }
    float y = def_dot(x, w, c->K);
    if (memcmp(&y, &c->y, sizeof y) != 0)
        fail_msg("%s: expected %a, got %a (generic)", c->what, (double)c->y, (double)y);
#if defined(PG_GEMM_X86)
    if (have_avx2()) {
        cpu_gemm_bf16_cols_avx2(&y, 1, x, w, 1, c->K, 0, 1);
        if (memcmp(&y, &c->y, sizeof y) != 0)
            fail_msg("%s: expected %a, got %a (avx2)", c->what, (double)c->y, (double)y);
    }
#endif
#if defined(PG_GEMM_DOT)
    if (cpu_gemm_bf16_dot_available()) {
        cpu_gemm_bf16_cols_avx512bf16(&y, 1, x, w, 1, c->K, 0, 1);
        if (memcmp(&y, &c->y, sizeof y) != 0)
            fail_msg("%s: expected %a, got %a (avx512bf16)", c->what, (double)c->y, (double)y);
    }
#endif
}

/* The definition pinned by hand. */
static void test_definition_by_hand(void **state)
{
    (void)state;
    const hand_case cases[] = {
        /* Lane 0 of K = 34: chunk 0 gives p0 = 1; chunk 1 has its odd
         * product 2^24 and its even -2^24. Odd first: 1 + 2^24 rounds to
         * 2^24 (tie to even), then + -2^24 = +0. Even first would give
         * (1 - 2^24) + 2^24 = 1, and so would the exact mode's lanes
         * (k, k + 16, ...). */
        {"odd before even", 34, 3, {0, 32, 33}, {1.0f, 4096.0f, 4096.0f}, {1.0f, -4096.0f, 4096.0f}, 0.0f},
        /* the same with the signs of chunk 1 swapped: 1 - 2^24 is exact, + 2^24 = 1 */
        {"odd before even, swapped", 34, 3, {0, 32, 33}, {1.0f, 4096.0f, 4096.0f}, {1.0f, 4096.0f, -4096.0f}, 1.0f},
        /* lane 8 (k = 16, 17: the second ymm half): 3 * 0.5 - 2 * 0.25 */
        {"lane 8", 18, 2, {16, 17}, {3.0f, -2.0f}, {0.5f, 0.25f}, 1.0f},
        /* FTZ: 2^-100 * -2^-30 = -2^-130 is subnormal: lane 0 = -0, and
         * the tree's -0 + +0 = +0 (without FTZ: -2^-130) */
        {"ftz", 1, 1, {0}, {0x1p-100f}, {-0x1p-30f}, 0.0f},
        /* FTZ of a sum: 2^-63 * 2^-63 - (2^-63 * 2^-63 + a little) */
        {"ftz sum", 2, 2, {0, 1}, {0x1.02p-63f, 0x1p-63f}, {-0x1p-63f, 0x1p-63f}, 0.0f},
        /* 1e30 * 1e30 overflows the lane to inf; the tree keeps it */
        {"overflow", 2, 2, {0, 1}, {0x1p100f, 1.0f}, {0x1p100f, 1.0f}, INFINITY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_hand_case(&cases[i]);
    /* DAZ: the smallest subnormal bf16 (2^-133) times 2^100 reads as 0 * 2^100 = +0, not 2^-33 */
    uint16_t xs = 0x0001, ws = bf16_of(0x1p100f);
    float y = def_dot(&xs, &ws, 1);
    assert_true(y == 0.0f && !signbit(y));
#if defined(PG_GEMM_X86)
    if (have_avx2()) {
        cpu_gemm_bf16_cols_avx2(&y, 1, &xs, &ws, 1, 1, 0, 1);
        assert_true(y == 0.0f && !signbit(y));
    }
#endif
#if defined(PG_GEMM_DOT)
    if (cpu_gemm_bf16_dot_available()) {
        y = -1.0f;
        cpu_gemm_bf16_cols_avx512bf16(&y, 1, &xs, &ws, 1, 1, 0, 1);
        assert_true(y == 0.0f && !signbit(y));
    }
#endif
}

/* Tininess after rounding (cpu_gemm_modes.h): odd product 2^-63 * 2^-63 =
 * FLT_MIN, then 2^-126 * -2^-24 = -2^-150: the exact sum FLT_MIN - 2^-150
 * rounds (gradually) to FLT_MIN but to 24 bits with an unbounded exponent
 * below it, so x86 flushes it to +0 — and so must the definition. One step
 * out of the window (FLT_MIN - 2^-151, which rounds up) both keep FLT_MIN;
 * the same on the negative side. */
static void test_tininess_after_rounding(void **state)
{
    (void)state;
    uint16_t x[2], w[2];
    x[1] = w[1] = bf16_of(ldexpf(1.0f, -63));
    x[0] = bf16_of(ldexpf(1.0f, -126)), w[0] = bf16_of(-ldexpf(1.0f, -24));
    float d = def_dot(x, w, 2);
    assert_true(d == 0.0f && !signbit(d));
    w[0] = bf16_of(-ldexpf(1.0f, -25));
    assert_true(def_dot(x, w, 2) == FLT_MIN);
    w[1] = bf16_of(-ldexpf(1.0f, -63)), w[0] = bf16_of(ldexpf(1.0f, -24));
    d = def_dot(x, w, 2); /* lane 0 flushes to -0; the tree's -0 + +0 of lane 8 is +0 */
    assert_true(d == 0.0f && !signbit(d));
    /* VDPBF16PS in the window (its tininess is not in the SDM's words):
     * the avx512bf16 kernel where the CPU has it */
#if defined(PG_GEMM_DOT)
    const kernel_under_test dot = {cpu_gemm_bf16_cols_avx512bf16, "avx512bf16"};
#else
    const kernel_under_test dot = {NULL, "none"};
#endif
    const int run_dot = cpu_gemm_bf16_dot_available();
    if (!run_dot)
        print_message("SKIP part: this CPU has no AVX512_BF16: VDPBF16PS not checked in the window\n");
    if (!have_avx2()) {
        print_message("SKIP: this CPU lacks AVX2 + FMA: no avx2 kernel to compare\n");
        skip();
    }
    for (int k = 0; k < 4; k++) {
        w[1] = bf16_of((k & 1 ? -1.0f : 1.0f) * ldexpf(1.0f, -63));
        w[0] = bf16_of((k & 1 ? 1.0f : -1.0f) * ldexpf(1.0f, k & 2 ? -25 : -24));
        compare_kernels(x, w, 1, 1, 2, 0, 1, "tininess window");
        if (run_dot)
            compare_kernel(&dot, x, w, 1, 1, 2, 0, 1, 1, "tininess window");
    }
}

static void test_avx2_matches_definition(void **state)
{
    (void)state;
    if (!have_avx2()) {
        print_message("SKIP: this CPU lacks AVX2 + FMA: no avx2 kernel to compare\n");
        skip();
    }
    pg_test_rng rng = {20};
    long outputs = 0, finite_outputs = 0;
    for (int it = 0; it < 160; it++) {
        const int32_t M = it < 20 ? 1 : pg_test_rng_int(&rng, 1, 70);
        const int32_t N = pg_test_rng_int(&rng, 1, it < 80 ? 20 : 60);
        int32_t K = it < 60 ? pg_test_rng_int(&rng, 1, 100) : pg_test_rng_int(&rng, 1, it < 150 ? 1200 : 4096);
        if (it % 5 == 0)
            K |= 1; /* odd K */
        const int cls = it % 3 == 0 ? V_UNIT : V_MIXED;
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, cls), *w = bf16_buf(&rng, (size_t)N * K, cls);
        if (it % 7 == 3)
            make_cancellations(x, w, M, N, K);
        if (it % 4 == 1) {
            sprinkle_inf(&rng, x, (size_t)M * K, 2);
            sprinkle_inf(&rng, w, (size_t)N * K, 2);
        }
        finite_outputs += compare_kernels(x, w, M, N, K, 0, N, it % 3 == 0 ? "random" : "edge values");
        const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
        finite_outputs += compare_kernels(x, w, M, N, K, n0, n1, "column range");
        outputs += (long)M * (N + (n1 - n0));
        free(x);
        free(w);
    }
    /* the whole-chunk walk: K around the walk's chunk (1024) and its
     * multiples; K past 4096, where 8 split rows no longer fit the kernel's
     * buffer and its tiles convert x as they go */
    const int32_t Ks[] = {31, 32, 33, 1023, 1024, 1025, 1055, 1056, 2047, 2048, 2080, 3071, 4096, 4097, 8192, 9000};
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
        const int32_t M = 5 + (int32_t)i % 4, N = 7, K = Ks[i];
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, V_MIXED), *w = bf16_buf(&rng, (size_t)N * K, V_MIXED);
        finite_outputs += compare_kernels(x, w, M, N, K, 0, N, "walk edge");
        finite_outputs += compare_kernels(x, w, 1, N, K, 0, N, "walk edge gemv");
        outputs += (long)(M + 1) * N;
        free(x);
        free(w);
    }
    /* K = 0: every output the tree of 16 zero lanes, +0 */
    {
        uint16_t none[1] = {0};
        compare_kernels(none, none, 3, 5, 0, 0, 5, "K = 0");
        compare_kernels(none, none, 1, 5, 0, 0, 5, "K = 0 gemv");
#if defined(PG_GEMM_X86)
        float y[2] = {-1.0f, -1.0f};
        cpu_gemm_bf16_cols_avx2(y, 1, none, none, 2, 0, 0, 1);
        assert_true(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && !signbit(y[1]));
#endif
    }
    /* all-subnormal-sum rows: tiny x and w everywhere (FTZ in every lane) */
    {
        const int32_t M = 6, N = 13, K = 300;
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, V_TINY), *w = bf16_buf(&rng, (size_t)N * K, V_TINY);
        finite_outputs += compare_kernels(x, w, M, N, K, 0, N, "tiny");
        outputs += (long)M * N;
        free(x);
        free(w);
    }
    print_message("checked %ld outputs of the avx2 kernel bit for bit, %ld of them finite\n", outputs,
                  finite_outputs);
    /* the comparisons above must mostly be of numbers, not of inf and NaN */
    assert_true(finite_outputs > outputs * 3 / 4);
}

/* The avx512bf16 kernel (one VDPBF16PS per chunk of 32, cpu_gemm_bf16_kernel.c)
 * against the generic one (the definition) bit for bit, where the CPU has
 * AVX512_BF16 + AVX-512F/BW/VL; SKIP (said so) elsewhere. Every M of its
 * tiles' edges (1 = the batch-1 tile, 2..5, 7, 16, 33) x N off its 6
 * columns x K whole chunks or not (the masked tail), padded ldy, column
 * ranges; then random shapes and edge values as the avx2 test has. */
static void test_avx512bf16_matches_definition(void **state)
{
    (void)state;
    if (!cpu_gemm_bf16_dot_available()) {
        print_message("SKIP: this CPU (or build) lacks AVX512_BF16 + AVX-512F/BW/VL: the avx512bf16 kernel "
                      "cannot run here\n");
        skip();
    }
#if defined(PG_GEMM_DOT)
    const kernel_under_test kt = {cpu_gemm_bf16_cols_avx512bf16, "avx512bf16"};
    pg_test_rng rng = {16};
    long outputs = 0, finite_outputs = 0;
    static const int32_t Ms[] = {1, 2, 3, 4, 5, 7, 16, 33};
    static const int32_t Ns[] = {1, 5, 6, 7, 13, 25};
    static const int32_t Ks[] = {1, 31, 32, 33, 64, 96, 100, 768, 777};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                const int cls = (ki + ni + mi) % 3 == 0 ? V_UNIT : V_MIXED;
                uint16_t *x = bf16_buf(&rng, (size_t)M * K, cls), *w = bf16_buf(&rng, (size_t)N * K, cls);
                if ((ki + mi) % 5 == 2)
                    make_cancellations(x, w, M, N, K);
                const int64_t ldy = N + pg_test_rng_int(&rng, 0, 5);
                finite_outputs += compare_kernel(&kt, x, w, M, N, K, 0, N, ldy, "tile edges");
                const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
                finite_outputs += compare_kernel(&kt, x, w, M, N, K, n0, n1, ldy, "tile edges, column range");
                outputs += (long)M * (N + (n1 - n0));
                free(x);
                free(w);
            }
    for (int it = 0; it < 160; it++) {
        const int32_t M = it < 20 ? 1 : pg_test_rng_int(&rng, 1, 70);
        const int32_t N = pg_test_rng_int(&rng, 1, it < 80 ? 20 : 60);
        int32_t K = it < 60 ? pg_test_rng_int(&rng, 1, 100) : pg_test_rng_int(&rng, 1, it < 150 ? 1200 : 4096);
        if (it % 5 == 0)
            K |= 1;
        const int cls = it % 3 == 0 ? V_UNIT : V_MIXED;
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, cls), *w = bf16_buf(&rng, (size_t)N * K, cls);
        if (it % 7 == 3)
            make_cancellations(x, w, M, N, K);
        if (it % 4 == 1) {
            sprinkle_inf(&rng, x, (size_t)M * K, 2);
            sprinkle_inf(&rng, w, (size_t)N * K, 2);
        }
        finite_outputs += compare_kernel(&kt, x, w, M, N, K, 0, N, N + 3, it % 3 == 0 ? "random" : "edge values");
        const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
        finite_outputs += compare_kernel(&kt, x, w, M, N, K, n0, n1, N, "column range");
        outputs += (long)M * (N + (n1 - n0));
        free(x);
        free(w);
    }
    /* long K (row blocks of x shorter than a tile), K = 0, all-tiny rows */
    static const int32_t Klong[] = {4096, 4097, 8192, 9000};
    for (size_t i = 0; i < sizeof Klong / sizeof Klong[0]; i++) {
        const int32_t M = 9, N = 7, K = Klong[i];
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, V_MIXED), *w = bf16_buf(&rng, (size_t)N * K, V_MIXED);
        finite_outputs += compare_kernel(&kt, x, w, M, N, K, 0, N, N, "long K");
        finite_outputs += compare_kernel(&kt, x, w, 1, N, K, 0, N, N, "long K gemv");
        outputs += (long)(M + 1) * N;
        free(x);
        free(w);
    }
    {
        uint16_t none[1] = {0};
        compare_kernel(&kt, none, none, 3, 5, 0, 0, 5, 5, "K = 0");
        compare_kernel(&kt, none, none, 1, 5, 0, 0, 5, 5, "K = 0 gemv");
        float y[2] = {-1.0f, -1.0f};
        cpu_gemm_bf16_cols_avx512bf16(y, 1, none, none, 2, 0, 0, 1);
        assert_true(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && !signbit(y[1]));
    }
    {
        const int32_t M = 6, N = 13, K = 300;
        uint16_t *x = bf16_buf(&rng, (size_t)M * K, V_TINY), *w = bf16_buf(&rng, (size_t)N * K, V_TINY);
        finite_outputs += compare_kernel(&kt, x, w, M, N, K, 0, N, N, "tiny");
        finite_outputs += compare_kernel(&kt, x, w, 1, N, K, 0, N, N, "tiny gemv");
        outputs += (long)(M + 1) * N;
        free(x);
        free(w);
    }
    /* the caller's MXCSR comes back unchanged */
    const unsigned int csr = _mm_getcsr();
    {
        uint16_t x[64], w[64];
        for (int i = 0; i < 64; i++)
            x[i] = w[i] = bf16_of(1.0f);
        float y = 0.0f;
        cpu_gemm_bf16_cols_avx512bf16(&y, 1, x, w, 1, 64, 0, 1);
        assert_true(y == 64.0f);
    }
    assert_int_equal(_mm_getcsr(), csr);
    print_message("checked %ld outputs of the avx512bf16 kernel bit for bit, %ld of them finite\n", outputs,
                  finite_outputs);
    assert_true(finite_outputs > outputs * 3 / 4);
#endif
}

/* f32 activations: mostly uniform, some values that round to subnormal
 * bf16, zeros, and exact halfway cases of the rounding */
static float *act_buf(pg_test_rng *rng, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    pg_test_fill_uniform(rng, p, n, -2.0f, 2.0f);
    for (size_t i = 0; i < n; i++) {
        const int r = pg_test_rng_int(rng, 0, 99);
        if (r < 3)
            p[i] = ldexpf(p[i], -128); /* a subnormal: DAZ'd */
        else if (r < 6)
            p[i] = 0.0f;
        else if (r < 9)
            p[i] = bf16_f32(0x3F80u) + ldexpf(1.0f, -8); /* 1 + half a bf16 ulp: ties to even (1) */
    }
    return p;
}

static void gemm_mode(cpu_gemm_variant v, cpu_pool *pool, float *y, int64_t ldy, const float *x, const uint16_t *w,
                      int32_t M, int32_t N, int32_t K)
{
    const size_t bytes = cpu_gemm_mode_scratch_bytes(CPU_MATMUL_BF16, M, K);
    void *scratch = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(scratch);
    cpu_gemm_mode(CPU_MATMUL_BF16, v, CPU_WT_BF16, pool, y, ldy, x, w, M, N, K, scratch);
    free(scratch);
}

/* Row r of y (in any batch, any row subset, pool and variant) is row r of
 * the batch of all M rows on one thread with the generic kernel. */
static void test_mode_batch_invariant(void **state)
{
    (void)state;
    pg_test_rng rng = {2020};
    cpu_pool *pools[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++)
        assert_int_equal(cpu_pool_create(&pools[p], p + 1, NULL), 0);
    const int32_t shapes[][2] = {{2304, 768}, {301, 1000}, {100, 2048}, {37, 33}, {29, 1}};
    const cpu_gemm_variant variants[] = {CPU_GEMM_AUTO, CPU_GEMM_GENERIC, CPU_GEMM_AVX2, CPU_GEMM_AVX512};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int32_t N = shapes[s][0], K = shapes[s][1], M = s == 0 ? 19 : 70;
        float *x = act_buf(&rng, (size_t)M * K);
        uint16_t *w = bf16_buf(&rng, (size_t)N * K, V_UNIT);
        float *ref = malloc((size_t)M * N * sizeof *ref), *y = malloc((size_t)M * N * sizeof *y);
        assert_non_null(ref);
        assert_non_null(y);
        gemm_mode(CPU_GEMM_GENERIC, NULL, ref, N, x, w, M, N, K);
        for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
            if (!cpu_gemm_variant_available(variants[vi])) {
                if (s == 0)
                    print_message("SKIP variant %s: not available here\n", cpu_gemm_variant_name(variants[vi]));
                continue;
            }
            if (s == 0)
                print_message("variant %s runs the %s kernel\n", cpu_gemm_variant_name(variants[vi]),
                              cpu_gemm_mode_kernel_name(CPU_MATMUL_BF16, variants[vi]));
            for (int p = 0; p < 2; p++)
                for (int sub = 0; sub < 4; sub++) {
                    /* the whole batch, one row, a run of rows, a single last row */
                    int32_t r0 = 0, rn = M;
                    if (sub == 1)
                        r0 = pg_test_rng_int(&rng, 0, M - 1), rn = 1;
                    else if (sub == 2)
                        r0 = pg_test_rng_int(&rng, 0, M - 1), rn = pg_test_rng_int(&rng, 1, M - r0);
                    else if (sub == 3)
                        r0 = M - 1, rn = 1;
                    gemm_mode(variants[vi], pools[p], y, N, x + (size_t)r0 * K, w, rn, N, K);
                    for (int32_t m = 0; m < rn; m++)
                        for (int32_t n = 0; n < N; n++)
                            if (!same_bits(y[(size_t)m * N + n], ref[(size_t)(r0 + m) * N + n]))
                                fail_msg("cpu_gemm_mode bf16 N=%d K=%d variant %s threads %d rows [%d,+%d): "
                                         "y[%d][%d]: expected %a (row %d of M=%d, generic), got %a",
                                         (int)N, (int)K, cpu_gemm_variant_name(variants[vi]), p + 1, (int)r0,
                                         (int)rn, (int)m, (int)n, (double)ref[(size_t)(r0 + m) * N + n], (int)(r0 + m),
                                         (int)M, (double)y[(size_t)m * N + n]);
                }
        }
        free(x);
        free(w);
        free(ref);
        free(y);
    }
    for (int p = 0; p < 2; p++)
        cpu_pool_destroy(pools[p]);
}

#if defined(PG_GEMM_X86)
/* The definition's tree (cpu_gemm_modes.h), ftz'd in software */
static float flush(float v)
{
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}
static float def_tree(const float acc[16])
{
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = flush(acc[i] + acc[i + 8]);
    for (int i = 0; i < 4; i++)
        s4[i] = flush(s8[i] + s8[i + 4]);
    for (int i = 0; i < 2; i++)
        s2[i] = flush(s4[i] + s4[i + 2]);
    return flush(s2[0] + s2[1]);
}

/* The 16 lanes of one output by the instruction: one VDPBF16PS per chunk
 * of 32 (x, w zero-padded to whole chunks); MXCSR plays no part in it. */
__attribute__((target("avx512bf16,avx512f,avx512vl"))) static void dpbf16_lanes(float acc[16], const uint16_t *x,
                                                                                 const uint16_t *w, int32_t chunks)
{
    __m512 a = _mm512_setzero_ps();
    for (int32_t c = 0; c < chunks; c++)
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(x + 32 * c), (__m512bh)_mm512_loadu_si512(w + 32 * c));
    _mm512_storeu_ps(acc, a);
}
#endif

/* VDPBF16PS vs the definition (Intel SDM: odd pair element first, DAZ in,
 * FTZ out, RNE), on random and edge-value inputs. */
static void test_vdpbf16ps_pinned(void **state)
{
    (void)state;
#if defined(PG_GEMM_X86)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) {
        print_message("SKIP: this CPU has no AVX512_BF16: VDPBF16PS not pinned here\n");
        skip();
    }
    pg_test_rng rng = {512};
    long checked = 0;
    for (int it = 0; it < 400; it++) {
        const int32_t K = it < 200 ? pg_test_rng_int(&rng, 1, 100) : pg_test_rng_int(&rng, 1, 4096);
        const int32_t chunks = (K + 31) / 32;
        const int cls = it % 4 == 0 ? V_UNIT : V_MIXED;
        uint16_t *x = calloc((size_t)chunks * 32, sizeof *x), *w = calloc((size_t)chunks * 32, sizeof *w);
        assert_non_null(x);
        assert_non_null(w);
        for (int32_t k = 0; k < K; k++)
            x[k] = rand_bf16(&rng, cls), w[k] = rand_bf16(&rng, cls);
        if (it % 7 == 3)
            make_cancellations(x, w, 1, 1, K); /* within x only: pairs of opposite sign */
        float acc[16];
        dpbf16_lanes(acc, x, w, chunks);
        const float got = def_tree(acc), want = def_dot(x, w, K);
        if (!same_bits(got, want))
            fail_msg("vdpbf16ps K=%d (it %d): expected %a (definition), got %a (instruction + tree)", (int)K, it,
                     (double)want, (double)got);
        checked++;
        free(x);
        free(w);
    }
    print_message("checked %ld products of VDPBF16PS bit for bit\n", checked);
#else
    print_message("SKIP: not an x86-64 build: no VDPBF16PS\n");
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_definition_by_hand),
        cmocka_unit_test(test_tininess_after_rounding),
        cmocka_unit_test(test_avx2_matches_definition),
        cmocka_unit_test(test_avx512bf16_matches_definition),
        cmocka_unit_test(test_mode_batch_invariant),
        cmocka_unit_test(test_vdpbf16ps_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
