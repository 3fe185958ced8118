/* bench_sec_host: the "host" section of pagedgen_bench (issue 30, item 2) —
 * the engine's own share of a decode step, measured without a GPU.
 *
 * The engine runs at the 1.1B shape (TinyLlama: 22 layers, hidden 2048,
 * 32 heads, 4 KV heads, vocabulary 32,000, the llama2 tokenizer) over a
 * backend that does no arithmetic: the same engine_backend interface as
 * core/model.c's (forward + greedy_rows, as the CUDA executor offers), with
 * the ids of the greedy rows fixed by a cheap hash of the step's token and
 * position and no logits written. What remains is what the host does per
 * step whatever the device: scheduling, building the step_batch (token
 * ids, positions, slots, block tables), marking the greedy rows, accepting
 * the ids (stop checks, detokenization, stats) and retiring. The layers set
 * nothing on the host but the vocabulary; the backend copies the step's
 * metadata into one staging buffer, as the CUDA executor's begin_step
 * packs it for its host -> device copy, so a step_batch that carries more
 * than a device needs shows here too.
 *
 * B requests (B = 1, 64, 256) of 512-token prompts (distinct: no prefix
 * hits), greedy, EOS ignored, are prefilled and decoded for a few steps
 * untimed; then STEPS decode steps are timed (the contexts grow from ~520
 * tokens); then 256 requests of 16,384-token prompts the same way, where
 * per-sequence work that walks the whole context (a block table of ~1,000
 * entries) would show. One line per batch: `host: batch B: X us/step, Y us/seq`, the
 * fastest of five rounds (each round a fresh engine), and below it the
 * thread's CPU time over the same steps (the steadier figure on a shared
 * machine). Targets (issue 30):
 * <= 40 us per step at batch 1, <= 1.5 us per sequence at 256.
 *
 * Then the same batches through the overlapped loop (issue 30 item 3,
 * core/engine_overlap.c): the backend is asynchronous as the CUDA
 * executor is (step_defer / step_wait; the ids written at the wait), and a
 * step profile splits each step's host time into what ran ahead — the next
 * step's schedule and metadata, done while the device would still run this
 * one — and the rest, which the device waits for:
 * `host overlapped: batch B: X us/step, Y us/step ahead, Z us/step on the
 * critical path`.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_machine.h"
#include "bench_report.h"
#include "bench_sections.h"
#include "engine.h"
#include "sampling_params.h"
#include "step_profile.h"
#include "tokenizer.h"

#define HOST_VOCAB 32000
#define HOST_HIDDEN 2048
#define HOST_PROMPT 512
#define HOST_LONG_PROMPT 16384
#define HOST_WARM_STEPS 8
#define HOST_ROUNDS 5

/* This thread's CPU time in seconds (steadier than the wall clock on a
 * shared machine: time the thread waits for a core does not count). */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The no-arithmetic backend. */
typedef struct null_backend {
    const uint8_t *greedy;   /* [L] pending greedy mask (greedy_rows), or NULL */
    int32_t *ids;            /* [L] their ids */
    int32_t L;
    int32_t *stage;          /* packed step metadata, as a device copy needs it */
    size_t stage_cap;        /* int32 entries */
    uint64_t sink;           /* keeps the packing observable */
    /* asynchronous (the overlapped loop): ids of a deferred step, handed
     * over at step_wait */
    bool armed, in_flight;
    int32_t *ids_pending;    /* [L] */
    int32_t *ids_dst;
    int32_t L_pending;
} null_backend;

static int null_defer(void *ctx, pg_error *err)
{
    (void)err;
    ((null_backend *)ctx)->armed = true;
    return PG_OK;
}

static int null_wait(void *ctx, pg_error *err)
{
    null_backend *n = ctx;
    if (!n->in_flight) return pg_error_set(err, PG_EINVAL, "null backend: nothing in flight");
    n->in_flight = false;
    if (n->ids_dst) memcpy(n->ids_dst, n->ids_pending, (size_t)n->L_pending * sizeof *n->ids_dst);
    return PG_OK;
}

static int null_greedy_rows(void *ctx, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err)
{
    (void)err;
    null_backend *n = ctx;
    n->greedy = L > 0 ? greedy : NULL;
    n->ids = ids;
    n->L = L;
    return PG_OK;
}

