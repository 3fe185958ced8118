/* End to end on stories260K (../shared/models/stories260K) against the
 * goldens made by upstream llama2.c run.c (../shared/goldens/stories260K-*):
 *
 *  - logits after each logits-golden prompt (model_forward on a prefill
 *    step_batch) within 1e-4 of max |logit|, and bit-identical when the same
 *    prompt is fed one token per step;
 *  - greedy completions through the engine equal completion_token_ids, the
 *    finish reason and completion_text exactly; the prompt ids equal
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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "config.h"
#include "cpu_executor.h"
#include "engine.h"
#include "json.h"
#include "model.h"
#include "safetensors.h"
#include "test_support.h"
#include "tokenizer.h"

#define MAX_GOLDENS 16

typedef struct golden {
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int32_t n_prompt;
    int32_t *completion_ids;
    int32_t n_completion;
    char *completion_text;
    size_t completion_text_len;
    int32_t max_new_tokens;
    bool stop;               /* finish_reason "stop" (else "length") */
    int32_t stop_token_id;   /* -1 for length */
} golden;

typedef struct logits_golden {
    int32_t *prompt_ids;
    int32_t n_prompt;
    int32_t argmax;
    float *logits;           /* [V] */
    int32_t n_logits;
} logits_golden;

typedef struct fixture {
    llama_config cfg;
    st_file *st;
    tokenizer *tok;
    golden g[MAX_GOLDENS];
    int n_g;
    logits_golden lg[MAX_GOLDENS];
    int n_lg;
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

/* ---- reading the goldens -------------------------------------------------- */

static void get_ids(const json_doc *d, int obj, const char *key, int32_t **out, int32_t *n)
{
    pg_error err;
    int a = json_obj_get(d, obj, key);
    assert_true(a >= 0 && json_is_array(d, a));
    *n = json_size(d, a);
    *out = malloc(((size_t)*n + 1) * sizeof **out);
    assert_non_null(*out);
    int i = a + 1;
    for (int k = 0; k < *n; k++, i = json_skip(d, i)) {
        int64_t v;
        assert_int_equal(json_get_int(d, i, 0, INT32_MAX, &v, &err), 0);
        (*out)[k] = (int32_t)v;
    }
}

static int64_t get_int(const json_doc *d, int obj, const char *key)
{
    pg_error err;
    int64_t v;
    int i = json_obj_get(d, obj, key);
    assert_true(i >= 0);
    assert_int_equal(json_get_int(d, i, INT64_MIN, INT64_MAX, &v, &err), 0);
    return v;
}

static char *get_str(const json_doc *d, int obj, const char *key, size_t *len)
{
    pg_error err;
    char *s = NULL;
    int i = json_obj_get(d, obj, key);
    assert_true(i >= 0);
    assert_int_equal(json_get_string(d, i, &s, len, &err), 0);
    return s;
}

/* Calls fn(fixture, doc) for every non-empty line of a JSONL file. */
static void for_each_line(fixture *f, const char *rel, void (*fn)(fixture *, const json_doc *))
{
    size_t len;
    char *text = pg_test_read_file(pg_test_shared_path(rel), &len);
    assert_non_null(text);
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        if (ll > 0) {
            json_doc d;
            pg_error err;
            assert_int_equal(json_parse(&d, line, ll, rel, &err), 0);
            fn(f, &d);
            json_doc_free(&d);
        }
        line += ll + 1;
    }
    free(text);
}

static void add_greedy(fixture *f, const json_doc *d)
{
    assert_true(f->n_g < MAX_GOLDENS);
    golden *g = &f->g[f->n_g++];
    g->prompt = get_str(d, 0, "prompt", &g->prompt_len);
    get_ids(d, 0, "prompt_token_ids", &g->prompt_ids, &g->n_prompt);
    get_ids(d, 0, "completion_token_ids", &g->completion_ids, &g->n_completion);
    g->completion_text = get_str(d, 0, "completion_text", &g->completion_text_len);
    g->max_new_tokens = (int32_t)get_int(d, 0, "max_new_tokens");
    size_t fl;
    char *fr = get_str(d, 0, "finish_reason", &fl);
    g->stop = strcmp(fr, "stop") == 0;
    assert_true(g->stop || strcmp(fr, "length") == 0);
    free(fr);
    int st = json_obj_get(d, 0, "stop_token_id");
    g->stop_token_id = json_is_null(d, st) ? -1 : (int32_t)get_int(d, 0, "stop_token_id");
}

