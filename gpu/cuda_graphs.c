/* cuda_graphs: CUDA graphs of decode steps (run_step) — the buckets, the
 * fixed buffers and their warm-up, capture, replay. See cuda_exec_internal.h
 * and the contract in cuda_executor.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"
#include "cuda_plan.h"

/* ---- CUDA graphs for decode steps (run_step) -------------------------------
 *
 * A pure decode step (every sequence one query token, every one sampling:
 * T = S = L, logits_rows = 0 .. S-1) of S <= max_batch sequences is padded
 * to its bucket P (cuda_plan_graph_bucket: 1, 2, 4, 8, 16, 24, ...) with
 * dummy sequences — token 0 at position 0, seq_len 1, slot -1 (kv_write
 * skips it: nothing is written), block-table row of zeros (block 0 is read,
 * only into the dummy rows, which no kernel mixes with the others) — and
 * its metadata is copied into the fixed buffers of cuda_graphs. The first
 * step of a bucket captures the model's whole forward (run by the
 * callback: embed, every layer, final norm, lm_head into g->logits_d, the
 * argmax of every row and its copy into pinned memory) into a graph; every
 * step then launches that graph, and the logits rows of the real sequences
 * (those not asked for as greedy ids) are copied out after it. The kernels see the same per-sequence data as an eager step and are
 * batch-invariant (the decode partition size depends on (hd, G) only, a
 * partition's block on the partition only, the grid is sized for the
 * tier's context and its extra blocks exit; the GEMMs run in fixed 128-row
 * calls by default), so graph and eager logits and KV are
 * bit-identical (tests/gpu/test_cuda_graphs.c). With fast_gemm the GEMM of
 * P padded rows may pick another cuBLAS kernel than the eager S rows.
 *
 * Fixed metadata layout (int32; Pm = max_batch, st = the tier's stride =
 * ceil(context / block_size), the top tier's for the block's size):
 * token_ids [Pm], positions [Pm],
 * slots [Pm], query_start [Pm+1], seq_lens [Pm], block_tables [Pm][st],
 * logits_rows [Pm], lora_slots [Pm] — the same offsets for every bucket;
 * a step copies only what its bucket reads (graph_upload).
 *
 * LoRA (lora_add): from the first step with lora_slots on (lora_seen; the
 * graphs captured before are dropped then), the padded batch always
 * carries lora_slots — the real rows' slots (-1 when the step has none),
 * -1 for the dummies — so a graph holds the forward's lora_add launches
 * whether or not the step that captured it used an adapter, and every step
 * of the bucket, with adapters or not, replays it: the kernels read each
 * row's slot from the fixed block on the device, nothing about the rows is
 * decided on the host. A run without adapters never sees slots. The
 * per-slot A, B, scale and rank are kernel arguments captured by value
 * (cuda_executor.h, "LoRA"). */
#define GM_TOK(Pm, st) ((size_t)0)
#define GM_POS(Pm, st) ((size_t)(Pm))
#define GM_SLOT(Pm, st) (2u * (size_t)(Pm))
#define GM_QS(Pm, st) (3u * (size_t)(Pm))
#define GM_LEN(Pm, st) (4u * (size_t)(Pm) + 1u)
#define GM_BT(Pm, st) (5u * (size_t)(Pm) + 1u)
#define GM_ROWS(Pm, st) (GM_BT(Pm, st) + (size_t)(Pm) * (size_t)(st))
#define GM_LORA(Pm, st) (GM_ROWS(Pm, st) + (size_t)(Pm))
#define GM_N(Pm, st) (GM_LORA(Pm, st) + (size_t)(Pm))
/* int32 from the start a step of bucket P uses before the logits rows */
#define GM_USED(Pm, st, P) (GM_BT(Pm, st) + (size_t)(P) * (size_t)(st))

static cuda_launch_counts counts_sub(cuda_launch_counts a, cuda_launch_counts b)
{
    return (cuda_launch_counts){a.kernels - b.kernels, a.gemms - b.gemms, a.copies - b.copies,
                                a.total - b.total};
}

static cuda_launch_counts counts_add(cuda_launch_counts a, cuda_launch_counts b)
{
    return (cuda_launch_counts){a.kernels + b.kernels, a.gemms + b.gemms, a.copies + b.copies,
                                a.total + b.total};
}

