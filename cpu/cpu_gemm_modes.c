/* cpu_gemm_modes: the reduced-precision matmul modes (cpu_gemm_modes.h):
 * activation rounding / quantization and the dispatch to the modes' column
 * kernels (cpu_gemm_q8_kernel.c, cpu_gemm_bf16_kernel.c). */
#include "cpu_gemm_modes.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "cpu_gemm_kernel.h"
#include "dtype.h"

const char *cpu_matmul_precision_name(cpu_matmul_precision p)
{
    static const char *const names[CPU_MATMUL_COUNT] = {"exact", "bf16", "int8"};
    return (unsigned)p < CPU_MATMUL_COUNT ? names[p] : NULL;
}

int cpu_matmul_precision_accepts(cpu_matmul_precision p, cpu_wt wt)
{
    switch (p) {
    case CPU_MATMUL_EXACT: return (unsigned)wt < CPU_WT_COUNT;
    case CPU_MATMUL_BF16: return wt == CPU_WT_BF16;
    case CPU_MATMUL_INT8: return wt == CPU_WT_I8;
    case CPU_MATMUL_COUNT: break;
    }
    return 0;
}

/* int8 runs W8A8 only on whole blocks of K */
static int q8_applies(cpu_matmul_precision p, int32_t K)
{
    return p == CPU_MATMUL_INT8 && K % CPU_I8_GROUP == 0;
}

size_t cpu_gemm_mode_scratch_bytes(cpu_matmul_precision p, int32_t M, int32_t K)
{
    if (p == CPU_MATMUL_BF16)
        return (size_t)M * (size_t)K * sizeof(uint16_t);
    if (q8_applies(p, K))
        return (size_t)M * (size_t)(K / CPU_I8_GROUP) * CPU_I8_BLOCK_BYTES;
    return 0;
}

void cpu_bf16_round_rows(uint16_t *xb, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) /* inline: vectorizes (dtype.h) */
        xb[i] = pg_f32_to_bf16(x[i]);
}

void cpu_q8_quantize_rows(unsigned char *xq, const float *x, int32_t M, int32_t K)
{
    const size_t row_bytes = (size_t)(K / CPU_I8_GROUP) * CPU_I8_BLOCK_BYTES;
    for (int32_t m = 0; m < M; m++) /* the weights' own quantizer (cpu_wt.c), so both sides agree */
        (void)cpu_wt_store(CPU_WT_I8, xq + (size_t)m * row_bytes, 0, x + (int64_t)m * K, ST_F32, (size_t)K);
}

