/* gemm_bench: the CPU executor's GEMM (cpu/cpu_gemm.c) against OpenBLAS on
 * the 110m model's shapes, with the machine's ceiling beside the figures.
 *
 *   gemm_bench [threads] [modes [cputime] | ms=M1,M2,... [cputime] | decode[-hot] [rounds [cputime]]]
 *       threads: default all online cores, for both; modes: the ceiling and
 *       the modes section only (also spelled int8 or --bf16-mode, the
 *       names it had before its two halves were merged); cputime (threads
 *       = 1): the modes section timed in the thread's CPU time
 *       (CLOCK_THREAD_CPUTIME_ID), which a shared machine's other
 *       processes do not inflate; ms=...: the main table only, at these
 *       batches (e.g. ms=1,4,16,64,128,512), without the modes section
 *       (with cputime, threads = 1: cpu_gemm and sgemm timed in interleaved
 *       rounds in the thread's CPU time); decode: the batch-1 decode step
 *       section only (decode_section below; rounds: default 20; cputime,
 *       threads = 1: timed in the thread's CPU time, the read bandwidth too);
 *       decode-hot: the same, then each kernel again on one thread in its
 *       CPU time on an L2-resident product (compute- or memory-bound?)
 *
 * Prints, per shape (N, K) and batch M in {1, 8, 32, 64, 128, 256}:
 * GFLOP/s of cpu_gemm, of cblas_sgemm and (M = 1) of cblas_sgemv, and
 * cpu_gemm as a fraction of the measured sgemm peak (a large square
 * product). At M = 1 it also prints GB/s of weight streamed. Then whether
 * OpenBLAS itself is batch-invariant here (row 0 of an M = 64 sgemm vs the
 * same row alone through sgemm and through sgemv), which is why pagedgen
 * does not use it for its matmuls. Then the modes section (issue 20):
 * per shape and M in {1, 16, 64, 256}, GFLOP/s of the exact f32 GEMM, of
 * the exact GEMM on int8 weights (W8A16: cpu_gemm_wt, CPU_WT_I8), of the
 * int8 mode (W8A8: cpu_gemm_mode, activation quantization included), of
 * the exact GEMM on bf16 weights and of the bf16 mode (activation rounding
 * included, cpu_gemm_modes.h), the five timed in interleaved rounds, with
 * each mode's ratio to f32 and to the exact product on its own storage.
 * It names the kernel each mode runs (cpu_gemm_mode_kernel_name); where
 * that is an AVX-512 dot kernel (avx512vnni, avx512bf16), the same modes
 * on their avx2 kernels (CPU_GEMM_AVX2) are timed in the same rounds and
 * printed beside, with the dot kernels' speedup over them.
 * Fixed seed, warm-up, best of timed repetitions within ~0.3 s (modes
 * section: ~0.45 s for the five) per point.
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
#include "cpu_wt.h"

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

typedef enum {
    IMPL_MINE,
    IMPL_SGEMM,
    IMPL_SGEMV,
    IMPL_W8A16,
    IMPL_W8A8,
    IMPL_BF16,
    IMPL_BF16_MODE,
    IMPL_W8A8_AVX2,     /* the int8 mode with CPU_GEMM_AVX2: its avx2 kernel */
    IMPL_BF16_MODE_AVX2 /* the bf16 mode's avx2 kernel */
} impl;

/* One timed product: y [M][N] = x [M][K] @ w^T; w_i8 / w_bf16 (the int8 /
 * bf16 impls): w as CPU_WT_I8 blocks / rounded to bf16; scratch: the
 * modes' (cpu_gemm_mode_scratch_bytes, the larger of the two). */
typedef struct bench_op {
    cpu_pool *pool;
    float *y;
    const float *x, *w;
    const void *w_i8;
    void *scratch;
    const uint16_t *w_bf16;
} bench_op;

