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
#include "pg_logsoftmax.h"
#include "pg_sample.h"
#include "sampling_params.h"
#include "step_batch.h"

typedef struct tokenizer tokenizer; /* tokenizer/tokenizer.h */

/* What the engine needs from a model (plain data; engine_create copies the
 * struct, ctx is borrowed and passed back to every call). Both functions
 * return 0 or a negative pg_status with err filled; the engine then fails
 * the step (engine_step returns it). */
/* Receives the logits of rows first .. first+n-1 of a step's logits_rows:
 * logits [n][vocab] f32 host, borrowed for the call. 0 or a negative
 * pg_status (with err filled), which stops the forward. */
typedef int (*engine_rows_fn)(void *ctx, int32_t first, int32_t n, const float *logits,
                              pg_error *err);

typedef struct engine_backend {
    void *ctx;
    int32_t vocab_size;          /* V: logits per row, and the valid token ids [0, V) */
    /* Runs the step: writes K/V of every token into its slot and, for each of
     * the b->num_logits rows of b->logits_rows in order, vocab_size f32
     * logits into logits [num_logits][vocab_size] (host memory owned by the
     * engine). b and its arrays are valid during the call only. */
    int (*forward)(void *ctx, const step_batch *b, float *logits, pg_error *err);
    /* Optional: the step of a request with prompt logprobs, whose
     * b->num_logits may be any number up to b->num_tokens (logits_rows
     * increasing): the rows' logits, bit for bit what forward gives for
     * each, arrive through sink in slices of at most slice_rows rows written
     * to buf [slice_rows][vocab_size] (model_forward_rows). NULL: such
     * requests prefill one token a step, the row of that token alone. */
    int (*forward_rows)(void *ctx, const step_batch *b, float *buf, int32_t slice_rows,
                        engine_rows_fn sink, void *sink_ctx, pg_error *err);
    /* Copies whole KV blocks src_dst[2k] -> src_dst[2k+1], k < n_pairs, in
     * every layer: copy-on-write before a shared, partly filled block is
     * written, which only parallel sampling (n > 1) causes (the prefix cache
     * shares full blocks only). May be NULL if no request has n > 1: a step
     * that needs a copy then fails with PG_EINVAL. */
    int (*copy_blocks)(void *ctx, const int32_t *src_dst, int32_t n_pairs, pg_error *err);
    /* Embedding requests (engine_add_embed_request) only; may be NULL
     * (they are then refused). Right after forward: the final-norm hidden
     * states of the step's token rows row0 .. row0+n-1 into out [n][hidden_size]
     * f32 (host). Each row is asked for at most once per step. */
    int (*hidden_rows)(void *ctx, int32_t row0, int32_t n, float *out, pg_error *err);
    int32_t hidden_size;         /* H of hidden_rows */
    /* Optional (NULL: every sampling row's logits come back, the CPU):
     * called right before a forward whose b->num_logits rows are all
     * sampling rows (no prompt logprobs in the step); for that forward
     * only, rows r < L with greedy[r] != 0 are not written to logits and
     * ids[r] gets their argmax (ties -> lowest id, NaN never wins: the
     * sampler's greedy rule, bit for bit; model_greedy_rows). The engine
     * marks only rows its sampler would take the plain argmax of: greedy
     * temperature, no logprobs, no penalties, no banned ids (min_tokens),
     * no grammar. Setting it to NULL turns the path off. */
    int (*greedy_rows)(void *ctx, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err);
    /* Optional (NULL: the rows come back and the engine computes their
     * logprobs, the CPU): called right before a forward or forward_rows
     * with its b->num_logits = L rows; for that forward only, rows r with
     * rows[r].want are not written to logits (nor to a forward_rows slice)
     * and rows[r] gets their log-softmax results (pg_lsm_row: the bits the
     * host's common/pg_logsoftmax.h gives; model_logprob_rows), filled by
     * the time the slice holding row r reaches the sink. The engine marks
     * its prompt-logprob rows (token: the next prompt token) and the
     * sampling rows of greedy requests with logprobs that are otherwise
     * plain (token -1: the argmax), and the rows it hands to sample_rows
     * whose requests want logprobs (token PG_LSM_SAMPLED: the drawn id,
     * which comes back in rows[r].token). No row is marked greedy as well.
     * rows is borrowed until the forward returns. NULL turns the path off
     * (and keeps sampled rows with logprobs on the host). */
    int (*logprob_rows)(void *ctx, pg_lsm_row *rows, int32_t L, pg_error *err);
    /* Optional (NULL: every sampled row comes back and the engine's sampler
     * reads it, the CPU): called right before a forward whose b->num_logits
     * = req->L rows are all sampling rows; for that forward only, rows
     * req->rows[q].row are not written to logits and req->ids[q] gets the
     * token sampled from them (common/pg_sample.h: the token the engine's
     * sampler gives, bit for bit; model_sample_rows). The engine hands
     * over the rows of single-sequence requests (an n > 1 group's once
     * forked) that are not plain greedy (those go to greedy_rows), a
     * grammar row with its mask (eos / stop ids let in where the text may
     * end); a row with logprobs only with logprob_rows, where it is marked
     * PG_LSM_SAMPLED too (a greedy one otherwise plain goes there alone);
     * no row is marked greedy as well. req is borrowed until the
     * forward returns; NULL clears it. NULL turns the path off. */
    int (*sample_rows)(void *ctx, const pg_smp_batch *req, pg_error *err);
    /* Optional, both or neither (NULL: every forward waits for its results,
     * the CPU): an asynchronous device. step_defer arms the next forward
     * (not forward_rows) to return once its work is queued: its logits rows,
     * greedy ids, logprob rows and sampled ids are written only when
     * step_wait returns (the buffers stay borrowed until then), and the
     * host arrays of its step_batch may be rewritten as soon as it returns
     * (the device copied them). step_wait waits for the armed forward and
     * writes its results; it fails with the forward's error if the device
     * work failed. No other backend call comes between the two. The engine
     * then runs the overlapped loop (engine_overlap.c): it schedules and
     * builds step N+1 between N's forward and N's step_wait. */
    int (*step_defer)(void *ctx, pg_error *err);
    int (*step_wait)(void *ctx, pg_error *err);
} engine_backend;

