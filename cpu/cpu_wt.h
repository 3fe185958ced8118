/* cpu_wt: internal to cpu/ — the element types the CPU executor stores
 * weights and the KV cache in, and the exact conversions between them and
 * the f32 the ops compute in.
 *
 * Weights (EXEC_WT buffers: matrices and the embedding table):
 *   CPU_WT_F32   4 bytes per element.
 *   CPU_WT_BF16  2 bytes: the top half of the f32 bits. Widening is a 16-bit
 *                shift, exact, so a bf16 checkpoint stored as bf16 computes
 *                with the very numbers an f32 copy of it holds.
 *   CPU_WT_I8    symmetric int8 in blocks of CPU_I8_GROUP = 32 consecutive
 *                elements (flat index e: block e / 32, as llama.cpp's Q8_0):
 *                block = [f32 scale][32 x int8 q], 36 bytes, unaligned;
 *                element e's value is (float)q * scale (one f32 rounding).
 *                Quantization (cpu_wt_store): scale = max|w| / 127 over the
 *                block (f32 division), q = round-to-nearest-even(w / scale)
 *                clamped to [-127, 127]; an all-zero block has scale 0. The
 *                last block of a buffer may be partial. A row of a matrix
 *                with K % 32 == 0 is whole blocks; other K work too (the
 *                GEMM reads element by element then), only slower.
 *                (Tried 2026-11-28, commit 0f77aa9: superblocks [8 scales]
 *                [8 x 32 q] with every quant load 32-byte aligned. L2-hot
 *                int8 kernels ran 6-11% faster, but the M = 1 step from
 *                memory did not (int8 exact AVX-512 5-7% slower), and only
 *                K % 256 == 0 rows could use it: reverted, bench/RESULTS.md.)
 * Every op reads a weight as cpu_wt_get() would give it, and the GEMM then
 * runs the f32 canonical order on those values: an int8 or bf16 product is
 * bit-identical to the f32 product of the dequantized matrix
 * (tests/ops/test_cpu_gemm.c, test_isa_identity.c).
 *
 * KV cache (EXEC_KV): CPU_KV_F32, CPU_KV_BF16, CPU_KV_F16, written by
 * kv_write with round to nearest even (weights/dtype.h pg_f32_to_bf16 /
 * pg_f32_to_f16) and widened exactly by attention.
 */
#ifndef PG_CPU_WT_H
#define PG_CPU_WT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"

typedef enum cpu_wt {
    CPU_WT_F32 = 0,
    CPU_WT_BF16,
    CPU_WT_I8,
    CPU_WT_COUNT
} cpu_wt;

typedef enum cpu_kv {
    CPU_KV_F32 = 0,
    CPU_KV_BF16,
    CPU_KV_F16,
    CPU_KV_COUNT
} cpu_kv;

#ifndef CPU_I8_GROUP
#define CPU_I8_GROUP 32 /* a build may pick another (bench: the group-size study) */
#endif
#define CPU_I8_BLOCK_BYTES (4 + CPU_I8_GROUP)

/* "f32", "bf16", "int8"; NULL out of range */
const char *cpu_wt_name(cpu_wt t);
/* "f32", "bf16", "f16"; NULL out of range */
const char *cpu_kv_name(cpu_kv t);

/* Bytes that n elements of type t take (int8: whole blocks). */
size_t cpu_wt_bytes(cpu_wt t, size_t n);

/* Stores n elements of src (src_dtype F32/F16/BF16, may be unaligned) at
 * element offset off of the weight buffer dst (type t): bf16 copies bf16
 * and rounds others to nearest even; int8 quantizes block by block (off
 * must be a multiple of CPU_I8_GROUP and off + n either one too or the end
 * of the buffer, else 1 is returned and nothing is written). 0 on success. */
int cpu_wt_store(cpu_wt t, void *dst, size_t off, const void *src, st_dtype src_dtype, size_t n);

/* Element e of weight buffer w of type t, as f32 (exact for f32 and bf16;
 * the dequantized value for int8). */
static inline float cpu_wt_get(const void *w, cpu_wt t, int64_t e)
{
    switch (t) {
    case CPU_WT_BF16: {
        uint16_t h;
        memcpy(&h, (const uint16_t *)w + e, sizeof h);
        const uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    case CPU_WT_I8: {
        const unsigned char *blk = (const unsigned char *)w + (e / CPU_I8_GROUP) * CPU_I8_BLOCK_BYTES;
        float s;
        memcpy(&s, blk, sizeof s);
        return (float)(int8_t)blk[4 + e % CPU_I8_GROUP] * s;
    }
    default: {
        float f;
        memcpy(&f, (const float *)w + e, sizeof f);
        return f;
    }
    }
}

/* dst[i] = element e0 + i of w, i < n */
void cpu_wt_get_row(float *dst, const void *w, cpu_wt t, int64_t e0, int64_t n);

/* Bytes per KV element (4 or 2). */
size_t cpu_kv_bytes(cpu_kv t);
/* dst[i] = src[i] converted to the KV type, i < n (round to nearest even) */
void cpu_kv_store(cpu_kv t, void *dst, const float *src, int64_t n);
/* dst[i] = src[i] widened to f32 (exact), i < n */
void cpu_kv_load(cpu_kv t, float *dst, const void *src, int64_t n);

#endif /* PG_CPU_WT_H */
