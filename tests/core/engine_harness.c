/* engine_harness: workloads and runs over the fake backend (see engine_harness.h). */
#include "engine_harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_pool.h"

static const int32_t harness_eos[1] = {1};

void workload_make(workload *w, const wl_shape *sh, uint64_t seed)
{
    pg_test_rng rng = {.s = seed};
    w->n = sh->n_requests;
    w->max_model_len = sh->max_model_len;
    w->reqs = calloc((size_t)w->n, sizeof *w->reqs);
    assert_non_null(w->reqs);
    /* a few shared prefixes so that prefix caching has something to find */
    int32_t prefixes[4][64];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 64; i++) prefixes[k][i] = pg_test_rng_int(&rng, 2, HARNESS_VOCAB - 1);
    for (int32_t i = 0; i < w->n; i++) {
        wl_req *r = &w->reqs[i];
        int32_t np = pg_test_rng_int(&rng, sh->prompt_min, sh->prompt_max);
        r->prompt = malloc((size_t)np * sizeof *r->prompt);
        assert_non_null(r->prompt);
        int k = pg_test_rng_int(&rng, 0, 5);
        int32_t shared = k < 4 ? pg_test_rng_int(&rng, 0, np < 64 ? np : 64) : 0;
        for (int32_t j = 0; j < np; j++)
            r->prompt[j] = j < shared ? prefixes[k][j] : pg_test_rng_int(&rng, 0, HARNESS_VOCAB - 1);
        r->n_prompt = np;
        sampling_params sp = sampling_params_default();
        sp.n = sh->max_n > 1 && pg_test_rng_int(&rng, 0, 3) == 0 ? pg_test_rng_int(&rng, 2, sh->max_n) : 1;
        sp.max_tokens = pg_test_rng_int(&rng, sh->out_min, sh->out_max);
        if (pg_test_rng_int(&rng, 0, 9) == 0) sp.max_tokens = -1;
        sp.temperature = pg_test_rng_int(&rng, 0, 2) == 0 ? 0.0f : 0.9f;
        sp.top_p = pg_test_rng_int(&rng, 0, 1) ? 1.0f : 0.9f;
        sp.seed = 1000 + (uint64_t)i;
        sp.ignore_eos = sh->ignore_eos_always || pg_test_rng_int(&rng, 0, 4) == 0;
        if (sp.max_tokens > 2 && pg_test_rng_int(&rng, 0, 4) == 0) sp.min_tokens = 2;
        if (pg_test_rng_int(&rng, 0, 3) == 0) {
            r->stop_ids[0] = pg_test_rng_int(&rng, 2, HARNESS_VOCAB - 1);
            sp.stop_token_ids = r->stop_ids;
            sp.n_stop_token_ids = 1;
        }
        if (pg_test_rng_int(&rng, 0, 4) == 0) sp.logprobs = pg_test_rng_int(&rng, 0, 3);
        if (pg_test_rng_int(&rng, 0, 5) == 0) sp.repetition_penalty = 1.2f;
        r->sp = sp;
        r->arrive_step = sh->arrival_span > 0 ? pg_test_rng_int(&rng, 0, sh->arrival_span) : 0;
    }
    /* arrival steps non-decreasing in request order */
    for (int32_t i = 1; i < w->n; i++)
        if (w->reqs[i].arrive_step < w->reqs[i - 1].arrive_step)
            w->reqs[i].arrive_step = w->reqs[i - 1].arrive_step;
}

void workload_free(workload *w)
{
    for (int32_t i = 0; i < w->n; i++) free(w->reqs[i].prompt);
    free(w->reqs);
    w->reqs = NULL;
}

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

int32_t workload_min_blocks(const workload *w, int32_t bs, int32_t n_max_override)
{
    int32_t best = 1;
    for (int32_t i = 0; i < w->n; i++) {
        const wl_req *r = &w->reqs[i];
        int32_t out = w->max_model_len - r->n_prompt;
        if (r->sp.max_tokens >= 0 && r->sp.max_tokens < out) out = r->sp.max_tokens;
        int32_t n = n_max_override > 0 ? n_max_override : r->sp.n;
        int32_t total = cdiv(r->n_prompt + out, bs), need;
        if (n == 1) {
            need = total;
        } else {
            int32_t shared = r->n_prompt / bs;
            need = shared + n * (total - shared);
        }
        if (need > best) best = need;
    }
    return best;
}

