/* test_moe_ops: the CPU executor's mixture-of-experts ops (executor.h
 * moe_route, moe_experts, moe_shared_add; cpu/cpu_moe.c).
 *
 *  - routing: softmax within 1e-6 of double, the top k in decreasing order
 *    with ties to the lower expert id, renormalization by the k's sum;
 *  - experts: every row's output is, bit for bit, its own dense MLP ops
 *    (matmul M = 1, silu_mul, matmul) per routed expert, summed in rank
 *    order — the simple twin — for every storage type and arithmetic mode,
 *    across a slice boundary (more than 256 rows); the same bits for a row
 *    alone, in any batch, with 1 or 3 threads; an expert no row picks is
 *    never read (its pointers are NULL here);
 *  - the shared expert's gate: out + sigmoid(g) * s.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_executor.h"
#include "test_support.h"

static executor *make_cpu(int32_t threads, int32_t wt, int32_t precision)
{
    cpu_executor_params p = {.threads = threads, .wt_dtype = wt, .matmul_precision = precision};
    executor *ex = NULL;
    pg_error err = {{0}};
    if (cpu_executor_create(&ex, &p, &err) != PG_OK)
        fail_msg("cpu executor: %s", err.msg);
    return ex;
}

static void test_route(void **state)
{
    (void)state;
    executor *ex = make_cpu(1, 0, 0);
    /* row 0: ties among 1, 2, 4 (value 3); row 1: distinct; row 2: all equal */
    const float z[3][6] = {{1, 3, 3, 0, 3, -1}, {0.5f, -2, 4, 1, 2.5f, 3}, {7, 7, 7, 7, 7, 7}};
    int32_t ids[3 * 3];
    float w[3 * 3];
    assert_int_equal(ex->op->moe_route(ex, ids, w, z, 3, 6, 3, 0), PG_OK);
    const int32_t want[3][3] = {{1, 2, 4}, {2, 5, 4}, {0, 1, 2}};
    for (int t = 0; t < 3; t++) {
        double mx = -INFINITY, s = 0.0;
        for (int e = 0; e < 6; e++)
            mx = (double)z[t][e] > mx ? (double)z[t][e] : mx;
        for (int e = 0; e < 6; e++)
            s += exp((double)z[t][e] - mx);
        for (int r = 0; r < 3; r++) {
            if (ids[t * 3 + r] != want[t][r])
                fail_msg("row %d rank %d: expert %d, expected %d (ties go to the lower id)", t, r, ids[t * 3 + r],
                         want[t][r]);
            const double p = exp((double)z[t][want[t][r]] - mx) / s;
            if (fabs((double)w[t * 3 + r] - p) > 1e-6 * p + 1e-9)
                fail_msg("row %d rank %d: weight %.9g, softmax %.9g", t, r, (double)w[t * 3 + r], p);
        }
    }
    /* k = 1 of a tie picks the lowest id; renormalized, one weight is 1 */
    assert_int_equal(ex->op->moe_route(ex, ids, w, z, 1, 6, 1, 1), PG_OK);
    assert_int_equal(ids[0], 1);
    assert_true(w[0] == 1.0f);
    /* renormalization: w / (w0 + w1 + w2), in rank order */
    float wn[9];
    assert_int_equal(ex->op->moe_route(ex, ids, w, z, 3, 6, 3, 0), PG_OK);
    assert_int_equal(ex->op->moe_route(ex, ids, wn, z, 3, 6, 3, 1), PG_OK);
    for (int t = 0; t < 3; t++) {
        const float s = w[t * 3] + w[t * 3 + 1] + w[t * 3 + 2];
        for (int r = 0; r < 3; r++)
            assert_true(wn[t * 3 + r] == w[t * 3 + r] / s);
    }
    /* a row's routing is its own: row 1 alone gives the same */
    int32_t ids1[3];
    float w1[3];
    assert_int_equal(ex->op->moe_route(ex, ids1, w1, z[1], 1, 6, 3, 0), PG_OK);
    assert_memory_equal(ids1, ids + 3, sizeof ids1);
    assert_memory_equal(w1, w + 3, sizeof w1);
    assert_int_equal(ex->op->moe_route(ex, ids, w, z, 3, 6, 7, 0), PG_EINVAL); /* k > E */
    ex->op->destroy(ex);
}

/* The experts of one test: E experts of [2I][H] / [H][I], uploaded to ex. */
typedef struct experts {
    int32_t E, H, I;
    float *gu_host, *down_host; /* [E][2I][H], [E][H][I] */
    void **gu, **down;          /* [E] device pointers (NULL: never uploaded) */
} experts;

