/* test_dtype: dtype names/sizes and the f16/bf16/f32 conversions against
 * hand-computed bit patterns (subnormals, inf, NaN, ties), exhaustive round
 * trips, and an independent double-precision rint() reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "dtype.h"
#include "test_support.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_names_sizes(void **state)
{
    (void)state;
    static const struct { const char *name; size_t size; } want[ST_DTYPE_COUNT] = {
        [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_F64] = {"F64", 8},
        [ST_I8] = {"I8", 1},   [ST_U8] = {"U8", 1},   [ST_I16] = {"I16", 2},   [ST_I32] = {"I32", 4},
        [ST_I64] = {"I64", 8}, [ST_BOOL] = {"BOOL", 1},
    };
    for (int t = 0; t < ST_DTYPE_COUNT; t++) {
        assert_string_equal(st_dtype_name((st_dtype)t), want[t].name);
        assert_int_equal(st_dtype_size((st_dtype)t), want[t].size);
        assert_int_equal(st_dtype_parse(want[t].name, strlen(want[t].name)), t);
        assert_int_equal(st_dtype_is_float_weight((st_dtype)t), t == ST_F32 || t == ST_F16 || t == ST_BF16);
    }
    assert_int_equal(st_dtype_parse("F8_E4M3", 7), -1);
    assert_int_equal(st_dtype_parse("F3", 2), -1);    /* prefix of F32 */
    assert_int_equal(st_dtype_parse("F32 ", 4), -1);
    assert_int_equal(st_dtype_parse("f32", 3), -1);   /* case matters */
    assert_int_equal(st_dtype_parse("", 0), -1);
}

