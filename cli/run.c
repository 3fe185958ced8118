/* run: the generate loop — read ahead of the engine by a bounded window,
 * step, write finished records in input order (or as they finish).
 *
 * Bounds: at most `window` = 4 x max_num_seqs requests sit in the engine;
 * in input order, the reorder buffer holds at most 8 x max_num_seqs + 64
 * records and the reader stops taking lines while the oldest unwritten
 * request would fall out of it. Memory is therefore bounded by these
 * windows plus the id set (one short key per distinct id, for duplicate
 * detection), never by the file. */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_render.h"
#include "config.h"
#include "device.h"
#include "embed_output.h"
#include "embed_prepare.h"
#include "engine.h"
#include "id_set.h"
#include "input.h"
#include "lora_adapter.h"
#include "model.h"
#include "output.h"
#include "pooling.h"
#include "progress.h"
#include "reorder.h"
#include "request_parse.h"
#include "resume.h"
#include "file_io.h"
#include "safetensors.h"
#include "shard.h"
#include "st_pooling.h"
#include "step_profile.h"
#include "tokenizer.h"

typedef struct run_state {
    const cli_options *o;
    llama_config cfg;
    tokenizer *tok;
    cli_chat chat;        /* the chat template (tmpl NULL: none found) */
    executor *ex;
    st_file *weights;
    model *mdl;
    engine *eng;
    int32_t max_model_len;
    sampling_params defaults;
    char model_name[256];
    /* --reasoning-parser: the ids of "<think>" and "</think>" (-1 without) */
    int32_t think_start_id, think_end_id;

    cli_input *in;
    cli_format fmt;
    int out_fd;
    cli_resume *resume;
    const cli_resume *kept; /* resume, or the multi-device parent's (options.h resume_kept) */
    cli_id_set *ids;
    cli_reorder *reorder;
    cli_output_ctx octx;
    cli_progress *progress;
    cli_progress_counts counts;

    int64_t next_index;
    uint64_t next_seq;
    int32_t in_engine, window;
    bool eof;
    int exit_code;        /* a fatal code once set (IO, MODEL) */
    pg_error err;
    op_profile prof;              /* --profile-ops: the model's op times */
    step_profile sprof;           /* --profile-steps: the engine's step phases */
    /* embedding lines: the model folder's sentence-transformers files and
     * the pooling they (or --pooling, or vLLM's default) give */
    st_pooling_config stp;
    pooling_params pool;
    const char *pool_source;
    bool pool_announced;
    /* --shard with -o FILE (shard.h): OUTPUT.done once the shard finishes;
     * after a resume, order[i] = the kept record's offset of the shard's
     * i-th request (or -1: written by this run), to sort the file back */
    bool shard_marker, track_order;
    int lock_fd;          /* the output, flock()ed while a shard runs; -1 none */
    int64_t *order;
    size_t n_order, cap_order;
} run_state;

static void fail(run_state *s, int code, const char *what)
{
    if (s->exit_code == CLI_EXIT_OK)
        s->exit_code = code;
    fprintf(stderr, "pagedgen: %s%s%s\n", what ? what : "", what ? ": " : "", s->err.msg);
}

/* ---- writing --------------------------------------------------------------- */

static int write_record(run_state *s, const char *data, size_t len)
{
    if (cli_write_all(s->out_fd, data, len, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, s->o->output_path);
        return PG_EIO;
    }
    return PG_OK;
}

/* Takes b's buffer as record seq: written now (unordered) or when its turn
 * comes. */
static void emit(run_state *s, uint64_t seq, json_buf *b)
{
    if (b->oom) {
        json_buf_free(b);
        s->err.msg[0] = '\0';
        pg_error_set(&s->err, PG_ENOMEM, "out of memory formatting a record");
        fail(s, CLI_EXIT_IO, NULL);
        return;
    }
    if (s->o->unordered) {
        write_record(s, b->data, b->len);
        json_buf_free(b);
        return;
    }
    if (cli_reorder_put(s->reorder, seq, b->data, b->len) != PG_OK) {
        json_buf_free(b); /* cannot happen: admission checks the window */
        return;
    }
    char *data;
    size_t len;
    while (cli_reorder_pop_next(s->reorder, &data, &len)) {
        if (s->exit_code == CLI_EXIT_OK)
            write_record(s, data, len);
        free(data);
    }
}

static void emit_error_status(run_state *s, const char *id_json, int64_t line, int status,
                              const char *msg)
{
    json_buf b = {0};
    cli_output_error(&b, &s->octx, id_json, line, status, msg);
    s->counts.failed++;
    emit(s, s->next_seq++, &b);
}

static void emit_error(run_state *s, const char *id_json, int64_t line, const char *msg)
{
    emit_error_status(s, id_json, line, 400, msg);
}

/* ---- admission ------------------------------------------------------------- */

/* The prompt's token ids: given, tokenized (with BOS, as vLLM's
 * completions), or for a chat request rendered by the chat template and
 * tokenized without BOS (*text then holds the rendered prompt, owned). */
static int tokenize_prompt(run_state *s, const cli_request *r, int32_t **ids, int32_t *n, char **text,
                           size_t *text_len, pg_error *err)
{
    *text = NULL;
    *text_len = 0;
    if (r->prompt_ids) {
        for (int32_t k = 0; k < r->n_prompt_ids; k++)
            if (r->prompt_ids[k] >= s->cfg.vocab_size)
                return pg_error_set(err, PG_EINVAL,
                                    "prompt_token_ids[%d] = %d is outside the vocabulary (size %d)",
                                    (int)k, (int)r->prompt_ids[k], (int)s->cfg.vocab_size);
        *ids = malloc((size_t)r->n_prompt_ids * sizeof **ids);
        if (!*ids)
            return pg_error_set(err, PG_ENOMEM, "out of memory");
        memcpy(*ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof **ids);
        *n = r->n_prompt_ids;
    } else if (r->chat_json) {
        size_t nn = 0;
        int rc = cli_chat_render(&s->chat, r->chat_json, r->chat_json_len, text, text_len, ids, &nn, err);
        if (rc != PG_OK)
            return rc;
        *n = (int32_t)nn;
    } else {
        if (!s->tok)
            return pg_error_set(err, PG_EINVAL,
                                "a text prompt needs a tokenizer (give --tokenizer DIR, or prompt_token_ids)");
        size_t nn = 0;
        pg_error e;
        if (tok_encode(s->tok, r->prompt, r->prompt_len, true, ids, &nn, &e) != PG_OK)
            return pg_error_set(err, PG_EINVAL, "prompt: %s", e.msg);
        *n = (int32_t)nn;
    }
    if (*n >= s->max_model_len) {
        int32_t got = *n;
        free(*ids);
        *ids = NULL;
        free(*text);
        *text = NULL;
        return pg_error_set(err, PG_EINVAL,
                            "prompt is too long: %d tokens, but max_model_len is %d (prompt + output)",
                            (int)got, (int)s->max_model_len);
    }
    return PG_OK;
}

