/* test_sampler: sampling_params defaults/validation and the sampler's vLLM
 * semantics (penalties, banning, greedy ties, temperature, min-p, top-k,
 * top-p, logprobs) and its deterministic per-sequence RNG. Distributions are
 * checked empirically with a fixed seed, so every run is identical. */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "sampler.h"
#include "sampling_params.h"
#include "test_support.h"

#define PINNED_FIRST_DRAW 1694951088825589ULL /* sampler_rng_init(0, 0), draw 0, times 2^53 */

/* ---- helpers ---------------------------------------------------------- */

/* Samples `draws` times from a fresh copy of logits (the sampler modifies
 * it) with one RNG stream; counts[vocab] receives the histogram. */
static void histogram(const sampling_params *p, const float *logits, int32_t vocab,
                      const sampler_seq_view *seq, uint64_t seed, int draws, int *counts)
{
    sampler_workspace *w = sampler_workspace_create(vocab);
    assert_non_null(w);
    float *buf = malloc((size_t)vocab * sizeof *buf);
    assert_non_null(buf);
    sampler_rng rng = sampler_rng_init(seed, 0);
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int d = 0; d < draws; d++) {
        memcpy(buf, logits, (size_t)vocab * sizeof *buf);
        sampler_result r = {0};
        assert_int_equal(sampler_sample(w, p, buf, vocab, seq, &rng, &r), PG_OK);
        assert_true(r.token_id >= 0 && r.token_id < vocab);
        counts[r.token_id]++;
    }
    assert_int_equal(rng.counter, (uint64_t)draws);
    free(buf);
    sampler_workspace_destroy(w);
}

/* Asserts that the histogram's support is exactly `expect` (every id in it
 * sampled at least once, no other id ever). */
static void assert_support(const int *counts, int32_t vocab, const int32_t *expect, int n_expect)
{
    for (int32_t i = 0; i < vocab; i++) {
        int in = 0;
        for (int j = 0; j < n_expect; j++)
            in |= expect[j] == i;
        if (in && counts[i] == 0)
            fail_msg("id %d should be sampled but never was", (int)i);
        if (!in && counts[i] != 0)
            fail_msg("id %d sampled %d times but must not be", (int)i, counts[i]);
    }
}

/* Pearson chi-square of the histogram against probabilities prob[vocab]. */
static double chi_square(const int *counts, const double *prob, int32_t vocab, int draws)
{
    double chi = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        double e = prob[i] * draws;
        double d = counts[i] - e;
        chi += d * d / e;
    }
    return chi;
}

static void softmax_d(const float *logits, int32_t n, double temp, double *out)
{
    double m = -INFINITY, s = 0.0;
    for (int32_t i = 0; i < n; i++)
        m = fmax(m, (double)logits[i] / temp);
    for (int32_t i = 0; i < n; i++)
        s += (out[i] = exp((double)logits[i] / temp - m));
    for (int32_t i = 0; i < n; i++)
        out[i] /= s;
}

/* ---- sampling_params ---------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    sampling_params p = sampling_params_default();
    assert_int_equal(p.n, 1);
    assert_int_equal(p.max_tokens, 16);
    assert_int_equal(p.min_tokens, 0);
    assert_true(p.temperature == 1.0f);
    assert_true(p.top_p == 1.0f);
    assert_int_equal(p.top_k, -1);
    assert_true(p.min_p == 0.0f);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    assert_true(p.seed == 0);
    assert_false(p.ignore_eos);
    assert_null(p.stop_token_ids);
    assert_int_equal(p.n_stop_token_ids, 0);
    assert_null(p.stop);
    assert_int_equal(p.n_stop, 0);
    assert_false(p.include_stop_str_in_output);
    assert_true(p.skip_special_tokens);
    assert_int_equal(p.logprobs, -1);
    pg_error err = {{0}};
    assert_int_equal(sampling_params_validate(&p, &err), PG_OK);
}

/* One bad field: validate fails with PG_EINVAL and a message containing
 * both `field` and `value`. */
static void expect_invalid(const sampling_params *p, const char *field, const char *value)
{
    pg_error err = {{0}};
    int rc = sampling_params_validate(p, &err);
    if (rc != PG_EINVAL)
        fail_msg("%s = %s: expected PG_EINVAL, got %d", field, value, rc);
    if (!strstr(err.msg, field) || !strstr(err.msg, value))
        fail_msg("message '%s' should name '%s' and '%s'", err.msg, field, value);
}

static void expect_valid(const sampling_params *p)
{
    pg_error err = {{0}};
    int rc = sampling_params_validate(p, &err);
    if (rc != PG_OK)
        fail_msg("expected valid, got %d: %s", rc, err.msg);
}

