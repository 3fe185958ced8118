/* End to end on stories260K (../shared/models/stories260K) against the
 * goldens made by upstream llama2.c run.c (../shared/goldens/stories260K-*):
 *
 *  - logits after each logits-golden prompt (model_forward on a prefill
 *    step_batch) within 1e-4 of max |logit|, and bit-identical when the same
 *    prompt is fed one token per step;
 *  - greedy completions through the engine equal completion_token_ids (plus
 *    the stopping id, which the engine keeps as vLLM does), the finish
 *    reason and completion_text exactly; the prompt ids equal
 *    tok_encode(prompt, add_special);
 *  - batch invariance: the same completions in every configuration (all in
 *    one batch, one at a time, a pool so small that preemption happens all
 *    the time, chunked prefill, prefix caching on and off, 1 and 2 threads,
 *    block sizes 1, 16 and 32);
 *  - parallel sampling (n = 4, temperature 1, seeded): four different
 *    samples, the same on every run and in every configuration, the prompt's
 *    blocks shared.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "engine.h"
#include "golden_support.h"
#include "model.h"
#include "test_support.h"
#include "tokenizer.h"

typedef struct fixture {
    pg_golden_set set;  /* the model and the goldens */
    tokenizer *tok;
} fixture;

/* One finished sequence as the engine gave it. */
typedef struct result {
    int32_t *ids;
    int32_t n;
    char *text;
    size_t text_len;
    finish_reason finish;
    int32_t stop_token_id;
} result;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    *state = f;
    if (pg_golden_set_load(&f->set))
        return -1;
    pg_error err;
    if (tok_load(&f->tok, f->set.model_dir, &err)) {
        fprintf(stderr, "loading %s: %s\n", f->set.model_dir, err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tok_free(f->tok);
    pg_golden_set_free(&f->set);
    free(f);
    return 0;
}

/* ---- a model on the CPU executor ----------------------------------------- */

typedef struct rig {
    executor *ex;
    model *m;
} rig;

static void rig_open(rig *r, fixture *f, int threads, const model_params *mp)
{
    pg_error err;
    cpu_executor_params cp = {.threads = threads};
    int rc = cpu_executor_create(&r->ex, &cp, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    rc = model_create(&r->m, r->ex, &f->set.cfg, f->set.st, mp, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
}

static void rig_close(rig *r)
{
    model_destroy(r->m);
    r->ex->op->destroy(r->ex);
}

/* ---- logits --------------------------------------------------------------- */

static void test_logits_goldens(void **state)
{
    fixture *f = *state;
    const int32_t V = f->set.cfg.vocab_size, bs = 16;
    model_params mp = {.num_kv_blocks = 32, .block_size = bs, .max_num_batched_tokens = 512,
                       .max_num_seqs = 4};
    rig r;
    rig_open(&r, f, 2, &mp);
    float *prefill = malloc((size_t)V * sizeof(float)), *inc = malloc((size_t)V * sizeof(float));
    assert_true(prefill && inc);
    double worst_rel = 0;
    for (int k = 0; k < f->set.n_lg; k++) {
        pg_logits_golden *g = &f->set.lg[k];
        assert_int_equal(g->n_logits, V);
        double t0 = now_ms();
        pg_golden_run_prompt(r.m, g->prompt_ids, g->n_prompt, g->n_prompt, bs, prefill);
        double t1 = now_ms();
        double maxabs = 0, maxdiff = 0;
        int32_t am = 0;
        for (int32_t v = 0; v < V; v++) {
            double a = (double)g->logits[v];
            if (a < 0)
                a = -a;
            if (a > maxabs)
                maxabs = a;
            double d = (double)prefill[v] - (double)g->logits[v];
            if (d < 0)
                d = -d;
            if (d > maxdiff)
                maxdiff = d;
            if (prefill[v] > prefill[am])
                am = v;
        }
        printf("    logits golden %d (%d prompt tokens): max |diff| %.3g, max |logit| %.3g, "
               "rel %.3g, prefill %.2f ms\n",
               k, (int)g->n_prompt, maxdiff, maxabs, maxdiff / maxabs, t1 - t0);
        if (maxdiff / maxabs > worst_rel)
            worst_rel = maxdiff / maxabs;
        assert_true(maxdiff <= 1e-4 * maxabs);
        assert_int_equal(am, g->argmax);
        /* the same prompt one token per step: bit-identical (executor contract) */
        pg_golden_run_prompt(r.m, g->prompt_ids, g->n_prompt, 1, bs, inc);
        assert_memory_equal(prefill, inc, (size_t)V * sizeof(float));
        /* and in uneven chunks of 7 */
        pg_golden_run_prompt(r.m, g->prompt_ids, g->n_prompt, 7, bs, inc);
        assert_memory_equal(prefill, inc, (size_t)V * sizeof(float));
    }
    printf("    logits: worst relative error %.3g (bound 1e-4)\n", worst_rel);
    free(prefill);
    free(inc);
    rig_close(&r);
}

/* ---- the engine ----------------------------------------------------------- */

typedef struct run_cfg {
    const char *name;
    int threads;
    pg_golden_pool pool;
    bool expect_preemption;
} run_cfg;

static void results_free(result *res, int n)
{
    for (int i = 0; i < n; i++) {
        free(res[i].ids);
        free(res[i].text);
    }
}

/* Runs requests [0, n_req) (each with n_samples samples) through a fresh
 * engine; res[req * n_samples + index] gets each sequence. */
static void run_engine(fixture *f, const run_cfg *c, const int32_t *const *prompts,
                       const int32_t *n_prompts, const sampling_params *sps, int n_req,
                       int n_samples, result *res, engine_stats *stats)
{
    model_params mp = pg_golden_model_params(&c->pool);
    rig r;
    rig_open(&r, f, c->threads, &mp);
    engine_params ep = pg_golden_engine_params(&f->set, &c->pool);
    engine_backend be = model_backend(r.m);
    engine *e = NULL;
    pg_error err;
    int rc = engine_create(&e, &ep, &be, f->tok, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    for (int i = 0; i < n_req; i++) {
        uint64_t id;
        rc = engine_add_request(e, prompts[i], n_prompts[i], &sps[i], (void *)(intptr_t)i, &id,
                                &err);
        if (rc)
            fprintf(stderr, "request %d: %s\n", i, err.msg);
        assert_int_equal(rc, 0);
    }
    int finished = 0;
    double t0 = now_ms();
    while (engine_has_unfinished(e)) {
        rc = engine_step(e, &err);
        if (rc)
            fprintf(stderr, "%s: step: %s\n", c->name, err.msg);
        assert_int_equal(rc, 0);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int i = (int)(intptr_t)o->user;
            assert_true(i >= 0 && i < n_req);
            assert_int_equal(o->n_outputs, n_samples);
            assert_int_equal(o->n_prompt_tokens, n_prompts[i]);
            for (int s = 0; s < n_samples; s++) {
                seq_output *so = &o->outputs[s];
                assert_int_equal(so->index, s);
                result *r0 = &res[i * n_samples + s];
                r0->n = so->n_tokens;
                r0->ids = malloc(((size_t)so->n_tokens + 1) * sizeof(int32_t));
                assert_non_null(r0->ids);
                memcpy(r0->ids, so->token_ids, (size_t)so->n_tokens * sizeof(int32_t));
                assert_non_null(so->text);
                r0->text = malloc(so->text_len + 1);
                assert_non_null(r0->text);
                memcpy(r0->text, so->text, so->text_len + 1);
                r0->text_len = so->text_len;
                r0->finish = so->finish;
                r0->stop_token_id = so->stop_token_id;
            }
            request_output_free(o);
            finished++;
        }
    }
    double t1 = now_ms();
    assert_int_equal(finished, n_req);
    engine_get_stats(e, stats);
    printf("    %-34s %7.1f ms  steps %5llu  prompt tok %5llu  gen tok %5llu  preempt %4llu  "
           "prefix hits %3llu/%3llu  cow %3llu  peak blocks %d/%d\n",
           c->name, t1 - t0, (unsigned long long)stats->steps,
           (unsigned long long)stats->prompt_tokens, (unsigned long long)stats->generated_tokens,
           (unsigned long long)stats->preemptions, (unsigned long long)stats->prefix_cache_hits,
           (unsigned long long)stats->prefix_cache_queries,
           (unsigned long long)stats->cow_copies, (int)stats->blocks_in_use_peak,
           (int)stats->num_blocks);
    engine_destroy(e);
    rig_close(&r);
}

static const run_cfg greedy_cfgs[] = {
    /* name                               thr {bs  blocks seqs batched prefix} preempt */
    {"batch, bs 16, 1 thread", 1, {16, 256, 256, 2048, true}, false},
    {"batch, bs 1, 2 threads, chunked", 2, {1, 4096, 256, 64, true}, false},
    {"one by one, bs 32, 2 threads", 2, {32, 64, 1, 2048, false}, false},
    {"one by one, bs 16, no prefix", 1, {16, 32, 1, 2048, false}, false},
    {"tiny pool, bs 16, 1 thread", 1, {16, 24, 256, 2048, true}, true},
    {"small pool, bs 16, no prefix, 1 thr", 1, {16, 40, 256, 64, false}, true},
    {"tiny pool, bs 1, 2 threads", 2, {1, 300, 256, 2048, false}, true},
    {"tiny pool, bs 32, prefix, 2 thr", 2, {32, 12, 256, 2048, true}, true},
};

static void test_greedy_goldens(void **state)
{
    fixture *f = *state;
    int n = f->set.n_g;
    const int32_t *prompts[PG_GOLDEN_MAX];
    int32_t n_prompts[PG_GOLDEN_MAX];
    sampling_params sps[PG_GOLDEN_MAX];

    /* the prompts' ids are the tokenizer's */
    for (int i = 0; i < n; i++) {
        pg_golden *g = &f->set.g[i];
        int32_t *ids;
        size_t n_ids;
        pg_error err;
        assert_int_equal(tok_encode(f->tok, g->prompt, g->prompt_len, true, &ids, &n_ids, &err),
                         0);
        assert_int_equal(n_ids, g->n_prompt);
        assert_memory_equal(ids, g->prompt_ids, n_ids * sizeof(int32_t));
        free(ids);
        prompts[i] = g->prompt_ids;
        n_prompts[i] = g->n_prompt;
        sps[i] = sampling_params_default();
        sps[i].temperature = 0.0f;
        sps[i].max_tokens = g->max_new_tokens;
    }

    int n_cfg = (int)(sizeof greedy_cfgs / sizeof greedy_cfgs[0]);
    int *passed = calloc((size_t)n, sizeof *passed);
    assert_non_null(passed);
    double t0 = now_ms();
    for (int c = 0; c < n_cfg; c++) {
        result res[PG_GOLDEN_MAX];
        memset(res, 0, sizeof res);
        engine_stats st;
        run_engine(f, &greedy_cfgs[c], prompts, n_prompts, sps, n, 1, res, &st);
        if (greedy_cfgs[c].expect_preemption)
            assert_true(st.preemptions > 0);
        for (int i = 0; i < n; i++) {
            pg_golden *g = &f->set.g[i];
            result *r = &res[i];
            /* the goldens leave out the stopping BOS (their README: run.c
             * breaks before emitting it); the engine keeps it as the last
             * token, as vLLM v1 does, so a "stop" golden is compared with
             * one more id, which must be its stop_token_id */
            int32_t want_n = g->n_completion + (g->stop ? 1 : 0);
            bool ids_ok = r->n == want_n &&
                          memcmp(r->ids, g->completion_ids,
                                 (size_t)g->n_completion * sizeof(int32_t)) == 0 &&
                          (!g->stop || r->ids[g->n_completion] == g->stop_token_id);
            bool text_ok = r->text_len == g->completion_text_len &&
                           memcmp(r->text, g->completion_text, r->text_len) == 0;
            /* stop: the eos id that stopped it; length: no stop id (-1) */
            bool finish_ok = r->finish == (g->stop ? FINISH_STOP : FINISH_LENGTH) &&
                             r->stop_token_id == g->stop_token_id;
            if (!(ids_ok && text_ok && finish_ok)) {
                int32_t first = 0;
                while (first < r->n && first < g->n_completion &&
                       r->ids[first] == g->completion_ids[first])
                    first++;
                printf("    [%s] golden %d MISMATCH: ids %s (got %d, want %d, first diff at %d), "
                       "text %s, finish %s (got %d stop id %d)\n",
                       greedy_cfgs[c].name, i, ids_ok ? "ok" : "differ", (int)r->n,
                       (int)g->n_completion, (int)first, text_ok ? "ok" : "differs",
                       finish_ok ? "ok" : "differs", (int)r->finish, (int)r->stop_token_id);
                if (!text_ok) {
                    size_t at = 0;
                    while (at < r->text_len && at < g->completion_text_len &&
                           r->text[at] == g->completion_text[at])
                        at++;
                    size_t from = at > 20 ? at - 20 : 0;
                    printf("      text: %zu bytes, want %zu; first diff at byte %zu: got \"%.40s\" "
                           "want \"%.40s\"\n",
                           r->text_len, g->completion_text_len, at, r->text + from,
                           g->completion_text + from);
                }
            } else {
                passed[i]++;
            }
        }
        results_free(res, n);
    }
    printf("    greedy: %d configurations in %.0f ms\n", n_cfg, now_ms() - t0);
    bool all = true;
    for (int i = 0; i < n; i++) {
        printf("    golden %d (%d prompt + %d completion tokens, %s): %d/%d configurations\n", i,
               (int)f->set.g[i].n_prompt, (int)f->set.g[i].n_completion,
               f->set.g[i].stop ? "stop" : "length", passed[i], n_cfg);
        all = all && passed[i] == n_cfg;
    }
    free(passed);
    assert_true(all);
}

/* n = 4 samples at temperature 1 with a seed. */
static void test_parallel_sampling(void **state)
{
    fixture *f = *state;
    enum { NS = 4, MAXT = 48 };
    const pg_golden *g = &f->set.g[4 < f->set.n_g ? 4 : 0];
    sampling_params sp = sampling_params_default();
    sp.n = NS;
    sp.temperature = 1.0f;
    sp.seed = 1234;
    sp.max_tokens = MAXT;
    const int32_t *prompts[1] = {g->prompt_ids};
    int32_t n_prompts[1] = {g->n_prompt};
    const run_cfg cfgs[] = {
        {"n=4, bs 16, 1 thread", 1, {16, 64, 16, 2048, true}, false},
        {"n=4 again, bs 16, 1 thread", 1, {16, 64, 16, 2048, true}, false},
        {"n=4, bs 4, no prefix, 2 threads", 2, {4, 128, 16, 2048, false}, false},
        {"n=4, bs 16, 24 blocks, 2 threads", 2, {16, 24, 16, 2048, true}, false},
    };
    result first[NS];
    memset(first, 0, sizeof first);
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        result res[NS];
        memset(res, 0, sizeof res);
        engine_stats st;
        run_engine(f, &cfgs[c], prompts, n_prompts, &sp, 1, NS, res, &st);
        if (c == 0) {
            /* four different samples */
            for (int a = 0; a < NS; a++)
                for (int b = a + 1; b < NS; b++)
                    assert_false(res[a].n == res[b].n &&
                                 memcmp(res[a].ids, res[b].ids,
                                        (size_t)res[a].n * sizeof(int32_t)) == 0);
            /* the prompt's blocks were shared: fewer blocks at peak than four
             * private copies of prompt + output would need */
            int32_t bs = cfgs[c].pool.block_size, private_blocks = 0;
            for (int s = 0; s < NS; s++)
                private_blocks += (g->n_prompt + res[s].n + bs - 1) / bs;
            printf("    n=4: peak blocks %d, private copies would need %d; cow %llu, prefix "
                   "hits %llu\n",
                   (int)st.blocks_in_use_peak, (int)private_blocks,
                   (unsigned long long)st.cow_copies, (unsigned long long)st.prefix_cache_hits);
            assert_true(st.blocks_in_use_peak < private_blocks);
            assert_true(st.cow_copies > 0 || st.prefix_cache_hits > 0);
            memcpy(first, res, sizeof res);
            for (int s = 0; s < NS; s++)
                printf("    sample %d: %d tokens, %s: \"%.60s...\"\n", s, (int)res[s].n,
                       res[s].finish == FINISH_STOP ? "stop" : "length", res[s].text);
            continue;
        }
        /* the same four samples on every run and in every configuration */
        for (int s = 0; s < NS; s++) {
            assert_int_equal(res[s].n, first[s].n);
            assert_memory_equal(res[s].ids, first[s].ids, (size_t)res[s].n * sizeof(int32_t));
            assert_int_equal(res[s].text_len, first[s].text_len);
            assert_memory_equal(res[s].text, first[s].text, res[s].text_len);
            assert_int_equal(res[s].finish, first[s].finish);
        }
        results_free(res, NS);
    }
    results_free(first, NS);
}

/* ---- prompt logprobs --------------------------------------------------------- */

/* prompt_logprobs through the engine equal a separate forward of each
 * prefix (log-softmax of the logits after token p, at token p + 1), with
 * rank and top k, in configurations that would otherwise skip or split
 * the prompt: a prefix-cache hit (the same prompt twice), a chunk budget,
 * and a pool small enough to preempt. */
static void test_prompt_logprobs(void **state)
{
    fixture *f = *state;
    /* a golden with a prompt of more than one block of 16 (a prefix-cache hit
     * is possible) */
    const pg_golden *g = &f->set.g[0];
    for (int i = 0; i < f->set.n_g; i++)
        if (f->set.g[i].n_prompt > 16 && f->set.g[i].n_prompt < 64) g = &f->set.g[i];
    assert_true(g->n_prompt > 16);
    const int32_t V = f->set.cfg.vocab_size, n = g->n_prompt;
    /* the reference: one forward per prefix */
    model_params mp0 = {.num_kv_blocks = 64, .block_size = 16, .max_num_batched_tokens = 512, .max_num_seqs = 4};
    rig r0;
    rig_open(&r0, f, 1, &mp0);
    float *row = malloc((size_t)V * sizeof(float));
    double *ref = calloc((size_t)n, sizeof(double));
    int32_t *ref_top = calloc((size_t)n, sizeof(int32_t));
    assert_true(row && ref && ref_top);
    for (int32_t p = 0; p + 1 < n; p++) {
        pg_golden_run_prompt(r0.m, g->prompt_ids, p + 1, p + 1, 16, row);
        double mx = -INFINITY, sum = 0;
        int32_t am = 0;
        for (int32_t v = 0; v < V; v++) {
            if ((double)row[v] > mx) mx = (double)row[v];
            if (row[v] > row[am]) am = v;
        }
        for (int32_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        ref[p + 1] = (double)row[g->prompt_ids[p + 1]] - (mx + log(sum));
        ref_top[p + 1] = am;
    }
    rig_close(&r0);
    const run_cfg cfgs[] = {
        {"prefix caching, bs 16", 1, {16, 64, 4, 2048, true}, false},
        {"budget 3, bs 4", 2, {4, 64, 4, 3, true}, false},
        {"tiny pool, bs 4", 1, {4, 20, 4, 2048, true}, false},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        model_params mp = pg_golden_model_params(&cfgs[c].pool);
        rig r;
        rig_open(&r, f, cfgs[c].threads, &mp);
        engine_params ep = pg_golden_engine_params(&f->set, &cfgs[c].pool);
        engine_backend be = model_backend(r.m);
        engine *e = NULL;
        pg_error err;
        assert_int_equal(engine_create(&e, &ep, &be, f->tok, &err), 0);
        sampling_params sp = sampling_params_default();
        sp.temperature = 0.0f;
        sp.max_tokens = 24;
        sp.ignore_eos = true;
        sp.prompt_logprobs = 2;
        sampling_params plain = sp;
        plain.prompt_logprobs = -1;
        uint64_t id;
        /* a plain request first fills the prefix cache; then two with prompt logprobs */
        assert_int_equal(engine_add_request(e, g->prompt_ids, n, &plain, (void *)0, &id, &err), 0);
        assert_int_equal(engine_add_request(e, g->prompt_ids, n, &sp, (void *)1, &id, &err), 0);
        assert_int_equal(engine_add_request(e, g->prompt_ids, n, &sp, (void *)2, &id, &err), 0);
        int got = 0;
        while (engine_has_unfinished(e)) {
            if (engine_step(e, &err)) fail_msg("%s", err.msg);
            request_output *o;
            while (engine_pop_finished(e, &o)) {
                if (o->user == (void *)0) {
                    assert_null(o->prompt_logprobs);
                } else {
                    assert_non_null(o->prompt_logprobs);
                    assert_true(isnan(o->prompt_logprobs[0]));
                    assert_int_equal(o->n_prompt_top, 2);
                    for (int32_t p = 1; p < n; p++) {
                        double d = fabs((double)o->prompt_logprobs[p] - ref[p]);
                        if (d > 1e-5)
                            fail_msg("[%s] prompt token %d: logprob %.7g, separate forward %.7g", cfgs[c].name,
                                     (int)p, (double)o->prompt_logprobs[p], ref[p]);
                        assert_int_equal(o->prompt_top_ids[p * 2], ref_top[p]);
                        assert_true(o->prompt_ranks[p] >= 1);
                        assert_true((o->prompt_ranks[p] == 1) == (g->prompt_ids[p] == ref_top[p]) ||
                                    o->prompt_top_logprobs[p * 2] == o->prompt_logprobs[p]);
                    }
                    got++;
                }
                request_output_free(o);
            }
        }
        engine_stats st;
        engine_get_stats(e, &st);
        printf("    prompt logprobs [%s]: %d prompt tokens, steps %llu, preemptions %llu, prefix hits %llu\n",
               cfgs[c].name, (int)n, (unsigned long long)st.steps, (unsigned long long)st.preemptions,
               (unsigned long long)st.prefix_cache_hits);
        if (c == 2)
            assert_true(st.preemptions > 0);
        assert_int_equal(got, 2);
        engine_destroy(e);
        rig_close(&r);
    }
    free(row);
    free(ref);
    free(ref_top);
}

/* ---- prompt logprobs: the prefill pass vs one row a step ------------------ */

/* What one request's prompt logprobs are, byte for byte. */
typedef struct plp_bytes {
    float *lp, *top_lp;
    int32_t *rank, *top_ids;
} plp_bytes;

/* Runs the three requests (a plain one that grows while the others prefill,
 * a long prompt with prompt logprobs 3, a second prompt with prompt
 * logprobs 0 from token 41 on and max_tokens 1) on
 * a fresh engine of `pool` and keeps the prompt logprobs of the two. */
static uint64_t run_plp(fixture *f, const run_cfg *c, bool per_step, const int32_t *ids, int32_t n,
                        int32_t n2, plp_bytes out[2])
{
    model_params mp = pg_golden_model_params(&c->pool);
    rig r;
    rig_open(&r, f, c->threads, &mp);
    engine_params ep = pg_golden_engine_params(&f->set, &c->pool);
    ep.prompt_logprobs_per_step = per_step;
    engine_backend be = model_backend(r.m);
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, f->tok, &err), 0);
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 8;
    sp.ignore_eos = true;
    sp.prompt_logprobs = 3;
    sampling_params plain = sp, sp2 = sp;
    plain.prompt_logprobs = -1;
    plain.max_tokens = 40;
    sp2.prompt_logprobs = 0;
    sp2.prompt_logprobs_from = 41; /* rows 0..39 not computed (perplexity's first half) */
    sp2.max_tokens = 1;
    uint64_t id;
    assert_int_equal(engine_add_request(e, ids + 5, 20, &plain, (void *)2, &id, &err), 0);
    assert_int_equal(engine_add_request(e, ids, n, &sp, (void *)0, &id, &err), 0);
    assert_int_equal(engine_add_request(e, ids + 7, n2, &sp2, (void *)1, &id, &err), 0);
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err)) fail_msg("[%s] %s", c->name, err.msg);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            intptr_t k = (intptr_t)o->user;
            if (k < 2) {
                size_t np = (size_t)o->n_prompt_tokens, nt = np * (size_t)(o->n_prompt_top > 0 ? o->n_prompt_top : 1);
                out[k].lp = malloc(np * sizeof(float));
                out[k].rank = malloc(np * sizeof(int32_t));
                out[k].top_ids = malloc(nt * sizeof(int32_t));
                out[k].top_lp = malloc(nt * sizeof(float));
                assert_true(out[k].lp && out[k].rank && out[k].top_ids && out[k].top_lp);
                memcpy(out[k].lp, o->prompt_logprobs, np * sizeof(float));
                memcpy(out[k].rank, o->prompt_ranks, np * sizeof(int32_t));
                memcpy(out[k].top_ids, o->prompt_top_ids, nt * sizeof(int32_t));
                memcpy(out[k].top_lp, o->prompt_top_logprobs, nt * sizeof(float));
            }
            request_output_free(o);
        }
    }
    engine_stats st;
    engine_get_stats(e, &st);
    printf("    [%s, %s]: steps %llu, preemptions %llu\n", c->name, per_step ? "one row a step" : "chunks",
           (unsigned long long)st.steps, (unsigned long long)st.preemptions);
    if (c->expect_preemption && !per_step) /* (one row a step never needs the pool at once) */
        assert_true(st.preemptions > 0);
    engine_destroy(e);
    rig_close(&r);
    return st.steps;
}

