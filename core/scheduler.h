/* scheduler: which tokens of which sequences run in the next step (vLLM
 * v1's Scheduler with one token budget; nano-vllm's check-then-commit).
 *
 * Per step: running requests first, in admission order — each live
 * sequence gets its next tokens (one decode token, or the next chunk of a
 * prefill) while the token budget lasts; then waiting requests are admitted
 * strictly in arrival order while blocks, the budget and max_num_seqs
 * allow (no request overtakes an earlier one; a prompt longer than the
 * remaining budget is prefilled in chunks over several steps).
 *
 * Admission watermark (vLLM's BlockSpaceManager watermark): with paged KV,
 * a waiting request (new or preempted) is admitted only if, after its
 * whole prompt's blocks (or, for a preempted one, all its tokens' blocks)
 * were taken, at least watermark_blocks blocks would remain free or
 * evictable. Admitting eagerly until the pool is exactly full leaves no
 * room for the running sequences' decode growth, so the next steps preempt
 * (and recompute) again and again. When nothing is running the head
 * request is admitted whenever its first chunk fits, so a request needing
 * almost the whole pool still runs (no hang). 0 disables the watermark.
 *
 * Prefix blocks are shared within a step: as soon as a sequence's block
 * holds only tokens scheduled this step or earlier, it is committed to the
 * prefix cache (kv_pool_commit) — after every sequence of its request got
 * its blocks, so an undone schedule never leaves an unwritten block in the
 * cache — and a request admitted later in the same step finds it: it skips
 * those tokens and its attention reads them after the layer's kv_write.
 * Blocks past a chunk's end are not committed (a chunk cut by the budget is
 * also the last thing scheduled in its step).
 *
 * Parallel sampling (n > 1): a request whose live sequences fit
 * max_num_seqs (and the free sequence slots, or without the prefix cache)
 * is admitted as one group: the leader computes the prompt and the others
 * fork its blocks (sequence.h). Otherwise (n > max_num_seqs, a request the
 * engine marked must_fan_out, or too few free slots with the prefix cache
 * on) the head request is split into one child request per live sequence
 * (request_fan_out), in its place in the queue, and each child is admitted,
 * scheduled and preempted on its own like vLLM v1's child requests; the
 * children admitted in one step share the prompt's full blocks through the
 * same-step prefix sharing below.
 *
 * Sliding window (sliding_window = W > 0, paged layout; vLLM's
 * SlidingWindowManager): a query at position p reads keys p - W + 1 .. p
 * only, so before anything is allocated in a step every running sequence
 * drops the blocks wholly below num_computed - W + 1 (its lowest query this
 * step and ever after) from its table (kv_pool_drop_before); an admitted
 * request drops those below its first computed token likewise. The
 * allocations of the step then see those blocks free: a windowed sequence
 * holds about ceil(W / block_size) + 1 blocks plus its chunk, however long
 * it grows, and more sequences run without preemption. A preempted
 * sequence recomputes from position 0 (it gets fresh blocks, or prefix-cache
 * hits whose every block is still cached).
 *
 * LoRA adapters (engine_params max_loras, vLLM's max_loras): the running
 * requests use at most max_loras distinct adapters (the base model counts
 * none), so every step does. The waiting head whose adapter would be one
 * too many waits — strict FCFS, as every admission here (vLLM v1 lets
 * later requests pass it) — until a running request of another adapter
 * finishes or is preempted; with nothing running it is always admitted,
 * so it never waits forever. Prefix-cache lookups are keyed by the
 * adapter (kv_pool_match_prefix_key).
 *
 * Preemption by recomputation: when a running sequence needs a block and
 * the pool has none free or evictable, the most recently admitted running
 * request (possibly the one being served) is preempted as a whole: its
 * blocks are released (full ones stay in the prefix cache), its sequences'
 * computed counts drop to 0, it goes to the front of the waiting queue, and
 * no request is admitted in that step.
 */
#ifndef PG_SCHEDULER_H
#define PG_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "kv_pool.h"
#include "pg_error.h"
#include "sequence.h"

typedef struct scheduler scheduler;

typedef struct scheduler_params {
    int32_t max_num_seqs;            /* sequences in one step (>= 1) */
    int32_t max_num_batched_tokens;  /* token budget of one step (>= 1) */
    int32_t max_model_len;           /* contiguous reservations */
    kv_layout layout;
    bool prefix_caching;             /* count prefix-cache queries */
    int32_t watermark_blocks;        /* blocks kept free at admission (paged); 0: none */
    bool plp_one_per_step;           /* prompt logprobs prefill one token a step
                                        (engine_params prompt_logprobs_per_step) */
    int32_t sliding_window;          /* W > 0: drop blocks behind every query's window
                                        (paged); 0: keep every block */
    int32_t max_loras;               /* distinct LoRA adapters among running requests
                                        (engine_params max_loras); 0: no limit */
} scheduler_params;

/* One scheduled sequence: tokens seq->num_computed .. + n_new - 1. */
typedef struct sched_entry {
    sequence *seq;
    int32_t n_new;
    bool samples;       /* its last scheduled token is its last token */
} sched_entry;

typedef struct sched_step {
    sched_entry *entries;      /* [n_entries], running then newly admitted */
    int32_t n_entries;
    int32_t *cow;              /* [n_cow][2] copy-on-write block pairs (src, dst) */
    int32_t n_cow;
    int32_t n_tokens;
    int32_t n_preempted;       /* requests preempted while scheduling */
    int32_t n_admitted;
    uint64_t prefix_queries;   /* full blocks looked up at admission */
    uint64_t prefix_hits;
} sched_step;

/* pool is borrowed. */
int scheduler_create(scheduler **out, const scheduler_params *p, kv_pool *pool, pg_error *err);
void scheduler_destroy(scheduler *s); /* accepts NULL; does not free requests */

/* Appends to the waiting queue (the request's tables must be empty). */
void scheduler_add(scheduler *s, request *r);
/* Decides the next step. The returned arrays are owned by the scheduler and
 * valid until the next call. Errors only on OOM. */
int scheduler_schedule(scheduler *s, sched_step *out, pg_error *err);
/* Removes a running request (or child) whose sequences are all finished (their
 * tables already released). */
void scheduler_remove(scheduler *s, request *r);
/* Removes a waiting request (abort, teardown). */
void scheduler_remove_waiting(scheduler *s, request *r);
/* Removes a request whose sequences are all finished from the queue it is
 * in: running, or waiting when the engine's overlapped loop preempted it
 * while scheduling the next step before its last token arrived
 * (engine_overlap.c). O(waiting) when it is running. */
void scheduler_remove_either(scheduler *s, request *r);

int32_t scheduler_num_running(const scheduler *s);
int32_t scheduler_num_waiting(const scheduler *s);
int32_t scheduler_running_seqs(const scheduler *s);
/* Queue heads for iteration via request->next (abort). */
request *scheduler_running(const scheduler *s);
request *scheduler_waiting(const scheduler *s);

#endif /* PG_SCHEDULER_H */