/* ---- embedding lines --------------------------------------------------------- */

/* An embedding line: every input tokenized and checked first, then one
 * engine request per input (its user a part of the line's group); the
 * group's record is written when its last part finishes (collect). */
static void submit_embed(run_state *s, cli_request *r)
{
    const cli_embed *em = r->embed;
    char msg[512];
    pooling_params pp;
    const char *bad = cli_embed_line_params(em, &s->pool, &s->stp, s->cfg.hidden_size, s->model_name, &pp, msg,
                                            sizeof msg);
    if (bad) {
        emit_error(s, r->id_json, r->line, bad);
        return;
    }
    if (!s->pool_announced && !s->o->quiet)
        fprintf(stderr, "pagedgen: embeddings: %s pooling, %snormalized (%s)\n", pooling_type_name(s->pool.type),
                s->pool.normalize ? "" : "not ", s->pool_source);
    s->pool_announced = true;
    int32_t n = em->n_inputs;
    int32_t **ids = calloc((size_t)n, sizeof *ids);
    int32_t *nids = calloc((size_t)n, sizeof *nids);
    cli_pending *g = calloc(1, sizeof *g);
    float **emb = calloc((size_t)n, sizeof *emb);
    pg_error e;
    int rc = ids && nids && g && emb ? PG_OK : pg_error_set(&e, PG_ENOMEM, "out of memory");
    for (int32_t k = 0; k < n && rc == PG_OK; k++)
        rc = cli_embed_input_ids(em, k, s->tok, s->cfg.vocab_size, s->max_model_len, &ids[k], &nids[k], &e);
    if (rc != PG_OK) {
        emit_error(s, r->id_json, r->line, e.msg);
        free(g);
        free(emb);
    } else {
        g->seq = s->next_seq++;
        g->index = r->index;
        g->line = r->line;
        g->id_json = r->id_json;
        r->id_json = NULL;
        g->n_embed = n;
        g->emb = emb;
        g->emb_base64 = em->base64;
        for (int32_t k = 0; k < n; k++) {
            cli_pending *part = calloc(1, sizeof *part);
            if (!part) {
                g->emb_error = strdup("out of memory");
                break;
            }
            part->group = g;
            part->part = k;
            g->emb_refs++;
            if (engine_add_embed_request(s->eng, ids[k], nids[k], &pp, part, NULL, &e) != PG_OK) {
                char m[1100];
                snprintf(m, sizeof m, "input[%d]: %.1000s", (int)k, e.msg);
                free(part);
                g->emb_refs--;
                g->emb_error = strdup(m);
                break;
            }
            s->in_engine++;
        }
        if (g->emb_refs == 0) { /* refused before anything ran */
            json_buf b = {0};
            cli_output_error(&b, &s->octx, g->id_json, g->line, 400,
                             g->emb_error ? g->emb_error : "out of memory");
            s->counts.failed++;
            emit(s, g->seq, &b);
            cli_pending_free(g);
        }
    }
    for (int32_t k = 0; ids && k < n; k++)
        free(ids[k]);
    free(ids);
    free(nids);
}

/* A finished part of an embedding line; the group's record once it is
 * the last. Frees the part. */
static void collect_part(run_state *s, cli_pending *p, request_output *out)
{
    cli_pending *g = p->group;
    if (out->embedding) {
        g->emb[p->part] = out->embedding;
        g->emb_dim = out->n_embedding;
        out->embedding = NULL;
        g->emb_prompt_tokens += out->n_prompt_tokens;
    }
    if (g->emb_refs == 1) {
        bool complete = true;
        for (int32_t k = 0; k < g->n_embed; k++)
            complete &= g->emb[k] != NULL;
        json_buf b = {0};
        if (g->emb_error) {
            cli_output_error(&b, &s->octx, g->id_json, g->line, 400, g->emb_error);
            s->counts.failed++;
            emit(s, g->seq, &b);
        } else if (complete) { /* else a part was aborted (interrupt): not written, --resume redoes it */
            cli_output_embedding(&b, &s->octx, g);
            s->counts.ok++;
            emit(s, g->seq, &b);
        }
    }
    cli_pending_free(p);
}

