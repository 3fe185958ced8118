/* cuda_step_profile: --profile-steps on the CUDA executor (core/step_profile.h,
 * executor.h set_step_profile / op_mark). The executor keeps one of these
 * (created at the first set_step_profile) and calls, besides the host
 * phase hooks (step_profile_add around its metadata copy, its waits and its
 * copies out):
 *   cuda_sprof_mark    for every op_mark of the forward: an event recorded
 *                      on the stream at each mark of a forward run op by op
 *                      outside a graph (eager), the launch count of any
 *                      forward (eager, a graph's warm-up or capture);
 *   cuda_sprof_step_done at the end of run_step: the device time between
 *                      consecutive marks becomes the op's (after waiting
 *                      for the last event: counted as SP_WAIT), or, when no
 *                      eager forward ran, the step counts as a graph replay.
 * Plain C over the CUDA runtime (no kernels). Not thread-safe: one executor,
 * one thread.
 */
#ifndef PG_CUDA_STEP_PROFILE_H
#define PG_CUDA_STEP_PROFILE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "pg_error.h"
#include "step_profile.h"

typedef struct cuda_sprof cuda_sprof;

/* Points *s at p (creating *s at the first call; p NULL stops profiling
 * and keeps *s for a later one). PG_ENOMEM when it cannot be created. */
int cuda_sprof_set(cuda_sprof **s, step_profile *p);
/* The profile in use, or NULL (s may be NULL). */
step_profile *cuda_sprof_profile(const cuda_sprof *s);
/* An op_mark (op = -1: the forward's start) on stream st; bound: the
 * forward is a graph's warm-up or capture (no events then); launches: the
 * executor's device work queued so far (cuda_executor_launch_counts'
 * total), read as a difference from the forward's start. Errors of the
 * runtime end the timing of this step (reported nowhere: profiling never
 * fails a step). */
void cuda_sprof_mark(cuda_sprof *s, int op, cudaStream_t st, int bound, uint64_t launches);
/* The end of a run_step that returned rc. */
void cuda_sprof_step_done(cuda_sprof *s, int rc);
void cuda_sprof_destroy(cuda_sprof *s); /* accepts NULL */

#endif /* PG_CUDA_STEP_PROFILE_H */
