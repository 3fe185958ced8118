/* avx512_dot_emu: scalar stand-ins for the AVX-512 intrinsics the matmul
 * modes' dot kernels use (cpu/cpu_gemm_bf16_kernel.c avx512bf16,
 * cpu/cpu_gemm_q8_kernel.c avx512vnni), so that test_gemm_dot_emu.c can
 * compile those kernels' own source on a machine without AVX-512 and run
 * it against the generic definition. Test-only; it checks the kernels'
 * bookkeeping (tiles, tails, masks, odd columns, the shuffle tree, the
 * +128 offset, MXCSR), not the instructions: each stand-in is the Intel
 * SDM's per-element description written in C (VDPBF16PS: odd pair element
 * first, each step one fused multiply-add with its inputs' subnormals read
 * as zero and FTZ from MXCSR, which the kernel sets; the instruction
 * itself is pinned against the definition by test_gemm_bf16's
 * test_vdpbf16ps_pinned where a CPU has it).
 *
 * Include after <immintrin.h> (which defines the 512-bit vector types
 * whatever the target) in a file built with -mavx2 -mfma -Wno-psabi; each
 * intrinsic name used is redefined to a stand-in operating on those types
 * lane by lane. */
#ifndef PG_AVX512_DOT_EMU_H
#define PG_AVX512_DOT_EMU_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the kernels check these */
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512BF16__ 1
#define __AVX512VNNI__ 1

typedef union emu512 {
    float f[16];
    int32_t i[16];
    uint8_t u8[64];
    int8_t s8[64];
    uint16_t u16[32];
} emu512;

#define EMU_TO(T, u)                                                                                          \
    __extension__({                                                                                                        \
        T r_;                                                                                                 \
        memcpy(&r_, &(u), 64);                                                                                \
        r_;                                                                                                   \
    })
#define EMU_FROM(v)                                                                                           \
    __extension__({                                                                                                        \
        emu512 u_;                                                                                            \
        __typeof__(v) v_ = (v);                                                                               \
        memcpy(&u_, &v_, 64);                                                                                 \
        u_;                                                                                                   \
    })

static inline float emu_daz(float v)
{
    return fabsf(v) < 0x1p-126f ? copysignf(0.0f, v) : v;
}

static inline __m512 emu_setzero_ps(void)
{
    emu512 u = {{0}};
    return EMU_TO(__m512, u);
}
static inline __m512i emu_setzero_si512(void)
{
    emu512 u = {{0}};
    return EMU_TO(__m512i, u);
}
static inline __m512 emu_set1_ps(float f)
{
    emu512 u;
    for (int l = 0; l < 16; l++)
        u.f[l] = f;
    return EMU_TO(__m512, u);
}
static inline __m512i emu_set1_epi8(char c)
{
    emu512 u;
    memset(u.u8, (unsigned char)c, 64);
    return EMU_TO(__m512i, u);
}
static inline __m512i emu_loadu_si512(const void *p)
{
    __m512i r;
    memcpy(&r, p, 64);
    return r;
}
/* only the elements the mask selects are read */
static inline __m512i emu_maskz_loadu_epi16(__mmask32 m, const void *p)
{
    emu512 u = {{0}};
    for (int e = 0; e < 32; e++)
        if ((m >> e) & 1u)
            memcpy(&u.u16[e], (const char *)p + 2 * e, 2);
    return EMU_TO(__m512i, u);
}
static inline void emu_storeu_ps(void *p, __m512 a)
{
    memcpy(p, &a, 64);
}
static inline __m512 emu_add_ps(__m512 a, __m512 b)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int l = 0; l < 16; l++)
        r.f[l] = x.f[l] + y.f[l];
    return EMU_TO(__m512, r);
}
static inline __m512 emu_mul_ps(__m512 a, __m512 b)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int l = 0; l < 16; l++)
        r.f[l] = x.f[l] * y.f[l];
    return EMU_TO(__m512, r);
}
static inline __m512 emu_fmadd_ps(__m512 a, __m512 b, __m512 c)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), z = EMU_FROM(c), r;
    for (int l = 0; l < 16; l++)
        r.f[l] = fmaf(x.f[l], y.f[l], z.f[l]);
    return EMU_TO(__m512, r);
}
static inline __m512 emu_cvtepi32_ps(__m512i a)
{
    emu512 x = EMU_FROM(a), r;
    for (int l = 0; l < 16; l++)
        r.f[l] = (float)x.i[l];
    return EMU_TO(__m512, r);
}
static inline __m512i emu_sub_epi32(__m512i a, __m512i b)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int l = 0; l < 16; l++)
        r.i[l] = (int32_t)((uint32_t)x.i[l] - (uint32_t)y.i[l]);
    return EMU_TO(__m512i, r);
}
static inline __m512i emu_xor_si512(__m512i a, __m512i b)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int e = 0; e < 64; e++)
        r.u8[e] = x.u8[e] ^ y.u8[e];
    return EMU_TO(__m512i, r);
}
/* VPDPBUSD: dword l += sum_{i<4} u8(a[4l + i]) * s8(b[4l + i]), no saturation */
static inline __m512i emu_dpbusd_epi32(__m512i src, __m512i a, __m512i b)
{
    emu512 s = EMU_FROM(src), x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int l = 0; l < 16; l++) {
        int64_t t = s.i[l];
        for (int i = 0; i < 4; i++)
            t += (int32_t)x.u8[4 * l + i] * (int32_t)y.s8[4 * l + i];
        r.i[l] = (int32_t)(uint32_t)(uint64_t)t;
    }
    return EMU_TO(__m512i, r);
}
/* VDPBF16PS: lane l += b16(a, 2l + 1) * b16(b, 2l + 1), then the even pair
 * element, each one fma (inputs' subnormals as zero; FTZ from MXCSR) */
