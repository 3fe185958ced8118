/* test_gemm_dot_emu: the AVX-512 dot kernels of the matmul modes
 * (cpu_gemm_bf16_kernel.c avx512bf16, cpu_gemm_q8_kernel.c avx512vnni),
 * their own source compiled here against avx512_dot_emu.h's scalar
 * stand-ins for the AVX-512 intrinsics, against the generic kernels (the
 * definitions) bit for bit — so their tiles, tails, masks, odd columns,
 * shuffle tree, +128 offset and MXCSR handling are checked on any x86-64
 * machine with AVX2 + FMA, including the many without AVX-512 where the
 * real kernels cannot run (test_gemm_bf16 / test_gemm_q8 run those, and
 * test_vdpbf16ps_pinned the instruction itself, where the CPU has them).
 * Shapes: M 1..5, 7, 16, 33 and random up to 70; N off the tiles (6) and
 * odd (a pair's unused half); K with and without a tail (bf16) or in
 * blocks (int8); padded ldy and column ranges; edge values (bf16
 * subnormals, tiny sums that FTZ, inf; int8 -128, +-127, zero and
 * subnormal or huge scales). */
#include "avx512_dot_emu.h"

/* the kernels' exported names, renamed (prototypes included) */
#define cpu_gemm_bf16_cols_avx512bf16 emu_gemm_bf16_cols
#define cpu_gemm_q8_cols_avx512vnni emu_gemm_q8_cols
#define CPU_GEMM_VARIANT avx512bf16
#include "../../cpu/cpu_gemm_bf16_kernel.c"
#undef CPU_GEMM_VARIANT
#define CPU_GEMM_VARIANT avx512vnni
#include "../../cpu/cpu_gemm_q8_kernel.c"
#undef CPU_GEMM_VARIANT

#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cpu_gemm.h"
#include "cpu_gemm_modes.h"
#include "cpu_wt.h"
#include "test_support.h"

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static int same_bits(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static void need_avx2(void)
{
    if (!cpu_gemm_variant_available(CPU_GEMM_AVX2)) {
        print_message("SKIP: the stand-ins use AVX2 + FMA, which this CPU lacks\n");
        skip();
    }
}

/* a bf16 value: mostly 2^-8 .. 2, some tiny (products near FLT_MIN),
 * subnormal, zero, large; inf at rate inf_per_mille */
static uint16_t rand_bf16(pg_test_rng *rng, int inf_per_mille)
{
    const uint16_t sign = (uint16_t)((pg_test_rng_next(rng) & 1u) << 15);
    const uint16_t mant = (uint16_t)(pg_test_rng_next(rng) & 0x7Fu);
    const int r = pg_test_rng_int(rng, 0, 999);
    if (r < inf_per_mille)
        return sign | 0x7F80u;
    if (r < 600)
        return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 119, 127) << 7) | mant;
    if (r < 800)
        return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 60, 67) << 7) | mant;
    if (r < 900)
        return sign | (uint16_t)(mant ? mant : 1u);
    if (r < 970)
        return sign;
    return sign | (uint16_t)((uint16_t)pg_test_rng_int(rng, 167, 177) << 7) | mant;
}

