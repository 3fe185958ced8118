/* engine: the step loop (see engine.h). One step = schedule (scheduler.c
 * over kv_pool.c; blocks the step fills enter the prefix cache there) ->
 * build the ragged step_batch -> copy-on-write copies -> backend forward ->
 * fork parallel samples -> sample (sampler.c) -> stop rules (sequence.c) ->
 * release finished sequences. */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_phase.h"
#include "beam_search.h"
#include "grammar.h"
#include "kv_pool.h"
#include "pg_logsoftmax.h"
#include "pooling.h"
#include "sample_rows.h"
#include "sampler.h"
#include "scheduler.h"
#include "sequence.h"
#include "step_profile.h"
#include "tokenizer.h"

/* A compiled constraint shared by the requests that give the same one
 * (kind and text): compiled once, one mask cache. Freed with its last
 * request. */
typedef struct gram_entry {
    grammar_kind kind;
    char *text;
    size_t len;
    grammar *g;
    grammar_cache *cache;
    int32_t refs;
    struct gram_entry *next;
} gram_entry;

/* Rows of one lm_head slice for prompt logprobs (forward_rows): 128 x
 * vocab f32 on the host (16 MB at 32k, 78 MB at 152k), whatever the chunk;
 * the CUDA GEMM's fixed row chunk. */
#define ENGINE_SCORE_SLICE_ROWS 128

/* Mask-cache memory per distinct constraint (grammar_cache_create): about
 * 500 states of a 128k vocabulary; past it masks are walked each time. */
#define ENGINE_GRAMMAR_CACHE_BYTES ((size_t)8 << 20)

