/* engine_phase: the phases of one engine step, internal to core/ — what
 * engine.c's serial loop runs in a row and engine_overlap.c interleaves
 * with the device (schedule and build step N+1 while step N runs).
 *
 *   schedule  scheduler_schedule, the step's counters, admission times
 *   build     the step_batch into the engine's step arrays (valid until the
 *             next build; the backend may keep no pointer into them past
 *             its forward)
 *   launch    copy-on-write copies, the device-row marks (greedy, sampled,
 *             logprob rows: they read the sequences' sampled ids, so they
 *             come after the step before has finished), the forward
 *             (armed with step_defer when async), then num_computed moves
 *             past the step's tokens
 *   finish    after the forward's results are in: pooling, forks, sampling,
 *             stop rules, retiring finished requests
 *   end       peaks and the invariant checker
 */
#ifndef PG_ENGINE_PHASE_H
#define PG_ENGINE_PHASE_H

#include <stdbool.h>

#include "engine.h"
#include "kv_pool.h"
#include "scheduler.h"
#include "step_profile.h"

/* --profile-steps bookkeeping of one engine_step call (inert without a
 * step profile). */
typedef struct step_timer {
    double ph[SP_COUNT];
    double t_step, t;
} step_timer;

void engine_timer_start(engine *e, step_timer *tm);
/* The time since the last lap into phase `which`. */
void engine_timer_lap(engine *e, step_timer *tm, step_phase which);
/* Adds the executor's own phases of the last call (step_profile cur:
 * h2d, wait, d2h) to tm and zeroes them; returns their sum. */
double engine_timer_take_exec(engine *e, step_timer *tm);
/* Records the call as one step of batch b's kind. */
void engine_timer_done(engine *e, step_timer *tm, const step_batch *b);

int engine_phase_schedule(engine *e, sched_step *st, step_timer *tm, pg_error *err);
void engine_phase_build(engine *e, const sched_step *st, step_batch *b);
/* *async (NULL: false) asks to arm the backend's step_defer first (the
 * results then come with step_wait); set to whether it did: a step with
 * prompt logprob rows in slices (forward_rows) always waits. */
int engine_phase_launch(engine *e, const sched_step *st, const step_batch *b, bool *async,
                        step_timer *tm, pg_error *err);
/* A step built ahead (b from engine_phase_build over st, rows unchanged
 * since): each entry's last token re-read from its sequence — the id that
 * replaced the placeholder it was built with. */
void engine_phase_patch(engine *e, const sched_step *st, const step_batch *b);
/* next (may be NULL): a step scheduled ahead (engine_overlap.c), whose
 * entries of sequences this step finished are removed before their
 * requests are retired (*n_dropped gets how many); the requests this step
 * retires are taken out of whichever queue holds them (a preemption while
 * scheduling next may have moved them to the waiting queue). */
int engine_phase_finish(engine *e, const sched_step *st, const step_batch *b, sched_step *next,
                        int32_t *n_dropped, step_timer *tm, pg_error *err);
int engine_phase_end(engine *e, pg_error *err);

/* The pool and the backend, for engine_overlap.c. */
kv_pool *engine_phase_pool(engine *e);
const engine_backend *engine_phase_backend(const engine *e);
int32_t engine_phase_max_seqs(const engine *e);
/* Whether the step's finish needs the build arrays of its own step (prompt
 * logprob rows, embedding rows: the overlapped loop builds no step ahead of
 * it), or forks a group right after its prompt (the forked sequences'
 * first rows depend on the fork). */
bool engine_phase_needs_serial(const engine *e, const sched_step *st);
/* The counters of the overlapped loop: a step built ahead, or (rebuilt)
 * one built again after the step before ended a sequence in it. */
void engine_phase_count_ahead(engine *e, bool rebuilt);

/* The overlapped loop (engine_overlap.c). */
typedef struct engine_overlap engine_overlap;
int engine_overlap_create(engine_overlap **out, int32_t max_seqs, pg_error *err);
void engine_overlap_destroy(engine_overlap *ov);
/* engine_step in the overlapped order: finishes one step per call. */
int engine_overlap_step(engine_overlap *ov, engine *e, pg_error *err);
/* Teardown: waits for a step still in flight (its results are dropped). */
void engine_overlap_drain(engine_overlap *ov, engine *e);

#endif /* PG_ENGINE_PHASE_H */