/* Submits a parsed request or writes its error record. */
static void submit(run_state *s, cli_request *r)
{
    if (r->embed) {
        submit_embed(s, r);
        return;
    }
    if (!model_has_lm_head(s->mdl)) {
        emit_error(s, r->id_json, r->line, "this model has no lm_head.weight (an embedding model): only "
                                           "embedding requests (/v1/embeddings, \"input\") are served");
        return;
    }
    int32_t *ids = NULL;
    int32_t n = 0;
    char *chat_text = NULL;
    size_t chat_len = 0;
    pg_error e;
    if (tokenize_prompt(s, r, &ids, &n, &chat_text, &chat_len, &e) != PG_OK) {
        emit_error(s, r->id_json, r->line, e.msg);
        return;
    }
    if (s->o->reasoning_parser != CLI_REASONING_NONE && r->chat_json &&
        r->sp.structured_kind != GRAMMAR_NONE &&
        !cli_reasoning_prompt_ended(ids, (size_t)n, s->think_start_id, s->think_end_id)) {
        /* vLLM applies the grammar only after the reasoning ends
         * (StructuredOutputManager with a reasoner: is_reasoning_end on the
         * prompt, then on the output); the engine here constrains from the
         * first token, so only a prompt that already closed the reasoning
         * (Qwen3 with enable_thinking false) gives vLLM's output */
        free(ids);
        free(chat_text);
        emit_error(s, r->id_json, r->line,
                   "structured outputs with --reasoning-parser need the prompt to end the reasoning "
                   "(e.g. chat_template_kwargs {\"enable_thinking\": false}): vLLM leaves the reasoning "
                   "unconstrained, which is not supported here");
        return;
    }
    cli_pending *p = calloc(1, sizeof *p);
    if (!p) {
        free(ids);
        free(chat_text);
        emit_error(s, r->id_json, r->line, "out of memory");
        return;
    }
    p->thinking_disabled = r->thinking_disabled;
    p->exclude_reasoning = r->exclude_reasoning;
    p->lora = r->sp.lora;
    p->seq = s->next_seq++;
    p->index = r->index;
    p->line = r->line;
    p->chat = r->chat_json != NULL;
    p->echo = r->echo;
    p->echo_only = r->echo_only;
    p->id_json = r->id_json;
    r->id_json = NULL;
    if (s->o->include_prompt || r->echo || r->sp.prompt_logprobs >= 0) {
        /* a chat request's prompt is its rendered text */
        p->prompt = chat_text ? chat_text : r->prompt;
        p->prompt_len = chat_text ? chat_len : r->prompt_len;
        if (chat_text)
            chat_text = NULL;
        else
            r->prompt = NULL;
        p->prompt_ids = ids;
        p->n_prompt_ids = n;
    }
    free(chat_text);
    /* vLLM's chat default: no max_tokens = the rest of the context
     * (max_model_len - prompt tokens), unless --max-tokens says otherwise */
    if (p->chat && !r->max_tokens_set && !(s->o->sampling_set & CLI_SET_MAX_TOKENS))
        r->sp.max_tokens = -1;
    /* an explicit "max_tokens": null is vLLM's "the rest of the context"
     * for completions too (get_max_tokens: max_model_len - prompt) */
    if (r->max_tokens_null && !r->max_tokens_set && !(s->o->sampling_set & CLI_SET_MAX_TOKENS))
        r->sp.max_tokens = -1;
    /* prompt + a max_tokens the line (or --max-tokens) asked for beyond the
     * context: vLLM's 400 (serving_engine.py _validate_input), unless
     * --truncate-max-tokens keeps the clamp (the engine then cuts it) */
    bool asked = r->max_tokens_set || (s->o->sampling_set & CLI_SET_MAX_TOKENS);
    if (asked && !s->o->truncate_max_tokens && r->sp.max_tokens >= 0 &&
        (int64_t)n + r->sp.max_tokens > s->max_model_len) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context "
                 "length is %d tokens and your request has %d input tokens (%d > %d - %d).",
                 (int)r->sp.max_tokens, (int)s->max_model_len, (int)n, (int)r->sp.max_tokens,
                 (int)s->max_model_len, (int)n);
        json_buf b = {0};
        cli_output_error(&b, &s->octx, p->id_json, p->line, 400, msg);
        s->counts.failed++;
        emit(s, p->seq, &b);
        if (p->prompt_ids == ids)
            ids = NULL;
        cli_pending_free(p);
        free(ids);
        return;
    }
    /* generation_config's max_new_tokens caps every request (vLLM's
     * get_max_tokens takes the min with default_sampling_params'
     * max_tokens), after the context check above saw what was asked */
    if (s->o->generation_config_defaults && s->cfg.has_max_new_tokens &&
        (r->sp.max_tokens < 0 || r->sp.max_tokens > s->cfg.max_new_tokens))
        r->sp.max_tokens = s->cfg.max_new_tokens;
    uint64_t rid;
    if (engine_add_request(s->eng, ids, n, &r->sp, p, &rid, &e) != PG_OK) {
        json_buf b = {0};
        cli_output_error(&b, &s->octx, p->id_json, p->line, 400, e.msg);
        s->counts.failed++;
        emit(s, p->seq, &b);
        if (p->prompt_ids == ids)
            ids = NULL;
        cli_pending_free(p);
        free(ids);
        return;
    }
    if (p->prompt_ids != ids)
        free(ids);
    s->in_engine++;
}

/* The body's "model" names what is served: --served-model-name, or
 * without it the -m folder's name or -m as given (vLLM serves args.model
 * under its path as given; the basename is what our records carry). */
static bool served_name_ok(const run_state *s, const char *name)
{
    if (s->o->served_model_name)
        return strcmp(name, s->o->served_model_name) == 0;
    return strcmp(name, s->model_name) == 0 || strcmp(name, s->o->model_dir) == 0;
}

/* vLLM's adapter selection (cli/README.md "LoRA adapters"): the served
 * name is the base model (0), a --lora NAME its adapter (1 + its index),
 * anything else -1 (the line's 404 record). */
static int32_t lora_of_model(const run_state *s, const char *name)
{
    if (served_name_ok(s, name))
        return 0;
    const size_t n = strlen(name);
    for (int32_t i = 0; i < s->o->n_loras; i++)
        if ((size_t)s->o->lora_name_len[i] == n && memcmp(s->o->lora_name[i], name, n) == 0)
            return i + 1;
    return -1;
}

static int note_order(run_state *s, int64_t offset)
{
    if (s->n_order == s->cap_order) {
        size_t cap = s->cap_order ? 2 * s->cap_order : 1024;
        int64_t *o = realloc(s->order, cap * sizeof *o);
        if (!o) {
            pg_error_set(&s->err, PG_ENOMEM, "out of memory");
            fail(s, CLI_EXIT_IO, NULL);
            return PG_ENOMEM;
        }
        s->order = o;
        s->cap_order = cap;
    }
    s->order[s->n_order++] = offset;
    return PG_OK;
}

/* One input line: parse, check the id, shard and resume filters, submit. */
static void take_line(run_state *s, const char *line, size_t len, int64_t line_no)
{
    int64_t index = s->next_index++;
    cli_request r;
    pg_error e;
    int rc = cli_request_parse_ex(&r, line, len, s->fmt, index, line_no, &s->defaults, s->o->seed,
                                  s->o->strict, &e);
    /* Every line's id is registered, in and out of the shard and of the
     * resumed part, so duplicate detection is the same in every run. */
    if (s->ids && r.id_key) {
        int64_t first = 0;
        int added = cli_id_set_add(s->ids, r.id_key, r.id_key_len, line_no, &first);
        if (added == 0 && rc == PG_OK) {
            rc = pg_error_set(&e, PG_EINVAL, "duplicate id %s (first used on line %lld)", r.id_json,
                              (long long)first);
        } else if (added < 0) {
            rc = pg_error_set(&e, PG_ENOMEM, "out of memory");
        }
    }
    bool in_shard = index % s->o->shard_n == s->o->shard_k;
    if (!in_shard) {
        cli_request_free(&r);
        return;
    }
    int prior = cli_resume_lookup(s->kept, rc == PG_OK ? r.id_key : NULL, r.id_key_len, line_no);
    if (s->track_order && note_order(s, prior == CLI_RESUME_NEW ? -1
                                     : cli_resume_offset(s->kept, rc == PG_OK ? r.id_key : NULL,
                                                         r.id_key_len, line_no)) != PG_OK) {
        cli_request_free(&r);
        return;
    }
    if (prior != CLI_RESUME_NEW) {
        s->counts.skipped++;
        s->counts.skipped_failed += prior == CLI_RESUME_ERROR;
        cli_request_free(&r);
        return;
    }
    if (rc == PG_OK && r.n_lax > 0)
        s->counts.lax_lines++;
    const int32_t lora = rc == PG_OK && r.model ? lora_of_model(s, r.model) : 0;
    if (lora > 0 && r.embed) {
        rc = pg_error_set(&e, PG_EINVAL, "model '%.200s' is a LoRA adapter: embeddings run on the base model",
                          r.model);
    } else if (lora > 0) {
        r.sp.lora = lora;
    }
    if (rc == PG_OK && lora < 0) {
        /* vLLM's _check_model: an unknown model is a 404 NotFoundError */
        char msg[512];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", r.model);
        emit_error_status(s, r.id_json, line_no, 404, msg);
    } else if (rc != PG_OK) {
        emit_error(s, r.id_json, line_no, e.msg);
    } else {
        submit(s, &r);
    }
    cli_request_free(&r);
}

