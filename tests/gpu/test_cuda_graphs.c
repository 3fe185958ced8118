/* test_cuda_graphs (suite gpu; suite gpu-emu on the host-emulated device,
 * tests/cuda_emu): CUDA graphs of decode steps (cuda_executor.h, run_step)
 * against the eager path.
 *
 * Two executors get the same weights and the same KV cache; one runs every
 * step eagerly, the other through run_step with graphs on. A small forward
 * written here (every op a decode step of core/model.c uses: embed,
 * rmsnorm with and without residual, matmul, rope, kv_write, attention,
 * silu_mul, gather_rows, logits) is what run_step captures; the cache is
 * filled with random data up front, so contexts of several hundred tokens
 * cost no prefill. Over a series of decode steps with
 *  - batch sizes 1 .. 8, padded into the buckets 1, 2, 4, 8,
 *  - context lengths on both sides of the decode partition (512 tokens:
 *    one partition written directly, two combined by the reduction kernel),
 *  - block tables and slots drawn anew every step,
 * the logits and, at the end, the whole KV cache must be bit-identical; a
 * prefill chunk through run_step runs eagerly; a replay rejects what the
 * eager begin_step and embed reject.
 * Negative controls, kept as tests that assert the failure is seen:
 *  - replays that skip copying the step's metadata into the fixed buffers
 *    give logits that differ from the eager step's;
 *  - a graph buffer reallocated without the graphs knowing (what a buffer
 *    grown on demand after a capture would be): the emulator reports the
 *    replay's use of the freed buffer (emulator only: on a device it is a
 *    use-after-free). The tracked reallocation is captured again and stays
 *    bit-identical (positive control).
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
#include "test_support.h"
#ifdef PG_CUDA_EMU
#include "emu_hooks.h"
#endif

/* tiny shapes: the emulator runs a fiber per CUDA thread. BIG_BATCH,
 * BIG_TOKENS: the fixtures at the CLI's default --max-num-seqs 256 (a
 * prefill of 256 prompts of 8 tokens); LONG_LEN: a 128k max_model_len. */
