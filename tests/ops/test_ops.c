/* test_ops: the op conformance suite. Every case runs on every executor of
 * ops_executors.c (CPU always; CUDA when built and a device is present)
 * against a simple reference written here (naive loops, double
 * accumulation) on fresh random inputs with awkward shapes: one token,
 * block boundaries +- 1, block sizes 1..32, GQA ratios 1, 2, 4, head dims
 * 8..128, ragged batches mixing prefill chunks and decodes over random
 * non-contiguous block tables. Outputs are poisoned with NaN before an op
 * and guard elements after every buffer are checked (ops_support.c). Inputs
 * are read back after upload so the reference sees the device's rounding. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtype.h"
#include "ops_executors.h"
#include "ops_support.h"

typedef void (*ops_case_fn)(executor *ex, double tol, pg_test_rng *rng);

static void ops_run_all(const char *name, ops_case_fn fn, uint64_t seed)
{
    for (int32_t i = 0; i < ops_executor_count(); i++) {
        const ops_executor_entry *e = ops_executor_get(i);
        executor *ex = NULL;
        pg_error err = {{0}};
        int rc = e->create(&ex, &err);
        if (rc == PG_EUNSUPPORTED) {
            print_message("SKIP %s on %s: %s\n", name, e->name, err.msg);
            continue;
        }
        if (rc)
            fail_msg("%s: creating executor %s failed: %s", name, e->name, err.msg);
        pg_test_rng rng = {seed};
        fn(ex, ops_executor_tolerance(ex), &rng);
        ex->op->destroy(ex);
    }
}

static float *hbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static double *dbuf(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void ops_ok(executor *ex, int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s failed (%d): %s", ex->name, what, rc, ex->op->last_error(ex));
}

/* ---- upload / download --------------------------------------------------- */

static void case_upload(executor *ex, double tol, pg_test_rng *rng)
{
    const exec_buf_kind kinds[] = {EXEC_ACT, EXEC_WT, EXEC_KV, EXEC_F32};
    const size_t n = 1000, off = 37;
    float *src = hbuf(n), *got = hbuf(n + off);
    uint16_t *h16 = calloc(n, sizeof *h16), *b16 = calloc(n, sizeof *b16);
    assert_non_null(h16);
    assert_non_null(b16);
    pg_test_fill_uniform(rng, src, n, -70000.0f, 70000.0f);
    for (size_t i = 0; i < 10; i++)
        src[i] = ldexpf(src[i], -140); /* subnormal in f16 and tiny in bf16 */
    src[10] = 0.0f;
    src[11] = -0.0f;
    src[12] = 1.0f;
    for (size_t i = 0; i < n; i++) {
        h16[i] = pg_f32_to_f16(src[i]);
        b16[i] = pg_f32_to_bf16(src[i]);
    }
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        void *d = ops_dev_alloc(ex, kinds[k], n + off);
        size_t eb = exec_kind_bytes(ex, kinds[k]);
        const struct { st_dtype dt; const void *p; } srcs[] = {{ST_F32, src}, {ST_F16, h16}, {ST_BF16, b16}};
        for (size_t s = 0; s < 3; s++) {
            ops_dev_poison(ex, d, kinds[k], n + off);
            ops_ok(ex, ex->op->upload(ex, d, kinds[k], off, srcs[s].p, srcs[s].dt, n), "upload");
            char what[128];
            snprintf(what, sizeof what, "%s: upload kind %d from %s", ex->name, (int)kinds[k], st_dtype_name(srcs[s].dt));
            ops_dev_get(ex, got, d, kinds[k], n + off, what);
            for (size_t i = 0; i < off; i++)
                if (!isnan(got[i]))
                    fail_msg("%s: element %zu before the offset changed", what, i);
            for (size_t i = 0; i < n; i++) {
                float want = srcs[s].dt == ST_F32 ? src[i]
                             : srcs[s].dt == ST_F16 ? pg_f16_to_f32(h16[i]) : pg_bf16_to_f32(b16[i]);
                float g = got[off + i];
                if (eb == 4 || kinds[k] == EXEC_F32) {
                    if (memcmp(&g, &want, sizeof g) != 0 && !(isinf(g) && isinf(want) && g == want))
                        fail_msg("%s: element %zu: expected %a exactly, got %a", what, i, (double)want, (double)g);
                } else if (isfinite(want) && fabsf(want) < 60000.0f) {
                    /* a 16-bit device type: rounding of want */
                    if (fabs((double)g - (double)want) > 1e-2 * fabs((double)want) + 1e-30)
                        fail_msg("%s: element %zu: expected ~%g, got %g", what, i, (double)want, (double)g);
                }
            }
        }
        ex->op->free(ex, d);
    }
    (void)tol;
    free(src);
    free(got);
    free(h16);
    free(b16);
}

static void test_upload_download(void **state)
{
    (void)state;
    ops_run_all("upload_download", case_upload, 1);
}

/* ---- embed ---------------------------------------------------------------- */