static void experts_upload(executor *ex, experts *x, const uint8_t *used)
{
    x->gu = calloc((size_t)x->E, sizeof *x->gu);
    x->down = calloc((size_t)x->E, sizeof *x->down);
    const size_t ngu = (size_t)2 * x->I * x->H, nd = (size_t)x->H * x->I;
    for (int32_t e = 0; e < x->E; e++) {
        if (used && !used[e])
            continue; /* left NULL: reading it would crash */
        x->gu[e] = ex->op->alloc(ex, EXEC_WT, ngu);
        x->down[e] = ex->op->alloc(ex, EXEC_WT, nd);
        assert_non_null(x->gu[e]);
        assert_non_null(x->down[e]);
        /* gate rows then up rows, as the model uploads them (two calls) */
        assert_int_equal(ex->op->upload(ex, x->gu[e], EXEC_WT, 0, x->gu_host + e * ngu, ST_F32, ngu / 2), PG_OK);
        assert_int_equal(ex->op->upload(ex, x->gu[e], EXEC_WT, ngu / 2, x->gu_host + e * ngu + ngu / 2, ST_F32,
                                        ngu / 2),
                         PG_OK);
        assert_int_equal(ex->op->upload(ex, x->down[e], EXEC_WT, 0, x->down_host + e * nd, ST_F32, nd), PG_OK);
    }
}

static void experts_free(executor *ex, experts *x)
{
    for (int32_t e = 0; e < x->E; e++) {
        ex->op->free(ex, x->gu[e]);
        ex->op->free(ex, x->down[e]);
    }
    free(x->gu);
    free(x->down);
    x->gu = x->down = NULL;
}

/* The simple twin: row t alone through the dense ops, per rank, summed in
 * rank order. */
static void twin_row(executor *ex, const experts *x, const float *xt, const int32_t *id, const float *w, int32_t k,
                     float *out)
{
    const int32_t H = x->H, I = x->I;
    float *gu = malloc(sizeof(float) * 2 * I), *act = malloc(sizeof(float) * I), *y = malloc(sizeof(float) * H);
    for (int32_t r = 0; r < k; r++) {
        assert_int_equal(ex->op->matmul(ex, gu, xt, x->gu[id[r]], 1, 2 * I, H), PG_OK);
        assert_int_equal(ex->op->silu_mul(ex, act, gu, 1, I), PG_OK);
        assert_int_equal(ex->op->matmul(ex, y, act, x->down[id[r]], 1, H, I), PG_OK);
        for (int32_t h = 0; h < H; h++)
            out[h] = r == 0 ? w[0] * y[h] : out[h] + w[r] * y[h];
    }
    free(gu);
    free(act);
    free(y);
}

