/* bench_machine: the machine's own ceilings, measured in the same run as the
 * figures they are compared with (STYLE.md habit 15: "benchmarks print the
 * ceiling beside the figure").
 *
 *   - sgemm peak: OpenBLAS cblas_sgemm on a large square (compute ceiling),
 *     and the project's cpu_gemm on an LLM-shaped product (what the
 *     executor can actually reach);
 *   - memory bandwidth: a streaming read and a STREAM-style triad over
 *     buffers far larger than the last-level cache (the ceiling of a
 *     bandwidth-bound batch-1 decode);
 *   - the machine's identity (CPU model, cores) and the process's peak RSS.
 */
#ifndef PG_BENCH_MACHINE_H
#define PG_BENCH_MACHINE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_machine {
    char cpu_model[128];        /* /proc/cpuinfo "model name" */
    int32_t online_cores;
    double mem_total_gib;
    const char *gemm_isa;       /* cpu_gemm_isa() */
    /* compute ceilings, GFLOP/s at `threads` threads */
    int32_t threads;
    int32_t sgemm_n;            /* side of the square for cblas_sgemm */
    double sgemm_gflops;        /* cblas_sgemm, best of several calls */
    int32_t pgemm_m, pgemm_n, pgemm_k; /* the cpu_gemm shape (M tokens, N out, K in) */
    double pgemm_gflops;        /* project cpu_gemm at M = pgemm_m */
    double pgemm_m1_gflops;     /* project cpu_gemm at M = 1 (streams the weights) */
    /* memory ceilings, GB/s (1e9 bytes) */
    size_t stream_bytes;        /* bytes per array */
    double read_gbs;            /* streaming read (sum) */
    double triad_gbs;           /* a[i] = b[i] + s*c[i], counted as 3 arrays moved */
} bench_machine;

/* Reads the machine's identity (fast, no measurement). */
void bench_machine_identify(bench_machine *m);

/* Measures the ceilings with `threads` threads; quick = smaller sizes.
 * Returns 0, or -1 when a buffer could not be allocated (fields stay 0). */
int bench_machine_measure(bench_machine *m, int32_t threads, int quick);

/* Peak resident set of this process in bytes (VmHWM; getrusage fallback). */
size_t bench_peak_rss_bytes(void);
/* Resets the peak (writes 5 to /proc/self/clear_refs); returns 0 when the
 * kernel allowed it, so the next bench_peak_rss_bytes() is per section. */
int bench_peak_rss_reset(void);

/* Monotonic seconds. */
double bench_now_s(void);

#endif /* PG_BENCH_MACHINE_H */
