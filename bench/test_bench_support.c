/* Tests of the bench's own pieces that its figures rest on: the seeded
 * workloads (deterministic, means as documented, truncation, shared prefix)
 * and the JSON writer (well-formed, commas, escaping, non-finite -> null). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench_report.h"
#include "bench_workload.h"

static void test_workload_deterministic(void **state)
{
    (void)state;
    bench_workload_spec s = {.name = "sharegpt", .dist = BENCH_DIST_SHAREGPT, .n_requests = 64,
                             .seed = 5};
    bench_workload a, b, c;
    assert_int_equal(bench_workload_make(&a, &s, 1024, 32000), 0);
    assert_int_equal(bench_workload_make(&b, &s, 1024, 32000), 0);
    s.seed = 6;
    assert_int_equal(bench_workload_make(&c, &s, 1024, 32000), 0);
    int differs = 0;
    for (int32_t i = 0; i < a.n; i++) {
        assert_int_equal(a.prompt_len[i], b.prompt_len[i]);
        assert_int_equal(a.output_len[i], b.output_len[i]);
        assert_memory_equal(a.prompt_ids[i], b.prompt_ids[i],
                            (size_t)a.prompt_len[i] * sizeof(int32_t));
        differs += a.prompt_len[i] != c.prompt_len[i];
    }
    assert_true(differs > a.n / 2);
    bench_workload_free(&a);
    bench_workload_free(&b);
    bench_workload_free(&c);
}

/* Untruncated, the lognormal draws have the paper's means (within 5% at
 * 20000 draws; sigma 1 gives a standard error of the mean ~1%). */
static void test_workload_means(void **state)
{
    (void)state;
    const struct { bench_dist d; double in, out; } cases[] = {
        {BENCH_DIST_SHAREGPT, 161.31, 337.99},
        {BENCH_DIST_ALPACA, 19.31, 58.45},
    };
    for (size_t k = 0; k < 2; k++) {
        bench_workload_spec s = {.name = "m", .dist = cases[k].d, .n_requests = 20000,
                                 .seed = 9};
        bench_workload w;
        assert_int_equal(bench_workload_make(&w, &s, 1 << 30, 32000), 0);
        assert_int_equal(w.n_truncated, 0);
        assert_true(fabs(w.mean_prompt / cases[k].in - 1.0) < 0.05);
        assert_true(fabs(w.mean_output / cases[k].out - 1.0) < 0.05);
        bench_workload_free(&w);
    }
}

static void test_workload_truncation_and_ids(void **state)
{
    (void)state;
    bench_workload_spec s = {.name = "t", .dist = BENCH_DIST_SHAREGPT, .n_requests = 500,
                             .seed = 3};
    bench_workload w;
    assert_int_equal(bench_workload_make(&w, &s, 256, 512), 0);
    assert_true(w.n_truncated > 0);
    for (int32_t i = 0; i < w.n; i++) {
        assert_true(w.prompt_len[i] >= 1 && w.output_len[i] >= 1);
        assert_true(w.prompt_len[i] + w.output_len[i] <= 256);
        for (int32_t k = 0; k < w.prompt_len[i]; k++)
            assert_true(w.prompt_ids[i][k] >= 3 && w.prompt_ids[i][k] < 512);
    }
    bench_workload_free(&w);
}

static void test_workload_shared_prefix(void **state)
{
    (void)state;
    bench_workload_spec s = {.name = "p", .dist = BENCH_DIST_FIXED, .n_requests = 4,
                             .prompt_len = 40, .output_len = 8, .shared_prefix = 32, .seed = 1};
    bench_workload w;
    assert_int_equal(bench_workload_make(&w, &s, 128, 32000), 0);
    for (int32_t i = 1; i < w.n; i++) {
        assert_int_equal(w.prompt_len[i], 40);
        assert_memory_equal(w.prompt_ids[0], w.prompt_ids[i], 32 * sizeof(int32_t));
        assert_memory_not_equal(w.prompt_ids[0] + 32, w.prompt_ids[i] + 32, 8 * sizeof(int32_t));
    }
    bench_workload_free(&w);
}

static void test_json_writer(void **state)
{
    (void)state;
    char path[] = "/tmp/pagedgen_bench_json_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    bench_json *j = bench_json_open(path);
    assert_non_null(j);
    bench_json_obj(j, NULL);
    bench_json_str(j, "s", "a\"b\\c\n");
    bench_json_num(j, "x", 1.5);
    bench_json_num(j, "nan", (double)NAN);
    bench_json_arr(j, "a");
    bench_json_int(j, NULL, 1);
    bench_json_int(j, NULL, -2);
    bench_json_end(j);
    bench_json_obj(j, "empty");
    bench_json_end(j);
    bench_json_bool(j, "t", true);
    assert_int_equal(bench_json_close(j), 0); /* closes the open object */
    char buf[512] = {0};
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    remove(path);
    buf[n] = '\0';
    const char *want = "{\n  \"s\": \"a\\\"b\\\\c\\n\",\n  \"x\": 1.5,\n  \"nan\": null,\n"
                       "  \"a\": [\n    1,\n    -2\n  ],\n  \"empty\": {},\n  \"t\": true\n}\n";
    assert_string_equal(buf, want);
}

static void test_svg_writer(void **state)
{
    (void)state;
    char path[] = "/tmp/pagedgen_bench_svg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    double x[3] = {1, 2, 4}, y[3] = {10, 20, 15};
    bench_chart c = {.title = "t <&>", .x_label = "x", .y_label = "y", .log2_x = true,
                     .n_series = 1};
    c.series[0] = (bench_series){.name = "s", .n = 3, .x = x, .y = y};
    assert_int_equal(bench_svg_write(path, &c), 0);
    char buf[8192] = {0};
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    remove(path);
    buf[n] = '\0';
    assert_non_null(strstr(buf, "<svg "));
    assert_non_null(strstr(buf, "</svg>\n"));
    assert_non_null(strstr(buf, "t &lt;&amp;&gt;"));
    assert_non_null(strstr(buf, "<polyline"));
    /* log2 x: 1, 2, 4 evenly spaced across the plot (70 .. 470) */
    assert_non_null(strstr(buf, "70.0,"));
    assert_non_null(strstr(buf, "270.0,"));
    assert_non_null(strstr(buf, "470.0,"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workload_deterministic),
        cmocka_unit_test(test_workload_means),
        cmocka_unit_test(test_workload_truncation_and_ids),
        cmocka_unit_test(test_workload_shared_prefix),
        cmocka_unit_test(test_json_writer),
        cmocka_unit_test(test_svg_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
