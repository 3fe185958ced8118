/* cm_exp: cpu/cpu_math.h's cm_exp (Cephes expf, the same polynomial on
 * every ISA) as one device function, so that a kernel whose result the CPU
 * twin must match bit for bit (gpu/moe_route.cu's softmax, gpu/moe_shared.cu's
 * sigmoid) computes exp with the CPU's bits instead of libdevice's expf.
 *
 * Every step is the CPU's, in its order, with one IEEE rounding each:
 * __fmul_rn / __fadd_rn / __fsub_rn are the operations nvcc never contracts
 * into an FMA (a plain a * b + c may become one on the device; the C11 CPU
 * build never fuses: -ffp-contract=off). Method and accuracy: cpu_math.h.
 */
#ifndef PG_CM_EXP_CUH
#define PG_CM_EXP_CUH

#include "cuda_common.cuh"

static __device__ __forceinline__ float pgk_cm_expf(float x)
{
    /* clamp to [-104, 88.8]; NaN compares false and stays NaN */
    x = x < -104.0f ? -104.0f : x;
    x = x > 88.8f ? 88.8f : x;
    /* t = 1.5 * 2^23 + n: n = round(x / ln2), its low mantissa bits */
    const float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 0x1.8p23f);
    const float n = __fsub_rn(t, 0x1.8p23f);
    const int32_t ni = (int32_t)(__float_as_uint(t) - 0x4B400000u);
    /* Cody-Waite: r = x - n ln2 in two steps */
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693359375f)), __fmul_rn(n, -2.12194440e-4f));
    const float z = __fmul_rn(r, r);
    float p = __fadd_rn(__fmul_rn(1.9875691500e-4f, r), 1.3981999507e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
    p = __fadd_rn(__fadd_rn(__fmul_rn(p, z), r), 1.0f);
    /* 2^n = 2^n1 * 2^n2, both normal: the first scaling is exact */
    const int32_t n1 = ni >> 1;
    const uint32_t n2 = (uint32_t)ni - (uint32_t)n1;
    const float s1 = __uint_as_float(((uint32_t)n1 + 127u) << 23);
    const float s2 = __uint_as_float((n2 + 127u) << 23);
    return __fmul_rn(__fmul_rn(p, s1), s2);
}

#endif /* PG_CM_EXP_CUH */
