/* The sampling definition (common/pg_sample.h) and the host sampler that
 * computes it fast (core/sampler.c):
 *   - pg_smp_expf against libm's exp (a few ulp on [-80, 0]; 1 at 0; 0
 *     below -80, at -inf and for NaN); pg_smp_weight at 0 is 2^42;
 *   - the simple twin: steps 1-9 spelled out here the slow way (a full
 *     sort for top-k and top-p, one sequential walk for the draw) give the
 *     same token as sampler_sample on random rows — flat and peaked, with
 *     ties, -inf, NaN and +inf, V from 1 to 151,936 — under random
 *     temperatures, top-k, top-p, min-p, penalties and banned ids, with the
 *     same draw count;
 *   - greedy rows take no draw and give the argmax of the penalized row.
 * The device's copy (gpu/sampling.cu) is compared with sampler_sample bit
 * for bit in tests/gpu/test_cuda_sampling.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pg_sample.h"
#include "sampler.h"
#include "sampling_params.h"
#include "test_support.h"

static void test_expf(void **state)
{
    (void)state;
    assert_true(pg_smp_expf(0.0f) == 1.0f);
    assert_true(pg_smp_expf(-0.0f) == 1.0f);
    assert_true(pg_smp_expf(-INFINITY) == 0.0f);
    assert_true(pg_smp_expf(NAN) == 0.0f);
    assert_true(pg_smp_expf(-80.5f) == 0.0f);
    assert_true(pg_smp_expf(-80.0f) > 0.0f);
    assert_true(pg_smp_weight(0.0f) == (uint64_t)1 << 42);
    assert_true(pg_smp_weight(-INFINITY) == 0);
    assert_true(pg_smp_weight(-40.0f) == 0);
    pg_test_rng r = {0x5eed};
    double worst = 0.0;
    for (int i = 0; i < 1000000; i++) {
        float x = pg_test_rng_uniform(&r, -80.0f, 0.0f);
        if (i < 1000) x = -(float)i * 1e-4f; /* near 0 */
        double ref = exp((double)x), got = pg_smp_expf(x);
        double ulp = ldexp(1.0, ilogb(ref) - 23);
        double e = fabs(got - ref) / ulp;
        if (e > worst) worst = e;
    }
    printf("pg_smp_expf: worst error %.2f ulp\n", worst);
    assert_true(worst <= 4.0);
}

/* ---- the simple twin of steps 1-9 ------------------------------------ */

typedef struct ref_tok {
    uint32_t key;
    int32_t id;
} ref_tok;

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_tok *a = pa, *b = pb;
    if (a->key != b->key) return a->key > b->key ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int ref_desc(const void *pa, const void *pb)
{
    float a = *(const float *)pa, b = *(const float *)pb;
    return (a < b) - (a > b);
}

