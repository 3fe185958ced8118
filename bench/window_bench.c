/* window_bench: KV blocks saved by freeing blocks behind a sliding window
 * (engine_params.sliding_window; vLLM's SlidingWindowManager), on a model
 * whose config sets a window, e.g. a synthetic 15m model made a Mistral
 * with a 256-token window (cli/README.md, "sliding-window model", gives the
 * two commands that write it).
 *
 * Two measurements, each with freeing on and off (same outputs):
 *   1. one request generating --output tokens: peak KV blocks in use;
 *   2. --seqs such requests at once in a pool of --num-kv-blocks blocks
 *      (default: what one sequence needs without freeing, + 25%): the mean
 *      number of sequences running per step, preemptions, wall time.
 * Printed as on/off ratios in one run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_workload.h"

static int parse_int(const char *s, int32_t *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > (1L << 28)) return -1;
    *out = (int32_t)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: window_bench --model-dir DIR [--prompt N] [--output N] [--seqs N]\n"
               "                    [--num-kv-blocks N] [--threads N]\n"
               "  DIR: a model whose config.json sets sliding_window (defaults: prompt 32,\n"
               "  output 2048, seqs 8, threads 2)\n");
}

static int run(bench_model *bm, const bench_workload *w, int32_t num_blocks, int32_t seqs,
               bool keep, bench_result *r)
{
    bench_run_params rp = bench_run_params_default(bm);
    rp.num_blocks = num_blocks;
    rp.max_num_seqs = seqs;
    rp.keep_window_blocks = keep;
    pg_error err = {{0}};
    int rc = bench_run(bm, w, &rp, r, &err);
    if (rc) fprintf(stderr, "window_bench: %s (freeing %s): %s\n", w->name, keep ? "off" : "on", err.msg);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int32_t prompt = 32, output = 2048, seqs = 8, num_blocks = 0, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--model-dir") == 0 && v) dir = v;
        else if (strcmp(a, "--prompt") == 0 && v) bad = parse_int(v, &prompt);
        else if (strcmp(a, "--output") == 0 && v) bad = parse_int(v, &output);
        else if (strcmp(a, "--seqs") == 0 && v) bad = parse_int(v, &seqs);
        else if (strcmp(a, "--num-kv-blocks") == 0 && v) bad = parse_int(v, &num_blocks);
        else if (strcmp(a, "--threads") == 0 && v) bad = parse_int(v, &threads);
        else { usage(stderr); return 2; }
        if (bad) {
            fprintf(stderr, "window_bench: %s: expected a positive integer, got '%s'\n", a, v);
            return 2;
        }
        i++;
    }
    if (!dir) { usage(stderr); return 2; }
    const int32_t bs = 16, one_seq = (prompt + output + bs - 1) / bs;
    if (num_blocks == 0) num_blocks = one_seq + one_seq / 4;
    model_params mp = {.num_kv_blocks = num_blocks > one_seq ? num_blocks : one_seq,
                       .block_size = bs, .max_num_batched_tokens = 2048, .max_num_seqs = seqs};
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    pg_error err = {{0}};
    if (bench_model_load(&bm, dir, threads, &mp, &err)) {
        fprintf(stderr, "window_bench: %s: %s\n", dir, err.msg);
        return 1;
    }
    int rc = 1;
    const int32_t W = bm.cfg.sliding_window;
    if (W <= 0) {
        fprintf(stderr, "window_bench: %s/config.json sets no sliding_window\n", dir);
        goto out;
    }
    if (prompt + output > bench_model_ctx(&bm)) {
        fprintf(stderr, "window_bench: prompt + output = %d exceeds the model's context %d\n",
                (int)(prompt + output), (int)bench_model_ctx(&bm));
        goto out;
    }
    printf("window_bench: %s (hidden %d, %d layers), sliding_window %d, block size %d, "
           "prompt %d + output %d tokens, %d threads\n", bm.name, (int)bm.cfg.hidden_size,
           (int)bm.cfg.num_hidden_layers, (int)W, (int)bs, (int)prompt, (int)output, (int)threads);
    bench_workload w1, wn;
    bench_workload_spec s1 = {.name = "one", .dist = BENCH_DIST_FIXED, .n_requests = 1,
                              .prompt_len = prompt, .output_len = output, .seed = 5};
    bench_workload_spec sn = s1;
    sn.name = "concurrent";
    sn.n_requests = seqs;
    if (bench_workload_make(&w1, &s1, bench_model_ctx(&bm), bm.cfg.vocab_size) ||
        bench_workload_make(&wn, &sn, bench_model_ctx(&bm), bm.cfg.vocab_size)) {
        fprintf(stderr, "window_bench: out of memory\n");
        goto out;
    }
    bench_result r1[2], rn[2]; /* [0] freeing on, [1] off */
    for (int k = 0; k < 2; k++)
        if (run(&bm, &w1, mp.num_kv_blocks, 1, k == 1, &r1[k])) goto out_w;
    printf("  1 sequence, %d tokens: peak KV blocks in use: freeing on %d, off %d (on/off %.3f; "
           "ceil(W/B)+1 = %d)\n", (int)(prompt + output), (int)r1[0].stats.blocks_in_use_peak,
           (int)r1[1].stats.blocks_in_use_peak,
           (double)r1[0].stats.blocks_in_use_peak / (double)r1[1].stats.blocks_in_use_peak,
           (int)((W + bs - 1) / bs + 1));
    for (int k = 0; k < 2; k++)
        if (run(&bm, &wn, num_blocks, seqs, k == 1, &rn[k])) goto out_w;
    printf("  %d sequences in a pool of %d blocks: freeing on: %.2f running per step (mean), "
           "%llu preemptions, %.2f s; off: %.2f running, %llu preemptions, %.2f s\n", (int)seqs,
           (int)num_blocks, rn[0].running_mean, (unsigned long long)rn[0].stats.preemptions,
           rn[0].wall_s, rn[1].running_mean, (unsigned long long)rn[1].stats.preemptions, rn[1].wall_s);
    printf("  on/off: sequences running per step %.2fx, generated tokens/s %.2fx, prompt tokens "
           "computed (incl. recomputation) %.3f\n", rn[0].running_mean / rn[1].running_mean,
           rn[0].gen_tok_s / rn[1].gen_tok_s,
           (double)rn[0].stats.prompt_tokens / (double)rn[1].stats.prompt_tokens);
    rc = 0;
out_w:
    bench_workload_free(&w1);
    bench_workload_free(&wn);
out:
    bench_model_free(&bm);
    return rc;
}
