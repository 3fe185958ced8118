/* golden_support: the stories260K test data shared by the executors' end to
 * end tests (tests/e2e/test_goldens.c on the CPU, tests/gpu/test_cuda_e2e.c
 * on CUDA): the model (../shared/models/stories260K: config + weights), the
 * goldens made by upstream llama2.c run.c (../shared/goldens/
 * stories260K-greedy.jsonl and stories260K-logits.jsonl), and the two ways
 * the tests drive a model: one prompt through model_forward, and the sizes
 * of a model + engine pair.
 *
 * Failures inside these helpers are cmocka failures (assert_* / fail_msg):
 * call them from a cmocka test or group setup. */
#ifndef PG_GOLDEN_SUPPORT_H
#define PG_GOLDEN_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "model.h"
#include "safetensors.h"

#define PG_GOLDEN_MAX 16

/* One line of stories260K-greedy.jsonl. Arrays and strings are malloc'd and
 * owned by the pg_golden_set. */
typedef struct pg_golden {
    char *prompt;                /* [prompt_len] UTF-8, NUL-terminated */
    size_t prompt_len;
    int32_t *prompt_ids;         /* [n_prompt] tokenizer ids incl. BOS */
    int32_t n_prompt;
    int32_t *completion_ids;     /* [n_completion] greedy ids */
    int32_t n_completion;
    char *completion_text;       /* [completion_text_len], NUL-terminated */
    size_t completion_text_len;
    int32_t max_new_tokens;
    bool stop;                   /* finish_reason "stop" (else "length") */
    int32_t stop_token_id;       /* the eos id that stopped it; -1 for "length" */
} pg_golden;

/* One line of stories260K-logits.jsonl: the logits after the last prompt
 * token. Arrays owned by the pg_golden_set. */
typedef struct pg_logits_golden {
    int32_t *prompt_ids;         /* [n_prompt] */
    int32_t n_prompt;
    int32_t argmax;
    float *logits;               /* [n_logits] = [V] */
    int32_t n_logits;
} pg_logits_golden;

typedef struct pg_golden_set {
    char model_dir[4096];        /* the model folder (for tok_load) */
    llama_config cfg;
    st_file *st;                 /* owned: closed by pg_golden_set_free */
    pg_golden g[PG_GOLDEN_MAX];
    int n_g;
    pg_logits_golden lg[PG_GOLDEN_MAX];
    int n_lg;
} pg_golden_set;

/* Loads the config, opens the weights and reads both golden files into s
 * (zeroed first). Returns 0, or -1 with the reason on stderr when the model
 * cannot be loaded (s is then left for pg_golden_set_free). A missing or
 * malformed golden file, or fewer than 8 greedy / 4 logits goldens, fails
 * the test. The shared folder itself is pg_test_shared_path's business
 * (exit 77 when absent outside CI). */
int pg_golden_set_load(pg_golden_set *s);
/* Frees everything pg_golden_set_load made; s may be partly loaded. */
void pg_golden_set_free(pg_golden_set *s);

/* Runs ids[0..n) through model_forward as one sequence on physical blocks
 * 0, 1, 2, ... (slot = position), `chunk` tokens per step (chunk = n: one
 * prefill; 1: one token per step), and leaves the logits after the last
 * token in logits [V]. bs must be the model's block size. */
void pg_golden_run_prompt(model *m, const int32_t *ids, int32_t n, int32_t chunk, int32_t bs,
                          float *logits);

/* The KV pool and step sizes of one model + engine pair. */
typedef struct pg_golden_pool {
    int32_t block_size, num_blocks, max_num_seqs, max_num_batched_tokens;
    bool prefix_caching;
} pg_golden_pool;

/* model_params for a pool. */
model_params pg_golden_model_params(const pg_golden_pool *p);
/* engine_params for a pool over s's model: max_model_len and the eos ids
 * from s->cfg (borrowed from s), invariants checked after every step. */
engine_params pg_golden_engine_params(const pg_golden_set *s, const pg_golden_pool *p);

#endif /* PG_GOLDEN_SUPPORT_H */
