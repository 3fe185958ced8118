/* ops_support: shared pieces of the op tests — device buffers with guard
 * regions, and random ragged step batches over random block tables. */
#ifndef PG_OPS_SUPPORT_H
#define PG_OPS_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "step_batch.h"
#include "test_support.h"

/* Every device buffer gets OPS_GUARD extra elements holding OPS_GUARD_VALUE
 * (exact in f32, f16 and bf16); ops_dev_get fails the test if one changed. */
#define OPS_GUARD 16
#define OPS_GUARD_VALUE 768.0f

void *ops_dev_alloc(executor *ex, exec_buf_kind kind, size_t n);
/* Uploads n f32 values and the guard after them. */
void ops_dev_put(executor *ex, void *d, exec_buf_kind kind, const float *h, size_t n);
/* Like ops_dev_put, then reads the values back into h: h then holds what
 * the device holds (rounded to its element type), for the reference. */
void ops_dev_put_rt(executor *ex, void *d, exec_buf_kind kind, float *h, size_t n);
/* n NaNs (outputs are poisoned before an op) and the guard. */
void ops_dev_poison(executor *ex, void *d, exec_buf_kind kind, size_t n);
/* Downloads n values, checks the guard is intact (what names the buffer). */
void ops_dev_get(executor *ex, float *h, const void *d, exec_buf_kind kind, size_t n, const char *what);

/* max |got - ref| over n, and max |ref|; fails (with `what`) unless every
 * value is finite and max err <= tol * max(max |ref|, 1e-3). */
void ops_check_close(const float *got, const double *ref, size_t n, double tol, const char *what);

/* A sequence of a ragged batch: its context length after the step and how
 * many of its last tokens the step computes. */
typedef struct ops_seq_spec {
    int32_t seq_len;
    int32_t q_len;
} ops_seq_spec;

typedef struct ops_batch {
    step_batch b;
    int32_t *token_ids, *positions, *slots, *query_start, *seq_lens, *block_tables, *logits_rows;
    int32_t num_blocks; /* physical blocks the tables point into (cache size) */
} ops_batch;

/* Random non-contiguous block tables (distinct blocks drawn from a pool of
 * about twice what is needed; unused table entries hold -1), token ids in
 * [0, vocab), logits rows = the last token of each sequence. */
void ops_batch_build(ops_batch *ob, const ops_seq_spec *specs, int32_t S, int32_t block_size,
                     int32_t vocab, pg_test_rng *rng);
/* The batch of sequence s of `in` alone (same blocks, ids, positions). */
void ops_batch_extract(ops_batch *out, const ops_batch *in, int32_t s);
void ops_batch_free(ops_batch *ob);

#endif /* PG_OPS_SUPPORT_H */
