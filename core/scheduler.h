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
/* Removes a running request whose sequences are all finished (their
 * tables already released). */
void scheduler_remove(scheduler *s, request *r);
/* Removes a waiting request (abort, teardown). */
void scheduler_remove_waiting(scheduler *s, request *r);

int32_t scheduler_num_running(const scheduler *s);
int32_t scheduler_num_waiting(const scheduler *s);
int32_t scheduler_running_seqs(const scheduler *s);
/* Queue heads for iteration via request->next (abort). */
request *scheduler_running(const scheduler *s);
request *scheduler_waiting(const scheduler *s);

#endif /* PG_SCHEDULER_H */
