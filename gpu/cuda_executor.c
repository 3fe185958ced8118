/* cuda_executor: the executor table over CUDA kernels and cuBLAS (see
 * cuda_executor.h). This file is plain C compiled by the C compiler; it
 * owns the device, the stream, the cuBLAS wrapper, the step metadata on the
 * device and the small workspaces, and forwards each op to its launcher
 * (cuda_kernels.h).
 *
 * Bytes per decode step (why the design is what it is). At batch B a decode
 * step reads every weight once (Llama-3-8B in bf16: 16 GB), the KV context of
 * every sequence (2 * n_layers * nkv * hd * 2 B = 128 KiB per token for
 * Llama-3-8B) and moves a few MB of activations. On an H100 (≈3.35 TB/s
 * HBM3; ~3 TB/s achievable) the weights alone take ≈5 ms: at B = 1 the step
 * is bandwidth-bound and its floor is ~5 ms (≈200 tok/s); each extra
 * sequence adds only its KV reads (1k context: 128 MiB ≈ 0.04 ms), which is
 * why the scheduler's job is to keep the batch full. GEMMs turn
 * compute-bound around B ≈ 300 (989 TFLOP/s bf16 dense / 3.35 TB/s ≈ 295
 * flops per weight byte, 2 flops per weight per sequence).
 */
#include "cuda_executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "cuda_kernels.h"
#include "cuda_plan.h"
#include "cuda_sample_rows.h"
#include "dtype.h"

/* Pinned host staging buffer with an event that says when the device has
 * finished reading it (host -> device copies are asynchronous). */
typedef struct pinned_buf {
    void *h;
    size_t cap;
    cudaEvent_t ev;
    int pending;          /* ev recorded after the last copy from h */
} pinned_buf;

typedef struct cuda_exec {
    executor base;        /* first member: executor* <-> cuda_exec* */
    int device;
    int act_dt, wt_dt, kv_dt; /* pgk_dtype codes */
    int sync_each;        /* PAGEDGEN_CUDA_SYNC=1 */
    cudaStream_t stream;
    cuda_gemm *gemm;
    pg_error err;

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
    size_t logits_copy_bytes;     /* logits the last step copied to the host */
    size_t logits_copy_total;     /* ... every step so far */
} cuda_exec;

#define STAGE_BYTES ((size_t)16 << 20)

static cuda_exec *cx(executor *ex) { return (cuda_exec *)ex; }

/* Reports a failed CUDA call. Also reads (and so clears) the runtime's
 * last error: a failed cudaMalloc or copy leaves it set, and the next
 * launch check (pgk_check_launch, cudaGetLastError) would report it as that
 * unrelated kernel's failure. A sticky error (a device fault) stays. */
static int cuda_fail(pg_error *err, int status, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return pg_error_set(err, status, "cuda: %s: %s: %s", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

#define CUDA_TRY(err, what, call)                                       \
    do {                                                                \
        cudaError_t e_ = (call);                                        \
        if (e_ != cudaSuccess)                                          \
            return cuda_fail((err), PG_EDEVICE, (what), e_);            \
    } while (0)

int cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error state */
        return 0;
    }
    return n < 0 ? 0 : n;
}

cuda_executor_params cuda_executor_params_default(void)
{
    cuda_executor_params p = {0, 0, 0, 0};
    return p;
}

/* 1 when st is being captured into a CUDA graph (or its capture was
 * invalidated): nothing may be allocated or freed then. */
static int stream_capturing(cudaStream_t st)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* ---- pinned staging ---------------------------------------------------- */

static int pinned_wait(pinned_buf *pb, pg_error *err)
{
    if (pb->pending) {
        CUDA_TRY(err, "cudaEventSynchronize (staging)", cudaEventSynchronize(pb->ev));
        pb->pending = 0;
    }
    return 0;
}

/* Returns (in *h) a pinned buffer of at least bytes that the device no
 * longer reads. */
static int pinned_get(cudaStream_t st, pinned_buf *pb, size_t bytes, void **h, pg_error *err)
{
    int rc = pinned_wait(pb, err);
    if (rc)
        return rc;
    if (!pb->ev)
        CUDA_TRY(err, "cudaEventCreateWithFlags",
                 cudaEventCreateWithFlags(&pb->ev, cudaEventDisableTiming));
    if (pb->cap < bytes) {
        if (stream_capturing(st))
            return pg_error_set(err, PG_EINVAL,
                                "cuda: pinned staging of %zu bytes (has %zu) while the stream is "
                                "captured into a CUDA graph: expected it sized by the warm-up",
                                bytes, pb->cap);
        size_t cap = pb->cap ? pb->cap : 4096;
        while (cap < bytes)
            cap *= 2;
        void *n = NULL;
        cudaError_t e = cudaMallocHost(&n, cap); /* cuda_fail clears the last error */
        if (e != cudaSuccess)
            return cuda_fail(err, PG_ENOMEM, "cudaMallocHost (staging)", e);
        if (pb->h)
            cudaFreeHost(pb->h);
        pb->h = n;
        pb->cap = cap;
    }
    *h = pb->h;
    return 0;
}

static int pinned_mark(pinned_buf *pb, cudaStream_t st, pg_error *err)
{
    CUDA_TRY(err, "cudaEventRecord (staging)", cudaEventRecord(pb->ev, st));
    pb->pending = 1;
    return 0;
}

static void pinned_free(pinned_buf *pb)
{
    if (pb->pending)
        cudaEventSynchronize(pb->ev);
    if (pb->h)
        cudaFreeHost(pb->h);
    if (pb->ev)
        cudaEventDestroy(pb->ev);
    memset(pb, 0, sizeof *pb);
}

/* Grows a device buffer to at least bytes (contents dropped). Refuses while
 * st is captured (the graph would hold the freed buffer; the driver
 * invalidates the capture anyway): the graphs' warm-up sizes every buffer a
 * capture touches. On a failed free nothing changes; on a failed
 * allocation *p is NULL and *cap_bytes 0. */
static int device_grow(cudaStream_t st, void **p, size_t *cap_bytes, size_t bytes,
                       const char *what, pg_error *err)
{
    if (*cap_bytes >= bytes && *p)
        return 0;
    if (stream_capturing(st))
        return pg_error_set(err, PG_EINVAL,
                            "cuda: %s of %zu bytes (has %zu) while the stream is captured into a "
                            "CUDA graph: expected it sized by the warm-up before the capture",
                            what, bytes, *cap_bytes);
    size_t cap = *cap_bytes ? *cap_bytes : 4096;
    while (cap < bytes)
        cap *= 2;
    if (*p) {
        cudaError_t e = cudaFree(*p); /* implicitly waits for the work that used it */
        if (e != cudaSuccess)
            return cuda_fail(err, PG_EDEVICE, "cudaFree (before a larger buffer)", e);
    }
    *p = NULL;
    *cap_bytes = 0;
    cudaError_t e = cudaMalloc(p, cap);
    if (e != cudaSuccess) {
        *p = NULL;
        return cuda_fail(err, PG_ENOMEM, what, e);
    }
    *cap_bytes = cap;
    return 0;
}

/* ---- CUDA graphs: state (the step logic is after the ops) ------------------ */

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
} cuda_graphs;

static int graph_bound(const cuda_exec *c)
{
    return c->graphs && c->graphs->bound;
}

static void graph_free(cuda_graphs *g);
static int graph_logits(cuda_exec *c, const void *x, const void *w, int32_t L, int32_t V,
                        int32_t H);

/* ---- lifetime and memory ---------------------------------------------- */