static void test_validate(void **state)
{
    (void)state;
    const sampling_params d = sampling_params_default();
    sampling_params p;

    p = d; p.n = 0; expect_invalid(&p, "n must", "got 0");
    p = d; p.n = 65; expect_invalid(&p, "n must", "65");
    p = d; p.n = 64; expect_valid(&p);
    p = d; p.max_tokens = 0; expect_invalid(&p, "max_tokens", "got 0");
    p = d; p.max_tokens = -2; expect_invalid(&p, "max_tokens", "-2");
    p = d; p.max_tokens = -1; p.min_tokens = 1000; expect_valid(&p);
    p = d; p.min_tokens = -1; expect_invalid(&p, "min_tokens", "-1");
    p = d; p.min_tokens = 17; expect_invalid(&p, "min_tokens", "17");
    p = d; p.min_tokens = 16; expect_valid(&p);
    p = d; p.temperature = -0.5f; expect_invalid(&p, "temperature", "-0.5");
    p = d; p.temperature = NAN; expect_invalid(&p, "temperature", "nan");
    p = d; p.temperature = INFINITY; expect_invalid(&p, "temperature", "inf");
    p = d; p.temperature = 0.0f; expect_valid(&p);
    p = d; p.top_p = 0.0f; expect_invalid(&p, "top_p", "got 0");
    p = d; p.top_p = 1.5f; expect_invalid(&p, "top_p", "1.5");
    p = d; p.top_p = 0.01f; expect_valid(&p);
    p = d; p.top_k = -2; expect_invalid(&p, "top_k", "-2");
    p = d; p.top_k = 0; expect_valid(&p);
    p = d; p.top_k = 1; expect_valid(&p);
    p = d; p.min_p = -0.1f; expect_invalid(&p, "min_p", "-0.1");
    p = d; p.min_p = 1.1f; expect_invalid(&p, "min_p", "1.1");
    p = d; p.min_p = 1.0f; expect_valid(&p);
    p = d; p.presence_penalty = 2.5f; expect_invalid(&p, "presence_penalty", "2.5");
    p = d; p.frequency_penalty = -3.0f; expect_invalid(&p, "frequency_penalty", "-3");
    p = d; p.presence_penalty = -2.0f; p.frequency_penalty = 2.0f; expect_valid(&p);
    p = d; p.repetition_penalty = 0.0f; expect_invalid(&p, "repetition_penalty", "got 0");
    p = d; p.repetition_penalty = 0.5f; expect_valid(&p);
    p = d; p.logprobs = -2; expect_invalid(&p, "logprobs", "-2");
    p = d; p.logprobs = 21; expect_invalid(&p, "logprobs", "21");
    p = d; p.logprobs = 20; expect_valid(&p);
    p = d; p.logprobs = 0; expect_valid(&p);

    const char *stops_bad[] = {"ok", ""};
    p = d; p.stop = stops_bad; p.n_stop = 2; expect_invalid(&p, "stop[1]", "\"\"");
    p = d; p.stop = NULL; p.n_stop = 1; expect_invalid(&p, "stop", "NULL");
    const char *stops_ok[] = {"\n\n", "END"};
    p = d; p.stop = stops_ok; p.n_stop = 2; expect_valid(&p);
    const int32_t ids_bad[] = {2, -5};
    p = d; p.stop_token_ids = ids_bad; p.n_stop_token_ids = 2;
    expect_invalid(&p, "stop_token_ids[1]", "-5");
    const int32_t ids_ok[] = {0, 2};
    p = d; p.stop_token_ids = ids_ok; p.n_stop_token_ids = 2; expect_valid(&p);

    pg_error err = {{0}};
    assert_int_equal(sampling_params_validate(NULL, &err), PG_EINVAL);
    assert_int_equal(sampling_params_validate(&d, NULL), PG_OK);
}

/* ---- RNG ---------------------------------------------------------------- */

