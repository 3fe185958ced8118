/* engine: the step loop. Owns requests, sequences, the block pool and the
 * scheduler; each engine_step() asks the scheduler what runs, builds the
 * ragged step_batch, calls the backend's forward, samples, appends, checks
 * stop conditions and frees finished sequences.
 *
 * The backend is what turns a step_batch into logits: the real one is
 * core/model.c over an executor (model_backend()); tests use a fake one.
 *
 * Outputs are a pure function of (model, prompt, sampling params): they do
 * not depend on batch composition, preemption, pool size or thread count.
 */
#ifndef PG_ENGINE_H
#define PG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"
#include "sampling_params.h"
#include "step_batch.h"

typedef struct tokenizer tokenizer; /* weights/tokenizer.h */

/* What the engine needs from a model. */
typedef struct engine_backend {
    void *ctx;
    int32_t vocab_size;
    /* Runs the step; writes b->num_logits rows of vocab_size f32 logits. */
    int (*forward)(void *ctx, const step_batch *b, float *logits, pg_error *err);
    /* Copies KV blocks src_dst[2k] -> src_dst[2k+1] in every layer (CoW). */
    int (*copy_blocks)(void *ctx, const int32_t *src_dst, int32_t n_pairs, pg_error *err);
} engine_backend;

typedef enum kv_layout {
    KV_LAYOUT_PAGED = 0,      /* PagedAttention: blocks on demand */
    KV_LAYOUT_CONTIGUOUS,     /* baseline: ceil(max_model_len/block_size) blocks reserved
                                 at admission, never shared (bench/teaching mode) */
} kv_layout;

typedef struct engine_params {
    int32_t block_size;              /* power of two in [1, 256]; default 16 */
    int32_t num_blocks;              /* KV pool size in blocks */
    int32_t max_num_seqs;            /* default 256 */
    int32_t max_num_batched_tokens;  /* token budget per step; default 2048 */
    int32_t max_model_len;           /* context limit (prompt + output) */
    bool prefix_caching;             /* default true */
    kv_layout layout;
    bool check_invariants;           /* run the pool checker after every step */
    const int32_t *eos_token_ids;    /* borrowed for the engine's lifetime */
    int32_t n_eos_token_ids;
} engine_params;

engine_params engine_params_default(void);

typedef enum finish_reason {
    FINISH_NONE = 0,
    FINISH_STOP,     /* eos, a stop token id or a stop string */
    FINISH_LENGTH,   /* max_tokens or the context limit */
    FINISH_ABORT,    /* engine_abort_all (interrupted run) */
} finish_reason;

/* One generated sequence. All arrays owned by the request_output. */
typedef struct seq_output {
    int32_t index;               /* 0 .. n-1 */
    int32_t *token_ids;          /* [n_tokens] generated ids (a stopping eos is not included;
                                    a stop token id from stop_token_ids is not included) */
    int32_t n_tokens;
    char *text;                  /* detokenized output (NULL without a tokenizer) */
    size_t text_len;
    finish_reason finish;
    int32_t stop_token_id;       /* the id that stopped it (an eos id or a stop_token_ids
                                    entry), or -1 */
    char *stop_str;              /* the stop string that matched, or NULL */
    /* logprobs (when requested, logprobs = k >= 0): per generated token */
    float *token_logprobs;       /* [n_tokens] logprob of the sampled token */
    int32_t *top_ids;            /* [n_tokens][k] */
    float *top_logprobs;         /* [n_tokens][k] */
    int32_t n_top;               /* k */
} seq_output;

typedef struct request_output {
    uint64_t request_id;         /* as returned by engine_add_request */
    void *user;                  /* as given to engine_add_request */
    int32_t n_prompt_tokens;
    int32_t n_outputs;
    seq_output *outputs;         /* [n_outputs], ordered by index */
    /* timings (only meaningful to --metrics; never part of default output) */
    double queue_ms, first_token_ms, total_ms;
    int32_t n_preemptions;
} request_output;

void request_output_free(request_output *o); /* accepts NULL */