/* An ordinary vocabulary id (past llama2's specials and byte tokens). */
static int32_t null_id(int32_t token, int32_t position)
{
    uint32_t h = (uint32_t)token * 2654435761u ^ (uint32_t)position * 40503u;
    return 259 + (int32_t)(h % (uint32_t)(HOST_VOCAB - 259));
}

static int null_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    null_backend *n = ctx;
    const int32_t T = b->num_tokens, S = b->num_seqs, L = b->num_logits;
    size_t nbt = (size_t)S * (size_t)b->block_table_stride;
    size_t need = 3u * (size_t)T + 2u * (size_t)S + 1u + nbt + (size_t)L;
    if (need > n->stage_cap) { /* grows to the largest step once, in the warm-up */
        int32_t *s = realloc(n->stage, need * sizeof *s);
        if (!s) return pg_error_set(err, PG_ENOMEM, "null backend: out of memory");
        n->stage = s;
        n->stage_cap = need;
    }
    size_t o = 0;
#define PUT(src, count)                                           \
    do {                                                          \
        memcpy(n->stage + o, (src), (size_t)(count) * sizeof(int32_t)); \
        o += (size_t)(count);                                     \
    } while (0)
    PUT(b->token_ids, T);
    PUT(b->positions, T);
    PUT(b->slots, T);
    PUT(b->query_start, S + 1);
    PUT(b->seq_lens, S);
    PUT(b->block_tables, nbt);
    PUT(b->logits_rows, L);
#undef PUT
    n->sink += (uint64_t)n->stage[o - 1];
    const bool deferred = n->armed;
    n->armed = false;
    int32_t *ids = n->ids;
    if (deferred && n->greedy) { /* the ids arrive at step_wait */
        if (!n->ids_pending && !(n->ids_pending = malloc(256 * sizeof *n->ids_pending)))
            return pg_error_set(err, PG_ENOMEM, "null backend: out of memory");
        if (L > 256) return pg_error_set(err, PG_EINVAL, "null backend: %d rows", (int)L);
        n->ids_dst = n->ids;
        n->L_pending = L;
        ids = n->ids_pending;
    } else {
        n->ids_dst = NULL;
    }
    n->in_flight = deferred;
    for (int32_t r = 0; r < L; r++) {
        int32_t t = b->logits_rows[r];
        if (n->greedy && r < n->L && n->greedy[r]) {
            ids[r] = null_id(b->token_ids[t], b->positions[t]);
        } else { /* a row sampled on the host: fixed logits, one peak */
            float *row = logits + (size_t)r * HOST_VOCAB;
            memset(row, 0, HOST_VOCAB * sizeof *row);
            row[null_id(b->token_ids[t], b->positions[t])] = 1.0f;
        }
    }
    n->greedy = NULL;
    n->L = 0;
    return PG_OK;
}

static engine_backend null_iface(null_backend *n, bool async)
{
    engine_backend be = {
        .ctx = n,
        .vocab_size = HOST_VOCAB,
        .forward = null_forward,
        .greedy_rows = null_greedy_rows,
        .hidden_size = HOST_HIDDEN,
        .step_defer = async ? null_defer : NULL,
        .step_wait = async ? null_wait : NULL,
    };
    return be;
}

/* One round at batch B: a fresh engine, prefill + warm-up untimed, `steps`
 * decode steps timed. *us_step gets their mean wall time, *cpu_us_step
 * their mean CPU time. ahead_us != NULL: the overlapped loop (an
 * asynchronous backend) under a step profile, *ahead_us the mean time a
 * step spent preparing the next one ahead. */