typedef enum kv_layout {
    KV_LAYOUT_PAGED = 0,      /* PagedAttention: blocks on demand */
    KV_LAYOUT_CONTIGUOUS,     /* baseline: ceil(max_model_len/block_size) blocks reserved
                                 at admission, never shared (bench/teaching mode) */
} kv_layout;

/* Plain data; engine_create copies it (eos ids included). */
typedef struct engine_params {
    int32_t block_size;              /* tokens per KV block, power of two in [1, 256]; default 16 */
    int32_t num_blocks;              /* KV pool size in blocks, [1, 2^28]; default 1024 */
    int32_t max_num_seqs;            /* sequences per step, >= 1; default 256 */
    int32_t max_num_batched_tokens;  /* token budget per step, >= 1; default 2048 */
    int32_t max_model_len;           /* context limit (prompt + output), >= 2; default 2048 */
    bool prefix_caching;             /* share full prompt blocks by content hash (paged
                                        layout only); default true */
    kv_layout layout;                /* default KV_LAYOUT_PAGED */
    bool check_invariants;           /* run the pool checker after every step (an
                                        inconsistency fails the step); default false */
    float watermark;                 /* admission watermark, a fraction of num_blocks in
                                        [0, 1) (vLLM's watermark): a waiting request is
                                        admitted only if, after its prompt's blocks (all its
                                        tokens' after a preemption), at least
                                        max(1, ceil(watermark * num_blocks)) blocks stay free
                                        or evictable, which leaves the running sequences
                                        room to grow instead of preempting one another at
                                        once. With nothing running the head request is
                                        admitted anyway. Paged layout only; 0 disables;
                                        default 0.01 */
    bool beam_copy_blocks;           /* beam search without sharing (bench and tests): a
                                        beam that takes a new slot gets fresh blocks with a
                                        copy of its parent's (backend copy_blocks) instead
                                        of forking its table; the same outputs, more blocks.
                                        The pool must hold it (else the step fails); default
                                        false */
    bool fan_out_always;             /* run every n > 1 request as n independent child
                                        requests, never as a forked group (benchmarks and
                                        tests; outputs are the same); default false */
    int32_t sliding_window;          /* the model's attention window W (config
                                        sliding_window): a query at position p reads keys
                                        p - W < j <= p only, so blocks wholly behind every
                                        query of a sequence are dropped from its table and
                                        freed (paged layout; scheduler.h). Must not exceed
                                        the model's window (the executor rejects a dropped
                                        block inside it). 0 (default): keep every block */
    bool prompt_logprobs_per_step;   /* the path before issue 21, for tests and the
                                        bench: a request with prompt logprobs prefills
                                        one token a step (its one logits row), instead
                                        of in chunks with every row of a chunk through
                                        backend forward_rows; the same values. Also
                                        taken when the backend has no forward_rows;
                                        default false */
    bool serial_loop;                /* never overlap the host's preparation of a step
                                        with the device's previous one, even over a backend
                                        with step_defer (PAGEDGEN_OVERLAP=off: the
                                        comparison); default false */
    const int32_t *eos_token_ids;    /* [n_eos_token_ids] ids in [0, vocab) that stop a
                                        sequence (unless ignore_eos); copied at create */
    int32_t n_eos_token_ids;         /* default 0: no eos */
    int32_t n_loras;                 /* LoRA adapters the backend holds (model_lora_add):
                                        a request's sampling_params.lora in 0 .. n_loras;
                                        default 0 */
    int32_t max_loras;               /* distinct adapters among the running requests, so in
                                        one step (vLLM's max_loras); a waiting request whose
                                        adapter would exceed it waits (scheduler.h); 0
                                        (default): no limit */
    int32_t beam_eos_token_id;       /* the one eos id of beam search (vLLM's tokenizer
                                        eos_token_id: beam_search.h), in [0, vocab) or -1
                                        (default): the first of eos_token_ids */
} engine_params;

