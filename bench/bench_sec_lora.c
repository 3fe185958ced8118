/* bench_sec_lora: the "lora" section of pagedgen_bench (issue 33 item 5) —
 * what LoRA adapters cost beside the base model on the CPU executor.
 *
 * The 110m model gets four synthetic rank-16 adapters
 * on all seven projections of every layer (A, B random, built in memory:
 * the section measures the forward, not the file reader), uploaded with
 * model_lora_add (its time per adapter is printed: the upload half of a
 * --lora load; the CLI's stderr line gives the whole load with the file).
 * Then, each the best of 3 interleaved rounds (1 with --quick):
 *   batch 64   64 requests x 64 generated tokens (prompts of 64), the base
 *              model vs the four adapters mixed evenly (request i under
 *              adapter 1 + i % 4, --max-loras 4), target >= 0.85x;
 *   batch 1    one request x 128 tokens (prompt 16), base vs one adapter,
 *              target >= 0.9x;
 * generated tok/s by wall time and by the process's CPU time (the steadier
 * figure on a loaded machine). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_engine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"
#include "lora_adapter.h"

#define LORA_RANK 16
#define LORA_N 4

/* A rank-16 adapter on every projection: A ~ U(-1,1)/sqrt(in), B ~ U(-0.05, 0.05). */
static lora_adapter *make_adapter(const llama_config *cfg, uint64_t seed)
{
    lora_adapter *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->r = LORA_RANK;
    a->lora_alpha = 32;
    a->max_rank = LORA_RANK;
    a->n_layers = cfg->num_hidden_layers;
    a->w = calloc((size_t)a->n_layers * LORA_NPROJ, sizeof *a->w);
    if (!a->w) {
        free(a);
        return NULL;
    }
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int32_t l = 0; l < a->n_layers; l++)
        for (int32_t p = 0; p < LORA_NPROJ; p++) {
            lora_weights *w = &a->w[(size_t)l * LORA_NPROJ + (size_t)p];
            lora_proj_dims(cfg, (lora_proj)p, &w->in, &w->out);
            w->r = LORA_RANK;
            w->scale = 2.0f;
            w->A = malloc(sizeof(float) * (size_t)w->r * (size_t)w->in);
            w->B = malloc(sizeof(float) * (size_t)w->out * (size_t)w->r);
            if (!w->A || !w->B) {
                lora_adapter_free(a);
                return NULL;
            }
            const float ia = 1.0f / sqrtf((float)w->in);
            for (size_t i = 0; i < (size_t)w->r * (size_t)w->in; i++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                w->A[i] = ((float)(s >> 40) / 8388608.0f - 1.0f) * ia;
            }
            for (size_t i = 0; i < (size_t)w->out * (size_t)w->r; i++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                w->B[i] = ((float)(s >> 40) / 8388608.0f - 1.0f) * 0.05f;
            }
            a->n_adapted++;
        }
    return a;
}

typedef struct lora_case {
    const char *name;
    bench_workload_spec spec;
    int32_t batch, n_loras;
    double target;
} lora_case;

int bench_section_lora(bench_ctx *c)
{
    const int rounds = c->quick ? 1 : 3;
    const char *name = "110m";
    printf("\n== lora (issue 33): %d rank-%d adapters on all seven projections vs the base model, %s "
           "(best of %d)\n", LORA_N, LORA_RANK, name, rounds);
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    bool skipped = false;
    int rc = bench_load(c, name, &bm, 1024, 64, &skipped);
    if (rc != 0 || skipped)
        return rc;
    double up_ms[LORA_N] = {0};
    for (int32_t k = 0; k < LORA_N && rc == 0; k++) {
        lora_adapter *a = make_adapter(&bm.cfg, (uint64_t)k + 1);
        if (!a) {
            rc = -1;
            break;
        }
        int32_t slot = -1;
        pg_error err = {{0}};
        const double t0 = bench_now_s();
        rc = model_lora_add(bm.m, a, "bench", &slot, &err);
        up_ms[k] = (bench_now_s() - t0) * 1e3;
        lora_adapter_free(a);
        if (rc != 0)
            fprintf(stderr, "pagedgen_bench: lora: %s\n", err.msg);
    }
    if (rc == 0)
        rc = bench_warm_up(&bm);
    if (rc != 0)
        goto out;
    printf("  adapter upload (model_lora_add, %d x 7 projections): %.1f %.1f %.1f %.1f ms\n",
           (int)bm.cfg.num_hidden_layers, up_ms[0], up_ms[1], up_ms[2], up_ms[3]);
    const lora_case cases[] = {
        {"batch64", {"fixed", BENCH_DIST_FIXED, 64, 64, 64, 0, 0, 81}, 64, LORA_N, 0.85},
        {"batch1", {"fixed", BENCH_DIST_FIXED, 1, 16, 128, 0, 0, 82}, 1, 1, 0.9},
    };
    bench_json_obj(c->j, "lora");
    bench_json_model(c->j, &bm);
    bench_json_num(c->j, "rank", LORA_RANK);
    bench_json_num(c->j, "upload_ms", up_ms[0]);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0] && rc == 0; ci++) {
        const lora_case *lc = &cases[ci];
        bench_workload w;
        if (bench_make_workload(&bm, &lc->spec, &w) != 0) {
            rc = -1;
            break;
        }
        bench_result r[2];
        double cpu[2] = {0.0, 0.0};
        memset(r, 0, sizeof r);
        for (int k = 0; k < rounds && rc == 0; k++)
            for (int i = 0; i < 2 && rc == 0; i++) {
                bench_run_params rp = bench_run_params_default(&bm);
                rp.max_num_seqs = lc->batch;
                rp.n_loras = i ? lc->n_loras : 0;
                rc = bench_run_keep_best(&bm, &w, &rp, &r[i], &cpu[i]);
            }
        if (rc == 0) {
            const double wall = r[1].gen_tok_s / r[0].gen_tok_s, cpur = cpu[0] / cpu[1];
            printf("  %-8s base %8.1f gen tok/s (CPU %6.2f s) | %d adapter%s %8.1f gen tok/s (CPU %6.2f s) | "
                   "%.3fx by wall time, %.3fx by CPU time (target >= %.2fx)\n", lc->name, r[0].gen_tok_s, cpu[0],
                   (int)lc->n_loras, lc->n_loras > 1 ? "s mixed" : "", r[1].gen_tok_s, cpu[1], wall, cpur,
                   lc->target);
            bench_json_obj(c->j, lc->name);
            bench_json_workload(c->j, "workload", &w);
            bench_json_num(c->j, "base_gen_tok_per_s", r[0].gen_tok_s);
            bench_json_num(c->j, "lora_gen_tok_per_s", r[1].gen_tok_s);
            bench_json_num(c->j, "base_cpu_s", cpu[0]);
            bench_json_num(c->j, "lora_cpu_s", cpu[1]);
            bench_json_num(c->j, "ratio_wall", wall);
            bench_json_num(c->j, "ratio_cpu", cpur);
            bench_json_num(c->j, "target", lc->target);
            bench_json_end(c->j);
        }
        bench_workload_free(&w);
    }
    bench_json_end(c->j);
out:
    bench_model_free(&bm);
    return rc;
}
