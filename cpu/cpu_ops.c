/* cpu_ops: the CPU executor's element-wise and copy ops (see executor.h for
 * each op's contract and layouts). Each op splits its rows statically over
 * the pool; every output element is computed by one worker in a fixed
 * order, so the split never changes a value. Jobs too small to pay for a
 * wake-up (~ a few microseconds) run on the calling thread.
 */
#include "cpu_ops.h"

#include <math.h>
#include <string.h>

/* Below this many elements touched, an op stays on the calling thread. */
#define CPU_OPS_PARALLEL_MIN 32768

static int32_t ops_workers(const cpu_exec *ce, double elems)
{
    return elems < (double)CPU_OPS_PARALLEL_MIN ? 1 : ce->n_threads;
}

/* ---- embed --------------------------------------------------------------- */

int cpu_op_embed(cpu_exec *ce, float *x, const void *table, int32_t H, int32_t V, const step_batch *b)
{
    for (int32_t t = 0; t < b->num_tokens; t++) {
        int32_t id = b->token_ids[t];
        if (id < 0 || id >= V)
            return cpu_exec_fail(ce, PG_EINVAL, "embed: token %d: expected id in [0,%d), got %d",
                                 (int)t, (int)V, (int)id);
        cpu_wt_get_row(x + (int64_t)t * H, table, ce->wt, (int64_t)id * H, H); /* converts */
    }
    return PG_OK;
}

/* ---- rmsnorm ------------------------------------------------------------- */

typedef struct rmsnorm_job {
    float *out, *residual;
    const float *x, *w;
    int32_t rows, dim;
    float eps;
} rmsnorm_job;

static void rmsnorm_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const rmsnorm_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range(j->rows, worker, n_workers, 1, &lo, &hi);
    const int32_t dim = j->dim;
    for (int64_t r = lo; r < hi; r++) {
        const float *src = j->x + r * dim;
        float *o = j->out + r * dim;
        if (j->residual) {
            float *res = j->residual + r * dim;
            for (int32_t i = 0; i < dim; i++)
                res[i] += src[i];
            src = res;
        }
        /* llama2.c rmsnorm: ss = sum x*x (in order); ss /= size; ss += eps;
         * ss = 1/sqrtf(ss); o = w * (ss * x) — HF LlamaRMSNorm's rounding. */
        float ss = 0.0f;
        for (int32_t i = 0; i < dim; i++)
            ss += src[i] * src[i];
        ss /= (float)dim;
        ss += j->eps;
        ss = 1.0f / sqrtf(ss);
        for (int32_t i = 0; i < dim; i++)
            o[i] = j->w[i] * (ss * src[i]);
    }
}

int cpu_op_rmsnorm(cpu_exec *ce, float *out, float *residual, const float *x, const float *w,
                   int32_t rows, int32_t dim, float eps)
{
    rmsnorm_job job = {out, residual, x, w, rows, dim, eps};
    cpu_pool_run(ce->pool, ops_workers(ce, (double)rows * dim), rmsnorm_worker, &job);
    return PG_OK;
}

/* ---- add_bias ------------------------------------------------------------ */

typedef struct bias_job {
    float *y;
    const float *bias;
    int32_t rows, n;
} bias_job;

static void bias_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const bias_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range(j->rows, worker, n_workers, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *y = j->y + r * j->n;
        for (int32_t i = 0; i < j->n; i++)
            y[i] += j->bias[i]; /* nn.Linear: x @ W^T + b, one f32 add */
    }
}

int cpu_op_add_bias(cpu_exec *ce, float *y, const float *bias, int32_t rows, int32_t N)
{
    bias_job job = {y, bias, rows, N};
    cpu_pool_run(ce->pool, ops_workers(ce, (double)rows * N), bias_worker, &job);
    return PG_OK;
}

/* ---- qk_norm ------------------------------------------------------------- */

typedef struct qk_norm_job {
    float *qkv;
    const float *q_w, *k_w;
    int32_t T, nh, nkv, hd;
    float eps;
} qk_norm_job;

/* One head of hd values in place, with rmsnorm_worker's arithmetic (the
 * same f32 order as the other RMSNorm: HF Qwen3RMSNorm is LlamaRMSNorm). */
static void head_rmsnorm(float *v, const float *w, int32_t hd, float eps)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < hd; i++)
        ss += v[i] * v[i];
    ss /= (float)hd;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int32_t i = 0; i < hd; i++)
        v[i] = w[i] * (ss * v[i]);
}

static void qk_norm_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const qk_norm_job *j = ctx;
    const int64_t row = (int64_t)(j->nh + 2 * j->nkv) * j->hd;
    int64_t lo, hi;
    cpu_pool_range(j->T, worker, n_workers, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *base = j->qkv + t * row; /* q heads, then k heads */
        for (int32_t h = 0; h < j->nh + j->nkv; h++)
            head_rmsnorm(base + (int64_t)h * j->hd, h < j->nh ? j->q_w : j->k_w, j->hd, j->eps);
    }
}