static void run_once(impl which, const bench_op *op, int M, int N, int K)
{
    float *y = op->y;
    const float *x = op->x, *w = op->w;
    switch (which) {
    case IMPL_MINE:
        cpu_gemm(op->pool, y, N, x, w, M, N, K);
        break;
    case IMPL_SGEMM:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
        break;
    case IMPL_SGEMV:
        for (int m = 0; m < M; m++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w, K, x + (size_t)m * K, 1, 0.0f,
                        y + (size_t)m * N, 1);
        break;
    case IMPL_W8A16:
        cpu_gemm_wt(CPU_GEMM_AUTO, CPU_WT_I8, op->pool, y, N, x, op->w_i8, M, N, K);
        break;
    case IMPL_W8A8:
        cpu_gemm_mode(CPU_MATMUL_INT8, CPU_GEMM_AUTO, CPU_WT_I8, op->pool, y, N, x, op->w_i8, M, N, K, op->scratch);
        break;
    case IMPL_BF16:
        cpu_gemm_wt(CPU_GEMM_AUTO, CPU_WT_BF16, op->pool, y, N, x, op->w_bf16, M, N, K);
        break;
    case IMPL_BF16_MODE:
        cpu_gemm_mode(CPU_MATMUL_BF16, CPU_GEMM_AUTO, CPU_WT_BF16, op->pool, y, N, x, op->w_bf16, M, N, K,
                      op->scratch);
        break;
    case IMPL_W8A8_AVX2:
        cpu_gemm_mode(CPU_MATMUL_INT8, CPU_GEMM_AVX2, CPU_WT_I8, op->pool, y, N, x, op->w_i8, M, N, K, op->scratch);
        break;
    case IMPL_BF16_MODE_AVX2:
        cpu_gemm_mode(CPU_MATMUL_BF16, CPU_GEMM_AVX2, CPU_WT_BF16, op->pool, y, N, x, op->w_bf16, M, N, K,
                      op->scratch);
        break;
    }
}

/* GFLOP/s: warm-up, then the best of repetitions within ~0.3 s */
static double gflops(impl which, const bench_op *op, int M, int N, int K)
{
    run_once(which, op, M, N, K);
    double best = 1e30, start = now_s();
    int reps = 0;
    do {
        double t0 = now_s();
        int inner = 0;
        double t;
        do {
            run_once(which, op, M, N, K);
            inner++;
        } while ((t = now_s() - t0) < 0.02);
        if (t / inner < best)
            best = t / inner;
        reps++;
    } while (now_s() - start < 0.3 || reps < 3);
    return 2.0 * M * N * K / best * 1e-9;
}

/* seconds on clock c */
static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per call on clock c over one window of >= 0.02 s */
static double best_window_s(impl which, const bench_op *op, int M, int N, int K, clockid_t c)
{
    double t0 = clock_s(c), t;
    int inner = 0;
    do {
        run_once(which, op, M, N, K);
        inner++;
    } while ((t = clock_s(c) - t0) < 0.02);
    return t / inner;
}

/* GFLOP/s of several impls timed in interleaved rounds (warm-up, then
 * rounds of one window each until ~0.45 s and >= 5 rounds, best window per
 * impl): a load that comes and goes hits them alike, so their ratio holds. */
static void gflops_interleaved(const impl *which, double *out, int n, const bench_op *op, int M, int N, int K,
                               clockid_t c)
{
    double best[8];
    for (int i = 0; i < n; i++) {
        run_once(which[i], op, M, N, K);
        best[i] = 1e30;
    }
    const double start = now_s(); /* the round budget in wall time */
    for (int r = 0; r < 5 || now_s() - start < 0.45; r++)
        for (int i = 0; i < n; i++) {
            const double t = best_window_s(which[i], op, M, N, K, c);
            best[i] = t < best[i] ? t : best[i];
        }
    for (int i = 0; i < n; i++)
        out[i] = 2.0 * M * N * K / best[i] * 1e-9;
}

