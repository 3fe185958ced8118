/* test_invariance: batch invariance (executor.h "Determinism", DESIGN.md
 * "Outputs are a pure function of the inputs"). On every executor of the
 * table: a row's matmul / logits / rmsnorm result and a sequence's attention
 * output are bit-identical alone and inside a larger ragged batch. On the
 * CPU also across thread counts 1, 2 and 3 and across GEMM variants (the
 * "cpu-avx2" and "cpu-generic" entries of ops_executors.c, where this CPU
 * runs them). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cpu_gemm.h"
#include "ops_executors.h"
#include "ops_support.h"

static float *rand_buf(pg_test_rng *rng, size_t n, float amp)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    pg_test_fill_uniform(rng, p, n, -amp, amp);
    return p;
}

static void ok(executor *ex, int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s failed: %s", ex->name, what, ex->op->last_error(ex));
}

/* The executors under test: the table's, plus CPU executors with 1, 2 and 3
 * threads. Results of every one must equal those of the first (for the
 * same element types); n_out counts them. */
#define MAX_EX 8
static int32_t make_executors(executor **exs)
{
    int32_t n = 0;
    for (int32_t i = 0; i < ops_executor_count() && n < MAX_EX; i++) {
        pg_error err = {{0}};
        int rc = ops_executor_get(i)->create(&exs[n], &err);
        if (rc == PG_EUNSUPPORTED) {
            print_message("SKIP %s: %s\n", ops_executor_get(i)->name, err.msg);
            continue;
        }
        if (rc)
            fail_msg("creating %s: %s", ops_executor_get(i)->name, err.msg);
        n++;
    }
    for (int32_t t = 1; t <= 3 && n < MAX_EX; t++) {
        cpu_executor_params p = {.threads = t};
        pg_error err = {{0}};
        if (cpu_executor_create(&exs[n], &p, &err))
            fail_msg("creating cpu executor with %d threads: %s", (int)t, err.msg);
        n++;
    }
    return n;
}

/* Executors that must give the same bits: the same kind ("cpu" with any
 * thread count and every "cpu-<gemm variant>": cpu_gemm.h's canonical
 * order is the same on every instruction set). */
static int same_family(const executor *a, const executor *b)
{
    if (strcmp(a->name, b->name) == 0)
        return 1;
    return strncmp(a->name, "cpu", 3) == 0 && strncmp(b->name, "cpu", 3) == 0;
}

static void destroy_executors(executor **exs, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        exs[i]->op->destroy(exs[i]);
}

/* y rows of a matmul (or logits) of x [M][K] with w [N][K] on ex. */
static void run_matmul(executor *ex, float *y, const float *x, const float *w, int32_t M, int32_t N, int32_t K,
                       int logits)
{
    void *dx = ops_dev_alloc(ex, EXEC_ACT, (size_t)M * K), *dw = ops_dev_alloc(ex, EXEC_WT, (size_t)N * K);
    ops_dev_put(ex, dx, EXEC_ACT, x, (size_t)M * K);
    /* no guard after w (an input): int8 weights take uploads at whole blocks */
    ok(ex, ex->op->upload(ex, dw, EXEC_WT, 0, w, ST_F32, (size_t)N * K), "upload w");
    if (logits) {
        ok(ex, ex->op->logits(ex, y, dx, dw, M, N, K), "logits");
    } else {
        void *dy = ops_dev_alloc(ex, EXEC_ACT, (size_t)M * N);
        ops_dev_poison(ex, dy, EXEC_ACT, (size_t)M * N);
        ok(ex, ex->op->matmul(ex, dy, dx, dw, M, N, K), "matmul");
        ops_dev_get(ex, y, dy, EXEC_ACT, (size_t)M * N, "matmul out");
        ex->op->free(ex, dy);
    }
    ex->op->free(ex, dx);
    ex->op->free(ex, dw);
}