static uint64_t graph_generation(const cuda_exec *c)
{
    return c->graphs->generation + cuda_gemm_buffers_generation(c->gemm);
}

static void graph_drop_all(cuda_graphs *g)
{
    for (int32_t i = 0; i < g->n_buckets; i++)
        if (g->buckets[i].exec) {
            cudaGraphExecDestroy(g->buckets[i].exec);
            g->buckets[i].exec = NULL;
        }
}

void cx_graph_free(cuda_graphs *g)
{
    if (!g)
        return;
    graph_drop_all(g);
    free(g->buckets);
    free(g->meta_host);
    cx_pinned_free(&g->meta_h);
    cx_pinned_free(&g->logits_h);
    cx_pinned_free(&g->ids_h);
    if (g->ids_d)
        cudaFree(g->ids_d);
    if (g->meta_d)
        cudaFree(g->meta_d);
    if (g->ws_d)
        cudaFree(g->ws_d);
    if (g->logits_d)
        cudaFree(g->logits_d);
    if (g->lora_u_d)
        cudaFree(g->lora_u_d);
    free(g);
}

/* begin_step while bound: the ops read the fixed buffers, sized for the
 * padded batch b (built by graph_fill, so not checked again). */
int cx_graph_bind_batch(cuda_exec *c, const step_batch *b)
{
    cuda_graphs *g = c->graphs;
    const int32_t P = b->num_seqs, Pm = g->max_batch, st = g->cur_stride;
    c->have_batch = 0;
    if (P < 1 || P > Pm || b->num_tokens != P || b->num_logits != P)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: expected a padded decode batch of 1 .. %d sequences, got "
                            "T %d, S %d, L %d", (int)Pm, (int)b->num_tokens, (int)P,
                            (int)b->num_logits);
    pgk_batch *d = &c->batch;
    d->token_ids = g->meta_d + GM_TOK(Pm, st);
    d->positions = g->meta_d + GM_POS(Pm, st);
    d->slots = g->meta_d + GM_SLOT(Pm, st);
    d->query_start = g->meta_d + GM_QS(Pm, st);
    d->seq_lens = g->meta_d + GM_LEN(Pm, st);
    d->block_tables = g->meta_d + GM_BT(Pm, st);
    d->logits_rows = g->meta_d + GM_ROWS(Pm, st);
    d->lora_slots = g->meta_d + GM_LORA(Pm, st);
    d->prefill_seqs = g->meta_d; /* num_prefill_seqs = 0: never read */
    d->num_tokens = P;
    d->num_seqs = P;
    d->block_size = g->block_size;
    d->block_table_stride = st;
    d->max_seq_len = g->cur_context; /* the grid of the tier, not of this step */
    d->max_query_len = 1;
    d->num_logits = P;
    d->num_prefill_seqs = 0;
    c->n_decode_seqs = P;
    c->have_batch = 1;
    return 0;
}

/* logits while bound: lm_head into the graph's buffer, the argmax of each
 * row and its copy into pinned memory, without waiting (capturable);
 * run_step copies the real rows out after the launch (cx_logits_out). */
int cx_graph_logits(cuda_exec *c, const void *x, const void *w, int32_t L, int32_t V,
                        int32_t H)
{
    cuda_graphs *g = c->graphs;
    const size_t bytes = (size_t)L * (size_t)V * 4u;
    if (g->logits_cap < bytes) {
        size_t cap = g->logits_cap;
        int rc = cx_device_grow(c->stream, (void **)&g->logits_d, &cap, bytes, "cudaMalloc (graph logits)",
                             &c->err);
        g->logits_cap = cap;
        g->generation++;
        if (rc)
            return rc;
    }
    if (g->ids_cap < (size_t)L * 4u) {
        size_t cap = g->ids_cap;
        int rc = cx_device_grow(c->stream, (void **)&g->ids_d, &cap, (size_t)L * 4u,
                             "cudaMalloc (graph argmax ids)", &c->err);
        g->ids_cap = cap;
        g->generation++;
        if (rc)
            return rc;
    }
    const int64_t x_rows = cx_rows_after(c, x, (size_t)H * pgk_dtype_bytes(c->act_dt));
    int rc = cuda_gemm_xwt_rows(c->gemm, g->logits_d, (int64_t)(g->logits_cap / ((size_t)V * 4u)),
                                PGK_F32, x, x_rows > L ? x_rows : L, w, c->act_dt, L, V, H, &c->err);
    if (rc)
        return rc;
    /* every row's argmax (cheap: the rows are read once more on the
     * device), for the rows the step wants as ids only; the logits rows are
     * copied after the replay, only those the step returns */
    if ((rc = pgk_argmax(g->ids_d, g->logits_d, L, V, &c->lk)))
        return rc;
    void *h = NULL;
    if ((rc = cx_pinned_get(c->stream, &g->ids_h, (size_t)L * 4u, &h, &c->err))) /* allocates only at the warm-up */
        return pg_error_wrap(&c->err, rc, "cuda graph argmax ids");
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph argmax ids)",
             cudaMemcpyAsync(h, g->ids_d, (size_t)L * 4u, cudaMemcpyDeviceToHost, c->stream));
    g->logits_rows = L;
    g->logits_V = V;
    return 0;
}

