/* cuda_exec_internal: the CUDA executor's state and the functions its files
 * share. Internal to gpu/ (plain C, included by the executor's C files only;
 * cuda_executor.h is the public contract). The executor is split by concept,
 * in the order a step runs through it:
 *
 *   cuda_executor.c   the table, creation and destruction
 *   cuda_memory.c     pinned staging, device buffers grown on demand, the
 *                     table's memory entries (alloc, upload, download, sync)
 *   cuda_step_meta.c  begin_step: the step's checks and its metadata on the
 *                     device
 *   cuda_ops.c        the ops of a layer, each forwarded to its launcher
 *                     (cuda_kernels.h) or to cuda_gemm.c
 *   cuda_lora.c       lora_add: the adapter slots of a projection, launched
 *                     in tables of PGK_LORA_SLOTS (lora.cu)
 *   cuda_moe.c        the mixture-of-experts ops (routing, grouped
 *                     experts, shared expert)
 *   cuda_logits.c     lm_head, device argmax and log-softmax rows, the copy
 *                     of the logits to the host
 *   cuda_graphs.c     CUDA graphs of decode steps (run_step)
 *
 * Names: cx_ for what crosses files; `static` for the rest.
 */
#ifndef PG_CUDA_EXEC_INTERNAL_H
#define PG_CUDA_EXEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_executor.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"
#include "cuda_sample_rows.h"
#include "cuda_step_profile.h"

/* Pinned host staging buffer with an event that says when the device has
 * finished reading it (host -> device copies are asynchronous). */
typedef struct pinned_buf {
    void *h;
    size_t cap;
    cudaEvent_t ev;
    int pending;          /* ev recorded after the last copy from h */
} pinned_buf;

/* One buffer of the table's alloc() (cx_rows_after). */
typedef struct cx_alloc_rec {
    uintptr_t p;
    size_t bytes;
} cx_alloc_rec;

typedef struct cuda_exec {
    executor base;        /* first member: executor* <-> cuda_exec* */
    int device;
    int act_dt, wt_dt, kv_dt; /* pgk_dtype codes */
    cudaStream_t stream;
    cuda_gemm *gemm;
    pg_error err;
    pgk_launch lk;        /* stream, sync_each (PAGEDGEN_CUDA_SYNC=1), &err; kernels launched */

    /* step metadata (begin_step): one device block of int32 */
    pinned_buf meta_h;
    int32_t *meta_d;
    size_t meta_cap;      /* int32 entries of meta_d */
    pgk_batch batch;      /* device pointers into meta_d */
    int have_batch;
    int32_t n_decode_seqs; /* sequences with q_len == 1 */

    /* decode attention split workspace, f32 */
    float *ws_d;
    size_t ws_floats;
    /* lm_head output, f32 [L][V], and its pinned host copy */
    float *logits_d;
    size_t logits_cap;
    pinned_buf logits_h;
    /* copy_blocks pairs */
    pinned_buf pairs_h;
    int32_t *pairs_d;
    size_t pairs_cap;
    /* upload / download staging: two buffers, alternated */
    pinned_buf stage[2];
    /* CUDA graphs of decode steps (run_step) */
    struct cuda_graphs *graphs;
    /* device greedy rows of the next step (cuda_executor_greedy_next_step);
     * greedy_L = 0: none pending. Borrowed from the caller. */
    const uint8_t *greedy;        /* [greedy_L] */
    int32_t *greedy_ids;          /* [greedy_L] host, written by that step */
    int32_t greedy_L;
    int32_t *ids_d;               /* argmax ids of the eager logits [L], device */
    size_t ids_cap;               /* bytes */
    pinned_buf ids_h;             /* their host copy */
    /* logprob rows of the next logits (cuda_executor_logprob_rows): results taken
     * on the device (pgk_logprobs), the rows not copied. lp_L = 0: none
     * pending. Borrowed from the caller. */
    pg_lsm_row *lp_rows;          /* [lp_L] */
    /* sampled rows of the next logits (cuda_executor_sample_rows,
     * cuda_sample_rows.h) */
    cuda_smp smp;
    int32_t lp_L;
    int32_t lp_n;                 /* requests launched for the logits being copied out */
    pgk_lp_req *lp_req_d;         /* [lp_n] device */
    size_t lp_req_cap;            /* bytes */
    pg_lsm_row *lp_out_d;         /* [lp_n] device */
    size_t lp_out_cap;            /* bytes */
    pinned_buf lp_req_h, lp_out_h;
    /* lora_add's u [T][rank] act of an eager step (a graph's: cuda_graphs) */
    void *lora_u_d;
    size_t lora_u_cap;            /* bytes */
    /* what this step's lora_add calls were given (the slots' A, B, scale,
     * rank, shapes; not the rows), hashed in call order since begin_step:
     * a graph replays the values of its capture (cuda_graphs.c cx_run_step) */
    uint64_t lora_sig;
    int32_t lora_calls;
    size_t logits_copy_bytes;     /* logits the last step copied to the host */
    size_t logits_copy_total;     /* ... every step so far */
    /* alloc()'s buffers, ascending by address: how many rows an operand
     * holds past its pointer (the GEMM computes a last partial chunk in
     * place when both operands hold its padded rows) */
    cx_alloc_rec *allocs;         /* [n_allocs] */
    size_t n_allocs, allocs_cap;
    /* what run_step launched (cuda_executor_launch_counts) */
    cuda_launch_counts last_step;
    struct cuda_sprof *sprof;     /* --profile-steps (cuda_step_profile.h), or NULL */
    /* mixture of experts (cuda_moe.c): the host plan's staging and the
     * grouped rows' work buffers, grown on demand */
    struct cx_moe {
        int used;                 /* an MoE op ran: steps run eagerly (cuda_graphs.c) */
        pinned_buf ids_h;         /* routed ids, device -> host */
        pinned_buf plan_h;        /* perm [S] | pos [T k], host -> device */
        int32_t *plan_d;
        size_t plan_cap;          /* bytes */
        void *work_d;             /* xs | gu | act | ys (cuda_moe.c) */
        size_t work_cap;          /* bytes */
        int32_t *off;             /* [off_cap] host: group starts / ends */
        size_t off_cap;
    } moe;
    /* an asynchronous step (cuda_executor_defer_step / _wait_step): defer_next
     * armed for the next run_step, defer_now for the copy-out running now
     * (never a graph's warm-up or capture), pend the copy-out queued and not
     * waited for: cx_logits_out's state until cx_logits_finish */
    int defer_next, defer_now;
    struct cx_pending {
        int active;
        float *logits_host;
        const float *h;               /* pinned rows */
        const uint8_t *gm;            /* greedy mask, or NULL */
        int32_t *ids_host;
        const int32_t *ids_pinned;
        pg_lsm_row *lp;               /* logprob rows, or NULL */
        int32_t lp_n, L, V;
    } pend;
} cuda_exec;