struct engine {
    engine_params p;
    int32_t max_seqs;           /* min(max_num_seqs, max_num_batched_tokens) */
    int32_t max_blocks;         /* ceil(max_model_len / block_size) */
    engine_backend be;
    const tokenizer *tok;
    int32_t *eos;               /* [n_eos] copy of p.eos_token_ids */
    int32_t n_eos;
    kv_pool *pool;
    scheduler *sched;
    sampler_workspace *ws;
    /* step buffers */
    int32_t *token_ids, *positions, *slots;     /* [max_num_batched_tokens] */
    int32_t *lora_slots;                        /* [max_num_batched_tokens] adapter slot or -1 */
    int32_t *query_start;                       /* [max_seqs + 1] */
    int32_t *seq_lens;                          /* [max_seqs] */
    int32_t *logits_rows;                       /* [max_num_batched_tokens] */
    /* what each logits row is for: a prompt row (row_req[j] != NULL) scores
     * row_req[j]->prompt[row_pos[j] + 1]; a sampling row (row_req[j] NULL)
     * goes to logits row -row_pos[j] - 1 */
    request **row_req;                          /* [max_num_batched_tokens] */
    int32_t *row_pos;                           /* [max_num_batched_tokens] */
    int32_t n_prompt_rows;                      /* of the step being run */
    bool plp_per_step;                          /* engine_params prompt_logprobs_per_step,
                                                   or no backend forward_rows */
    float *slice;                               /* [slice_rows][vocab] forward_rows slices */
    int32_t slice_rows;
    int32_t *block_tables;                      /* [max_seqs][max_blocks], rows at bt_stride */
    /* the block table rows kept from step to step (build_batch): row i holds
     * the first row_n[i] entries of table row_tab[i] at its version row_ver[i],
     * so a sequence in the same row again gets only its new entries */
    int32_t bt_stride;                          /* entries per row now; 0: no row valid */
    int32_t *row_tab;                           /* [max_seqs] kv_pool table handle, -1: none */
    uint32_t *row_ver;                          /* [max_seqs] */
    int32_t *row_n;                             /* [max_seqs] */
    uint64_t *seq_ids;                          /* [max_seqs] */
    const sequence **seq_at;                    /* [max_seqs] the step's sequences */
    request **done;                             /* [max_seqs] retiring this step */
    float *logits;                              /* [max_seqs][vocab] sampling rows */
    float *scratch;                             /* [vocab] */
    /* the step's sampling rows taken on the device (backend greedy_rows) */
    uint8_t *greedy;                            /* [max_seqs] 1: plain greedy row */
    int32_t *greedy_ids;                        /* [max_seqs] their ids */
    /* the step's sampling rows sampled on the device (backend sample_rows):
     * dsamp[r] = 1 + the row's index in srows, 0 = not there */
    int32_t *dsamp;                             /* [max_seqs] */
    sample_rows *srows;
    /* the step's logits rows whose logprobs the backend takes itself
     * (backend logprob_rows): prompt-logprob rows and greedy rows with
     * logprobs; NULL when the backend has none */
    pg_lsm_row *lp_rows;                        /* [max_num_batched_tokens] */
    bool lp_active;                             /* lp_rows marks rows of this step */
    int32_t *samp_lrow;                         /* [max_seqs] sampling row s -> its logits row */
    float *hidden;                              /* [max_num_batched_tokens][H] pooled
                                                   rows, allocated at the first embedding */
    /* structured outputs: the vocabulary trie (built at the first constrained
     * request) and one mask */
    grammar_vocab *gvocab;
    uint64_t *gmask;                            /* [grammar_mask_words] */
    gram_entry *grams;                          /* live compiled constraints */
    int32_t top_ids[SAMPLING_PARAMS_MAX_LOGPROBS];
    float top_lp[SAMPLING_PARAMS_MAX_LOGPROBS];
    /* finished outputs, FIFO */
    request_output **fin;
    int32_t fin_head, fin_n, fin_cap;
    uint64_t next_id;
    int32_t n_unfinished;
    engine_stats stats;
    double util_filled_sum, util_alloc_sum;
    bool dev_greedy, dev_sample;                /* the step in flight marked device rows */
    engine_overlap *ov;                         /* the overlapped loop, NULL: serial */
    step_profile *sprof;                        /* borrowed, NULL: no step profile */
    double samp_s;                              /* host sampling time of the step (sprof) */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

engine_params engine_params_default(void)
{
    engine_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.num_blocks = 1024;
    p.max_num_seqs = 256;
    p.max_num_batched_tokens = 2048;
    p.max_model_len = 2048;
    p.prefix_caching = true;
    p.layout = KV_LAYOUT_PAGED;
    p.check_invariants = false;
    p.watermark = 0.01f;
    p.beam_eos_token_id = -1;
    return p;
}

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

int32_t engine_watermark_blocks(const engine_params *p)
{
    if (!(p->watermark > 0.0f) || p->layout != KV_LAYOUT_PAGED) return 0;
    double w = ceil((double)p->watermark * (double)p->num_blocks);
    return w < 1.0 ? 1 : (int32_t)w;
}

int engine_create(engine **out, const engine_params *p, const engine_backend *backend,
                  const tokenizer *tok, pg_error *err)
{
    *out = NULL;
    if (!p || !backend || !backend->forward || backend->vocab_size < 1)
        return pg_error_set(err, PG_EINVAL, "engine: expected params and a backend with a forward "
                            "and vocab_size >= 1");
    if (p->max_num_seqs < 1 || p->max_num_batched_tokens < 1 || p->max_model_len < 2)
        return pg_error_set(err, PG_EINVAL, "engine: expected max_num_seqs >= 1, "
                            "max_num_batched_tokens >= 1, max_model_len >= 2, got %d, %d, %d",
                            (int)p->max_num_seqs, (int)p->max_num_batched_tokens,
                            (int)p->max_model_len);
    if (p->layout != KV_LAYOUT_PAGED && p->layout != KV_LAYOUT_CONTIGUOUS)
        return pg_error_set(err, PG_EINVAL, "engine: unknown kv layout %d", (int)p->layout);
    if (p->n_loras < 0 || p->max_loras < 0)
        return pg_error_set(err, PG_EINVAL, "engine: expected n_loras, max_loras >= 0, got %d, %d",
                            (int)p->n_loras, (int)p->max_loras);
    if (!(p->watermark >= 0.0f && p->watermark < 1.0f))
        return pg_error_set(err, PG_EINVAL, "engine: watermark: expected a fraction of the pool "
                            "in [0, 1), got %g", (double)p->watermark);
    if (p->sliding_window < 0)
        return pg_error_set(err, PG_EINVAL, "engine: sliding_window: expected >= 0, got %d",
                            (int)p->sliding_window);
    if (p->n_eos_token_ids < 0 || (p->n_eos_token_ids > 0 && !p->eos_token_ids))
        return pg_error_set(err, PG_EINVAL, "engine: expected %d eos ids, got NULL",
                            (int)p->n_eos_token_ids);
    for (int32_t i = 0; i < p->n_eos_token_ids; i++)
        if (p->eos_token_ids[i] < 0 || p->eos_token_ids[i] >= backend->vocab_size)
            return pg_error_set(err, PG_EINVAL, "engine: eos id %d: expected an id in [0, %d)",
                                (int)p->eos_token_ids[i], (int)backend->vocab_size);
    if (p->beam_copy_blocks && !backend->copy_blocks)
        return pg_error_set(err, PG_EINVAL, "engine: beam_copy_blocks needs backend copy_blocks");
    if (p->beam_eos_token_id < -1 || p->beam_eos_token_id >= backend->vocab_size)
        return pg_error_set(err, PG_EINVAL, "engine: beam_eos_token_id %d: expected -1 or an id in "
                            "[0, %d)", (int)p->beam_eos_token_id, (int)backend->vocab_size);
    engine *e = calloc(1, sizeof *e);
    if (!e) return pg_error_set(err, PG_ENOMEM, "engine: out of memory");
    e->p = *p;
    e->be = *backend;
    e->tok = tok;
    e->max_seqs = p->max_num_seqs < p->max_num_batched_tokens ? p->max_num_seqs
                                                               : p->max_num_batched_tokens;
    int rc;
    kv_pool_params pp = {.num_blocks = p->num_blocks, .block_size = p->block_size,
                         .prefix_caching = p->prefix_caching && p->layout == KV_LAYOUT_PAGED};
    if ((rc = kv_pool_create(&e->pool, &pp, err))) goto fail;
    e->max_blocks = ceil_div(p->max_model_len, p->block_size);
    scheduler_params sp = {.max_num_seqs = e->max_seqs,
                           .max_num_batched_tokens = p->max_num_batched_tokens,
                           .max_model_len = p->max_model_len, .layout = p->layout,
                           .prefix_caching = pp.prefix_caching,
                           .watermark_blocks = engine_watermark_blocks(p),
                           .plp_one_per_step = p->prompt_logprobs_per_step || !backend->forward_rows,
                           .sliding_window = p->sliding_window, .max_loras = p->max_loras};
    if ((rc = scheduler_create(&e->sched, &sp, e->pool, err))) goto fail;
    size_t T = (size_t)p->max_num_batched_tokens, S = (size_t)e->max_seqs;
    size_t V = (size_t)backend->vocab_size;
    e->n_eos = p->n_eos_token_ids;
    e->eos = malloc((size_t)(e->n_eos + 1) * sizeof *e->eos);
    e->ws = sampler_workspace_create(backend->vocab_size);
    e->token_ids = malloc(T * sizeof(int32_t));
    e->positions = malloc(T * sizeof(int32_t));
    e->slots = malloc(T * sizeof(int32_t));
    e->lora_slots = malloc(T * sizeof(int32_t));
    e->query_start = malloc((S + 1) * sizeof(int32_t));
    e->seq_lens = malloc(S * sizeof(int32_t));
    e->logits_rows = malloc(T * sizeof(int32_t));
    e->row_req = malloc(T * sizeof(request *));
    e->row_pos = malloc(T * sizeof(int32_t));
    e->plp_per_step = p->prompt_logprobs_per_step || !backend->forward_rows;
    /* at most max_seqs rows too: the logits buffers an executor sizes for
     * a step's sampling rows then hold a slice (cli/device.c's CUDA plan) */
    e->slice_rows = (int32_t)(T < ENGINE_SCORE_SLICE_ROWS ? T : ENGINE_SCORE_SLICE_ROWS);
    if (e->slice_rows > e->max_seqs) e->slice_rows = e->max_seqs;
    if (!e->plp_per_step) e->slice = malloc((size_t)e->slice_rows * V * sizeof(float));
    e->block_tables = malloc(S * (size_t)e->max_blocks * sizeof(int32_t));
    e->row_tab = malloc(S * sizeof(int32_t));
    e->row_ver = malloc(S * sizeof(uint32_t));
    e->row_n = malloc(S * sizeof(int32_t));
    e->seq_ids = malloc(S * sizeof(uint64_t));
    e->seq_at = calloc(S, sizeof *e->seq_at);
    e->done = malloc(S * sizeof(request *));
    e->logits = malloc(S * V * sizeof(float));
    e->scratch = malloc(V * sizeof(float));
    e->greedy = malloc(S);
    e->greedy_ids = malloc(S * sizeof(int32_t));
    e->dsamp = calloc(S, sizeof(int32_t));
    e->srows = sample_rows_create((int32_t)S);
    e->samp_lrow = malloc(S * sizeof(int32_t));
    if (backend->logprob_rows) e->lp_rows = calloc(T, sizeof *e->lp_rows);
    if (!e->eos || !e->ws || !e->token_ids || !e->positions || !e->slots || !e->lora_slots || !e->query_start ||
        !e->seq_lens || !e->logits_rows || !e->row_req || !e->row_pos ||
        (!e->plp_per_step && !e->slice) || !e->block_tables || !e->row_tab || !e->row_ver ||
        !e->row_n || !e->seq_ids || !e->seq_at || !e->done || !e->logits ||
        !e->scratch || !e->greedy || !e->greedy_ids || !e->dsamp || !e->srows || !e->samp_lrow ||
        (backend->logprob_rows && !e->lp_rows)) {
        rc = pg_error_set(err, PG_ENOMEM, "engine: out of memory for step buffers (%zu tokens, "
                          "%zu sequences, vocab %zu)", T, S, V);
        goto fail;
    }
    /* an asynchronous backend: the host prepares a step while the device
     * runs the one before (engine_overlap.c) */
    if (backend->step_defer && backend->step_wait && !p->serial_loop &&
        (rc = engine_overlap_create(&e->ov, e->max_seqs, err)))
        goto fail;
    if (e->n_eos > 0) memcpy(e->eos, p->eos_token_ids, (size_t)e->n_eos * sizeof *e->eos);
    e->p.eos_token_ids = e->eos;
    e->stats.num_blocks = p->num_blocks;
    *out = e;
    return PG_OK;
fail:
    engine_destroy(e);
    return rc;
}

static void gram_release(engine *e, gram_entry *g)
{
    if (!g || --g->refs > 0) return;
    for (gram_entry **p = &e->grams; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    grammar_cache_destroy(g->cache);
    grammar_destroy(g->g);
    free(g->text);
    free(g);
}

/* The shared compile of sp's constraint (a new reference). */
static int gram_acquire(engine *e, const sampling_params *sp, gram_entry **out, pg_error *err)
{
    const char *text = sp->structured ? sp->structured : "";
    size_t len = sp->structured ? sp->structured_len : 0;
    for (gram_entry *g = e->grams; g; g = g->next)
        if (g->kind == sp->structured_kind && g->len == len && memcmp(g->text, text, len) == 0) {
            g->refs++;
            *out = g;
            return PG_OK;
        }
    gram_entry *g = calloc(1, sizeof *g);
    if (!g || !(g->text = malloc(len + 1))) {
        free(g);
        return pg_error_set(err, PG_ENOMEM, "engine: out of memory for a constraint");
    }
    memcpy(g->text, text, len);
    g->text[len] = '\0';
    g->len = len;
    g->kind = sp->structured_kind;
    int rc = grammar_compile(&g->g, g->kind, g->text, len, err);
    if (!rc) rc = grammar_cache_create(&g->cache, g->g, e->gvocab, ENGINE_GRAMMAR_CACHE_BYTES, err);
    if (rc) {
        grammar_destroy(g->g);
        free(g->text);
        free(g);
        return rc;
    }
    g->refs = 1;
    g->next = e->grams;
    e->grams = g;
    *out = g;
    return PG_OK;
}

static void destroy_request(engine *e, request *r)
{
    gram_release(e, r->gentry);
    r->gentry = NULL;
    for (int32_t i = 0; i < r->n; i++)
        if (r->seqs[i].table >= 0) kv_pool_table_delete(e->pool, r->seqs[i].table);
    request_destroy(r);
}

/* Frees a child shell (out of the scheduler's queues; its sequence stays
 * in the parent). Returns its parent when that was the last child (the
 * caller retires or destroys it), else NULL. */
static request *detach_child(request *c)
{
    request *p = c->parent;
    c->seqs[0].req = p;
    p->n_live--; /* each child ran one of the parent's live sequences */
    request_destroy(c);
    return --p->n_children == 0 ? p : NULL;
}

/* Frees a request taken out of the scheduler's queues (teardown). */
static void drop_request(engine *e, request *r)
{
    if (r->parent && !(r = detach_child(r))) return;
    destroy_request(e, r);
}

void engine_destroy(engine *e)
{
    if (!e) return;
    if (e->ov) { /* a step in flight writes into the step buffers */
        engine_overlap_drain(e->ov, e);
        engine_overlap_destroy(e->ov);
        e->ov = NULL;
    }
    if (e->sched) {
        request *r;
        while ((r = scheduler_running(e->sched))) {
            scheduler_remove(e->sched, r);
            drop_request(e, r);
        }
        while ((r = scheduler_waiting(e->sched))) {
            scheduler_remove_waiting(e->sched, r);
            drop_request(e, r);
        }
    }
    for (int32_t i = 0; i < e->fin_n; i++)
        request_output_free(e->fin[(e->fin_head + i) % e->fin_cap]);
    free(e->fin);
    scheduler_destroy(e->sched);
    kv_pool_destroy(e->pool);
    sampler_workspace_destroy(e->ws);
    free(e->eos);
    free(e->token_ids);
    free(e->positions);
    free(e->slots);
    free(e->lora_slots);
    free(e->query_start);
    free(e->seq_lens);
    free(e->logits_rows);
    free(e->row_req);
    free(e->row_pos);
    free(e->slice);
    free(e->block_tables);
    free(e->row_tab);
    free(e->row_ver);
    free(e->row_n);
    free(e->seq_ids);
    free(e->seq_at);
    free(e->done);
    free(e->logits);
    free(e->scratch);
    free(e->greedy);
    free(e->dsamp);
    sample_rows_destroy(e->srows);
    free(e->greedy_ids);
    free(e->samp_lrow);
    free(e->lp_rows);
    free(e->hidden);
    grammar_vocab_destroy(e->gvocab);
    free(e->gmask);
    free(e);
}

/* Blocks a request needs at its longest (each sequence at its cap, the
 * prompt's full blocks shared by its n sequences; n = 1: one child). */
static int64_t request_blocks_needed(const engine *e, int32_t n_prompt, int32_t n,
                                     int32_t max_output)
{
    int32_t bs = e->p.block_size;
    if (e->p.layout == KV_LAYOUT_CONTIGUOUS) return (int64_t)n * e->max_blocks;
    int64_t total = ceil_div(n_prompt + max_output, bs);
    int64_t need = n == 1 ? total : n_prompt / bs + (int64_t)n * (total - n_prompt / bs);
    if (e->p.sliding_window > 0) {
        /* blocks behind the window are dropped before each step's
         * allocation: a sequence holds those touching its window and its
         * chunk, + 1 kept for the prefix-cache chain (kv_pool_drop_before) */
        int32_t chunk = e->p.max_num_batched_tokens < n_prompt + max_output
                            ? e->p.max_num_batched_tokens : n_prompt + max_output;
        int64_t per_seq = ceil_div(e->p.sliding_window - 1 + chunk, bs) + 2;
        if (per_seq < total && (int64_t)n * per_seq < need) need = (int64_t)n * per_seq;
    }
    return need;
}

/* The vocabulary as the automaton sees it (tok_token_bytes per id; ids the
 * tokenizer does not know never match), built once. */
static int ensure_grammar_vocab(engine *e, pg_error *err)
{
    if (e->gvocab) return PG_OK;
    if (!e->tok)
        return pg_error_set(err, PG_EINVAL, "request: structured outputs need a tokenizer, got none");
    int32_t V = e->be.vocab_size;
    char **bytes = calloc((size_t)V, sizeof *bytes);
    uint32_t *lens = calloc((size_t)V, sizeof *lens);
    int rc = bytes && lens ? PG_OK : PG_ENOMEM;
    for (int32_t i = 0; i < V && !rc; i++) {
        size_t l = 0;
        rc = tok_token_bytes(e->tok, i, &bytes[i], &l, err);
        lens[i] = (uint32_t)l;
    }
    if (!rc) rc = grammar_vocab_create(&e->gvocab, V, (const char *const *)bytes, lens, err);
    if (!rc && !(e->gmask = malloc(grammar_mask_words(e->gvocab) * sizeof *e->gmask))) rc = PG_ENOMEM;
    for (int32_t i = 0; bytes && i < V; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    if (rc) {
        grammar_vocab_destroy(e->gvocab);
        e->gvocab = NULL;
        return rc == PG_ENOMEM ? pg_error_set(err, rc, "engine: out of memory for the vocabulary trie") : rc;
    }
    return PG_OK;
}

/* engine_add_request, and with pl != NULL an embedding request that takes
 * pl (owned by the request once queued; freed by the caller on error). */
static int add_request(engine *e, const int32_t *prompt_ids, int32_t n_prompt,
                       const sampling_params *sp, pooler *pl, void *user, uint64_t *request_id,
                       pg_error *err)
{
    int rc = sampling_params_validate(sp, err);
    if (rc) return pg_error_wrap(err, rc, "request");
    if (sp->lora > e->p.n_loras)
        return pg_error_set(err, PG_EINVAL, "request: lora %d: the engine holds %d adapter(s)", (int)sp->lora,
                            (int)e->p.n_loras);
    if (sp->lora > 0 && pl)
        return pg_error_set(err, PG_EINVAL, "request: embeddings run on the base model, not under a LoRA adapter");
    if (n_prompt < 1 || !prompt_ids)
        return pg_error_set(err, PG_EINVAL, "request: expected a prompt of at least 1 token, got %d",
                            (int)n_prompt);
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt_ids[i] < 0 || prompt_ids[i] >= e->be.vocab_size)
            return pg_error_set(err, PG_EINVAL, "request: prompt token %d: expected an id in "
                                "[0, %d), got %d", (int)i, (int)e->be.vocab_size,
                                (int)prompt_ids[i]);
    for (size_t i = 0; i < sp->n_stop_token_ids; i++)
        if (sp->stop_token_ids[i] < 0 || sp->stop_token_ids[i] >= e->be.vocab_size)
            return pg_error_set(err, PG_EINVAL, "request: stop_token_ids[%zu]: expected an id in "
                                "[0, %d), got %d", i, (int)e->be.vocab_size,
                                (int)sp->stop_token_ids[i]);
    if (sp->n_stop > 0 && !e->tok)
        return pg_error_set(err, PG_EINVAL, "request: stop strings need a tokenizer, got none");
    if (n_prompt >= e->p.max_model_len)
        return pg_error_set(err, PG_EINVAL, "request: prompt of %d tokens does not fit "
                            "max_model_len %d (at least one token of room is needed)",
                            (int)n_prompt, (int)e->p.max_model_len);
    int32_t max_output = e->p.max_model_len - n_prompt;
    if (sp->max_tokens >= 0 && sp->max_tokens < max_output) max_output = sp->max_tokens;
    /* n sequences that cannot run together (more than a step holds, or
     * more than the pool holds at their longest) run as independent
     * children (scheduler.h); refused only if one sequence alone can never
     * fit the pool */
    int64_t need_one = request_blocks_needed(e, n_prompt, 1, max_output);
    if (need_one > e->p.num_blocks)
        return pg_error_set(err, PG_EINVAL, "request: needs %lld KV blocks (%d prompt tokens, up to "
                            "%d generated, block size %d), the pool has %d",
                            (long long)need_one, (int)n_prompt, (int)max_output,
                            (int)e->p.block_size, (int)e->p.num_blocks);
    bool must_fan_out = e->p.fan_out_always || sp->n > e->max_seqs ||
                        request_blocks_needed(e, n_prompt, sp->n, max_output) > e->p.num_blocks;
    if (sp->use_beam_search && !pl) {
        /* a beam group runs as one unit: its n slots in one step, and after a
         * preemption every beam recomputed on its own blocks (the prompt's full
         * blocks shared only through the prefix cache) */
        if (e->p.layout != KV_LAYOUT_PAGED)
            return pg_error_set(err, PG_EINVAL, "request: beam search needs the paged KV layout");
        if (sp->n > e->max_seqs)
            return pg_error_set(err, PG_EINVAL, "request: beam width %d exceeds the %d sequences "
                                "a step holds (max_num_seqs, max_num_batched_tokens)",
                                (int)sp->n, (int)e->max_seqs);
        int64_t need = e->p.prefix_caching
                           ? request_blocks_needed(e, n_prompt, sp->n, max_output)
                           : (int64_t)sp->n * ceil_div(n_prompt + max_output, e->p.block_size);
        if (need > e->p.num_blocks)
            return pg_error_set(err, PG_EINVAL, "request: a beam group of width %d needs up to %lld "
                                "KV blocks (%d prompt tokens, up to %d generated, block size %d), "
                                "the pool has %d", (int)sp->n, (long long)need, (int)n_prompt,
                                (int)max_output, (int)e->p.block_size, (int)e->p.num_blocks);
        must_fan_out = false;
    }
    request *r;
    rc = request_create(&r, e->next_id, prompt_ids, n_prompt, sp, e->p.max_model_len, e->eos,
                        e->n_eos, e->tok, user, err);
    if (rc) return rc;
    r->must_fan_out = must_fan_out && !pl;
    if (sp->use_beam_search && !pl &&
        (rc = beam_group_create(&r->beam, r,
                                e->p.beam_eos_token_id >= 0 ? e->p.beam_eos_token_id
                                : e->n_eos > 0 ? e->eos[0] : -1, e->tok, err))) {
        request_destroy(r);
        return rc;
    }
    if (sp->structured_kind != GRAMMAR_NONE) {
        gram_entry *g = NULL;
        if ((rc = ensure_grammar_vocab(e, err)) || (rc = gram_acquire(e, sp, &g, err))) {
            destroy_request(e, r);
            return pg_error_wrap(err, rc == PG_ENOMEM ? rc : PG_EINVAL, "request: structured outputs");
        }
        r->gentry = g;
        r->gram = g->g;
        r->gcache = g->cache;
        for (int32_t i = 0; i < r->n; i++) grammar_state_init(r->gram, &r->seqs[i].gst);
    }
    for (int32_t i = 0; i < r->n; i++) {
        if ((rc = kv_pool_table_new(e->pool, &r->seqs[i].table, err))) {
            destroy_request(e, r);
            return rc;
        }
        /* prefix-cache entries are keyed by adapter (kv_pool_match_prefix_key) */
        kv_pool_table_set_key(e->pool, r->seqs[i].table, (uint32_t)sp->lora);
    }
    r->pooler = pl;
    r->arrival = e->next_id;
    r->t_arrival_ms = now_ms();
    if (request_id) *request_id = e->next_id;
    e->next_id++;
    scheduler_add(e->sched, r);
    e->n_unfinished++;
    return PG_OK;
}

int engine_add_request(engine *e, const int32_t *prompt_ids, int32_t n_prompt,
                       const sampling_params *sp, void *user, uint64_t *request_id,
                       pg_error *err)
{
    return add_request(e, prompt_ids, n_prompt, sp, NULL, user, request_id, err);
}

int engine_add_embed_request(engine *e, const int32_t *prompt_ids, int32_t n_prompt,
                             const pooling_params *pp, void *user, uint64_t *request_id,
                             pg_error *err)
{
    if (!e->be.hidden_rows || e->be.hidden_size < 1)
        return pg_error_set(err, PG_EINVAL, "request: embeddings need a backend with hidden_rows, got none");
    if (!e->hidden) {
        size_t n = (size_t)e->p.max_num_batched_tokens * (size_t)e->be.hidden_size;
        if (!(e->hidden = malloc(n * sizeof *e->hidden)))
            return pg_error_set(err, PG_ENOMEM, "engine: out of memory for %zu pooled hidden values", n);
    }
    pooler *pl = NULL;
    int rc = pooler_create(&pl, pp, e->be.hidden_size, n_prompt > 0 ? n_prompt : 1, err);
    if (rc) return pg_error_wrap(err, rc, "request");
    /* a prefill that samples nothing: one token of room, greedy, no eos */
    sampling_params sp = sampling_params_default();
    sp.max_tokens = 1;
    sp.temperature = 0.0f;
    rc = add_request(e, prompt_ids, n_prompt, &sp, pl, user, request_id, err);
    if (rc) pooler_destroy(pl);
    return rc;
}

bool engine_has_unfinished(const engine *e) { return e->n_unfinished > 0; }
int32_t engine_num_unfinished(const engine *e) { return e->n_unfinished; }

static int push_finished(engine *e, request_output *o)
{
    if (e->fin_n == e->fin_cap) {
        int32_t cap = e->fin_cap ? 2 * e->fin_cap : 16;
        request_output **nf = malloc((size_t)cap * sizeof *nf);
        if (!nf) return PG_ENOMEM;
        for (int32_t i = 0; i < e->fin_n; i++) nf[i] = e->fin[(e->fin_head + i) % e->fin_cap];
        free(e->fin);
        e->fin = nf;
        e->fin_head = 0;
        e->fin_cap = cap;
    }
    e->fin[(e->fin_head + e->fin_n) % e->fin_cap] = o;
    e->fin_n++;
    return PG_OK;
}

bool engine_pop_finished(engine *e, request_output **out)
{
    if (e->fin_n == 0) return false;
    *out = e->fin[e->fin_head];
    e->fin_head = (e->fin_head + 1) % e->fin_cap;
    e->fin_n--;
    return true;
}

/* Hands a request whose sequences are all finished (or aborted) to the
 * finished queue and frees it; a child only when it is its parent's last. */
static int retire(engine *e, request *r, pg_error *err)
{
    /* a child: its sequence (finished or aborted) stays in the parent,
     * which is handed out with all n outputs when its last child goes */
    if (r->parent && !(r = detach_child(r))) return PG_OK;
    request_output *o = request_make_output(r, now_ms());
    destroy_request(e, r);
    e->n_unfinished--;
    e->stats.requests_finished++;
    if (!o || push_finished(e, o)) {
        request_output_free(o);
        return pg_error_set(err, PG_ENOMEM, "engine: out of memory for a request's output");
    }
    return PG_OK;
}

void engine_abort_all(engine *e)
{
    if (e->ov) engine_overlap_drain(e->ov, e);
    request *r;
    while ((r = scheduler_running(e->sched))) {
        scheduler_remove(e->sched, r);
        retire(e, r, NULL);
    }
    while ((r = scheduler_waiting(e->sched))) {
        scheduler_remove_waiting(e->sched, r);
        retire(e, r, NULL);
    }
}

/* The prompt positions whose logits this entry returns for prompt logprobs
 * (position p scores prompt token p + 1): [*lo, return value), empty when
 * the request has none. `start` is the entry's num_computed before the
 * step. One-row-a-step path: the entry's one token, unless it samples. */
static int32_t prompt_rows(const engine *e, const sched_entry *en, int32_t start, int32_t *lo)
{
    const request *r = en->seq->req;
    *lo = start;
    if (!r->plp) return start;
    if (e->plp_per_step)
        return en->samples || en->n_new != 1 || start + 1 >= r->n_prompt || start + 1 < r->plp_from
                   ? start : start + 1;
    /* positions p in [start, start + n_new) with from <= p + 1 < n_prompt */
    int32_t hi = start + en->n_new;
    if (hi > r->n_prompt - 1) hi = r->n_prompt - 1;
    if (*lo < r->plp_from - 1) *lo = r->plp_from - 1;
    if (hi < *lo) hi = *lo;
    return hi;
}

/* Position p's prompt logprob results (scoring prompt token p + 1): its
 * logprob and rank, the top k of n_ptop (the rest, past the vocabulary:
 * id -1, logprob 0). */
static void prompt_logprob_set(request *r, int32_t p, float lp, int32_t rank, const int32_t *ids,
                               const float *lps, int32_t k)
{
    r->plp[p + 1] = lp;
    r->p_rank[p + 1] = rank;
    for (int32_t j = 0; j < r->n_ptop; j++) {
        size_t at = (size_t)(p + 1) * (size_t)r->n_ptop + (size_t)j;
        r->p_top_ids[at] = j < k ? ids[j] : -1;
        r->p_top_lp[at] = j < k ? lps[j] : 0.0f;
    }
}

/* Prompt logprobs of request r from the raw logits row of position p:
 * token p + 1's logprob, its rank (1 + the ids with a larger logit) and
 * the top n_ptop ids (ties: lowest id first, NaN last), by
 * common/pg_logsoftmax.h's definition (the device's, bit for bit:
 * engine_backend logprob_rows). vLLM computes them the same way, from the
 * raw logits (v1 prompt logprobs). */
static void prompt_logprob(request *r, int32_t p, const float *row, int32_t vocab)
{
    double lse = pg_lsm_lse(row, vocab);
    int32_t tok = r->prompt[p + 1];
    int32_t rank = 1;
    for (int32_t v = 0; v < vocab; v++) rank += row[v] > row[tok];
    int32_t ids[PG_LSM_MAX_TOP];
    float lps[PG_LSM_MAX_TOP];
    int32_t k = r->n_ptop < vocab ? r->n_ptop : vocab;
    pg_lsm_topk(row, vocab, k, ids, lps);
    for (int32_t j = 0; j < k; j++)
        lps[j] = pg_lsm_logprob(lps[j], lse);
    prompt_logprob_set(r, p, pg_lsm_logprob(row[tok], lse), rank, ids, lps, k);
}

/* The entry samples a token: it completes its tokens and is no embedding
 * request (those pool instead, pool_entries). */
static bool entry_samples(const sched_entry *en)
{
    return en->samples && !request_root(en->seq->req)->pooler;
}

/* Embedding requests after the forward: hand each its wanted hidden rows
 * (pooling.h), and finish those whose prompt is now computed: pool, free
 * the blocks (nothing is sampled). Runs after num_computed has moved past
 * the entry's tokens. */
static int pool_entries(engine *e, const sched_step *st, pg_error *err)
{
    int rc;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const sched_entry *en = &st->entries[i];
        sequence *q = en->seq;
        request *root = request_root(q->req);
        if (!root->pooler) continue;
        int32_t start = q->num_computed - en->n_new, first, count;
        pooler_rows_wanted(root->pooler, start, en->n_new, &first, &count);
        if (count > 0) {
            if ((rc = e->be.hidden_rows(e->be.ctx, e->query_start[i] + first, count, e->hidden, err)))
                return rc;
            pooler_add(root->pooler, start + first, e->hidden, count);
        }
        if (!en->samples) continue;
        if ((rc = pooler_finish(root->pooler, &root->embedding, &root->n_embedding, err)))
            return pg_error_wrap(err, rc, "engine: request %llu", (unsigned long long)root->id);
        if ((rc = sequence_finish(q, FINISH_LENGTH, err))) return rc;
        kv_pool_table_release(e->pool, q->table);
        q->num_computed = 0;
        q->req->n_live--;
    }
    return PG_OK;
}

/* The sink of a step's logits rows (engine_rows_fn): a prompt row becomes
 * its request's prompt logprobs at once, a sampling row is kept in
 * e->logits (moved down in place when logits is e->logits itself). */
static int take_rows(void *ctx, int32_t first, int32_t n, const float *logits, pg_error *err)
{
    (void)err;
    engine *e = ctx;
    const size_t V = (size_t)e->be.vocab_size;
    for (int32_t j = 0; j < n; j++) {
        const float *row = logits + (size_t)j * V;
        int32_t k = first + j;
        const pg_lsm_row *lp = e->lp_active && e->lp_rows[k].want ? &e->lp_rows[k] : NULL;
        if (e->row_req[k] && lp) { /* taken by the backend: the row was not written */
            prompt_logprob_set(e->row_req[k], e->row_pos[k], lp->logprob, lp->rank, lp->top_ids,
                               lp->top_lp, lp->n_top);
        } else if (e->row_req[k]) {
            prompt_logprob(e->row_req[k], e->row_pos[k], row, (int32_t)V);
        } else if (!lp) {
            float *dst = e->logits + (size_t)(-e->row_pos[k] - 1) * V;
            if (dst != row) memmove(dst, row, V * sizeof *row);
        }
    }
    return PG_OK;
}

/* Block table entries per row: the step's longest table rounded up to
 * ENGINE_BT_STRIDE_STEP entries (at most max_blocks), so the row layout
 * stays put while contexts grow (it changes once per 512 tokens of the
 * longest context at block size 16) and rows can be updated in place. */
#define ENGINE_BT_STRIDE_STEP 32

/* Row i of the step's block tables for sequence q, whose table now needs
 * nblk entries: only the entries past those the row already holds when it
 * held q's table last step at the same version (decode: none, or one new
 * block every block_size steps), else the whole row. vLLM v1 keeps its
 * block table rows the same way (vllm/v1/worker/block_table.py append_row). */
static void table_row(engine *e, int32_t i, const sequence *q, const int32_t *blocks, int32_t nblk)
{
    uint32_t ver = kv_pool_table_version(e->pool, q->table);
    int32_t from = 0;
    if (e->row_tab[i] == q->table && e->row_ver[i] == ver && e->row_n[i] <= nblk) from = e->row_n[i];
    if (nblk > from)
        memcpy(&e->block_tables[(size_t)i * (size_t)e->bt_stride + (size_t)from], blocks + from,
               (size_t)(nblk - from) * sizeof *blocks);
    e->row_tab[i] = q->table;
    e->row_ver[i] = ver;
    e->row_n[i] = nblk;
}

/* Fills the step_batch from the schedule. */
static void build_batch(engine *e, const sched_step *st, step_batch *b)
{
    int32_t bs = e->p.block_size;
    int32_t t = 0, n_logits = 0, need = 1, max_seq = 0, max_q = 0, n_samples = 0;
    int32_t n_prompt_rows = 0;
    bool any_lora = false;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const sequence *q = st->entries[i].seq;
        any_lora |= q->req->sp.lora > 0;
        int32_t len = q->num_computed + st->entries[i].n_new;
        if (ceil_div(len, bs) > need) need = ceil_div(len, bs);
    }
    int32_t stride = ceil_div(need, ENGINE_BT_STRIDE_STEP) * ENGINE_BT_STRIDE_STEP;
    if (stride > e->max_blocks) stride = e->max_blocks;
    if (stride != e->bt_stride) { /* a new row layout: every row from scratch */
        e->bt_stride = stride;
        for (int32_t i = 0; i < e->max_seqs; i++) e->row_tab[i] = -1;
    }
    e->query_start[0] = 0;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const sched_entry *en = &st->entries[i];
        const sequence *q = en->seq;
        int32_t nb;
        const int32_t *blocks = kv_pool_table_blocks(e->pool, q->table, &nb);
        int32_t len = q->num_computed + en->n_new;
        for (int32_t k = 0; k < en->n_new; k++, t++) {
            int32_t pos = q->num_computed + k;
            e->token_ids[t] = q->tokens[pos];
            e->positions[t] = pos;
            e->slots[t] = blocks[pos / bs] * bs + pos % bs;
            e->lora_slots[t] = q->req->sp.lora - 1;
        }
        e->query_start[i + 1] = t;
        e->seq_lens[i] = len;
        table_row(e, i, q, blocks, ceil_div(len, bs));
        e->seq_ids[i] = (q->req->id << 8) | (uint64_t)q->index;
        e->seq_at[i] = q;
        if (len > max_seq) max_seq = len;
        if (en->n_new > max_q) max_q = en->n_new;
        int32_t lo, hi = prompt_rows(e, en, q->num_computed, &lo);
        for (int32_t p = lo; p < hi; p++, n_logits++) {
            e->logits_rows[n_logits] = t - en->n_new + (p - q->num_computed);
            e->row_req[n_logits] = q->req;
            e->row_pos[n_logits] = p;
        }
        n_prompt_rows += hi - lo;
        if (entry_samples(en)) {
            e->samp_lrow[n_samples] = n_logits;
            e->logits_rows[n_logits] = t - 1;
            e->row_req[n_logits] = NULL;
            e->row_pos[n_logits++] = -(++n_samples);
        }
    }
    e->n_prompt_rows = n_prompt_rows;
    memset(b, 0, sizeof *b);
    b->num_tokens = t;
    b->num_seqs = st->n_entries;
    b->block_size = bs;
    b->token_ids = e->token_ids;
    b->positions = e->positions;
    b->slots = e->slots;
    b->query_start = e->query_start;
    b->seq_lens = e->seq_lens;
    b->block_tables = e->block_tables;
    b->block_table_stride = stride;
    b->max_seq_len = max_seq;
    b->max_query_len = max_q;
    b->num_logits = n_logits;
    b->logits_rows = e->logits_rows;
    b->lora_slots = any_lora ? e->lora_slots : NULL;
}

