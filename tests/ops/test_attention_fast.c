/* test_attention_fast: the CPU executor's fast paged attention
 * (cpu_attention.c cpu_op_attention) against its simple twin
 * (cpu_op_attention_ref) and against its canonical order spelled out here,
 * and cpu_math.h's exp against libm's expf.
 *
 *  - cm_hsum16 gives the bits of sixteen cm_hsum (the fixed tree).
 *  - exp: every lane of cm_exp within 1 ulp of expf for normal results and
 *    within one subnormal step below, on a dense sweep of [-104, 89] and the
 *    special values (-inf -> 0, large negative -> 0, overflow -> inf, NaN).
 *  - fast vs reference on fresh random inputs over awkward shapes: context
 *    lengths 1, 15, 16, 17, 255, 1000; block sizes 1, 16, 32; GQA 1, 2, 4;
 *    hd 2, 8, 16, 24, 64, 128; ragged batches mixing prefill chunks and
 *    decodes over random non-contiguous block tables; scores large enough
 *    that exp underflows. Outputs are poisoned with NaN, guard elements
 *    after every buffer are checked.
 *  - the fast path equals the canonical order (cpu_attention.c header)
 *    written out in scalar C here, bit for bit: a change of its reduction
 *    order fails here, not only in test_isa_identity's digest.
 *  - bit-identical across thread counts 1, 2, 3 and 7 (which changes how
 *    items are split into chunks and kv-head ranges) and for every
 *    sequence alone vs inside the ragged batch.
 *  - the prefill tiles (several query rows of one sequence per work item):
 *    prompts of up to 600 tokens, several in one step, chunked prefill,
 *    windows, tiles shortened for a long context with many heads, all
 *    against the canonical order as above; and a prompt prefilled at once
 *    equals the same prompt one token per step and in random chunks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cpu_math.h"
#include "cpu_ops.h"
#include "ops_support.h"

/* cm_v16f values only pass between inline helpers of this file */
#pragma GCC diagnostic ignored "-Wpsabi"

/* ---- exp ------------------------------------------------------------------ */

