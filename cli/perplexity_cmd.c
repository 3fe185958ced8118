/* perplexity_cmd: `pagedgen perplexity -m MODEL -f TEXT [--ctx N] [--batch-size B]`
 * — llama.cpp's llama-perplexity (tools/perplexity/perplexity.cpp,
 * perplexity()) over the engine:
 *
 *   tokens = tokenize(text, add_special)          once, BOS as the tokenizer adds it
 *   n_chunk = len(tokens) / N                     (at least 2 windows: len >= 2N)
 *   window i = tokens[i*N .. i*N + N), its first token replaced by BOS when
 *              the tokenizer adds one
 *   scored   = positions first+1 .. N-1 of each window, first = N/2: every
 *              scored token has at least N/2 tokens of context
 *   nll      = mean of -log p(token | window so far), ppl = exp(nll)
 *   stderr   = sqrt((mean(nll^2) - nll^2) / (count - 1)) * ppl
 *
 * Each window is one request with prompt logprobs (max_tokens 1, greedy,
 * the sampled token ignored); the engine batches windows up to B tokens a
 * step, and computes the logits rows in its prefill pass (engine.h
 * forward_rows). The running estimate goes to stderr as windows complete in
 * order; stdout gets one JSON line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "device.h"
#include "engine.h"
#include "file_io.h"
#include "model.h"
#include "progress.h"
#include "run.h"
#include "safetensors.h"
#include "tokenizer.h"

/* The text file's size limit (llama.cpp reads any size; wikitext-2's test
 * split is 1.3 MB). */
#define PPL_MAX_TEXT_BYTES ((size_t)1 << 30)

typedef struct ppl_window {
    double nll, nll2;     /* sums over its scored tokens */
    int32_t count;
    bool done;
} ppl_window;

typedef struct ppl_state {
    const cli_options *o;
    llama_config cfg;
    tokenizer *tok;
    executor *ex;
    st_file *weights;
    model *mdl;
    engine *eng;
    char *text;
    int32_t *ids;
    size_t n_ids;
    ppl_window *win;
    pg_error err;
} ppl_state;

static int fail(ppl_state *s, int code, const char *what)
{
    if (what)
        fprintf(stderr, "pagedgen: perplexity: %s: %s\n", what, s->err.msg);
    else
        fprintf(stderr, "pagedgen: perplexity: %s\n", s->err.msg);
    return code;
}

static int load(ppl_state *s, int32_t max_model_len, int32_t *code)
{
    const cli_options *o = s->o;
    const char *tdir = o->tokenizer_dir ? o->tokenizer_dir : o->model_dir;
    if (llama_config_load(&s->cfg, o->model_dir, &s->err) != PG_OK)
        return *code = fail(s, CLI_EXIT_MODEL, o->model_dir);
    if (tok_load(&s->tok, tdir, &s->err) != PG_OK)
        return *code = fail(s, CLI_EXIT_MODEL, tdir);
    if (max_model_len > s->cfg.max_position_embeddings) {
        pg_error_set(&s->err, PG_EINVAL, "--ctx %d: expected at most the model's "
                     "max_position_embeddings - 1 = %d", (int)(max_model_len - 1),
                     (int)(s->cfg.max_position_embeddings - 1));
        return *code = fail(s, CLI_EXIT_USAGE, NULL);
    }
    int rc = cli_device_open(o, &s->ex, &s->err);
    if (rc != PG_OK)
        return *code = fail(s, rc == PG_EUNSUPPORTED || rc == PG_EINVAL ? CLI_EXIT_USAGE
                                                                          : CLI_EXIT_MODEL, "device");
    if (st_open(&s->weights, o->model_dir, &s->err) != PG_OK)
        return *code = fail(s, CLI_EXIT_MODEL, NULL);
    cli_kv_plan plan;
    if (cli_model_create(&s->mdl, &plan, o, s->ex, &s->cfg, s->weights, max_model_len,
                         &s->err) != PG_OK)
        return *code = fail(s, CLI_EXIT_MODEL, o->model_dir);
    st_close(s->weights);
    s->weights = NULL;
    engine_params ep = engine_params_default();
    ep.block_size = o->block_size;
    ep.num_blocks = plan.num_blocks;
    ep.max_num_seqs = o->max_num_seqs;
    ep.max_num_batched_tokens = o->max_num_batched_tokens;
    ep.max_model_len = max_model_len;
    ep.prefix_caching = false; /* windows share nothing */
    ep.check_invariants = o->check_invariants;
    ep.prompt_logprobs_per_step = o->prompt_logprobs_per_step;
    engine_backend be = model_backend(s->mdl);
    if (engine_create(&s->eng, &ep, &be, s->tok, &s->err) != PG_OK)
        return *code = fail(s, CLI_EXIT_MODEL, "engine");
    if (!o->quiet)
        fprintf(stderr, "pagedgen: perplexity: model %s on %s, KV cache %d blocks of %d tokens\n",
                o->model_dir, s->ex->name, (int)plan.num_blocks, (int)o->block_size);
    return 0;
}