static int accept_sampled(engine *e, sequence *q, const sampler_result *res, pg_error *err);

/* q's structured-output mask for its next token into e->gmask: tokens that
 * keep the automaton alive, with budgeted ends (grammar_mask_budget: after
 * this token, keep room to finish the text in single-byte tokens plus one
 * for eos, so max_tokens never cuts a constrained text short). Returns how
 * many are allowed (0: nothing can follow), -1 when out of memory; *can_end:
 * the text so far is a complete match. */
static int32_t seq_grammar_mask(engine *e, sequence *q, bool *can_end)
{
    request *r = q->req;
    int32_t n_out = q->n_tokens - r->n_prompt;
    int32_t cnt = grammar_mask_cached(r->gcache, &q->gst, e->gmask);
    if (cnt < 0) return -1;
    *can_end = grammar_can_end(r->gram, &q->gst);
    if (!r->sp.ignore_eos) {
        int32_t left = r->max_output - n_out - 1;
        cnt = grammar_mask_budget(r->gram, e->gvocab, &q->gst, e->gmask, left - 1, *can_end);
    }
    return cnt;
}

/* What the sampler reads of q: its prompt, its output so far, and the
 * banned ids while min_tokens is not reached (stop ids and eos). */
static sampler_seq_view seq_sampler_view(const sequence *q)
{
    const request *r = q->req;
    const int32_t n_out = q->n_tokens - r->n_prompt;
    return (sampler_seq_view){
        .prompt_ids = r->prompt, .n_prompt = r->n_prompt,
        .output_ids = q->tokens + r->n_prompt, .n_output = n_out,
        .banned_ids = n_out < r->sp.min_tokens ? r->banned : NULL,
        .n_banned = n_out < r->sp.min_tokens ? r->n_banned : 0,
    };
}

