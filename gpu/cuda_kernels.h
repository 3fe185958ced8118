/* cuda_kernels: the C-callable launchers of gpu/'s kernels (one .cu file per
 * op family). Internal to gpu/: included by cuda_executor.c (C) and by the
 * .cu files (C++, which wrap it in extern "C").
 *
 * Every launcher
 *   - takes device pointers (d_ prefix for step metadata copied by
 *     begin_step) and host scalars, and a pgk_launch (the stream, the
 *     error, the launch counter);
 *   - checks its preconditions (sizes, head_dim, alignment) before launching,
 *     then the launch itself (cudaGetLastError) and, when sync_each is set
 *     (PAGEDGEN_CUDA_SYNC=1), synchronizes the stream so that a fault is
 *     reported by the op that caused it;
 *   - returns 0, PG_EINVAL / PG_EUNSUPPORTED (precondition, nothing launched)
 *     or PG_EDEVICE, with a message in err naming the kernel and the CUDA
 *     error (cudaGetErrorName: cudaGetErrorString).
 *
 * Element types are pgk_dtype codes: activations and weights are BF16 or
 * F32 (the f32 precision mode, used to check the kernels against the
 * goldens), the KV cache BF16, F16 or F32. Every reduction accumulates in f32.
 */
#ifndef PG_CUDA_KERNELS_H
#define PG_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "pg_error.h" /* plain C: given C linkage inside the .cu files */
#include "pg_logsoftmax.h"
#include "pg_sample.h"

typedef enum pgk_dtype {
    PGK_BF16 = 0,
    PGK_F16 = 1,
    PGK_F32 = 2,
} pgk_dtype;

size_t pgk_dtype_bytes(int dt);
const char *pgk_dtype_name(int dt);

/* Where a launcher launches and reports, and what it launched: every
 * launcher takes one (the executor owns it, cuda_exec_internal.h). */
typedef struct pgk_launch {
    cudaStream_t st;
    int sync_each;        /* PAGEDGEN_CUDA_SYNC=1: synchronize after every launch */
    pg_error *err;
    uint64_t kernels;     /* kernels launched: pgk_check_launch adds one per launch */
} pgk_launch;

/* The one launch check: counts the launch of `kernel` (lk->kernels), then
 * checks cudaGetLastError (and synchronizes when lk->sync_each); 0 or
 * PG_EDEVICE with the message in lk->err. Called once after every kernel
 * launch in gpu/ (a launcher that launches two kernels calls it twice). */
int pgk_check_launch(const char *kernel, pgk_launch *lk);
/* The same check without counting, for work counted elsewhere (cuBLAS
 * products and copies: cuda_gemm.c counts them). */
int pgk_check_stream(const char *what, pgk_launch *lk);

/* Step metadata on the device (copied by begin_step, which checked it:
 * positions[t] = seq_lens[s] - q_len(s) + i for the i-th token of sequence s,
 * slots >= 0, block-table entries >= 0). */
typedef struct pgk_batch {
    int32_t num_tokens, num_seqs, block_size, block_table_stride;
    int32_t max_seq_len, max_query_len, num_logits;
    int32_t num_prefill_seqs;     /* sequences with q_len >= 2 */
    const int32_t *token_ids;     /* [T] */
    const int32_t *positions;     /* [T] */
    const int32_t *slots;         /* [T] */
    const int32_t *query_start;   /* [S+1] */
    const int32_t *seq_lens;      /* [S] */
    const int32_t *block_tables;  /* [S][block_table_stride] */
    const int32_t *logits_rows;   /* [L] */
    const int32_t *prefill_seqs;  /* [num_prefill_seqs]: their indices s, ascending */
    const int32_t *lora_slots;    /* [T] each row's LoRA adapter slot, -1: none; NULL when
                                     the step has none (step_batch.lora_slots) */
} pgk_batch;

/* x[t][i] = table[token_ids[t]][i]; x [T][H] act, table [V][H] act type.
 * A token id outside [0, V) gives a zero row (the executor rejects such ids
 * on the host before launching, as the CPU twin does). */
int pgk_embed(void *x, const void *table, int dt, int32_t H, int32_t V, const pgk_batch *b,
              pgk_launch *lk);

/* HF LlamaRMSNorm with optional fused residual add (executor.h rmsnorm). */
int pgk_rmsnorm(void *out, void *residual, const void *x, const float *w, int dt,
                int32_t rows, int32_t dim, float eps, pgk_launch *lk);

/* y[r][n] += bias[n] (f32 add, one rounding); y [rows][N] act, bias [N] f32
 * (bias.cu). */
int pgk_add_bias(void *y, const float *bias, int dt, int32_t rows, int32_t N, pgk_launch *lk);

/* Per-head RMSNorm in place on the q heads (q_w) and k heads (k_w) of qkv
 * [T][(nh+2nkv)*hd]; q_w, k_w [hd] f32 (qk_norm.cu; executor.h qk_norm). */
int pgk_qk_norm(void *qkv, const float *q_w, const float *k_w, int dt, int32_t T, int32_t nh,
                int32_t nkv, int32_t hd, float eps, pgk_launch *lk);

