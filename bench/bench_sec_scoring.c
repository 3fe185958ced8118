/* bench_sec_scoring: the "scoring" section of pagedgen_bench (issue 21) —
 * requests with prompt logprobs, what an evaluation run sends, three ways:
 *   plain      the same prompts without prompt logprobs (prefill only: the
 *              ceiling, one logits row per request);
 *   prefill    prompt logprobs computed in the prefill pass (chunks; every
 *              row's logits through forward_rows);
 *   per step   the path before issue 21 (engine_params
 *              prompt_logprobs_per_step: one prompt token a step);
 *   cached     (multiple choice) prompt logprobs from the continuation on
 *              (sampling_params.prompt_logprobs_from = the context length):
 *              the choices after a question's first read its context's
 *              full blocks from the prefix cache, their values unchanged
 *              (no row of a cached position is needed).
 * Workloads: 16 prompts x 256 tokens (max_tokens 1), one 512-token request,
 * and an lm-eval-shaped multiple choice: questions of a 200-400 token
 * context with 4 continuations of 5-30 tokens, each choice one request
 * (context + continuation, prompt logprobs 1, max_tokens 1: what echo +
 * max_tokens 0 + logprobs 1 becomes). Scored tok/s counts the prompt tokens
 * that get a logprob (all but each prompt's first). Each run is the best of
 * two interleaved rounds (one with --quick). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

enum { MODE_PLAIN, MODE_PREFILL, MODE_PER_STEP, MODE_CACHED, N_MODES };
static const char *const mode_name[N_MODES] = {"plain", "prefill", "per_step", "cached"};

/* Runs w in the modes asked (mask), best wall time of `rounds` interleaved
 * rounds into r[mode]. Plain runs without the prefix cache (the same token
 * count computed); scoring runs with it on (a prompt-logprob request reads
 * no hits: engine.h). */
static int run_modes(bench_model *bm, const bench_workload *w, unsigned mask, int rounds,
                     const int32_t *from, bench_result r[N_MODES])
{
    for (int m = 0; m < N_MODES; m++)
        r[m].wall_s = 0.0;
    for (int k = 0; k < rounds; k++)
        for (int m = 0; m < N_MODES; m++) {
            if (!(mask & (1u << m)))
                continue;
            bench_run_params rp = bench_run_params_default(bm);
            rp.prefix_caching = m != MODE_PLAIN;
            rp.prompt_logprobs = m == MODE_PLAIN ? -1 : 1;
            rp.prompt_logprobs_per_step = m == MODE_PER_STEP;
            rp.prompt_logprobs_from = m == MODE_CACHED ? from : NULL;
            bench_result x;
            int rc = bench_run_or_report(bm, w, &rp, &x);
            if (rc != 0)
                return rc;
            if (r[m].wall_s == 0.0 || x.wall_s < r[m].wall_s)
                r[m] = x;
        }
    return 0;
}

static double scored_tokens(const bench_workload *w, const int32_t *from)
{
    double n = 0.0;
    for (int32_t i = 0; i < w->n; i++)
        n += from ? w->prompt_len[i] - from[i] : w->prompt_len[i] - 1;
    return n;
}

/* The arithmetic's own bound on scored / plain: model FLOPs of the plain
 * prefill (layers for every prompt token, one logits row per request,
 * attention) over those of the scored one (a logits row for every scored
 * token as well). Scoring cannot beat it without skipping lm_head rows. */
static double work_bound(const bench_model *bm, const bench_workload *w)
{
    const llama_config *c = &bm->cfg;
    const double vh = 2.0 * (double)c->vocab_size * (double)c->hidden_size;
    double tokens = 0.0, pairs = 0.0;
    for (int32_t i = 0; i < w->n; i++) {
        const double P = w->prompt_len[i];
        tokens += P;
        pairs += P * (P + 1.0) / 2.0;
    }
    const double common = 2.0 * bm->params_layers * tokens +
                          4.0 * (double)c->num_hidden_layers * (double)c->num_attention_heads *
                              (double)c->head_dim * pairs;
    return (common + vh * (double)w->n) / (common + vh * scored_tokens(w, NULL) + vh * (double)w->n);
}

