/* test_cuda_e2e (suite gpu): the CUDA executor end to end.
 *
 * Without CUDA built, or without a device (cuda_device_count() == 0), it
 * prints "SKIP: ..." and exits 77 (meson: SKIP). With one:
 *  - long-context attention: decode sequences that span several partitions
 *    (the split + reduction path: seq_len 1, 511, 512, 513, 1500, 2100)
 *    mixed with a prefill chunk on top of a cached prefix, CUDA vs the CPU
 *    twin (the stories260K goldens never exceed one partition);
 *  - stories260K logits goldens (prefill, and one token per step through the
 *    decode kernel): f32 precision within 1e-4 of max |logit|, bf16 within
 *    5e-2, argmax equal wherever the golden's top-2 margin exceeds the bound;
 *  - greedy goldens through the engine on the f32 precision: the token ids
 *    equal the goldens exactly, in a batch, with preemption, with chunked
 *    prefill and with the decode steps as CUDA graphs; on bf16: the same schedule twice gives the same ids (CUDA's
 *    run-to-run determinism) and the agreement with the goldens is printed.
 *
 *  - device greedy rows (engine_backend greedy_rows, bf16, decode steps as
 *    graphs): a batch mixing plain greedy requests with sampled ones,
 *    greedy ones with logprobs, a penalty and min_tokens gives the same
 *    ids and logprobs with the path on and off (be.greedy_rows = NULL,
 *    the logits path), and copies fewer logits bytes to the host.
 *
 *  - device sampled rows (engine_backend sample_rows, gpu/sampling.cu):
 *    the same batch with sampled rows (top-k, top-p, min-p, penalties,
 *    banned ids; with logprobs k 0, 5, 20 and 3, scored on the device on
 *    the drawn id: logprob_rows' PG_LSM_SAMPLED) and an n = 2 request,
 *    graphs and eager, gives the host sampling's ids, logprobs and top
 *    entries bit for bit and copies no logits row but the fork's.
 *
 *  - device logprob rows (engine_backend logprob_rows, gpu/logprobs.cu):
 *    a batch mixing plain greedy, sampled, greedy-with-logprobs and
 *    prompt-logprobs requests (max_num_seqs 8: prompt rows in lm_head
 *    slices of 8, and one row per step) gives the same output bytes (ids,
 *    logprobs, tops, prompt logprobs, ranks, prompt tops) with the path on
 *    and off, and copies fewer logits bytes (cuda_graph_info).
 *
 *  - launches per decode step (cuda_executor_launch_counts): stories260K
 *    at 9 a layer (5 kernels + 4 cuBLAS products), eager and graphed, and
 *    the unfused ops (rope_kv taken out of the table) the same logits bit
 *    for bit with one kernel more a layer;
 *
 *  - embeddings (model_hidden_rows through the engine): last and mean
 *    pooled vectors of three golden prompts, batched with greedy requests
 *    whose decode steps run as CUDA graphs, against the CPU's: f32 within
 *    1e-5, bf16 within 1e-2 (normalized entries), and the same bits twice.
 *
 * PAGEDGEN_CUDA_E2E_QUICK=N (tests/cuda_emu sets it for the host-emulated
 * device, where a CUDA thread is a fiber): the greedy goldens stop after N
 * tokens and are compared on those (a greedy completion's prefix is the
 * completion of the shorter request).
 */
#include <stdio.h>

#ifndef PG_HAVE_CUDA
int main(void)
{
    printf("SKIP: the CUDA executor is not built (meson found no nvcc/cuBLAS)\n");
    return 77;
}
#else

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cuda_executor.h"
#include "engine.h"
#include "golden_support.h"
#include "model.h"
#include "pooling.h"
#include "test_support.h"

/* The goldens' fixture: the stories260K model and goldens (golden_support.h). */
typedef pg_golden_set fixture;

/* ---- executors ------------------------------------------------------------ */

static executor *make_cuda(int precision)
{
    executor *ex = NULL;
    pg_error err;
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    int rc = cuda_executor_create(&ex, &p, &err);
    if (rc)
        fail_msg("cuda_executor_create: %s", err.msg);
    return ex;
}

static executor *make_cpu(void)
{
    executor *ex = NULL;
    pg_error err;
    cpu_executor_params p = {.threads = 2};
    int rc = cpu_executor_create(&ex, &p, &err);
    if (rc)
        fail_msg("cpu_executor_create: %s", err.msg);
    return ex;
}

static void ok(executor *ex, int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s: %s", ex->name, what, ex->op->last_error(ex));
}

/* ---- long-context attention vs the CPU twin -------------------------------- */

enum { A_NH = 8, A_NKV = 2, A_HD = 128, A_BS = 16 };

/* Runs attention for batch b on ex: qkv [T][(nh+2nkv)*hd] and the cache
 * kv [2][nb][bs][nkv][hd] given in f32; out [T][nh*hd] f32. */
static void attn_run(executor *ex, const step_batch *b, const float *qkv, const float *kv,
                     int32_t nb, float *out)
{
    const int32_t T = b->num_tokens, W = (A_NH + 2 * A_NKV) * A_HD;
    const size_t plane = (size_t)nb * A_BS * A_NKV * A_HD;
    void *d_qkv = ex->op->alloc(ex, EXEC_ACT, (size_t)T * W);
    void *d_kv = ex->op->alloc(ex, EXEC_KV, 2 * plane);
    void *d_out = ex->op->alloc(ex, EXEC_ACT, (size_t)T * A_NH * A_HD);
    assert_true(d_qkv && d_kv && d_out);
    ok(ex, ex->op->upload(ex, d_qkv, EXEC_ACT, 0, qkv, ST_F32, (size_t)T * W), "upload qkv");
    ok(ex, ex->op->upload(ex, d_kv, EXEC_KV, 0, kv, ST_F32, 2 * plane), "upload kv");
    ok(ex, ex->op->begin_step(ex, b), "begin_step");
    void *v_cache = (char *)d_kv + plane * ex->kv_bytes;
    ok(ex, ex->op->attention(ex, d_out, d_qkv, d_kv, v_cache, A_NH, A_NKV, A_HD,
                             1.0f / sqrtf((float)A_HD), b), "attention");
    ok(ex, ex->op->download_f32(ex, out, d_out, EXEC_ACT, (size_t)T * A_NH * A_HD), "download");
    ex->op->free(ex, d_qkv);
    ex->op->free(ex, d_kv);
    ex->op->free(ex, d_out);
}