static inline __m512 emu_dpbf16_ps(__m512 src, __m512bh a, __m512bh b)
{
    emu512 s = EMU_FROM(src), x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int l = 0; l < 16; l++) {
        float acc = s.f[l];
        for (int e = 1; e >= 0; e--) {
            const uint32_t xb = (uint32_t)x.u16[2 * l + e] << 16, yb = (uint32_t)y.u16[2 * l + e] << 16;
            float xf, yf;
            memcpy(&xf, &xb, 4);
            memcpy(&yf, &yb, 4);
            acc = fmaf(emu_daz(xf), emu_daz(yf), acc);
        }
        r.f[l] = acc;
    }
    return EMU_TO(__m512, r);
}
static inline __m512 emu_shuffle_f32x4(__m512 a, __m512 b, int imm)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int q = 0; q < 4; q++) {
        const int sel = (imm >> (2 * q)) & 3;
        memcpy(&r.f[4 * q], q < 2 ? &x.f[4 * sel] : &y.f[4 * sel], 16);
    }
    return EMU_TO(__m512, r);
}
static inline __m512 emu_shuffle_ps(__m512 a, __m512 b, int imm)
{
    emu512 x = EMU_FROM(a), y = EMU_FROM(b), r;
    for (int q = 0; q < 4; q++)
        for (int e = 0; e < 4; e++) {
            const int sel = (imm >> (2 * e)) & 3;
            r.f[4 * q + e] = e < 2 ? x.f[4 * q + sel] : y.f[4 * q + sel];
        }
    return EMU_TO(__m512, r);
}
static inline __m256 emu_castps512_ps256(__m512 a)
{
    __m256 r;
    memcpy(&r, &a, 32);
    return r;
}
static inline __m512 emu_castps256_ps512(__m256 a)
{
    emu512 u = {{0}};
    memcpy(&u, &a, 32);
    return EMU_TO(__m512, u);
}
static inline __m512i emu_castsi256_si512(__m256i a)
{
    emu512 u = {{0}};
    memcpy(&u, &a, 32);
    return EMU_TO(__m512i, u);
}
static inline __m512d emu_castps_pd(__m512 a)
{
    return EMU_TO(__m512d, a);
}
static inline __m512 emu_castpd_ps(__m512d a)
{
    return EMU_TO(__m512, a);
}
static inline __m256d emu_extractf64x4_pd(__m512d a, int hi)
{
    __m256d r;
    memcpy(&r, (const char *)&a + 32 * (hi & 1), 32);
    return r;
}
static inline __m512d emu_insertf64x4(__m512d a, __m256d b, int hi)
{
    memcpy((char *)&a + 32 * (hi & 1), &b, 32);
    return a;
}
static inline __m512i emu_inserti64x4(__m512i a, __m256i b, int hi)
{
    memcpy((char *)&a + 32 * (hi & 1), &b, 32);
    return a;
}
static inline __m512i emu_broadcast_i64x4(__m256i a)
{
    emu512 u;
    memcpy(&u.u8[0], &a, 32);
    memcpy(&u.u8[32], &a, 32);
    return EMU_TO(__m512i, u);
}

#undef _mm512_setzero_ps
#define _mm512_setzero_ps emu_setzero_ps
#undef _mm512_setzero_si512
#define _mm512_setzero_si512 emu_setzero_si512
#undef _mm512_set1_ps
#define _mm512_set1_ps emu_set1_ps
#undef _mm512_set1_epi8
#define _mm512_set1_epi8 emu_set1_epi8
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 emu_loadu_si512
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16 emu_maskz_loadu_epi16
#undef _mm512_storeu_ps
#define _mm512_storeu_ps emu_storeu_ps
#undef _mm512_add_ps
#define _mm512_add_ps emu_add_ps
#undef _mm512_mul_ps
#define _mm512_mul_ps emu_mul_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps emu_fmadd_ps
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
#undef _mm512_sub_epi32
#define _mm512_sub_epi32 emu_sub_epi32
#undef _mm512_xor_si512
#define _mm512_xor_si512 emu_xor_si512
#undef _mm512_dpbusd_epi32
#define _mm512_dpbusd_epi32 emu_dpbusd_epi32
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps emu_dpbf16_ps
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4 emu_shuffle_f32x4
#undef _mm512_shuffle_ps
#define _mm512_shuffle_ps emu_shuffle_ps
#undef _mm512_castps512_ps256
#define _mm512_castps512_ps256 emu_castps512_ps256
#undef _mm512_castps256_ps512
#define _mm512_castps256_ps512 emu_castps256_ps512
#undef _mm512_castsi256_si512
#define _mm512_castsi256_si512 emu_castsi256_si512
#undef _mm512_castps_pd
#define _mm512_castps_pd emu_castps_pd
#undef _mm512_castpd_ps
#define _mm512_castpd_ps emu_castpd_ps
#undef _mm512_extractf64x4_pd
#define _mm512_extractf64x4_pd emu_extractf64x4_pd
#undef _mm512_insertf64x4
#define _mm512_insertf64x4 emu_insertf64x4
#undef _mm512_inserti64x4
#define _mm512_inserti64x4 emu_inserti64x4
#undef _mm512_broadcast_i64x4
#define _mm512_broadcast_i64x4 emu_broadcast_i64x4

#endif /* PG_AVX512_DOT_EMU_H */
