/* test_cuda_lora (suite gpu; emu_cuda_lora in suite gpu-emu on the
 * host-emulated device, tests/cuda_emu): the CUDA executor's lora_add
 * (core/executor.h; gpu/lora.cu, gpu/cuda_lora.c).
 *
 *  - twin: bf16 and f32 executors against a C twin of the kernels' exact
 *    orders (gpu/lora.cu's header: the shrink's 32 lanes of 8-element
 *    slices added by the xor butterfly, the expand's fmaf over j
 *    increasing, the scale, the add, each rounded as the kernels round),
 *    bit for bit; and against the contract's double reference within the
 *    dtype's tolerance. Cases: slots mixed with -1, slots whose A is NULL,
 *    ranks 1, 8, 16, 64, K and N not multiples of 8 (the scalar loads) and
 *    multiples (the 16-byte loads), y a column slice of a wider output
 *    (ldy > N, offset), T = 1 and T = 300, more slots than one launch's
 *    table (70: two tables). Rows without an adapter and the columns
 *    outside the slice keep their bits; guard elements stay.
 *  - row invariance: a row alone (T = 1) and in the mixed batch of 300:
 *    the same bits.
 *  - the CPU executor's lora_add (cpu/cpu_lora.c) on the same inputs:
 *    within 1e-5 (f32) / 2e-2 (bf16) of max |y|.
 *  - CUDA graphs: a small forward with a lora_add (embed, matmul,
 *    lora_add, gather, logits) through run_step with graphs on against the
 *    eager executor, bit for bit: a step without adapters, then the first
 *    with slots (captured again: the first graph had none), then steps
 *    with other slots (and none) in the same bucket replay that graph (the
 *    slots are read on the device) and give the eager bits; the adapters
 *    change the logits (else the test would prove nothing); a slot
 *    reloaded after the captures, then an eager step: captured again.
 *  - refusals: a slot >= n_slots, a rank past PG_LORA_MAX_RANK, A without B.
 * Without CUDA built or without a device: SKIP (77). */
#include <stdio.h>

#ifndef PG_HAVE_CUDA
int main(void)
{
    printf("SKIP: the CUDA executor is not built (meson found no nvcc/cuBLAS)\n");
    return 77;
}
#else

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cuda_executor.h"
#include "dtype.h"
#include "test_support.h"

enum { GUARD = 8, MAX_SLOTS = 70 };
static const float GUARD_VALUE = 768.0f;