static void test_long_attention(void **state)
{
    (void)state;
    /* decodes of various lengths around the 512-token partition, and one
     * 5-token prefill chunk over a 700-token cached prefix */
    const int32_t dec_lens[] = {1, 511, 512, 513, 1500, 2100};
    const int32_t n_dec = (int32_t)(sizeof dec_lens / sizeof dec_lens[0]);
    const int32_t pf_q = 5, pf_len = 705;
    const int32_t S = n_dec + 1, T = n_dec + pf_q;
    int32_t seq_lens[8], qs[9], stride = 0;
    for (int32_t s = 0; s < n_dec; s++)
        seq_lens[s] = dec_lens[s];
    seq_lens[n_dec] = pf_len;
    qs[0] = 0;
    int32_t max_len = 0;
    for (int32_t s = 0; s < S; s++) {
        qs[s + 1] = qs[s] + (s < n_dec ? 1 : pf_q);
        int32_t nblk = (seq_lens[s] + A_BS - 1) / A_BS;
        stride = nblk > stride ? nblk : stride;
        max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
    }
    /* physical blocks: a shuffled permutation, so tables are not contiguous */
    int32_t nb = 0;
    for (int32_t s = 0; s < S; s++)
        nb += (seq_lens[s] + A_BS - 1) / A_BS;
    nb += 3;
    int32_t *perm = malloc((size_t)nb * sizeof *perm);
    int32_t *bt = calloc((size_t)S * (size_t)stride, sizeof *bt);
    int32_t *tok = calloc((size_t)T, sizeof *tok), *pos = malloc((size_t)T * sizeof *pos);
    int32_t *slots = malloc((size_t)T * sizeof *slots), *rows = malloc((size_t)S * sizeof *rows);
    assert_true(perm && bt && tok && pos && slots && rows);
    pg_test_rng rng = {12345};
    for (int32_t i = 0; i < nb; i++)
        perm[i] = i;
    for (int32_t i = nb - 1; i > 0; i--) {
        int32_t j = pg_test_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 0;
    for (int32_t s = 0; s < S; s++) {
        int32_t nblk = (seq_lens[s] + A_BS - 1) / A_BS;
        for (int32_t k = 0; k < nblk; k++)
            bt[s * stride + k] = perm[next++];
        for (int32_t t = qs[s]; t < qs[s + 1]; t++) {
            pos[t] = seq_lens[s] - (qs[s + 1] - t);
            slots[t] = bt[s * stride + pos[t] / A_BS] * A_BS + pos[t] % A_BS;
        }
        rows[s] = qs[s + 1] - 1;
    }
    step_batch b = {.num_tokens = T, .num_seqs = S, .block_size = A_BS, .token_ids = tok,
                    .positions = pos, .slots = slots, .query_start = qs, .seq_lens = seq_lens,
                    .block_tables = bt, .block_table_stride = stride, .max_seq_len = max_len,
                    .max_query_len = pf_q, .num_logits = S, .logits_rows = rows};
    const size_t W = (A_NH + 2 * A_NKV) * A_HD;
    const size_t plane = (size_t)nb * A_BS * A_NKV * A_HD;
    float *qkv = malloc((size_t)T * W * sizeof(float)), *kv = malloc(2 * plane * sizeof(float));
    const size_t n_out = (size_t)T * A_NH * A_HD;
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    assert_true(qkv && kv && ref && got);
    pg_test_fill_uniform(&rng, qkv, (size_t)T * W, -2.0f, 2.0f);
    pg_test_fill_uniform(&rng, kv, 2 * plane, -2.0f, 2.0f);

    executor *cpu = make_cpu();
    attn_run(cpu, &b, qkv, kv, nb, ref);
    cpu->op->destroy(cpu);
    double maxref = 0;
    for (size_t i = 0; i < n_out; i++)
        maxref = fabs((double)ref[i]) > maxref ? fabs((double)ref[i]) : maxref;

    const int precisions[] = {1, 0};
    const double tols[] = {1e-4, 3e-2};
    for (int k = 0; k < 2; k++) {
        executor *ex = make_cuda(precisions[k]);
        attn_run(ex, &b, qkv, kv, nb, got);
        /* the one-sequence pure-decode path gives the same bits as in the mixed batch */
        double maxdiff = 0;
        for (size_t i = 0; i < n_out; i++) {
            double d = fabs((double)got[i] - (double)ref[i]);
            maxdiff = d > maxdiff || d != d ? d : maxdiff;
        }
        printf("    long attention, %s precision: max |diff| %.3g, max |ref| %.3g, rel %.3g "
               "(bound %.0e)\n", precisions[k] ? "f32" : "bf16", maxdiff, maxref,
               maxdiff / maxref, tols[k]);
        assert_true(maxdiff <= tols[k] * maxref);

        /* sequence 5 (2100 tokens, 5 partitions) alone as a pure decode step:
         * identical bits (the kernels are batch-invariant) */
        int32_t s5 = 5, qs1[2] = {0, 1}, len1 = seq_lens[s5], row1 = 0;
        int32_t tok1 = 0, pos1 = pos[qs[s5]], slot1 = slots[qs[s5]];
        step_batch b1 = {.num_tokens = 1, .num_seqs = 1, .block_size = A_BS, .token_ids = &tok1,
                         .positions = &pos1, .slots = &slot1, .query_start = qs1,
                         .seq_lens = &len1, .block_tables = bt + s5 * stride,
                         .block_table_stride = stride, .max_seq_len = len1, .max_query_len = 1,
                         .num_logits = 1, .logits_rows = &row1};
        float *qkv1 = qkv + (size_t)qs[s5] * W;
        float out1[A_NH * A_HD];
        attn_run(ex, &b1, qkv1, kv, nb, out1);
        assert_memory_equal(out1, got + (size_t)qs[s5] * A_NH * A_HD, sizeof out1);
        ex->op->destroy(ex);
    }
    free(perm);
    free(bt);
    free(tok);
    free(pos);
    free(slots);
    free(rows);
    free(qkv);
    free(kv);
    free(ref);
    free(got);
}

/* ---- goldens --------------------------------------------------------------- */

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    *state = f;
    return pg_golden_set_load(f);
}