/* 1 when b is a step the graphs run: pure decode, every row sampling, in
 * the bounds the fixed buffers were sized for. */
static int graph_eligible(const cuda_graphs *g, const step_batch *b)
{
    const int32_t S = b->num_seqs;
    if (S < 1 || S > g->max_batch || b->num_tokens != S || b->num_logits != S ||
        b->block_size < 1 || (g->block_size && b->block_size != g->block_size) ||
        (g->block_size && b->sliding_window != g->window))
        return 0;
    for (int32_t s = 0; s <= S; s++)
        if (b->query_start[s] != s)
            return 0;
    for (int32_t s = 0; s < S; s++)
        if (b->logits_rows[s] != s || b->seq_lens[s] < 1 || b->seq_lens[s] > g->max_seq_len)
            return 0;
    return 1;
}

/* Builds the batch of bucket P in g->meta_host: the S real sequences of b
 * (none when b is NULL: the warm-up), then dummies; *pb views it. */
static void graph_fill(cuda_graphs *g, const step_batch *b, int32_t P, step_batch *pb)
{
    const int32_t Pm = g->max_batch, st = g->cur_stride, S = b ? b->num_seqs : 0;
    int32_t *h = g->meta_host;
    memset(h, 0, GM_USED(Pm, st, P) * 4u); /* the rows of bucket P (graph_upload) */
    for (int32_t s = 0; s < P; s++) {
        int real = s < S;
        int32_t len = real ? b->seq_lens[s] : 1;
        h[GM_TOK(Pm, st) + s] = real ? b->token_ids[s] : 0;
        h[GM_POS(Pm, st) + s] = len - 1;
        h[GM_SLOT(Pm, st) + s] = real ? b->slots[s] : -1;
        h[GM_QS(Pm, st) + s + 1] = s + 1;
        h[GM_LEN(Pm, st) + s] = len;
        h[GM_ROWS(Pm, st) + s] = s;
        h[GM_LORA(Pm, st) + s] = real && b->lora_slots ? b->lora_slots[s] : -1;
        if (real) {
            int32_t nblk = (len + b->block_size - 1) / b->block_size;
            memcpy(h + GM_BT(Pm, st) + (size_t)s * (size_t)st,
                   b->block_tables + (size_t)s * (size_t)b->block_table_stride, (size_t)nblk * 4u);
        }
    }
    memset(pb, 0, sizeof *pb);
    pb->num_tokens = pb->num_seqs = pb->num_logits = P;
    pb->block_size = g->block_size;
    pb->token_ids = h + GM_TOK(Pm, st);
    pb->positions = h + GM_POS(Pm, st);
    pb->slots = h + GM_SLOT(Pm, st);
    pb->query_start = h + GM_QS(Pm, st);
    pb->seq_lens = h + GM_LEN(Pm, st);
    pb->block_tables = h + GM_BT(Pm, st);
    pb->block_table_stride = st;
    pb->max_seq_len = g->cur_context;
    pb->max_query_len = 1;
    pb->logits_rows = h + GM_ROWS(Pm, st);
    pb->lora_slots = g->lora_seen ? h + GM_LORA(Pm, st) : NULL;
    pb->sliding_window = g->window;
}