int cpu_gemm_bf16_dot_available(void)
{
#if defined(PG_GEMM_DOT)
    /* libgcc reports the AVX-512 features only where the OS saves the zmm
     * state (XCR0), as cpu_gemm_variant_available's avx512f */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int cpu_gemm_q8_dot_available(void)
{
#if defined(PG_GEMM_DOT)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* Which kernel runs mode p (bf16, or int8 on whole blocks) under variant
 * v: AUTO resolves to the best variant; AVX-512 runs the dot-instruction
 * kernel where the CPU has its instructions, else the avx2 one (same
 * bits), as AVX2 does; generic the generic one. */
typedef enum { MODE_KERNEL_GENERIC, MODE_KERNEL_AVX2, MODE_KERNEL_DOT } mode_kernel;

static mode_kernel mode_kernel_for(cpu_matmul_precision p, cpu_gemm_variant v)
{
#if defined(PG_GEMM_X86)
    if (v == CPU_GEMM_AUTO)
        v = cpu_gemm_variant_best();
    if (v == CPU_GEMM_AVX512 && ((p == CPU_MATMUL_BF16 && cpu_gemm_bf16_dot_available()) ||
                                 (p == CPU_MATMUL_INT8 && cpu_gemm_q8_dot_available())))
        return MODE_KERNEL_DOT;
    if (v == CPU_GEMM_AVX2 || v == CPU_GEMM_AVX512)
        return MODE_KERNEL_AVX2;
#else
    (void)p;
    (void)v;
#endif
    return MODE_KERNEL_GENERIC;
}

const char *cpu_gemm_mode_kernel_name(cpu_matmul_precision p, cpu_gemm_variant v)
{
    if ((unsigned)p >= CPU_MATMUL_COUNT || (unsigned)v >= CPU_GEMM_VARIANT_COUNT || !cpu_gemm_variant_available(v))
        return NULL;
    if (p == CPU_MATMUL_EXACT)
        return cpu_gemm_variant_name(v == CPU_GEMM_AUTO ? cpu_gemm_variant_best() : v);
    switch (mode_kernel_for(p, v)) {
    case MODE_KERNEL_DOT: return p == CPU_MATMUL_BF16 ? "avx512bf16" : "avx512vnni";
    case MODE_KERNEL_AVX2: return "avx2";
    case MODE_KERNEL_GENERIC: break;
    }
    return "generic";
}

typedef struct mode_job {
    cpu_gemm_q8_cols_fn q8;
    cpu_gemm_bf16_cols_fn bf16;
    float *y;
    int64_t ldy;
    const void *x;
    const void *w;
    int32_t M, K;
} mode_job;

static void mode_task(void *ctx, int32_t n0, int32_t n1)
{
    const mode_job *j = ctx;
    if (j->q8)
        j->q8(j->y, j->ldy, j->x, j->w, j->M, j->K, n0, n1);
    else
        j->bf16(j->y, j->ldy, j->x, j->w, j->M, j->K, n0, n1);
}

void cpu_gemm_mode(cpu_matmul_precision p, cpu_gemm_variant v, cpu_wt wt, cpu_pool *pool, float *y,
                   int64_t ldy, const float *x, const void *w, int32_t M, int32_t N, int32_t K,
                   void *scratch)
{
    assert(cpu_matmul_precision_accepts(p, wt));
    assert(cpu_gemm_variant_available(v));
    if (p == CPU_MATMUL_EXACT || (p == CPU_MATMUL_INT8 && !q8_applies(p, K)) || M == 0) {
        cpu_gemm_wt(v, wt, pool, y, ldy, x, w, M, N, K);
        return;
    }
    const mode_kernel mk = mode_kernel_for(p, v);
    (void)mk; /* read only in x86-64 builds */
    mode_job job = {0};
    job.y = y;
    job.ldy = ldy;
    job.x = scratch;
    job.w = w;
    job.M = M;
    job.K = K;
    if (p == CPU_MATMUL_BF16) {
        cpu_bf16_round_rows(scratch, x, (int64_t)M * K);
        job.bf16 = cpu_gemm_bf16_cols_generic;
#if defined(PG_GEMM_X86)
        if (mk == MODE_KERNEL_AVX2)
            job.bf16 = cpu_gemm_bf16_cols_avx2;
#endif
#if defined(PG_GEMM_DOT)
        if (mk == MODE_KERNEL_DOT)
            job.bf16 = cpu_gemm_bf16_cols_avx512bf16;
#endif
    } else {
        job.q8 = cpu_gemm_q8_cols_generic;
#if defined(PG_GEMM_X86)
        if (mk != MODE_KERNEL_GENERIC) /* the same bytes: 0.34 against 1.9 ns per element */
            cpu_q8_quantize_rows_avx2(scratch, x, M, K);
        else
            cpu_q8_quantize_rows(scratch, x, M, K);
        if (mk == MODE_KERNEL_AVX2)
            job.q8 = cpu_gemm_q8_cols_avx2;
#else
        cpu_q8_quantize_rows(scratch, x, M, K);
#endif
#if defined(PG_GEMM_DOT)
        if (mk == MODE_KERNEL_DOT)
            job.q8 = cpu_gemm_q8_cols_avx512vnni;
#endif
    }
    cpu_gemm_run_cols(pool, M, N, K, mode_task, &job);
}
