/* test_cuda_moe (suite gpu on a device; emu_cuda_moe, suite gpu-emu, on the
 * host-emulated device): the CUDA executor's mixture-of-experts ops
 * (gpu/cuda_moe.c; executor.h moe_route, moe_experts, moe_shared_add).
 *
 *  - route: ids and weights bit-identical to the CPU twin (cpu/cpu_moe.c)
 *    for f32 logits (the f32 mode) and for bf16 logits (the CPU fed the
 *    same bf16 values widened): E = 8, 60, 128, k = 1, 2, 4, 8, with and
 *    without renormalization, rows with ties;
 *  - experts: every row's output is, bit for bit, its dense twin — the
 *    executor's own matmul (M = 1), silu_mul, matmul for each routed
 *    expert, combined in rank order (w0 * y0, then + w_r * y_r, f32, one
 *    rounding to the activation type) — in both precisions, for T = 1, 7
 *    and 300 (> 128: groups that span several 128-row GEMM chunks), with
 *    random routing and with every row sharing the same experts; a row
 *    alone gives the bits it has in the batch;
 *  - experts against the CPU twin (f32 mode, T = 300, k = 3): within 1e-5
 *    relative;
 *  - shared_add: out + sigmoid(g) * s bit-identical to the CPU twin (f32
 *    mode) and to the CPU's f32 result rounded once to bf16 (bf16 mode).
 * On a device only (not emulated: too slow there): row-position invariance
 * at Qwen3-30B-A3B's expert shapes (H 2048, moe_intermediate 768, 128
 * experts, top 8, bf16), 300 rows of which many share their experts, a
 * sample of rows against their dense twin and alone.
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

#include <cuda_runtime_api.h>

#include "cpu_executor.h"
#include "cuda_executor.h"
#include "dtype.h"
#include "test_support.h"

static executor *make_cuda(int precision)
{
    executor *ex = NULL;
    pg_error err = {{0}};
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    if (cuda_executor_create(&ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    return ex;
}

static executor *make_cpu(void)
{
    cpu_executor_params p = {.threads = 1};
    executor *ex = NULL;
    pg_error err = {{0}};
    if (cpu_executor_create(&ex, &p, &err))
        fail_msg("cpu executor: %s", err.msg);
    return ex;
}

static void ok(executor *ex, int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s failed: %s", ex->name, what, ex->op->last_error(ex));
}

/* f rounded to the activation type of precision prec, as f32 */
static float act_round(int prec, float f)
{
    return prec ? f : pg_bf16_to_f32(pg_f32_to_bf16(f));
}