static long check_bf16(pg_test_rng *rng, int32_t M, int32_t N, int32_t K, int32_t n0, int32_t n1, int64_t ldy,
                       int inf_per_mille)
{
    uint16_t *x = xmalloc((size_t)M * (size_t)K * 2), *w = xmalloc((size_t)N * (size_t)K * 2);
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++)
        x[i] = rand_bf16(rng, inf_per_mille);
    for (size_t i = 0; i < (size_t)N * (size_t)K; i++)
        w[i] = rand_bf16(rng, inf_per_mille);
    const size_t n = (size_t)M * (size_t)ldy;
    float *yg = xmalloc(n * sizeof *yg), *ye = xmalloc(n * sizeof *ye);
    for (size_t i = 0; i < n; i++)
        yg[i] = ye[i] = -1234.5f;
    cpu_gemm_bf16_cols_generic(yg, ldy, x, w, M, K, n0, n1);
    const unsigned int csr = _mm_getcsr();
    emu_gemm_bf16_cols(ye, ldy, x, w, M, K, n0, n1);
    assert_int_equal(_mm_getcsr(), csr); /* the caller's MXCSR back, flags included */
    long finite = 0;
    for (int32_t m = 0; m < M; m++)
        for (int64_t c = 0; c < ldy; c++) {
            const float g = yg[(size_t)m * (size_t)ldy + (size_t)c], e = ye[(size_t)m * (size_t)ldy + (size_t)c];
            if (c < n0 || c >= n1) {
                if (e != -1234.5f)
                    fail_msg("bf16 emu M=%d N=%d K=%d cols [%d,%d): y[%d][%lld] outside the columns written", (int)M,
                             (int)N, (int)K, (int)n0, (int)n1, (int)m, (long long)c);
            } else if (!same_bits(g, e)) {
                fail_msg("bf16 emu M=%d N=%d K=%d cols [%d,%d) ldy %lld: y[%d][%lld]: expected %a (generic), got %a "
                         "(avx512bf16 source, emulated)", (int)M, (int)N, (int)K, (int)n0, (int)n1, (long long)ldy,
                         (int)m, (long long)c, (double)g, (double)e);
            } else {
                finite += isfinite(g);
            }
        }
    free(x);
    free(w);
    free(yg);
    free(ye);
    return finite;
}

static void test_bf16_source_matches_definition(void **state)
{
    (void)state;
    need_avx2();
    pg_test_rng rng = {77};
    static const int32_t Ms[] = {1, 2, 3, 4, 5, 7, 16, 33};
    static const int32_t Ns[] = {1, 5, 6, 7, 13};
    static const int32_t Ks[] = {0, 1, 31, 32, 33, 64, 96, 100, 768};
    long outputs = 0, finite = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                const int64_t ldy = N + pg_test_rng_int(&rng, 0, 3);
                finite += check_bf16(&rng, M, N, K, 0, N, ldy, 0);
                const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
                finite += check_bf16(&rng, M, N, K, n0, n1, ldy, ki % 4 == 1 ? 2 : 0);
                outputs += (long)M * (N + n1 - n0);
            }
    for (int it = 0; it < 20; it++) {
        const int32_t M = pg_test_rng_int(&rng, 1, 70), N = pg_test_rng_int(&rng, 1, 40);
        const int32_t K = pg_test_rng_int(&rng, 1, it < 15 ? 600 : 5000);
        finite += check_bf16(&rng, M, N, K, 0, N, N, 0);
        outputs += (long)M * N;
    }
    print_message("avx512bf16 source (emulated) == generic on %ld outputs, %ld finite\n", outputs, finite);
    assert_true(finite > outputs / 2);
}

/* q8 rows with per-block exponents -20..20 through the quantizer; then
 * some blocks replaced by edge ones: -128 here and there, +-127, zero
 * scale, subnormal scale, huge scale */