static void teardown(ppl_state *s)
{
    if (s->eng) {
        engine_abort_all(s->eng);
        request_output *out;
        while (engine_pop_finished(s->eng, &out))
            request_output_free(out);
    }
    engine_destroy(s->eng);
    model_destroy(s->mdl);
    st_close(s->weights);
    if (s->ex)
        s->ex->op->destroy(s->ex);
    tok_free(s->tok);
    pg_file_free(s->text);
    free(s->ids);
    free(s->win);
}

/* The scored tokens of one finished window: llama.cpp's process_logits
 * sums -logprob and its square in double. */
static void take_window(ppl_state *s, const request_output *out, int32_t first)
{
    ppl_window *w = &s->win[(intptr_t)out->user];
    for (int32_t p = first + 1; p < out->n_prompt_tokens; p++) {
        double v = -(double)out->prompt_logprobs[p];
        w->nll += v;
        w->nll2 += v * v;
        w->count++;
    }
    w->done = true;
}

static void progress_line(const ppl_state *s, int32_t done, int32_t n_chunk, double nll, double nll2,
                          int64_t count, double secs, bool tty)
{
    if (s->o->quiet || count == 0)
        return;
    double av = nll / (double)count, ppl = exp(av);
    double var = nll2 / (double)count - av * av;
    double se = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * ppl : 0.0;
    char bar[33];
    int fill = (int)(32 * (int64_t)done / n_chunk);
    for (int k = 0; k < 32; k++)
        bar[k] = k < fill ? '#' : '.';
    bar[32] = '\0';
    fprintf(stderr, "%s[%s] %d/%d windows  ppl %.4f +/- %.5f  %.1f s%s", tty ? "\r" : "", bar,
            (int)done, (int)n_chunk, ppl, se, secs, tty ? "" : "\n");
    fflush(stderr);
}