int cpu_op_qk_norm(cpu_exec *ce, float *qkv, const float *q_w, const float *k_w, int32_t T, int32_t nh,
                   int32_t nkv, int32_t hd, float eps)
{
    qk_norm_job job = {qkv, q_w, k_w, T, nh, nkv, hd, eps};
    cpu_pool_run(ce->pool, ops_workers(ce, (double)T * (nh + nkv) * hd * 2.0), qk_norm_worker, &job);
    return PG_OK;
}

/* ---- rope ---------------------------------------------------------------- */

typedef struct rope_job {
    cpu_exec *ce;
    float *qkv;
    const float *inv_freq;
    int32_t nh, nkv, hd;
    const step_batch *b;
} rope_job;

static void rope_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const rope_job *j = ctx;
    const int32_t hd = j->hd, half = hd / 2, nheads = j->nh + j->nkv;
    const int64_t row = (int64_t)(j->nh + 2 * j->nkv) * hd;
    float *cs = j->ce->scratch[worker].buf; /* [half] cos, then [half] sin */
    float *sn = cs + half;
    int64_t lo, hi;
    cpu_pool_range(j->b->num_tokens, worker, n_workers, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        /* llama2.c: val = pos * freq; fcr = cosf(val); fci = sinf(val) */
        const float pos = (float)j->b->positions[t];
        for (int32_t i = 0; i < half; i++) {
            float val = pos * j->inv_freq[i];
            cs[i] = cosf(val);
            sn[i] = sinf(val);
        }
        float *base = j->qkv + t * row; /* q heads then k heads are contiguous */
        for (int32_t h = 0; h < nheads; h++) {
            float *v = base + (int64_t)h * hd;
            for (int32_t i = 0; i < half; i++) {
                /* HF rotate_half: q*cos + rotate_half(q)*sin */
                float a = v[i], c = v[i + half];
                v[i] = a * cs[i] - c * sn[i];
                v[i + half] = c * cs[i] + a * sn[i];
            }
        }
    }
}

int cpu_op_rope(cpu_exec *ce, float *qkv, const float *inv_freq, int32_t nh, int32_t nkv, int32_t hd,
                const step_batch *b)
{
    int rc = cpu_exec_scratch(ce, (size_t)hd);
    if (rc)
        return rc;
    rope_job job = {ce, qkv, inv_freq, nh, nkv, hd, b};
    cpu_pool_run(ce->pool, ops_workers(ce, (double)b->num_tokens * (nh + nkv) * hd * 4.0), rope_worker, &job);
    return PG_OK;
}

/* ---- kv_write ------------------------------------------------------------ */

typedef struct kv_write_job {
    cpu_exec *ce;
    void *k_cache, *v_cache;
    const float *qkv;
    int32_t nh, nkv, hd;
    const step_batch *b;
} kv_write_job;
/* a static share of the tokens; each token's K and V rows are written by
 * one worker (the slots were checked before: every row goes to its own slot) */
static void kv_write_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const kv_write_job *j = ctx;
    const int64_t row = (int64_t)(j->nh + 2 * j->nkv) * j->hd, kvw = (int64_t)j->nkv * j->hd;
    const size_t eb = cpu_kv_bytes(j->ce->kv);
    int64_t lo, hi;
    cpu_pool_range(j->b->num_tokens, worker, n_workers, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t slot = j->b->slots[t];
        const float *src = j->qkv + t * row + (int64_t)j->nh * j->hd;
        /* f32: a copy; bf16 / f16: round to nearest even */
        cpu_kv_store(j->ce->kv, (char *)j->k_cache + (size_t)(slot * kvw) * eb, src, kvw);
        cpu_kv_store(j->ce->kv, (char *)j->v_cache + (size_t)(slot * kvw) * eb, src + kvw, kvw);
    }
}
int cpu_op_kv_write(cpu_exec *ce, void *k_cache, void *v_cache, const float *qkv, int32_t nh,
                    int32_t nkv, int32_t hd, const step_batch *b)
{
    for (int32_t t = 0; t < b->num_tokens; t++)
        if (b->slots[t] < 0)
            return cpu_exec_fail(ce, PG_EINVAL, "kv_write: token %d: expected slot >= 0, got %lld",
                                 (int)t, (long long)b->slots[t]);
    kv_write_job job = {ce, k_cache, v_cache, qkv, nh, nkv, hd, b};
    cpu_pool_run(ce->pool, ops_workers(ce, (double)b->num_tokens * nkv * hd * 2.0), kv_write_worker, &job);
    return PG_OK;
}

/* ---- silu_mul ------------------------------------------------------------ */

