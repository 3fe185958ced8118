/* cpu_gemm_bf16_kernel: the bf16 mode's column kernel, one variant per
 * compilation (cpu/meson.build: -DCPU_GEMM_VARIANT=generic|avx2), exported as
 * cpu_gemm_bf16_cols_<variant>. Every variant computes the canonical order of
 * cpu_gemm_modes.h ("bf16": VDPBF16PS's pairs, DAZ in, FTZ out), so all
 * return the same bits; the generic one is the definition written out, the
 * simple twin the others are tested against (tests/ops/test_gemm_modes.c).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_gemm_kernel.h"

#if !defined(CPU_GEMM_VARIANT)
#error "cpu_gemm_bf16_kernel.c is compiled with -DCPU_GEMM_VARIANT=avx2|generic (cpu/meson.build)"
#endif
#define BF_CAT2(a, b) a##b
#define BF_CAT(a, b) BF_CAT2(a, b)
#define BF_COLS_FN BF_CAT(cpu_gemm_bf16_cols_, CPU_GEMM_VARIANT)

/* a subnormal reads (daz) or rounds (ftz) to zero of its sign */
static inline float bf_flush(float v)
{
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

/* element k of a bf16 row, 0 past K, daz'd */
static inline float bf_at(const uint16_t *row, int32_t k, int32_t K)
{
    if (k >= K)
        return 0.0f;
    const uint32_t bits = (uint32_t)row[k] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return bf_flush(f);
}

/* The definition: one output at a time, the sixteen lanes in scalars. */
static float bf16_dot_ref(const uint16_t *xr, const uint16_t *wr, int32_t K)
{
    float acc[16] = {0};
    for (int32_t k0 = 0; k0 < K; k0 += 32)
        for (int l = 0; l < 16; l++) {
            const int32_t odd = k0 + 2 * l + 1, even = k0 + 2 * l;
            acc[l] = bf_flush(fmaf(bf_at(xr, odd, K), bf_at(wr, odd, K), acc[l]));
            acc[l] = bf_flush(fmaf(bf_at(xr, even, K), bf_at(wr, even, K), acc[l]));
        }
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = bf_flush(acc[i] + acc[i + 8]);
    for (int i = 0; i < 4; i++)
        s4[i] = bf_flush(s8[i] + s8[i + 4]);
    for (int i = 0; i < 2; i++)
        s2[i] = bf_flush(s4[i] + s4[i + 2]);
    return bf_flush(s2[0] + s2[1]);
}

void BF_COLS_FN(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *w, int32_t M, int32_t K, int32_t n0,
                int32_t n1)
{
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = n0; n < n1; n++)
            y[(int64_t)m * ldy + n] = bf16_dot_ref(xb + (int64_t)m * K, w + (int64_t)n * K, K);
}
