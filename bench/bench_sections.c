/* bench_sections: what every section of pagedgen_bench shares — model
 * folders, loading, running a workload, the JSON objects of a model, a
 * workload and a result (see bench_sections.h). Each section lives in its
 * own bench_sec_<name>.c. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_engine.h"
#include "bench_machine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"
#include <sys/stat.h>

bool bench_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The folder of model `name` ("15m", "110m", "gqa-110m", "stories260K"). */
void bench_model_path(const bench_ctx *c, const char *name, char *out, size_t cap)
{
    if (c->single_model)
        snprintf(out, cap, "%s", c->model_dir);
    else if (strcmp(name, "stories260K") == 0)
        snprintf(out, cap, "%s/models/stories260K", c->shared_dir);
    else
        snprintf(out, cap, "%s/%s", c->model_dir, name);
}

bool bench_section_on(const bench_ctx *c, const char *name)
{
    return !c->only || strcmp(c->only, name) == 0;
}

void bench_check(bench_ctx *c, bool ok, const char *what)
{
    if (!ok) {
        c->checks_failed++;
        printf("  CHECK FAILED: %s\n", what);
    }
}


/* The context of model `name` from its config.json; 0 when the model is
 * missing (the caller's load_model then reports the skip). */
int bench_config_ctx(const bench_ctx *c, const char *name, int32_t *ctx)
{
    char dir[BENCH_MAX_PATH + 64], cfgp[BENCH_MAX_PATH + 96];
    bench_model_path(c, name, dir, sizeof(dir));
    snprintf(cfgp, sizeof(cfgp), "%s/config.json", dir);
    *ctx = 0;
    if (!bench_file_exists(cfgp))
        return 0;
    llama_config cfg;
    pg_error err = {{0}};
    if (llama_config_load(&cfg, dir, &err) != 0) {
        fprintf(stderr, "pagedgen_bench: %s\n", err.msg);
        return -1;
    }
    *ctx = cfg.max_position_embeddings;
    return 0;
}

/* Loads a model, or reports why not (missing synthetic models are skipped). */
int bench_load(bench_ctx *c, const char *name, bench_model *bm, int32_t num_blocks,
                      int32_t max_num_seqs, bool *skipped)
{
    char dir[BENCH_MAX_PATH + 64], cfg[BENCH_MAX_PATH + 96];
    bench_model_path(c, name, dir, sizeof(dir));
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    *skipped = false;
    if (!bench_file_exists(cfg)) {
        printf("  (model %s not found at %s: skipped; scripts/bench generates it)\n", name, dir);
        *skipped = true;
        return 0;
    }
    model_params mp = {.num_kv_blocks = num_blocks, .block_size = 16,
                       .max_num_batched_tokens = 2048, .max_num_seqs = max_num_seqs};
    pg_error err = {{0}};
    int rc = bench_model_load(bm, dir, c->threads, &mp, &err);
    if (rc != 0)
        fprintf(stderr, "pagedgen_bench: loading %s: %s\n", dir, err.msg);
    return rc;
}

/* Draws spec s for bm's context and vocabulary; 0, or -1 (out of memory). */
int bench_make_workload(const bench_model *bm, const bench_workload_spec *s, bench_workload *w)
{
    return bench_workload_make(w, s, bench_model_ctx(bm), bm->cfg.vocab_size);
}

/* Runs w with rp; on failure says which workload on which model failed. */
int bench_run_or_report(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
                         bench_result *r)
{
    pg_error err = {{0}};
    int rc = bench_run(bm, w, rp, r, &err);
    if (rc != 0)
        fprintf(stderr, "pagedgen_bench: %s on %s: %s\n", w->name, bm->name, err.msg);
    return rc;
}

double bench_process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int bench_run_keep_best(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
                        bench_result *best, double *best_cpu_s)
{
    bench_result x;
    const double c0 = bench_process_cpu_s();
    int rc = bench_run_or_report(bm, w, rp, &x);
    const double c1 = bench_process_cpu_s() - c0;
    if (rc == 0 && (best->wall_s == 0.0 || x.wall_s < best->wall_s))
        *best = x;
    if (rc == 0 && (*best_cpu_s == 0.0 || c1 < *best_cpu_s))
        *best_cpu_s = c1;
    return rc;
}

int bench_two_batches(const bench_ctx *c, int32_t batches[2])
{
    batches[0] = 1;
    batches[1] = c->quick ? 8 : 64;
    if (c->n_batches <= 0)
        return 2;
    const int n = c->n_batches < 2 ? c->n_batches : 2;
    for (int i = 0; i < n; i++)
        batches[i] = c->batches[i];
    return n;
}

/* Makes spec s's workload, runs it with rp into *out and frees it — unless
 * keep is given and the run succeeded: then *keep holds the workload and the
 * caller frees it. Returns 0, or -1 / the run's error (workload freed). */
int bench_run_workload(bench_model *bm, const bench_workload_spec *s, const bench_run_params *rp,
                        bench_result *out, bench_workload *keep)
{
    bench_workload w;
    if (bench_make_workload(bm, s, &w) != 0)
        return -1;
    int rc = bench_run_or_report(bm, &w, rp, out);
    if (rc == 0 && keep)
        *keep = w;
    else
        bench_workload_free(&w);
    return rc;
}