static void case_embed(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t shapes[][3] = {{1, 1, 5}, {1, 17, 3}, {7, 64, 50}, {33, 288, 512}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t T = shapes[c][0], H = shapes[c][1], V = shapes[c][2];
        ops_seq_spec spec = {T + 3, T};
        ops_batch ob;
        ops_batch_build(&ob, &spec, 1, 16, V, rng);
        ob.token_ids[0] = V - 1;
        if (T > 1)
            ob.token_ids[1] = 0;
        float *table = hbuf((size_t)V * H), *x = hbuf((size_t)T * H);
        pg_test_fill_uniform(rng, table, (size_t)V * H, -2.0f, 2.0f);
        void *dt = ops_dev_alloc(ex, EXEC_WT, (size_t)V * H), *dx = ops_dev_alloc(ex, EXEC_ACT, (size_t)T * H);
        ops_dev_put_rt(ex, dt, EXEC_WT, table, (size_t)V * H);
        ops_dev_poison(ex, dx, EXEC_ACT, (size_t)T * H);
        ops_ok(ex, ex->op->begin_step(ex, &ob.b), "begin_step");
        ops_ok(ex, ex->op->embed(ex, dx, dt, H, V, &ob.b), "embed");
        char what[128];
        snprintf(what, sizeof what, "%s: embed T=%d H=%d V=%d", ex->name, (int)T, (int)H, (int)V);
        ops_dev_get(ex, x, dx, EXEC_ACT, (size_t)T * H, what);
        double *ref = dbuf((size_t)T * H);
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < H; i++)
                ref[(size_t)t * H + i] = table[(size_t)ob.token_ids[t] * H + i];
        ops_check_close(x, ref, (size_t)T * H, 0.0, what);
        ex->op->free(ex, dt);
        ex->op->free(ex, dx);
        free(table);
        free(x);
        free(ref);
        ops_batch_free(&ob);
    }
    (void)tol;
}

static void test_embed(void **state)
{
    (void)state;
    ops_run_all("embed", case_embed, 2);
}

/* ---- rmsnorm -------------------------------------------------------------- */

static void case_rmsnorm(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t shapes[][2] = {{1, 1}, {1, 7}, {3, 64}, {5, 288}, {2, 4096}, {17, 768}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        for (int with_res = 0; with_res < 2; with_res++) {
            const int32_t rows = shapes[c][0], dim = shapes[c][1];
            const size_t n = (size_t)rows * dim;
            const float eps = 1e-5f;
            float *x = hbuf(n), *res = hbuf(n), *w = hbuf((size_t)dim), *out = hbuf(n);
            /* dim 7 rows are tiny, so that eps dominates the mean square */
            const float amp = dim == 7 ? 3e-3f : 3.0f;
            pg_test_fill_uniform(rng, x, n, -amp, amp);
            pg_test_fill_uniform(rng, res, n, -amp, amp);
            pg_test_fill_uniform(rng, w, (size_t)dim, 0.5f, 1.5f);
            void *dx = ops_dev_alloc(ex, EXEC_ACT, n), *dr = ops_dev_alloc(ex, EXEC_ACT, n);
            void *dw = ops_dev_alloc(ex, EXEC_F32, (size_t)dim), *dout = ops_dev_alloc(ex, EXEC_ACT, n);
            ops_dev_put_rt(ex, dx, EXEC_ACT, x, n);
            ops_dev_put_rt(ex, dr, EXEC_ACT, res, n);
            ops_dev_put_rt(ex, dw, EXEC_F32, w, (size_t)dim);
            ops_dev_poison(ex, dout, EXEC_ACT, n);
            ops_ok(ex, ex->op->rmsnorm(ex, dout, with_res ? dr : NULL, dx, dw, rows, dim, eps), "rmsnorm");
            char what[128];
            snprintf(what, sizeof what, "%s: rmsnorm rows=%d dim=%d residual=%d", ex->name, (int)rows, (int)dim, with_res);
            ops_dev_get(ex, out, dout, EXEC_ACT, n, what);
            double *ref = dbuf(n), *ref_res = dbuf(n);
            for (int32_t r = 0; r < rows; r++) {
                double ss = 0.0;
                for (int32_t i = 0; i < dim; i++) {
                    size_t k = (size_t)r * dim + i;
                    /* the residual stream is stored in act precision before normalizing */
                    ref_res[k] = with_res ? (double)(res[k] + x[k]) : (double)x[k];
                    ss += ref_res[k] * ref_res[k];
                }
                double inv = 1.0 / sqrt(ss / dim + (double)eps);
                for (int32_t i = 0; i < dim; i++) {
                    size_t k = (size_t)r * dim + i;
                    ref[k] = ref_res[k] * inv * (double)w[i];
                }
            }
            ops_check_close(out, ref, n, tol, what);
            if (with_res) {
                float *got_res = hbuf(n);
                ops_dev_get(ex, got_res, dr, EXEC_ACT, n, "rmsnorm residual");
                strncat(what, " (residual stream)", sizeof what - strlen(what) - 1);
                ops_check_close(got_res, ref_res, n, tol, what);
                free(got_res);
            }
            ex->op->free(ex, dx);
            ex->op->free(ex, dr);
            ex->op->free(ex, dw);
            ex->op->free(ex, dout);
            free(x);
            free(res);
            free(w);
            free(out);
            free(ref);
            free(ref_res);
        }
    }
}

static void test_rmsnorm(void **state)
{
    (void)state;
    ops_run_all("rmsnorm", case_rmsnorm, 3);
}

/* ---- matmul and logits ---------------------------------------------------- */

