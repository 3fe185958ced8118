/* bench_sec_storage: the "storage" section of pagedgen_bench (issue 13) — the
 * 110m model with its weights stored as f32, bf16 and int8 and its KV cache
 * as f32 and bf16, and the matmul precision modes (issue 20: bf16 and int8
 * arithmetic, cpu_gemm_modes.h) on their own storage types, at batch 1 and
 * 64 (prompt 128 / output 128, greedy,
 * EOS ignored), beside the batch-1 roofline: the bytes one decode step
 * streams (the weights as stored + the KV cache read at the mean context)
 * against the machine's measured read bandwidth.
 *
 * On a machine other engineers load, absolute figures drift from minute to
 * minute; the ratios to f32/f32 are what to read. The six configurations
 * are therefore run in rounds (each round loads one configuration after the
 * other and runs every batch size), and each keeps its best round.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_sections.h"
#include "bench_workload.h"
#include "cpu_executor.h"
#include "cpu_gemm_modes.h"
#include "cpu_wt.h"

typedef struct storage_cfg {
    cpu_wt wt;
    cpu_kv kv;
    cpu_matmul_precision matmul;
} storage_cfg;

static const storage_cfg storage_cfgs[] = {
    {CPU_WT_F32, CPU_KV_F32, CPU_MATMUL_EXACT},  {CPU_WT_F32, CPU_KV_BF16, CPU_MATMUL_EXACT},
    {CPU_WT_BF16, CPU_KV_F32, CPU_MATMUL_EXACT}, {CPU_WT_BF16, CPU_KV_BF16, CPU_MATMUL_EXACT},
    {CPU_WT_I8, CPU_KV_F32, CPU_MATMUL_EXACT},   {CPU_WT_I8, CPU_KV_BF16, CPU_MATMUL_EXACT},
    {CPU_WT_BF16, CPU_KV_BF16, CPU_MATMUL_BF16}, {CPU_WT_I8, CPU_KV_BF16, CPU_MATMUL_INT8},
};
#define N_CFG ((int)(sizeof storage_cfgs / sizeof storage_cfgs[0]))
#define MAX_B 4

/* Bytes one batch-1 decode step reads: every weight matrix once (the
 * embedding table only for one row unless it is also the lm_head) and the
 * KV cache of `ctx` tokens. */
static double step_bytes(const bench_model *bm, double ctx)
{
    const llama_config *c = &bm->cfg;
    double w = (double)bm->weight_bytes;
    if (!c->tie_word_embeddings)
        w -= (double)exec_wt_bytes(bm->ex, (size_t)c->vocab_size * (size_t)c->hidden_size);
    const double kv_per_token = (double)bm->kv_bytes_per_block / (double)bm->mp.block_size;
    return w + ctx * kv_per_token;
}

