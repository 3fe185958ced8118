/* sequence: request/sequence state, stop rules, outputs (see sequence.h). */
#include "sequence.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "beam_search.h"
#include "pooling.h"
#include "tokenizer.h"

static char *dup_str(const char *s, size_t len)
{
    char *d = malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

int request_create(request **out, uint64_t id, const int32_t *prompt, int32_t n_prompt,
                   const sampling_params *sp, int32_t max_model_len, const int32_t *eos_ids,
                   int32_t n_eos, const tokenizer *tok, void *user, pg_error *err)
{
    *out = NULL;
    request *r = calloc(1, sizeof *r);
    if (!r) goto oom;
    r->id = id;
    r->user = user;
    r->sp = *sp;
    r->sp.stop_token_ids = NULL;
    r->sp.n_stop_token_ids = 0;
    r->sp.stop = NULL;
    r->sp.n_stop = 0;
    r->sp.structured = NULL; /* compiled by the engine into r->gram */
    r->sp.structured_len = 0;
    if (sp->n_stop_token_ids > 0) {
        r->stop_ids = malloc(sp->n_stop_token_ids * sizeof *r->stop_ids);
        if (!r->stop_ids) goto oom;
        memcpy(r->stop_ids, sp->stop_token_ids, sp->n_stop_token_ids * sizeof *r->stop_ids);
        r->sp.stop_token_ids = r->stop_ids;
        r->sp.n_stop_token_ids = sp->n_stop_token_ids;
    }
    if (sp->n_stop > 0) {
        r->stops = calloc(sp->n_stop, sizeof *r->stops);
        if (!r->stops) goto oom;
        r->sp.n_stop = sp->n_stop;
        r->sp.stop = (const char *const *)r->stops;
        for (size_t i = 0; i < sp->n_stop; i++)
            if (!(r->stops[i] = dup_str(sp->stop[i], strlen(sp->stop[i])))) goto oom;
    }
    int32_t n_ban_max = (sp->ignore_eos ? 0 : n_eos) + (int32_t)sp->n_stop_token_ids;
    if (n_ban_max > 0) {
        r->banned = malloc((size_t)n_ban_max * sizeof *r->banned);
        if (!r->banned) goto oom;
        if (!sp->ignore_eos)
            for (int32_t i = 0; i < n_eos; i++) r->banned[r->n_banned++] = eos_ids[i];
        for (size_t i = 0; i < sp->n_stop_token_ids; i++) r->banned[r->n_banned++] = r->stop_ids[i];
    }
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    if (!r->prompt) goto oom;
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    r->max_output = max_model_len - n_prompt;
    if (sp->max_tokens >= 0 && sp->max_tokens < r->max_output) r->max_output = sp->max_tokens;
    r->n_top = sp->logprobs > 0 ? sp->logprobs : 0;
    if (sp->prompt_logprobs >= 0) {
        r->n_ptop = sp->prompt_logprobs;
        r->plp_from = sp->prompt_logprobs_from;
        size_t np = (size_t)n_prompt, nt = np * (size_t)(r->n_ptop > 0 ? r->n_ptop : 1);
        r->plp = malloc(np * sizeof *r->plp);
        r->p_rank = malloc(np * sizeof *r->p_rank);
        r->p_top_ids = malloc(nt * sizeof *r->p_top_ids);
        r->p_top_lp = malloc(nt * sizeof *r->p_top_lp);
        if (!r->plp || !r->p_rank || !r->p_top_ids || !r->p_top_lp) goto oom;
        for (size_t i = 0; i < np; i++) {
            r->plp[i] = NAN;
            r->p_rank[i] = 0;
        }
        for (size_t i = 0; i < nt; i++) {
            r->p_top_ids[i] = -1;
            r->p_top_lp[i] = 0.0f;
        }
    }
    r->n = sp->n;
    r->n_live = sp->n;
    r->seqs = calloc((size_t)sp->n, sizeof *r->seqs);
    if (!r->seqs) goto oom;
    for (int32_t i = 0; i < r->n; i++) {
        sequence *s = &r->seqs[i];
        s->req = r;
        s->index = i;
        s->table = -1;
        s->stop_token_id = -1;
        s->stop_str = -1;
        s->rng = sampler_rng_init(sp->seed, i);
        s->cap = n_prompt + (r->max_output < 16 ? r->max_output : 16);
        s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
        if (!s->tokens) goto oom;
        memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
        s->n_tokens = n_prompt;
        if (tok) {
            int rc = tok_stream_create(&s->ts, tok, sp->skip_special_tokens, prompt,
                                       (size_t)n_prompt, err);
            if (rc) {
                request_destroy(r);
                return rc;
            }
        }
    }
    *out = r;
    return PG_OK;
oom:
    request_destroy(r);
    return pg_error_set(err, PG_ENOMEM, "engine: out of memory for a request of %d tokens",
                        (int)n_prompt);
}

void request_destroy(request *r)
{
    if (!r) return;
    if (r->parent) { /* a child owns only its shell */
        free(r);
        return;
    }
    beam_group_destroy(r->beam);
    if (r->seqs) {
        for (int32_t i = 0; i < r->n; i++) {
            sequence *s = &r->seqs[i];
            free(s->tokens);
            tok_stream_free(s->ts);
            free(s->text);
            free(s->lp);
            free(s->top_ids);
            free(s->top_lp);
        }
        free(r->seqs);
    }
    if (r->stops)
        for (size_t i = 0; i < r->sp.n_stop; i++) free(r->stops[i]);
    free(r->stops);
    free(r->stop_ids);
    free(r->banned);
    free(r->prompt);
    pooler_destroy(r->pooler);
    free(r->embedding);
    free(r->plp);
    free(r->p_rank);
    free(r->p_top_ids);
    free(r->p_top_lp);
    free(r);
}

int request_fan_out(request *r, request **children, int32_t *n_children)
{
    int32_t n = 0;
    for (int32_t i = 0; i < r->n; i++) {
        if (r->seqs[i].finished) continue;
        request *c = malloc(sizeof *c);
        if (!c) {
            while (n > 0) free(children[--n]);
            return PG_ENOMEM;
        }
        *c = *r; /* params, prompt, stops, banned ids: borrowed from r */
        c->parent = r;
        c->seqs = &r->seqs[i];
        c->n = 1;
        c->n_live = 1;
        c->forked = false;
        c->n_children = 0;
        c->fanned_out = false;
        c->must_fan_out = false;
        c->retiring = false;
        c->prev = c->next = NULL;
        children[n++] = c;
    }
    for (int32_t k = 0; k < n; k++) children[k]->seqs[0].req = children[k];
    r->fanned_out = true;
    r->forked = false;
    r->n_children = n;
    *n_children = n;
    return PG_OK;
}

sequence *request_leader(request *r)
{
    for (int32_t i = 0; i < r->n; i++)
        if (!r->seqs[i].finished) return &r->seqs[i];
    return NULL;
}

int32_t request_seq_target(const request *r, const sequence *s, bool shared_prompt)
{
    if (s->finished) return s->num_computed;
    if (r->beam) return s->n_tokens; /* every live beam: its own tokens (beam_search.h) */
    if (shared_prompt && !r->forked && r->n_live > 1) {
        const sequence *lead = request_leader((request *)r);
        return s == lead ? r->n_prompt : 0;
    }
    return s->n_tokens;
}

static int text_append(sequence *s, const char *t, size_t len)
{
    if (len == 0) return PG_OK;
    if (s->text_len + len + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 64;
        while (cap < s->text_len + len + 1) cap *= 2;
        char *nt = realloc(s->text, cap);
        if (!nt) return PG_ENOMEM;
        s->text = nt;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, t, len);
    s->text_len += len;
    s->text[s->text_len] = '\0';
    return PG_OK;
}

/* Room for one more token in s->tokens (at most n_prompt + max_output). */
static int grow_tokens(sequence *s)
{
    request *r = s->req;
    if (s->n_tokens < s->cap) return PG_OK;
    int32_t cap = s->cap + (s->cap - r->n_prompt > 16 ? s->cap - r->n_prompt : 16);
    if (cap > r->n_prompt + r->max_output) cap = r->n_prompt + r->max_output;
    if (cap <= s->n_tokens) return PG_EINVAL;
    int32_t *nt = realloc(s->tokens, (size_t)cap * sizeof *nt);
    if (!nt) return PG_ENOMEM;
    s->tokens = nt;
    s->cap = cap;
    return PG_OK;
}

int sequence_push_placeholder(sequence *s, pg_error *err)
{
    int rc = grow_tokens(s);
    if (rc)
        return pg_error_set(err, rc, "sequence: no room for a placeholder token (%d of %d)",
                            (int)s->n_tokens, (int)s->cap);
    s->tokens[s->n_tokens++] = -1;
    s->n_placeholder = 1;
    return PG_OK;
}

void sequence_pop_placeholder(sequence *s)
{
    if (!s->n_placeholder) return;
    s->n_tokens--;
    s->n_placeholder = 0;
}

/* Appends id (tokens, logprobs); feeds the text stream when `text`. */
static int append(sequence *s, int32_t id, const sampler_result *res, bool text, pg_error *err)
{
    request *r = s->req;
    int32_t n_out = s->n_tokens - r->n_prompt;
    if (s->n_tokens == s->cap) {
        int32_t cap = s->cap + (s->cap - r->n_prompt > 16 ? s->cap - r->n_prompt : 16);
        if (cap > r->n_prompt + r->max_output) cap = r->n_prompt + r->max_output;
        int32_t *nt = realloc(s->tokens, (size_t)cap * sizeof *nt);
        if (!nt) goto oom;
        s->tokens = nt;
        s->cap = cap;
    }
    if (r->sp.logprobs >= 0) {
        if (n_out == s->lp_cap) {
            int32_t cap = s->lp_cap ? 2 * s->lp_cap : 16;
            float *lp = realloc(s->lp, (size_t)cap * sizeof *lp);
            if (!lp) goto oom;
            s->lp = lp;
            if (r->n_top > 0) {
                int32_t *ti = realloc(s->top_ids, (size_t)cap * (size_t)r->n_top * sizeof *ti);
                if (!ti) goto oom;
                s->top_ids = ti;
                float *tl = realloc(s->top_lp, (size_t)cap * (size_t)r->n_top * sizeof *tl);
                if (!tl) goto oom;
                s->top_lp = tl;
            }
            s->lp_cap = cap;
        }
        s->lp[n_out] = res ? res->logprob : 0.0f;
        for (int32_t k = 0; k < r->n_top; k++) {
            bool have = res && k < res->n_top;
            s->top_ids[(size_t)n_out * (size_t)r->n_top + (size_t)k] = have ? res->top_ids[k] : -1;
            s->top_lp[(size_t)n_out * (size_t)r->n_top + (size_t)k] =
                have ? res->top_logprobs[k] : 0.0f;
        }
    }
    s->tokens[s->n_tokens++] = id;
    if (s->ts && text) {
        const char *t;
        size_t len;
        int rc = tok_stream_push(s->ts, id, &t, &len, err);
        if (rc) return rc;
        if (text_append(s, t, len)) goto oom;
    }
    return PG_OK;
oom:
    return pg_error_set(err, PG_ENOMEM, "engine: out of memory appending to request %llu",
                        (unsigned long long)r->id);
}

int sequence_append(sequence *s, int32_t id, const sampler_result *res, pg_error *err)
{
    return append(s, id, res, true, err);
}

static bool id_in(int32_t id, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* The first needle occurrence at or after start, or -1. */
static long find_from(const char *hay, size_t hay_len, const char *needle, size_t n_len,
                      size_t start)
{
    if (n_len == 0 || n_len > hay_len) return -1;
    for (size_t i = start; i + n_len <= hay_len; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, n_len) == 0) return (long)i;
    return -1;
}

static int flush_text(sequence *s, pg_error *err)
{
    if (!s->ts) return PG_OK;
    const char *t;
    size_t len;
    int rc = tok_stream_finish(s->ts, &t, &len, err);
    if (rc) return rc;
    if (text_append(s, t, len))
        return pg_error_set(err, PG_ENOMEM, "engine: out of memory for output text");
    return PG_OK;
}

static int finish(sequence *s, finish_reason why, pg_error *err)
{
    s->finished = true;
    s->finish = why;
    return s->stop_str >= 0 ? PG_OK : flush_text(s, err);
}

int sequence_finish(sequence *s, finish_reason why, pg_error *err)
{
    return finish(s, why, err);
}

int sequence_accept(sequence *s, int32_t id, const sampler_result *res, const int32_t *eos_ids,
                    int32_t n_eos, pg_error *err)
{
    request *r = s->req;
    int32_t n_out = s->n_tokens - r->n_prompt + 1; /* counting id */
    bool length = n_out >= r->max_output;
    /* vLLM v1 check_stop: the length cap first, then eos, then stop ids */
    if (!length) {
        bool is_eos = !r->sp.ignore_eos && id_in(id, eos_ids, (size_t)n_eos);
        bool is_stop_id = id_in(id, r->stop_ids, r->sp.n_stop_token_ids);
        if (is_eos || is_stop_id) {
            /* vLLM v1 keeps the stopping id in the output (token_ids,
             * logprobs, completion_tokens); its detokenizer renders it only
             * with include_stop_str_in_output, and skips the stop-string
             * check (vllm/v1/engine/detokenizer.py update()). */
            s->stop_token_id = id;
            int rc = append(s, id, res, r->sp.include_stop_str_in_output, err);
            if (rc) return rc;
            return finish(s, FINISH_STOP, err);
        }
    }
    size_t old_len = s->text_len;
    int rc = sequence_append(s, id, res, err);
    if (rc) return rc;
    /* stop strings (vLLM's detokenizer check, only past min_tokens): the
     * first stop string in list order found in the text that overlaps the
     * new bytes; the text is cut before it (or after it with
     * include_stop_str_in_output). */
    if (r->sp.n_stop > 0 && n_out > r->sp.min_tokens && s->text_len > old_len) {
        size_t new_len = s->text_len - old_len;
        for (size_t i = 0; i < r->sp.n_stop; i++) {
            size_t sl = strlen(r->stops[i]);
            size_t start = new_len + sl <= s->text_len ? s->text_len - new_len - sl : 0;
            long at = find_from(s->text, s->text_len, r->stops[i], sl, start);
            if (at < 0) continue;
            s->text_len = (size_t)at + (r->sp.include_stop_str_in_output ? sl : 0);
            s->text[s->text_len] = '\0';
            s->stop_str = (int32_t)i;
            return finish(s, FINISH_STOP, err);
        }
    }
    if (length) return finish(s, FINISH_LENGTH, err);
    return PG_OK;
}

request_output *request_make_output(const request *r, double now_ms)
{
    request_output *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->request_id = r->id;
    o->user = r->user;
    o->n_prompt_tokens = r->n_prompt;
    o->n_preemptions = r->n_preemptions;
    o->queue_ms = r->admitted_once ? r->t_first_admit_ms - r->t_arrival_ms : 0.0;
    o->first_token_ms = r->sampled_once ? r->t_first_token_ms - r->t_arrival_ms : 0.0;
    o->total_ms = now_ms - r->t_arrival_ms;
    o->outputs = calloc((size_t)r->n, sizeof *o->outputs);
    if (!o->outputs) goto oom;
    if (r->plp) {
        size_t np = (size_t)r->n_prompt, nt = np * (size_t)(r->n_ptop > 0 ? r->n_ptop : 1);
        o->n_prompt_top = r->n_ptop;
        o->prompt_logprobs = malloc(np * sizeof(float));
        o->prompt_ranks = malloc(np * sizeof(int32_t));
        o->prompt_top_ids = malloc(nt * sizeof(int32_t));
        o->prompt_top_logprobs = malloc(nt * sizeof(float));
        if (!o->prompt_logprobs || !o->prompt_ranks || !o->prompt_top_ids || !o->prompt_top_logprobs)
            goto oom;
        memcpy(o->prompt_logprobs, r->plp, np * sizeof(float));
        memcpy(o->prompt_ranks, r->p_rank, np * sizeof(int32_t));
        memcpy(o->prompt_top_ids, r->p_top_ids, nt * sizeof(int32_t));
        memcpy(o->prompt_top_logprobs, r->p_top_lp, nt * sizeof(float));
    }
    if (r->pooler) { /* an embedding request: its vector (NULL if aborted), no sequence */
        if (r->embedding) {
            if (!(o->embedding = malloc((size_t)r->n_embedding * sizeof *o->embedding))) goto oom;
            memcpy(o->embedding, r->embedding, (size_t)r->n_embedding * sizeof *o->embedding);
            o->n_embedding = r->n_embedding;
        }
        return o;
    }
    if (r->beam) { /* the best beams, best first */
        if (beam_group_outputs(r->beam, o)) goto oom;
        return o;
    }
    o->n_outputs = r->n;
    for (int32_t i = 0; i < r->n; i++) {
        const sequence *s = &r->seqs[i];
        seq_output *so = &o->outputs[i];
        int32_t n = s->n_tokens - r->n_prompt;
        so->index = i;
        so->n_tokens = n;
        so->token_ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *so->token_ids);
        if (!so->token_ids) goto oom;
        memcpy(so->token_ids, s->tokens + r->n_prompt, (size_t)n * sizeof *so->token_ids);
        so->finish = s->finished ? s->finish : FINISH_ABORT;
        so->stop_token_id = s->stop_token_id;
        if (s->stop_str >= 0 && !(so->stop_str = dup_str(r->stops[s->stop_str],
                                                         strlen(r->stops[s->stop_str]))))
            goto oom;
        if (s->ts) {
            so->text = dup_str(s->text ? s->text : "", s->text_len);
            if (!so->text) goto oom;
            so->text_len = s->text_len;
        }
        if (r->sp.logprobs >= 0) {
            size_t nt = (size_t)n * (size_t)r->n_top;
            so->n_top = r->n_top;
            so->token_logprobs = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
            so->top_ids = malloc((nt > 0 ? nt : 1) * sizeof(int32_t));
            so->top_logprobs = malloc((nt > 0 ? nt : 1) * sizeof(float));
            if (!so->token_logprobs || !so->top_ids || !so->top_logprobs) goto oom;
            if (n > 0) memcpy(so->token_logprobs, s->lp, (size_t)n * sizeof(float));
            if (nt > 0) {
                memcpy(so->top_ids, s->top_ids, nt * sizeof(int32_t));
                memcpy(so->top_logprobs, s->top_lp, nt * sizeof(float));
            }
        }
    }
    return o;
oom:
    request_output_free(o);
    return NULL;
}

void request_output_free(request_output *o)
{
    if (!o) return;
    for (int32_t i = 0; o->outputs && i < o->n_outputs; i++) {
        seq_output *so = &o->outputs[i];
        free(so->token_ids);
        free(so->text);
        free(so->stop_str);
        free(so->token_logprobs);
        free(so->top_ids);
        free(so->top_logprobs);
    }
    free(o->outputs);
    free(o->prompt_logprobs);
    free(o->prompt_ranks);
    free(o->prompt_top_ids);
    free(o->prompt_top_logprobs);
    free(o->embedding);
    free(o);
}
