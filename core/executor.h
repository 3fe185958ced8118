/* executor: the seam between the engine and a device (dav1d's DSP context,
 * calm's forward pointer). core/model.c writes the LLaMA forward once
 * against this table; cpu/ implements it with OpenBLAS and plain C, gpu/ with
 * CUDA kernels and cuBLAS. The CPU table is the reference: every op of every
 * other executor is tested against it (tests/ops).
 *
 * Memory. Every pointer an op takes is a *device* pointer from ex->op->alloc
 * (plain host memory on the CPU), except arguments documented as host. Three
 * element types are the executor's choice and are announced in the struct:
 *   act   — activations            (cpu: f32; cuda: bf16, f32 with precision 1)
 *   wt    — weight matrices and the embedding table (cuda: the same as
 *           act; cpu: f32, bf16, or int8 in blocks of 32 with an f32
 *           scale each, 36 bytes: wt_block_elems / wt_block_bytes)
 *   kv    — the KV cache           (cpu: f32, bf16 or f16; cuda: bf16 or f16, f32 with precision 1)
 * Norm weights and RoPE inverse frequencies are always f32 (kind EXEC_F32).
 * Reductions (dot products, norms, softmax) accumulate in f32 everywhere.
 *
 * Layouts (row-major, C order):
 *   activations x          [T][H]                  T = step tokens
 *   qkv                    [T][(nh + 2*nkv) * hd]  q heads, then k heads, then v heads
 *   attention out          [T][nh * hd]
 *   gate_up                [T][2 * I]              gate columns 0..I-1, up columns I..2I-1
 *   weight w of a matmul   [N][K]                  (PyTorch nn.Linear: y = x @ w.T)
 *   embedding table        [V][H]
 *   KV cache, per layer and for K and for V one plane:
 *                          [num_blocks][block_size][nkv][hd]
 *   the whole cache is     [n_layers][2][num_blocks][block_size][nkv][hd]
 *   (plane p = 2*layer + (0 for K, 1 for V)); one block id addresses the
 *   same slot range in every plane.
 *
 * Determinism. For a given token row, the result of every op must not depend
 * on the other rows of the batch, on T, or on the thread count: a sequence's
 * logits are bit-identical alone or in a batch of 64 (DESIGN.md "Outputs are
 * a pure function of the inputs"). Attention may depend on the row's own
 * sequence's query length: the CPU gives the same bits for a prompt
 * prefilled at once or token by token, CUDA's decode and prefill kernels
 * sum in different orders (cuda_executor.h).
 *
 * Errors. Ops return 0 or a negative pg_status and leave a message that
 * op->last_error() returns. Ops may run asynchronously (CUDA); results are
 * only guaranteed visible after an op that returns data to the host
 * (logits, sync).
 */
#ifndef PG_EXECUTOR_H
#define PG_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "pg_error.h"
#include "pg_logsoftmax.h"
#include "pg_sample.h"
#include "step_batch.h"

typedef struct executor executor;
typedef struct step_profile step_profile; /* core/step_profile.h */

typedef enum exec_buf_kind {
    EXEC_ACT = 0,  /* activations: ex->act_bytes per element */
    EXEC_WT,       /* weight matrix / embedding: ex->wt_bytes per element */
    EXEC_KV,       /* KV cache: ex->kv_bytes per element */
    EXEC_F32,      /* f32 vectors (norm weights, rope inv_freq) */
    EXEC_I32,      /* int32 scratch */
} exec_buf_kind;

/* One step's forward written against this table (core/model.c): begin_step,
 * the ops, logits into logits_host. Returns 0 or a negative pg_status (the
 * callback keeps its own message). */
typedef int (*exec_forward_fn)(void *ctx, const step_batch *b, float *logits_host);

