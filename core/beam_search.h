/* beam_search: vLLM's beam search (sampling_params.use_beam_search), run
 * on shared KV blocks as the PagedAttention paper's §4.4 does it.
 *
 * The algorithm is vLLM's, read at these commits:
 *   vllm/beam_search.py (get_beam_search_score,
 *     create_sort_beams_key_function) at 00634b8acf93e413a1c380288665a543b98be7ea;
 *   vllm/entrypoints/llm.py LLM.beam_search at 0012cf691b7e69423244d2b1405f4b6832156e19
 *     (the same loop as the OpenAI server's beam_search).
 * With W = beam_width (the request's n):
 *   - each step every live beam asks for logprobs = 2W: its top 2W next
 *     tokens by logprob, best first (at temperature 0 the sampled token is
 *     the argmax, already first among them). Logprobs are of the raw
 *     logits (vLLM v1's default logprobs_mode raw_logprobs), here
 *     common/pg_logsoftmax.h's, whose top k breaks ties to the lower id;
 *   - a candidate = the parent's tokens + the token, cum_logprob = the
 *     parent's + the token's logprob (summed in double, as Python does);
 *     candidates are listed beam by beam in the beams' rank order, each
 *     beam's in its logprob order;
 *   - a candidate whose token is the eos id (and not ignore_eos) joins the
 *     completed list (in that order); the others are sorted by
 *     beam_score, descending, with Python's stable sort (equal scores keep
 *     the listing order: parent rank, then the parent's logprob order),
 *     and the first W are the live beams of the next step;
 *   - there is no early stop: the loop runs max_tokens steps (here the
 *     request's max_output: max_tokens cut to the context) or until no
 *     beam is live; then the live beams are appended to the completed
 *     list (after it), the whole list is stably sorted by the same score
 *     and its first W are the outputs, best first;
 *   - beam_score = cum_logprob / seq_len^length_penalty, seq_len counting
 *     the prompt and the generated tokens but not a final eos id.
 * Outputs take the OpenAI server's shapes: token_ids are the generated
 * ids (a completing eos not among them unless include_stop_str_in_output),
 * text = transformers' decode of the ids without the eos (skip_special_tokens
 * as asked, clean_up_tokenization_spaces as the tokenizer config), finish
 * "stop" (stop_token_id = eos) for a completed beam, "length" otherwise;
 * cumulative_logprob includes the eos's logprob. The eos id is the first
 * of the engine's eos ids (vLLM uses the tokenizer's single eos_token_id).
 *
 * On the block pool: the request's n = W sequences are beam slots. The
 * prompt is computed once by slot 0; every step each surviving beam keeps
 * its parent's slot (the parent's first survivor) or takes a free slot
 * whose table forks the parent's (kv_pool_fork: ref counts up; a write into
 * a shared, partly filled block copies it first, the scheduler's
 * copy-on-write); a pruned beam's slot releases its blocks in the same
 * step, before any fork. After a preemption the group recomputes every
 * live beam (the prompt's full blocks shared through the prefix cache when
 * it is on). A slot whose row is in waits (schedules nothing) until every
 * live beam's row is in; then the step selects. */
#ifndef PG_BEAM_SEARCH_H
#define PG_BEAM_SEARCH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "pg_error.h"

/* ---- the ranking: pure functions --------------------------------------- */

/* vLLM's get_beam_search_score: cum_logprob / pow(seq_len', length_penalty)
 * with seq_len' = seq_len - 1 when ends_eos (the last token is the eos id),
 * else seq_len. seq_len counts the prompt. */
double beam_score(double cum_logprob, int32_t seq_len, bool ends_eos, double length_penalty);

/* Stable descending order of n scores (Python's sorted(..., reverse=True):
 * equal scores keep their input order; NaN sorts as below everything):
 * order [n] gets the indices, scratch [n] is working room. */
void beam_sort_desc(const double *score, int32_t n, int32_t *order, int32_t *scratch);

/* One candidate of a step: parent beam (by rank), token and its logprob. */
typedef struct beam_cand {
    int32_t parent;         /* the parent's rank among the live beams */
    int32_t token;
    double cum_logprob;     /* the parent's + the token's */
} beam_cand;

/* One step's selection over cands [n_cands] listed as vLLM lists them
 * (parent rank order, then each parent's logprob order), all of length
 * seq_len (prompt + generated, this token included): the candidates whose
 * token is eos (and not ignore_eos) go to completed [*n_completed] in
 * listing order; of the others the first `width` by beam_score, stably,
 * go to live [*n_live] best first (indices into cands). eos < 0: none.
 * scratch: room for 3 * n_cands int32 and n_cands doubles. */
void beam_select(const beam_cand *cands, int32_t n_cands, int32_t seq_len, int32_t width,
                 int32_t eos, bool ignore_eos, double length_penalty, int32_t *live,
                 int32_t *n_live, int32_t *completed, int32_t *n_completed, int32_t *iscratch,
                 double *dscratch);

/* ---- the group: a beam request's state on the engine's sequences -------- */

typedef struct beam_group beam_group;
typedef struct request request;        /* core/sequence.h */
typedef struct kv_pool kv_pool;        /* core/kv_pool.h */
typedef struct tokenizer tokenizer;

/* Creates r's group (r->sp.use_beam_search, r->n = width slots): slot 0
 * live, the others idle (finished, no tokens past the prompt). eos < 0:
 * no eos. tok (borrowed, may be NULL: no text) decodes the outputs. On
 * error nothing is allocated. */
int beam_group_create(beam_group **out, request *r, int32_t eos, const tokenizer *tok,
                      pg_error *err);
void beam_group_destroy(beam_group *g); /* accepts NULL */

/* The logprobs row (pg_lsm_row with k = beam_group_k) of live slot q's
 * newest position: keeps its candidates. Called once per row the step
 * returns (again after a preemption's recomputation: the same values). */
void beam_group_take(beam_group *g, int32_t slot, const pg_lsm_row *lp);
/* The top entries a live slot's row must return: 2 * width, at most V. */
int32_t beam_group_k(const beam_group *g);

/* How a survivor that takes a free slot gets its parent's KV: shared
 * (copy == NULL: kv_pool_fork) or, for the bench's "without sharing" run,
 * fresh blocks that copy(ctx, src_dst pairs, n_pairs) fills at once
 * (engine_backend copy_blocks). */
typedef struct beam_kv {
    kv_pool *pool;
    int (*copy)(void *ctx, const int32_t *src_dst, int32_t n_pairs, pg_error *err);
    void *ctx;
} beam_kv;

/* Runs the step's selection when every live beam's candidates are in
 * (else returns at once): prunes (kv_pool_table_release), forks
 * (kv_pool_fork, or a copy: beam_kv), appends each survivor's token to
 * its slot; at max_output or with no live beam left, ranks the final list
 * and finishes the request (every table released, r->n_live = 0).
 * *n_new_tokens gets the tokens appended. An error (PG_ENOMEM, a copy
 * that finds the pool full: PG_ENOSPACE, the backend's) means the engine
 * must stop (state is mid-step). */
int beam_group_advance(beam_group *g, const beam_kv *kv, int32_t *n_new_tokens, pg_error *err);

/* Fills o->outputs (room for r->n) and o->n_outputs with the best beams,
 * best first (index = rank); a group not finished (engine_abort_all) is
 * ranked as it stands, its live beams with FINISH_ABORT. 0 or PG_ENOMEM. */
int beam_group_outputs(beam_group *g, request_output *o);

#endif /* PG_BEAM_SEARCH_H */