/* The part of g->meta_host bucket P reads -> the fixed device block
 * (through pinned staging): everything up to the end of row P-1 of the
 * block tables, then the P logits rows, and the P LoRA slots when with_lora
 * (the warm-up, and every step once one had slots: before, the block holds
 * the warm-up's -1s). */
static int graph_upload(cuda_exec *c, int32_t P, int with_lora)
{
    cuda_graphs *g = c->graphs;
    const int32_t Pm = g->max_batch, st = g->cur_stride;
    void *hv = NULL;
    int rc = cx_pinned_get(c->stream, &g->meta_h, g->meta_n * 4u, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda graph metadata");
    int32_t *h = hv;
    const size_t head = GM_USED(Pm, st, P), rows = GM_ROWS(Pm, st), lora = GM_LORA(Pm, st);
    memcpy(h, g->meta_host, head * 4u);
    memcpy(h + rows, g->meta_host + rows, (size_t)P * 4u);
    if (with_lora)
        memcpy(h + lora, g->meta_host + lora, (size_t)P * 4u);
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph metadata)",
             cudaMemcpyAsync(g->meta_d, h, head * 4u, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph metadata rows)",
             cudaMemcpyAsync(g->meta_d + rows, h + rows, (size_t)P * 4u, cudaMemcpyHostToDevice,
                             c->stream));
    if (with_lora)
        CUDA_TRY(&c->err, "cudaMemcpyAsync (graph metadata lora slots)",
                 cudaMemcpyAsync(g->meta_d + lora, h + lora, (size_t)P * 4u, cudaMemcpyHostToDevice,
                                 c->stream));
    g->meta_upload_bytes = (head + (with_lora ? 2u : 1u) * (size_t)P) * 4u;
    return cx_pinned_mark(&g->meta_h, c->stream, &c->err);
}

/* The fixed buffers, then one uncaptured forward of max_batch dummy
 * sequences through them: it grows the decode workspace, the logits (device
 * and pinned) and the GEMM padding to their largest, so no capture
 * allocates (vLLM warms up before capturing for the same reason). */
static int graph_warm_up(cuda_exec *c, exec_forward_fn forward, void *ctx)
{
    cuda_graphs *g = c->graphs;
    g->meta_n = GM_N(g->max_batch, g->stride);
    free(g->meta_host); /* a retried warm-up (the last one failed) */
    g->meta_host = malloc(g->meta_n * 4u);
    if (!g->meta_host)
        return pg_error_set(&c->err, PG_ENOMEM, "cuda graph: out of host memory");
    size_t cap = 0; /* a retried warm-up frees the last one's block */
    int rc = cx_device_grow(c->stream, (void **)&g->meta_d, &cap, g->meta_n * 4u,
                         "cudaMalloc (graph metadata)", &c->err);
    if (rc)
        return rc;
    /* lora_add's u for any rank the contract allows: a capture never grows
     * it (256 KiB at max_batch 256 in bf16) */
    cap = g->lora_u_cap;
    rc = cx_device_grow(c->stream, &g->lora_u_d, &cap,
                        (size_t)g->max_batch * PG_LORA_MAX_RANK * pgk_dtype_bytes(c->act_dt),
                        "cudaMalloc (graph lora scratch)", &c->err);
    g->lora_u_cap = cap;
    if (rc)
        return rc;
    /* the top tier: the largest decode workspace and table stride */
    g->cur_context = g->max_seq_len;
    g->cur_stride = g->stride;
    step_batch pb;
    graph_fill(g, NULL, g->max_batch, &pb);
    if ((rc = graph_upload(c, g->max_batch, 1)))
        return rc;
    g->bound = 1;
    rc = forward(ctx, &pb, NULL);
    g->bound = 0;
    if (rc)
        return rc;
    CUDA_TRY(&c->err, "cudaStreamSynchronize (graph warm-up)", cudaStreamSynchronize(c->stream));
    g->warmed = 1;
    return 0;
}

