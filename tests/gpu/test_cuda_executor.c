/* test_cuda_executor (suite gpu; suite gpu-emu on the host-emulated device,
 * tests/cuda_emu): the CUDA executor's own contract beyond the op results
 * that tests/ops checks —
 *  - begin_step rejects what the CPU twin rejects (a negative slot or
 *    block-table entry) and a position that disagrees with
 *    seq_lens - q_len + i (the kernels' derivation); embed rejects token
 *    ids outside [0, V);
 *  - cuda_executor_argmax: ties -> lowest id, NaN never wins, a row of
 *    -inf/NaN only -> -1 and PG_EINVAL (core/sampler.c's greedy rule),
 *    and the same ids as sampler_sample at temperature 0 on tie-heavy rows;
 *  - cuda_executor_logprobs (gpu/logprobs.cu) against the host's
 *    pg_lsm_row_eval (common/pg_logsoftmax.h) bit for bit: lse, logprob,
 *    rank, top k on tie-heavy and extreme rows (huge, tiny, -inf, NaN,
 *    +-0), V below, at and not a multiple of the block, every k;
 *  - copy_blocks rejects a chained or doubled destination;
 *  - decode attention over more partitions than the grid's 32 splits
 *    (blocks merging several) against a double-precision reference, and
 *    bit-identical alone and in a batch;
 *  - the fused rope_kv (gpu/rope_kv.cu) against its twins, the four ops
 *    add_bias, qk_norm, rope and kv_write one by one: the same bytes in
 *    qkv and both cache planes on random rows (one token and several; GQA
 *    ratios 1, 2, 4, 8; head_dim 8, 64, 128; bf16/bf16, bf16/f16,
 *    f32/f32; with and without bias and q/k norm);
 *  - on the emulated device, the prefill kernel launches blocks for the
 *    prefill sequences only (the emulator counts them).
 * Without CUDA built or without a device: SKIP (77). */
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
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_executor.h"
#include "pg_logsoftmax.h"
#include "sampler.h"
#include "sampling_params.h"
#include "test_support.h"
#ifdef PG_CUDA_EMU
#include "emu_hooks.h"
#endif

static executor *make_cuda(int precision)
{
    executor *ex = NULL;
    pg_error err;
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    if (cuda_executor_create(&ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    return ex;
}

/* A valid step: sequence 0 decodes (len 5), sequence 1 prefills 3 tokens
 * of a 7-token context, sequence 2 decodes (len 1); block size 4. */
enum { BS = 4, STRIDE = 2 };
typedef struct batch_fix {
    int32_t tok[5], pos[5], slots[5], qs[4], lens[3], bt[3 * STRIDE], rows[3];
    step_batch b;
} batch_fix;

static void batch_init(batch_fix *f)
{
    const int32_t tok[5] = {1, 2, 3, 4, 5}, qs[4] = {0, 1, 4, 5}, lens[3] = {5, 7, 1};
    const int32_t bt[3 * STRIDE] = {0, 1, 2, 3, 4, 0}, rows[3] = {0, 3, 4};
    memcpy(f->tok, tok, sizeof tok);
    memcpy(f->qs, qs, sizeof qs);
    memcpy(f->lens, lens, sizeof lens);
    memcpy(f->bt, bt, sizeof bt);
    memcpy(f->rows, rows, sizeof rows);
    for (int32_t s = 0; s < 3; s++)
        for (int32_t t = qs[s]; t < qs[s + 1]; t++) {
            f->pos[t] = lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]);
            f->slots[t] = bt[s * STRIDE + f->pos[t] / BS] * BS + f->pos[t] % BS;
        }
    step_batch b = {.num_tokens = 5, .num_seqs = 3, .block_size = BS, .token_ids = f->tok,
                    .positions = f->pos, .slots = f->slots, .query_start = f->qs,
                    .seq_lens = f->lens, .block_tables = f->bt, .block_table_stride = STRIDE,
                    .max_seq_len = 7, .max_query_len = 3, .num_logits = 3, .logits_rows = f->rows};
    f->b = b;
}

