/* cpu_pool: see cpu_pool.h.
 *
 * Dispatch: a job is n fixed chunks (chunk w is fn(ctx, w, n)), dealt into
 * one queue per thread (thread t's static share, pool_share; the caller is
 * thread 0). The caller fills the queue words, bumps the generation under
 * the mutex and broadcasts; each worker spins briefly on the generation
 * (steps come in quick succession, and a futex wake costs tens of
 * microseconds), then sleeps on the condition variable. Every thread, the
 * caller included, runs its own queue from the front and then steals from
 * the back of the others' (one compare-and-swap per chunk), so a worker the
 * OS has not scheduled yet (a loaded machine) delays nothing, while on an
 * idle machine every thread runs its own share job after job (cache
 * affinity, as with a purely static split). Which thread runs a chunk is
 * timing; what the chunk computes is not (the split is static, and every
 * output is written by exactly one chunk). Completion is an atomic count of
 * finished chunks the caller spins on (then yields).
 */
#include "cpu_pool.h"

#include <assert.h>
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

/* A queue word: the chunks [next, end) of one thread's static share of the
 * current job, tagged with the job's generation: generation (bits 32..63),
 * end (16..31), next (0..15). A compare-and-swap takes a chunk from the
 * front (the owner) or the back (a thief) and proves, in the same step,
 * which job the chunk belongs to. One word per cache line. */
#define POOL_GEN(s) ((uint32_t)((s) >> 32))
#define POOL_END(s) ((int32_t)(((s) >> 16) & 0xffff))
#define POOL_NEXT(s) ((int32_t)((s)&0xffff))
#define POOL_WORD(gen, end, next) (((uint64_t)(gen) << 32) | ((uint64_t)(end) << 16) | (uint64_t)(next))

typedef struct pool_queue {
    _Atomic uint64_t word;
    char pad[64 - sizeof(uint64_t)];
} pool_queue;

struct cpu_pool {
    int32_t n_threads;
    cpu_pool_worker *workers; /* [n_threads - 1], worker i+1 */
    int32_t n_started;
    pool_queue *queues;       /* [n_threads], 64-byte aligned; thread 0 = the caller */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint32_t generation; /* of the current job; bumped under mu to wake workers */
    atomic_int done;             /* chunks of the current job finished */
    int stop;                    /* under mu */

    /* The current job: written by the caller before it publishes the queue
     * words, read by a thread only after it has claimed a chunk of that job
     * (and the caller does not start another job before every chunk is
     * done, so they cannot change under a claimed chunk). */
    cpu_pool_fn fn;
    void *ctx;
    int32_t n_chunks;
};

/* Thread t's static share of n chunks: chunk t when n <= T (the layout of
 * one chunk per thread), else a contiguous run, so that on an idle machine
 * every thread runs the same chunks job after job (its share of the weights
 * stays in its own cache). */
static void pool_share(int32_t n, int32_t T, int32_t t, int32_t *lo, int32_t *hi)
{
    if (n <= T) {
        *lo = t < n ? t : n;
        *hi = t < n ? t + 1 : n;
    } else {
        *lo = (int32_t)((int64_t)t * n / T);
        *hi = (int32_t)((int64_t)(t + 1) * n / T);
    }
}

/* Takes one chunk of job gen from q: from the front when q is the claiming
 * thread's own queue, from the back when stealing. 0 when q is empty or
 * holds another job. */
static int pool_claim(pool_queue *q, uint32_t gen, int own, int32_t *chunk)
{
    uint64_t s = atomic_load_explicit(&q->word, memory_order_acquire);
    for (;;) {
        if (POOL_GEN(s) != gen || POOL_NEXT(s) >= POOL_END(s))
            return 0;
        /* next + 1, or end - 1 (next < end <= 0xffff: no borrow or carry) */
        const uint64_t claimed = own ? s + 1 : s - ((uint64_t)1 << 16);
        if (atomic_compare_exchange_weak_explicit(&q->word, &s, claimed, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *chunk = own ? POOL_NEXT(s) : POOL_END(s) - 1;
            return 1;
        }
    }
}

/* Thread self runs chunks of job gen: its own share first, then whatever
 * the others have not started (a thread the OS has not scheduled yet delays
 * nothing). Returns when no queue has a chunk of job gen left. */
static void pool_work(cpu_pool *pool, int32_t self, uint32_t gen)
{
    const int32_t T = pool->n_threads;
    for (int32_t k = 0; k < T; k++) {
        pool_queue *q = &pool->queues[(self + k) % T];
        int32_t c;
        while (pool_claim(q, gen, k == 0, &c)) {
            pool->fn(pool->ctx, c, pool->n_chunks);
            atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        }
    }
}

static void *cpu_pool_main(void *arg)
{
    cpu_pool_worker *self = arg;
    cpu_pool *pool = self->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
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
        pool_work(pool, self->index, gen);
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
    atomic_init(&pool->done, 0);
    pool->queues = aligned_alloc(64, (size_t)n_threads * sizeof *pool->queues);
    if (!pool->queues) {
        cpu_pool_destroy(pool);
        return pg_error_set(err, PG_ENOMEM, "cpu_pool: out of memory");
    }
    for (int32_t t = 0; t < n_threads; t++)
        atomic_init(&pool->queues[t].word, POOL_WORD(0, 0, 0));
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
    free(pool->queues);
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
    cpu_pool_run_chunks(pool, n_workers, fn, ctx);
}

void cpu_pool_run_chunks(cpu_pool *pool, int32_t n_chunks, cpu_pool_fn fn, void *ctx)
{
    assert(n_chunks >= 1 && n_chunks <= CPU_POOL_MAX_CHUNKS);
    if (n_chunks == 1 || pool->n_started == 0) {
        for (int32_t w = 0; w < n_chunks; w++)
            fn(ctx, w, n_chunks);
        return;
    }
    const int32_t n_workers = n_chunks;
    /* every chunk of the previous job is done: no thread holds a claim */
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_chunks = n_workers;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    const uint32_t gen = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
    for (int32_t t = 0; t < pool->n_threads; t++) {
        int32_t lo, hi;
        pool_share(n_workers, pool->n_threads, t, &lo, &hi);
        atomic_store_explicit(&pool->queues[t].word, POOL_WORD(gen, hi, lo), memory_order_release);
    }
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->generation, gen, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);

    /* the caller is thread 0: its share, then anything not yet started */
    pool_work(pool, 0, gen);

    const int64_t t0 = pool_now_ns();
    int spinning = 1;
    for (int spin = 0; atomic_load_explicit(&pool->done, memory_order_acquire) < n_workers; spin++) {
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
