/* sequence: the engine's state for one request and its n sequences
 * (vLLM's Request / Sequence; nano-vllm's Sequence). Internal to core/:
 * shared by the scheduler and the engine, not part of the public API.
 *
 * A sequence's tokens are prompt + generated ids; num_computed of them have
 * their K/V in the sequence's block table. The scheduler computes tokens
 * num_computed .. target-1; a sequence samples when all its tokens are
 * computed. Preemption drops the KV (num_computed = 0) and keeps tokens,
 * RNG and text, so recomputation resumes exactly where it stopped.
 *
 * Parallel sampling (n > 1, paged layout): until the prompt is computed
 * ("not forked") only the leader (first live sequence) runs, computing just
 * the prompt; then every live sequence forks the leader's table (shared
 * blocks, copy-on-write on divergence) and continues with its own tokens.
 * After a preemption the request forks again the same way.
 */
#ifndef PG_SEQUENCE_H
#define PG_SEQUENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"
#include "sampling_params.h"

typedef struct tok_stream tok_stream;
typedef struct request request;

typedef struct sequence {
    request *req;
    int32_t index;              /* 0 .. n-1 (RNG stream and output order) */
    int32_t *tokens;            /* [cap] prompt then generated ids */
    int32_t n_tokens, cap;
    int32_t num_computed;       /* tokens whose K/V are in the table */
    int32_t table;              /* kv_pool table handle */
    sampler_rng rng;
    bool finished;
    finish_reason finish;
    int32_t stop_token_id;      /* the eos id or stop_token_ids entry that stopped it, or -1 */
    int32_t stop_str;           /* index into the request's stop strings, or -1 */
    /* text (only with a tokenizer) */
    tok_stream *ts;
    char *text;
    size_t text_len, text_cap;
    /* logprobs (when requested): per generated token */
    float *lp;                  /* [n generated] */
    int32_t *top_ids;           /* [n generated][n_top] */
    float *top_lp;              /* [n generated][n_top] */
    int32_t lp_cap;
} sequence;

struct request {
    uint64_t id;
    void *user;
    sampling_params sp;         /* deep copy: stop ids and strings owned below */
    int32_t *stop_ids;          /* [sp.n_stop_token_ids] */
    char **stops;               /* [sp.n_stop] */
    int32_t *banned;            /* eos (unless ignore_eos) + stop ids: min_tokens mask */
    int32_t n_banned;
    int32_t *prompt;            /* [n_prompt] */
    int32_t n_prompt;
    int32_t max_output;         /* max_tokens truncated to the context */
    int32_t n_top;              /* logprobs k, or 0 */
    /* prompt logprobs (sp.prompt_logprobs >= 0): [n_prompt] (+ [n_prompt][n_ptop]),
     * entry p filled when the prompt's position p-1 was computed */
    float *plp;
    int32_t *p_rank, *p_top_ids;
    float *p_top_lp;
    int32_t n_ptop;
    sequence *seqs;             /* [n] */
    int32_t n, n_live;
    bool forked;                /* the live sequences run on their own */
    int32_t n_preemptions;
    uint64_t arrival;           /* arrival order (FCFS) */
    double t_arrival_ms, t_first_admit_ms, t_first_token_ms;
    bool admitted_once, sampled_once;
    bool retiring;              /* all sequences finished; being handed out */
    request *prev, *next;       /* links in the scheduler's queues */
};

/* Creates a request with n sequences, copying prompt and params. tok may be
 * NULL. eos ids are borrowed. On error nothing is left allocated. */
int request_create(request **out, uint64_t id, const int32_t *prompt, int32_t n_prompt,
                   const sampling_params *sp, int32_t max_model_len, const int32_t *eos_ids,
                   int32_t n_eos, const tokenizer *tok, void *user, pg_error *err);
void request_destroy(request *r); /* accepts NULL */

/* The first live sequence (the leader before a fork), or NULL. */
sequence *request_leader(request *r);
/* The number of tokens sequence s should have computed when this request is
 * fully scheduled: the prompt for the leader before a fork with n_live > 1,
 * 0 for the other sequences then, else all of its tokens. */
int32_t request_seq_target(const request *r, const sequence *s, bool shared_prompt);

/* Appends a sampled token with its logprobs (res may be NULL without
 * logprobs), feeding the text stream. Returns 0 or an error. */
int sequence_append(sequence *s, int32_t id, const sampler_result *res, pg_error *err);
/* Applies the stop rules to a freshly sampled id (vLLM order: length cap,
 * eos, stop ids; stop strings override): appends it (a stopping eos/stop
 * id too, as vLLM v1 does: its text only with include_stop_str_in_output),
 * and marks the sequence finished when a rule fires. eos ids
 * borrowed. Returns 0 or an error. */
int sequence_accept(sequence *s, int32_t id, const sampler_result *res, const int32_t *eos_ids,
                    int32_t n_eos, pg_error *err);

/* Builds the output of a finished (or aborted) request. NULL on OOM. */
request_output *request_make_output(const request *r, double now_ms);

#endif /* PG_SEQUENCE_H */