static executor *make_cuda(int precision)
{
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    executor *ex = NULL;
    pg_error err = {{0}};
    if (cuda_executor_create(&ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    return ex;
}

static float round_act(const executor *ex, float v)
{
    return ex->act_bytes == 2 ? pg_bf16_to_f32(pg_f32_to_bf16(v)) : v;
}

/* n values + GUARD guard values on the device, in act; h rounded to act in place */
static void *put_act(executor *ex, float *h, size_t n)
{
    void *d = ex->op->alloc(ex, EXEC_ACT, n + GUARD);
    if (!d)
        fail_msg("alloc: %s", ex->op->last_error(ex));
    float *tmp = malloc((n + GUARD) * sizeof *tmp);
    assert_non_null(tmp);
    for (size_t i = 0; i < n; i++)
        tmp[i] = h[i] = round_act(ex, h[i]);
    for (size_t i = 0; i < GUARD; i++)
        tmp[n + i] = GUARD_VALUE;
    if (ex->op->upload(ex, d, EXEC_ACT, 0, tmp, ST_F32, n + GUARD))
        fail_msg("upload: %s", ex->op->last_error(ex));
    free(tmp);
    return d;
}

static void get_act(executor *ex, float *h, const void *d, size_t n)
{
    float *tmp = malloc((n + GUARD) * sizeof *tmp);
    assert_non_null(tmp);
    if (ex->op->download_f32(ex, tmp, d, EXEC_ACT, n + GUARD))
        fail_msg("download: %s", ex->op->last_error(ex));
    for (size_t i = 0; i < GUARD; i++)
        if (tmp[n + i] != GUARD_VALUE)
            fail_msg("guard element %zu after %zu values: %g", i, n, (double)tmp[n + i]);
    memcpy(h, tmp, n * sizeof *h);
    free(tmp);
}

/* ---- one case: inputs on the host ---------------------------------------- */

typedef struct lora_case {
    int32_t T, K, N, ldy, col0, n_slots;
    int32_t rank[MAX_SLOTS];
    int has_a[MAX_SLOTS];
    float scale[MAX_SLOTS];
    int32_t *slots;          /* [T] */
    float *x;                /* [T][K] */
    float *y0;               /* [T][ldy] */
    float *A[MAX_SLOTS];     /* [rank][K] */
    float *B[MAX_SLOTS];     /* [N][rank] */
} lora_case;

static void case_free(lora_case *c)
{
    free(c->slots);
    free(c->x);
    free(c->y0);
    for (int32_t a = 0; a < c->n_slots; a++) {
        free(c->A[a]);
        free(c->B[a]);
    }
}

/* ranks[a] (0: A NULL); slots drawn from the used slots and -1 */
static void case_make(lora_case *c, pg_test_rng *rng, int32_t T, int32_t K, int32_t N, int32_t ldy,
                      int32_t col0, int32_t n_slots, const int32_t *ranks)
{
    memset(c, 0, sizeof *c);
    c->T = T, c->K = K, c->N = N, c->ldy = ldy, c->col0 = col0, c->n_slots = n_slots;
    c->slots = malloc((size_t)T * sizeof *c->slots);
    c->x = malloc((size_t)T * K * sizeof *c->x);
    c->y0 = malloc((size_t)T * ldy * sizeof *c->y0);
    assert_true(c->slots && c->x && c->y0);
    pg_test_fill_uniform(rng, c->x, (size_t)T * K, -1.0f, 1.0f);
    pg_test_fill_uniform(rng, c->y0, (size_t)T * ldy, -2.0f, 2.0f);
    for (int32_t a = 0; a < n_slots; a++) {
        c->rank[a] = ranks[a] ? ranks[a] : 4;
        c->has_a[a] = ranks[a] != 0;
        c->scale[a] = pg_test_rng_uniform(rng, 0.25f, 4.0f);
        c->A[a] = malloc((size_t)c->rank[a] * K * sizeof(float));
        c->B[a] = malloc((size_t)N * c->rank[a] * sizeof(float));
        assert_true(c->A[a] && c->B[a]);
        pg_test_fill_uniform(rng, c->A[a], (size_t)c->rank[a] * K, -0.5f, 0.5f);
        pg_test_fill_uniform(rng, c->B[a], (size_t)N * c->rank[a], -0.5f, 0.5f);
    }
    for (int32_t t = 0; t < T; t++)
        c->slots[t] = pg_test_rng_int(rng, -1, n_slots - 1);
}

/* ---- the twins ----------------------------------------------------------- */

/* lora.cu's shrink order: lane l sums slices 8 l, 8 l + 256, ... with fmaf
 * in k order, then warp_sum's butterfly (lane l adds lane l ^ o's value,
 * o = 16, 8, 4, 2, 1); lane 0's sum. */
static float twin_shrink_dot(const float *x, const float *a, int32_t K)
{
    float lane[32];
    for (int l = 0; l < 32; l++) {
        float acc = 0.0f;
        for (int32_t k0 = 8 * l; k0 < K; k0 += 256)
            for (int32_t k = k0; k < k0 + 8 && k < K; k++)
                acc = fmaf(x[k], a[k], acc);
        lane[l] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        for (int l = 0; l < 32; l++)
            nv[l] = lane[l] + lane[l ^ o];
        memcpy(lane, nv, sizeof lane);
    }
    return lane[0];
}

/* y (the host copy of the whole [T][ldy], from y0) after lora_add as the
 * kernels compute it */
static void twin_kernels(const executor *ex, const lora_case *c, float *y)
{
    memcpy(y, c->y0, (size_t)c->T * c->ldy * sizeof *y);
    float u[512];
    for (int32_t t = 0; t < c->T; t++) {
        const int32_t a = c->slots[t];
        if (a < 0 || !c->has_a[a])
            continue;
        const int32_t r = c->rank[a];
        for (int32_t j = 0; j < r; j++)
            u[j] = round_act(ex, twin_shrink_dot(c->x + (size_t)t * c->K, c->A[a] + (size_t)j * c->K, c->K));
        for (int32_t n = 0; n < c->N; n++) {
            float dot = 0.0f;
            for (int32_t j = 0; j < r; j++)
                dot = fmaf(u[j], c->B[a][(size_t)n * r + j], dot);
            const float s = c->scale[a] * dot;
            float *yp = &y[(size_t)t * c->ldy + c->col0 + n];
            const float v = *yp + s;
            *yp = round_act(ex, v);
        }
    }
}

/* the contract in double: u rounded to act, the rest exact; y [T][ldy] */
static void twin_double(const executor *ex, const lora_case *c, double *y)
{
    for (size_t i = 0; i < (size_t)c->T * c->ldy; i++)
        y[i] = c->y0[i];
    double u[512];
    for (int32_t t = 0; t < c->T; t++) {
        const int32_t a = c->slots[t];
        if (a < 0 || !c->has_a[a])
            continue;
        const int32_t r = c->rank[a];
        for (int32_t j = 0; j < r; j++) {
            double s = 0.0;
            for (int32_t k = 0; k < c->K; k++)
                s += (double)c->x[(size_t)t * c->K + k] * (double)c->A[a][(size_t)j * c->K + k];
            u[j] = round_act(ex, (float)s);
        }
        for (int32_t n = 0; n < c->N; n++) {
            double dot = 0.0;
            for (int32_t j = 0; j < r; j++)
                dot += u[j] * (double)c->B[a][(size_t)n * r + j];
            y[(size_t)t * c->ldy + c->col0 + n] += (double)c->scale[a] * dot;
        }
    }
}

/* ---- running a case on an executor ---------------------------------------- */

typedef struct dev_case {
    void *x, *y;
    void *A[MAX_SLOTS], *B[MAX_SLOTS];
    const void *Ap[MAX_SLOTS], *Bp[MAX_SLOTS];
} dev_case;

/* uploads c (rounding its host inputs to ex's act in place) */
static void dev_case_put(executor *ex, lora_case *c, dev_case *d)
{
    memset(d, 0, sizeof *d);
    d->x = put_act(ex, c->x, (size_t)c->T * c->K);
    d->y = put_act(ex, c->y0, (size_t)c->T * c->ldy);
    for (int32_t a = 0; a < c->n_slots; a++) {
        d->A[a] = put_act(ex, c->A[a], (size_t)c->rank[a] * c->K);
        d->B[a] = put_act(ex, c->B[a], (size_t)c->N * c->rank[a]);
        d->Ap[a] = c->has_a[a] ? d->A[a] : NULL;
        d->Bp[a] = c->has_a[a] ? d->B[a] : NULL;
    }
}

static void dev_case_free(executor *ex, const lora_case *c, dev_case *d)
{
    ex->op->free(ex, d->x);
    ex->op->free(ex, d->y);
    for (int32_t a = 0; a < c->n_slots; a++) {
        ex->op->free(ex, d->A[a]);
        ex->op->free(ex, d->B[a]);
    }
}

/* A step of T one-token sequences (begin_step checks a real batch) */
typedef struct flat_step {
    int32_t *tok, *pos, *slot, *qs, *len, *bt, *rows;
    step_batch b;
} flat_step;

static void flat_step_make(flat_step *s, int32_t T, const int32_t *lora_slots)
{
    s->tok = calloc((size_t)T, 4);
    s->pos = calloc((size_t)T, 4);
    s->slot = calloc((size_t)T, 4);
    s->qs = calloc((size_t)T + 1, 4);
    s->len = calloc((size_t)T, 4);
    s->bt = calloc((size_t)T, 4);
    s->rows = calloc((size_t)T, 4);
    assert_true(s->tok && s->pos && s->slot && s->qs && s->len && s->bt && s->rows);
    for (int32_t t = 0; t < T; t++) {
        s->slot[t] = t * 16;
        s->qs[t + 1] = t + 1;
        s->len[t] = 1;
        s->bt[t] = t;
        s->rows[t] = t;
    }
    s->b = (step_batch){
        .num_tokens = T, .num_seqs = T, .block_size = 16, .token_ids = s->tok,
        .positions = s->pos, .slots = s->slot, .query_start = s->qs, .seq_lens = s->len,
        .block_tables = s->bt, .block_table_stride = 1, .max_seq_len = 1, .max_query_len = 1,
        .num_logits = T, .logits_rows = s->rows, .lora_slots = lora_slots,
    };
}

static void flat_step_free(flat_step *s)
{
    free(s->tok);
    free(s->pos);
    free(s->slot);
    free(s->qs);
    free(s->len);
    free(s->bt);
    free(s->rows);
}

/* lora_add of c on ex (rank_arg: the ranks passed, NULL: c's; null_b0:
 * slot 0's B passed as NULL); out [T][ldy] the result */
static int run_case_ranks(executor *ex, lora_case *c, const int32_t *rank_arg, int null_b0, float *out)
{
    dev_case d;
    dev_case_put(ex, c, &d);
    flat_step s;
    flat_step_make(&s, c->T, c->slots);
    if (null_b0)
        d.Bp[0] = NULL;
    int rc = ex->op->begin_step(ex, &s.b);
    if (rc == 0)
        rc = ex->op->lora_add(ex, (char *)d.y + (size_t)c->col0 * ex->act_bytes, c->ldy, d.x, c->K,
                              c->N, d.Ap, d.Bp, c->scale, rank_arg ? rank_arg : c->rank, c->n_slots,
                              &s.b);
    if (rc == 0)
        get_act(ex, out, d.y, (size_t)c->T * c->ldy);
    flat_step_free(&s);
    dev_case_free(ex, c, &d);
    return rc;
}

static int run_case(executor *ex, lora_case *c, float *out)
{
    return run_case_ranks(ex, c, NULL, 0, out);
}

static void check_case(executor *ex, lora_case *c, const char *what)
{
    const size_t n = (size_t)c->T * c->ldy;
    float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    double *ref = malloc(n * sizeof *ref);
    assert_true(got && want && ref);
    /* run first: it rounds c's inputs to the executor's act */
    if (run_case(ex, c, got))
        fail_msg("%s: %s: lora_add: %s", ex->name, what, ex->op->last_error(ex));
    twin_kernels(ex, c, want);
    twin_double(ex, c, ref);
    int touched = 0;
    double max_ref = 1e-3, max_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
            fail_msg("%s: %s: y[%zu][%zu] = %a, the kernels' twin %a (slot %d)", ex->name, what,
                     i / (size_t)c->ldy, i % (size_t)c->ldy, (double)got[i], (double)want[i],
                     (int)c->slots[i / (size_t)c->ldy]);
        touched += got[i] != c->y0[i];
        max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
        const double e = fabs((double)got[i] - ref[i]);
        max_err = e > max_err ? e : max_err;
    }
    const double tol = ex->act_bytes == 2 ? 2e-2 : 1e-5;
    if (max_err > tol * max_ref)
        fail_msg("%s: %s: max |y - double| = %g, expected <= %g x %g", ex->name, what, max_err, tol,
                 max_ref);
    if (!touched)
        fail_msg("%s: %s: no element changed: the case tests nothing", ex->name, what);
    free(got);
    free(want);
    free(ref);
}

/* the CPU executor's op (cpu/cpu_lora.c) on the same inputs */
static void check_against_cpu(executor *cu, lora_case *c, const char *what)
{
    cpu_executor_params p = {.threads = 0};
    executor *cpu = NULL;
    pg_error err = {{0}};
    if (cpu_executor_create(&cpu, &p, &err))
        fail_msg("cpu executor: %s", err.msg);
    if (!cpu->op->lora_add)
        fail_msg("%s: the cpu executor has no lora_add (cpu/cpu_lora.c)", what);
    const size_t n = (size_t)c->T * c->ldy;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    assert_true(a && b);
    /* the CUDA executor first: its act rounding then applies to both */
    if (run_case(cu, c, a))
        fail_msg("%s: %s: %s", cu->name, what, cu->op->last_error(cu));
    if (run_case(cpu, c, b))
        fail_msg("cpu: %s: %s", what, cpu->op->last_error(cpu));
    double max_ref = 1e-3, max_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        max_ref = fabs((double)b[i]) > max_ref ? fabs((double)b[i]) : max_ref;
        const double e = fabs((double)a[i] - (double)b[i]);
        max_err = e > max_err ? e : max_err;
    }
    const double tol = cu->act_bytes == 2 ? 2e-2 : 1e-5;
    if (max_err > tol * max_ref)
        fail_msg("%s vs cpu: %s: max diff %g, expected <= %g x %g", cu->name, what, max_err, tol, max_ref);
    print_message("%s vs cpu: %s: max |diff| %.3g (max |y| %.3g)\n", cu->name, what, max_err, max_ref);
    free(a);
    free(b);
    cpu->op->destroy(cpu);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_twin(void **state)
{
    (void)state;
    static const int32_t r4[] = {1, 16, 0, 8};            /* slot 2: A NULL */
    static const int32_t r64[] = {64, 0, 8};
    static const int32_t r3[] = {16, 8, 0};
    for (int precision = 0; precision <= 1; precision++) {
        executor *ex = make_cuda(precision);
        pg_test_rng rng = {77 + (uint64_t)precision};
        lora_case c;
        /* one row, 16-byte loads (K, rank multiples of 8) */
        static const int32_t r1[] = {8};
        case_make(&c, &rng, 1, 24, 20, 20, 0, 1, r1);
        c.slots[0] = 0;
        check_case(ex, &c, "T 1, K 24, N 20, rank 8");
        case_free(&c);
        /* scalar loads: K 37, N 45 a slice at column 7 of 60; ranks 1 and 16, a NULL A */
        case_make(&c, &rng, 9, 37, 45, 60, 7, 4, r4);
        c.slots[0] = -1, c.slots[1] = 2, c.slots[2] = 1, c.slots[3] = 0;
        check_case(ex, &c, "T 9, K 37, N 45 of 60, ranks 1/16/-/8");
        case_free(&c);
        /* rank 64, K a multiple of 8 and of 16, N odd */
        case_make(&c, &rng, 5, 48, 33, 33, 0, 3, r64);
        c.slots[0] = 0;
        check_case(ex, &c, "T 5, K 48, N 33, ranks 64/-/8");
        case_free(&c);
        /* 300 rows (past a 128-row chunk), K 40 (16-byte loads), N 19 */
        case_make(&c, &rng, 300, 40, 19, 19, 0, 3, r3);
        check_case(ex, &c, "T 300, K 40, N 19, ranks 16/8/-");
        case_free(&c);
        /* 70 slots: two tables of the launcher; slots 1 and 69 used */
        int32_t r70[70] = {0};
        r70[1] = 8;
        r70[69] = 16;
        case_make(&c, &rng, 6, 16, 12, 12, 0, 70, r70);
        const int32_t s70[6] = {69, 1, -1, 5, 69, 1};
        memcpy(c.slots, s70, sizeof s70);
        check_case(ex, &c, "70 slots");
        case_free(&c);
        ex->op->destroy(ex);
    }
}

/* a row's bits alone and in a batch of 300 with other adapters */
static void test_row_invariance(void **state)
{
    (void)state;
    static const int32_t ranks[] = {16, 1, 8};
    for (int precision = 0; precision <= 1; precision++) {
        executor *ex = make_cuda(precision);
        pg_test_rng rng = {5 + (uint64_t)precision};
        lora_case big;
        case_make(&big, &rng, 300, 72, 23, 23, 0, 3, ranks);
        float *all = malloc((size_t)300 * 23 * sizeof *all);
        assert_non_null(all);
        if (run_case(ex, &big, all))
            fail_msg("%s: batch: %s", ex->name, ex->op->last_error(ex));
        const int32_t rows[] = {0, 1, 150, 299};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            const int32_t t = rows[i];
            lora_case one = big;
            one.T = 1;
            one.slots = &big.slots[t];
            one.x = &big.x[(size_t)t * big.K];
            one.y0 = &big.y0[(size_t)t * big.ldy];
            float got[23];
            if (run_case(ex, &one, got))
                fail_msg("%s: row %d alone: %s", ex->name, (int)t, ex->op->last_error(ex));
            if (memcmp(got, &all[(size_t)t * 23], sizeof got) != 0)
                fail_msg("%s: row %d (slot %d): alone differs from in the batch of 300", ex->name,
                         (int)t, (int)big.slots[t]);
        }
        free(all);
        case_free(&big);
        ex->op->destroy(ex);
    }
}