/* Samples the next token of q from a logits row and applies the stop rules;
 * releases q's blocks when it finishes. */
static int sample_seq(engine *e, sequence *q, const float *row, pg_error *err)
{
    /* --profile-steps: the row's copy, its grammar mask and the sampler */
    const double t_samp = e->sprof ? step_profile_now() : 0.0;
    request *r = q->req;
    int32_t vocab = e->be.vocab_size;
    memcpy(e->scratch, row, (size_t)vocab * sizeof *row);
    sampler_seq_view view = seq_sampler_view(q);
    sampler_result res = {.top_ids = e->top_ids, .top_logprobs = e->top_lp};
    int rc;
    if (r->gram) {
        /* structured outputs: tokens that kill the automaton get -inf before
         * anything else (penalties, temperature, top-k/p, min-p, greedy);
         * eos and stop ids only where the text so far is a complete match */
        bool can_end;
        int32_t cnt = seq_grammar_mask(e, q, &can_end);
        if (cnt < 0)
            return pg_error_set(err, PG_ENOMEM, "engine: out of memory for a token mask");
        if (cnt == 0) {
            /* nothing can follow: end here (as sampling the one allowed eos
             * would), or a dead end the vocabulary cannot spell (abort) */
            q->stop_token_id = can_end && !r->sp.ignore_eos && e->n_eos > 0 ? e->eos[0] : -1;
            if ((rc = sequence_finish(q, can_end ? FINISH_STOP : FINISH_ABORT, err))) return rc;
            kv_pool_table_release(e->pool, q->table);
            q->num_computed = 0;
            r->n_live--;
            return PG_OK;
        }
        for (int32_t i = 0; i < vocab; i++)
            if (!((e->gmask[i >> 6] >> (i & 63)) & 1)) e->scratch[i] = -INFINITY;
        if (can_end) {
            for (int32_t k = 0; k < e->n_eos && !r->sp.ignore_eos; k++)
                e->scratch[e->eos[k]] = row[e->eos[k]];
            for (size_t k = 0; k < r->sp.n_stop_token_ids; k++)
                e->scratch[r->stop_ids[k]] = row[r->stop_ids[k]];
        }
    }
    rc = sampler_sample(e->ws, &r->sp, e->scratch, vocab, &view, &q->rng, &res);
    if (e->sprof) e->samp_s += step_profile_now() - t_samp;
    if (rc)
        return pg_error_set(err, rc, "engine: request %llu sequence %d: %s",
                            (unsigned long long)r->id, (int)q->index,
                            sampler_workspace_error(e->ws));
    return accept_sampled(e, q, &res, err);
}

