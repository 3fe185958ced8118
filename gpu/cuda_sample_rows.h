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
    uint8_t *marked;          /* [marked_cap] host: 1 = row sampled on the device */
    int32_t marked_cap;
    void *buf_d;              /* device: rows | pen_ids | pen_cnt | ban_ids | mask | ids */
    size_t buf_d_cap;
    void *buf_h;              /* pinned host staging, the same layout */
    size_t buf_h_cap;
    size_t ids_off;           /* offset of ids in both */
} cuda_smp;

/* Keeps req for the next logits (NULL clears). PG_EINVAL for a malformed
 * request (counts, NULL arrays). */
int cuda_smp_set(cuda_smp *s, const pg_smp_batch *req, pg_error *err);

/* The pending request over logits_d [L][V] (device, f32): checks it
 * against L, uploads it, launches the kernel (the rows are rewritten in
 * place) and queues the ids' copy to pinned memory, all on lk->st (errors
 * in lk->err). Nothing
 * pending: 0 and nothing launched. On failure the request is dropped. */
int cuda_smp_launch(cuda_smp *s, float *logits_d, int32_t L, int32_t V, pgk_launch *lk);

/* True when row r of the logits being copied out was sampled on the
 * device (its floats are not to be copied). */
static inline bool cuda_smp_marked(const cuda_smp *s, int32_t r)
{
    return s->launched > 0 && s->marked[r];
}

/* After st was synchronized: the ids into req->ids; drops the request. */
void cuda_smp_finish(cuda_smp *s);

/* Drops a pending request (a step that failed or did not reach its logits). */
void cuda_smp_clear(cuda_smp *s);

/* Frees the buffers (the stream synchronized by the caller). */
void cuda_smp_free(cuda_smp *s);

#endif /* PG_CUDA_SAMPLE_ROWS_H */
