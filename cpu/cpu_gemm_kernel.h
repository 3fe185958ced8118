/* cpu_gemm_kernel: internal to cpu/ — the per-ISA column kernels that
 * cpu_gemm.c dispatches to (and tests/ops/test_isa_identity.c compares).
 * All of them compute columns [n0, n1) of y = x @ w^T for all M rows in the
 * canonical reduction order of cpu_gemm.h, so they return the same bits;
 * they differ only in speed and in the instructions they need:
 *
 *   cpu_gemm_cols_avx512   AVX-512F + FMA   (x86-64 builds only)
 *   cpu_gemm_cols_avx2     AVX2 + FMA       (x86-64 builds only)
 *   cpu_gemm_cols_generic  any machine      (fmaf per lane; slow without FMA hardware)
 *
 * Calling a variant the CPU does not support is undefined (SIGILL): use
 * cpu_gemm_variant_available() first. Layouts as in cpu_gemm_cols().
 */
#ifndef PG_CPU_GEMM_KERNEL_H
#define PG_CPU_GEMM_KERNEL_H

#include <stdint.h>

#include "cpu_pool.h"

/* y [M][ldy] f32, x [M][K] f32, w [N][K] of storage type wt (cpu_wt.h
 * cpu_wt: f32, bf16, int8 blocks), columns [n0, n1) */
typedef void (*cpu_gemm_cols_fn)(float *y, int64_t ldy, const float *x, const void *w, int32_t wt, int32_t M,
                                 int32_t K, int32_t n0, int32_t n1);

#if defined(PG_GEMM_X86)
void cpu_gemm_cols_avx512(float *y, int64_t ldy, const float *x, const void *w, int32_t wt, int32_t M, int32_t K,
                        int32_t n0, int32_t n1);
void cpu_gemm_cols_avx2(float *y, int64_t ldy, const float *x, const void *w, int32_t wt, int32_t M, int32_t K,
                        int32_t n0, int32_t n1);
#endif
void cpu_gemm_cols_generic(float *y, int64_t ldy, const float *x, const void *w, int32_t wt, int32_t M, int32_t K,
                        int32_t n0, int32_t n1);

/* The reduced-precision modes' column kernels (cpu_gemm_modes.h), one per
 * file and variant: generic; avx2 on x86-64; and, where the compiler has
 * the flags (PG_GEMM_DOT), the AVX-512 dot-instruction ones:
 *
 *   cpu_gemm_bf16_cols_avx512bf16  AVX-512F/BW/VL + AVX512_BF16 (VDPBF16PS)
 *   cpu_gemm_q8_cols_avx512vnni    AVX-512F/BW/VL + AVX512_VNNI (VPDPBUSD)
 *
 * which run only where cpu_gemm_bf16_dot_available() /
 * cpu_gemm_q8_dot_available() say so (elsewhere an AVX-512 machine runs
 * the avx2 ones). q8: xq [M][K/32] q8 rows, w [N][K/32] int8 weight
 * blocks, K % 32 == 0. bf16: xb [M][K] bf16 rows, w [N][K] bf16, any K. */
typedef void (*cpu_gemm_q8_cols_fn)(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w,
                                    int32_t M, int32_t K, int32_t n0, int32_t n1);
typedef void (*cpu_gemm_bf16_cols_fn)(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M,
                                      int32_t K, int32_t n0, int32_t n1);
#if defined(PG_GEMM_X86)
void cpu_gemm_q8_cols_avx2(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M,
                           int32_t K, int32_t n0, int32_t n1);
void cpu_gemm_bf16_cols_avx2(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M, int32_t K,
                             int32_t n0, int32_t n1);
/* cpu_q8_quantize_rows (cpu_gemm_modes.h), the same bytes, with AVX2 */
void cpu_q8_quantize_rows_avx2(unsigned char *xq, const float *x, int32_t M, int32_t K);
#endif
#if defined(PG_GEMM_DOT)
void cpu_gemm_bf16_cols_avx512bf16(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M,
                                   int32_t K, int32_t n0, int32_t n1);
void cpu_gemm_q8_cols_avx512vnni(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M,
                                 int32_t K, int32_t n0, int32_t n1);
#endif
/* 1 if this build has the avx512bf16 / avx512vnni kernel and this CPU (and
 * OS: the zmm state) runs it (cpu_gemm_modes.c) */
int cpu_gemm_bf16_dot_available(void);
int cpu_gemm_q8_dot_available(void);
void cpu_gemm_q8_cols_generic(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M,
                              int32_t K, int32_t n0, int32_t n1);
void cpu_gemm_bf16_cols_generic(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M,
                                int32_t K, int32_t n0, int32_t n1);

/* Runs task(ctx, n0, n1) over the columns [0, N) of an M x N x K product,
 * split across pool as cpu_gemm splits its own (whole register tiles per
 * share; the split never changes a value). pool may be NULL. */
typedef void (*cpu_gemm_cols_task)(void *ctx, int32_t n0, int32_t n1);
void cpu_gemm_run_cols(cpu_pool *pool, int32_t M, int32_t N, int32_t K, cpu_gemm_cols_task task, void *ctx);

#endif /* PG_CPU_GEMM_KERNEL_H */