static int32_t beam_row_k(const engine *e, const request *r);

/* True when sample_seq would take the plain argmax of q's logits row as
 * the forward gives it (sampler_plain_argmax: greedy, no penalties, no
 * banned ids, no logprobs; and no grammar mask), so the backend may take
 * it on the device (engine_backend greedy_rows). A request of n > 1 stays
 * on the host: its fresh fork samples every sequence from one row. */
static bool seq_plain_greedy(const sequence *q)
{
    const request *r = q->req;
    int32_t n_out = q->n_tokens - r->n_prompt;
    sampler_seq_view view = {.n_banned = n_out < r->sp.min_tokens ? r->n_banned : 0};
    return !r->gram && !r->beam && r->n == 1 && sampler_plain_argmax(&r->sp, &view);
}

/* True when sample_seq would take the plain argmax of q's row and its
 * logprobs from the raw row, and nothing else: as seq_plain_greedy, but
 * with logprobs (the backend may then take the token and the logprobs
 * itself: engine_backend logprob_rows, token -1). */
static bool seq_greedy_logprobs(const sequence *q)
{
    const request *r = q->req;
    if (r->sp.logprobs < 0 || r->gram || r->beam || r->n != 1) return false;
    int32_t n_out = q->n_tokens - r->n_prompt;
    sampler_seq_view view = {.n_banned = n_out < r->sp.min_tokens ? r->n_banned : 0};
    sampling_params sp = r->sp;
    sp.logprobs = -1; /* the logprobs come from the raw row: they do not change the token */
    return sampler_plain_argmax(&sp, &view);
}

