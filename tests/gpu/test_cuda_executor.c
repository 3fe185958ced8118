/* test_cuda_executor (suite gpu; suite gpu-emu on the host-emulated device,
 * tests/cuda_emu): the CUDA executor's own contract beyond the op results
 * that tests/ops checks —
 *  - begin_step rejects what the CPU twin rejects (a negative slot or
 *    block-table entry) and a position that disagrees with
 *    seq_lens - q_len + i (the kernels' derivation); embed rejects token
 *    ids outside [0, V);
 *  - cuda_executor_argmax: ties -> lowest id, NaN never wins, a row of
 *    -inf/NaN only -> -1 and PG_EINVAL (core/sampler.c's greedy rule);
 *  - copy_blocks rejects a chained or doubled destination;
 *  - on the emulated device, the prefill kernel launches blocks for the
 *    prefill sequences only (the emulator counts them).
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

#include "cuda_executor.h"
#include "test_support.h"
#ifdef PG_CUDA_EMU
#include "emu_hooks.h"
#endif

static executor *make_cuda(int precision)
{
    executor *ex = NULL;
    pg_error err;
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    if (cuda_executor_create(&ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    return ex;
}

/* A valid step: sequence 0 decodes (len 5), sequence 1 prefills 3 tokens
 * of a 7-token context, sequence 2 decodes (len 1); block size 4. */
enum { BS = 4, STRIDE = 2 };
typedef struct batch_fix {
    int32_t tok[5], pos[5], slots[5], qs[4], lens[3], bt[3 * STRIDE], rows[3];
    step_batch b;
} batch_fix;

static void batch_init(batch_fix *f)
{
    const int32_t tok[5] = {1, 2, 3, 4, 5}, qs[4] = {0, 1, 4, 5}, lens[3] = {5, 7, 1};
    const int32_t bt[3 * STRIDE] = {0, 1, 2, 3, 4, 0}, rows[3] = {0, 3, 4};
    memcpy(f->tok, tok, sizeof tok);
    memcpy(f->qs, qs, sizeof qs);
    memcpy(f->lens, lens, sizeof lens);
    memcpy(f->bt, bt, sizeof bt);
    memcpy(f->rows, rows, sizeof rows);
    for (int32_t s = 0; s < 3; s++)
        for (int32_t t = qs[s]; t < qs[s + 1]; t++) {
            f->pos[t] = lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]);
            f->slots[t] = bt[s * STRIDE + f->pos[t] / BS] * BS + f->pos[t] % BS;
        }
    step_batch b = {.num_tokens = 5, .num_seqs = 3, .block_size = BS, .token_ids = f->tok,
                    .positions = f->pos, .slots = f->slots, .query_start = f->qs,
                    .seq_lens = f->lens, .block_tables = f->bt, .block_table_stride = STRIDE,
                    .max_seq_len = 7, .max_query_len = 3, .num_logits = 3, .logits_rows = f->rows};
    f->b = b;
}

static void test_begin_step_checks(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    batch_fix f;
    batch_init(&f);
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);

    f.pos[2] = 6; /* query 1 of the prefill (seq_len 7, q_len 3): position 5 */
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "expected position 5, got 6"));
    batch_init(&f);
    f.slots[4] = -1;
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "slot"));
    batch_init(&f);
    f.bt[1 * STRIDE + 1] = -3;
    assert_int_equal(ex->op->begin_step(ex, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "block table entry 1"));

    /* embed: token ids must be in [0, V) */
    batch_init(&f);
    const int32_t H = 8, V = 6;
    float table[6 * 8];
    for (int i = 0; i < V * H; i++)
        table[i] = (float)i;
    void *d_table = ex->op->alloc(ex, EXEC_WT, (size_t)V * H);
    void *d_x = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * H);
    assert_true(d_table && d_x);
    assert_int_equal(ex->op->upload(ex, d_table, EXEC_WT, 0, table, ST_F32, (size_t)V * H), 0);
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    assert_int_equal(ex->op->embed(ex, d_x, d_table, H, V, &f.b), 0);
    f.tok[3] = V;
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    assert_int_equal(ex->op->embed(ex, d_x, d_table, H, V, &f.b), PG_EINVAL);
    assert_non_null(strstr(ex->op->last_error(ex), "token 3"));
    assert_int_equal(ex->op->sync(ex), 0);
    ex->op->free(ex, d_table);
    ex->op->free(ex, d_x);
    ex->op->destroy(ex);
}

