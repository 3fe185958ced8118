/* test_gemm_q8: the int8 matmul mode (W8A8, cpu_gemm_modes.h "int8").
 *
 *  - The definition pinned: one hand-built K = 32 product (known ints and
 *    scales) whose f32 result is written below as a literal, and which the
 *    plausible other orders (lanes summed in sequence or in adjacent pairs,
 *    the scale applied after the integer sum, p * sx * sw in two roundings)
 *    all round differently.
 *  - The AVX2 kernel (cpu_gemm_q8_kernel.c) against the generic one, its
 *    simple twin, bit for bit (memcmp) on fresh random inputs (M 1..70, N
 *    off the tile widths, K = 32..4096, odd column ranges, a padded ldy
 *    whose padding must stay untouched) and on edge blocks (all zero,
 *    +-127 everywhere, one huge outlier per block, scales near FLT_MIN whose
 *    products are subnormal, scales whose products overflow).
 *  - The avx512vnni kernel against the generic one the same way (tile
 *    edges, random shapes, edge blocks, -128), where the CPU has AVX512_VNNI.
 *  - cpu_gemm_mode(CPU_MATMUL_INT8) end to end: every variant this CPU runs,
 *    pools of 1 and 2 threads and none, row m alone == row m in a batch.
 * The AVX2 parts are skipped, with a message, where the CPU lacks AVX2. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_gemm.h"
#include "cpu_gemm_kernel.h"
#include "cpu_gemm_modes.h"
#include "cpu_pool.h"
#include "cpu_wt.h"
#include "test_support.h"

static int have_avx2(void)
{
    return cpu_gemm_variant_available(CPU_GEMM_AVX2);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* one block: scale, then 32 ints */
static void put_block(unsigned char *blk, float scale, const int8_t *q)
{
    memcpy(blk, &scale, sizeof scale);
    memcpy(blk + 4, q, CPU_I8_GROUP);
}

/* K = 32, sx = 0.1f, sw = 0.3f: d = sx * sw = 0x1.eb852p-6 (one f32
 * rounding), acc[j] = p_b[j] * d (one rounding each), then the tree. The
 * literal was computed in exact rational arithmetic, rounding to f32 at
 * each step of cpu_gemm_modes.h's order. The other orders named at the top
 * give -0x1.6f4c2ap+10, one ulp away. */
static void test_definition_pinned(void **state)
{
    (void)state;
    static const int8_t qx[32] = {-11, 87,  65,  42,  64, 5,   119,  -54, 12,  -40, 100, -69, 93,  -110, 92,  23,
                                  121, -54, -97, 80,  -65, -116, -119, 104, 78, 50,  4,   109, -77, 102,  99, 103};
    static const int8_t qw[32] = {-17,  20, -115, -124, -4,  63,  -97, -84, 1,  -51, -66, 42, -122, 7,   10,  -22,
                                  -114, 113, 106, 29,   -98, -40, -95, -63, 121, 93, 11, -5, 80,   73, -112, -37};
    unsigned char xb[CPU_I8_BLOCK_BYTES], wb[CPU_I8_BLOCK_BYTES];
    put_block(xb, 0.1f, qx);
    put_block(wb, 0.3f, qw);
    const float want = -0x1.6f4c2cp+10f;
    float y = NAN;
    cpu_gemm_q8_cols_generic(&y, 1, xb, wb, 1, 32, 0, 1);
    if (memcmp(&y, &want, sizeof y) != 0)
        fail_msg("q8 generic, pinned K = 32 case: expected %a, got %a", (double)want, (double)y);
#if defined(PG_GEMM_X86)
    if (have_avx2()) {
        y = NAN;
        cpu_gemm_q8_cols_avx2(&y, 1, xb, wb, 1, 32, 0, 1);
        if (memcmp(&y, &want, sizeof y) != 0)
            fail_msg("q8 avx2, pinned K = 32 case: expected %a, got %a", (double)want, (double)y);
    }
#endif
#if defined(PG_GEMM_DOT)
    if (cpu_gemm_q8_dot_available()) {
        y = NAN;
        cpu_gemm_q8_cols_avx512vnni(&y, 1, xb, wb, 1, 32, 0, 1);
        if (memcmp(&y, &want, sizeof y) != 0)
            fail_msg("q8 avx512vnni, pinned K = 32 case: expected %a, got %a", (double)want, (double)y);
    }
#endif
}