static void test_rng_streams(void **state)
{
    (void)state;
    enum { N = 256 };
    double a[N], b[N];
    sampler_rng r1 = sampler_rng_init(1234, 0), r2 = sampler_rng_init(1234, 0);
    for (int i = 0; i < N; i++) {
        a[i] = sampler_rng_uniform(&r1);
        b[i] = sampler_rng_uniform(&r2);
        assert_true(a[i] >= 0.0 && a[i] < 1.0);
        assert_true(a[i] == b[i]);
    }
    assert_true(r1.counter == N);

    /* the k-th draw depends only on (seed, index, k): interleaving two
     * sequences' draws (any batch composition) changes nothing */
    sampler_rng x = sampler_rng_init(1234, 0), y = sampler_rng_init(1234, 1);
    double ys[N];
    for (int i = 0; i < N; i++) {
        assert_true(sampler_rng_uniform(&x) == a[i]);
        ys[i] = sampler_rng_uniform(&y);
    }
    /* resuming from a saved state (preemption keeps the RNG) */
    sampler_rng z = sampler_rng_init(1234, 0);
    z.counter = 100;
    assert_true(sampler_rng_uniform(&z) == a[100]);

    /* different index / different seed -> different streams (no equal draw
     * at the same position, and not a shifted copy of each other) */
    sampler_rng s2 = sampler_rng_init(1235, 0);
    int same_pos = 0, shifted = 0;
    for (int i = 0; i < N; i++) {
        double v = sampler_rng_uniform(&s2);
        same_pos += ys[i] == a[i];
        same_pos += v == a[i];
        for (int j = 0; j < N; j++)
            shifted += ys[i] == a[j];
    }
    assert_int_equal(same_pos, 0);
    assert_int_equal(shifted, 0);

    /* 53 random bits: u * 2^53 is an integer and the low bit varies; mean ~ 1/2 */
    sampler_rng m = sampler_rng_init(7, 3);
    int odd = 0;
    double sum = 0.0;
    for (int i = 0; i < 100000; i++) {
        double u = sampler_rng_uniform(&m);
        double k = u * 0x1.0p53;
        assert_true(k == floor(k));
        odd += fmod(k, 2.0) == 1.0;
        sum += u;
    }
    assert_in_range(odd, 49000, 51000);
    assert_true(fabs(sum / 100000 - 0.5) < 0.005);

    /* pinned: the stream is part of the output's reproducibility contract
     * (same seed -> same completions across pagedgen versions); changing the
     * generator must be a deliberate, visible decision */
    sampler_rng pin = sampler_rng_init(0, 0);
    uint64_t first = (uint64_t)(sampler_rng_uniform(&pin) * 0x1.0p53);
    assert_true(first == PINNED_FIRST_DRAW);
}

/* ---- greedy, banning ---------------------------------------------------- */

static void test_greedy_ties_and_banned(void **state)
{
    (void)state;
    sampler_workspace *w = sampler_workspace_create(8);
    assert_non_null(w);
    sampling_params p = sampling_params_default();
    p.temperature = 0.0f;
    sampler_rng rng = sampler_rng_init(1, 0);
    sampler_result r = {0};

    float l1[6] = {1.0f, 5.0f, -2.0f, 5.0f, 3.0f, 5.0f};
    assert_int_equal(sampler_sample(w, &p, l1, 6, NULL, &rng, &r), PG_OK);
    assert_int_equal(r.token_id, 1);
    assert_true(rng.counter == 0); /* greedy draws nothing */

    const int32_t banned[] = {1, 5};
    sampler_seq_view seq = {.banned_ids = banned, .n_banned = 2};
    float l2[6] = {1.0f, 5.0f, -2.0f, 5.0f, 3.0f, 5.0f};
    assert_int_equal(sampler_sample(w, &p, l2, 6, &seq, &rng, &r), PG_OK);
    assert_int_equal(r.token_id, 3);
    assert_true(isinf(l2[1]) && l2[1] < 0.0f);

    /* below vLLM's _SAMPLING_EPS is greedy too; NaN never wins */
    p.temperature = 5e-6f;
    float l3[4] = {NAN, 0.5f, 0.7f, 0.7f};
    assert_int_equal(sampler_sample(w, &p, l3, 4, NULL, &rng, &r), PG_OK);
    assert_int_equal(r.token_id, 2);
    assert_true(rng.counter == 0);

    /* everything banned: an error with a message, not a made-up token */
    const int32_t all[] = {0, 1, 2};
    sampler_seq_view seq_all = {.banned_ids = all, .n_banned = 3};
    float l4[3] = {1.0f, 2.0f, 3.0f};
    assert_int_equal(sampler_sample(w, &p, l4, 3, &seq_all, &rng, &r), PG_EINVAL);
    assert_non_null(strstr(sampler_workspace_error(w), "banned"));
    p.temperature = 1.0f;
    float l5[3] = {1.0f, 2.0f, 3.0f};
    assert_int_equal(sampler_sample(w, &p, l5, 3, &seq_all, &rng, &r), PG_EINVAL);

    /* ids out of range and a vocab larger than the workspace are rejected
     * before anything is changed */
    const int32_t bad[] = {0, 9};
    sampler_seq_view seq_bad = {.output_ids = bad, .n_output = 2};
    float l6[8] = {0};
    assert_int_equal(sampler_sample(w, &p, l6, 8, &seq_bad, &rng, &r), PG_EINVAL);
    assert_non_null(strstr(sampler_workspace_error(w), "output_ids[1]"));
    float l7[9] = {0};
    assert_int_equal(sampler_sample(w, &p, l7, 9, NULL, &rng, &r), PG_EINVAL);
    assert_non_null(strstr(sampler_workspace_error(w), "vocab"));
    sampler_workspace_destroy(w);
    sampler_workspace_destroy(NULL);
}

