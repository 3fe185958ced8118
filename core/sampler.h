/* sampler: logits -> next token for one sequence, on the host, with vLLM's
 * semantics. Pure functions plus a per-sequence RNG whose stream depends
 * only on (request seed, sequence index, number of tokens drawn so far), so
 * a sequence samples the same tokens whatever the batch and however often
 * it was preempted.
 *
 * Order of processing (vLLM v1): penalties (repetition over prompt+output,
 * presence/frequency over output), min_tokens masking of eos/stop ids,
 * then greedy argmax if temperature < 1e-5 (ties -> lowest id, no RNG
 * draw); otherwise divide by temperature, min-p (vLLM v1 runs it before
 * top-k/top-p), top-k (boundary ties kept), top-p over the survivors,
 * softmax, one uniform draw, inverse CDF over the survivors in ascending id
 * order. Logprobs are computed from the raw logits (before penalties and
 * temperature), as vLLM's default "raw_logprobs" mode does, by the
 * log-softmax definition in common/pg_logsoftmax.h, which the CUDA
 * executor computes bit for bit alike (gpu/logprobs.cu): a greedy request
 * with logprobs may take its token and logprobs from the device instead of
 * its row (engine_backend logprob_rows) with the same result. Details and
 * provenance: sampler.c.
 */
#ifndef PG_SAMPLER_H
#define PG_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_sample.h"
#include "sampling_params.h"

/* Counter-based (draw k is a hash of (key, k); splitmix64 mixing, see
 * sampler.c): the state is just the key and the counter. Plain data. */
typedef struct sampler_rng {
    uint64_t key;      /* derived from (seed, sequence index) */
    uint64_t counter;  /* tokens drawn so far */
} sampler_rng;

/* The stream of sequence seq_index of a request seeded with seed, at draw 0. */
sampler_rng sampler_rng_init(uint64_t seed, int32_t seq_index);
/* Uniform double in [0, 1) for draw number rng->counter; advances the counter. */
double sampler_rng_uniform(sampler_rng *rng);

/* What the sampler needs to know about the sequence so far (borrowed for
 * the call; ids must be in [0, vocab)). */
typedef struct sampler_seq_view {
    const int32_t *prompt_ids;  int32_t n_prompt;
    const int32_t *output_ids;  int32_t n_output;
    /* ids that must not be sampled yet (eos + stop_token_ids while
     * n_output < min_tokens); the engine fills it */
    const int32_t *banned_ids;  int32_t n_banned;
} sampler_seq_view;

typedef struct sampler_result {
    int32_t token_id;
    float logprob;              /* of token_id under the raw distribution (logprobs >= 0;
                                   else 0) */
    int32_t n_top;              /* min(params->logprobs, vocab); 0 when logprobs = -1 */
    int32_t *top_ids;           /* [n_top], caller-provided storage */
    float *top_logprobs;        /* [n_top], caller-provided storage, descending */
} sampler_result;

/* Workspace reused across calls (sized for the vocabulary); one per thread.
 * create returns NULL when out of memory or vocab_size < 1. */
typedef struct sampler_workspace sampler_workspace;
sampler_workspace *sampler_workspace_create(int32_t vocab_size);
void sampler_workspace_destroy(sampler_workspace *w); /* accepts NULL */
/* The message of the last failed sampler_sample() on w (borrowed; valid
 * until the next call on w). */
const char *sampler_workspace_error(const sampler_workspace *w);

/* Samples from logits[vocab] (modified in place; vocab <= the workspace's
 * size). result->top_ids and top_logprobs must have room for
 * params->logprobs entries when >= 0; result->n_top = min(logprobs, vocab),
 * 0 when logprobs = -1. Draws exactly one uniform from rng per call unless
 * greedy. Returns PG_EINVAL (message: sampler_workspace_error) for an id
 * out of [0, vocab) in seq, missing storage, or when every logit is -inf,
 * nan or banned. seq may be NULL (no history). Params are assumed valid
 * (sampling_params_validate). */
int sampler_sample(sampler_workspace *w, const sampling_params *params, float *logits,
                   int32_t vocab, const sampler_seq_view *seq, sampler_rng *rng,
                   sampler_result *result);

/* True when sampler_sample(params, seq) would return the argmax of the
 * logits exactly as given (ties -> lowest id, NaN never wins) and nothing
 * else: greedy temperature, no penalties, no banned ids, no logprobs. Its
 * result may then be taken elsewhere (a device argmax, executor.h
 * greedy_rows) with the same token; result->logprob 0, n_top 0. seq may be
 * NULL. */
bool sampler_plain_argmax(const sampling_params *params, const sampler_seq_view *seq);

/* sampler_sample(params, logits, seq, rng) as a device takes it
 * (common/pg_sample.h pg_smp_row; gpu/sampling.cu): fills *row (row->row
 * and row->mask_first are left for the caller: -1 and -1 here) and appends
 * step 1's distinct ids of prompt ∪ output with their output counts to
 * pen_ids / pen_cnt at *n_pen (room for n_prompt + n_output more needed)
 * and step 2's banned ids to ban_ids at *n_ban (room for n_banned more),
 * advancing both counts. Does not advance rng: the draw row->counter is
 * the one sampler_sample would take, so a caller that samples elsewhere
 * advances rng->counter itself when !sampler_row_greedy(params). Returns
 * PG_EINVAL (sampler_workspace_error) for an id out of [0, w's vocab). */
int sampler_row_params(sampler_workspace *w, const sampling_params *params,
                       const sampler_seq_view *seq, const sampler_rng *rng, pg_smp_row *row,
                       int32_t *pen_ids, int32_t *pen_cnt, int32_t *n_pen, int32_t *ban_ids,
                       int32_t *n_ban);

/* True when params sample greedily (step 3: no draw taken). */
bool sampler_row_greedy(const sampling_params *params);

#endif /* PG_SAMPLER_H */