#define STAGE_BYTES ((size_t)16 << 20)

static inline cuda_exec *cx(executor *ex) { return (cuda_exec *)ex; }

/* Reports a failed CUDA call (clears the runtime's last error; cuda_memory.c). */
int cx_fail(pg_error *err, int status, const char *what, cudaError_t e);

#define CUDA_TRY(err, what, call)                                       \
    do {                                                                \
        cudaError_t e_ = (call);                                        \
        if (e_ != cudaSuccess)                                          \
            return cx_fail((err), PG_EDEVICE, (what), e_);            \
    } while (0)

/* ---- cuda_memory.c -------------------------------------------------------- */

/* 1 when st is being captured into a CUDA graph (or its capture was
 * invalidated): nothing may be allocated or freed then. */
int cx_stream_capturing(cudaStream_t st);
/* Returns (in *h) a pinned buffer of at least bytes that the device no
 * longer reads. */
int cx_pinned_get(cudaStream_t st, pinned_buf *pb, size_t bytes, void **h, pg_error *err);
/* Records that the device reads pb until the stream passes this point. */
int cx_pinned_mark(pinned_buf *pb, cudaStream_t st, pg_error *err);
void cx_pinned_free(pinned_buf *pb);
/* Grows a device buffer to at least bytes (contents dropped); refuses while
 * st is captured. */
int cx_device_grow(cudaStream_t st, void **p, size_t *cap_bytes, size_t bytes, const char *what,
                   pg_error *err);
int cx_mem_info(executor *ex, size_t *free_bytes, size_t *total_bytes);
void *cx_alloc(executor *ex, exec_buf_kind kind, size_t n_elems);
void cx_free(executor *ex, void *p);
int cx_upload(executor *ex, void *dst, exec_buf_kind kind, size_t dst_elem_off, const void *src,
              st_dtype src_dtype, size_t n_elems);
int cx_download_f32(executor *ex, float *dst_host, const void *src, exec_buf_kind kind,
                    size_t n_elems);
int cx_sync(executor *ex);
/* Whole rows of row_bytes from p to the end of the alloc() buffer holding
 * p; 0 when p is in none (an internal buffer, or foreign memory). */
