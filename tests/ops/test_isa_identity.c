/* test_isa_identity: the CPU GEMM gives the same bits on every instruction
 * set (cpu_gemm.h "canonical reduction order"). Every kernel variant built
 * into the library (cpu_gemm_kernel.c compiled for AVX-512, AVX2 and
 * generic) that this CPU can run is compared, bit for bit, with the
 * canonical order written out below in plain C (16 fmaf lanes, zero-padded
 * tail, fixed tree), on fresh random inputs over awkward shapes (K around
 * multiples of 16, N = 1, M = 1..130, odd column splits, 1 and 2 threads)
 * and on inputs whose sums depend on the order (a wide exponent range,
 * signed zeros, products that underflow). A variant the CPU cannot run is
 * reported as SKIP. Reordering any variant's reduction fails here.
 *
 * Then the whole executor: its arguments are isa_digest programs, each
 * linked against a copy of cpu/ compiled for one x86-64 level (x86-64 =
 * SSE2, x86-64-v3 = AVX2+FMA, native; tests/ops/meson.build). Each prints a
 * digest of stories260K's logits; all of them, under every GEMM variant
 * they can run, and the baseline build under glibc's non-FMA libm
 * (GLIBC_TUNABLES masks AVX2/FMA/AVX-512 for glibc's ifuncs: expf, sincosf),
 * must print the same digest — and so must each matmul precision mode
 * (cpu_gemm_modes.h: bf16, int8), against its own reference. This is what checks that the scalar ops
 * (rmsnorm, rope, silu) and attention's vector code do not depend on the compiler's
 * vectorization or on FMA contraction either. The libm run only shows that
 * stories260K does not hit the few inputs where glibc's FMA and SSE2 expf /
 * sincosf differ (cpu_executor.h "Across machines"). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "cpu_gemm.h"
#include "cpu_gemm_kernel.h"
#include "cpu_gemm_modes.h"
#include "cpu_pool.h"
#include "test_support.h"

/* The contract, spelled out: y = dot(x, w) over K in the canonical order. */
static float canonical_dot(const float *x, const float *w, int32_t K)
{
    float acc[16];
    for (int l = 0; l < 16; l++)
        acc[l] = 0.0f;
    for (int32_t k0 = 0; k0 < K; k0 += 16)
        for (int l = 0; l < 16; l++) {
            const int32_t k = k0 + l;
            acc[l] = fmaf(k < K ? x[k] : 0.0f, k < K ? w[k] : 0.0f, acc[l]); /* padded: fma(0, 0, acc) */
        }
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++)
        s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* Values whose sum depends on the order: mostly [-1, 1), scaled by 2^e
 * for e in [-24, 24], with exact +-0 and products small enough to
 * underflow mixed in. */
static void fill_awkward(pg_test_rng *rng, float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int kind = pg_test_rng_int(rng, 0, 19);
        float v = pg_test_rng_uniform(rng, -1.0f, 1.0f);
        if (kind == 0)
            v = 0.0f;
        else if (kind == 1)
            v = -0.0f;
        else if (kind == 2)
            v = ldexpf(v, -70); /* tiny: a product of two underflows */
        else if (kind < 10)
            v = ldexpf(v, pg_test_rng_int(rng, -24, 24));
        p[i] = v;
    }
}

static float *alloc_floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    return p;
}

/* The variants to check: every one but AUTO (an alias of the best). */
static const cpu_gemm_variant variants[] = {CPU_GEMM_GENERIC, CPU_GEMM_AVX2, CPU_GEMM_AVX512};
#define N_VARIANTS ((int)(sizeof variants / sizeof variants[0]))

static int variant_runs(cpu_gemm_variant v)
{
    if (cpu_gemm_variant_available(v))
        return 1;
    print_message("SKIP gemm variant %s: not built for or not supported by this CPU\n", cpu_gemm_variant_name(v));
    return 0;
}