/* Records forward over the padded batch pb into bk->exec. */
static int graph_capture(cuda_exec *c, graph_bucket *bk, const step_batch *pb,
                         exec_forward_fn forward, void *ctx)
{
    cuda_graphs *g = c->graphs;
    CUDA_TRY(&c->err, "cudaStreamBeginCapture",
             cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal));
    const int sync_each = c->lk.sync_each; /* a synchronization would invalidate the capture */
    c->lk.sync_each = 0;
    if (g->fault & CUDA_GRAPH_TEST_FAIL_CAPTURE) {
        /* illegal while capturing: the driver (and the emulator) invalidate
         * the capture, which then fails at its end (a negative control) */
        g->fault &= ~CUDA_GRAPH_TEST_FAIL_CAPTURE;
        (void)cudaStreamSynchronize(c->stream);
    }
    g->bound = g->capturing = 1;
    const cuda_launch_counts k0 = cx_counts(c);
    int rc = forward(ctx, pb, NULL);
    bk->launches = counts_sub(cx_counts(c), k0); /* what each replay runs */
    g->bound = g->capturing = 0;
    c->lk.sync_each = sync_each;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (rc || e != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        if (rc)
            return rc;
        return cx_fail(&c->err, PG_EDEVICE, "cudaStreamEndCapture (decode step graph)", e);
    }
    e = cudaGraphInstantiate(&bk->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        bk->exec = NULL;
        return cx_fail(&c->err, PG_EDEVICE, "cudaGraphInstantiate (decode step graph)", e);
    }
    bk->generation = graph_generation(c);
    /* the lora_add values this graph replays: the graphs captured with
     * other values (a slot reloaded since) are dropped */
    if (g->lora_sig_set && g->lora_sig != c->lora_sig)
        for (int32_t i = 0; i < g->n_buckets; i++)
            if (&g->buckets[i] != bk && g->buckets[i].exec) {
                cudaGraphExecDestroy(g->buckets[i].exec);
                g->buckets[i].exec = NULL;
            }
    g->lora_sig = c->lora_sig;
    g->lora_sig_set = 1;
    bk->logits_rows = g->logits_rows;
    bk->logits_V = g->logits_V;
    g->captures++;
    return 0;
}

/* The graph of bucket (P, tier) fell back to eager: one warning per bucket
 * (a failed capture is not an error: the step runs eagerly, as with
 * --enforce-eager, with the same bits). */
static void graph_fall_back(cuda_exec *c, graph_bucket *bk)
{
    cuda_graphs *g = c->graphs;
    bk->eager = 1;
    g->eager_fallbacks++;
    fprintf(stderr,
            "pagedgen: warning: cuda graph of %d sequences (contexts <= %d tokens): capture failed "
            "(%s); these steps run eagerly\n", (int)bk->size, (int)bk->context, c->err.msg);
}

/* *replayed: the bucket whose graph the step launched (NULL: eager), and
 * *mark the counts just before the step's own work (cx_run_step's
 * last_step: the warm-up and capture are not the step's). */