/* RoPE (rotate_half) in place on the q and k heads of qkv [T][(nh+2nkv)*hd]. */
int pgk_rope(void *qkv, const float *inv_freq, int dt, int32_t nh, int32_t nkv, int32_t hd,
             const pgk_batch *b, pgk_launch *lk);

/* k/v heads of qkv -> slot slots[t] of k_cache, v_cache
 * ([num_blocks][block_size][nkv][hd], kv_dt). A negative slot is skipped
 * (begin_step rejects them today; kept for padded CUDA-graph batches). */
int pgk_kv_write(void *k_cache, void *v_cache, int kv_dt, const void *qkv, int dt,
                 int32_t nh, int32_t nkv, int32_t hd, const pgk_batch *b, pgk_launch *lk);

/* add_bias (bias != NULL), qk_norm (q_w != NULL, k_w too), rope and kv_write
 * in one launch (rope_kv.cu): the same bits as the four launchers above in
 * that order (qkv_steps.cuh holds the steps they share). */
int pgk_rope_kv(void *qkv, void *k_cache, void *v_cache, int kv_dt, const float *bias,
                const float *q_w, const float *k_w, float eps, const float *inv_freq, int dt,
                int32_t nh, int32_t nkv, int32_t hd, const pgk_batch *b, pgk_launch *lk);

/* y [M][N] = x [M][K] . w [N][K]^T for bf16 x and w (K % 8 == 0, 16-byte
 * aligned), y bf16 or f32 (gemv.cu): one warp per output, the weights
 * streamed once per 8 rows; a row's bits do not depend on M or its
 * position (not cuBLAS's bits: cuda_gemm.c uses it per shape). */
int pgk_gemv(void *y, int y_dt, const void *x, const void *w, int32_t M, int32_t N, int32_t K,
             pgk_launch *lk);

/* Decode attention (paged_attention.cu) for the sequences with exactly one
 * query token (the others are left to the prefill kernel). window: 0 = full
 * causal attention, W > 0 = the last W keys (executor.h attention).
 * ws: f32 workspace of at least pgk_decode_workspace_floats(...) floats
 * (used only when some sequence spans more than one partition). */
size_t pgk_decode_workspace_floats(int32_t num_seqs, int32_t nh, int32_t hd, int32_t max_seq_len,
                                   int32_t partition_size);
int pgk_decode_attention(void *out, const void *qkv, int dt, const void *k_cache,
                         const void *v_cache, int kv_dt, int32_t nh, int32_t nkv, int32_t hd,
                         float scale, int32_t window, const pgk_batch *b, float *ws, size_t ws_floats,
                         pgk_launch *lk);

/* Prefill attention (prefill_attention.cu) for the sequences with two or
 * more query tokens: grid z runs over b->prefill_seqs only. */
int pgk_prefill_attention(void *out, const void *qkv, int dt, const void *k_cache,
                          const void *v_cache, int kv_dt, int32_t nh, int32_t nkv, int32_t hd,
                          float scale, int32_t window, const pgk_batch *b, pgk_launch *lk);

/* out[t][i] = silu(gate_up[t][i]) * gate_up[t][I+i]. */
int pgk_silu_mul(void *out, const void *gate_up, int dt, int32_t T, int32_t I, pgk_launch *lk);

/* Mixture of experts (moe_route.cu, moe_experts.cu, moe_shared.cu; the
 * op is gpu/cuda_moe.c). router [T][E] dt; ids [T][k] i32 and weights
 * [T][k] f32 (device): executor.h moe_route, cpu/cpu_moe.c's bits. */
int pgk_moe_route(int32_t *ids, float *weights, const void *router, int dt, int32_t T, int32_t E,
                  int32_t k, int32_t norm_topk, pgk_launch *lk);
/* xs[s] = x[perm[s]] for perm[s] >= 0 (others untouched); [.][H] dt. */
int pgk_moe_gather(void *xs, const void *x, const int32_t *perm, int dt, int32_t S, int32_t H,
                   pgk_launch *lk);
/* out[t] = sum_{r<k} weights[t][r] * ys[pos[t][r]] in rank order, f32,
 * rounded to dt once; out [T][H], ys [.][H] dt. */
int pgk_moe_combine(void *out, const void *ys, const int32_t *pos, const float *weights, int dt,
                    int32_t T, int32_t H, int32_t k, pgk_launch *lk);
/* out[t][n] += sigmoid(gate[t]) * shared[t][n]; [T][N] dt, gate [T] dt. */
int pgk_moe_shared_add(void *out, const void *shared, const void *gate, int dt, int32_t T, int32_t N,
                       pgk_launch *lk);

/* dst[r] = src[logits_rows[r]], [.][dim]. */
int pgk_gather_rows(void *dst, const void *src, int dt, int32_t dim, const pgk_batch *b,
                    pgk_launch *lk);

/* For each pair k and plane p: block d_pairs[2k] -> d_pairs[2k+1]
 * (d_pairs on the device). The pairs run in parallel: no destination may be
 * the source or the destination of another pair (the executor checks). */
