/* test_lora_ops: the CPU executor's lora_add (executor.h; cpu/cpu_lora.c).
 *
 *  - twin: on random inputs (T past a 64-row slice, K not a multiple of
 *    16, four slots of ranks 16, 8, 3, 1, one of them not targeting the
 *    projection, rows of the base model between), every output is bit for
 *    bit the plain-loop twin in the contract's order: the shrink in
 *    cpu_gemm's canonical order (16 fmaf lanes, the fixed tree), the
 *    expand over j increasing, then the scale, then the add;
 *  - untouched: rows with slot -1, rows whose slot has no A here, the
 *    columns of y outside the projection's (a fused output), and every row
 *    when b->lora_slots is NULL, keep their bits;
 *  - row invariance: each row alone (T = 1) gives the bits it gets in the
 *    mixed batch, with 1 or 3 threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_executor.h"
#include "test_support.h"

/* N = 600: the expand's 64-column blocks, its tail and, over 3 threads, its column split (work above cpu_lora.c's one-thread bound) */
enum { T = 150, K = 72, N = 600, LDY = 611, OFF = 7, NS = 4 };
static const int32_t ranks[NS] = {16, 8, 3, 1};

typedef struct lora_case {
    float x[T][K];
    float y0[T][LDY];
    float *A[NS], *B[NS];
    float scale[NS];
    int32_t slot[T];
} lora_case;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static lora_case *make_case(void)
{
    lora_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++)
            c->x[t][k] = frand();
        for (int n = 0; n < LDY; n++)
            c->y0[t][n] = frand();
        /* -1, 0..3 mixed; slot 2 has no A for this projection */
        c->slot[t] = (int32_t)((t * 7 + t / 5) % (NS + 1)) - 1;
    }
    for (int a = 0; a < NS; a++) {
        c->scale[a] = 0.5f + 0.25f * (float)a;
        if (a == 2)
            continue;
        c->A[a] = malloc(sizeof(float) * (size_t)ranks[a] * K);
        c->B[a] = malloc(sizeof(float) * (size_t)N * (size_t)ranks[a]);
        for (int i = 0; i < ranks[a] * K; i++)
            c->A[a][i] = frand();
        for (int i = 0; i < N * ranks[a]; i++)
            c->B[a][i] = frand();
    }
    return c;
}

static void free_case(lora_case *c)
{
    for (int a = 0; a < NS; a++) {
        free(c->A[a]);
        free(c->B[a]);
    }
    free(c);
}

/* cpu_gemm.h's canonical order written plainly */
static float canon_dot(const float *x, const float *w, int32_t k)
{
    float l[16] = {0};
    for (int32_t i = 0; i < (k + 15) / 16 * 16; i++)
        l[i % 16] = fmaf(i < k ? x[i] : 0.0f, i < k ? w[i] : 0.0f, l[i % 16]);
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++)
        s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* the twin: plain loops in the contract's order, row by row */
static void twin(const lora_case *c, float y[T][LDY])
{
    memcpy(y, c->y0, sizeof c->y0);
    for (int t = 0; t < T; t++) {
        const int a = c->slot[t];
        if (a < 0 || !c->A[a])
            continue;
        float u[16];
        for (int j = 0; j < ranks[a]; j++)
            u[j] = canon_dot(c->x[t], c->A[a] + (size_t)j * K, K);
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int j = 0; j < ranks[a]; j++) {
                const float p = u[j] * c->B[a][n * ranks[a] + j];
                s = s + p;
            }
            const float d = c->scale[a] * s;
            y[t][OFF + n] = y[t][OFF + n] + d;
        }
    }
}

static executor *make_cpu(int32_t threads)
{
    cpu_executor_params p = {.threads = threads};
    executor *ex = NULL;
    pg_error err = {{0}};
    if (cpu_executor_create(&ex, &p, &err) != PG_OK)
        fail_msg("cpu executor: %s", err.msg);
    return ex;
}

