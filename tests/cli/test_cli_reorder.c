/* tests/cli/test_cli_reorder: the bounded reorder buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reorder.h"
#include "test_support.h"

static char *rec(uint64_t seq)
{
    char *s = malloc(32);
    snprintf(s, 32, "r%llu", (unsigned long long)seq);
    return s;
}

static void test_in_order_release(void **state)
{
    (void)state;
    cli_reorder *r;
    assert_int_equal(cli_reorder_create(&r, 4), PG_OK);
    char *d;
    size_t len;
    assert_false(cli_reorder_pop_next(r, &d, &len));
    assert_int_equal(cli_reorder_put(r, 2, rec(2), 2), PG_OK);
    assert_int_equal(cli_reorder_put(r, 1, rec(1), 2), PG_OK);
    assert_false(cli_reorder_pop_next(r, &d, &len)); /* 0 is missing */
    char *dup = rec(1);
    assert_int_equal(cli_reorder_put(r, 1, dup, 2), PG_EINVAL);
    free(dup);
    /* window: next = 0, capacity 4 -> seq 4 is refused */
    assert_true(cli_reorder_can_admit(r, 3));
    assert_false(cli_reorder_can_admit(r, 4));
    char *far = rec(4);
    assert_int_equal(cli_reorder_put(r, 4, far, 2), PG_EINVAL);
    free(far);
    assert_int_equal(cli_reorder_put(r, 0, rec(0), 2), PG_OK);
    for (uint64_t k = 0; k < 3; k++) {
        assert_true(cli_reorder_pop_next(r, &d, &len));
        char want[32];
        snprintf(want, sizeof want, "r%llu", (unsigned long long)k);
        assert_string_equal(d, want);
        free(d);
    }
    assert_int_equal(cli_reorder_next(r), 3);
    assert_true(cli_reorder_can_admit(r, 6));
    assert_false(cli_reorder_can_admit(r, 2)); /* already released */
    cli_reorder_destroy(r);
}

static void test_pop_any_and_skip(void **state)
{
    (void)state;
    cli_reorder *r;
    assert_int_equal(cli_reorder_create(&r, 8), PG_OK);
    assert_int_equal(cli_reorder_put(r, 3, rec(3), 2), PG_OK);
    assert_int_equal(cli_reorder_put(r, 5, rec(5), 2), PG_OK);
    char *d;
    size_t len;
    assert_true(cli_reorder_pop_any(r, &d, &len));
    assert_string_equal(d, "r3");
    free(d);
    assert_int_equal(cli_reorder_next(r), 4);
    cli_reorder_skip_next(r);
    assert_true(cli_reorder_pop_next(r, &d, &len));
    assert_string_equal(d, "r5");
    free(d);
    assert_false(cli_reorder_pop_any(r, &d, &len));
    assert_int_equal(cli_reorder_held(r), 0);
    /* destroy frees what it still holds (ASan checks) */
    assert_int_equal(cli_reorder_put(r, 7, rec(7), 2), PG_OK);
    cli_reorder_destroy(r);
    assert_int_equal(cli_reorder_create(&r, 0), PG_EINVAL);
}

/* Random completion order through a small window always comes out sorted. */
static void test_random_order(void **state)
{
    (void)state;
    enum { N = 5000, CAP = 16 };
    cli_reorder *r;
    assert_int_equal(cli_reorder_create(&r, CAP), PG_OK);
    pg_test_rng rng = {12345};
    uint64_t admitted = 0, expect = 0;
    uint64_t inflight[CAP];
    int n_inflight = 0;
    while (expect < N) {
        while (admitted < N && n_inflight < CAP && cli_reorder_can_admit(r, admitted))
            inflight[n_inflight++] = admitted++;
        assert_true(n_inflight > 0);
        int pick = pg_test_rng_int(&rng, 0, n_inflight - 1);
        uint64_t seq = inflight[pick];
        inflight[pick] = inflight[--n_inflight];
        assert_int_equal(cli_reorder_put(r, seq, rec(seq), 2), PG_OK);
        char *d;
        size_t len;
        while (cli_reorder_pop_next(r, &d, &len)) {
            char want[32];
            snprintf(want, sizeof want, "r%llu", (unsigned long long)expect++);
            assert_string_equal(d, want);
            free(d);
        }
        assert_true(cli_reorder_held(r) <= CAP);
    }
    cli_reorder_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order_release),
        cmocka_unit_test(test_pop_any_and_skip),
        cmocka_unit_test(test_random_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
