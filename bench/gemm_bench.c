/* gemm_bench: the CPU executor's GEMM (cpu/cpu_gemm.c) against OpenBLAS on
 * the 110m model's shapes, with the machine's ceiling beside the figures.
 *
 *   gemm_bench [threads]      (default: all online cores, for both)
 *   gemm_bench [threads] --bf16-mode
 *                             (only the bf16 matmul mode's section, below)
 *
 * Prints, per shape (N, K) and batch M in {1, 8, 32, 64, 128, 256}:
 * GFLOP/s of cpu_gemm, of cblas_sgemm and (M = 1) of cblas_sgemv, and
 * cpu_gemm as a fraction of the measured sgemm peak (a large square
 * product). At M = 1 it also prints GB/s of weight streamed. Then whether
 * OpenBLAS itself is batch-invariant here (row 0 of an M = 64 sgemm vs the
 * same row alone through sgemm and through sgemv), which is why pagedgen
 * does not use it for its matmuls. Fixed seed, warm-up, best of timed
 * repetitions within ~0.3 s per point.
 *
 * --bf16-mode (issue 20): per shape and M in {1, 16, 64, 256}, GFLOP/s of
 * the exact product on f32 weights (cpu_gemm), the exact product on bf16
 * weights (cpu_gemm_wt CPU_WT_BF16) and the bf16 mode (cpu_gemm_mode:
 * activations rounded to bf16, VDPBF16PS's order, cpu_gemm_modes.h), each
 * the best of five interleaved rounds, with the ratios, the mode as a
 * fraction of the sgemm ceiling, and at M = 1 the weight GB/s (2 bytes per
 * weight: GB/s = GFLOP/s). With threads = 1 it times thread CPU time
 * (bfb_clock), which a loaded machine disturbs less than wall time.
 */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_gemm.h"
#include "cpu_gemm_modes.h"
#include "cpu_pool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float *rand_buf(size_t n, uint64_t *state)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(*state >> 40) / (double)(1ull << 24)) - 0.5f;
    }
    return p;
}

typedef enum { IMPL_MINE, IMPL_SGEMM, IMPL_SGEMV } impl;

static void run_once(impl which, cpu_pool *pool, float *y, const float *x, const float *w, int M, int N, int K)
{
    switch (which) {
    case IMPL_MINE:
        cpu_gemm(pool, y, N, x, w, M, N, K);
        break;
    case IMPL_SGEMM:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
        break;
    case IMPL_SGEMV:
        for (int m = 0; m < M; m++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w, K, x + (size_t)m * K, 1, 0.0f,
                        y + (size_t)m * N, 1);
        break;
    }
}

/* GFLOP/s: warm-up, then the best of repetitions within ~0.3 s */
static double gflops(impl which, cpu_pool *pool, float *y, const float *x, const float *w, int M, int N, int K)
{
    run_once(which, pool, y, x, w, M, N, K);
    double best = 1e30, start = now_s();
    int reps = 0;
    do {
        double t0 = now_s();
        int inner = 0;
        double t;
        do {
            run_once(which, pool, y, x, w, M, N, K);
            inner++;
        } while ((t = now_s() - t0) < 0.02);
        if (t / inner < best)
            best = t / inner;
        reps++;
    } while (now_s() - start < 0.3 || reps < 3);
    return 2.0 * M * N * K / best * 1e-9;
}

/* ---- the bf16 matmul mode vs the exact products (--bf16-mode) ---------- */

typedef enum { BFB_EXACT_F32, BFB_EXACT_BF16, BFB_MODE_BF16, BFB_COUNT } bfb_impl;

typedef struct bfb_operands {
    cpu_pool *pool;
    float *y;               /* [M][N] */
    const float *x;         /* [M][K] */
    const float *w;         /* [N][K] f32 */
    const uint16_t *wb;     /* [N][K] bf16 (w rounded) */
    void *scratch;          /* cpu_gemm_mode_scratch_bytes(bf16, 256, K) */
    int M, N, K;
} bfb_operands;

static void bfb_run(bfb_impl which, const bfb_operands *o)
{
    switch (which) {
    case BFB_EXACT_F32:
        cpu_gemm(o->pool, o->y, o->N, o->x, o->w, o->M, o->N, o->K);
        break;
    case BFB_EXACT_BF16:
        cpu_gemm_wt(CPU_GEMM_AUTO, CPU_WT_BF16, o->pool, o->y, o->N, o->x, o->wb, o->M, o->N, o->K);
        break;
    case BFB_MODE_BF16:
        cpu_gemm_mode(CPU_MATMUL_BF16, CPU_GEMM_AUTO, CPU_WT_BF16, o->pool, o->y, o->N, o->x, o->wb, o->M, o->N, o->K,
                      o->scratch);
        break;
    case BFB_COUNT:
        break;
    }
}

/* With one thread every product runs on the calling thread (cpu_pool of 1),
 * so the section can time this thread's CPU time, which excludes the time
 * it waits descheduled on a loaded machine (not cache or SMT-sibling
 * interference). With more threads: wall time. */
