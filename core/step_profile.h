/* step_profile: where a step's wall time goes (--profile-steps): the
 * engine's host phases on the host clock, the executor's own (the metadata
 * copy, waiting for the device, the copies back) where it reports them
 * (CUDA), each op's device time where it times them (CUDA events, eager
 * steps), and the kernel launches of one forward.
 *
 * Phases of one engine_step, disjoint, in the order they run:
 *   schedule   scheduler_schedule (and the admission bookkeeping)
 *   metadata   building the step_batch, the greedy / logprob row marks,
 *              handing copy-on-write pairs to the backend
 *   h2d        executor: checking and packing the step's metadata, queueing
 *              its host -> device copy (a graph step: the fixed buffers')
 *   launch     the rest of the forward call on the host: model.c's op
 *              calls and the kernels they queue, or a graph replay
 *   ahead      the overlapped loop (engine_overlap.c): scheduling and
 *              building the next step while the device runs this one —
 *              host time taken out of the wait below (0 in the serial loop)
 *   wait       executor: waiting for the device to finish the step
 *   d2h        executor: ids, logprob results and logits rows out of
 *              pinned memory into the engine's buffers
 *   sample     host sampling of the rows the device did not take
 *   output     forks, stop checks, detokenization, retiring requests
 * An executor that reports nothing (the CPU) leaves h2d, wait and d2h at 0:
 * its whole forward is "launch" (the arithmetic itself).
 *
 * Owned by its creator (the CLI); the engine, the model and the executor
 * borrow it (engine_set_step_profile, model_set_step_profile,
 * executor_ops.set_step_profile). One thread, like engine_step.
 */
#ifndef PG_STEP_PROFILE_H
#define PG_STEP_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "op_profile.h"

typedef enum step_phase {
    SP_SCHEDULE = 0,
    SP_METADATA,
    SP_H2D,
    SP_LAUNCH,
    SP_AHEAD,
    SP_WAIT,
    SP_D2H,
    SP_SAMPLE,
    SP_OUTPUT,
    SP_COUNT
} step_phase;

typedef struct step_profile {
    /* per step kind (OPP_PREFILL: some sequence has more than one query
     * token; OPP_DECODE: a pure decode step) */
    double phase_s[OPP_KINDS][SP_COUNT]; /* summed over the steps */
    double step_s[OPP_KINDS];            /* engine_step's wall time, whole */
    int64_t steps[OPP_KINDS];
    int64_t seqs[OPP_KINDS];             /* sequences in those steps */
    /* the step being run: its kind (set by the engine before the forward)
     * and the executor's phases of it (zeroed by the engine, added to by
     * the executor: only SP_H2D, SP_WAIT and SP_D2H) */
    int kind;
    double cur[SP_COUNT];
    /* device time of each op (OPP_*), summed over layers and steps, of the
     * steps whose ops were timed (eager steps; graph replays are not) */
    double op_dev_ms[OPP_KINDS][OPP_COUNT];
    int64_t op_marks[OPP_KINDS][OPP_COUNT]; /* times each op was timed: an op the
                                             * model never runs prints no line */
    int64_t op_steps[OPP_KINDS];
    int64_t graph_steps[OPP_KINDS];      /* steps run as one graph replay */
    /* kernel launches of the last forward run op by op (eager, a graph's
     * warm-up or capture) of each kind; -1: none seen */
    int64_t launches[OPP_KINDS];
    int32_t n_layers;                    /* of the model (for the per-layer figures) */
} step_profile;

/* Zeroes p; launches -1. */
void step_profile_init(step_profile *p, int32_t n_layers);

/* Monotonic wall clock in seconds. */
double step_profile_now(void);

/* The phase's printed name ("schedule", ...). */
const char *step_profile_phase_name(step_phase ph);

/* Adds the time since t0 (step_profile_now) to the current step's phase ph
 * (p->cur); nothing when p is NULL. For executors. */
void step_profile_add(step_profile *p, step_phase ph, double t0);

/* Writes, per kind with steps: the steps, mean sequences per step and
 * wall ms per step; each phase's ms per step and share of the step; the
 * rest of the step (the time between the phases: loop overhead); then,
 * where ops were timed on the device, each op's us per step and per layer;
 * and one line `kernel launches per decode step: N (L layers)` (N is
 * "n/a" when no decode forward ran op by op on a device: the cpu). */
void step_profile_print(const step_profile *p, FILE *f, const char *prefix);

#endif /* PG_STEP_PROFILE_H */