/* Random q8 rows [rows][K/32]: each block's values are uniform in +-1
 * times 2^e with e per block in [-20, 20] (so scales differ from block to
 * block), quantized with the weights' own quantizer. */
static unsigned char *rand_q8(pg_test_rng *rng, int32_t rows, int32_t K)
{
    const size_t n = (size_t)rows * (size_t)K;
    float *f = xmalloc(n * sizeof *f);
    pg_test_fill_uniform(rng, f, n, -1.0f, 1.0f);
    for (size_t b = 0; b < n / CPU_I8_GROUP; b++) {
        const float s = ldexpf(1.0f, pg_test_rng_int(rng, -20, 20));
        for (int i = 0; i < CPU_I8_GROUP; i++)
            f[b * CPU_I8_GROUP + (size_t)i] *= s;
    }
    unsigned char *q = xmalloc((size_t)rows * (size_t)(K / CPU_I8_GROUP) * CPU_I8_BLOCK_BYTES);
    cpu_q8_quantize_rows(q, f, rows, K);
    free(f);
    return q;
}

#if defined(PG_GEMM_X86)
/* The kernel compare_kernels tests against the generic one: the avx2 one,
 * or (test_avx512vnni_*) the avx512vnni one. */
static cpu_gemm_q8_cols_fn kernel_fn = cpu_gemm_q8_cols_avx2;
static const char *kernel_name = "avx2";

/* columns [n0, n1) of y [M][ldy] by both kernels, NaN elsewhere: the same
 * bits, and nothing outside the columns written */
static void compare_kernels(const char *what, const unsigned char *xq, const unsigned char *w, int32_t M, int32_t N,
                            int32_t K, int32_t n0, int32_t n1, int64_t ldy)
{
    const size_t n = (size_t)M * (size_t)ldy;
    float *yg = xmalloc(n * sizeof *yg), *ya = xmalloc(n * sizeof *ya);
    for (size_t i = 0; i < n; i++)
        yg[i] = ya[i] = NAN;
    cpu_gemm_q8_cols_generic(yg, ldy, xq, w, M, K, n0, n1);
    kernel_fn(ya, ldy, xq, w, M, K, n0, n1);
    for (int32_t m = 0; m < M; m++)
        for (int64_t c = 0; c < ldy; c++) {
            const size_t i = (size_t)m * (size_t)ldy + (size_t)c;
            if (memcmp(&yg[i], &ya[i], sizeof *yg) != 0)
                fail_msg("q8 %s M=%d N=%d K=%d cols [%d, %d): y[%d][%lld]: generic %a, %s %a", what, (int)M,
                         (int)N, (int)K, (int)n0, (int)n1, (int)m, (long long)c, (double)yg[i], kernel_name,
                         (double)ya[i]);
            if ((c < n0 || c >= n1) && !isnan(ya[i]))
                fail_msg("q8 %s M=%d N=%d K=%d cols [%d, %d): y[%d][%lld] outside the columns was written (%s)",
                         what, (int)M, (int)N, (int)K, (int)n0, (int)n1, (int)m, (long long)c, kernel_name);
        }
    free(yg);
    free(ya);
}
#endif