typedef struct executor_ops {
    /* ---- lifetime and memory -------------------------------------------- */
    void (*destroy)(executor *ex);                 /* accepts NULL */
    const char *(*last_error)(executor *ex);
    /* Device memory in bytes: free now, and total. The CPU reports
     * MemAvailable and MemTotal. */
    int (*mem_info)(executor *ex, size_t *free_bytes, size_t *total_bytes);
    /* n_elems elements of `kind`; NULL on failure (last_error says why).
     * Memory is 64-byte aligned; contents undefined. */
    void *(*alloc)(executor *ex, exec_buf_kind kind, size_t n_elems);
    void (*free)(executor *ex, void *p);           /* accepts NULL */
    /* Host -> device copy of n_elems elements starting at element offset
     * dst_elem_off of dst (a buffer of `kind`), converting from src_dtype
     * (F32, F16, BF16; host memory, may be unaligned) to kind's type. */
    int (*upload)(executor *ex, void *dst, exec_buf_kind kind, size_t dst_elem_off,
                  const void *src, st_dtype src_dtype, size_t n_elems);
    /* Device -> host copy of n_elems elements of `kind`, converted to f32. */
    int (*download_f32)(executor *ex, float *dst_host, const void *src, exec_buf_kind kind,
                        size_t n_elems);
    /* Waits for all queued work. */
    int (*sync)(executor *ex);

    /* ---- per step --------------------------------------------------------- */
    /* Makes the step's metadata available to the ops (the GPU copies it to the
     * device). Every op below that takes `b` must get the batch most recently
     * passed here. The host arrays may be reused by the caller afterwards. */
    int (*begin_step)(executor *ex, const step_batch *b);

    /* ---- ops (all T = b->num_tokens rows unless said otherwise) ---------- */
    /* x[t] = table[b->token_ids[t]]                 x [T][H] act, table [V][H] wt */
    int (*embed)(executor *ex, void *x, const void *table, int32_t H, int32_t V,
                 const step_batch *b);
    /* RMSNorm, HF LlamaRMSNorm: out = x / sqrt(mean(x^2) + eps) * w.
     * With residual != NULL first residual += x, then out = rmsnorm(residual) * w
     * (the residual stream is updated in place). Without, out = rmsnorm(x) * w.
     * out, x, residual [rows][dim] act; w [dim] f32. */
    int (*rmsnorm)(executor *ex, void *out, void *residual, const void *x, const float *w,
                   int32_t rows, int32_t dim, float eps);
    /* y = x @ w^T          y [M][N] act, x [M][K] act, w [N][K] wt.
     * Row m of y must not depend on M or on the other rows. Rows of x and
     * y past M that lie inside their alloc() buffers may be read (x) and
     * overwritten (y): the CUDA executor computes its fixed 128-row chunks
     * in place when the buffers hold them (gpu/cuda_gemm.h
     * cuda_gemm_xwt_rows); callers keep nothing there. */
    int (*matmul)(executor *ex, void *y, const void *x, const void *w,
                  int32_t M, int32_t N, int32_t K);
    /* RoPE in place on the q and k heads of qkv (rotate_half convention:
     * pairs (i, i + hd/2)); angle = b->positions[t] * inv_freq[i],
     * inv_freq [hd/2] f32 (scaling already folded in by the caller). */
    int (*rope)(executor *ex, void *qkv, const float *inv_freq,
                int32_t nh, int32_t nkv, int32_t hd, const step_batch *b);
    /* y[r][n] += bias[n] for r < rows, n < N (nn.Linear's bias, added after
     * the matmul: Qwen2's q|k|v projection biases). y [rows][N] act, bias
     * [N] f32. Only called for families with biases (llama_family). */
    int (*add_bias)(executor *ex, void *y, const float *bias, int32_t rows, int32_t N);
    /* Per-head RMSNorm in place on the q and k heads of qkv (Qwen3's q_norm
     * and k_norm, before rope; HF Qwen3RMSNorm = LlamaRMSNorm over hd):
     * for every token t < T, each q head h < nh of qkv[t]
     *   v = v / sqrt(mean(v^2) + eps) * q_w     (over the hd elements)
     * and each k head likewise with k_w; the v heads are untouched.
     * qkv [T][(nh + 2*nkv) * hd] act; q_w, k_w [hd] f32. Only called for
     * families with q/k norms (llama_family). */
    int (*qk_norm)(executor *ex, void *qkv, const float *q_w, const float *k_w, int32_t T,
                   int32_t nh, int32_t nkv, int32_t hd, float eps);
    /* Writes each token's k and v heads (from qkv) into slot b->slots[t] of
     * the planes k_cache and v_cache ([num_blocks][block_size][nkv][hd] kv). */
    int (*kv_write)(executor *ex, void *k_cache, void *v_cache, const void *qkv,
                    int32_t nh, int32_t nkv, int32_t hd, const step_batch *b);
    /* Causal GQA attention of every query token over its own sequence's
     * paged context: token t of sequence s at position p attends to
     * positions 0..p (lo..p with lo = max(0, p - W + 1) when
     * W = b->sliding_window > 0; the window changes only which positions
     * are summed, never the order; b may differ from begin_step's batch in
     * sliding_window alone: a model with a window on some layers only
     * passes each layer's), found through row s of b->block_tables; query head h
     * reads kv head h / (nh / nkv). out[t][h*hd..] = softmax(q.k * scale) @ v.
     * out [T][nh*hd] act; qkv as above; caches as in kv_write. */
    int (*attention)(executor *ex, void *out, const void *qkv,
                     const void *k_cache, const void *v_cache,
                     int32_t nh, int32_t nkv, int32_t hd, float scale,
                     const step_batch *b);
    /* out[t][i] = silu(gate_up[t][i]) * gate_up[t][I + i]
     * out [T][I] act, gate_up [T][2I] act; silu(x) = x / (1 + exp(-x)). */
    int (*silu_mul)(executor *ex, void *out, const void *gate_up, int32_t T, int32_t I);
    /* dst[r] = src[b->logits_rows[r]] for r < b->num_logits; [.][dim] act. */
    int (*gather_rows)(executor *ex, void *dst, const void *src, int32_t dim,
                       const step_batch *b);
    /* logits_host[r][v] = x[r] . w[v] in f32 for r < L, then copied to the
     * host (synchronizes). x [L][H] act, w [V][H] wt, logits_host [L][V]. */
    int (*logits)(executor *ex, float *logits_host, const void *x, const void *w,
                  int32_t L, int32_t V, int32_t H);
    /* Copies whole blocks in every plane: for each pair k, block
     * src_dst_host[2k] -> block src_dst_host[2k+1] (host array). kv is the
     * whole cache; plane_elems = num_blocks * block_size * nkv * hd elements,
     * block_elems = block_size * nkv * hd. Used for copy-on-write. */
    int (*copy_blocks)(executor *ex, void *kv, int32_t n_planes, size_t plane_elems,
                       size_t block_elems, const int32_t *src_dst_host, int32_t n_pairs);

    /* ---- whole steps (optional: NULL when the executor has none, the CPU) */
    /* Runs one step's forward: forward(ctx, b, logits_host) as is, or — for a
     * step the executor can record once and replay (CUDA graphs of pure
     * decode steps, cuda_executor.h) — a replay of forward recorded over b
     * padded to a fixed shape, with the same results: logits_host [L][V] and
     * the KV writes bit-identical to the direct call. So forward may be
     * called over a batch other than b (padded, or dummy for a warm-up) and
     * must launch the same work for the same shapes: no decision on the
     * batch's values on the host. Returns forward's status, or the
     * executor's own (last_error). */
    int (*run_step)(executor *ex, const step_batch *b, float *logits_host,
                    exec_forward_fn forward, void *ctx);
    /* Greedy rows of the next step, taken on the device (optional: NULL on
     * the CPU, where the engine's sampler reads every row). For the next
     * run_step only (consumed by it, even one that fails): every row r < L
     * of its logits_host with greedy[r] != 0 is NOT written; ids_host[r]
     * gets argmax_v of that row instead (ties -> the lowest id, NaN never
     * wins: core/sampler.c's greedy rule, bit for bit), so its V floats
     * never leave the device. Rows with greedy[r] == 0 are written as
     * always. The step fails with PG_EINVAL when its number of logits rows
     * is not L or a greedy row has no logit > -inf. greedy [L] and ids_host
     * [L] are host memory borrowed until that step returns; L = 0 clears a
     * pending mask. Only for steps that give all their rows in one call
     * (model_forward, not the slices of model_forward_rows). */
    int (*greedy_rows)(executor *ex, const uint8_t *greedy, int32_t L, int32_t *ids_host);
    /* Logprob rows of the next logits (optional: NULL on the CPU, where the
     * engine computes them from the row): for the next run_step, or inside
     * a forward the next logits op (consumed by it, even one that fails),
     * every row r < L of its logits_host with rows[r].want is NOT written;
     * rows[r] gets its log-softmax results instead (pg_lsm_row: lse, the
     * logprob and rank of rows[r].token — the argmax for -1, core/sampler.c's
     * greedy rule —, the top rows[r].k), by common/pg_logsoftmax.h's
     * definition: the bits core/sampler.c and core/engine.c compute on the
     * host. A row is not also marked greedy. A row also handed to
     * sample_rows (below) has token PG_LSM_SAMPLED, and only such a row:
     * its results are of the token sample_rows draws from it (rows[r].token
     * out = that id), over the row as the sampler received it (after its
     * grammar mask, before penalties and temperature: the row
     * core/sampler.c takes the logprobs of), without the row or the id
     * going through the host in between. The logits fails with
     * PG_EINVAL when its number of rows is not L or a request is out of
     * range (token >= V or < PG_LSM_SAMPLED, PG_LSM_SAMPLED on a row not
     * sampled or the other way round, k > PG_LSM_MAX_TOP). rows [L] is
     * host memory borrowed until that logits returns; L = 0 clears it. */
    int (*logprob_rows)(executor *ex, pg_lsm_row *rows, int32_t L);

    /* ---- fused ops (optional: NULL where the executor has none, the CPU;
     * the model then calls the ops they stand for one by one) ------------ */
    /* What lies between the qkv projection and attention, in one call, with
     * the results of these ops in this order, bit for bit:
     *   add_bias(qkv, b_qkv, T, (nh + 2 nkv) hd)    when b_qkv != NULL
     *   qk_norm(qkv, q_w, k_w, T, nh, nkv, hd, eps)  when q_w != NULL (k_w too)
     *   rope(qkv, inv_freq, nh, nkv, hd, b)
     *   kv_write(k_cache, v_cache, qkv, nh, nkv, hd, b)
     * (CUDA: one kernel, a token's row read once: gpu/rope_kv.cu). */
    int (*rope_kv)(executor *ex, void *qkv, void *k_cache, void *v_cache, const float *b_qkv,
                   const float *q_w, const float *k_w, float eps, const float *inv_freq,
                   int32_t nh, int32_t nkv, int32_t hd, const step_batch *b);

    /* ---- step profile (optional: NULL on the CPU, --profile-steps) ------ */
    /* Borrows p (NULL stops) until the next call: every later step adds
     * its host phases to p->cur (SP_H2D: checking, packing and queueing
     * the step's metadata; SP_WAIT: waiting for the device; SP_D2H: copies
     * out of pinned memory into the caller's buffers), and a step whose
     * forward runs op by op outside a graph capture times each op on the
     * device between the op_mark calls into p->op_dev_ms[p->kind] (and
     * p->op_steps), a graph replay counts in p->graph_steps, and a forward
     * run op by op (eager, a graph's warm-up or capture) leaves its kernel
     * launches in p->launches[p->kind]. Timing adds synchronization: only
     * for profiling. */
    void (*set_step_profile)(executor *ex, step_profile *p);
    /* Called by the forward (core/model.c) with op = -1 right before its
     * first op, and with op = OPP_* (op_profile.h) right after each op's
     * calls: the device time between two marks is the op's. Ignored
     * without a step profile. */
    void (*op_mark)(executor *ex, int op);

    /* Sampled rows of the next logits (optional: NULL on the CPU, where the
     * engine's sampler reads every row): for the next run_step, or the next
     * logits op outside one (consumed by it, even one that fails), every
     * row req->rows[q].row of its logits_host is NOT written; req->ids[q]
     * gets the token sampled from it instead, by common/pg_sample.h's
     * definition (steps 0-9: the grammar mask, penalties, banned ids,
     * temperature, min-p, top-k, top-p, the draw): the token core/sampler.c
     * gives for the same row, bit for bit, so its V floats never leave the
     * device. A row is not also marked greedy; it may be marked logprob
     * with token PG_LSM_SAMPLED (logprob_rows, above). The logits fail
     * with PG_EINVAL when req->L is not their number of rows or a row is
     * out of range. req and what it points to are host memory borrowed
     * until that logits returns; NULL clears a pending request. */
    int (*sample_rows)(executor *ex, const pg_smp_batch *req);

    /* An asynchronous step (optional, both or neither: NULL on the CPU,
     * whose forward has its results when it returns). defer_step arms the
     * next run_step (consumed by it, even one that fails) to return once
     * its work and its device -> host copies are queued: logits_host, the
     * greedy ids, logprob rows and sampled ids it would write are written
     * by wait_step, which waits for the device; those buffers and the
     * masks' host arrays stay borrowed until then, and no other op may come
     * between the two (the engine's overlapped loop, core/engine_overlap.c,
     * runs only host work there). wait_step returns 0 when nothing is
     * pending, else the step's copy-out status (a greedy row with no
     * token, a device error). */
    int (*defer_step)(executor *ex);
    int (*wait_step)(executor *ex);

    /* ---- mixture of experts (optional: NULL where the executor has none,
     * the model then refuses an MoE checkpoint; Mixtral, Qwen2-MoE,
     * Qwen3-MoE: config.h llama_family) ------------------------------- */
    /* Routing of every row t < T, as transformers' SparseMoeBlocks
     * (modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py):
     *   p[e] = exp(router[t][e] - max) / sum     f32, over all E experts,
     *          the sum in increasing e
     *   ids[t][r], r < k: the k largest p in decreasing order, ties to the
     *          lower expert id (torch.topk leaves ties unspecified)
     *   weights[t][r] = p[ids[t][r]], divided by their sum (in rank order)
     *          when norm_topk != 0
     * router [T][E] act (h @ gate^T, from matmul); ids [T][k] i32; weights
     * [T][k] f32. A row's result depends on its own logits only. */
    int (*moe_route)(executor *ex, int32_t *ids, float *weights, const void *router, int32_t T,
                     int32_t E, int32_t k, int32_t norm_topk);
    /* The routed experts of every row t < T, summed in rank order:
     *   out[t] = sum_{r < k} weights[t][r] * y_r     (r = 0 first; a * b then +)
     *   y_r = (silu(x[t] @ G^T) * (x[t] @ U^T)) @ D^T of expert e = ids[t][r],
     *         G, U rows 0..I-1 and I..2I-1 of w_gate_up[e], D = w_down[e]
     * Each y_r must be the bits of the dense MLP ops (matmul, silu_mul,
     * matmul) over that row alone: a row's result does not depend on which
     * or how many other rows share its experts (rows are grouped by expert,
     * then by row index, and each group goes through the row-invariant
     * products). out, x [T][H] act; ids, weights as moe_route's;
     * w_gate_up, w_down: host arrays of E device pointers to [2I][H] wt and
     * [H][I] wt; an expert no row picks is not read. */
    int (*moe_experts)(executor *ex, void *out, const void *x, const int32_t *ids, const float *weights,
                       void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I,
                       int32_t E, int32_t k);
    /* Qwen2-MoE's shared expert: out[t][n] = out[t][n] + sigmoid(gate[t]) *
     * shared[t][n] (Qwen2MoeSparseMoeBlock: F.sigmoid(shared_expert_gate(h))
     * * shared_expert(h), then added). out, shared [T][N] act; gate [T][1]
     * act (h @ shared_expert_gate^T). */
    int (*moe_shared_add)(executor *ex, void *out, const void *shared, const void *gate, int32_t T,
                          int32_t N);

    /* ---- LoRA adapters (optional: NULL where the executor has none; the
     * engine then refuses --lora on that device) ----------------------- */
    /* Adds one projection's LoRA deltas to its output, PEFT's
     * lora.Linear.forward (result + lora_B(lora_A(x)) * scaling) per row:
     * for every row t < T with a = b->lora_slots[t] >= 0 and A[a] != NULL,
     *   u[j]     = x[t] . A[a][j]                 j < rank[a], f32, then
     *              rounded to act (PEFT: lora_A's output in the adapter dtype)
     *   y[t][n] += scale[a] * (u . B[a][n])       n < N, the dot in f32 over
     *              j increasing, then scale, then the add, rounded to act
     * Rows with no adapter (or b->lora_slots == NULL) are left as they are.
     * A row's result depends on its own x, its adapter, K, N and rank only:
     * not on T, the other rows, their adapters or the thread count (rows
     * are grouped by adapter, then by row index, and each group goes through
     * row-invariant products). y [T][ldy] act, the delta going to columns
     * 0..N-1 (the caller offsets y to a projection's columns inside a fused
     * output: q, k, v of qkv, gate, up of gate_up); x [T][K] act;
     * A, B, scale, rank: host arrays of n_slots entries, A[a] [rank[a]][K]
     * act and B[a] [N][rank[a]] act device pointers (NULL: slot a does not
     * target this projection), rank[a] <= PG_LORA_MAX_RANK. */
    int (*lora_add)(executor *ex, void *y, int32_t ldy, const void *x, int32_t K, int32_t N,
                    const void *const *A, const void *const *B, const float *scale,
                    const int32_t *rank, int32_t n_slots, const step_batch *b);
} executor_ops;

