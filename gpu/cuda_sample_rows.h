/* cuda_sample_rows: the CUDA executor's sampled rows (executor.h
 * sample_rows) — one step's pending request (pg_smp_batch, borrowed), its
 * upload, the sampling kernel (gpu/sampling.cu pgk_sample) over the step's
 * device logits and the ids' way back — so that cuda_executor.c only
 * calls it at the points a step's logits pass (launch after the logits
 * are computed, skip the marked rows in the copy out, finish after the
 * stream's synchronization). One instance per executor, zeroed at start;
 * not thread-safe (the executor's stream is one). */
#ifndef PG_CUDA_SAMPLE_ROWS_H
#define PG_CUDA_SAMPLE_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "pg_error.h"
#include "pg_sample.h"

typedef struct cuda_smp {
    const pg_smp_batch *req;  /* pending (borrowed), NULL: none */
    int32_t launched;         /* rows sampled for the logits being copied out */
    bool queued;              /* an upload / ids copy is queued on the stream */
    int32_t *marked;          /* [marked_cap] host: q + 1 = logits row sampled as
                                 request row q, 0 = not sampled on the device */
    int32_t marked_cap;
    void *buf_d;              /* device: rows | pen_ids | pen_cnt | ban_ids | mask |
                                 raw_slot | ids */
    size_t buf_d_cap;
    void *buf_h;              /* pinned host staging, the same layout */
    size_t buf_h_cap;
    size_t ids_off;           /* offset of ids in both */
    int32_t *raw_slot;        /* [raw_slot_cap] host: request row q's row of raw_d, -1 */
    int32_t raw_slot_cap;
    float *raw_d;             /* device [raw_rows][V]: the rows whose logprobs are
                                 wanted, as the sampler's logprobs read them */
    size_t raw_cap;           /* bytes */
} cuda_smp;

/* Keeps req for the next logits (NULL clears). PG_EINVAL for a malformed
 * request (counts, NULL arrays). */
int cuda_smp_set(cuda_smp *s, const pg_smp_batch *req, pg_error *err);

/* The pending request over logits_d [L][V] (device, f32): checks it
 * against L, uploads it, launches the kernel (the rows are rewritten in
 * place) and queues the ids' copy to pinned memory, all on lk->st (errors
 * in lk->err). lp [L] (or NULL): the step's logprob rows; a sampled row r
 * with lp[r].want and lp[r].token == PG_LSM_SAMPLED keeps its row as the
 * sampler's logprobs read it (after the grammar mask) in the device
 * buffer cuda_smp_raw, at row cuda_smp_raw_row, for pgk_logprobs. Nothing
 * pending: 0 and nothing launched. On failure the request is dropped. */
int cuda_smp_launch(cuda_smp *s, float *logits_d, int32_t L, int32_t V, const pg_lsm_row *lp,
                    pgk_launch *lk);

/* True when row r of the logits being copied out was sampled on the
 * device (its floats are not to be copied). */
static inline bool cuda_smp_marked(const cuda_smp *s, int32_t r)
{
    return s->launched > 0 && s->marked[r];
}

/* After cuda_smp_launch: logits row r's index in the request (its id is
 * cuda_smp_ids_d()[index]), -1 when r was not sampled. */
static inline int32_t cuda_smp_index(const cuda_smp *s, int32_t r)
{
    return cuda_smp_marked(s, r) ? s->marked[r] - 1 : -1;
}

/* After cuda_smp_launch: the row of cuda_smp_raw holding request row q's
 * logits as its logprobs read them, -1 when it was not kept. */
static inline int32_t cuda_smp_raw_row(const cuda_smp *s, int32_t q)
{
    return s->launched > 0 && q >= 0 && q < s->launched ? s->raw_slot[q] : -1;
}

/* After cuda_smp_launch (device memory, valid on the stream until the
 * next launch): the kept rows [.][V] and the sampled ids [launched]. */
static inline const float *cuda_smp_raw(const cuda_smp *s) { return s->raw_d; }
static inline const int32_t *cuda_smp_ids_d(const cuda_smp *s)
{
    return (const int32_t *)(const void *)((const char *)s->buf_d + s->ids_off);
}

/* After st was synchronized: the ids into req->ids; drops the request. */
void cuda_smp_finish(cuda_smp *s);

/* Drops a pending request (a step that failed or did not reach its logits). */
void cuda_smp_clear(cuda_smp *s);

/* Frees the buffers (the stream synchronized by the caller). */
void cuda_smp_free(cuda_smp *s);

#endif /* PG_CUDA_SAMPLE_ROWS_H */
