/* bench_sec_moe: the "moe" section of pagedgen_bench (issue 31 item 7) — a
 * synthetic Qwen3-MoE with Qwen3-30B-A3B's layer shape beside a dense model
 * with the same active parameters per token, in bf16 and int8 storage, at
 * batch 1 and 64 (prompt 128 / output 128, greedy, EOS ignored).
 *
 * The models (scripts/bench writes them; scripts/make-synthetic-qwen):
 *   qwen3-30b-a3b-l4    Qwen3-30B-A3B's config.json (hidden 2048, 32 / 4
 *                       heads of 128, 128 experts of moe_intermediate 768,
 *                       top 8, norm_topk_prob) cut to 4 of its 48 layers,
 *                       and its vocabulary cut by the same factor 12
 *                       (151,936 -> 12,672) so that the untied lm_head keeps
 *                       its share of a token's active weights (~11%, as in
 *                       the whole model: 311 M of ~3.0 B)
 *   qwen3-a3b-dense-l4  the same with a dense MLP of intermediate
 *                       6144 = top-k x moe_intermediate (the config's own
 *                       intermediate_size): the same active weights per
 *                       token, less the router's 128 x 2048 per layer
 *
 * Printed per configuration: batch-1 decode tok/s and batch-64 generated
 * tok/s (incl. prefill), the MoE / dense ratio at batch 1 (target >= 0.8x,
 * issue 31) by wall time and by the process's CPU time (the steadier
 * figure on a shared machine), and the routed-expert check (item 3): the
 * bytes a batch-1 token reads if only its k routed experts are read, the
 * GB/s that makes at the measured tok/s, and the GB/s it would take to read
 * all E experts per token at that speed; a figure over the machine's read
 * bandwidth proves the unrouted experts are not read (a failed check
 * otherwise).
 *
 * Rounds: the four configurations are loaded one after the other in each
 * round (MoE bf16, dense bf16, MoE int8, dense int8) and each keeps its best
 * round, so the MoE and dense figures of a storage type are measured back
 * to back. Batch 1 runs in every round (2), the big batch in the first
 * only: at 2 cores one batch-64 run of the MoE takes minutes. The JSON object "moe" has the storage section's row layout, so
 * bench/peers.py --section moe reads it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench_engine.h"
#include "bench_sections.h"
#include "bench_workload.h"
#include "cpu_executor.h"
#include "cpu_gemm_modes.h"
#include "cpu_wt.h"

#define MOE_MODEL "qwen3-30b-a3b-l4"
#define DENSE_MODEL "qwen3-a3b-dense-l4"
#define MAX_B 4

typedef struct moe_cfg {
    const char *model; /* folder under the model dir */
    const char *kind;  /* "moe" / "dense" */
    cpu_wt wt;
} moe_cfg;

static const moe_cfg moe_cfgs[] = {
    {MOE_MODEL, "moe", CPU_WT_BF16},
    {DENSE_MODEL, "dense", CPU_WT_BF16},
    {MOE_MODEL, "moe", CPU_WT_I8},
    {DENSE_MODEL, "dense", CPU_WT_I8},
};
#define N_CFG ((int)(sizeof moe_cfgs / sizeof moe_cfgs[0]))

/* Bytes of one batch-1 decode step's weights: every matrix once, the
 * embedding table for one row (untied), and of each MoE layer's experts
 * only `experts_read` of E. */
static double step_weight_bytes(const bench_model *bm, int32_t experts_read)
{
    const llama_config *c = &bm->cfg;
    double w = (double)bm->weight_bytes;
    if (!c->tie_word_embeddings)
        w -= (double)exec_wt_bytes(bm->ex, (size_t)c->vocab_size * (size_t)c->hidden_size);
    const int32_t E = c->family.n_experts;
    if (E > 0) {
        const double one = (double)exec_wt_bytes(bm->ex, (size_t)c->hidden_size *
                                                             (size_t)c->family.moe_intermediate_size) *
                           3.0;
        for (int32_t l = 0; l < c->num_hidden_layers; l++)
            if (llama_layer_moe(c, l))
                w -= one * (double)(E - experts_read);
    }
    return w;
}