static int teardown(void **state)
{
    fixture *f = *state;
    pg_golden_set_free(f);
    free(f);
    return 0;
}

static model *open_model(fixture *f, executor *ex, const model_params *mp)
{
    model *m = NULL;
    pg_error err;
    int rc = model_create(&m, ex, &f->cfg, f->st, mp, &err);
    if (rc)
        fail_msg("model_create on %s: %s", ex->name, err.msg);
    return m;
}

static void check_logits(fixture *f, int precision, double tol)
{
    const int32_t V = f->cfg.vocab_size, bs = 16;
    model_params mp = {.num_kv_blocks = 32, .block_size = bs, .max_num_batched_tokens = 512,
                       .max_num_seqs = 4};
    executor *ex = make_cuda(precision);
    model *m = open_model(f, ex, &mp);
    float *got = malloc((size_t)V * sizeof(float));
    assert_non_null(got);
    for (int k = 0; k < f->n_lg; k++) {
        pg_logits_golden *g = &f->lg[k];
        assert_int_equal(g->n_logits, V);
        /* the margin between the golden's best and second-best logit */
        float top1 = -INFINITY, top2 = -INFINITY;
        double maxabs = 0;
        for (int32_t v = 0; v < V; v++) {
            float x = g->logits[v];
            if (x > top1) {
                top2 = top1;
                top1 = x;
            } else if (x > top2) {
                top2 = x;
            }
            maxabs = fabs((double)x) > maxabs ? fabs((double)x) : maxabs;
        }
        const int32_t chunks[] = {g->n_prompt, 1, 3};
        for (int c = 0; c < 3; c++) {
            pg_golden_run_prompt(m, g->prompt_ids, g->n_prompt, chunks[c], bs, got);
            double maxdiff = 0;
            int32_t am = 0;
            for (int32_t v = 0; v < V; v++) {
                double d = fabs((double)got[v] - (double)g->logits[v]);
                maxdiff = d > maxdiff || d != d ? d : maxdiff;
                if (got[v] > got[am])
                    am = v;
            }
            printf("    %s logits golden %d, chunk %d: max |diff| %.3g, rel %.3g (bound %.0e), "
                   "argmax %d (golden %d, margin %.3g)\n", precision ? "f32" : "bf16", k,
                   (int)chunks[c], maxdiff, maxdiff / maxabs, tol, (int)am, (int)g->argmax,
                   (double)(top1 - top2));
            assert_true(maxdiff <= tol * maxabs);
            if ((double)(top1 - top2) > 2.0 * tol * maxabs)
                assert_int_equal(am, g->argmax);
        }
    }
    free(got);
    model_destroy(m);
    ex->op->destroy(ex);
}

static void test_logits_f32(void **state) { check_logits(*state, 1, 1e-4); }
static void test_logits_bf16(void **state) { check_logits(*state, 0, 5e-2); }

/* ---- launches per decode step ---------------------------------------------- */

/* The work of one decode step (cuda_executor_launch_counts' last_step) on
 * stories260K (5 layers, Llama: no bias, no q/k norm), a one-sequence step
 * after 9 one-token steps, and what it must stay at (gpu/README.md
 * "Launches per decode step"). Per layer 9:
 *   kernels 5 (rmsnorm, rope_kv, decode attention, rmsnorm, silu_mul) +
 *   cuBLAS products 4 (qkv, o, gate_up, down; in place: no padding copies)
 * plus, per step, embed 1, the head's gathers 2, final rmsnorm 1, the
 * lm_head product 1 and its 2 padding copies (rows_out holds max_num_seqs
 * rows, fewer than the 128 a chunk pads to); a graphed step also runs the
 * argmax of every row (1 kernel, inside its graph).
 * The same model with the fused op taken out of the table (rope_kv = NULL:
 * rope and kv_write one by one) must give the same logits bit for bit and
 * count one kernel more per layer. */
