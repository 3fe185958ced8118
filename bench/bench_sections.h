/* bench_sections: the sections of pagedgen_bench — one file each,
 * bench_sec_<name>.c: machine ceilings, throughput, paged vs contiguous,
 * scaling, prefix sharing and parallel sampling, storage types — over the
 * run state that main() fills from the command line, and the helpers they
 * share (bench_sections.c). Each section prints its table to stdout and adds
 * its object to c->j;
 * sections return 0, or nonzero when a model failed to load or a run failed
 * (failed checks are counted in c->checks_failed instead).
 */
#ifndef PG_BENCH_SECTIONS_H
#define PG_BENCH_SECTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench_engine.h"
#include "bench_machine.h"
#include "bench_report.h"
#include "bench_workload.h"

#define BENCH_MAX_PATH 1024

typedef struct bench_ctx {
    bool quick;
    bool skip_ceilings;    /* --skip-ceilings: no machine measurement (profiling) */
    const char *only;
    char model_dir[BENCH_MAX_PATH];
    bool single_model;     /* model_dir is one model */
    char shared_dir[BENCH_MAX_PATH];
    char out_dir[BENCH_MAX_PATH];
    int32_t threads;
    int32_t batches[16];   /* --batches: the throughput section's batch sizes */
    int32_t n_batches;     /* 0 = the defaults */
    const char *git_commit;
    char cmdline[4096];
    bench_machine mach;
    bench_json *j;
    int checks_failed;
} bench_ctx;

bool bench_file_exists(const char *path);
/* --only: true when section `name` is to run. */
bool bench_section_on(const bench_ctx *c, const char *name);

/* ---- shared by the sections (bench_sections.c) ---- */

static inline int32_t bench_ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }
/* The folder of model `name` ("15m", "110m", "gqa-110m", "stories260K"). */
void bench_model_path(const bench_ctx *c, const char *name, char *out, size_t cap);
/* Counts and prints a failed check (c->checks_failed). */
void bench_check(bench_ctx *c, bool ok, const char *what);
/* max_position_embeddings of model `name` from its config.json into *ctx;
 * *ctx = 0 when the model is missing (bench_load then reports the skip). */
int bench_config_ctx(const bench_ctx *c, const char *name, int32_t *ctx);
/* Loads model `name`, or reports why not (*skipped: a missing synthetic model). */
int bench_load(bench_ctx *c, const char *name, bench_model *bm, int32_t num_blocks,
               int32_t max_num_seqs, bool *skipped);
/* Draws spec s for bm's context and vocabulary; 0, or -1 (out of memory). */
int bench_make_workload(const bench_model *bm, const bench_workload_spec *s, bench_workload *w);
/* Runs w with rp; on failure says which workload on which model failed. */
int bench_run_or_report(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
                        bench_result *r);
/* Runs w with rp once (bench_run_or_report) and keeps the best of rounds:
 * *best the faster run's result (wall_s 0 = none yet), *best_cpu_s the
 * smaller process CPU time of the run (0 = none yet). */
int bench_run_keep_best(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
                        bench_result *best, double *best_cpu_s);
/* CPU seconds of the whole process (every thread): the ratios measured on
 * a loaded machine. */
double bench_process_cpu_s(void);
/* The storage-shaped sections' two batch sizes: 1 and 64 (8 with --quick),
 * or the first two --batches given. Returns how many (1 or 2). */
int bench_two_batches(const bench_ctx *c, int32_t batches[2]);
/* Makes spec s's workload, runs it into *out and frees it — unless keep is
 * given and the run succeeded: then *keep holds it and the caller frees it. */
int bench_run_workload(bench_model *bm, const bench_workload_spec *s, const bench_run_params *rp,
                       bench_result *out, bench_workload *keep);
/* Runs w with rp[0] then rp[1], stopping at the first failure. */
int bench_run_pair(bench_model *bm, const bench_workload *w, const bench_run_params rp[2],
                   bench_result r[2]);
/* A short untimed run: page faults, pool start-up and caches out of the way. */
int bench_warm_up(bench_model *bm);
void bench_json_workload(bench_json *j, const char *key, const bench_workload *w);
void bench_json_result(bench_json *j, const char *key, const bench_result *r,
                       const bench_run_params *rp);
void bench_json_model(bench_json *j, const bench_model *bm);

/* ---- the sections (bench_sec_<name>.c) ---- */

void bench_section_machine(bench_ctx *c); /* measures c->mach */
int bench_section_throughput(bench_ctx *c);
int bench_section_paged(bench_ctx *c);
int bench_section_scaling(bench_ctx *c);
int bench_section_prefix(bench_ctx *c);   /* + parallel sampling */
int bench_section_storage(bench_ctx *c);  /* f32/bf16/int8 weights x f32/bf16 kv */
int bench_section_scoring(bench_ctx *c);  /* prompt logprobs: prefill pass vs one row a step */
int bench_section_host(bench_ctx *c);     /* the engine's host share of a decode step */
int bench_section_sampling(bench_ctx *c); /* greedy vs sampled rows at V = 151,936 */
int bench_section_beam(bench_ctx *c);     /* beam search: KV blocks shared vs copied */
int bench_section_lora(bench_ctx *c);     /* LoRA adapters mixed vs the base model */
int bench_section_moe(bench_ctx *c);      /* Qwen3-30B-A3B's layers vs a dense twin, bf16 / int8 */

#endif /* PG_BENCH_SECTIONS_H */