int bench_section_moe(bench_ctx *c)
{
    const int32_t P = c->quick ? 16 : 128, G = c->quick ? 16 : 128;
    int32_t batches[MAX_B] = {0};
    const int n_b = bench_two_batches(c, batches);
    const int rounds = c->quick ? 1 : 2;
    printf("\n== moe (issue 31): Qwen3-30B-A3B's layer shape (4 layers) vs a dense model of the same active "
           "parameters; prompt %d / output %d, ignore EOS, greedy, %d threads, bf16 kv, batch 1 best of %d "
           "interleaved round%s, batch %d one round\n", P, G, c->threads, rounds, rounds == 1 ? "" : "s",
           (int)batches[n_b - 1]);
    if (c->single_model) {
        printf("  (one model given with --model-dir: skipped; the section needs %s and %s under the model "
               "folder, which scripts/bench writes)\n", MOE_MODEL, DENSE_MODEL);
        return 0;
    }
    char dirs[2][BENCH_MAX_PATH + 64];
    for (int i = 0; i < 2; i++) {
        char cfgp[BENCH_MAX_PATH + 96];
        bench_model_path(c, i == 0 ? MOE_MODEL : DENSE_MODEL, dirs[i], sizeof dirs[i]);
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dirs[i]);
        if (!bench_file_exists(cfgp)) {
            printf("  (model %s not found: skipped; scripts/bench --only moe generates it)\n", dirs[i]);
            return 0;
        }
    }
    const int32_t blocks_per_req = (P + G + 15) / 16, max_b = batches[n_b - 1];
    model_params mp = {.num_kv_blocks = max_b * blocks_per_req + 16, .block_size = 16,
                       .max_num_batched_tokens = 2048, .max_num_seqs = max_b};

    double decode[N_CFG][MAX_B], gen[N_CFG][MAX_B], prefill[N_CFG][MAX_B], gen_cpu[N_CFG][MAX_B];
    double weights[N_CFG], load_s[N_CFG], active_b[N_CFG], all_b[N_CFG];
    int32_t n_exp = 0, k_exp = 0;
    memset(decode, 0, sizeof decode);
    memset(gen, 0, sizeof gen);
    memset(prefill, 0, sizeof prefill);
    memset(gen_cpu, 0, sizeof gen_cpu);
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++)
        for (int k = 0; k < N_CFG && rc == 0; k++) {
            const char *dir = dirs[strcmp(moe_cfgs[k].kind, "moe") == 0 ? 0 : 1];
            bench_model bm;
            pg_error err = {{0}};
            cpu_executor_params cp = {.threads = c->threads, .wt_dtype = (int32_t)moe_cfgs[k].wt,
                                      .kv_dtype = (int32_t)CPU_KV_BF16,
                                      .matmul_precision = (int32_t)CPU_MATMUL_EXACT,
                                      .prefault_kv = true}; /* as the storage section: llama.cpp clears its KV */
            if ((rc = bench_model_load_with(&bm, dir, &cp, &mp, &err)) != 0) {
                fprintf(stderr, "pagedgen_bench: loading %s: %s\n", dir, err.msg);
                break;
            }
            weights[k] = (double)bm.weight_bytes;
            load_s[k] = bm.load_s;
            if (bm.cfg.family.n_experts > 0) {
                n_exp = bm.cfg.family.n_experts;
                k_exp = bm.cfg.family.n_experts_per_tok;
                active_b[k] = step_weight_bytes(&bm, k_exp);
                all_b[k] = step_weight_bytes(&bm, n_exp);
            } else
                active_b[k] = all_b[k] = step_weight_bytes(&bm, 0);
            if ((rc = bench_warm_up(&bm)) != 0) {
                bench_model_free(&bm);
                break;
            }
            for (int bi = 0; bi < n_b && rc == 0; bi++) {
                if (r > 0 && batches[bi] > 1)
                    continue; /* the big batch: first round only */
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
                const double c0 = bench_process_cpu_s();
                if ((rc = bench_run(&bm, &w, &rp, &res, &err)) != 0)
                    fprintf(stderr, "pagedgen_bench: moe %s/%s batch %d: %s\n", moe_cfgs[k].kind,
                            cpu_wt_name(moe_cfgs[k].wt), (int)batches[bi], err.msg);
                else {
                    const double cs = bench_process_cpu_s() - c0;
                    decode[k][bi] = fmax(decode[k][bi], res.decode_tok_s);
                    gen[k][bi] = fmax(gen[k][bi], res.gen_tok_s);
                    prefill[k][bi] = fmax(prefill[k][bi], res.prompt_tok_s);
                    if (cs > 0.0)
                        gen_cpu[k][bi] = fmax(gen_cpu[k][bi], (double)batches[bi] * G / cs);
                }
                bench_workload_free(&w);
            }
            bench_model_free(&bm);
        }
    if (rc != 0)
        return rc;

    const double bw = c->mach.read_gbs;
    char hd_gen[32], hd_dec[32];
    snprintf(hd_dec, sizeof hd_dec, "b%d decode/s", (int)batches[n_b - 1]);
    snprintf(hd_gen, sizeof hd_gen, "b%d gen t/s", (int)batches[n_b - 1]);
    printf("  %-6s %-7s %9s %7s | %11s %10s %9s %9s | %11s %11s %12s\n", "model", "weights", "wt_MiB", "load_s",
           "b1 decode/s", "b1 gen/cpu", "MB/token", "GB/s", hd_dec, hd_gen, "gen/cpu s");
    bench_json *j = c->j;
    bench_json_obj(j, "moe");
    bench_json_int(j, "prompt_len", P);
    bench_json_int(j, "output_len", G);
    bench_json_int(j, "threads", c->threads);
    bench_json_int(j, "rounds", 1);              /* the big batch's (peers.py gives llama.cpp as many) */
    bench_json_int(j, "rounds_batch1", rounds);
    bench_json_num(j, "read_gbs", bw);
    bench_json_int(j, "experts", n_exp);
    bench_json_int(j, "experts_per_tok", k_exp);
    bench_json_arr(j, "rows");
    for (int k = 0; k < N_CFG; k++) {
        const int moe = strcmp(moe_cfgs[k].kind, "moe") == 0;
        const double gbs = active_b[k] * decode[k][0] * 1e-9;
        printf("  %-6s %-7s %9.1f %7.2f | %11.1f %10.1f %9.1f %9.1f | %11.1f %11.1f %12.1f\n", moe_cfgs[k].kind,
               cpu_wt_name(moe_cfgs[k].wt), weights[k] / 1048576.0, load_s[k], decode[k][0], gen_cpu[k][0],
               active_b[k] * 1e-6, gbs, decode[k][n_b - 1], gen[k][n_b - 1], gen_cpu[k][n_b - 1]);
        bench_json_obj(j, NULL);
        bench_json_str(j, "model", moe_cfgs[k].kind);
        bench_json_str(j, "weights", cpu_wt_name(moe_cfgs[k].wt));
        bench_json_str(j, "kv", "bf16");
        bench_json_str(j, "matmul", "exact");
        bench_json_num(j, "weight_bytes", weights[k]);
        bench_json_num(j, "load_s", load_s[k]);
        bench_json_num(j, "b1_bytes_per_token", active_b[k]);
        if (moe)
            bench_json_num(j, "b1_bytes_per_token_all_experts", all_b[k]);
        bench_json_arr(j, "batches");
        for (int bi = 0; bi < n_b; bi++) {
            bench_json_obj(j, NULL);
            bench_json_int(j, "batch", batches[bi]);
            bench_json_num(j, "decode_tok_s", decode[k][bi]);
            bench_json_num(j, "gen_tok_s", gen[k][bi]);
            bench_json_num(j, "prefill_tok_s", prefill[k][bi]);
            bench_json_num(j, "gen_tok_per_cpu_s", gen_cpu[k][bi]);
            bench_json_end(j);
        }
        bench_json_end(j);
        bench_json_end(j);
    }
    bench_json_end(j);
    bench_json_arr(j, "ratios");
    for (int k = 0; k + 1 < N_CFG; k += 2) { /* (moe, dense) pairs of one storage type */
        const double r_wall = decode[k][0] / decode[k + 1][0], r_cpu = gen_cpu[k][0] / gen_cpu[k + 1][0];
        const double r_big = gen[k][n_b - 1] / gen[k + 1][n_b - 1];
        printf("  moe / dense, %s: batch-1 decode %.2fx (wall), %.2fx (CPU time) [target >= 0.8x]; batch-%d "
               "generated %.2fx\n", cpu_wt_name(moe_cfgs[k].wt), r_wall, r_cpu, (int)batches[n_b - 1], r_big);
        bench_json_obj(j, NULL);
        bench_json_str(j, "weights", cpu_wt_name(moe_cfgs[k].wt));
        bench_json_num(j, "b1_decode_wall", r_wall);
        bench_json_num(j, "b1_gen_cpu", r_cpu);
        bench_json_num(j, "big_batch_gen", r_big);
        bench_json_end(j);
        /* item 3: batch 1 reads the routed experts only */
        const double all_gbs = all_b[k] * decode[k][0] * 1e-9;
        if (bw > 0.0) {
            printf("    routed experts only at batch 1: %.1f MB/token read at %.1f tok/s = %.1f GB/s; all %d "
                   "experts would be %.1f MB/token = %.1f GB/s, %.1fx the measured read bandwidth %.1f GB/s\n",
                   active_b[k] * 1e-6, decode[k][0], active_b[k] * decode[k][0] * 1e-9, (int)n_exp,
                   all_b[k] * 1e-6, all_gbs, all_gbs / bw, bw);
            bench_check(c, all_gbs > bw, "moe: batch 1 as fast as reading only the routed experts allows");
        }
    }
    bench_json_end(j);
    bench_json_end(j);
    printf("  (b1 gen/cpu, gen/cpu s: generated tokens / the process's CPU seconds of the run, incl. prefill; "
           "MB/token: weights one batch-1 step reads, the routed experts only; GB/s: that x b1 decode/s)\n");
    return 0;
}