static void add_logits(fixture *f, const json_doc *d)
{
    assert_true(f->n_lg < MAX_GOLDENS);
    logits_golden *g = &f->lg[f->n_lg++];
    get_ids(d, 0, "prompt_token_ids", &g->prompt_ids, &g->n_prompt);
    g->argmax = (int32_t)get_int(d, 0, "argmax");
    int a = json_obj_get(d, 0, "logits");
    assert_true(a >= 0 && json_is_array(d, a));
    g->n_logits = json_size(d, a);
    g->logits = malloc((size_t)g->n_logits * sizeof(float));
    assert_non_null(g->logits);
    int i = a + 1;
    for (int k = 0; k < g->n_logits; k++, i = json_skip(d, i)) {
        double v;
        pg_error err;
        assert_int_equal(json_get_double(d, i, &v, &err), 0);
        g->logits[k] = (float)v;
    }
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    pg_error err;
    const char *dir = pg_test_shared_path("models/stories260K");
    char model_dir[4096];
    snprintf(model_dir, sizeof model_dir, "%s", dir);
    if (llama_config_load(&f->cfg, model_dir, &err) || st_open(&f->st, model_dir, &err) ||
        tok_load(&f->tok, model_dir, &err)) {
        fprintf(stderr, "loading %s: %s\n", model_dir, err.msg);
        return -1;
    }
    for_each_line(f, "goldens/stories260K-greedy.jsonl", add_greedy);
    for_each_line(f, "goldens/stories260K-logits.jsonl", add_logits);
    assert_true(f->n_g >= 8 && f->n_lg >= 4);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < f->n_g; i++) {
        free(f->g[i].prompt);
        free(f->g[i].prompt_ids);
        free(f->g[i].completion_ids);
        free(f->g[i].completion_text);
    }
    for (int i = 0; i < f->n_lg; i++) {
        free(f->lg[i].prompt_ids);
        free(f->lg[i].logits);
    }
    tok_free(f->tok);
    st_close(f->st);
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
    rc = model_create(&r->m, r->ex, &f->cfg, f->st, mp, &err);
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

/* Runs ids[0..n) as one prefill (chunk = n) or one token per step (chunk = 1)
 * on blocks 0, 1, 2, ... and returns the logits after the last token. */
static void run_prompt(model *m, const int32_t *ids, int32_t n, int32_t chunk, int32_t bs,
                       float *logits)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots);
    int32_t *bt = malloc(((size_t)n / (size_t)bs + 1) * sizeof *bt);
    assert_true(pos && slots && bt);
    for (int32_t i = 0; i < n; i++)
        pos[i] = slots[i] = i;
    for (int32_t i = 0; i <= n / bs; i++)
        bt[i] = i;
    for (int32_t start = 0; start < n; start += chunk) {
        int32_t q = n - start < chunk ? n - start : chunk;
        int32_t qs[2] = {0, q}, len = start + q, row = q - 1;
        step_batch b = {.num_tokens = q, .num_seqs = 1, .block_size = bs,
                        .token_ids = ids + start, .positions = pos + start,
                        .slots = slots + start, .query_start = qs, .seq_lens = &len,
                        .block_tables = bt, .block_table_stride = n / bs + 1,
                        .max_seq_len = len, .max_query_len = q, .num_logits = 1,
                        .logits_rows = &row};
        pg_error err;
        int rc = model_forward(m, &b, logits, &err);
        if (rc)
            fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
    }
    free(pos);
    free(slots);
    free(bt);
}