/* The modes section: f32 exact, W8A16, W8A8, exact on bf16 weights and
 * the bf16 mode side by side. */
static void modes_section(cpu_pool *pool, double peak, uint64_t *seed, clockid_t c)
{
    const struct { const char *name; int N, K; } shapes[] = {
        {"o", 768, 768}, {"qkv", 2304, 768}, {"gate_up", 4096, 768}, {"down", 768, 2048}, {"lm_head", 32000, 768},
    };
    const int Ms[] = {1, 16, 64, 256};
    const char *kernel_bf16 = cpu_gemm_mode_kernel_name(CPU_MATMUL_BF16, CPU_GEMM_AUTO);
    const char *kernel_int8 = cpu_gemm_mode_kernel_name(CPU_MATMUL_INT8, CPU_GEMM_AUTO);
    /* the AVX-512 dot kernels run here: time the avx2 ones beside them */
    const int dot = strcmp(kernel_bf16, "avx512bf16") == 0 || strcmp(kernel_int8, "avx512vnni") == 0;
    printf("\nmatmul modes (issue 20): exact f32; int8 weights exact (W8A16) and int8 mode (W8A8, quantizing x "
           "included); bf16 weights exact and bf16 mode (rounding x included); GFLOP/s%s\n",
           c == CLOCK_THREAD_CPUTIME_ID ? ", thread CPU time" : "");
    printf("mode kernels: int8 %s, bf16 %s%s\n", kernel_int8, kernel_bf16,
           dot ? " (A8 avx2, bm avx2: the same modes on their avx2 kernels, timed in the same rounds)" : "");
    printf("%-8s %5s %5s %4s | %8s %8s %8s %8s %8s | %7s %7s %7s %7s %7s | ", "shape", "N", "K", "M", "f32",
           "W8A16", "W8A8", "bf16", "bf16mode", "A8/f32", "A8/A16", "bm/f32", "bm/bf16", "A8/peak");
    if (dot)
        printf("%8s %8s %7s %7s | ", "A8 avx2", "bm avx2", "A8/avx2", "bm/avx2");
    printf("%s\n", "M=1 weight GB/s (f32, W8A16, W8A8, bf16, bf16 mode)");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        float *w = rand_buf((size_t)N * K, seed), *x = rand_buf((size_t)256 * K, seed);
        float *y = rand_buf((size_t)256 * N, seed);
        void *w_i8 = malloc(cpu_wt_bytes(CPU_WT_I8, (size_t)N * K));
        uint16_t *w_bf16 = aligned_alloc(64, ((size_t)N * K * sizeof *w_bf16 + 63) / 64 * 64);
        size_t sb = cpu_gemm_mode_scratch_bytes(CPU_MATMUL_INT8, 256, K);
        const size_t sb16 = cpu_gemm_mode_scratch_bytes(CPU_MATMUL_BF16, 256, K);
        sb = sb16 > sb ? sb16 : sb;
        void *scratch = aligned_alloc(64, (sb + 63) / 64 * 64);
        if (!w_i8 || !w_bf16 || !scratch) {
            fprintf(stderr, "gemm_bench: out of memory\n");
            exit(1);
        }
        cpu_wt_store(CPU_WT_I8, w_i8, 0, w, ST_F32, (size_t)N * K);
        cpu_bf16_round_rows(w_bf16, w, (int64_t)N * K);
        const bench_op op = {pool, y, x, w, w_i8, scratch, w_bf16};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            const impl which[7] = {IMPL_MINE,      IMPL_W8A16,     IMPL_W8A8,          IMPL_BF16,
                                   IMPL_BF16_MODE, IMPL_W8A8_AVX2, IMPL_BF16_MODE_AVX2};
            double g[7];
            gflops_interleaved(which, g, dot ? 7 : 5, &op, M, N, K, c);
            printf("%-8s %5d %5d %4d | %8.1f %8.1f %8.1f %8.1f %8.1f | %6.2fx %6.2fx %6.2fx %6.2fx %6.0f%% |",
                   shapes[s].name, N, K, M, g[0], g[1], g[2], g[3], g[4], g[2] / g[0], g[2] / g[1], g[4] / g[0],
                   g[4] / g[3], 100.0 * g[2] / peak);
            if (dot)
                printf(" %8.1f %8.1f %6.2fx %6.2fx |", g[5], g[6], g[2] / g[5], g[4] / g[6]);
            if (M == 1) /* 2 flops per weight: f32 4 bytes, int8 36 per 32, bf16 2 */
                printf(" %.1f, %.1f, %.1f, %.1f, %.1f", g[0] * 2.0, g[1] * 0.5625, g[2] * 0.5625, g[3], g[4]);
            printf("\n");
            fflush(stdout);
        }
        free(w);
        free(x);
        free(y);
        free(w_i8);
        free(w_bf16);
        free(scratch);
    }
}