static void test_against_cpu(void **state)
{
    (void)state;
    static const int32_t ranks[] = {16, 0, 8, 1};
    for (int precision = 0; precision <= 1; precision++) {
        executor *ex = make_cuda(precision);
        pg_test_rng rng = {99};
        lora_case c;
        case_make(&c, &rng, 130, 37, 29, 40, 3, 4, ranks);
        check_against_cpu(ex, &c, precision ? "f32: T 130, K 37, N 29 of 40" : "bf16: T 130, K 37, N 29 of 40");
        case_free(&c);
        ex->op->destroy(ex);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    pg_test_rng rng = {3};
    static const int32_t ranks[] = {8, 4};
    lora_case c;
    case_make(&c, &rng, 3, 16, 8, 8, 0, 2, ranks);
    float out[24];
    c.slots[1] = 2; /* n_slots is 2 */
    assert_int_equal(run_case(ex, &c, out), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "lora_slots[1] = 2"));
    c.slots[1] = 1;
    const int32_t bad[2] = {PG_LORA_MAX_RANK + 1, c.rank[1]};
    assert_int_equal(run_case_ranks(ex, &c, bad, 0, out), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "rank"));
    assert_int_equal(run_case_ranks(ex, &c, NULL, 1, out), PG_EINVAL); /* A without B */
    assert_non_null(strstr(ex->op->last_error(ex), "slot 0: expected B"));
    assert_int_equal(run_case(ex, &c, out), 0);
    case_free(&c);
    ex->op->destroy(ex);
}

