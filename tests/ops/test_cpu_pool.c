/* test_cpu_pool: the CPU executor's thread pool (cpu/cpu_pool.c). Every
 * chunk of every job runs exactly once, with the right (w, n), its writes
 * are visible to the caller when cpu_pool_run returns, jobs follow each
 * other without leaking chunks into the next one (many short jobs in a row,
 * chunk counts above and below the pool size, with more threads than
 * cores so that workers run late and the caller claims their chunks), and
 * the chunk a thread runs never depends on which thread runs it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_pool.h"
#include "test_support.h"

#define MAX_CHUNKS 64

typedef struct count_job {
    int32_t expect_n;
    uint32_t job_id;
    atomic_int runs[MAX_CHUNKS];  /* times chunk w ran */
    uint32_t stamp[MAX_CHUNKS];   /* plain write by the chunk: job_id */
    atomic_int bad_n;             /* calls with n != expect_n or w out of range */
} count_job;

static void count_fn(void *ctx, int32_t w, int32_t n)
{
    count_job *j = ctx;
    if (n != j->expect_n || w < 0 || w >= n || w >= MAX_CHUNKS) {
        atomic_fetch_add(&j->bad_n, 1);
        return;
    }
    /* a little work, longer for later chunks, so that chunks finish out of
     * order and a worker is often still busy when the caller runs out of
     * chunks to claim (the caller must then wait for it) */
    volatile uint32_t spin = 0;
    for (int32_t i = 0; i < 64 * (w % 8); i++)
        spin += (uint32_t)i;
    j->stamp[w] = j->job_id;
    atomic_fetch_add(&j->runs[w], 1);
}

static void run_jobs(cpu_pool *pool, int chunked, int32_t n_jobs, pg_test_rng *rng)
{
    static count_job job; /* large-ish; reused, reset per job */
    for (int32_t it = 0; it < n_jobs; it++) {
        const int32_t want = pg_test_rng_int(rng, 1, chunked ? MAX_CHUNKS : cpu_pool_size(pool) + 2);
        const int32_t n = chunked ? want : (want > cpu_pool_size(pool) ? cpu_pool_size(pool) : want);
        job.expect_n = n;
        job.job_id = (uint32_t)it + 1;
        atomic_store(&job.bad_n, 0);
        for (int32_t w = 0; w < MAX_CHUNKS; w++) {
            atomic_store(&job.runs[w], 0);
            job.stamp[w] = 0;
        }
        if (chunked)
            cpu_pool_run_chunks(pool, n, count_fn, &job);
        else
            cpu_pool_run(pool, want, count_fn, &job);
        assert_int_equal(atomic_load(&job.bad_n), 0);
        for (int32_t w = 0; w < MAX_CHUNKS; w++) {
            const int expect_runs = w < n ? 1 : 0;
            if (atomic_load(&job.runs[w]) != expect_runs)
                fail_msg("pool of %d, job %d with %d chunks: chunk %d ran %d times", (int)cpu_pool_size(pool),
                         (int)it, (int)n, (int)w, atomic_load(&job.runs[w]));
            if (w < n && job.stamp[w] != job.job_id)
                fail_msg("pool of %d, job %d: chunk %d's write is not visible after cpu_pool_run", (int)cpu_pool_size(pool),
                         (int)it, (int)w);
        }
    }
}

static void test_every_chunk_once(void **state)
{
    (void)state;
    pg_test_rng rng = {5};
    /* 1 thread (no workers), 2, and 5 (more threads than this machine's
     * cores: workers are often not scheduled when a job is published) */
    const int32_t sizes[] = {1, 2, 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cpu_pool *pool = NULL;
        assert_int_equal(cpu_pool_create(&pool, sizes[i], NULL), 0);
        assert_int_equal(cpu_pool_size(pool), sizes[i]);
        run_jobs(pool, 0, 8000, &rng);
        run_jobs(pool, 1, 8000, &rng);
        cpu_pool_destroy(pool);
    }
}

static void test_create_errors(void **state)
{
    (void)state;
    cpu_pool *pool = (cpu_pool *)&pool;
    pg_error err = {{0}};
    assert_int_equal(cpu_pool_create(&pool, 0, &err), PG_EINVAL);
    assert_null(pool);
    assert_non_null(strstr(err.msg, "threads"));
    cpu_pool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_once),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