static double bfb_clock(int thread_cpu)
{
    if (!thread_cpu)
        return now_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* seconds per product: the best of repetitions within ~0.1 s (one round) */
static double bfb_round(bfb_impl which, const bfb_operands *o, int thread_cpu)
{
    bfb_run(which, o);
    double best = 1e30, start = bfb_clock(thread_cpu);
    do {
        double t0 = bfb_clock(thread_cpu), t;
        int inner = 0;
        do {
            bfb_run(which, o);
            inner++;
        } while ((t = bfb_clock(thread_cpu) - t0) < 0.01);
        if (t / inner < best)
            best = t / inner;
    } while (bfb_clock(thread_cpu) - start < 0.1);
    return best;
}

static void bench_bf16_mode(cpu_pool *pool, int threads, uint64_t *seed)
{
    /* the ceiling, on the section's clock: a 2048^3 sgemm (OpenBLAS runs
     * on the calling thread when it has one) */
    double peak;
    {
        const int P = 2048;
        float *pa = rand_buf((size_t)P * P, seed), *pb = rand_buf((size_t)P * P, seed);
        float *pc = rand_buf((size_t)P * P, seed);
        double best = 1e30;
        for (int r = 0; r < 4; r++) {
            const double t0 = bfb_clock(threads == 1);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, P, 1.0f, pa, P, pb, P, 0.0f, pc, P);
            const double t = bfb_clock(threads == 1) - t0;
            best = t < best ? t : best;
        }
        peak = 2.0 * P * P * P / best * 1e-9;
        printf("ceiling: OpenBLAS sgemm %dx%dx%d = %.1f GFLOP/s (f32 FMA; on AVX2 the bf16 mode has no faster "
               "instruction)\n", P, P, P, peak);
        free(pa);
        free(pb);
        free(pc);
    }
    const struct { const char *name; int N, K; } shapes[] = {
        {"o", 768, 768}, {"qkv", 2304, 768}, {"gate_up", 4096, 768}, {"down", 768, 2048}, {"lm_head", 32000, 768},
    };
    const int Ms[] = {1, 16, 64, 256};
    printf("bf16 matmul mode (cpu_gemm_modes.h), %d threads, kernels %s; GFLOP/s (%s), best of 5 interleaved "
           "rounds\n", threads, cpu_gemm_isa(), threads == 1 ? "thread CPU time" : "wall time");
    printf("%-8s %5s %5s %4s | %9s %9s %9s | %9s %9s %6s | %s\n", "shape", "N", "K", "M", "exact f32", "exact bf16",
           "bf16 mode", "mode/f32", "mode/bf16", "/peak", "M=1 weight GB/s (exact bf16, mode)");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        float *w = rand_buf((size_t)N * K, seed), *x = rand_buf((size_t)256 * K, seed);
        float *y = rand_buf((size_t)256 * N, seed);
        uint16_t *wb = aligned_alloc(64, ((size_t)N * K * sizeof *wb + 63) / 64 * 64);
        const size_t scratch_bytes = cpu_gemm_mode_scratch_bytes(CPU_MATMUL_BF16, 256, K);
        void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
        if (!wb || !scratch) {
            fprintf(stderr, "gemm_bench: out of memory\n");
            exit(1);
        }
        cpu_bf16_round_rows(wb, w, (int64_t)N * K);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            bfb_operands o = {pool, y, x, w, wb, scratch, Ms[mi], N, K};
            double best[BFB_COUNT] = {1e30, 1e30, 1e30};
            for (int round = 0; round < 5; round++)
                for (int i = 0; i < BFB_COUNT; i++) {
                    const double t = bfb_round((bfb_impl)i, &o, threads == 1);
                    if (t < best[i])
                        best[i] = t;
                }
            double g[BFB_COUNT];
            for (int i = 0; i < BFB_COUNT; i++)
                g[i] = 2.0 * o.M * N * K / best[i] * 1e-9;
            printf("%-8s %5d %5d %4d | %9.1f %9.1f %9.1f | %8.2fx %8.2fx %5.0f%% |", shapes[s].name, N, K, o.M,
                   g[BFB_EXACT_F32], g[BFB_EXACT_BF16], g[BFB_MODE_BF16], g[BFB_MODE_BF16] / g[BFB_EXACT_F32],
                   g[BFB_MODE_BF16] / g[BFB_EXACT_BF16], 100.0 * g[BFB_MODE_BF16] / peak);
            if (o.M == 1)
                printf(" %.1f, %.1f", g[BFB_EXACT_BF16], g[BFB_MODE_BF16]);
            printf("\n");
            fflush(stdout);
        }
        free(w);
        free(x);
        free(y);
        free(wb);
        free(scratch);
    }
}

