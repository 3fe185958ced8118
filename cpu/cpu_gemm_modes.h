/* cpu_gemm_modes: the CPU executor's reduced-precision matmul arithmetic,
 * opt-in (`--matmul-precision bf16|int8`), each with a canonical order of
 * its own so that a mode's output is still a pure function of the input:
 * bit-identical across batch composition, M, column splits, thread counts
 * and instruction sets, exactly as the exact (f32) GEMM of cpu_gemm.h is.
 *
 * Exact (CPU_MATMUL_EXACT, the default): cpu_gemm.h, unchanged.
 *
 * bf16 (CPU_MATMUL_BF16). Weights are stored bf16 (an f32 checkpoint is
 * rounded to bf16 at load). Each row of x [M][K] f32 is rounded to bf16
 * (round to nearest even, pg_f32_to_bf16) before the product. Then, in
 * the order of x86's VDPBF16PS (Intel SDM: "FP32 FMA with DAZ in, FTZ out
 * and RNE rounding", the odd element of each pair first), for y[m][n]:
 *   acc[l] = +0 for the 16 lanes l;
 *   for c = 0, 1, ... < ceil(K / 32), for every lane l (x, w read 0 past K):
 *       acc[l] = ftz(fma(daz(x[32c + 2l + 1]), daz(w[32c + 2l + 1]), acc[l]))
 *       acc[l] = ftz(fma(daz(x[32c + 2l]),     daz(w[32c + 2l]),     acc[l]))
 *   then the 16-lane tree of cpu_gemm.h, each addition ftz'd.
 * daz(v): a subnormal input reads as zero of its sign; ftz(r): a result
 * that is subnormal after rounding to f32's own precision becomes zero of
 * its sign (both are MXCSR's DAZ and FTZ bits, which the x86 kernels set
 * around the product; the generic kernel does them in software, with x86's
 * tininess after rounding: a result whose exact value is below FLT_MIN -
 * 2^-151 is flushed even where it would round to FLT_MIN). Products of two
 * bf16 are exact in f32, so each step is one rounding, as in the
 * instruction. Where the CPU has AVX512_BF16 the instruction computes the
 * same sequence (tests/ops/test_gemm_bf16.c pins that where it can run),
 * and the avx512bf16 kernel is that instruction, one zmm per output.
 *
 * int8 (CPU_MATMUL_INT8, W8A8). Weights are stored int8 in blocks of 32
 * with an f32 scale (cpu_wt.h CPU_WT_I8, as `--quantization int8`). For a
 * product with K % 32 == 0, each row of x is quantized the same way, per
 * block of 32 of its own K (q8 rows below: scale = max|x| / 127, q = round
 * to nearest even of x / scale, clamped to +-127). Then for y[m][n], with
 * the blocks b = 0 .. K/32 - 1 of row m of x (scale sx_b, ints qx) and of
 * row n of w (sw_b, qw):
 *   p_b[j] = sum_{i<4} qx[32b + 4j + i] * qw[32b + 4j + i]   (int32, exact)
 *   acc[j] = +0 for the 8 lanes j;
 *   for b increasing: acc[j] = fma((float)p_b[j], sx_b * sw_b, acc[j])
 *                     (sx_b * sw_b one f32 product; (float)p exact)
 *   s4[i] = acc[i] + acc[i + 4], s2[i] = s4[i] + s4[i + 2], y = s2[0] + s2[1].
 * Integer sums are exact, so any instruction that forms p_b[j] (x86's
 * pmaddubsw + pmaddwd in the avx2 kernel, VNNI's vpdpbusd in the
 * avx512vnni one) gives the same ints; the float steps are fixed above. A product with K % 32 != 0 (stories260K's
 * down_proj: K = 172) computes as `--quantization int8` does, x in f32
 * (W8A16, cpu_gemm.h's order on the dequantized weights): the shape alone
 * decides, so invariance holds.
 *
 * Kernels (cpu_gemm_kernel.h; every one computes the orders above, so all
 * give the same bits), and the one cpu_gemm_mode runs per variant v:
 *
 *   v        bf16                          int8 (K % 32 == 0)
 *   generic  generic (the definition)      generic (the definition)
 *   avx2     avx2 (AVX2 + FMA)             avx2 (AVX2 + FMA)
 *   avx512   avx512bf16 where the CPU has  avx512vnni where the CPU has
 *            AVX-512F/BW/VL + AVX512_BF16  AVX-512F/BW/VL + AVX512_VNNI
 *            (VDPBF16PS), else avx2        (VPDPBUSD), else avx2
 *   auto     as the best variant (cpu_gemm_variant_best)
 *
 * cpu_gemm_mode_kernel_name says which one runs. Measured on a Sapphire
 * Rapids Xeon (2026-11-26, bench/RESULTS.md): both dot kernels equal the
 * definition bit for bit there and run 1.4-2.0x their avx2 twins, but
 * below the exact AVX-512 f32 kernel at M >= 16 (bf16 ~165, int8 ~230,
 * exact ~330 GFLOP/s on 2 threads): their 4 x 6 tiles were written
 * without such a CPU and are untuned.
 *
 * Layouts: q8 rows [M][K/32] blocks of CPU_I8_BLOCK_BYTES (= the weight
 * blocks of cpu_wt.h: f32 scale, 32 int8); bf16 rows [M][K] uint16.
 */