static void test_logits_goldens(void **state)
{
    fixture *f = *state;
    const int32_t V = f->cfg.vocab_size, bs = 16;
    model_params mp = {.num_kv_blocks = 32, .block_size = bs, .max_num_batched_tokens = 512,
                       .max_num_seqs = 4};
    rig r;
    rig_open(&r, f, 2, &mp);
    float *prefill = malloc((size_t)V * sizeof(float)), *inc = malloc((size_t)V * sizeof(float));
    assert_true(prefill && inc);
    double worst_rel = 0;
    for (int k = 0; k < f->n_lg; k++) {
        logits_golden *g = &f->lg[k];
        assert_int_equal(g->n_logits, V);
        double t0 = now_ms();
        run_prompt(r.m, g->prompt_ids, g->n_prompt, g->n_prompt, bs, prefill);
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
        run_prompt(r.m, g->prompt_ids, g->n_prompt, 1, bs, inc);
        assert_memory_equal(prefill, inc, (size_t)V * sizeof(float));
        /* and in uneven chunks of 7 */
        run_prompt(r.m, g->prompt_ids, g->n_prompt, 7, bs, inc);
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
    int32_t block_size, num_blocks, max_num_seqs, max_num_batched_tokens;
    bool prefix_caching;
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
    model_params mp = {.num_kv_blocks = c->num_blocks, .block_size = c->block_size,
                       .max_num_batched_tokens = c->max_num_batched_tokens,
                       .max_num_seqs = c->max_num_seqs};
    rig r;
    rig_open(&r, f, c->threads, &mp);
    engine_params ep = engine_params_default();
    ep.block_size = c->block_size;
    ep.num_blocks = c->num_blocks;
    ep.max_num_seqs = c->max_num_seqs;
    ep.max_num_batched_tokens = c->max_num_batched_tokens;
    ep.max_model_len = f->cfg.max_position_embeddings;
    ep.prefix_caching = c->prefix_caching;
    ep.check_invariants = true;
    ep.eos_token_ids = f->cfg.eos_token_ids;
    ep.n_eos_token_ids = f->cfg.n_eos_token_ids;
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
    /* name                               thr  bs  blocks seqs batched prefix preempt */
    {"batch, bs 16, 1 thread", 1, 16, 256, 256, 2048, true, false},
    {"batch, bs 1, 2 threads, chunked", 2, 1, 4096, 256, 64, true, false},
    {"one by one, bs 32, 2 threads", 2, 32, 64, 1, 2048, false, false},
    {"one by one, bs 16, no prefix", 1, 16, 32, 1, 2048, false, false},
    {"tiny pool, bs 16, 1 thread", 1, 16, 24, 256, 2048, true, true},
    {"small pool, bs 16, no prefix, 1 thr", 1, 16, 40, 256, 64, false, true},
    {"tiny pool, bs 1, 2 threads", 2, 1, 300, 256, 2048, false, true},
    {"tiny pool, bs 32, prefix, 2 thr", 2, 32, 12, 256, 2048, true, true},
};

static void test_greedy_goldens(void **state)
{
    fixture *f = *state;
    int n = f->n_g;
    const int32_t *prompts[MAX_GOLDENS];
    int32_t n_prompts[MAX_GOLDENS];
    sampling_params sps[MAX_GOLDENS];

    /* the prompts' ids are the tokenizer's */
    for (int i = 0; i < n; i++) {
        golden *g = &f->g[i];
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
        result res[MAX_GOLDENS];
        memset(res, 0, sizeof res);
        engine_stats st;
        run_engine(f, &greedy_cfgs[c], prompts, n_prompts, sps, n, 1, res, &st);
        if (greedy_cfgs[c].expect_preemption)
            assert_true(st.preemptions > 0);
        for (int i = 0; i < n; i++) {
            golden *g = &f->g[i];
            result *r = &res[i];
            bool ids_ok = r->n == g->n_completion &&
                          memcmp(r->ids, g->completion_ids,
                                 (size_t)r->n * sizeof(int32_t)) == 0;
            bool text_ok = r->text_len == g->completion_text_len &&
                           memcmp(r->text, g->completion_text, r->text_len) == 0;
            bool finish_ok = g->stop ? (r->finish == FINISH_STOP && r->stop_token_id == 1)
                                     : r->finish == FINISH_LENGTH;
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
               (int)f->g[i].n_prompt, (int)f->g[i].n_completion,
               f->g[i].stop ? "stop" : "length", passed[i], n_cfg);
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
    const golden *g = &f->g[4 < f->n_g ? 4 : 0];
    sampling_params sp = sampling_params_default();
    sp.n = NS;
    sp.temperature = 1.0f;
    sp.seed = 1234;
    sp.max_tokens = MAXT;
    const int32_t *prompts[1] = {g->prompt_ids};
    int32_t n_prompts[1] = {g->n_prompt};
    const run_cfg cfgs[] = {
        {"n=4, bs 16, 1 thread", 1, 16, 64, 16, 2048, true, false},
        {"n=4 again, bs 16, 1 thread", 1, 16, 64, 16, 2048, true, false},
        {"n=4, bs 4, no prefix, 2 threads", 2, 4, 128, 16, 2048, false, false},
        {"n=4, bs 16, 24 blocks, 2 threads", 2, 16, 24, 16, 2048, true, false},
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
            int32_t bs = cfgs[c].block_size, private_blocks = 0;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_goldens),
        cmocka_unit_test(test_greedy_goldens),
        cmocka_unit_test(test_parallel_sampling),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
