/* cpu_math: internal to cpu/ — deterministic, vectorizable float math for
 * the CPU ops: a 16-lane vector type and exp written with plain * and +.
 *
 * Why. cpu/ must give the same bits on every x86-64 level it is compiled
 * for (tests/ops/test_isa_identity.c) and for any batch or thread count.
 * The project builds C11 (ISO mode: -ffp-contract=off, no implicit FMA) and
 * without -ffast-math, so GCC never reorders a float reduction: a loop that
 * sums into one scalar stays scalar. The way to vectorize and stay exact is
 * to write the lanes out: cm_v16f is a GCC vector extension type of 16
 * floats whose element-wise + - * / compile to whatever the ISA has (one
 * zmm on AVX-512, two ymm on AVX2, four xmm on SSE2) with the same IEEE
 * single-rounding result in every lane; a reduction over lanes is written
 * as one fixed tree (cm_hsum). No fma: a separate multiply and add is what
 * every ISA has (a fused one would need the fmaf libcall on SSE2).
 *
 * cm_exp is exp for all 16 lanes at once, the same polynomial on every ISA
 * (glibc's expf is correctly rounded in most cases but picks an FMA or an
 * SSE2 implementation by CPU, and is a scalar call). Method (Cephes expf,
 * S. L. Moshier): clamp x to [-104, 88.8]; n = round(x / ln2) by the
 * 1.5 * 2^23 trick (round to nearest even, no conversion instruction);
 * r = x - n * ln2 in two steps (Cody-Waite: ln2_hi has 9 significant bits,
 * so n * ln2_hi and x - n * ln2_hi are exact), |r| <= ln2 / 2; e^r by
 * Cephes' degree-7 minimax polynomial 1 + r + r^2 * P(r), Horner form;
 * then * 2^(n/2) * 2^(n - n/2), two exact scalings by powers of two built
 * from the exponent bits (the second one rounds once if the result is
 * subnormal, and overflows to +inf above FLT_MAX). Accuracy against expf:
 * within 1 ulp for results >= FLT_MIN, within one subnormal step below
 * (tests/ops/test_attention_fast.c checks it). exp(-inf) = 0, x < -104
 * gives +0, x > 88.73 gives +inf, NaN gives NaN.
 *
 * A caveat measured on AVX2 with GCC 12: arithmetic on cm_v16f splits into
 * two ymm well, but its comparisons become a compare and branch per lane,
 * its shuffles lane moves, and a value joined from two ymm a trip through
 * general registers. Hot loops on such machines therefore run 8 lanes at a
 * time (cm_exp8; cpu_attention.c's attn_vf), and cm_hsum16 has an AVX2
 * form; the bits are the same.
 *
 * Functions are static inline in this header; cm_v16f arguments are passed
 * by value between inlined helpers of one translation unit, never across an
 * ABI boundary, so GCC's -Wpsabi note about 64-byte vectors on narrower
 * ISAs does not apply (it is silenced here and in the files that include
 * this header).
 */
#ifndef PG_CPU_MATH_H
#define PG_CPU_MATH_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define CM_LANES 16

typedef float cm_v16f __attribute__((vector_size(64)));
typedef int32_t cm_v16i __attribute__((vector_size(64)));
typedef uint32_t cm_v16u __attribute__((vector_size(64)));
typedef float cm_v8f __attribute__((vector_size(32)));
typedef float cm_v4f __attribute__((vector_size(16)));
typedef uint16_t cm_v16h __attribute__((vector_size(32)));

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

static inline cm_v16f cm_zero(void)
{
    return (cm_v16f){0.0f};
}