int64_t cx_rows_after(const cuda_exec *c, const void *p, size_t row_bytes);
/* Device work queued so far: kernels (c->lk), cuBLAS products and copies
 * (cuda_gemm_counts). */
cuda_launch_counts cx_counts(const cuda_exec *c);

/* ---- cuda_step_meta.c ----------------------------------------------------- */

/* begin_step's checks, then (upload = 1) the metadata to the device. */
int cx_begin_step_impl(cuda_exec *c, const step_batch *b, int upload);
int cx_begin_step(executor *ex, const step_batch *b);
/* The device copy of b (checks that b is the batch of the last begin_step). */
int cx_step_batch_dev(cuda_exec *c, const step_batch *b, const char *op, const pgk_batch **out);

/* ---- cuda_ops.c ----------------------------------------------------------- */

int cx_embed(executor *ex, void *x, const void *table, int32_t H, int32_t V, const step_batch *b);
int cx_rmsnorm(executor *ex, void *out, void *residual, const void *x, const float *w,
               int32_t rows, int32_t dim, float eps);
int cx_matmul(executor *ex, void *y, const void *x, const void *w, int32_t M, int32_t N, int32_t K);
int cx_rope(executor *ex, void *qkv, const float *inv_freq, int32_t nh, int32_t nkv, int32_t hd,
            const step_batch *b);
int cx_kv_write(executor *ex, void *k_cache, void *v_cache, const void *qkv, int32_t nh,
                int32_t nkv, int32_t hd, const step_batch *b);
int cx_rope_kv(executor *ex, void *qkv, void *k_cache, void *v_cache, const float *b_qkv,
               const float *q_w, const float *k_w, float eps, const float *inv_freq, int32_t nh,
               int32_t nkv, int32_t hd, const step_batch *b);
int cx_attention(executor *ex, void *out, const void *qkv, const void *k_cache, const void *v_cache,
                 int32_t nh, int32_t nkv, int32_t hd, float scale, const step_batch *b);
int cx_add_bias(executor *ex, void *y, const float *bias, int32_t rows, int32_t N);
int cx_qk_norm(executor *ex, void *qkv, const float *q_w, const float *k_w, int32_t T, int32_t nh,
               int32_t nkv, int32_t hd, float eps);
int cx_silu_mul(executor *ex, void *out, const void *gate_up, int32_t T, int32_t I);
int cx_gather_rows(executor *ex, void *dst, const void *src, int32_t dim, const step_batch *b);
int cx_copy_blocks(executor *ex, void *kv, int32_t n_planes, size_t plane_elems,
                   size_t block_elems, const int32_t *src_dst_host, int32_t n_pairs);

/* ---- cuda_lora.c ---------------------------------------------------------- */

int cx_lora_add(executor *ex, void *y, int32_t ldy, const void *x, int32_t K, int32_t N,
                const void *const *A, const void *const *B, const float *scale,
                const int32_t *rank, int32_t n_slots, const step_batch *b);

/* ---- cuda_moe.c ----------------------------------------------------------- */

int cx_moe_route(executor *ex, int32_t *ids, float *weights, const void *router, int32_t T, int32_t E,
                 int32_t k, int32_t norm_topk);
int cx_moe_experts(executor *ex, void *out, const void *x, const int32_t *ids, const float *weights,
                   void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I, int32_t E,
                   int32_t k);
int cx_moe_shared_add(executor *ex, void *out, const void *shared, const void *gate, int32_t T, int32_t N);

/* ---- cuda_logits.c -------------------------------------------------------- */

/* The copy-out cx_logits_out queued under defer_now: waits for the stream
 * and hands the rows, ids and logprob results over. 0 when none. */
int cx_logits_finish(cuda_exec *c);

/* The pending logprob rows of logits_d [L][V] launched (sets c->lp_n). */
int cx_lp_launch(cuda_exec *c, const float *logits_d, int32_t L, int32_t V);
/* The step's pending sampled rows (cuda_smp_launch) and then its logprob
 * rows (cx_lp_launch, which may score a sampled row's drawn id) over
 * logits_d [L][V], after its lm_head or its graph's replay; the logprob
 * mask dropped on failure. */
int cx_rows_launch(cuda_exec *c, float *logits_d, int32_t L, int32_t V);
/* The logits rows of a step to the host (greedy ids, logprob results, the
 * other rows' floats); waits for the stream; consumes the masks. */
int cx_logits_out(cuda_exec *c, float *logits_host, const float *logits_d, pinned_buf *ph,
                  const int32_t *ids_pinned, int32_t L, int32_t V);
