/* cpu_gemm: the CPU executor's matrix multiply, y = x @ w^T, written so that
 * every output element is computed the same way whatever the batch, the
 * thread count and the machine's instruction set.
 *
 *   y [M][N] f32, x [M][K] f32, w [N][K] f32 (PyTorch nn.Linear layout,
 *   row-major, w not repacked: the embedding table doubles as lm_head);
 *   or w [N][K] bf16 / int8 blocks (cpu_gemm_wt, cpu_wt.h), widened in
 *   registers to the f32 values the canonical order then runs on.
 *
 * The canonical reduction order (the invariance contract). y[m][n] is the
 * dot product of row m of x with row n of w, accumulated in 16 f32 lanes:
 * lane l (0..15) holds the sum over k = l, l+16, l+32, ... in increasing k,
 * one fused multiply-add (fmaf, single rounding) per step, starting from
 * +0; the tail of K is read zero-padded into the last step (a real fma of
 * 0 * 0 into lanes past K). The lanes are then summed by one fixed tree:
 *   s8[i] = l[i] + l[i+8], s4[i] = s8[i] + s8[i+4], s2[i] = s4[i] + s4[i+2],
 *   y = s2[0] + s2[1].
 * Every variant (cpu_gemm_kernel.c: AVX-512 with one zmm per output, AVX2
 * with two ymm, generic with 16 scalar fmaf lanes) runs exactly this
 * sequence, so results are bit-identical across x86-64 machines; register
 * tiles of several rows x several columns only decide which accumulators
 * live in registers together. Hence y[m][n] is bit-identical for every M,
 * every other row, every column split, every thread count and every
 * variant (tests/ops/test_cpu_gemm.c, tests/ops/test_isa_identity.c).
 * OpenBLAS does not promise this: its sgemv and sgemm paths and its
 * M-dependent blocking round differently; see bench/gemm_bench.c.
 *
 * The variant is chosen at run time (__builtin_cpu_supports), not by the
 * build's -march: a portable build is as fast as a native one.
 *
 * Speed: register tiles (4 x 6 outputs AVX-512, 4 x 3 AVX2); a tile of w
 * rows stays in L1 while a block of x rows streams past it from L2; at
 * M = 1 (batch-1 decode) a 1 x 6 tile with every accumulator in registers
 * streams w once, prefetching ahead of each row. On AVX2 from M = 16 (24
 * where K > 1024) the 16 lanes run as 16 independent outer products
 * instead ("lane-major", cpu_gemm_kernel.c pk_cols): x and 24-column
 * panels of w are packed per lane (w transposed, widened from bf16 / int8
 * once), a ymm accumulates one lane of 8 columns with x broadcast (4 x 24
 * outputs per register tile), and the tree is merged lane by lane; it runs
 * at ~0.9-1.0x OpenBLAS sgemm at M = 128 where the 4 x 3 tile ran at
 * ~0.55-0.75x (bench/RESULTS.md, 2026-11-26). Work is split over columns
 * (N) across the pool: by work for M > 4, in 16 chunks per thread for
 * M <= 4 (a memory-bound product then never leaves one thread running the
 * last big chunk alone).
 */
#ifndef PG_CPU_GEMM_H
#define PG_CPU_GEMM_H

#include <stdint.h>

#include "cpu_pool.h"
#include "cpu_wt.h"

/* The kernel variants; CPU_GEMM_AUTO = the fastest this CPU runs. */
typedef enum cpu_gemm_variant {
    CPU_GEMM_AUTO = 0,
    CPU_GEMM_GENERIC,
    CPU_GEMM_AVX2,
    CPU_GEMM_AVX512,
    CPU_GEMM_VARIANT_COUNT
} cpu_gemm_variant;

/* 1 if this build has the variant and this CPU (and OS) can run it. */
int cpu_gemm_variant_available(cpu_gemm_variant v);
/* What CPU_GEMM_AUTO resolves to here. */
cpu_gemm_variant cpu_gemm_variant_best(void);
/* "auto", "generic", "avx2", "avx512"; NULL for an out-of-range value. */
const char *cpu_gemm_variant_name(cpu_gemm_variant v);

/* Columns [n0, n1) of y for all M rows, on the calling thread, with the
 * best variant. ldy: row stride of y in elements (>= N; the logits op
 * writes into a caller's [L][V] array). */
void cpu_gemm_cols(float *y, int64_t ldy, const float *x, const float *w,
                   int32_t M, int32_t K, int32_t n0, int32_t n1);

/* The whole product with the best variant, split over columns across pool
 * (pool may be NULL: single-threaded). Results do not depend on the pool
 * size. */
void cpu_gemm(cpu_pool *pool, float *y, int64_t ldy, const float *x, const float *w,
              int32_t M, int32_t N, int32_t K);

/* cpu_gemm with a chosen variant, which must be available (checked with an
 * assert; CPU_GEMM_AUTO is always available). Same bits as cpu_gemm. */
void cpu_gemm_with(cpu_gemm_variant v, cpu_pool *pool, float *y, int64_t ldy, const float *x,
                   const float *w, int32_t M, int32_t N, int32_t K);

/* cpu_gemm_with for a weight matrix w [N][K] stored as wt (cpu_wt.h): the
 * kernel widens bf16 (exact) or dequantizes int8 blocks in registers and
 * runs the same canonical order on those values, so the result is
 * bit-identical to the f32 product of the matrix cpu_wt_get() reads. */
void cpu_gemm_wt(cpu_gemm_variant v, cpu_wt wt, cpu_pool *pool, float *y, int64_t ldy, const float *x,
                 const void *w, int32_t M, int32_t N, int32_t K);

/* Lanes of the canonical accumulation: 16, whatever the variant. */
int32_t cpu_gemm_lanes(void);
/* Name of the best variant: "avx512", "avx2", "generic". */
const char *cpu_gemm_isa(void);

#endif /* PG_CPU_GEMM_H */