/* The largest LoRA rank an executor's lora_add takes (vLLM's
 * max_lora_rank choices stop at 512). */
#define PG_LORA_MAX_RANK 512

/* Backends embed this as the first member of their own struct. */
struct executor {
    const executor_ops *op;
    const char *name;         /* "cpu", "cuda" */
    size_t act_bytes;         /* bytes per element of EXEC_ACT */
    size_t wt_bytes;          /* ... EXEC_WT */
    size_t kv_bytes;          /* ... EXEC_KV */
    /* Weights stored in blocks: wt_block_elems elements take wt_block_bytes
     * (the CPU's int8: 32 and 36); 0 = plain elements of wt_bytes. Sizes of
     * weight buffers go through exec_wt_bytes. */
    size_t wt_block_elems, wt_block_bytes;
};

/* Bytes n weight elements take on ex. */
static inline size_t exec_wt_bytes(const executor *ex, size_t n)
{
    if (ex->wt_block_elems)
        return (n + ex->wt_block_elems - 1) / ex->wt_block_elems * ex->wt_block_bytes;
    return n * ex->wt_bytes;
}

/* Bytes per element of a buffer kind on ex. */
static inline size_t exec_kind_bytes(const executor *ex, exec_buf_kind kind)
{
    switch (kind) {
    case EXEC_ACT: return ex->act_bytes;
    case EXEC_WT: return ex->wt_bytes;
    case EXEC_KV: return ex->kv_bytes;
    case EXEC_F32: return 4;
    case EXEC_I32: return 4;
    }
    return 0;
}

#endif /* PG_EXECUTOR_H */
