/* cpu_pool: a small persistent pthread worker pool for the CPU executor.
 *
 * cpu_pool_run(pool, fn, ctx) calls fn(ctx, w, n) once for every worker
 * w = 0..n-1 (the calling thread is worker 0) and returns when all calls
 * have returned. Work is split statically: each op derives its own share
 * from (w, n) with cpu_pool_range, so which thread computes what is a pure
 * function of the problem size and n, never of timing. The ops of cpu/ are
 * written so that the *value* of every output element does not depend on
 * the split either (each element is computed entirely by one worker, in a
 * fixed order), which is what makes results independent of thread count.
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

/* Runs fn on min(n_workers, pool size) workers (n_workers <= 0: all), so a
 * small job can stay on the calling thread. fn gets the effective count. */
void cpu_pool_run(cpu_pool *pool, int32_t n_workers, cpu_pool_fn fn, void *ctx);

/* The static share [*lo, *hi) of n items for worker w of nw, in units of
 * `align` items (the last share takes the remainder). */
void cpu_pool_range(int64_t n, int32_t w, int32_t nw, int64_t align, int64_t *lo, int64_t *hi);

#endif /* PG_CPU_POOL_H */