static void test_avx2_matches_generic_random(void **state)
{
    (void)state;
    if (!have_avx2()) {
        print_message("SKIP: this CPU has no AVX2 + FMA (the generic kernel is the only one)\n");
        skip();
    }
#if defined(PG_GEMM_X86)
    pg_test_rng rng = {2020};
    long outputs = 0;
    /* fixed corners first: the largest K with M = 1, 4, 70; one column;
     * tiles 4 x 3 and 1 x 6 plus one; K = 32768 and one block past it */
    static const int32_t fixed[][3] = {{1, 7, 4096}, {4, 13, 4096}, {70, 5, 4096}, {5, 1, 32}, {1, 1, 32}, {5, 4, 64},
                                       {1, 7, 64}, {70, 301, 32}, {5, 4, 32 * 1025}, {9, 7, 32 * 1024}};
    for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++) {
        const int32_t M = fixed[f][0], N = fixed[f][1], K = fixed[f][2];
        unsigned char *xq = rand_q8(&rng, M, K), *w = rand_q8(&rng, N, K);
        compare_kernels("fixed", xq, w, M, N, K, 0, N, N + 1);
        outputs += (long)M * N;
        free(xq);
        free(w);
    }
    for (int it = 0; it < 120; it++) {
        /* small shapes first, then up to M = 70, K = 4096 (work kept bounded) */
        const int32_t M = it % 5 == 0 ? 1 : pg_test_rng_int(&rng, 1, it < 60 ? 9 : 70);
        const int32_t K = 32 * pg_test_rng_int(&rng, 1, it < 60 ? 8 : 128);
        int32_t N = pg_test_rng_int(&rng, 1, it < 60 ? 30 : 200);
        while ((int64_t)M * N * K > 12 * 1000 * 1000 && N > 1)
            N /= 2;
        const int32_t n0 = it % 3 == 0 ? pg_test_rng_int(&rng, 0, N) : 0;
        const int32_t n1 = it % 3 == 0 ? pg_test_rng_int(&rng, n0, N) : N;
        unsigned char *xq = rand_q8(&rng, M, K), *w = rand_q8(&rng, N, K);
        compare_kernels("random", xq, w, M, N, K, n0, n1, N + pg_test_rng_int(&rng, 0, 3));
        outputs += (long)M * (n1 - n0);
        free(xq);
        free(w);
    }
    print_message("avx2 == generic on %ld random outputs\n", outputs);
#endif
}

/* Edge blocks, built by hand (ints and scales) or through the quantizer. */
typedef enum { EDGE_ZERO, EDGE_MAX, EDGE_OUTLIER, EDGE_TINY, EDGE_HUGE, EDGE_MIXED, EDGE_COUNT } edge_kind;
static const char *const edge_names[EDGE_COUNT] = {"all-zero", "+-127", "outlier", "tiny scales", "huge scales",
                                                   "mixed"};

static void fill_edge(pg_test_rng *rng, unsigned char *q, int32_t rows, int32_t K, edge_kind kind)
{
    const int32_t nb = K / CPU_I8_GROUP;
    for (int32_t r = 0; r < rows; r++)
        for (int32_t b = 0; b < nb; b++) {
            unsigned char *blk = q + ((size_t)r * (size_t)nb + (size_t)b) * CPU_I8_BLOCK_BYTES;
            edge_kind k = kind == EDGE_MIXED ? (edge_kind)pg_test_rng_int(rng, 0, EDGE_HUGE) : kind;
            int8_t ints[CPU_I8_GROUP];
            float scale;
            if (k == EDGE_OUTLIER) { /* through the quantizer: one value 1e30 times the rest */
                float v[CPU_I8_GROUP];
                pg_test_fill_uniform(rng, v, CPU_I8_GROUP, -1.0f, 1.0f);
                v[pg_test_rng_int(rng, 0, CPU_I8_GROUP - 1)] = pg_test_rng_int(rng, 0, 1) ? 1e30f : -1e30f;
                assert_int_equal(cpu_wt_store(CPU_WT_I8, blk, 0, v, ST_F32, CPU_I8_GROUP), 0);
                continue;
            }
            for (int i = 0; i < CPU_I8_GROUP; i++)
                ints[i] = k == EDGE_ZERO ? 0
                        : k == EDGE_MAX  ? (pg_test_rng_int(rng, 0, 1) ? 127 : -127)
                                         : (int8_t)pg_test_rng_int(rng, -127, 127);
            switch (k) {
            case EDGE_ZERO: scale = 0.0f; break;
            case EDGE_MAX: scale = pg_test_rng_uniform(rng, 0.5f, 2.0f); break;
            /* 2^-140 .. 2^-108: subnormal scales, and products sx * sw,
             * p * d and sums that are subnormal (DAZ or FTZ would show) */
            case EDGE_TINY:
                scale = ldexpf(pg_test_rng_uniform(rng, 1.0f, 2.0f), pg_test_rng_int(rng, -140, -109));
                break;
            /* sx * sw overflows to inf (p = 0 then gives NaN, as in the definition) */
            case EDGE_HUGE: scale = FLT_MAX / 127.0f * pg_test_rng_uniform(rng, 0.01f, 1.0f); break;
            default: scale = pg_test_rng_uniform(rng, 1e-3f, 1.0f); break;
            }
            put_block(blk, scale, ints);
        }
}