static int64_t ulp_distance(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    /* map the sign-magnitude order onto the integers */
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

static void check_exp16(const float *x, int64_t *max_ulp, float *worst_x)
{
    const cm_v16f y = cm_exp(cm_load(x));
    for (int i = 0; i < CM_LANES; i++) {
        const float want = expf(x[i]), got = y[i];
        if (memcmp(&got, &(float){cm_expf(x[i])}, sizeof got) != 0)
            fail_msg("cm_exp(%a): lane %d gives %a, cm_expf %a", (double)x[i], i, (double)got, (double)cm_expf(x[i]));
        if (isnan(want)) {
            if (!isnan(got))
                fail_msg("cm_exp(%a) = %a, expected NaN", (double)x[i], (double)got);
            continue;
        }
        if (want < 0x1p-126f) { /* subnormal or zero result: one step of 2^-149 */
            if (fabsf(got - want) > 0x1p-149f || got < 0.0f)
                fail_msg("cm_exp(%a) = %a, expf %a: more than one subnormal step apart", (double)x[i], (double)got,
                         (double)want);
            continue;
        }
        const int64_t u = ulp_distance(got, want);
        if (u > *max_ulp) {
            *max_ulp = u;
            *worst_x = x[i];
        }
    }
}

static void test_exp_accuracy(void **state)
{
    (void)state;
    int64_t max_ulp = 0;
    float worst = 0.0f, x[CM_LANES];
    long n = 0;
    /* every 97th float of [-104.5, 89] (by bit pattern: dense near 0) */
    for (uint32_t sign = 0; sign < 2; sign++) {
        const float lim = sign ? 104.5f : 89.0f;
        uint32_t end;
        memcpy(&end, &lim, sizeof end);
        int k = 0;
        for (uint32_t u = 0; u <= end; u += 97) {
            const uint32_t bits = u | (sign << 31);
            memcpy(&x[k], &bits, sizeof bits);
            if (++k == CM_LANES) {
                check_exp16(x, &max_ulp, &worst);
                n += k;
                k = 0;
            }
        }
    }
    /* the softmax range [-30, 0] on a regular grid */
    for (int i = 0; i < 1 << 20; i += CM_LANES) {
        for (int l = 0; l < CM_LANES; l++)
            x[l] = -30.0f * (float)(i + l) / (float)(1 << 20);
        check_exp16(x, &max_ulp, &worst);
        n += CM_LANES;
    }
    print_message("cm_exp: %ld values, max %lld ulp from expf (at %a)\n", n, (long long)max_ulp, (double)worst);
    if (max_ulp > 1)
        fail_msg("cm_exp: %lld ulp from expf at %a, expected <= 1", (long long)max_ulp, (double)worst);

    /* special values */
    const struct { float x, want; } sp[] = {
        {0.0f, 1.0f}, {-0.0f, 1.0f}, {-INFINITY, 0.0f}, {INFINITY, INFINITY}, {-1000.0f, 0.0f},
        {-104.0f, 0.0f}, {-110.0f, 0.0f}, {89.0f, INFINITY}, {88.8f, INFINITY}, {1000.0f, INFINITY},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        const float got = cm_expf(sp[i].x);
        if (memcmp(&got, &sp[i].want, sizeof got) != 0)
            fail_msg("cm_exp(%a) = %a, expected %a", (double)sp[i].x, (double)got, (double)sp[i].want);
    }
    assert_true(isnan(cm_expf(NAN)));
    assert_true(cm_expf(88.72f) < INFINITY && cm_expf(88.72f) > 3.0e38f);
    assert_true(cm_expf(-103.0f) > 0.0f); /* a subnormal, not flushed */
}

/* cm_hsum16 is sixteen cm_hsum, bit for bit, on sums that depend on the
 * order (a wide exponent range, signed zeros, cancellation). */
static void test_hsum16(void **state)
{
    (void)state;
    pg_test_rng rng = {11};
    for (int it = 0; it < 2000; it++) {
        cm_v16f a[CM_LANES];
        for (int i = 0; i < CM_LANES; i++)
            for (int l = 0; l < CM_LANES; l++) {
                const int kind = pg_test_rng_int(&rng, 0, 9);
                float v = ldexpf(pg_test_rng_uniform(&rng, -1.0f, 1.0f), pg_test_rng_int(&rng, -30, 30));
                a[i][l] = kind == 0 ? 0.0f : kind == 1 ? -0.0f : kind == 2 ? 1e30f * (l % 2 ? 1.0f : -1.0f) : v;
            }
        const cm_v16f got = cm_hsum16(a);
        for (int i = 0; i < CM_LANES; i++) {
            const float want = cm_hsum(a[i]), g = got[i];
            if (memcmp(&g, &want, sizeof g) != 0)
                fail_msg("cm_hsum16 lane %d = %a, cm_hsum %a", i, (double)g, (double)want);
        }
    }
}

/* ---- the canonical order, spelled out -------------------------------------- */

static float canon_tree(const float *l)
{
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++)
        s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* out [T][nh*hd] in the order of cpu_attention.c's header comment */
static void canonical_attention(float *out, const float *qkv, const float *kc, const float *vc, int32_t nh,
                                int32_t nkv, int32_t hd, float scale, const ops_batch *ob)
{
    const step_batch *b = &ob->b;
    const int32_t G = nh / nkv, bs = b->block_size, width = (nh + 2 * nkv) * hd, kvw = nkv * hd;
    float *e = malloc((size_t)b->max_seq_len * sizeof *e), *o = malloc((size_t)hd * sizeof *o);
    assert_non_null(e);
    assert_non_null(o);
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int32_t *table = b->block_tables + (size_t)s * b->block_table_stride;
        for (int32_t t = b->query_start[s]; t < b->query_start[s + 1]; t++) {
            const int32_t n = b->positions[t] + 1, w = b->sliding_window;
            const int32_t lo = w > 0 && n - w > 0 ? n - w : 0; /* p - W < j <= p */
            for (int32_t h = 0; h < nh; h++) {
                const int32_t g = h / G;
                const float *q = qkv + (size_t)t * width + (size_t)h * hd;
                float mx = -INFINITY;
                for (int32_t j = lo; j < n; j++) {
                    const float *k = kc + ((size_t)table[j / bs] * bs + (size_t)(j % bs)) * kvw + (size_t)g * hd;
                    float lanes[16] = {0.0f};
                    for (int32_t d0 = 0; d0 < hd; d0 += 16)
                        for (int l = 0; l < 16; l++) {
                            const int32_t d = d0 + l;
                            const float p = d < hd ? q[d] * k[d] : 0.0f * 0.0f;
                            lanes[l] = lanes[l] + p;
                        }
                    e[j] = canon_tree(lanes) * scale;
                    mx = e[j] > mx ? e[j] : mx;
                }
                float z = 0.0f;
                for (int32_t j = lo; j < n; j++) {
                    e[j] = cm_expf(e[j] - mx);
                    z = z + e[j];
                }
                const float inv = 1.0f / z;
                for (int32_t d = 0; d < hd; d++)
                    o[d] = 0.0f;
                for (int32_t j = lo; j < n; j++) {
                    const float *v = vc + ((size_t)table[j / bs] * bs + (size_t)(j % bs)) * kvw + (size_t)g * hd;
                    for (int32_t d = 0; d < hd; d++)
                        o[d] = o[d] + e[j] * v[d];
                }
                float *dst = out + (size_t)t * nh * hd + (size_t)h * hd;
                for (int32_t d = 0; d < hd; d++)
                    dst[d] = o[d] * inv;
            }
        }
    }
    free(e);
    free(o);
}

