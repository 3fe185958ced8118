/* engine_harness: shared by the engine tests — random workloads, running a
 * workload through an engine over the fake backend under a given
 * configuration, and a byte signature of the outputs to compare runs. */
#ifndef PG_TEST_ENGINE_HARNESS_H
#define PG_TEST_ENGINE_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "fake_backend.h"
#include "test_support.h"

#define HARNESS_VOCAB 64

typedef struct wl_req {
    int32_t *prompt;
    int32_t n_prompt;
    sampling_params sp;
    int32_t stop_ids[2];
    int32_t arrive_step;        /* used when the run says so */
} wl_req;

typedef struct workload {
    wl_req *reqs;
    int32_t n;
    int32_t max_model_len;
} workload;

typedef struct wl_shape {
    int32_t n_requests;
    int32_t max_model_len;
    int32_t prompt_min, prompt_max;
    int32_t out_min, out_max;
    int32_t max_n;              /* parallel samples 1..max_n */
    bool ignore_eos_always;
    int32_t arrival_span;       /* arrive_step in [0, span] */
} wl_shape;

void workload_make(workload *w, const wl_shape *shape, uint64_t seed);
void workload_free(workload *w);

typedef struct run_cfg {
    int32_t num_blocks;         /* 0: enough for everything at once */
    int32_t block_size;
    int32_t max_num_seqs;
    int32_t max_num_batched_tokens;
    bool prefix_caching;
    kv_layout layout;
    bool staggered;             /* add requests at their arrive_step */
    bool fan_out_always;        /* engine_params.fan_out_always */
    int32_t attn_window;        /* the fake model's sliding window (fake_backend_params) */
    bool follow_tokens;         /* fake_backend_params.follow_tokens (beam search) */
    int32_t sliding_window;     /* engine_params.sliding_window: 0 keeps every block */
    float watermark;            /* admission watermark: 0 = the engine's default,
                                   < 0 = none (0 to the engine) */
} run_cfg;

typedef struct run_result {
    char **sig;                 /* [n requests] output signature */
    engine_stats stats;
    fake_backend_counts counts;
    int32_t fcfs_violations;    /* see harness.c */
    int32_t readmit_violations;
} run_result;

/* Fewest blocks in which every request of w can run (alone). */
int32_t workload_min_blocks(const workload *w, int32_t block_size, int32_t n_max_override);
void run_workload(const workload *w, const run_cfg *c, run_result *out);
void run_result_free(run_result *r, int32_t n);
/* Asserts both runs gave identical signatures (names the first difference). */
void assert_same_outputs(const run_result *a, const run_result *b, int32_t n, const char *what);

#endif /* PG_TEST_ENGINE_HARNESS_H */