/* memcmp of y [M][ldy] (first N columns) against the canonical reference */
static void expect_canonical(const char *what, cpu_gemm_variant v, const float *y, int64_t ldy, const float *ref,
                             int32_t M, int32_t N, int32_t K)
{
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = 0; n < N; n++) {
            const float got = y[(size_t)m * ldy + n], want = ref[(size_t)m * N + n];
            if (memcmp(&got, &want, sizeof got) != 0)
                fail_msg("gemm variant %s (%s) M=%d N=%d K=%d: y[%d][%d] = %a, canonical order gives %a",
                         cpu_gemm_variant_name(v), what, (int)M, (int)N, (int)K, (int)m, (int)n, (double)got,
                         (double)want);
        }
}

static void test_variants_match_canonical(void **state)
{
    (void)state;
    pg_test_rng rng = {2024};
    cpu_pool *pool = NULL;
    assert_int_equal(cpu_pool_create(&pool, 2, NULL), 0);
    const int32_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 13, 64, 129, 130};
    const int32_t Ns[] = {1, 2, 3, 5, 6, 7, 12, 13, 25, 37};
    const int32_t Ks[] = {1, 7, 15, 16, 17, 31, 33, 100, 257, 512, 513, 769, 1040}; /* AVX2 walks k in chunks of 512 */
    int runs[N_VARIANTS];
    for (int v = 0; v < N_VARIANTS; v++)
        runs[v] = variant_runs(variants[v]);
    long checked = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                /* the big shapes only for a few N, to keep the generic variant quick */
                if (M > 13 && N > 13 && K > 100)
                    continue;
                const int64_t ldy = N + pg_test_rng_int(&rng, 0, 2);
                float *x = alloc_floats((size_t)M * K), *w = alloc_floats((size_t)N * K);
                float *y = alloc_floats((size_t)M * ldy), *ref = alloc_floats((size_t)M * N);
                if ((mi + ni + ki) % 2)
                    fill_awkward(&rng, x, (size_t)M * K), fill_awkward(&rng, w, (size_t)N * K);
                else
                    pg_test_fill_uniform(&rng, x, (size_t)M * K, -1.0f, 1.0f),
                        pg_test_fill_uniform(&rng, w, (size_t)N * K, -1.0f, 1.0f);
                for (int32_t m = 0; m < M; m++)
                    for (int32_t n = 0; n < N; n++)
                        ref[(size_t)m * N + n] = canonical_dot(x + (size_t)m * K, w + (size_t)n * K, K);
                for (int v = 0; v < N_VARIANTS; v++) {
                    if (!runs[v])
                        continue;
                    memset(y, 0xff, (size_t)M * ldy * sizeof *y);
                    cpu_gemm_with(variants[v], (mi + ni) % 2 ? pool : NULL, y, ldy, x, w, M, N, K);
                    expect_canonical("whole product", variants[v], y, ldy, ref, M, N, K);
                    checked++;
                }
                free(x);
                free(w);
                free(y);
                free(ref);
            }
    cpu_pool_destroy(pool);
    print_message("checked %ld products bit for bit\n", checked);
}

/* Weights of storage type t holding w [n] (rounded or quantized as the
 * executor's upload does), and wq [n] f32: what cpu_wt_get reads back. */
static void *store_weights(cpu_wt t, const float *w, size_t n, float *wq)
{
    void *p = malloc(cpu_wt_bytes(t, n) + 64);
    assert_non_null(p);
    assert_int_equal(cpu_wt_store(t, p, 0, w, ST_F32, n), 0);
    cpu_wt_get_row(wq, p, t, 0, (int64_t)n);
    return p;
}

/* The column kernel of each variant (NULL where this build has none). */
static void column_kernels(cpu_gemm_cols_fn fns[N_VARIANTS])
{
    fns[0] = cpu_gemm_cols_generic;
    fns[1] = fns[2] = NULL;
#if defined(PG_GEMM_X86)
    fns[1] = cpu_gemm_cols_avx2;
    fns[2] = cpu_gemm_cols_avx512;
#endif
}