static void test_begin_step_checks(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    batch_fix f;
    batch_init(&f);
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);

    f.pos[2] = 6; /* query 1 of the prefill (seq_len 7, q_len 3): position 5 */
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "expected position 5, got 6"));
    batch_init(&f);
    f.slots[4] = -1;
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "slot"));
    batch_init(&f);
    f.bt[1 * STRIDE + 1] = -3;
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "block table entry 1"));

    /* embed: token ids must be in [0, V) */
    batch_init(&f);
    const int32_t H = 8, V = 6;
    float table[6 * 8];
    for (int i = 0; i < V * H; i++)
        table[i] = (float)i;
    void *d_table = ex->op->alloc(ex, EXEC_WT, (size_t)V * H);
    void *d_x = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * H);
    assert_true(d_table && d_x);
    assert_int_equal(ex->op->upload(ex, d_table, EXEC_WT, 0, table, ST_F32, (size_t)V * H), 0);
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    assert_int_equal(ex->op->embed(ex, d_x, d_table, H, V, &f.b), 0);
    f.tok[3] = V;
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    assert_int_equal(ex->op->embed(ex, d_x, d_table, H, V, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "token 3"));
    assert_int_equal(ex->op->sync(ex), 0);
    ex->op->free(ex, d_table);
    ex->op->free(ex, d_x);
    ex->op->destroy(ex);
}

static void test_argmax_rule(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    enum { R = 4, V = 300 };
    float *lg = malloc((size_t)R * V * sizeof *lg);
    assert_non_null(lg);
    for (int i = 0; i < R * V; i++)
        lg[i] = -1.0f;
    lg[0 * V + 7] = 2.0f; /* row 0: a tie at 7 and 250 -> 7, NaN elsewhere never wins */
    lg[0 * V + 250] = 2.0f;
    lg[0 * V + 3] = NAN;
    for (int v = 0; v < V; v++) /* row 1: -inf and NaN except one finite value at 299 */
        lg[1 * V + v] = v % 2 ? -INFINITY : NAN;
    lg[1 * V + 299] = -1e30f;
    lg[2 * V + 0] = INFINITY; /* row 2: +inf wins */
    for (int v = 0; v < V; v++) /* row 3: nothing > -inf */
        lg[3 * V + v] = v % 3 ? -INFINITY : NAN;
    float *d = ex->op->alloc(ex, EXEC_F32, (size_t)R * V);
    assert_non_null(d);
    assert_int_equal(ex->op->upload(ex, d, EXEC_F32, 0, lg, ST_F32, (size_t)R * V), 0);
    int32_t ids[R];
    assert_int_equal(cuda_executor_argmax(ex, ids, d, 3, V), 0);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 299);
    assert_int_equal(ids[2], 0);
    assert_int_equal(cuda_executor_argmax(ex, ids, d, R, V), PG_EINVAL);
    assert_int_equal(ids[3], -1);
    assert_non_null(strstr(ex->op->last_error(ex), "row 3"));
    ex->op->free(ex, d);
    free(lg);
    ex->op->destroy(ex);
}

/* The device argmax against core/sampler.c's greedy sampling (temperature
 * 0, no processors) on rows full of ties: the same id for every row, the
 * rule a device-side greedy path must keep (ties -> lowest id, +0 = -0,
 * NaN never wins, +inf wins). */