/* True when q's next token may be sampled where its logits are (engine_backend
 * sample_rows): what sample_seq would do with the row is its grammar mask
 * and sampler_sample on one sequence. An n > 1 group's sequences are, once
 * forked; the row it forks from samples n tokens from one row, and stays on
 * the host. With logprobs only when the backend takes them too
 * (logprob_rows, token PG_LSM_SAMPLED: the drawn id, scored on the row as
 * the sampler received it) — except a row seq_greedy_logprobs leaves to
 * the logprob rows alone (its argmax). */
static bool seq_device_sampled(const engine *e, const sequence *q)
{
    const request *r = q->req;
    if (r->beam || !(r->n == 1 || r->forked)) return false;
    return r->sp.logprobs < 0 || (e->be.logprob_rows && !seq_greedy_logprobs(q));
}

/* Hands the step's device-sampled rows to the backend (sample_rows): every
 * sampling row of a seq_device_sampled sequence not already taken as plain
 * greedy (e->greedy when dev_greedy); mark_logprob_rows then marks those
 * with logprobs PG_LSM_SAMPLED. Only when every logits row samples (no
 * prompt logprobs). Sets *on when it handed any over. */
static int mark_sample_rows(engine *e, const sched_step *st, const step_batch *b, bool dev_greedy,
                            bool *on, pg_error *err)
{
    *on = false;
    if (!e->be.sample_rows || e->n_prompt_rows != 0 || b->num_logits == 0) return PG_OK;
    sample_rows_reset(e->srows, b->num_logits);
    int32_t n = 0;
    for (int32_t i = 0, row = 0; i < st->n_entries; i++) {
        if (!entry_samples(&st->entries[i])) continue;
        const int32_t s = row++;
        sequence *q = st->entries[i].seq;
        e->dsamp[s] = 0;
        if ((dev_greedy && e->greedy[s]) || !seq_device_sampled(e, q)) continue;
        const request *r = q->req;
        sampler_seq_view view = seq_sampler_view(q);
        bool can_end = false;
        if (r->gram && (size_t)e->n_eos + r->sp.n_stop_token_ids > 64) continue; /* (term below) */
        if (r->gram) { /* its mask goes with it (sample_seq's, computed here) */
            int32_t cnt = seq_grammar_mask(e, q, &can_end);
            if (cnt < 0) return pg_error_set(err, PG_ENOMEM, "engine: out of memory for a token mask");
            if (cnt == 0) continue; /* nothing can follow: sample_seq ends it */
        }
        int32_t k = sample_rows_add(e->srows, e->ws, &r->sp, &view, &q->rng, s, err);
        if (k < 0) return pg_error_wrap(err, k, "engine: request %llu", (unsigned long long)r->id);
        if (r->gram) {
            /* eos and stop ids let in where the text may end, as sample_seq does */
            int32_t term[64], n_term = 0;
            for (int32_t j = 0; can_end && !r->sp.ignore_eos && j < e->n_eos && n_term < 64; j++)
                term[n_term++] = e->eos[j];
            for (size_t j = 0; can_end && j < r->sp.n_stop_token_ids && n_term < 64; j++)
                term[n_term++] = r->stop_ids[j];
            int rc = sample_rows_set_mask(e->srows, k, e->gmask, e->be.vocab_size, term, n_term, err);
            if (rc) return rc;
        }
        e->dsamp[s] = k + 1;
        n++;
    }
    if (n == 0) return PG_OK;
    int rc = e->be.sample_rows(e->be.ctx, sample_rows_batch(e->srows), err);
    if (rc) return rc;
    *on = true;
    return PG_OK;
}

/* Marks the step's rows the backend takes the logprobs of (logprob_rows):
 * every prompt-logprob row (scoring the next prompt token), the sampling
 * rows of seq_greedy_logprobs sequences (their argmax) and the rows
 * mark_sample_rows handed over whose request wants logprobs (the drawn
 * id: PG_LSM_SAMPLED). Sets e->lp_active when it marked any and handed
 * them over. */
static int mark_logprob_rows(engine *e, const sched_step *st, const step_batch *b, pg_error *err)
{
    e->lp_active = false;
    if (!e->be.logprob_rows || b->num_logits == 0) return PG_OK;
    int32_t n = 0;
    for (int32_t j = 0; j < b->num_logits; j++) {
        pg_lsm_row *q = &e->lp_rows[j];
        memset(q, 0, sizeof *q);
        const request *r = e->row_req[j];
        if (!r) continue;
        q->want = 1;
        q->token = r->prompt[e->row_pos[j] + 1];
        q->k = r->n_ptop > 0 ? r->n_ptop : 0;
        n++;
    }
    for (int32_t i = 0, s = 0; i < st->n_entries; i++) {
        if (!entry_samples(&st->entries[i])) continue;
        int32_t j = e->samp_lrow[s++];
        const request *br = st->entries[i].seq->req;
        const bool sampled = e->dev_sample && e->dsamp[s - 1] && br->sp.logprobs >= 0;
        if (!br->beam && !sampled && !seq_greedy_logprobs(st->entries[i].seq)) continue;
        pg_lsm_row *q = &e->lp_rows[j];
        q->want = 1;
        q->token = sampled ? PG_LSM_SAMPLED : -1;
        q->k = br->beam ? beam_row_k(e, br) : br->sp.logprobs; /* a beam's top 2W candidates */
        n++;
    }
    if (n == 0) return PG_OK;
    int rc = e->be.logprob_rows(e->be.ctx, e->lp_rows, b->num_logits, err);
    if (rc) return rc;
    e->lp_active = true;
    return PG_OK;
}

/* The top entries a beam slot's row gives: 2 * width, at most V. */
static int32_t beam_row_k(const engine *e, const request *r)
{
    int32_t k = beam_group_k(r->beam);
    return k < e->be.vocab_size ? k : e->be.vocab_size;
}

/* A beam slot's row (host logits, or lp already taken by the backend):
 * its candidates to the group (beam_search.h). */
static void beam_take(engine *e, sequence *q, const float *row, const pg_lsm_row *lp)
{
    pg_lsm_row mine;
    if (!lp) {
        memset(&mine, 0, sizeof mine);
        mine.want = 1;
        mine.token = -1;
        mine.k = beam_row_k(e, q->req);
        pg_lsm_row_eval(&mine, row, e->be.vocab_size);
        lp = &mine;
    }
    beam_group_take(q->req->beam, q->index, lp);
}

/* The logprobs the backend took for a sampling row (mark_logprob_rows)
 * into *res, as sampler_sample gives them (the same definition). */
static void lp_into_result(engine *e, const pg_lsm_row *lp, sampler_result *res)
{
    res->logprob = lp->logprob;
    res->n_top = lp->n_top;
    res->top_ids = e->top_ids;
    res->top_logprobs = e->top_lp;
    memcpy(e->top_ids, lp->top_ids, (size_t)lp->n_top * sizeof *e->top_ids);
    memcpy(e->top_lp, lp->top_lp, (size_t)lp->n_top * sizeof *e->top_lp);
}

/* A sampling row the backend took (mark_logprob_rows): its token and
 * logprobs as the sampler's result. */
static int sample_from_lp(engine *e, sequence *q, const pg_lsm_row *lp, pg_error *err)
{
    if (lp->token < 0)
        return pg_error_set(err, PG_EINVAL, "engine: request %llu sequence %d: sampler: no token can be "
                            "sampled: all %d logits are -inf, nan or banned",
                            (unsigned long long)q->req->id, (int)q->index, (int)e->be.vocab_size);
    sampler_result res = {.token_id = lp->token};
    lp_into_result(e, lp, &res);
    return accept_sampled(e, q, &res, err);
}

/* The sampled token res->token_id of q: first-token time, stats, the
 * grammar, the stop rules (sequence_accept); releases q's blocks when it
 * finishes. Every token goes through here, host-sampled or device greedy. */