static bool can_admit(const run_state *s)
{
    if (s->eof || s->exit_code != CLI_EXIT_OK || cli_signals_stop_requested())
        return false;
    if (s->in_engine >= s->window)
        return false;
    return s->o->unordered || cli_reorder_can_admit(s->reorder, s->next_seq);
}

static void admit(run_state *s)
{
    while (can_admit(s)) {
        const char *line;
        size_t len;
        int64_t line_no;
        int rc = cli_input_next(s->in, &line, &len, &line_no, &s->err);
        if (rc == CLI_INPUT_EINTR)
            continue; /* the loop condition sees the stop flag */
        if (rc == CLI_INPUT_EOF) {
            s->eof = true;
            break;
        }
        if (rc < 0) {
            fail(s, CLI_EXIT_IO, NULL);
            break;
        }
        take_line(s, line, len, line_no);
    }
}

/* ---- results ------------------------------------------------------------------ */

static void collect(run_state *s, bool discard_aborted)
{
    request_output *out;
    while (engine_pop_finished(s->eng, &out)) {
        cli_pending *p = out->user;
        s->in_engine--;
        if (p->group) {
            collect_part(s, p, out);
            request_output_free(out);
            continue;
        }
        bool aborted = false;
        for (int32_t k = 0; k < out->n_outputs; k++)
            aborted |= out->outputs[k].finish == FINISH_ABORT;
        if (aborted && discard_aborted) {
            /* not written: --resume redoes it */
        } else {
            json_buf b = {0};
            cli_output_result(&b, &s->octx, p, out);
            s->counts.ok++;
            emit(s, p->seq, &b);
        }
        cli_pending_free(p);
        request_output_free(out);
    }
}

/* After an interrupt: every finished record goes out, gaps and all. */
static void flush_all(run_state *s)
{
    char *data;
    size_t len;
    if (!s->reorder)
        return;
    while (cli_reorder_pop_any(s->reorder, &data, &len)) {
        if (s->exit_code == CLI_EXIT_OK)
            write_record(s, data, len);
        free(data);
    }
}

/* ---- setup -------------------------------------------------------------------- */

static int resolve_defaults(run_state *s)
{
    const cli_options *o = s->o;
    sampling_params d = sampling_params_default();
    d.max_tokens = CLI_DEFAULT_MAX_TOKENS;
    /* --generation-config vllm: vLLM's get_diff_sampling_param returns {}
     * (vllm/config/model.py at 18ec6629), so none of the file's sampling
     * keys apply; its eos ids are read either way (try_get_generation_config
     * reads the model's file for "auto" and "vllm" alike) */
    llama_config none;
    memset(&none, 0, sizeof none);
    const llama_config *g = o->generation_config_defaults ? &s->cfg : &none;
    if (g->has_temperature)
        d.temperature = g->temperature;
    if (g->has_top_p)
        d.top_p = g->top_p;
    if (g->has_top_k)
        d.top_k = g->top_k;
    /* vLLM's --generation-config auto (vllm/config/model.py
     * get_diff_sampling_param at 18ec6629): repetition_penalty,
     * temperature, top_k, top_p, min_p, max_new_tokens (as max_tokens);
     * do_sample is not among them, so a do_sample false file with a
     * temperature samples, as in vLLM */
    if (g->has_repetition_penalty)
        d.repetition_penalty = g->repetition_penalty;
    if (g->has_min_p)
        d.min_p = g->min_p;
    if (g->has_max_new_tokens)
        d.max_tokens = g->max_new_tokens;
    const sampling_params *f = &o->sampling;
    unsigned set = o->sampling_set;
    if (set & CLI_SET_MAX_TOKENS) d.max_tokens = f->max_tokens;
    if (set & CLI_SET_TEMPERATURE) d.temperature = f->temperature;
    if (set & CLI_SET_TOP_P) d.top_p = f->top_p;
    if (set & CLI_SET_TOP_K) d.top_k = f->top_k;
    if (set & CLI_SET_MIN_P) d.min_p = f->min_p;
    if (set & CLI_SET_N) d.n = f->n;
    if (set & CLI_SET_MIN_TOKENS) d.min_tokens = f->min_tokens;
    if (set & CLI_SET_PRESENCE) d.presence_penalty = f->presence_penalty;
    if (set & CLI_SET_FREQUENCY) d.frequency_penalty = f->frequency_penalty;
    if (set & CLI_SET_REPETITION) d.repetition_penalty = f->repetition_penalty;
    if (set & CLI_SET_LOGPROBS) d.logprobs = f->logprobs;
    if (set & CLI_SET_IGNORE_EOS) d.ignore_eos = f->ignore_eos;
    d.stop = o->n_stop ? o->stop : NULL;
    d.n_stop = (size_t)o->n_stop;
    s->defaults = d;
    if (sampling_params_validate(&d, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_USAGE, "default sampling flags");
        return PG_EINVAL;
    }
    return PG_OK;
}