/* The decode section (`gemm_bench T decode`, issue 34): one batch-1 decode
 * step's matmuls of the 110m model (12 layers x qkv, o, gate_up, down, then
 * lm_head: 49 products at M = 1, the weights as the engine stores them, 85M
 * + 24.6M elements, far larger than any cache) through the pool as the
 * engine runs them, for each storage type and mode, on the best variant and
 * on the avx2 one, timed in interleaved rounds (best step of each); the
 * weight bytes a step reads over its time against the machine's read
 * bandwidth measured in the same run (a sum over 512 MiB, as
 * bench_machine.c's): the batch-1 roof of the storage section with
 * attention, norms and the engine's own work left out. */
typedef struct decode_mat {
    int N, K;
    float *w;
    void *w_i8;
    uint16_t *w_bf16;
} decode_mat;

typedef struct decode_impl {
    const char *name;
    cpu_matmul_precision p;
    cpu_wt wt;
    cpu_gemm_variant v;
} decode_impl;

typedef struct read_job {
    const float *a;
    size_t n;
    float sums[64];
} read_job;

static void read_worker(void *ctx, int32_t w, int32_t nw)
{
    read_job *j = ctx;
    int64_t lo, hi;
    cpu_pool_range((int64_t)j->n, w, nw, 4096, &lo, &hi);
    /* 64 independent lanes (four vectors of 16): one chain of vector adds
     * would bound a single core below its memory rate */
    float acc[64] = {0};
    for (int64_t i = lo; i + 64 <= hi; i += 64)
        for (int l = 0; l < 64; l++)
            acc[l] += j->a[i + l];
    float s = 0.0f;
    for (int l = 0; l < 64; l++)
        s += acc[l];
    if (w < 64)
        j->sums[w] = s;
}

/* GB/s of a parallel sum over 512 MiB on clock c, best of 5 */
static double read_gbs(cpu_pool *pool, clockid_t c)
{
    const size_t n = (size_t)128 << 20;
    float *a = aligned_alloc(64, n * sizeof(float));
    if (!a)
        return 0.0;
    for (size_t i = 0; i < n; i++)
        a[i] = 1.0f;
    read_job j = {a, n, {0}};
    double best = 0.0;
    for (int r = 0; r < 5; r++) {
        const double t0 = clock_s(c);
        cpu_pool_run(pool, 0, read_worker, &j);
        const double g = (double)n * sizeof(float) / (clock_s(c) - t0) * 1e-9;
        best = g > best ? g : best;
    }
    free(a);
    return best;
}

