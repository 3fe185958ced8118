/* cpu_gemm: see cpu_gemm.h for the reduction-order contract and
 * cpu_gemm_kernel.c for the per-ISA kernels. This file only picks the
 * variant and splits columns across the pool.
 */
#include "cpu_gemm.h"

#include <assert.h>
#include <stddef.h>

#include "cpu_gemm_kernel.h"

/* Column shares are multiples of this (a multiple of every variant's
 * register tile width: 6, 3, 4), so only the last share has a partial tile;
 * GEMM_SPLIT_ALIGN_WIDE for M > GEMM_GEMV_ROWS, also a multiple of the
 * AVX2 lane-major path's 24-column w panel (cpu_gemm_kernel.c pk_cols).
 * It changes which thread computes a column, never the column's value. */
#define GEMM_SPLIT_ALIGN 12
#define GEMM_SPLIT_ALIGN_WIDE 24
#define GEMM_CHUNKS_PER_THREAD 4
#define GEMM_CHUNK_MIN_WORK 524288.0
/* A product of at most GEMM_GEMV_ROWS rows of x streams w once and is
 * bound by memory, not arithmetic: its chunks are cut by count, not by
 * work, GEMM_GEMV_CHUNKS_PER_THREAD per thread. With the work rule a
 * batch-1 qkv (2304 x 768) was 3 chunks for 2 threads, and whichever
 * thread took the third ran it alone while the other waited. */
#ifndef GEMM_GEMV_ROWS
#define GEMM_GEMV_ROWS 4
#endif
#ifndef GEMM_GEMV_CHUNKS_PER_THREAD
#define GEMM_GEMV_CHUNKS_PER_THREAD 16
#endif

int cpu_gemm_variant_available(cpu_gemm_variant v)
{
    switch (v) {
    case CPU_GEMM_AUTO:
    case CPU_GEMM_GENERIC:
        return 1;
#if defined(PG_GEMM_X86)
    case CPU_GEMM_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CPU_GEMM_AVX512:
        /* libgcc also checks that the OS saves the zmm state (XCR0) */
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
    case CPU_GEMM_AVX2:
    case CPU_GEMM_AVX512:
        return 0;
#endif
    case CPU_GEMM_VARIANT_COUNT:
        break;
    }
    return 0;
}

cpu_gemm_variant cpu_gemm_variant_best(void)
{
    if (cpu_gemm_variant_available(CPU_GEMM_AVX512))
        return CPU_GEMM_AVX512;
    if (cpu_gemm_variant_available(CPU_GEMM_AVX2))
        return CPU_GEMM_AVX2;
    return CPU_GEMM_GENERIC;
}

const char *cpu_gemm_variant_name(cpu_gemm_variant v)
{
    static const char *const names[CPU_GEMM_VARIANT_COUNT] = {"auto", "generic", "avx2", "avx512"};
    return (unsigned)v < CPU_GEMM_VARIANT_COUNT ? names[v] : NULL;
}

static cpu_gemm_cols_fn gemm_kernel(cpu_gemm_variant v)
{
    if (v == CPU_GEMM_AUTO)
        v = cpu_gemm_variant_best();
    assert(cpu_gemm_variant_available(v));
    switch (v) {
#if defined(PG_GEMM_X86)
    case CPU_GEMM_AVX512:
        return cpu_gemm_cols_avx512;
    case CPU_GEMM_AVX2:
        return cpu_gemm_cols_avx2;
#endif
    default:
        return cpu_gemm_cols_generic;
    }
}

int32_t cpu_gemm_lanes(void)
{
    return 16;
}

const char *cpu_gemm_isa(void)
{
    return cpu_gemm_variant_name(cpu_gemm_variant_best());
}

void cpu_gemm_cols(float *y, int64_t ldy, const float *x, const float *w,
                   int32_t M, int32_t K, int32_t n0, int32_t n1)
{
    gemm_kernel(CPU_GEMM_AUTO)(y, ldy, x, w, CPU_WT_F32, M, K, n0, n1);
}

/* The pool split (cpu_gemm_kernel.h): columns [n0, n1) per call. */
typedef struct cols_job {
    cpu_gemm_cols_task task;
    void *ctx;
    int32_t N;
    int32_t align; /* GEMM_SPLIT_ALIGN or GEMM_SPLIT_ALIGN_WIDE */
} cols_job;

static void cols_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const cols_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range(j->N, worker, n_workers, j->align, &lo, &hi);
    if (lo < hi)
        j->task(j->ctx, (int32_t)lo, (int32_t)hi);
}

void cpu_gemm_run_cols(cpu_pool *pool, int32_t M, int32_t N, int32_t K, cpu_gemm_cols_task task, void *ctx)
{
    cols_job job = {task, ctx, N, M > GEMM_GEMV_ROWS ? GEMM_SPLIT_ALIGN_WIDE : GEMM_SPLIT_ALIGN};
    /* Below ~64k multiply-adds a second thread costs more than it saves. */
    double work = (double)M * (double)N * (double)K;
    if (!pool || cpu_pool_size(pool) == 1 || work < 65536.0 || N < 2 * GEMM_SPLIT_ALIGN) {
        cols_worker(&job, 0, 1);
        return;
    }
    /* Up to GEMM_CHUNKS_PER_THREAD column chunks per thread, each of at
     * least GEMM_CHUNK_MIN_WORK multiply-adds (whole tiles; the split never
     * changes a value): a thread that runs late holds up only a small chunk
     * while the others take the rest, and a small product is not cut finer
     * than one chunk per thread. */
    const int64_t units = (N + job.align - 1) / job.align, threads = cpu_pool_size(pool);
    int64_t chunks = (int64_t)(work / GEMM_CHUNK_MIN_WORK);
    chunks = chunks < threads ? threads : chunks;
    chunks = chunks > threads * GEMM_CHUNKS_PER_THREAD ? threads * GEMM_CHUNKS_PER_THREAD : chunks;
    if (M <= GEMM_GEMV_ROWS)
        chunks = threads * GEMM_GEMV_CHUNKS_PER_THREAD;
    cpu_pool_run_chunks(pool, (int32_t)(chunks < units ? chunks : units), cols_worker, &job);
}

typedef struct gemm_job {
    cpu_gemm_cols_fn kernel;
    float *y;
    int64_t ldy;
    const float *x;
    const void *w;
    int32_t wt;
    int32_t M, K;
} gemm_job;

static void gemm_task(void *ctx, int32_t n0, int32_t n1)
{
    const gemm_job *j = ctx;
    j->kernel(j->y, j->ldy, j->x, j->w, j->wt, j->M, j->K, n0, n1);
}

void cpu_gemm_wt(cpu_gemm_variant v, cpu_wt wt, cpu_pool *pool, float *y, int64_t ldy, const float *x,
                 const void *w, int32_t M, int32_t N, int32_t K)
{
    gemm_job job = {gemm_kernel(v), y, ldy, x, w, (int32_t)wt, M, K};
    cpu_gemm_run_cols(pool, M, N, K, gemm_task, &job);
}

void cpu_gemm_with(cpu_gemm_variant v, cpu_pool *pool, float *y, int64_t ldy, const float *x,
                   const float *w, int32_t M, int32_t N, int32_t K)
{
    cpu_gemm_wt(v, CPU_WT_F32, pool, y, ldy, x, w, M, N, K);
}

void cpu_gemm(cpu_pool *pool, float *y, int64_t ldy, const float *x, const float *w,
              int32_t M, int32_t N, int32_t K)
{
    cpu_gemm_with(CPU_GEMM_AUTO, pool, y, ldy, x, w, M, N, K);
}