static void test_argmax_matches_sampler(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    enum { R = 64, V = 1000 };
    static const float pool[] = {-1.0f, 0.0f, -0.0f, 0.5f, 0.50000006f, -INFINITY, NAN, 0.25f};
    float *lg = malloc((size_t)R * V * sizeof *lg), *row = malloc(V * sizeof *row);
    assert_true(lg && row);
    uint32_t r = 99u;
    for (int32_t i = 0; i < R; i++) {
        /* rows use ever fewer values, so the winner is tied more often */
        const uint32_t n = 2u + (uint32_t)i % 7u;
        for (int32_t v = 0; v < V; v++)
            lg[i * V + v] = pool[((r = r * 1664525u + 1013904223u) >> 16) % n];
    }
    lg[5 * V + 999] = INFINITY;
    float *d = ex->op->alloc(ex, EXEC_F32, (size_t)R * V);
    assert_non_null(d);
    assert_int_equal(ex->op->upload(ex, d, EXEC_F32, 0, lg, ST_F32, (size_t)R * V), 0);
    int32_t ids[R];
    assert_int_equal(cuda_executor_argmax(ex, ids, d, R, V), 0);
    sampler_workspace *ws = sampler_workspace_create(V);
    assert_non_null(ws);
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sampler_rng rng = sampler_rng_init(1, 0);
    for (int32_t i = 0; i < R; i++) {
        memcpy(row, lg + (size_t)i * V, V * sizeof *row);
        sampler_result res = {0};
        assert_int_equal(sampler_sample(ws, &sp, row, V, NULL, &rng, &res), 0);
        if (ids[i] != res.token_id)
            fail_msg("row %d: device argmax %d, sampler %d", (int)i, (int)ids[i], (int)res.token_id);
    }
    sampler_workspace_destroy(ws);
    ex->op->free(ex, d);
    free(lg);
    free(row);
    ex->op->destroy(ex);
}

/* float/double equal bit for bit, or both NaN (a NaN's payload is the
 * hardware's: x86 and the GPU make different default NaNs) */
static int same_f(float a, float b)
{
    return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}
static int same_d(double a, double b)
{
    return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}

/* Fills row [V] of kind 0..10 (rng state *r). */
static void lp_fill(float *row, int32_t V, int kind, uint32_t *r)
{
    static const float ties[] = {-1.0f, 0.0f, -0.0f, 0.5f, 0.50000006f, -INFINITY, 0.25f, 3.0f};
    for (int32_t v = 0; v < V; v++) {
        *r = *r * 1664525u + 1013904223u;
        float u = (float)(*r >> 8) * 0x1p-24f; /* [0, 1) */
        switch (kind) {
        case 0: row[v] = 20.0f * u - 10.0f; break;
        case 1: row[v] = ties[(*r >> 16) % 8u]; break;
        case 2: row[v] = ties[(*r >> 16) % 3u]; break;                 /* -1, +0, -0 only */
        case 3: row[v] = (u - 0.5f) * 3e38f * 2.0f; break;                  /* huge */
        case 4: row[v] = (u - 0.5f) * 1e-38f; break;                    /* tiny, subnormal */
        case 5: row[v] = u < 0.95f ? -INFINITY : u; break;              /* mostly -inf */
        case 6: row[v] = (*r >> 16) % 5u == 0 ? NAN : u; break;         /* NaN entries */
        case 7: row[v] = v == V - 1 ? 1.0f : -INFINITY; break;          /* one finite, at the end */
        case 8: row[v] = (*r >> 16) % 2u ? -INFINITY : NAN; break;      /* nothing > -inf */
        case 9: row[v] = 100.0f * u; break;                             /* wide */
        default: row[v] = v == 0 ? 0.0f : -8.0f * u; break;             /* max 0: lse = log(sum), every bit seen */
        }
    }
}