static void cuda_destroy(executor *ex)
{
    if (!ex)
        return;
    cuda_exec *c = cx(ex);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    graph_free(c->graphs);
    cuda_gemm_destroy(c->gemm);
    pinned_free(&c->meta_h);
    pinned_free(&c->pairs_h);
    pinned_free(&c->logits_h);
    pinned_free(&c->ids_h);
    pinned_free(&c->lp_req_h);
    pinned_free(&c->lp_out_h);
    cuda_smp_free(&c->smp);
    pinned_free(&c->stage[0]);
    pinned_free(&c->stage[1]);
    if (c->meta_d)
        cudaFree(c->meta_d);
    if (c->ws_d)
        cudaFree(c->ws_d);
    if (c->logits_d)
        cudaFree(c->logits_d);
    if (c->pairs_d)
        cudaFree(c->pairs_d);
    if (c->ids_d)
        cudaFree(c->ids_d);
    if (c->lp_req_d)
        cudaFree(c->lp_req_d);
    if (c->lp_out_d)
        cudaFree(c->lp_out_d);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

static const char *cuda_last_error(executor *ex)
{
    return cx(ex)->err.msg;
}

static int cuda_mem_info(executor *ex, size_t *free_bytes, size_t *total_bytes)
{
    cuda_exec *c = cx(ex);
    size_t f = 0, t = 0;
    CUDA_TRY(&c->err, "cudaMemGetInfo", cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

static int kind_dt(const cuda_exec *c, exec_buf_kind kind)
{
    switch (kind) {
    case EXEC_ACT: return c->act_dt;
    case EXEC_WT: return c->wt_dt;
    case EXEC_KV: return c->kv_dt;
    case EXEC_F32: return PGK_F32;
    case EXEC_I32: return -1;
    }
    return -2;
}

static const char *kind_name(exec_buf_kind kind)
{
    switch (kind) {
    case EXEC_ACT: return "activations";
    case EXEC_WT: return "weights";
    case EXEC_KV: return "kv cache";
    case EXEC_F32: return "f32";
    case EXEC_I32: return "i32";
    }
    return "?";
}

static void *cuda_alloc(executor *ex, exec_buf_kind kind, size_t n_elems)
{
    cuda_exec *c = cx(ex);
    size_t eb = exec_kind_bytes(ex, kind);
    if (eb == 0) {
        pg_error_set(&c->err, PG_EINVAL, "cuda alloc: unknown buffer kind %d", (int)kind);
        return NULL;
    }
    if (n_elems > ((size_t)-1 - 255) / eb) {
        pg_error_set(&c->err, PG_EINVAL, "cuda alloc: %zu elements of %s overflow", n_elems,
                     kind_name(kind));
        return NULL;
    }
    size_t bytes = n_elems * eb;
    if (bytes == 0)
        bytes = 64;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        pg_error_set(&c->err, PG_ENOMEM,
                     "cuda alloc: %.1f MiB of %s on device %d: %s: %s (free %.1f MiB of %.1f MiB)",
                     (double)bytes / 1048576.0, kind_name(kind), c->device, cudaGetErrorName(e),
                     cudaGetErrorString(e), (double)f / 1048576.0, (double)t / 1048576.0);
        return NULL;
    }
    return p; /* cudaMalloc memory is at least 256-byte aligned */
}

static void cuda_free(executor *ex, void *p)
{
    if (p)
        cudaFree(p);
    (void)ex;
}

/* Converts n elements of src (src_dtype, host, maybe unaligned) to dst_dt
 * into dst (host). */
static void convert_chunk(void *dst, int dst_dt, const unsigned char *src, st_dtype src_dtype,
                          size_t n)
{
    size_t sb = st_dtype_size(src_dtype);
    if (dst_dt == PGK_F32) {
        pg_convert_to_f32((float *)dst, src, src_dtype, n);
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    if ((dst_dt == PGK_BF16 && src_dtype == ST_BF16) || (dst_dt == PGK_F16 && src_dtype == ST_F16)) {
        memcpy(d, src, n * 2u);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f;
        if (src_dtype == ST_F32) {
            memcpy(&f, src + i * sb, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + i * sb, 2);
            f = src_dtype == ST_F16 ? pg_f16_to_f32(h) : pg_bf16_to_f32(h);
        }
        d[i] = dst_dt == PGK_BF16 ? pg_f32_to_bf16(f) : pg_f32_to_f16(f);
    }
}

static int cuda_upload(executor *ex, void *dst, exec_buf_kind kind, size_t dst_elem_off,
                       const void *src, st_dtype src_dtype, size_t n_elems)
{
    cuda_exec *c = cx(ex);
    int dt = kind_dt(c, kind);
    size_t db = exec_kind_bytes(ex, kind);
    if (dt == -2 || db == 0)
        return pg_error_set(&c->err, PG_EINVAL, "cuda upload: unknown buffer kind %d", (int)kind);
    if (dt == -1 ? src_dtype != ST_I32 : !st_dtype_is_float_weight(src_dtype))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda upload to %s: source dtype %s: expected %s", kind_name(kind),
                            st_dtype_name(src_dtype), dt == -1 ? "I32" : "F32, F16 or BF16");
    size_t sb = st_dtype_size(src_dtype);
    size_t per_chunk = STAGE_BYTES / db;
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst + dst_elem_off * db;
    for (size_t done = 0, k = 0; done < n_elems; k++) {
        size_t n = n_elems - done < per_chunk ? n_elems - done : per_chunk;
        pinned_buf *pb = &c->stage[k % 2];
        void *h = NULL;
        int rc = pinned_get(c->stream, pb, STAGE_BYTES, &h, &c->err);
        if (rc)
            return pg_error_wrap(&c->err, rc, "cuda upload");
        if (dt == -1)
            memcpy(h, s + done * sb, n * 4u);
        else
            convert_chunk(h, dt, s + done * sb, src_dtype, n);
        CUDA_TRY(&c->err, "cudaMemcpyAsync (upload)",
                 cudaMemcpyAsync(d + done * db, h, n * db, cudaMemcpyHostToDevice, c->stream));
        rc = pinned_mark(pb, c->stream, &c->err);
        if (rc)
            return rc;
        done += n;
    }
    return 0;
}

static int cuda_download_f32(executor *ex, float *dst_host, const void *src, exec_buf_kind kind,
                             size_t n_elems)
{
    cuda_exec *c = cx(ex);
    int dt = kind_dt(c, kind);
    size_t sbytes = exec_kind_bytes(ex, kind);
    if (dt < 0)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda download_f32: buffer kind %s: expected a float kind",
                            kind_name(kind));
    size_t per_chunk = STAGE_BYTES / sbytes;
    const unsigned char *s = (const unsigned char *)src;
    for (size_t done = 0; done < n_elems;) {
        size_t n = n_elems - done < per_chunk ? n_elems - done : per_chunk;
        void *h = NULL;
        int rc = pinned_get(c->stream, &c->stage[0], STAGE_BYTES, &h, &c->err);
        if (rc)
            return pg_error_wrap(&c->err, rc, "cuda download_f32");
        CUDA_TRY(&c->err, "cudaMemcpyAsync (download)",
                 cudaMemcpyAsync(h, s + done * sbytes, n * sbytes, cudaMemcpyDeviceToHost,
                                 c->stream));
        CUDA_TRY(&c->err, "cudaStreamSynchronize (download)", cudaStreamSynchronize(c->stream));
        if (dt == PGK_F32) {
            memcpy(dst_host + done, h, n * 4u);
        } else {
            const uint16_t *hv = (const uint16_t *)h;
            for (size_t i = 0; i < n; i++)
                dst_host[done + i] = dt == PGK_BF16 ? pg_bf16_to_f32(hv[i]) : pg_f16_to_f32(hv[i]);
        }
        done += n;
    }
    return 0;
}

static int cuda_sync(executor *ex)
{
    cuda_exec *c = cx(ex);
    CUDA_TRY(&c->err, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    return 0;
}

/* ---- per step ------------------------------------------------------------ */

static int graph_bind_batch(cuda_exec *c, const step_batch *b);

/* begin_step's checks, then (upload = 1) the metadata to the device. */
static int begin_step_impl(cuda_exec *c, const step_batch *b, int upload)
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
    if (!upload)
        return 0;

    size_t n_bt = (size_t)S * (size_t)b->block_table_stride;
    size_t n = 3u * (size_t)T + (size_t)(S + 1) + (size_t)S + n_bt + (size_t)L + (size_t)n_prefill;
    void *hv = NULL;
    int rc = pinned_get(c->stream, &c->meta_h, n * 4u, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda begin_step");
    size_t cap_bytes = c->meta_cap * 4u;
    rc = device_grow(c->stream, (void **)&c->meta_d, &cap_bytes, n * 4u, "cudaMalloc (step metadata)", &c->err);
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
    d->prefill_seqs = c->meta_d + o;
    for (int32_t s = 0; s < S; s++)
        if (b->query_start[s + 1] - b->query_start[s] >= 2)
            h[o++] = s;
#undef PUT
    CUDA_TRY(&c->err, "cudaMemcpyAsync (step metadata)",
             cudaMemcpyAsync(c->meta_d, h, n * 4u, cudaMemcpyHostToDevice, c->stream));
    rc = pinned_mark(&c->meta_h, c->stream, &c->err);
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

static int cuda_begin_step(executor *ex, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    if (graph_bound(c)) /* a warm-up or capture of a graphed step */
        return graph_bind_batch(c, b);
    return begin_step_impl(c, b, 1);
}

/* The device copy of b (checks that b is the batch of the last begin_step). */
static int step_batch_dev(cuda_exec *c, const step_batch *b, const char *op, const pgk_batch **out)
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

/* ---- ops ------------------------------------------------------------------ */

static int cuda_embed(executor *ex, void *x, const void *table, int32_t H, int32_t V,
                      const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = step_batch_dev(c, b, "embed", &d);
    if (rc)
        return rc;
    for (int32_t t = 0; t < b->num_tokens; t++)
        if (b->token_ids[t] < 0 || b->token_ids[t] >= V)
            return pg_error_set(&c->err, PG_EINVAL, "cuda embed: token %d: expected id in [0,%d), got %d",
                                (int)t, (int)V, (int)b->token_ids[t]);
    if (c->graphs && c->graphs->bound)
        c->graphs->vocab = V; /* replays check their token ids against it */
    return pgk_embed(x, table, c->act_dt, H, V, d, c->stream, c->sync_each, &c->err);
}

static int cuda_rmsnorm(executor *ex, void *out, void *residual, const void *x, const float *w,
                        int32_t rows, int32_t dim, float eps)
{
    cuda_exec *c = cx(ex);
    return pgk_rmsnorm(out, residual, x, w, c->act_dt, rows, dim, eps, c->stream, c->sync_each,
                       &c->err);
}

static int cuda_matmul(executor *ex, void *y, const void *x, const void *w, int32_t M, int32_t N,
                       int32_t K)
{
    cuda_exec *c = cx(ex);
    int rc = cuda_gemm_xwt(c->gemm, y, c->act_dt, x, w, c->act_dt, M, N, K, &c->err);
    if (rc == 0)
        rc = pgk_check_launch("matmul (cublasGemmEx)", c->stream, c->sync_each, &c->err);
    return rc;
}

static int cuda_rope(executor *ex, void *qkv, const float *inv_freq, int32_t nh, int32_t nkv,
                     int32_t hd, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = step_batch_dev(c, b, "rope", &d);
    if (rc)
        return rc;
    return pgk_rope(qkv, inv_freq, c->act_dt, nh, nkv, hd, d, c->stream, c->sync_each, &c->err);
}

static int cuda_kv_write(executor *ex, void *k_cache, void *v_cache, const void *qkv, int32_t nh,
                         int32_t nkv, int32_t hd, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = step_batch_dev(c, b, "kv_write", &d);
    if (rc)
        return rc;
    return pgk_kv_write(k_cache, v_cache, c->kv_dt, qkv, c->act_dt, nh, nkv, hd, d, c->stream,
                        c->sync_each, &c->err);
}

/* Sequences with one query token go to the decode kernel, the others to the
 * prefill kernel — chosen per sequence, never by the batch (a pure decode
 * step, b->max_query_len == 1, launches only the decode kernel). */
static int cuda_attention(executor *ex, void *out, const void *qkv, const void *k_cache,
                          const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                          const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = step_batch_dev(c, b, "attention", &d);
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
        float **ws = graph_bound(c) ? &c->graphs->ws_d : &c->ws_d;
        size_t *ws_floats = graph_bound(c) ? &c->graphs->ws_floats : &c->ws_floats;
        if (need > *ws_floats) {
            size_t cap = *ws_floats * 4u;
            rc = device_grow(c->stream, (void **)ws, &cap, need * 4u, "cudaMalloc (decode workspace)",
                             &c->err);
            *ws_floats = cap / 4u;
            if (graph_bound(c))
                c->graphs->generation++;
            if (rc)
                return rc;
        }
        rc = pgk_decode_attention(out, qkv, c->act_dt, k_cache, v_cache, c->kv_dt, nh, nkv, hd,
                                  scale, b->sliding_window, d, *ws, *ws_floats, c->stream, c->sync_each, &c->err);
        if (rc)
            return rc;
    }
    if (d->max_query_len > 1)
        rc = pgk_prefill_attention(out, qkv, c->act_dt, k_cache, v_cache, c->kv_dt, nh, nkv, hd,
                                   scale, b->sliding_window, d, c->stream, c->sync_each, &c->err);
    return rc;
}

/* Qwen's ops (executor.h add_bias, qk_norm): gpu/bias.cu, gpu/qk_norm.cu */
static int cuda_add_bias(executor *ex, void *y, const float *bias, int32_t rows, int32_t N)
{
    cuda_exec *c = cx(ex);
    if (rows == 0)
        return 0;
    return pgk_add_bias(y, bias, c->act_dt, rows, N, c->stream, c->sync_each, &c->err);
}

static int cuda_qk_norm(executor *ex, void *qkv, const float *q_w, const float *k_w, int32_t T,
                        int32_t nh, int32_t nkv, int32_t hd, float eps)
{
    cuda_exec *c = cx(ex);
    if (T == 0)
        return 0;
    return pgk_qk_norm(qkv, q_w, k_w, c->act_dt, T, nh, nkv, hd, eps, c->stream, c->sync_each,
                       &c->err);
}

static int cuda_silu_mul(executor *ex, void *out, const void *gate_up, int32_t T, int32_t I)
{
    cuda_exec *c = cx(ex);
    return pgk_silu_mul(out, gate_up, c->act_dt, T, I, c->stream, c->sync_each, &c->err);
}

static int cuda_gather_rows(executor *ex, void *dst, const void *src, int32_t dim,
                            const step_batch *b)
{
    cuda_exec *c = cx(ex);
    const pgk_batch *d = NULL;
    int rc = step_batch_dev(c, b, "gather_rows", &d);
    if (rc)
        return rc;
    return pgk_gather_rows(dst, src, c->act_dt, dim, d, c->stream, c->sync_each, &c->err);
}

/* The pending logprob rows (cuda_executor_logprob_rows) of logits_d [L][V]: their
 * requests uploaded, pgk_logprobs, the results queued for a copy into
 * pinned memory (logits_out waits and hands them over). Not capturable
 * (runs after a replay, or in an eager step). Sets c->lp_n. */
static int lp_launch(cuda_exec *c, const float *logits_d, int32_t L, int32_t V)
{
    c->lp_n = 0;
    if (!c->lp_L)
        return 0;
    if (c->lp_L != L)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logits: the logprob rows have %d rows, the step %d", (int)c->lp_L, (int)L);
    int32_t n = 0;
    for (int32_t r = 0; r < L; r++) {
        const pg_lsm_row *q = &c->lp_rows[r];
        if (!q->want)
            continue;
        if (q->token < -1 || q->token >= V || q->k < 0 || q->k > PG_LSM_MAX_TOP)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logprob rows: row %d: expected token in [-1, %d) and k in [0, %d], "
                                "got %d and %d", (int)r, (int)V, PG_LSM_MAX_TOP, (int)q->token, (int)q->k);
        if (c->greedy_L && c->greedy[r])
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logprob rows: row %d: expected a row marked once, got it greedy too",
                                (int)r);
        n++;
    }
    if (n == 0)
        return 0;
    void *hq = NULL, *ho = NULL;
    size_t cap = c->lp_req_cap;
    int rc = device_grow(c->stream, (void **)&c->lp_req_d, &cap, (size_t)n * sizeof(pgk_lp_req),
                         "cudaMalloc (logprob requests)", &c->err);
    c->lp_req_cap = cap;
    if (rc)
        return rc;
    cap = c->lp_out_cap;
    rc = device_grow(c->stream, (void **)&c->lp_out_d, &cap, (size_t)n * sizeof(pg_lsm_row),
                     "cudaMalloc (logprob results)", &c->err);
    c->lp_out_cap = cap;
    if (rc || (rc = pinned_get(c->stream, &c->lp_req_h, (size_t)n * sizeof(pgk_lp_req), &hq, &c->err)) ||
        (rc = pinned_get(c->stream, &c->lp_out_h, (size_t)n * sizeof(pg_lsm_row), &ho, &c->err)))
        return rc;
    pgk_lp_req *req = hq;
    for (int32_t r = 0, q = 0; r < L; r++)
        if (c->lp_rows[r].want)
            req[q++] = (pgk_lp_req){.row = r, .token = c->lp_rows[r].token, .k = c->lp_rows[r].k};
    CUDA_TRY(&c->err, "cudaMemcpyAsync (logprob requests)",
             cudaMemcpyAsync(c->lp_req_d, hq, (size_t)n * sizeof(pgk_lp_req), cudaMemcpyHostToDevice,
                             c->stream));
    if ((rc = pinned_mark(&c->lp_req_h, c->stream, &c->err)) ||
        (rc = pgk_logprobs(c->lp_out_d, logits_d, V, c->lp_req_d, n, c->stream, c->sync_each, &c->err)))
        return rc;
    CUDA_TRY(&c->err, "cudaMemcpyAsync (logprob results)",
             cudaMemcpyAsync(ho, c->lp_out_d, (size_t)n * sizeof(pg_lsm_row), cudaMemcpyDeviceToHost,
                             c->stream));
    c->lp_n = n;
    return 0;
}

