/* output: record formatting (see output.h). */
#include "output.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "request_parse.h"
#include "sampling_params.h"
#include "tokenizer.h"

void cli_pending_free(cli_pending *p)
{
    if (!p)
        return;
    if (p->group) {
        cli_pending *g = p->group;
        free(p);
        if (--g->emb_refs > 0)
            return;
        p = g;
    }
    for (int32_t k = 0; p->emb && k < p->n_embed; k++)
        free(p->emb[k]);
    free(p->emb);
    free(p->emb_error);
    free(p->id_json);
    free(p->prompt);
    free(p->prompt_ids);
    free(p);
}

static void put_ids(json_buf *b, const int32_t *ids, int32_t n)
{
    json_buf_puts(b, "[");
    for (int32_t k = 0; k < n; k++)
        json_buf_printf(b, k ? ",%d" : "%d", (int)ids[k]);
    json_buf_puts(b, "]");
}

/* Logprobs as JSON numbers: -inf (a token the sampler could not pick) has
 * no JSON spelling; it is written as -9999.0 as vLLM does. */
static void put_logprob(json_buf *b, float x)
{
    if (!isfinite(x))
        json_buf_puts(b, x > 0 ? "9999.0" : "-9999.0");
    else
        json_buf_printf(b, "%.7g", (double)x);
}

static const char *finish_name(finish_reason f)
{
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ABORT: return "abort";
    case FINISH_NONE: break;
    }
    return "length";
}

static void put_stop_reason(json_buf *b, const cli_output_ctx *c, const seq_output *s)
{
    if (s->finish == FINISH_STOP && s->stop_str) {
        json_buf_string(b, s->stop_str, strlen(s->stop_str));
        return;
    }
    if (s->finish == FINISH_STOP && s->stop_token_id >= 0 && s->has_cumulative_logprob) {
        /* beam search: vLLM's beam_search sets stop_reason = eos_token_id */
        json_buf_printf(b, "%d", (int)s->stop_token_id);
        return;
    }
    if (s->finish == FINISH_STOP && s->stop_token_id >= 0) {
        bool is_null = c->primary_eos >= 0 ? s->stop_token_id == c->primary_eos : false;
        for (int32_t k = 0; c->primary_eos < 0 && k < c->n_eos_ids; k++)
            is_null = is_null || c->eos_ids[k] == s->stop_token_id;
        if (is_null)
            json_buf_puts(b, "null");
        else
            json_buf_printf(b, "%d", (int)s->stop_token_id);
        return;
    }
    json_buf_puts(b, "null");
}

static void put_text(json_buf *b, const seq_output *s)
{
    if (s->text)
        json_buf_string(b, s->text, s->text_len);
    else
        json_buf_puts(b, "null");
}

/* --reasoning-parser: the split of a chat output's text (cli/reasoning.h);
 * the request's include_reasoning false drops the reasoning, as vLLM's
 * serving_chat does after extract_reasoning. */
static void split_reasoning(const cli_output_ctx *c, const cli_pending *p, const seq_output *s,
                            cli_reasoning_split *sp)
{
    cli_reasoning_split_text(c->reasoning, s->text, s->text_len, !p->thinking_disabled, sp);
    if (p->exclude_reasoning)
        sp->has_reasoning = false;
}

static void put_part(json_buf *b, const seq_output *s, bool has, size_t off, size_t len)
{
    if (has)
        json_buf_string(b, s->text + off, len);
    else
        json_buf_puts(b, "null");
}

/* vLLM v1's logprob dict of one generated token: the sampled token first
 * ("Sampler puts the sampled logprob in first", vllm/v1/engine/logprobs.py),
 * then the top k in order, the sampled one not repeated (a dict keyed by
 * id): k entries when it is among the top k, else k + 1; 1 with k = 0.
 * Fills ids/lps (room for SAMPLING_PARAMS_MAX_LOGPROBS + 1), returns the count. */