static int run_step_impl(cuda_exec *c, const step_batch *b, float *logits_host,
                         exec_forward_fn forward, void *ctx, const graph_bucket **replayed,
                         cuda_launch_counts *mark)
{
    cuda_graphs *g = c->graphs;
    if (!g || c->moe.used || !graph_eligible(g, b)) {
        c->defer_now = c->defer_next;
        /* prefill, mixed, too large, or a model with mixture-of-experts
         * layers (cuda_moe.c plans their groups on the host): eager */
        return forward(ctx, b, logits_host);
    }
    /* the checks the eager begin_step and embed make, on the real batch */
    int rc = cx_begin_step_impl(c, b, 0);
    if (rc)
        return rc;
    if (!g->block_size) {
        g->block_size = b->block_size;
        g->stride = (g->max_seq_len + b->block_size - 1) / b->block_size;
        g->window = b->sliding_window;
    }
    if (!g->warmed && (rc = graph_warm_up(c, forward, ctx)))
        return rc;
    if (c->moe.used) { /* the warm-up met an MoE layer: no capture */
        c->defer_now = c->defer_next;
        return forward(ctx, b, logits_host);
    }
    /* embed's check, with the V the warm-up's embed saw */
    const int32_t S = b->num_seqs;
    for (int32_t t = 0; t < S; t++)
        if (b->token_ids[t] < 0 || b->token_ids[t] >= g->vocab)
            return pg_error_set(&c->err, PG_EINVAL, "cuda embed: token %d: expected id in [0,%d), got %d",
                                (int)t, (int)g->vocab, (int)b->token_ids[t]);
    const int32_t P = cuda_plan_graph_bucket(S, g->max_batch);
    int32_t max_len = 0, context = 0;
    for (int32_t s = 0; s < S; s++)
        max_len = b->seq_lens[s] > max_len ? b->seq_lens[s] : max_len;
    const int32_t tier = cuda_plan_graph_context(max_len, g->max_seq_len, &context);
    graph_bucket *bk = NULL;
    for (int32_t i = 0; i < g->n_sizes && !bk && tier >= 0; i++)
        if (g->buckets[i * g->n_tiers].size == P)
            bk = &g->buckets[i * g->n_tiers + tier];
    if (!bk)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: no bucket of %d sequences with contexts of %d tokens",
                            (int)P, (int)max_len);
    if (bk->eager) {
        c->defer_now = c->defer_next;
        return forward(ctx, b, logits_host);
    }
    /* the first step with adapters: the graphs so far were captured without
     * slots (a forward may skip lora_add then); from here every padded
     * batch carries them */
    if (b->lora_slots && !g->lora_seen) {
        g->lora_seen = 1;
        graph_drop_all(g);
    }
    /* a buffer a graph uses was reallocated since its capture: capture again */
    if (bk->exec && bk->generation != graph_generation(c))
        graph_drop_all(g);
    g->cur_context = bk->context;
    g->cur_stride = (bk->context + g->block_size - 1) / g->block_size;
    step_batch pb;
    const double t0 = step_profile_now();
    graph_fill(g, b, P, &pb);
    if (!(bk->exec && (g->fault & CUDA_GRAPH_TEST_SKIP_METADATA)) &&
        (rc = graph_upload(c, P, g->lora_seen)))
        return rc;
    step_profile_add(cuda_sprof_profile(c->sprof), SP_H2D, t0);
    if (!bk->exec && graph_capture(c, bk, &pb, forward, ctx)) {
        graph_fall_back(c, bk);
        *mark = cx_counts(c);
        c->defer_now = c->defer_next;
        return forward(ctx, b, logits_host);
    }
    if (bk->logits_rows != P || bk->logits_V < 1) {
        c->greedy_L = 0;
        c->lp_L = 0;
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: the captured step computed %d logits rows, expected %d",
                            (int)bk->logits_rows, (int)P);
    }
    *replayed = bk;
    *mark = cx_counts(c);
    CUDA_TRY(&c->err, "cudaGraphLaunch (decode step)", cudaGraphLaunch(bk->exec, c->stream));
    g->replays++;
    /* the sampled and logprob rows, then the S real rows (of the P
     * computed), after the replay (stream order) */
    if ((rc = cx_rows_launch(c, g->logits_d, S, bk->logits_V)))
        return rc;
    c->defer_now = c->defer_next;
    return cx_logits_out(c, logits_host, g->logits_d, &g->logits_h, g->ids_h.h, S, bk->logits_V);
}

int cx_run_step(executor *ex, const step_batch *b, float *logits_host,
                         exec_forward_fn forward, void *ctx)
{
    cuda_exec *c = cx(ex);
    const graph_bucket *replayed = NULL;
    cuda_launch_counts mark = cx_counts(c);
    int rc = run_step_impl(c, b, logits_host, forward, ctx, &replayed, &mark);
    cuda_graphs *g = c->graphs;
    if (rc == 0 && !replayed && g && g->lora_sig_set && c->lora_calls > 0 &&
        c->lora_sig != g->lora_sig) {
        /* an eager step gave lora_add other values than the graphs hold (an
         * adapter loaded into a slot since): capture them again */
        graph_drop_all(g);
        g->lora_sig_set = 0;
    }
    c->last_step = counts_sub(cx_counts(c), mark);
    if (replayed)
        c->last_step = counts_add(c->last_step, replayed->launches);
    cuda_sprof_step_done(c->sprof, rc);
    c->greedy_L = 0; /* a greedy mask is for this step only, even one that failed */
    c->lp_L = 0;
    c->defer_next = c->defer_now = 0; /* so is step_defer */
    if (rc)
        c->pend.active = 0;
    if (!c->pend.active) /* (a deferred copy-out still reads it: cx_logits_finish) */
        cuda_smp_clear(&c->smp);
    return rc;
}

