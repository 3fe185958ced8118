/* cpu_gemm_q8_kernel: the int8 mode's (W8A8) column kernel, one variant per
 * compilation (cpu/meson.build: -DCPU_GEMM_VARIANT=generic|avx2), exported as
 * cpu_gemm_q8_cols_<variant>. Every variant computes the canonical order of
 * cpu_gemm_modes.h ("int8"), so all return the same bits; the generic one is
 * the definition written out, the simple twin the others are tested
 * against (tests/ops/test_gemm_modes.c).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_gemm_kernel.h"
#include "cpu_wt.h"

#if !defined(CPU_GEMM_VARIANT)
#error "cpu_gemm_q8_kernel.c is compiled with -DCPU_GEMM_VARIANT=avx2|generic (cpu/meson.build)"
#endif
#define Q8_CAT2(a, b) a##b
#define Q8_CAT(a, b) Q8_CAT2(a, b)
#define Q8_COLS_FN Q8_CAT(cpu_gemm_q8_cols_, CPU_GEMM_VARIANT)

_Static_assert(CPU_I8_GROUP == 32, "the int8 mode's order is defined on blocks of 32");

/* The definition: one output at a time, the eight lanes in scalars. */
static float q8_dot_ref(const unsigned char *xr, const unsigned char *wr, int32_t nb)
{
    float acc[8] = {0};
    for (int32_t b = 0; b < nb; b++) {
        const unsigned char *xb = xr + (size_t)b * CPU_I8_BLOCK_BYTES, *wb = wr + (size_t)b * CPU_I8_BLOCK_BYTES;
        float sx, sw;
        memcpy(&sx, xb, sizeof sx);
        memcpy(&sw, wb, sizeof sw);
        const float d = sx * sw;
        const int8_t *qx = (const int8_t *)(xb + 4), *qw = (const int8_t *)(wb + 4);
        for (int j = 0; j < 8; j++) {
            int32_t p = 0;
            for (int i = 0; i < 4; i++)
                p += (int32_t)qx[4 * j + i] * (int32_t)qw[4 * j + i];
            acc[j] = fmaf((float)p, d, acc[j]);
        }
    }
    float s4[4], s2[2];
    for (int i = 0; i < 4; i++)
        s4[i] = acc[i] + acc[i + 4];
    for (int i = 0; i < 2; i++)
        s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

void Q8_COLS_FN(float *y, int64_t ldy, const unsigned char *xq, const unsigned char *w, int32_t M, int32_t K,
                int32_t n0, int32_t n1)
{
    const int32_t nb = K / CPU_I8_GROUP;
    const size_t row_bytes = (size_t)nb * CPU_I8_BLOCK_BYTES;
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = n0; n < n1; n++)
            y[(int64_t)m * ldy + n] = q8_dot_ref(xq + (size_t)m * row_bytes, w + (size_t)n * row_bytes, nb);
}