static int accept_sampled(engine *e, sequence *q, const sampler_result *res, pg_error *err)
{
    request *r = q->req;
    int rc;
    request *root = request_root(r);
    if (!root->sampled_once) {
        root->sampled_once = true;
        root->t_first_token_ms = now_ms();
    }
    e->stats.generated_tokens++;
    if (r->gram) {
        uint32_t blen;
        const uint8_t *b = grammar_vocab_bytes(e->gvocab, res->token_id, &blen);
        /* a token of the mask always advances; one let in only as a
         * terminator (eos, a stop id) stops the sequence in sequence_accept */
        bool in_mask = (e->gmask[res->token_id >> 6] >> (res->token_id & 63)) & 1;
        if (in_mask && !grammar_advance(r->gram, &q->gst, b, blen))
            return pg_error_set(err, PG_EINVAL, "engine: request %llu: token %d refused by its own mask",
                                (unsigned long long)r->id, (int)res->token_id);
    }
    rc = sequence_accept(q, res->token_id, res, e->eos, e->n_eos, err);
    if (rc) return rc;
    if (q->finished) {
        kv_pool_table_release(e->pool, q->table);
        q->num_computed = 0;
        r->n_live--;
    }
    return PG_OK;
}

void engine_set_step_profile(engine *e, step_profile *p) { e->sprof = p; }

/* ---- the phases of a step (engine_phase.h) ------------------------------ */

void engine_timer_start(engine *e, step_timer *tm)
{
    memset(tm, 0, sizeof *tm);
    tm->t_step = tm->t = e->sprof ? step_profile_now() : 0.0;
}

void engine_timer_lap(engine *e, step_timer *tm, step_phase which)
{
    if (!e->sprof) return;
    double now = step_profile_now();
    tm->ph[which] += now - tm->t;
    tm->t = now;
}

double engine_timer_take_exec(engine *e, step_timer *tm)
{
    if (!e->sprof) return 0.0;
    const step_phase xs[3] = {SP_H2D, SP_WAIT, SP_D2H};
    double sum = 0.0;
    for (int i = 0; i < 3; i++) {
        tm->ph[xs[i]] += e->sprof->cur[xs[i]];
        sum += e->sprof->cur[xs[i]];
        e->sprof->cur[xs[i]] = 0.0;
    }
    return sum;
}

/* --profile-steps: the call, begun at tm->t_step, as one step of b's kind
 * with tm's phases. */
void engine_timer_done(engine *e, step_timer *tm, const step_batch *b)
{
    step_profile *p = e->sprof;
    if (!p) return;
    int k = b->num_tokens > b->num_seqs ? OPP_PREFILL : OPP_DECODE;
    p->steps[k]++;
    p->seqs[k] += b->num_seqs;
    p->step_s[k] += step_profile_now() - tm->t_step;
    for (int i = 0; i < SP_COUNT; i++) p->phase_s[k][i] += tm->ph[i];
}

kv_pool *engine_phase_pool(engine *e) { return e->pool; }
const engine_backend *engine_phase_backend(const engine *e) { return &e->be; }
int32_t engine_phase_max_seqs(const engine *e) { return e->max_seqs; }

void engine_phase_count_ahead(engine *e, bool rebuilt)
{
    if (rebuilt) e->stats.steps_rebuilt++;
    else e->stats.steps_ahead++;
}

bool engine_phase_needs_serial(const engine *e, const sched_step *st)
{
    if (e->n_prompt_rows > 0) return true;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const sequence *q = st->entries[i].seq;
        const request *r = q->req;
        if (request_root((request *)r)->pooler) return true;
        /* a beam group's selection rewrites its beams' tokens and block
         * tables after the step: nothing of its next step is known before */
        if (r->beam) return true;
        /* the fork after the prompt (engine_phase_finish): the leader has
         * just computed it (num_computed moved at launch) */
        if (e->p.layout == KV_LAYOUT_PAGED && !r->forked && r->n_live > 1 &&
            q == request_leader((request *)r) && q->num_computed == r->n_prompt)
            return true;
    }
    return false;
}

int engine_phase_schedule(engine *e, sched_step *st, step_timer *tm, pg_error *err)
{
    int rc = scheduler_schedule(e->sched, st, err);
    if (rc) return rc;
    e->stats.steps++;
    e->stats.preemptions += (uint64_t)st->n_preempted;
    e->stats.prefix_cache_queries += st->prefix_queries;
    e->stats.prefix_cache_hits += st->prefix_hits;
    double t_admit = now_ms();
    for (int32_t i = 0; i < st->n_entries; i++) {
        request *r = request_root(st->entries[i].seq->req);
        if (!r->admitted_once) {
            r->admitted_once = true;
            r->t_first_admit_ms = t_admit;
        }
    }
    engine_timer_lap(e, tm, SP_SCHEDULE); /* with the admission bookkeeping above */
    return PG_OK;
}

void engine_phase_build(engine *e, const sched_step *st, step_batch *b) { build_batch(e, st, b); }

int engine_phase_launch(engine *e, const sched_step *st, const step_batch *b, bool *async,
                        step_timer *tm, pg_error *err)
{
    int rc;
    /* a step with prompt logprob rows takes them as they arrive (take_rows,
     * forward_rows): it always waits */
    bool defer = async && *async && e->be.step_defer && e->n_prompt_rows == 0;
    if (async) *async = defer;
    if (st->n_cow > 0) {
        if (!e->be.copy_blocks)
            return pg_error_set(err, PG_EINVAL, "engine: copy-on-write needs backend copy_blocks");
        if ((rc = e->be.copy_blocks(e->be.ctx, st->cow, st->n_cow, err))) return rc;
    }
    /* prompt logprobs are taken from their rows as the rows arrive
     * (take_rows); the sampling rows end in e->logits, in entry order */
    /* plain greedy sampling rows: their ids from the device argmax, their
     * logits rows left there (only when every logits row samples: no
     * prompt logprobs in the step) */
    e->dev_greedy = false;
    if (e->be.greedy_rows && e->n_prompt_rows == 0 && b->num_logits > 0) {
        int32_t L = 0, n_greedy = 0;
        for (int32_t i = 0; i < st->n_entries; i++) {
            if (!entry_samples(&st->entries[i])) continue;
            e->greedy[L] = seq_plain_greedy(st->entries[i].seq);
            n_greedy += e->greedy[L++];
        }
        if (L != b->num_logits)
            return pg_error_set(err, PG_EINVAL, "engine: expected %d sampling rows, got %d",
                                (int)b->num_logits, (int)L);
        if (n_greedy > 0) {
            if ((rc = e->be.greedy_rows(e->be.ctx, e->greedy, L, e->greedy_ids, err))) return rc;
            e->dev_greedy = true;
        }
    }
    e->dev_sample = false;
    if ((rc = mark_sample_rows(e, st, b, e->dev_greedy, &e->dev_sample, err))) return rc;
    if ((rc = mark_logprob_rows(e, st, b, err))) return rc;
    if (e->sprof) {
        e->sprof->kind = b->num_tokens > b->num_seqs ? OPP_PREFILL : OPP_DECODE;
        memset(e->sprof->cur, 0, sizeof e->sprof->cur);
        e->samp_s = 0.0;
    }
    engine_timer_lap(e, tm, SP_METADATA);
    if (e->n_prompt_rows == 0 || e->plp_per_step) {
        if ((defer && (rc = e->be.step_defer(e->be.ctx, err))) ||
            (rc = e->be.forward(e->be.ctx, b, e->logits, err))) {
            pg_error ignored;
            if (e->dev_greedy) /* a forward that failed early leaves no mask pending */
                (void)e->be.greedy_rows(e->be.ctx, NULL, 0, NULL, &ignored);
            if (e->dev_sample) (void)e->be.sample_rows(e->be.ctx, NULL, &ignored);
            return rc;
        }
        /* (take_rows reads the rows: a deferred step has none, see above) */
        if (e->n_prompt_rows > 0 && (rc = take_rows(e, 0, b->num_logits, e->logits, err))) return rc;
    } else if ((rc = e->be.forward_rows(e->be.ctx, b, e->slice, e->slice_rows, take_rows, e, err))) {
        return rc;
    }
    if (e->sprof) { /* the forward: the executor's phases, the rest is launching */
        double now = step_profile_now(), fwd = now - tm->t;
        tm->t = now;
        tm->ph[SP_LAUNCH] += fwd - engine_timer_take_exec(e, tm);
    }
    for (int32_t i = 0; i < st->n_entries; i++) {
        sequence *q = st->entries[i].seq;
        int32_t end = q->num_computed + st->entries[i].n_new;
        bool has_newest = end == q->n_tokens && q->n_tokens > q->req->n_prompt;
        e->stats.prompt_tokens += (uint64_t)(st->entries[i].n_new - (has_newest ? 1 : 0));
        q->num_computed = end; /* its full blocks were committed when it was scheduled */
    }
    return PG_OK;
}

void engine_phase_patch(engine *e, const sched_step *st, const step_batch *b)
{
    (void)b;
    for (int32_t i = 0; i < st->n_entries; i++) {
        const sequence *q = st->entries[i].seq;
        e->token_ids[e->query_start[i + 1] - 1] = q->tokens[e->seq_lens[i] - 1];
    }
}

/* Removes from next the entries of sequences that finished; returns how
 * many. */
static int32_t drop_finished(sched_step *next)
{
    int32_t n = 0, dropped = 0;
    for (int32_t i = 0; i < next->n_entries; i++) {
        const sched_entry *en = &next->entries[i];
        if (en->seq->finished) {
            next->n_tokens -= en->n_new;
            dropped++;
            continue;
        }
        next->entries[n++] = *en;
    }
    next->n_entries = n;
    return dropped;
}

