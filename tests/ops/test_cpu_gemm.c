/* test_cpu_gemm: the CPU GEMM (cpu/cpu_gemm.c) against a naive double
 * reference on random shapes (every tile edge: M, N, K around the register
 * tile and lane sizes), and its batch-invariance contract: y[m][n] is
 * bit-identical for every M, row position, column split and pool size. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_gemm.h"
#include "cpu_pool.h"
#include "test_support.h"

static float *rand_buf(pg_test_rng *rng, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    pg_test_fill_uniform(rng, p, n, -1.0f, 1.0f);
    return p;
}

static void test_gemm_matches_reference(void **state)
{
    (void)state;
    pg_test_rng rng = {42};
    cpu_pool *pool = NULL;
    assert_int_equal(cpu_pool_create(&pool, 2, NULL), 0);
    for (int it = 0; it < 200; it++) {
        const int32_t M = pg_test_rng_int(&rng, 1, it < 100 ? 9 : 70);
        const int32_t N = pg_test_rng_int(&rng, 1, it < 100 ? 20 : 300);
        const int32_t K = pg_test_rng_int(&rng, 1, it < 150 ? 40 : 1100);
        const int32_t pad = pg_test_rng_int(&rng, 0, 3); /* ldy > N */
        const int64_t ldy = N + pad;
        float *x = rand_buf(&rng, (size_t)M * K), *w = rand_buf(&rng, (size_t)N * K);
        float *y = malloc((size_t)M * ldy * sizeof *y);
        assert_non_null(y);
        for (size_t i = 0; i < (size_t)M * ldy; i++)
            y[i] = NAN;
        cpu_gemm(it % 2 ? pool : NULL, y, ldy, x, w, M, N, K);
        for (int32_t m = 0; m < M; m++) {
            for (int32_t n = 0; n < N; n++) {
                double ref = 0.0, mag = 0.0;
                for (int32_t k = 0; k < K; k++) {
                    ref += (double)x[(size_t)m * K + k] * (double)w[(size_t)n * K + k];
                    mag += fabs((double)x[(size_t)m * K + k] * (double)w[(size_t)n * K + k]);
                }
                double got = (double)y[(size_t)m * ldy + n];
                /* f32 accumulation error bound: ~ K/lanes steps of eps */
                double bound = 1e-6 * mag * (1.0 + K / (double)cpu_gemm_lanes()) + 1e-30;
                if (!(fabs(got - ref) <= bound))
                    fail_msg("cpu_gemm M=%d N=%d K=%d ldy=%lld: y[%d][%d] = %.9g, reference %.9g (bound %.3g)",
                             (int)M, (int)N, (int)K, (long long)ldy, (int)m, (int)n, got, ref, bound);
            }
            for (int64_t n = N; n < ldy; n++)
                if (!isnan(y[(size_t)m * ldy + n]))
                    fail_msg("cpu_gemm M=%d N=%d K=%d: padding column %lld of row %d written", (int)M, (int)N,
                             (int)K, (long long)n, (int)m);
        }
        free(x);
        free(w);
        free(y);
    }
    cpu_pool_destroy(pool);
}

/* Row r of y for x = the same row r placed in batches of different M, at
 * different positions, with different neighbours, split and pools. */
static void test_gemm_bit_identical(void **state)
{
    (void)state;
    pg_test_rng rng = {7};
    const int32_t shapes[][2] = {{2304, 768}, {100, 2048}, {7, 17}, {35, 1}, {301, 33}};
    cpu_pool *pools[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++)
        assert_int_equal(cpu_pool_create(&pools[p], p + 1, NULL), 0);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t N = shapes[c][0], K = shapes[c][1];
        float *w = rand_buf(&rng, (size_t)N * K), *row = rand_buf(&rng, (size_t)K);
        float *y1 = malloc((size_t)N * sizeof *y1);
        assert_non_null(y1);
        cpu_gemm(NULL, y1, N, row, w, 1, N, K);
        const int32_t Ms[] = {2, 3, 4, 5, 8, 13, 64, 129};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int32_t M = Ms[mi];
            for (int32_t r = 0; r < M; r += (M > 8 ? 7 : 1)) {
                float *x = rand_buf(&rng, (size_t)M * K), *y = malloc((size_t)M * N * sizeof *y);
                assert_non_null(y);
                memcpy(x + (size_t)r * K, row, (size_t)K * sizeof *row);
                cpu_gemm(pools[(mi + (size_t)r) % 3], y, N, x, w, M, N, K);
                if (memcmp(y + (size_t)r * N, y1, (size_t)N * sizeof *y1) != 0)
                    fail_msg("cpu_gemm N=%d K=%d: row %d of M=%d differs from M=1", (int)N, (int)K, (int)r, (int)M);
                free(x);
                free(y);
            }
        }
        /* arbitrary column ranges */
        float *yc = malloc((size_t)N * sizeof *yc);
        assert_non_null(yc);
        for (int rep = 0; rep < 5; rep++) {
            int32_t cut = pg_test_rng_int(&rng, 0, N);
            cpu_gemm_cols(yc, N, row, w, 1, K, 0, cut);
            cpu_gemm_cols(yc, N, row, w, 1, K, cut, N);
            if (memcmp(yc, y1, (size_t)N * sizeof *yc) != 0)
                fail_msg("cpu_gemm N=%d K=%d: split at column %d changes the result", (int)N, (int)K, (int)cut);
        }
        free(yc);
        free(w);
        free(row);
        free(y1);
    }
    for (int p = 0; p < 3; p++)
        cpu_pool_destroy(pools[p]);
}

