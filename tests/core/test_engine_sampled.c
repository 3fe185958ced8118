/* tests/core/test_engine_sampled: the engine's device-sampling plumbing
 * (engine_backend sample_rows) over the fake backend, with a sample_rows
 * that does what gpu/sampling.cu does from the rows it is handed — the
 * grammar mask (with the terminators let in), the penalties over the
 * distinct ids with their counts, the banned ids, then steps 3-9 at the
 * row's draw (here by core/sampler.c on the masked row, the definition the
 * kernel is compared with in tests/gpu/test_cuda_sampling.c) — and then
 * poisons the rows with NaN, so a row the engine still samples on the host
 * after handing it over fails the step. A batch of structured-output
 * requests (JSON schema, choice, regex; sampled and greedy; n = 3;
 * ignore_eos; min_tokens) and plain ones (temperature, top-k, top-p, min-p,
 * penalties, min_tokens, logprobs, n = 2), with the real stories260K
 * tokenizer, eos on and a small pool (preemptions), must give the same
 * outputs bit for bit with the path on and off (sample_rows NULL), and the
 * path must have taken grammar rows and plain sampled rows.
 * With a logprob_rows beside it (gpu/logprobs.cu's part: the rows it is
 * marked, pg_lsm_row_eval; a PG_LSM_SAMPLED row scored with the id drawn,
 * on the row as it was after the mask), sampled rows with logprobs (top k
 * 0, 5, 20; penalties; a grammar row; n = 2 once forked) are handed over
 * too and give the host's tokens, logprobs and top entries bit for bit;
 * without logprob_rows they stay on the host (their rows, poisoned, would
 * fail the step). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "fake_backend.h"
#include "pg_logsoftmax.h"
#include "pg_sample.h"
#include "sampler.h"
#include "test_support.h"
#include "tokenizer.h"

static tokenizer *g_tok;

typedef struct smp_backend {
    engine_backend inner;
    const pg_smp_batch *req;      /* pending for the next forward (NULL: none) */
    pg_lsm_row *lp;               /* pending logprob rows [lp_L] (NULL: none) */
    int32_t lp_L;
    sampler_workspace *ws;
    float *kept;                  /* [V] a PG_LSM_SAMPLED row after its mask */
    int32_t V;
    uint64_t marked, masked, lp_sampled, lp_other;
} smp_backend;

static int sb_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    smp_backend *sb = ctx;
    const pg_smp_batch *q = sb->req;
    pg_lsm_row *lp = sb->lp;
    sb->req = NULL; /* for this forward only */
    sb->lp = NULL;
    int rc = sb->inner.forward(sb->inner.ctx, b, logits, err);
    if (rc || (!q && !lp))
        return rc;
    if ((q && q->L != b->num_logits) || (lp && sb->lp_L != b->num_logits))
        return pg_error_set(err, PG_EINVAL, "sample / logprob rows of %d / %d rows, step of %d",
                            q ? (int)q->L : -1, lp ? (int)sb->lp_L : -1, (int)b->num_logits);
    const int32_t V = sb->V;
    for (int32_t r = 0; lp && r < sb->lp_L; r++) { /* the rows not sampled: as gpu/logprobs.cu */
        if (!lp[r].want || lp[r].token == PG_LSM_SAMPLED) continue;
        float *x = logits + (size_t)r * V;
        pg_lsm_row_eval(&lp[r], x, V);
        for (int32_t v = 0; v < V; v++)
            x[v] = NAN;
        sb->lp_other++;
    }
    for (int32_t i = 0; q && i < q->n; i++) {
        const pg_smp_row *R = &q->rows[i];
        float *x = logits + (size_t)R->row * V;
        if (R->mask_first >= 0) { /* step 0 */
            for (int32_t v = 0; v < V; v++)
                if (!((q->mask[R->mask_first + (v >> 5)] >> (v & 31)) & 1u)) x[v] = -INFINITY;
            sb->masked++;
        }
        pg_lsm_row *L = lp && lp[R->row].want ? &lp[R->row] : NULL;
        if (L && L->token != PG_LSM_SAMPLED)
            return pg_error_set(err, PG_EINVAL, "sampled row %d marked for logprobs with token %d",
                                (int)R->row, (int)L->token);
        if (L) /* the row as the logprobs read it */
            memcpy(sb->kept, x, (size_t)V * sizeof *x);
        for (int32_t e = 0; e < R->n_pen; e++) { /* step 1 */
            int32_t id = q->pen_ids[R->pen_first + e];
            x[id] = pg_smp_penalize(x[id], R->rep, q->pen_cnt[R->pen_first + e], R->freq, R->pres);
        }
        for (int32_t e = 0; e < R->n_ban; e++) /* step 2 */
            x[q->ban_ids[R->ban_first + e]] = -INFINITY;
        sampling_params sp = sampling_params_default();
        sp.temperature = R->temperature;
        sp.top_k = R->top_k;
        sp.top_p = R->top_p;
        sp.min_p = R->min_p;
        sampler_rng rng = {.key = R->key, .counter = R->counter};
        sampler_result res = {0};
        q->ids[i] = sampler_sample(sb->ws, &sp, x, V, NULL, &rng, &res) ? -1 : res.token_id;
        if (L) { /* the drawn id, scored on the kept row */
            L->token = q->ids[i];
            if (L->token >= 0) pg_lsm_row_eval(L, sb->kept, V);
            sb->lp_sampled++;
        }
        for (int32_t v = 0; v < V; v++)
            x[v] = NAN; /* never read: the host sampler would fail on it */
        sb->marked++;
    }
    for (int32_t r = 0; lp && r < sb->lp_L; r++)
        if (lp[r].want && lp[r].token == PG_LSM_SAMPLED)
            return pg_error_set(err, PG_EINVAL, "logprob row %d: PG_LSM_SAMPLED on a row not sampled",
                                (int)r);
    return PG_OK;
}