static void test_launches_per_step(void **state)
{
    fixture *f = *state;
    const int32_t NL = f->cfg.num_hidden_layers, V = f->cfg.vocab_size, bs = 16, n = 10;
    assert_int_equal(NL, 5);
    const int32_t *ids = f->lg[0].prompt_ids;
    assert_true(f->lg[0].n_prompt >= 2);
    int32_t tok[10];
    for (int32_t i = 0; i < n; i++) /* the golden prompt, repeated to n tokens */
        tok[i] = ids[i % f->lg[0].n_prompt];
    model_params mp = {.num_kv_blocks = 32, .block_size = bs, .max_num_batched_tokens = 512,
                       .max_num_seqs = 4};
    const uint64_t per_layer_kernels = 5, per_layer_gemms = 4;
    const uint64_t kernels = 1 + NL * per_layer_kernels + 3, gemms = NL * per_layer_gemms + 1;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    assert_true(want && got);
    for (int precision = 0; precision <= 1; precision++)
        for (int variant = 0; variant < 3; variant++) { /* fused eager, graphed, unfused eager */
            executor *ex = make_cuda(precision);
            const executor_ops *ops = ex->op;
            executor_ops unfused = *ops;
            unfused.rope_kv = NULL;
            if (variant == 1) {
                pg_error err;
                if (cuda_executor_set_graphs(ex, 4, 512, &err))
                    fail_msg("cuda_executor_set_graphs: %s", err.msg);
            }
            model *m = open_model(f, ex, &mp);
            if (variant == 2)
                ex->op = &unfused;
            pg_golden_run_prompt(m, tok, n, 1, bs, variant ? got : want);
            ex->op = ops;
            cuda_launch_counts c;
            cuda_executor_launch_counts(ex, NULL, &c);
            printf("    %s %s: one decode step: %llu launches = %llu kernels + %llu cuBLAS + %llu "
                   "copies (%d layers)\n", precision ? "f32" : "bf16",
                   variant == 0 ? "fused eager" : variant == 1 ? "fused graphed" : "unfused eager",
                   (unsigned long long)c.total, (unsigned long long)c.kernels,
                   (unsigned long long)c.gemms, (unsigned long long)c.copies, (int)NL);
            assert_int_equal(c.kernels, kernels + (variant == 1) + (variant == 2 ? NL : 0));
            assert_int_equal(c.gemms, gemms);
            assert_int_equal(c.copies, 2);
            assert_int_equal(c.total, c.kernels + c.gemms + c.copies);
            if (variant)
                assert_memory_equal(got, want, (size_t)V * sizeof *got);
            if (variant == 1) {
                long captures = 0, replays = 0;
                cuda_executor_graph_stats(ex, &captures, &replays);
                assert_true(replays > 0); /* the counted step was a replay */
            }
            model_destroy(m);
            ex->op->destroy(ex);
        }
    free(want);
    free(got);
}

typedef struct run_cfg {
    const char *name;
    pg_golden_pool pool;
    int32_t graph_batch;          /* > 0: CUDA graphs for decode steps of up to this many */
} run_cfg;

/* Tokens per greedy golden: all, or PAGEDGEN_CUDA_E2E_QUICK's prefix. */
static int32_t golden_len(const pg_golden *g, int32_t *max_tokens)
{
    const char *q = getenv("PAGEDGEN_CUDA_E2E_QUICK");
    long cap = q && *q ? strtol(q, NULL, 10) : 0;
    *max_tokens = g->max_new_tokens;
    if (cap > 0 && cap < *max_tokens)
        *max_tokens = (int32_t)cap;
    return g->n_completion < *max_tokens ? g->n_completion : *max_tokens;
}

/* All goldens through a fresh engine on a CUDA executor; ids[i] / n[i] get
 * each completion (malloc'd). */
static void run_engine(fixture *f, int precision, const run_cfg *c, int32_t **ids, int32_t *n,
                       engine_stats *stats)
{
    model_params mp = pg_golden_model_params(&c->pool);
    executor *ex = make_cuda(precision);
    pg_error gerr;
    if (c->graph_batch > 0 &&
        cuda_executor_set_graphs(ex, c->graph_batch, f->cfg.max_position_embeddings, &gerr))
        fail_msg("cuda_executor_set_graphs: %s", gerr.msg);
    model *m = open_model(f, ex, &mp);
    engine_params ep = pg_golden_engine_params(f, &c->pool);
    engine_backend be = model_backend(m);
    engine *e = NULL;
    pg_error err;
    if (engine_create(&e, &ep, &be, NULL, &err))
        fail_msg("engine_create: %s", err.msg);
    for (int i = 0; i < f->n_g; i++) {
        sampling_params sp = sampling_params_default();
        sp.temperature = 0.0f;
        (void)golden_len(&f->g[i], &sp.max_tokens);
        uint64_t id;
        if (engine_add_request(e, f->g[i].prompt_ids, f->g[i].n_prompt, &sp,
                               (void *)(intptr_t)i, &id, &err))
            fail_msg("request %d: %s", i, err.msg);
    }
    int finished = 0;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("%s: step: %s", c->name, err.msg);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int i = (int)(intptr_t)o->user;
            assert_true(i >= 0 && i < f->n_g && o->n_outputs == 1);
            n[i] = o->outputs[0].n_tokens;
            ids[i] = malloc(((size_t)n[i] + 1) * sizeof(int32_t));
            assert_non_null(ids[i]);
            memcpy(ids[i], o->outputs[0].token_ids, (size_t)n[i] * sizeof(int32_t));
            request_output_free(o);
            finished++;
        }
    }
    assert_int_equal(finished, f->n_g);
    engine_get_stats(e, stats);
    if (c->graph_batch > 0) {
        long captures = 0, replays = 0;
        cuda_executor_graph_stats(ex, &captures, &replays);
        printf("    [%s] graphs captured %ld, replayed %ld\n", c->name, captures, replays);
        assert_true(captures > 0 && replays > captures); /* the decode steps ran as graphs */
        cuda_graph_info gi;
        cuda_executor_graph_info(ex, &gi);
        assert_int_equal(gi.eager_fallbacks, 0); /* no capture was refused */
    }
    engine_destroy(e);
    model_destroy(m);
    ex->op->destroy(ex);
}

