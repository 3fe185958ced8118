/* pagedgen_bench: what the PagedAttention paper claims, measured on this
 * engine, and the CPU throughput targets — one run, one table, one JSON.
 *
 * Sections (--only NAME runs one; all run by default):
 *   throughput  Issue 4: 110m model, prompt 128 / output 128, batch 1..128:
 *               generated and prompt tokens/s beside the machine's sgemm peak
 *               and, at batch 1, weight bytes/s beside its memory bandwidth;
 *               peak RSS vs weights + KV budget.
 *   paged       Issue 7: KV_LAYOUT_PAGED vs KV_LAYOUT_CONTIGUOUS at the same
 *               KV budget and scheduler: requests/s, tokens/s, peak
 *               concurrent sequences, KV utilization, preemptions.
 *   scaling     throughput vs max_num_seqs and vs KV budget (SVG plots).
 *   prefix      shared system prefix with prefix caching on/off, and n = 4
 *               parallel sampling vs 4 independent requests (blocks saved).
 *   storage     Issue 13: 110m with f32 / bf16 / int8 weights x f32 / bf16
 *               KV cache at batch 1 and 64, ratios to f32/f32 in the same
 *               run, the batch-1 bytes-per-token roofline (bench_sec_storage.c).
 *   scoring     Issue 21: prompt logprobs in the prefill pass vs one row a
 *               step vs plain prefill: 16 x 256, one 512-token request, and a
 *               4-way multiple-choice workload (bench_sec_scoring.c).
 *   host        Issue 30: the engine's host share of a decode step at the 1.1B
 *               shape over a no-arithmetic backend, batch 1, 64, 256
 *               (bench_sec_host.c).
 *   sampling    Issue 30: greedy vs temperature 0.8 (and + top_p 0.95) generated
 *               tok/s at V = 151,936 on one thread (bench_sec_sampling.c).
 *   beam        Issue 35: beam search at widths 2/4/6, KV blocks with sharing vs
 *               each beam its own copy, throughput (bench_sec_beam.c).
 *   lora        Issue 33: four rank-16 LoRA adapters on all seven projections mixed
 *               evenly at batch 64, one at batch 1, vs the base model; the
 *               adapter upload time (bench_sec_lora.c).
 *   moe         Issue 31: Qwen3-30B-A3B's layer shape (4 layers) beside a dense
 *               model of the same active parameters, bf16 and int8, batch 1
 *               and 64, and the routed-experts-only check (bench_sec_moe.c).
 *
 * The engine is driven directly (prompts as token ids, EOS ignored, greedy
 * unless said otherwise, fixed seeds, a warm-up run per model). Figures go
 * to stdout and to OUT/results.json (+ OUT/<name>.svg).
 *
 * Usage: pagedgen_bench [--quick] [--only SECTION] [--model-dir DIR]
 *                       [--threads N] [--out DIR] [--shared DIR] [--git-commit SHA]
 *                       [--batches 1,8,...] [--skip-ceilings]
 * --model-dir: a folder holding the synthetic models 15m, 110m, gqa-110m
 *   (default build/models), or one model folder (has config.json): then
 *   every section runs on that model. A leading "$PAGEDGEN_SHARED" in the
 *   path is replaced by that environment variable (for meson's test()).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_engine.h"
#include "bench_machine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "bench_workload.h"

#define MAX_PATH BENCH_MAX_PATH

static int mkdir_p(const char *path)
{
    char tmp[MAX_PATH];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: pagedgen_bench [--quick] [--only machine|throughput|paged|scaling|prefix|storage|scoring|host|sampling|beam|lora|moe]\n"
               "                      [--model-dir DIR] [--threads N] [--out DIR] [--shared DIR]\n"
               "                      [--git-commit SHA] [--batches 1,8,...] [--skip-ceilings]\n"
               "  --model-dir  folder with the synthetic models 15m, 110m, gqa-110m (default\n"
               "               build/models), or one model folder: every section runs on it\n"
               "  --shared     test data folder (stories260K); default $PAGEDGEN_SHARED or ../shared\n"
               "  --out        where results.json and the SVG plots go (default build/bench)\n"
               "  --git-commit recorded in results.json (default $PAGEDGEN_GIT_COMMIT)\n"
               "  --batches    batch sizes of the throughput section (default 1,8,32,64,128)\n"
               "  --skip-ceilings  do not measure sgemm/bandwidth (for profiling the engine)\n");
}

/* "$PAGEDGEN_SHARED/rest" -> "<env>/rest" (meson test() passes no shell). */
static void expand_shared(char *out, size_t cap, const char *in)
{
    const char *var = "$PAGEDGEN_SHARED";
    const char *env = getenv("PAGEDGEN_SHARED");
    if (strncmp(in, var, strlen(var)) == 0 && env)
        snprintf(out, cap, "%s%s", env, in + strlen(var));
    else
        snprintf(out, cap, "%s", in);
}