/* The column kernels called directly on arbitrary column ranges (the split
 * the pool makes never changes a value, and neither does a variant), for
 * every weight storage type: bf16 and int8 weights give, bit for bit, the
 * canonical order over the values they hold (int8: with K a multiple of 32,
 * whole blocks; otherwise element by element). */
static void test_kernels_on_column_ranges(void **state)
{
    (void)state;
    cpu_gemm_cols_fn fns[N_VARIANTS];
    column_kernels(fns);
    pg_test_rng rng = {99};
    for (int it = 0; it < 90; it++) {
        const cpu_wt wt = (cpu_wt)(it % CPU_WT_COUNT);
        const int32_t M = pg_test_rng_int(&rng, 1, it < 45 ? 6 : 130), N = pg_test_rng_int(&rng, 1, 40);
        int32_t K = pg_test_rng_int(&rng, 1, it % 3 ? 70 : 600);
        if (it % 2)
            K = (K + 31) / 32 * 32; /* int8: whole blocks per row */
        float *x = alloc_floats((size_t)M * K), *w = alloc_floats((size_t)N * K);
        float *wq = alloc_floats((size_t)N * K);
        float *y = alloc_floats((size_t)M * N), *ref = alloc_floats((size_t)M * N);
        fill_awkward(&rng, x, (size_t)M * K);
        fill_awkward(&rng, w, (size_t)N * K);
        void *ws = store_weights(wt, w, (size_t)N * K, wq);
        for (int32_t m = 0; m < M; m++)
            for (int32_t n = 0; n < N; n++)
                ref[(size_t)m * N + n] = canonical_dot(x + (size_t)m * K, wq + (size_t)n * K, K);
        for (int v = 0; v < N_VARIANTS; v++) {
            if (!fns[v] || !cpu_gemm_variant_available(variants[v]))
                continue;
            memset(y, 0xff, (size_t)M * N * sizeof *y);
            const int32_t cut1 = pg_test_rng_int(&rng, 0, N), cut2 = pg_test_rng_int(&rng, cut1, N);
            fns[v](y, N, x, ws, (int32_t)wt, M, K, 0, cut1);
            fns[v](y, N, x, ws, (int32_t)wt, M, K, cut1, cut2);
            fns[v](y, N, x, ws, (int32_t)wt, M, K, cut2, N);
            expect_canonical(cpu_wt_name(wt), variants[v], y, N, ref, M, N, K);
        }
        free(ws);
        free(x);
        free(w);
        free(wq);
        free(y);
        free(ref);
    }
}

/* The batch-1 tile (M = 1: one row of x against up to 6 rows of w, every
 * accumulator in registers; AVX2's is wider than its 4 x 3 tile): every
 * column count 1 .. 13 (every partial tile), every storage type, K with and
 * without a tail, on every variant, bit for bit the canonical order. */
