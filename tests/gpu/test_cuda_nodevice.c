/* test_cuda_nodevice: what the CUDA executor does on a machine without a
 * GPU (or without the driver) — the build and CI machines: the device count
 * is 0 without an error printed or a crash, and creating the executor fails
 * cleanly with PG_EDEVICE and a message. On a machine with a device it
 * checks parameter validation only. Built only when CUDA is. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_executor.h"

static void test_count_and_create(void **state)
{
    (void)state;
    int n = cuda_device_count();
    assert_true(n >= 0);
    assert_int_equal(cuda_device_count(), n); /* stable, no sticky error */
    executor *ex = NULL;
    pg_error err;
    memset(&err, 0, sizeof err);
    cuda_executor_params p = cuda_executor_params_default();
    assert_int_equal(p.device, 0);
    assert_int_equal(p.kv_dtype, 0);
    assert_int_equal(p.precision, 0);
    if (n == 0) {
        assert_int_equal(cuda_executor_create(&ex, &p, &err), PG_EDEVICE);
        assert_null(ex);
        assert_non_null(strstr(err.msg, "no CUDA device"));
    } else {
        p.device = n; /* one past the last */
        assert_int_equal(cuda_executor_create(&ex, &p, &err), PG_EINVAL);
        assert_null(ex);
    }
}

static void test_bad_params(void **state)
{
    (void)state;
    executor *ex = NULL;
    pg_error err;
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = 2;
    assert_int_equal(cuda_executor_create(&ex, &p, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "precision 2"));
    p.precision = 0;
    p.kv_dtype = 5;
    assert_int_equal(cuda_executor_create(&ex, &p, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "kv_dtype 5"));
    assert_null(ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count_and_create),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
