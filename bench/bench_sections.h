/* bench_sections: the sections of pagedgen_bench (machine ceilings,
 * throughput, paged vs contiguous, scaling, prefix sharing and parallel
 * sampling) over the run state that main() fills from the command line.
 * Each section prints its table to stdout and adds its object to c->j;
 * sections return 0, or nonzero when a model failed to load or a run failed
 * (failed checks are counted in c->checks_failed instead).
 */
#ifndef PG_BENCH_SECTIONS_H
#define PG_BENCH_SECTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "bench_machine.h"
#include "bench_report.h"

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

void bench_section_machine(bench_ctx *c); /* measures c->mach */
int bench_section_throughput(bench_ctx *c);
int bench_section_paged(bench_ctx *c);
int bench_section_scaling(bench_ctx *c);
int bench_section_prefix(bench_ctx *c);   /* + parallel sampling */
int bench_section_storage(bench_ctx *c);  /* bench_storage.c: f32/bf16/int8 weights x f32/bf16 kv */

#endif /* PG_BENCH_SECTIONS_H */