/* ---- CUDA graphs -------------------------------------------------------------- */

enum { GH = 24, GV = 40, GSLOTS = 3, GMAX_BATCH = 4, GLEN = 64 };
static const int32_t g_ranks[GSLOTS] = {8, 16, 1};
static const int g_has_a[GSLOTS] = {1, 0, 1};

typedef struct graph_model {
    executor *ex;
    void *emb, *w, *x, *y, *rows;
    void *A[GSLOTS], *B[GSLOTS];
    const void *Ap[GSLOTS], *Bp[GSLOTS];
    float scale[GSLOTS];
} graph_model;

static int graph_forward(void *ctx, const step_batch *b, float *logits)
{
    graph_model *m = ctx;
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    const int32_t T = b->num_tokens;
    int rc;
    if ((rc = op->begin_step(ex, b)) || (rc = op->embed(ex, m->x, m->emb, GH, GV, b)) ||
        (rc = op->matmul(ex, m->y, m->x, m->w, T, GH, GH)) ||
        /* skipped without slots, as a forward may (the graphs then drop the
         * graphs captured before the first step with slots) */
        (b->lora_slots &&
         (rc = op->lora_add(ex, m->y, GH, m->x, GH, GH, m->Ap, m->Bp, m->scale, g_ranks, GSLOTS, b))) ||
        (rc = op->gather_rows(ex, m->rows, m->y, GH, b)))
        return rc;
    return op->logits(ex, logits, m->rows, m->emb, b->num_logits, GV, GH);
}