static void report(bench_ctx *c, const bench_model *bm, const char *key, const bench_workload *w,
                   unsigned mask, const int32_t *from, const bench_result r[N_MODES])
{
    bench_json *j = c->j;
    bench_json_obj(j, key);
    bench_json_workload(j, "workload", w);
    for (int m = 0; m < N_MODES; m++) {
        if (!(mask & (1u << m)))
            continue;
        double scored = scored_tokens(w, m == MODE_CACHED ? from : NULL);
        double sc = r[m].wall_s > 0.0 ? scored / r[m].wall_s : 0.0;
        printf("    %-9s %8.3f s  %8.2f req/s  %9.1f prompt tok/s  %9.1f scored tok/s  steps %6llu  "
               "prefix hits %llu\n", mode_name[m], r[m].wall_s, r[m].req_per_s, r[m].prompt_tok_s,
               m == MODE_PLAIN ? 0.0 : sc, (unsigned long long)r[m].stats.steps,
               (unsigned long long)r[m].stats.prefix_cache_hits);
        bench_json_obj(j, mode_name[m]);
        bench_json_num(j, "wall_s", r[m].wall_s);
        bench_json_num(j, "req_per_s", r[m].req_per_s);
        bench_json_num(j, "prompt_tok_per_s", r[m].prompt_tok_s);
        if (m != MODE_PLAIN)
            bench_json_num(j, "scored_tok_per_s", sc);
        bench_json_int(j, "steps", (int64_t)r[m].stats.steps);
        bench_json_int(j, "prefix_cache_hits", (int64_t)r[m].stats.prefix_cache_hits);
        bench_json_end(j);
    }
    if ((mask & 3u) == 3u && r[MODE_PLAIN].wall_s > 0.0) {
        double q = r[MODE_PLAIN].wall_s / r[MODE_PREFILL].wall_s;
        const double bound = work_bound(bm, w);
        printf("    prefill-pass scoring / plain prefill: %.2fx tok/s (target >= 0.85x; the FLOPs allow "
               "at most %.2fx: every scored token also takes a %d x %d lm_head row)\n", q, bound,
               (int)bm->cfg.vocab_size, (int)bm->cfg.hidden_size);
        bench_json_num(j, "prefill_over_plain", q);
        bench_json_num(j, "prefill_over_plain_flops_bound", bound);
    }
    if ((mask & 6u) == 6u && r[MODE_PREFILL].wall_s > 0.0) {
        double q = r[MODE_PER_STEP].wall_s / r[MODE_PREFILL].wall_s;
        printf("    prefill pass / one row a step: %.2fx faster\n", q);
        bench_json_num(j, "prefill_over_per_step", q);
    }
    if ((mask & 12u) == 12u && r[MODE_CACHED].wall_s > 0.0) {
        double q = r[MODE_PER_STEP].wall_s / r[MODE_CACHED].wall_s;
        printf("    continuations only + prefix cache / one row a step: %.2fx requests/s\n", q);
        bench_json_num(j, "cached_over_per_step", q);
    }
    bench_json_end(j);
}

/* The multiple-choice workload: n_q questions, each a context of 200-400
 * tokens (quick: 40-80) shared by 4 choices of 5-30 tokens, requests in
 * question order (the 4 choices of a question are neighbours, as lm-eval
 * sends them). */
