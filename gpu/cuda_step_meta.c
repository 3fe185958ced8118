/* cuda_step_meta: begin_step — the step's checks (those of the CPU twin,
 * made on the host before anything is launched) and its metadata copied to
 * the device in one block (pgk_batch points into it); a graphed step binds
 * the graphs' fixed block instead (cuda_graphs.c). See cuda_exec_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"

/* begin_step's checks, then (upload = 1) the metadata to the device. */
int cx_begin_step_impl(cuda_exec *c, const step_batch *b, int upload)
{
    c->have_batch = 0;
    const int32_t T = b->num_tokens, S = b->num_seqs, L = b->num_logits;
    if (T < 1 || S < 1 || L < 0 || L > T || b->block_size < 1 || b->block_table_stride < 0)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda begin_step: expected T >= 1, S >= 1, 0 <= L <= T, block_size >= 1, "
                            "got T %d, S %d, L %d, block_size %d", (int)T, (int)S, (int)L,
                            (int)b->block_size);
    if (b->query_start[0] != 0 || b->query_start[S] != T)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda begin_step: expected query_start[0] = 0 and query_start[S] = T = %d, "
                            "got %d and %d", (int)T, (int)b->query_start[0], (int)b->query_start[S]);
    /* The checks of the CPU twin (cpu_check_batch, attn_prepare,
     * cpu_op_kv_write), here before anything is launched: on the device a
     * bad entry is an illegal address or a silent write into another
     * sequence's KV. Token ids are checked by embed, which knows V. */
    int32_t max_q = 0, max_len = 0, n_decode = 0, n_prefill = 0;
    for (int32_t s = 0; s < S; s++) {
        int32_t q = b->query_start[s + 1] - b->query_start[s];
        int32_t len = b->seq_lens[s];
        int64_t nblk = ((int64_t)len + b->block_size - 1) / b->block_size;
        if (q < 0 || len < q || nblk > b->block_table_stride)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda begin_step: sequence %d: expected 0 <= q_len <= seq_len and "
                                "ceil(seq_len / block_size) <= block_table_stride %d, got q_len %d, "
                                "seq_len %d", (int)s, (int)b->block_table_stride, (int)q, (int)len);
        const int32_t *table = b->block_tables + (size_t)s * (size_t)b->block_table_stride;
        /* null entries (dropped behind the sliding window) only wholly below
         * the first query's lowest key: the kernels never load those */
        const int32_t p0 = len - q, w = b->sliding_window;
        const int64_t lo = w > 0 && p0 - w + 1 > 0 ? p0 - w + 1 : 0;
        for (int64_t k = 0; k < nblk; k++)
            if (table[k] < 0 && (k + 1) * b->block_size > lo)
                return pg_error_set(&c->err, PG_EINVAL,
                                    "cuda begin_step: sequence %d: block table entry %d: expected a "
                                    "block id >= 0 (it holds positions the queries read, from %d on), "
                                    "got %d", (int)s, (int)k, (int)lo, (int)table[k]);
        /* the kernels derive a query's position as seq_len - q_len + i (the
         * chunk is the tail of the context), rope and the CPU read positions */
        for (int32_t i = 0; i < q; i++) {
            int32_t t = b->query_start[s] + i;
            if (b->positions[t] != len - q + i)
                return pg_error_set(&c->err, PG_EINVAL,
                                    "cuda begin_step: token %d (query %d of sequence %d, seq_len %d, "
                                    "q_len %d): expected position %d, got %d", (int)t, (int)i, (int)s,
                                    (int)len, (int)q, (int)(len - q + i), (int)b->positions[t]);
            if (b->slots[t] < 0)
                return pg_error_set(&c->err, PG_EINVAL,
                                    "cuda begin_step: token %d: expected slot >= 0, got %d", (int)t,
                                    (int)b->slots[t]);
        }
        max_q = q > max_q ? q : max_q;
        max_len = len > max_len ? len : max_len;
        n_decode += q == 1;
        n_prefill += q >= 2;
    }
    for (int32_t r = 0; r < L; r++)
        if (b->logits_rows[r] < 0 || b->logits_rows[r] >= T)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda begin_step: logits_rows[%d] = %d: expected 0 .. %d",
                                (int)r, (int)b->logits_rows[r], (int)T - 1);
    /* LoRA slots: -1 (the base model) or a slot; lora_add checks the upper
     * bound against its n_slots, the kernels skip a row of no slot they have */
    for (int32_t t = 0; b->lora_slots && t < T; t++)
        if (b->lora_slots[t] < -1)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda begin_step: lora_slots[%d] = %d: expected -1 or a slot >= 0",
                                (int)t, (int)b->lora_slots[t]);
    if (!upload)
        return 0;

    size_t n_bt = (size_t)S * (size_t)b->block_table_stride;
    size_t n = 3u * (size_t)T + (size_t)(S + 1) + (size_t)S + n_bt + (size_t)L + (size_t)n_prefill +
               (b->lora_slots ? (size_t)T : 0u);
    void *hv = NULL;
    int rc = cx_pinned_get(c->stream, &c->meta_h, n * 4u, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda begin_step");
    size_t cap_bytes = c->meta_cap * 4u;
    rc = cx_device_grow(c->stream, (void **)&c->meta_d, &cap_bytes, n * 4u, "cudaMalloc (step metadata)", &c->err);
    c->meta_cap = cap_bytes / 4u;
    if (rc)
        return rc;
    int32_t *h = (int32_t *)hv;
    size_t o = 0;
    pgk_batch *d = &c->batch;
#define PUT(field, src, count)                                   \
    do {                                                         \
        memcpy(h + o, (src), (size_t)(count) * 4u);              \
        d->field = c->meta_d + o;                                \
        o += (size_t)(count);                                    \
    } while (0)
    PUT(token_ids, b->token_ids, T);
    PUT(positions, b->positions, T);
    PUT(slots, b->slots, T);
    PUT(query_start, b->query_start, S + 1);
    PUT(seq_lens, b->seq_lens, S);
    PUT(block_tables, b->block_tables, n_bt);
    PUT(logits_rows, b->logits_rows, L);
    d->lora_slots = NULL;
    if (b->lora_slots)
        PUT(lora_slots, b->lora_slots, T);
    d->prefill_seqs = c->meta_d + o;
    for (int32_t s = 0; s < S; s++)
        if (b->query_start[s + 1] - b->query_start[s] >= 2)
            h[o++] = s;
#undef PUT
    CUDA_TRY(&c->err, "cudaMemcpyAsync (step metadata)",
             cudaMemcpyAsync(c->meta_d, h, n * 4u, cudaMemcpyHostToDevice, c->stream));
    rc = cx_pinned_mark(&c->meta_h, c->stream, &c->err);
    if (rc)
        return rc;
    d->num_tokens = T;
    d->num_seqs = S;
    d->block_size = b->block_size;
    d->block_table_stride = b->block_table_stride;
    d->max_seq_len = max_len;      /* recomputed: the grids are sized from these */
    d->max_query_len = max_q;
    d->num_logits = L;
    d->num_prefill_seqs = n_prefill;
    c->n_decode_seqs = n_decode;
    c->have_batch = 1;
    return 0;
}

int cx_begin_step(executor *ex, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    c->lora_sig = 0xcbf29ce484222325ull; /* a new forward: its lora_add calls from here */
    c->lora_calls = 0;
    if (cx_graph_bound(c)) /* a warm-up or capture of a graphed step */
        return cx_graph_bind_batch(c, b);
    const double t0 = step_profile_now();
    int rc = cx_begin_step_impl(c, b, 1);
    step_profile_add(cuda_sprof_profile(c->sprof), SP_H2D, t0);
    return rc;
}

/* The device copy of b (checks that b is the batch of the last begin_step). */
int cx_step_batch_dev(cuda_exec *c, const step_batch *b, const char *op, const pgk_batch **out)
{
    if (!c->have_batch || b->num_tokens != c->batch.num_tokens || b->num_seqs != c->batch.num_seqs ||
        b->num_logits != c->batch.num_logits)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda %s: expected the batch of the last begin_step (T %d, S %d), got "
                            "T %d, S %d", op, c->have_batch ? (int)c->batch.num_tokens : -1,
                            c->have_batch ? (int)c->batch.num_seqs : -1, (int)b->num_tokens,
                            (int)b->num_seqs);
    *out = &c->batch;
    return 0;
}