static int sb_logprob_rows(void *ctx, pg_lsm_row *rows, int32_t L, pg_error *err)
{
    (void)err;
    smp_backend *sb = ctx;
    sb->lp = L > 0 ? rows : NULL;
    sb->lp_L = L;
    return PG_OK;
}

static int sb_sample(void *ctx, const pg_smp_batch *req, pg_error *err)
{
    (void)err;
    ((smp_backend *)ctx)->req = req;
    return PG_OK;
}

static int sb_copy(void *ctx, const int32_t *src_dst, int32_t n, pg_error *err)
{
    smp_backend *sb = ctx;
    return sb->inner.copy_blocks(sb->inner.ctx, src_dst, n, err);
}

typedef struct req_spec {
    grammar_kind kind;
    const char *src;
    float temperature, top_p, min_p, rep, freq;
    int32_t top_k, n, max_tokens, min_tokens, logprobs;
    bool ignore_eos;
} req_spec;

static const req_spec specs[] = {
    {GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4},"
     "\"b\":{\"enum\":[true,\"x\",3]}},\"required\":[\"a\",\"b\"]}", 1.0f, 1.0f, 0, 1, 0, -1, 1, 120, 0, -1, false},
    {GRAMMAR_CHOICE, "[\"alpha\",\"beta\",\"gamma\"]", 0.0f, 1.0f, 0, 1, 0, -1, 1, 50, 0, -1, false},
    {GRAMMAR_REGEX, "[a-c]{2,5}-(x|yy)", 1.0f, 0.9f, 0, 1, 0, 5, 3, 50, 0, -1, false},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}", 0.7f, 1.0f, 0.05f, 1.2f, 0, -1, 1, 120, 0,
     -1, false},
    {GRAMMAR_CHOICE, "[\"yes\",\"no\"]", 1.0f, 1.0f, 0, 1, 0, -1, 1, 50, 0, -1, true},
    {GRAMMAR_CHOICE, "[\"ok\"]", 0.0f, 1.0f, 0, 1, 0, -1, 1, 50, 20, -1, false},
    /* the text may end after any letter and go on: eos let in as a terminator */
    {GRAMMAR_REGEX, "[a-e ]{1,30}", 1.0f, 1.0f, 0, 1, 0, -1, 1, 40, 0, -1, false},
    {GRAMMAR_REGEX, "[a-z]{1,20}", 0.0f, 1.0f, 0, 1.2f, 0, -1, 1, 40, 0, -1, false},
    {GRAMMAR_NONE, NULL, 0.8f, 1.0f, 0, 1, 0, -1, 1, 24, 0, -1, false},
    {GRAMMAR_NONE, NULL, 1.0f, 0.9f, 0.02f, 1, 0, 40, 1, 24, 4, -1, false},
    {GRAMMAR_NONE, NULL, 1.3f, 1.0f, 0, 1.3f, 0.5f, -1, 1, 24, 0, -1, false},
    {GRAMMAR_NONE, NULL, 0.0f, 1.0f, 0, 1.5f, 0, -1, 1, 24, 6, -1, false},
    {GRAMMAR_NONE, NULL, 0.9f, 1.0f, 0, 1, 0, -1, 1, 24, 0, 2, false},
    /* sampled with logprobs: top k 0, 5, 20; penalties and min_tokens; a
     * grammar row; n = 2 (its forked rows); greedy with a penalty */
    {GRAMMAR_NONE, NULL, 1.0f, 1.0f, 0, 1, 0, -1, 1, 20, 0, 0, false},
    {GRAMMAR_NONE, NULL, 0.8f, 0.9f, 0, 1, 0, 30, 1, 20, 0, 5, false},
    {GRAMMAR_NONE, NULL, 1.2f, 1.0f, 0.05f, 1.3f, 0.4f, -1, 1, 20, 5, 20, false},
    {GRAMMAR_REGEX, "[a-e ]{1,30}", 1.0f, 1.0f, 0, 1, 0, -1, 1, 40, 0, 5, false},
    {GRAMMAR_NONE, NULL, 0.9f, 1.0f, 0, 1.2f, 0, -1, 2, 20, 0, 3, false},
    {GRAMMAR_NONE, NULL, 0.0f, 1.0f, 0, 1.4f, 0, -1, 1, 20, 0, 4, false},
    {GRAMMAR_NONE, NULL, 0.9f, 0.8f, 0, 1, 0, -1, 2, 24, 0, -1, false},
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))
#define N_REQ (3 * N_SPECS)