static void *dev_upload(executor *ex, exec_buf_kind kind, const void *src, st_dtype dt, size_t n)
{
    void *d = ex->op->alloc(ex, kind, n ? n : 1);
    assert_non_null(d);
    if (n)
        ok(ex, ex->op->upload(ex, d, kind, 0, src, dt, n), "upload");
    return d;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- routing ------------------------------------------------------------- */

static void route_case(executor *cu, executor *cpu, int prec, int32_t T, int32_t E, int32_t k, int32_t norm,
                       pg_test_rng *rng)
{
    float *z = malloc((size_t)T * (size_t)E * sizeof *z);
    assert_non_null(z);
    pg_test_fill_uniform(rng, z, (size_t)T * E, -4.0f, 4.0f);
    /* ties: row 0 has three equal maxima, row 1 is constant */
    for (int32_t e = 0; e < E; e++) {
        if (T > 1)
            z[E + e] = 0.25f;
        if (e % 3 == 1)
            z[e] = 5.0f;
    }
    for (size_t i = 0; i < (size_t)T * E; i++) /* the logits the device holds */
        z[i] = act_round(prec, z[i]);
    void *zd = dev_upload(cu, EXEC_ACT, z, ST_F32, (size_t)T * E);
    int32_t *idd = cu->op->alloc(cu, EXEC_I32, (size_t)T * k);
    float *wd = cu->op->alloc(cu, EXEC_F32, (size_t)T * k);
    assert_non_null(idd);
    assert_non_null(wd);
    ok(cu, cu->op->moe_route(cu, idd, wd, zd, T, E, k, norm), "moe_route");
    int32_t *ids = malloc((size_t)T * k * sizeof *ids), *ids_c = malloc((size_t)T * k * sizeof *ids);
    float *w = malloc((size_t)T * k * sizeof *w), *w_c = malloc((size_t)T * k * sizeof *w);
    assert_true(ids && ids_c && w && w_c);
    ok(cu, cu->op->download_f32(cu, w, wd, EXEC_F32, (size_t)T * k), "download weights");
    /* ids: download_f32 takes float kinds only; a blocking copy of the int32s */
    assert_int_equal(cudaMemcpy(ids, idd, (size_t)T * k * 4u, cudaMemcpyDeviceToHost), cudaSuccess);
    ok(cpu, cpu->op->moe_route(cpu, ids_c, w_c, z, T, E, k, norm), "cpu moe_route");
    for (int32_t i = 0; i < T * k; i++) {
        if (ids[i] != ids_c[i] || bits(w[i]) != bits(w_c[i]))
            fail_msg("precision %d T %d E %d k %d norm %d: row %d rank %d: cuda expert %d weight %a, cpu %d %a", prec,
                     (int)T, (int)E, (int)k, (int)norm, (int)(i / k), (int)(i % k), (int)ids[i], (double)w[i],
                     (int)ids_c[i], (double)w_c[i]);
    }
    if (T > 1) /* the tie rows: the lowest ids first */
        for (int32_t r = 0; r < k; r++)
            assert_int_equal(ids[k + r], r);
    assert_int_equal(ids[0], 1);
    free(z), free(ids), free(ids_c), free(w), free(w_c);
    cu->op->free(cu, zd);
    cu->op->free(cu, idd);
    cu->op->free(cu, wd);
}

static void test_route(void **state)
{
    (void)state;
    executor *cpu = make_cpu();
    pg_test_rng rng = {31};
    for (int prec = 0; prec <= 1; prec++) {
        executor *cu = make_cuda(prec);
        route_case(cu, cpu, prec, 37, 8, 2, 1, &rng);
        route_case(cu, cpu, prec, 37, 8, 1, 0, &rng);
        route_case(cu, cpu, prec, 19, 60, 4, 0, &rng);
        route_case(cu, cpu, prec, 19, 128, 8, 1, &rng);
        cu->op->destroy(cu);
    }
    cpu->op->destroy(cpu);
}

/* ---- experts -------------------------------------------------------------- */

typedef struct experts {
    int32_t H, I, E;
    void *gu_all, *down_all;
    void **gu, **down; /* [E] device pointers into them */
} experts;

static void experts_init(experts *x, executor *ex, int32_t H, int32_t I, int32_t E, pg_test_rng *rng)
{
    x->H = H, x->I = I, x->E = E;
    const size_t n_gu = (size_t)2 * I * H, n_d = (size_t)H * I;
    x->gu_all = ex->op->alloc(ex, EXEC_WT, (size_t)E * n_gu);
    x->down_all = ex->op->alloc(ex, EXEC_WT, (size_t)E * n_d);
    x->gu = calloc((size_t)E, sizeof *x->gu);
    x->down = calloc((size_t)E, sizeof *x->down);
    float *buf = malloc((n_gu > n_d ? n_gu : n_d) * sizeof *buf);
    assert_true(x->gu_all && x->down_all && x->gu && x->down && buf);
    const float ag = 1.0f / sqrtf((float)H), ad = 1.0f / sqrtf((float)I);
    for (int32_t e = 0; e < E; e++) {
        pg_test_fill_uniform(rng, buf, n_gu, -ag, ag);
        ok(ex, ex->op->upload(ex, x->gu_all, EXEC_WT, (size_t)e * n_gu, buf, ST_F32, n_gu), "upload gate_up");
        pg_test_fill_uniform(rng, buf, n_d, -ad, ad);
        ok(ex, ex->op->upload(ex, x->down_all, EXEC_WT, (size_t)e * n_d, buf, ST_F32, n_d), "upload down");
        x->gu[e] = (char *)x->gu_all + exec_wt_bytes(ex, (size_t)e * n_gu);
        x->down[e] = (char *)x->down_all + exec_wt_bytes(ex, (size_t)e * n_d);
    }
    free(buf);
}

static void experts_free(experts *x, executor *ex)
{
    ex->op->free(ex, x->gu_all);
    ex->op->free(ex, x->down_all);
    free(x->gu);
    free(x->down);
}

/* moe_experts over rows [t0, t0 + T) of the host inputs: out [T][H] f32 */
static void run_experts(executor *ex, const experts *x, const float *xin, const int32_t *ids, const float *w,
                        int32_t T, int32_t k, float *out)
{
    const int32_t H = x->H;
    void *xd = dev_upload(ex, EXEC_ACT, xin, ST_F32, (size_t)T * H);
    int32_t *idd = dev_upload(ex, EXEC_I32, ids, ST_I32, (size_t)T * k);
    float *wd = dev_upload(ex, EXEC_F32, w, ST_F32, (size_t)T * k);
    void *od = ex->op->alloc(ex, EXEC_ACT, (size_t)T * H);
    assert_non_null(od);
    ok(ex, ex->op->moe_experts(ex, od, xd, idd, wd, x->gu, x->down, T, H, x->I, x->E, k), "moe_experts");
    ok(ex, ex->op->download_f32(ex, out, od, EXEC_ACT, (size_t)T * H), "download out");
    ex->op->free(ex, xd);
    ex->op->free(ex, idd);
    ex->op->free(ex, wd);
    ex->op->free(ex, od);
}

/* The dense twin of one row: the executor's matmul / silu_mul / matmul over
 * that row alone per routed expert, combined on the host in rank order. */
static void dense_twin(executor *ex, int prec, const experts *x, const float *xrow, const int32_t *ids,
                       const float *w, int32_t k, float *out)
{
    const int32_t H = x->H, I = x->I;
    void *xd = dev_upload(ex, EXEC_ACT, xrow, ST_F32, (size_t)H);
    void *gu = ex->op->alloc(ex, EXEC_ACT, (size_t)2 * I), *act = ex->op->alloc(ex, EXEC_ACT, (size_t)I),
         *yd = ex->op->alloc(ex, EXEC_ACT, (size_t)H);
    float *y = malloc((size_t)H * sizeof *y), *acc = calloc((size_t)H, sizeof *acc);
    assert_true(gu && act && yd && y && acc);
    for (int32_t r = 0; r < k; r++) {
        ok(ex, ex->op->matmul(ex, gu, xd, x->gu[ids[r]], 1, 2 * I, H), "twin gate_up");
        ok(ex, ex->op->silu_mul(ex, act, gu, 1, I), "twin silu_mul");
        ok(ex, ex->op->matmul(ex, yd, act, x->down[ids[r]], 1, H, I), "twin down");
        ok(ex, ex->op->download_f32(ex, y, yd, EXEC_ACT, (size_t)H), "twin download");
        for (int32_t h = 0; h < H; h++) {
            const float p = w[r] * y[h];
            acc[h] = r == 0 ? p : acc[h] + p;
        }
    }
    for (int32_t h = 0; h < H; h++)
        out[h] = act_round(prec, acc[h]);
    free(y), free(acc);
    ex->op->free(ex, xd), ex->op->free(ex, gu), ex->op->free(ex, act), ex->op->free(ex, yd);
}

/* Routing of T rows: shared = 1: every row the same k experts (one group
 * of T rows per expert), else random distinct experts; random weights. */
static void make_routing(pg_test_rng *rng, int32_t T, int32_t E, int32_t k, int shared, int32_t *ids, float *w)
{
    for (int32_t t = 0; t < T; t++)
        for (int32_t r = 0; r < k; r++) {
            int32_t e;
            int dup;
            do {
                e = shared ? (3 + 5 * r) % E : pg_test_rng_int(rng, 0, E - 1);
                dup = 0;
                for (int32_t q = 0; q < r; q++)
                    dup |= ids[t * k + q] == e;
            } while (dup && !shared);
            ids[t * k + r] = e;
            w[t * k + r] = pg_test_rng_uniform(rng, 0.05f, 1.0f);
        }
}

/* The rows checked against their twin and alone: all for small T, else a
 * sample that covers chunk edges (0, 127, 128, 255, 256, last). */
static int row_checked(int32_t t, int32_t T, int32_t stride)
{
    return T <= 8 || t == 0 || t == 127 || t == 128 || t == 255 || t == 256 || t == T - 1 || t % stride == 5;
}

static void experts_case(executor *ex, int prec, const experts *x, int32_t T, int32_t k, int shared,
                         int32_t stride, pg_test_rng *rng)
{
    const int32_t H = x->H;
    float *xin = malloc((size_t)T * H * sizeof *xin), *out = malloc((size_t)T * H * sizeof *out),
          *twin = malloc((size_t)H * sizeof *twin), *alone = malloc((size_t)H * sizeof *alone);
    int32_t *ids = malloc((size_t)T * k * sizeof *ids);
    float *w = malloc((size_t)T * k * sizeof *w);
    assert_true(xin && out && twin && alone && ids && w);
    pg_test_fill_uniform(rng, xin, (size_t)T * H, -1.0f, 1.0f);
    make_routing(rng, T, x->E, k, shared, ids, w);
    run_experts(ex, x, xin, ids, w, T, k, out);
    int32_t checked = 0;
    for (int32_t t = 0; t < T; t++) {
        if (!row_checked(t, T, stride))
            continue;
        checked++;
        dense_twin(ex, prec, x, xin + (size_t)t * H, ids + (size_t)t * k, w + (size_t)t * k, k, twin);
        run_experts(ex, x, xin + (size_t)t * H, ids + (size_t)t * k, w + (size_t)t * k, 1, k, alone);
        for (int32_t h = 0; h < H; h++) {
            const float o = out[(size_t)t * H + h];
            if (bits(o) != bits(twin[h]))
                fail_msg("precision %d T %d k %d shared %d: row %d col %d: batch %a, dense twin %a", prec, (int)T,
                         (int)k, shared, (int)t, (int)h, (double)o, (double)twin[h]);
            if (bits(o) != bits(alone[h]))
                fail_msg("precision %d T %d k %d shared %d: row %d col %d: batch %a, alone %a", prec, (int)T,
                         (int)k, shared, (int)t, (int)h, (double)o, (double)alone[h]);
        }
    }
    assert_true(checked > 0);
    free(xin), free(out), free(twin), free(alone), free(ids), free(w);
}

/* The CPU twin (cpu/cpu_moe.c) on the same f32 weights and inputs: equal
 * within 1e-5 relative (about 1 ulp measured on the emulator: the CPU's
 * GEMM and cuBLAS sum in different orders; the grouping and the rank-order
 * combine are the same). */
static void cpu_twin_case(executor *cu, const experts *x, uint64_t weight_seed, int32_t T, int32_t k)
{
    executor *cpu = make_cpu();
    pg_test_rng wr = {weight_seed}, rng = {weight_seed + 1000};
    experts xc;
    experts_init(&xc, cpu, x->H, x->I, x->E, &wr); /* the same draws: the same weights */
    const int32_t H = x->H;
    float *xin = malloc((size_t)T * H * sizeof *xin), *out = malloc((size_t)T * H * sizeof *out),
          *want = malloc((size_t)T * H * sizeof *want);
    int32_t *ids = malloc((size_t)T * k * sizeof *ids);
    float *w = malloc((size_t)T * k * sizeof *w);
    assert_true(xin && out && want && ids && w);
    pg_test_fill_uniform(&rng, xin, (size_t)T * H, -1.0f, 1.0f);
    make_routing(&rng, T, x->E, k, 0, ids, w);
    run_experts(cu, x, xin, ids, w, T, k, out);
    ok(cpu, cpu->op->moe_experts(cpu, want, xin, ids, w, xc.gu, xc.down, T, H, x->I, x->E, k), "cpu moe_experts");
    for (size_t i = 0; i < (size_t)T * H; i++)
        if (fabsf(out[i] - want[i]) > 1e-7f + 1e-5f * fabsf(want[i]))
            fail_msg("T %d k %d: element %zu: cuda %.9g, cpu %.9g", (int)T, (int)k, i, (double)out[i],
                     (double)want[i]);
    free(xin), free(out), free(want), free(ids), free(w);
    experts_free(&xc, cpu);
    cpu->op->destroy(cpu);
}

static void test_experts(void **state)
{
    (void)state;
    for (int prec = 0; prec <= 1; prec++) {
        executor *ex = make_cuda(prec);
        pg_test_rng rng = {57 + (uint64_t)prec};
        experts x;
        experts_init(&x, ex, 64, 32, 8, &rng);
        if (prec == 1)
            cpu_twin_case(ex, &x, 57 + (uint64_t)prec, 300, 3);
        experts_case(ex, prec, &x, 1, 2, 0, 1, &rng);
        experts_case(ex, prec, &x, 7, 3, 0, 1, &rng);
        experts_case(ex, prec, &x, 300, 2, 0, 97, &rng);
        experts_case(ex, prec, &x, 300, 2, 1, 97, &rng);
        /* an out-of-range id is refused by name */
        {
            const int32_t bad[2] = {1, 8};
            int32_t *idd = dev_upload(ex, EXEC_I32, bad, ST_I32, 2);
            float wv[2] = {0.5f, 0.5f};
            float *wd = dev_upload(ex, EXEC_F32, wv, ST_F32, 2);
            void *xd = ex->op->alloc(ex, EXEC_ACT, 64), *od = ex->op->alloc(ex, EXEC_ACT, 64);
            assert_int_equal(ex->op->moe_experts(ex, od, xd, idd, wd, x.gu, x.down, 1, 64, 32, 8, 2), PG_EINVAL);
            assert_non_null(strstr(ex->op->last_error(ex), "expert id 8 outside [0, 8)"));
            ex->op->free(ex, idd), ex->op->free(ex, wd), ex->op->free(ex, xd), ex->op->free(ex, od);
        }
        experts_free(&x, ex);
        ex->op->destroy(ex);
    }
}

#ifndef PG_CUDA_EMU
/* Qwen3-30B-A3B's expert shapes on a device (bf16): 300 rows, top 8 of 128,
 * rows 0..149 sharing the same 8 experts (groups of 150+ rows: two 128-row
 * chunks), the rest random. */
static void test_experts_qwen3_30b(void **state)
{
    (void)state;
    executor *ex = make_cuda(0);
    pg_test_rng rng = {3030};
    experts x;
    experts_init(&x, ex, 2048, 768, 128, &rng);
    const int32_t T = 300, k = 8, H = 2048;
    float *xin = malloc((size_t)T * H * sizeof *xin), *out = malloc((size_t)T * H * sizeof *out),
          *twin = malloc((size_t)H * sizeof *twin), *alone = malloc((size_t)H * sizeof *alone);
    int32_t *ids = malloc((size_t)T * k * sizeof *ids);
    float *w = malloc((size_t)T * k * sizeof *w);
    assert_true(xin && out && twin && alone && ids && w);
    pg_test_fill_uniform(&rng, xin, (size_t)T * H, -1.0f, 1.0f);
    make_routing(&rng, 150, 128, k, 1, ids, w);
    make_routing(&rng, T - 150, 128, k, 0, ids + 150 * k, w + 150 * k);
    run_experts(ex, &x, xin, ids, w, T, k, out);
    const int32_t rows[] = {0, 1, 77, 127, 128, 149, 150, 151, 200, 299};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const int32_t t = rows[i];
        dense_twin(ex, 0, &x, xin + (size_t)t * H, ids + (size_t)t * k, w + (size_t)t * k, k, twin);
        run_experts(ex, &x, xin + (size_t)t * H, ids + (size_t)t * k, w + (size_t)t * k, 1, k, alone);
        for (int32_t h = 0; h < H; h++) {
            const float o = out[(size_t)t * H + h];
            if (bits(o) != bits(twin[h]) || bits(o) != bits(alone[h]))
                fail_msg("Qwen3-30B-A3B shapes: row %d col %d: batch %a, dense twin %a, alone %a", (int)t, (int)h,
                         (double)o, (double)twin[h], (double)alone[h]);
        }
    }
    free(xin), free(out), free(twin), free(alone), free(ids), free(w);
    experts_free(&x, ex);
    ex->op->destroy(ex);
}
#endif