/* The logits rows of a step to the host: rows the pending greedy mask
 * (cuda_executor_greedy_next_step) marks get only their id (ids_pinned,
 * an argmax copy queued on the stream), the others their V floats, through
 * pinned memory (a DMA straight from the device; a pageable copy is staged
 * by the driver in pieces) — one copy per run of consecutive rows. Waits
 * for the stream; consumes the mask. */
static int logits_out(cuda_exec *c, float *logits_host, const float *logits_d, pinned_buf *ph,
                      const int32_t *ids_pinned, int32_t L, int32_t V)
{
    const uint8_t *gm = c->greedy_L ? c->greedy : NULL;
    int32_t *ids_host = c->greedy_ids;
    const int32_t gL = c->greedy_L;
    pg_lsm_row *lp = c->lp_n ? c->lp_rows : NULL; /* lp_launch checked lp_L == L */
    const int32_t lp_n = c->lp_n;
    c->greedy_L = 0;
    c->lp_L = 0;
    c->lp_n = 0;
    c->logits_copy_bytes = 0;
    if (gm && (gL != L || !ids_pinned))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logits: the greedy mask has %d rows, the step %d", (int)gL, (int)L);
    const size_t row_bytes = (size_t)V * 4u;
    void *hv = NULL;
    int rc = pinned_get(c->stream, ph, (size_t)L * row_bytes, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda logits");
    float *h = hv;
    for (int32_t r = 0, r1; r < L; r = r1) {
        for (r1 = r; r1 < L && !(gm && gm[r1]) && !(lp && lp[r1].want) && !cuda_smp_marked(&c->smp, r1);
             r1++)
            ;
        if (r1 == r) {
            r1 = r + 1; /* a greedy, logprob or sampled row: not copied */
            continue;
        }
        CUDA_TRY(&c->err, "cudaMemcpyAsync (logits)",
                 cudaMemcpyAsync(h + (size_t)r * V, logits_d + (size_t)r * V,
                                 (size_t)(r1 - r) * row_bytes, cudaMemcpyDeviceToHost, c->stream));
        c->logits_copy_bytes += (size_t)(r1 - r) * row_bytes;
        c->logits_copy_total += (size_t)(r1 - r) * row_bytes;
    }
    CUDA_TRY(&c->err, "cudaStreamSynchronize (logits)", cudaStreamSynchronize(c->stream));
    const pg_lsm_row *lp_out = lp_n ? c->lp_out_h.h : NULL;
    for (int32_t r = 0, q = 0; r < L; r++) {
        if (lp && lp[r].want) { /* results in the order of the requests (lp_launch) */
            lp[r] = lp_out[q++];
            continue;
        }
        if (cuda_smp_marked(&c->smp, r))
            continue; /* its id comes with cuda_smp_finish */
        if (!(gm && gm[r])) {
            memcpy(logits_host + (size_t)r * V, h + (size_t)r * V, row_bytes);
            continue;
        }
        ids_host[r] = ids_pinned[r];
        if (ids_host[r] < 0)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logits: greedy row %d: no token can be sampled: all %d logits "
                                "are -inf or nan", (int)r, (int)V);
    }
    cuda_smp_finish(&c->smp);
    return 0;
}

