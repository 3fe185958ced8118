/* emu_half: the emulator's __nv_bfloat16 / __half (and their pairs) with
 * the conversion intrinsics gpu/ uses, written here from the IEEE formats
 * rather than taken from cuda_bf16.hpp (whose host paths depend on the
 * toolkit version): storage is the 16-bit pattern; f32 -> 16-bit rounds to
 * nearest even (the _rn intrinsics), NaN stays NaN, overflow gives inf
 * (f16) as on the device; 16-bit -> f32 is exact. tests/cuda_emu/test_emu
 * checks these against common/dtype's conversions on every f16/bf16
 * pattern and on random and boundary f32 values. */
#ifndef EMU_HALF_H
#define EMU_HALF_H

#include <stdint.h>
#include <string.h>

struct alignas(2) __nv_bfloat16 {
    uint16_t bits;
};
struct alignas(2) __half {
    uint16_t bits;
};
/* pairs: 4-byte aligned, as on the device (a misaligned pair load is a
 * misaligned-address fault there; UBSan's alignment check here) */
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
struct alignas(4) __half2 {
    __half x, y;
};

namespace emu {

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> bf16, round to nearest even; NaN -> quiet NaN of the same sign. */
static inline uint16_t f32_to_bf16_rn(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static inline float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* f32 -> IEEE binary16, round to nearest even, subnormals, overflow -> inf,
 * NaN -> quiet NaN. */
static inline uint16_t f32_to_f16_rn(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf (65504 is the largest) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal f16: exponent >= -14 */
        uint32_t lsb = (a >> 13) & 1u;
        a += 0xfffu + lsb;
        return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
    }
    /* subnormal f16 (or zero): value = m * 2^-24, m = round(|f| * 2^24) */
    if (a < 0x33000000u) /* < 2^-25: rounds to 0 (exactly 2^-25 ties to even 0) */
        return sign;
    uint32_t e = a >> 23;                  /* 102 .. 112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;             /* 14 .. 24: m * 2^(e-150) / 2^-24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* exact: m * 2^-24 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

} // namespace emu

struct float2;
static inline float __bfloat162float(__nv_bfloat16 h) { return emu::bf16_to_f32(h.bits); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{emu::f32_to_bf16_rn(f)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __half2float(__half h) { return emu::f16_to_f32(h.bits); }
static inline __half __float2half_rn(float f) { return __half{emu::f32_to_f16_rn(f)}; }
static inline __half __float2half(float f) { return __float2half_rn(f); }

#endif
