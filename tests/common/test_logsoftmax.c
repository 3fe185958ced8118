/* pg_logsoftmax (common/pg_logsoftmax.h): the shared log-softmax definition.
 * Its own exp and log against libm's in double (a few ulp), the whole
 * row's lse against a long-double reference (1e-14 relative) on rows with
 * huge, tiny and -inf logits and lengths that are not a multiple of the
 * lanes, the fixed summation order (the lanes and the tree, spelled out
 * again here), and the top-k order (descending, ties to the lower id, NaN
 * last) against a sort. The device's copy of the definition is compared
 * with this one bit for bit in tests/gpu/test_cuda_executor.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pg_logsoftmax.h"
#include "test_support.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) /* [0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

static void test_exp(void **state)
{
    (void)state;
    assert_true(pg_lsm_exp(0.0) == 1.0);
    assert_true(pg_lsm_exp(-0.0) == 1.0);
    assert_true(pg_lsm_exp(-INFINITY) == 0.0);
    assert_true(pg_lsm_exp(-700.5) == 0.0);
    assert_true(isnan(pg_lsm_exp(NAN)));
    double worst = 0.0;
    for (int i = 0; i < 200000; i++) {
        double x = i < 100000 ? -700.0 * urand() : -20.0 * urand();
        double ref = exp(x), got = pg_lsm_exp(x);
        double rel = fabs(got - ref) / ref;
        if (rel > worst) worst = rel;
    }
    printf("pg_lsm_exp: worst relative error %.3g\n", worst);
    assert_true(worst < 1e-15);
}

static void test_log(void **state)
{
    (void)state;
    assert_true(pg_lsm_log(1.0) == 0.0);
    assert_true(isnan(pg_lsm_log(NAN)));
    assert_true(isnan(pg_lsm_log(0.5)));
    double worst = 0.0;
    for (int i = 0; i < 200000; i++) {
        double x = i < 100000 ? 1.0 + 3.0 * urand() : exp(40.0 * urand());
        double ref = log(x), got = pg_lsm_log(x);
        double err = fabs(got - ref) / (ref > 1.0 ? ref : 1.0);
        if (err > worst) worst = err;
    }
    printf("pg_lsm_log: worst error %.3g (relative, absolute below 1)\n", worst);
    assert_true(worst < 1e-15);
}

/* the definition spelled out with an explicit lane array and tree */
static double lse_spelled(const float *raw, int32_t V)
{
    double m = -INFINITY;
    for (int32_t v = 0; v < V; v++)
        if ((double)raw[v] > m) m = (double)raw[v];
    m += 0.0;
    double lane[PG_LSM_LANES] = {0};
    for (int32_t v = 0; v < V; v++)
        lane[v % PG_LSM_LANES] += pg_lsm_exp((double)raw[v] - m);
    for (int32_t s = PG_LSM_LANES / 2; s > 0; s /= 2)
        for (int32_t j = 0; j < s; j++) lane[j] += lane[j + s];
    return m + pg_lsm_log(lane[0]);
}

static void fill_row(float *row, int32_t V, int kind)
{
    for (int32_t v = 0; v < V; v++) {
        switch (kind) {
        case 0: row[v] = (float)(20.0 * urand() - 10.0); break;
        case 1: row[v] = (float)(int)(4.0 * urand()); break;                 /* ties */
        case 2: row[v] = (float)(1e30 * (urand() - 0.5)); break;             /* huge */
        case 3: row[v] = (float)(1e-30 * (urand() - 0.5)); break;            /* tiny */
        case 4: row[v] = urand() < 0.9 ? -INFINITY : (float)(urand() - 0.5); break;
        default: row[v] = (float)(1e4 * urand()); break;                     /* wide */
        }
    }
}