static int logits_impl(cuda_exec *c, float *logits_host, const void *x, const void *w, int32_t L,
                       int32_t V, int32_t H)
{
    if (L < 1 || V < 1 || H < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda logits: expected L, V, H >= 1, got %d, %d, %d",
                            (int)L, (int)V, (int)H);
    size_t bytes = (size_t)L * (size_t)V * 4u;
    if (graph_bound(c))
        return graph_logits(c, x, w, L, V, H);
    size_t cap = c->logits_cap;
    int rc = device_grow(c->stream, (void **)&c->logits_d, &cap, bytes, "cudaMalloc (logits)", &c->err);
    c->logits_cap = cap;
    if (rc)
        return rc;
    rc = cuda_gemm_xwt(c->gemm, c->logits_d, PGK_F32, x, w, c->act_dt, L, V, H, &c->err);
    if (rc)
        return rc;
    const int32_t *ids = NULL;
    if (c->greedy_L) { /* the greedy rows' ids: argmax on the device */
        cap = c->ids_cap;
        rc = device_grow(c->stream, (void **)&c->ids_d, &cap, (size_t)L * 4u,
                         "cudaMalloc (argmax ids)", &c->err);
        c->ids_cap = cap;
        void *hi = NULL;
        if (rc || (rc = pgk_argmax(c->ids_d, c->logits_d, L, V, c->stream, c->sync_each, &c->err)) ||
            (rc = pinned_get(c->stream, &c->ids_h, (size_t)L * 4u, &hi, &c->err))) {
            c->greedy_L = 0;
            return rc;
        }
        CUDA_TRY(&c->err, "cudaMemcpyAsync (argmax ids)",
                 cudaMemcpyAsync(hi, c->ids_d, (size_t)L * 4u, cudaMemcpyDeviceToHost, c->stream));
        ids = hi;
    }
    if ((rc = lp_launch(c, c->logits_d, L, V))) {
        c->lp_L = 0;
        return rc;
    }
    if ((rc = cuda_smp_launch(&c->smp, c->stream, c->logits_d, L, V, c->sync_each, &c->err)))
        return rc;
    return logits_out(c, logits_host, c->logits_d, &c->logits_h, ids, L, V);
}

