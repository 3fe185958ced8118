/* fake_backend: an engine_backend without a model, for testing the engine.
 * It keeps its own KV store of num_blocks * block_size slots, each holding
 * (token id, position, writer sequence id), and for every step:
 *   - checks the batch's shape (query_start, seq_lens, positions, slots
 *     consistent with the block tables, logits_rows);
 *   - writes every token into its slot with a hash of the writer's whole
 *     prefix (its tokens 0..position, as a real K/V depends on all of
 *     them), failing if the slot's block is shared (ref count > 1:
 *     copy-on-write must have happened first) — unless the block is in the
 *     prefix cache: a full prompt block is committed when scheduled, so a
 *     request admitted in the same step may already share the block its
 *     owner is writing (every holder expects the same content, which the
 *     reads below verify);
 *   - checks that every block in the prefix cache now holds slots written
 *     since the block was last taken (kv_pool_block_epoch): a block must
 *     not be findable before its K/V are computed;
 *   - then (as attention follows kv_write in every layer) reads each
 *     sequence's whole context through its block table and fails if a slot
 *     was never written, is stale (written before its block was last
 *     taken) or holds anything but that sequence's own (token, position,
 *     prefix) — the expected tokens are the registered prompt and
 *     the tokens the sequence itself fed at later positions (a
 *     recomputation must feed the same ones);
 *   - returns logits that are a hash of the last few tokens read back from
 *     the store and the position, so a wrong read changes the output.
 * copy_blocks copies slot records (and checks the destination is private).
 * The first violation is kept (fake_backend_error) and fails the step. */
#ifndef PG_TEST_FAKE_BACKEND_H
#define PG_TEST_FAKE_BACKEND_H

#include <stdint.h>

#include "engine.h"

typedef struct fake_backend fake_backend;

typedef struct fake_backend_params {
    int32_t vocab_size;
    int32_t num_blocks;
    int32_t block_size;
    int32_t window;        /* tokens hashed into the logits (>= 1) */
    int32_t attn_window;   /* 0: every block table entry below seq_len must be a
                              block; W >= window: a sliding-window model, entries
                              wholly below a sequence's first query - W + 1 may be
                              null (-1) and are skipped */
    uint64_t salt;         /* changes the "model" */
    bool follow_tokens;    /* take each sequence's expected tokens from the engine
                              (engine_step_seq_tokens) at every step instead of
                              requiring that a sequence keep what it fed: beam
                              search slots change beams. The reads are still
                              checked against those tokens */
} fake_backend_params;

typedef struct fake_backend_counts {
    uint64_t steps, tokens, slot_writes, slot_reads, block_copies;
    uint64_t null_entries_skipped; /* slots of null (dropped) entries not read */
    /* attn_window > 0: the most blocks one sequence's table held in a step,
     * and the most by which that exceeded ceil((W - 1 + q_len) / B) + 1 (the
     * blocks touching what its queries read; <= 0 when nothing else is held) */
    int32_t max_held_blocks, max_held_over_bound;
} fake_backend_counts;

fake_backend *fake_backend_create(const fake_backend_params *p);
void fake_backend_destroy(fake_backend *f); /* accepts NULL */
engine_backend fake_backend_iface(fake_backend *f);
/* Must be called after engine_create (ref counts and sequence ids). */
void fake_backend_attach(fake_backend *f, const engine *e);
/* Registers request id's prompt (call right after engine_add_request). */
void fake_backend_set_prompt(fake_backend *f, uint64_t request_id, const int32_t *prompt,
                             int32_t n);
/* Adds nreq requests with the prompts the engine tests share (request k:
 * 3 + k % 7 ids, id i = (31 k + 7 i + 1) % vocab), sampling params_of(k),
 * user pointer k, and registers each prompt. 0, or engine_add_request's
 * error (err says which request). */
int fake_backend_add_requests(fake_backend *f, engine *e, int nreq, int32_t vocab,
                              sampling_params (*params_of)(int k), pg_error *err);
/* The first violation seen, or NULL. */
const char *fake_backend_error(const fake_backend *f);
fake_backend_counts fake_backend_get_counts(const fake_backend *f);
/* Called with the batch's sequence ids at every forward (may be NULL). */
typedef void (*fake_backend_step_fn)(void *user, const uint64_t *seq_ids, const int32_t *qstart,
                                     const int32_t *positions, int32_t num_seqs);
void fake_backend_on_step(fake_backend *f, fake_backend_step_fn fn, void *user);

#endif /* PG_TEST_FAKE_BACKEND_H */
