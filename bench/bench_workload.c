/* bench_workload: seeded request sets (see header for the distributions). */
#include "bench_workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t bench_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1) */
static double rng_unit(uint64_t *s)
{
    return ((double)(bench_rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* standard normal (Box-Muller) */
static double rng_normal(uint64_t *s)
{
    double u1 = rng_unit(s), u2 = rng_unit(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* lognormal with the given mean and sigma, rounded, >= 1 */
static int64_t draw_lognormal(uint64_t *s, double mean, double sigma)
{
    double mu = log(mean) - 0.5 * sigma * sigma;
    double v = exp(mu + sigma * rng_normal(s));
    if (v > 1e9)
        v = 1e9;
    int64_t r = (int64_t)llround(v);
    return r < 1 ? 1 : r;
}

void bench_workload_free(bench_workload *w)
{
    if (!w)
        return;
    if (w->prompt_ids)
        for (int32_t i = 0; i < w->n; i++)
            free(w->prompt_ids[i]);
    free(w->prompt_ids);
    free(w->prompt_len);
    free(w->output_len);
    memset(w, 0, sizeof(*w));
}

int bench_workload_make(bench_workload *w, const bench_workload_spec *s, int32_t ctx,
                        int32_t vocab)
{
    memset(w, 0, sizeof(*w));
    if (s->n_requests < 1 || ctx < 2 || vocab < 4)
        return -1;
    snprintf(w->name, sizeof(w->name), "%s", s->name ? s->name : "workload");
    w->n = s->n_requests;
    w->prompt_len = calloc((size_t)w->n, sizeof(int32_t));
    w->output_len = calloc((size_t)w->n, sizeof(int32_t));
    w->prompt_ids = calloc((size_t)w->n, sizeof(int32_t *));
    if (!w->prompt_len || !w->output_len || !w->prompt_ids)
        goto fail;

    double scale = s->scale > 0.0 ? s->scale : 1.0;
    uint64_t len_rng = s->seed * 0x2545f4914f6cdd1dull + 1u;
    uint64_t tok_rng = s->seed ^ 0x5851f42d4c957f2dull;
    int32_t *prefix = NULL;
    if (s->shared_prefix > 0) {
        prefix = malloc((size_t)s->shared_prefix * sizeof(int32_t));
        if (!prefix)
            goto fail;
        for (int32_t k = 0; k < s->shared_prefix; k++)
            prefix[k] = 3 + (int32_t)(bench_rng_next(&tok_rng) % (uint64_t)(vocab - 3));
    }
    double sum_p = 0.0, sum_o = 0.0;
    for (int32_t i = 0; i < w->n; i++) {
        int64_t p, o;
        switch (s->dist) {
        case BENCH_DIST_SHAREGPT:
            p = draw_lognormal(&len_rng, 161.31 * scale, 1.0);
            o = draw_lognormal(&len_rng, 337.99 * scale, 1.0);
            break;
        case BENCH_DIST_ALPACA:
            p = draw_lognormal(&len_rng, 19.31 * scale, 0.5);
            o = draw_lognormal(&len_rng, 58.45 * scale, 0.7);
            break;
        case BENCH_DIST_FIXED:
        default:
            p = s->prompt_len;
            o = s->output_len;
            break;
        }
        p += s->shared_prefix > 0 && s->dist != BENCH_DIST_FIXED ? s->shared_prefix : 0;
        int truncated = 0;
        if (p > ctx - 1) {
            p = ctx - 1;
            truncated = 1;
        }
        if (p < 1)
            p = 1;
        if (o > ctx - p) {
            o = ctx - p;
            truncated = 1;
        }
        if (o < 1)
            o = 1;
        w->n_truncated += truncated;
        w->prompt_len[i] = (int32_t)p;
        w->output_len[i] = (int32_t)o;
        sum_p += (double)p;
        sum_o += (double)o;
        if (p > w->max_prompt)
            w->max_prompt = (int32_t)p;
        if (o > w->max_output)
            w->max_output = (int32_t)o;
        w->prompt_ids[i] = malloc((size_t)p * sizeof(int32_t));
        if (!w->prompt_ids[i]) {
            free(prefix);
            goto fail;
        }
        for (int64_t k = 0; k < p; k++)
            w->prompt_ids[i][k] = (prefix && k < s->shared_prefix)
                ? prefix[k]
                : 3 + (int32_t)(bench_rng_next(&tok_rng) % (uint64_t)(vocab - 3));
    }
    free(prefix);
    w->mean_prompt = sum_p / (double)w->n;
    w->mean_output = sum_o / (double)w->n;
    return 0;
fail:
    bench_workload_free(w);
    return -1;
}