static inline cm_v16f cm_splat(float x)
{
    return (cm_v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

/* 16 floats from p (any alignment) */
static inline cm_v16f cm_load(const float *p)
{
    cm_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void cm_store(float *p, cm_v16f v)
{
    memcpy(p, &v, sizeof v);
}

/* The fixed summing tree over the 16 lanes (the one cpu_gemm.h uses):
 * s8[i] = a[i] + a[i+8], s4[i] = s8[i] + s8[i+4], s2[i] = s4[i] + s4[i+2],
 * sum = s2[0] + s2[1]. */
static inline float cm_hsum(cm_v16f a)
{
    const cm_v8f s8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const cm_v4f s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* Sixteen cm_hsum at once: lane i of the result is cm_hsum(a[i]), bit for
 * bit (every lane sees the same pairings in the same order, (l, l+8),
 * (l, l+4), (l, l+2), (l, l+1); IEEE addition is commutative, so which
 * operand comes first does not matter). A shuffle network in place of 16
 * horizontal reductions: 30 two-vector shuffles and 15 adds for 16 sums. */
static inline cm_v16f cm_hsum16(const cm_v16f *a)
{
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* AVX2: a cm_v16f is two ymm (lanes 0..7, 8..15), and GCC lowers the
     * 64-byte shuffles below lane by lane (~290 instructions for 16 sums,
     * a quarter of a prefill attention tile's work). The same pairings with
     * 8-lane shuffles: 30 shuffles and 30 adds. */
    __m256 s8[16], s4[8], s2[4], s1[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) { /* (l, l+8): the two halves */
        __m256 lo, hi;
        memcpy(&lo, (const float *)&a[i], sizeof lo);
        memcpy(&hi, (const float *)&a[i] + 8, sizeof hi);
        s8[i] = _mm256_add_ps(lo, hi);
    }
    /* (l, l+4): s4[k] = [input 2k lanes 0..3 | input 2k+1 lanes 0..3] */
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        s4[k] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x20),
                              _mm256_permute2f128_ps(s8[2 * k], s8[2 * k + 1], 0x31));
    /* (l, l+2): s2[k] = [4k: 0,1 | 4k+2: 0,1 || 4k+1: 0,1 | 4k+3: 0,1] */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        s2[k] = _mm256_add_ps(_mm256_shuffle_ps(s4[2 * k], s4[2 * k + 1], 0x44),
                              _mm256_shuffle_ps(s4[2 * k], s4[2 * k + 1], 0xEE));
    /* (l, l+1): s1[k] = inputs 8k + 0, 2, 4, 6, 1, 3, 5, 7 */
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++)
        s1[k] = _mm256_add_ps(_mm256_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0x88),
                              _mm256_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0xDD));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    cm_v16f out;
    const __m256 o0 = _mm256_permutevar8x32_ps(s1[0], order), o1 = _mm256_permutevar8x32_ps(s1[1], order);
    memcpy((float *)&out, &o0, sizeof o0);
    memcpy((float *)&out + 8, &o1, sizeof o1);
    return out;
#else
    cm_v16f r[8], q[4], p[2];
    /* (l, l+8): r[i] lanes 0..7 belong to input 2i, 8..15 to input 2i+1 */
    for (int i = 0; i < 8; i++)
        r[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                       30, 31);
    /* (l, l+4): q[i] lanes 4k..4k+3 belong to input 4i+k */
    for (int i = 0; i < 4; i++)
        q[i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                                       27) +
               __builtin_shufflevector(r[2 * i], r[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    /* (l, l+2): p[i] lanes 2k, 2k+1 belong to input 8i+k */
    for (int i = 0; i < 2; i++)
        p[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                                       29) +
               __builtin_shufflevector(q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    /* (l, l+1): lane k is input k */
    return __builtin_shufflevector(p[0], p[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(p[0], p[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#endif
}

/* Widening 16-bit storage to f32, exactly, at either width (cm_load_bf16 /
 * cm_load_f16: 16 lanes; cm_load_bf16_8 / cm_load_f16_8: 8, what AVX2 hot
 * loops use); lanes are independent, so both widths give the same bits.
 * bf16: the bits shifted up by 16. f16: integer operations and one multiply
 * by a power of two (no F16C needed, the same bits on every ISA): the
 * exponent and mantissa fields, moved to f32's positions, read as an f32
 * 2^112 times too small (an f16 subnormal lands on an f32 subnormal, whose
 * scaling is exact as well: the default MXCSR has no DAZ); inf and NaN
 * (exponent 31) get f32's all-ones exponent, payload kept; then the sign. */
#define CM_WIDEN_DEFINE(bf16_name, f16_name, VF, VI, VU, VH)                                              \
    static inline VF bf16_name(const uint16_t *p)                                                         \
    {                                                                                                     \
        VH h;                                                                                             \
        memcpy(&h, p, sizeof h);                                                                          \
        return (VF)(__builtin_convertvector(h, VU) << 16);                                                \
    }                                                                                                     \
    static inline VF f16_name(const uint16_t *p)                                                          \
    {                                                                                                     \
        VH h;                                                                                             \
        memcpy(&h, p, sizeof h);                                                                          \
        const VU u = __builtin_convertvector(h, VU);                                                      \
        const VU em = (u & 0x7fffu) << 13;                                                                \
        const VF fin = (VF)em * 0x1p112f;                                                                 \
        const VF nonfin = (VF)(em | 0x7f800000u);                                                         \
        const VI big = (VI)(em >= (0x7c00u << 13));                                                       \
        const VF v = (VF)(((VI)nonfin & big) | ((VI)fin & ~big));                                         \
        return (VF)((VU)v | ((u & 0x8000u) << 16));                                                       \
    }
typedef int32_t cm_v8i __attribute__((vector_size(32)));
typedef uint32_t cm_v8u __attribute__((vector_size(32)));
typedef uint16_t cm_v8h __attribute__((vector_size(16)));
CM_WIDEN_DEFINE(cm_load_bf16, cm_load_f16, cm_v16f, cm_v16i, cm_v16u, cm_v16h)
CM_WIDEN_DEFINE(cm_load_bf16_8, cm_load_f16_8, cm_v8f, cm_v8i, cm_v8u, cm_v8h)
#undef CM_WIDEN_DEFINE

/* e^x in every lane (see the header comment for method and accuracy),
 * defined once for any vector width: cm_exp on 16 lanes, cm_exp8 on 8.
 * The lanes are independent, so both give the same bits per value. Why
 * two: on AVX2 GCC 12 turns the comparisons of a 64-byte vector into a
 * scalar compare and branch per lane, so AVX2 hot loops run 8 lanes (a
 * ymm) at a time with cm_exp8. */
#define CM_EXP_DEFINE(name, VF, VI, VU)                                                                         \
    static inline VF name(VF x)                                                                                 \
    {                                                                                                           \
        const VF zero = {0.0f};                                                                                 \
        const VF lo = zero + -104.0f, hi = zero + 88.8f;                                                        \
        x = (VF)((((VI)lo) & (VI)(x < lo)) | (((VI)x) & ~(VI)(x < lo))); /* NaN compares false, stays NaN */  \
        x = (VF)((((VI)hi) & (VI)(x > hi)) | (((VI)x) & ~(VI)(x > hi)));                                       \
        /* t = 1.5 * 2^23 + n: adding the magic number rounds x / ln2 to the                                 \
         * nearest integer n (even on ties); its low mantissa bits hold n */                                   \
        const VF t = x * 1.44269504088896341f + 0x1.8p23f;                                                      \
        const VF n = t - 0x1.8p23f;                                                                             \
        const VI ni = (VI)((VU)t - 0x4B400000u); /* bits of 0x1.8p23f */                                        \
        const VF r = (x - n * 0.693359375f) - n * -2.12194440e-4f;                                              \
        const VF z = r * r;                                                                                     \
        const VF p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +              \
                        4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f;      \
        /* 2^n = 2^n1 * 2^n2, n1 = floor(n / 2) in [-75, 64], n2 = n - n1 in                                  \
         * [-75, 64]: both are normal floats, so p * 2^n1 is exact */                                         \
        const VI n1 = ni >> 1;                                                                                  \
        const VU n2 = (VU)ni - (VU)n1;                                                                          \
        const VF s1 = (VF)(((VU)n1 + 127u) << 23);                                                              \
        const VF s2 = (VF)((n2 + 127u) << 23);                                                                  \
        return (p * s1) * s2;                                                                                   \
    }
CM_EXP_DEFINE(cm_exp, cm_v16f, cm_v16i, cm_v16u)
CM_EXP_DEFINE(cm_exp8, cm_v8f, cm_v8i, cm_v8u)
#undef CM_EXP_DEFINE

/* cm_exp of one value (lane 0): the same bits as the vector version */
static inline float cm_expf(float x)
{
    return cm_exp(cm_splat(x))[0];
}

#pragma GCC diagnostic pop

#endif /* PG_CPU_MATH_H */