/* ---- fast vs reference ------------------------------------------------------- */

typedef struct attn_case {
    int32_t nh, nkv, hd, bs;
    float amp; /* q and k in [-amp, amp): large amp makes exp underflow */
    int32_t S;
    ops_seq_spec seqs[8];
    int32_t window; /* step_batch.sliding_window: 0 = full causal */
} attn_case;

static const attn_case cases[] = {
    /* the context lengths of the brief, as decodes, MHA, hd 64, bs 16 */
    {4, 4, 64, 16, 1.0f, 6, {{1, 1}, {15, 1}, {16, 1}, {17, 1}, {255, 1}, {1000, 1}}, 0},
    /* block size 1, GQA 2, hd 16, prefill chunks and decodes */
    {4, 2, 16, 1, 1.0f, 5, {{17, 17}, {15, 3}, {1, 1}, {255, 1}, {16, 16}}, 0},
    /* block size 32, GQA 4, hd 128, a long chunked prefill */
    {8, 2, 128, 32, 1.0f, 5, {{1000, 7}, {255, 1}, {16, 16}, {17, 2}, {33, 1}}, 0},
    /* hd 8 (a partial vector), GQA 2, single kv head */
    {2, 1, 8, 16, 1.0f, 4, {{1, 1}, {17, 17}, {255, 3}, {16, 1}}, 0},
    /* hd 24 (one full vector and a tail), GQA 2; scores large: exp underflows */
    {6, 3, 24, 16, 4.0f, 4, {{15, 15}, {255, 2}, {1000, 1}, {17, 1}}, 0},
    /* hd 2 */
    {4, 4, 2, 32, 3.0f, 3, {{1, 1}, {33, 33}, {255, 1}}, 0},
    /* 110m-like: 12 heads, hd 64, a decode batch with one prefill chunk */
    {12, 12, 64, 16, 1.0f, 8, {{130, 1}, {200, 1}, {17, 1}, {129, 64}, {256, 1}, {1, 1}, {16, 1}, {255, 1}}, 0},
    /* GQA 4, hd 128, bs 16 */
    {16, 4, 128, 16, 2.0f, 3, {{1, 1}, {255, 17}, {1000, 1}}, 0},
    /* sliding windows smaller than the context (1, inside a block, across
     * block boundaries), equal to it and larger; GQA; prefill, chunked
     * prefill and decode */
    {4, 2, 16, 16, 1.0f, 5, {{17, 17}, {15, 3}, {1, 1}, {255, 1}, {40, 9}}, 1},
    {4, 2, 16, 1, 1.0f, 5, {{17, 17}, {15, 3}, {1, 1}, {255, 1}, {16, 16}}, 5},
    {8, 2, 128, 32, 1.0f, 5, {{1000, 7}, {255, 1}, {16, 16}, {17, 2}, {33, 1}}, 40},
    {12, 12, 64, 16, 1.0f, 8, {{130, 1}, {200, 1}, {17, 1}, {129, 64}, {256, 1}, {1, 1}, {16, 1}, {255, 1}}, 16},
    {6, 3, 24, 16, 4.0f, 4, {{15, 15}, {255, 2}, {1000, 1}, {17, 1}}, 255},
    {16, 4, 128, 16, 2.0f, 3, {{1, 1}, {255, 17}, {1000, 1}}, 2000},
    /* prefill tiles (attn_tile): long prompts, several of different lengths
     * in one step beside decodes, chunked prefill (query rows from mid-
     * context), lengths that are not a multiple of the tile; GQA 1, 2, 4;
     * hd 8, 64, 128; windows across tiles and blocks */
    {4, 2, 64, 16, 1.0f, 4, {{600, 600}, {77, 77}, {90, 1}, {30, 30}}, 0},
    {4, 1, 128, 16, 1.0f, 4, {{600, 120}, {129, 129}, {40, 1}, {19, 11}}, 0},
    {3, 3, 8, 16, 3.0f, 3, {{600, 600}, {33, 20}, {2, 2}}, 0},
    {12, 12, 64, 16, 1.0f, 3, {{130, 130}, {130, 3}, {9, 9}}, 0},
    {8, 2, 64, 16, 1.0f, 3, {{600, 600}, {300, 100}, {50, 1}}, 100},
    {4, 4, 128, 32, 2.0f, 3, {{600, 37}, {200, 200}, {13, 13}}, 7},
    {2, 1, 8, 1, 1.0f, 2, {{97, 97}, {64, 30}}, 3},
    /* many heads and a long context: tiles shortened to keep the score
     * area in bounds (ATTN_TILE_E_MAX_FLOATS) */
    {64, 16, 8, 16, 1.0f, 2, {{2100, 24}, {40, 40}}, 0},
};

