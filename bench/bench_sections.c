/* bench_sections: pagedgen_bench's sections (see bench_sections.h and the
 * usage comment in pagedgen_bench.c). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_engine.h"
#include "bench_machine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

#define MAX_PATH BENCH_MAX_PATH

/* Issue 4's targets, generated tokens/s on this class of machine. */
static const int32_t target_batch[] = {1, 64, 128};
static const double target_gen_tok_s[] = {45.0, 400.0, 450.0};

/* ---- small helpers -------------------------------------------------------- */

bool bench_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The folder of model `name` ("15m", "110m", "gqa-110m", "stories260K"). */
static void model_path(const bench_ctx *c, const char *name, char *out, size_t cap)
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

static void check(bench_ctx *c, bool ok, const char *what)
{
    if (!ok) {
        c->checks_failed++;
        printf("  CHECK FAILED: %s\n", what);
    }
}

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* The context of model `name` from its config.json; 0 when the model is
 * missing (the caller's load_model then reports the skip). */
static int model_ctx(const bench_ctx *c, const char *name, int32_t *ctx)
{
    char dir[MAX_PATH + 64], cfgp[MAX_PATH + 96];
    model_path(c, name, dir, sizeof(dir));
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
static int load_model(bench_ctx *c, const char *name, bench_model *bm, int32_t num_blocks,
                      int32_t max_num_seqs, bool *skipped)
{
    char dir[MAX_PATH + 64], cfg[MAX_PATH + 96];
    model_path(c, name, dir, sizeof(dir));
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
static int make_workload(const bench_model *bm, const bench_workload_spec *s, bench_workload *w)
{
    return bench_workload_make(w, s, bench_model_ctx(bm), bm->cfg.vocab_size);
}

/* Runs w with rp; on failure says which workload on which model failed. */
static int run_or_report(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
                         bench_result *r)
{
    pg_error err = {{0}};
    int rc = bench_run(bm, w, rp, r, &err);
    if (rc != 0)
        fprintf(stderr, "pagedgen_bench: %s on %s: %s\n", w->name, bm->name, err.msg);
    return rc;
}

/* Makes spec s's workload, runs it with rp into *out and frees it — unless
 * keep is given and the run succeeded: then *keep holds the workload and the
 * caller frees it. Returns 0, or -1 / the run's error (workload freed). */
static int run_workload(bench_model *bm, const bench_workload_spec *s, const bench_run_params *rp,
                        bench_result *out, bench_workload *keep)
{
    bench_workload w;
    if (make_workload(bm, s, &w) != 0)
        return -1;
    int rc = run_or_report(bm, &w, rp, out);
    if (rc == 0 && keep)
        *keep = w;
    else
        bench_workload_free(&w);
    return rc;
}

/* Runs w twice, with rp[0] then rp[1] (paged/contiguous, caching on/off),
 * stopping at the first failure. */
static int run_pair(bench_model *bm, const bench_workload *w, const bench_run_params rp[2],
                    bench_result r[2])
{
    int rc = run_or_report(bm, w, &rp[0], &r[0]);
    if (rc == 0)
        rc = run_or_report(bm, w, &rp[1], &r[1]);
    return rc;
}

/* A short run so that page faults, pool start-up and caches are out of the
 * way before anything is timed. */
static int warm_up(bench_model *bm)
{
    bench_workload_spec s = {.name = "warm-up", .dist = BENCH_DIST_FIXED, .n_requests = 2,
                             .prompt_len = 8, .output_len = 4, .seed = 99};
    bench_run_params rp = bench_run_params_default(bm);
    bench_result r;
    return run_workload(bm, &s, &rp, &r, NULL);
}

static void json_workload(bench_json *j, const char *key, const bench_workload *w)
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

static void json_result(bench_json *j, const char *key, const bench_result *r,
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

static void json_model(bench_json *j, const bench_model *bm)
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

/* ---- section: machine ceilings --------------------------------------------- */

void bench_section_machine(bench_ctx *c)
{
    bench_machine *m = &c->mach;
    printf("== machine: %s, %d cores online, %.1f GiB; cpu_gemm ISA %s\n", m->cpu_model,
           m->online_cores, m->mem_total_gib, m->gemm_isa);
    if (bench_machine_measure(m, c->threads, c->quick) != 0)
        printf("  (some ceilings could not be measured: allocation failed)\n");
    printf("  sgemm peak (OpenBLAS cblas_sgemm %dx%d, %d threads): %8.1f GFLOP/s\n", m->sgemm_n,
           m->sgemm_n, m->threads, m->sgemm_gflops);
    printf("  project cpu_gemm M=%d N=%d K=%d:                %8.1f GFLOP/s\n", m->pgemm_m,
           m->pgemm_n, m->pgemm_k, m->pgemm_gflops);
    printf("  project cpu_gemm M=1 (weight-streaming):          %8.1f GFLOP/s\n",
           m->pgemm_m1_gflops);
    printf("  memory bandwidth (%zu MiB arrays): read %.1f GB/s, triad %.1f GB/s\n",
           m->stream_bytes >> 20, m->read_gbs, m->triad_gbs);

    bench_json *j = c->j;
    bench_json_obj(j, "machine");
    bench_json_str(j, "cpu_model", m->cpu_model);
    bench_json_int(j, "online_cores", m->online_cores);
    bench_json_num(j, "mem_total_gib", m->mem_total_gib);
    bench_json_str(j, "cpu_gemm_isa", m->gemm_isa);
    bench_json_int(j, "threads", m->threads);
    bench_json_int(j, "sgemm_n", m->sgemm_n);
    bench_json_num(j, "sgemm_gflops", m->sgemm_gflops);
    bench_json_arr(j, "project_gemm_shape_mnk");
    bench_json_int(j, NULL, m->pgemm_m);
    bench_json_int(j, NULL, m->pgemm_n);
    bench_json_int(j, NULL, m->pgemm_k);
    bench_json_end(j);
    bench_json_num(j, "project_gemm_gflops", m->pgemm_gflops);
    bench_json_num(j, "project_gemm_m1_gflops", m->pgemm_m1_gflops);
    bench_json_int(j, "stream_bytes", (int64_t)m->stream_bytes);
    bench_json_num(j, "read_gbs", m->read_gbs);
    bench_json_num(j, "triad_gbs", m->triad_gbs);
    bench_json_end(j);
}

/* ---- section: throughput (Issue 4) ----------------------------------------- */

static double target_for(int32_t batch)
{
    for (size_t i = 0; i < sizeof(target_batch) / sizeof(target_batch[0]); i++)
        if (target_batch[i] == batch)
            return target_gen_tok_s[i];
    return (double)NAN;
}

int bench_section_throughput(bench_ctx *c)
{
    static const int32_t full_batches[] = {1, 8, 32, 64, 128};
    static const int32_t quick_batches[] = {1, 8};
    const int32_t *batches = c->quick ? quick_batches : full_batches;
    int32_t n_batches = c->quick ? 2 : 5;
    if (c->n_batches > 0) {
        batches = c->batches;
        n_batches = c->n_batches;
    }
    int32_t P = c->quick ? 16 : 128, G = c->quick ? 16 : 128;
    int32_t max_batch = 1;
    for (int32_t i = 0; i < n_batches; i++)
        max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    int32_t blocks_per_req = ceil_div(P + G, 16);
    int32_t num_blocks = max_batch * blocks_per_req + 16;

    printf("\n== throughput (Issue 4): prompt %d / output %d, ignore EOS, greedy, %d threads, "
           "batch = requests = max_num_seqs\n", P, G, c->threads);
    bench_model bm;
    bool skipped;
    int rc = load_model(c, "110m", &bm, num_blocks, max_batch, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = warm_up(&bm)) != 0)
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
    bench_json_obj(j, "throughput");
    json_model(j, &bm);
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
        if ((rc = run_workload(&bm, &s, &rp, &r, NULL)) != 0)
            break;
        double frac_peak = peak > 0.0 ? r.gflops / peak : (double)NAN;
        double frac_sgemm = c->mach.sgemm_gflops > 0.0 ? r.gflops / c->mach.sgemm_gflops : (double)NAN;
        double frac_pgemm = c->mach.pgemm_gflops > 0.0 ? r.gflops / c->mach.pgemm_gflops : (double)NAN;
        double tgt = target_for(B);
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
        json_result(j, "result", &r, &rp);
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
        printf("  targets (Issue 4): >= 45 gen tok/s at batch 1, >= 400 at 64, >= 450 at 128\n");
        bench_json_int(j, "peak_rss_bytes", (int64_t)rss);
        bench_json_num(j, "weights_plus_kv_bytes", budget);
        bench_chart ch = {.title = "generated tokens/s vs batch (110m, P128/G128)",
                          .x_label = "batch (requests = max_num_seqs)",
                          .y_label = "generated tokens/s", .log2_x = true, .n_series = 1};
        ch.series[0] = (bench_series){.name = bm.name, .n = n_batches, .x = xs, .y = ys};
        char path[MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/throughput_batch.svg", c->out_dir);
        bench_svg_write(path, &ch);
    }
    bench_json_end(j); /* throughput */
out:
    bench_model_free(&bm);
    return rc;
}

/* ---- section: paged vs contiguous (Issue 7) --------------------------------- */

typedef struct paged_case {
    const char *model;
    bench_workload_spec spec;
    int32_t contiguous_seqs;  /* KV budget = this many contiguous reservations */
} paged_case;

static int run_paged_case(bench_ctx *c, const paged_case *pc)
{
    bench_model bm;
    bool skipped;
    /* the budget needs the context, which needs the config: read it first */
    int32_t ctx = 0;
    if (model_ctx(c, pc->model, &ctx) != 0)
        return -1;
    if (ctx == 0) {
        printf("  (model %s not found: skipped)\n", pc->model);
        return 0;
    }
    int32_t reserve = ceil_div(ctx, 16);
    int32_t num_blocks = reserve * pc->contiguous_seqs;
    int rc = load_model(c, pc->model, &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = warm_up(&bm)) != 0)
        goto out;
    bench_workload w;
    if (make_workload(&bm, &pc->spec, &w) != 0) { /* ctx == bench_model_ctx(&bm) */
        rc = -1;
        goto out;
    }
    bench_result r[2];
    bench_run_params rp[2];
    for (int k = 0; k < 2; k++) {
        rp[k] = bench_run_params_default(&bm);
        rp[k].num_blocks = num_blocks;
        rp[k].max_num_seqs = 256;
        rp[k].layout = k == 0 ? KV_LAYOUT_PAGED : KV_LAYOUT_CONTIGUOUS;
    }
    rc = run_pair(&bm, &w, rp, r);
    if (rc == 0) {
        double kv_mib = (double)bm.kv_bytes_per_block * num_blocks / 1048576.0;
        printf("  %-11s %-9s %4d req, mean P %5.1f G %5.1f%s | KV %d blocks (%.1f MiB, %d x "
               "ctx %d)\n", bm.name, w.name, w.n, w.mean_prompt, w.mean_output,
               w.n_truncated ? " (some truncated)" : "", num_blocks, kv_mib, pc->contiguous_seqs,
               ctx);
        for (int k = 0; k < 2; k++) {
            const engine_stats *s = &r[k].stats;
            printf("    %-10s %8.2f req/s %9.1f gen tok/s %8.2f s  peak seqs %4d  mean run "
                   "%6.1f  KV util %5.1f%%  pool %5.1f%%  preempt %4llu\n",
                   k == 0 ? "paged" : "contiguous", r[k].req_per_s, r[k].gen_tok_s, r[k].wall_s,
                   s->peak_running_seqs, r[k].running_mean, 100.0 * s->kv_utilization_mean,
                   100.0 * r[k].occupancy_mean, (unsigned long long)s->preemptions);
        }
        double ratio_req = r[1].req_per_s > 0.0 ? r[0].req_per_s / r[1].req_per_s : (double)NAN;
        double ratio_tok = r[1].gen_tok_s > 0.0 ? r[0].gen_tok_s / r[1].gen_tok_s : (double)NAN;
        double ratio_seqs = r[1].stats.peak_running_seqs > 0
                                ? (double)r[0].stats.peak_running_seqs /
                                      (double)r[1].stats.peak_running_seqs
                                : (double)NAN;
        printf("    paged/contiguous: %.2fx req/s, %.2fx gen tok/s, %.2fx peak concurrent seqs\n",
               ratio_req, ratio_tok, ratio_seqs);
        /* the baseline is faithful: never more than budget / reservation at once */
        check(c, r[1].stats.peak_running_seqs <= pc->contiguous_seqs,
              "contiguous layout ran more sequences than its reservations allow");
        check(c, r[0].stats.peak_running_seqs >= r[1].stats.peak_running_seqs,
              "paged layout ran fewer concurrent sequences than contiguous at the same budget");
        check(c, r[0].stats.kv_utilization_mean > 0.0 && r[0].stats.kv_utilization_mean <= 1.0,
              "paged KV utilization outside (0, 1]");
        bench_json *j = c->j;
        bench_json_obj(j, NULL);
        bench_json_str(j, "model", bm.name);
        bench_json_int(j, "context", ctx);
        bench_json_int(j, "kv_budget_blocks", num_blocks);
        bench_json_num(j, "kv_budget_bytes", (double)bm.kv_bytes_per_block * num_blocks);
        bench_json_int(j, "contiguous_reservation_blocks", reserve);
        json_workload(j, "workload", &w);
        json_result(j, "paged", &r[0], &rp[0]);
        json_result(j, "contiguous", &r[1], &rp[1]);
        bench_json_num(j, "ratio_requests_per_s", ratio_req);
        bench_json_num(j, "ratio_generated_tok_per_s", ratio_tok);
        bench_json_num(j, "ratio_peak_running_seqs", ratio_seqs);
        bench_json_end(j);
    }
    bench_workload_free(&w);
out:
    bench_model_free(&bm);
    return rc;
}

int bench_section_paged(bench_ctx *c)
{
    printf("\n== paged vs contiguous (Issue 7): same KV budget, same FCFS scheduler, all "
           "requests at t=0, greedy, ignore EOS\n");
    printf("  contiguous = each request reserves ceil(context/16) blocks at admission; the "
           "budget fits that many reservations\n");
    printf("  paper (vLLM vs Orca/FasterTransformer): 2-4x throughput at the same latency; "
           "KV waste 60-80%% -> < 4%%\n");
    /* ShareGPT scaled by ctx/2048 keeps the paper's length-to-context ratio
     * (its OPT models have 2048 context) on the 256-context 15m model. */
    static const paged_case full_cases[] = {
        {"15m", {"fixed", BENCH_DIST_FIXED, 96, 48, 80, 0, 0, 11}, 8},
        {"15m", {"sharegpt", BENCH_DIST_SHAREGPT, 128, 0, 0, 256.0 / 2048.0, 0, 12}, 8},
        {"15m", {"alpaca", BENCH_DIST_ALPACA, 128, 0, 0, 0, 0, 13}, 8},
        {"110m", {"alpaca", BENCH_DIST_ALPACA, 24, 0, 0, 0, 0, 14}, 4},
        {"gqa-110m", {"alpaca", BENCH_DIST_ALPACA, 24, 0, 0, 0, 0, 14}, 4},
        {"stories260K", {"sharegpt", BENCH_DIST_SHAREGPT, 128, 0, 0, 0, 0, 16}, 4},
        {"stories260K", {"alpaca", BENCH_DIST_ALPACA, 256, 0, 0, 0, 0, 17}, 4},
    };
    static const paged_case quick_cases[] = {
        {"stories260K", {"fixed", BENCH_DIST_FIXED, 32, 24, 40, 0, 0, 11}, 4},
        {"stories260K", {"alpaca", BENCH_DIST_ALPACA, 48, 0, 0, 0, 0, 13}, 4},
    };
    const paged_case *cases = c->quick ? quick_cases : full_cases;
    size_t n = c->quick ? sizeof(quick_cases) / sizeof(quick_cases[0])
                        : sizeof(full_cases) / sizeof(full_cases[0]);
    bench_json_arr(c->j, "paged_vs_contiguous");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = run_paged_case(c, &cases[i]);
    bench_json_end(c->j);
    return rc;
}

/* ---- section: scaling -------------------------------------------------------- */

int bench_section_scaling(bench_ctx *c)
{
    const char *name = "15m";
    int32_t P = c->quick ? 16 : 32, G = c->quick ? 16 : 64;
    int32_t max_mns = c->quick ? 16 : 256;
    printf("\n== scaling: throughput vs max_num_seqs (fixed P%d/G%d, requests = max(16, 2 x "
           "max_num_seqs), KV ample) and vs KV budget\n", P, G);
    int32_t blocks_per_req = ceil_div(P + G, 16);
    bench_model bm;
    bool skipped;
    /* the budget sweep below needs up to 32 context reservations */
    int32_t ctx = 0;
    if (model_ctx(c, name, &ctx) != 0)
        return -1;
    int32_t num_blocks = max_mns * blocks_per_req + 16;
    if (num_blocks < 32 * ceil_div(ctx, 16))
        num_blocks = 32 * ceil_div(ctx, 16);
    int rc = load_model(c, name, &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = warm_up(&bm)) != 0)
        goto out;
    bench_json *j = c->j;
    bench_json_obj(j, "scaling");
    json_model(j, &bm);

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
        rc = run_workload(&bm, &s, &rp, &r, &w);
        if (rc == 0) {
            printf("  %8d %6d %10.1f %9.2f %8.2f\n", mns, nreq, r.gen_tok_s, r.req_per_s,
                   r.wall_s);
            xs[npts] = mns;
            ys[npts] = r.gen_tok_s;
            yr[npts] = r.req_per_s;
            npts++;
            bench_json_obj(j, NULL);
            json_workload(j, "workload", &w);
            json_result(j, "result", &r, &rp);
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
        char path[MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/scaling_max_num_seqs.svg", c->out_dir);
        bench_svg_write(path, &ch);
    }
    (void)yr;

    /* vs KV budget: an Alpaca-like mix; budget in context reservations */
    int32_t reserve = ceil_div(bench_model_ctx(&bm), 16);
    static const int32_t full_mult[] = {2, 4, 8, 16, 32};
    static const int32_t quick_mult[] = {2, 8};
    const int32_t *mult = c->quick ? quick_mult : full_mult;
    int32_t nm = c->quick ? 2 : 5;
    bench_workload_spec s = {.name = "alpaca", .dist = BENCH_DIST_ALPACA,
                             .n_requests = c->quick ? 32 : 128, .seed = 22};
    bench_workload w;
    if (rc == 0 && make_workload(&bm, &s, &w) != 0)
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
            if ((rc = run_pair(&bm, &w, rp, r)) != 0)
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
            json_result(j, "paged", &r[0], &rp[0]);
            json_result(j, "contiguous", &r[1], &rp[1]);
            bench_json_end(j);
        }
        bench_json_end(j);
        json_workload(j, "kv_budget_workload", &w);
        bench_workload_free(&w);
    }
    if (rc == 0 && nb > 0) {
        bench_chart ch = {.title = "throughput vs KV budget (15m, Alpaca-like mix)",
                          .x_label = "KV cache budget (MiB)", .y_label = "generated tokens/s",
                          .log2_x = true, .n_series = 2};
        ch.series[0] = (bench_series){.name = "paged", .n = nb, .x = bx, .y = by[0]};
        ch.series[1] = (bench_series){.name = "contiguous", .n = nb, .x = bx, .y = by[1]};
        char path[MAX_PATH + 32];
        snprintf(path, sizeof(path), "%s/scaling_kv_budget.svg", c->out_dir);
        bench_svg_write(path, &ch);
    }
    bench_json_end(j); /* scaling */
out:
    bench_model_free(&bm);
    return rc;
}

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
    int32_t per_req = ceil_div(prefix + uniq + G, 16);
    int32_t num_blocks = nreq * per_req * 4 + 64;
    int rc = load_model(c, "110m", &bm, num_blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    if ((rc = warm_up(&bm)) != 0)
        goto out;
    bench_json *j = c->j;
    bench_json_obj(j, "prefix_sharing");
    json_model(j, &bm);
    bench_json_str(j, "paper_shared_prefix_speedup", "1.67-3.58x");
    bench_json_str(j, "paper_parallel_sampling_memory_saved", "6-30%");
    bench_workload_spec s = {.name = "shared-prefix", .dist = BENCH_DIST_FIXED,
                             .n_requests = nreq, .prompt_len = prefix + uniq, .output_len = G,
                             .shared_prefix = prefix, .seed = 31};
    bench_workload w;
    if (make_workload(&bm, &s, &w) != 0) {
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
    rc = run_pair(&bm, &w, rp, r);
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
        check(c, r[0].stats.prefix_cache_hits > 0, "prefix caching on gave no cache hits");
        check(c, r[0].stats.prompt_tokens < r[1].stats.prompt_tokens,
              "prefix caching on computed as many prompt tokens as off");
        json_workload(j, "workload", &w);
        json_result(j, "caching_on", &r[0], &rp[0]);
        json_result(j, "caching_off", &r[1], &rp[1]);
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
    if (make_workload(bm, spec, &wa) != 0)
        return -1;
    bench_workload_spec s2 = *spec;
    s2.n_requests = spec->n_requests * n;
    if (make_workload(bm, &s2, &wb) != 0) {
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
    int rc = run_or_report(bm, &wa, &pa, &ra);
    if (rc == 0)
        rc = run_or_report(bm, &wb, &pb, &rb);
    if (rc == 0)
        rc = run_or_report(bm, &wa, &pf, &rf);
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
        check(c, ra.stats.blocks_in_use_peak < rb.stats.blocks_in_use_peak,
              "parallel sampling did not use fewer blocks than independent requests");
        bench_json *j = c->j;
        bench_json_obj(j, NULL);
        bench_json_str(j, "model", bm->name);
        json_workload(j, "workload", &wa);
        json_result(j, "shared_n4", &ra, &pa);
        json_result(j, "independent", &rb, &pb);
        json_result(j, "fan_out_n4", &rf, &pf);
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
    if (model_ctx(c, "15m", &ctx) != 0)
        return -1;
    bench_model bm;
    bool skipped;
    /* ample: every request's 4 sequences at full context at once */
    int32_t blocks = 4 * 32 * ceil_div(ctx > 0 ? ctx : 256, 16) + 16;
    int rc = load_model(c, "15m", &bm, blocks, 256, &skipped);
    if (rc != 0 || skipped)
        return rc;
    rc = warm_up(&bm);
    bench_json_arr(c->j, "parallel_sampling");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = run_parallel(c, &bm, &specs[i]);
    bench_json_end(c->j);
    bench_model_free(&bm);
    return rc;
}
