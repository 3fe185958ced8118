/* cpu_ops: internal to cpu/ — the CPU executor's state and its op bodies
 * (cpu_ops.c: element-wise and copy ops; cpu_attention.c: paged attention).
 * Not part of the executor contract; only cpu_executor.c includes it. */
#ifndef PG_CPU_OPS_H
#define PG_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_pool.h"
#include "cpu_wt.h"
#include "executor.h"

/* Per-worker scratch, grown on the calling thread before a parallel op. */
typedef struct cpu_scratch {
    float *buf;
    size_t cap; /* floats */
} cpu_scratch;

typedef struct cpu_exec {
    executor base; /* first: executor * <-> cpu_exec * */
    cpu_pool *pool;
    int32_t n_threads;
    int32_t gemm_variant;   /* cpu_gemm_variant of matmul and logits */
    cpu_wt wt;              /* storage of EXEC_WT buffers */
    cpu_kv kv;              /* storage of EXEC_KV buffers */
    int32_t precision;      /* cpu_matmul_precision of matmul and logits */
    bool prefault_kv;       /* cpu_executor_params.prefault_kv */
    /* The KV buffer's huge pages, grown with the run (cpu_executor.c
     * cpu_kv_pages): the last EXEC_KV buffer allocated without prefault,
     * its bytes, the stage (0: planes not known yet, 1: each plane's tail
     * huge, its lead in 4 KiB pages, 2: all huge) and the smallest lead. */
    char *kv_buf;
    size_t kv_buf_bytes;
    int32_t kv_pages_stage;
    size_t kv_lead_bytes;
    void *act_q;            /* [act_q_cap] bytes: x rounded / quantized for a mode's product */
    size_t act_q_cap;
    cpu_scratch *scratch;   /* [n_threads] */
    int32_t *tok_seq;       /* [tok_seq_cap] sequence of each token (attention) */
    size_t tok_seq_cap;
    int32_t *attn_tiles;    /* [attn_tiles_cap] first token row of each attention tile, then T */
    size_t attn_tiles_cap;
    void *moe_buf;          /* [moe_cap] bytes: moe_experts' grouped rows (cpu_moe.c) */
    size_t moe_cap;
    void *lora_buf;         /* [lora_cap] bytes: lora_add's sorted rows and gathered slice (cpu_lora.c) */
    size_t lora_cap;
    char err[1024];
} cpu_exec;

/* The part [*lo, *hi) of the KV plane [ps, ps + plane_bytes) asked for
 * transparent huge pages from a run's first KV write on: from the first
 * 2 MiB boundary at least 2 MiB past the plane's start to the plane's last
 * whole 4 KiB page. The lead before it (2 to 4 MiB: the blocks the pool
 * hands out first) stays in 4 KiB pages until the run outgrows it. False
 * (nothing asked) when the plane ends inside its lead. */
bool cpu_kv_tail_range(uintptr_t ps, size_t plane_bytes, uintptr_t *lo, uintptr_t *hi);

/* Formats ce->err; returns status. */
int cpu_exec_fail(cpu_exec *ce, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Ensures every worker's scratch holds >= n floats. */
int cpu_exec_scratch(cpu_exec *ce, size_t n);

/* Op bodies: arguments as in executor.h (weight buffers of type ce->wt,
 * caches of type ce->kv), validated by the caller except
 * where said. Return 0 or a negative pg_status (message in ce->err). */
int cpu_op_embed(cpu_exec *ce, float *x, const void *table, int32_t H, int32_t V, const step_batch *b);
int cpu_op_rmsnorm(cpu_exec *ce, float *out, float *residual, const float *x, const float *w,
                   int32_t rows, int32_t dim, float eps);
int cpu_op_add_bias(cpu_exec *ce, float *y, const float *bias, int32_t rows, int32_t N);
int cpu_op_qk_norm(cpu_exec *ce, float *qkv, const float *q_w, const float *k_w, int32_t T, int32_t nh,
                   int32_t nkv, int32_t hd, float eps);
int cpu_op_rope(cpu_exec *ce, float *qkv, const float *inv_freq, int32_t nh, int32_t nkv, int32_t hd,
                const step_batch *b);
int cpu_op_kv_write(cpu_exec *ce, void *k_cache, void *v_cache, const float *qkv, int32_t nh,
                    int32_t nkv, int32_t hd, const step_batch *b);
int cpu_op_silu_mul(cpu_exec *ce, float *out, const float *gate_up, int32_t T, int32_t I);
int cpu_op_gather_rows(cpu_exec *ce, float *dst, const float *src, int32_t dim, const step_batch *b);
int cpu_op_copy_blocks(cpu_exec *ce, void *kv, int32_t n_planes, size_t plane_elems, size_t block_elems,
                       const int32_t *src_dst, int32_t n_pairs);
int cpu_op_attention(cpu_exec *ce, float *out, const float *qkv, const void *k_cache,
                     const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                     const step_batch *b);
/* The simple twin of cpu_op_attention (cpu_attention.c): same contract,
 * plain loops and libm expf; for tests (tests/ops/test_attention_fast.c). */
int cpu_op_attention_ref(cpu_exec *ce, float *out, const float *qkv, const void *k_cache,
                         const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                         const step_batch *b);

/* y [M][ldy] = x @ w^T (w [N][K] of type ce->wt) in the executor's matmul
 * precision: the matmul op's product (cpu_executor.c). */
int cpu_product(cpu_exec *ce, float *y, int64_t ldy, const float *x, const void *w, int32_t M, int32_t N,
                int32_t K);
/* Mixture of experts (cpu_moe.c; executor.h moe_route / moe_experts /
 * moe_shared_add). */
int cpu_op_moe_route(cpu_exec *ce, int32_t *ids, float *weights, const float *router, int32_t T, int32_t E,
                     int32_t k, int32_t norm_topk);
int cpu_op_moe_experts(cpu_exec *ce, float *out, const float *x, const int32_t *ids, const float *weights,
                       void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I, int32_t E,
                       int32_t k);
int cpu_op_moe_shared_add(cpu_exec *ce, float *out, const float *shared, const float *gate, int32_t T, int32_t N);

/* LoRA deltas (cpu_lora.c; executor.h lora_add). */
int cpu_op_lora_add(cpu_exec *ce, float *y, int32_t ldy, const float *x, int32_t K, int32_t N,
                    const float *const *A, const float *const *B, const float *scale, const int32_t *rank,
                    int32_t n_slots, const step_batch *b);

/* Checks the step batch's own consistency (T, S, query_start, seq_lens vs
 * positions, logits_rows); "where" names the op. */
int cpu_check_batch(cpu_exec *ce, const char *where, const step_batch *b);

#endif /* PG_CPU_OPS_H */