static float *fbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static executor *make_cpu_kv(int32_t threads, cpu_kv kv)
{
    executor *ex = NULL;
    pg_error err = {{0}};
    cpu_executor_params p = {.threads = threads, .kv_dtype = (int32_t)kv};
    if (cpu_executor_create(&ex, &p, &err))
        fail_msg("cpu executor with %d threads: %s", (int)threads, err.msg);
    return ex;
}

/* out (host) of the fast path on ex, through the executor table, with the
 * caches already in ex (dk, dv) */
static void run_fast_dev(executor *ex, float *out, const float *qkv, const void *dk, const void *dv,
                         const attn_case *ac, const step_batch *b, const char *what)
{
    const int32_t T = b->num_tokens, width = (ac->nh + 2 * ac->nkv) * ac->hd;
    const size_t no = (size_t)T * ac->nh * ac->hd;
    void *dq = ops_dev_alloc(ex, EXEC_ACT, (size_t)T * width), *dout = ops_dev_alloc(ex, EXEC_ACT, no);
    ops_dev_put(ex, dq, EXEC_ACT, qkv, (size_t)T * width);
    ops_dev_poison(ex, dout, EXEC_ACT, no);
    if (ex->op->begin_step(ex, b) || ex->op->attention(ex, dout, dq, dk, dv, ac->nh, ac->nkv, ac->hd,
                                                       1.0f / sqrtf((float)ac->hd), b))
        fail_msg("%s: attention failed: %s", what, ex->op->last_error(ex));
    ops_dev_get(ex, out, dout, EXEC_ACT, no, what);
    ex->op->free(ex, dq);
    ex->op->free(ex, dout);
}

/* the same, caches from the host */
static void run_fast(executor *ex, float *out, const float *qkv, const float *kc, const float *vc, size_t nc,
                     const attn_case *ac, const step_batch *b, const char *what)
{
    void *dk = ops_dev_alloc(ex, EXEC_KV, nc), *dv = ops_dev_alloc(ex, EXEC_KV, nc);
    ops_dev_put(ex, dk, EXEC_KV, kc, nc);
    ops_dev_put(ex, dv, EXEC_KV, vc, nc);
    run_fast_dev(ex, out, qkv, dk, dv, ac, b, what);
    ex->op->free(ex, dk);
    ex->op->free(ex, dv);
}