static void test_lse(void **state)
{
    (void)state;
    const int32_t Vs[] = {1, 2, 255, 256, 257, 1000, 32000, 151936};
    float *row = malloc(151936 * sizeof *row);
    assert_non_null(row);
    for (size_t iv = 0; iv < sizeof Vs / sizeof *Vs; iv++)
        for (int kind = 0; kind < 6; kind++) {
            int32_t V = Vs[iv];
            fill_row(row, V, kind);
            if (kind == 4) row[V - 1] = 0.25f; /* at least one finite */
            double got = pg_lsm_lse(row, V);
            double spelled = lse_spelled(row, V);
            assert_memory_equal(&got, &spelled, sizeof got);
            long double m = -INFINITY, sum = 0.0L;
            for (int32_t v = 0; v < V; v++)
                if (row[v] > m) m = row[v];
            for (int32_t v = 0; v < V; v++) sum += expl((long double)row[v] - m);
            double ref = (double)(m + logl(sum));
            double err = fabs(got - ref) / (fabs(ref) > 1.0 ? fabs(ref) : 1.0);
            if (!(err < 1e-14))
                fail_msg("V %d kind %d: lse %.17g, reference %.17g", (int)V, kind, got, ref);
        }
    /* every logit equal: lse = x + log V */
    for (int32_t v = 0; v < 1000; v++) row[v] = 3.0f;
    assert_true(fabs(pg_lsm_lse(row, 1000) - (3.0 + log(1000.0))) < 1e-14);
    /* +0 and -0 as the max give the same lse, bit for bit */
    row[0] = -0.0f; row[1] = 0.0f; row[2] = -5.0f;
    double a = pg_lsm_lse(row, 3);
    row[0] = 0.0f; row[1] = -0.0f;
    double b = pg_lsm_lse(row, 3);
    assert_memory_equal(&a, &b, sizeof a);
    /* NaN anywhere: NaN (a NaN logit poisons the sum, as before) */
    row[1] = NAN;
    assert_true(isnan(pg_lsm_lse(row, 3)));
    free(row);
}

typedef struct { float x; int32_t id; } cand;
static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (pg_lsm_better(a->x, a->id, b->x, b->id)) return -1;
    if (pg_lsm_better(b->x, b->id, a->x, a->id)) return 1;
    return 0;
}

static void test_topk(void **state)
{
    (void)state;
    /* the order itself */
    assert_true(pg_lsm_better(2.0f, 5, 1.0f, 0));
    assert_true(pg_lsm_better(1.0f, 0, 1.0f, 5));
    assert_false(pg_lsm_better(1.0f, 5, 1.0f, 0));
    assert_true(pg_lsm_better(-0.0f, 1, 0.0f, 2));  /* +0 == -0: by id */
    assert_true(pg_lsm_better(-INFINITY, 9, NAN, 0)); /* NaN last */
    assert_false(pg_lsm_better(NAN, 0, -INFINITY, 9));
    assert_true(pg_lsm_better(NAN, 0, NAN, 1));
    const int32_t V = 3001;
    float *row = malloc(V * sizeof *row);
    cand *c = malloc(V * sizeof *c);
    assert_non_null(row);
    assert_non_null(c);
    for (int kind = 0; kind < 6; kind++) {
        fill_row(row, V, kind);
        if (kind == 1)
            for (int32_t v = 0; v < V; v += 7) row[v] = NAN;
        for (int32_t v = 0; v < V; v++) c[v] = (cand){row[v], v};
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
        for (int32_t k = 0; k <= PG_LSM_MAX_TOP; k++) {
            int32_t ids[PG_LSM_MAX_TOP];
            float vals[PG_LSM_MAX_TOP];
            pg_lsm_topk(row, V, k, ids, vals);
            for (int32_t j = 0; j < k; j++) {
                assert_int_equal(ids[j], c[j].id);
                assert_memory_equal(&vals[j], &row[c[j].id], sizeof(float));
            }
        }
    }
    /* fewer ids than k: every id, in order */
    float small[3] = {1.0f, 5.0f, 1.0f};
    int32_t ids[3];
    float vals[3];
    pg_lsm_topk(small, 3, 3, ids, vals);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 0);
    assert_int_equal(ids[2], 2);
    free(row);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_log),
        cmocka_unit_test(test_lse),
        cmocka_unit_test(test_topk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