static void test_batch1_tile_matches_canonical(void **state)
{
    (void)state;
    cpu_gemm_cols_fn fns[N_VARIANTS];
    column_kernels(fns);
    pg_test_rng rng = {2024};
    const int32_t Ks[] = {5, 32, 47, 96, 800};
    long checked = 0;
    for (int t = 0; t < CPU_WT_COUNT; t++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (int32_t N = 1; N <= 13; N++) {
                const int32_t K = Ks[ki];
                float *x = alloc_floats((size_t)K), *w = alloc_floats((size_t)N * K);
                float *wq = alloc_floats((size_t)N * K), *y = alloc_floats((size_t)N), *ref = alloc_floats((size_t)N);
                fill_awkward(&rng, x, (size_t)K);
                fill_awkward(&rng, w, (size_t)N * K);
                void *ws = store_weights((cpu_wt)t, w, (size_t)N * K, wq);
                for (int32_t n = 0; n < N; n++)
                    ref[n] = canonical_dot(x, wq + (size_t)n * K, K);
                for (int v = 0; v < N_VARIANTS; v++) {
                    if (!fns[v] || !cpu_gemm_variant_available(variants[v]))
                        continue;
                    memset(y, 0xff, (size_t)N * sizeof *y);
                    fns[v](y, N, x, ws, t, 1, K, 0, N);
                    expect_canonical(cpu_wt_name((cpu_wt)t), variants[v], y, N, ref, 1, N, K);
                    checked++;
                }
                free(ws);
                free(x);
                free(w);
                free(wq);
                free(y);
                free(ref);
            }
    print_message("checked %ld batch-1 products bit for bit\n", checked);
}

/* The whole product through cpu_gemm_wt for bf16 and int8 storage on the
 * model-like shapes (K a multiple of 32 or not, M = 1 .. 130, 1 and 2
 * threads): every variant gives the canonical order over the stored values,
 * bit for bit. */
static void test_storage_types_match_canonical(void **state)
{
    (void)state;
    pg_test_rng rng = {77};
    cpu_pool *pool = NULL;
    assert_int_equal(cpu_pool_create(&pool, 2, NULL), 0);
    const int32_t Ms[] = {1, 3, 4, 64, 130};
    const int32_t Ns[] = {1, 7, 13, 37};
    const int32_t Ks[] = {17, 32, 64, 100, 172, 288, 544, 768};
    long checked = 0;
    for (int t = CPU_WT_BF16; t < CPU_WT_COUNT; t++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    const int32_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                    if (M > 4 && N > 13 && K > 100)
                        continue;
                    float *x = alloc_floats((size_t)M * K), *w = alloc_floats((size_t)N * K);
                    float *wq = alloc_floats((size_t)N * K);
                    float *y = alloc_floats((size_t)M * N), *ref = alloc_floats((size_t)M * N);
                    pg_test_fill_uniform(&rng, x, (size_t)M * K, -1.0f, 1.0f);
                    if ((ki + ni) % 2)
                        fill_awkward(&rng, w, (size_t)N * K);
                    else
                        pg_test_fill_uniform(&rng, w, (size_t)N * K, -1.0f, 1.0f);
                    void *ws = store_weights((cpu_wt)t, w, (size_t)N * K, wq);
                    for (int32_t m = 0; m < M; m++)
                        for (int32_t n = 0; n < N; n++)
                            ref[(size_t)m * N + n] = canonical_dot(x + (size_t)m * K, wq + (size_t)n * K, K);
                    for (int v = 0; v < N_VARIANTS; v++) {
                        if (!cpu_gemm_variant_available(variants[v]))
                            continue;
                        memset(y, 0xff, (size_t)M * N * sizeof *y);
                        cpu_gemm_wt(variants[v], (cpu_wt)t, (mi + ni) % 2 ? pool : NULL, y, N, x, ws, M, N, K);
                        expect_canonical(cpu_wt_name((cpu_wt)t), variants[v], y, N, ref, M, N, K);
                        checked++;
                    }
                    free(ws);
                    free(x);
                    free(w);
                    free(wq);
                    free(y);
                    free(ref);
                }
    cpu_pool_destroy(pool);
    print_message("checked %ld bf16 / int8 products bit for bit\n", checked);
}

/* The AVX2 kernel's lane-major path (cpu_gemm_kernel.c "lane-major": from
 * M = 16, 24 where K > 1024; x and 24-column w panels packed per lane, the
 * tree merged on a stack of slots) against the canonical order and the
 * generic twin, every storage type, on the edges it has: M not a multiple
 * of its 4-row tile, two row blocks (K = 4100: 124 rows per block, so
 * M = 130 is two blocks of 68 and 62), N not a multiple of 24 or of 8,
 * column ranges cut off the 24-column grid, K % 16 != 0, ldy > N, and
 * products that all underflow to -0 (the padded fma(0, 0, -0) gives +0);
 * then the whole product through a 2-thread pool (column chunks of 24). */
static void test_lane_major_path(void **state)
{
    (void)state;
    cpu_gemm_cols_fn fns[N_VARIANTS];
    column_kernels(fns);
    pg_test_rng rng = {4242};
    cpu_pool *pool = NULL;
    assert_int_equal(cpu_pool_create(&pool, 2, NULL), 0);
    const struct { int32_t M, N, K; } shapes[] = {
        {16, 49, 768}, {17, 25, 15}, {19, 8, 1}, {24, 73, 1041}, {33, 47, 96}, {61, 30, 1040},
        {64, 26, 4096}, {130, 50, 4100}, {23, 31, 1100}, {20, 24, 500},
    };
    long checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int t = 0; t < CPU_WT_COUNT; t++) {
            const int32_t M = shapes[si].M, N = shapes[si].N, K = shapes[si].K;
            const int64_t ldy = N + 3;
            float *x = alloc_floats((size_t)M * K), *w = alloc_floats((size_t)N * K);
            float *wq = alloc_floats((size_t)N * K);
            float *y = alloc_floats((size_t)M * ldy), *ref = alloc_floats((size_t)M * N);
            const int underflow = si == 1 || si == 4; /* every product a -0 */
            if (underflow) {
                for (size_t i = 0; i < (size_t)M * K; i++)
                    x[i] = ldexpf(1.0f, -80);
                for (size_t i = 0; i < (size_t)N * K; i++)
                    w[i] = -ldexpf(1.0f, -80); /* products of 2^-160: -0 after rounding */
            } else {
                fill_awkward(&rng, x, (size_t)M * K);
                fill_awkward(&rng, w, (size_t)N * K);
            }
            void *ws = store_weights((cpu_wt)t, w, (size_t)N * K, wq);
            for (int32_t m = 0; m < M; m++)
                for (int32_t n = 0; n < N; n++)
                    ref[(size_t)m * N + n] = canonical_dot(x + (size_t)m * K, wq + (size_t)n * K, K);
            for (int v = 0; v < N_VARIANTS; v++) {
                if (!fns[v] || !cpu_gemm_variant_available(variants[v]))
                    continue;
                memset(y, 0xff, (size_t)M * ldy * sizeof *y);
                const int32_t cut1 = pg_test_rng_int(&rng, 0, N), cut2 = pg_test_rng_int(&rng, cut1, N);
                fns[v](y, ldy, x, ws, (int32_t)t, M, K, 0, cut1);
                fns[v](y, ldy, x, ws, (int32_t)t, M, K, cut1, cut2);
                fns[v](y, ldy, x, ws, (int32_t)t, M, K, cut2, N);
                expect_canonical(cpu_wt_name((cpu_wt)t), variants[v], y, ldy, ref, M, N, K);
                for (int32_t m = 0; m < M; m++) /* the columns past N are not written */
                    for (int64_t n = N; n < ldy; n++) {
                        uint32_t bits;
                        memcpy(&bits, &y[(size_t)m * ldy + n], sizeof bits);
                        if (bits != 0xffffffffu)
                            fail_msg("gemm variant %s M=%d N=%d K=%d: y[%d][%d] past N written",
                                     cpu_gemm_variant_name(variants[v]), (int)M, (int)N, (int)K, (int)m, (int)n);
                    }
                checked++;
            }
            /* through the pool, split into chunks of the 24-column panels */
            for (int v = 0; v < N_VARIANTS; v++) {
                if (!cpu_gemm_variant_available(variants[v]))
                    continue;
                memset(y, 0xff, (size_t)M * ldy * sizeof *y);
                cpu_gemm_wt(variants[v], (cpu_wt)t, pool, y, ldy, x, ws, M, N, K);
                expect_canonical(cpu_wt_name((cpu_wt)t), variants[v], y, ldy, ref, M, N, K);
                checked++;
            }
            /* the case is what it says (f32 and bf16 keep -2^-80; int8 reads 0) */
            if (underflow && t != CPU_WT_I8)
                assert_int_equal(!!signbit(ref[0]), K % 16 == 0); /* no padded step: every lane stays -0 */
            free(ws);
            free(x);
            free(w);
            free(wq);
            free(y);
            free(ref);
        }
    cpu_pool_destroy(pool);
    print_message("checked %ld lane-major products bit for bit\n", checked);
}