static void test_argmax_rule(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    enum { R = 4, V = 300 };
    float *lg = malloc((size_t)R * V * sizeof *lg);
    assert_non_null(lg);
    for (int i = 0; i < R * V; i++)
        lg[i] = -1.0f;
    lg[0 * V + 7] = 2.0f; /* row 0: a tie at 7 and 250 -> 7, NaN elsewhere never wins */
    lg[0 * V + 250] = 2.0f;
    lg[0 * V + 3] = NAN;
    for (int v = 0; v < V; v++) /* row 1: -inf and NaN except one finite value at 299 */
        lg[1 * V + v] = v % 2 ? -INFINITY : NAN;
    lg[1 * V + 299] = -1e30f;
    lg[2 * V + 0] = INFINITY; /* row 2: +inf wins */
    for (int v = 0; v < V; v++) /* row 3: nothing > -inf */
        lg[3 * V + v] = v % 3 ? -INFINITY : NAN;
    float *d = ex->op->alloc(ex, EXEC_F32, (size_t)R * V);
    assert_non_null(d);
    assert_int_equal(ex->op->upload(ex, d, EXEC_F32, 0, lg, ST_F32, (size_t)R * V), 0);
    int32_t ids[R];
    assert_int_equal(cuda_executor_argmax(ex, ids, d, 3, V), 0);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 299);
    assert_int_equal(ids[2], 0);
    assert_int_equal(cuda_executor_argmax(ex, ids, d, R, V), PG_EINVAL);
    assert_int_equal(ids[3], -1);
    assert_non_null(strstr(ex->op->last_error(ex), "row 3"));
    ex->op->free(ex, d);
    free(lg);
    ex->op->destroy(ex);
}

static void test_copy_blocks_pairs(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    const int32_t nb = 8, block_elems = 16, planes = 2;
    const size_t plane = (size_t)nb * block_elems;
    void *kv = ex->op->alloc(ex, EXEC_KV, plane * planes);
    assert_non_null(kv);
    const int32_t ok_pairs[] = {0, 1, 0, 2, 3, 4, 5, 5};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, ok_pairs, 4), 0);
    const int32_t chain[] = {0, 1, 1, 2};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, chain, 2), PG_EINVAL);
    const int32_t twice[] = {0, 3, 1, 3};
    assert_int_equal(ex->op->copy_blocks(ex, kv, planes, plane, block_elems, twice, 2), PG_EINVAL);
    assert_int_equal(ex->op->sync(ex), 0);
    ex->op->free(ex, kv);
    ex->op->destroy(ex);
}

#ifdef PG_CUDA_EMU
/* Prefill blocks: grid_x * nkv per prefill sequence, none for decodes. */
static void test_prefill_grid(void **state)
{
    (void)state;
    executor *ex = make_cuda(1);
    batch_fix f;
    batch_init(&f);
    const int32_t nh = 4, nkv = 2, hd = 8, W = (nh + 2 * nkv) * hd;
    void *qkv = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * W);
    void *kv = ex->op->alloc(ex, EXEC_KV, (size_t)2 * 5 * BS * nkv * hd);
    void *out = ex->op->alloc(ex, EXEC_ACT, (size_t)5 * nh * hd);
    assert_true(qkv && kv && out);
    float *z = calloc((size_t)2 * 5 * BS * nkv * hd, sizeof *z);
    assert_non_null(z);
    assert_int_equal(ex->op->upload(ex, qkv, EXEC_ACT, 0, z, ST_F32, (size_t)5 * W), 0);
    assert_int_equal(ex->op->upload(ex, kv, EXEC_KV, 0, z, ST_F32, (size_t)2 * 5 * BS * nkv * hd), 0);
    long before = emu_blocks_launched("prefill_attention_kernel");
    assert_int_equal(ex->op->begin_step(ex, &f.b), 0);
    void *v_cache = (char *)kv + (size_t)5 * BS * nkv * hd * ex->kv_bytes;
    assert_int_equal(ex->op->attention(ex, out, qkv, kv, v_cache, nh, nkv, hd, 0.5f, &f.b), 0);
    assert_int_equal(ex->op->sync(ex), 0);
    /* one prefill sequence of 3 tokens x G = 2 rows: grid_x = 1 */
    assert_int_equal(emu_blocks_launched("prefill_attention_kernel") - before, 1 * nkv * 1);
    free(z);
    ex->op->free(ex, qkv);
    ex->op->free(ex, kv);
    ex->op->free(ex, out);
    ex->op->destroy(ex);
}
#endif

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin_step_checks),
        cmocka_unit_test(test_argmax_rule),
        cmocka_unit_test(test_copy_blocks_pairs),
#ifdef PG_CUDA_EMU
        cmocka_unit_test(test_prefill_grid),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif /* PG_HAVE_CUDA */
