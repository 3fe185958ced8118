/* cpu_pool: see cpu_pool.h.
 *
 * Dispatch: the caller bumps a generation counter under the mutex and
 * broadcasts; each worker spins briefly on the counter (steps come in quick
 * succession, and a futex wake costs tens of microseconds), then sleeps on
 * the condition variable. Completion is an atomic countdown the caller
 * spins on (then yields).
 */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* How long a worker spins for the next job, and the caller for the
 * workers, before sleeping / yielding (a pause costs 10 to 140 cycles
 * depending on the core, so the budget is in time, not iterations). */
#define CPU_POOL_SPIN_NS 100000

static int64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct cpu_pool_worker {
    cpu_pool *pool;
    int32_t index;
    pthread_t thread;
} cpu_pool_worker;

struct cpu_pool {
    int32_t n_threads;
    cpu_pool_worker *workers; /* [n_threads - 1], worker i+1 */
    int32_t n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t generation; /* bumped for every job */
    atomic_int pending;             /* workers still running the job */
    int stop;                       /* under mu */

    /* the current job (written before generation is bumped) */
    cpu_pool_fn fn;
    void *ctx;
    int32_t job_workers;
};

static void *cpu_pool_main(void *arg)
{
    cpu_pool_worker *self = arg;
    cpu_pool *pool = self->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (gen == seen) {
            const int64_t t0 = pool_now_ns();
            for (int spin = 0; gen == seen; spin++) {
                pool_pause();
                gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
                if ((spin & 63) == 63 && pool_now_ns() - t0 > CPU_POOL_SPIN_NS)
                    break;
            }
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->mu);
            while (!pool->stop &&
                   (gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool->cv, &pool->mu);
            int stop = pool->stop;
            pthread_mutex_unlock(&pool->mu);
            if (stop)
                return NULL;
        }
        seen = gen;
        if (self->index < pool->job_workers)
            pool->fn(pool->ctx, self->index, pool->job_workers);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

int cpu_pool_create(cpu_pool **out, int32_t n_threads, pg_error *err)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return pg_error_set(err, PG_EINVAL, "cpu_pool: expected 1..1024 threads, got %d", (int)n_threads);
    cpu_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return pg_error_set(err, PG_ENOMEM, "cpu_pool: out of memory");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)(n_threads - 1), sizeof *pool->workers);
        if (!pool->workers) {
            cpu_pool_destroy(pool);
            return pg_error_set(err, PG_ENOMEM, "cpu_pool: out of memory");
        }
        for (int32_t i = 0; i < n_threads - 1; i++) {
            pool->workers[i].pool = pool;
            pool->workers[i].index = i + 1;
            if (pthread_create(&pool->workers[i].thread, NULL, cpu_pool_main, &pool->workers[i]) != 0) {
                cpu_pool_destroy(pool);
                return pg_error_set(err, PG_ENOMEM, "cpu_pool: pthread_create failed for worker %d of %d",
                                    (int)(i + 1), (int)n_threads);
            }
            pool->n_started++;
        }
    }
    *out = pool;
    return PG_OK;
}

void cpu_pool_destroy(cpu_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    free(pool->workers);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

int32_t cpu_pool_size(const cpu_pool *pool)
{
    return pool->n_threads;
}

void cpu_pool_run(cpu_pool *pool, int32_t n_workers, cpu_pool_fn fn, void *ctx)
{
    if (n_workers <= 0 || n_workers > pool->n_threads)
        n_workers = pool->n_threads;
    if (n_workers == 1 || pool->n_started == 0) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->job_workers = n_workers;
    /* every started worker acknowledges the job, even if it has no share */
    atomic_store_explicit(&pool->pending, pool->n_started, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);

    fn(ctx, 0, n_workers);

    const int64_t t0 = pool_now_ns();
    int spinning = 1;
    for (int spin = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spin++) {
        if (spinning) {
            pool_pause();
            if ((spin & 63) == 63 && pool_now_ns() - t0 > CPU_POOL_SPIN_NS)
                spinning = 0;
        } else {
            sched_yield();
        }
    }
}

void cpu_pool_range(int64_t n, int32_t w, int32_t nw, int64_t align, int64_t *lo, int64_t *hi)
{
    if (align < 1)
        align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t per = units / nw, extra = units % nw;
    int64_t u0 = (int64_t)w * per + (w < extra ? w : extra);
    int64_t u1 = u0 + per + (w < extra ? 1 : 0);
    int64_t a = u0 * align, b = u1 * align;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}