static const run_cfg cfgs[] = {
    /* name                              {bs  blocks seqs batched prefix} */
    {"batch, bs 16", {16, 256, 256, 2048, true}, 0},
    {"tiny pool (preemption), bs 16", {16, 24, 256, 2048, true}, 0},
    {"chunked prefill, bs 1", {1, 4096, 256, 64, false}, 0},
    /* decode steps as CUDA graphs (buckets 1, 2, 4, 8), the rest eager */
    {"batch, bs 16, cuda graphs", {16, 256, 256, 2048, true}, 8},
};

/* tokens equal to the golden before the first difference */
static int32_t agree(const pg_golden *g, const int32_t *ids, int32_t n)
{
    int32_t k = 0;
    while (k < n && k < g->n_completion && ids[k] == g->completion_ids[k])
        k++;
    return k;
}

static void test_greedy_f32(void **state)
{
    fixture *f = *state;
    bool all = true;
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        int32_t *ids[PG_GOLDEN_MAX] = {0}, n[PG_GOLDEN_MAX] = {0};
        engine_stats st;
        run_engine(f, 1, &cfgs[c], ids, n, &st);
        for (int i = 0; i < f->n_g; i++) {
            int32_t max_tokens, want = golden_len(&f->g[i], &max_tokens);
            /* the goldens leave out the stopping BOS; the engine keeps it as
             * its last token (vLLM v1), when there is room for it */
            bool stops = f->g[i].stop && want == f->g[i].n_completion && want < max_tokens;
            bool same = n[i] == want + (stops ? 1 : 0) &&
                        memcmp(ids[i], f->g[i].completion_ids, (size_t)want * sizeof(int32_t)) == 0 &&
                        (!stops || ids[i][want] == f->g[i].stop_token_id);
            if (!same)
                printf("    [f32, %s] golden %d MISMATCH: %d tokens (want %d), first diff at %d\n",
                       cfgs[c].name, i, (int)n[i], (int)want,
                       (int)agree(&f->g[i], ids[i], n[i]));
            all = all && same;
            free(ids[i]);
        }
        printf("    [f32, %s] steps %llu, preemptions %llu\n", cfgs[c].name,
               (unsigned long long)st.steps, (unsigned long long)st.preemptions);
    }
    assert_true(all);
}

static void test_greedy_bf16(void **state)
{
    fixture *f = *state;
    int32_t *a[PG_GOLDEN_MAX] = {0}, na[PG_GOLDEN_MAX] = {0};
    int32_t *b[PG_GOLDEN_MAX] = {0}, nb[PG_GOLDEN_MAX] = {0};
    engine_stats st;
    run_engine(f, 0, &cfgs[0], a, na, &st);
    run_engine(f, 0, &cfgs[0], b, nb, &st);
    for (int i = 0; i < f->n_g; i++) {
        printf("    [bf16] golden %d: %d of %d tokens agree with the f32 golden before the first "
               "difference\n", i, (int)agree(&f->g[i], a[i], na[i]), (int)f->g[i].n_completion);
        assert_int_equal(na[i], nb[i]);
        assert_memory_equal(a[i], b[i], (size_t)na[i] * sizeof(int32_t));
        free(a[i]);
        free(b[i]);
    }
}

/* ---- device greedy rows ------------------------------------------------- */

/* Request i's sampling (i < 8, the goldens): plain greedy (ids from the
 * device argmax) for i % 8 in {0, 3} (3 stops after a quarter of the
 * tokens: the 9 sequences drop to 8, the largest graph bucket, and the
 * decode steps after it replay graphs); the others taken on the host
 * without the device sampler, on the device with it:
 *   1  sampled (temperature 0.8, top-k 20) with logprobs 0
 *   2  greedy with logprobs 2 (the logprob rows' argmax, token -1)
 *   4  sampled (top-p 0.9) n = 2 with logprobs 5: its fork row samples
 *      two tokens on the host, its forked rows one each on the device
 *   5  greedy with a repetition penalty and min_tokens (banned eos)
 *   6  sampled (temperature 1.2, min-p, frequency and presence
 *      penalties) with logprobs 20
 *   7  greedy with a repetition penalty and logprobs 3 */
static sampling_params dg_params(int i, int32_t max_tokens)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = max_tokens;
    switch (i % 8) {
    case 3: sp.max_tokens = max_tokens / 4 > 1 ? max_tokens / 4 : 1; break;
    case 1: sp.temperature = 0.8f; sp.top_k = 20; sp.seed = 7u + (uint64_t)i; sp.logprobs = 0; break;
    case 2: sp.logprobs = 2; break;
    case 4: sp.temperature = 1.0f; sp.top_p = 0.9f; sp.seed = 3u; sp.n = 2; sp.logprobs = 5; break;
    case 5: sp.repetition_penalty = 1.3f; sp.min_tokens = 4; break;
    case 6:
        sp.temperature = 1.2f; sp.min_p = 0.02f; sp.frequency_penalty = 0.4f; sp.presence_penalty = 0.2f;
        sp.seed = 9u; sp.logprobs = 20;
        break;
    case 7: sp.repetition_penalty = 1.2f; sp.logprobs = 3; break;
    default: break;
    }
    return sp;
}

typedef struct dg_out {
    int32_t n[PG_GOLDEN_MAX];          /* tokens of every output together */
    unsigned char *bytes[PG_GOLDEN_MAX]; /* every output: ids, logprobs, top ids, top logprobs */
    size_t nbytes[PG_GOLDEN_MAX];
    size_t copied;                 /* logits bytes copied to the host */
    long replays;
} dg_out;

static void dg_put(dg_out *o, int i, const void *src, size_t n)
{
    if (!src || n == 0)
        return;
    o->bytes[i] = realloc(o->bytes[i], o->nbytes[i] + n);
    assert_non_null(o->bytes[i]);
    memcpy(o->bytes[i] + o->nbytes[i], src, n);
    o->nbytes[i] += n;
}