static void plp_free(plp_bytes p[2])
{
    for (int k = 0; k < 2; k++) {
        free(p[k].lp);
        free(p[k].rank);
        free(p[k].top_ids);
        free(p[k].top_lp);
    }
}

/* Prompt logprobs computed in the prefill pass (chunks; every row of a
 * chunk through forward_rows, lm_head in slices of 128 rows) are the bytes
 * of the one-row-a-step path, whatever the chunk size, the batch around
 * them, the pool (preemption and recomputation), the threads and the block
 * size; and the prefill path takes far fewer steps. A 300-token prompt
 * crosses slices (128 rows) and runs of rows broken by other sequences. */
static void test_prompt_logprobs_prefill_pass(void **state)
{
    fixture *f = *state;
    enum { N = 300, N2 = 150 };
    int32_t ids[N + 8];
    /* the golden prompts' tokens one after another (BOS first): real text */
    int32_t k = 0;
    for (int gi = 0; k < N + 8; gi = (gi + 1) % f->set.n_g)
        for (int32_t j = gi == 0 && k == 0 ? 0 : 1; j < f->set.g[gi].n_prompt && k < N + 8; j++)
            ids[k++] = f->set.g[gi].prompt_ids[j];
    const run_cfg ref_cfg = {"reference, bs 16", 1, {16, 128, 8, 2048, true}, false};
    plp_bytes ref[2] = {{0}};
    uint64_t ref_steps = run_plp(f, &ref_cfg, true, ids, N, N2, ref);
    const run_cfg cfgs[] = {
        {"one chunk, bs 16", 1, {16, 128, 8, 2048, true}, false},
        {"budget 7, bs 4", 2, {4, 256, 8, 7, true}, false},
        {"budget 130, 2 threads, bs 8", 2, {8, 256, 2, 130, false}, false},
        {"tiny pool, bs 4", 1, {4, 81, 4, 32, true}, true},
        {"one seq a step, bs 32", 1, {32, 64, 1, 512, true}, false},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        for (int per_step = 0; per_step < 2; per_step++) {
            if (per_step && c != 3) continue; /* the old path preempted too */
            plp_bytes got[2] = {{0}};
            uint64_t steps = run_plp(f, &cfgs[c], per_step, ids, N, N2, got);
            if (c == 0 && !per_step) assert_true(steps * 4 < ref_steps);
            const int32_t np[2] = {N, N2}, nt[2] = {3, 1};
            for (int q = 0; q < 2; q++) {
                for (int32_t p = 0; p < np[q]; p++) {
                    uint32_t a, b;
                    memcpy(&a, &got[q].lp[p], 4);
                    memcpy(&b, &ref[q].lp[p], 4);
                    if (a != b)
                        fail_msg("[%s] request %d prompt token %d: logprob %.9g (0x%08x), one row a step "
                                 "%.9g (0x%08x)", cfgs[c].name, q, (int)p, (double)got[q].lp[p], a,
                                 (double)ref[q].lp[p], b);
                }
                assert_memory_equal(got[q].rank, ref[q].rank, (size_t)np[q] * sizeof(int32_t));
                assert_memory_equal(got[q].top_ids, ref[q].top_ids, (size_t)(np[q] * nt[q]) * sizeof(int32_t));
                assert_memory_equal(got[q].top_lp, ref[q].top_lp, (size_t)(np[q] * nt[q]) * sizeof(float));
            }
            plp_free(got);
        }
    }
    plp_free(ref);
}

