/* pooling: an embedding request's pooler — the final-norm hidden states of
 * its prompt (model_hidden_rows) reduced to one vector, as vLLM's pooling
 * runner does for an "embed" task (vllm/model_executor/layers/pooler.py;
 * PoolingParams in vllm/pooling_params.py at
 * 0235532e130d621f67948f3572fcf7d77bcb71d3):
 *
 *   LAST  the hidden row of the last prompt token   (vLLM's default for a
 *         decoder LM served as an embedding model, and Qwen3-Embedding's
 *         and e5-mistral's sentence-transformers pooling_mode_lasttoken)
 *   MEAN  the mean of the rows of every prompt token
 *   CLS   the row of the first prompt token
 *
 * then Matryoshka truncation to the first `dimensions` entries, then (with
 * normalize) division by the L2 norm: vLLM's EmbeddingPoolerHead slices
 * [..., :dimensions] before its PoolerNormalize (F.normalize, p = 2,
 * eps 1e-12).
 *
 * Arithmetic: rows arrive in position order (chunked prefill hands them
 * over step by step, always increasing), and the pooler sums in double in
 * that order, so the vector does not depend on how the prompt was chunked
 * or batched; the rows themselves are batch-invariant (the forward is).
 * The final vector is the double result rounded to f32.
 *
 * Plain data (pooling_params) + one opaque accumulator per request.
 */
#ifndef PG_POOLING_H
#define PG_POOLING_H

#include <stdbool.h>
#include <stdint.h>

#include "pg_error.h"

typedef enum pooling_type {
    POOLING_LAST = 0,
    POOLING_MEAN,
    POOLING_CLS,
} pooling_type;

/* Plain data; the pooler copies it. */
typedef struct pooling_params {
    pooling_type type;
    bool normalize;         /* L2-normalize the (truncated) vector; vLLM's default true */
    int32_t dimensions;     /* 0: all H entries; else 1..H: keep the first `dimensions`
                               (Matryoshka), before normalizing */
} pooling_params;

/* "last", "mean", "cls" (NULL for another value). */
const char *pooling_type_name(pooling_type t);
/* The type named by the NUL-terminated s ("last" or "lasttoken", "mean",
 * "cls"); PG_EINVAL naming the accepted ones otherwise. */
int pooling_type_parse(const char *s, pooling_type *out, pg_error *err);

/* PG_EINVAL with a message for a type out of range or dimensions outside
 * [0, hidden]. */
int pooling_params_validate(const pooling_params *p, int32_t hidden, pg_error *err);

typedef struct pooler pooler;

/* An accumulator for a prompt of n_prompt tokens and hidden size H.
 * PG_EINVAL (see pooling_params_validate), PG_ENOMEM; *out NULL on error. */
int pooler_create(pooler **out, const pooling_params *p, int32_t hidden, int32_t n_prompt,
                  pg_error *err);
void pooler_destroy(pooler *pl); /* accepts NULL */

/* Whether this pooler reads prompt rows other than the last: then the
 * prompt must be computed in full (no prefix-cache hits: vLLM's
 * skip_reading_prefix_cache for pooling over all tokens). */
bool pooler_needs_all_rows(const pooler *pl);

/* For a step that computes positions start .. start+n_new-1 of the prompt:
 * the rows the pooler wants, as *first (offset into the step's rows of
 * this sequence) and *count (0: none). */
void pooler_rows_wanted(const pooler *pl, int32_t start, int32_t n_new, int32_t *first,
                        int32_t *count);

/* Hands over the hidden rows rows [count][H] f32 of positions pos0 ..
 * pos0+count-1 (what pooler_rows_wanted asked, or more: LAST and CLS take
 * their one position's row if it is among them, MEAN sums them all). For
 * MEAN, pos0 == 0 starts over (a preempted request recomputes its prompt
 * from the beginning) and a gap in the positions is refused at finish;
 * LAST and CLS overwrite their row. */
void pooler_add(pooler *pl, int32_t pos0, const float *rows, int32_t count);

/* Once every row was handed over: the pooled, truncated, normalized vector
 * in *out [*dim] f32 (malloc'd, the caller owns it). PG_EINVAL when rows
 * are missing; PG_ENOMEM. */
int pooler_finish(pooler *pl, float **out, int32_t *dim, pg_error *err);

#endif /* PG_POOLING_H */
