/* cuda_ops: the ops of a layer (executor.h), each forwarded to its launcher
 * (cuda_kernels.h, one .cu file per op family) or to the GEMM wrapper
 * (cuda_gemm.c). See cuda_exec_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"
#include "cuda_plan.h"

int cx_embed(executor *ex, void *x, const void *table, int32_t H, int32_t V,
                      const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "embed", &d);
    if (rc)
        return rc;
    for (int32_t t = 0; t < b->num_tokens; t++)
        if (b->token_ids[t] < 0 || b->token_ids[t] >= V)
            return pg_error_set(&c->err, PG_EINVAL, "cuda embed: token %d: expected id in [0,%d), got %d",
                                (int)t, (int)V, (int)b->token_ids[t]);
    if (c->graphs && c->graphs->bound)
        c->graphs->vocab = V; /* replays check their token ids against it */
    return pgk_embed(x, table, c->act_dt, H, V, d, &c->lk);
}

int cx_rmsnorm(executor *ex, void *out, void *residual, const void *x, const float *w,
                        int32_t rows, int32_t dim, float eps)
{
    cuda_exec *c = cx(ex);
    return pgk_rmsnorm(out, residual, x, w, c->act_dt, rows, dim, eps, &c->lk);
}

int cx_matmul(executor *ex, void *y, const void *x, const void *w, int32_t M, int32_t N,
                       int32_t K)
{
    cuda_exec *c = cx(ex);
    /* the rows y and x hold (alloc()'s table): a last partial 128-row chunk
     * runs in place when both hold its padded rows (cuda_gemm_xwt_rows;
     * executor.h matmul allows writing y's rows past M) */
    const size_t eb = pgk_dtype_bytes(c->act_dt);
    const int64_t y_rows = cx_rows_after(c, y, (size_t)N * eb);
    const int64_t x_rows = cx_rows_after(c, x, (size_t)K * eb);
    int rc = cuda_gemm_xwt_rows(c->gemm, y, y_rows > M ? y_rows : M, c->act_dt, x,
                                x_rows > M ? x_rows : M, w, c->act_dt, M, N, K, &c->err);
    if (rc == 0)
        rc = pgk_check_stream("matmul (cublasGemmEx)", &c->lk); /* counted by cuda_gemm */
    return rc;
}

int cx_rope(executor *ex, void *qkv, const float *inv_freq, int32_t nh, int32_t nkv,
                     int32_t hd, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "rope", &d);
    if (rc)
        return rc;
    return pgk_rope(qkv, inv_freq, c->act_dt, nh, nkv, hd, d, &c->lk);
}

int cx_kv_write(executor *ex, void *k_cache, void *v_cache, const void *qkv, int32_t nh,
                         int32_t nkv, int32_t hd, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "kv_write", &d);
    if (rc)
        return rc;
    return pgk_kv_write(k_cache, v_cache, c->kv_dt, qkv, c->act_dt, nh, nkv, hd, d, &c->lk);
}

/* bias + q/k norm + rope + kv_write in one launch (gpu/rope_kv.cu; the
 * four ops above are its twins, executor.h rope_kv) */
int cx_rope_kv(executor *ex, void *qkv, void *k_cache, void *v_cache, const float *b_qkv,
               const float *q_w, const float *k_w, float eps, const float *inv_freq, int32_t nh,
               int32_t nkv, int32_t hd, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "rope_kv", &d);
    if (rc)
        return rc;
    return pgk_rope_kv(qkv, k_cache, v_cache, c->kv_dt, b_qkv, q_w, k_w, eps, inv_freq, c->act_dt,
                       nh, nkv, hd, d, &c->lk);
}

/* Sequences with one query token go to the decode kernel, the others to the
 * prefill kernel — chosen per sequence, never by the batch (a pure decode
 * step, b->max_query_len == 1, launches only the decode kernel). */
int cx_attention(executor *ex, void *out, const void *qkv, const void *k_cache,
                          const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                          const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "attention", &d);
    if (rc)
        return rc;
    if (!cuda_plan_head_dim_supported(hd))
        return pg_error_set(&c->err, PG_EUNSUPPORTED,
                            "cuda attention: head_dim %d not supported (expected 8, 16, 32, 64, 128 "
                            "or 256)", (int)hd);
    if (c->n_decode_seqs > 0) {
        if (nkv < 1 || nh % nkv != 0)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda attention: nh %d is not a multiple of nkv %d", (int)nh, (int)nkv);
        cuda_decode_plan pl;
        rc = cuda_plan_decode(&pl, hd, nh / nkv, d->max_seq_len, CUDA_PLAN_SMEM_DEFAULT_BYTES,
                              &c->err);
        if (rc)
            return rc;
        size_t need = pgk_decode_workspace_floats(d->num_seqs, nh, hd, d->max_seq_len,
                                                  pl.partition_size);
        /* a graphed step has its own workspace, sized at the warm-up */
        float **ws = cx_graph_bound(c) ? &c->graphs->ws_d : &c->ws_d;
        size_t *ws_floats = cx_graph_bound(c) ? &c->graphs->ws_floats : &c->ws_floats;
        if (need > *ws_floats) {
            size_t cap = *ws_floats * 4u;
            rc = cx_device_grow(c->stream, (void **)ws, &cap, need * 4u, "cudaMalloc (decode workspace)",
                             &c->err);
            *ws_floats = cap / 4u;
            if (cx_graph_bound(c))
                c->graphs->generation++;
            if (rc)
                return rc;
        }
        rc = pgk_decode_attention(out, qkv, c->act_dt, k_cache, v_cache, c->kv_dt, nh, nkv, hd,
                                  scale, b->sliding_window, d, *ws, *ws_floats, &c->lk);
        if (rc)
            return rc;
    }
    if (d->max_query_len > 1)
        rc = pgk_prefill_attention(out, qkv, c->act_dt, k_cache, v_cache, c->kv_dt, nh, nkv, hd,
                                   scale, b->sliding_window, d, &c->lk);
    return rc;
}

