/* rope_table: inverse frequencies for default, linear and llama3 scaling. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rope_table.h"

/* The default case must be bit-identical to llama2.c run.c's expression,
 * which made the stories260K goldens (head_size 8, theta 10000). */
static void test_default_matches_llama2c(void **state)
{
    (void)state;
    float f[64];
    pg_error err;
    for (int hd = 2; hd <= 128; hd *= 2) {
        assert_int_equal(rope_inv_freq(f, hd, 10000.0f, NULL, &err), 0);
        for (int head_dim = 0; head_dim < hd; head_dim += 2) {
            float freq = 1.0f / powf(10000.0f, (float)head_dim / (float)hd); /* run.c */
            float want_bits = freq;
            assert_memory_equal(&f[head_dim / 2], &want_bits, sizeof(float));
            double exact = pow(10000.0, -(double)head_dim / (double)hd);
            assert_true(fabs((double)f[head_dim / 2] - exact) <= 1e-6 * exact);
        }
    }
    /* a config with rope_scaling type NONE gives the same as NULL */
    llama_rope_scaling none = {.type = LLAMA_ROPE_NONE, .factor = 8.0f};
    float g[4];
    assert_int_equal(rope_inv_freq(g, 8, 10000.0f, &none, &err), 0);
    assert_int_equal(rope_inv_freq(f, 8, 10000.0f, NULL, &err), 0);
    assert_memory_equal(f, g, sizeof g);
    assert_true(g[0] == 1.0f);
}

static void test_linear_divides_by_factor(void **state)
{
    (void)state;
    llama_rope_scaling lin = {.type = LLAMA_ROPE_LINEAR, .factor = 4.0f};
    float base[32], scaled[32];
    pg_error err;
    assert_int_equal(rope_inv_freq(base, 64, 500000.0f, NULL, &err), 0);
    assert_int_equal(rope_inv_freq(scaled, 64, 500000.0f, &lin, &err), 0);
    for (int i = 0; i < 32; i++)
        assert_true(scaled[i] == base[i] / 4.0f);
}

/* Llama 3.1's rope_scaling (factor 8, low 1, high 4, original 8192) on
 * theta 500000, head_dim 128, against the formula evaluated in double. */
static void test_llama3_three_regions(void **state)
{
    (void)state;
    llama_rope_scaling s = {.type = LLAMA_ROPE_LLAMA3, .factor = 8.0f, .low_freq_factor = 1.0f,
                            .high_freq_factor = 4.0f, .original_max_position_embeddings = 8192};
    float base[64], f[64];
    pg_error err;
    assert_int_equal(rope_inv_freq(base, 128, 500000.0f, NULL, &err), 0);
    assert_int_equal(rope_inv_freq(f, 128, 500000.0f, &s, &err), 0);
    int n_high = 0, n_low = 0, n_mid = 0;
    const double two_pi = 6.283185307179586;
    for (int i = 0; i < 64; i++) {
        double inv = (double)base[i];
        double wavelen = two_pi / inv;
        double want;
        if (wavelen < 8192.0 / 4.0) {
            want = inv;
            n_high++;
            assert_true(f[i] == base[i]); /* untouched, bit for bit */
        } else if (wavelen > 8192.0 / 1.0) {
            want = inv / 8.0;
            n_low++;
            assert_true(f[i] == base[i] / 8.0f);
        } else {
            double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
            want = (1.0 - smooth) * inv / 8.0 + smooth * inv;
            n_mid++;
            assert_true((double)f[i] < inv && (double)f[i] > inv / 8.0);
        }
        assert_true(fabs((double)f[i] - want) <= 1e-5 * want);
        if (i > 0)
            assert_true(f[i] < f[i - 1]); /* still strictly decreasing */
    }
    /* all three regions are exercised by this config */
    assert_true(n_high > 0 && n_low > 0 && n_mid > 0);
    assert_int_equal(n_high + n_low + n_mid, 64);
}

static void test_refusals_write_nothing(void **state)
{
    (void)state;
    float f[8];
    float sentinel[8];
    for (int i = 0; i < 8; i++)
        f[i] = sentinel[i] = -123.0f;
    pg_error err;
    assert_int_equal(rope_inv_freq(f, 7, 10000.0f, NULL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "head_dim"));
    assert_int_equal(rope_inv_freq(f, 0, 10000.0f, NULL, &err), PG_EINVAL);
    assert_int_equal(rope_inv_freq(f, 8, 0.0f, NULL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "rope_theta"));
    llama_rope_scaling bad = {.type = LLAMA_ROPE_LINEAR, .factor = 0.0f};
    assert_int_equal(rope_inv_freq(f, 8, 10000.0f, &bad, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "factor"));
    llama_rope_scaling bad3 = {.type = LLAMA_ROPE_LLAMA3, .factor = 8.0f, .low_freq_factor = 4.0f,
                               .high_freq_factor = 1.0f, .original_max_position_embeddings = 8192};
    assert_int_equal(rope_inv_freq(f, 8, 10000.0f, &bad3, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "low_freq_factor"));
    bad3.low_freq_factor = 1.0f;
    bad3.high_freq_factor = 4.0f;
    bad3.original_max_position_embeddings = 0;
    assert_int_equal(rope_inv_freq(f, 8, 10000.0f, &bad3, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "original_max_position_embeddings"));
    assert_memory_equal(f, sentinel, sizeof f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_matches_llama2c),
        cmocka_unit_test(test_linear_divides_by_factor),
        cmocka_unit_test(test_llama3_three_regions),
        cmocka_unit_test(test_refusals_write_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
