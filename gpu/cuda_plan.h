/* cuda_plan: the host-side decisions of the CUDA executor, in plain C with
 * no CUDA header, so they are unit-tested on every machine
 * (tests/gpu/test_cuda_plan.c) whether or not CUDA is built:
 *   - which head sizes the attention kernels are compiled for;
 *   - the decode attention geometry: threads, thread groups per token,
 *     partition size (tokens of context one block walks) and the number of
 *     partitions of a sequence (vLLM's paged_attention v1 = one partition,
 *     v2 = several plus a reduction kernel);
 *   - the prefill attention tiles (query rows and keys per block);
 *   - the KV-cache size from --gpu-memory-utilization;
 *   - the CUDA-graph batch-size buckets (1, 2, 4, 8, 16, 24, 32, ...).
 * Pure functions; no state.
 */
#ifndef PG_CUDA_PLAN_H
#define PG_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

/* Threads per block of both attention kernels (4 warps). */
#define CUDA_PLAN_ATTN_THREADS 128
/* Elements of one head a thread of the decode kernel loads per key/value
 * (8 bf16 = one 16-byte load). */
#define CUDA_PLAN_DECODE_EPT 8
/* Query heads of one KV head the decode kernel accumulates at once (its
 * per-thread accumulators are [CUDA_PLAN_DECODE_MAX_G][EPT] registers); a
 * larger GQA group is processed in chunks of this many heads. */
#define CUDA_PLAN_DECODE_MAX_G 8
/* Blocks of the decode kernel per (sequence, KV-head chunk) at most: its
 * grid.z is min(partitions, this) and block z handles partitions z, z + 32,
 * z + 64, ... of a sequence (merging them in that order), so the grid and
 * the split workspace are bounded whatever max_model_len is (a CUDA graph's
 * grid is planned for its longest context: 256 partitions of 512 at 128k
 * tokens). A partition's arithmetic and its block do not depend on the grid:
 * partition p always goes to block p mod 32, so graph and eager steps, and
 * any two batches, give the same bits. */
#define CUDA_PLAN_DECODE_MAX_SPLITS 32
/* Shared memory a block may use without an opt-in on every sm_80+ GPU. */
#define CUDA_PLAN_SMEM_DEFAULT_BYTES (48u * 1024u)

/* 1 when the attention kernels are instantiated for head_dim hd:
 * 8, 16, 32, 64, 128, 256 (a power of two so that hd / 8 threads of a
 * group divide a warp). Others (80, 96, ...) return 0. */
int cuda_plan_head_dim_supported(int32_t hd);

typedef struct cuda_decode_plan {
    int32_t threads;          /* CUDA_PLAN_ATTN_THREADS */
    int32_t group_threads;    /* threads that share one key: hd / EPT */
    int32_t partition_size;   /* context tokens per block (multiple of 32) */
    int32_t max_partitions;   /* ceil(max_seq_len / partition_size) */
    int32_t splits;           /* min(max_partitions, CUDA_PLAN_DECODE_MAX_SPLITS) = grid.z,
                                 and the partial results per (sequence, head) */
    size_t smem_bytes;        /* dynamic shared memory per block */
} cuda_decode_plan;

/* Geometry of the decode kernel for head_dim hd, G = nh / nkv query heads
 * per KV head and the longest context of the step. The partition size is
 * the largest of 512, 256, 128, 64 whose shared memory (q [G][hd] f32,
 * scores [G][P] f32, reduction [threads*EPT] f32, statistics [7][G] f32)
 * fits smem_limit_bytes.
 * It depends on (hd, G) only, never on the batch, so a sequence is split the
 * same way in every step — and by a CUDA graph, whose grid is planned for
 * the context bound of its tier (cuda_plan_graph_context; blocks past a
 * sequence's partitions exit at once), so graph and eager steps give the
 * same bits (cuda_executor.h). */
int cuda_plan_decode(cuda_decode_plan *out, int32_t hd, int32_t G, int32_t max_seq_len,
                     size_t smem_limit_bytes, pg_error *err);