static void check_rows_matmul(int logits)
{
    executor *exs[MAX_EX];
    const int32_t n_ex = make_executors(exs);
    pg_test_rng rng = {logits ? 101 : 100};
    const int32_t shapes[][2] = {{2304, 768}, {768, 2048}, {37, 17}, {1000, 64}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t N = shapes[c][0], K = shapes[c][1], M = 64;
        float *w = rand_buf(&rng, (size_t)N * K, 1.0f), *x = rand_buf(&rng, (size_t)M * K, 1.0f);
        float *y_big = malloc((size_t)M * N * sizeof(float)), *y_one = malloc((size_t)N * sizeof(float));
        float *first = malloc((size_t)M * N * sizeof(float));
        assert_non_null(y_big);
        assert_non_null(y_one);
        assert_non_null(first);
        for (int32_t e = 0; e < n_ex; e++) {
            executor *ex = exs[e];
            run_matmul(ex, y_big, x, w, M, N, K, logits);
            for (int32_t r = 0; r < M; r += 9) {
                run_matmul(ex, y_one, x + (size_t)r * K, w, 1, N, K, logits);
                if (memcmp(y_one, y_big + (size_t)r * N, (size_t)N * sizeof(float)) != 0)
                    fail_msg("%s: %s N=%d K=%d: row %d alone differs from the same row in a batch of %d",
                             ex->name, logits ? "logits" : "matmul", (int)N, (int)K, (int)r, (int)M);
            }
            /* the same executor kind with another thread count: same bits */
            if (e == 0)
                memcpy(first, y_big, (size_t)M * N * sizeof(float));
            else if (ex->act_bytes == exs[0]->act_bytes && same_family(ex, exs[0]) &&
                     memcmp(first, y_big, (size_t)M * N * sizeof(float)) != 0)
                fail_msg("%s (executor %d): %s N=%d K=%d differs from %s (thread count or gemm variant)", ex->name, (int)e,
                         logits ? "logits" : "matmul", (int)N, (int)K, exs[0]->name);
        }
        free(w);
        free(x);
        free(y_big);
        free(y_one);
        free(first);
    }
    destroy_executors(exs, n_ex);
}

static void test_matmul_invariance(void **state)
{
    (void)state;
    check_rows_matmul(0);
}

static void test_logits_invariance(void **state)
{
    (void)state;
    check_rows_matmul(1);
}

static void test_rmsnorm_invariance(void **state)
{
    (void)state;
    executor *exs[MAX_EX];
    const int32_t n_ex = make_executors(exs);
    pg_test_rng rng = {102};
    const int32_t rows = 33, dim = 768;
    float *x = rand_buf(&rng, (size_t)rows * dim, 2.0f), *w = rand_buf(&rng, (size_t)dim, 1.0f);
    float *big = malloc((size_t)rows * dim * sizeof(float)), *one = malloc((size_t)dim * sizeof(float));
    float *first = malloc((size_t)rows * dim * sizeof(float));
    assert_non_null(big);
    assert_non_null(one);
    assert_non_null(first);
    for (int32_t e = 0; e < n_ex; e++) {
        executor *ex = exs[e];
        void *dx = ops_dev_alloc(ex, EXEC_ACT, (size_t)rows * dim), *dw = ops_dev_alloc(ex, EXEC_F32, (size_t)dim);
        void *dout = ops_dev_alloc(ex, EXEC_ACT, (size_t)rows * dim);
        ops_dev_put(ex, dx, EXEC_ACT, x, (size_t)rows * dim);
        ops_dev_put(ex, dw, EXEC_F32, w, (size_t)dim);
        ops_dev_poison(ex, dout, EXEC_ACT, (size_t)rows * dim);
        ok(ex, ex->op->rmsnorm(ex, dout, NULL, dx, dw, rows, dim, 1e-5f), "rmsnorm");
        ops_dev_get(ex, big, dout, EXEC_ACT, (size_t)rows * dim, "rmsnorm out");
        void *dx1 = ops_dev_alloc(ex, EXEC_ACT, (size_t)dim), *dout1 = ops_dev_alloc(ex, EXEC_ACT, (size_t)dim);
        for (int32_t r = 0; r < rows; r += 5) {
            ops_dev_put(ex, dx1, EXEC_ACT, x + (size_t)r * dim, (size_t)dim);
            ops_dev_poison(ex, dout1, EXEC_ACT, (size_t)dim);
            ok(ex, ex->op->rmsnorm(ex, dout1, NULL, dx1, dw, 1, dim, 1e-5f), "rmsnorm");
            ops_dev_get(ex, one, dout1, EXEC_ACT, (size_t)dim, "rmsnorm out");
            if (memcmp(one, big + (size_t)r * dim, (size_t)dim * sizeof(float)) != 0)
                fail_msg("%s: rmsnorm row %d alone differs from the batch of %d", ex->name, (int)r, (int)rows);
        }
        if (e == 0)
            memcpy(first, big, (size_t)rows * dim * sizeof(float));
        else if (same_family(ex, exs[0]) && memcmp(first, big, (size_t)rows * dim * sizeof(float)) != 0)
            fail_msg("%s (executor %d): rmsnorm differs across thread counts", ex->name, (int)e);
        ex->op->free(ex, dx1);
        ex->op->free(ex, dout1);
        ex->op->free(ex, dx);
        ex->op->free(ex, dw);
        ex->op->free(ex, dout);
    }
    free(x);
    free(w);
    free(big);
    free(one);
    free(first);
    destroy_executors(exs, n_ex);
}