/* The zero-padded tail is a real fma(0, 0, acc): with every product an
 * underflow to -0, the lanes past K turn -0 into +0, so y = +0. A variant
 * that skipped the padded lanes (or summed lanes in another order than the
 * tree, or used a separate multiply and add) would give -0 here. */
static void test_signed_zero_tail(void **state)
{
    (void)state;
    for (int32_t K = 1; K <= 48; K++) {
        float *x = alloc_floats((size_t)K), *w = alloc_floats((size_t)K);
        for (int32_t k = 0; k < K; k++) {
            x[k] = -0x1p-80f;
            w[k] = 0x1p-80f; /* product -2^-160: rounds to -0 */
        }
        const float want = canonical_dot(x, w, K);
        if (K % 16 != 0)
            assert_false(signbit(want)); /* the padded lanes make it +0 */
        else
            assert_true(signbit(want)); /* no padding: every lane stays -0 */
        for (int v = 0; v < N_VARIANTS; v++) {
            if (!cpu_gemm_variant_available(variants[v]))
                continue;
            float y = 1.0f;
            cpu_gemm_with(variants[v], NULL, &y, 1, x, w, 1, 1, K);
            if (memcmp(&y, &want, sizeof y) != 0)
                fail_msg("gemm variant %s K=%d: signed-zero sum is %a, canonical order gives %a",
                         cpu_gemm_variant_name(variants[v]), (int)K, (double)y, (double)want);
        }
        free(x);
        free(w);
    }
}