/* a's outputs are b's, byte for byte; frees both */
static void dg_same(dg_out *a, dg_out *b, int n_g)
{
    for (int i = 0; i < n_g; i++) {
        assert_int_equal(a->n[i], b->n[i]);
        assert_int_equal(a->nbytes[i], b->nbytes[i]);
        assert_memory_equal(a->bytes[i], b->bytes[i], a->nbytes[i]);
    }
}

static void dg_free(dg_out *o, int n_g)
{
    for (int i = 0; i < n_g; i++)
        free(o->bytes[i]);
}

/* device_sample: sampled rows on the device too (be.sample_rows);
 * graphs: CUDA graphs of decode steps (else eager). */
static void dg_run_with(fixture *f, bool device_greedy, bool device_sample, bool graphs, dg_out *out)
{
    const run_cfg *c = &cfgs[3]; /* batch, bs 16, graphs of up to 8 */
    model_params mp = pg_golden_model_params(&c->pool);
    executor *ex = make_cuda(0);
    pg_error err;
    if (graphs && cuda_executor_set_graphs(ex, c->graph_batch, f->cfg.max_position_embeddings, &err))
        fail_msg("cuda_executor_set_graphs: %s", err.msg);
    model *m = open_model(f, ex, &mp);
    engine_params ep = pg_golden_engine_params(f, &c->pool);
    engine_backend be = model_backend(m);
    assert_non_null(be.greedy_rows); /* the CUDA executor has the path */
    if (!device_greedy)
        be.greedy_rows = NULL;
    assert_non_null(be.sample_rows);
    if (!device_sample)
        be.sample_rows = NULL;
    engine *e = NULL;
    if (engine_create(&e, &ep, &be, NULL, &err))
        fail_msg("engine_create: %s", err.msg);
    for (int i = 0; i < f->n_g; i++) {
        int32_t max_tokens;
        (void)golden_len(&f->g[i], &max_tokens);
        sampling_params sp = dg_params(i, max_tokens);
        uint64_t id;
        if (engine_add_request(e, f->g[i].prompt_ids, f->g[i].n_prompt, &sp,
                               (void *)(intptr_t)i, &id, &err))
            fail_msg("request %d: %s", i, err.msg);
    }
    int finished = 0;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("device greedy %d: step: %s", (int)device_greedy, err.msg);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int i = (int)(intptr_t)o->user;
            assert_true(i >= 0 && i < f->n_g && o->n_outputs == dg_params(i, 1).n);
            for (int k = 0; k < o->n_outputs; k++) {
                const seq_output *so = &o->outputs[k];
                const size_t nt = (size_t)so->n_tokens, ntop = nt * (size_t)so->n_top;
                out->n[i] += so->n_tokens;
                dg_put(out, i, so->token_ids, nt * sizeof(int32_t));
                dg_put(out, i, so->token_logprobs, nt * sizeof(float));
                dg_put(out, i, so->top_ids, ntop * sizeof(int32_t));
                dg_put(out, i, so->top_logprobs, ntop * sizeof(float));
            }
            request_output_free(o);
            finished++;
        }
    }
    assert_int_equal(finished, f->n_g);
    cuda_graph_info gi;
    cuda_executor_graph_info(ex, &gi);
    out->copied = gi.logits_copy_total_bytes;
    out->replays = gi.replays;
    engine_destroy(e);
    model_destroy(m);
    ex->op->destroy(ex);
}

static void dg_run(fixture *f, bool device_greedy, dg_out *out)
{
    dg_run_with(f, device_greedy, false, true, out);
}

static void test_device_greedy(void **state)
{
    fixture *f = *state;
    assert_true(f->n_g >= 4); /* plain greedy, sampled and host-greedy requests */
    dg_out on = {0}, off = {0};
    dg_run(f, true, &on);
    dg_run(f, false, &off);
    printf("    [device greedy] logits copied to the host: %zu bytes with, %zu without; "
           "%ld / %ld graph replays\n", on.copied, off.copied, on.replays, off.replays);
    assert_true(on.replays > 0 && off.replays > 0);
    dg_same(&on, &off, f->n_g);
    dg_free(&on, f->n_g);
    dg_free(&off, f->n_g);
    /* the plain greedy rows' logits stayed on the device: at least one row
     * of V f32 per token they generated past the first step */
    assert_true(on.copied + (size_t)f->cfg.vocab_size * 4u <= off.copied);
}

/* ---- device sampled rows ------------------------------------------------ */

/* dg_params's requests with every row taken on the device (plain greedy:
 * the argmax; greedy with logprobs: the logprob rows; sampled, with and
 * without logprobs, and greedy with a penalty and banned ids:
 * gpu/sampling.cu, then gpu/logprobs.cu on the drawn id), with graphs and
 * eager, against the sampled rows on the host: the same ids, logprobs and
 * top entries bit for bit, and no logits row copied to the host but the
 * one an n = 2 request forks from (it samples both sequences' first
 * tokens on the host). */
static void test_device_sampled(void **state)
{
    fixture *f = *state;
    assert_true(f->n_g >= 8);
    dg_out g = {0}, e = {0}, h = {0};
    dg_run_with(f, true, true, true, &g);
    dg_run_with(f, true, true, false, &e);
    dg_run_with(f, true, false, true, &h);
    printf("    [device sampled] logits copied to the host: %zu bytes (graphs), %zu (eager), %zu with the "
           "host sampling; %ld graph replays\n", g.copied, e.copied, h.copied, g.replays);
    assert_true(g.replays > 0 && e.replays == 0);
    dg_same(&g, &h, f->n_g);
    dg_same(&e, &h, f->n_g);
    dg_free(&g, f->n_g);
    dg_free(&e, f->n_g);
    dg_free(&h, f->n_g);
    const size_t row = (size_t)f->cfg.vocab_size * 4u;
    int n_fork = 0;
    for (int i = 0; i < f->n_g; i++)
        n_fork += dg_params(i, 1).n > 1;
    assert_int_equal(n_fork, 1);
    assert_true(g.copied == row * (size_t)n_fork && e.copied == row * (size_t)n_fork);
    /* the host's sampled rows came back: every token of requests 1, 4
     * (past its fork), 5, 6 and 7 */
    assert_true(h.copied >= row * (size_t)(h.n[1] + h.n[4] + h.n[5] + h.n[6] + h.n[7] - 1));
}