typedef struct engine_stats {
    uint64_t steps;
    uint64_t prompt_tokens;          /* prompt tokens computed (incl. recomputation) */
    uint64_t generated_tokens;
    uint64_t requests_finished;
    uint64_t preemptions;
    uint64_t prefix_cache_queries;   /* full prompt blocks looked up */
    uint64_t prefix_cache_hits;
    uint64_t cow_copies;
    int32_t num_blocks;
    int32_t blocks_in_use;           /* now */
    int32_t blocks_in_use_peak;
    int32_t running, waiting;        /* requests now */
    int32_t peak_running_seqs;
    double kv_utilization;           /* filled slots / slots of allocated blocks, now */
    double kv_utilization_mean;      /* averaged over steps, weighted by blocks in use */
} engine_stats;

typedef struct engine engine;

/* tok may be NULL: then outputs carry no text and stop strings are refused
 * at engine_add_request. The engine borrows backend and tok. */
int engine_create(engine **out, const engine_params *p, const engine_backend *backend,
                  const tokenizer *tok, pg_error *err);
void engine_destroy(engine *e); /* accepts NULL */

/* Queues a request (FCFS: arrival order is call order). The prompt and the
 * params are copied. Refused with PG_EINVAL (nothing queued) when the prompt
 * is empty, holds ids outside the vocabulary, cannot fit max_model_len or
 * the whole pool, or the params are invalid; the message says which.
 * A prompt that fits but leaves less room than max_tokens is accepted and
 * finishes with FINISH_LENGTH at max_model_len (max_tokens is truncated to
 * the context; max_tokens = -1 means exactly that). Also refused: n larger
 * than a step can hold (min(max_num_seqs, max_num_batched_tokens)), stop
 * strings without a tokenizer, stop ids outside the vocabulary, and a
 * request whose worst case (every sequence at its length cap; the prompt's
 * full blocks shared by the n sequences) needs more KV blocks than the
 * pool has — it could never finish, so it is an error, not a hang.
 *
 * Stop rules, in vLLM v1's order, after each sampled token: the length cap
 * (max_tokens or the context: FINISH_LENGTH, the token is kept); an eos id
 * (unless ignore_eos) or a stop_token_ids entry (FINISH_STOP, the token is
 * not kept, stop_token_id names it); then stop strings on the text (only
 * past min_tokens; FINISH_STOP, stop_str names it, the text is cut before it
 * or after it with include_stop_str_in_output, the token ids are kept) — a
 * stop string found on the length-capping token still wins. Before
 * min_tokens, eos and stop ids are masked in sampling. */
int engine_add_request(engine *e, const int32_t *prompt_ids, int32_t n_prompt,
                       const sampling_params *sp, void *user, uint64_t *request_id,
                       pg_error *err);

/* Runs one step (no-op when nothing is queued). Finished requests become
 * available to engine_pop_finished. An error from the backend is returned
 * and the engine should be destroyed. */
int engine_step(engine *e, pg_error *err);

bool engine_has_unfinished(const engine *e);
int32_t engine_num_unfinished(const engine *e);

/* Hands over the next finished request (in finishing order), or returns
 * false. The caller owns *out (request_output_free). */
bool engine_pop_finished(engine *e, request_output **out);

/* Finishes every unfinished request with FINISH_ABORT (outputs so far). */
void engine_abort_all(engine *e);

void engine_get_stats(const engine *e, engine_stats *s);

/* ---- introspection (tests, fake backends, metrics) ----------------------- */
typedef struct kv_pool kv_pool; /* core/kv_pool.h */
/* The block pool (borrowed; valid until engine_destroy). */
const kv_pool *engine_kv_pool(const engine *e);
/* Inside backend->forward: for each of the step's b->num_seqs sequences,
 * (request_id << 8) | sequence index. Borrowed, valid during the step. */
const uint64_t *engine_step_seq_ids(const engine *e);
/* The waiting queue front to back (request ids), up to max; returns the
 * total number waiting. */
int32_t engine_waiting_ids(const engine *e, uint64_t *ids, int32_t max);

#endif /* PG_ENGINE_H */
