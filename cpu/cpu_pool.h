/* cpu_pool: a small persistent pthread worker pool for the CPU executor.
 *
 * cpu_pool_run(pool, fn, ctx) calls fn(ctx, w, n) once for every chunk
 * w = 0..n-1 and returns when all calls have returned. Each chunk runs on
 * whichever thread of the pool claims it first, the calling thread
 * included (so a worker the OS has not scheduled on a loaded machine
 * delays nothing: the caller runs its chunk); no two threads run the same
 * chunk, so per-chunk scratch indexed by w is private to that call. Work
 * is split statically: each op derives its share from (w, n) with
 * cpu_pool_range, so what chunk w computes is a pure function of the
 * problem size and n, never of timing or of the thread that runs it. The
 * ops of cpu/ are written so that the *value* of every output element does
 * not depend on the split either (each element is computed entirely by one
 * chunk, in a fixed order), which is what makes results independent of
 * thread count.
 *
 * Not reentrant: one cpu_pool_run at a time, from the thread that created
 * the pool (or any single thread).
 */
#ifndef PG_CPU_POOL_H
#define PG_CPU_POOL_H

#include <stdint.h>

#include "pg_error.h"

typedef struct cpu_pool cpu_pool;

typedef void (*cpu_pool_fn)(void *ctx, int32_t worker, int32_t n_workers);

/* n_threads >= 1 workers in all (n_threads - 1 pthreads are started). */
int cpu_pool_create(cpu_pool **out, int32_t n_threads, pg_error *err);
void cpu_pool_destroy(cpu_pool *pool); /* accepts NULL */
int32_t cpu_pool_size(const cpu_pool *pool);

/* Runs fn on n = min(n_workers, pool size) chunks (n_workers <= 0: pool
 * size), so a small job can stay on the calling thread (n = 1). fn gets the
 * effective count n. */
void cpu_pool_run(cpu_pool *pool, int32_t n_workers, cpu_pool_fn fn, void *ctx);

/* Runs fn on n_chunks chunks (1..CPU_POOL_MAX_CHUNKS), however many threads
 * the pool has: finer chunks than threads balance the load when some
 * threads run late (a preempted thread holds only a small chunk). For ops
 * without per-thread scratch (a chunk index may exceed the pool size). */
#define CPU_POOL_MAX_CHUNKS 65535
void cpu_pool_run_chunks(cpu_pool *pool, int32_t n_chunks, cpu_pool_fn fn, void *ctx);

/* The static share [*lo, *hi) of n items for worker w of nw, in units of
 * `align` items (the last share takes the remainder). */
void cpu_pool_range(int64_t n, int32_t w, int32_t nw, int64_t align, int64_t *lo, int64_t *hi);

#endif /* PG_CPU_POOL_H */
