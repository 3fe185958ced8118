/* bench_sec_machine: the "machine" section of pagedgen_bench — the ceilings
 * every other figure is read against (sgemm peak, cpu_gemm GFLOP/s, memory
 * bandwidth). */
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