static void *gput(executor *ex, const float *h, size_t n)
{
    void *d = ex->op->alloc(ex, EXEC_ACT, n);
    if (!d || ex->op->upload(ex, d, EXEC_ACT, 0, h, ST_F32, n))
        fail_msg("graph model: %s", ex->op->last_error(ex));
    return d;
}

static void graph_model_init(graph_model *m, int graphs, pg_test_rng *rng_in)
{
    pg_test_rng rng = *rng_in; /* both models get the same weights */
    memset(m, 0, sizeof *m);
    m->ex = make_cuda(0);
    pg_error err = {{0}};
    if (graphs && cuda_executor_set_graphs(m->ex, GMAX_BATCH, GLEN, &err))
        fail_msg("set_graphs: %s", err.msg);
    float emb[GV * GH], w[GH * GH], buf[16 * GH];
    pg_test_fill_uniform(&rng, emb, GV * GH, -1.0f, 1.0f);
    pg_test_fill_uniform(&rng, w, GH * GH, -0.3f, 0.3f);
    m->emb = gput(m->ex, emb, GV * GH);
    m->w = gput(m->ex, w, GH * GH);
    m->x = m->ex->op->alloc(m->ex, EXEC_ACT, GMAX_BATCH * GH);
    m->y = m->ex->op->alloc(m->ex, EXEC_ACT, GMAX_BATCH * GH);
    m->rows = m->ex->op->alloc(m->ex, EXEC_ACT, GMAX_BATCH * GH);
    assert_true(m->x && m->y && m->rows);
    for (int a = 0; a < GSLOTS; a++) {
        pg_test_fill_uniform(&rng, buf, (size_t)g_ranks[a] * GH, -0.5f, 0.5f);
        m->A[a] = gput(m->ex, buf, (size_t)g_ranks[a] * GH);
        pg_test_fill_uniform(&rng, buf, (size_t)g_ranks[a] * GH, -0.5f, 0.5f);
        m->B[a] = gput(m->ex, buf, (size_t)g_ranks[a] * GH);
        m->Ap[a] = g_has_a[a] ? m->A[a] : NULL;
        m->Bp[a] = g_has_a[a] ? m->B[a] : NULL;
        m->scale[a] = 2.0f + (float)a;
    }
}