static void run_op(executor *ex, const lora_case *c, float *y, const float *x, const int32_t *slots, int32_t n)
{
    step_batch b = {.num_tokens = n, .lora_slots = slots};
    const int32_t rank[NS] = {ranks[0], ranks[1], ranks[2], ranks[3]};
    const void *A[NS], *B[NS];
    for (int a = 0; a < NS; a++) {
        A[a] = c->A[a];
        B[a] = c->B[a];
    }
    if (ex->op->lora_add(ex, y + OFF, LDY, x, K, N, A, B, c->scale, rank, NS, &b) != PG_OK)
        fail_msg("lora_add: %s", ex->op->last_error(ex));
}

static void test_twin_and_untouched(void **state)
{
    (void)state;
    lora_case *c = make_case();
    static float want[T][LDY], got[T][LDY];
    twin(c, want);
    executor *ex = make_cpu(3);
    memcpy(got, c->y0, sizeof got);
    run_op(ex, c, &got[0][0], &c->x[0][0], c->slot, T);
    int changed = 0;
    for (int t = 0; t < T; t++) {
        const int a = c->slot[t];
        for (int n = 0; n < LDY; n++) {
            if (memcmp(&got[t][n], &want[t][n], sizeof(float)) != 0)
                fail_msg("row %d (slot %d) col %d: %.9g, twin %.9g", t, a, n, (double)got[t][n],
                         (double)want[t][n]);
            const int inside = a >= 0 && c->A[a] && n >= OFF && n < OFF + N;
            if (!inside && memcmp(&got[t][n], &c->y0[t][n], sizeof(float)) != 0)
                fail_msg("row %d (slot %d) col %d was written", t, a, n);
            changed += inside && got[t][n] != c->y0[t][n];
        }
    }
    assert_true(changed > T / 2 * N / 2); /* the delta did something */
    /* no adapter rows at all */
    step_batch b = {.num_tokens = T, .lora_slots = NULL};
    memcpy(got, c->y0, sizeof got);
    assert_int_equal(ex->op->lora_add(ex, &got[0][OFF], LDY, c->x, K, N, NULL, NULL, NULL, NULL, 0, &b), PG_OK);
    assert_memory_equal(got, c->y0, sizeof got);
    /* a slot out of range is refused */
    int32_t bad[T];
    memcpy(bad, c->slot, sizeof bad);
    bad[3] = NS;
    step_batch bb = {.num_tokens = T, .lora_slots = bad};
    const int32_t rank[NS] = {ranks[0], ranks[1], ranks[2], ranks[3]};
    const void *A[NS] = {c->A[0], c->A[1], c->A[2], c->A[3]}, *B[NS] = {c->B[0], c->B[1], c->B[2], c->B[3]};
    assert_int_equal(ex->op->lora_add(ex, &got[0][OFF], LDY, c->x, K, N, A, B, c->scale, rank, NS, &bb),
                     PG_EINVAL);
    ex->op->destroy(ex);
    free_case(c);
}

static void test_row_invariance(void **state)
{
    (void)state;
    lora_case *c = make_case();
    static float batch[T][LDY], alone[LDY];
    executor *ex1 = make_cpu(1), *ex3 = make_cpu(3);
    memcpy(batch, c->y0, sizeof batch);
    run_op(ex3, c, &batch[0][0], &c->x[0][0], c->slot, T);
    for (int t = 0; t < T; t++) {
        memcpy(alone, c->y0[t], sizeof alone);
        run_op(t % 2 ? ex1 : ex3, c, alone, c->x[t], &c->slot[t], 1);
        if (memcmp(alone, batch[t], sizeof alone) != 0)
            fail_msg("row %d (slot %d): alone differs from the mixed batch", t, c->slot[t]);
    }
    /* one adapter for every row vs the mixed batch: the rows of slot 0 agree */
    static float same[T][LDY];
    int32_t all0[T];
    for (int t = 0; t < T; t++)
        all0[t] = 0;
    memcpy(same, c->y0, sizeof same);
    run_op(ex1, c, &same[0][0], &c->x[0][0], all0, T);
    for (int t = 0; t < T; t++)
        if (c->slot[t] == 0 && memcmp(same[t], batch[t], sizeof same[t]) != 0)
            fail_msg("row %d: slot 0 alone in the batch differs from slot 0 among others", t);
    ex1->op->destroy(ex1);
    ex3->op->destroy(ex3);
    free_case(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twin_and_untouched),
        cmocka_unit_test(test_row_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