static void test_banned_never_sampled(void **state)
{
    (void)state;
    enum { V = 8, D = 4000 };
    float logits[V] = {0.5f, 3.0f, 0.1f, 0.2f, 0.3f, 2.5f, 0.0f, -0.1f};
    const int32_t banned[] = {1, 5, 6};
    sampler_seq_view seq = {.banned_ids = banned, .n_banned = 3};
    sampling_params p = sampling_params_default();
    int counts[V];
    histogram(&p, logits, V, &seq, 42, D, counts);
    const int32_t allowed[] = {0, 2, 3, 4, 7};
    assert_support(counts, V, allowed, 5);
}

/* ---- temperature -------------------------------------------------------- */

static void test_temperature_distribution(void **state)
{
    (void)state;
    enum { V = 10, D = 20000 };
    float logits[V];
    pg_test_rng tr = {99};
    pg_test_fill_uniform(&tr, logits, V, -2.0f, 2.0f);
    sampling_params p = sampling_params_default();
    p.temperature = 0.7f;
    int counts[V];
    histogram(&p, logits, V, NULL, 2024, D, counts);

    double want[V], wrong[V];
    softmax_d(logits, V, 0.7, want);
    softmax_d(logits, V, 1.0, wrong);
    double chi = chi_square(counts, want, V, D);
    double chi_wrong = chi_square(counts, wrong, V, D);
    double maxdiff = 0.0;
    for (int i = 0; i < V; i++)
        maxdiff = fmax(maxdiff, fabs((double)counts[i] / D - want[i]));
    printf("temperature 0.7: chi2 %.2f (df 9, 0.1%% critical 27.88), vs T=1: %.1f, max |p - p^| %.4f\n",
           chi, chi_wrong, maxdiff);
    assert_true(chi < 27.88);
    assert_true(chi_wrong > 100.0); /* the test can tell T=0.7 from T=1 */
    assert_true(maxdiff < 0.012);

    /* same seed -> same histogram; another seed -> another one */
    int again[V], other[V];
    histogram(&p, logits, V, NULL, 2024, D, again);
    histogram(&p, logits, V, NULL, 2025, D, other);
    assert_memory_equal(counts, again, sizeof counts);
    assert_memory_not_equal(counts, other, sizeof counts);
}

/* ---- min-p, top-k, top-p: exact supports --------------------------------- */

static void test_top_k(void **state)
{
    (void)state;
    enum { D = 3000 };
    sampling_params p = sampling_params_default();
    float l[8] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f};
    int counts[8];
    p.top_k = 3;
    histogram(&p, l, 8, NULL, 1, D, counts);
    const int32_t k3[] = {5, 6, 7};
    assert_support(counts, 8, k3, 3);

    /* boundary ties are all kept (vLLM masks logits < k-th value) */
    float t[6] = {1.0f, 3.0f, 3.0f, 3.0f, 2.0f, 0.0f};
    p.top_k = 2;
    histogram(&p, t, 6, NULL, 2, D, counts);
    const int32_t k2[] = {1, 2, 3};
    assert_support(counts, 6, k2, 3);
    p.top_k = 4;
    histogram(&p, t, 6, NULL, 3, D, counts);
    const int32_t k4[] = {1, 2, 3, 4};
    assert_support(counts, 6, k4, 4);

    /* top_k >= vocab and 0 are off; top_k 1 is greedy-like */
    float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int32_t all[] = {0, 1, 2, 3};
    p.top_k = 10;
    histogram(&p, u, 4, NULL, 4, D, counts);
    assert_support(counts, 4, all, 4);
    p.top_k = 0;
    histogram(&p, u, 4, NULL, 4, D, counts);
    assert_support(counts, 4, all, 4);
    p.top_k = 1;
    histogram(&p, l, 8, NULL, 5, 200, counts);
    const int32_t k1[] = {7};
    assert_support(counts, 8, k1, 1);

    /* the kept tokens keep their relative probabilities */
    float r[5] = {0.0f, 1.0f, 0.5f, -1.0f, 0.2f};
    p.top_k = 2;
    histogram(&p, r, 5, NULL, 6, 20000, counts);
    double ratio = (double)counts[1] / counts[2], want = exp(0.5);
    assert_true(counts[0] + counts[3] + counts[4] == 0);
    assert_true(fabs(ratio - want) < 0.05 * want);
}