static void decode_step(const decode_impl *im, cpu_pool *pool, const decode_mat *mats, int n_mats, float *y,
                        const float *x, void *scratch)
{
    for (int i = 0; i < n_mats; i++) {
        const decode_mat *m = &mats[i];
        const void *w = im->wt == CPU_WT_F32 ? (const void *)m->w : im->wt == CPU_WT_BF16 ? (const void *)m->w_bf16
                                                                                          : m->w_i8;
        cpu_gemm_mode(im->p, im->v, im->wt, pool, y, m->N, x, w, 1, m->N, m->K, scratch);
    }
}

/* Seconds per cpu_gemm_mode call of im on the hot product w (N x K at
 * M = 1, already in cache), best of rounds windows of >= 20 ms on clock c */
static double hot_call_s(const decode_impl *im, const decode_mat *m, float *y, const float *x, void *scratch,
                         int rounds, clockid_t c)
{
    const void *w = im->wt == CPU_WT_F32 ? (const void *)m->w : im->wt == CPU_WT_BF16 ? (const void *)m->w_bf16
                                                                                      : m->w_i8;
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        const double t0 = clock_s(c);
        long n = 0;
        do { /* 64 calls between clock reads (a CPU-time read is a system call) */
            for (int i = 0; i < 64; i++)
                cpu_gemm_mode(im->p, im->v, im->wt, NULL, y, m->N, x, w, 1, m->N, m->K, scratch);
            n += 64;
        } while (clock_s(c) - t0 < 0.02);
        const double t = (clock_s(c) - t0) / (double)n;
        best = t < best ? t : best;
    }
    return best;
}