#if defined(PG_GEMM_X86)
/* every pair of edge kinds on a few shapes: kernel_fn vs the generic one */
static void compare_edges(void)
{
    pg_test_rng rng = {127};
    const int32_t shapes[][3] = {{1, 13, 32}, {5, 7, 96}, {9, 11, 256}, {1, 29, 768}, {6, 5, 4096}};
    for (int kx = 0; kx < EDGE_COUNT; kx++)
        for (int kw = 0; kw < EDGE_COUNT; kw++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int32_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                const size_t row_bytes = (size_t)(K / CPU_I8_GROUP) * CPU_I8_BLOCK_BYTES;
                unsigned char *xq = xmalloc((size_t)M * row_bytes), *w = xmalloc((size_t)N * row_bytes);
                fill_edge(&rng, xq, M, K, (edge_kind)kx);
                fill_edge(&rng, w, N, K, (edge_kind)kw);
                char what[64];
                snprintf(what, sizeof what, "x %s, w %s", edge_names[kx], edge_names[kw]);
                compare_kernels(what, xq, w, M, N, K, 0, N, N);
                free(xq);
                free(w);
            }
}
#endif

static void test_avx2_matches_generic_edges(void **state)
{
    (void)state;
    if (!have_avx2()) {
        print_message("SKIP: this CPU has no AVX2 + FMA (the generic kernel is the only one)\n");
        skip();
    }
#if defined(PG_GEMM_X86)
    compare_edges();
#endif
}

static void test_avx512vnni_matches_generic_edges(void **state)
{
    (void)state;
    if (!cpu_gemm_q8_dot_available()) {
        print_message("SKIP: this CPU (or build) lacks AVX512_VNNI + AVX-512F/BW/VL: the avx512vnni kernel "
                      "cannot run here\n");
        skip();
    }
#if defined(PG_GEMM_DOT)
    kernel_fn = cpu_gemm_q8_cols_avx512vnni;
    kernel_name = "avx512vnni";
    compare_edges();
    kernel_fn = cpu_gemm_q8_cols_avx2;
    kernel_name = "avx2";
#endif
}

/* The avx512vnni kernel (cpu_gemm_q8_kernel.c: vpdpbusd, two outputs per
 * zmm) against the generic one, bit for bit, where the CPU has AVX512_VNNI
 * + AVX-512F/BW/VL (SKIP, said so, elsewhere): every M of its tile edges x
 * N off its 6 columns (odd ones: a pair's half unused) and its 1 x 6
 * batch-1 tile x K in whole blocks, padded ldy and column ranges; then
 * the random shapes and the edge blocks of the avx2 tests, and -128 (which
 * this kernel's +128 offset handles, though no quantizer writes it). */
