/* cpu_attention: causal GQA attention over the paged KV cache (executor.h
 * "attention"), the reference the GPU kernel is tested against.
 *
 * For token t of sequence s at position p, kv head g, query heads
 * h = g*G .. g*G+G-1 (G = nh / nkv), context positions j = 0..p:
 *   slot_j   = block_tables[s][j / bs] * bs + j % bs
 *   k_j, v_j = k_cache/v_cache + slot_j * nkv*hd + g*hd       [hd] f32
 *   q_h      = qkv + t*(nh+2nkv)*hd + h*hd                    [hd] f32
 *   s[h][j]  = dot(q_h, k_j) * scale          (8-lane fixed-order dot)
 *   e[h][j]  = expf(s[h][j] - max_j s[h][j]); z_h = sum_j e[h][j] (j order)
 *   out[t][h*hd + d] = (sum_j e[h][j] * v_j[d]) * (1 / z_h)   (j order)
 * Each (t, g) pair is computed wholly by one worker from its own inputs, so
 * a token's output does not depend on the batch or the thread count. All
 * query heads of one kv head run together: each k_j, v_j is loaded once.
 * Pairs are dealt round-robin (pair i -> worker i mod n): a static split that
 * also balances prefill rows of growing length.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"

/* dot(a, b) in 8 lanes: lane l sums i = l, l+8, ... in order; then a fixed
 * tree. The lane loop vectorizes without reassociation. */
static float attn_dot(const float *a, const float *b, int32_t n)
{
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    for (int32_t l = 0; i < n; i++, l++)
        acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

typedef struct attn_job {
    cpu_exec *ce;
    float *out;
    const float *qkv, *k_cache, *v_cache;
    int32_t nh, nkv, hd;
    float scale;
    const step_batch *b;
} attn_job;

static void attn_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const attn_job *j = ctx;
    const step_batch *b = j->b;
    const int32_t hd = j->hd, nkv = j->nkv, G = j->nh / j->nkv, bs = b->block_size;
    const int64_t row = (int64_t)(j->nh + 2 * nkv) * hd, kvw = (int64_t)nkv * hd;
    const int64_t out_row = (int64_t)j->nh * hd;
    const int32_t ctx_cap = b->max_seq_len;
    float *scores = j->ce->scratch[worker].buf;   /* [G][max_seq_len] */
    float *inv_z = scores + (int64_t)G * ctx_cap; /* [G] */
    const int64_t n_pairs = (int64_t)b->num_tokens * nkv;
    for (int64_t i = worker; i < n_pairs; i += n_workers) {
        const int32_t t = (int32_t)(i / nkv), g = (int32_t)(i % nkv);
        const int32_t s = j->ce->tok_seq[t], n_ctx = b->positions[t] + 1;
        const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
        const float *q = j->qkv + t * row + (int64_t)g * G * hd;
        float *o = j->out + t * out_row + (int64_t)g * G * hd;

        for (int32_t c = 0; c < n_ctx; c++) {
            int64_t slot = (int64_t)table[c / bs] * bs + c % bs;
            const float *k = j->k_cache + slot * kvw + (int64_t)g * hd;
            for (int32_t h = 0; h < G; h++)
                scores[(int64_t)h * ctx_cap + c] = attn_dot(q + (int64_t)h * hd, k, hd) * j->scale;
        }
        for (int32_t h = 0; h < G; h++) {
            float *sc = scores + (int64_t)h * ctx_cap;
            float mx = sc[0];
            for (int32_t c = 1; c < n_ctx; c++)
                mx = sc[c] > mx ? sc[c] : mx;
            float z = 0.0f;
            for (int32_t c = 0; c < n_ctx; c++) {
                sc[c] = expf(sc[c] - mx);
                z += sc[c];
            }
            inv_z[h] = 1.0f / z;
            memset(o + (int64_t)h * hd, 0, (size_t)hd * sizeof(float));
        }
        for (int32_t c = 0; c < n_ctx; c++) {
            int64_t slot = (int64_t)table[c / bs] * bs + c % bs;
            const float *v = j->v_cache + slot * kvw + (int64_t)g * hd;
            for (int32_t h = 0; h < G; h++) {
                const float e = scores[(int64_t)h * ctx_cap + c];
                float *oh = o + (int64_t)h * hd;
                for (int32_t d = 0; d < hd; d++)
                    oh[d] += e * v[d];
            }
        }
        for (int32_t h = 0; h < G; h++) {
            const float inv = inv_z[h];
            float *oh = o + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++)
                oh[d] *= inv;
        }
    }
}

int cpu_op_attention(cpu_exec *ce, float *out, const float *qkv, const float *k_cache,
                     const float *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                     const step_batch *b)
{
    const int32_t T = b->num_tokens;
    if (!b->positions || !b->seq_lens || !b->block_tables)
        return cpu_exec_fail(ce, PG_EINVAL, "attention: positions, seq_lens and block_tables are required");
    if ((size_t)T > ce->tok_seq_cap) {
        int32_t *p = realloc(ce->tok_seq, (size_t)T * sizeof *p);
        if (!p)
            return cpu_exec_fail(ce, PG_ENOMEM, "attention: out of memory for %d token rows", (int)T);
        ce->tok_seq = p;
        ce->tok_seq_cap = (size_t)T;
    }
    int32_t max_len = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t len = b->seq_lens[s];
        if (len > max_len)
            max_len = len;
        int32_t n_blocks = (len + b->block_size - 1) / b->block_size;
        if (n_blocks > b->block_table_stride)
            return cpu_exec_fail(ce, PG_EINVAL, "attention: sequence %d: seq_len %d needs %d blocks, table stride is %d",
                                 (int)s, (int)len, (int)n_blocks, (int)b->block_table_stride);
        const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
        for (int32_t k = 0; k < n_blocks; k++)
            if (table[k] < 0)
                return cpu_exec_fail(ce, PG_EINVAL, "attention: sequence %d: block table entry %d is %d, expected >= 0",
                                     (int)s, (int)k, (int)table[k]);
        for (int32_t t = b->query_start[s]; t < b->query_start[s + 1]; t++) {
            if (b->positions[t] < 0 || b->positions[t] >= len)
                return cpu_exec_fail(ce, PG_EINVAL, "attention: token %d of sequence %d: expected position in [0,%d), got %d",
                                     (int)t, (int)s, (int)len, (int)b->positions[t]);
            ce->tok_seq[t] = s;
        }
    }
    if (max_len > b->max_seq_len)
        return cpu_exec_fail(ce, PG_EINVAL, "attention: max_seq_len is %d but a sequence has %d tokens",
                             (int)b->max_seq_len, (int)max_len);
    /* scores [G][max_seq_len], then 1/z [G] */
    int rc = cpu_exec_scratch(ce, (size_t)(nh / nkv) * ((size_t)b->max_seq_len + 1));
    if (rc)
        return rc;
    attn_job job = {ce, out, qkv, k_cache, v_cache, nh, nkv, hd, scale, b};
    double work = (double)T * nh * hd * (double)b->max_seq_len;
    cpu_pool_run(ce->pool, work < 32768.0 ? 1 : ce->n_threads, attn_worker, &job);
    return PG_OK;
}