static int cuda_logits(executor *ex, float *logits_host, const void *x, const void *w, int32_t L,
                       int32_t V, int32_t H)
{
    cuda_exec *c = cx(ex);
    int rc = logits_impl(c, logits_host, x, w, L, V, H);
    if (!graph_bound(c)) { /* a mask is for one step, whatever happened (a graph's is the replay's) */
        c->greedy_L = 0;
        c->lp_L = 0;
        cuda_smp_clear(&c->smp);
    }
    return rc;
}

static int cuda_copy_blocks(executor *ex, void *kv, int32_t n_planes, size_t plane_elems,
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
    int rc = pinned_get(c->stream, &c->pairs_h, bytes, &h, &c->err);
    if (rc)
        return rc;
    size_t cap = c->pairs_cap;
    rc = device_grow(c->stream, (void **)&c->pairs_d, &cap, bytes, "cudaMalloc (copy_blocks pairs)", &c->err);
    c->pairs_cap = cap;
    if (rc)
        return rc;
    memcpy(h, src_dst_host, bytes);
    CUDA_TRY(&c->err, "cudaMemcpyAsync (copy_blocks pairs)",
             cudaMemcpyAsync(c->pairs_d, h, bytes, cudaMemcpyHostToDevice, c->stream));
    rc = pinned_mark(&c->pairs_h, c->stream, &c->err);
    if (rc)
        return rc;
    return pgk_copy_blocks(kv, c->kv_dt, n_planes, plane_elems, block_elems, c->pairs_d, n_pairs,
                           c->stream, c->sync_each, &c->err);
}

/* ---- CUDA graphs for decode steps (run_step) -------------------------------
 *
 * A pure decode step (every sequence one query token, every one sampling:
 * T = S = L, logits_rows = 0 .. S-1) of S <= max_batch sequences is padded
 * to its bucket P (cuda_plan_graph_bucket: 1, 2, 4, 8, 16, 24, ...) with
 * dummy sequences — token 0 at position 0, seq_len 1, slot -1 (kv_write
 * skips it: nothing is written), block-table row of zeros (block 0 is read,
 * only into the dummy rows, which no kernel mixes with the others) — and
 * its metadata is copied into the fixed buffers of cuda_graphs. The first
 * step of a bucket captures the model's whole forward (run by the
 * callback: embed, every layer, final norm, lm_head into g->logits_d, the
 * argmax of every row and its copy into pinned memory) into a graph; every
 * step then launches that graph, and the logits rows of the real sequences
 * (those not asked for as greedy ids) are copied out after it. The kernels see the same per-sequence data as an eager step and are
 * batch-invariant (the decode partition size depends on (hd, G) only, a
 * partition's block on the partition only, the grid is sized for the
 * tier's context and its extra blocks exit; the GEMMs run in fixed 128-row
 * calls by default), so graph and eager logits and KV are
 * bit-identical (tests/gpu/test_cuda_graphs.c). With fast_gemm the GEMM of
 * P padded rows may pick another cuBLAS kernel than the eager S rows.
 *
 * Fixed metadata layout (int32; Pm = max_batch, st = the tier's stride =
 * ceil(context / block_size), the top tier's for the block's size):
 * token_ids [Pm], positions [Pm],
 * slots [Pm], query_start [Pm+1], seq_lens [Pm], block_tables [Pm][st],
 * logits_rows [Pm] — the same offsets for every bucket; a step copies
 * only what its bucket reads (graph_upload). */
#define GM_TOK(Pm, st) ((size_t)0)
#define GM_POS(Pm, st) ((size_t)(Pm))
#define GM_SLOT(Pm, st) (2u * (size_t)(Pm))
#define GM_QS(Pm, st) (3u * (size_t)(Pm))
#define GM_LEN(Pm, st) (4u * (size_t)(Pm) + 1u)
#define GM_BT(Pm, st) (5u * (size_t)(Pm) + 1u)
#define GM_ROWS(Pm, st) (GM_BT(Pm, st) + (size_t)(Pm) * (size_t)(st))
#define GM_N(Pm, st) (GM_ROWS(Pm, st) + (size_t)(Pm))
/* int32 from the start a step of bucket P uses before the logits rows */
#define GM_USED(Pm, st, P) (GM_BT(Pm, st) + (size_t)(P) * (size_t)(st))

static uint64_t graph_generation(const cuda_exec *c)
{
    return c->graphs->generation + cuda_gemm_buffers_generation(c->gemm);
}

static void graph_drop_all(cuda_graphs *g)
{
    for (int32_t i = 0; i < g->n_buckets; i++)
        if (g->buckets[i].exec) {
            cudaGraphExecDestroy(g->buckets[i].exec);
            g->buckets[i].exec = NULL;
        }
}

static void graph_free(cuda_graphs *g)
{
    if (!g)
        return;
    graph_drop_all(g);
    free(g->buckets);
    free(g->meta_host);
    pinned_free(&g->meta_h);
    pinned_free(&g->logits_h);
    pinned_free(&g->ids_h);
    if (g->ids_d)
        cudaFree(g->ids_d);
    if (g->meta_d)
        cudaFree(g->meta_d);
    if (g->ws_d)
        cudaFree(g->ws_d);
    if (g->logits_d)
        cudaFree(g->logits_d);
    free(g);
}

/* begin_step while bound: the ops read the fixed buffers, sized for the
 * padded batch b (built by graph_fill, so not checked again). */
static int graph_bind_batch(cuda_exec *c, const step_batch *b)
{
    cuda_graphs *g = c->graphs;
    const int32_t P = b->num_seqs, Pm = g->max_batch, st = g->cur_stride;
    c->have_batch = 0;
    if (P < 1 || P > Pm || b->num_tokens != P || b->num_logits != P)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: expected a padded decode batch of 1 .. %d sequences, got "
                            "T %d, S %d, L %d", (int)Pm, (int)b->num_tokens, (int)P,
                            (int)b->num_logits);
    pgk_batch *d = &c->batch;
    d->token_ids = g->meta_d + GM_TOK(Pm, st);
    d->positions = g->meta_d + GM_POS(Pm, st);
    d->slots = g->meta_d + GM_SLOT(Pm, st);
    d->query_start = g->meta_d + GM_QS(Pm, st);
    d->seq_lens = g->meta_d + GM_LEN(Pm, st);
    d->block_tables = g->meta_d + GM_BT(Pm, st);
    d->logits_rows = g->meta_d + GM_ROWS(Pm, st);
    d->prefill_seqs = g->meta_d; /* num_prefill_seqs = 0: never read */
    d->num_tokens = P;
    d->num_seqs = P;
    d->block_size = g->block_size;
    d->block_table_stride = st;
    d->max_seq_len = g->cur_context; /* the grid of the tier, not of this step */
    d->max_query_len = 1;
    d->num_logits = P;
    d->num_prefill_seqs = 0;
    c->n_decode_seqs = P;
    c->have_batch = 1;
    return 0;
}

/* logits while bound: lm_head into the graph's buffer, the argmax of each
 * row and its copy into pinned memory, without waiting (capturable);
 * run_step copies the real rows out after the launch (logits_out). */
static int graph_logits(cuda_exec *c, const void *x, const void *w, int32_t L, int32_t V,
                        int32_t H)
{
    cuda_graphs *g = c->graphs;
    const size_t bytes = (size_t)L * (size_t)V * 4u;
    if (g->logits_cap < bytes) {
        size_t cap = g->logits_cap;
        int rc = device_grow(c->stream, (void **)&g->logits_d, &cap, bytes, "cudaMalloc (graph logits)",
                             &c->err);
        g->logits_cap = cap;
        g->generation++;
        if (rc)
            return rc;
    }
    if (g->ids_cap < (size_t)L * 4u) {
        size_t cap = g->ids_cap;
        int rc = device_grow(c->stream, (void **)&g->ids_d, &cap, (size_t)L * 4u,
                             "cudaMalloc (graph argmax ids)", &c->err);
        g->ids_cap = cap;
        g->generation++;
        if (rc)
            return rc;
    }
    int rc = cuda_gemm_xwt(c->gemm, g->logits_d, PGK_F32, x, w, c->act_dt, L, V, H, &c->err);
    if (rc)
        return rc;
    /* every row's argmax (cheap: the rows are read once more on the
     * device), for the rows the step wants as ids only; the logits rows are
     * copied after the replay, only those the step returns */
    if ((rc = pgk_argmax(g->ids_d, g->logits_d, L, V, c->stream, 0, &c->err)))
        return rc;
    void *h = NULL;
    if ((rc = pinned_get(c->stream, &g->ids_h, (size_t)L * 4u, &h, &c->err))) /* allocates only at the warm-up */
        return pg_error_wrap(&c->err, rc, "cuda graph argmax ids");
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph argmax ids)",
             cudaMemcpyAsync(h, g->ids_d, (size_t)L * 4u, cudaMemcpyDeviceToHost, c->stream));
    g->logits_rows = L;
    g->logits_V = V;
    return 0;
}