static int host_round(const tokenizer *tok, int32_t B, int32_t prompt_len, int32_t steps,
                      uint64_t seed, double *us_step, double *cpu_us_step, double *ahead_us,
                      pg_error *err)
{
    null_backend nb = {0};
    engine_backend be = null_iface(&nb, ahead_us != NULL);
    step_profile prof;
    step_profile_init(&prof, 22);
    const int32_t eos = 2;
    engine_params p = engine_params_default();
    p.max_num_seqs = 256;
    p.max_num_batched_tokens = 2048;
    /* the first requests decode while the last are still prefilled (a
     * request at a time past max_num_batched_tokens): room for those steps
     * too, so all B run through the timed ones */
    int32_t max_tokens = 2 * B * prompt_len / p.max_num_batched_tokens + 8 + HOST_WARM_STEPS + steps;
    p.max_model_len = prompt_len + max_tokens;
    p.eos_token_ids = &eos;
    p.n_eos_token_ids = 1;
    int32_t per_seq = bench_ceil_div(prompt_len + max_tokens, p.block_size);
    p.num_blocks = B * per_seq + 64;
    engine *e = NULL;
    int rc = engine_create(&e, &p, &be, tok, err);
    if (rc) return rc;
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    if (!prompt) {
        engine_destroy(e);
        return pg_error_set(err, PG_ENOMEM, "host: out of memory");
    }
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.max_tokens = max_tokens;
    uint64_t x = seed;
    for (int32_t r = 0; r < B && !rc; r++) {
        for (int32_t i = 0; i < prompt_len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = 259 + (int32_t)((x >> 33) % (uint64_t)(HOST_VOCAB - 259));
        }
        rc = engine_add_request(e, prompt, prompt_len, &sp, NULL, NULL, err);
    }
    free(prompt);
    /* prefill: until every prompt is computed (distinct prompts: no
     * prefix hits), then warm decode */
    engine_stats st;
    while (!rc) {
        engine_get_stats(e, &st);
        if (st.prompt_tokens >= (uint64_t)B * prompt_len) break;
        rc = engine_step(e, err);
    }
    for (int32_t i = 0; i < HOST_WARM_STEPS && !rc; i++) rc = engine_step(e, err);
    uint64_t gen0 = 0;
    if (!rc) {
        engine_get_stats(e, &st);
        gen0 = st.generated_tokens;
    }
    if (ahead_us) engine_set_step_profile(e, &prof);
    double t0 = bench_now_s(), c0 = thread_cpu_s();
    for (int32_t i = 0; i < steps && !rc; i++) rc = engine_step(e, err);
    double dt = bench_now_s() - t0, dc = thread_cpu_s() - c0;
    engine_set_step_profile(e, NULL);
    if (ahead_us) *ahead_us = prof.phase_s[OPP_DECODE][SP_AHEAD] * 1e6 / (double)steps;
    if (!rc && ahead_us) {
        engine_get_stats(e, &st);
        if (st.steps_ahead == 0)
            rc = pg_error_set(err, PG_EINVAL, "host: batch %d: the overlapped loop built no step ahead",
                              (int)B);
    }
    if (!rc) {
        engine_get_stats(e, &st);
        if (st.generated_tokens - gen0 != (uint64_t)B * (uint64_t)steps || st.running != B)
            rc = pg_error_set(err, PG_EINVAL, "host: batch %d: expected %d tokens from %d "
                              "running requests in the timed steps, got %llu from %d", (int)B,
                              (int)(B * steps), (int)B,
                              (unsigned long long)(st.generated_tokens - gen0), (int)st.running);
    }
    engine_destroy(e);
    free(nb.stage);
    free(nb.ids_pending);
    *us_step = dt * 1e6 / (double)steps;
    *cpu_us_step = dc * 1e6 / (double)steps;
    return rc;
}

