/* bench_engine: a model loaded onto the CPU executor once, and workloads run
 * through fresh engines over it (no CLI, prompts as token ids, EOS ignored,
 * so every request generates exactly its output length).
 *
 * The model is created with the largest KV pool any run will use; each run
 * gets an engine whose pool (engine_params.num_blocks) may be smaller — the
 * engine only hands out block ids below its own num_blocks, so the model's
 * extra blocks simply stay unused and the KV budget of a run is exactly
 * num_blocks * kv_bytes_per_block.
 */
#ifndef PG_BENCH_ENGINE_H
#define PG_BENCH_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench_workload.h"
#include "config.h"
#include "cpu_executor.h"
#include "engine.h"
#include "executor.h"
#include "model.h"
#include "pg_error.h"

typedef struct bench_model {
    char dir[512];
    char name[64];               /* last path component of dir */
    llama_config cfg;
    executor *ex;
    model *m;
    engine_backend backend;
    model_params mp;             /* as created (largest pool, S, T) */
    int32_t threads;
    size_t weight_bytes;         /* model_weight_bytes on the executor */
    size_t kv_bytes_per_block;   /* all layers, K and V */
    double params_layers;        /* matmul weights per token in the layers */
    double params_total;         /* + embedding (+ lm_head when untied) */
    double load_s;               /* config + safetensors + upload + KV alloc */
} bench_model;

/* Loads dir (config.json + safetensors) onto a CPU executor with `threads`
 * threads and a KV pool of mp->num_kv_blocks blocks. */
int bench_model_load(bench_model *bm, const char *dir, int32_t threads, const model_params *mp,
                     pg_error *err);
/* The same on a CPU executor made from cp (threads, weight and KV storage). */
int bench_model_load_with(bench_model *bm, const char *dir, const cpu_executor_params *cp,
                          const model_params *mp, pg_error *err);
void bench_model_free(bench_model *bm); /* accepts a zeroed struct */

/* Context limit of the model (max_position_embeddings). */
int32_t bench_model_ctx(const bench_model *bm);

typedef struct bench_run_params {
    int32_t num_blocks;              /* the run's KV budget (<= bm->mp.num_kv_blocks) */
    int32_t block_size;              /* must equal bm->mp.block_size */
    int32_t max_num_seqs;
    int32_t max_num_batched_tokens;
    int32_t max_model_len;           /* 0: the model's context */
    bool prefix_caching;
    kv_layout layout;
    int32_t n;                       /* parallel samples per request (>= 1) */
    bool fan_out_always;             /* n > 1 as n child requests, never forked
                                        (engine_params.fan_out_always) */
    bool keep_window_blocks;         /* engine_params.sliding_window = 0 even for a
                                        sliding-window model (default: its window, so
                                        blocks behind it are freed) */
    int32_t prompt_logprobs;         /* -1 (default): none; k >= 0: every request asks
                                        for prompt logprobs with top k (scoring) */
    bool prompt_logprobs_per_step;   /* engine_params.prompt_logprobs_per_step: the
                                        one-row-a-step path before issue 21 */
    const int32_t *prompt_logprobs_from; /* [requests] sampling_params.prompt_logprobs_from
                                        of each request; NULL: 0 (every prompt token) */
    float temperature;               /* 0 = greedy */
    float top_p;                     /* 0 (default) or 1: off */
    uint64_t seed;
    /* Request 0 is added alone and stepped until its prompt is computed, and
     * only then are the others added (timing covers all of it). With a shared
     * system prefix this puts the prefix in the prefix cache first, as the
     * paper's shared-prefix experiment has it precomputed; otherwise requests
     * admitted in the same step all miss (nothing is cached yet). */
    bool first_ahead;
    bool beam_search;                /* every request a beam search of width n
                                        (sampling_params.use_beam_search, greedy) */
    bool beam_copy_blocks;           /* engine_params.beam_copy_blocks: beams copy their
                                        parent's blocks instead of sharing them */
    int32_t n_loras;                 /* LoRA adapters the model holds (model_lora_add):
                                        request i runs under adapter 1 + i % n_loras
                                        (sampling_params.lora), all within max_loras =
                                        n_loras; 0 (default): the base model */
} bench_run_params;

typedef struct bench_result {
    int32_t requests;
    int32_t seqs;                    /* requests * n */
    double wall_s;                   /* first step to last finished */
    double prefill_s;                /* steps that computed prompt tokens */
    double decode_s;                 /* steps that computed none */
    uint64_t decode_generated;       /* tokens generated by pure decode steps */
    double req_per_s, gen_tok_s, prompt_tok_s, decode_tok_s;
    double flops;                    /* model FLOPs of the run (see bench_engine.c) */
    double gflops;                   /* flops / wall_s */
    double occupancy_mean;           /* mean over steps of blocks_in_use / num_blocks */
    double running_mean;             /* mean over steps of running requests */
    engine_stats stats;              /* at the end of the run */
    /* KV blocks with sharing (referenced blocks) against without (every
     * block table entry its own block: kv_pool_table_entries), summed over
     * steps and at their peaks */
    double kv_shared_sum, kv_unshared_sum;
    int32_t kv_shared_peak;
    int64_t kv_unshared_peak;
} bench_result;

bench_run_params bench_run_params_default(const bench_model *bm);

/* Runs every request of w (all added at t = 0, in order) to completion on a
 * fresh engine and fills *out. Fails (PG_EFORMAT) if any sequence did not
 * generate exactly its output length, which would make the figures lie. */
int bench_run(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
              bench_result *out, pg_error *err);

#endif /* PG_BENCH_ENGINE_H */