static request_output **run(bool device, bool device_lp, int32_t num_blocks, int32_t max_seqs,
                            uint64_t *marked, uint64_t *masked, uint64_t *lp_sampled, const req_spec *only)
{
    const int32_t V = tok_vocab_size(g_tok);
    fake_backend_params fp = {.vocab_size = V, .num_blocks = num_blocks, .block_size = 4, .window = 3,
                              .salt = 5};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    smp_backend sb = {.inner = fake_backend_iface(f), .ws = sampler_workspace_create(V), .V = V,
                      .kept = malloc((size_t)V * sizeof(float))};
    assert_true(sb.ws && sb.kept);
    engine_backend be = {.ctx = &sb, .vocab_size = V, .forward = sb_forward, .copy_blocks = sb_copy,
                         .sample_rows = device ? sb_sample : NULL,
                         .logprob_rows = device_lp ? sb_logprob_rows : NULL};
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_num_seqs = max_seqs;
    ep.max_model_len = 160;
    ep.check_invariants = true;
    ep.watermark = 0.0f;
    int32_t eos = tok_eos_id(g_tok);
    ep.eos_token_ids = &eos;
    ep.n_eos_token_ids = 1;
    engine *e;
    pg_error err;
    if (engine_create(&e, &ep, &be, g_tok, &err))
        fail_msg("%s", err.msg);
    fake_backend_attach(f, e);
    request_output **outs = calloc(N_REQ, sizeof *outs);
    assert_non_null(outs);
    const int32_t prompt[] = {1, 400, 300, 288, 301, 270};
    for (int i = 0; i < N_REQ; i++) {
        const req_spec *r = only ? only : &specs[i % N_SPECS];
        sampling_params sp = sampling_params_default();
        sp.temperature = r->temperature;
        sp.top_p = r->top_p;
        sp.top_k = r->top_k;
        sp.min_p = r->min_p;
        sp.repetition_penalty = r->rep;
        sp.frequency_penalty = r->freq;
        sp.presence_penalty = r->freq * 0.5f;
        sp.n = r->n;
        sp.max_tokens = r->max_tokens;
        sp.min_tokens = r->min_tokens;
        sp.logprobs = r->logprobs;
        sp.ignore_eos = r->ignore_eos;
        sp.seed = 100 + (uint64_t)i;
        sp.structured_kind = r->kind;
        sp.structured = r->src;
        sp.structured_len = r->src ? strlen(r->src) : 0;
        uint64_t id;
        if (engine_add_request(e, prompt, 6, &sp, NULL, &id, &err))
            fail_msg("request %d: %s", i, err.msg);
        fake_backend_set_prompt(f, id, prompt, 6);
    }
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("device %d: %s (%s)", (int)device, err.msg, fake_backend_error(f));
        request_output *o;
        while (engine_pop_finished(e, &o))
            outs[o->request_id] = o;
    }
    engine_stats st;
    engine_get_stats(e, &st);
    printf("# device %d, logprobs %d, pool %d, max_num_seqs %d: %llu preemptions, %llu rows sampled by the "
           "backend (%llu with a mask, %llu with logprobs), %llu other logprob rows\n", (int)device,
           (int)device_lp, (int)num_blocks, (int)max_seqs, (unsigned long long)st.preemptions,
           (unsigned long long)sb.marked, (unsigned long long)sb.masked, (unsigned long long)sb.lp_sampled,
           (unsigned long long)sb.lp_other);
    *marked = sb.marked;
    *masked = sb.masked;
    *lp_sampled = sb.lp_sampled;
    engine_destroy(e);
    sampler_workspace_destroy(sb.ws);
    free(sb.kept);
    fake_backend_destroy(f);
    return outs;
}