static void run_ref(executor *ex, float *out, const float *qkv, const float *kc, const float *vc, size_t nc,
                    const attn_case *ac, const step_batch *b, const char *what)
{
    const size_t no = (size_t)b->num_tokens * ac->nh * ac->hd;
    float *dout = ops_dev_alloc(ex, EXEC_ACT, no);
    /* the caches in the executor's type (the twin reads them as stored) */
    void *dk = ops_dev_alloc(ex, EXEC_KV, nc), *dv = ops_dev_alloc(ex, EXEC_KV, nc);
    ops_dev_put(ex, dk, EXEC_KV, kc, nc);
    ops_dev_put(ex, dv, EXEC_KV, vc, nc);
    ops_dev_poison(ex, dout, EXEC_ACT, no);
    if (cpu_op_attention_ref((cpu_exec *)ex, dout, qkv, dk, dv, ac->nh, ac->nkv, ac->hd,
                             1.0f / sqrtf((float)ac->hd), b))
        fail_msg("%s: reference attention failed: %s", what, ex->op->last_error(ex));
    ops_dev_get(ex, out, dout, EXEC_ACT, no, what);
    ex->op->free(ex, dout);
    ex->op->free(ex, dk);
    ex->op->free(ex, dv);
}

/* Every case with each KV cache type (f32, bf16, f16): the inputs are
 * rounded to the type first (ops_dev_put_rt), so the canonical order below
 * runs on the very values the 16-bit cache holds and the fast path must
 * match it bit for bit, as with f32. */
static void fast_vs_ref_kv(cpu_kv kv)
{
    const int32_t thread_counts[] = {1, 2, 3, 7};
    executor *exs[4];
    for (int i = 0; i < 4; i++)
        exs[i] = make_cpu_kv(thread_counts[i], kv);
    pg_test_rng rng = {4242u + (uint64_t)kv};
    double worst_rel = 0.0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const attn_case *ac = &cases[c];
        ops_batch ob;
        ops_batch_build(&ob, ac->seqs, ac->S, ac->bs, 10, &rng);
        ob.b.sliding_window = ac->window;
        /* with a window, the blocks wholly behind each sequence's first
         * query's window are null (-1), as the engine drops them: both
         * versions must accept them and never read them */
        for (int32_t s = 0; ac->window > 0 && s < ac->S; s++) {
            const int32_t p0 = ob.positions[ob.query_start[s]], lo = p0 - ac->window + 1;
            int32_t *table = ob.block_tables + (size_t)s * ob.b.block_table_stride;
            for (int32_t k = 0; (k + 1) * ac->bs <= lo; k++)
                table[k] = -1;
        }
        const int32_t T = ob.b.num_tokens, width = (ac->nh + 2 * ac->nkv) * ac->hd, ow = ac->nh * ac->hd;
        const size_t nq = (size_t)T * width, nc = (size_t)ob.num_blocks * ac->bs * ac->nkv * ac->hd;
        const size_t no = (size_t)T * ow;
        float *qkv = fbuf(nq), *kc = fbuf(nc), *vc = fbuf(nc);
        pg_test_fill_uniform(&rng, qkv, nq, -ac->amp, ac->amp);
        pg_test_fill_uniform(&rng, kc, nc, -ac->amp, ac->amp);
        pg_test_fill_uniform(&rng, vc, nc, -1.0f, 1.0f);
        {
            void *tmp = ops_dev_alloc(exs[0], EXEC_KV, nc);
            ops_dev_put_rt(exs[0], tmp, EXEC_KV, kc, nc);
            ops_dev_put_rt(exs[0], tmp, EXEC_KV, vc, nc);
            exs[0]->op->free(exs[0], tmp);
        }
        float *fast = fbuf(no), *ref = fbuf(no), *canon = fbuf(no), *other = fbuf(no);
        char what[200];
        snprintf(what, sizeof what, "kv %s case %zu: nh=%d nkv=%d hd=%d bs=%d S=%d T=%d window=%d", cpu_kv_name(kv), c,
                 (int)ac->nh, (int)ac->nkv, (int)ac->hd, (int)ac->bs, (int)ac->S, (int)T, (int)ac->window);

        run_fast(exs[0], fast, qkv, kc, vc, nc, ac, &ob.b, what);
        run_ref(exs[1], ref, qkv, kc, vc, nc, ac, &ob.b, what);
        /* close to the reference: max |difference| <= 4e-7 * amp^2 *
         * max |reference| (each output is a softmax-weighted mean of v in
         * [-1, 1]; the two differ by a few ulps in the dot products, exp and
         * z, f32 eps = 1.2e-7, and an ulp of a score s ~ amp^2 is an absolute
         * error of exp(s - max): observed 1e-7..3e-7 at amp 1, 1.4e-6 at 4) */
        double *refd = malloc(no * sizeof *refd);
        assert_non_null(refd);
        for (size_t i = 0; i < no; i++)
            refd[i] = ref[i];
        ops_check_close(fast, refd, no, 4e-7 * (double)ac->amp * (double)ac->amp, what);
        double max_err = 0.0, max_ref = 0.0;
        for (size_t i = 0; i < no; i++) {
            max_err = fmax(max_err, fabs((double)fast[i] - refd[i]));
            max_ref = fmax(max_ref, fabs(refd[i]));
        }
        if (max_err / max_ref > worst_rel)
            worst_rel = max_err / max_ref;
        free(refd);

        /* the canonical order, bit for bit */
        canonical_attention(canon, qkv, kc, vc, ac->nh, ac->nkv, ac->hd, 1.0f / sqrtf((float)ac->hd), &ob);
        for (size_t i = 0; i < no; i++)
            if (memcmp(&fast[i], &canon[i], sizeof fast[i]) != 0)
                fail_msg("%s: out[%zu][%zu] = %a, the canonical order gives %a", what, i / (size_t)ow,
                         i % (size_t)ow, (double)fast[i], (double)canon[i]);

        /* other thread counts: same bits */
        for (int e = 1; e < 4; e++) {
            run_fast(exs[e], other, qkv, kc, vc, nc, ac, &ob.b, what);
            if (memcmp(other, fast, no * sizeof *fast) != 0)
                fail_msg("%s: %d threads differ from 1 thread", what, (int)thread_counts[e]);
        }
        /* every sequence alone: same bits as inside the batch */
        for (int32_t s = 0; s < ac->S; s++) {
            ops_batch alone;
            ops_batch_extract(&alone, &ob, s);
            alone.b.sliding_window = ob.b.sliding_window;
            const int32_t q0 = ob.query_start[s];
            run_fast(exs[1], other, qkv + (size_t)q0 * width, kc, vc, nc, ac, &alone.b, what);
            if (memcmp(other, fast + (size_t)q0 * ow, (size_t)alone.b.num_tokens * ow * sizeof *fast) != 0)
                fail_msg("%s: sequence %d (len %d) alone differs from the ragged batch", what, (int)s,
                         (int)ac->seqs[s].seq_len);
            ops_batch_free(&alone);
        }
        free(qkv);
        free(kc);
        free(vc);
        free(fast);
        free(ref);
        free(canon);
        free(other);
        ops_batch_free(&ob);
    }
    print_message("kv %s: fast vs reference: max |difference| / max |reference| %.3g\n", cpu_kv_name(kv),
                  worst_rel);
    for (int i = 0; i < 4; i++)
        exs[i]->op->destroy(exs[i]);
}

