/* sample_rows: one step's sampled rows as a device takes them
 * (common/pg_sample.h pg_smp_batch; engine_backend sample_rows) — the rows'
 * parameters (sampler_row_params), their penalty and banned ids, and the
 * ids that come back. The engine adds the rows it hands over before the
 * forward and reads their tokens after it. The arrays grow as needed and
 * are kept between steps (no allocation in a steady decode). Owned by the
 * engine; not thread-safe. */
#ifndef PG_SAMPLE_ROWS_H
#define PG_SAMPLE_ROWS_H

#include <stdint.h>

#include "pg_error.h"
#include "pg_sample.h"
#include "sampler.h"

typedef struct sample_rows sample_rows;

/* For up to max_rows rows a step; NULL when out of memory. */
sample_rows *sample_rows_create(int32_t max_rows);
void sample_rows_destroy(sample_rows *s); /* accepts NULL */

/* Starts a step of L logits rows: no row added. */
void sample_rows_reset(sample_rows *s, int32_t L);

/* Adds logits row `row` (ascending across calls) sampled with params from
 * the sequence seq at rng's draw (sampler_row_params, through ws); returns
 * its index q in the batch, or a negative error (PG_ENOMEM, or PG_EINVAL
 * with err set). */
int32_t sample_rows_add(sample_rows *s, sampler_workspace *ws, const sampling_params *params,
                        const sampler_seq_view *seq, const sampler_rng *rng, int32_t row,
                        pg_error *err);

/* Row q's grammar mask (step 0): mask [ceil(V/64)] 64-bit words (bit v:
 * token v allowed, grammar.h's layout) with the terminators term[n_term]
 * (eos / stop ids let in where the text may end) allowed as well; the
 * terminators not in mask are remembered for sample_rows_mask_of. Returns
 * 0, or PG_ENOMEM (err set). */
int sample_rows_set_mask(sample_rows *s, int32_t q, const uint64_t *mask, int32_t V,
                         const int32_t *term, int32_t n_term, pg_error *err);

/* Row q's mask as given to sample_rows_set_mask (without the added
 * terminators) into out [ceil(V/64)]. */
void sample_rows_mask_of(const sample_rows *s, int32_t q, uint64_t *out, int32_t V);

/* The batch to hand over (n = the rows added; ids written into it). */
const pg_smp_batch *sample_rows_batch(const sample_rows *s);

/* The token of row q after the forward (-1: none could be sampled). */
int32_t sample_rows_id(const sample_rows *s, int32_t q);

#endif /* PG_SAMPLE_ROWS_H */
