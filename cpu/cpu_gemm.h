/* cpu_gemm: the CPU executor's matrix multiply, y = x @ w^T, written so that
 * every output element is computed the same way whatever the batch.
 *
 *   y [M][N] f32, x [M][K] f32, w [N][K] f32 (PyTorch nn.Linear layout,
 *   row-major, w not repacked: the embedding table doubles as lm_head).
 *
 * Reduction order (the batch-invariance contract). y[m][n] is the dot
 * product of row m of x with row n of w, accumulated in VL f32 lanes
 * (VL = 16 with AVX-512, 8 with AVX2+FMA, 4 otherwise): lane l holds
 * sum over k = l, l+VL, l+2VL, ... in increasing k, one fused multiply-add
 * per step (plain multiply then add in the portable build); the tail of K
 * is read zero-padded into the last step; the lanes are then summed by one
 * fixed tree. Register tiles of several rows x several columns only decide
 * which accumulators live in registers together; they never change that
 * sequence, so y[m][n] is bit-identical for every M, every other row, every
 * column split, and every thread count. (OpenBLAS does not promise this:
 * its sgemv and sgemm paths and its M-dependent blocking round
 * differently; see bench/gemm_bench.c.)
 *
 * Speed: tiles of MR x NR outputs (4 x 6 AVX-512, 4 x 3 AVX2): a tile of
 * w rows stays in L1 while a block of x rows streams past it from L2; at
 * M = 1 the kernel streams w once. Work is split over columns (N) across the pool.
 */
#ifndef PG_CPU_GEMM_H
#define PG_CPU_GEMM_H

#include <stdint.h>

#include "cpu_pool.h"

/* Columns [n0, n1) of y for all M rows, on the calling thread.
 * ldy: row stride of y in elements (>= N; the logits op writes into a
 * caller's [L][V] array). */
void cpu_gemm_cols(float *y, int64_t ldy, const float *x, const float *w,
                   int32_t M, int32_t K, int32_t n0, int32_t n1);

/* The whole product, split over columns across pool (pool may be NULL:
 * single-threaded). Results do not depend on the pool size. */
void cpu_gemm(cpu_pool *pool, float *y, int64_t ldy, const float *x, const float *w,
              int32_t M, int32_t N, int32_t K);

/* Lanes of the accumulation (for documentation, tests and the bench). */
int32_t cpu_gemm_lanes(void);
/* "avx512", "avx2", "generic" */
const char *cpu_gemm_isa(void);

#endif /* PG_CPU_GEMM_H */