typedef struct silu_job {
    float *out;
    const float *gate_up;
    int32_t T, I;
} silu_job;

/* a static share of the T * I outputs in runs of 16 (a batch-1 row is
 * split too: each element is computed alone, so the split changes no value) */
static void silu_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const silu_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range((int64_t)j->T * j->I, worker, n_workers, 16, &lo, &hi);
    while (lo < hi) {
        const int64_t t = lo / j->I, i0 = lo % j->I, i1 = i0 + (hi - lo) < j->I ? i0 + (hi - lo) : j->I;
        const float *g = j->gate_up + t * 2 * j->I, *u = g + j->I;
        float *o = j->out + t * j->I;
        for (int64_t i = i0; i < i1; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i]; /* silu(g) * u */
        lo += i1 - i0;
    }
}
int cpu_op_silu_mul(cpu_exec *ce, float *out, const float *gate_up, int32_t T, int32_t I)
{
    silu_job job = {out, gate_up, T, I};
    /* an expf costs about what a 16-element pass of the other ops does */
    cpu_pool_run(ce->pool, ops_workers(ce, (double)T * I * 16.0), silu_worker, &job);
    return PG_OK;
}

/* ---- gather_rows --------------------------------------------------------- */

int cpu_op_gather_rows(cpu_exec *ce, float *dst, const float *src, int32_t dim, const step_batch *b)
{
    for (int32_t r = 0; r < b->num_logits; r++) {
        int32_t t = b->logits_rows[r];
        if (t < 0 || t >= b->num_tokens)
            return cpu_exec_fail(ce, PG_EINVAL, "gather_rows: logits row %d: expected token row in [0,%d), got %d",
                                 (int)r, (int)b->num_tokens, (int)t);
        memmove(dst + (int64_t)r * dim, src + (int64_t)t * dim, (size_t)dim * sizeof(float));
    }
    return PG_OK;
}

/* ---- copy_blocks --------------------------------------------------------- */

int cpu_op_copy_blocks(cpu_exec *ce, void *kv, int32_t n_planes, size_t plane_elems, size_t block_elems,
                       const int32_t *src_dst, int32_t n_pairs)
{
    if (block_elems == 0 || plane_elems % block_elems != 0)
        return cpu_exec_fail(ce, PG_EINVAL, "copy_blocks: expected plane_elems a multiple of block_elems, got %zu and %zu",
                             plane_elems, block_elems);
    const int64_t num_blocks = (int64_t)(plane_elems / block_elems);
    for (int32_t k = 0; k < 2 * n_pairs; k++)
        if (src_dst[k] < 0 || src_dst[k] >= num_blocks)
            return cpu_exec_fail(ce, PG_EINVAL, "copy_blocks: pair %d: expected block id in [0,%lld), got %d",
                                 (int)(k / 2), (long long)num_blocks, (int)src_dst[k]);
    const size_t eb = cpu_kv_bytes(ce->kv), block_bytes = block_elems * eb;
    for (int32_t p = 0; p < n_planes; p++) {
        char *plane = (char *)kv + (size_t)p * plane_elems * eb;
        for (int32_t k = 0; k < n_pairs; k++) {
            if (src_dst[2 * k] == src_dst[2 * k + 1])
                continue;
            memcpy(plane + (size_t)src_dst[2 * k + 1] * block_bytes,
                   plane + (size_t)src_dst[2 * k] * block_bytes, block_bytes);
        }
    }
    return PG_OK;
}

/* ---- step batch checks --------------------------------------------------- */

int cpu_check_batch(cpu_exec *ce, const char *where, const step_batch *b)
{
    if (!b)
        return cpu_exec_fail(ce, PG_EINVAL, "%s: step batch is NULL", where);
    if (b->num_tokens < 1 || b->num_seqs < 1 || b->block_size < 1)
        return cpu_exec_fail(ce, PG_EINVAL, "%s: expected num_tokens, num_seqs, block_size >= 1, got %d, %d, %d",
                             where, (int)b->num_tokens, (int)b->num_seqs, (int)b->block_size);
    if (!b->query_start || b->query_start[0] != 0 || b->query_start[b->num_seqs] != b->num_tokens)
        return cpu_exec_fail(ce, PG_EINVAL, "%s: expected query_start[0] = 0 and query_start[S] = T = %d",
                             where, (int)b->num_tokens);
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t q0 = b->query_start[s], q1 = b->query_start[s + 1];
        if (q1 < q0 || (b->seq_lens && b->seq_lens[s] < q1 - q0))
            return cpu_exec_fail(ce, PG_EINVAL, "%s: sequence %d: query range [%d,%d) inconsistent with seq_len %d",
                                 where, (int)s, (int)q0, (int)q1, b->seq_lens ? (int)b->seq_lens[s] : -1);
    }
    return PG_OK;
}