int engine_phase_finish(engine *e, const sched_step *st, const step_batch *b, sched_step *next,
                        int32_t *n_dropped, step_timer *tm, pg_error *err)
{
    (void)b;
    int rc;
    if ((rc = pool_entries(e, st, err))) return rc;
    kv_pool_metrics m;
    kv_pool_get_metrics(e->pool, &m);
    e->util_filled_sum += (double)m.filled_slots;
    e->util_alloc_sum += (double)m.allocated_slots;
    const bool dev_greedy = e->dev_greedy, dev_sample = e->dev_sample;

    /* forks (the leader has just computed the prompt), then sampling. Only
     * the KV is forked: every sequence keeps its own sampling state from
     * request_create (RNG stream i; per-sequence state such as a grammar
     * belongs there too, so a fanned-out child, which never forks, has its
     * own: see request_fan_out) */
    int32_t row = 0;
    for (int32_t i = 0; i < st->n_entries; i++) {
        sequence *q = st->entries[i].seq;
        request *r = q->req;
        bool fresh_fork = false;
        if (e->p.layout == KV_LAYOUT_PAGED && !r->beam && !r->forked && r->n_live > 1 &&
            q == request_leader(r) && q->num_computed == r->n_prompt) {
            for (int32_t k = 0; k < r->n; k++) {
                sequence *o = &r->seqs[k];
                if (o == q || o->finished) continue;
                if ((rc = kv_pool_fork(e->pool, q->table, o->table)))
                    return pg_error_set(err, rc, "engine: out of memory forking a sequence");
                o->num_computed = r->n_prompt;
            }
            r->forked = true;
            fresh_fork = st->entries[i].samples;
        }
        if (!entry_samples(&st->entries[i])) continue;
        const float *lrow = e->logits + (size_t)row * (size_t)e->be.vocab_size;
        /* the row's logprobs when the backend took them (mark_logprob_rows) */
        const pg_lsm_row *lp = e->lp_active && e->lp_rows[e->samp_lrow[row]].want
                                   ? &e->lp_rows[e->samp_lrow[row]] : NULL;
        if (r->beam) { /* candidates now, the selection once every beam's are in */
            row++;
            beam_take(e, q, lrow, lp);
            continue;
        }
        if (dev_sample && e->dsamp[row]) {
            /* sampled where the logits are: the token the sampler would give,
             * one draw taken unless greedy (never a fresh fork); with
             * logprobs, the backend's for that token (PG_LSM_SAMPLED) */
            sampler_result res = {.token_id = sample_rows_id(e->srows, e->dsamp[row] - 1)};
            row++;
            if (res.token_id < 0)
                return pg_error_set(err, PG_EINVAL, "engine: request %llu sequence %d: sampler: no token "
                                    "can be sampled: all %d logits are -inf, nan or banned",
                                    (unsigned long long)r->id, (int)q->index, (int)e->be.vocab_size);
            if (lp && lp->token != res.token_id)
                return pg_error_set(err, PG_EINVAL, "engine: request %llu sequence %d: the backend's logprobs "
                                    "are of token %d, its sampled token is %d", (unsigned long long)r->id,
                                    (int)q->index, (int)lp->token, (int)res.token_id);
            if (lp) lp_into_result(e, lp, &res);
            if (!sampler_row_greedy(&r->sp)) q->rng.counter++;
            if (r->gram) /* accept_sampled checks the token against the mask */
                sample_rows_mask_of(e->srows, e->dsamp[row - 1] - 1, e->gmask, e->be.vocab_size);
            if ((rc = accept_sampled(e, q, &res, err))) return rc;
            continue;
        }
        if (lp) {
            row++; /* never a fresh fork: seq_greedy_logprobs leaves n > 1 to the host */
            if ((rc = sample_from_lp(e, q, lp, err))) return rc;
            continue;
        }
        if (dev_greedy && e->greedy[row]) {
            /* never a fresh fork: seq_plain_greedy leaves n > 1 to the host */
            sampler_result res = {.token_id = e->greedy_ids[row]};
            row++;
            if ((rc = accept_sampled(e, q, &res, err))) return rc;
            continue;
        }
        row++;
        if (fresh_fork) {
            for (int32_t k = 0; k < r->n; k++)
                if (!r->seqs[k].finished && (rc = sample_seq(e, &r->seqs[k], lrow, err)))
                    return rc;
        } else if ((rc = sample_seq(e, q, lrow, err))) {
            return rc;
        }
    }
    /* beam groups whose every live beam has its candidates: the step's
     * selection (prunes, forks, appends; finishes the group at the end) */
    for (int32_t i = 0; i < st->n_entries; i++) {
        request *r = st->entries[i].seq->req;
        if (!r->beam || !entry_samples(&st->entries[i])) continue;
        int32_t n_new = 0;
        beam_kv kv = {.pool = e->pool, .copy = e->p.beam_copy_blocks ? e->be.copy_blocks : NULL,
                      .ctx = e->be.ctx};
        if ((rc = beam_group_advance(r->beam, &kv, &n_new, err))) return rc;
        e->stats.generated_tokens += (uint64_t)n_new;
        if (n_new > 0 && !request_root(r)->sampled_once) {
            r->sampled_once = true;
            r->t_first_token_ms = now_ms();
        }
    }
    /* the step scheduled ahead loses the rows of sequences that just
     * finished (their blocks went back with them) before they are freed */
    if (n_dropped) *n_dropped = next ? drop_finished(next) : 0;
    /* retire requests whose sequences all finished (each once: a request
     * may own several entries) */
    int32_t n_done = 0;
    for (int32_t i = 0; i < st->n_entries; i++) {
        request *r = st->entries[i].seq->req;
        if (r->n_live > 0 || r->retiring) continue;
        r->retiring = true;
        e->done[n_done++] = r;
    }
    for (int32_t i = 0; i < n_done; i++) {
        if (next && next->n_preempted > 0) scheduler_remove_either(e->sched, e->done[i]);
        else scheduler_remove(e->sched, e->done[i]);
        if ((rc = retire(e, e->done[i], err))) return rc;
    }
    if (e->sprof) {
        engine_timer_lap(e, tm, SP_OUTPUT);
        tm->ph[SP_SAMPLE] += e->samp_s; /* it ran inside the output loop */
        tm->ph[SP_OUTPUT] -= e->samp_s;
        e->samp_s = 0.0;
    }
    return PG_OK;
}

int engine_phase_end(engine *e, pg_error *err)
{
    kv_pool_metrics mm;
    kv_pool_get_metrics(e->pool, &mm);
    if (mm.blocks_in_use > e->stats.blocks_in_use_peak)
        e->stats.blocks_in_use_peak = mm.blocks_in_use;
    int32_t rs = scheduler_running_seqs(e->sched);
    if (rs > e->stats.peak_running_seqs) e->stats.peak_running_seqs = rs;
    int rc;
    if (e->p.check_invariants && (rc = kv_pool_check(e->pool, err)))
        return pg_error_wrap(err, rc, "engine: after step %llu", (unsigned long long)e->stats.steps);
    return PG_OK;
}

int engine_step(engine *e, pg_error *err)
{
    if (e->ov) return engine_overlap_step(e->ov, e, err);
    if (e->n_unfinished == 0) return PG_OK;
    step_timer tm;
    engine_timer_start(e, &tm);
    sched_step st;
    step_batch b;
    int rc = engine_phase_schedule(e, &st, &tm, err);
    if (rc) return rc;
    if (st.n_entries > 0) { /* 0: everything was preempted: readmit next step */
        engine_phase_build(e, &st, &b);
        if ((rc = engine_phase_launch(e, &st, &b, NULL, &tm, err)) ||
            (rc = engine_phase_finish(e, &st, &b, NULL, NULL, &tm, err)))
            return rc;
        engine_timer_done(e, &tm, &b);
    }
    return engine_phase_end(e, err);
}

void engine_get_stats(const engine *e, engine_stats *s)
{
    *s = e->stats;
    kv_pool_metrics m;
    kv_pool_get_metrics(e->pool, &m);
    s->num_blocks = m.num_blocks;
    s->blocks_in_use = m.blocks_in_use;
    s->blocks_in_use_peak = m.blocks_in_use_peak;
    s->cow_copies = m.cow_copies;
    s->running = scheduler_num_running(e->sched);
    s->waiting = scheduler_num_waiting(e->sched);
    s->kv_utilization = m.allocated_slots > 0 ? (double)m.filled_slots / (double)m.allocated_slots
                                              : 0.0;
    s->kv_utilization_mean = e->util_alloc_sum > 0.0 ? e->util_filled_sum / e->util_alloc_sum : 0.0;
}

const kv_pool *engine_kv_pool(const engine *e) { return e->pool; }

const uint64_t *engine_step_seq_ids(const engine *e) { return e->seq_ids; }

const int32_t *engine_step_seq_tokens(const engine *e, int32_t s, int32_t *n)
{
    *n = e->seq_at[s]->n_tokens;
    return e->seq_at[s]->tokens;
}

int32_t engine_waiting_ids(const engine *e, uint64_t *ids, int32_t max)
{
    int32_t n = 0;
    for (const request *r = scheduler_waiting(e->sched); r; r = r->next, n++)
        if (n < max) ids[n] = r->id;
    return n;
}