/* ---- shared expert ----------------------------------------------------------- */

static void test_shared_add(void **state)
{
    (void)state;
    executor *cpu = make_cpu();
    const int32_t T = 13, N = 40;
    pg_test_rng rng = {77};
    float out0[13 * 40], sh[13 * 40], g[13], want[13 * 40], got[13 * 40];
    for (int prec = 0; prec <= 1; prec++) {
        executor *cu = make_cuda(prec);
        pg_test_fill_uniform(&rng, out0, (size_t)T * N, -2.0f, 2.0f);
        pg_test_fill_uniform(&rng, sh, (size_t)T * N, -2.0f, 2.0f);
        pg_test_fill_uniform(&rng, g, (size_t)T, -6.0f, 6.0f);
        for (int32_t i = 0; i < T * N; i++)
            out0[i] = act_round(prec, out0[i]), sh[i] = act_round(prec, sh[i]);
        for (int32_t t = 0; t < T; t++)
            g[t] = act_round(prec, g[t]);
        void *od = dev_upload(cu, EXEC_ACT, out0, ST_F32, (size_t)T * N),
             *sd = dev_upload(cu, EXEC_ACT, sh, ST_F32, (size_t)T * N), *gd = dev_upload(cu, EXEC_ACT, g, ST_F32, T);
        ok(cu, cu->op->moe_shared_add(cu, od, sd, gd, T, N), "moe_shared_add");
        ok(cu, cu->op->download_f32(cu, got, od, EXEC_ACT, (size_t)T * N), "download");
        memcpy(want, out0, sizeof want);
        ok(cpu, cpu->op->moe_shared_add(cpu, want, sh, g, T, N), "cpu moe_shared_add");
        for (int32_t i = 0; i < T * N; i++)
            if (bits(got[i]) != bits(act_round(prec, want[i])))
                fail_msg("precision %d: element %d: cuda %a, cpu %a", prec, (int)i, (double)got[i],
                         (double)act_round(prec, want[i]));
        cu->op->free(cu, od), cu->op->free(cu, sd), cu->op->free(cu, gd);
        cu->op->destroy(cu);
    }
    cpu->op->destroy(cpu);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_shared_add),
        cmocka_unit_test(test_experts),
#ifndef PG_CUDA_EMU
        cmocka_unit_test(test_experts_qwen3_30b),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* PG_HAVE_CUDA */