/* One fma whose exact result lies just below a float halfway point while
 * its double rounding lands on it: a separate multiply and add, or an
 * emulation that rounds twice (double, then float), gives the wrong side.
 * Lane 0 with K = 17: acc = fma(x0, w0, 0) = 1 + 2^-23, then
 * fma(a, b, acc) with a*b = 2^-24 - 2^-70: exact 1 + 2^-23 + 2^-24 - 2^-70,
 * correctly rounded 1 + 2^-23 (double rounding gives 1 + 2^-22). */
static void test_fma_is_fused(void **state)
{
    (void)state;
    float x[17] = {0}, w[17] = {0};
    x[0] = 1.0f + 0x1p-23f;
    w[0] = 1.0f;
    x[16] = 0x1p-12f * (1.0f + 0x1p-23f);
    w[16] = 0x1p-12f * (1.0f - 0x1p-24f * 2.0f);
    const float want = 1.0f + 0x1p-23f;
    assert_true(canonical_dot(x, w, 17) == want);
    const float twice = (float)((double)x[0] * (double)w[0] + (double)x[16] * (double)w[16]);
    assert_true(twice != want); /* the case really is one that double rounding gets wrong */
    for (int v = 0; v < N_VARIANTS; v++) {
        if (!cpu_gemm_variant_available(variants[v]))
            continue;
        float y = 0.0f;
        cpu_gemm_with(variants[v], NULL, &y, 1, x, w, 1, 1, 17);
        if (y != want)
            fail_msg("gemm variant %s: fused multiply-add gives %a, expected %a", cpu_gemm_variant_name(variants[v]),
                     (double)y, (double)want);
    }
}

/* AUTO is the best available variant, names and availability are sane. */
static void test_variant_table(void **state)
{
    (void)state;
    assert_true(cpu_gemm_variant_available(CPU_GEMM_AUTO));
    assert_true(cpu_gemm_variant_available(CPU_GEMM_GENERIC));
    assert_false(cpu_gemm_variant_available(CPU_GEMM_VARIANT_COUNT));
    const cpu_gemm_variant best = cpu_gemm_variant_best();
    assert_true(best != CPU_GEMM_AUTO && cpu_gemm_variant_available(best));
    for (int v = (int)best + 1; v < (int)CPU_GEMM_VARIANT_COUNT; v++)
        assert_false(cpu_gemm_variant_available((cpu_gemm_variant)v));
    assert_string_equal(cpu_gemm_isa(), cpu_gemm_variant_name(best));
    assert_int_equal(cpu_gemm_lanes(), 16);
    assert_null(cpu_gemm_variant_name(CPU_GEMM_VARIANT_COUNT));
    print_message("best gemm variant here: %s\n", cpu_gemm_variant_name(best));
}

