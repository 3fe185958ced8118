/* bench_sec_sampling: the "sampling" section of pagedgen_bench (issue 30
 * item 7) — what a sampled row costs beside a greedy one on the host
 * sampler (core/sampler.c, common/pg_sample.h), where the vocabulary
 * dominates: a Qwen3-vocabulary model (V = 151,936) with tiny layers
 * (scripts/make-synthetic-qwen --preset tiny-qwen3 --vocab 151936
 * build/models/tiny-qwen3-v152k), 32 requests x 64 generated tokens
 * (prompts of 16), one thread, three runs over the same workload:
 *   greedy        temperature 0 (the argmax of each row),
 *   t0.8          temperature 0.8 (softmax weights of every token and a draw),
 *   t0.8 top-p    temperature 0.8, top_p 0.95 (+ the top-p cut),
 * each the best of `rounds` interleaved rounds, and the ratio of the
 * sampled runs' generated tok/s to greedy's (target >= 0.7x) — by wall
 * time and by the process's CPU time (one thread: the CPU time is the
 * run's work without the time other processes took the core, the figure
 * to compare on a loaded machine). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench_engine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

#define SAMPLING_MODEL "tiny-qwen3-v152k"

enum { RUN_GREEDY, RUN_TEMP, RUN_TOP_P, N_RUNS };
static const char *const run_name[N_RUNS] = {"greedy", "t0.8", "t0.8_top_p0.95"};

int bench_section_sampling(bench_ctx *c)
{
    const int rounds = c->quick ? 1 : 3;
    printf("\n== sampling (issue 30): greedy vs sampled rows on a large vocabulary, one thread "
           "(best of %d)\n", rounds);
    char dir[BENCH_MAX_PATH + 64], cfg[BENCH_MAX_PATH + 96];
    bench_model_path(c, SAMPLING_MODEL, dir, sizeof(dir));
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (!bench_file_exists(cfg)) {
        printf("  (model %s not found at %s: skipped; make it with scripts/make-synthetic-qwen "
               "--preset tiny-qwen3 --vocab 151936 %s)\n", SAMPLING_MODEL, dir, dir);
        return 0;
    }
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    model_params mp = {.num_kv_blocks = 512, .block_size = 16, .max_num_batched_tokens = 2048,
                       .max_num_seqs = 32};
    pg_error err = {{0}};
    int rc = bench_model_load(&bm, dir, 1, &mp, &err);
    if (rc != 0) {
        fprintf(stderr, "pagedgen_bench: loading %s: %s\n", dir, err.msg);
        return rc;
    }
    if ((rc = bench_warm_up(&bm)) != 0)
        goto out;
    bench_workload w;
    bench_workload_spec s = {.name = "fixed", .dist = BENCH_DIST_FIXED, .n_requests = 32,
                             .prompt_len = 16, .output_len = 64, .seed = 71};
    if (bench_make_workload(&bm, &s, &w) != 0) {
        rc = -1;
        goto out;
    }
    bench_result r[N_RUNS];
    double cpu[N_RUNS] = {0.0};
    memset(r, 0, sizeof r);
    for (int k = 0; k < rounds && rc == 0; k++)
        for (int i = 0; i < N_RUNS && rc == 0; i++) {
            bench_run_params rp = bench_run_params_default(&bm);
            rp.temperature = i == RUN_GREEDY ? 0.0f : 0.8f;
            rp.top_p = i == RUN_TOP_P ? 0.95f : 0.0f;
            rc = bench_run_keep_best(&bm, &w, &rp, &r[i], &cpu[i]);
        }
    if (rc == 0) {
        bench_json_obj(c->j, "sampling");
        bench_json_model(c->j, &bm);
        bench_json_workload(c->j, "workload", &w);
        printf("  %s (V = %d): 32 requests x 64 tokens (prompt 16), 1 thread\n", bm.name,
               (int)bm.cfg.vocab_size);
        const double gen = (double)r[RUN_GREEDY].stats.generated_tokens;
        for (int i = 0; i < N_RUNS; i++) {
            double ratio = r[i].gen_tok_s / r[RUN_GREEDY].gen_tok_s;
            double cpu_tok = cpu[i] > 0.0 ? gen / cpu[i] : 0.0;
            printf("    %-15s %8.3f s  %9.1f generated tok/s  %5.2fx greedy | CPU %7.3f s  %9.1f tok/s "
                   "of CPU  %5.2fx greedy\n", run_name[i], r[i].wall_s, r[i].gen_tok_s, ratio, cpu[i],
                   cpu_tok, cpu[RUN_GREEDY] / cpu[i]);
            bench_json_obj(c->j, run_name[i]);
            bench_json_num(c->j, "wall_s", r[i].wall_s);
            bench_json_num(c->j, "gen_tok_per_s", r[i].gen_tok_s);
            bench_json_num(c->j, "over_greedy", ratio);
            bench_json_num(c->j, "cpu_s", cpu[i]);
            bench_json_num(c->j, "cpu_over_greedy", cpu[RUN_GREEDY] / cpu[i]);
            bench_json_end(c->j);
        }
        printf("  sampled (temperature 0.8) / greedy: %.2fx generated tok/s by wall time, %.2fx by CPU "
               "time (target >= 0.7x)\n", r[RUN_TEMP].gen_tok_s / r[RUN_GREEDY].gen_tok_s,
               cpu[RUN_GREEDY] / cpu[RUN_TEMP]);
        bench_json_end(c->j);
    }
    bench_workload_free(&w);
out:
    bench_model_free(&bm);
    return rc;
}