#ifndef PG_CPU_GEMM_MODES_H
#define PG_CPU_GEMM_MODES_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_gemm.h"
#include "cpu_pool.h"
#include "cpu_wt.h"

typedef enum cpu_matmul_precision {
    CPU_MATMUL_EXACT = 0,
    CPU_MATMUL_BF16,
    CPU_MATMUL_INT8,
    CPU_MATMUL_COUNT
} cpu_matmul_precision;

/* "exact", "bf16", "int8"; NULL out of range */
const char *cpu_matmul_precision_name(cpu_matmul_precision p);
/* The weight storage a mode computes on: exact any, bf16 CPU_WT_BF16,
 * int8 CPU_WT_I8. 1 if wt is one the mode accepts. */
int cpu_matmul_precision_accepts(cpu_matmul_precision p, cpu_wt wt);

/* Bytes of scratch cpu_gemm_mode needs for x [M][K] (0 for exact and for
 * int8 products that run W8A16). */
size_t cpu_gemm_mode_scratch_bytes(cpu_matmul_precision p, int32_t M, int32_t K);

/* x [M][K] f32 -> bf16 rows [M][K] (round to nearest even) */
void cpu_bf16_round_rows(uint16_t *xb, const float *x, int64_t n);
/* x [M][K] f32 -> q8 rows [M][K/32] (K % 32 == 0) */
void cpu_q8_quantize_rows(unsigned char *xq, const float *x, int32_t M, int32_t K);

/* y [M][ldy] = x @ w^T in mode p on weights w [N][K] stored as wt (which p
 * must accept), with variant v (CPU_GEMM_AUTO = the best; which kernel
 * each variant runs: the table above; the bits are the same).
 * scratch: cpu_gemm_mode_scratch_bytes(p, M, K) bytes, 64-byte aligned,
 * or NULL when that is 0. Exact = cpu_gemm_wt. */
void cpu_gemm_mode(cpu_matmul_precision p, cpu_gemm_variant v, cpu_wt wt, cpu_pool *pool, float *y,
                   int64_t ldy, const float *x, const void *w, int32_t M, int32_t N, int32_t K,
                   void *scratch);

/* The kernel cpu_gemm_mode runs for mode p under variant v (the table
 * above; for int8, on products with K % 32 == 0): "avx512bf16",
 * "avx512vnni", "avx2", "generic"; for exact, the GEMM variant's name.
 * NULL if p or v is out of range or v is not available here. */
const char *cpu_gemm_mode_kernel_name(cpu_matmul_precision p, cpu_gemm_variant v);

#endif /* PG_CPU_GEMM_MODES_H */