static void case_matmul_one(executor *ex, double tol, pg_test_rng *rng, int32_t M, int32_t N, int32_t K,
                            int logits)
{
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = hbuf(nx), *w = hbuf(nw), *y = hbuf(ny);
    pg_test_fill_uniform(rng, x, nx, -1.0f, 1.0f);
    pg_test_fill_uniform(rng, w, nw, -1.0f, 1.0f);
    void *dx = ops_dev_alloc(ex, EXEC_ACT, nx), *dw = ops_dev_alloc(ex, EXEC_WT, nw);
    ops_dev_put_rt(ex, dx, EXEC_ACT, x, nx);
    ops_dev_put_rt(ex, dw, EXEC_WT, w, nw);
    char what[128];
    snprintf(what, sizeof what, "%s: %s M=%d N=%d K=%d", ex->name, logits ? "logits" : "matmul", (int)M, (int)N, (int)K);
    if (logits) {
        float *host = hbuf(ny + OPS_GUARD);
        for (size_t i = 0; i < ny; i++)
            host[i] = NAN;
        for (size_t i = ny; i < ny + OPS_GUARD; i++)
            host[i] = OPS_GUARD_VALUE;
        ops_ok(ex, ex->op->logits(ex, host, dx, dw, M, N, K), "logits");
        for (size_t i = ny; i < ny + OPS_GUARD; i++)
            if (host[i] != OPS_GUARD_VALUE)
                fail_msg("%s: host guard %zu overwritten", what, i - ny);
        memcpy(y, host, ny * sizeof *y);
        free(host);
    } else {
        void *dy = ops_dev_alloc(ex, EXEC_ACT, ny);
        ops_dev_poison(ex, dy, EXEC_ACT, ny);
        ops_ok(ex, ex->op->matmul(ex, dy, dx, dw, M, N, K), "matmul");
        ops_dev_get(ex, y, dy, EXEC_ACT, ny, what);
        ex->op->free(ex, dy);
    }
    double *ref = dbuf(ny);
    for (int32_t m = 0; m < M; m++)
        for (int32_t n = 0; n < N; n++) {
            double s = 0.0;
            for (int32_t k = 0; k < K; k++)
                s += (double)x[(size_t)m * K + k] * (double)w[(size_t)n * K + k];
            ref[(size_t)m * N + n] = s;
        }
    /* logits are f32 on every executor (accumulated and returned in f32) */
    ops_check_close(y, ref, ny, logits && ex->act_bytes < 4 ? tol : tol, what);
    ex->op->free(ex, dx);
    ex->op->free(ex, dw);
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void case_matmul(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t shapes[][3] = {
        {1, 1, 1},   {1, 5, 3},    {1, 7, 8},     {2, 13, 15},  {3, 64, 16},  {4, 6, 17},
        {5, 100, 31}, {7, 33, 64}, {17, 19, 100}, {64, 70, 33}, {1, 768, 768}, {65, 130, 288},
        {9, 49, 2048}, {128, 96, 40},
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        case_matmul_one(ex, tol, rng, shapes[c][0], shapes[c][1], shapes[c][2], 0);
}

static void case_logits(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t shapes[][3] = {{1, 1, 1}, {1, 37, 64}, {3, 512, 17}, {8, 1000, 288}, {2, 32000, 64}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        case_matmul_one(ex, tol, rng, shapes[c][0], shapes[c][1], shapes[c][2], 1);
}

static void test_matmul(void **state)
{
    (void)state;
    ops_run_all("matmul", case_matmul, 4);
}

static void test_logits(void **state)
{
    (void)state;
    ops_run_all("logits", case_logits, 5);
}

/* ---- rope ------------------------------------------------------------------ */

static void case_rope(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t heads[][3] = {{1, 1, 8}, {4, 2, 16}, {8, 2, 64}, {4, 1, 128}, {6, 6, 48}};
    for (size_t c = 0; c < sizeof heads / sizeof heads[0]; c++) {
        const int32_t nh = heads[c][0], nkv = heads[c][1], hd = heads[c][2], half = hd / 2;
        const ops_seq_spec specs[] = {{1, 1}, {40, 7}, {4100, 1}, {17, 17}};
        ops_batch ob;
        ops_batch_build(&ob, specs, 4, 16, 10, rng);
        const int32_t T = ob.b.num_tokens, width = (nh + 2 * nkv) * hd;
        const size_t n = (size_t)T * width;
        float *qkv = hbuf(n), *inv = hbuf((size_t)half), *out = hbuf(n);
        pg_test_fill_uniform(rng, qkv, n, -2.0f, 2.0f);
        for (int32_t i = 0; i < half; i++)
            inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hd);
        void *dq = ops_dev_alloc(ex, EXEC_ACT, n), *di = ops_dev_alloc(ex, EXEC_F32, (size_t)half);
        ops_dev_put_rt(ex, dq, EXEC_ACT, qkv, n);
        ops_dev_put_rt(ex, di, EXEC_F32, inv, (size_t)half);
        ops_ok(ex, ex->op->begin_step(ex, &ob.b), "begin_step");
        ops_ok(ex, ex->op->rope(ex, dq, di, nh, nkv, hd, &ob.b), "rope");
        char what[128];
        snprintf(what, sizeof what, "%s: rope nh=%d nkv=%d hd=%d T=%d", ex->name, (int)nh, (int)nkv, (int)hd, (int)T);
        ops_dev_get(ex, out, dq, EXEC_ACT, n, what);
        double *ref = dbuf(n);
        for (int32_t t = 0; t < T; t++) {
            for (int32_t col = 0; col < width; col++)
                ref[(size_t)t * width + col] = qkv[(size_t)t * width + col]; /* v heads untouched */
            for (int32_t h = 0; h < nh + nkv; h++) {
                const float *v = qkv + (size_t)t * width + (size_t)h * hd;
                double *r = ref + (size_t)t * width + (size_t)h * hd;
                for (int32_t i = 0; i < half; i++) {
                    double ang = (double)((float)ob.positions[t] * inv[i]); /* angle rounded to f32 */
                    double cs = cos(ang), sn = sin(ang);
                    r[i] = (double)v[i] * cs - (double)v[i + half] * sn;
                    r[i + half] = (double)v[i + half] * cs + (double)v[i] * sn;
                }
            }
        }
        ops_check_close(out, ref, n, tol * 4.0, what);
        ex->op->free(ex, dq);
        ex->op->free(ex, di);
        free(qkv);
        free(inv);
        free(out);
        free(ref);
        ops_batch_free(&ob);
    }
}

static void test_rope(void **state)
{
    (void)state;
    ops_run_all("rope", case_rope, 6);
}

/* ---- kv_write -------------------------------------------------------------- */

static void case_kv_write(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t cfg[][4] = {{1, 1, 8, 1}, {4, 2, 16, 8}, {8, 2, 64, 16}, {4, 1, 128, 32}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int32_t nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = cfg[c][3];
        const ops_seq_spec specs[] = {{15, 15}, {17, 2}, {16, 1}, {1, 1}};
        ops_batch ob;
        ops_batch_build(&ob, specs, 4, bs, 10, rng);
        const int32_t T = ob.b.num_tokens, width = (nh + 2 * nkv) * hd, kvw = nkv * hd;
        const size_t nq = (size_t)T * width, nc = (size_t)ob.num_blocks * bs * kvw;
        float *qkv = hbuf(nq), *kc = hbuf(nc), *vc = hbuf(nc), *got = hbuf(nc);
        pg_test_fill_uniform(rng, qkv, nq, -2.0f, 2.0f);
        pg_test_fill_uniform(rng, kc, nc, -2.0f, 2.0f);
        pg_test_fill_uniform(rng, vc, nc, -2.0f, 2.0f);
        void *dq = ops_dev_alloc(ex, EXEC_ACT, nq), *dk = ops_dev_alloc(ex, EXEC_KV, nc), *dv = ops_dev_alloc(ex, EXEC_KV, nc);
        ops_dev_put_rt(ex, dq, EXEC_ACT, qkv, nq);
        ops_dev_put_rt(ex, dk, EXEC_KV, kc, nc);
        ops_dev_put_rt(ex, dv, EXEC_KV, vc, nc);
        ops_ok(ex, ex->op->begin_step(ex, &ob.b), "begin_step");
        ops_ok(ex, ex->op->kv_write(ex, dk, dv, dq, nh, nkv, hd, &ob.b), "kv_write");
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < kvw; i++) {
                kc[(size_t)ob.slots[t] * kvw + i] = qkv[(size_t)t * width + (size_t)nh * hd + i];
                vc[(size_t)ob.slots[t] * kvw + i] = qkv[(size_t)t * width + (size_t)(nh + nkv) * hd + i];
            }
        char what[128];
        for (int plane = 0; plane < 2; plane++) {
            snprintf(what, sizeof what, "%s: kv_write %s nkv=%d hd=%d bs=%d", ex->name, plane ? "v" : "k",
                     (int)nkv, (int)hd, (int)bs);
            ops_dev_get(ex, got, plane ? dv : dk, EXEC_KV, nc, what);
            const float *want = plane ? vc : kc;
            for (size_t i = 0; i < nc; i++)
                if (fabs((double)got[i] - (double)want[i]) > tol * 2.0 * fabs((double)want[i]))
                    fail_msg("%s: element %zu (slot %zu): expected %g, got %g", what, i, i / (size_t)kvw,
                             (double)want[i], (double)got[i]);
        }
        ex->op->free(ex, dq);
        ex->op->free(ex, dk);
        ex->op->free(ex, dv);
        free(qkv);
        free(kc);
        free(vc);
        free(got);
        ops_batch_free(&ob);
    }
}

static void test_kv_write(void **state)
{
    (void)state;
    ops_run_all("kv_write", case_kv_write, 7);
}

/* ---- attention ------------------------------------------------------------- */

typedef struct attn_case {
    int32_t nh, nkv, hd, bs;
    int32_t S;
    ops_seq_spec seqs[6];
    int32_t window; /* step_batch.sliding_window: 0 = full causal */
} attn_case;

/* Sets to -1 the entries of sequence s's table wholly below the lowest key
 * its first query reads; returns the index of the block holding that key. */
static int32_t attn_null_behind(ops_batch *ob, int32_t s, int32_t window)
{
    const int32_t bs = ob->b.block_size, p0 = ob->positions[ob->query_start[s]];
    const int32_t lo = p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    int32_t *table = ob->block_tables + (size_t)s * ob->b.block_table_stride;
    for (int32_t k = 0; (k + 1) * bs <= lo; k++)
        table[k] = -1;
    return lo / bs;
}

/* null_behind: null (-1) the table entries wholly behind every sequence's
 * window (blocks the engine dropped), then check that a null entry inside
 * the window is refused. */
static void case_attention_one(executor *ex, double tol, pg_test_rng *rng, const attn_case *ac,
                               int null_behind)
{
    const int32_t nh = ac->nh, nkv = ac->nkv, hd = ac->hd, bs = ac->bs, G = nh / nkv;
    ops_batch ob;
    ops_batch_build(&ob, ac->seqs, ac->S, bs, 10, rng);
    ob.b.sliding_window = ac->window;
    int32_t n_null = 0;
    if (null_behind)
        for (int32_t s = 0; s < ac->S; s++)
            n_null += attn_null_behind(&ob, s, ac->window);
    if (null_behind)
        assert_true(n_null > 0); /* the case drops something */
    const int32_t T = ob.b.num_tokens, width = (nh + 2 * nkv) * hd, kvw = nkv * hd;
    const size_t nq = (size_t)T * width, nc = (size_t)ob.num_blocks * bs * kvw, no = (size_t)T * nh * hd;
    float *qkv = hbuf(nq), *kc = hbuf(nc), *vc = hbuf(nc), *out = hbuf(no);
    pg_test_fill_uniform(rng, qkv, nq, -1.0f, 1.0f);
    pg_test_fill_uniform(rng, kc, nc, -1.0f, 1.0f);
    pg_test_fill_uniform(rng, vc, nc, -1.0f, 1.0f);
    void *dq = ops_dev_alloc(ex, EXEC_ACT, nq), *dk = ops_dev_alloc(ex, EXEC_KV, nc), *dv = ops_dev_alloc(ex, EXEC_KV, nc);
    void *dout = ops_dev_alloc(ex, EXEC_ACT, no);
    ops_dev_put_rt(ex, dq, EXEC_ACT, qkv, nq);
    ops_dev_put_rt(ex, dk, EXEC_KV, kc, nc);
    ops_dev_put_rt(ex, dv, EXEC_KV, vc, nc);
    ops_dev_poison(ex, dout, EXEC_ACT, no);
    const float scale = 1.0f / sqrtf((float)hd);
    ops_ok(ex, ex->op->begin_step(ex, &ob.b), "begin_step");
    ops_ok(ex, ex->op->attention(ex, dout, dq, dk, dv, nh, nkv, hd, scale, &ob.b), "attention");
    char what[160];
    snprintf(what, sizeof what, "%s: attention nh=%d nkv=%d hd=%d bs=%d S=%d T=%d window=%d", ex->name, (int)nh,
             (int)nkv, (int)hd, (int)bs, (int)ac->S, (int)T, (int)ac->window);
    ops_dev_get(ex, out, dout, EXEC_ACT, no, what);

    double *ref = dbuf(no), *sc = dbuf((size_t)ob.b.max_seq_len);
    for (int32_t s = 0; s < ac->S; s++) {
        const int32_t *table = ob.block_tables + (size_t)s * ob.b.block_table_stride;
        for (int32_t t = ob.query_start[s]; t < ob.query_start[s + 1]; t++) {
            const int32_t p = ob.positions[t];
            /* transformers' sliding window: keys j with p - W < j <= p */
            const int32_t lo = ac->window > 0 && p - ac->window + 1 > 0 ? p - ac->window + 1 : 0;
            for (int32_t h = 0; h < nh; h++) {
                const int32_t g = h / G;
                const float *q = qkv + (size_t)t * width + (size_t)h * hd;
                double mx = -INFINITY, z = 0.0;
                for (int32_t j = lo; j <= p; j++) {
                    size_t slot = (size_t)table[j / bs] * bs + (size_t)(j % bs);
                    const float *k = kc + slot * kvw + (size_t)g * hd;
                    double d = 0.0;
                    for (int32_t i = 0; i < hd; i++)
                        d += (double)q[i] * (double)k[i];
                    sc[j] = d * (double)scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int32_t j = lo; j <= p; j++) {
                    sc[j] = exp(sc[j] - mx);
                    z += sc[j];
                }
                double *r = ref + (size_t)t * nh * hd + (size_t)h * hd;
                for (int32_t i = 0; i < hd; i++)
                    r[i] = 0.0;
                for (int32_t j = lo; j <= p; j++) {
                    size_t slot = (size_t)table[j / bs] * bs + (size_t)(j % bs);
                    const float *v = vc + slot * kvw + (size_t)g * hd;
                    for (int32_t i = 0; i < hd; i++)
                        r[i] += sc[j] / z * (double)v[i];
                }
            }
        }
    }
    ops_check_close(out, ref, no, tol * 4.0, what);
    if (null_behind) {
        /* a null entry where a query reads is a corrupt table: refused (by
         * begin_step on CUDA, by the attention's checks on the CPU), never
         * read as garbage */
        int32_t k = attn_null_behind(&ob, ac->S - 1, ac->window);
        ob.block_tables[(size_t)(ac->S - 1) * ob.b.block_table_stride + (size_t)k] = -1;
        int rc = ex->op->begin_step(ex, &ob.b);
        if (rc == 0)
            rc = ex->op->attention(ex, dout, dq, dk, dv, nh, nkv, hd, scale, &ob.b);
        if (rc != PG_EINVAL)
            fail_msg("%s: a null block table entry inside the window: expected PG_EINVAL, got %d", what, rc);
    }
    ex->op->free(ex, dq);
    ex->op->free(ex, dk);
    ex->op->free(ex, dv);
    ex->op->free(ex, dout);
    free(qkv);
    free(kc);
    free(vc);
    free(out);
    free(ref);
    free(sc);
    ops_batch_free(&ob);
}

static void case_attention(executor *ex, double tol, pg_test_rng *rng)
{
    const attn_case cases[] = {
        /* one decode token, one block */
        {1, 1, 8, 16, 1, {{1, 1}}, 0},
        /* block boundary +- 1, decodes */
        {2, 2, 16, 16, 3, {{15, 1}, {16, 1}, {17, 1}}, 0},
        /* GQA 2 and 4, prefill chunks mixed with decodes */
        {4, 2, 64, 16, 4, {{15, 15}, {40, 1}, {33, 9}, {17, 1}}, 0},
        {8, 2, 64, 8, 3, {{17, 5}, {9, 1}, {64, 64}}, 0},
        {4, 1, 128, 32, 3, {{31, 1}, {33, 33}, {65, 2}}, 0},
        /* block size 1: every position in its own block */
        {2, 1, 16, 1, 3, {{1, 1}, {7, 3}, {20, 1}}, 0},
        {6, 3, 8, 8, 5, {{1, 1}, {8, 8}, {9, 1}, {16, 2}, {23, 23}}, 0},
        /* a long context */
        {4, 4, 32, 16, 2, {{600, 1}, {300, 40}}, 0},
        /* sliding windows: smaller than the context (1, one block, across
         * block boundaries), equal to it, larger; GQA, prefill, chunked
         * prefill and decode */
        {2, 2, 16, 16, 4, {{15, 1}, {16, 16}, {17, 1}, {40, 9}}, 1},
        {4, 2, 64, 16, 4, {{15, 15}, {40, 1}, {33, 9}, {17, 1}}, 16},
        {8, 2, 64, 8, 3, {{17, 5}, {9, 1}, {64, 64}}, 7},
        {4, 1, 128, 32, 3, {{31, 1}, {33, 33}, {65, 2}}, 33},
        {6, 3, 8, 8, 5, {{1, 1}, {8, 8}, {9, 1}, {16, 2}, {23, 23}}, 8},
        {2, 1, 16, 1, 3, {{1, 1}, {7, 3}, {20, 1}}, 5},
        {4, 4, 32, 16, 3, {{600, 1}, {300, 40}, {50, 50}}, 550},
        {4, 2, 32, 16, 3, {{600, 1}, {300, 40}, {50, 50}}, 700},
        {4, 2, 32, 16, 3, {{600, 1}, {300, 40}, {50, 50}}, 100},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        case_attention_one(ex, tol, rng, &cases[c], 0);
    /* blocks dropped behind the window (null entries): decode, chunked
     * prefill starting past the window, block size 1, window < block */
    const attn_case null_cases[] = {
        {4, 2, 64, 16, 4, {{40, 1}, {70, 9}, {33, 1}, {100, 30}}, 16},
        {8, 2, 64, 8, 3, {{17, 1}, {30, 5}, {64, 20}}, 7},
        {2, 1, 16, 1, 3, {{7, 1}, {20, 3}, {20, 1}}, 5},
        {4, 4, 32, 16, 2, {{600, 1}, {300, 40}}, 100},
        {2, 2, 16, 16, 2, {{40, 1}, {50, 2}}, 3},
    };
    for (size_t c = 0; c < sizeof null_cases / sizeof null_cases[0]; c++)
        case_attention_one(ex, tol, rng, &null_cases[c], 1);
}

static void test_attention(void **state)
{
    (void)state;
    ops_run_all("attention", case_attention, 8);
}

/* ---- add_bias (Qwen2's q|k|v biases) --------------------------------------- */

static void case_add_bias(executor *ex, double tol, pg_test_rng *rng)
{
    /* {7, 1152}: Qwen2.5-0.5B's QKV (896 + 2 * 128) over a short chunk;
     * {40, 3001}: rows split over the pool, an odd width */
    const int32_t shapes[][2] = {{1, 1}, {1, 17}, {3, 64}, {7, 1152}, {40, 3001}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t rows = shapes[c][0], N = shapes[c][1];
        const size_t n = (size_t)rows * N;
        float *y = hbuf(n), *bias = hbuf((size_t)N), *out = hbuf(n);
        pg_test_fill_uniform(rng, y, n, -4.0f, 4.0f);
        pg_test_fill_uniform(rng, bias, (size_t)N, -2.0f, 2.0f);
        void *dy = ops_dev_alloc(ex, EXEC_ACT, n), *db = ops_dev_alloc(ex, EXEC_F32, (size_t)N);
        ops_dev_put_rt(ex, dy, EXEC_ACT, y, n);
        ops_dev_put_rt(ex, db, EXEC_F32, bias, (size_t)N);
        ops_ok(ex, ex->op->add_bias(ex, dy, db, rows, N), "add_bias");
        char what[128];
        snprintf(what, sizeof what, "%s: add_bias rows=%d N=%d", ex->name, (int)rows, (int)N);
        ops_dev_get(ex, out, dy, EXEC_ACT, n, what);
        double *ref = dbuf(n);
        for (size_t k = 0; k < n; k++)
            ref[k] = (double)y[k] + (double)bias[k % (size_t)N];
        ops_check_close(out, ref, n, tol, what);
        /* rows = 0 changes nothing */
        ops_ok(ex, ex->op->add_bias(ex, dy, db, 0, N), "add_bias rows=0");
        float *again = hbuf(n);
        ops_dev_get(ex, again, dy, EXEC_ACT, n, what);
        assert_memory_equal(again, out, n * sizeof(float));
        ex->op->free(ex, dy);
        ex->op->free(ex, db);
        free(y);
        free(bias);
        free(out);
        free(again);
        free(ref);
    }
}

static void test_add_bias(void **state)
{
    (void)state;
    ops_run_all("add_bias", case_add_bias, 21);
}

/* ---- qk_norm (Qwen3's per-head q/k RMSNorm) ---------------------------------- */

static void case_qk_norm(executor *ex, double tol, pg_test_rng *rng)
{
    /* {T, nh, nkv, hd}: one token; GQA 1, 2, 4; head dims 8..256 (Qwen3
     * uses 128); a chunk long enough to split over the pool */
    const int32_t shapes[][4] = {{1, 1, 1, 8}, {1, 4, 2, 16}, {3, 8, 2, 64}, {5, 16, 8, 128},
                                 {2, 4, 1, 256}, {37, 16, 4, 128}, {2, 3, 3, 6}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t T = shapes[c][0], nh = shapes[c][1], nkv = shapes[c][2], hd = shapes[c][3];
        const int32_t row = (nh + 2 * nkv) * hd;
        const size_t n = (size_t)T * (size_t)row;
        const float eps = 1e-6f;
        float *qkv = hbuf(n), *qw = hbuf((size_t)hd), *kw = hbuf((size_t)hd), *out = hbuf(n);
        pg_test_fill_uniform(rng, qkv, n, -3.0f, 3.0f);
        /* one tiny head, so that eps matters */
        for (int32_t i = 0; i < hd; i++)
            qkv[i] *= 1e-4f;
        pg_test_fill_uniform(rng, qw, (size_t)hd, 0.5f, 1.5f);
        pg_test_fill_uniform(rng, kw, (size_t)hd, -1.5f, 1.5f);
        void *dq = ops_dev_alloc(ex, EXEC_ACT, n);
        void *dqw = ops_dev_alloc(ex, EXEC_F32, (size_t)hd), *dkw = ops_dev_alloc(ex, EXEC_F32, (size_t)hd);
        ops_dev_put_rt(ex, dq, EXEC_ACT, qkv, n);
        ops_dev_put_rt(ex, dqw, EXEC_F32, qw, (size_t)hd);
        ops_dev_put_rt(ex, dkw, EXEC_F32, kw, (size_t)hd);
        ops_ok(ex, ex->op->qk_norm(ex, dq, dqw, dkw, T, nh, nkv, hd, eps), "qk_norm");
        char what[128];
        snprintf(what, sizeof what, "%s: qk_norm T=%d nh=%d nkv=%d hd=%d", ex->name, (int)T, (int)nh, (int)nkv,
                 (int)hd);
        ops_dev_get(ex, out, dq, EXEC_ACT, n, what);
        double *ref = dbuf(n);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < nh + 2 * nkv; h++) {
                const size_t base = (size_t)t * (size_t)row + (size_t)h * (size_t)hd;
                double ss = 0.0;
                for (int32_t i = 0; i < hd; i++)
                    ss += (double)qkv[base + i] * (double)qkv[base + i];
                const double inv = 1.0 / sqrt(ss / hd + (double)eps);
                for (int32_t i = 0; i < hd; i++) /* v heads (h >= nh + nkv) unchanged */
                    ref[base + i] = h >= nh + nkv ? (double)qkv[base + i]
                                                  : (double)qkv[base + i] * inv * (double)(h < nh ? qw[i] : kw[i]);
            }
        ops_check_close(out, ref, n, tol, what);
        ex->op->free(ex, dq);
        ex->op->free(ex, dqw);
        ex->op->free(ex, dkw);
        free(qkv);
        free(qw);
        free(kw);
        free(out);
        free(ref);
    }
}

static void test_qk_norm(void **state)
{
    (void)state;
    ops_run_all("qk_norm", case_qk_norm, 22);
}

/* ---- silu_mul ---------------------------------------------------------------- */

static void case_silu_mul(executor *ex, double tol, pg_test_rng *rng)
{
    /* {1, 2048}, {1, 3001}: one row split across the pool; {9, 1000}: splits inside a row */
    const int32_t shapes[][2] = {{1, 1}, {1, 17}, {3, 256}, {9, 1000}, {1, 2048}, {1, 3001}, {64, 2048}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t T = shapes[c][0], I = shapes[c][1];
        const size_t n_in = (size_t)T * 2 * I, n = (size_t)T * I;
        float *gu = hbuf(n_in), *out = hbuf(n);
        pg_test_fill_uniform(rng, gu, n_in, -8.0f, 8.0f);
        if (I > 2) {
            gu[0] = -100.0f; /* exp overflow side */
            gu[1] = 100.0f;
        }
        void *dg = ops_dev_alloc(ex, EXEC_ACT, n_in), *dout = ops_dev_alloc(ex, EXEC_ACT, n);
        ops_dev_put_rt(ex, dg, EXEC_ACT, gu, n_in);
        ops_dev_poison(ex, dout, EXEC_ACT, n);
        ops_ok(ex, ex->op->silu_mul(ex, dout, dg, T, I), "silu_mul");
        char what[128];
        snprintf(what, sizeof what, "%s: silu_mul T=%d I=%d", ex->name, (int)T, (int)I);
        ops_dev_get(ex, out, dout, EXEC_ACT, n, what);
        double *ref = dbuf(n);
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < I; i++) {
                double g = gu[(size_t)t * 2 * I + i], u = gu[(size_t)t * 2 * I + I + i];
                ref[(size_t)t * I + i] = g / (1.0 + exp(-g)) * u;
            }
        ops_check_close(out, ref, n, tol, what);
        ex->op->free(ex, dg);
        ex->op->free(ex, dout);
        free(gu);
        free(out);
        free(ref);
    }
}