/* 1 when b is a step the graphs run: pure decode, every row sampling, in
 * the bounds the fixed buffers were sized for. */
static int graph_eligible(const cuda_graphs *g, const step_batch *b)
{
    const int32_t S = b->num_seqs;
    if (S < 1 || S > g->max_batch || b->num_tokens != S || b->num_logits != S ||
        b->block_size < 1 || (g->block_size && b->block_size != g->block_size) ||
        (g->block_size && b->sliding_window != g->window))
        return 0;
    for (int32_t s = 0; s <= S; s++)
        if (b->query_start[s] != s)
            return 0;
    for (int32_t s = 0; s < S; s++)
        if (b->logits_rows[s] != s || b->seq_lens[s] < 1 || b->seq_lens[s] > g->max_seq_len)
            return 0;
    return 1;
}

/* Builds the batch of bucket P in g->meta_host: the S real sequences of b
 * (none when b is NULL: the warm-up), then dummies; *pb views it. */
static void graph_fill(cuda_graphs *g, const step_batch *b, int32_t P, step_batch *pb)
{
    const int32_t Pm = g->max_batch, st = g->cur_stride, S = b ? b->num_seqs : 0;
    int32_t *h = g->meta_host;
    memset(h, 0, GM_USED(Pm, st, P) * 4u); /* the rows of bucket P (graph_upload) */
    for (int32_t s = 0; s < P; s++) {
        int real = s < S;
        int32_t len = real ? b->seq_lens[s] : 1;
        h[GM_TOK(Pm, st) + s] = real ? b->token_ids[s] : 0;
        h[GM_POS(Pm, st) + s] = len - 1;
        h[GM_SLOT(Pm, st) + s] = real ? b->slots[s] : -1;
        h[GM_QS(Pm, st) + s + 1] = s + 1;
        h[GM_LEN(Pm, st) + s] = len;
        h[GM_ROWS(Pm, st) + s] = s;
        if (real) {
            int32_t nblk = (len + b->block_size - 1) / b->block_size;
            memcpy(h + GM_BT(Pm, st) + (size_t)s * (size_t)st,
                   b->block_tables + (size_t)s * (size_t)b->block_table_stride, (size_t)nblk * 4u);
        }
    }
    memset(pb, 0, sizeof *pb);
    pb->num_tokens = pb->num_seqs = pb->num_logits = P;
    pb->block_size = g->block_size;
    pb->token_ids = h + GM_TOK(Pm, st);
    pb->positions = h + GM_POS(Pm, st);
    pb->slots = h + GM_SLOT(Pm, st);
    pb->query_start = h + GM_QS(Pm, st);
    pb->seq_lens = h + GM_LEN(Pm, st);
    pb->block_tables = h + GM_BT(Pm, st);
    pb->block_table_stride = st;
    pb->max_seq_len = g->cur_context;
    pb->max_query_len = 1;
    pb->logits_rows = h + GM_ROWS(Pm, st);
    pb->sliding_window = g->window;
}

/* The part of g->meta_host bucket P reads -> the fixed device block
 * (through pinned staging): everything up to the end of row P-1 of the
 * block tables, then the P logits rows. */
static int graph_upload(cuda_exec *c, int32_t P)
{
    cuda_graphs *g = c->graphs;
    const int32_t Pm = g->max_batch, st = g->cur_stride;
    void *hv = NULL;
    int rc = pinned_get(c->stream, &g->meta_h, g->meta_n * 4u, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda graph metadata");
    int32_t *h = hv;
    const size_t head = GM_USED(Pm, st, P), rows = GM_ROWS(Pm, st);
    memcpy(h, g->meta_host, head * 4u);
    memcpy(h + rows, g->meta_host + rows, (size_t)P * 4u);
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph metadata)",
             cudaMemcpyAsync(g->meta_d, h, head * 4u, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(&c->err, "cudaMemcpyAsync (graph metadata rows)",
             cudaMemcpyAsync(g->meta_d + rows, h + rows, (size_t)P * 4u, cudaMemcpyHostToDevice,
                             c->stream));
    g->meta_upload_bytes = (head + (size_t)P) * 4u;
    return pinned_mark(&g->meta_h, c->stream, &c->err);
}

/* The fixed buffers, then one uncaptured forward of max_batch dummy
 * sequences through them: it grows the decode workspace, the logits (device
 * and pinned) and the GEMM padding to their largest, so no capture
 * allocates (vLLM warms up before capturing for the same reason). */
static int graph_warm_up(cuda_exec *c, exec_forward_fn forward, void *ctx)
{
    cuda_graphs *g = c->graphs;
    g->meta_n = GM_N(g->max_batch, g->stride);
    free(g->meta_host); /* a retried warm-up (the last one failed) */
    g->meta_host = malloc(g->meta_n * 4u);
    if (!g->meta_host)
        return pg_error_set(&c->err, PG_ENOMEM, "cuda graph: out of host memory");
    size_t cap = 0; /* a retried warm-up frees the last one's block */
    int rc = device_grow(c->stream, (void **)&g->meta_d, &cap, g->meta_n * 4u,
                         "cudaMalloc (graph metadata)", &c->err);
    if (rc)
        return rc;
    /* the top tier: the largest decode workspace and table stride */
    g->cur_context = g->max_seq_len;
    g->cur_stride = g->stride;
    step_batch pb;
    graph_fill(g, NULL, g->max_batch, &pb);
    if ((rc = graph_upload(c, g->max_batch)))
        return rc;
    g->bound = 1;
    rc = forward(ctx, &pb, NULL);
    g->bound = 0;
    if (rc)
        return rc;
    CUDA_TRY(&c->err, "cudaStreamSynchronize (graph warm-up)", cudaStreamSynchronize(c->stream));
    g->warmed = 1;
    return 0;
}

/* Records forward over the padded batch pb into bk->exec. */
static int graph_capture(cuda_exec *c, graph_bucket *bk, const step_batch *pb,
                         exec_forward_fn forward, void *ctx)
{
    cuda_graphs *g = c->graphs;
    CUDA_TRY(&c->err, "cudaStreamBeginCapture",
             cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal));
    const int sync_each = c->sync_each; /* a synchronization would invalidate the capture */
    c->sync_each = 0;
    if (g->fault & CUDA_GRAPH_TEST_FAIL_CAPTURE) {
        /* illegal while capturing: the driver (and the emulator) invalidate
         * the capture, which then fails at its end (a negative control) */
        g->fault &= ~CUDA_GRAPH_TEST_FAIL_CAPTURE;
        (void)cudaStreamSynchronize(c->stream);
    }
    g->bound = g->capturing = 1;
    int rc = forward(ctx, pb, NULL);
    g->bound = g->capturing = 0;
    c->sync_each = sync_each;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (rc || e != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        if (rc)
            return rc;
        return cuda_fail(&c->err, PG_EDEVICE, "cudaStreamEndCapture (decode step graph)", e);
    }
    e = cudaGraphInstantiate(&bk->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        bk->exec = NULL;
        return cuda_fail(&c->err, PG_EDEVICE, "cudaGraphInstantiate (decode step graph)", e);
    }
    bk->generation = graph_generation(c);
    bk->logits_rows = g->logits_rows;
    bk->logits_V = g->logits_V;
    g->captures++;
    return 0;
}