/* ---- signatures ---------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (b->s && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        b->s = realloc(b->s, cap);
        assert_non_null(b->s);
        b->cap = cap;
    }
}

static char *signature(const request_output *o)
{
    sbuf b = {0};
    sb_printf(&b, "prompt %d\n", (int)o->n_prompt_tokens);
    for (int32_t k = 0; k < o->n_outputs; k++) {
        const seq_output *so = &o->outputs[k];
        sb_printf(&b, "[%d] finish %d stop %d n %d:", (int)so->index, (int)so->finish,
                  (int)so->stop_token_id, (int)so->n_tokens);
        for (int32_t t = 0; t < so->n_tokens; t++) sb_printf(&b, " %d", (int)so->token_ids[t]);
        if (so->token_logprobs) {
            sb_printf(&b, " | lp");
            for (int32_t t = 0; t < so->n_tokens; t++) {
                sb_printf(&b, " %a", (double)so->token_logprobs[t]);
                for (int32_t j = 0; j < so->n_top; j++)
                    sb_printf(&b, " %d:%a", (int)so->top_ids[(size_t)t * (size_t)so->n_top + (size_t)j],
                              (double)so->top_logprobs[(size_t)t * (size_t)so->n_top + (size_t)j]);
            }
        }
        if (so->has_cumulative_logprob) sb_printf(&b, " | cum %a", so->cumulative_logprob);
        if (so->text) sb_printf(&b, " | text %s", so->text);
        sb_printf(&b, "\n");
    }
    return b.s;
}

/* ---- FCFS observation ------------------------------------------------------ */

typedef struct fcfs_obs {
    bool *seen;                 /* [n] appeared in some earlier step */
    bool *in_step;              /* [n] appears in this step */
    int32_t n;
} fcfs_obs;

static void on_step(void *user, const uint64_t *seq_ids, const int32_t *qstart,
                    const int32_t *positions, int32_t num_seqs)
{
    (void)qstart;
    (void)positions;
    fcfs_obs *o = user;
    for (int32_t s = 0; s < num_seqs; s++) {
        uint64_t rid = seq_ids[s] >> 8;
        if ((int64_t)rid < o->n) o->in_step[rid] = true;
    }
}

