/* bench_sec_prefix: the "prefix" section of pagedgen_bench — shared-prefix
 * workloads with prefix caching on and off, and parallel sampling (n > 1)
 * forked vs fanned out. */
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

/* ---- section: prefix sharing and parallel sampling --------------------------- */

static int section_parallel(bench_ctx *c);

int bench_section_prefix(bench_ctx *c)
{
    int32_t prefix = c->quick ? 64 : 512, uniq = c->quick ? 16 : 32, G = c->quick ? 8 : 32;
    int32_t nreq = c->quick ? 8 : 16;
    printf("\n== prefix sharing: %d requests, shared prefix %d + %d own tokens, output %d; "
           "request 0 prefilled first (the system prompt is cached, as in the paper), then "
           "the rest at once\n", nreq, prefix, uniq, G);
    printf("  paper: 1.67-3.58x throughput with a shared prefix (translation, 1/5-shot); "
           "6-30%% memory saved by parallel sampling\n");
    bench_model bm;
    bool skipped;
    int32_t per_req = bench_ceil_div(prefix + uniq + G, 16);
    int32_t num_blocks = nreq * per_req * 4 + 64;
    int rc = bench_load(c, "110m", &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    bench_json *j = c->j;
    bench_json_obj(j, "prefix_sharing");
    bench_json_model(j, &bm);
    bench_json_str(j, "paper_shared_prefix_speedup", "1.67-3.58x");
    bench_json_str(j, "paper_parallel_sampling_memory_saved", "6-30%");
    bench_workload_spec s = {.name = "shared-prefix", .dist = BENCH_DIST_FIXED,
                             .n_requests = nreq, .prompt_len = prefix + uniq, .output_len = G,
                             .shared_prefix = prefix, .seed = 31};
    bench_workload w;
    if (bench_make_workload(&bm, &s, &w) != 0) {
        rc = -1;
        goto out_json;
    }
    bench_result r[2];
    bench_run_params rp[2];
    for (int k = 0; k < 2; k++) {
        rp[k] = bench_run_params_default(&bm);
        rp[k].num_blocks = nreq * per_req + 16;
        rp[k].prefix_caching = k == 0;
        rp[k].first_ahead = true; /* same schedule in both runs */
    }
    rc = bench_run_pair(&bm, &w, rp, r);
    if (rc == 0) {
        for (int k = 0; k < 2; k++)
            printf("    caching %-3s %8.2f req/s %9.1f gen tok/s %8.2f s  prompt tokens "
                   "computed %6llu  peak blocks %5d  hits %llu/%llu\n", k == 0 ? "on" : "off",
                   r[k].req_per_s, r[k].gen_tok_s, r[k].wall_s,
                   (unsigned long long)r[k].stats.prompt_tokens, r[k].stats.blocks_in_use_peak,
                   (unsigned long long)r[k].stats.prefix_cache_hits,
                   (unsigned long long)r[k].stats.prefix_cache_queries);
        double sp = r[1].req_per_s > 0.0 ? r[0].req_per_s / r[1].req_per_s : (double)NAN;
        double mem = r[1].stats.blocks_in_use_peak > 0
                         ? (double)r[0].stats.blocks_in_use_peak / r[1].stats.blocks_in_use_peak
                         : (double)NAN;
        printf("    prefix caching on/off: %.2fx req/s (paper 1.67-3.58x), peak blocks %.2fx\n",
               sp, mem);
        bench_check(c, r[0].stats.prefix_cache_hits > 0, "prefix caching on gave no cache hits");
        bench_check(c, r[0].stats.prompt_tokens < r[1].stats.prompt_tokens,
              "prefix caching on computed as many prompt tokens as off");
        bench_json_workload(j, "workload", &w);
        bench_json_result(j, "caching_on", &r[0], &rp[0]);
        bench_json_result(j, "caching_off", &r[1], &rp[1]);
        bench_json_num(j, "speedup_requests_per_s", sp);
        bench_json_num(j, "peak_blocks_ratio_on_off", mem);
    }
    bench_workload_free(&w);

out_json:
    bench_json_end(j); /* prefix_sharing */
out:
    bench_model_free(&bm);
    if (rc == 0)
        rc = section_parallel(c);
    return rc;
}

/* Parallel sampling: n = 4 samples sharing the prompt's blocks (fork +
 * copy-on-write) vs 4 independent requests of the same prompt, prefix
 * caching off in both so the fork is the only sharing; the pool is ample so
 * the peak measures need, not a limit. "ideal" is the token-level saving
 * 1 - sum(P + n G) / sum(n (P + G)), before block rounding. */
static int run_parallel(bench_ctx *c, bench_model *bm, const bench_workload_spec *spec)
{
    const int32_t n = 4;
    bench_workload wa, wb;
    if (bench_make_workload(bm, spec, &wa) != 0)
        return -1;
    bench_workload_spec s2 = *spec;
    s2.n_requests = spec->n_requests * n;
    if (bench_make_workload(bm, &s2, &wb) != 0) {
        bench_workload_free(&wa);
        return -1;
    }
    /* the independent copy: request i of wa repeated n times */
    double tok_shared = 0.0, tok_indep = 0.0;
    for (int32_t i = 0; i < wb.n; i++) {
        int32_t src = i / n;
        wb.prompt_len[i] = wa.prompt_len[src];
        wb.output_len[i] = wa.output_len[src];
        free(wb.prompt_ids[i]);
        wb.prompt_ids[i] = malloc((size_t)wa.prompt_len[src] * sizeof(int32_t));
        if (!wb.prompt_ids[i]) {
            bench_workload_free(&wa);
            bench_workload_free(&wb);
            return -1;
        }
        memcpy(wb.prompt_ids[i], wa.prompt_ids[src], (size_t)wa.prompt_len[src] * sizeof(int32_t));
    }
    snprintf(wb.name, sizeof(wb.name), "%.24s-independent-x%d", wa.name, n);
    for (int32_t i = 0; i < wa.n; i++) {
        tok_shared += wa.prompt_len[i] + (double)n * wa.output_len[i];
        tok_indep += (double)n * (wa.prompt_len[i] + wa.output_len[i]);
    }
    double ideal = 1.0 - tok_shared / tok_indep;
    bench_result ra, rb;
    bench_run_params pa = bench_run_params_default(bm), pb;
    pa.prefix_caching = false;
    pa.temperature = 1.0f;
    pa.seed = 7;
    pb = pa;
    pa.n = n;
    /* fan-out (vLLM v1): the same n=4 requests as 4 child requests each,
     * sharing the prompt's full blocks through the prefix cache */
    bench_result rf;
    bench_run_params pf = pa;
    pf.n = n;
    pf.prefix_caching = true;
    pf.fan_out_always = true;
    int rc = bench_run_or_report(bm, &wa, &pa, &ra);
    if (rc == 0)
        rc = bench_run_or_report(bm, &wb, &pb, &rb);
    if (rc == 0)
        rc = bench_run_or_report(bm, &wa, &pf, &rf);
    if (rc == 0) {
        printf("  %-11s %-9s n=4 fork: peak blocks %5d, %llu prompt tokens computed, %.0f tok/s; "
               "fan-out: peak blocks %5d, %llu prompt tokens computed (%llu prefix hits), "
               "%.0f tok/s\n", bm->name, wa.name, ra.stats.blocks_in_use_peak,
               (unsigned long long)ra.stats.prompt_tokens, ra.gen_tok_s,
               rf.stats.blocks_in_use_peak, (unsigned long long)rf.stats.prompt_tokens,
               (unsigned long long)rf.stats.prefix_cache_hits, rf.gen_tok_s);
        double saved = rb.stats.blocks_in_use_peak > 0
                           ? 1.0 - (double)ra.stats.blocks_in_use_peak / rb.stats.blocks_in_use_peak
                           : (double)NAN;
        printf("  %-11s %-9s %3d prompts, mean P %5.1f G %5.1f: n=4 peak blocks %5d (CoW %llu, "
               "%.0f tok/s) vs 4 independent %5d (%.0f tok/s): saved %.1f%% (ideal %.1f%%)\n",
               bm->name, wa.name, wa.n, wa.mean_prompt, wa.mean_output,
               ra.stats.blocks_in_use_peak, (unsigned long long)ra.stats.cow_copies, ra.gen_tok_s,
               rb.stats.blocks_in_use_peak, rb.gen_tok_s, 100.0 * saved, 100.0 * ideal);
        bench_check(c, ra.stats.blocks_in_use_peak < rb.stats.blocks_in_use_peak,
              "parallel sampling did not use fewer blocks than independent requests");
        bench_json *j = c->j;
        bench_json_obj(j, NULL);
        bench_json_str(j, "model", bm->name);
        bench_json_workload(j, "workload", &wa);
        bench_json_result(j, "shared_n4", &ra, &pa);
        bench_json_result(j, "independent", &rb, &pb);
        bench_json_result(j, "fan_out_n4", &rf, &pf);
        bench_json_num(j, "memory_saved_fraction", saved);
        bench_json_num(j, "ideal_token_saving_fraction", ideal);
        bench_json_end(j);
    }
    bench_workload_free(&wa);
    bench_workload_free(&wb);
    return rc;
}

static int section_parallel(bench_ctx *c)
{
    /* ShareGPT-like at half scale keeps the paper's input/output ratio inside
     * the 15m model's 256 context; Alpaca-like as drawn. */
    static const bench_workload_spec full_specs[] = {
        {"sharegpt", BENCH_DIST_SHAREGPT, 32, 0, 0, 0.5, 0, 51},
        {"alpaca", BENCH_DIST_ALPACA, 32, 0, 0, 0, 0, 52},
        {"fixed", BENCH_DIST_FIXED, 16, 120, 64, 0, 0, 53},
    };
    static const bench_workload_spec quick_specs[] = {
        {"alpaca", BENCH_DIST_ALPACA, 8, 0, 0, 0, 0, 52},
        {"fixed", BENCH_DIST_FIXED, 4, 40, 16, 0, 0, 53},
    };
    const bench_workload_spec *specs = c->quick ? quick_specs : full_specs;
    size_t n = c->quick ? 2 : 3;
    printf("  parallel sampling (n=4, temperature 1, seeded) vs 4 independent requests of the "
           "same prompt, prefix caching off in both:\n");
    int32_t ctx = 0;
    if (bench_config_ctx(c, "15m", &ctx) != 0)
        return -1;
    bench_model bm;
    bool skipped;
    /* ample: every request's 4 sequences at full context at once */
    int32_t blocks = 4 * 32 * bench_ceil_div(ctx > 0 ? ctx : 256, 16) + 16;
    int rc = bench_load(c, "15m", &bm, blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    rc = bench_warm_up(&bm);
    bench_json_arr(c->j, "parallel_sampling");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = run_parallel(c, &bm, &specs[i]);
    bench_json_end(c->j);
    bench_model_free(&bm);
    return rc;
}