int main(int argc, char **argv)
{
    int bf16_mode_only = 0;
    if (argc > 1 && strcmp(argv[argc - 1], "--bf16-mode") == 0) {
        bf16_mode_only = 1;
        argc--;
    }
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    cpu_pool *pool = NULL;
    if (cpu_pool_create(&pool, threads, NULL) != 0) {
        fprintf(stderr, "gemm_bench: cannot start %d threads\n", threads);
        return 1;
    }
    openblas_set_num_threads(threads);
    uint64_t seed = 12345;
    if (bf16_mode_only) {
        bench_bf16_mode(pool, threads, &seed);
        cpu_pool_destroy(pool);
        return 0;
    }

    /* the ceiling: a large square sgemm */
    const int P = 2048;
    float *pa = rand_buf((size_t)P * P, &seed), *pb = rand_buf((size_t)P * P, &seed);
    float *pc = rand_buf((size_t)P * P, &seed);
    double peak = gflops(IMPL_SGEMM, pool, pc, pa, pb, P, P, P);
    double mine_sq = gflops(IMPL_MINE, pool, pc, pa, pb, P, P, P);
    free(pa);
    free(pb);
    free(pc);
    printf("gemm_bench: %d threads, cpu_gemm isa %s (%d lanes), OpenBLAS %s\n", threads, cpu_gemm_isa(),
           (int)cpu_gemm_lanes(), openblas_get_config());
    printf("ceiling: OpenBLAS sgemm %dx%dx%d = %.1f GFLOP/s (cpu_gemm on it: %.1f, %.0f%%)\n\n", P, P, P, peak,
           mine_sq, 100.0 * mine_sq / peak);

    const struct { const char *name; int N, K; } shapes[] = {
        {"qkv", 2304, 768}, {"o", 768, 768}, {"gate_up", 4096, 768}, {"down", 768, 2048}, {"lm_head", 32000, 768},
    };
    const int Ms[] = {1, 8, 32, 64, 128, 256};
    printf("%-8s %5s %5s %4s | %9s %9s %9s | %7s %7s | %s\n", "shape", "N", "K", "M", "cpu_gemm", "sgemm", "sgemv",
           "/sgemm", "/peak", "M=1 weight GB/s (cpu_gemm, sgemv)");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        float *w = rand_buf((size_t)N * K, &seed), *x = rand_buf((size_t)256 * K, &seed);
        float *y = rand_buf((size_t)256 * N, &seed);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            double g_mine = gflops(IMPL_MINE, pool, y, x, w, M, N, K);
            double g_blas = gflops(IMPL_SGEMM, pool, y, x, w, M, N, K);
            double g_gemv = M == 1 ? gflops(IMPL_SGEMV, pool, y, x, w, M, N, K) : 0.0;
            printf("%-8s %5d %5d %4d | %9.1f %9.1f ", shapes[s].name, N, K, M, g_mine, g_blas);
            if (M == 1)
                printf("%9.1f | %6.0f%% %6.0f%% | %.1f, %.1f\n", g_gemv, 100.0 * g_mine / g_blas, 100.0 * g_mine / peak,
                       g_mine * 2.0, g_gemv * 2.0); /* 2 flops per 4-byte weight: GB/s = 2 x GFLOP/s */
            else
                printf("%9s | %6.0f%% %6.0f%% |\n", "", 100.0 * g_mine / g_blas, 100.0 * g_mine / peak);
        }
        free(w);
        free(x);
        free(y);
    }

    /* Is OpenBLAS batch-invariant? Row 0 at M = 64 vs the same row alone. */
    {
        const int N = 2304, K = 768, M = 64;
        float *w = rand_buf((size_t)N * K, &seed), *x = rand_buf((size_t)M * K, &seed);
        float *y64 = rand_buf((size_t)M * N, &seed), *y1 = rand_buf((size_t)N, &seed), *yv = rand_buf((size_t)N, &seed);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y64, N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N, K, 1.0f, x, K, w, K, 0.0f, y1, N);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w, K, x, 1, 0.0f, yv, 1);
        int diff_gemm = 0, diff_gemv = 0;
        for (int n = 0; n < N; n++) {
            diff_gemm += memcmp(&y64[n], &y1[n], sizeof(float)) != 0;
            diff_gemv += memcmp(&y64[n], &yv[n], sizeof(float)) != 0;
        }
        cpu_gemm(pool, y64, N, x, w, M, N, K);
        cpu_gemm(pool, y1, N, x, w, 1, N, K);
        int diff_mine = 0;
        for (int n = 0; n < N; n++)
            diff_mine += memcmp(&y64[n], &y1[n], sizeof(float)) != 0;
        printf("\nbatch invariance, N=%d K=%d, row 0 of M=%d vs alone: OpenBLAS sgemm(M=1) differs in %d of %d outputs, "
               "sgemv in %d; cpu_gemm in %d\n", N, K, M, diff_gemm, N, diff_gemv, diff_mine);
        free(w);
        free(x);
        free(y64);
        free(y1);
        free(yv);
    }
    cpu_pool_destroy(pool);
    return 0;
}