static void decode_section(cpu_pool *pool, uint64_t *seed, int rounds, clockid_t c, int hot)
{
    enum { D_L = 12, D_H = 768, D_I = 2048, D_V = 32000 };
    decode_mat mats[4 * D_L + 1];
    int n_mats = 0;
    for (int l = 0; l < D_L; l++) {
        const int shp[4][2] = {{3 * D_H, D_H}, {D_H, D_H}, {2 * D_I, D_H}, {D_H, D_I}};
        for (int s = 0; s < 4; s++)
            mats[n_mats++] = (decode_mat){shp[s][0], shp[s][1], NULL, NULL, NULL};
    }
    mats[n_mats++] = (decode_mat){D_V, D_H, NULL, NULL, NULL};
    double bytes[CPU_WT_COUNT] = {0};
    for (int i = 0; i < n_mats; i++) {
        decode_mat *m = &mats[i];
        const size_t e = (size_t)m->N * (size_t)m->K;
        m->w = rand_buf(e, seed);
        m->w_i8 = aligned_alloc(64, (cpu_wt_bytes(CPU_WT_I8, e) + 63) / 64 * 64);
        m->w_bf16 = aligned_alloc(64, (e * sizeof(uint16_t) + 63) / 64 * 64);
        if (!m->w_i8 || !m->w_bf16) {
            fprintf(stderr, "gemm_bench: out of memory\n");
            exit(1);
        }
        cpu_wt_store(CPU_WT_I8, m->w_i8, 0, m->w, ST_F32, e);
        cpu_bf16_round_rows(m->w_bf16, m->w, (int64_t)e);
        for (int t = 0; t < CPU_WT_COUNT; t++)
            bytes[t] += (double)cpu_wt_bytes((cpu_wt)t, e);
    }
    float *x = rand_buf(D_I, seed), *y = rand_buf(D_V, seed);
    void *scratch = aligned_alloc(64, 4096 * 4);
    const decode_impl impls[] = {
        {"f32", CPU_MATMUL_EXACT, CPU_WT_F32, CPU_GEMM_AUTO},
        {"bf16", CPU_MATMUL_EXACT, CPU_WT_BF16, CPU_GEMM_AUTO},
        {"int8", CPU_MATMUL_EXACT, CPU_WT_I8, CPU_GEMM_AUTO},
        {"bf16 mode", CPU_MATMUL_BF16, CPU_WT_BF16, CPU_GEMM_AUTO},
        {"int8 mode", CPU_MATMUL_INT8, CPU_WT_I8, CPU_GEMM_AUTO},
        {"f32", CPU_MATMUL_EXACT, CPU_WT_F32, CPU_GEMM_AVX2},
        {"bf16", CPU_MATMUL_EXACT, CPU_WT_BF16, CPU_GEMM_AVX2},
        {"int8", CPU_MATMUL_EXACT, CPU_WT_I8, CPU_GEMM_AVX2},
        {"bf16 mode", CPU_MATMUL_BF16, CPU_WT_BF16, CPU_GEMM_AVX2},
        {"int8 mode", CPU_MATMUL_INT8, CPU_WT_I8, CPU_GEMM_AVX2},
    };
    enum { N_IMPL = sizeof impls / sizeof impls[0] };
    int avail[N_IMPL];
    double best[N_IMPL];
    for (int k = 0; k < N_IMPL; k++) {
        avail[k] = cpu_gemm_variant_available(impls[k].v) &&
                   (impls[k].v == CPU_GEMM_AUTO || cpu_gemm_variant_best() != CPU_GEMM_AVX2);
        best[k] = 1e30;
        if (avail[k])
            decode_step(&impls[k], pool, mats, n_mats, y, x, scratch); /* warm-up */
    }
    const double bw_before = read_gbs(pool, c);
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < N_IMPL; k++) {
            if (!avail[k])
                continue;
            const double t0 = clock_s(c);
            decode_step(&impls[k], pool, mats, n_mats, y, x, scratch);
            const double t = clock_s(c) - t0;
            best[k] = t < best[k] ? t : best[k];
        }
    const double bw_after = read_gbs(pool, c), bw = bw_before > bw_after ? bw_before : bw_after;
    printf("\nbatch-1 decode step (issue 34): the 49 matmuls of the 110m model at M = 1, %d threads, best of %d "
           "interleaved rounds%s; read bandwidth %.1f GB/s (sum over 512 MiB, best before / after: %.1f / %.1f)\n",
           cpu_pool_size(pool), rounds, c == CLOCK_THREAD_CPUTIME_ID ? ", thread CPU time" : "", bw, bw_before,
           bw_after);
    printf("%-10s %-8s %-10s | %9s %9s %8s %7s\n", "weights", "variant", "kernel", "step us", "MB", "GB/s", "%roof");
    for (int k = 0; k < N_IMPL; k++) {
        if (!avail[k])
            continue;
        const decode_impl *im = &impls[k];
        const char *kern = cpu_gemm_mode_kernel_name(im->p, im->v);
        const double b = bytes[im->wt];
        printf("%-10s %-8s %-10s | %9.1f %9.1f %8.1f %6.0f%%\n", im->name,
               cpu_gemm_variant_name(im->v == CPU_GEMM_AUTO ? cpu_gemm_variant_best() : im->v),
               kern ? kern : "?", best[k] * 1e6, b * 1e-6, b / best[k] * 1e-9, 100.0 * b / best[k] * 1e-9 / bw);
    }
    if (hot) {
        /* the same kernels on one thread, on a product that stays in L2
         * (192 x 768: f32 576 KiB, bf16 288, int8 162): how fast each
         * consumes weights when memory is not the limit. A kernel whose hot
         * rate is not well above its share of the read bandwidth per core
         * is bound by its own instructions at M = 1. */
        decode_mat h = {192, D_H, NULL, NULL, NULL};
        const size_t e = (size_t)h.N * (size_t)h.K;
        h.w = rand_buf(e, seed);
        h.w_i8 = aligned_alloc(64, (cpu_wt_bytes(CPU_WT_I8, e) + 63) / 64 * 64);
        h.w_bf16 = aligned_alloc(64, (e * sizeof(uint16_t) + 63) / 64 * 64);
        if (!h.w_i8 || !h.w_bf16) {
            fprintf(stderr, "gemm_bench: out of memory\n");
            exit(1);
        }
        cpu_wt_store(CPU_WT_I8, h.w_i8, 0, h.w, ST_F32, e);
        cpu_bf16_round_rows(h.w_bf16, h.w, (int64_t)e);
        const clockid_t hc = CLOCK_THREAD_CPUTIME_ID;
        printf("\nthe same kernels hot: one thread, its CPU time, a %d x %d product at M = 1 that stays in L2, best "
               "of %d windows; the read bandwidth's share per core: %.1f GB/s\n",
               h.N, h.K, rounds, bw / cpu_pool_size(pool));
        printf("%-10s %-8s %-10s | %9s %8s %8s\n", "weights", "variant", "kernel", "call us", "GB/s", "x share");
        for (int k = 0; k < N_IMPL; k++) {
            if (!avail[k])
                continue;
            const decode_impl *im = &impls[k];
            const char *kern = cpu_gemm_mode_kernel_name(im->p, im->v);
            const double t = hot_call_s(im, &h, y, x, scratch, rounds, hc), b = (double)cpu_wt_bytes(im->wt, e);
            printf("%-10s %-8s %-10s | %9.2f %8.1f %7.2fx\n", im->name,
                   cpu_gemm_variant_name(im->v == CPU_GEMM_AUTO ? cpu_gemm_variant_best() : im->v),
                   kern ? kern : "?", t * 1e6, b / t * 1e-9, b / t * 1e-9 / (bw / cpu_pool_size(pool)));
        }
        free(h.w);
        free(h.w_i8);
        free(h.w_bf16);
    }
    for (int i = 0; i < n_mats; i++) {
        free(mats[i].w);
        free(mats[i].w_i8);
        free(mats[i].w_bf16);
    }
    free(x);
    free(y);
    free(scratch);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    const int modes_only = argc > 2 && (strcmp(argv[2], "modes") == 0 || strcmp(argv[2], "int8") == 0 ||
                                        strcmp(argv[2], "--bf16-mode") == 0);
    const int ms_only = argc > 2 && strncmp(argv[2], "ms=", 3) == 0;
    if (argc > 2 && (strcmp(argv[2], "decode") == 0 || strcmp(argv[2], "decode-hot") == 0)) {
        /* no ceiling: the read bandwidth is its own */
        cpu_pool *dp = NULL;
        if (cpu_pool_create(&dp, threads, NULL) != 0) {
            fprintf(stderr, "gemm_bench: cannot start %d threads\n", threads);
            return 1;
        }
        uint64_t dseed = 12345;
        /* decode [rounds] [cputime] (cputime: 1 thread, its CPU time) */
        const int rounds = argc > 3 ? atoi(argv[3]) : 20;
        const int dcpu = argc > 4 && strcmp(argv[4], "cputime") == 0;
        if (dcpu && threads != 1) {
            fprintf(stderr, "gemm_bench: decode cputime: expected 1 thread, got %d\n", threads);
            return 1;
        }
        decode_section(dp, &dseed, rounds > 0 ? rounds : 20, dcpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC,
                       strcmp(argv[2], "decode-hot") == 0);
        cpu_pool_destroy(dp);
        return 0;
    }
    const int cputime = (modes_only || ms_only) && argc > 3 && strcmp(argv[3], "cputime") == 0;
    int Ms[16] = {1, 8, 32, 64, 128, 256}, n_ms = 6;
    if (ms_only) {
        n_ms = 0;
        for (const char *p = argv[2] + 3; *p && n_ms < 16;) {
            char *end;
            const long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 4096 || (*end && *end != ',')) {
                fprintf(stderr, "gemm_bench: ms=: expected batches 1..4096 separated by commas, got '%s'\n",
                        argv[2] + 3);
                return 1;
            }
            Ms[n_ms++] = (int)v;
            p = *end ? end + 1 : end;
        }
    }
    int max_m = 256;
    for (int i = 0; i < n_ms; i++)
        max_m = Ms[i] > max_m ? Ms[i] : max_m;
    if (cputime && threads != 1) {
        fprintf(stderr, "gemm_bench: cputime: expected 1 thread (the pool's workers are not counted), got %d\n",
                threads);
        return 1;
    }
    cpu_pool *pool = NULL;
    if (cpu_pool_create(&pool, threads, NULL) != 0) {
        fprintf(stderr, "gemm_bench: cannot start %d threads\n", threads);
        return 1;
    }
    openblas_set_num_threads(threads);
    uint64_t seed = 12345;

    /* the ceiling: a large square sgemm */
    const int P = 2048;
    float *pa = rand_buf((size_t)P * P, &seed), *pb = rand_buf((size_t)P * P, &seed);
    float *pc = rand_buf((size_t)P * P, &seed);
    const bench_op sq = {pool, pc, pa, pb, NULL, NULL, NULL};
    double peak, mine_sq;
    if (cputime) { /* the ceiling on the same clock as the figures beside it */
        const impl which[2] = {IMPL_SGEMM, IMPL_MINE};
        double g[2];
        gflops_interleaved(which, g, 2, &sq, P, P, P, CLOCK_THREAD_CPUTIME_ID);
        peak = g[0];
        mine_sq = g[1];
    } else {
        peak = gflops(IMPL_SGEMM, &sq, P, P, P);
        mine_sq = gflops(IMPL_MINE, &sq, P, P, P);
    }
    free(pa);
    free(pb);
    free(pc);
    printf("gemm_bench: %d threads, cpu_gemm isa %s (%d lanes), OpenBLAS %s\n", threads, cpu_gemm_isa(),
           (int)cpu_gemm_lanes(), openblas_get_config());
    printf("ceiling: OpenBLAS sgemm %dx%dx%d = %.1f GFLOP/s (cpu_gemm on it: %.1f, %.0f%%)\n\n", P, P, P, peak,
           mine_sq, 100.0 * mine_sq / peak);

    if (modes_only) {
        modes_section(pool, peak, &seed, cputime ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC);
        cpu_pool_destroy(pool);
        return 0;
    }
    const struct { const char *name; int N, K; } shapes[] = {
        {"qkv", 2304, 768}, {"o", 768, 768}, {"gate_up", 4096, 768}, {"down", 768, 2048}, {"lm_head", 32000, 768},
    };
    printf("%-8s %5s %5s %4s | %9s %9s %9s | %7s %7s | %s\n", "shape", "N", "K", "M", "cpu_gemm", "sgemm", "sgemv",
           "/sgemm", "/peak", "M=1 weight GB/s (cpu_gemm, sgemv)");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K;
        float *w = rand_buf((size_t)N * K, &seed), *x = rand_buf((size_t)max_m * K, &seed);
        float *y = rand_buf((size_t)max_m * N, &seed);
        for (int mi = 0; mi < n_ms; mi++) {
            const int M = Ms[mi];
            const bench_op op = {pool, y, x, w, NULL, NULL, NULL};
            double g_mine, g_blas;
            if (cputime) {
                const impl which[2] = {IMPL_MINE, IMPL_SGEMM};
                double g[2];
                gflops_interleaved(which, g, 2, &op, M, N, K, CLOCK_THREAD_CPUTIME_ID);
                g_mine = g[0];
                g_blas = g[1];
            } else {
                g_mine = gflops(IMPL_MINE, &op, M, N, K);
                g_blas = gflops(IMPL_SGEMM, &op, M, N, K);
            }
            double g_gemv = M == 1 ? gflops(IMPL_SGEMV, &op, M, N, K) : 0.0;
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
    if (ms_only) {
        cpu_pool_destroy(pool);
        return 0;
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
    modes_section(pool, peak, &seed, CLOCK_MONOTONIC);
    cpu_pool_destroy(pool);
    return 0;
}