int cuda_executor_set_graphs(executor *ex, int32_t max_batch, int32_t max_seq_len, pg_error *err)
{
    cuda_exec *c = cx_as_cuda(ex);
    if (!c)
        return pg_error_set(err, PG_EINVAL, "cuda graphs: not a cuda executor");
    if (max_batch < 0 || max_batch > 65535 || (max_batch > 0 && max_seq_len < 1))
        return pg_error_set(err, PG_EINVAL,
                            "cuda graphs: expected 0 <= max_batch <= 65535 and max_seq_len >= 1, "
                            "got %d and %d", (int)max_batch, (int)max_seq_len);
    if (c->graphs) {
        cudaStreamSynchronize(c->stream);
        cx_graph_free(c->graphs);
        c->graphs = NULL;
    }
    if (max_batch == 0)
        return 0;
    cuda_graphs *g = calloc(1, sizeof *g);
    const int32_t n = cuda_plan_graph_sizes(NULL, 0, max_batch);
    const int32_t n_tiers = cuda_plan_graph_tiers(max_seq_len);
    int32_t *sizes = malloc((size_t)n * sizeof *sizes);
    if (g)
        g->buckets = calloc((size_t)n * (size_t)n_tiers, sizeof *g->buckets);
    if (!g || !sizes || !g->buckets) {
        free(sizes);
        cx_graph_free(g);
        return pg_error_set(err, PG_ENOMEM, "cuda graphs: out of host memory");
    }
    cuda_plan_graph_sizes(sizes, n, max_batch);
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0, len = 1; k < n_tiers; k++) {
            graph_bucket *bk = &g->buckets[i * n_tiers + k];
            bk->size = sizes[i];
            cuda_plan_graph_context(len, max_seq_len, &bk->context);
            len = bk->context + 1;
        }
    free(sizes);
    g->n_buckets = n * n_tiers;
    g->n_sizes = n;
    g->n_tiers = n_tiers;
    g->max_batch = max_batch;
    g->max_seq_len = max_seq_len;
    c->graphs = g;
    return 0;
}

void cuda_executor_graph_stats(executor *ex, long *captures, long *replays)
{
    cuda_exec *c = cx_as_cuda(ex);
    *captures = c && c->graphs ? c->graphs->captures : 0;
    *replays = c && c->graphs ? c->graphs->replays : 0;
}

void cuda_executor_graph_info(executor *ex, cuda_graph_info *out)
{
    cuda_exec *c = cx_as_cuda(ex);
    const cuda_graphs *g = c ? c->graphs : NULL;
    memset(out, 0, sizeof *out);
    if (c) {
        out->logits_copy_bytes = c->logits_copy_bytes;
        out->logits_copy_total_bytes = c->logits_copy_total;
    }
    if (!g)
        return;
    out->captures = g->captures;
    out->replays = g->replays;
    out->eager_fallbacks = g->eager_fallbacks;
    out->workspace_bytes = g->ws_floats * 4u;
    out->meta_upload_bytes = g->meta_upload_bytes;
    out->logits_copy_bytes = c->logits_copy_bytes;
    out->logits_copy_total_bytes = c->logits_copy_total;
}

int cuda_executor_graph_test_fault(executor *ex, int fault)
{
    cuda_exec *c = cx_as_cuda(ex);
    if (!c || !c->graphs || !c->graphs->logits_d)
        return PG_EINVAL;
    cuda_graphs *g = c->graphs;
    if (fault == CUDA_GRAPH_TEST_SKIP_METADATA || fault == CUDA_GRAPH_TEST_FAIL_CAPTURE) {
        g->fault |= fault;
        return 0;
    }
    if (fault != CUDA_GRAPH_TEST_REGROW && fault != CUDA_GRAPH_TEST_REGROW_UNTRACKED)
        return PG_EINVAL;
    /* what a larger step would do to a buffer grown on demand */
    size_t cap = g->logits_cap;
    int rc = cx_device_grow(c->stream, (void **)&g->logits_d, &cap, g->logits_cap + 1, "cudaMalloc (test regrow)",
                         &c->err);
    g->logits_cap = cap;
    if (fault == CUDA_GRAPH_TEST_REGROW)
        g->generation++;
    return rc;
}