/* Steps 1-9 on x[V] (modified), the slow way; -1 when nothing is alive. */
static int32_t ref_sample(const sampling_params *p, float *x, int32_t V, const sampler_seq_view *s,
                          uint64_t key, uint64_t *counter)
{
    /* 1: each distinct id of prompt ∪ output once, with its output count */
    uint8_t *done = calloc((size_t)V, 1);
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? s->output_ids : s->prompt_ids;
        int32_t n = pass ? s->n_output : s->n_prompt;
        for (int32_t i = 0; i < n; i++) {
            int32_t id = ids[i];
            if (done[id]) continue;
            done[id] = 1;
            int32_t c = 0;
            for (int32_t j = 0; j < s->n_output; j++) c += s->output_ids[j] == id;
            x[id] = pg_smp_penalize(x[id], p->repetition_penalty, c, p->frequency_penalty,
                                    p->presence_penalty);
        }
    }
    free(done);
    for (int32_t i = 0; i < s->n_banned; i++) x[s->banned_ids[i]] = -INFINITY; /* 2 */
    if (p->temperature < PG_SMP_EPS) { /* 3 */
        int32_t best = -1;
        for (int32_t v = 0; v < V; v++)
            if (x[v] > -INFINITY && (best < 0 || x[v] > x[best])) best = v;
        return best;
    }
    float m = -INFINITY; /* 4 */
    int32_t alive = 0;
    for (int32_t v = 0; v < V; v++) {
        x[v] = pg_smp_temper(x[v], p->temperature);
        if (x[v] > m) m = x[v];
        alive += x[v] > -INFINITY;
    }
    if (alive == 0) return -1;
    if (p->min_p > 0.0f) { /* 5 */
        float thr = m + pg_smp_min_p_log(p->min_p);
        alive = 0;
        for (int32_t v = 0; v < V; v++) {
            if (x[v] < thr) x[v] = -INFINITY;
            alive += x[v] > -INFINITY;
        }
    }
    if (p->top_k > 0 && p->top_k < alive) { /* 6: a full sort */
        float *srt = malloc((size_t)alive * sizeof *srt);
        int32_t n = 0;
        for (int32_t v = 0; v < V; v++)
            if (x[v] > -INFINITY) srt[n++] = x[v];
        qsort(srt, (size_t)n, sizeof *srt, ref_desc);
        float kth = srt[p->top_k - 1];
        free(srt);
        for (int32_t v = 0; v < V; v++)
            if (x[v] < kth) x[v] = -INFINITY;
    }
    uint64_t *w = malloc((size_t)V * sizeof *w), total = 0; /* 7 */
    for (int32_t v = 0; v < V; v++) {
        w[v] = pg_smp_weight(x[v] - m);
        total += w[v];
    }
    if (p->top_p < 1.0f) { /* 8: a full sort, one walk */
        ref_tok *o = malloc((size_t)V * sizeof *o);
        int32_t n = 0;
        for (int32_t v = 0; v < V; v++)
            if (x[v] > -INFINITY) o[n++] = (ref_tok){pg_smp_key(x[v]), v};
        qsort(o, (size_t)n, sizeof *o, ref_cmp);
        uint64_t need = pg_smp_need(p->top_p, total), cum = 0;
        int32_t keep = 0;
        while (keep < n) {
            cum += w[o[keep++].id];
            if (cum >= need) break;
        }
        for (int32_t j = keep; j < n; j++) {
            w[o[j].id] = 0;
            x[o[j].id] = -INFINITY;
        }
        for (int32_t v = 0; v < V; v++)
            if (!(x[v] > -INFINITY)) w[v] = 0;
        total = cum;
        free(o);
    }
    uint64_t target = pg_smp_target(pg_smp_draw(key, (*counter)++), total), cum = 0; /* 9 */
    int32_t tok = -1;
    for (int32_t v = 0; v < V && tok < 0; v++) {
        cum += w[v];
        if (cum > target) tok = v;
    }
    free(w);
    return tok;
}

/* A random row of V: flat (scale 0.05) or peaked (scale 8), values
 * quantized to make ties sometimes, a few -inf / NaN / +inf. */
static void random_row(pg_test_rng *r, float *x, int32_t V, int kind)
{
    float scale = kind % 3 == 0 ? 0.05f : (kind % 3 == 1 ? 2.0f : 8.0f);
    for (int32_t v = 0; v < V; v++) {
        float u = pg_test_rng_uniform(r, -1.0f, 1.0f) + pg_test_rng_uniform(r, -1.0f, 1.0f);
        x[v] = u * scale;
        if (kind & 4) x[v] = roundf(x[v] * 4.0f) * 0.25f; /* ties */
    }
    if (kind & 8) {
        for (int k = 0; k < 1 + V / 50; k++) x[pg_test_rng_int(r, 0, V - 1)] = -INFINITY;
        x[pg_test_rng_int(r, 0, V - 1)] = NAN;
        if (kind & 16) x[pg_test_rng_int(r, 0, V - 1)] = INFINITY;
    }
}

static void random_params(pg_test_rng *r, sampling_params *p, int32_t V)
{
    *p = sampling_params_default();
    int k = pg_test_rng_int(r, 0, 15);
    p->temperature = k == 0 ? 0.0f : pg_test_rng_uniform(r, 0.2f, 2.0f);
    if (k & 1) p->top_k = pg_test_rng_int(r, 1, V < 2000 ? V : 2000);
    if (k & 2) p->top_p = pg_test_rng_uniform(r, 0.05f, 1.0f);
    if (k & 4) p->min_p = pg_test_rng_uniform(r, 0.0f, 0.3f);
    if (k & 8) {
        p->repetition_penalty = pg_test_rng_uniform(r, 0.5f, 2.0f);
        p->frequency_penalty = pg_test_rng_uniform(r, -2.0f, 2.0f);
        p->presence_penalty = pg_test_rng_uniform(r, -2.0f, 2.0f);
    }
    if (pg_test_rng_int(r, 0, 7) == 0) p->top_k = 1500; /* the quickselect (> 1024) */
    if (pg_test_rng_int(r, 0, 7) == 0) p->top_p = 0.999f;
}