int bench_section_storage(bench_ctx *c)
{
    const int32_t P = c->quick ? 16 : 128, G = c->quick ? 16 : 128;
    int32_t batches[MAX_B] = {0};
    const int n_b = bench_two_batches(c, batches);
    const int rounds = c->quick ? 1 : 2;
    char dir[BENCH_MAX_PATH + 16];
    if (c->single_model)
        snprintf(dir, sizeof dir, "%s", c->model_dir);
    else
        snprintf(dir, sizeof dir, "%s/110m", c->model_dir);
    char cfgp[BENCH_MAX_PATH + 32];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    printf("\n== storage types (issue 13): prompt %d / output %d, ignore EOS, greedy, %d threads; "
           "weights x kv cache, best of %d interleaved round%s\n", P, G, c->threads, rounds,
           rounds == 1 ? "" : "s");
    if (!bench_file_exists(cfgp)) {
        printf("  (model 110m not found at %s: skipped; scripts/bench generates it)\n", dir);
        return 0;
    }
    const int32_t blocks_per_req = (P + G + 15) / 16, max_b = batches[n_b - 1];
    model_params mp = {.num_kv_blocks = max_b * blocks_per_req + 16, .block_size = 16,
                       .max_num_batched_tokens = 2048, .max_num_seqs = max_b};

    double decode[N_CFG][MAX_B], gen[N_CFG][MAX_B], prefill[N_CFG][MAX_B], bytes_b1[N_CFG], weights[N_CFG],
        load_s[N_CFG];
    memset(decode, 0, sizeof decode);
    memset(gen, 0, sizeof gen);
    memset(prefill, 0, sizeof prefill);
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++)
        for (int k = 0; k < N_CFG && rc == 0; k++) {
            bench_model bm;
            pg_error err = {{0}};
            cpu_executor_params cp = {.threads = c->threads, .wt_dtype = (int32_t)storage_cfgs[k].wt,
                                      .kv_dtype = (int32_t)storage_cfgs[k].kv,
                                      .matmul_precision = (int32_t)storage_cfgs[k].matmul,
                                      /* the pool's pages written at load (in load_s), as llama.cpp
                                       * clears its KV buffer when it creates a context
                                       * (src/llama-kv-cache.cpp, ggml_backend_buffer_clear; 0.5.0):
                                       * the timed steps of both sides then exclude the kernel's
                                       * first-touch page zeroing */
                                      .prefault_kv = true};
            if ((rc = bench_model_load_with(&bm, dir, &cp, &mp, &err)) != 0) {
                fprintf(stderr, "pagedgen_bench: loading %s: %s\n", dir, err.msg);
                break;
            }
            weights[k] = (double)bm.weight_bytes;
            load_s[k] = bm.load_s;
            bytes_b1[k] = step_bytes(&bm, P + G / 2.0);
            for (int bi = 0; bi < n_b && rc == 0; bi++) {
                bench_workload_spec s = {.name = "fixed", .dist = BENCH_DIST_FIXED, .n_requests = batches[bi],
                                         .prompt_len = P, .output_len = G, .seed = 1};
                bench_workload w;
                if (bench_workload_make(&w, &s, bench_model_ctx(&bm), bm.cfg.vocab_size) != 0) {
                    rc = -1;
                    break;
                }
                bench_run_params rp = bench_run_params_default(&bm);
                rp.max_num_seqs = batches[bi];
                bench_result res;
                if ((rc = bench_run(&bm, &w, &rp, &res, &err)) != 0)
                    fprintf(stderr, "pagedgen_bench: storage %s/%s/%s batch %d: %s\n",
                            cpu_wt_name(storage_cfgs[k].wt), cpu_kv_name(storage_cfgs[k].kv),
                            cpu_matmul_precision_name(storage_cfgs[k].matmul), (int)batches[bi], err.msg);
                else {
                    decode[k][bi] = fmax(decode[k][bi], res.decode_tok_s);
                    gen[k][bi] = fmax(gen[k][bi], res.gen_tok_s);
                    prefill[k][bi] = fmax(prefill[k][bi], res.prompt_tok_s);
                }
                bench_workload_free(&w);
            }
            bench_model_free(&bm);
        }
    if (rc != 0)
        return rc;

    const double bw = c->mach.read_gbs * 1e9;
    char hd_dec[32], hd_gen[32], hd_pre[32];
    snprintf(hd_dec, sizeof hd_dec, "b%d decode/s", (int)batches[n_b - 1]);
    snprintf(hd_gen, sizeof hd_gen, "b%d gen t/s", (int)batches[n_b - 1]);
    snprintf(hd_pre, sizeof hd_pre, "b%d prefill/s", (int)batches[n_b - 1]);
    printf("  %-7s %-5s %-6s %9s %8s | %11s %7s %9s %8s %6s | %11s %7s %11s %12s\n", "weights", "kv", "matmul",
           "wt_MiB", "load_s", "b1 decode/s", "x f32", "MB/token", "roof t/s", "%roof", hd_dec, "x f32", hd_gen,
           hd_pre);
    if (bw <= 0.0)
        printf("  (no read bandwidth measured: --skip-ceilings; %%roof left out)\n");
    bench_json *j = c->j;
    bench_json_obj(j, "storage");
    bench_json_int(j, "prompt_len", P);
    bench_json_int(j, "output_len", G);
    bench_json_int(j, "threads", c->threads);
    bench_json_int(j, "rounds", rounds);
    bench_json_num(j, "read_gbs", c->mach.read_gbs);
    bench_json_arr(j, "rows");
    for (int k = 0; k < N_CFG; k++) {
        const double roof = bw > 0.0 ? bw / bytes_b1[k] : (double)NAN;
        printf("  %-7s %-5s %-6s %9.1f %8.2f | %11.1f %6.2fx %9.1f %8.1f %5.0f%% | %11.1f %6.2fx %11.1f %12.1f\n",
               cpu_wt_name(storage_cfgs[k].wt), cpu_kv_name(storage_cfgs[k].kv),
               cpu_matmul_precision_name(storage_cfgs[k].matmul), weights[k] / 1048576.0, load_s[k], decode[k][0],
               decode[k][0] / decode[0][0], bytes_b1[k] * 1e-6, roof, 100.0 * decode[k][0] / roof,
               decode[k][n_b - 1], decode[k][n_b - 1] / decode[0][n_b - 1], gen[k][n_b - 1],
               prefill[k][n_b - 1]);
        bench_json_obj(j, NULL);
        bench_json_str(j, "weights", cpu_wt_name(storage_cfgs[k].wt));
        bench_json_str(j, "kv", cpu_kv_name(storage_cfgs[k].kv));
        bench_json_str(j, "matmul", cpu_matmul_precision_name(storage_cfgs[k].matmul));
        bench_json_num(j, "weight_bytes", weights[k]);
        bench_json_num(j, "b1_bytes_per_token", bytes_b1[k]);
        bench_json_num(j, "b1_roofline_tok_s", roof);
        bench_json_arr(j, "batches");
        for (int bi = 0; bi < n_b; bi++) {
            bench_json_obj(j, NULL);
            bench_json_int(j, "batch", batches[bi]);
            bench_json_num(j, "decode_tok_s", decode[k][bi]);
            bench_json_num(j, "gen_tok_s", gen[k][bi]);
            bench_json_num(j, "prefill_tok_s", prefill[k][bi]);
            bench_json_num(j, "decode_vs_f32", decode[k][bi] / decode[0][bi]);
            bench_json_end(j);
        }
        bench_json_end(j);
        bench_json_end(j);
    }
    bench_json_end(j);
    bench_json_end(j);
    printf("  (x f32: decode tok/s over weights f32 / kv f32 at the same batch, same run; roof: read "
           "bandwidth %.1f GB/s / bytes per batch-1 decode step at the mean context %.0f; matmul: the arithmetic, "
           "--matmul-precision; prefill/s: prompt tokens / time of the steps that computed them)\n",
           c->mach.read_gbs, P + G / 2.0);
    return 0;
}