/* Runs w twice, with rp[0] then rp[1] (paged/contiguous, caching on/off),
 * stopping at the first failure. */
int bench_run_pair(bench_model *bm, const bench_workload *w, const bench_run_params rp[2],
                    bench_result r[2])
{
    int rc = bench_run_or_report(bm, w, &rp[0], &r[0]);
    if (rc == 0)
        rc = bench_run_or_report(bm, w, &rp[1], &r[1]);
    return rc;
}

/* A short run so that page faults, pool start-up and caches are out of the
 * way before anything is timed. */
int bench_warm_up(bench_model *bm)
{
    bench_workload_spec s = {.name = "warm-up", .dist = BENCH_DIST_FIXED, .n_requests = 2,
                             .prompt_len = 8, .output_len = 4, .seed = 99};
    bench_run_params rp = bench_run_params_default(bm);
    bench_result r;
    return bench_run_workload(bm, &s, &rp, &r, NULL);
}

void bench_json_workload(bench_json *j, const char *key, const bench_workload *w)
{
    bench_json_obj(j, key);
    bench_json_str(j, "name", w->name);
    bench_json_int(j, "requests", w->n);
    bench_json_num(j, "mean_prompt", w->mean_prompt);
    bench_json_num(j, "mean_output", w->mean_output);
    bench_json_int(j, "max_prompt", w->max_prompt);
    bench_json_int(j, "max_output", w->max_output);
    bench_json_int(j, "truncated", w->n_truncated);
    bench_json_end(j);
}

void bench_json_result(bench_json *j, const char *key, const bench_result *r,
                        const bench_run_params *rp)
{
    const engine_stats *s = &r->stats;
    bench_json_obj(j, key);
    bench_json_str(j, "layout", rp->layout == KV_LAYOUT_PAGED ? "paged" : "contiguous");
    bench_json_int(j, "num_blocks", rp->num_blocks);
    bench_json_int(j, "max_num_seqs", rp->max_num_seqs);
    bench_json_int(j, "max_num_batched_tokens", rp->max_num_batched_tokens);
    bench_json_bool(j, "prefix_caching", rp->prefix_caching);
    bench_json_int(j, "n", rp->n);
    bench_json_bool(j, "fan_out_always", rp->fan_out_always);
    bench_json_num(j, "temperature", (double)rp->temperature);
    bench_json_int(j, "requests", r->requests);
    bench_json_int(j, "seqs", r->seqs);
    bench_json_num(j, "wall_s", r->wall_s);
    bench_json_num(j, "prefill_s", r->prefill_s);
    bench_json_num(j, "decode_s", r->decode_s);
    bench_json_num(j, "requests_per_s", r->req_per_s);
    bench_json_num(j, "generated_tok_per_s", r->gen_tok_s);
    bench_json_num(j, "prompt_tok_per_s", r->prompt_tok_s);
    bench_json_num(j, "decode_tok_per_s", r->decode_tok_s);
    bench_json_num(j, "model_gflop", r->flops * 1e-9);
    bench_json_num(j, "gflop_per_s", r->gflops);
    bench_json_int(j, "steps", (int64_t)s->steps);
    bench_json_int(j, "prompt_tokens", (int64_t)s->prompt_tokens);
    bench_json_int(j, "generated_tokens", (int64_t)s->generated_tokens);
    bench_json_int(j, "preemptions", (int64_t)s->preemptions);
    bench_json_int(j, "peak_running_seqs", s->peak_running_seqs);
    bench_json_num(j, "mean_running_requests", r->running_mean);
    bench_json_int(j, "blocks_in_use_peak", s->blocks_in_use_peak);
    bench_json_num(j, "pool_occupancy_mean", r->occupancy_mean);
    bench_json_num(j, "kv_utilization_mean", s->kv_utilization_mean);
    bench_json_int(j, "prefix_cache_queries", (int64_t)s->prefix_cache_queries);
    bench_json_int(j, "prefix_cache_hits", (int64_t)s->prefix_cache_hits);
    bench_json_int(j, "cow_copies", (int64_t)s->cow_copies);
    bench_json_end(j);
}

void bench_json_model(bench_json *j, const bench_model *bm)
{
    bench_json_obj(j, "model");
    bench_json_str(j, "name", bm->name);
    bench_json_str(j, "dir", bm->dir);
    bench_json_num(j, "params_total", bm->params_total);
    bench_json_num(j, "params_layers", bm->params_layers);
    bench_json_int(j, "weight_bytes", (int64_t)bm->weight_bytes);
    bench_json_int(j, "kv_bytes_per_block", (int64_t)bm->kv_bytes_per_block);
    bench_json_int(j, "block_size", bm->mp.block_size);
    bench_json_int(j, "context", bench_model_ctx(bm));
    bench_json_int(j, "n_layers", bm->cfg.num_hidden_layers);
    bench_json_int(j, "n_heads", bm->cfg.num_attention_heads);
    bench_json_int(j, "n_kv_heads", bm->cfg.num_key_value_heads);
    bench_json_num(j, "load_s", bm->load_s);
    bench_json_end(j);
}
