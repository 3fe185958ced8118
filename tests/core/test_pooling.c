/* tests/core/test_pooling: the pooler (pooling.h) over hand-made rows: the
 * rows it asks for per chunk, last / mean / cls against a double
 * computation, Matryoshka truncation before normalizing, chunking and
 * restarts (recomputation) giving the same bits, refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pooling.h"

enum { H = 5, N = 7 };

static float rows[N][H];

static void fill(void)
{
    for (int t = 0; t < N; t++)
        for (int j = 0; j < H; j++)
            rows[t][j] = (float)sin(1.0 + 0.7 * t + 1.3 * j) * (float)(1 + j);
}

/* Feeds the prompt in chunks of `chunk` tokens (as the engine does) and
 * finishes. */
static float *pool(const pooling_params *pp, int chunk, int32_t *dim)
{
    pooler *pl = NULL;
    pg_error err;
    assert_int_equal(pooler_create(&pl, pp, H, N, &err), PG_OK);
    for (int start = 0; start < N; start += chunk) {
        int n_new = start + chunk > N ? N - start : chunk, first, count;
        pooler_rows_wanted(pl, start, n_new, &first, &count);
        if (count)
            pooler_add(pl, start + first, rows[start + first], count);
    }
    float *v = NULL;
    assert_int_equal(pooler_finish(pl, &v, dim, &err), PG_OK);
    pooler_destroy(pl);
    return v;
}

static void test_rows_wanted(void **state)
{
    (void)state;
    pooler *pl;
    pg_error err;
    int32_t first, count;
    pooling_params last = {.type = POOLING_LAST}, mean = {.type = POOLING_MEAN}, cls = {.type = POOLING_CLS};
    assert_int_equal(pooler_create(&pl, &last, H, N, &err), PG_OK);
    assert_false(pooler_needs_all_rows(pl));
    pooler_rows_wanted(pl, 0, 4, &first, &count);
    assert_int_equal(count, 0);
    pooler_rows_wanted(pl, 4, 3, &first, &count);
    assert_int_equal(first, 2);
    assert_int_equal(count, 1);
    pooler_destroy(pl);
    assert_int_equal(pooler_create(&pl, &mean, H, N, &err), PG_OK);
    assert_true(pooler_needs_all_rows(pl));
    pooler_rows_wanted(pl, 4, 3, &first, &count);
    assert_int_equal(first, 0);
    assert_int_equal(count, 3);
    pooler_destroy(pl);
    assert_int_equal(pooler_create(&pl, &cls, H, N, &err), PG_OK);
    pooler_rows_wanted(pl, 0, 2, &first, &count);
    assert_int_equal(count, 1);
    pooler_rows_wanted(pl, 2, 5, &first, &count);
    assert_int_equal(count, 0);
    /* missing rows are refused, not pooled from zeros */
    float *v;
    int32_t d;
    assert_int_equal(pooler_finish(pl, &v, &d, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    pooler_destroy(pl);
}

static void test_values(void **state)
{
    (void)state;
    fill();
    const pooling_type types[3] = {POOLING_LAST, POOLING_MEAN, POOLING_CLS};
    for (int ti = 0; ti < 3; ti++)
        for (int dims = 0; dims <= 3; dims += 3)
            for (int norm = 0; norm <= 1; norm++) {
                pooling_params pp = {.type = types[ti], .normalize = norm, .dimensions = dims};
                double want[H], ss = 0;
                int d = dims ? dims : H;
                for (int j = 0; j < d; j++) {
                    double v = 0;
                    if (types[ti] == POOLING_LAST)
                        v = (double)rows[N - 1][j];
                    else if (types[ti] == POOLING_CLS)
                        v = (double)rows[0][j];
                    else {
                        for (int t = 0; t < N; t++)
                            v += (double)rows[t][j];
                        v /= N;
                    }
                    want[j] = v;
                    ss += v * v;
                }
                int32_t got_d;
                float *v1 = pool(&pp, N, &got_d);
                assert_int_equal(got_d, d);
                for (int j = 0; j < d; j++)
                    assert_true(fabs((double)v1[j] - (norm ? want[j] / sqrt(ss) : want[j])) <= 1e-7 * (1 + fabs(want[j])));
                /* chunked 1, 2, 3 tokens a step: the same bits */
                for (int chunk = 1; chunk <= 3; chunk++) {
                    float *v2 = pool(&pp, chunk, &got_d);
                    assert_memory_equal(v1, v2, (size_t)d * sizeof(float));
                    free(v2);
                }
                free(v1);
            }
}

/* A preempted request recomputes from position 0: the pooler starts over. */
static void test_restart(void **state)
{
    (void)state;
    fill();
    pooling_params pp = {.type = POOLING_MEAN, .normalize = true};
    int32_t d;
    float *want = pool(&pp, 2, &d);
    pooler *pl;
    pg_error err;
    assert_int_equal(pooler_create(&pl, &pp, H, N, &err), PG_OK);
    pooler_add(pl, 0, rows[0], 3);
    pooler_add(pl, 0, rows[0], 4); /* recomputed */
    pooler_add(pl, 4, rows[4], 3);
    float *got;
    assert_int_equal(pooler_finish(pl, &got, &d, &err), PG_OK);
    assert_memory_equal(want, got, (size_t)d * sizeof(float));
    free(got);
    free(want);
    pooler_destroy(pl);
}

static void test_refusals(void **state)
{
    (void)state;
    pooler *pl = NULL;
    pg_error err;
    pooling_params pp = {.type = POOLING_LAST, .dimensions = H + 1};
    assert_int_equal(pooler_create(&pl, &pp, H, N, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    assert_null(pl);
    pooling_type t;
    assert_int_equal(pooling_type_parse("max", &t, &err), PG_EINVAL);
    assert_int_equal(pooling_type_parse("lasttoken", &t, &err), PG_OK);
    assert_int_equal(t, POOLING_LAST);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_wanted),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