static int parse_int(const char *s, int32_t lo, int32_t hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int32_t)v;
    return 0;
}

/* "1,8,64" -> {1, 8, 64} */
static int parse_list(const char *s, int32_t *out, int32_t cap, int32_t *n)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n >= cap || parse_int(tok, 1, 256, &out[*n]) != 0)
            return -1;
        (*n)++;
    }
    return *n > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench_ctx c;
    memset(&c, 0, sizeof(c));
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows through tee */
    c.threads = 2;
    snprintf(c.model_dir, sizeof(c.model_dir), "build/models");
    snprintf(c.out_dir, sizeof(c.out_dir), "build/bench");
    const char *env_shared = getenv("PAGEDGEN_SHARED");
    snprintf(c.shared_dir, sizeof(c.shared_dir), "%s", env_shared ? env_shared : "../shared");
    c.git_commit = getenv("PAGEDGEN_GIT_COMMIT");

    size_t off = 0;
    for (int i = 0; i < argc && off < sizeof(c.cmdline) - 1; i++)
        off += (size_t)snprintf(c.cmdline + off, sizeof(c.cmdline) - off, "%s%s", i ? " " : "",
                                argv[i]);

    static const struct option opts[] = {
        {"quick", no_argument, NULL, 'q'},      {"only", required_argument, NULL, 'o'},
        {"model-dir", required_argument, NULL, 'm'}, {"threads", required_argument, NULL, 't'},
        {"out", required_argument, NULL, 'O'},  {"shared", required_argument, NULL, 's'},
        {"git-commit", required_argument, NULL, 'g'}, {"help", no_argument, NULL, 'h'},
        {"batches", required_argument, NULL, 'b'},
        {"skip-ceilings", no_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'q': c.quick = true; break;
        case 'k': c.skip_ceilings = true; break;
        case 'o': c.only = optarg; break;
        case 'm': expand_shared(c.model_dir, sizeof(c.model_dir), optarg); break;
        case 'O': snprintf(c.out_dir, sizeof(c.out_dir), "%s", optarg); break;
        case 's': expand_shared(c.shared_dir, sizeof(c.shared_dir), optarg); break;
        case 'g': c.git_commit = optarg; break;
        case 't':
            if (parse_int(optarg, 1, 256, &c.threads) != 0) {
                fprintf(stderr, "pagedgen_bench: --threads: expected 1..256, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_list(optarg, c.batches, 16, &c.n_batches) != 0) {
                fprintf(stderr, "pagedgen_bench: --batches: expected up to 16 sizes in 1..256 "
                                "separated by commas, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "pagedgen_bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    static const char *const sections[] = {"machine", "throughput", "paged", "scaling", "prefix", "storage",
                                           "scoring", "host", "sampling", "beam", "lora", "moe"};
    enum { N_SECTIONS = sizeof(sections) / sizeof(sections[0]) };
    if (c.only) {
        bool known = false;
        for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
            known = known || strcmp(c.only, sections[i]) == 0;
        if (!known) {
            fprintf(stderr, "pagedgen_bench: --only: expected machine, throughput, paged, "
                            "scaling, prefix, storage, scoring, host, sampling, beam, lora or moe, got '%s'\n", c.only);
            return 2;
        }
    }
    char cfg[MAX_PATH + 16];
    snprintf(cfg, sizeof(cfg), "%s/config.json", c.model_dir);
    c.single_model = bench_file_exists(cfg);
    if (mkdir_p(c.out_dir) != 0) {
        fprintf(stderr, "pagedgen_bench: cannot create %s: %s\n", c.out_dir, strerror(errno));
        return 1;
    }
    char path[MAX_PATH + 32];
    snprintf(path, sizeof(path), "%s/results.json", c.out_dir);
    c.j = bench_json_open(path);
    if (!c.j) {
        fprintf(stderr, "pagedgen_bench: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }

    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    bench_machine_identify(&c.mach);
    printf("pagedgen_bench %s%s, %d threads, models %s%s, commit %s, %s\n",
           c.quick ? "--quick" : "full", c.only ? "" : " (all sections)", c.threads,
           c.model_dir, c.single_model ? " (single model)" : "",
           c.git_commit ? c.git_commit : "unknown", date);
    bench_json_obj(c.j, NULL);
    bench_json_str(c.j, "bench", "pagedgen_bench");
    bench_json_str(c.j, "git_commit", c.git_commit);
    bench_json_str(c.j, "date", date);
    bench_json_str(c.j, "command_line", c.cmdline);
    bench_json_bool(c.j, "quick", c.quick);
    bench_json_str(c.j, "only", c.only);
    bench_json_int(c.j, "threads", c.threads);
    bench_json_str(c.j, "model_dir", c.model_dir);
    /* other processes on the machine skew every figure: record the load */
    double load[3] = {0.0, 0.0, 0.0};
    if (getloadavg(load, 3) == 3) {
        printf("load average at start: %.2f %.2f %.2f (on %d cores)\n", load[0], load[1],
               load[2], c.mach.online_cores);
        bench_json_num(c.j, "loadavg_1min_at_start", load[0]);
    }

    double t0 = bench_now_s();
    int rc = 0;
    if (!c.skip_ceilings &&
        (bench_section_on(&c, "machine") || bench_section_on(&c, "throughput") ||
         bench_section_on(&c, "storage") || bench_section_on(&c, "moe")))
        bench_section_machine(&c); /* the throughput figures are compared against these */
    static int (*const section_fn[])(bench_ctx *) = {NULL, bench_section_throughput,
                                                     bench_section_paged, bench_section_scaling,
                                                     bench_section_prefix, bench_section_storage,
                                                     bench_section_scoring, bench_section_host,
                                                     bench_section_sampling, bench_section_beam,
                                                     bench_section_lora,
                                                     bench_section_moe};
    double section_s[N_SECTIONS] = {0};
    for (size_t i = 1; i < N_SECTIONS && rc == 0; i++) {
        if (!bench_section_on(&c, sections[i]))
            continue;
        double ts = bench_now_s();
        rc = section_fn[i](&c);
        section_s[i] = bench_now_s() - ts;
        printf("  (%s: %.1f s)\n", sections[i], section_s[i]);
    }
    bench_json_obj(c.j, "section_seconds");
    for (size_t i = 1; i < N_SECTIONS; i++)
        if (section_s[i] > 0.0)
            bench_json_num(c.j, sections[i], section_s[i]);
    bench_json_end(c.j);
    double total = bench_now_s() - t0;
    if (getloadavg(load, 3) == 3) {
        printf("load average at end: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
        bench_json_num(c.j, "loadavg_5min_at_end", load[1]);
    }
    bench_json_int(c.j, "checks_failed", c.checks_failed);
    bench_json_num(c.j, "total_s", total);
    bench_json_bool(c.j, "ok", rc == 0 && c.checks_failed == 0);
    if (bench_json_close(c.j) != 0) {
        fprintf(stderr, "pagedgen_bench: writing %s failed\n", path);
        rc = rc ? rc : -1;
    }
    printf("\n%s in %.1f s; results in %s (%d checks failed)\n", rc == 0 ? "done" : "FAILED",
           total, path, c.checks_failed);
    return rc == 0 && c.checks_failed == 0 ? 0 : 1;
}
