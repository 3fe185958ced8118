/* bench_sec_throughput: the "throughput" section of pagedgen_bench (issue 4)
 * — generated tokens/s by batch size against the machine's ceilings. */
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

/* Issue 4's targets, generated tokens/s on this class of machine. */
static const int32_t target_batch[] = {1, 64, 128};
static const double target_gen_tok_s[] = {45.0, 400.0, 450.0};

/* ---- section: throughput (Issue 4) ----------------------------------------- */

static double target_for(int32_t batch)
{
    for (size_t i = 0; i < sizeof(target_batch) / sizeof(target_batch[0]); i++)
        if (target_batch[i] == batch)
            return target_gen_tok_s[i];
    return (double)NAN;
}

/* One model's table: the batches (at most batch_cap each) into c->j under
 * json_key; svg_name: the chart's file in c->out_dir. */
static int throughput_table(bench_ctx *c, const char *name, const char *json_key, const char *svg_name,
                            int32_t batch_cap)
{
    static const int32_t full_batches[] = {1, 8, 32, 64, 128};
    static const int32_t quick_batches[] = {1, 8};
    const int32_t *all = c->quick ? quick_batches : full_batches;
    int32_t n_all = c->quick ? 2 : 5;
    if (c->n_batches > 0) {
        all = c->batches;
        n_all = c->n_batches;
    }
    int32_t batches[16], n_batches = 0;
    for (int32_t i = 0; i < n_all && n_batches < 16; i++)
        if (all[i] <= batch_cap)
            batches[n_batches++] = all[i];
    if (n_batches == 0)
        return 0;
    int32_t P = c->quick ? 16 : 128, G = c->quick ? 16 : 128;
    int32_t max_batch = 1;
    for (int32_t i = 0; i < n_batches; i++)
        max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    int32_t blocks_per_req = bench_ceil_div(P + G, 16);
    int32_t num_blocks = max_batch * blocks_per_req + 16;

    printf("\n== throughput, %s: prompt %d / output %d, ignore EOS, greedy, %d threads, "
           "batch = requests = max_num_seqs\n", name, P, G, c->threads);
    bench_model bm;
    bool skipped;
    int rc = bench_load(c, name, &bm, num_blocks, max_batch, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    bench_peak_rss_reset();
    printf("  model %s: %.1fM params, weights %.1f MiB, KV %.2f MiB/block (16 tokens), pool %d "
           "blocks = %.1f MiB\n", bm.name, bm.params_total * 1e-6,
           (double)bm.weight_bytes / 1048576.0, (double)bm.kv_bytes_per_block / 1048576.0,
           num_blocks, (double)bm.kv_bytes_per_block * num_blocks / 1048576.0);
    printf("  %5s %9s %10s %10s %10s %9s %8s %8s %8s\n", "batch", "wall_s", "gen_tok/s",
           "prompt_t/s", "decode_t/s", "GFLOP/s", "%peak", "%cblas", "target");
    /* the machine's sgemm peak: the better of OpenBLAS on a large square and
     * the project's GEMM on an LLM shape (both measured above, same threads) */
    double peak = c->mach.sgemm_gflops > c->mach.pgemm_gflops ? c->mach.sgemm_gflops
                                                                : c->mach.pgemm_gflops;
    printf("  (%%peak: of the measured sgemm peak %.1f GFLOP/s = max(cblas_sgemm %.1f, cpu_gemm "
           "%.1f); %%cblas: of cblas_sgemm alone)\n", peak, c->mach.sgemm_gflops,
           c->mach.pgemm_gflops);

    bench_json *j = c->j;
    bench_json_obj(j, json_key);
    bench_json_model(j, &bm);
    bench_json_int(j, "prompt_len", P);
    bench_json_int(j, "output_len", G);
    bench_json_int(j, "threads", c->threads);
    bench_json_num(j, "sgemm_peak_gflops", peak);
    bench_json_str(j, "flops_model", "2*params_layers per layer token + 2*V*H per logits row + "
                   "4*L*nh*hd per attended (query,key) pair");
    bench_json_arr(j, "rows");
    double xs[8], ys[8], b1_decode = 0.0;
    for (int32_t bi = 0; bi < n_batches; bi++) {
        int32_t B = batches[bi];
        bench_workload_spec s = {.name = "fixed", .dist = BENCH_DIST_FIXED, .n_requests = B,
                                 .prompt_len = P, .output_len = G, .seed = 1};
        bench_run_params rp = bench_run_params_default(&bm);
        rp.max_num_seqs = B;
        rp.num_blocks = B * blocks_per_req + 16;
        bench_result r;
        if ((rc = bench_run_workload(&bm, &s, &rp, &r, NULL)) != 0)
            break;
        double frac_peak = peak > 0.0 ? r.gflops / peak : (double)NAN;
        double frac_sgemm = c->mach.sgemm_gflops > 0.0 ? r.gflops / c->mach.sgemm_gflops : (double)NAN;
        double frac_pgemm = c->mach.pgemm_gflops > 0.0 ? r.gflops / c->mach.pgemm_gflops : (double)NAN;
        double tgt = strcmp(name, "110m") == 0 ? target_for(B) : (double)NAN; /* issue 4's model */
        char tgt_s[32] = "-";
        if (!isnan(tgt))
            snprintf(tgt_s, sizeof(tgt_s), ">=%.0f%s", tgt, r.gen_tok_s >= tgt ? "" : "!");
        printf("  %5d %9.2f %10.1f %10.1f %10.1f %9.1f %7.1f%% %7.1f%% %8s\n", B, r.wall_s,
               r.gen_tok_s, r.prompt_tok_s, r.decode_tok_s, r.gflops, 100.0 * frac_peak,
               100.0 * frac_sgemm, tgt_s);
        bench_json_obj(j, NULL);
        bench_json_int(j, "batch", B);
        bench_json_num(j, "frac_sgemm_peak", frac_peak);
        bench_json_num(j, "frac_cblas_sgemm", frac_sgemm);
        bench_json_num(j, "frac_project_gemm_peak", frac_pgemm);
        bench_json_num(j, "target_gen_tok_per_s", tgt);
        if (!isnan(tgt))
            bench_json_bool(j, "meets_target", r.gen_tok_s >= tgt);
        bench_json_result(j, "result", &r, &rp);
        bench_json_end(j);
        xs[bi] = B;
        ys[bi] = r.gen_tok_s;
        if (B == 1)
            b1_decode = r.decode_tok_s;
    }
    bench_json_end(j); /* rows */
    if (rc == 0 && b1_decode > 0.0) {
        /* batch 1 decode reads every weight once per token */
        double wgbs = b1_decode * (double)bm.weight_bytes * 1e-9;
        printf("  batch 1: %.1f decode tok/s x %.1f MiB weights = %.2f GB/s of weights, "
               "%.0f%% of measured read bandwidth %.1f GB/s (45 tok/s would need %.1f GB/s)\n",
               b1_decode, (double)bm.weight_bytes / 1048576.0, wgbs,
               c->mach.read_gbs > 0.0 ? 100.0 * wgbs / c->mach.read_gbs : 0.0, c->mach.read_gbs,
               45.0 * (double)bm.weight_bytes * 1e-9);
        bench_json_num(j, "batch1_weight_gbs", wgbs);
        bench_json_num(j, "batch1_frac_read_bandwidth",
                       c->mach.read_gbs > 0.0 ? wgbs / c->mach.read_gbs : (double)NAN);
    }
    if (rc == 0) {
        size_t rss = bench_peak_rss_bytes();
        double budget = (double)bm.weight_bytes + (double)bm.kv_bytes_per_block * num_blocks;
        printf("  peak RSS during the runs %.1f MiB vs weights + KV pool %.1f MiB\n",
               (double)rss / 1048576.0, budget / 1048576.0);
        if (strcmp(name, "110m") == 0)
            printf("  targets (Issue 4): >= 45 gen tok/s at batch 1, >= 400 at 64, >= 450 at 128\n");
        bench_json_int(j, "peak_rss_bytes", (int64_t)rss);
        bench_json_num(j, "weights_plus_kv_bytes", budget);
        char title[96];
        snprintf(title, sizeof title, "generated tokens/s vs batch (%s, P%d/G%d)", name, (int)P, (int)G);
        bench_chart ch = {.title = title,
                          .x_label = "batch (requests = max_num_seqs)",
                          .y_label = "generated tokens/s", .log2_x = true, .n_series = 1};
        ch.series[0] = (bench_series){.name = bm.name, .n = n_batches, .x = xs, .y = ys};
        char path[BENCH_MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/%s", c->out_dir, svg_name);
        bench_svg_write(path, &ch);
    }
    bench_json_end(j); /* throughput */
out:
    bench_model_free(&bm);
    return rc;
}

/* The 110m Llama at every batch size (issue 4's targets), then a
 * Qwen3-0.6B-shaped model (issue 22: q/k norms, head_dim 128, a 151,936-entry
 * vocabulary; scripts/bench writes it with scripts/make-synthetic-qwen) up to
 * batch 32 — at 0.6B parameters a batch-128 run takes minutes on 2 cores. */
int bench_section_throughput(bench_ctx *c)
{
    int rc = throughput_table(c, "110m", "throughput", "throughput_batch.svg", 1 << 30);
    if (rc == 0 && !c->single_model)
        rc = throughput_table(c, "qwen3-0.6b", "throughput_qwen3_0.6b", "throughput_batch_qwen3.svg", 32);
    return rc;
}