/* Partitions sequence of seq_len tokens is split into (>= 1 for seq_len >= 1). */
int32_t cuda_plan_num_partitions(int32_t seq_len, int32_t partition_size);

typedef struct cuda_prefill_plan {
    int32_t threads;          /* CUDA_PLAN_ATTN_THREADS */
    int32_t rows_per_block;   /* R flattened (query token, head-of-group) rows */
    int32_t keys_per_tile;    /* BK keys loaded into shared memory at a time */
    int32_t grid_x;           /* ceil(max_query_len * G / R) */
    size_t smem_bytes;        /* Q, O [R][hd], K [BK][hd+1], V [BK][hd], S [R][BK],
                                 m, l, alpha [R], all f32 */
} cuda_prefill_plan;

/* Tiles of the prefill kernel: R = clamp(2048 / hd, 8, 64) rows,
 * BK = clamp(2048 / hd, 8, 32) keys. Fails when the tiles do not fit
 * smem_limit_bytes. */
int cuda_plan_prefill(cuda_prefill_plan *out, int32_t hd, int32_t G, int32_t max_query_len,
                      size_t smem_limit_bytes, pg_error *err);

/* Blocks of `threads` for n independent elements, capped at max_blocks
 * (kernels then loop grid-stride); >= 1. */
int32_t cuda_plan_blocks(size_t n, int32_t threads, int32_t max_blocks);

/* KV cache sizing, vLLM's rule: the KV cache may take what is left of
 * total * utilization after everything already allocated (weights, the
 * CUDA context, workspaces; measured as total - free after loading) and
 * what is still to be allocated (reserve_bytes: activation workspace,
 * cuBLAS workspace, not yet allocated).
 *   budget = total * util - (total - free) - reserve
 *   blocks = floor(budget / kv_bytes_per_block)
 * Fails with PG_ENOMEM and a message with every number when not even
 * min_blocks fit; util must be in (0, 1]. */
typedef struct cuda_mem_plan_in {
    size_t total_bytes;
    size_t free_bytes;           /* measured after the weights were loaded */
    double utilization;          /* --gpu-memory-utilization, (0, 1] */
    size_t reserve_bytes;        /* still to be allocated besides the KV cache */
    size_t kv_bytes_per_block;   /* all layers, K and V */
    int32_t min_blocks;          /* fewer than this is an error (>= 1) */
} cuda_mem_plan_in;

int cuda_plan_kv_blocks(int32_t *num_blocks, const cuda_mem_plan_in *in, pg_error *err);

/* CUDA-graph batch buckets (vLLM's capture sizes): 1, 2, 4, then every
 * multiple of 8 up to max_batch (max_batch itself is added when it is not
 * one of them). Writes at most cap sizes in increasing order and returns how
 * many there are in all (may exceed cap). */
int32_t cuda_plan_graph_sizes(int32_t *sizes, int32_t cap, int32_t max_batch);
/* CUDA-graph context tiers: a decode step whose longest context is seq_len
 * runs the graph planned for cuda_plan_graph_context(seq_len, max_seq_len)
 * tokens: the smallest of 512, 2048, 8192, ... (x4) that holds seq_len,
 * clamped to max_seq_len; its decode grid and its block-table stride are
 * sized by that bound, not by max_model_len, so a step's launches and
 * metadata copy stay within 4x of the context in use. Returns the tier's
 * index (0, 1, ...) and its bound in *bound; -1 when seq_len is outside
 * [1, max_seq_len]. cuda_plan_graph_tiers: how many tiers max_seq_len has. */
#define CUDA_PLAN_GRAPH_TIER0 512
int32_t cuda_plan_graph_context(int32_t seq_len, int32_t max_seq_len, int32_t *bound);
int32_t cuda_plan_graph_tiers(int32_t max_seq_len);
/* The smallest bucket >= batch (the padded batch a captured graph runs),
 * or -1 when batch > max_batch or batch < 1. */
int32_t cuda_plan_graph_bucket(int32_t batch, int32_t max_batch);

#endif /* PG_CUDA_PLAN_H */