/* gpu/logprobs.cu against pg_lsm_row_eval, the host's definition. */
static void test_logprobs_match_host(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
#ifdef PG_CUDA_EMU
    static const int32_t Vs[] = {1, 7, 255, 256, 257, 1000, 5003};
#else
    static const int32_t Vs[] = {1, 7, 255, 256, 257, 1000, 5003, 32000, 151936};
#endif
    enum { KINDS = 11, PER = 3 }; /* rows per kind: different tokens and k */
    const int32_t R = KINDS * PER;
    uint32_t rs = 7u;
    for (size_t iv = 0; iv < sizeof Vs / sizeof *Vs; iv++) {
        const int32_t V = Vs[iv];
        float *lg = malloc((size_t)R * V * sizeof *lg);
        pg_lsm_row *dev = calloc((size_t)R, sizeof *dev), *host = calloc((size_t)R, sizeof *host);
        assert_true(lg && dev && host);
        for (int32_t i = 0; i < R; i++) {
            lp_fill(lg + (size_t)i * V, V, i / PER, &rs);
            dev[i].token = i % PER == 0 ? -1 : (int32_t)((rs >> 4) % (uint32_t)V);
            dev[i].k = (int32_t)((uint32_t)(i * 7 + (int32_t)iv) % (PG_LSM_MAX_TOP + 1));
            host[i] = dev[i];
            host[i].want = 1;
            pg_lsm_row_eval(&host[i], lg + (size_t)i * V, V);
        }
        float *d = ex->op->alloc(ex, EXEC_F32, (size_t)R * V);
        assert_non_null(d);
        assert_int_equal(ex->op->upload(ex, d, EXEC_F32, 0, lg, ST_F32, (size_t)R * V), 0);
        assert_int_equal(cuda_executor_logprobs(ex, dev, d, R, V), 0);
        for (int32_t i = 0; i < R; i++) {
            const pg_lsm_row *a = &dev[i], *b = &host[i];
            int ok = a->want == 1 && a->token == b->token && a->k == b->k && a->n_top == b->n_top &&
                     a->rank == b->rank && same_d(a->lse, b->lse) && same_f(a->logprob, b->logprob);
            for (int32_t j = 0; j < PG_LSM_MAX_TOP && ok; j++)
                ok = a->top_ids[j] == b->top_ids[j] && same_f(a->top_lp[j], b->top_lp[j]);
            if (!ok)
                fail_msg("V %d row %d (kind %d, token %d, k %d): device token %d lse %.17g lp %.9g rank %d "
                         "n_top %d top0 %d %.9g; host token %d lse %.17g lp %.9g rank %d n_top %d top0 %d %.9g",
                         (int)V, (int)i, (int)(i / PER), (int)host[i].token, (int)b->k, (int)a->token,
                         a->lse, (double)a->logprob, (int)a->rank, (int)a->n_top, (int)a->top_ids[0],
                         (double)a->top_lp[0], (int)b->token, b->lse, (double)b->logprob, (int)b->rank,
                         (int)b->n_top, (int)b->top_ids[0], (double)b->top_lp[0]);
        }
        /* a greedy row (token -1) gets the sampler's greedy id */
        sampler_workspace *ws = sampler_workspace_create(V);
        assert_non_null(ws);
        sampling_params sp = sampling_params_default();
        sp.temperature = 0.0f;
        sampler_rng rng = sampler_rng_init(1, 0);
        float *row = malloc((size_t)V * sizeof *row);
        assert_non_null(row);
        for (int32_t i = 0; i < R; i += PER) {
            memcpy(row, lg + (size_t)i * V, (size_t)V * sizeof *row);
            sampler_result res = {0};
            int rc = sampler_sample(ws, &sp, row, V, NULL, &rng, &res);
            assert_int_equal(rc == 0 ? res.token_id : -1, dev[i].token);
        }
        free(row);
        sampler_workspace_destroy(ws);
        ex->op->free(ex, d);
        free(lg);
        free(dev);
        free(host);
    }
    ex->op->destroy(ex);
}

static void test_copy_blocks_pairs(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    const int32_t nb = 8, block_elems = 16, planes = 2;
    const size_t plane = (size_t)nb * block_elems;
    void *kv = ex->op->alloc(ex, EXEC_KV, plane * planes);
    assert_non_null(kv);
    const int32_t ok_pairs[] = {0, 1, 0, 2, 3, 4, 5, 5};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, ok_pairs, 4), 0);
    const int32_t chain[] = {0, 1, 1, 2};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, chain, 2), PG_EINVAL);
    const int32_t twice[] = {0, 3, 1, 3};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, twice, 2), PG_EINVAL);
    assert_int_equal(ex->op->sync(ex), 0);
    ex->op->free(ex, kv);
    ex->op->destroy(ex);
}