static void test_f16_to_f32(void **state)
{
    (void)state;
    static const struct { uint16_t h; uint32_t f; } cases[] = {
        {0x0000, 0x00000000}, {0x8000, 0x80000000}, /* +-0 */
        {0x3C00, 0x3F800000}, {0xC000, 0xC0000000}, /* 1, -2 */
        {0x7BFF, 0x477FE000},                       /* 65504, max finite */
        {0x0001, 0x33800000},                       /* 2^-24, min subnormal */
        {0x03FF, 0x387FC000},                       /* max subnormal 1023 * 2^-24 */
        {0x0200, 0x38000000},                       /* 2^-15 */
        {0x8001, 0xB3800000},                       /* -2^-24 */
        {0x0400, 0x38800000},                       /* 2^-14, min normal */
        {0x3555, 0x3EAAA000},                       /* 0.333251953125 */
        {0x7C00, 0x7F800000}, {0xFC00, 0xFF800000}, /* +-inf */
        {0x7E00, 0x7FC00000},                       /* quiet NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(bits(pg_f16_to_f32(cases[i].h)), cases[i].f);
    assert_true(isnan(pg_f16_to_f32(0x7C01))); /* signalling NaN stays NaN */
    assert_true(isnan(pg_f16_to_f32(0xFFFF)));
}

static void test_bf16_to_f32(void **state)
{
    (void)state;
    assert_int_equal(bits(pg_bf16_to_f32(0x3F80)), 0x3F800000);
    assert_int_equal(bits(pg_bf16_to_f32(0xC040)), 0xC0400000); /* -3 */
    assert_int_equal(bits(pg_bf16_to_f32(0x7F80)), 0x7F800000);
    assert_int_equal(bits(pg_bf16_to_f32(0x0001)), 0x00010000); /* f32 subnormal */
    assert_int_equal(bits(pg_bf16_to_f32(0x8000)), 0x80000000);
    assert_true(isnan(pg_bf16_to_f32(0x7F81)));
}

static void test_f32_to_bf16(void **state)
{
    (void)state;
    static const struct { uint32_t f; uint16_t b; } cases[] = {
        {0x3F800000, 0x3F80},                       /* 1 */
        {0x3F808000, 0x3F80},                       /* tie, kept bit even -> down */
        {0x3F818000, 0x3F82},                       /* tie, kept bit odd -> up */
        {0x3F808001, 0x3F81},                       /* just above the tie -> up */
        {0x3F807FFF, 0x3F80},                       /* just below the tie -> down */
        {0xBF818000, 0xBF82},                       /* negative tie, odd -> away */
        {0x7F7FFFFF, 0x7F80},                       /* FLT_MAX rounds to inf */
        {0x7F7F0000, 0x7F7F},                       /* max bf16 exact */
        {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80}, /* +-inf */
        {0x80000000, 0x8000},                       /* -0 */
        {0x00008000, 0x0000},                       /* subnormal tie, even -> 0 */
        {0x00018000, 0x0002},                       /* subnormal tie, odd -> up */
        {0x007FFFFF, 0x0080},                       /* max subnormal -> min normal */
        {0x7FC00000, 0x7FC0},                       /* quiet NaN */
        {0x7F800001, 0x7FC0},                       /* sNaN with low payload: NaN, not inf */
        {0xFF800001, 0xFFC0},                       /* negative sNaN */
        {0x7FFFFFFF, 0x7FFF},                       /* NaN that RNE would carry into the sign */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = pg_f32_to_bf16(from_bits(cases[i].f));
        if (got != cases[i].b)
            fail_msg("f32 0x%08x -> bf16: expected 0x%04x, got 0x%04x", (unsigned)cases[i].f,
                     (unsigned)cases[i].b, (unsigned)got);
    }
}

static void test_f32_to_f16(void **state)
{
    (void)state;
    static const struct { uint32_t f; uint16_t h; } cases[] = {
        {0x3F800000, 0x3C00}, {0xC0000000, 0xC000}, /* 1, -2 */
        {0x80000000, 0x8000},                       /* -0 */
        {0x477FE000, 0x7BFF},                       /* 65504 */
        {0x477FEF00, 0x7BFF},                       /* 65519: below the tie */
        {0x477FF000, 0x7C00},                       /* 65520: tie -> even = inf */
        {0x49742400, 0x7C00},                       /* 1e6 -> inf */
        {0xC7800000, 0xFC00},                       /* -65536 -> -inf */
        {0x3F801000, 0x3C00},                       /* 1 + 2^-11: tie, even -> down */
        {0x3F803000, 0x3C02},                       /* 1 + 3*2^-11: tie, odd -> up */
        {0x3F801001, 0x3C01},                       /* above the tie -> up */
        {0x3EAAAAAB, 0x3555},                       /* 1/3 */
        {0x38800000, 0x0400},                       /* 2^-14 min normal */
        {0x387FC000, 0x03FF},                       /* max subnormal, exact */
        {0x387FE000, 0x0400},                       /* 1023.5 * 2^-24: tie, odd -> up to min normal */
        {0x33800000, 0x0001},                       /* 2^-24 */
        {0x33000000, 0x0000},                       /* 2^-25: tie -> even 0 */
        {0xB3000000, 0x8000},                       /* -2^-25 -> -0 */
        {0x33000001, 0x0001},                       /* just above 2^-25 -> 1 */
        {0x33C00000, 0x0002},                       /* 1.5 * 2^-24: tie, odd -> 2 */
        {0x34200000, 0x0002},                       /* 2.5 * 2^-24: tie, even -> 2 */
        {0x00000001, 0x0000},                       /* f32 subnormal -> 0 */
        {0x7F800000, 0x7C00}, {0xFF800000, 0xFC00}, /* +-inf */
        {0x7FC00000, 0x7E00},                       /* quiet NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = pg_f32_to_f16(from_bits(cases[i].f));
        if (got != cases[i].h)
            fail_msg("f32 0x%08x -> f16: expected 0x%04x, got 0x%04x", (unsigned)cases[i].f,
                     (unsigned)cases[i].h, (unsigned)got);
    }
    /* NaNs whose payload lies only in the dropped bits must stay NaN */
    uint16_t h = pg_f32_to_f16(from_bits(0x7F800001));
    assert_true((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0);
    h = pg_f32_to_f16(from_bits(0xFF800001));
    assert_true(h & 0x8000);
    assert_true(isnan(pg_f16_to_f32(h)));
}

/* Every f16 and bf16 value survives x -> f32 -> x (NaNs stay NaN). */
static void test_round_trips_exhaustive(void **state)
{
    (void)state;
    for (uint32_t x = 0; x < 65536; x++) {
        uint16_t h = (uint16_t)x;
        float f = pg_f16_to_f32(h);
        bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (nan) {
            assert_true(isnan(f));
            assert_true(isnan(pg_f16_to_f32(pg_f32_to_f16(f))));
        } else if (pg_f32_to_f16(f) != h) {
            fail_msg("f16 0x%04x round trip gave 0x%04x", (unsigned)h, (unsigned)pg_f32_to_f16(f));
        }
        float g = pg_bf16_to_f32(h);
        bool bnan = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
        if (bnan)
            assert_true(isnan(pg_bf16_to_f32(pg_f32_to_bf16(g))));
        else if (pg_f32_to_bf16(g) != h)
            fail_msg("bf16 0x%04x round trip gave 0x%04x", (unsigned)h, (unsigned)pg_f32_to_bf16(g));
    }
}

/* Reference rounding via double rint() (ties to even in the default mode):
 * a value with `mbits` mantissa bits, exponent bias `bias`, `ebits` exponent
 * bits. Returns the encoding's magnitude bits (no sign). */
static uint32_t ref_round(double a, int mbits, int ebits, int bias)
{
    int emin = 1 - bias; /* exponent of the smallest normal */
    int emax_field = (1 << ebits) - 1;
    if (a < ldexp(1.0, emin)) { /* subnormal: quantum 2^(emin - mbits) */
        double q = rint(ldexp(a, mbits - emin));
        return (uint32_t)q; /* q == 2^mbits encodes the smallest normal */
    }
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): exponent e - 1 */
    e -= 1;
    double q = rint(ldexp(a, mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
    if (q >= ldexp(1.0, mbits + 1)) {
        q = ldexp(1.0, mbits);
        e += 1;
    }
    if (e + bias >= emax_field)
        return (uint32_t)emax_field << mbits; /* inf */
    return ((uint32_t)(e + bias) << mbits) | ((uint32_t)q - (1u << mbits));
}

static void test_random_against_reference(void **state)
{
    (void)state;
    pg_test_rng rng = {12345};
    for (int i = 0; i < 400000; i++) {
        uint32_t u = (uint32_t)pg_test_rng_next(&rng);
        /* half the draws near f16's range so subnormals/overflow get hit */
        if (i & 1)
            u = (u & 0x80FFFFFFu) | ((uint32_t)pg_test_rng_int(&rng, 100, 145) << 23);
        float f = from_bits(u);
        if (isnan(f) || isinf(f))
            continue;
        double a = fabs((double)f);
        uint16_t sign16 = (uint16_t)((u >> 16) & 0x8000u);
        uint16_t want_h = (uint16_t)(sign16 | ref_round(a, 10, 5, 15));
        uint16_t want_b = (uint16_t)(sign16 | ref_round(a, 7, 8, 127));
        uint16_t got_h = pg_f32_to_f16(f), got_b = pg_f32_to_bf16(f);
        if (got_h != want_h)
            fail_msg("f32 0x%08x -> f16: reference 0x%04x, got 0x%04x", (unsigned)u, (unsigned)want_h,
                     (unsigned)got_h);
        if (got_b != want_b)
            fail_msg("f32 0x%08x -> bf16: reference 0x%04x, got 0x%04x", (unsigned)u, (unsigned)want_b,
                     (unsigned)got_b);
    }
}

static void test_convert_unaligned(void **state)
{
    (void)state;
    unsigned char raw[1 + 4 * 3];
    uint16_t h[3] = {0x3C00, 0xC000, 0x0001};
    uint16_t b[3] = {0x3F80, 0xC040, 0x7F80};
    float f[3] = {1.5f, -0.25f, 3.0f}, out[3];
    memcpy(raw + 1, h, sizeof h); /* odd address: src may be unaligned */
    pg_convert_to_f32(out, raw + 1, ST_F16, 3);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && bits(out[2]) == 0x33800000);
    memcpy(raw + 1, b, sizeof b);
    pg_convert_to_f32(out, raw + 1, ST_BF16, 3);
    assert_true(out[0] == 1.0f && out[1] == -3.0f && isinf(out[2]));
    memcpy(raw + 1, f, sizeof f);
    pg_convert_to_f32(out, raw + 1, ST_F32, 3);
    assert_memory_equal(out, f, sizeof f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_sizes),
        cmocka_unit_test(test_f16_to_f32),
        cmocka_unit_test(test_bf16_to_f32),
        cmocka_unit_test(test_f32_to_bf16),
        cmocka_unit_test(test_f32_to_f16),
        cmocka_unit_test(test_round_trips_exhaustive),
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_convert_unaligned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