static void test_avx512vnni_matches_generic(void **state)
{
    (void)state;
    if (!cpu_gemm_q8_dot_available()) {
        print_message("SKIP: this CPU (or build) lacks AVX512_VNNI + AVX-512F/BW/VL: the avx512vnni kernel "
                      "cannot run here\n");
        skip();
    }
#if defined(PG_GEMM_DOT)
    kernel_fn = cpu_gemm_q8_cols_avx512vnni;
    kernel_name = "avx512vnni";
    pg_test_rng rng = {4096};
    long outputs = 0;
    static const int32_t Ms[] = {1, 2, 3, 4, 5, 7, 16, 33};
    static const int32_t Ns[] = {1, 2, 5, 6, 7, 13, 25};
    static const int32_t Ks[] = {32, 64, 96, 768, 2048};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                unsigned char *xq = rand_q8(&rng, M, K), *w = rand_q8(&rng, N, K);
                const int64_t ldy = N + pg_test_rng_int(&rng, 0, 5);
                compare_kernels("tile edges", xq, w, M, N, K, 0, N, ldy);
                const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
                compare_kernels("tile edges, column range", xq, w, M, N, K, n0, n1, ldy);
                outputs += (long)M * (N + (n1 - n0));
                free(xq);
                free(w);
            }
    for (int it = 0; it < 120; it++) {
        const int32_t M = it % 5 == 0 ? 1 : pg_test_rng_int(&rng, 1, it < 60 ? 9 : 70);
        const int32_t K = 32 * pg_test_rng_int(&rng, 1, it < 60 ? 8 : 128);
        int32_t N = pg_test_rng_int(&rng, 1, it < 60 ? 30 : 200);
        while ((int64_t)M * N * K > 12 * 1000 * 1000 && N > 1)
            N /= 2;
        const int32_t n0 = it % 3 == 0 ? pg_test_rng_int(&rng, 0, N) : 0;
        const int32_t n1 = it % 3 == 0 ? pg_test_rng_int(&rng, n0, N) : N;
        unsigned char *xq = rand_q8(&rng, M, K), *w = rand_q8(&rng, N, K);
        compare_kernels("random", xq, w, M, N, K, n0, n1, N + pg_test_rng_int(&rng, 0, 3));
        outputs += (long)M * (n1 - n0);
        free(xq);
        free(w);
    }
    {   /* K = 32768 and one block past it; -128 in x and w */
        const int32_t M = 5, N = 7, K = 32 * 1025;
        unsigned char *xq = rand_q8(&rng, M, K), *w = rand_q8(&rng, N, K);
        compare_kernels("long K", xq, w, M, N, K, 0, N, N);
        compare_kernels("long K gemv", xq, w, 1, N, K, 0, N, N);
        for (int32_t r = 0; r < M; r++)
            xq[(size_t)r * (K / 32) * CPU_I8_BLOCK_BYTES + 4 + (size_t)r] = 0x80;
        for (int32_t r = 0; r < N; r++)
            w[(size_t)r * (K / 32) * CPU_I8_BLOCK_BYTES + 4 + (size_t)r % 3] = 0x80;
        compare_kernels("-128", xq, w, M, N, K, 0, N, N);
        compare_kernels("-128 gemv", xq, w, 1, N, K, 0, N, N);
        outputs += 2L * (M + 1) * N;
        free(xq);
        free(w);
    }
    kernel_fn = cpu_gemm_q8_cols_avx2;
    kernel_name = "avx2";
    print_message("avx512vnni == generic on %ld outputs\n", outputs);
#endif
}

/* The AVX2 activation quantizer against cpu_q8_quantize_rows (cpu_wt.c's
 * i8_block, the definition) byte for byte: random rows over a wide
 * exponent range, and blocks of edge values: zeros of both signs, NaN,
 * +-inf, FLT_MAX, subnormals (scale 0 or subnormal), exact ties of
 * v / scale at k + 1/2 (amax 127: scale 1), values just past the clamp. */