/* ---- device logprob rows ------------------------------------------------ */

/* Request i's sampling for the logprob-rows test: i % 5 = 0 plain greedy
 * with prompt logprobs (k 2), 1 sampled with logprobs (the host's), 2
 * greedy with logprobs 5 (the device's, token -1), 3 greedy with logprobs
 * 0 and prompt logprobs 0, 4 greedy with logprobs 20 and prompt logprobs 20
 * and a repetition penalty (its sampling rows: the host's). */
static sampling_params lp_params(int i, int32_t max_tokens)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = max_tokens;
    switch (i % 5) {
    case 0: sp.prompt_logprobs = 2; break;
    case 1: sp.temperature = 0.8f; sp.top_k = 20; sp.seed = 11u + (uint64_t)i; sp.logprobs = 3; break;
    case 2: sp.logprobs = 5; break;
    case 3: sp.logprobs = 0; sp.prompt_logprobs = 0; break;
    default: sp.logprobs = 20; sp.prompt_logprobs = 20; sp.repetition_penalty = 1.2f; break;
    }
    return sp;
}

/* Everything a request returns, as bytes (ids, logprobs, tops, prompt
 * logprobs, ranks, prompt tops), appended to a growing buffer. */
typedef struct lp_bytes {
    unsigned char *p[PG_GOLDEN_MAX];
    size_t n[PG_GOLDEN_MAX];
} lp_bytes;

static void lp_put(lp_bytes *b, int i, const void *src, size_t n)
{
    if (!src || n == 0)
        return;
    b->p[i] = realloc(b->p[i], b->n[i] + n);
    assert_non_null(b->p[i]);
    memcpy(b->p[i] + b->n[i], src, n);
    b->n[i] += n;
}

/* The batch of lp_params requests through the CUDA executor with graphs
 * (up to 8 sequences; max_num_seqs 8, so a prompt-logprob step hands its
 * lm_head rows over in slices of 8: model forward_head_slices), with the
 * device logprob rows on or off; plp_per_step: prompt logprobs one row per
 * step (the whole-forward path). Returns the logits bytes copied. */
static size_t lp_run(fixture *f, bool device_lp, bool plp_per_step, lp_bytes *out, long *replays)
{
    const pg_golden_pool pool = {16, 256, 8, 2048, true};
    model_params mp = pg_golden_model_params(&pool);
    executor *ex = make_cuda(0);
    pg_error err;
    if (cuda_executor_set_graphs(ex, 8, f->cfg.max_position_embeddings, &err))
        fail_msg("cuda_executor_set_graphs: %s", err.msg);
    model *m = open_model(f, ex, &mp);
    engine_params ep = pg_golden_engine_params(f, &pool);
    ep.prompt_logprobs_per_step = plp_per_step;
    engine_backend be = model_backend(m);
    assert_non_null(be.logprob_rows); /* the CUDA executor has the path */
    if (!device_lp)
        be.logprob_rows = NULL;
    engine *e = NULL;
    if (engine_create(&e, &ep, &be, NULL, &err))
        fail_msg("engine_create: %s", err.msg);
    for (int i = 0; i < f->n_g; i++) {
        int32_t max_tokens;
        (void)golden_len(&f->g[i], &max_tokens);
        sampling_params sp = lp_params(i, max_tokens < 12 ? max_tokens : 12);
        if (engine_add_request(e, f->g[i].prompt_ids, f->g[i].n_prompt, &sp, (void *)(intptr_t)i, NULL,
                               &err))
            fail_msg("request %d: %s", i, err.msg);
    }
    int finished = 0;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("device logprobs %d: step: %s", (int)device_lp, err.msg);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int i = (int)(intptr_t)o->user;
            assert_true(i >= 0 && i < f->n_g && o->n_outputs == 1);
            const seq_output *so = &o->outputs[0];
            size_t nt = (size_t)so->n_tokens, np = (size_t)o->n_prompt_tokens;
            lp_put(out, i, so->token_ids, nt * sizeof(int32_t));
            lp_put(out, i, so->token_logprobs, nt * sizeof(float));
            lp_put(out, i, so->top_ids, nt * (size_t)so->n_top * sizeof(int32_t));
            lp_put(out, i, so->top_logprobs, nt * (size_t)so->n_top * sizeof(float));
            lp_put(out, i, o->prompt_logprobs, np * sizeof(float));
            lp_put(out, i, o->prompt_ranks, np * sizeof(int32_t));
            lp_put(out, i, o->prompt_top_ids, np * (size_t)o->n_prompt_top * sizeof(int32_t));
            lp_put(out, i, o->prompt_top_logprobs, np * (size_t)o->n_prompt_top * sizeof(float));
            request_output_free(o);
            finished++;
        }
    }
    assert_int_equal(finished, f->n_g);
    cuda_graph_info gi;
    cuda_executor_graph_info(ex, &gi);
    *replays = gi.replays;
    engine_destroy(e);
    model_destroy(m);
    ex->op->destroy(ex);
    return gi.logits_copy_total_bytes;
}

/* The same bytes with the device logprob rows on and off (the host
 * computes the same definition: common/pg_logsoftmax.h), for prompt
 * logprobs in slices and one row per step; with them on, the marked rows
 * stay on the device. Fails without gpu/logprobs.cu's hook (no
 * logprob_rows, or bytes copied unchanged) and with any bit of the
 * device's arithmetic off the host's. */