static void test_silu_mul(void **state)
{
    (void)state;
    ops_run_all("silu_mul", case_silu_mul, 9);
}

/* ---- gather_rows --------------------------------------------------------------- */

static void case_gather_rows(executor *ex, double tol, pg_test_rng *rng)
{
    const ops_seq_spec specs[] = {{5, 5}, {9, 1}, {20, 3}, {1, 1}};
    const int32_t dims[] = {1, 7, 64, 288};
    for (size_t c = 0; c < sizeof dims / sizeof dims[0]; c++) {
        const int32_t dim = dims[c];
        ops_batch ob;
        ops_batch_build(&ob, specs, 4, 16, 10, rng);
        /* only some sequences sample this step */
        ob.logits_rows[0] = ob.query_start[1] - 1;
        ob.logits_rows[1] = ob.query_start[3] - 1;
        ob.logits_rows[2] = ob.query_start[4] - 1;
        ob.b.num_logits = 3;
        const int32_t T = ob.b.num_tokens, L = ob.b.num_logits;
        float *src = hbuf((size_t)T * dim), *dst = hbuf((size_t)L * dim);
        pg_test_fill_uniform(rng, src, (size_t)T * dim, -5.0f, 5.0f);
        void *ds = ops_dev_alloc(ex, EXEC_ACT, (size_t)T * dim), *dd = ops_dev_alloc(ex, EXEC_ACT, (size_t)L * dim);
        ops_dev_put_rt(ex, ds, EXEC_ACT, src, (size_t)T * dim);
        ops_dev_poison(ex, dd, EXEC_ACT, (size_t)L * dim);
        ops_ok(ex, ex->op->begin_step(ex, &ob.b), "begin_step");
        ops_ok(ex, ex->op->gather_rows(ex, dd, ds, dim, &ob.b), "gather_rows");
        char what[128];
        snprintf(what, sizeof what, "%s: gather_rows dim=%d", ex->name, (int)dim);
        ops_dev_get(ex, dst, dd, EXEC_ACT, (size_t)L * dim, what);
        double *ref = dbuf((size_t)L * dim);
        for (int32_t r = 0; r < L; r++)
            for (int32_t i = 0; i < dim; i++)
                ref[(size_t)r * dim + i] = src[(size_t)ob.logits_rows[r] * dim + i];
        ops_check_close(dst, ref, (size_t)L * dim, 0.0, what);
        ex->op->free(ex, ds);
        ex->op->free(ex, dd);
        free(src);
        free(dst);
        free(ref);
        ops_batch_free(&ob);
    }
    (void)tol;
}