int bench_section_host(bench_ctx *c)
{
    printf("\n== host: the engine's share of a decode step (issue 30), 1.1B shape (22 layers, "
           "hidden 2048, 32/4 heads, V 32000), no-arithmetic backend, %d-token prompts, greedy\n",
           HOST_PROMPT);
    char tdir[BENCH_MAX_PATH + 32];
    snprintf(tdir, sizeof tdir, "%s/tokenizers/llama2", c->shared_dir);
    tokenizer *tok = NULL;
    pg_error err = {{0}};
    if (tok_load(&tok, tdir, &err) != 0) {
        printf("  (tokenizer %s: %s: outputs not detokenized)\n", tdir, err.msg);
        tok = NULL;
    }
    /* the three batches at 512-token prompts, then 256 sequences at 16k
     * tokens: per-sequence work that walks the context shows there */
    static const int32_t batches[] = {1, 64, 256, 256};
    static const int32_t prompts[] = {HOST_PROMPT, HOST_PROMPT, HOST_PROMPT, HOST_LONG_PROMPT};
    bench_json_arr(c->j, "host");
    int rc = 0;
    for (size_t k = 0; k < sizeof batches / sizeof batches[0] && rc == 0; k++) {
        int32_t B = batches[k], P = prompts[k];
        if (c->quick && P != HOST_PROMPT) continue;
        int32_t steps = c->quick ? 16 : (B == 1 ? 2000 : B == 64 ? 400 : 200);
        double best = 0.0, best_cpu = 0.0;
        for (int round = 0; round < (c->quick ? 1 : HOST_ROUNDS) && rc == 0; round++) {
            double us = 0.0, cpu = 0.0;
            rc = host_round(tok, B, P, steps, 1234u + (uint64_t)round, &us, &cpu, NULL, &err);
            if (rc == 0 && (round == 0 || us < best)) best = us;
            if (rc == 0 && (round == 0 || cpu < best_cpu)) best_cpu = cpu;
        }
        if (rc != 0) {
            fprintf(stderr, "pagedgen_bench: host: %s\n", err.msg);
            break;
        }
        if (P == HOST_PROMPT)
            printf("host: batch %d: %.1f us/step, %.2f us/seq\n", (int)B, best, best / (double)B);
        else
            printf("host: batch %d, %d-token prompts: %.1f us/step, %.2f us/seq\n", (int)B, (int)P,
                   best, best / (double)B);
        printf("  (batch %d: %d steps timed, fastest of %d rounds; thread CPU time %.1f us/step, "
               "%.2f us/seq)\n", (int)B, (int)steps, c->quick ? 1 : HOST_ROUNDS, best_cpu,
               best_cpu / (double)B);
        bench_json_obj(c->j, NULL);
        bench_json_int(c->j, "batch", B);
        bench_json_int(c->j, "prompt_tokens", P);
        bench_json_int(c->j, "timed_steps", steps);
        bench_json_num(c->j, "us_per_step", best);
        bench_json_num(c->j, "us_per_seq", best / (double)B);
        bench_json_num(c->j, "cpu_us_per_step", best_cpu);
        bench_json_bool(c->j, "detokenized", tok != NULL);
        bench_json_end(c->j);
    }
    bench_json_end(c->j);
    if (rc == 0)
        printf("  targets: <= 40 us/step at batch 1, <= 1.5 us/seq at batch 256\n");
    /* the overlapped loop (issue 30 item 3): what of a step's host time is
     * prepared while the device runs the step before, and what remains */
    bench_json_arr(c->j, "host_overlapped");
    for (size_t k = 0; k < 3 && rc == 0; k++) {
        int32_t B = batches[k];
        int32_t steps = c->quick ? 16 : (B == 1 ? 2000 : B == 64 ? 400 : 200);
        double best = 0.0, best_ahead = 0.0;
        for (int round = 0; round < (c->quick ? 1 : HOST_ROUNDS) && rc == 0; round++) {
            double us = 0.0, cpu = 0.0, ahead = 0.0;
            rc = host_round(tok, B, HOST_PROMPT, steps, 1234u + (uint64_t)round, &us, &cpu, &ahead, &err);
            if (rc == 0 && (round == 0 || us < best)) {
                best = us;
                best_ahead = ahead;
            }
        }
        if (rc != 0) {
            fprintf(stderr, "pagedgen_bench: host overlapped: %s\n", err.msg);
            break;
        }
        printf("host overlapped: batch %d: %.1f us/step, %.1f us/step ahead, %.1f us/step on the "
               "critical path\n", (int)B, best, best_ahead, best - best_ahead);
        bench_json_obj(c->j, NULL);
        bench_json_int(c->j, "batch", B);
        bench_json_num(c->j, "us_per_step", best);
        bench_json_num(c->j, "ahead_us_per_step", best_ahead);
        bench_json_end(c->j);
    }
    bench_json_end(c->j);
    if (rc == 0)
        printf("  (overlapped: the fastest round's; under a step profile, whose clock reads add "
               "to the step)\n");
    tok_free(tok);
    return rc;
}