void run_workload(const workload *w, const run_cfg *c, run_result *out)
{
    memset(out, 0, sizeof *out);
    int32_t nb = c->num_blocks;
    if (nb == 0) {
        int32_t per = c->layout == KV_LAYOUT_CONTIGUOUS
                          ? cdiv(w->max_model_len, c->block_size) * 4
                          : workload_min_blocks(w, c->block_size, 0);
        nb = per * (w->n < 2000 ? w->n : 2000);
    }
    fake_backend_params fp = {.vocab_size = HARNESS_VOCAB, .num_blocks = nb,
                              .block_size = c->block_size, .window = 4, .salt = 77,
                              .attn_window = c->attn_window, .follow_tokens = c->follow_tokens};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    engine_params ep = engine_params_default();
    ep.block_size = c->block_size;
    ep.num_blocks = nb;
    ep.max_num_seqs = c->max_num_seqs;
    ep.max_num_batched_tokens = c->max_num_batched_tokens;
    ep.max_model_len = w->max_model_len;
    ep.prefix_caching = c->prefix_caching;
    ep.layout = c->layout;
    if (c->watermark != 0.0f) ep.watermark = c->watermark < 0.0f ? 0.0f : c->watermark;
    ep.check_invariants = true;
    ep.fan_out_always = c->fan_out_always;
    ep.sliding_window = c->sliding_window;
    ep.eos_token_ids = harness_eos;
    ep.n_eos_token_ids = 1;
    engine_backend be = fake_backend_iface(f);
    engine *e = NULL;
    pg_error err = {{0}};
    int rc = engine_create(&e, &ep, &be, NULL, &err);
    if (rc) fail_msg("engine_create: %s", err.msg);
    fake_backend_attach(f, e);
    fcfs_obs obs = {.seen = calloc((size_t)w->n, 1), .in_step = calloc((size_t)w->n, 1), .n = w->n};
    assert_non_null(obs.seen);
    assert_non_null(obs.in_step);
    fake_backend_on_step(f, on_step, &obs);
    out->sig = calloc((size_t)w->n, sizeof *out->sig);
    assert_non_null(out->sig);
    int32_t next = 0, n_done = 0;
    uint64_t waiting[4];
    for (int64_t step = 0; next < w->n || engine_has_unfinished(e); step++) {
        while (next < w->n && (!c->staggered || w->reqs[next].arrive_step <= step)) {
            uint64_t id;
            rc = engine_add_request(e, w->reqs[next].prompt, w->reqs[next].n_prompt,
                                    &w->reqs[next].sp, (void *)(intptr_t)next, &id, &err);
            if (rc) fail_msg("request %d: %s", (int)next, err.msg);
            assert_int_equal(id, (uint64_t)next);
            fake_backend_set_prompt(f, id, w->reqs[next].prompt, w->reqs[next].n_prompt);
            next++;
        }
        int32_t n_wait = engine_waiting_ids(e, waiting, 4);
        memset(obs.in_step, 0, (size_t)w->n);
        rc = engine_step(e, &err);
        if (rc) fail_msg("step %lld: %s (fake: %s)", (long long)step, err.msg,
                         fake_backend_error(f) ? fake_backend_error(f) : "ok");
        /* FCFS: a request first runs only after every earlier one has run;
         * a preempted request at the front of the queue goes before any
         * request that has never run */
        int32_t lowest_unseen = 0;
        while (lowest_unseen < next && obs.seen[lowest_unseen]) lowest_unseen++;
        for (int32_t i = 0; i < next; i++) {
            if (!obs.in_step[i] || obs.seen[i]) continue;
            for (int32_t j = lowest_unseen; j < i; j++)
                if (!obs.seen[j] && !obs.in_step[j]) out->fcfs_violations++;
            if (n_wait > 0 && obs.seen[waiting[0]] && !obs.in_step[waiting[0]])
                out->readmit_violations++;
        }
        for (int32_t i = 0; i < next; i++) obs.seen[i] = obs.seen[i] || obs.in_step[i];
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int32_t i = (int32_t)(intptr_t)o->user;
            assert_null(out->sig[i]);
            out->sig[i] = signature(o);
            request_output_free(o);
            n_done++;
        }
        if (step > 2000000) fail_msg("no progress");
    }
    assert_int_equal(n_done, w->n);
    assert_null(fake_backend_error(f));
    /* nothing leaked: every block free or cached-evictable, tables gone */
    const kv_pool *pool = engine_kv_pool(e);
    if (kv_pool_check(pool, &err)) fail_msg("%s", err.msg);
    kv_pool_metrics m;
    kv_pool_get_metrics(pool, &m);
    assert_int_equal(m.blocks_in_use, 0);
    assert_int_equal(kv_pool_num_free(pool), nb);
    engine_get_stats(e, &out->stats);
    out->counts = fake_backend_get_counts(f);
    free(obs.seen);
    free(obs.in_step);
    engine_destroy(e);
    fake_backend_destroy(f);
}

void run_result_free(run_result *r, int32_t n)
{
    for (int32_t i = 0; r->sig && i < n; i++) free(r->sig[i]);
    free(r->sig);
    r->sig = NULL;
}

void assert_same_outputs(const run_result *a, const run_result *b, int32_t n, const char *what)
{
    for (int32_t i = 0; i < n; i++)
        if (strcmp(a->sig[i], b->sig[i]) != 0)
            fail_msg("%s: request %d differs:\n--- reference\n%s--- this run\n%s", what, (int)i,
                     a->sig[i], b->sig[i]);
}