static void graph_model_free(graph_model *m)
{
    executor *ex = m->ex;
    void *bufs[] = {m->emb, m->w, m->x, m->y, m->rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ex->op->free(ex, bufs[i]);
    for (int a = 0; a < GSLOTS; a++) {
        ex->op->free(ex, m->A[a]);
        ex->op->free(ex, m->B[a]);
    }
    ex->op->destroy(ex);
}

/* decode step of S sequences, token ids tok, lora slots ls (or NULL) */
static void graph_step(graph_model *eager, graph_model *graph, int32_t S, const int32_t *tok,
                       const int32_t *ls, float *le, float *lg)
{
    flat_step s;
    flat_step_make(&s, S, ls);
    memcpy(s.tok, tok, (size_t)S * 4);
    if (graph_forward(eager, &s.b, le))
        fail_msg("eager step: %s", eager->ex->op->last_error(eager->ex));
    executor *gx = graph->ex;
    if (gx->op->run_step(gx, &s.b, lg, graph_forward, graph))
        fail_msg("graph step: %s", gx->op->last_error(gx));
    flat_step_free(&s);
}

static void test_graphs(void **state)
{
    (void)state;
    pg_test_rng rng = {2024};
    graph_model eager, graph;
    graph_model_init(&eager, 0, &rng);
    graph_model_init(&graph, 1, &rng);
    float le[GMAX_BATCH * GV], lg[GMAX_BATCH * GV], base[GMAX_BATCH * GV];
    const int32_t tok[GMAX_BATCH] = {3, 17, 39, 0};
    long captures = 0, replays = 0;
    /* 3 sequences -> bucket 4 (one dummy row): a step without adapters
     * first (its graph has no slots), then slots 0, -1, 2: captured again */
    const int32_t s1[3] = {0, -1, 2}, s2[3] = {2, 2, 0}, s3[3] = {1, 0, -1};
    graph_step(&eager, &graph, 3, tok, NULL, le, lg);
    if (memcmp(le, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("before any adapter: the graph's logits differ from the eager step's");
    graph_step(&eager, &graph, 3, tok, s1, le, lg);
    cuda_executor_graph_stats(graph.ex, &captures, &replays);
    assert_int_equal(captures, 2);
    assert_int_equal(replays, 2);
    if (memcmp(le, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("slots 0, -1, 2: the graph's logits differ from the eager step's");
    /* the same step without adapters: the adapters must change rows 0 and 2 */
    graph_step(&eager, &graph, 3, tok, NULL, base, lg);
    if (memcmp(base, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("no slots: the graph's logits differ from the eager step's");
    if (memcmp(base, le, GV * sizeof(float)) == 0 || memcmp(base + 2 * GV, le + 2 * GV, GV * sizeof(float)) == 0)
        fail_msg("the adapters did not change the logits of rows 0 and 2: the test proves nothing");
    if (memcmp(base + GV, le + GV, GV * sizeof(float)) != 0)
        fail_msg("row 1 (slot -1) changed with its neighbours' adapters");
    /* other slots, same bucket: the same graph replays */
    graph_step(&eager, &graph, 3, tok, s2, le, lg);
    if (memcmp(le, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("slots 2, 2, 0: the graph's logits differ from the eager step's");
    graph_step(&eager, &graph, 3, tok, s3, le, lg); /* slot 1 has no A: that row is the base's */
    if (memcmp(le, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("slots 1, 0, -1: the graph's logits differ from the eager step's");
    if (memcmp(base, le, GV * sizeof(float)) != 0)
        fail_msg("slot 1 (A NULL) changed its row");
    cuda_executor_graph_stats(graph.ex, &captures, &replays);
    assert_int_equal(captures, 2);
    assert_int_equal(replays, 5);
    /* one sequence: bucket 1, a second capture */
    const int32_t s4[1] = {2};
    graph_step(&eager, &graph, 1, tok + 1, s4, le, lg);
    if (memcmp(le, lg, GV * sizeof(float)) != 0)
        fail_msg("one sequence, slot 2: the graph's logits differ from the eager step's");
    cuda_executor_graph_stats(graph.ex, &captures, &replays);
    assert_int_equal(captures, 3);
    /* slot 0 reloaded (another scale) after the captures: an eager step (a
     * prefill chunk of two tokens, slot 0) sees the new value and drops the
     * graphs; the next decode step captures again and gives the eager bits */
    eager.scale[0] = graph.scale[0] = -1.5f;
    {
        int32_t tk[2] = {5, 6}, pos[2] = {0, 1}, sl[2] = {0, 1}, qs[2] = {0, 2}, len[1] = {2};
        int32_t bt[1] = {0}, rows[1] = {1}, ls[2] = {0, 0};
        step_batch pre = {
            .num_tokens = 2, .num_seqs = 1, .block_size = 16, .token_ids = tk, .positions = pos,
            .slots = sl, .query_start = qs, .seq_lens = len, .block_tables = bt,
            .block_table_stride = 1, .max_seq_len = 2, .max_query_len = 2, .num_logits = 1,
            .logits_rows = rows, .lora_slots = ls,
        };
        if (graph_forward(&eager, &pre, le))
            fail_msg("eager prefill: %s", eager.ex->op->last_error(eager.ex));
        if (graph.ex->op->run_step(graph.ex, &pre, lg, graph_forward, &graph))
            fail_msg("prefill through run_step: %s", graph.ex->op->last_error(graph.ex));
        if (memcmp(le, lg, GV * sizeof(float)) != 0)
            fail_msg("prefill: eager and run_step differ");
    }
    graph_step(&eager, &graph, 3, tok, s1, le, lg);
    if (memcmp(le, lg, 3 * GV * sizeof(float)) != 0)
        fail_msg("slot 0 reloaded: the graph's logits differ from the eager step's (a stale graph)");
    cuda_executor_graph_stats(graph.ex, &captures, &replays);
    assert_int_equal(captures, 4);
    graph_model_free(&eager);
    graph_model_free(&graph);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twin),
        cmocka_unit_test(test_row_invariance),
        cmocka_unit_test(test_against_cpu),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