/* qsort comparator: descending value, then ascending id */
typedef struct ref_cand {
    float x;
    int32_t id;
} ref_cand;
static int ref_cmp(const void *pa, const void *pb)
{
    const ref_cand *a = pa, *b = pb;
    if (a->x != b->x)
        return a->x > b->x ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The kept set is visible in the logits the sampler leaves behind (> -inf
 * = kept). Compares it with a full-sort reference for top-k (heap and
 * quickselect paths, heavy ties) and top-p, on a 5000-token vocabulary. */
static void test_filters_exact_sets(void **state)
{
    (void)state;
    enum { V = 5000 };
    float *base = malloc(V * sizeof *base), *l = malloc(V * sizeof *l);
    ref_cand *ref = malloc(V * sizeof *ref);
    assert_non_null(base);
    assert_non_null(l);
    assert_non_null(ref);
    sampler_workspace *w = sampler_workspace_create(V);
    assert_non_null(w);
    pg_test_rng tr = {77};
    for (int quantized = 0; quantized < 2; quantized++) {
        for (int i = 0; i < V; i++) {
            float x = pg_test_rng_uniform(&tr, -6.0f, 6.0f);
            base[i] = quantized ? floorf(x * 4.0f) / 4.0f : x; /* 48 distinct values: many ties */
            ref[i].x = base[i];
            ref[i].id = i;
        }
        qsort(ref, V, sizeof *ref, ref_cmp);

        const int32_t ks[] = {1, 7, 50, 1024, 1025, 3000, V - 1};
        for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
            sampling_params p = sampling_params_default();
            p.top_k = ks[t];
            float kth = ref[ks[t] - 1].x;
            memcpy(l, base, V * sizeof *l);
            sampler_rng rng = sampler_rng_init(1, 0);
            sampler_result r = {0};
            assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r), PG_OK);
            int kept = 0;
            for (int i = 0; i < V; i++) {
                bool want = base[i] >= kth, got = l[i] > -INFINITY;
                if (want != got)
                    fail_msg("top_k %d (quantized %d): id %d logit %g kth %g: kept %d, want %d",
                             (int)ks[t], quantized, i, (double)base[i], (double)kth, got, want);
                kept += got;
            }
            assert_true(kept >= ks[t]);
            assert_true(quantized || kept == ks[t]);
            assert_true(base[r.token_id] >= kth);
        }

        const float ps[] = {0.05f, 0.3f, 0.9f, 0.99f};
        for (size_t t = 0; t < sizeof ps / sizeof ps[0]; t++) {
            double m = (double)ref[0].x, total = 0.0, cum = 0.0;
            for (int j = 0; j < V; j++)
                total += exp((double)ref[j].x - m);
            int keep = 0;
            while (keep < V) {
                cum += exp((double)ref[keep].x - m);
                keep++;
                if (cum >= (double)ps[t] * total)
                    break;
            }
            sampling_params p = sampling_params_default();
            p.top_p = ps[t];
            memcpy(l, base, V * sizeof *l);
            sampler_rng rng = sampler_rng_init(2, 0);
            sampler_result r = {0};
            assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r), PG_OK);
            int got = 0;
            for (int i = 0; i < V; i++)
                got += l[i] > -INFINITY;
            if (got != keep)
                fail_msg("top_p %g (quantized %d): kept %d tokens, want %d", (double)ps[t], quantized,
                         got, keep);
            for (int j = 0; j < keep; j++)
                assert_true(l[ref[j].id] > -INFINITY);
        }
    }
    sampler_workspace_destroy(w);
    free(ref);
    free(l);
    free(base);
}

