/* bench_sec_scaling: the "scaling" section of pagedgen_bench — throughput
 * as the request count grows past what the pool holds at once. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_machine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

/* ---- section: scaling -------------------------------------------------------- */

int bench_section_scaling(bench_ctx *c)
{
    const char *name = "15m";
    int32_t P = c->quick ? 16 : 32, G = c->quick ? 16 : 64;
    int32_t max_mns = c->quick ? 16 : 256;
    printf("\n== scaling: throughput vs max_num_seqs (fixed P%d/G%d, requests = max(16, 2 x "
           "max_num_seqs), KV ample) and vs KV budget\n", P, G);
    int32_t blocks_per_req = bench_ceil_div(P + G, 16);
    bench_model bm;
    bool skipped;
    /* the budget sweep below needs up to 32 context reservations */
    int32_t ctx = 0;
    if (bench_config_ctx(c, name, &ctx) != 0)
        return -1;
    int32_t num_blocks = max_mns * blocks_per_req + 16;
    if (num_blocks < 32 * bench_ceil_div(ctx, 16))
        num_blocks = 32 * bench_ceil_div(ctx, 16);
    int rc = bench_load(c, name, &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    bench_json *j = c->j;
    bench_json_obj(j, "scaling");
    bench_json_model(j, &bm);

    double xs[16], ys[16], yr[16];
    int32_t npts = 0;
    bench_json_arr(j, "vs_max_num_seqs");
    printf("  %8s %6s %10s %9s %8s\n", "max_seqs", "reqs", "gen_tok/s", "req/s", "wall_s");
    for (int32_t mns = 1; mns <= max_mns && rc == 0; mns *= 2) {
        int32_t nreq = mns * 2 < 16 ? 16 : mns * 2;
        bench_workload_spec s = {.name = "fixed", .dist = BENCH_DIST_FIXED, .n_requests = nreq,
                                 .prompt_len = P, .output_len = G, .seed = 21};
        bench_run_params rp = bench_run_params_default(&bm);
        rp.max_num_seqs = mns;
        rp.num_blocks = mns * blocks_per_req + 16;
        bench_result r;
        bench_workload w;
        rc = bench_run_workload(&bm, &s, &rp, &r, &w);
        if (rc == 0) {
            printf("  %8d %6d %10.1f %9.2f %8.2f\n", mns, nreq, r.gen_tok_s, r.req_per_s,
                   r.wall_s);
            xs[npts] = mns;
            ys[npts] = r.gen_tok_s;
            yr[npts] = r.req_per_s;
            npts++;
            bench_json_obj(j, NULL);
            bench_json_workload(j, "workload", &w);
            bench_json_result(j, "result", &r, &rp);
            bench_json_end(j);
            bench_workload_free(&w);
        }
    }
    bench_json_end(j);
    if (rc == 0) {
        bench_chart ch = {.title = "throughput vs max_num_seqs (15m, fixed lengths)",
                          .x_label = "max_num_seqs", .y_label = "generated tokens/s",
                          .log2_x = true, .n_series = 1};
        ch.series[0] = (bench_series){.name = "gen tok/s", .n = npts, .x = xs, .y = ys};
        char path[BENCH_MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/scaling_max_num_seqs.svg", c->out_dir);
        bench_svg_write(path, &ch);
    }
    (void)yr;

    /* vs KV budget: an Alpaca-like mix; budget in context reservations */
    int32_t reserve = bench_ceil_div(bench_model_ctx(&bm), 16);
    static const int32_t full_mult[] = {2, 4, 8, 16, 32};
    static const int32_t quick_mult[] = {2, 8};
    const int32_t *mult = c->quick ? quick_mult : full_mult;
    int32_t nm = c->quick ? 2 : 5;
    bench_workload_spec s = {.name = "alpaca", .dist = BENCH_DIST_ALPACA,
                             .n_requests = c->quick ? 32 : 128, .seed = 22};
    bench_workload w;
    if (rc == 0 && bench_make_workload(&bm, &s, &w) != 0)
        rc = -1;
    double bx[8], by[2][8];
    int32_t nb = 0;
    if (rc == 0) {
        printf("  KV budget sweep: %s, %d requests, mean P %.1f G %.1f\n", w.name, w.n,
               w.mean_prompt, w.mean_output);
        printf("  %8s %9s %12s %12s %7s %10s %10s\n", "blocks", "KV MiB", "paged tok/s",
               "contig tok/s", "ratio", "paged seqs", "contig seqs");
        bench_json_arr(j, "vs_kv_budget");
        for (int32_t mi = 0; mi < nm && rc == 0; mi++) {
            int32_t blocks = reserve * mult[mi];
            if (blocks > bm.mp.num_kv_blocks)
                break;
            bench_result r[2];
            bench_run_params rp[2];
            for (int k = 0; k < 2; k++) {
                rp[k] = bench_run_params_default(&bm);
                rp[k].num_blocks = blocks;
                rp[k].layout = k == 0 ? KV_LAYOUT_PAGED : KV_LAYOUT_CONTIGUOUS;
            }
            if ((rc = bench_run_pair(&bm, &w, rp, r)) != 0)
                break;
            printf("  %8d %9.1f %12.1f %12.1f %6.2fx %10d %10d\n", blocks,
                   (double)bm.kv_bytes_per_block * blocks / 1048576.0, r[0].gen_tok_s,
                   r[1].gen_tok_s, r[0].gen_tok_s / r[1].gen_tok_s, r[0].stats.peak_running_seqs,
                   r[1].stats.peak_running_seqs);
            bx[nb] = (double)bm.kv_bytes_per_block * blocks / 1048576.0;
            by[0][nb] = r[0].gen_tok_s;
            by[1][nb] = r[1].gen_tok_s;
            nb++;
            bench_json_obj(j, NULL);
            bench_json_int(j, "kv_budget_blocks", blocks);
            bench_json_num(j, "kv_budget_bytes", (double)bm.kv_bytes_per_block * blocks);
            bench_json_result(j, "paged", &r[0], &rp[0]);
            bench_json_result(j, "contiguous", &r[1], &rp[1]);
            bench_json_end(j);
        }
        bench_json_end(j);
        bench_json_workload(j, "kv_budget_workload", &w);
        bench_workload_free(&w);
    }
    if (rc == 0 && nb > 0) {
        bench_chart ch = {.title = "throughput vs KV budget (15m, Alpaca-like mix)",
                          .x_label = "KV cache budget (MiB)", .y_label = "generated tokens/s",
                          .log2_x = true, .n_series = 2};
        ch.series[0] = (bench_series){.name = "paged", .n = nb, .x = bx, .y = by[0]};
        ch.series[1] = (bench_series){.name = "contiguous", .n = nb, .x = bx, .y = by[1]};
        char path[BENCH_MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/scaling_kv_budget.svg", c->out_dir);
        bench_svg_write(path, &ch);
    }
    bench_json_end(j); /* scaling */
out:
    bench_model_free(&bm);
    return rc;
}
