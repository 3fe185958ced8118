/* bench_workload: the request sets a benchmark feeds the engine — prompt
 * and output lengths, and the prompt token ids — drawn with a fixed seed so
 * that every run of the bench sees the same requests.
 *
 * Length distributions (all requests arrive at t = 0, outputs have a fixed
 * length because the engine ignores EOS):
 *   fixed     every request has prompt P and output G;
 *   sharegpt  ShareGPT-like (Kwon et al., SOSP 2023, Fig. 11: mean input
 *             161.31, mean output 337.99 tokens, long-tailed), lognormal
 *             with sigma 1.0 for both, mu = ln(mean) - sigma^2 / 2 so the
 *             untruncated mean is the paper's;
 *   alpaca    Alpaca-like (mean input 19.31, output 58.45; short, less
 *             tailed), lognormal with sigma 0.5 (input) and 0.7 (output).
 * A `scale` multiplies both means (e.g. ctx / 2048 keeps the paper's
 * length-to-context ratio on a short-context model: its OPT models had
 * 2048). Draws are then truncated to the model's context: prompt in
 * [1, ctx - 1], output in [1, ctx - prompt]; the realised means are kept
 * in the workload so reports show what was actually run.
 */
#ifndef PG_BENCH_WORKLOAD_H
#define PG_BENCH_WORKLOAD_H

#include <stdint.h>

typedef enum bench_dist {
    BENCH_DIST_FIXED = 0,
    BENCH_DIST_SHAREGPT,
    BENCH_DIST_ALPACA,
} bench_dist;

typedef struct bench_workload_spec {
    const char *name;       /* label in reports, e.g. "sharegpt" */
    bench_dist dist;
    int32_t n_requests;
    int32_t prompt_len;     /* fixed only */
    int32_t output_len;     /* fixed only */
    double scale;           /* sharegpt/alpaca: multiplies the means (0 = 1) */
    int32_t shared_prefix;  /* first this many prompt tokens are identical in
                               every request (prefix-sharing runs), 0 = none */
    uint64_t seed;
} bench_workload_spec;

typedef struct bench_workload {
    char name[48];
    int32_t n;               /* requests */
    int32_t *prompt_len;     /* [n] */
    int32_t *output_len;     /* [n] */
    int32_t **prompt_ids;    /* [n][prompt_len[i]] token ids in [3, vocab) */
    double mean_prompt, mean_output; /* realised, after truncation */
    int32_t max_prompt, max_output;
    int32_t n_truncated;     /* requests whose draw was cut to the context */
} bench_workload;

/* Draws the workload for a model with context ctx and vocabulary vocab.
 * Returns 0, or -1 when out of memory or the spec is invalid. */
int bench_workload_make(bench_workload *w, const bench_workload_spec *s, int32_t ctx,
                        int32_t vocab);
void bench_workload_free(bench_workload *w); /* accepts a zeroed struct */

/* Deterministic splitmix64 stream used for the draws (exported for tests). */
uint64_t bench_rng_next(uint64_t *state);

#endif /* PG_BENCH_WORKLOAD_H */