static int32_t logprob_dict(const seq_output *s, int32_t t, int32_t *ids, float *lps)
{
    int32_t n = 0;
    ids[n] = s->token_ids[t];
    lps[n++] = s->token_logprobs[t];
    for (int32_t k = 0; k < s->n_top; k++) {
        size_t at = (size_t)t * (size_t)s->n_top + (size_t)k;
        if (s->top_ids[at] < 0 || s->top_ids[at] == s->token_ids[t])
            continue;
        ids[n] = s->top_ids[at];
        lps[n++] = s->top_logprobs[at];
    }
    return n;
}

/* One position of a completions logprobs object: a token, its logprob (or
 * none: the first prompt token) and its logprob dict. */
typedef struct lp_pos {
    int32_t id;
    bool none;
    float lp;
    int32_t n;
    int32_t ids[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    float lps[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
} lp_pos;

/* Prompt position p of o (the prompt token first, then its top k). */
static void prompt_pos(const request_output *o, const int32_t *prompt_ids, int32_t p, lp_pos *out)
{
    out->id = prompt_ids[p];
    out->n = 0;
    out->none = p == 0 || !o->prompt_logprobs || isnan(o->prompt_logprobs[p]);
    if (out->none)
        return;
    out->lp = o->prompt_logprobs[p];
    out->ids[out->n] = out->id;
    out->lps[out->n++] = out->lp;
    for (int32_t k = 0; k < o->n_prompt_top; k++) {
        size_t at = (size_t)p * (size_t)o->n_prompt_top + (size_t)k;
        if (o->prompt_top_ids[at] < 0 || o->prompt_top_ids[at] == out->id)
            continue;
        out->ids[out->n] = o->prompt_top_ids[at];
        out->lps[out->n++] = o->prompt_top_logprobs[at];
    }
}

/* [{"id": t, "logprob": x, "top": [[id, x], ...]}, ...]; "top" is the
 * logprob dict (the sampled token first, k or k + 1 entries). */
static void put_logprobs_jsonl(json_buf *b, const seq_output *s)
{
    int32_t ids[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    float lps[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    json_buf_puts(b, "[");
    for (int32_t t = 0; t < s->n_tokens; t++) {
        json_buf_printf(b, "%s{\"id\":%d,\"logprob\":", t ? "," : "", (int)s->token_ids[t]);
        put_logprob(b, s->token_logprobs[t]);
        json_buf_puts(b, ",\"top\":[");
        int32_t n = logprob_dict(s, t, ids, lps);
        for (int32_t k = 0; k < n; k++) {
            json_buf_printf(b, "%s[%d,", k ? "," : "", (int)ids[k]);
            put_logprob(b, lps[k]);
            json_buf_puts(b, "]");
        }
        json_buf_puts(b, "]}");
    }
    json_buf_puts(b, "]");
}

/* The text one token adds after a BOS (so a leading space is kept, as in
 * the completion text): decode([bos, id]) - decode([bos]). malloc'd, or
 * NULL without a tokenizer (or when decoding fails). */
static char *token_text(const tokenizer *tok, int32_t id, size_t *len_out)
{
    tok_stream *st = NULL;
    int32_t bos = tok ? tok_bos_id(tok) : -1;
    const char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    char *all = NULL;
    if (tok && tok_stream_create(&st, tok, false, &bos, bos >= 0 ? 1 : 0, NULL) == PG_OK &&
        tok_stream_push(st, id, &t1, &n1, NULL) == PG_OK) {
        char *joined = malloc(n1 + 1);
        if (joined) {
            memcpy(joined, t1, n1);
            if (tok_stream_finish(st, &t2, &n2, NULL) != PG_OK)
                n2 = 0;
            all = realloc(joined, n1 + n2 + 1);
            if (all) {
                memcpy(all + n1, t2, n2);
                all[n1 + n2] = '\0';
                *len_out = n1 + n2;
            } else {
                free(joined);
            }
        }
    }
    tok_stream_free(st);
    return all;
}

/* token_text as a JSON string; without it the id as a string ("383"). */
static void put_token_string(json_buf *b, const tokenizer *tok, int32_t id, size_t *len_out)
{
    size_t len = 0;
    char *t = token_text(tok, id, &len);
    if (t)
        json_buf_string(b, t, len);
    else
        json_buf_printf(b, "\"%d\"", (int)id);
    if (len_out)
        *len_out = len;
    free(t);
}

/* The fields of one chat API logprob: "token", "logprob", "bytes" (the
 * token text's UTF-8 bytes) — vLLM's ChatCompletionLogProb. */
static void put_chat_logprob(json_buf *b, const tokenizer *tok, int32_t id, float logprob)
{
    size_t len = 0;
    char *t = token_text(tok, id, &len);
    json_buf_puts(b, "\"token\":");
    if (t)
        json_buf_string(b, t, len);
    else
        json_buf_printf(b, "\"%d\"", (int)id);
    json_buf_puts(b, ",\"logprob\":");
    put_logprob(b, logprob);
    json_buf_puts(b, ",\"bytes\":");
    if (t) {
        json_buf_puts(b, "[");
        for (size_t k = 0; k < len; k++)
            json_buf_printf(b, k ? ",%u" : "%u", (unsigned)(unsigned char)t[k]);
        json_buf_puts(b, "]");
    } else {
        json_buf_puts(b, "null");
    }
    free(t);
}

/* The chat API's logprobs: {"content": [{token, logprob, bytes,
 * "top_logprobs": [{token, logprob, bytes}, ... top_logprobs]}, ...]}.
 * top_logprobs is the first top_logprobs entries of the logprob dict (the
 * sampled token first), as vLLM's _get_top_logprobs takes them. */
static void put_logprobs_chat(json_buf *b, const cli_output_ctx *c, const seq_output *s)
{
    int32_t ids[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    float lps[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    json_buf_puts(b, "{\"content\":[");
    for (int32_t t = 0; t < s->n_tokens; t++) {
        json_buf_puts(b, t ? ",{" : "{");
        put_chat_logprob(b, c->tok, s->token_ids[t], s->token_logprobs[t]);
        json_buf_puts(b, ",\"top_logprobs\":[");
        int32_t n = logprob_dict(s, t, ids, lps);
        if (n > s->n_top)
            n = s->n_top;
        for (int32_t k = 0; k < n; k++) {
            json_buf_puts(b, k ? ",{" : "{");
            put_chat_logprob(b, c->tok, ids[k], lps[k]);
            json_buf_puts(b, "}");
        }
        json_buf_puts(b, "]}");
    }
    json_buf_puts(b, "]}");
}

/* OpenAI completions logprobs over positions: tokens, token_logprobs,
 * top_logprobs, text_offset (vLLM's _create_completion_logprobs). */
static void put_logprobs_positions(json_buf *b, const cli_output_ctx *c, const lp_pos *pos, int32_t n)
{
    json_buf_puts(b, "{\"tokens\":[");
    for (int32_t t = 0; t < n; t++) {
        if (t)
            json_buf_puts(b, ",");
        put_token_string(b, c->tok, pos[t].id, NULL);
    }
    json_buf_puts(b, "],\"token_logprobs\":[");
    for (int32_t t = 0; t < n; t++) {
        if (t)
            json_buf_puts(b, ",");
        if (pos[t].none)
            json_buf_puts(b, "null");
        else
            put_logprob(b, pos[t].lp);
    }
    /* top_logprobs: the logprob dict (sampled or prompt token first, k or
     * k + 1 entries) as {token text: logprob}; tokens with the same text
     * are one key, at the first one's place with the last one's value (a
     * Python dict built by a comprehension, serving_completion.py
     * _create_completion_logprobs); null where the logprob is */
    json_buf_puts(b, "],\"top_logprobs\":[");
    char *txt[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    size_t tlen[SAMPLING_PARAMS_MAX_LOGPROBS + 1];
    for (int32_t t = 0; t < n; t++) {
        if (t)
            json_buf_puts(b, ",");
        if (pos[t].none) {
            json_buf_puts(b, "null");
            continue;
        }
        json_buf_puts(b, "{");
        int32_t m = pos[t].n;
        for (int32_t k = 0; k < m; k++) {
            tlen[k] = 0;
            txt[k] = token_text(c->tok, pos[t].ids[k], &tlen[k]);
            if (!txt[k]) {
                char num[16];
                int w = snprintf(num, sizeof num, "%d", (int)pos[t].ids[k]);
                txt[k] = malloc((size_t)w + 1);
                if (txt[k])
                    memcpy(txt[k], num, (size_t)w + 1);
                tlen[k] = txt[k] ? (size_t)w : 0;
            }
        }
        bool first = true;
        for (int32_t k = 0; k < m; k++) {
            bool seen = false;
            for (int32_t j = 0; j < k && !seen; j++)
                seen = tlen[j] == tlen[k] && (tlen[k] == 0 || memcmp(txt[j], txt[k], tlen[k]) == 0);
            if (seen)
                continue;
            float v = pos[t].lps[k];
            for (int32_t j = k + 1; j < m; j++)
                if (tlen[j] == tlen[k] && (tlen[k] == 0 || memcmp(txt[j], txt[k], tlen[k]) == 0))
                    v = pos[t].lps[j];
            if (!first)
                json_buf_puts(b, ",");
            first = false;
            json_buf_string(b, txt[k] ? txt[k] : "", tlen[k]);
            json_buf_puts(b, ":");
            put_logprob(b, v);
        }
        for (int32_t k = 0; k < m; k++)
            free(txt[k]);
        json_buf_puts(b, "}");
    }
    /* text_offset: Python len() of each token's text, in characters (code
     * points: UTF-8 bytes that are not continuation bytes) */
    json_buf_puts(b, "],\"text_offset\":[");
    size_t off = 0;
    for (int32_t t = 0; t < n; t++) {
        json_buf_printf(b, t ? ",%zu" : "%zu", off);
        size_t len = 0;
        char *tx = token_text(c->tok, pos[t].id, &len);
        if (tx) {
            for (size_t k = 0; k < len; k++)
                off += ((unsigned char)tx[k] & 0xC0) != 0x80;
        } else {
            char num[16];
            off += (size_t)snprintf(num, sizeof num, "%d", (int)pos[t].id);
        }
        free(tx);
    }
    json_buf_puts(b, "]}");
}

/* The completions logprobs of choice s: with echo the prompt's positions
 * first (the first one null), then the output's (none with echo_only). */
static void put_logprobs_openai(json_buf *b, const cli_output_ctx *c, const cli_pending *p,
                                const request_output *o, const seq_output *s)
{
    int32_t n_prompt = p->echo ? p->n_prompt_ids : 0;
    int32_t n_out = p->echo_only ? 0 : s->n_tokens;
    lp_pos *pos = calloc((size_t)(n_prompt + n_out) + 1, sizeof *pos);
    if (!pos) {
        b->oom = true;
        return;
    }
    for (int32_t i = 0; i < n_prompt; i++)
        prompt_pos(o, p->prompt_ids, i, &pos[i]);
    for (int32_t t = 0; t < n_out; t++) {
        lp_pos *q = &pos[n_prompt + t];
        q->id = s->token_ids[t];
        q->lp = s->token_logprobs[t];
        q->n = logprob_dict(s, t, q->ids, q->lps);
    }
    put_logprobs_positions(b, c, pos, n_prompt + n_out);
    free(pos);
}

/* vLLM's prompt_logprobs of a completion choice: [null, {"<id>":
 * {"logprob", "rank", "decoded_token"}, ...}, ...] (the prompt token first,
 * then its top k; ranks 1.. for those). */
static void put_prompt_logprobs_vllm(json_buf *b, const cli_output_ctx *c, const cli_pending *p,
                                     const request_output *o)
{
    if (!o->prompt_logprobs || !p->prompt_ids) {
        json_buf_puts(b, "null");
        return;
    }
    json_buf_puts(b, "[");
    for (int32_t i = 0; i < p->n_prompt_ids; i++) {
        lp_pos q;
        prompt_pos(o, p->prompt_ids, i, &q);
        if (i)
            json_buf_puts(b, ",");
        if (q.none) {
            json_buf_puts(b, "null");
            continue;
        }
        json_buf_puts(b, "{");
        for (int32_t k = 0; k < q.n; k++) {
            int32_t rank = k == 0 ? o->prompt_ranks[i] : 0;
            if (k > 0)
                for (int32_t j = 0; j < o->n_prompt_top; j++)
                    if (o->prompt_top_ids[(size_t)i * (size_t)o->n_prompt_top + (size_t)j] == q.ids[k])
                        rank = j + 1;
            json_buf_printf(b, "%s\"%d\":{\"logprob\":", k ? "," : "", (int)q.ids[k]);
            put_logprob(b, q.lps[k]);
            json_buf_printf(b, ",\"rank\":%d,\"decoded_token\":", (int)rank);
            put_token_string(b, c->tok, q.ids[k], NULL);
            json_buf_puts(b, "}");
        }
        json_buf_puts(b, "}");
    }
    json_buf_puts(b, "]");
}

static int64_t completion_tokens(const request_output *o)
{
    int64_t n = 0;
    for (int32_t k = 0; k < o->n_outputs; k++)
        n += o->outputs[k].n_tokens;
    return n;
}

static void put_metrics(json_buf *b, const request_output *o)
{
    json_buf_printf(b, ",\"metrics\":{\"queue_ms\":%.3f,\"first_token_ms\":%.3f,\"total_ms\":%.3f,"
                    "\"preemptions\":%d}",
                    o->queue_ms, o->first_token_ms, o->total_ms, (int)o->n_preemptions);
}

static void openai_hash(char out[17], const char *id_json, int64_t line)
{
    char buf[32];
    uint64_t h;
    if (id_json) {
        h = cli_hash64(id_json, strlen(id_json));
    } else {
        int n = snprintf(buf, sizeof buf, "line:%lld", (long long)line);
        h = cli_hash64(buf, (size_t)n);
    }
    /* splitmix64's finalizer: FNV alone leaves similar ids with similar hashes */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* The envelope of vLLM's run-batch BatchRequestOutput up to the body:
 * {"id", "custom_id", "response": {"status_code", "request_id", "body": */
static void put_batch_head(json_buf *b, const char h[17], const char *id_json, int status)
{
    json_buf_printf(b, "{\"id\":\"batch_req_%s\",\"custom_id\":%s,\"response\":{\"status_code\":%d,"
                    "\"request_id\":\"batch-%s\",\"body\":",
                    h, id_json ? id_json : "null", status, h);
}

/* ..."created": C, "model": M — the body fields both endpoints share. */
static void put_body_head(json_buf *b, const cli_output_ctx *c, int32_t lora, const char *id_prefix,
                          const char h[17], const char *object)
{
    json_buf_printf(b, "{\"id\":\"%s%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", id_prefix, h,
                    object, c->metrics ? (long long)time(NULL) : 0LL);
    /* vLLM's OpenAIServing._get_model_name: an adapter's request answers
     * with the adapter's name, any other with the served name */
    if (lora > 0 && lora <= c->n_loras) {
        json_buf_string(b, c->lora_names[lora - 1], (size_t)c->lora_name_lens[lora - 1]);
        return;
    }
    const char *model = c->model_name ? c->model_name : "";
    json_buf_string(b, model, strlen(model));
}

/* ,"finish_reason": ..., "stop_reason": ...} — closes a choice. */
static void put_choice_end(json_buf *b, const cli_output_ctx *c, const seq_output *s)
{
    json_buf_printf(b, ",\"finish_reason\":\"%s\",\"stop_reason\":", finish_name(s->finish));
    put_stop_reason(b, c, s);
    json_buf_puts(b, "}");
}

/* },"error":null(,"metrics")}\n — closes the response and the line. */
static void put_batch_tail(json_buf *b, const cli_output_ctx *c, const request_output *o)
{
    json_buf_puts(b, "},\"error\":null");
    if (c->metrics)
        put_metrics(b, o);
    json_buf_puts(b, "}\n");
}

/* /v1/completions: vLLM's CompletionResponse body with every key its
 * model_dump_json writes, in its field order (protocol.py at vLLM 0052bed3:
 * CompletionResponseChoice, CompletionResponse, UsageInfo). */
static void body_completion(json_buf *b, const cli_output_ctx *c, const cli_pending *p, const char h[17],
                            const request_output *o)
{
    /* echo (vLLM's request_output_to_completion_response): the prompt text
     * before the output's (the ids decoded for an id prompt); with
     * max_tokens 0 the prompt alone */
    char *echo_text = NULL;
    size_t echo_len = 0;
    if (p->echo) {
        if (p->prompt) {
            echo_text = malloc(p->prompt_len + 1);
            if (echo_text) {
                memcpy(echo_text, p->prompt, p->prompt_len);
                echo_len = p->prompt_len;
            }
        } else if (c->tok && p->prompt_ids) {
            if (tok_decode(c->tok, p->prompt_ids, (size_t)p->n_prompt_ids, false, &echo_text, &echo_len, NULL) !=
                PG_OK)
                echo_text = NULL;
        }
    }
    put_body_head(b, c, p->lora, "cmpl-", h, "text_completion");
    json_buf_puts(b, ",\"choices\":[");
    for (int32_t k = 0; k < o->n_outputs; k++) {
        const seq_output *s = &o->outputs[k];
        json_buf_printf(b, "%s{\"index\":%d,\"text\":", k ? "," : "", (int)s->index);
        if (p->echo && (echo_text || s->text)) {
            size_t out_len = p->echo_only || !s->text ? 0 : s->text_len;
            char *all = malloc(echo_len + out_len + 1);
            if (!all) {
                b->oom = true;
            } else {
                if (echo_len)
                    memcpy(all, echo_text, echo_len);
                if (out_len)
                    memcpy(all + echo_len, s->text, out_len);
                json_buf_string(b, all, echo_len + out_len);
                free(all);
            }
        } else {
            put_text(b, s);
        }
        json_buf_puts(b, ",\"logprobs\":");
        if (s->token_logprobs)
            put_logprobs_openai(b, c, p, o, s);
        else
            json_buf_puts(b, "null");
        json_buf_printf(b, ",\"finish_reason\":\"%s\",\"stop_reason\":", finish_name(s->finish));
        put_stop_reason(b, c, s);
        json_buf_puts(b, ",\"prompt_logprobs\":");
        put_prompt_logprobs_vllm(b, c, p, o);
        json_buf_puts(b, "}");
    }
    free(echo_text);
    int64_t ct = completion_tokens(o);
    json_buf_printf(b, "],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":{\"prompt_tokens\":%d,"
                    "\"total_tokens\":%lld,\"completion_tokens\":%lld,\"prompt_tokens_details\":null},"
                    "\"kv_transfer_params\":null}",
                    (int)o->n_prompt_tokens, (long long)(ct + o->n_prompt_tokens), (long long)ct);
}

/* /v1/chat/completions: vLLM's ChatCompletionResponse body with every key
 * its model_dump_json writes, in its field order (protocol.py at vLLM
 * 0052bed3: ChatMessage, ChatCompletionResponseChoice, UsageInfo). */
static void body_chat(json_buf *b, const cli_output_ctx *c, const cli_pending *p, const char h[17],
                      const request_output *o)
{
    put_body_head(b, c, p->lora, "chatcmpl-", h, "chat.completion");
    json_buf_puts(b, ",\"choices\":[");
    for (int32_t k = 0; k < o->n_outputs; k++) {
        const seq_output *s = &o->outputs[k];
        json_buf_printf(b, "%s{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", k ? "," : "",
                        (int)s->index);
        if (c->reasoning == CLI_REASONING_NONE || !s->text) {
            put_text(b, s);
            json_buf_puts(b, ",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,"
                             "\"tool_calls\":[],\"reasoning_content\":null},\"logprobs\":");
        } else {
            /* with a reasoning parser the message carries vLLM's current
             * field name, "reasoning" (ChatMessage in
             * vllm/entrypoints/openai/chat_completion/protocol.py at
             * 002032ee; "reasoning_content" until vLLM PR #27752 renamed
             * it, removed by PR #33402) */
            cli_reasoning_split sp;
            split_reasoning(c, p, s, &sp);
            put_part(b, s, sp.has_content, sp.content_off, sp.content_len);
            json_buf_puts(b, ",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,"
                             "\"tool_calls\":[],\"reasoning\":");
            put_part(b, s, sp.has_reasoning, sp.reasoning_off, sp.reasoning_len);
            json_buf_puts(b, "},\"logprobs\":");
        }
        if (s->token_logprobs)
            put_logprobs_chat(b, c, s);
        else
            json_buf_puts(b, "null");
        put_choice_end(b, c, s);
    }
    int64_t ct = completion_tokens(o);
    json_buf_printf(b, "],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":{\"prompt_tokens\":%d,"
                    "\"total_tokens\":%lld,\"completion_tokens\":%lld,\"prompt_tokens_details\":null},"
                    "\"prompt_logprobs\":",
                    (int)o->n_prompt_tokens, (long long)(ct + o->n_prompt_tokens), (long long)ct);
    /* vLLM's serving_chat.py (at 99c5632f) puts the request's
     * clamp_prompt_logprobs(final_res.prompt_logprobs) on the response, not
     * on a choice: the same list as a completion choice's */
    put_prompt_logprobs_vllm(b, c, p, o);
    json_buf_puts(b, ",\"kv_transfer_params\":null}");
}

static void result_openai(json_buf *b, const cli_output_ctx *c, const cli_pending *p,
                          const request_output *o)
{
    char h[17];
    openai_hash(h, p->id_json, p->line);
    put_batch_head(b, h, p->id_json, 200);
    if (p->chat)
        body_chat(b, c, p, h, o);
    else
        body_completion(b, c, p, h, o);
    put_batch_tail(b, c, o);
}

void cli_output_result(json_buf *b, const cli_output_ctx *c, const cli_pending *p,
                       const request_output *o)
{
    if (c->fmt == CLI_FORMAT_OPENAI) {
        result_openai(b, c, p, o);
        return;
    }
    json_buf_printf(b, "{\"id\":%s", p->id_json ? p->id_json : "null");
    if (c->include_prompt) {
        json_buf_puts(b, ",\"prompt\":");
        if (p->prompt)
            json_buf_string(b, p->prompt, p->prompt_len);
        else
            json_buf_puts(b, "null");
        json_buf_puts(b, ",\"prompt_token_ids\":");
        put_ids(b, p->prompt_ids, p->n_prompt_ids);
    }
    json_buf_puts(b, ",\"outputs\":[");
    for (int32_t k = 0; k < o->n_outputs; k++) {
        const seq_output *s = &o->outputs[k];
        json_buf_printf(b, "%s{\"index\":%d,\"text\":", k ? "," : "", (int)s->index);
        put_text(b, s);
        if (p->chat && c->reasoning != CLI_REASONING_NONE && s->text) {
            /* a jsonl chat line with --reasoning-parser: text stays the
             * whole output (as token_ids); the split beside it */
            cli_reasoning_split sp;
            split_reasoning(c, p, s, &sp);
            json_buf_puts(b, ",\"reasoning\":");
            put_part(b, s, sp.has_reasoning, sp.reasoning_off, sp.reasoning_len);
            json_buf_puts(b, ",\"content\":");
            put_part(b, s, sp.has_content, sp.content_off, sp.content_len);
        }
        json_buf_puts(b, ",\"token_ids\":");
        put_ids(b, s->token_ids, s->n_tokens);
        if (s->has_cumulative_logprob) {
            /* beam search: vLLM's CompletionOutput.cumulative_logprob, a
             * Python float (17 digits round-trip the double) */
            json_buf_puts(b, ",\"cumulative_logprob\":");
            if (isfinite(s->cumulative_logprob))
                json_buf_printf(b, "%.17g", s->cumulative_logprob);
            else
                json_buf_puts(b, "-9999.0");
        }
        json_buf_printf(b, ",\"finish_reason\":\"%s\",\"stop_reason\":", finish_name(s->finish));
        put_stop_reason(b, c, s);
        if (s->token_logprobs) {
            json_buf_puts(b, ",\"logprobs\":");
            put_logprobs_jsonl(b, s);
        }
        json_buf_puts(b, "}");
    }
    json_buf_puts(b, "]");
    if (o->prompt_logprobs && p->prompt_ids) {
        /* vLLM's RequestOutput.prompt_logprobs: null for the first token,
         * then each prompt token's logprob dict (it first, then its top k) */
        json_buf_puts(b, ",\"prompt_logprobs\":[");
        for (int32_t i = 0; i < p->n_prompt_ids; i++) {
            lp_pos q;
            prompt_pos(o, p->prompt_ids, i, &q);
            if (i)
                json_buf_puts(b, ",");
            if (q.none) {
                json_buf_puts(b, "null");
                continue;
            }
            json_buf_puts(b, "[");
            for (int32_t k = 0; k < q.n; k++) {
                json_buf_printf(b, "%s[%d,", k ? "," : "", (int)q.ids[k]);
                put_logprob(b, q.lps[k]);
                json_buf_puts(b, "]");
            }
            json_buf_puts(b, "]");
        }
        json_buf_puts(b, "]");
    }
    json_buf_printf(b, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%lld}",
                    (int)o->n_prompt_tokens, (long long)completion_tokens(o));
    if (c->metrics)
        put_metrics(b, o);
    json_buf_puts(b, "}\n");
}

void cli_output_error(json_buf *b, const cli_output_ctx *c, const char *id_json, int64_t line,
                      int status, const char *message)
{
    if (c->fmt == CLI_FORMAT_OPENAI) {
        /* vLLM's ErrorInfo {"message", "type", "param", "code"} (code = the
         * HTTP status, type from create_error_response), plus our "line";
         * the response has that status and no body, as run_batch.py writes
         * an ErrorResponse. */
        char h[17];
        openai_hash(h, id_json, line);
        put_batch_head(b, h, id_json, status);
        json_buf_puts(b, "null},\"error\":{\"message\":");
        json_buf_string(b, message, strlen(message));
        json_buf_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d,\"line\":%lld}}\n",
                        status == 404 ? "NotFoundError" : "BadRequestError", status, (long long)line);
        return;
    }
    json_buf_printf(b, "{\"id\":%s,\"error\":{\"message\":", id_json ? id_json : "null");
    json_buf_string(b, message, strlen(message));
    json_buf_printf(b, ",\"line\":%lld}}\n", (long long)line);
}

void cli_output_openai_open(json_buf *b, const cli_output_ctx *c, const char *id_json, int64_t line,
                            const char *id_prefix, const char *object)
{
    char h[17];
    openai_hash(h, id_json, line);
    put_batch_head(b, h, id_json, 200);
    put_body_head(b, c, 0, id_prefix, h, object); /* embeddings and scores: the base model */
}

void cli_output_openai_close(json_buf *b)
{
    json_buf_puts(b, "}},\"error\":null}\n"); /* body, response, line */
}

int cli_write_all(int fd, const char *data, size_t len, pg_error *err)
{
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return pg_error_set(err, PG_EIO, "write: %s", strerror(errno));
        }
        data += w;
        len -= (size_t)w;
    }
    return PG_OK;
}