static void test_quantize_matches_definition(void **state)
{
    (void)state;
    if (!have_avx2()) {
        print_message("SKIP: this CPU has no AVX2 + FMA (the generic quantizer is the only one)\n");
        skip();
    }
#if defined(PG_GEMM_X86)
    pg_test_rng rng = {36};
    static const float edges[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, FLT_MIN,
                                  FLT_TRUE_MIN, -FLT_TRUE_MIN, 1e-40f, 127.0f, -127.0f, 2.5f, -3.5f, 0.5f, -0.5f,
                                  126.5f, 127.49f, 1.0f, -1e-3f};
    const int n_edges = (int)(sizeof edges / sizeof edges[0]);
    for (int it = 0; it < 400; it++) {
        const int32_t M = pg_test_rng_int(&rng, 1, 5), K = 32 * pg_test_rng_int(&rng, 1, it < 200 ? 4 : 64);
        const size_t n = (size_t)M * (size_t)K, bytes = n / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
        float *x = xmalloc(n * sizeof *x);
        pg_test_fill_uniform(&rng, x, n, -1.0f, 1.0f);
        for (size_t b = 0; b < n / CPU_I8_GROUP; b++) {
            const int kind = pg_test_rng_int(&rng, 0, 3);
            const float s = ldexpf(1.0f, pg_test_rng_int(&rng, -140, 120));
            for (int i = 0; i < CPU_I8_GROUP; i++) {
                float *v = &x[b * CPU_I8_GROUP + (size_t)i];
                if (kind == 1)
                    *v *= s; /* a scale from subnormal to huge */
                else if (kind == 2 && pg_test_rng_int(&rng, 0, 3) == 0)
                    *v = edges[pg_test_rng_int(&rng, 0, n_edges - 1)];
                else if (kind == 3) /* amax 127, scale 1: halves are exact ties */
                    *v = i == 0 ? 127.0f : (float)pg_test_rng_int(&rng, -254, 254) * 0.5f;
            }
        }
        unsigned char *qd = xmalloc(bytes), *qa = xmalloc(bytes);
        memset(qd, 0xAA, bytes);
        memset(qa, 0x55, bytes);
        cpu_q8_quantize_rows(qd, x, M, K);
        cpu_q8_quantize_rows_avx2(qa, x, M, K);
        for (size_t i = 0; i < bytes; i++)
            if (qd[i] != qa[i]) {
                const size_t b = i / CPU_I8_BLOCK_BYTES, at = i % CPU_I8_BLOCK_BYTES;
                const size_t e = b * CPU_I8_GROUP + (at < 4 ? 0 : at - 4); /* the element (byte 0-3: the scale) */
                fail_msg("q8 quantize M=%d K=%d: block %zu byte %zu: definition 0x%02x, avx2 0x%02x (x = %a)", (int)M,
                         (int)K, b, at, qd[i], qa[i], (double)x[e]);
            }
        free(x);
        free(qd);
        free(qa);
    }
#endif
}

/* cpu_gemm_mode end to end on f32 x (quantized inside): every variant, pool
 * and batch gives row r the bits it gets alone through the generic kernel. */