/* The graph of bucket (P, tier) fell back to eager: one warning per bucket
 * (a failed capture is not an error: the step runs eagerly, as with
 * --enforce-eager, with the same bits). */
static void graph_fall_back(cuda_exec *c, graph_bucket *bk)
{
    cuda_graphs *g = c->graphs;
    bk->eager = 1;
    g->eager_fallbacks++;
    fprintf(stderr,
            "pagedgen: warning: cuda graph of %d sequences (contexts <= %d tokens): capture failed "
            "(%s); these steps run eagerly\n", (int)bk->size, (int)bk->context, c->err.msg);
}

static int run_step_impl(cuda_exec *c, const step_batch *b, float *logits_host,
                         exec_forward_fn forward, void *ctx)
{
    cuda_graphs *g = c->graphs;
    if (!g || !graph_eligible(g, b))
        return forward(ctx, b, logits_host); /* prefill, mixed, too large: eager */
    /* the checks the eager begin_step and embed make, on the real batch */
    int rc = begin_step_impl(c, b, 0);
    if (rc)
        return rc;
    if (!g->block_size) {
        g->block_size = b->block_size;
        g->stride = (g->max_seq_len + b->block_size - 1) / b->block_size;
        g->window = b->sliding_window;
    }
    if (!g->warmed && (rc = graph_warm_up(c, forward, ctx)))
        return rc;
    /* embed's check, with the V the warm-up's embed saw */
    const int32_t S = b->num_seqs;
    for (int32_t t = 0; t < S; t++)
        if (b->token_ids[t] < 0 || b->token_ids[t] >= g->vocab)
            return pg_error_set(&c->err, PG_EINVAL, "cuda embed: token %d: expected id in [0,%d), got %d",
                                (int)t, (int)g->vocab, (int)b->token_ids[t]);
    const int32_t P = cuda_plan_graph_bucket(S, g->max_batch);
    int32_t max_len = 0, context = 0;
    for (int32_t s = 0; s < S; s++)
        max_len = b->seq_lens[s] > max_len ? b->seq_lens[s] : max_len;
    const int32_t tier = cuda_plan_graph_context(max_len, g->max_seq_len, &context);
    graph_bucket *bk = NULL;
    for (int32_t i = 0; i < g->n_sizes && !bk && tier >= 0; i++)
        if (g->buckets[i * g->n_tiers].size == P)
            bk = &g->buckets[i * g->n_tiers + tier];
    if (!bk)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: no bucket of %d sequences with contexts of %d tokens",
                            (int)P, (int)max_len);
    if (bk->eager)
        return forward(ctx, b, logits_host);
    /* a buffer a graph uses was reallocated since its capture: capture again */
    if (bk->exec && bk->generation != graph_generation(c))
        graph_drop_all(g);
    g->cur_context = bk->context;
    g->cur_stride = (bk->context + g->block_size - 1) / g->block_size;
    step_batch pb;
    graph_fill(g, b, P, &pb);
    if (!(bk->exec && (g->fault & CUDA_GRAPH_TEST_SKIP_METADATA)) && (rc = graph_upload(c, P)))
        return rc;
    if (!bk->exec && graph_capture(c, bk, &pb, forward, ctx)) {
        graph_fall_back(c, bk);
        return forward(ctx, b, logits_host);
    }
    if (bk->logits_rows != P || bk->logits_V < 1) {
        c->greedy_L = 0;
        c->lp_L = 0;
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda graph: the captured step computed %d logits rows, expected %d",
                            (int)bk->logits_rows, (int)P);
    }
    CUDA_TRY(&c->err, "cudaGraphLaunch (decode step)", cudaGraphLaunch(bk->exec, c->stream));
    g->replays++;
    /* the logprob rows, then the S real rows (of the P computed), after the
     * replay (stream order) */
    if ((rc = lp_launch(c, g->logits_d, S, bk->logits_V)) ||
        (rc = cuda_smp_launch(&c->smp, c->stream, g->logits_d, S, bk->logits_V, c->sync_each, &c->err)))
        return rc;
    return logits_out(c, logits_host, g->logits_d, &g->logits_h, g->ids_h.h, S, bk->logits_V);
}

static int cuda_run_step(executor *ex, const step_batch *b, float *logits_host,
                         exec_forward_fn forward, void *ctx)
{
    cuda_exec *c = cx(ex);
    int rc = run_step_impl(c, b, logits_host, forward, ctx);
    c->greedy_L = 0; /* a greedy mask is for this step only, even one that failed */
    c->lp_L = 0;
    cuda_smp_clear(&c->smp);
    return rc;
}

static const executor_ops cuda_ops;

static cuda_exec *as_cuda(executor *ex)
{
    return ex && ex->op == &cuda_ops ? cx(ex) : NULL;
}

int cuda_executor_set_graphs(executor *ex, int32_t max_batch, int32_t max_seq_len, pg_error *err)
{
    cuda_exec *c = as_cuda(ex);
    if (!c)
        return pg_error_set(err, PG_EINVAL, "cuda graphs: not a cuda executor");
    if (max_batch < 0 || max_batch > 65535 || (max_batch > 0 && max_seq_len < 1))
        return pg_error_set(err, PG_EINVAL,
                            "cuda graphs: expected 0 <= max_batch <= 65535 and max_seq_len >= 1, "
                            "got %d and %d", (int)max_batch, (int)max_seq_len);
    if (c->graphs) {
        cudaStreamSynchronize(c->stream);
        graph_free(c->graphs);
        c->graphs = NULL;
    }
    if (max_batch == 0)
        return 0;
    cuda_graphs *g = calloc(1, sizeof *g);
    const int32_t n = cuda_plan_graph_sizes(NULL, 0, max_batch);
    const int32_t n_tiers = cuda_plan_graph_tiers(max_seq_len);
    int32_t *sizes = malloc((size_t)n * sizeof *sizes);
    if (g)
        g->buckets = calloc((size_t)n * (size_t)n_tiers, sizeof *g->buckets);
    if (!g || !sizes || !g->buckets) {
        free(sizes);
        graph_free(g);
        return pg_error_set(err, PG_ENOMEM, "cuda graphs: out of host memory");
    }
    cuda_plan_graph_sizes(sizes, n, max_batch);
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0, len = 1; k < n_tiers; k++) {
            graph_bucket *bk = &g->buckets[i * n_tiers + k];
            bk->size = sizes[i];
            cuda_plan_graph_context(len, max_seq_len, &bk->context);
            len = bk->context + 1;
        }
    free(sizes);
    g->n_buckets = n * n_tiers;
    g->n_sizes = n;
    g->n_tiers = n_tiers;
    g->max_batch = max_batch;
    g->max_seq_len = max_seq_len;
    c->graphs = g;
    return 0;
}

void cuda_executor_graph_stats(executor *ex, long *captures, long *replays)
{
    cuda_exec *c = as_cuda(ex);
    *captures = c && c->graphs ? c->graphs->captures : 0;
    *replays = c && c->graphs ? c->graphs->replays : 0;
}

void cuda_executor_graph_info(executor *ex, cuda_graph_info *out)
{
    cuda_exec *c = as_cuda(ex);
    const cuda_graphs *g = c ? c->graphs : NULL;
    memset(out, 0, sizeof *out);
    if (c) {
        out->logits_copy_bytes = c->logits_copy_bytes;
        out->logits_copy_total_bytes = c->logits_copy_total;
    }
    if (!g)
        return;
    out->captures = g->captures;
    out->replays = g->replays;
    out->eager_fallbacks = g->eager_fallbacks;
    out->workspace_bytes = g->ws_floats * 4u;
    out->meta_upload_bytes = g->meta_upload_bytes;
    out->logits_copy_bytes = c->logits_copy_bytes;
    out->logits_copy_total_bytes = c->logits_copy_total;
}