static void test_top_p(void **state)
{
    (void)state;
    enum { D = 4000 };
    /* probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (ids shuffled) */
    const double pr[5] = {0.0625, 0.25, 0.5, 0.0625, 0.125};
    float l[5];
    for (int i = 0; i < 5; i++)
        l[i] = (float)log(pr[i]);
    sampling_params p = sampling_params_default();
    int counts[5];

    p.top_p = 0.45f;  /* 0.5 >= 0.45 */
    histogram(&p, l, 5, NULL, 11, D, counts);
    const int32_t s1[] = {2};
    assert_support(counts, 5, s1, 1);
    p.top_p = 0.7f;   /* 0.5 < 0.7 <= 0.75 */
    histogram(&p, l, 5, NULL, 12, D, counts);
    const int32_t s2[] = {2, 1};
    assert_support(counts, 5, s2, 2);
    p.top_p = 0.8f;   /* 0.75 < 0.8 <= 0.875 */
    histogram(&p, l, 5, NULL, 13, D, counts);
    const int32_t s3[] = {2, 1, 4};
    assert_support(counts, 5, s3, 3);
    p.top_p = 0.9f;   /* 0.875 < 0.9: the two equal 0.0625 tokens -> lower id first */
    histogram(&p, l, 5, NULL, 14, D, counts);
    const int32_t s4[] = {2, 1, 4, 0};
    assert_support(counts, 5, s4, 4);
    p.top_p = 1.0f;
    histogram(&p, l, 5, NULL, 15, D, counts);
    const int32_t s5[] = {0, 1, 2, 3, 4};
    assert_support(counts, 5, s5, 5);

    /* renormalized among the kept: 0.5 : 0.25 : 0.125 -> 4/7, 2/7, 1/7 */
    p.top_p = 0.8f;
    histogram(&p, l, 5, NULL, 16, 21000, counts);
    assert_true(fabs(counts[2] / 21000.0 - 4.0 / 7) < 0.015);
    assert_true(fabs(counts[1] / 21000.0 - 2.0 / 7) < 0.015);
    assert_true(fabs(counts[4] / 21000.0 - 1.0 / 7) < 0.015);

    /* top-p applies after top-k, over the top-k survivors renormalized:
     * top_k 2 keeps 0.5, 0.25 -> 2/3, 1/3; top_p 0.6 keeps only 2/3 */
    p.top_k = 2;
    p.top_p = 0.6f;
    histogram(&p, l, 5, NULL, 17, D, counts);
    assert_support(counts, 5, s1, 1);
}

static void test_min_p(void **state)
{
    (void)state;
    enum { D = 4000 };
    const double pr[4] = {0.1, 0.4, 0.2, 0.3};
    float l[4];
    for (int i = 0; i < 4; i++)
        l[i] = (float)log(pr[i]);
    sampling_params p = sampling_params_default();
    int counts[4];

    p.min_p = 0.6f; /* threshold 0.24: keeps 0.4, 0.3 */
    histogram(&p, l, 4, NULL, 21, D, counts);
    const int32_t a[] = {1, 3};
    assert_support(counts, 4, a, 2);
    p.min_p = 0.3f; /* 0.12: keeps 0.4, 0.3, 0.2 */
    histogram(&p, l, 4, NULL, 22, D, counts);
    const int32_t b[] = {1, 3, 2};
    assert_support(counts, 4, b, 3);
    p.min_p = 1.0f; /* only the max */
    histogram(&p, l, 4, NULL, 23, D, counts);
    const int32_t c[] = {1};
    assert_support(counts, 4, c, 1);

    /* vLLM v1 order: min-p before top-p. min_p 0.6 leaves 0.4, 0.3 ->
     * renormalized 4/7, 3/7; top_p 0.5 then keeps only id 1. (top-p first
     * would keep {1, 3}: 0.4 < 0.5 <= 0.7.) */
    p.min_p = 0.6f;
    p.top_p = 0.5f;
    histogram(&p, l, 4, NULL, 24, D, counts);
    assert_support(counts, 4, c, 1);

    /* min-p is relative to the temperature-scaled distribution: at T = 2
     * probs ~ sqrt(pr): 0.316, 0.632, 0.447, 0.548 (/ sum); ratio to max
     * 0.5, 1, 0.707, 0.866; min_p 0.6 keeps {1, 2, 3} */
    p.top_p = 1.0f;
    p.temperature = 2.0f;
    histogram(&p, l, 4, NULL, 25, D, counts);
    assert_support(counts, 4, b, 3);
}

/* ---- penalties ---------------------------------------------------------- */