int cli_run_perplexity(const cli_options *o)
{
    ppl_state st;
    memset(&st, 0, sizeof st);
    ppl_state *s = &st;
    s->o = o;
    int32_t code = CLI_EXIT_OK;
    cli_signals_install();
    const int32_t n_ctx = o->ppl_ctx, first = n_ctx / 2;
    size_t text_len = 0;
    if (pg_read_file(o->ppl_file, PPL_MAX_TEXT_BYTES, &s->text, &text_len, &s->err) != PG_OK) {
        code = fail(s, CLI_EXIT_IO, NULL);
        goto done;
    }
    /* a window's N prompt tokens + the one sampled token */
    if (load(s, n_ctx + 1, &code))
        goto done;
    double t_tok = cli_now_s();
    if (tok_encode(s->tok, s->text, text_len, true, &s->ids, &s->n_ids, &s->err) != PG_OK) {
        code = fail(s, CLI_EXIT_MODEL, "tokenize");
        goto done;
    }
    if (s->n_ids < 2 * (size_t)n_ctx) {
        pg_error_set(&s->err, PG_EINVAL, "%s: expected at least 2 x --ctx = %d tokens, the text "
                     "tokenizes to %zu", o->ppl_file, (int)(2 * n_ctx), s->n_ids);
        code = fail(s, CLI_EXIT_USAGE, NULL);
        goto done;
    }
    const int32_t n_chunk = (int32_t)(s->n_ids / (size_t)n_ctx);
    /* llama.cpp: BOS at the start of every window when the vocabulary adds
     * one (here: when the tokenizer put it at the start of the text) */
    const int32_t bos = tok_bos_id(s->tok);
    const bool add_bos = bos >= 0 && s->ids[0] == bos;
    if (!o->quiet)
        fprintf(stderr, "pagedgen: perplexity: %zu tokens (%.3f s), %d windows of %d, scoring "
                "positions %d..%d of each, %s BOS, %d tokens a step\n", s->n_ids,
                cli_now_s() - t_tok, (int)n_chunk, (int)n_ctx, (int)first + 1, (int)n_ctx - 1,
                add_bos ? "with" : "without", (int)o->max_num_batched_tokens);
    if (!(s->win = calloc((size_t)n_chunk, sizeof *s->win))) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory for %d windows", (int)n_chunk);
        code = fail(s, CLI_EXIT_MODEL, NULL);
        goto done;
    }
    sampling_params sp = sampling_params_default();
    sp.max_tokens = 1;
    sp.temperature = 0.0f;
    sp.ignore_eos = true;
    sp.prompt_logprobs = 0;
    sp.prompt_logprobs_from = first + 1; /* llama.cpp asks no logits of the first half */
    /* windows in flight: enough to fill every step, few enough that their
     * prompt copies stay small */
    const int32_t in_flight_max = 2 * (o->max_num_batched_tokens / n_ctx) + 2;
    int32_t next = 0, in_flight = 0, reported = 0;
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    const bool tty = isatty(STDERR_FILENO) == 1;
    double t0 = cli_now_s(), last_print = t0;
    int32_t *win_ids = malloc((size_t)n_ctx * sizeof *win_ids);
    if (!win_ids) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory");
        code = fail(s, CLI_EXIT_MODEL, NULL);
        goto done;
    }
    while (reported < n_chunk) {
        while (next < n_chunk && in_flight < in_flight_max) {
            memcpy(win_ids, s->ids + (size_t)next * (size_t)n_ctx, (size_t)n_ctx * sizeof *win_ids);
            if (add_bos)
                win_ids[0] = bos;
            if (engine_add_request(s->eng, win_ids, n_ctx, &sp, (void *)(intptr_t)next, NULL,
                                   &s->err) != PG_OK) {
                code = fail(s, CLI_EXIT_MODEL, "window");
                break;
            }
            next++;
            in_flight++;
        }
        if (code != CLI_EXIT_OK)
            break;
        if (cli_signals_stop_requested()) {
            code = CLI_EXIT_INTERRUPTED;
            break;
        }
        if (engine_step(s->eng, &s->err) != PG_OK) {
            code = fail(s, CLI_EXIT_MODEL, "engine step");
            break;
        }
        request_output *out;
        while (engine_pop_finished(s->eng, &out)) {
            take_window(s, out, first);
            request_output_free(out);
            in_flight--;
        }
        /* the running estimate over the windows done in order (as
         * llama.cpp prints it) */
        bool advanced = false;
        while (reported < n_chunk && s->win[reported].done) {
            nll += s->win[reported].nll;
            nll2 += s->win[reported].nll2;
            count += s->win[reported].count;
            reported++;
            advanced = true;
        }
        double now = cli_now_s();
        if (advanced && (reported == n_chunk || now - last_print >= (tty ? 0.2 : o->log_interval_s))) {
            progress_line(s, reported, n_chunk, nll, nll2, count, now - t0, tty);
            last_print = now;
        }
    }
    free(win_ids);
    if (code != CLI_EXIT_OK)
        goto done;
    if (tty && !o->quiet)
        fputc('\n', stderr);
    double secs = cli_now_s() - t0;
    double av = nll / (double)count, ppl = exp(av);
    double var = nll2 / (double)count - av * av;
    double se = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * ppl : 0.0;
    int64_t evaluated = (int64_t)n_chunk * n_ctx;
    printf("{\"ppl\":%.6f,\"ppl_stderr\":%.6f,\"nll\":%.8f,\"tokens_scored\":%lld,\"windows\":%d,"
           "\"ctx\":%d,\"tokens_evaluated\":%lld,\"seconds\":%.3f,\"tok_per_s\":%.1f,"
           "\"scored_tok_per_s\":%.1f}\n",
           ppl, se, av, (long long)count, (int)n_chunk, (int)n_ctx, (long long)evaluated, secs,
           secs > 0 ? (double)evaluated / secs : 0.0, secs > 0 ? (double)count / secs : 0.0);
    if (fflush(stdout) != 0)
        code = CLI_EXIT_IO;
    else if (!o->quiet)
        fprintf(stderr, "pagedgen: perplexity: Final estimate: PPL = %.4f +/- %.5f\n", ppl, se);
done:
    teardown(s);
    return code;
}