/* a's outputs equal b's: tokens, text, finish, logprobs and top entries */
static void same_outputs(request_output **a_, request_output **b_, int n_req, const char *what)
{
    for (int i = 0; i < n_req; i++) {
        assert_non_null(a_[i]);
        assert_non_null(b_[i]);
        assert_int_equal(a_[i]->n_outputs, b_[i]->n_outputs);
        for (int k = 0; k < a_[i]->n_outputs; k++) {
            const seq_output *a = &a_[i]->outputs[k], *b = &b_[i]->outputs[k];
            if (a->n_tokens != b->n_tokens ||
                memcmp(a->token_ids, b->token_ids, (size_t)a->n_tokens * sizeof(int32_t)))
                fail_msg("%s: request %d.%d (spec %d): '%s' against '%s'", what, i, k, i % N_SPECS, a->text,
                         b->text);
            assert_int_equal(a->finish, b->finish);
            assert_string_equal(a->text, b->text);
            assert_int_equal(a->token_logprobs != NULL, b->token_logprobs != NULL);
            assert_int_equal(a->n_top, b->n_top);
            if (a->token_logprobs)
                assert_memory_equal(a->token_logprobs, b->token_logprobs,
                                    (size_t)a->n_tokens * sizeof(float));
            if (a->n_top > 0) {
                const size_t nt = (size_t)a->n_tokens * (size_t)a->n_top;
                assert_memory_equal(a->top_ids, b->top_ids, nt * sizeof(int32_t));
                assert_memory_equal(a->top_logprobs, b->top_logprobs, nt * sizeof(float));
            }
        }
    }
}

static void free_outputs(request_output **o)
{
    for (int i = 0; i < N_REQ; i++)
        request_output_free(o[i]);
    free(o);
}

static void test_on_off_identical(void **state)
{
    (void)state;
    const int32_t pools[][2] = {{1024, 64}, {40, 8}};
    for (size_t p = 0; p < sizeof pools / sizeof *pools; p++) {
        uint64_t m_on, k_on, l_on, m_off, k_off, l_off, m_lp, k_lp, l_lp;
        request_output **on = run(true, false, pools[p][0], pools[p][1], &m_on, &k_on, &l_on, NULL);
        request_output **off = run(false, false, pools[p][0], pools[p][1], &m_off, &k_off, &l_off, NULL);
        /* and with the logprob rows: sampled rows with logprobs go too */
        request_output **lp = run(true, true, pools[p][0], pools[p][1], &m_lp, &k_lp, &l_lp, NULL);
        assert_true(m_on > 0 && k_on > 0 && k_on < m_on); /* grammar rows and plain ones */
        assert_true(m_off == 0 && l_on == 0);
        assert_true(l_lp > 0 && m_lp >= m_on + l_lp && k_lp > k_on); /* the grammar row with logprobs too */
        same_outputs(on, off, N_REQ, "sample_rows on / off");
        same_outputs(lp, off, N_REQ, "sample_rows and logprob_rows on / off");
        free_outputs(on);
        free_outputs(off);
        free_outputs(lp);
    }
}

/* n > 1 after its fork: each sequence samples its own row, so those rows go
 * to the backend too (only the row the group forks from, which samples n
 * tokens, stays on the host) — and give the host's bytes */
static void test_parallel_sampling_rows_on_device(void **state)
{
    (void)state;
    const req_spec *n2 = &specs[N_SPECS - 1];
    assert_int_equal(n2->n, 2);
    assert_int_equal(n2->kind, GRAMMAR_NONE);
    uint64_t m_on, k_on, l_on, m_off, k_off, l_off;
    request_output **on = run(true, false, 1024, 64, &m_on, &k_on, &l_on, n2);
    request_output **off = run(false, false, 1024, 64, &m_off, &k_off, &l_off, n2);
    /* N_REQ requests of 2 sequences and 24 tokens: all but the forking
     * row of each sequence's tokens (eos may end some early) */
    assert_true(m_on >= (uint64_t)N_REQ * 2);
    assert_true(m_off == 0);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(on[i]->n_outputs, 2);
        assert_int_equal(on[i]->n_outputs, off[i]->n_outputs);
        for (int k = 0; k < on[i]->n_outputs; k++) {
            const seq_output *a = &on[i]->outputs[k], *b = &off[i]->outputs[k];
            assert_int_equal(a->n_tokens, b->n_tokens);
            assert_memory_equal(a->token_ids, b->token_ids, (size_t)a->n_tokens * sizeof(int32_t));
            assert_int_equal(a->finish, b->finish);
        }
        request_output_free(on[i]);
        request_output_free(off[i]);
    }
    free(on);
    free(off);
}

int main(void)
{
    pg_error err;
    if (tok_load(&g_tok, pg_test_shared_path("models/stories260K"), &err))
        fail_msg("%s", err.msg);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_off_identical),
        cmocka_unit_test(test_parallel_sampling_rows_on_device),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tok_free(g_tok);
    return rc;
}