static void test_twin(void **state)
{
    (void)state;
    static const int32_t sizes[] = {1, 2, 7, 100, 1000, 5000, 40000, 151936};
    const int32_t VMAX = 151936;
    float *row = malloc((size_t)VMAX * sizeof *row), *a = malloc((size_t)VMAX * sizeof *a),
          *b = malloc((size_t)VMAX * sizeof *b);
    sampler_workspace *ws = sampler_workspace_create(VMAX);
    assert_non_null(ws);
    pg_test_rng r = {0x7a11};
    int32_t prompt[64], output[64], banned[4];
    int n_cases = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int32_t V = sizes[si];
        const int cases = V >= 100000 ? 12 : 60;
        for (int c = 0; c < cases; c++, n_cases++) {
            random_row(&r, row, V, c);
            sampling_params p;
            random_params(&r, &p, V);
            sampler_seq_view s = {.prompt_ids = prompt, .n_prompt = pg_test_rng_int(&r, 0, 64),
                                  .output_ids = output, .n_output = pg_test_rng_int(&r, 0, 64),
                                  .banned_ids = banned, .n_banned = V > 8 ? pg_test_rng_int(&r, 0, 4) : 0};
            for (int i = 0; i < 64; i++) {
                prompt[i] = pg_test_rng_int(&r, 0, V - 1);
                output[i] = pg_test_rng_int(&r, 0, V < 20 ? V - 1 : 19); /* repeats */
            }
            for (int i = 0; i < 4; i++) banned[i] = pg_test_rng_int(&r, 0, V - 1);
            sampler_rng rng = sampler_rng_init((uint64_t)c, (int32_t)si);
            uint64_t ref_counter = rng.counter;
            memcpy(a, row, (size_t)V * sizeof *a);
            memcpy(b, row, (size_t)V * sizeof *b);
            int32_t want = ref_sample(&p, a, V, &s, rng.key, &ref_counter);
            sampler_result res = {0};
            int rc = sampler_sample(ws, &p, b, V, &s, &rng, &res);
            if (want < 0) {
                assert_int_equal(rc, PG_EINVAL);
                continue;
            }
            assert_int_equal(rc, PG_OK);
            if (res.token_id != want)
                fail_msg("V %d case %d (t %g, top_k %d, top_p %g, min_p %g): sampler %d, twin %d", (int)V,
                         c, (double)p.temperature, (int)p.top_k, (double)p.top_p, (double)p.min_p,
                         (int)res.token_id, (int)want);
            assert_true(rng.counter == ref_counter);
        }
    }
    /* top-p on flat and tie-heavy rows of the full vocabulary: most tokens
     * are candidates, the radix select's path */
    static const float tps[] = {0.95f, 0.5f, 0.999f, 0.05f};
    for (int kind = 0; kind < 8; kind += 4)
        for (size_t t = 0; t < sizeof tps / sizeof *tps; t++, n_cases++) {
            random_row(&r, row, VMAX, kind);
            sampling_params p = sampling_params_default();
            p.temperature = 0.8f;
            p.top_p = tps[t];
            sampler_rng rng = sampler_rng_init(77, (int32_t)t);
            uint64_t ref_counter = rng.counter;
            memcpy(a, row, (size_t)VMAX * sizeof *a);
            memcpy(b, row, (size_t)VMAX * sizeof *b);
            int32_t want = ref_sample(&p, a, VMAX, &(sampler_seq_view){0}, rng.key, &ref_counter);
            sampler_result res = {0};
            assert_int_equal(sampler_sample(ws, &p, b, VMAX, NULL, &rng, &res), PG_OK);
            if (res.token_id != want)
                fail_msg("flat row (kind %d), top_p %g: sampler %d, twin %d", kind, (double)tps[t],
                         (int)res.token_id, (int)want);
            for (int32_t v = 0; v < VMAX; v++) /* the kept set, visible in both rows */
                if ((a[v] > -INFINITY) != (b[v] > -INFINITY))
                    fail_msg("flat row (kind %d), top_p %g: id %d kept by one only", kind, (double)tps[t],
                             (int)v);
        }
    printf("%d rows: the sampler and its twin agree\n", n_cases);
    sampler_workspace_destroy(ws);
    free(row);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf),
        cmocka_unit_test(test_twin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