#if defined(PG_GEMM_DOT)
#include <cpuid.h>
/* The CPU's own word, read here without libgcc: AVX-512F/BW/VL (leaf 7
 * EBX bits 16, 30, 31) with the OS saving the opmask and zmm state (XCR0
 * bits 1, 2, 5, 6, 7), plus AVX512_VNNI (leaf 7 ECX bit 11) or
 * AVX512_BF16 (leaf 7 subleaf 1 EAX bit 5), and AVX2 + FMA. */
static int cpuid_has_dot(int bf16)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 12))) /* OSXSAVE, FMA */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6u) != 0xE6u)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    const unsigned need_b = (1u << 5) | (1u << 16) | (1u << 30) | (1u << 31); /* AVX2, F, BW, VL */
    if ((b & need_b) != need_b)
        return 0;
    if (!bf16)
        return (c >> 11) & 1u;
    const unsigned max_sub = a;
    if (max_sub < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return (a >> 5) & 1u;
}
#endif

/* Which kernel each matmul mode runs under each variant
 * (cpu_gemm_modes.h's table): the dot-instruction kernels exactly where
 * the CPU has their instructions (CPUID read here) and only for AUTO /
 * AVX512; AVX2 and GENERIC never run them. */
static void test_mode_kernels_dispatch(void **state)
{
    (void)state;
    int dot[2] = {0, 0}; /* bf16, int8: the CPU runs the dot kernel */
#if defined(PG_GEMM_DOT)
    dot[0] = cpuid_has_dot(1);
    dot[1] = cpuid_has_dot(0);
#endif
    assert_int_equal(cpu_gemm_bf16_dot_available(), dot[0]);
    assert_int_equal(cpu_gemm_q8_dot_available(), dot[1]);
    const cpu_gemm_variant all[] = {CPU_GEMM_AUTO, CPU_GEMM_GENERIC, CPU_GEMM_AVX2, CPU_GEMM_AVX512};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const cpu_gemm_variant v = all[i];
        if (!cpu_gemm_variant_available(v)) {
            assert_null(cpu_gemm_mode_kernel_name(CPU_MATMUL_BF16, v));
            continue;
        }
        const cpu_gemm_variant r = v == CPU_GEMM_AUTO ? cpu_gemm_variant_best() : v;
        for (int p = 0; p < 2; p++) {
            const cpu_matmul_precision mode = p == 0 ? CPU_MATMUL_BF16 : CPU_MATMUL_INT8;
            const char *want = r == CPU_GEMM_GENERIC                  ? "generic"
                             : r == CPU_GEMM_AVX512 && dot[p]        ? (p == 0 ? "avx512bf16" : "avx512vnni")
                                                                     : "avx2";
            const char *got = cpu_gemm_mode_kernel_name(mode, v);
            assert_non_null(got);
            if (strcmp(got, want) != 0)
                fail_msg("mode %s variant %s: expected the %s kernel, got %s", cpu_matmul_precision_name(mode),
                         cpu_gemm_variant_name(v), want, got);
            print_message("mode %s, variant %s: %s kernel\n", cpu_matmul_precision_name(mode),
                          cpu_gemm_variant_name(v), got);
        }
        assert_string_equal(cpu_gemm_mode_kernel_name(CPU_MATMUL_EXACT, v), cpu_gemm_variant_name(r));
    }
    assert_null(cpu_gemm_mode_kernel_name(CPU_MATMUL_COUNT, CPU_GEMM_AUTO));
    if (!dot[0] || !dot[1])
        print_message("note: this CPU lacks AVX512_BF16 and/or AVX512_VNNI (or the build the dot kernels): "
                      "they are not selected here\n");
}