static void test_mode_invariance(void **state)
{
    (void)state;
    pg_test_rng rng = {8};
    cpu_pool *pools[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++)
        assert_int_equal(cpu_pool_create(&pools[p], p + 1, NULL), 0);
    const int32_t shapes[][2] = {{2304, 768}, {301, 2048}, {37, 32}, {1000, 4096}, {50, 172}};
    const cpu_gemm_variant variants[] = {CPU_GEMM_AUTO, CPU_GEMM_GENERIC, CPU_GEMM_AVX2, CPU_GEMM_AVX512};
    int avx2_ran = 0;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t N = shapes[c][0], K = shapes[c][1], Mmax = 19;
        float *wf = xmalloc((size_t)N * (size_t)K * sizeof *wf), *x = xmalloc((size_t)Mmax * (size_t)K * sizeof *x);
        pg_test_fill_uniform(&rng, wf, (size_t)N * (size_t)K, -1.0f, 1.0f);
        pg_test_fill_uniform(&rng, x, (size_t)Mmax * (size_t)K, -3.0f, 3.0f);
        void *w = xmalloc(cpu_wt_bytes(CPU_WT_I8, (size_t)N * (size_t)K));
        assert_int_equal(cpu_wt_store(CPU_WT_I8, w, 0, wf, ST_F32, (size_t)N * (size_t)K), 0);
        void *scratch = aligned_alloc(64, (cpu_gemm_mode_scratch_bytes(CPU_MATMUL_INT8, Mmax, K) + 64) / 64 * 64);
        assert_non_null(scratch);
        /* each row alone, generic, no pool: the reference */
        float *ref = xmalloc((size_t)Mmax * (size_t)N * sizeof *ref);
        float *y = xmalloc((size_t)Mmax * (size_t)N * sizeof *y);
        for (int32_t m = 0; m < Mmax; m++)
            cpu_gemm_mode(CPU_MATMUL_INT8, CPU_GEMM_GENERIC, CPU_WT_I8, NULL, ref + (size_t)m * (size_t)N, N,
                          x + (size_t)m * (size_t)K, w, 1, N, K, scratch);
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            if (!cpu_gemm_variant_available(variants[v]))
                continue;
            avx2_ran |= variants[v] == CPU_GEMM_AVX2;
            if (c == 0)
                print_message("variant %s runs the %s kernel\n", cpu_gemm_variant_name(variants[v]),
                              cpu_gemm_mode_kernel_name(CPU_MATMUL_INT8, variants[v]));
            const int32_t Ms[] = {1, 2, 4, 5, 8, 19};
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                for (int p = -1; p < 2; p++) {
                    const int32_t M = Ms[mi], r0 = pg_test_rng_int(&rng, 0, Mmax - M); /* rows r0 .. r0 + M - 1 */
                    for (size_t i = 0; i < (size_t)M * (size_t)N; i++)
                        y[i] = NAN;
                    cpu_gemm_mode(CPU_MATMUL_INT8, variants[v], CPU_WT_I8, p < 0 ? NULL : pools[p], y, N,
                                  x + (size_t)r0 * (size_t)K, w, M, N, K, scratch);
                    for (int32_t m = 0; m < M; m++)
                        if (memcmp(y + (size_t)m * (size_t)N, ref + (size_t)(r0 + m) * (size_t)N,
                                   (size_t)N * sizeof *y) != 0)
                            fail_msg("int8 mode %s N=%d K=%d: row %d of a batch of M=%d (pool %d) differs from "
                                     "the row alone (generic)", cpu_gemm_variant_name(variants[v]), (int)N, (int)K,
                                     (int)(r0 + m), (int)M, p < 0 ? 0 : p + 1);
                }
        }
        /* K % 32 != 0 runs W8A16: cpu_gemm_wt on the same weights */
        if (K % CPU_I8_GROUP != 0) {
            cpu_gemm_wt(CPU_GEMM_GENERIC, CPU_WT_I8, NULL, y, N, x, w, Mmax, N, K);
            if (memcmp(y, ref, (size_t)Mmax * (size_t)N * sizeof *y) != 0)
                fail_msg("int8 mode N=%d K=%d: K %% 32 != 0 should run W8A16 (cpu_gemm_wt)", (int)N, (int)K);
        }
        free(scratch);
        free(ref);
        free(y);
        free(w);
        free(wf);
        free(x);
    }
    for (int p = 0; p < 2; p++)
        cpu_pool_destroy(pools[p]);
    if (!avx2_ran)
        print_message("note: no AVX2 on this CPU, only the generic kernel was checked end to end\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_definition_pinned),
        cmocka_unit_test(test_avx2_matches_generic_random),
        cmocka_unit_test(test_avx2_matches_generic_edges),
        cmocka_unit_test(test_avx512vnni_matches_generic),
        cmocka_unit_test(test_avx512vnni_matches_generic_edges),
        cmocka_unit_test(test_quantize_matches_definition),
        cmocka_unit_test(test_mode_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