/* attention of the batch; out [T][nh*hd] on the host */
static void run_attention(executor *ex, float *out, const float *qkv, const float *kc, const float *vc, size_t nc,
                          int32_t nh, int32_t nkv, int32_t hd, const step_batch *b)
{
    const int32_t T = b->num_tokens, width = (nh + 2 * nkv) * hd;
    void *dq = ops_dev_alloc(ex, EXEC_ACT, (size_t)T * width), *dk = ops_dev_alloc(ex, EXEC_KV, nc);
    void *dv = ops_dev_alloc(ex, EXEC_KV, nc), *dout = ops_dev_alloc(ex, EXEC_ACT, (size_t)T * nh * hd);
    ops_dev_put(ex, dq, EXEC_ACT, qkv, (size_t)T * width);
    ops_dev_put(ex, dk, EXEC_KV, kc, nc);
    ops_dev_put(ex, dv, EXEC_KV, vc, nc);
    ops_dev_poison(ex, dout, EXEC_ACT, (size_t)T * nh * hd);
    ok(ex, ex->op->begin_step(ex, b), "begin_step");
    ok(ex, ex->op->attention(ex, dout, dq, dk, dv, nh, nkv, hd, 1.0f / sqrtf((float)hd), b), "attention");
    ops_dev_get(ex, out, dout, EXEC_ACT, (size_t)T * nh * hd, "attention out");
    ex->op->free(ex, dq);
    ex->op->free(ex, dk);
    ex->op->free(ex, dv);
    ex->op->free(ex, dout);
}

static void test_attention_invariance(void **state)
{
    (void)state;
    executor *exs[MAX_EX];
    const int32_t n_ex = make_executors(exs);
    pg_test_rng rng = {103};
    const int32_t nh = 8, nkv = 2, hd = 64, bs = 16;
    const ops_seq_spec specs[] = {{40, 1}, {17, 17}, {100, 1}, {33, 5}, {16, 1}, {250, 64}};
    const int32_t S = 6;
    ops_batch ob;
    ops_batch_build(&ob, specs, S, bs, 10, &rng);
    const int32_t T = ob.b.num_tokens, width = (nh + 2 * nkv) * hd, ow = nh * hd;
    const size_t nc = (size_t)ob.num_blocks * bs * nkv * hd;
    float *qkv = rand_buf(&rng, (size_t)T * width, 1.0f), *kc = rand_buf(&rng, nc, 1.0f), *vc = rand_buf(&rng, nc, 1.0f);
    float *big = malloc((size_t)T * ow * sizeof(float)), *first = malloc((size_t)T * ow * sizeof(float));
    float *one = malloc((size_t)T * ow * sizeof(float));
    assert_non_null(big);
    assert_non_null(first);
    assert_non_null(one);
    for (int32_t e = 0; e < n_ex; e++) {
        executor *ex = exs[e];
        run_attention(ex, big, qkv, kc, vc, nc, nh, nkv, hd, &ob.b);
        for (int32_t s = 0; s < S; s++) {
            ops_batch alone;
            ops_batch_extract(&alone, &ob, s);
            const int32_t q0 = ob.query_start[s], q = alone.b.num_tokens;
            run_attention(ex, one, qkv + (size_t)q0 * width, kc, vc, nc, nh, nkv, hd, &alone.b);
            if (memcmp(one, big + (size_t)q0 * ow, (size_t)q * ow * sizeof(float)) != 0)
                fail_msg("%s: attention of sequence %d (len %d, %d tokens) alone differs from the ragged batch",
                         ex->name, (int)s, (int)specs[s].seq_len, (int)q);
            ops_batch_free(&alone);
        }
        if (e == 0)
            memcpy(first, big, (size_t)T * ow * sizeof(float));
        else if (same_family(ex, exs[0]) && memcmp(first, big, (size_t)T * ow * sizeof(float)) != 0)
            fail_msg("%s (executor %d): attention differs across thread counts", ex->name, (int)e);
    }
    free(qkv);
    free(kc);
    free(vc);
    free(big);
    free(first);
    free(one);
    ops_batch_free(&ob);
    destroy_executors(exs, n_ex);
}