/* The defaults above (no eos ids). */
engine_params engine_params_default(void);
/* The watermark in blocks for these params: max(1, ceil(watermark *
 * num_blocks)), 0 when the watermark is 0 or the layout is contiguous. */
int32_t engine_watermark_blocks(const engine_params *p);

typedef enum finish_reason {
    FINISH_NONE = 0,
    FINISH_STOP,     /* eos, a stop token id or a stop string */
    FINISH_LENGTH,   /* max_tokens or the context limit */
    FINISH_ABORT,    /* engine_abort_all (interrupted run) */
} finish_reason;

/* One generated sequence. Every pointer is owned by the request_output
 * (freed by request_output_free). */
typedef struct seq_output {
    int32_t index;               /* 0 .. n-1 (the sequence's RNG stream) */
    int32_t *token_ids;          /* [n_tokens] generated ids. A stopping eos id or
                                    stop_token_ids entry is the last one (vLLM v1); the
                                    tokens of a matched stop string are too (only the text
                                    is cut) */
    int32_t n_tokens;
    char *text;                  /* [text_len] detokenized output, NUL-terminated; cut before
                                    a matched stop string (after it with
                                    include_stop_str_in_output). NULL without a tokenizer */
    size_t text_len;
    finish_reason finish;        /* FINISH_ABORT for a sequence still running at
                                    engine_abort_all */
    int32_t stop_token_id;       /* the id that stopped it: an eos id or a stop_token_ids
                                    entry (FINISH_STOP); -1 otherwise (length, stop string,
                                    abort) */
    char *stop_str;              /* a copy of the stop string that matched, or NULL */
    /* logprobs, when the request asked for them (logprobs = k >= 0; else all
     * NULL and n_top 0), computed from the raw logits (sampler.h) */
    float *token_logprobs;       /* [n_tokens] logprob of each sampled token */
    int32_t *top_ids;            /* [n_tokens][n_top] best ids, best first */
    float *top_logprobs;         /* [n_tokens][n_top] their logprobs, descending */
    int32_t n_top;               /* k (rows hold -1 / 0 past min(k, vocab) entries) */
    /* beam search (sampling_params.use_beam_search): the beam's summed
     * logprobs (vLLM's cumulative_logprob); false / 0 otherwise */
    bool has_cumulative_logprob;
    double cumulative_logprob;
} seq_output;

