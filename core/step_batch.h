/* step_batch: the ragged batch of one engine step — the only thing the
 * model forward and the executors see of the scheduler (vLLM v1's shape).
 * Prefill, chunked prefill, decode and cached prefixes are all this one
 * form: sequence s contributes the tokens query_start[s] .. query_start[s+1]-1,
 * which are the last q_len = query_start[s+1] - query_start[s] positions of
 * its context of seq_lens[s] tokens (positions seq_lens[s]-q_len .. seq_lens[s]-1).
 *
 * Plain data; every array is borrowed from the engine and valid for the
 * duration of the step. T = num_tokens, S = num_seqs, L = num_logits.
 */
#ifndef PG_STEP_BATCH_H
#define PG_STEP_BATCH_H

#include <stdint.h>

typedef struct step_batch {
    int32_t num_tokens;           /* T >= 1 */
    int32_t num_seqs;             /* S >= 1 */
    int32_t block_size;           /* tokens per KV block (power of two) */

    const int32_t *token_ids;     /* [T] */
    const int32_t *positions;     /* [T] position of each token in its sequence */
    const int32_t *slots;         /* [T] physical KV slot = block_id * block_size + offset,
                                     where this token's K and V are written */

    const int32_t *query_start;   /* [S+1] prefix sums of per-sequence token counts;
                                     query_start[0] = 0, query_start[S] = T */
    const int32_t *seq_lens;      /* [S] context length after this step (>= q_len) */
    const int32_t *block_tables;  /* [S][block_table_stride] physical block ids;
                                     row s holds ceil(seq_lens[s] / block_size) entries; with
                                     a sliding window W the entries wholly below the lowest
                                     key of the sequence's first query (p - W + 1) may be -1
                                     (blocks freed behind the window: never read); any other
                                     entry is a block id, else the step is refused */
    int32_t block_table_stride;   /* row stride of block_tables, in entries */
    int32_t max_seq_len;          /* max over seq_lens (launch sizing) */
    int32_t max_query_len;        /* max over q_len (1 for a pure decode step) */

    int32_t num_logits;           /* L: rows that need logits this step */
    const int32_t *logits_rows;   /* [L] token rows (0..T-1), increasing; the last
                                     scheduled token of every sequence that samples */
    int32_t sliding_window;       /* 0: full causal attention; W > 0: the token at
                                     position p attends to positions
                                     max(0, p - W + 1) .. p only (W keys: transformers'
                                     sliding_window_overlay, kv_idx > q_idx - W) */
    const int32_t *lora_slots;    /* [T] resident LoRA adapter slot of each token row
                                     (executor_ops.lora_add), -1: the base model; NULL
                                     when no row of the step uses an adapter */
} step_batch;

#endif /* PG_STEP_BATCH_H */