static unsigned char *rand_q8(pg_test_rng *rng, int32_t rows, int32_t K, int edges)
{
    const size_t n = (size_t)rows * (size_t)K, nb = n / CPU_I8_GROUP;
    float *f = xmalloc(n * sizeof *f);
    pg_test_fill_uniform(rng, f, n, -1.0f, 1.0f);
    for (size_t b = 0; b < nb; b++) {
        const float s = ldexpf(1.0f, pg_test_rng_int(rng, -20, 20));
        for (int i = 0; i < CPU_I8_GROUP; i++)
            f[b * CPU_I8_GROUP + (size_t)i] *= s;
    }
    unsigned char *q = xmalloc(nb * CPU_I8_BLOCK_BYTES);
    cpu_q8_quantize_rows(q, f, rows, K);
    free(f);
    for (size_t b = 0; edges && b < nb; b++) {
        unsigned char *blk = q + b * CPU_I8_BLOCK_BYTES;
        const int kind = pg_test_rng_int(rng, 0, 9);
        float s;
        switch (kind) {
        case 0: blk[4 + pg_test_rng_int(rng, 0, 31)] = 0x80; break; /* -128 */
        case 1:
            for (int i = 0; i < CPU_I8_GROUP; i++)
                blk[4 + i] = pg_test_rng_int(rng, 0, 1) ? 0x7F : 0x81; /* +-127 */
            break;
        case 2: s = 0.0f; memcpy(blk, &s, 4); break;
        case 3: s = ldexpf(1.5f, pg_test_rng_int(rng, -140, -110)); memcpy(blk, &s, 4); break;
        case 4: s = FLT_MAX / 127.0f; memcpy(blk, &s, 4); break;
        default: break;
        }
    }
    return q;
}

static void check_q8(pg_test_rng *rng, int32_t M, int32_t N, int32_t K, int32_t n0, int32_t n1, int64_t ldy,
                     int edges)
{
    unsigned char *xq = rand_q8(rng, M, K, edges), *w = rand_q8(rng, N, K, edges);
    const size_t n = (size_t)M * (size_t)ldy;
    float *yg = xmalloc(n * sizeof *yg), *ye = xmalloc(n * sizeof *ye);
    for (size_t i = 0; i < n; i++)
        yg[i] = ye[i] = NAN;
    cpu_gemm_q8_cols_generic(yg, ldy, xq, w, M, K, n0, n1);
    emu_gemm_q8_cols(ye, ldy, xq, w, M, K, n0, n1);
    for (int32_t m = 0; m < M; m++)
        for (int64_t c = 0; c < ldy; c++) {
            const size_t i = (size_t)m * (size_t)ldy + (size_t)c;
            if (memcmp(&yg[i], &ye[i], sizeof *yg) != 0)
                fail_msg("q8 emu M=%d N=%d K=%d cols [%d,%d) ldy %lld: y[%d][%lld]: generic %a, avx512vnni source "
                         "(emulated) %a", (int)M, (int)N, (int)K, (int)n0, (int)n1, (long long)ldy, (int)m,
                         (long long)c, (double)yg[i], (double)ye[i]);
        }
    free(xq);
    free(w);
    free(yg);
    free(ye);
}

static void test_q8_source_matches_definition(void **state)
{
    (void)state;
    need_avx2();
    pg_test_rng rng = {88};
    static const int32_t Ms[] = {1, 2, 3, 4, 5, 7, 16, 33};
    static const int32_t Ns[] = {1, 2, 5, 6, 7, 9, 13};
    static const int32_t Ks[] = {32, 64, 96, 768};
    long outputs = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                const int64_t ldy = N + pg_test_rng_int(&rng, 0, 3);
                check_q8(&rng, M, N, K, 0, N, ldy, 0);
                const int32_t n0 = pg_test_rng_int(&rng, 0, N - 1), n1 = pg_test_rng_int(&rng, n0 + 1, N);
                check_q8(&rng, M, N, K, n0, n1, ldy, 1);
                outputs += (long)M * (N + n1 - n0);
            }
    for (int it = 0; it < 20; it++) {
        const int32_t M = pg_test_rng_int(&rng, 1, 70), N = pg_test_rng_int(&rng, 1, 40);
        const int32_t K = 32 * pg_test_rng_int(&rng, 1, it < 15 ? 24 : 160);
        check_q8(&rng, M, N, K, 0, N, N, it % 2);
        outputs += (long)M * N;
    }
    print_message("avx512vnni source (emulated) == generic on %ld outputs\n", outputs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_source_matches_definition),
        cmocka_unit_test(test_q8_source_matches_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