/* ---- whole-executor digests across builds --------------------------------- */

typedef struct digest_progs {
    int n;
    char **paths; /* isa_digest_<level> executables (argv) */
} digest_progs;

/* Runs one digest program; returns 0 and the digest line in out, 77 when it
 * skipped, or fails the test. */
static int run_digest(const char *path, const char *variant, const char *mode, const char *env, char *out,
                      size_t cap)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s '%s' %s %s", env, path, variant, mode);
    FILE *f = popen(cmd, "r");
    if (!f)
        fail_msg("cannot run %s", cmd);
    char line[512];
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "digest ", 7) == 0)
            snprintf(out, cap, "%s", line);
        else if (strncmp(line, "gemm ", 5) == 0) /* which kernel ran */
            print_message("  %s", line);
    }
    int st = pclose(f);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        return 77;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !out[0])
        fail_msg("%s: exit status %d, digest line '%s'", cmd, st, out);
    return 0;
}

static void test_builds_agree(void **state)
{
    const digest_progs *d = *state;
    if (d->n == 0) {
        print_message("SKIP: no isa_digest programs given (not an x86-64 build)\n");
        skip();
    }
    /* non-FMA glibc: masks the features its ifunc resolvers test */
    const char *no_fma = "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F,-AVX512VL";
    static const char *const modes[] = {"exact", "bf16", "int8"};
    int compared = 0;
    for (size_t mo = 0; mo < sizeof modes / sizeof modes[0]; mo++) {
        char ref[512] = "", got[512], ref_what[512] = "";
        for (int i = 0; i < d->n; i++) {
            const char *base = strrchr(d->paths[i], '/');
            base = base ? base + 1 : d->paths[i];
            const int v3 = strstr(base, "x86-64-v3") != NULL, baseline = !v3 && strstr(base, "x86-64") != NULL;
            if (v3 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                        __builtin_cpu_supports("bmi2"))) {
                print_message("SKIP %s: this CPU is not x86-64-v3\n", base);
                continue;
            }
            /* avx512: the exact AVX-512 kernel, and for the modes the dot
             * kernels where the CPU has them (else avx2's): see "gemm" in the
             * digest programs' output */
            const char *runs[][2] = {{"auto", ""}, {"avx512", ""}, {"avx2", ""}, {"generic", ""}, {"generic", no_fma}};
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
                if (r == 4 && !baseline)
                    continue; /* the libm check once, on the baseline build */
                if (run_digest(d->paths[i], runs[r][0], modes[mo], runs[r][1], got, sizeof got) == 77) {
                    print_message("SKIP %s %s: variant not available here\n", base, runs[r][0]);
                    continue;
                }
                char what[512];
                snprintf(what, sizeof what, "%s gemm=%s %s%s%s", base, runs[r][0], modes[mo],
                         runs[r][1][0] ? " " : "", runs[r][1]);
                print_message("%s: %s", what, got);
                if (!ref[0]) {
                    snprintf(ref, sizeof ref, "%s", got);
                    snprintf(ref_what, sizeof ref_what, "%s", what);
                } else if (strcmp(ref, got) != 0) {
                    fail_msg("stories260K logits differ: %s gives %s but %s gives %s", what, got, ref_what, ref);
                }
                compared++;
            }
        }
    }
    print_message("%d builds x variants x modes agree bit for bit\n", compared);
}

int main(int argc, char **argv)
{
    digest_progs progs = {argc - 1, argv + 1};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variant_table),
        cmocka_unit_test(test_mode_kernels_dispatch),
        cmocka_unit_test(test_signed_zero_tail),
        cmocka_unit_test(test_fma_is_fused),
        cmocka_unit_test(test_variants_match_canonical),
        cmocka_unit_test(test_kernels_on_column_ranges),
        cmocka_unit_test(test_batch1_tile_matches_canonical),
        cmocka_unit_test(test_lane_major_path),
        cmocka_unit_test(test_storage_types_match_canonical),
        cmocka_unit_test_prestate(test_builds_agree, &progs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