/* A finished request, handed to the caller by engine_pop_finished. */
typedef struct request_output {
    uint64_t request_id;         /* as returned by engine_add_request */
    void *user;                  /* as given to engine_add_request (not touched) */
    int32_t n_prompt_tokens;
    int32_t n_outputs;           /* the request's n (beam search: the best beams, at most n) */
    seq_output *outputs;         /* [n_outputs], ordered by index (beam search: best
                                    first, index = rank); owned */
    /* wall-clock times since engine_add_request (only meaningful to
     * --metrics; never part of default output): to the first admission and
     * to the first sampled token (0 when it never got there), to the finish */
    double queue_ms, first_token_ms, total_ms;
    int32_t n_preemptions;       /* times the request was preempted (recomputed) */
    /* prompt logprobs (prompt_logprobs = k >= 0; else NULL and 0): entry
     * p > 0 is prompt token p's logprob given tokens 0..p-1, from the raw
     * logits; entry 0 has none (NaN, vLLM's None) */
    float *prompt_logprobs;      /* [n_prompt_tokens] */
    int32_t *prompt_ranks;       /* [n_prompt_tokens] 1 + the ids more likely than it */
    int32_t *prompt_top_ids;     /* [n_prompt_tokens][n_prompt_top], best first (-1 past V) */
    float *prompt_top_logprobs;  /* [n_prompt_tokens][n_prompt_top] */
    int32_t n_prompt_top;
    /* an embedding request (engine_add_embed_request): n_outputs 0 and the
     * pooled vector (pooling.h), NULL when aborted before its prompt was
     * computed; a generation request: NULL and 0 */
    float *embedding;            /* [n_embedding] */
    int32_t n_embedding;
} request_output;

/* Frees o and everything it points to. Accepts NULL. */
void request_output_free(request_output *o);

/* Counters since engine_create (engine_get_stats). */
typedef struct engine_stats {
    uint64_t steps;
    uint64_t prompt_tokens;          /* prompt tokens computed (incl. recomputation) */
    uint64_t generated_tokens;       /* tokens sampled (incl. stopping eos/stop ids) */
    uint64_t requests_finished;      /* incl. aborted ones */
    uint64_t preemptions;
    uint64_t prefix_cache_queries;   /* full prompt blocks looked up */
    uint64_t prefix_cache_hits;
    uint64_t cow_copies;
    /* the overlapped loop (engine_backend step_defer): steps scheduled and
     * built while the device ran the step before, and of those the ones
     * built again because that step ended a sequence scheduled in them;
     * 0 in the serial loop */
    uint64_t steps_ahead, steps_rebuilt;
    int32_t num_blocks;
    int32_t blocks_in_use;           /* now */
    int32_t blocks_in_use_peak;
    int32_t running, waiting;        /* requests now (a fanned-out request: its
                                        children, each counted) */
    int32_t peak_running_seqs;
    double kv_utilization;           /* filled slots / slots of allocated blocks, now */
    double kv_utilization_mean;      /* averaged over steps, weighted by blocks in use */
} engine_stats;

typedef struct engine engine;

/* Creates an engine over a backend. p and *backend are copied; backend->ctx
 * and tok are borrowed and must outlive the engine. tok may be NULL: then
 * outputs carry no text and stop strings are refused at engine_add_request.
 * Refused (PG_EINVAL, nothing allocated, *out NULL) for out-of-range params
 * or eos ids outside the vocabulary; PG_ENOMEM for the step buffers. */
int engine_create(engine **out, const engine_params *p, const engine_backend *backend,
                  const tokenizer *tok, pg_error *err);
/* Frees the engine with every request it still holds (queued, running, and
 * finished but not popped). Accepts NULL. */
void engine_destroy(engine *e);