static void test_fast_vs_ref(void **state)
{
    (void)state;
    for (int kv = 0; kv < CPU_KV_COUNT; kv++)
        fast_vs_ref_kv((cpu_kv)kv);
}

/* cm_load_bf16 / cm_load_f16 against weights/dtype.c's scalar
 * conversions on every one of the 65536 bit patterns (NaNs: still NaN,
 * sign and payload kept); the 8-lane forms (what attention's AVX2 loops
 * read the cache with) give the 16-lane forms' bits. */
static void test_widen_16bit(void **state)
{
    (void)state;
    for (uint32_t base = 0; base < 65536; base += 16) {
        uint16_t h[16];
        for (int i = 0; i < 16; i++)
            h[i] = (uint16_t)(base + (uint32_t)i);
        const cm_v16f b = cm_load_bf16(h), f = cm_load_f16(h);
        for (int half = 0; half < 2; half++) {
            const cm_v8f b8 = cm_load_bf16_8(h + 8 * half), f8 = cm_load_f16_8(h + 8 * half);
            if (memcmp(&b8, (const float *)&b + 8 * half, sizeof b8) != 0)
                fail_msg("cm_load_bf16_8 at 0x%04x differs from cm_load_bf16", (unsigned)(base + 8u * (unsigned)half));
            if (memcmp(&f8, (const float *)&f + 8 * half, sizeof f8) != 0)
                fail_msg("cm_load_f16_8 at 0x%04x differs from cm_load_f16", (unsigned)(base + 8u * (unsigned)half));
        }
        for (int i = 0; i < 16; i++) {
            const float wb = pg_bf16_to_f32(h[i]), wf = pg_f16_to_f32(h[i]);
            const float gb = b[i], gf = f[i];
            if (memcmp(&gb, &wb, sizeof gb) != 0)
                fail_msg("cm_load_bf16(0x%04x) = %a, expected %a", (unsigned)h[i], (double)gb, (double)wb);
            if (memcmp(&gf, &wf, sizeof gf) != 0 && !(isnan(gf) && isnan(wf)))
                fail_msg("cm_load_f16(0x%04x) = %a, expected %a", (unsigned)h[i], (double)gf, (double)wf);
            if (isnan(wf)) { /* same bits for NaN too: payload and sign */
                uint32_t a, c;
                memcpy(&a, &gf, sizeof a);
                memcpy(&c, &wf, sizeof c);
                if ((a & 0x80000000u) != (c & 0x80000000u) || (a & 0x003fffffu) != (c & 0x003fffffu))
                    fail_msg("cm_load_f16(0x%04x): NaN bits %08x, expected %08x", (unsigned)h[i], a, c);
            }
        }
    }
}