int cx_logits(executor *ex, float *logits_host, const void *x, const void *w, int32_t L, int32_t V,
              int32_t H);

/* ---- CUDA graphs: state (the step logic: cuda_graphs.c) --------------------- */

/* One (batch size, context tier) bucket: the graph of a decode step of
 * exactly `size` sequences whose contexts are at most `context` tokens,
 * captured on first use. */
typedef struct graph_bucket {
    int32_t size;
    int32_t context;              /* cuda_plan_graph_context bound of its tier */
    int eager;                    /* its capture failed: its steps run eagerly */
    cudaGraphExec_t exec;         /* NULL until captured */
    uint64_t generation;          /* buffers_generation() at the capture */
    int32_t logits_rows, logits_V; /* what its logits node copies to the host */
    cuda_launch_counts launches;  /* the device work its capture recorded */
} graph_bucket;

/* Everything a captured graph reads or writes besides the model's own
 * buffers has a fixed address here, sized for the largest bucket before
 * the first capture (the warm-up): the metadata block (offsets fixed by
 * max_batch and the tier's stride, the same for every batch size), the
 * decode workspace, the logits and their pinned host copy. The eager path
 * keeps its own buffers, so an eager step that grows them cannot move a
 * graph's. */
typedef struct cuda_graphs {
    int32_t max_batch;            /* largest bucket; 0 = graphs off */
    int32_t max_seq_len;          /* context bound of the top tier */
    int32_t n_sizes, n_tiers;     /* buckets = n_sizes x n_tiers, size-major */
    int32_t block_size, stride;   /* fixed at the first graphed step; stride: of the top tier */
    int32_t cur_context, cur_stride; /* the tier bound and table stride being bound */
    int32_t window;               /* sliding window the graphs were captured with */
    int32_t vocab;                /* V seen by embed while bound (0 = not yet) */
    int bound;                    /* begin_step binds the fixed buffers (warm-up, capture) */
    int capturing;
    int warmed;                   /* the warm-up at max_batch ran */
    int32_t n_buckets;
    graph_bucket *buckets;
    int32_t *meta_d;              /* [meta_n] int32, device */
    size_t meta_n;
    pinned_buf meta_h;            /* [meta_n] host staging of the padded batch */
    int32_t *meta_host;           /* host build of the padded batch [meta_n] */
    float *ws_d;                  /* decode workspace */
    size_t ws_floats;
    float *logits_d;              /* [max_batch][V] f32 */
    size_t logits_cap;            /* bytes */
    pinned_buf logits_h;          /* host copy of the rows the step returns (after the replay) */
    int32_t *ids_d;               /* [max_batch] argmax of each logits row (in the graph) */
    size_t ids_cap;               /* bytes */
    pinned_buf ids_h;             /* its host copy, written by the graph's last node */
    int32_t logits_rows, logits_V; /* of the last bound logits() (the captured step's) */
    uint64_t generation;          /* bumped when ws_d or logits_d is reallocated */
    int fault;                    /* CUDA_GRAPH_TEST_* (the tests' faults) */
    long captures, replays, eager_fallbacks;
    size_t meta_upload_bytes;     /* copied by the last graph_upload */
    int lora_seen;                /* a graphed step had lora_slots: every step copies its slots */
    int lora_sig_set;             /* lora_sig: the lora_add values the graphs were captured with */
    uint64_t lora_sig;
    void *lora_u_d;               /* lora_add's u while bound: [max_batch][PG_LORA_MAX_RANK] act */
    size_t lora_u_cap;            /* bytes */
} cuda_graphs;

/* ---- cuda_graphs.c --------------------------------------------------------- */

static inline int cx_graph_bound(const cuda_exec *c)
{
    return c->graphs && c->graphs->bound;
}

void cx_graph_free(cuda_graphs *g);
/* begin_step while bound: the ops read the graphs' fixed buffers. */
int cx_graph_bind_batch(cuda_exec *c, const step_batch *b);
/* logits while bound: lm_head, argmax and its copy, capturable. */
int cx_graph_logits(cuda_exec *c, const void *x, const void *w, int32_t L, int32_t V, int32_t H);
int cx_run_step(executor *ex, const step_batch *b, float *logits_host, exec_forward_fn forward,
                void *ctx);

/* ---- cuda_executor.c ------------------------------------------------------ */

/* ex as a cuda_exec, or NULL when it is not the CUDA executor. */
cuda_exec *cx_as_cuda(executor *ex);

#endif /* PG_CUDA_EXEC_INTERNAL_H */