int pgk_copy_blocks(void *kv, int kv_dt, int32_t n_planes, size_t plane_elems,
                    size_t block_elems, const int32_t *d_pairs, int32_t n_pairs,
                    pgk_launch *lk);

/* Greedy sampling on the device: ids[r] = argmax_v logits[r][v] (f32,
 * [rows][V]); ties -> lowest id; NaN never wins; a row with no logit
 * > -inf (all -inf or NaN) gives -1 (core/sampler.c's greedy rule). */
int pgk_argmax(int32_t *ids, const float *logits, int32_t rows, int32_t V, pgk_launch *lk);

/* One logits row whose log-softmax results are taken on the device
 * (pgk_logprobs): which row, which token to score (-1: its argmax;
 * PG_LSM_SAMPLED: the token pgk_sample drew from it), how many top entries
 * (pg_lsm_row's in-fields). */
typedef struct pgk_lp_req {
    int32_t row;    /* logits row; for PG_LSM_SAMPLED its row of raw (below) */
    int32_t token;  /* in [0, V), -1: the row's argmax, or PG_LSM_SAMPLED */
    int32_t k;      /* 0 .. PG_LSM_MAX_TOP */
    int32_t sid;    /* PG_LSM_SAMPLED: its index in pgk_sample's ids */
} pgk_lp_req;

/* out[q] (device) = the results of d_req[q] (device, q < n) over logits
 * [.][V] (f32, device): pg_lsm_row's out-fields (want, token's in-value and
 * k as requested), by common/pg_logsoftmax.h's definition, bit for bit the
 * host's pg_lsm_row_eval. A PG_LSM_SAMPLED request reads row req.row of
 * raw [.][V] (pgk_sample's copies of its rows before step 1) and scores
 * sampled[req.sid] (pgk_sample's ids; -1 there: token -1, logprob 0, rank
 * 1); raw and sampled may be NULL when no request is PG_LSM_SAMPLED. One
 * block per request. */
int pgk_logprobs(pg_lsm_row *out, const float *logits, int32_t V, const pgk_lp_req *d_req,
                 int32_t n, const float *raw, const int32_t *sampled, pgk_launch *lk);

/* Sampling on the device: ids[q] (device) = the token of sampled row
 * rows[q] (device, q < n) of logits [.][V] (f32, device), by
 * common/pg_sample.h's definition (steps 0-9), bit for bit core/sampler.c's
 * sampler_sample; -1 when no token can be sampled (every logit -inf, NaN,
 * banned or masked). The rows are rewritten in place (their logits after
 * steps 0-6). Device arrays indexed by pg_smp_row: pen_ids / pen_cnt (the
 * distinct ids of prompt and output, each with its output count), ban_ids,
 * mask (32-bit words, bit v = token v allowed). raw_slot (device, [n], or
 * NULL: none): row q with raw_slot[q] >= 0 is also copied, after step 0
 * (its grammar mask) and before step 1, into raw + raw_slot[q] x V — the
 * row whose log-softmax the sampler's logprobs are (core/sampler.c), for
 * pgk_logprobs's PG_LSM_SAMPLED requests. One block per row. */
int pgk_sample(int32_t *ids, float *logits, int32_t V, const pg_smp_row *rows, int32_t n,
               const int32_t *pen_ids, const int32_t *pen_cnt, const int32_t *ban_ids,
               const uint32_t *mask, float *raw, const int32_t *raw_slot, pgk_launch *lk);

/* The LoRA adapter slots one pgk_lora_add launch serves, passed to its
 * kernels by value (a CUDA graph captures the values with the launch). */
#define PGK_LORA_SLOTS 64
typedef struct pgk_lora_tab {
    const void *A[PGK_LORA_SLOTS];  /* slot slot0 + i: [rank][K] act, device; NULL: the slot
                                       does not adapt this projection */
    const void *B[PGK_LORA_SLOTS];  /* [N][rank] act, device */
    float scale[PGK_LORA_SLOTS];
    int32_t rank[PGK_LORA_SLOTS];   /* 1 .. 512 (PG_LORA_MAX_RANK) where A != NULL */
    int32_t slot0;                  /* the adapter slot of entry 0 */
    int32_t n;                      /* entries used, 1 .. PGK_LORA_SLOTS */
} pgk_lora_tab;

/* executor.h lora_add for the rows whose slot d_slots[t] (device, [T]) is
 * one of tab's (lora.cu): u [T][rmax] act (rmax: the largest rank of tab's
 * slots with an A; device scratch, 16-byte aligned) = x [T][K] act .
 * A[a]^T rounded to act, then y [T][ldy] act += scale[a] * (u . B[a]^T),
 * columns 0 .. N-1. Two launches (shrink, expand); none when no slot of
 * tab has an A. Rows of other slots, or -1, are not touched. */
int pgk_lora_add(void *y, int32_t ldy, const void *x, void *u, int dt, int32_t T, int32_t K,
                 int32_t N, const int32_t *d_slots, const pgk_lora_tab *tab, pgk_launch *lk);

#ifdef __cplusplus
}
#endif

#endif /* PG_CUDA_KERNELS_H */