static bool file_exists(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* --lora NAME=DIR: each adapter read against the model's config, checked
 * against --max-lora-rank, uploaded as the model's slot i (model_lora_add).
 * An executor without the LoRA op is a usage error like the other device
 * refusals; a bad adapter a model error naming it. */
static int load_loras(run_state *s)
{
    const cli_options *o = s->o;
    for (int32_t i = 0; i < o->n_loras; i++) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)o->lora_name_len[i], o->lora_name[i]);
        if (!s->ex->op->lora_add) {
            pg_error_set(&s->err, PG_EUNSUPPORTED, "--lora %s: the %s executor has no LoRA op: run adapters "
                         "with --device cpu", name, s->ex->name);
            fail(s, CLI_EXIT_USAGE, NULL);
            return PG_EUNSUPPORTED;
        }
        const double t0 = cli_now_s();
        lora_adapter *a = NULL;
        int rc = lora_adapter_load(&a, o->lora_dir[i], &s->cfg, &s->err);
        if (rc == PG_OK && a->max_rank > o->max_lora_rank)
            rc = pg_error_set(&s->err, PG_EINVAL, "adapter rank %d exceeds --max-lora-rank %d",
                              (int)a->max_rank, (int)o->max_lora_rank);
        int32_t slot = -1;
        if (rc == PG_OK)
            rc = model_lora_add(s->mdl, a, name, &slot, &s->err);
        if (rc == PG_OK && slot != i)
            rc = pg_error_set(&s->err, PG_EINVAL, "slot %d, expected %d", (int)slot, (int)i);
        if (rc != PG_OK) {
            char what[512];
            snprintf(what, sizeof what, "--lora %s=%s", name, o->lora_dir[i]);
            lora_adapter_free(a);
            fail(s, rc == PG_EUNSUPPORTED ? CLI_EXIT_USAGE : CLI_EXIT_MODEL, what);
            return rc;
        }
        if (!o->quiet)
            fprintf(stderr, "pagedgen: lora %s: %s, rank %d, %d projections adapted, loaded in %.1f ms "
                    "(base_model_name_or_path '%s', not checked)\n", name, o->lora_dir[i], (int)a->max_rank,
                    (int)a->n_adapted, (cli_now_s() - t0) * 1e3, a->base_model_name_or_path);
        lora_adapter_free(a);
    }
    return PG_OK;
}

static void set_model_name(run_state *s)
{
    if (s->o->served_model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", s->o->served_model_name);
        return;
    }
    const char *dir = s->o->model_dir;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)(n - b), dir + b);
}

/* --reasoning-parser needs "<think>" and "</think>" to be single tokens
 * of the tokenizer, or vLLM refuses to build the parser
 * (BaseThinkingReasoningParser.__init__: "... could not locate think
 * start/end tokens in the tokenizer!"): refused here at start-up. */
static int find_think_tokens(run_state *s)
{
    s->think_start_id = s->think_end_id = -1;
    if (s->o->reasoning_parser == CLI_REASONING_NONE)
        return PG_OK;
    const char *names[2] = {CLI_REASONING_START, CLI_REASONING_END};
    int32_t *out[2] = {&s->think_start_id, &s->think_end_id};
    for (int k = 0; k < 2; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        pg_error e;
        if (s->tok && tok_encode(s->tok, names[k], strlen(names[k]), false, &ids, &n, &e) == PG_OK && n == 1)
            *out[k] = ids[0];
        free(ids);
        if (*out[k] < 0) {
            pg_error_set(&s->err, PG_EINVAL,
                         "--reasoning-parser %s: expected '%s' to be one token of the tokenizer, got %s "
                         "(vLLM: could not locate think start/end tokens in the tokenizer)",
                         cli_reasoning_parser_name(s->o->reasoning_parser), names[k],
                         s->tok ? "several" : "no tokenizer");
            fail(s, CLI_EXIT_USAGE, NULL);
            return PG_EINVAL;
        }
    }
    return PG_OK;
}

