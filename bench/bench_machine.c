/* bench_machine: compute and memory ceilings of this machine (see header). */
#include "bench_machine.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cpu_gemm.h"
#include "cpu_pool.h"

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void bench_machine_identify(bench_machine *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->cpu_model, sizeof(m->cpu_model), "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ' || *c == '\t')
                        c++;
                    snprintf(m->cpu_model, sizeof(m->cpu_model), "%s", c);
                    m->cpu_model[strcspn(m->cpu_model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    m->online_cores = n > 0 ? (int32_t)n : 1;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        m->mem_total_gib = (double)pages * (double)psz / (1024.0 * 1024.0 * 1024.0);
    m->gemm_isa = cpu_gemm_isa();
}

/* ---- compute ceilings ---------------------------------------------------- */

static void fill(float *x, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    }
}

/* Best GFLOP/s of cblas_sgemm C = A @ B^T on an n x n square: one warm-up
 * call, then calls until min_s seconds have passed (at least 3). */
static double sgemm_gflops(int32_t n, int32_t threads, double min_s)
{
    size_t nn = (size_t)n * (size_t)n;
    float *a = aligned_alloc(64, nn * sizeof(float));
    float *b = aligned_alloc(64, nn * sizeof(float));
    float *c = aligned_alloc(64, nn * sizeof(float));
    double best = 0.0;
    if (a && b && c) {
        fill(a, nn, 1);
        fill(b, nn, 2);
        openblas_set_num_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t_end = bench_now_s() + min_s;
        for (int it = 0; it < 3 || bench_now_s() < t_end; it++) {
            double t0 = bench_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            double dt = bench_now_s() - t0;
            double g = 2.0 * (double)n * (double)n * (double)n / dt * 1e-9;
            if (g > best)
                best = g;
        }
        /* OpenBLAS is not on the engine's hot path; keep its threads quiet */
        openblas_set_num_threads(1);
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* Best GFLOP/s of the project's cpu_gemm, y [M][N] = x [M][K] @ w[N][K]^T. */
static double pgemm_gflops(cpu_pool *pool, int32_t M, int32_t N, int32_t K, double min_s)
{
    float *x = aligned_alloc(64, (size_t)M * (size_t)K * sizeof(float));
    float *w = aligned_alloc(64, (size_t)N * (size_t)K * sizeof(float));
    float *y = aligned_alloc(64, (size_t)M * (size_t)N * sizeof(float));
    double best = 0.0;
    if (x && w && y) {
        fill(x, (size_t)M * (size_t)K, 3);
        fill(w, (size_t)N * (size_t)K, 4);
        cpu_gemm(pool, y, N, x, w, M, N, K);
        double t_end = bench_now_s() + min_s;
        for (int it = 0; it < 3 || bench_now_s() < t_end; it++) {
            double t0 = bench_now_s();
            cpu_gemm(pool, y, N, x, w, M, N, K);
            double dt = bench_now_s() - t0;
            double g = 2.0 * (double)M * (double)N * (double)K / dt * 1e-9;
            if (g > best)
                best = g;
        }
    }
    free(x);
    free(w);
    free(y);
    return best;
}

/* ---- memory ceilings ----------------------------------------------------- */

#define BENCH_LANES 16

typedef struct stream_job {
    float *a, *b, *c;     /* [n] each */
    size_t n;
    int op;               /* 0 init, 1 read, 2 triad */
    float sums[64];       /* per worker, keeps the read from being optimized out */
} stream_job;

static void stream_worker(void *ctx, int32_t w, int32_t nw)
{
    stream_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range((int64_t)j->n, w, nw, 4096, &lo, &hi);
    if (j->op == 0) {
        for (int64_t i = lo; i < hi; i++) {
            j->a[i] = 1.0f;
            if (j->b)
                j->b[i] = 2.0f;
            if (j->c)
                j->c[i] = 0.5f;
        }
    } else if (j->op == 1) {
        float acc[BENCH_LANES] = {0};
        int64_t i = lo;
        for (; i + BENCH_LANES <= hi; i += BENCH_LANES)
            for (int l = 0; l < BENCH_LANES; l++)
                acc[l] += j->a[i + l];
        for (; i < hi; i++)
            acc[0] += j->a[i];
        float s = 0.0f;
        for (int l = 0; l < BENCH_LANES; l++)
            s += acc[l];
        if (w < 64)
            j->sums[w] = s;
    } else {
        const float k = 3.0f;
        float *restrict a = j->a;
        const float *restrict b = j->b, *restrict c = j->c;
        for (int64_t i = lo; i < hi; i++)
            a[i] = b[i] + k * c[i];
    }
}

static double stream_best(cpu_pool *pool, stream_job *j, int op, double bytes, int reps)
{
    double best = 0.0;
    j->op = op;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now_s();
        cpu_pool_run(pool, 0, stream_worker, j);
        double dt = bench_now_s() - t0;
        double g = bytes / dt * 1e-9;
        if (g > best)
            best = g;
    }
    return best;
}

int bench_machine_measure(bench_machine *m, int32_t threads, int quick)
{
    m->threads = threads;
    cpu_pool *pool = NULL;
    if (cpu_pool_create(&pool, threads, NULL) != 0)
        return -1;

    double min_s = quick ? 0.2 : 1.0;
    m->sgemm_n = quick ? 1024 : 2048;
    m->sgemm_gflops = sgemm_gflops(m->sgemm_n, threads, min_s);
    /* an FFN-shaped product of the 110m model: 128 tokens x (768 -> 2048) */
    m->pgemm_m = 128;
    m->pgemm_n = 2048;
    m->pgemm_k = 768;
    m->pgemm_gflops = pgemm_gflops(pool, m->pgemm_m, m->pgemm_n, m->pgemm_k, min_s);
    /* M = 1 over a matrix far larger than the cache: bandwidth-bound */
    m->pgemm_m1_gflops = pgemm_gflops(pool, 1, quick ? 4096 : 16384, 2048, min_s);

    int rc = 0;
    size_t n = (quick ? (size_t)32 : (size_t)128) << 20; /* floats per array */
    m->stream_bytes = n * sizeof(float);
    stream_job *j = calloc(1, sizeof(*j));
    if (j) {
        j->n = n;
        j->a = aligned_alloc(64, n * sizeof(float));
        j->b = aligned_alloc(64, n * sizeof(float));
        j->c = aligned_alloc(64, n * sizeof(float));
    }
    if (j && j->a && j->b && j->c) {
        j->op = 0;
        cpu_pool_run(pool, 0, stream_worker, j); /* first touch, in parallel */
        int reps = quick ? 3 : 5;
        m->read_gbs = stream_best(pool, j, 1, (double)n * sizeof(float), reps);
        m->triad_gbs = stream_best(pool, j, 2, 3.0 * (double)n * sizeof(float), reps);
    } else {
        rc = -1;
    }
    if (j) {
        free(j->a);
        free(j->b);
        free(j->c);
        free(j);
    }
    cpu_pool_destroy(pool);
    return rc;
}

size_t bench_peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof(line), f)) {
            unsigned long kb;
            if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) {
                fclose(f);
                return (size_t)kb * 1024u;
            }
        }
        fclose(f);
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        return (size_t)ru.ru_maxrss * 1024u;
    return 0;
}

int bench_peak_rss_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return -1;
    int ok = fputs("5", f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : -1;
}