/* cpu_kv_store (what kv_write writes into a 16-bit cache) against the
 * scalar conversions of weights/dtype.h, one call per element (their own
 * values are pinned case by case in tests/weights test_dtype): every high half (so every sign,
 * exponent, NaN and inf) under the low halves that decide rounding: 0,
 * the ties 0x8000 (to even: the kept lsb 0 or 1 both occur over the high
 * halves), one below and above them, 0xffff (a carry through the
 * mantissa into the exponent, up to inf past the largest finite), and a
 * few random ones. Bit for bit, NaNs included. */
static void test_narrow_16bit(void **state)
{
    (void)state;
    enum { N_LOW = 10 };
    static const uint32_t fixed_low[6] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    pg_test_rng rng = {4242};
    float *src = fbuf(65536u * N_LOW);
    uint16_t *got = calloc(65536u * N_LOW, sizeof *got);
    assert_non_null(got);
    for (uint32_t hi = 0; hi < 65536u; hi++)
        for (uint32_t j = 0; j < N_LOW; j++) {
            const uint32_t lo = j < 6 ? fixed_low[j] : (uint32_t)(pg_test_rng_next(&rng) & 0xffffu);
            const uint32_t bits = hi << 16 | lo;
            memcpy(&src[hi * N_LOW + j], &bits, sizeof bits);
        }
    const cpu_kv kinds[2] = {CPU_KV_BF16, CPU_KV_F16};
    for (int k = 0; k < 2; k++) {
        cpu_kv_store(kinds[k], got, src, (int64_t)65536 * N_LOW);
        for (size_t i = 0; i < 65536u * N_LOW; i++) {
            const uint16_t want = kinds[k] == CPU_KV_BF16 ? pg_f32_to_bf16(src[i]) : pg_f32_to_f16(src[i]);
            if (got[i] != want) {
                uint32_t bits;
                memcpy(&bits, &src[i], sizeof bits);
                fail_msg("cpu_kv_store %s(0x%08x) = 0x%04x, expected 0x%04x", cpu_kv_name(kinds[k]), bits,
                         (unsigned)got[i], (unsigned)want);
            }
        }
    }
    free(src);
    free(got);
}

/* out (host) of the fast path for query rows [p0, p1) of `all` (one
 * sequence prefilled at positions 0..T-1): the step that runs only those
 * rows, with the same blocks (a chunk of a chunked prefill; p1 = p0 + 1:
 * a decode step) */
static void run_rows(executor *ex, float *out, const float *qkv, const void *dk, const void *dv,
                     const attn_case *ac, const ops_batch *all, int32_t p0, int32_t p1)
{
    const int32_t width = (ac->nh + 2 * ac->nkv) * ac->hd;
    ops_batch part = *all;
    int32_t qs[2] = {0, p1 - p0}, len = p1, lr = p1 - p0 - 1;
    part.b.num_tokens = p1 - p0;
    part.b.query_start = qs;
    part.b.seq_lens = &len;
    part.b.positions = all->positions + p0;
    part.b.slots = all->slots + p0;
    part.b.token_ids = all->token_ids + p0;
    part.b.num_logits = 1;
    part.b.logits_rows = &lr;
    part.b.max_query_len = p1 - p0;
    run_fast_dev(ex, out, qkv + (size_t)p0 * width, dk, dv, ac, &part.b, "rows");
}