static int load_model(run_state *s)
{
    const cli_options *o = s->o;
    if (llama_config_load(&s->cfg, o->model_dir, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_MODEL, o->model_dir);
        return -1;
    }
    const char *tdir = o->tokenizer_dir ? o->tokenizer_dir : o->model_dir;
    if (o->tokenizer_dir || file_exists(o->model_dir, "tokenizer.json")) {
        if (tok_load(&s->tok, tdir, &s->err) != PG_OK) {
            fail(s, CLI_EXIT_MODEL, tdir);
            return -1;
        }
    } else if (!o->quiet) {
        fprintf(stderr, "pagedgen: %s has no tokenizer.json: prompts must be prompt_token_ids and "
                        "outputs carry no text (give --tokenizer DIR)\n", o->model_dir);
    }
    /* The chat template is parsed now, so that one that does not parse is
     * refused before any work (exit 3, with its line and column); none
     * found is not an error: chat lines then get CLI_CHAT_NO_TEMPLATE. */
    int crc = cli_chat_open(&s->chat, o, tdir, s->tok, true, &s->err);
    if (crc != PG_OK) {
        fail(s, crc == PG_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_MODEL, NULL);
        return -1;
    }
    if (find_think_tokens(s) != PG_OK)
        return -1;
    s->max_model_len = o->max_model_len ? o->max_model_len : s->cfg.max_position_embeddings;
    if (s->max_model_len > s->cfg.max_position_embeddings) {
        pg_error_set(&s->err, PG_EINVAL, "--max-model-len %d exceeds the model's max_position_embeddings %d",
                     (int)s->max_model_len, (int)s->cfg.max_position_embeddings);
        fail(s, CLI_EXIT_USAGE, NULL);
        return -1;
    }
    if (resolve_defaults(s) != PG_OK)
        return -1;
    /* embeddings: the folder's sentence-transformers files (embed_prepare.h) */
    if (st_pooling_load(&s->stp, o->model_dir, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_MODEL, o->model_dir);
        return -1;
    }
    cli_embed_default_pooling(o->pooling, &s->stp, &s->pool, &s->pool_source);
    int rc = cli_device_open(o, &s->ex, &s->err);
    if (rc != PG_OK) {
        fail(s, rc == PG_EUNSUPPORTED || rc == PG_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_MODEL, "device");
        return -1;
    }
    if (o->profile_ops && strcmp(s->ex->name, "cpu") != 0) {
        /* an op returns before it has run there: the times would be launch times */
        pg_error_set(&s->err, PG_EINVAL, "--profile-ops times the ops of the cpu executor; the %s "
                     "executor runs them asynchronously (profile it with Nsight Systems)", s->ex->name);
        fail(s, CLI_EXIT_USAGE, NULL);
        return -1;
    }
    if (st_open(&s->weights, o->model_dir, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_MODEL, NULL);
        return -1;
    }
    /* plans the KV pool (on cuda by measuring a first load) and loads */
    cli_kv_plan plan;
    if (cli_model_create(&s->mdl, &plan, o, s->ex, &s->cfg, s->weights, s->max_model_len,
                         &s->err) != PG_OK) {
        fail(s, CLI_EXIT_MODEL, o->model_dir);
        return -1;
    }
    if (load_loras(s) != PG_OK)
        return -1;
    if (o->profile_ops)
        model_set_op_profile(s->mdl, &s->prof);
    /* The weights now live on the executor; the mapping is not needed. */
    st_close(s->weights);
    s->weights = NULL;

    engine_params ep = engine_params_default();
    ep.block_size = o->block_size;
    ep.num_blocks = plan.num_blocks;
    ep.max_num_seqs = o->max_num_seqs;
    ep.max_num_batched_tokens = o->max_num_batched_tokens;
    ep.max_model_len = s->max_model_len;
    ep.prefix_caching = o->prefix_caching;
    ep.sliding_window = o->free_window_blocks ? s->cfg.sliding_window : 0;
    ep.layout = o->layout;
    ep.check_invariants = o->check_invariants;
    ep.prompt_logprobs_per_step = o->prompt_logprobs_per_step;
    ep.eos_token_ids = s->cfg.eos_token_ids;
    ep.n_eos_token_ids = s->cfg.n_eos_token_ids;
    ep.n_loras = o->n_loras;
    ep.max_loras = o->n_loras > 0 ? o->max_loras : 0;
    /* PAGEDGEN_OVERLAP=off: the serial engine loop on an asynchronous
     * device (CUDA), for comparison (gpu/README.md "Overlapping the host
     * with the device"); on (the default) has no effect on the cpu */
    const char *overlap = getenv("PAGEDGEN_OVERLAP");
    if (overlap && strcmp(overlap, "off") != 0 && strcmp(overlap, "on") != 0) {
        pg_error_set(&s->err, PG_EINVAL, "expected off or on, got '%s'", overlap);
        fail(s, CLI_EXIT_USAGE, "PAGEDGEN_OVERLAP");
        return -1;
    }
    ep.serial_loop = overlap && strcmp(overlap, "off") == 0;
    /* beam search's eos is the tokenizer's eos_token_id (vLLM's beam_search) */
    if (s->tok && tok_eos_id(s->tok) >= 0 && tok_eos_id(s->tok) < s->cfg.vocab_size)
        ep.beam_eos_token_id = tok_eos_id(s->tok);
    engine_backend be = model_backend(s->mdl);
    if (engine_create(&s->eng, &ep, &be, s->tok, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_MODEL, "engine");
        return -1;
    }
    if (o->profile_steps) { /* the cpu executor reports no phases of its own: that is fine */
        step_profile_init(&s->sprof, s->cfg.num_hidden_layers);
        engine_set_step_profile(s->eng, &s->sprof);
        (void)model_set_step_profile(s->mdl, &s->sprof);
    }
    if (!o->quiet) {
        int64_t tokens = (int64_t)plan.num_blocks * o->block_size;
        double mib = (double)plan.num_blocks * (double)plan.bytes_per_block / 1048576.0;
        char dev[96];
        if (strcmp(s->ex->name, "cpu") == 0)
            snprintf(dev, sizeof dev, "%s (weights %s, kv cache %s)", s->ex->name,
                     s->ex->wt_block_elems ? "int8" : (s->ex->wt_bytes == 2 ? "bf16" : "f32"),
                     s->ex->kv_bytes == 4 ? "f32" : (o->kv_cache_dtype == CLI_KV_DTYPE_FP16 ? "fp16" : "bf16"));
        else
            snprintf(dev, sizeof dev, "%s:%d (%s, kv cache %s)", s->ex->name, (int)o->cuda_device,
                     s->ex->act_bytes == 4 ? "float32" : "bfloat16",
                     s->ex->kv_bytes == 4 ? "f32" : (o->kv_cache_dtype == CLI_KV_DTYPE_FP16 ? "fp16" : "bf16"));
        fprintf(stderr, "pagedgen: model %s: %d layers, hidden %d, vocab %d, max_model_len %d; device %s\n",
                s->model_name, (int)s->cfg.num_hidden_layers, (int)s->cfg.hidden_size,
                (int)s->cfg.vocab_size, (int)s->max_model_len, dev);
        if (plan.measured)
            fprintf(stderr, "pagedgen: device memory: total %.1f MiB, utilization %.2f, free %.1f MiB after "
                            "loading (%.1f MiB: weights, workspaces), %.1f MiB left by the profile step, "
                            "%.1f MiB kept for buffers grown while running\n",
                    (double)plan.total_bytes / 1048576.0, o->gpu_memory_utilization,
                    (double)plan.free_after_load_bytes / 1048576.0, (double)plan.load_bytes / 1048576.0,
                    (double)plan.profile_bytes / 1048576.0, (double)plan.reserve_bytes / 1048576.0);
        fprintf(stderr, "pagedgen: KV cache: %d blocks of %d tokens = %lld tokens, %.1f MiB (%s%s)\n",
                (int)plan.num_blocks, (int)o->block_size, (long long)tokens, mib, plan.source,
                plan.capped_to ? ", capped to max-num-seqs x max-model-len" : "");
        fprintf(stderr, "pagedgen: Maximum concurrency for %d tokens per request: %.2fx\n",
                (int)s->max_model_len, (double)tokens / (double)s->max_model_len);
    }
    return 0;
}