int cuda_executor_greedy_next_step(executor *ex, const uint8_t *greedy, int32_t L,
                                   int32_t *ids_host)
{
    cuda_exec *c = as_cuda(ex);
    if (!c)
        return PG_EINVAL;
    if (L < 0 || (L > 0 && (!greedy || !ids_host)))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda greedy rows: expected L >= 0 and a mask and ids for L > 0, got L %d",
                            (int)L);
    c->greedy = greedy;
    c->greedy_ids = ids_host;
    c->greedy_L = L;
    return 0;
}

int cuda_executor_logprob_rows(executor *ex, pg_lsm_row *rows, int32_t L)
{
    cuda_exec *c = as_cuda(ex);
    if (!c)
        return PG_EINVAL;
    if (L < 0 || (L > 0 && !rows))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logprob rows: expected L >= 0 and rows for L > 0, got L %d", (int)L);
    c->lp_rows = rows;
    c->lp_L = L;
    return 0;
}

int cuda_executor_sample_rows(executor *ex, const pg_smp_batch *req)
{
    cuda_exec *c = as_cuda(ex);
    return c ? cuda_smp_set(&c->smp, req, &c->err) : PG_EINVAL;
}

int cuda_executor_logprobs(executor *ex, pg_lsm_row *rows_host, const float *logits, int32_t n,
                           int32_t V)
{
    cuda_exec *c = cx(ex);
    if (n < 1 || V < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda logprobs: expected n, V >= 1, got %d, %d",
                            (int)n, (int)V);
    for (int32_t r = 0; r < n; r++)
        rows_host[r].want = 1;
    pg_lsm_row *saved = c->lp_rows;
    int32_t saved_L = c->lp_L;
    c->lp_rows = rows_host;
    c->lp_L = n;
    int rc = lp_launch(c, logits, n, V);
    c->lp_rows = saved;
    c->lp_L = saved_L;
    if (!rc && c->lp_n == n) {
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess)
            rc = cuda_fail(&c->err, PG_EDEVICE, "logprobs result copy", e);
        else
            memcpy(rows_host, c->lp_out_h.h, (size_t)n * sizeof *rows_host);
    }
    c->lp_n = 0;
    return rc;
}

int cuda_executor_graph_test_fault(executor *ex, int fault)
{
    cuda_exec *c = as_cuda(ex);
    if (!c || !c->graphs || !c->graphs->logits_d)
        return PG_EINVAL;
    cuda_graphs *g = c->graphs;
    if (fault == CUDA_GRAPH_TEST_SKIP_METADATA || fault == CUDA_GRAPH_TEST_FAIL_CAPTURE) {
        g->fault |= fault;
        return 0;
    }
    if (fault != CUDA_GRAPH_TEST_REGROW && fault != CUDA_GRAPH_TEST_REGROW_UNTRACKED)
        return PG_EINVAL;
    /* what a larger step would do to a buffer grown on demand */
    size_t cap = g->logits_cap;
    int rc = device_grow(c->stream, (void **)&g->logits_d, &cap, g->logits_cap + 1, "cudaMalloc (test regrow)",
                         &c->err);
    g->logits_cap = cap;
    if (fault == CUDA_GRAPH_TEST_REGROW)
        g->generation++;
    return rc;
}

int cuda_executor_argmax(executor *ex, int32_t *ids_host, const float *logits, int32_t rows,
                         int32_t V)
{
    cuda_exec *c = cx(ex);
    int32_t *ids_d = NULL;
    if (rows < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda argmax: rows %d < 1", (int)rows);
    CUDA_TRY(&c->err, "cudaMalloc (argmax ids)", cudaMalloc((void **)&ids_d, (size_t)rows * 4u));
    int rc = pgk_argmax(ids_d, logits, rows, V, c->stream, c->sync_each, &c->err);
    if (rc == 0) {
        cudaError_t e = cudaMemcpyAsync(ids_host, ids_d, (size_t)rows * 4u, cudaMemcpyDeviceToHost,
                                        c->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess)
            rc = cuda_fail(&c->err, PG_EDEVICE, "argmax result copy", e);
    }
    for (int32_t r = 0; rc == 0 && r < rows; r++)
        if (ids_host[r] < 0)
            rc = pg_error_set(&c->err, PG_EINVAL,
                              "cuda argmax: row %d: no token can be sampled: all %d logits are -inf "
                              "or nan", (int)r, (int)V);
    cudaFree(ids_d);
    return rc;
}

static const executor_ops cuda_ops = {
    .destroy = cuda_destroy,
    .last_error = cuda_last_error,
    .mem_info = cuda_mem_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download_f32 = cuda_download_f32,
    .sync = cuda_sync,
    .begin_step = cuda_begin_step,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .add_bias = cuda_add_bias,
    .qk_norm = cuda_qk_norm,
    .rope = cuda_rope,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .silu_mul = cuda_silu_mul,
    .gather_rows = cuda_gather_rows,
    .logits = cuda_logits,
    .copy_blocks = cuda_copy_blocks,
    .run_step = cuda_run_step,
    .greedy_rows = cuda_executor_greedy_next_step,
    .logprob_rows = cuda_executor_logprob_rows,
    .sample_rows = cuda_executor_sample_rows,
};

int cuda_executor_create(executor **out, const cuda_executor_params *p, pg_error *err)
{
    cuda_executor_params def = cuda_executor_params_default();
    if (!p)
        p = &def;
    if (p->precision != 0 && p->precision != 1)
        return pg_error_set(err, PG_EINVAL, "cuda executor: precision %d: expected 0 (bf16) or 1 (f32)",
                            p->precision);
    if (p->precision == 0 && p->kv_dtype != 0 && p->kv_dtype != 1)
        return pg_error_set(err, PG_EINVAL, "cuda executor: kv_dtype %d: expected 0 (bf16) or 1 (fp16)",
                            p->kv_dtype);
    int n = cuda_device_count();
    if (n == 0)
        return pg_error_set(err, PG_EDEVICE, "cuda executor: no CUDA device (or no driver) found");
    if (p->device < 0 || p->device >= n)
        return pg_error_set(err, PG_EINVAL, "cuda executor: device %d: expected 0 .. %d",
                            (int)p->device, n - 1);
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(p->device));

    cuda_exec *c = calloc(1, sizeof *c);
    if (!c)
        return pg_error_set(err, PG_ENOMEM, "cuda executor: out of host memory");
    c->device = p->device;
    c->act_dt = c->wt_dt = p->precision == 1 ? PGK_F32 : PGK_BF16;
    c->kv_dt = p->precision == 1 ? PGK_F32 : (p->kv_dtype == 1 ? PGK_F16 : PGK_BF16);
    const char *sync = getenv("PAGEDGEN_CUDA_SYNC");
    c->sync_each = sync && strcmp(sync, "1") == 0;
    c->base.op = &cuda_ops;
    c->base.name = "cuda";
    c->base.act_bytes = pgk_dtype_bytes(c->act_dt);
    c->base.wt_bytes = pgk_dtype_bytes(c->wt_dt);
    c->base.kv_bytes = pgk_dtype_bytes(c->kv_dt);

    int rc;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        rc = cuda_fail(err, PG_EDEVICE, "cudaStreamCreate", e);
        goto fail;
    }
    rc = cuda_gemm_create(&c->gemm, c->stream, err);
    if (rc) {
        pg_error_wrap(err, rc, "cuda executor on device %d", (int)p->device);
        goto fail;
    }
    cuda_gemm_set_fixed_rows(c->gemm, p->fast_gemm ? 0 : CUDA_GEMM_FIXED_ROWS);
    *out = &c->base;
    return 0;
fail:
    cuda_destroy(&c->base);
    return rc;
}
