/* bench_sec_beam: the "beam" section of pagedgen_bench (issue 35) — the
 * PagedAttention paper's beam search figure (§6.3, Fig. 15): KV blocks in
 * use when beams share their prompt and common prefix (fork + copy-on-write,
 * pruned beams freed at once) against the same run's beams each holding
 * their own copy (every block table entry its own block:
 * kv_pool_table_entries), at beam widths 2, 4, 6 on the bench's Alpaca-like
 * and ShareGPT-like length distributions; then the same workload run
 * without sharing (engine_params.beam_copy_blocks: a beam that takes a new
 * slot gets fresh blocks with a copy of its parent's), whose blocks in use
 * and throughput are printed beside. The paper saves 37.6-55.2% on Alpaca
 * at widths 2-6 (OPT-13B, block 16). Greedy beams with ignore_eos, so
 * every beam runs to its fixed length; the pool holds every run without
 * preemption. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

#define BEAM_MODEL "stories260K"

int bench_section_beam(bench_ctx *c)
{
    printf("\n== beam search (issue 35): KV blocks with sharing vs each beam its own copy, "
           "greedy, ignore EOS\n");
    printf("  paper (Fig. 15, Alpaca, beam widths 2-6): 37.6-55.2%% of KV blocks saved by sharing\n");
    int32_t ctx = 0;
    if (bench_config_ctx(c, BEAM_MODEL, &ctx) != 0)
        return -1;
    if (ctx == 0) {
        printf("  (model %s not found: skipped)\n", BEAM_MODEL);
        return 0;
    }
    const int32_t num_blocks = 8192;
    bench_model bm;
    bool skipped;
    int rc = bench_load(c, BEAM_MODEL, &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    const int32_t n_req = c->quick ? 16 : 64;
    /* ShareGPT scaled by ctx/2048 keeps the paper's length-to-context ratio */
    const bench_workload_spec specs[2] = {
        {"alpaca", BENCH_DIST_ALPACA, n_req, 0, 0, 0, 0, 35},
        {"sharegpt", BENCH_DIST_SHAREGPT, n_req, 0, 0, (double)ctx / 2048.0, 0, 36},
    };
    const int32_t widths[3] = {2, 4, 6};
    bench_json_arr(c->j, "beam");
    for (int s = 0; s < 2 && rc == 0; s++) {
        bench_workload w;
        if (bench_make_workload(&bm, &specs[s], &w) != 0) {
            rc = -1;
            break;
        }
        printf("  %-11s %-9s %4d req, mean P %5.1f G %5.1f%s | KV pool %d blocks of %d\n", bm.name,
               w.name, w.n, w.mean_prompt, w.mean_output, w.n_truncated ? " (some truncated)" : "",
               num_blocks, bm.mp.block_size);
        for (int k = 0; k < 3 && rc == 0; k++) {
            bench_run_params rp = bench_run_params_default(&bm);
            rp.num_blocks = num_blocks;
            rp.max_num_seqs = 256;
            rp.n = widths[k];
            rp.beam_search = true;
            bench_result r, rcp;
            if ((rc = bench_run_or_report(&bm, &w, &rp, &r)) != 0)
                break;
            bench_run_params rpc = rp;
            rpc.beam_copy_blocks = true;
            if ((rc = bench_run_or_report(&bm, &w, &rpc, &rcp)) != 0)
                break;
            double saved_mean = r.kv_unshared_sum > 0.0 ? 1.0 - r.kv_shared_sum / r.kv_unshared_sum : 0.0;
            double saved_peak = r.kv_unshared_peak > 0
                                    ? 1.0 - (double)r.kv_shared_peak / (double)r.kv_unshared_peak : 0.0;
            printf("    width %d: blocks in use, mean over steps %8.1f shared / %8.1f unshared = %5.1f%% "
                   "saved; peak %5d / %5lld = %5.1f%% saved | %8.1f gen tok/s %7.2f req/s %6.2f s  "
                   "cow %llu  preempt %llu\n", (int)widths[k],
                   r.kv_shared_sum / (double)(r.stats.steps ? r.stats.steps : 1),
                   r.kv_unshared_sum / (double)(r.stats.steps ? r.stats.steps : 1), 100.0 * saved_mean,
                   (int)r.kv_shared_peak, (long long)r.kv_unshared_peak, 100.0 * saved_peak,
                   r.gen_tok_s, r.req_per_s, r.wall_s, (unsigned long long)r.stats.cow_copies,
                   (unsigned long long)r.stats.preemptions);
            const double steps_c = (double)(rcp.stats.steps ? rcp.stats.steps : 1);
            printf("             copying run: blocks in use, mean %8.1f, peak %5d | %8.1f gen tok/s "
                   "%6.2f s | shared / copying: %.2fx gen tok/s, %.2fx fewer blocks (mean)\n",
                   rcp.kv_shared_sum / steps_c, (int)rcp.kv_shared_peak, rcp.gen_tok_s, rcp.wall_s,
                   rcp.gen_tok_s > 0.0 ? r.gen_tok_s / rcp.gen_tok_s : 0.0,
                   r.kv_shared_sum > 0.0 ? (rcp.kv_shared_sum / steps_c) /
                                               (r.kv_shared_sum / (double)(r.stats.steps ? r.stats.steps : 1))
                                         : 0.0);
            bench_check(c, rcp.stats.generated_tokens == r.stats.generated_tokens,
                        "beam search: the copying run generated other tokens");
            bench_check(c, r.kv_shared_sum < r.kv_unshared_sum,
                        "beam search: sharing saved no KV blocks");
            bench_check(c, r.seqs == w.n * widths[k], "beam search: not every request gave width beams");
            bench_json *j = c->j;
            bench_json_obj(j, NULL);
            bench_json_str(j, "model", bm.name);
            bench_json_int(j, "width", widths[k]);
            bench_json_workload(j, "workload", &w);
            bench_json_num(j, "kv_blocks_shared_mean", r.kv_shared_sum / (double)(r.stats.steps ? r.stats.steps : 1));
            bench_json_num(j, "kv_blocks_unshared_mean",
                           r.kv_unshared_sum / (double)(r.stats.steps ? r.stats.steps : 1));
            bench_json_num(j, "saved_mean", saved_mean);
            bench_json_int(j, "kv_blocks_shared_peak", r.kv_shared_peak);
            bench_json_num(j, "kv_blocks_unshared_peak", (double)r.kv_unshared_peak);
            bench_json_num(j, "saved_peak", saved_peak);
            bench_json_result(j, "run", &r, &rp);
            bench_json_num(j, "copying_kv_blocks_mean", rcp.kv_shared_sum / steps_c);
            bench_json_int(j, "copying_kv_blocks_peak", rcp.kv_shared_peak);
            bench_json_result(j, "copying_run", &rcp, &rpc);
            bench_json_end(j);
        }
        bench_workload_free(&w);
    }
    bench_json_end(c->j);
out:
    bench_model_free(&bm);
    return rc;
}