static int open_output(run_state *s)
{
    const cli_options *o = s->o;
    if (strcmp(o->output_path, "-") == 0) {
        s->out_fd = STDOUT_FILENO;
        s->kept = o->resume_kept;
        return 0;
    }
    if (o->resume && cli_resume_load(&s->resume, o->output_path, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        return -1;
    }
    s->kept = s->resume;
    s->track_order = s->shard_marker && cli_resume_kept_bytes(s->resume) > 0;
    int flags = O_WRONLY | O_CREAT | (o->resume ? O_APPEND : O_TRUNC);
    s->out_fd = open(o->output_path, flags, 0644);
    if (s->out_fd < 0) {
        pg_error_set(&s->err, PG_EIO, "%s: cannot open output: %s", o->output_path, strerror(errno));
        fail(s, CLI_EXIT_IO, NULL);
        return -1;
    }
    if (s->resume && !o->quiet)
        fprintf(stderr, "pagedgen: --resume: %lld records kept in %s%s\n",
                (long long)cli_resume_records(s->resume), o->output_path,
                cli_resume_cut_bytes(s->resume) ? " (a partial last line was cut off)" : "");
    return 0;
}

static int open_input(run_state *s)
{
    if (cli_input_open(&s->in, s->o->input_path, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        return -1;
    }
    s->fmt = s->o->input_format;
    if (s->fmt == CLI_FORMAT_AUTO) {
        const char *line;
        size_t len;
        int rc;
        do {
            rc = cli_input_peek(s->in, &line, &len, &s->err);
        } while (rc == CLI_INPUT_EINTR && !cli_signals_stop_requested());
        if (rc < 0) {
            fail(s, CLI_EXIT_IO, NULL);
            return -1;
        }
        s->fmt = rc == CLI_INPUT_LINE ? cli_detect_format(line, len) : CLI_FORMAT_JSONL;
    }
    int64_t lines = cli_input_count(s->o->input_path);
    if (lines >= 0) {
        int64_t n = s->o->shard_n, k = s->o->shard_k;
        s->counts.total = lines > k ? (lines - k + n - 1) / n : 0;
    } else {
        s->counts.total = -1;
    }
    return 0;
}

static void teardown(run_state *s)
{
    if (s->eng) {
        /* pending records still owned by unfinished requests */
        engine_abort_all(s->eng);
        request_output *out;
        while (engine_pop_finished(s->eng, &out)) {
            cli_pending_free(out->user);
            request_output_free(out);
        }
    }
    engine_destroy(s->eng);
    model_destroy(s->mdl);
    st_close(s->weights);
    if (s->ex)
        s->ex->op->destroy(s->ex);
    cli_chat_close(&s->chat);
    tok_free(s->tok);
    cli_input_close(s->in);
    if (s->out_fd > STDERR_FILENO)
        close(s->out_fd);
    cli_resume_destroy(s->resume);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s->order);
    cli_id_set_destroy(s->ids);
    cli_reorder_destroy(s->reorder);
    cli_progress_destroy(s->progress);
}

/* ---- shards (shard.h) ------------------------------------------------------------ */

static const char *env_getenv(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

/* --shard auto (K, N from the scheduler) and the -o naming ({shard}, a
 * directory): rewrites o's shard and output_path (*path owns the latter). */
static int shard_resolve(cli_options *o, char **path, pg_error *err)
{
    *path = NULL;
    if (!o->shard_given)
        return PG_OK;
    char source[160] = "";
    if (o->shard_auto &&
        cli_shard_from_env(env_getenv, NULL, o->shard_auto_n, &o->shard_k, &o->shard_n, source, sizeof source,
                           err) != PG_OK)
        return PG_EINVAL;
    if (strcmp(o->output_path, "-") != 0) {
        size_t l = strlen(o->output_path);
        bool is_dir = pg_dir_exists(o->output_path) == 1 || (l > 0 && o->output_path[l - 1] == '/');
        /* -o out/: every task of the array may be the first (EEXIST is fine) */
        if (is_dir && mkdir(o->output_path, 0755) != 0 && errno != EEXIST)
            return pg_error_set(err, PG_EIO, "-o %s: cannot create the directory: %s", o->output_path,
                                strerror(errno));
        int rc = cli_shard_output_path(o->output_path, is_dir, o->input_path, o->shard_k, o->shard_n, path, err);
        if (rc != PG_OK)
            return rc;
        if (*path)
            o->output_path = *path;
        else if (o->shard_auto)
            return pg_error_set(err, PG_EINVAL, "--shard auto: every task of the array would write -o %s: put "
                                "{shard} in its name or give a directory (-o out/)", o->output_path);
    }
    if (o->shard_auto && !o->quiet)
        fprintf(stderr, "pagedgen: --shard auto: shard %d of %d (%s), output %s\n", (int)o->shard_k,
                (int)o->shard_n, source, o->output_path);
    return PG_OK;
}

/* Before the output is opened: without --resume an old marker goes; with
 * it, a marker that matches this run means the shard is done (1, *code =
 * the finished run's exit code), one from another input or other flags is
 * refused (-1, exit 2), a stale one (the output changed since) goes. 0: run. */
static int shard_check_marker(run_state *s, int *code)
{
    const cli_options *o = s->o;
    s->shard_marker = o->shard_given && strcmp(o->output_path, "-") != 0 && strcmp(o->input_path, "-") != 0 &&
                      !o->unordered;
    if (!s->shard_marker)
        return 0;
    char *mpath = cli_shard_marker_path(o->output_path);
    char *flags = NULL;
    cli_shard_marker m = {0};
    int ret = 0, rc;
    if (!mpath || cli_shard_flags_canonical(o->shaping, &flags) != PG_OK) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory");
        fail(s, CLI_EXIT_IO, NULL);
        ret = -1;
        goto out;
    }
    /* One writer per shard: a scheduler may start a task's replacement
     * while the old one still runs (Kubernetes without
     * podReplacementPolicy: Failed). Before anything is truncated or
     * unlinked; file systems without flock (ENOLCK, EINVAL) go unlocked. */
    s->lock_fd = open(o->output_path, O_RDWR | O_CREAT, 0644);
    if (s->lock_fd < 0) {
        pg_error_set(&s->err, PG_EIO, "%s: cannot open output: %s", o->output_path, strerror(errno));
        fail(s, CLI_EXIT_IO, NULL);
        ret = -1;
        goto out;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
        pg_error_set(&s->err, PG_EINVAL, "%s: another pagedgen is writing this shard (it holds the file's "
                     "lock): not started", o->output_path);
        fail(s, CLI_EXIT_USAGE, NULL);
        ret = -1;
        goto out;
    }
    if (!o->resume) {
        unlink(mpath);
        goto out;
    }
    rc = cli_shard_marker_read(o->output_path, &m, &s->err);
    if (rc == CLI_SHARD_NO_MARKER)
        goto out;
    if (rc != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        ret = -1;
        goto out;
    }
    int64_t in_bytes = 0;
    uint64_t in_hash = 0;
    if (cli_shard_hash_file(o->input_path, &in_bytes, &in_hash, NULL, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        ret = -1;
        goto out;
    }
    const char *why = m.k != o->shard_k || m.n != o->shard_n ? "another shard"
                      : m.input_bytes != in_bytes || m.input_hash != in_hash ? "another input"
                      : strcmp(m.flags, flags) != 0 ? "other output-shaping flags" : NULL;
    if (why) {
        pg_error_set(&s->err, PG_EINVAL, "--resume: %s says the output is shard %d of %d of %s: remove %s and its "
                     "marker to start again, or resume with the flags it was made with", mpath, (int)m.k,
                     (int)m.n, why, o->output_path);
        fail(s, CLI_EXIT_USAGE, NULL);
        ret = -1;
        goto out;
    }
    struct stat st;
    if (stat(o->output_path, &st) != 0 || (int64_t)st.st_size != m.output_bytes) {
        if (!o->quiet)
            fprintf(stderr, "pagedgen: --resume: %s changed since its shard finished (%s): resuming it\n",
                    o->output_path, mpath);
        unlink(mpath);
        goto out;
    }
    if (!o->quiet)
        fprintf(stderr, "pagedgen: --resume: shard %d of %d already finished (%s): nothing to do\n",
                (int)o->shard_k, (int)o->shard_n, mpath);
    *code = m.exit_code;
    ret = 1;
out:
    cli_shard_marker_free(&m);
    free(flags);
    free(mpath);
    return ret;
}

/* The shard ran to its end: a resumed file is put back in input order,
 * then the marker is written (shard.h). */
static void shard_finish(run_state *s)
{
    const cli_options *o = s->o;
    if (s->out_fd > STDERR_FILENO)
        close(s->out_fd);
    s->out_fd = -1;
    if (s->track_order &&
        cli_shard_sort_output(o->output_path, cli_resume_kept_bytes(s->resume), s->order, s->n_order,
                              &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        return;
    }
    cli_shard_marker m = {.k = o->shard_k, .n = o->shard_n,
                          .exit_code = s->counts.failed + s->counts.skipped_failed > 0 ? 1 : 0};
    snprintf(m.format, sizeof m.format, "%s", cli_format_name(s->fmt));
    uint64_t out_hash;
    if (cli_shard_hash_file(o->input_path, &m.input_bytes, &m.input_hash, NULL, &s->err) != PG_OK ||
        cli_shard_hash_file(o->output_path, &m.output_bytes, &out_hash, &m.records, &s->err) != PG_OK) {
        fail(s, CLI_EXIT_IO, NULL);
        return;
    }
    if (cli_shard_flags_canonical(o->shaping, &m.flags) != PG_OK) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory");
        fail(s, CLI_EXIT_IO, NULL);
        return;
    }
    if (cli_shard_marker_write(o->output_path, &m, &s->err) != PG_OK)
        fail(s, CLI_EXIT_IO, NULL);
    cli_shard_marker_free(&m);
}

int cli_run_generate(const cli_options *opts)
{
    run_state st;
    memset(&st, 0, sizeof st);
    run_state *s = &st;
    cli_options local = *opts; /* --shard auto and {shard} rewrite shard and output_path */
    const cli_options *o = &local;
    char *shard_path = NULL;
    s->o = o;
    s->out_fd = -1;
    s->lock_fd = -1;
    int src = shard_resolve(&local, &shard_path, &s->err);
    if (src != PG_OK) {
        fail(s, src == PG_ENOMEM || src == PG_EIO ? CLI_EXIT_IO : CLI_EXIT_USAGE, NULL);
        goto done;
    }
    int done_code = 0;
    int mk = shard_check_marker(s, &done_code);
    if (mk < 0)
        goto done;
    if (mk > 0) {
        close(s->lock_fd);
        free(shard_path);
        return done_code;
    }
    cli_signals_install();
    set_model_name(s);

    if (open_input(s) != 0 || open_output(s) != 0 || load_model(s) != 0)
        goto done;

    s->window = o->max_num_seqs * 4;
    if (s->window < 16)
        s->window = 16;
    if (s->fmt != CLI_FORMAT_TEXT && !(s->ids = cli_id_set_create())) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory");
        fail(s, CLI_EXIT_IO, NULL);
        goto done;
    }
    if (cli_reorder_create(&s->reorder, (size_t)o->max_num_seqs * 8 + 64) != PG_OK ||
        cli_progress_create(&s->progress, STDERR_FILENO, isatty(STDERR_FILENO) == 1, o->quiet,
                            o->log_interval_s) != 0) {
        pg_error_set(&s->err, PG_ENOMEM, "out of memory");
        fail(s, CLI_EXIT_IO, NULL);
        goto done;
    }
    s->octx = (cli_output_ctx){
        .fmt = s->fmt, .tok = s->tok, .model_name = s->model_name,
        .lora_names = o->lora_name, .lora_name_lens = o->lora_name_len, .n_loras = o->n_loras,
        .include_prompt = o->include_prompt, .metrics = o->metrics,
        .eos_ids = s->cfg.eos_token_ids, .n_eos_ids = s->cfg.n_eos_token_ids,
        .primary_eos = s->tok && tok_eos_id(s->tok) >= 0 ? tok_eos_id(s->tok)
                       : s->cfg.n_eos_token_ids > 0 ? s->cfg.eos_token_ids[0] : -1,
        .reasoning = o->reasoning_parser,
    };

    engine_stats stats;
    for (;;) {
        admit(s);
        if (s->exit_code != CLI_EXIT_OK || cli_signals_stop_requested())
            break;
        if (!engine_has_unfinished(s->eng)) {
            if (s->eof)
                break;
            continue; /* (can't happen: the oldest unwritten request is in the engine) */
        }
        if (engine_step(s->eng, &s->err) != PG_OK) {
            fail(s, CLI_EXIT_MODEL, "engine step");
            break;
        }
        collect(s, false);
        engine_get_stats(s->eng, &stats);
        cli_progress_update(s->progress, &s->counts, &stats, false);
    }
    bool interrupted = cli_signals_stop_requested() && s->exit_code == CLI_EXIT_OK;
    if (interrupted) {
        /* stop admitting, abort what runs (not written: --resume redoes it),
         * flush everything that finished */
        collect(s, true);
        engine_abort_all(s->eng);
        collect(s, true);
        flush_all(s);
    }
    engine_get_stats(s->eng, &stats);
    cli_progress_summary(s->progress, &s->counts, &stats, interrupted);
    if (o->profile_ops) /* asked for by name: printed under --quiet too */
        op_profile_print(&s->prof, stderr, "pagedgen: ");
    if (o->profile_steps)
        step_profile_print(&s->sprof, stderr, "pagedgen: ");
    if (interrupted && s->exit_code == CLI_EXIT_OK)
        s->exit_code = CLI_EXIT_INTERRUPTED;
    if (s->exit_code == CLI_EXIT_OK && s->shard_marker)
        shard_finish(s);
done:;
    int code = s->exit_code;
    /* error records kept from an earlier run count: a resumed run exits
     * like the uninterrupted run would have */
    if (code == CLI_EXIT_OK && s->counts.failed + s->counts.skipped_failed > 0)
        code = CLI_EXIT_LINES_FAILED;
    teardown(s);
    free(shard_path);
    return code;
}