enum {
    H = 16, NH = 2, NKV = 1, HD = 8, Q = NH * HD, QKV = (NH + 2 * NKV) * HD, I = 32, V = 40,
    BS = 16, NB = 320, MAX_LEN = 700, MAX_BATCH = 8, TMAX = MAX_BATCH,
    BIG_BATCH = 256, BIG_TOKENS = 2048, LONG_LEN = 131072,
    KV_ELEMS = NB * BS * NKV * HD, TABLE_STRIDE = (MAX_LEN + BS - 1) / BS,
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float rndf(void) { return (float)(rnd() % 2001) / 1000.0f - 1.0f; }

/* host copies of the weights and the initial cache, shared by both executors */
typedef struct host_model {
    float emb[V * H], qkv[QKV * H], o[H * Q], gu[2 * I * H], down[H * I];
    float n1[H], n2[H], inv_freq[HD / 2];
    float *k, *v; /* [KV_ELEMS] */
} host_model;

typedef struct dev_model {
    executor *ex;
    void *emb, *w_qkv, *w_o, *w_gu, *w_down;
    float *n1, *n2, *inv_freq;
    void *k, *v;
    void *x, *normed, *qkv, *attn, *proj, *gu, *mlp, *rows;
    int fail_next;        /* the next forward fails (before any op): a failed warm-up */
} dev_model;

static void *dalloc(executor *ex, exec_buf_kind kind, size_t n)
{
    void *p = ex->op->alloc(ex, kind, n);
    if (!p)
        fail_msg("alloc: %s", ex->op->last_error(ex));
    return p;
}

static void *dupload(executor *ex, exec_buf_kind kind, const float *src, size_t n)
{
    void *p = dalloc(ex, kind, n);
    if (ex->op->upload(ex, p, kind, 0, src, ST_F32, n))
        fail_msg("upload: %s", ex->op->last_error(ex));
    return p;
}

/* graph_batch 0: eager only; tmax: the most tokens of a step */
static void dev_model_init(dev_model *d, const host_model *h, int32_t graph_batch,
                           int32_t graph_len, int32_t tmax)
{
    pg_error err;
    cuda_executor_params p = cuda_executor_params_default();
    if (cuda_executor_create(&d->ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    if (graph_batch && cuda_executor_set_graphs(d->ex, graph_batch, graph_len, &err))
        fail_msg("cuda_executor_set_graphs: %s", err.msg);
    executor *ex = d->ex;
    d->emb = dupload(ex, EXEC_WT, h->emb, V * H);
    d->w_qkv = dupload(ex, EXEC_WT, h->qkv, QKV * H);
    d->w_o = dupload(ex, EXEC_WT, h->o, H * Q);
    d->w_gu = dupload(ex, EXEC_WT, h->gu, 2 * I * H);
    d->w_down = dupload(ex, EXEC_WT, h->down, H * I);
    d->n1 = dupload(ex, EXEC_F32, h->n1, H);
    d->n2 = dupload(ex, EXEC_F32, h->n2, H);
    d->inv_freq = dupload(ex, EXEC_F32, h->inv_freq, HD / 2);
    d->k = dupload(ex, EXEC_KV, h->k, KV_ELEMS);
    d->v = dupload(ex, EXEC_KV, h->v, KV_ELEMS);
    const size_t T = (size_t)tmax;
    d->x = dalloc(ex, EXEC_ACT, T * H);
    d->normed = dalloc(ex, EXEC_ACT, T * H);
    d->qkv = dalloc(ex, EXEC_ACT, T * QKV);
    d->attn = dalloc(ex, EXEC_ACT, T * Q);
    d->proj = dalloc(ex, EXEC_ACT, T * H);
    d->gu = dalloc(ex, EXEC_ACT, T * 2 * I);
    d->mlp = dalloc(ex, EXEC_ACT, T * I);
    d->rows = dalloc(ex, EXEC_ACT, T * H);
}

static void dev_model_free(dev_model *d)
{
    executor *ex = d->ex;
    void *bufs[] = {d->emb, d->w_qkv, d->w_o, d->w_gu, d->w_down, d->n1, d->n2, d->inv_freq,
                    d->k, d->v, d->x, d->normed, d->qkv, d->attn, d->proj, d->gu, d->mlp, d->rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ex->op->free(ex, bufs[i]);
    ex->op->destroy(ex);
}

/* One decoder layer and the head over b, op by op (core/model.c's order). */
static int mini_forward(void *ctx, const step_batch *b, float *logits)
{
    dev_model *d = ctx;
    executor *ex = d->ex;
    const executor_ops *op = ex->op;
    const int32_t T = b->num_tokens;
    int rc;
    if (d->fail_next) {
        d->fail_next = 0;
        return PG_EINVAL;
    }
    if ((rc = op->begin_step(ex, b)) || (rc = op->embed(ex, d->x, d->emb, H, V, b)) ||
        (rc = op->rmsnorm(ex, d->normed, NULL, d->x, d->n1, T, H, 1e-5f)) ||
        (rc = op->matmul(ex, d->qkv, d->normed, d->w_qkv, T, QKV, H)) ||
        (rc = op->rope(ex, d->qkv, d->inv_freq, NH, NKV, HD, b)) ||
        (rc = op->kv_write(ex, d->k, d->v, d->qkv, NH, NKV, HD, b)) ||
        (rc = op->attention(ex, d->attn, d->qkv, d->k, d->v, NH, NKV, HD, 0.35f, b)) ||
        (rc = op->matmul(ex, d->proj, d->attn, d->w_o, T, H, Q)) ||
        (rc = op->rmsnorm(ex, d->normed, d->x, d->proj, d->n2, T, H, 1e-5f)) ||
        (rc = op->matmul(ex, d->gu, d->normed, d->w_gu, T, 2 * I, H)) ||
        (rc = op->silu_mul(ex, d->mlp, d->gu, T, I)) ||
        (rc = op->matmul(ex, d->proj, d->mlp, d->w_down, T, H, I)) ||
        (rc = op->gather_rows(ex, d->rows, d->proj, H, b)))
        return rc;
    return op->logits(ex, logits, d->rows, d->emb, b->num_logits, V, H);
}

/* A pure decode step of S sequences with the given context lengths; block
 * tables drawn at random, the block holding each written slot distinct. */
typedef struct decode_step {
    int32_t tok[MAX_BATCH], pos[MAX_BATCH], slots[MAX_BATCH], qs[MAX_BATCH + 1];
    int32_t lens[MAX_BATCH], bt[MAX_BATCH * TABLE_STRIDE], rows[MAX_BATCH];
    step_batch b;
} decode_step;

static void decode_step_make(decode_step *s, int32_t S, const int32_t *lens)
{
    int32_t perm[NB];
    for (int32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memset(s, 0, sizeof *s);
    for (int32_t r = 0; r < S; r++) {
        int32_t len = lens[r], nblk = (len + BS - 1) / BS;
        for (int32_t k = 0; k < nblk; k++)
            s->bt[r * TABLE_STRIDE + k] = (int32_t)(rnd() % NB);
        s->bt[r * TABLE_STRIDE + nblk - 1] = perm[r]; /* written block: distinct */
        s->tok[r] = (int32_t)(rnd() % V);
        s->pos[r] = len - 1;
        s->slots[r] = perm[r] * BS + (len - 1) % BS;
        s->lens[r] = len;
        s->rows[r] = r;
        s->qs[r + 1] = r + 1;
    }
    int32_t max_len = 0;
    for (int32_t r = 0; r < S; r++)
        max_len = lens[r] > max_len ? lens[r] : max_len;
    s->b = (step_batch){
        .num_tokens = S, .num_seqs = S, .block_size = BS, .token_ids = s->tok,
        .positions = s->pos, .slots = s->slots, .query_start = s->qs, .seq_lens = s->lens,
        .block_tables = s->bt, .block_table_stride = TABLE_STRIDE, .max_seq_len = max_len,
        .max_query_len = 1, .num_logits = S, .logits_rows = s->rows,
    };
}

typedef struct fixture {
    host_model h;
    dev_model eager, graph;
    long errors0;     /* emulator errors before this fixture (a negative control's stay) */
} fixture;

static long error_count(void);

static fixture *fixture_new(int32_t graph_batch, int32_t graph_len, int32_t tmax)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    host_model *h = &f->h;
    float *arrays[] = {h->emb, h->qkv, h->o, h->gu, h->down};
    size_t sizes[] = {V * H, QKV * H, H * Q, 2 * I * H, H * I};
    for (size_t a = 0; a < 5; a++)
        for (size_t i = 0; i < sizes[a]; i++)
            arrays[a][i] = rndf() * 0.5f;
    for (int i = 0; i < H; i++) {
        h->n1[i] = 1.0f + 0.1f * rndf();
        h->n2[i] = 1.0f + 0.1f * rndf();
    }
    for (int i = 0; i < HD / 2; i++)
        h->inv_freq[i] = powf(10000.0f, -2.0f * (float)i / HD);
    h->k = malloc(KV_ELEMS * sizeof(float));
    h->v = malloc(KV_ELEMS * sizeof(float));
    assert_true(h->k && h->v);
    for (size_t i = 0; i < KV_ELEMS; i++) {
        h->k[i] = rndf();
        h->v[i] = rndf();
    }
    dev_model_init(&f->eager, h, 0, 0, tmax);
    dev_model_init(&f->graph, h, graph_batch, graph_len, tmax);
    f->errors0 = error_count();
    return f;
}

static int setup(void **state)
{
    *state = fixture_new(MAX_BATCH, MAX_LEN, TMAX);
    return 0;
}

/* graphs at the CLI's default --max-num-seqs 256 */
static int setup_big(void **state)
{
    *state = fixture_new(BIG_BATCH, MAX_LEN, BIG_TOKENS);
    return 0;
}

/* graphs for a 128k max_model_len */
static int setup_long(void **state)
{
    *state = fixture_new(MAX_BATCH, LONG_LEN, TMAX);
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    dev_model_free(&f->eager);
    dev_model_free(&f->graph);
    free(f->h.k);
    free(f->h.v);
    free(f);
    return 0;
}

/* One step on both executors: eager directly, graphed through run_step.
 * Returns 1 when the logits are bit-identical. */
static int step_batch_both(fixture *f, const step_batch *b)
{
    static float le[BIG_BATCH * V], lg[BIG_BATCH * V];
    memset(le, 0, sizeof le);
    memset(lg, 0, sizeof lg);
    if (mini_forward(&f->eager, b, le))
        fail_msg("eager step: %s", f->eager.ex->op->last_error(f->eager.ex));
    executor *gx = f->graph.ex;
    if (gx->op->run_step(gx, b, lg, mini_forward, &f->graph))
        fail_msg("graph step: %s", gx->op->last_error(gx));
    return memcmp(le, lg, (size_t)b->num_logits * V * sizeof(float)) == 0;
}

static int step_both(fixture *f, const decode_step *s)
{
    return step_batch_both(f, &s->b);
}

static int kv_equal(fixture *f)
{
    float *a = malloc(KV_ELEMS * sizeof(float)), *b = malloc(KV_ELEMS * sizeof(float));
    assert_true(a && b);
    int same = 1;
    void *ea[] = {f->eager.k, f->eager.v}, *ga[] = {f->graph.k, f->graph.v};
    for (int p = 0; p < 2; p++) {
        executor *e = f->eager.ex, *g = f->graph.ex;
        assert_int_equal(e->op->download_f32(e, a, ea[p], EXEC_KV, KV_ELEMS), 0);
        assert_int_equal(g->op->download_f32(g, b, ga[p], EXEC_KV, KV_ELEMS), 0);
        same = same && memcmp(a, b, KV_ELEMS * sizeof(float)) == 0;
    }
    free(a);
    free(b);
    return same;
}

static long error_count(void)
{
#ifdef PG_CUDA_EMU
    return emu_error_count();
#else
    return 0;
#endif
}

static void test_graph_matches_eager(void **state)
{
    fixture *f = *state;
    /* batch sizes into buckets 1, 4, 2, 8, 8, 4, 8, 1; lengths around 512 */
    static const int32_t sizes[] = {1, 3, 2, 5, 8, 4, 7, 1};
    static const int32_t len_pool[] = {1, 2, 17, 100, 511, 512, 513, 600, 690, 700};
    long captures = 0, replays = 0;
    int seen[4][2] = {{0}}; /* (bucket 1, 2, 4, 8) x (context tier 512, 700) */
    long n_graphs = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int32_t lens[MAX_BATCH], max_len = 0;
        for (int32_t r = 0; r < sizes[k]; r++) {
            lens[r] = len_pool[rnd() % (sizeof len_pool / sizeof len_pool[0])];
            max_len = lens[r] > max_len ? lens[r] : max_len;
        }
        int bucket = sizes[k] == 1 ? 0 : sizes[k] == 2 ? 1 : sizes[k] <= 4 ? 2 : 3;
        n_graphs += !seen[bucket][max_len > 512];
        seen[bucket][max_len > 512] = 1;
        decode_step s;
        decode_step_make(&s, sizes[k], lens);
        if (!step_both(f, &s))
            fail_msg("step %zu (%d sequences): graph and eager logits differ", k, (int)sizes[k]);
    }
    assert_true(kv_equal(f));
    cuda_executor_graph_stats(f->graph.ex, &captures, &replays);
    assert_int_equal(captures, n_graphs); /* each (bucket, context tier) captured once */
    assert_int_equal(replays, 8);
    /* a replay checks what the eager begin_step and embed check */
    {
        int32_t lens[2] = {10, 20};
        decode_step bad;
        decode_step_make(&bad, 2, lens);
        float lg[2 * V];
        executor *gx = f->graph.ex;
        bad.tok[1] = V;
        assert_int_equal(gx->op->run_step(gx, &bad.b, lg, mini_forward, &f->graph), PG_EINVAL);
        assert_non_null(strstr(gx->op->last_error(gx), "expected id in [0,40)"));
        bad.tok[1] = 0;
        bad.pos[0] = 3; /* not seq_len - 1 */
        assert_int_equal(gx->op->run_step(gx, &bad.b, lg, mini_forward, &f->graph), PG_EINVAL);
        assert_non_null(strstr(gx->op->last_error(gx), "expected position 9"));
    }
    /* a prefill chunk (2 query tokens) is not graphed: run_step runs it
     * eagerly, with the same results */
    int32_t tok[2] = {3, 7}, pos[2] = {598, 599}, slots[2] = {5 * BS + 6, 5 * BS + 7}, qs[2] = {0, 2};
    int32_t len[1] = {600}, bt[TABLE_STRIDE] = {0}, rows[1] = {1};
    bt[599 / BS] = 5;
    step_batch pf = {.num_tokens = 2, .num_seqs = 1, .block_size = BS, .token_ids = tok,
                     .positions = pos, .slots = slots, .query_start = qs, .seq_lens = len,
                     .block_tables = bt, .block_table_stride = TABLE_STRIDE, .max_seq_len = 600,
                     .max_query_len = 2, .num_logits = 1, .logits_rows = rows};
    decode_step as_step = {.b = pf};
    assert_true(step_both(f, &as_step));
    cuda_executor_graph_stats(f->graph.ex, &captures, &replays);
    assert_int_equal(replays, 8);
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

/* Negative control: replays that do not copy the step's metadata into the
 * fixed buffers must be caught by the comparison. */
static void test_negative_skipped_metadata(void **state)
{
    fixture *f = *state;
    int32_t lens[2] = {40, 513};
    decode_step s;
    decode_step_make(&s, 2, lens);
    assert_true(step_both(f, &s)); /* bucket 2 captured and replayed */
    assert_int_equal(cuda_executor_graph_test_fault(f->graph.ex, CUDA_GRAPH_TEST_SKIP_METADATA), 0);
    int32_t lens2[2] = {41, 514};
    decode_step s2;
    decode_step_make(&s2, 2, lens2);
    assert_false(step_both(f, &s2)); /* the replay ran the previous step's metadata */
    assert_int_equal(error_count() - f->errors0, 0);
}

/* A graph buffer reallocated after the capture: tracked, the graphs are
 * captured again and stay bit-identical; untracked, the replay uses the
 * freed buffer, which the emulator reports. */
static void test_regrown_buffer(void **state)
{
    fixture *f = *state;
    int32_t lens[3] = {5, 9, 530};
    decode_step s;
    decode_step_make(&s, 3, lens);
    assert_true(step_both(f, &s));
    long c0, r0, c1, r1;
    cuda_executor_graph_stats(f->graph.ex, &c0, &r0);
    assert_int_equal(cuda_executor_graph_test_fault(f->graph.ex, CUDA_GRAPH_TEST_REGROW), 0);
    decode_step_make(&s, 3, lens);
    assert_true(step_both(f, &s));
    cuda_executor_graph_stats(f->graph.ex, &c1, &r1);
    assert_int_equal(c1, c0 + 1); /* captured again */
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
#ifdef PG_CUDA_EMU
    /* negative control: the graph still holds the old logits buffer */
    assert_int_equal(cuda_executor_graph_test_fault(f->graph.ex, CUDA_GRAPH_TEST_REGROW_UNTRACKED), 0);
    long e0 = emu_error_count();
    decode_step_make(&s, 3, lens);
    (void)step_both(f, &s);
    assert_true(emu_error_count() > e0);
#endif
}

/* Steps of sequences that own their blocks: block k of sequence r is
 * r * bps + k, so a prompt's KV written by one step is read by the next. */
typedef struct owned_step {
    int32_t *tok, *pos, *slots, *qs, *lens, *bt, *rows;
    step_batch b;
} owned_step;

/* S sequences of contexts lens[r] after the step, each computing its last
 * q tokens (q = the prompt for a prefill, 1 for a decode step). */
static void owned_step_make(owned_step *st, int32_t S, const int32_t *lens, int32_t q, int32_t bps)
{
    const int32_t T = S * q;
    st->tok = malloc((size_t)T * 4u);
    st->pos = malloc((size_t)T * 4u);
    st->slots = malloc((size_t)T * 4u);
    st->qs = malloc((size_t)(S + 1) * 4u);
    st->lens = malloc((size_t)S * 4u);
    st->bt = calloc((size_t)S * (size_t)bps, 4u);
    st->rows = malloc((size_t)S * 4u);
    assert_true(st->tok && st->pos && st->slots && st->qs && st->lens && st->bt && st->rows);
    assert_true(S * bps <= NB);
    int32_t max_len = 0;
    st->qs[0] = 0;
    for (int32_t r = 0; r < S; r++) {
        assert_true(lens[r] >= q && lens[r] <= bps * BS);
        for (int32_t i = 0; i < q; i++) {
            int32_t t = r * q + i, p = lens[r] - q + i;
            st->tok[t] = (int32_t)(rnd() % V);
            st->pos[t] = p;
            st->slots[t] = (r * bps + p / BS) * BS + p % BS;
        }
        for (int32_t k = 0; k < bps; k++)
            st->bt[r * bps + k] = r * bps + k;
        st->qs[r + 1] = (r + 1) * q;
        st->lens[r] = lens[r];
        st->rows[r] = r * q + q - 1;
        max_len = lens[r] > max_len ? lens[r] : max_len;
    }
    st->b = (step_batch){
        .num_tokens = T, .num_seqs = S, .block_size = BS, .token_ids = st->tok,
        .positions = st->pos, .slots = st->slots, .query_start = st->qs, .seq_lens = st->lens,
        .block_tables = st->bt, .block_table_stride = bps, .max_seq_len = max_len,
        .max_query_len = q, .num_logits = S, .logits_rows = st->rows,
    };
}

static void owned_step_free(owned_step *st)
{
    free(st->tok);
    free(st->pos);
    free(st->slots);
    free(st->qs);
    free(st->lens);
    free(st->bt);
    free(st->rows);
}

/* The prompts (one step each, eager through run_step), then decode steps of
 * the first n_seqs[k] sequences, graph against eager bit for bit. */
static void run_fixed_length(fixture *f, int32_t S, int32_t prompt, int32_t bps,
                             const int32_t *n_seqs, int32_t n_steps)
{
    int32_t *lens = malloc((size_t)S * 4u);
    assert_non_null(lens);
    for (int32_t r = 0; r < S; r++)
        lens[r] = prompt;
    owned_step st;
    owned_step_make(&st, S, lens, prompt, bps);
    assert_true(step_batch_both(f, &st.b));
    owned_step_free(&st);
    for (int32_t k = 0; k < n_steps; k++) {
        for (int32_t r = 0; r < n_seqs[k]; r++)
            lens[r]++;
        owned_step_make(&st, n_seqs[k], lens, 1, bps);
        int same = step_batch_both(f, &st.b);
        owned_step_free(&st);
        if (!same)
            fail_msg("decode step %d (%d sequences): graph and eager logits differ", (int)k,
                     (int)n_seqs[k]);
    }
    free(lens);
    assert_true(kv_equal(f));
}

/* Graphs at max_batch 256 (the CLI's default --max-num-seqs): the warm-up
 * runs 256 rows, whole 128-row GEMM chunks, and must still size the GEMM
 * padding a later bucket's partial chunk uses, or the capture of that
 * bucket allocates (illegal) and falls back to eager. One prompt of 128
 * tokens, then decode steps of 1 sequence (bucket 1). */
static void test_big_batch_one_prompt(void **state)
{
    fixture *f = *state;
    static const int32_t n_seqs[] = {1, 1, 1, 1};
    run_fixed_length(f, 1, 128, 9, n_seqs, 4);
    cuda_graph_info gi;
    cuda_executor_graph_info(f->graph.ex, &gi);
    assert_int_equal(gi.eager_fallbacks, 0);
    assert_int_equal(gi.captures, 1);
    assert_int_equal(gi.replays, 4);
    assert_int_equal(error_count() - f->errors0, 0);
}

/* 256 prompts of 8 tokens (a 2048-token prefill), decode steps of all 256
 * (the warm-up's bucket), then of the first 100 (bucket 104: partial
 * GEMM chunks captured after the warm-up). */
static void test_big_batch_many_prompts(void **state)
{
    fixture *f = *state;
    static const int32_t n_seqs[] = {256, 256, 100, 100};
    run_fixed_length(f, BIG_BATCH, 8, 1, n_seqs, 4);
    cuda_graph_info gi;
    cuda_executor_graph_info(f->graph.ex, &gi);
    assert_int_equal(gi.eager_fallbacks, 0);
    assert_int_equal(gi.captures, 2);
    assert_int_equal(gi.replays, 4);
    assert_int_equal(error_count() - f->errors0, 0);
}

/* A capture that fails (here: a synchronization while capturing, which
 * the driver forbids) runs that bucket eagerly, with the same bits, from
 * then on; the other buckets keep their graphs. */
static void test_failed_capture_runs_eagerly(void **state)
{
    fixture *f = *state;
    executor *gx = f->graph.ex;
    static const int32_t lens[3] = {5, 40, 100};
    decode_step s;
    decode_step_make(&s, 1, lens);
    assert_true(step_both(f, &s)); /* warm-up, bucket 1 captured */
    assert_int_equal(cuda_executor_graph_test_fault(gx, CUDA_GRAPH_TEST_FAIL_CAPTURE), 0);
    decode_step_make(&s, 2, lens);
    assert_true(step_both(f, &s)); /* bucket 2: the capture fails, eager */
    decode_step_make(&s, 2, lens + 1);
    assert_true(step_both(f, &s)); /* bucket 2 again: eager, no second try */
    decode_step_make(&s, 3, lens);
    assert_true(step_both(f, &s)); /* bucket 4: captured */
    cuda_graph_info gi;
    cuda_executor_graph_info(gx, &gi);
    assert_int_equal(gi.eager_fallbacks, 1);
    assert_int_equal(gi.captures, 2);
    assert_int_equal(gi.replays, 2);
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

/* A warm-up that fails (its forward returned an error) fails that step;
 * the next step warms up again and runs as a graph, bit-identical (the
 * retry reuses the host metadata block: an ASan run reports a leak if not). */
static void test_failed_warm_up_retried(void **state)
{
    fixture *f = *state;
    executor *gx = f->graph.ex;
    static const int32_t lens[2] = {7, 520};
    decode_step s;
    decode_step_make(&s, 2, lens);
    static float lg[2 * V];
    f->graph.fail_next = 1;
    assert_int_equal(gx->op->run_step(gx, &s.b, lg, mini_forward, &f->graph), PG_EINVAL);
    assert_true(step_both(f, &s));
    cuda_graph_info gi;
    cuda_executor_graph_info(gx, &gi);
    assert_int_equal(gi.captures, 1);
    assert_int_equal(gi.replays, 1);
    assert_int_equal(gi.eager_fallbacks, 0);
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

/* core/sampler.c's greedy rule on the host: strict > from -inf */
static int32_t host_argmax(const float *row, int32_t n)
{
    float best = -INFINITY;
    int32_t id = -1;
    for (int32_t v = 0; v < n; v++)
        if (row[v] > best) {
            best = row[v];
            id = v;
        }
    return id;
}

/* Greedy rows (cuda_executor_greedy_next_step), through a graph and
 * eagerly (a prefill chunk): their ids are the host argmax of the eager
 * logits, their rows of logits_host are not written and do not cross to
 * the host; the other rows are bit-identical to the eager step's. The mask
 * is for one step: the next copies every row again. */
static void test_greedy_rows(void **state)
{
    fixture *f = *state;
    executor *gx = f->graph.ex;
    static const int32_t lens[4] = {9, 300, 600, 64};
    static const uint8_t mask[3] = {1, 0, 1};
    static float le[3 * V], lg[3 * V];
    cuda_graph_info gi;
    for (int k = 0; k < 3; k++) { /* capture, then two replays */
        decode_step s;
        decode_step_make(&s, 3, lens + (k == 2));
        int32_t ids[3] = {-7, -7, -7};
        for (int i = 0; i < 3 * V; i++)
            lg[i] = 12345.0f;
        assert_int_equal(mini_forward(&f->eager, &s.b, le), 0);
        assert_int_equal(cuda_executor_greedy_next_step(gx, mask, 3, ids), 0);
        if (gx->op->run_step(gx, &s.b, lg, mini_forward, &f->graph))
            fail_msg("graph step: %s", gx->op->last_error(gx));
        for (int32_t r = 0; r < 3; r++) {
            if (!mask[r]) {
                assert_memory_equal(le + r * V, lg + r * V, V * sizeof(float));
                assert_int_equal(ids[r], -7);
                continue;
            }
            assert_int_equal(ids[r], host_argmax(le + r * V, V));
            for (int v = 0; v < V; v++)
                assert_true(lg[r * V + v] == 12345.0f);
        }
        cuda_executor_graph_info(gx, &gi);
        assert_int_equal(gi.logits_copy_bytes, V * sizeof(float)); /* row 1 only */
    }
    cuda_executor_graph_info(gx, &gi);
    assert_int_equal(gi.replays, 3);
    /* no mask: every row again */
    decode_step s;
    decode_step_make(&s, 3, lens);
    assert_true(step_both(f, &s));
    cuda_executor_graph_info(gx, &gi);
    assert_int_equal(gi.logits_copy_bytes, 3 * V * sizeof(float));
    /* eagerly: a prefill chunk of 2 tokens, its one logits row greedy */
    int32_t tok[2] = {3, 7}, pos[2] = {598, 599}, slots[2] = {5 * BS + 6, 5 * BS + 7}, qs[2] = {0, 2};
    int32_t len[1] = {600}, bt[TABLE_STRIDE] = {0}, rows[1] = {1}, id = -7;
    bt[599 / BS] = 5;
    step_batch pf = {.num_tokens = 2, .num_seqs = 1, .block_size = BS, .token_ids = tok,
                     .positions = pos, .slots = slots, .query_start = qs, .seq_lens = len,
                     .block_tables = bt, .block_table_stride = TABLE_STRIDE, .max_seq_len = 600,
                     .max_query_len = 2, .num_logits = 1, .logits_rows = rows};
    assert_int_equal(mini_forward(&f->eager, &pf, le), 0);
    assert_int_equal(cuda_executor_greedy_next_step(gx, mask, 1, &id), 0);
    assert_int_equal(gx->op->run_step(gx, &pf, lg, mini_forward, &f->graph), 0);
    assert_int_equal(id, host_argmax(le, V));
    cuda_executor_graph_info(gx, &gi);
    assert_int_equal(gi.logits_copy_bytes, 0);
    /* a mask of the wrong length fails that step, and only that step */
    decode_step_make(&s, 3, lens);
    assert_int_equal(cuda_executor_greedy_next_step(gx, mask, 2, &id), 0);
    assert_int_equal(gx->op->run_step(gx, &s.b, lg, mini_forward, &f->graph), PG_EINVAL);
    assert_non_null(strstr(gx->op->last_error(gx), "greedy mask has 2 rows"));
    assert_int_equal(mini_forward(&f->eager, &s.b, le), 0); /* the KV the failed step wrote */
    decode_step_make(&s, 3, lens);
    assert_true(step_both(f, &s));
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

static long decode_blocks(void)
{
#ifdef PG_CUDA_EMU
    return emu_blocks_launched("paged_attention_decode_kernel");
#else
    return 0;
#endif
}

/* step_both, counting the decode blocks each executor launched (emulator;
 * 0 on a device). */
static int step_both_counted(fixture *f, const decode_step *s, long *eager_blocks,
                             long *graph_blocks)
{
    static float le[MAX_BATCH * V], lg[MAX_BATCH * V];
    long b0 = decode_blocks();
    if (mini_forward(&f->eager, &s->b, le))
        fail_msg("eager step: %s", f->eager.ex->op->last_error(f->eager.ex));
    long b1 = decode_blocks();
    executor *gx = f->graph.ex;
    if (gx->op->run_step(gx, &s->b, lg, mini_forward, &f->graph))
        fail_msg("graph step: %s", gx->op->last_error(gx));
    *eager_blocks = b1 - b0;
    *graph_blocks = decode_blocks() - b1;
    return memcmp(le, lg, (size_t)s->b.num_logits * V * sizeof(float)) == 0;
}

/* A 128k max_model_len: a graphed decode step launches blocks and copies
 * metadata for the context tier of the step (512 tokens, then 2048), not
 * for 131072 tokens (256 partitions per sequence, 8192 table entries),
 * and its split workspace is bounded by the 32 splits. */
static void test_long_max_model_len(void **state)
{
    fixture *f = *state;
    executor *gx = f->graph.ex;
    static const int32_t lens[4] = {30, 300, 513, 690};
    decode_step s;
    decode_step_make(&s, 2, lens);
    assert_true(step_both(f, &s)); /* warm-up at the top tier, bucket (2, 512) captured */
    for (int tier = 0; tier < 2; tier++) {
        decode_step_make(&s, 2, lens + 2 * tier);
        assert_true(step_both(f, &s));
        decode_step_make(&s, 2, lens + 2 * tier);
        long eager_blocks = 0, blocks = 0;
        assert_true(step_both_counted(f, &s, &eager_blocks, &blocks)); /* a replay */
        cuda_graph_info gi;
        cuda_executor_graph_info(gx, &gi);
        /* bucket 2 x nkv 1 x splits: ceil(512 / 512) = 1, ceil(2048 / 512) = 4 */
        const int32_t splits = tier == 0 ? 1 : 4, stride = (tier == 0 ? 512 : 2048) / BS;
#ifdef PG_CUDA_EMU
        assert_int_equal(blocks, 2 * NKV * splits);
        /* the eager step's grid is its own context's: ceil(300 / 512) = 1,
         * ceil(690 / 512) = 2 */
        assert_int_equal(eager_blocks, 2 * NKV * (tier == 0 ? 1 : 2));
#else
        (void)blocks;
        (void)eager_blocks;
        (void)splits;
#endif
        /* token, position, slot, query_start, seq_len rows of the 8-row
         * block, the bucket's 2 table rows of the tier's stride, 2 logits rows */
        assert_int_equal(gi.meta_upload_bytes, (5u * MAX_BATCH + 1u + 2u * stride + 2u) * 4u);
        /* (a buffer's capacity is rounded up to a power of two) */
        assert_true(gi.workspace_bytes <= 2u * (size_t)MAX_BATCH * NH * 32 * (HD + 2) * 4);
    }
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

/* Contexts past 32 partitions of 512 (16k tokens), 128k max_model_len:
 * {600, 9000} runs the graph of the 32k tier, whose decode kernel loops
 * (LONG), against an eager step whose longest context has 18 partitions
 * (one per block); {600, 20000} has 40 partitions, merged two to a block,
 * in both. Bit-identical logits and KV. Block tables point anywhere in the
 * small cache (reads only); the written blocks are distinct. */
static void test_long_contexts_loop(void **state)
{
    fixture *f = *state;
    enum { LEN2 = 20000, STRIDE2 = (LEN2 + BS - 1) / BS };
    int32_t *bt = malloc(2u * STRIDE2 * sizeof *bt);
    assert_non_null(bt);
    for (int c = 0; c < 3; c++) {
        int32_t lens[2] = {600, c == 0 ? 9000 : LEN2}, tok[2], pos[2], slots[2];
        int32_t qs[3] = {0, 1, 2}, rows[2] = {0, 1};
        for (int32_t r = 0; r < 2; r++) {
            for (int32_t k = 0; k < STRIDE2; k++)
                bt[r * STRIDE2 + k] = (int32_t)(rnd() % NB);
            bt[r * STRIDE2 + (lens[r] - 1) / BS] = r; /* the written blocks: 0 and 1 */
            tok[r] = (int32_t)(rnd() % V);
            pos[r] = lens[r] - 1;
            slots[r] = r * BS + (lens[r] - 1) % BS;
        }
        step_batch b = {.num_tokens = 2, .num_seqs = 2, .block_size = BS, .token_ids = tok,
                        .positions = pos, .slots = slots, .query_start = qs, .seq_lens = lens,
                        .block_tables = bt, .block_table_stride = STRIDE2,
                        .max_seq_len = lens[1], .max_query_len = 1, .num_logits = 2,
                        .logits_rows = rows};
        if (!step_batch_both(f, &b))
            fail_msg("step %d (contexts 600, %d): graph and eager logits differ", c, (int)lens[1]);
    }
    free(bt);
    cuda_graph_info gi;
    cuda_executor_graph_info(f->graph.ex, &gi);
    assert_int_equal(gi.captures, 1); /* (2, 32768): 64 partitions of 512, the looping kernel */
    assert_int_equal(gi.replays, 3);
    assert_true(kv_equal(f));
    assert_int_equal(error_count() - f->errors0, 0);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    /* separate fixtures: a negative control leaves its executor broken */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_graph_matches_eager, setup, teardown),
        cmocka_unit_test_setup_teardown(test_negative_skipped_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regrown_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_capture_runs_eagerly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_warm_up_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_greedy_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_batch_one_prompt, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_big_batch_many_prompts, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_long_max_model_len, setup_long, teardown),
        cmocka_unit_test_setup_teardown(test_long_contexts_loop, setup_long, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