/* Decode attention over more than CUDA_PLAN_DECODE_MAX_SPLITS (32)
 * partitions: a context of 17000 tokens is 34 partitions of 512, so blocks
 * 0 and 1 each merge two (paged_attention.cu). The output must match a
 * double-precision softmax(q.k) v to f32 accuracy, and be bit-identical
 * alone and beside a short sequence (the merge order does not depend on
 * the batch's grid). */
static void test_decode_beyond_max_splits(void **state)
{
    (void)state;
    enum { NH = 2, NKV = 1, HD = 8, W = (NH + 2 * NKV) * HD, LEN = 17000, BSZ = 16,
           NBLK = (LEN + BSZ - 1) / BSZ + 1 };
    executor *ex = make_cuda(1);
    const size_t plane = (size_t)NBLK * BSZ * NKV * HD;
    float *hq = malloc(2 * W * sizeof *hq), *hkv = malloc(2 * plane * sizeof *hkv);
    float *o1 = malloc(2 * NH * HD * sizeof *o1), *o2 = malloc(2 * NH * HD * sizeof *o2);
    int32_t *bt = malloc(2 * NBLK * sizeof *bt);
    assert_true(hq && hkv && o1 && o2 && bt);
    uint32_t r = 7u;
    for (size_t i = 0; i < 2 * W; i++)
        hq[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < 2 * plane; i++)
        hkv[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    /* sequence 0: blocks in reverse order; sequence 1 (17 tokens): block 0, 1 */
    for (int32_t k = 0; k < NBLK; k++) {
        bt[k] = NBLK - 1 - k;
        bt[NBLK + k] = k;
    }
    void *qkv = ex->op->alloc(ex, EXEC_ACT, 2 * W), *kv = ex->op->alloc(ex, EXEC_KV, 2 * plane);
    void *out = ex->op->alloc(ex, EXEC_ACT, 2 * NH * HD);
    assert_true(qkv && kv && out);
    assert_int_equal(ex->op->upload(ex, qkv, EXEC_ACT, 0, hq, ST_F32, 2 * W), 0);
    assert_int_equal(ex->op->upload(ex, kv, EXEC_KV, 0, hkv, ST_F32, 2 * plane), 0);
    void *v_cache = (char *)kv + plane * ex->kv_bytes;
    const float scale = 0.35f;
    int32_t tok[2] = {0, 0}, pos[2] = {LEN - 1, 16}, slots[2] = {0, 16}, qs[3] = {0, 1, 2};
    int32_t lens[2] = {LEN, 17}, rows[2] = {0, 1};
    for (int pass = 0; pass < 2; pass++) { /* alone, then beside sequence 1 */
        const int32_t S = pass + 1;
        step_batch b = {.num_tokens = S, .num_seqs = S, .block_size = BSZ, .token_ids = tok,
                        .positions = pos, .slots = slots, .query_start = qs, .seq_lens = lens,
                        .block_tables = bt, .block_table_stride = NBLK, .max_seq_len = LEN,
                        .max_query_len = 1, .num_logits = S, .logits_rows = rows};
        assert_int_equal(ex->op->begin_step(ex, &b), 0);
        if (ex->op->attention(ex, out, qkv, kv, v_cache, NH, NKV, HD, scale, &b))
            fail_msg("attention: %s", ex->op->last_error(ex));
        assert_int_equal(ex->op->download_f32(ex, pass ? o2 : o1, out, EXEC_ACT, (size_t)S * NH * HD),
                         0);
    }
    assert_memory_equal(o1, o2, NH * HD * sizeof *o1);
    /* the reference, in double */
    for (int32_t h = 0; h < NH; h++) {
        const float *q = hq + h * HD;
        double m = -INFINITY, l = 0.0, o[HD] = {0};
        double *sc = malloc(LEN * sizeof *sc);
        assert_non_null(sc);
        for (int32_t j = 0; j < LEN; j++) {
            size_t slot = (size_t)bt[j / BSZ] * BSZ + (size_t)(j % BSZ);
            double d = 0.0;
            for (int32_t e = 0; e < HD; e++)
                d += (double)q[e] * (double)hkv[slot * HD + e];
            sc[j] = d * (double)scale;
            m = sc[j] > m ? sc[j] : m;
        }
        for (int32_t j = 0; j < LEN; j++) {
            size_t slot = (size_t)bt[j / BSZ] * BSZ + (size_t)(j % BSZ);
            double p = exp(sc[j] - m);
            l += p;
            for (int32_t e = 0; e < HD; e++)
                o[e] += p * (double)hkv[plane + slot * HD + e];
        }
        free(sc);
        for (int32_t e = 0; e < HD; e++) {
            double ref = o[e] / l, got = (double)o1[h * HD + e];
            if (fabs(got - ref) > 2e-6 + 1e-5 * fabs(ref))
                fail_msg("head %d dim %d: expected %.9g, got %.9g", (int)h, (int)e, ref, got);
        }
    }
    ex->op->free(ex, qkv);
    ex->op->free(ex, kv);
    ex->op->free(ex, out);
    ex->op->destroy(ex);
    free(hq);
    free(hkv);
    free(o1);
    free(o2);
    free(bt);
}

/* ---- fused kernels against their twins, bit for bit ------------------------ */

/* rope_kv (gpu/rope_kv.cu: bias + q/k norm + rope + kv_write in one launch)
 * against the four ops one by one (add_bias, qk_norm, rope, kv_write) on
 * random rows: qkv after the call and both cache planes must be the same
 * bytes. Shapes: one token and several, GQA ratios 1, 4 and 8, head_dim 64
 * and 128 (and 8), bf16/bf16, bf16/f16 and f32/f32, each with and without
 * bias and q/k norm. */
static void test_rope_kv_fused(void **state)
{
    (void)state;
    static const struct {
        int32_t T, nh, nkv, hd;
    } shapes[] = {{1, 8, 1, 64}, {3, 4, 4, 128}, {5, 8, 2, 64}, {2, 16, 2, 128}, {4, 2, 1, 8}};
    static const struct {
        int precision, kv_dtype;
    } types[] = {{0, 0}, {0, 1}, {1, 0}};
    uint32_t r = 12345u;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        cuda_executor_params p = cuda_executor_params_default();
        p.precision = types[ti].precision;
        p.kv_dtype = types[ti].kv_dtype;
        executor *ex[2];
        pg_error err;
        for (int e = 0; e < 2; e++)
            if (cuda_executor_create(&ex[e], &p, &err))
                fail_msg("cuda_executor_create: %s", err.msg);
        assert_non_null(ex[0]->op->rope_kv);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int variant = 0; variant < 4; variant++) {
                const int32_t T = shapes[si].T, nh = shapes[si].nh, nkv = shapes[si].nkv;
                const int32_t hd = shapes[si].hd, W = (nh + 2 * nkv) * hd, BSZ = 16, NBLK = 4, STR = 256;
                const size_t plane = (size_t)NBLK * BSZ * nkv * hd;
                const int bias = variant & 1, norm = variant >> 1;
                float *hq = malloc((size_t)T * W * sizeof *hq), *hb = malloc((size_t)W * sizeof *hb);
                float *hw = malloc((size_t)2 * hd * sizeof *hw), *hf = malloc((size_t)hd / 2 * sizeof *hf);
                float *hkv = malloc(2 * plane * sizeof *hkv);
                float *got[2][2];
                assert_true(hq && hb && hw && hf && hkv);
                for (int32_t i = 0; i < T * W; i++)
                    hq[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / 4194304.0f - 2.0f;
                for (int32_t i = 0; i < W; i++)
                    hb[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
                for (int32_t i = 0; i < 2 * hd; i++)
                    hw[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f + 0.5f;
                for (int32_t i = 0; i < hd / 2; i++)
                    hf[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
                for (size_t i = 0; i < 2 * plane; i++)
                    hkv[i] = 7.0f; /* a slot nobody writes keeps it */
                /* one sequence per token, positions far apart (large angles) */
                int32_t tok[8] = {0}, pos[8], slots[8], qs[9], lens[8], rows[8];
                int32_t *bt = calloc((size_t)8 * STR, sizeof *bt);
                assert_non_null(bt);
                for (int32_t t = 0; t < T; t++) {
                    r = r * 1664525u + 1013904223u;
                    pos[t] = (int32_t)((r >> 8) % 4000u); /* angles up to ~4000 rad */
                    lens[t] = pos[t] + 1;
                    slots[t] = t * 3 + 1;
                    qs[t] = t;
                    rows[t] = t;
                }
                qs[T] = T;
                for (int e = 0; e < 2; e++) {
                    executor *x = ex[e];
                    void *qkv = x->op->alloc(x, EXEC_ACT, (size_t)T * W);
                    void *kv = x->op->alloc(x, EXEC_KV, 2 * plane);
                    float *b = x->op->alloc(x, EXEC_F32, (size_t)W);
                    float *w = x->op->alloc(x, EXEC_F32, (size_t)2 * hd);
                    float *f = x->op->alloc(x, EXEC_F32, (size_t)hd / 2);
                    assert_true(qkv && kv && b && w && f);
                    assert_int_equal(x->op->upload(x, qkv, EXEC_ACT, 0, hq, ST_F32, (size_t)T * W), 0);
                    assert_int_equal(x->op->upload(x, kv, EXEC_KV, 0, hkv, ST_F32, 2 * plane), 0);
                    assert_int_equal(x->op->upload(x, b, EXEC_F32, 0, hb, ST_F32, (size_t)W), 0);
                    assert_int_equal(x->op->upload(x, w, EXEC_F32, 0, hw, ST_F32, (size_t)2 * hd), 0);
                    assert_int_equal(x->op->upload(x, f, EXEC_F32, 0, hf, ST_F32, (size_t)hd / 2), 0);
                    step_batch sb = {.num_tokens = T, .num_seqs = T, .block_size = BSZ,
                                     .token_ids = tok, .positions = pos, .slots = slots,
                                     .query_start = qs, .seq_lens = lens, .block_tables = bt,
                                     .block_table_stride = STR, .max_seq_len = 4000,
                                     .max_query_len = 1, .num_logits = T, .logits_rows = rows};
                    void *v_cache = (char *)kv + plane * x->kv_bytes;
                    const float eps = 1e-6f;
                    int rc = x->op->begin_step(x, &sb);
                    if (e == 0) {
                        if (!rc)
                            rc = x->op->rope_kv(x, qkv, kv, v_cache, bias ? b : NULL,
                                                norm ? w : NULL, norm ? w + hd : NULL, eps, f, nh,
                                                nkv, hd, &sb);
                    } else {
                        if (!rc && bias)
                            rc = x->op->add_bias(x, qkv, b, T, W);
                        if (!rc && norm)
                            rc = x->op->qk_norm(x, qkv, w, w + hd, T, nh, nkv, hd, eps);
                        if (!rc)
                            rc = x->op->rope(x, qkv, f, nh, nkv, hd, &sb);
                        if (!rc)
                            rc = x->op->kv_write(x, kv, v_cache, qkv, nh, nkv, hd, &sb);
                    }
                    if (rc)
                        fail_msg("%s: %s", e ? "the four ops" : "rope_kv", x->op->last_error(x));
                    got[e][0] = malloc((size_t)T * W * sizeof(float));
                    got[e][1] = malloc(2 * plane * sizeof(float));
                    assert_true(got[e][0] && got[e][1]);
                    assert_int_equal(x->op->download_f32(x, got[e][0], qkv, EXEC_ACT, (size_t)T * W), 0);
                    assert_int_equal(x->op->download_f32(x, got[e][1], kv, EXEC_KV, 2 * plane), 0);
                    x->op->free(x, qkv);
                    x->op->free(x, kv);
                    x->op->free(x, b);
                    x->op->free(x, w);
                    x->op->free(x, f);
                }
                if (memcmp(got[0][0], got[1][0], (size_t)T * W * sizeof(float)) ||
                    memcmp(got[0][1], got[1][1], 2 * plane * sizeof(float)))
                    fail_msg("rope_kv differs from its twin: precision %d kv %d, T %d nh %d nkv %d hd %d, "
                             "bias %d norm %d", types[ti].precision, types[ti].kv_dtype, (int)T,
                             (int)nh, (int)nkv, (int)hd, bias, norm);
                /* the rows changed; slot 0 (nobody's) was not written, slot 1 was */
                assert_true(memcmp(got[0][0], hq, (size_t)T * W * sizeof(float)) != 0);
                assert_true(got[0][1][0] == 7.0f && got[0][1][(size_t)nkv * hd] != 7.0f);
                for (int e = 0; e < 2; e++) {
                    free(got[e][0]);
                    free(got[e][1]);
                }
                free(hq);
                free(hb);
                free(hw);
                free(hf);
                free(hkv);
                free(bt);
            }
        ex[0]->op->destroy(ex[0]);
        ex[1]->op->destroy(ex[1]);
    }
}

#ifdef PG_CUDA_EMU
/* Prefill blocks: grid_x * nkv per prefill sequence, none for decodes. */
static void test_prefill_grid(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    batch_fix f;
    batch_init(&f);
    const int32_t nh = 4, nkv = 2, hd = 8, W = (nh + 2 * nkv) * hd;
    void *qkv = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * W);
    void *kv = ex->op->alloc(ex, EXEC_KV, (size_t)2 * 5 * BS * nkv * hd);
    void *out = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * nh * hd);
    assert_true(qkv && kv && out);
    float *z = calloc((size_t)2 * 5 * BS * nkv * hd, sizeof *z);
    assert_non_null(z);
    assert_int_equal(ex->op->upload(ex, qkv, EXEC_ACT, 0, z, ST_F32, (size_t)5 * W), 0);
    assert_int_equal(ex->op->upload(ex, kv, EXEC_KV, 0, z, ST_F32, (size_t)2 * 5 * BS * nkv * hd), 0);
    long before = emu_blocks_launched("prefill_attention_kernel");
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    void *v_cache = (char *)kv + (size_t)5 * BS * nkv * hd * ex->kv_bytes;
    assert_int_equal(ex->op->attention(ex, out, qkv, kv, v_cache, nh, nkv, hd, 0.5f, &f.b), 0);
    assert_int_equal(ex->op->sync(ex), 0);
    /* one prefill sequence of 3 tokens x G = 2 rows: grid_x = 1 */
    assert_int_equal(emu_blocks_launched("prefill_attention_kernel") - before, 1 * nkv * 1);
    free(z);
    ex->op->free(ex, qkv);
    ex->op->free(ex, kv);
    ex->op->free(ex, out);
    ex->op->destroy(ex);
}
#endif

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin_step_checks),
        cmocka_unit_test(test_argmax_rule),
        cmocka_unit_test(test_argmax_matches_sampler),
        cmocka_unit_test(test_logprobs_match_host),
        cmocka_unit_test(test_copy_blocks_pairs),
        cmocka_unit_test(test_decode_beyond_max_splits),
        cmocka_unit_test(test_rope_kv_fused),
#ifdef PG_CUDA_EMU
        cmocka_unit_test(test_prefill_grid),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif /* PG_HAVE_CUDA */