static int make_mc(const bench_model *bm, int32_t n_q, bool quick, bench_workload *w,
                   int32_t *ctx_len)
{
    bench_workload_spec s = {.name = "multiple-choice", .dist = BENCH_DIST_FIXED,
                             .n_requests = 4 * n_q, .prompt_len = 2, .output_len = 1, .seed = 53};
    if (bench_make_workload(bm, &s, w) != 0)
        return -1;
    uint64_t rng = 0x5eed2101u;
    const int32_t V = bm->cfg.vocab_size;
    double sum = 0.0;
    w->max_prompt = 0;
    for (int32_t q = 0; q < n_q; q++) {
        int32_t ctx = quick ? 40 + (int32_t)(bench_rng_next(&rng) % 41)
                            : 200 + (int32_t)(bench_rng_next(&rng) % 201);
        int32_t ctx_ids[400];
        ctx_ids[0] = 1;
        for (int32_t t = 1; t < ctx; t++)
            ctx_ids[t] = 3 + (int32_t)(bench_rng_next(&rng) % (uint64_t)(V - 3));
        for (int32_t k = 0; k < 4; k++) {
            int32_t i = 4 * q + k, cont = 5 + (int32_t)(bench_rng_next(&rng) % 26);
            int32_t *ids = malloc((size_t)(ctx + cont) * sizeof *ids);
            if (!ids)
                return -1;
            memcpy(ids, ctx_ids, (size_t)ctx * sizeof *ids);
            for (int32_t t = 0; t < cont; t++)
                ids[ctx + t] = 3 + (int32_t)(bench_rng_next(&rng) % (uint64_t)(V - 3));
            free(w->prompt_ids[i]);
            w->prompt_ids[i] = ids;
            w->prompt_len[i] = ctx + cont;
            ctx_len[i] = ctx;
            sum += ctx + cont;
            if (ctx + cont > w->max_prompt)
                w->max_prompt = ctx + cont;
        }
    }
    w->mean_prompt = sum / (double)w->n;
    return 0;
}

int bench_section_scoring(bench_ctx *c)
{
    const bool quick = c->quick;
    const int32_t nreq = quick ? 4 : 16, plen = quick ? 64 : 256, long_len = quick ? 128 : 512;
    const int32_t n_q = quick ? 2 : 8;
    const int rounds = quick ? 1 : 2;
    printf("\n== scoring (issue 21): prompt logprobs in the prefill pass vs one row a step vs plain "
           "prefill (best of %d)\n", rounds);
    bench_model bm;
    bool skipped;
    int rc = bench_load(c, "110m", &bm, 2048, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    bench_json_obj(c->j, "scoring");
    bench_json_model(c->j, &bm);
    bench_result r[N_MODES];
    bench_workload w;

    printf("  %d prompts x %d tokens, max_tokens 1\n", nreq, plen);
    bench_workload_spec s = {.name = "fixed", .dist = BENCH_DIST_FIXED, .n_requests = nreq,
                             .prompt_len = plen, .output_len = 1, .seed = 41};
    if (bench_make_workload(&bm, &s, &w) != 0) {
        rc = -1;
        goto out_json;
    }
    rc = run_modes(&bm, &w, 7u, rounds, NULL, r);
    if (rc == 0)
        report(c, &bm, "batch", &w, 7u, NULL, r);
    bench_workload_free(&w);
    if (rc != 0)
        goto out_json;

    printf("  one request of %d tokens, max_tokens 1\n", long_len);
    s = (bench_workload_spec){.name = "single", .dist = BENCH_DIST_FIXED, .n_requests = 1,
                              .prompt_len = long_len, .output_len = 1, .seed = 43};
    if (bench_make_workload(&bm, &s, &w) != 0) {
        rc = -1;
        goto out_json;
    }
    rc = run_modes(&bm, &w, 7u, rounds, NULL, r);
    if (rc == 0)
        report(c, &bm, "single", &w, 7u, NULL, r);
    bench_workload_free(&w);
    if (rc != 0)
        goto out_json;

    printf("  multiple choice: %d questions x 4 choices, context %s tokens, continuations 5-30, "
           "prompt logprobs 1 + max_tokens 1 (echo + max_tokens 0 + logprobs 1)\n", n_q,
           quick ? "40-80" : "200-400");
    memset(&w, 0, sizeof w);
    int32_t *ctx_len = calloc((size_t)(4 * n_q), sizeof *ctx_len);
    if (!ctx_len || make_mc(&bm, n_q, quick, &w, ctx_len) != 0) {
        free(ctx_len);
        bench_workload_free(&w);
        rc = -1;
        goto out_json;
    }
    rc = run_modes(&bm, &w, 15u, rounds, ctx_len, r);
    if (rc == 0)
        report(c, &bm, "multiple_choice", &w, 15u, ctx_len, r);
    free(ctx_len);
    bench_workload_free(&w);

out_json:
    bench_json_end(c->j); /* scoring */
out:
    bench_model_free(&bm);
    return rc;
}