static void check_experts(int32_t H, int32_t I, int32_t T, uint64_t seed)
{
    pg_test_rng rng = {seed};
    experts x = {.E = 7, .H = H, .I = I};
    const int32_t k = 3;
    x.gu_host = malloc(sizeof(float) * (size_t)x.E * 2 * x.I * x.H);
    x.down_host = malloc(sizeof(float) * (size_t)x.E * x.H * x.I);
    pg_test_fill_uniform(&rng, x.gu_host, (size_t)x.E * 2 * x.I * x.H, -0.3f, 0.3f);
    pg_test_fill_uniform(&rng, x.down_host, (size_t)x.E * x.H * x.I, -0.3f, 0.3f);
    float *in = malloc(sizeof(float) * (size_t)T * x.H);
    pg_test_fill_uniform(&rng, in, (size_t)T * x.H, -1.0f, 1.0f);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * k);
    float *w = malloc(sizeof(float) * (size_t)T * k);
    uint8_t used[7] = {0};
    for (int32_t t = 0; t < T; t++) {
        for (int32_t r = 0; r < k; r++) {
            int32_t e;
            int dup;
            do { /* distinct experts per row; expert 6 never picked */
                e = pg_test_rng_int(&rng, 0, x.E - 2);
                dup = 0;
                for (int32_t q = 0; q < r; q++)
                    dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + r] = e;
            w[t * k + r] = pg_test_rng_uniform(&rng, 0.05f, 1.0f);
            used[e] = 1;
        }
    }
    assert_false(used[6]);
    /* storage x arithmetic: f32 exact, bf16 exact, int8 exact, bf16 mode, int8 mode */
    const int32_t combos[][2] = {{0, 0}, {1, 0}, {2, 0}, {1, 1}, {2, 2}};
    float *out = malloc(sizeof(float) * (size_t)T * x.H), *out3 = malloc(sizeof(float) * (size_t)T * x.H);
    float *row = malloc(sizeof(float) * x.H), *twin = malloc(sizeof(float) * x.H);
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        executor *ex = make_cpu(1, combos[c][0], combos[c][1]);
        executor *ex3 = make_cpu(3, combos[c][0], combos[c][1]);
        experts_upload(ex, &x, used); /* expert 6: NULL, never read */
        assert_int_equal(ex->op->moe_experts(ex, out, in, ids, w, x.gu, x.down, T, x.H, x.I, x.E, k), PG_OK);
        for (int32_t t = 0; t < T; t++) {
            twin_row(ex, &x, in + (size_t)t * x.H, ids + t * k, w + t * k, k, twin);
            if (memcmp(twin, out + (size_t)t * x.H, sizeof(float) * x.H) != 0)
                fail_msg("wt %d mode %d: row %d of %d differs from its dense ops alone", combos[c][0],
                         combos[c][1], t, T);
            if (t % 37 == 0 || t == T - 1) { /* the row alone through moe_experts */
                assert_int_equal(ex->op->moe_experts(ex, row, in + (size_t)t * x.H, ids + t * k, w + t * k, x.gu,
                                                     x.down, 1, x.H, x.I, x.E, k),
                                 PG_OK);
                assert_memory_equal(row, out + (size_t)t * x.H, sizeof(float) * x.H);
            }
        }
        experts_free(ex, &x);
        experts_upload(ex3, &x, NULL);
        assert_int_equal(ex3->op->moe_experts(ex3, out3, in, ids, w, x.gu, x.down, T, x.H, x.I, x.E, k), PG_OK);
        assert_memory_equal(out3, out, sizeof(float) * (size_t)T * x.H);
        /* the last 5 rows as a batch of their own */
        assert_int_equal(ex3->op->moe_experts(ex3, out3, in + (size_t)(T - 5) * x.H, ids + (T - 5) * k,
                                              w + (T - 5) * k, x.gu, x.down, 5, x.H, x.I, x.E, k),
                         PG_OK);
        assert_memory_equal(out3, out + (size_t)(T - 5) * x.H, sizeof(float) * 5 * x.H);
        experts_free(ex3, &x);
        ex3->op->destroy(ex3);
        ex->op->destroy(ex);
    }
    /* an id outside [0, E) is refused */
    executor *ex = make_cpu(1, 0, 0);
    experts_upload(ex, &x, NULL);
    int32_t bad[3] = {0, 7, 1};
    assert_int_equal(ex->op->moe_experts(ex, row, in, bad, w, x.gu, x.down, 1, x.H, x.I, x.E, k), PG_EINVAL);
    experts_free(ex, &x);
    ex->op->destroy(ex);
    free(out);
    free(out3);
    free(row);
    free(twin);
    free(ids);
    free(w);
    free(in);
    free(x.gu_host);
    free(x.down_host);
}

static void test_experts(void **state)
{
    (void)state;
    /* H = 40, I = 24: K tails that are not multiples of 16 (I * H a
     * multiple of 32: int8 blocks); 300 rows: two slices, the experts as
     * chunks with 1 thread and column-split with 3 */
    check_experts(40, 24, 300, 31);
    /* H = 64, I = 40: the int8 mode quantizes x for the gate|up product
     * (K = 64) but not for down (K = 40); 13 rows: groups of a few rows */
    check_experts(64, 40, 13, 32);
}

static void test_shared_add(void **state)
{
    (void)state;
    executor *ex = make_cpu(2, 0, 0);
    pg_test_rng rng = {5};
    enum { T = 4, N = 33 };
    float out[T * N], sh[T * N], g[T] = {-3.0f, 0.0f, 2.5f, -90.0f}, before[T * N];
    pg_test_fill_uniform(&rng, out, T * N, -1.0f, 1.0f);
    pg_test_fill_uniform(&rng, sh, T * N, -1.0f, 1.0f);
    memcpy(before, out, sizeof out);
    assert_int_equal(ex->op->moe_shared_add(ex, out, sh, g, T, N), PG_OK);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const double want = (double)before[t * N + n] + (double)sh[t * N + n] / (1.0 + exp(-(double)g[t]));
            assert_true(fabs((double)out[t * N + n] - want) <= 1e-6 * (1.0 + fabs(want)));
        }
    ex->op->destroy(ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_experts),
        cmocka_unit_test(test_shared_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
