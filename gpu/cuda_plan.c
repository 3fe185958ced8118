/* cuda_plan: host-side launch geometry, memory and graph-bucket planning of
 * the CUDA executor (see cuda_plan.h). Plain C, no CUDA header. */
#include "cuda_plan.h"

#include <math.h>

int cuda_plan_head_dim_supported(int32_t hd)
{
    switch (hd) {
    case 8: case 16: case 32: case 64: case 128: case 256: return 1;
    default: return 0;
    }
}

static size_t decode_smem_bytes(int32_t hd, int32_t gc, int32_t partition)
{
    size_t q = (size_t)gc * (size_t)hd * 4u;                 /* q [gc][hd] f32 */
    size_t s = (size_t)gc * (size_t)partition * 4u;          /* scores [gc][P] f32 */
    size_t red = (size_t)CUDA_PLAN_ATTN_THREADS * CUDA_PLAN_DECODE_EPT * 4u; /* [threads*EPT] */
    size_t stats = 7u * (size_t)gc * 4u;  /* max, sum; the split's max, sum; merge weights (3) [gc] */
    return q + s + red + stats;
}

int32_t cuda_plan_num_partitions(int32_t seq_len, int32_t partition_size)
{
    if (seq_len <= 0 || partition_size <= 0)
        return 1;
    return (int32_t)(((int64_t)seq_len + partition_size - 1) / partition_size);
}

int cuda_plan_decode(cuda_decode_plan *out, int32_t hd, int32_t G, int32_t max_seq_len,
                     size_t smem_limit_bytes, pg_error *err)
{
    static const int32_t sizes[] = {512, 256, 128, 64};
    if (!cuda_plan_head_dim_supported(hd))
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "cuda decode attention: head_dim %d not supported "
                            "(expected 8, 16, 32, 64, 128 or 256)", (int)hd);
    if (G < 1)
        return pg_error_set(err, PG_EINVAL,
                            "cuda decode attention: query heads per kv head must be >= 1, got %d",
                            (int)G);
    if (max_seq_len < 1)
        return pg_error_set(err, PG_EINVAL,
                            "cuda decode attention: max_seq_len must be >= 1, got %d",
                            (int)max_seq_len);
    int32_t gc = G < CUDA_PLAN_DECODE_MAX_G ? G : CUDA_PLAN_DECODE_MAX_G;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t need = decode_smem_bytes(hd, gc, sizes[i]);
        if (need <= smem_limit_bytes) {
            out->threads = CUDA_PLAN_ATTN_THREADS;
            out->group_threads = hd / CUDA_PLAN_DECODE_EPT;
            out->partition_size = sizes[i];
            out->max_partitions = cuda_plan_num_partitions(max_seq_len, sizes[i]);
            out->splits = out->max_partitions < CUDA_PLAN_DECODE_MAX_SPLITS
                              ? out->max_partitions : CUDA_PLAN_DECODE_MAX_SPLITS;
            out->smem_bytes = need;
            return 0;
        }
    }
    return pg_error_set(err, PG_EUNSUPPORTED,
                        "cuda decode attention: head_dim %d, %d heads per kv head: expected at most "
                        "%zu bytes of shared memory, the smallest partition needs %zu",
                        (int)hd, (int)G, smem_limit_bytes, decode_smem_bytes(hd, gc, 64));
}

static int32_t clamp_i32(int32_t v, int32_t lo, int32_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

int cuda_plan_prefill(cuda_prefill_plan *out, int32_t hd, int32_t G, int32_t max_query_len,
                      size_t smem_limit_bytes, pg_error *err)
{
    if (!cuda_plan_head_dim_supported(hd))
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "cuda prefill attention: head_dim %d not supported "
                            "(expected 8, 16, 32, 64, 128 or 256)", (int)hd);
    if (G < 1 || max_query_len < 1)
        return pg_error_set(err, PG_EINVAL,
                            "cuda prefill attention: expected G >= 1 and max_query_len >= 1, "
                            "got %d and %d", (int)G, (int)max_query_len);
    int32_t R = clamp_i32(2048 / hd, 8, 64);
    int32_t BK = clamp_i32(2048 / hd, 8, 32);
    size_t f = 4u;
    size_t need = f * ((size_t)R * (size_t)hd * 2u            /* Q, O */
                       + (size_t)BK * (size_t)(hd + 1)        /* K (padded rows) */
                       + (size_t)BK * (size_t)hd              /* V */
                       + (size_t)R * (size_t)BK               /* S */
                       + 3u * (size_t)R);                     /* m, l, alpha */
    if (need > smem_limit_bytes)
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "cuda prefill attention: head_dim %d needs %zu bytes of shared memory, "
                            "limit %zu", (int)hd, need, smem_limit_bytes);
    int64_t rows = (int64_t)max_query_len * G;
    out->threads = CUDA_PLAN_ATTN_THREADS;
    out->rows_per_block = R;
    out->keys_per_tile = BK;
    out->grid_x = (int32_t)((rows + R - 1) / R);
    out->smem_bytes = need;
    return 0;
}