/* Weight storage types (cpu_wt.h): for bf16 and int8 weights, on CPU
 * executors with 1, 2 and 3 threads and every GEMM variant this CPU runs,
 * a row of matmul / logits is bit-identical alone and in a batch of 64,
 * every executor gives the same bits, and those bits are the f32
 * executor's on the values the storage holds (bf16: the weights rounded
 * once; int8: dequantized): the storage changes the numbers read, never
 * the order they are summed in. A 16-bit KV cache is checked the same way
 * by test_attention_fast.c. */
static void check_storage(cpu_wt wt, int logits)
{
    executor *exs[8];
    int32_t n_ex = 0;
    for (int32_t v = 0; v < CPU_GEMM_VARIANT_COUNT; v++)
        for (int32_t t = 1; t <= 3; t++) {
            if (!cpu_gemm_variant_available((cpu_gemm_variant)v) || (v != CPU_GEMM_AUTO && t != 2) || n_ex == 8)
                continue;
            cpu_executor_params p = {.threads = t, .gemm_variant = v, .wt_dtype = (int32_t)wt};
            pg_error err = {{0}};
            if (cpu_executor_create(&exs[n_ex], &p, &err))
                fail_msg("cpu executor (%s weights): %s", cpu_wt_name(wt), err.msg);
            n_ex++;
        }
    executor *f32 = NULL;
    pg_error err = {{0}};
    cpu_executor_params p32 = {.threads = 2};
    if (cpu_executor_create(&f32, &p32, &err))
        fail_msg("cpu executor: %s", err.msg);
    pg_test_rng rng = {(uint64_t)(300 + 10 * wt + logits)};
    const int32_t shapes[][2] = {{2304, 768}, {768, 2048}, {37, 17}, {172, 64}, {64, 172}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t N = shapes[c][0], K = shapes[c][1], M = 64;
        float *w = rand_buf(&rng, (size_t)N * K, 0.05f), *x = rand_buf(&rng, (size_t)M * K, 1.0f);
        float *y_big = malloc((size_t)M * N * sizeof(float)), *y_one = malloc((size_t)N * sizeof(float));
        float *want = malloc((size_t)M * N * sizeof(float));
        assert_non_null(y_big);
        assert_non_null(y_one);
        assert_non_null(want);
        /* the stored values, as f32 */
        void *dw = ops_dev_alloc(exs[0], EXEC_WT, (size_t)N * K);
        ok(exs[0], exs[0]->op->upload(exs[0], dw, EXEC_WT, 0, w, ST_F32, (size_t)N * K), "upload w");
        if (exs[0]->op->download_f32(exs[0], w, dw, EXEC_WT, (size_t)N * K))
            fail_msg("download: %s", exs[0]->op->last_error(exs[0]));
        exs[0]->op->free(exs[0], dw);
        run_matmul(f32, want, x, w, M, N, K, logits);
        for (int32_t e = 0; e < n_ex; e++) {
            executor *ex = exs[e];
            run_matmul(ex, y_big, x, w, M, N, K, logits);
            if (memcmp(want, y_big, (size_t)M * N * sizeof(float)) != 0)
                fail_msg("%s weights, %s (executor %d) %s N=%d K=%d: differs from f32 on the stored values",
                         cpu_wt_name(wt), ex->name, (int)e, logits ? "logits" : "matmul", (int)N, (int)K);
            for (int32_t r = 0; r < M; r += 9) {
                run_matmul(ex, y_one, x + (size_t)r * K, w, 1, N, K, logits);
                if (memcmp(y_one, y_big + (size_t)r * N, (size_t)N * sizeof(float)) != 0)
                    fail_msg("%s weights, %s: %s N=%d K=%d: row %d alone differs from a batch of %d",
                             cpu_wt_name(wt), ex->name, logits ? "logits" : "matmul", (int)N, (int)K, (int)r,
                             (int)M);
            }
        }
        free(w);
        free(x);
        free(y_big);
        free(y_one);
        free(want);
    }
    f32->op->destroy(f32);
    destroy_executors(exs, n_ex);
}

static void test_storage_invariance(void **state)
{
    (void)state;
    for (int wt = CPU_WT_BF16; wt < CPU_WT_COUNT; wt++) {
        check_storage((cpu_wt)wt, 0);
        check_storage((cpu_wt)wt, 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_invariance),
        cmocka_unit_test(test_logits_invariance),
        cmocka_unit_test(test_rmsnorm_invariance),
        cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_storage_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