/* Qwen's ops (executor.h add_bias, qk_norm): gpu/bias.cu, gpu/qk_norm.cu */
int cx_add_bias(executor *ex, void *y, const float *bias, int32_t rows, int32_t N)
{
    cuda_exec *c = cx(ex);
    if (rows == 0)
        return 0;
    return pgk_add_bias(y, bias, c->act_dt, rows, N, &c->lk);
}

int cx_qk_norm(executor *ex, void *qkv, const float *q_w, const float *k_w, int32_t T,
                        int32_t nh, int32_t nkv, int32_t hd, float eps)
{
    cuda_exec *c = cx(ex);
    if (T == 0)
        return 0;
    return pgk_qk_norm(qkv, q_w, k_w, c->act_dt, T, nh, nkv, hd, eps, &c->lk);
}

int cx_silu_mul(executor *ex, void *out, const void *gate_up, int32_t T, int32_t I)
{
    cuda_exec *c = cx(ex);
    return pgk_silu_mul(out, gate_up, c->act_dt, T, I, &c->lk);
}

int cx_gather_rows(executor *ex, void *dst, const void *src, int32_t dim,
                            const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "gather_rows", &d);
    if (rc)
        return rc;
    return pgk_gather_rows(dst, src, c->act_dt, dim, d, &c->lk);
}

int cx_copy_blocks(executor *ex, void *kv, int32_t n_planes, size_t plane_elems,
                            size_t block_elems, const int32_t *src_dst_host, int32_t n_pairs)
{
    cuda_exec *c = cx(ex);
    if (n_pairs <= 0)
        return n_pairs == 0 ? 0
                            : pg_error_set(&c->err, PG_EINVAL, "cuda copy_blocks: n_pairs %d < 0",
                                           (int)n_pairs);
    if (block_elems == 0 || plane_elems % block_elems != 0)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda copy_blocks: plane of %zu elements is not a multiple of the block "
                            "of %zu", plane_elems, block_elems);
    size_t nb = plane_elems / block_elems;
    for (int32_t i = 0; i < 2 * n_pairs; i++)
        if (src_dst_host[i] < 0 || (size_t)src_dst_host[i] >= nb)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda copy_blocks: block id %d at %d: expected 0 .. %zu",
                                (int)src_dst_host[i], (int)i, nb - 1);
    /* the pairs are copied in parallel (one kernel): a destination that is
     * also another pair's source or destination would race (a chain a->b,
     * b->c gives c either a's or b's old contents). Copy-on-write never
     * produces one (destinations are fresh blocks); reject it. */
    for (int32_t k = 0; k < n_pairs; k++)
        for (int32_t j = 0; j < n_pairs; j++)
            if (j != k && (src_dst_host[2 * j] == src_dst_host[2 * k + 1] ||
                           src_dst_host[2 * j + 1] == src_dst_host[2 * k + 1]) &&
                src_dst_host[2 * k] != src_dst_host[2 * k + 1])
                return pg_error_set(&c->err, PG_EINVAL,
                                    "cuda copy_blocks: pair %d's destination block %d is also used by "
                                    "pair %d: expected distinct destinations that are no pair's source",
                                    (int)k, (int)src_dst_host[2 * k + 1], (int)j);
    size_t bytes = (size_t)n_pairs * 2u * 4u;
    void *h = NULL;
    int rc = cx_pinned_get(c->stream, &c->pairs_h, bytes, &h, &c->err);
    if (rc)
        return rc;
    size_t cap = c->pairs_cap;
    rc = cx_device_grow(c->stream, (void **)&c->pairs_d, &cap, bytes, "cudaMalloc (copy_blocks pairs)", &c->err);
    c->pairs_cap = cap;
    if (rc)
        return rc;
    memcpy(h, src_dst_host, bytes);
    CUDA_TRY(&c->err, "cudaMemcpyAsync (copy_blocks pairs)",
             cudaMemcpyAsync(c->pairs_d, h, bytes, cudaMemcpyHostToDevice, c->stream));
    rc = cx_pinned_mark(&c->pairs_h, c->stream, &c->err);
    if (rc)
        return rc;
    return pgk_copy_blocks(kv, c->kv_dt, n_planes, plane_elems, block_elems, c->pairs_d, n_pairs,
                           &c->lk);
}