/* A request that asks prompt logprobs from token F on reads prefix-cache
 * hits on blocks wholly before position F - 1 (their rows are not needed),
 * and its values are the bytes of the one-row-a-step path, which reads no
 * hit, and of the prefill pass with caching off. */
static void test_prompt_logprobs_prefix_hits(void **state)
{
    fixture *f = *state;
    enum { N = 250, F = 150 };
    int32_t ids[N];
    int32_t k = 0;
    for (int gi = 0; k < N; gi = (gi + 1) % f->set.n_g)
        for (int32_t j = gi == 0 && k == 0 ? 0 : 1; j < f->set.g[gi].n_prompt && k < N; j++)
            ids[k++] = f->set.g[gi].prompt_ids[j];
    float got[3][N];
    int32_t top[3][N * 2];
    uint64_t hits[3];
    for (int c = 0; c < 3; c++) { /* 0: chunks + cache, 1: chunks, no cache, 2: one row a step */
        pg_golden_pool pool = {16, 128, 8, 2048, c != 1};
        model_params mp = pg_golden_model_params(&pool);
        rig r;
        rig_open(&r, f, 1, &mp);
        engine_params ep = pg_golden_engine_params(&f->set, &pool);
        ep.prompt_logprobs_per_step = c == 2;
        engine_backend be = model_backend(r.m);
        engine *e = NULL;
        pg_error err;
        assert_int_equal(engine_create(&e, &ep, &be, f->tok, &err), 0);
        sampling_params plain = sampling_params_default(), sp;
        plain.temperature = 0.0f;
        plain.max_tokens = 1;
        sp = plain;
        sp.prompt_logprobs = 2;
        sp.prompt_logprobs_from = F;
        uint64_t id;
        /* the context first (cached), then the request that scores past it */
        assert_int_equal(engine_add_request(e, ids, 200, &plain, (void *)0, &id, &err), 0);
        while (engine_has_unfinished(e)) {
            if (engine_step(e, &err)) fail_msg("%s", err.msg);
            request_output *o;
            while (engine_pop_finished(e, &o)) request_output_free(o);
        }
        assert_int_equal(engine_add_request(e, ids, N, &sp, (void *)1, &id, &err), 0);
        while (engine_has_unfinished(e)) {
            if (engine_step(e, &err)) fail_msg("%s", err.msg);
            request_output *o;
            while (engine_pop_finished(e, &o)) {
                memcpy(got[c], o->prompt_logprobs, sizeof got[c]);
                memcpy(top[c], o->prompt_top_ids, sizeof top[c]);
                request_output_free(o);
            }
        }
        engine_stats st;
        engine_get_stats(e, &st);
        hits[c] = st.prefix_cache_hits;
        printf("    prompt logprobs from %d [%s]: prefix hits %llu\n", (int)F,
               c == 0 ? "chunks, cache" : c == 1 ? "chunks, no cache" : "one row a step",
               (unsigned long long)hits[c]);
        engine_destroy(e);
        rig_close(&r);
    }
    assert_int_equal(hits[0], (F - 1) / 16); /* the blocks wholly before position F - 1 */
    assert_int_equal(hits[2], 0);
    for (int c = 1; c < 3; c++) {
        assert_memory_equal(got[0], got[c], sizeof got[0]);
        assert_memory_equal(top[0], top[c], sizeof top[0]);
    }
    for (int32_t p = 0; p < N; p++)
        assert_true(p < F ? isnan(got[0][p]) : !isnan(got[0][p]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_goldens),
        cmocka_unit_test(test_greedy_goldens),
        cmocka_unit_test(test_parallel_sampling),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_prompt_logprobs_prefill_pass),
        cmocka_unit_test(test_prompt_logprobs_prefix_hits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