static void test_device_logprobs(void **state)
{
    fixture *f = *state;
    assert_true(f->n_g >= 5);
    for (int per_step = 0; per_step < 2; per_step++) {
        lp_bytes on = {0}, off = {0};
        long r_on = 0, r_off = 0;
        size_t c_on = lp_run(f, true, per_step, &on, &r_on);
        size_t c_off = lp_run(f, false, per_step, &off, &r_off);
        printf("    [device logprobs, prompt logprobs %s] logits copied to the host: %zu bytes with, "
               "%zu without; %ld / %ld graph replays\n", per_step ? "per step" : "in slices", c_on, c_off,
               r_on, r_off);
        assert_true(r_on > 0 && r_off > 0);
        for (int i = 0; i < f->n_g; i++) {
            assert_int_equal(on.n[i], off.n[i]);
            assert_memory_equal(on.p[i], off.p[i], on.n[i]);
            free(on.p[i]);
            free(off.p[i]);
        }
        /* every prompt-logprob row and greedy-with-logprobs row stayed:
         * at least the prompt rows of request 0 (n_prompt - 1 rows of V) */
        assert_true(c_on + (size_t)(f->g[0].n_prompt - 1) * (size_t)f->cfg.vocab_size * 4u <= c_off);
    }
}

/* ---- embeddings --------------------------------------------------------- */

enum { EMB_N = 3 };

/* Pooled vectors of the first EMB_N golden prompts (pooling `type`), two
 * greedy requests running beside them (decode steps as graphs on cuda).
 * Destroys ex. */
static void embed_run(fixture *f, executor *ex, pooling_type type, float (*out)[64])
{
    assert_true(f->cfg.hidden_size <= 64 && f->n_g >= EMB_N);
    model_params mp = {.num_kv_blocks = 64, .block_size = 16, .max_num_batched_tokens = 64, .max_num_seqs = 8};
    pg_error err;
    if (strcmp(ex->name, "cuda") == 0 && cuda_executor_set_graphs(ex, 8, 256, &err))
        fail_msg("cuda_executor_set_graphs: %s", err.msg);
    model *m = open_model(f, ex, &mp);
    engine_params ep = engine_params_default();
    ep.block_size = 16;
    ep.num_blocks = 64;
    ep.max_num_seqs = 8;
    ep.max_num_batched_tokens = 64;
    ep.max_model_len = 256;
    engine_backend be = model_backend(m);
    engine *e = NULL;
    if (engine_create(&e, &ep, &be, NULL, &err))
        fail_msg("engine_create: %s", err.msg);
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 6;
    pooling_params pp = {.type = type, .normalize = true};
    for (int i = 0; i < EMB_N; i++) {
        if (i < 2 && engine_add_request(e, f->g[i].prompt_ids, f->g[i].n_prompt, &sp, (void *)(intptr_t)(100 + i),
                                        NULL, &err))
            fail_msg("request: %s", err.msg);
        if (engine_add_embed_request(e, f->g[i].prompt_ids, f->g[i].n_prompt, &pp, (void *)(intptr_t)i, NULL, &err))
            fail_msg("embedding request: %s", err.msg);
    }
    int done = 0;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("step: %s", err.msg);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            intptr_t i = (intptr_t)o->user;
            if (i < 100) {
                assert_int_equal(o->n_embedding, f->cfg.hidden_size);
                memcpy(out[i], o->embedding, (size_t)o->n_embedding * sizeof(float));
                done++;
            }
            request_output_free(o);
        }
    }
    assert_int_equal(done, EMB_N);
    engine_destroy(e);
    model_destroy(m);
    ex->op->destroy(ex);
}

static void test_embeddings(void **state)
{
    fixture *f = *state;
    const int32_t H = f->cfg.hidden_size;
    for (int t = 0; t < 2; t++) {
        pooling_type type = t ? POOLING_MEAN : POOLING_LAST;
        static float cpu[EMB_N][64], g1[EMB_N][64], g2[EMB_N][64];
        embed_run(f, make_cpu(), type, cpu);
        for (int precision = 1; precision >= 0; precision--) {
            embed_run(f, make_cuda(precision), type, g1);
            embed_run(f, make_cuda(precision), type, g2);
            double worst = 0;
            for (int i = 0; i < EMB_N; i++)
                for (int32_t j = 0; j < H; j++) {
                    double d = fabs((double)g1[i][j] - (double)cpu[i][j]);
                    worst = d > worst || d != d ? d : worst;
                }
            double tol = precision ? 1e-5 : 1e-2;
            printf("    %s pooling, %s: max |diff| vs cpu %.3g (bound %.0e)\n", pooling_type_name(type),
                   precision ? "f32" : "bf16", worst, tol);
            assert_true(worst <= tol);
            assert_memory_equal(g1, g2, sizeof g1);
        }
    }
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest attn[] = {
        cmocka_unit_test(test_long_attention),
    };
    const struct CMUnitTest goldens[] = {
        cmocka_unit_test(test_logits_f32),
        cmocka_unit_test(test_logits_bf16),
        cmocka_unit_test(test_launches_per_step),
        cmocka_unit_test(test_greedy_f32),
        cmocka_unit_test(test_greedy_bf16),
        cmocka_unit_test(test_device_greedy),
        cmocka_unit_test(test_device_sampled),
        cmocka_unit_test(test_device_logprobs),
        cmocka_unit_test(test_embeddings),
    };
    int rc = cmocka_run_group_tests(attn, NULL, NULL);
    rc |= cmocka_run_group_tests(goldens, setup, teardown);
    return rc;
}
#endif /* PG_HAVE_CUDA */