static void test_gather_rows(void **state)
{
    (void)state;
    ops_run_all("gather_rows", case_gather_rows, 10);
}

/* ---- copy_blocks ----------------------------------------------------------------- */

static void case_copy_blocks(executor *ex, double tol, pg_test_rng *rng)
{
    const int32_t cfg[][4] = {{2, 1, 8, 10}, {6, 16, 64, 9}, {4, 8, 32, 33}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int32_t n_planes = cfg[c][0], bs = cfg[c][1], kvw = cfg[c][2], num_blocks = cfg[c][3];
        const size_t block_elems = (size_t)bs * kvw, plane_elems = block_elems * num_blocks;
        const size_t n = plane_elems * n_planes;
        float *kv = hbuf(n), *got = hbuf(n);
        pg_test_fill_uniform(rng, kv, n, -3.0f, 3.0f);
        void *d = ops_dev_alloc(ex, EXEC_KV, n);
        ops_dev_put_rt(ex, d, EXEC_KV, kv, n);
        /* distinct destinations, sources never a destination */
        int32_t pairs[8];
        const int32_t n_pairs = num_blocks >= 8 ? 4 : 1;
        int32_t perm[64];
        for (int32_t i = 0; i < num_blocks; i++)
            perm[i] = i;
        for (int32_t i = num_blocks - 1; i > 0; i--) {
            int32_t j = pg_test_rng_int(rng, 0, i), tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        for (int32_t k = 0; k < n_pairs; k++) {
            pairs[2 * k] = perm[2 * k];
            pairs[2 * k + 1] = perm[2 * k + 1];
        }
        ops_ok(ex, ex->op->copy_blocks(ex, d, n_planes, plane_elems, block_elems, pairs, n_pairs), "copy_blocks");
        for (int32_t p = 0; p < n_planes; p++)
            for (int32_t k = 0; k < n_pairs; k++)
                memcpy(kv + (size_t)p * plane_elems + (size_t)pairs[2 * k + 1] * block_elems,
                       kv + (size_t)p * plane_elems + (size_t)pairs[2 * k] * block_elems, block_elems * sizeof(float));
        char what[128];
        snprintf(what, sizeof what, "%s: copy_blocks planes=%d bs=%d pairs=%d", ex->name, (int)n_planes, (int)bs, (int)n_pairs);
        ops_dev_get(ex, got, d, EXEC_KV, n, what);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &kv[i], sizeof(float)) != 0)
                fail_msg("%s: element %zu (plane %zu, block %zu): expected %g, got %g", what, i, i / plane_elems,
                         (i % plane_elems) / block_elems, (double)kv[i], (double)got[i]);
        ex->op->free(ex, d);
        free(kv);
        free(got);
    }
    (void)tol;
}

static void test_copy_blocks(void **state)
{
    (void)state;
    ops_run_all("copy_blocks", case_copy_blocks, 11);
}

/* ---- mem_info ------------------------------------------------------------------- */

static void case_mem_info(executor *ex, double tol, pg_test_rng *rng)
{
    size_t free_b = 0, total_b = 0;
    ops_ok(ex, ex->op->mem_info(ex, &free_b, &total_b), "mem_info");
    assert_true(total_b > 0);
    assert_true(free_b <= total_b);
    (void)tol;
    (void)rng;
}

static void test_mem_info(void **state)
{
    (void)state;
    ops_run_all("mem_info", case_mem_info, 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_download),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_add_bias),
        cmocka_unit_test(test_qk_norm),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_copy_blocks),
        cmocka_unit_test(test_mem_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