int32_t cuda_plan_blocks(size_t n, int32_t threads, int32_t max_blocks)
{
    if (threads < 1)
        threads = 1;
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b < 1)
        b = 1;
    if (max_blocks >= 1 && b > (size_t)max_blocks)
        b = (size_t)max_blocks;
    return (int32_t)b;
}

int cuda_plan_kv_blocks(int32_t *num_blocks, const cuda_mem_plan_in *in, pg_error *err)
{
    if (!(in->utilization > 0.0 && in->utilization <= 1.0))
        return pg_error_set(err, PG_EINVAL,
                            "gpu memory utilization must be in (0, 1], got %g", in->utilization);
    if (in->kv_bytes_per_block == 0)
        return pg_error_set(err, PG_EINVAL, "kv bytes per block must be > 0");
    if (in->free_bytes > in->total_bytes)
        return pg_error_set(err, PG_EINVAL, "free memory %zu exceeds total %zu",
                            in->free_bytes, in->total_bytes);
    double allowed = (double)in->total_bytes * in->utilization;
    double used = (double)(in->total_bytes - in->free_bytes);
    double budget = allowed - used - (double)in->reserve_bytes;
    double blocks = budget > 0.0 ? floor(budget / (double)in->kv_bytes_per_block) : 0.0;
    int32_t min_blocks = in->min_blocks < 1 ? 1 : in->min_blocks;
    if (blocks < (double)min_blocks) {
        return pg_error_set(err, PG_ENOMEM,
                            "gpu memory: not enough for the kv cache: total %.1f MiB x utilization %.2f "
                            "= %.1f MiB allowed, %.1f MiB in use (weights, context), %.1f MiB still "
                            "to allocate (workspaces) leaves %.1f MiB; expected at least %d blocks of "
                            "%.3f MiB, found room for %.0f (raise --gpu-memory-utilization or use a "
                            "smaller model)",
                            (double)in->total_bytes / 1048576.0, in->utilization,
                            allowed / 1048576.0, used / 1048576.0,
                            (double)in->reserve_bytes / 1048576.0, budget / 1048576.0,
                            (int)min_blocks, (double)in->kv_bytes_per_block / 1048576.0, blocks);
    }
    *num_blocks = blocks > (double)INT32_MAX ? INT32_MAX : (int32_t)blocks;
    return 0;
}

int32_t cuda_plan_graph_sizes(int32_t *sizes, int32_t cap, int32_t max_batch)
{
    int32_t n = 0;
    int32_t last = 0;
    for (int32_t s = 1; s <= max_batch;) {
        if (n < cap)
            sizes[n] = s;
        n++;
        last = s;
        s = s < 8 ? (s < 4 ? s * 2 : 8) : s + 8;
    }
    if (max_batch >= 1 && last != max_batch) {
        if (n < cap)
            sizes[n] = max_batch;
        n++;
    }
    return n;
}

int32_t cuda_plan_graph_bucket(int32_t batch, int32_t max_batch)
{
    if (batch < 1 || batch > max_batch)
        return -1;
    int32_t b;
    if (batch <= 2)
        b = batch;
    else if (batch <= 4)
        b = 4;
    else
        b = (batch + 7) / 8 * 8;
    return b > max_batch ? max_batch : b;
}

int32_t cuda_plan_graph_context(int32_t seq_len, int32_t max_seq_len, int32_t *bound)
{
    if (seq_len < 1 || seq_len > max_seq_len)
        return -1;
    int64_t b = CUDA_PLAN_GRAPH_TIER0;
    int32_t k = 0;
    while (b < seq_len && b < max_seq_len) {
        b *= 4;
        k++;
    }
    *bound = b < max_seq_len ? (int32_t)b : max_seq_len;
    return k;
}

int32_t cuda_plan_graph_tiers(int32_t max_seq_len)
{
    int32_t bound = 0;
    return max_seq_len < 1 ? 0 : cuda_plan_graph_context(max_seq_len, max_seq_len, &bound) + 1;
}