/* bf16 and int8 weights (cpu_gemm_wt): row r of y is the same bits in
 * batches of every M, with every pool, and equal to the f32 GEMM on the
 * values the storage holds (bf16: rounded once; int8: dequantized per
 * block of 32); cpu_wt_store quantizes the same wherever a row starts. */
static void test_gemm_storage_types(void **state)
{
    (void)state;
    pg_test_rng rng = {71};
    const int32_t shapes[][2] = {{2304, 768}, {100, 2048}, {7, 17}, {64, 172}, {301, 96}};
    cpu_pool *pools[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++)
        assert_int_equal(cpu_pool_create(&pools[p], p + 2, NULL), 0);
    for (int t = CPU_WT_BF16; t < CPU_WT_COUNT; t++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            const int32_t N = shapes[c][0], K = shapes[c][1];
            const size_t n = (size_t)N * K;
            float *w = rand_buf(&rng, n), *row = rand_buf(&rng, (size_t)K), *wq = malloc(n * sizeof *wq);
            void *ws = malloc(cpu_wt_bytes((cpu_wt)t, n));
            float *y1 = malloc((size_t)N * sizeof *y1), *yf = malloc((size_t)N * sizeof *yf);
            assert_true(wq && ws && y1 && yf);
            assert_int_equal(cpu_wt_store((cpu_wt)t, ws, 0, w, ST_F32, n), 0);
            cpu_wt_get_row(wq, ws, (cpu_wt)t, 0, (int64_t)n);
            if (t == CPU_WT_I8) /* an upload that does not start on a block is refused */
                assert_int_equal(cpu_wt_store((cpu_wt)t, ws, 16, w, ST_F32, 32), 1);
            cpu_gemm_wt(CPU_GEMM_AUTO, (cpu_wt)t, NULL, y1, N, row, ws, 1, N, K);
            cpu_gemm(NULL, yf, N, row, wq, 1, N, K);
            if (memcmp(y1, yf, (size_t)N * sizeof *y1) != 0)
                fail_msg("%s N=%d K=%d: differs from f32 on the stored values", cpu_wt_name((cpu_wt)t), (int)N,
                         (int)K);
            const int32_t Ms[] = {2, 4, 13, 64};
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], r = M / 2;
                float *x = rand_buf(&rng, (size_t)M * K), *y = malloc((size_t)M * N * sizeof *y);
                assert_non_null(y);
                memcpy(x + (size_t)r * K, row, (size_t)K * sizeof *row);
                cpu_gemm_wt(CPU_GEMM_AUTO, (cpu_wt)t, pools[mi % 2], y, N, x, ws, M, N, K);
                if (memcmp(y + (size_t)r * N, y1, (size_t)N * sizeof *y1) != 0)
                    fail_msg("%s N=%d K=%d: row %d of M=%d differs from M=1", cpu_wt_name((cpu_wt)t), (int)N,
                             (int)K, (int)r, (int)M);
                free(x);
                free(y);
            }
            free(w);
            free(row);
            free(wq);
            free(ws);
            free(y1);
            free(yf);
        }
    for (int p = 0; p < 2; p++)
        cpu_pool_destroy(pools[p]);
}

static void test_pool_range(void **state)
{
    (void)state;
    /* shares tile [0, n) exactly, aligned */
    for (int64_t n = 0; n < 50; n++)
        for (int32_t nw = 1; nw <= 5; nw++)
            for (int64_t align = 1; align <= 6; align++) {
                int64_t expect = 0;
                for (int32_t w = 0; w < nw; w++) {
                    int64_t lo, hi;
                    cpu_pool_range(n, w, nw, align, &lo, &hi);
                    assert_true(lo == expect && hi >= lo && hi <= n);
                    assert_true(lo % align == 0 || lo == n);
                    expect = hi;
                }
                assert_true(expect == n);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_reference),
        cmocka_unit_test(test_gemm_bit_identical),
        cmocka_unit_test(test_gemm_storage_types),
        cmocka_unit_test(test_pool_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