/* Queues a request (FCFS: arrival order is call order). The prompt and the
 * params (stop ids and strings included) are copied; user is handed back in
 * the output. *request_id (may be NULL) gets its id: 0, 1, 2, ... over the
 * accepted requests. Refused with PG_EINVAL (nothing queued) when the prompt
 * is empty, holds ids outside the vocabulary, cannot fit max_model_len or
 * the whole pool, or the params are invalid; the message says which.
 * A prompt that fits but leaves less room than max_tokens is accepted and
 * finishes with FINISH_LENGTH at max_model_len (max_tokens is truncated to
 * the context; max_tokens = -1 means exactly that). Also refused: stop
 * strings without a tokenizer, stop ids outside the vocabulary, and a
 * request one of whose sequences alone (at its length cap) needs more KV
 * blocks than the pool has — it could never finish, so it is an error, not
 * a hang.
 *
 * Parallel sampling (n > 1), as vLLM v1 (vllm/v1/engine/parallel_sampling.py
 * at 003d3ee22261b7937258b7531aee00e10393f1d6): when the n sequences fit a
 * step and the free sequence slots at admission, they run as one group
 * that computes the prompt once and forks it (copy-on-write); otherwise
 * (n > min(max_num_seqs, max_num_batched_tokens), n sequences beyond the
 * pool at their longest, or — with the prefix cache — too few free slots)
 * the request runs as n child requests that share the prompt through the
 * prefix cache and are scheduled and preempted on their own. Either way
 * sequence i samples from RNG stream i, so the outputs are the same; the
 * request finishes when its last sequence does, outputs in index order.
 *
 * Beam search (sp->use_beam_search; core/beam_search.h): vLLM's algorithm
 * with n = the beam width, its n sequences beam slots whose block tables
 * fork (ref counts, copy-on-write); admitted and preempted as one group of
 * n slots, never fanned out. Refused: the contiguous layout, a width beyond
 * the sequences a step holds, and a group that could not fit the pool with
 * every beam on its own blocks (with the prefix cache: the prompt's full
 * blocks once). Outputs: the best beams, best first, with
 * cumulative_logprob; the eos is beam_eos_token_id.
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

/* Queues an embedding request (vLLM's "embed" pooling task): the prompt is
 * prefilled like any other (chunked, batched with generation, preempted
 * and recomputed), nothing is sampled, and the request finishes once its
 * last prompt token is computed, with request_output.embedding = the
 * pooled final-norm hidden states (pooling.h; pp copied). Needs the
 * backend's hidden_rows. MEAN and CLS pooling read the prompt's every row,
 * so such a request takes no prefix-cache hits. Refused like
 * engine_add_request (the prompt, the pool) and for invalid pp. */
typedef struct pooling_params pooling_params; /* core/pooling.h */
int engine_add_embed_request(engine *e, const int32_t *prompt_ids, int32_t n_prompt,
                             const pooling_params *pp, void *user, uint64_t *request_id,
                             pg_error *err);

/* Runs one step (no-op when nothing is queued). Finished requests become
 * available to engine_pop_finished. An error (from the backend, the
 * sampler, memory, or the invariant checker) is returned and the engine is
 * left mid-step: only engine_destroy (or engine_get_stats) may follow. */
int engine_step(engine *e, pg_error *err);

/* Requests added and not yet finished (waiting or running); finished ones
 * not yet popped do not count. */
bool engine_has_unfinished(const engine *e);
int32_t engine_num_unfinished(const engine *e);

/* Hands over the next finished request (in finishing order), or returns
 * false. The caller owns *out (request_output_free). */
bool engine_pop_finished(engine *e, request_output **out);

/* Finishes every unfinished request now (an interrupted run): sequences
 * that were still running get FINISH_ABORT with the tokens and text so far;
 * the outputs go to engine_pop_finished, running requests first. A request
 * whose output cannot be allocated is dropped. */
void engine_abort_all(engine *e);

/* Fills *s: the counters, and the pool and queue state now. */
void engine_get_stats(const engine *e, engine_stats *s);

/* --profile-steps: times every later step's phases into p (step_profile.h;
 * borrowed, NULL stops): schedule, metadata, the forward (split by what the
 * executor reports into p->cur), sample, output. The backend's executor
 * and model are given p by the caller (model_set_step_profile). Steps
 * that run nothing (all preempted) are not counted. */
typedef struct step_profile step_profile; /* core/step_profile.h */
void engine_set_step_profile(engine *e, step_profile *p);

/* ---- introspection (tests, fake backends, metrics) ----------------------- */
typedef struct kv_pool kv_pool; /* core/kv_pool.h */
/* The block pool (borrowed; valid until engine_destroy). */
const kv_pool *engine_kv_pool(const engine *e);
/* Inside backend->forward: for each of the step's b->num_seqs sequences,
 * (request_id << 8) | sequence index. Borrowed, valid during the step. */
const uint64_t *engine_step_seq_ids(const engine *e);
/* Inside backend->forward: the tokens (prompt then generated) of the
 * step's sequence s < b->num_seqs, *n of them. Borrowed, valid during the
 * step. A beam search slot's tokens change when it takes another beam
 * (beam_search.h): a fake backend follows them here. */
const int32_t *engine_step_seq_tokens(const engine *e, int32_t s, int32_t *n);
/* The waiting queue front to back (request ids; a fanned-out request's
 * waiting children each give its id), up to max; returns the total number
 * waiting. */
int32_t engine_waiting_ids(const engine *e, uint64_t *ids, int32_t max);

#endif /* PG_ENGINE_H */
