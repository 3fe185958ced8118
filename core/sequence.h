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
 *
 * Fan-out (vLLM v1's ParentRequest, vllm/v1/engine/parallel_sampling.py at
 * 003d3ee22261b7937258b7531aee00e10393f1d6): when the n sequences cannot run
 * together — n > max_num_seqs, a pool too small for all of them at once, or
 * (with the prefix cache) too few free sequence slots at admission — the
 * scheduler splits the waiting request into one child request per live
 * sequence (request_fan_out). A child is a shell (n = 1) that runs the
 * parent's sequence seqs[i] in place: same index, RNG stream, tokens, text
 * and sequence id, so its output is byte for byte the one the fork gives.
 * Children share the prompt through the prefix cache and are scheduled,
 * preempted and retired on their own; the parent sits in no queue, collects
 * nothing but the finished sequences in its own seqs[] (so the output is
 * in index order) and is handed out when its last child retires.
 */
#ifndef PG_SEQUENCE_H
#define PG_SEQUENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "grammar.h"
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
    grammar_state gst;          /* structured outputs: the automaton after the generated
                                   tokens (host state: kept across preemption, which
                                   re-computes KV but samples nothing again) */
    int32_t n_placeholder;      /* 1 while the last token is a placeholder for an id the
                                   device has not returned yet (the engine's overlapped
                                   loop, engine_overlap.c: scheduled ahead, never
                                   committed to the prefix cache, never fed); else 0 */
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
    /* an embedding request (engine_add_embed_request): its pooler, and the
     * pooled vector once the prompt is computed (handed to the output) */
    struct pooler *pooler;      /* owned, or NULL: a generation request */
    float *embedding;           /* [n_embedding] owned, NULL until finished */
    int32_t n_embedding;
    int32_t plp_from;           /* sp.prompt_logprobs_from: entries before it are not computed */
    grammar *gram;              /* structured outputs constraint, or NULL; borrowed from */
    grammar_cache *gcache;      /* the engine's shared compile (gentry, released by the */
    void *gentry;               /* engine when the request is destroyed) */
    sequence *seqs;             /* [n] */
    int32_t n, n_live;
    bool forked;                /* the live sequences run on their own */
    int32_t n_preemptions;
    uint64_t arrival;           /* arrival order (FCFS) */
    double t_arrival_ms, t_first_admit_ms, t_first_token_ms;
    bool admitted_once, sampled_once;
    bool retiring;              /* all sequences finished; being handed out */
    /* fan-out (see the top of this file) */
    request *parent;            /* a child: its parent (the fields above are a shallow
                                   copy of the parent's; seqs points into parent->seqs;
                                   the child owns only itself). Request-level state that
                                   changes while running (timing, n_preemptions, prompt
                                   logprobs, ...) must be written to request_root(r), or
                                   a child's write is lost with its shell */
    int32_t n_children;         /* a fanned-out parent: children not yet retired */
    bool fanned_out;            /* a parent whose live sequences run as children */
    bool must_fan_out;          /* the n sequences can never run together (engine) */
    struct beam_group *beam;    /* sp.use_beam_search: the group over the n slots
                                   (beam_search.h; owned), else NULL. Never forked
                                   the n > 1 way nor fanned out */
    request *prev, *next;       /* links in the scheduler's queues */
};

/* Creates a request with n sequences, copying prompt and params. tok may be
 * NULL. eos ids are borrowed. On error nothing is left allocated. */
int request_create(request **out, uint64_t id, const int32_t *prompt, int32_t n_prompt,
                   const sampling_params *sp, int32_t max_model_len, const int32_t *eos_ids,
                   int32_t n_eos, const tokenizer *tok, void *user, pg_error *err);
/* Frees r and everything it owns (a child: only itself). Accepts NULL. */
void request_destroy(request *r);

/* The request that owns the output: r's parent for a child, else r. */
static inline request *request_root(request *r) { return r->parent ? r->parent : r; }

/* Splits r (waiting, every table empty, not a child) into one child per
 * live sequence, in index order, written to children (room for r->n);
 * *n_children gets their count. r becomes a fanned-out parent. Per-sequence
 * state stays in r->seqs[i]: a child has no state of its own to copy.
 * Hook for per-sequence sampling state (e.g. a structured-output grammar
 * state): keep it in sequence, initialised for every sequence at
 * request_create (not only the leader's, copied at the fork), and a child
 * runs its own. PG_ENOMEM: nothing changed. */
int request_fan_out(request *r, request **children, int32_t *n_children);

/* Sequence slots r holds in a step: a beam group all of its n (its beams
 * grow from 1 to n without a new admission), else its live ones. */
static inline int32_t request_seq_slots(const request *r) { return r->beam ? r->n : r->n_live; }

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

/* The overlapped loop (engine_overlap.c): appends a placeholder token
 * (-1, n_placeholder = 1) so the scheduler gives s its next decode row
 * before the id of the step in flight is known; pop takes it off again
 * before that id is accepted. Nothing else (text, logprobs, stop rules)
 * sees a placeholder. PG_ENOMEM: nothing changed. */
int sequence_push_placeholder(sequence *s, pg_error *err);
void sequence_pop_placeholder(sequence *s);

/* Finishes s now for a reason outside the stop rules (a structured-output
 * automaton that can only end: FINISH_STOP, or a dead end: FINISH_ABORT);
 * flushes its text. Returns 0 or an error. */
int sequence_finish(sequence *s, finish_reason why, pg_error *err);

/* Builds the output of a finished (or aborted) request. NULL on OOM. */
request_output *request_make_output(const request *r, double now_ms);

#endif /* PG_SEQUENCE_H */