/* A token's output does not change when its own sequence is prefilled at
 * once, token by token (decode steps) or in chunks of other sizes
 * (executor.h "Determinism"): prompts of up to 600 tokens, every KV type,
 * GQA 1/2/4, hd 8/64/128, windows, 1 and 2 threads. Bit for bit. */
static void test_prefill_equals_decode(void **state)
{
    (void)state;
    static const attn_case pcases[] = {
        {4, 1, 64, 16, 1.0f, 1, {{600, 600}}, 0},
        {4, 4, 8, 16, 2.0f, 1, {{257, 257}}, 0},
        {4, 2, 128, 32, 1.0f, 1, {{333, 333}}, 50},
        {4, 1, 64, 1, 1.0f, 1, {{70, 70}}, 5},
    };
    pg_test_rng rng = {77};
    for (int kv = 0; kv < CPU_KV_COUNT; kv++)
        for (int32_t threads = 1; threads <= 2; threads++) {
            executor *ex = make_cpu_kv(threads, (cpu_kv)kv);
            for (size_t c = 0; c < sizeof pcases / sizeof pcases[0]; c++) {
                const attn_case *ac = &pcases[c];
                ops_batch all;
                ops_batch_build(&all, ac->seqs, 1, ac->bs, 10, &rng);
                all.b.sliding_window = ac->window;
                const int32_t T = all.b.num_tokens, width = (ac->nh + 2 * ac->nkv) * ac->hd, ow = ac->nh * ac->hd;
                const size_t nq = (size_t)T * width, nc = (size_t)all.num_blocks * ac->bs * ac->nkv * ac->hd;
                float *qkv = fbuf(nq), *kc = fbuf(nc), *vc = fbuf(nc), *pre = fbuf((size_t)T * ow);
                float *part = fbuf((size_t)T * ow);
                pg_test_fill_uniform(&rng, qkv, nq, -ac->amp, ac->amp);
                pg_test_fill_uniform(&rng, kc, nc, -ac->amp, ac->amp);
                pg_test_fill_uniform(&rng, vc, nc, -1.0f, 1.0f);
                void *dk = ops_dev_alloc(ex, EXEC_KV, nc), *dv = ops_dev_alloc(ex, EXEC_KV, nc);
                ops_dev_put(ex, dk, EXEC_KV, kc, nc);
                ops_dev_put(ex, dv, EXEC_KV, vc, nc);
                run_fast_dev(ex, pre, qkv, dk, dv, ac, &all.b, "prefill");
                /* chunk sizes: 1 (a decode step per token), then random ones */
                for (int mode = 0; mode < 2; mode++)
                    for (int32_t p0 = 0, p1; p0 < T; p0 = p1) {
                        p1 = p0 + (mode == 0 ? 1 : pg_test_rng_int(&rng, 1, 70));
                        p1 = p1 > T ? T : p1;
                        run_rows(ex, part, qkv, dk, dv, ac, &all, p0, p1);
                        if (memcmp(part, pre + (size_t)p0 * ow, (size_t)(p1 - p0) * ow * sizeof *part) != 0)
                            fail_msg("kv %s, %d threads, case %zu: rows [%d, %d) of a prefill of %d run as %s differ "
                                     "from the prefill at once", cpu_kv_name((cpu_kv)kv), (int)threads, c, (int)p0,
                                     (int)p1, (int)T, mode == 0 ? "decode steps" : "a chunk");
                    }
                ex->op->free(ex, dk);
                ex->op->free(ex, dv);
                free(qkv);
                free(kc);
                free(vc);
                free(pre);
                free(part);
                ops_batch_free(&all);
            }
            ex->op->destroy(ex);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_accuracy),
        cmocka_unit_test(test_hsum16),
        cmocka_unit_test(test_fast_vs_ref),
        cmocka_unit_test(test_widen_16bit),
        cmocka_unit_test(test_narrow_16bit),
        cmocka_unit_test(test_prefill_equals_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