static void test_penalties_exact(void **state)
{
    (void)state;
    sampler_workspace *w = sampler_workspace_create(6);
    assert_non_null(w);
    sampling_params p = sampling_params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    const int32_t prompt[] = {0, 1, 0};
    const int32_t output[] = {1, 2, 2, 5};
    sampler_seq_view seq = {.prompt_ids = prompt, .n_prompt = 3, .output_ids = output, .n_output = 4};
    float l[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
    sampler_rng rng = sampler_rng_init(0, 0);
    sampler_result r = {0};
    assert_int_equal(sampler_sample(w, &p, l, 6, &seq, &rng, &r), PG_OK);
    /* id 0 prompt only (twice, divided once): 2 / 2 = 1
     * id 1 prompt+output x1: -1 * 2 = -2, - 0.5 * 1 = -2.5, - 0.25 = -2.75
     * id 2 output x2: 0.5 / 2 = 0.25, - 0.5 * 2 = -0.75, - 0.25 = -1
     * id 3 untouched; id 4 untouched (negative, not in any set)
     * id 5 output x1 with logit 0 (not > 0 -> multiply): 0, -0.5, -0.75 */
    const float want[6] = {1.0f, -2.75f, -1.0f, 3.0f, -2.0f, -0.75f};
    for (int i = 0; i < 6; i++)
        if (l[i] != want[i])
            fail_msg("id %d: penalized logit %g, want %g", i, (double)l[i], (double)want[i]);
    assert_int_equal(r.token_id, 3);

    /* the workspace's scratch is clean again: a second call with no
     * history leaves logits alone */
    p.repetition_penalty = 1.0f;
    float l2[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
    const float orig[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
    assert_int_equal(sampler_sample(w, &p, l2, 6, NULL, &rng, &r), PG_OK);
    assert_memory_equal(l2, orig, sizeof orig);

    /* repetition < 1 encourages repeats: positive / 0.5 doubles, negative
     * * 0.5 halves */
    sampling_params q = sampling_params_default();
    q.temperature = 0.0f;
    q.repetition_penalty = 0.5f;
    const int32_t out2[] = {0, 1};
    sampler_seq_view s2 = {.output_ids = out2, .n_output = 2};
    float l3[3] = {1.5f, -4.0f, 2.5f};
    assert_int_equal(sampler_sample(w, &q, l3, 3, &s2, &rng, &r), PG_OK);
    assert_true(l3[0] == 3.0f && l3[1] == -2.0f && l3[2] == 2.5f);
    assert_int_equal(r.token_id, 0); /* the penalty flipped the argmax */

    /* a negative presence penalty raises repeated tokens */
    q.repetition_penalty = 1.0f;
    q.presence_penalty = -1.0f;
    float l4[3] = {0.0f, 0.5f, 0.9f};
    const int32_t out3[] = {0};
    sampler_seq_view s3 = {.output_ids = out3, .n_output = 1};
    assert_int_equal(sampler_sample(w, &q, l4, 3, &s3, &rng, &r), PG_OK);
    assert_int_equal(r.token_id, 0);
    assert_true(l4[0] == 1.0f);
    sampler_workspace_destroy(w);
}

/* ---- logprobs ----------------------------------------------------------- */

static void test_logprobs(void **state)
{
    (void)state;
    enum { V = 7 };
    sampler_workspace *w = sampler_workspace_create(V);
    assert_non_null(w);
    const float raw[V] = {1.0f, 2.0f, 0.5f, 2.0f, -1.0f, 1.5f, -3.0f};
    double m = 2.0, s = 0.0;
    for (int i = 0; i < V; i++)
        s += exp((double)raw[i] - m);
    double lse = m + log(s);

    sampling_params p = sampling_params_default();
    p.temperature = 0.0f;
    p.logprobs = 4;
    p.repetition_penalty = 4.0f; /* moves the argmax to id 5, logprobs stay raw */
    const int32_t out[] = {1, 3};
    sampler_seq_view seq = {.output_ids = out, .n_output = 2};
    float l[V];
    memcpy(l, raw, sizeof l);
    int32_t top_ids[4] = {-1, -1, -1, -1};
    float top_lp[4] = {0};
    sampler_result r = {.top_ids = top_ids, .top_logprobs = top_lp};
    sampler_rng rng = sampler_rng_init(3, 0);
    assert_int_equal(sampler_sample(w, &p, l, V, &seq, &rng, &r), PG_OK);
    assert_int_equal(r.token_id, 5);
    assert_true(fabs((double)r.logprob - (1.5 - lse)) < 1e-6);
    assert_int_equal(r.n_top, 4);
    const int32_t want_ids[4] = {1, 3, 5, 0}; /* 2.0 tie -> lower id first */
    const double want_raw[4] = {2.0, 2.0, 1.5, 1.0};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(top_ids[j], want_ids[j]);
        assert_true(fabs((double)top_lp[j] - (want_raw[j] - lse)) < 1e-6);
        if (j > 0)
            assert_true(top_lp[j] <= top_lp[j - 1]);
    }

    /* logprobs = 0: only the sampled token's; -1: none */
    p.logprobs = 0;
    p.repetition_penalty = 1.0f;
    memcpy(l, raw, sizeof l);
    sampler_result r0 = {0};
    assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r0), PG_OK);
    assert_int_equal(r0.token_id, 1);
    assert_int_equal(r0.n_top, 0);
    assert_true(fabs((double)r0.logprob - (2.0 - lse)) < 1e-6);
    p.logprobs = -1;
    memcpy(l, raw, sizeof l);
    assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r0), PG_OK);
    assert_int_equal(r0.n_top, 0);

    /* random sampling: the sampled token's logprob is raw, not tempered */
    p.logprobs = 2;
    p.temperature = 0.3f;
    for (int k = 0; k < 50; k++) {
        memcpy(l, raw, sizeof l);
        assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r), PG_OK);
        assert_true(fabs((double)r.logprob - ((double)raw[r.token_id] - lse)) < 1e-6);
        assert_int_equal(r.n_top, 2);
        assert_int_equal(top_ids[0], 1);
        assert_int_equal(top_ids[1], 3);
    }
    /* missing storage is an error */
    sampler_result bad = {0};
    memcpy(l, raw, sizeof l);
    assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &bad), PG_EINVAL);
    sampler_workspace_destroy(w);
}

