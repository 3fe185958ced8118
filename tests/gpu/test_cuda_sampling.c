/* test_cuda_sampling (suite gpu; suite gpu-emu on the host-emulated device,
 * tests/cuda_emu): gpu/sampling.cu (pgk_sample) against the host sampler
 * (core/sampler.c sampler_sample), both computing common/pg_sample.h's
 * definition: the same token for every row, bit for bit, on random rows —
 * flat and peaked, with ties, -inf, NaN and +inf — under random
 * temperatures (greedy included), top-k (radix select; boundary ties),
 * top-p (the cut and its ties), min-p, repetition / frequency / presence
 * penalties over a history with repeats, banned ids and a grammar mask
 * (32-bit words, applied first as core/engine.c does before the host
 * sampler), with the rows' parameters built by sampler_row_params, as the
 * engine builds them; and a row with no token left gives -1.
 * Rows that also want logprobs (every other row; k 0, 5, 20 in turn): the
 * kernel keeps them after the mask (raw_slot) and gpu/logprobs.cu scores
 * the drawn id there (PG_LSM_SAMPLED, reading the ids on the device) — the
 * kept row equal to the host's masked row, and the logprob, top ids and
 * top logprobs equal to sampler_sample's own, the rank to
 * pg_lsm_row_eval's, bit for bit.
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

#include "cuda_kernels.h"
#include "pg_logsoftmax.h"
#include "pg_sample.h"
#include "sampler.h"
#include "sampling_params.h"
#include "test_support.h"

static void random_params(pg_test_rng *r, sampling_params *p, int32_t V)
{
    *p = sampling_params_default();
    int k = pg_test_rng_int(r, 0, 15);
    p->temperature = k == 0 ? 0.0f : pg_test_rng_uniform(r, 0.2f, 2.0f);
    if (k & 1) p->top_k = pg_test_rng_int(r, 1, V < 2000 ? V : 2000);
    if (k & 2) p->top_p = pg_test_rng_uniform(r, 0.05f, 1.0f);
    if (k & 4) p->min_p = pg_test_rng_uniform(r, 0.0f, 0.3f);
    if (k & 8) {
        p->repetition_penalty = pg_test_rng_uniform(r, 0.5f, 2.0f);
        p->frequency_penalty = pg_test_rng_uniform(r, -2.0f, 2.0f);
        p->presence_penalty = pg_test_rng_uniform(r, -2.0f, 2.0f);
    }
    if (pg_test_rng_int(r, 0, 7) == 0) p->top_p = 0.999f;
}

enum { R = 24, HIST = 48, BANS = 4 };

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
    if (h && bytes) assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void test_device_equals_host(void **state)
{
    (void)state;
#ifdef PG_CUDA_EMU
    static const int32_t Vs[] = {1, 7, 600, 5003};
#else
    static const int32_t Vs[] = {1, 7, 600, 5003, 32000, 151936};
#endif
    pg_test_rng r = {0xde71ce};
    int checked = 0;
    for (size_t iv = 0; iv < sizeof Vs / sizeof *Vs; iv++) {
        const int32_t V = Vs[iv], W = (V + 31) / 32;
        float *lg = malloc((size_t)R * V * sizeof *lg), *row = malloc((size_t)V * sizeof *row);
        int32_t *prompt = malloc((size_t)R * HIST * sizeof *prompt);
        int32_t *output = malloc((size_t)R * HIST * sizeof *output);
        int32_t *banned = malloc((size_t)R * BANS * sizeof *banned);
        int32_t *pen_ids = malloc((size_t)R * 2 * HIST * sizeof *pen_ids);
        int32_t *pen_cnt = malloc((size_t)R * 2 * HIST * sizeof *pen_cnt);
        int32_t *ban_ids = malloc((size_t)R * BANS * sizeof *ban_ids);
        uint32_t *mask = malloc((size_t)R * W * sizeof *mask);
        pg_smp_row *rows = calloc(R, sizeof *rows);
        sampling_params *sp = malloc(R * sizeof *sp);
        sampler_seq_view *view = malloc(R * sizeof *view);
        int32_t want[R], got[R], n_pen = 0, n_ban = 0;
        /* rows with logprobs: their slot in raw, the host's results */
        int32_t slot[R], n_raw = 0;
        pgk_lp_req lreq[R];
        pg_lsm_row lwant[R];
        float *masked_rows = malloc((size_t)R * V * sizeof *masked_rows);
        assert_non_null(masked_rows);
        assert_true(lg && row && prompt && output && banned && pen_ids && pen_cnt && ban_ids && mask &&
                    rows && sp && view);
        sampler_workspace *ws = sampler_workspace_create(V);
        assert_non_null(ws);
        for (int32_t q = 0; q < R; q++) {
            float *x = lg + (size_t)q * V;
            pg_test_logits_row(&r, x, V, q + (int)iv);
            random_params(&r, &sp[q], V);
            int32_t *pq = prompt + q * HIST, *oq = output + q * HIST, *bq = banned + q * BANS;
            for (int i = 0; i < HIST; i++) {
                pq[i] = pg_test_rng_int(&r, 0, V - 1);
                oq[i] = pg_test_rng_int(&r, 0, V < 20 ? V - 1 : 19); /* repeats */
            }
            for (int i = 0; i < BANS; i++) bq[i] = pg_test_rng_int(&r, 0, V - 1);
            view[q] = (sampler_seq_view){.prompt_ids = pq, .n_prompt = pg_test_rng_int(&r, 0, HIST),
                                         .output_ids = oq, .n_output = pg_test_rng_int(&r, 0, HIST),
                                         .banned_ids = bq, .n_banned = V > 8 ? pg_test_rng_int(&r, 0, BANS) : 0};
            if (q == R - 1) { /* nothing left: every logit -inf */
                for (int32_t v = 0; v < V; v++) x[v] = -INFINITY;
            }
            sampler_rng rng = sampler_rng_init((uint64_t)q, (int32_t)iv);
            rng.counter = (uint64_t)pg_test_rng_int(&r, 0, 100);
            assert_int_equal(sampler_row_params(ws, &sp[q], &view[q], &rng, &rows[q], pen_ids, pen_cnt,
                                                &n_pen, ban_ids, &n_ban), 0);
            rows[q].row = q;
            uint32_t *mq = mask + (size_t)q * W;
            const bool masked = q % 3 == 1;
            for (int32_t w = 0; w < W; w++)
                mq[w] = masked ? (uint32_t)pg_test_rng_next(&r) | 1u : 0xffffffffu;
            rows[q].mask_first = masked ? q * W : -1;
            /* the host: the mask first (core/engine.c sample_seq), then the sampler */
            memcpy(row, x, (size_t)V * sizeof *row);
            for (int32_t v = 0; v < V && masked; v++)
                if (!((mq[v >> 5] >> (v & 31)) & 1u)) row[v] = -INFINITY;
            slot[q] = -1;
            if (q % 2 == 0) { /* logprobs too: the kept row is the masked one */
                static const int32_t ks[] = {0, 5, 20};
                sp[q].logprobs = ks[(q / 2) % 3];
                slot[q] = n_raw;
                memcpy(masked_rows + (size_t)n_raw * V, row, (size_t)V * sizeof *row);
                lreq[n_raw] = (pgk_lp_req){.row = n_raw, .token = PG_LSM_SAMPLED, .k = sp[q].logprobs,
                                           .sid = q};
            }
            int32_t top_ids[PG_LSM_MAX_TOP];
            float top_lp[PG_LSM_MAX_TOP];
            sampler_result res = {.top_ids = top_ids, .top_logprobs = top_lp};
            int rc = sampler_sample(ws, &sp[q], row, V, &view[q], &rng, &res);
            want[q] = rc == 0 ? res.token_id : -1;
            if (slot[q] >= 0) {
                pg_lsm_row *w = &lwant[n_raw++];
                memset(w, 0, sizeof *w);
                w->want = 1;
                w->k = sp[q].logprobs;
                w->token = want[q];
                w->rank = 1;
                for (int32_t j = 0; j < PG_LSM_MAX_TOP; j++)
                    w->top_ids[j] = -1;
                if (want[q] >= 0) { /* the rank (not in sampler_result), the rest as a check */
                    pg_lsm_row_eval(w, masked_rows + (size_t)slot[q] * V, V);
                    assert_true(w->token == want[q] && w->n_top == res.n_top);
                    assert_memory_equal(&w->logprob, &res.logprob, sizeof res.logprob);
                    assert_memory_equal(w->top_ids, top_ids, (size_t)res.n_top * sizeof *top_ids);
                    assert_memory_equal(w->top_lp, top_lp, (size_t)res.n_top * sizeof *top_lp);
                }
            }
        }
        float *d_lg = dev_copy(lg, (size_t)R * V * sizeof *lg);
        pg_smp_row *d_rows = dev_copy(rows, R * sizeof *rows);
        int32_t *d_pi = dev_copy(pen_ids, (size_t)n_pen * sizeof *pen_ids);
        int32_t *d_pc = dev_copy(pen_cnt, (size_t)n_pen * sizeof *pen_cnt);
        int32_t *d_bi = dev_copy(ban_ids, (size_t)n_ban * sizeof *ban_ids);
        uint32_t *d_mk = dev_copy(mask, (size_t)R * W * sizeof *mask);
        int32_t *d_ids = dev_copy(NULL, R * sizeof(int32_t));
        int32_t *d_slot = dev_copy(slot, sizeof slot);
        float *d_raw = dev_copy(NULL, (size_t)n_raw * V * sizeof(float));
        pgk_lp_req *d_lreq = dev_copy(lreq, (size_t)n_raw * sizeof *lreq);
        pg_lsm_row *d_lout = dev_copy(NULL, (size_t)n_raw * sizeof(pg_lsm_row));
        pg_error err;
        pgk_launch lk = {0, 1, &err, 0};
        assert_int_equal(pgk_sample(d_ids, d_lg, V, d_rows, R, d_pi, d_pc, d_bi, d_mk, d_raw, d_slot, &lk),
                         0);
        /* the logprobs after the draw, the ids read on the device */
        assert_int_equal(pgk_logprobs(d_lout, d_lg, V, d_lreq, n_raw, d_raw, d_ids, &lk), 0);
        assert_int_equal(cudaMemcpy(got, d_ids, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
        float *kept = malloc((size_t)n_raw * V * sizeof *kept);
        pg_lsm_row lgot[R];
        assert_non_null(kept);
        assert_int_equal(cudaMemcpy(kept, d_raw, (size_t)n_raw * V * sizeof *kept, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_int_equal(cudaMemcpy(lgot, d_lout, (size_t)n_raw * sizeof *lgot, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(kept, masked_rows, (size_t)n_raw * V * sizeof *kept);
        for (int32_t j = 0; j < n_raw; j++) {
            const pg_lsm_row *a = &lgot[j], *b = &lwant[j];
            /* (a row with no token: -1, logprob 0, rank 1; the engine fails it) */
            if (a->token != b->token || a->rank != b->rank ||
                memcmp(&a->logprob, &b->logprob, sizeof a->logprob) ||
                (b->token >= 0 && (a->n_top != b->n_top ||
                                   memcmp(a->top_ids, b->top_ids, sizeof a->top_ids) ||
                                   memcmp(a->top_lp, b->top_lp, sizeof a->top_lp) ||
                                   memcmp(&a->lse, &b->lse, sizeof a->lse))))
                fail_msg("V %d logprob row %d (k %d): device token %d lp %.9g rank %d n_top %d, host token "
                         "%d lp %.9g rank %d n_top %d", (int)V, (int)j, (int)b->k, (int)a->token,
                         (double)a->logprob, (int)a->rank, (int)a->n_top, (int)b->token, (double)b->logprob,
                         (int)b->rank, (int)b->n_top);
        }
        free(kept);
        free(masked_rows);
        cudaFree(d_slot);
        cudaFree(d_raw);
        cudaFree(d_lreq);
        cudaFree(d_lout);
        for (int32_t q = 0; q < R; q++) {
            if (got[q] != want[q])
                fail_msg("V %d row %d (t %g, top_k %d, top_p %g, min_p %g, rep %g, mask %d): device %d, "
                         "host %d", (int)V, (int)q, (double)sp[q].temperature, (int)sp[q].top_k,
                         (double)sp[q].top_p, (double)sp[q].min_p, (double)sp[q].repetition_penalty,
                         rows[q].mask_first >= 0, (int)got[q], (int)want[q]);
            checked++;
        }
        assert_int_equal(got[R - 1], -1);
        cudaFree(d_lg);
        cudaFree(d_rows);
        cudaFree(d_pi);
        cudaFree(d_pc);
        cudaFree(d_bi);
        cudaFree(d_mk);
        cudaFree(d_ids);
        sampler_workspace_destroy(ws);
        free(lg), free(row), free(prompt), free(output), free(banned), free(pen_ids), free(pen_cnt);
        free(ban_ids), free(mask), free(rows), free(sp), free(view);
    }
    printf("%d rows: the device and the host sampler agree\n", checked);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_equals_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
