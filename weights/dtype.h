/* dtype: the element types a safetensors file may hold, and the float
 * conversions the loaders need (f16/bf16 -> f32 for the CPU, f32 -> bf16 for
 * the GPU upload). Pure functions, no state. */
#ifndef PG_DTYPE_H
#define PG_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum st_dtype {
    ST_F32 = 0,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I8,
    ST_U8,
    ST_I16,
    ST_I32,
    ST_I64,
    ST_BOOL,
    ST_DTYPE_COUNT,
} st_dtype;

/* Bytes per element (1 for BOOL, I8, U8). */
size_t st_dtype_size(st_dtype t);
/* The safetensors spelling: "F32", "BF16", ... */
const char *st_dtype_name(st_dtype t);
/* Parses a safetensors dtype string of length len; returns -1 if unknown. */
int st_dtype_parse(const char *s, size_t len);
/* True for F32, F16, BF16: the dtypes a weight may have. */
int st_dtype_is_float_weight(st_dtype t);

/* IEEE binary16 -> binary32, exact (subnormals, inf, NaN kept). */
float pg_f16_to_f32(uint16_t h);
/* bfloat16 -> binary32, exact (it is the top half of the f32 bits). */
float pg_bf16_to_f32(uint16_t b);
/* binary32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN
 * (sign and top payload kept, quiet bit forced). RNE: add 0x7FFF plus the
 * lowest kept bit; a carry into the exponent is the correct rounding (up to
 * inf past bf16's max). Inline and without a branch, so that a loop over a
 * row (the CPU's kv_write, cpu_wt.c) vectorizes: called once per element
 * through this library it was 15% of a 110m prefill. */
static inline uint16_t pg_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    const uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}
/* binary32 -> binary16, round to nearest even; overflow -> inf. */
uint16_t pg_f32_to_f16(float f);

/* Converts n elements of a float weight dtype (F32, F16, BF16) to f32.
 * src may be unaligned (it points into an mmapped file). */
void pg_convert_to_f32(float *dst, const void *src, st_dtype src_dtype, size_t n);

#endif /* PG_DTYPE_H */