/* ---- a real vocabulary ---------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void test_large_vocab(void **state)
{
    (void)state;
    enum { V = 128256, ROUNDS = 20 };
    float *base = malloc(V * sizeof *base), *l = malloc(V * sizeof *l);
    assert_non_null(base);
    assert_non_null(l);
    pg_test_rng tr = {5};
    pg_test_fill_uniform(&tr, base, V, -8.0f, 8.0f);
    base[77777] = 20.0f; /* a clear winner */
    sampler_workspace *w = sampler_workspace_create(V);
    assert_non_null(w);
    int32_t top_ids[20];
    float top_lp[20];

    struct { const char *name; float t, top_p, min_p; int32_t top_k, logprobs; } cfg[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, -1, -1},
        {"greedy+logprobs20", 0.0f, 1.0f, 0.0f, -1, 20},
        {"temperature", 0.8f, 1.0f, 0.0f, -1, -1},
        {"top_k 50", 0.8f, 1.0f, 0.0f, 50, -1},
        {"top_k 50 + top_p 0.9", 0.8f, 0.9f, 0.0f, 50, -1},
        {"top_p 0.9", 0.8f, 0.9f, 0.0f, -1, -1},
        {"min_p 0.05", 0.8f, 1.0f, 0.05f, -1, -1},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sampling_params p = sampling_params_default();
        p.temperature = cfg[c].t;
        p.top_p = cfg[c].top_p;
        p.top_k = cfg[c].top_k;
        p.min_p = cfg[c].min_p;
        p.logprobs = cfg[c].logprobs;
        sampler_rng rng = sampler_rng_init(9, 0);
        double ms = 0.0;
        for (int k = 0; k < ROUNDS; k++) {
            memcpy(l, base, V * sizeof *l);
            sampler_result r = {.top_ids = top_ids, .top_logprobs = top_lp};
            double t0 = now_ms();
            assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r), PG_OK);
            ms += now_ms() - t0;
            if (p.temperature == 0.0f || p.top_k == 50 || p.min_p > 0.0f)
                assert_int_equal(r.token_id, 77777); /* 20 vs <= 8: everything else is tiny */
            if (p.logprobs == 20) {
                assert_int_equal(top_ids[0], 77777);
                for (int j = 1; j < 20; j++)
                    assert_true(top_lp[j] <= top_lp[j - 1]);
            }
        }
        printf("vocab %d, %-22s %.3f ms/token\n", V, cfg[c].name, ms / ROUNDS);
    }

    /* top-k = 50 on a flat-ish vocabulary: every sample is among the 50 largest */
    base[77777] = 0.0f;
    sampling_params p = sampling_params_default();
    p.top_k = 50;
    p.temperature = 0.5f;
    float *sorted = malloc(V * sizeof *sorted);
    assert_non_null(sorted);
    memcpy(sorted, base, V * sizeof *sorted);
    float kth = -INFINITY;
    for (int j = 0; j < 50; j++) { /* 50th largest by repeated max, O(50 V) */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (sorted[i] > sorted[best])
                best = i;
        kth = sorted[best];
        sorted[best] = -INFINITY;
    }
    sampler_rng rng = sampler_rng_init(10, 4);
    for (int k = 0; k < 200; k++) {
        memcpy(l, base, V * sizeof *l);
        sampler_result r = {0};
        assert_int_equal(sampler_sample(w, &p, l, V, NULL, &rng, &r), PG_OK);
        assert_true(base[r.token_id] >= kth);
    }
    free(sorted);
    sampler_workspace_destroy(w);
    free(l);
    free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_rng_streams),
        cmocka_unit_test(test_greedy_ties_and_banned),
        cmocka_unit_test(test_banned_never_sampled),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_filters_exact_sets),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties_exact),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_large_vocab),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
