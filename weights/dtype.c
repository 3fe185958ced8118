/* dtype: safetensors element types and the float conversions (see dtype.h).
 *
 * Bit layouts: f32 = s|e8|m23 (bias 127), f16 = s|e5|m10 (bias 15),
 * bf16 = the top 16 bits of an f32 (s|e8|m7). Rounding is IEEE round to
 * nearest, ties to even, done on the integer bit patterns so the result does
 * not depend on the FPU's rounding mode or on -ffast-math. */
#include "dtype.h"

#include <assert.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I8] = {"I8", 1},   [ST_U8] = {"U8", 1},
    [ST_I16] = {"I16", 2},   [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8},
    [ST_BOOL] = {"BOOL", 1},
};

size_t st_dtype_size(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_info[t].size : 0;
}

const char *st_dtype_name(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_info[t].name : "?";
}

int st_dtype_parse(const char *s, size_t len)
{
    for (int t = 0; t < ST_DTYPE_COUNT; t++) {
        const char *n = dtype_info[t].name;
        if (strlen(n) == len && memcmp(n, s, len) == 0)
            return t;
    }
    return -1;
}

int st_dtype_is_float_weight(st_dtype t)
{
    return t == ST_F32 || t == ST_F16 || t == ST_BF16;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float pg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign); /* +-0 */
        /* subnormal: man * 2^-24; normalise so the leading 1 is bit 10 */
        uint32_t e = 127 - 15 + 1;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((man & 0x3FFu) << 13));
    }
    if (exp == 31) /* inf (man == 0) or NaN (payload kept, so NaN stays NaN) */
        return bits_f32(sign | 0x7F800000u | (man << 13));
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

float pg_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

uint16_t pg_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        if (ax > 0x7F800000u) /* NaN -> quiet NaN, top payload bits kept */
            return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
        return (uint16_t)(sign | 0x7C00u);
    }
    /* 65520 = 0x477FF000 is half way between 65504 (max f16, odd mantissa)
     * and 2^16: ties go to even, i.e. to inf. */
    if (ax >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);
    if (ax < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (ax <= 0x33000000u) /* <= 2^-25: rounds to 0 (2^-25 is a tie -> even 0) */
            return sign;
        uint32_t e = ax >> 23;                       /* 102 .. 112 */
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;   /* value = m * 2^(e-150) */
        uint32_t shift = 126 - e;                    /* value / 2^-24 = m >> shift */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* may reach 0x400: the smallest normal, encoded correctly */
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - ((uint32_t)(127 - 15) << 23)) >> 13; /* rebias exponent */
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is correct rounding */
    return (uint16_t)(sign | r);
}

void pg_convert_to_f32(float *dst, const void *src, st_dtype src_dtype, size_t n)
{
    const unsigned char *s = src;
    switch (src_dtype) {
    case ST_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = pg_f16_to_f32(h);
        }
        break;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = pg_bf16_to_f32(h);
        }
        break;
    default:
        /* Not a float weight dtype: a caller bug (st_get checks dtypes). */
        assert(!"pg_convert_to_f32: source dtype is not F32, F16 or BF16");
        memset(dst, 0, n * sizeof(float));
        break;
    }
}
