/* chat_template: see the header. The render follows transformers'
 * render_jinja_template (utils/chat_template_utils.py, v4.5x): variables
 * messages, tools, documents, add_generation_prompt, the special tokens and
 * every chat_template_kwargs key; continue_final_message appends
 * "CONTINUE_FINAL_MESSAGE_TAG " to the final message's content, renders,
 * and cuts the output at the tag (rstripped when the template trimmed the
 * space after it). */
#include "chat_template.h"

#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "jinja_builtins.h"
#include "jinja_eval.h"
#include "jinja_parse.h"

#define CHAT_MAX_FILE_BYTES ((size_t)16 << 20)
#define CHAT_PARSE_MAX_MEMORY ((size_t)256 << 20)
#define CFM_TAG "CONTINUE_FINAL_MESSAGE_TAG "

struct chat_template {
    jinja_rt rt;       /* owns the AST */
    jnode *root;
    char *label;
    char *src;         /* the template source (continue_final_message checks it) */
    size_t src_len;
    char *bos, *eos;   /* NULL = undefined */
    jinja_limits lim;
};

static char *dup_or_null(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

static int parse_template(chat_template *t, pg_error *err)
{
    jmp_buf jb;
    t->rt.on_error = &jb;
    if (setjmp(jb))
        return pg_error_set(err, PG_EFORMAT, "%s: chat template: line %d, column %d: %s", t->label,
                            t->rt.line, t->rt.col, t->rt.msg);
    t->root = jinja_parse(&t->rt, t->src, t->src_len);
    t->rt.on_error = NULL;
    return 0;
}

int chat_template_create(chat_template **out, const char *src, size_t len, const char *label_in,
                         const char *bos_token, const char *eos_token, pg_error *err)
{
    *out = NULL;
    const char *const label = label_in ? label_in : "chat template";
    chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return pg_error_set(err, PG_ENOMEM, "%s: chat template: out of memory", label);
    t->label = dup_or_null(label);
    t->src = malloc(len + 1);
    t->bos = dup_or_null(bos_token);
    t->eos = dup_or_null(eos_token);
    if (!t->label || !t->src || (bos_token && !t->bos) || (eos_token && !t->eos)) {
        chat_template_destroy(t);
        return pg_error_set(err, PG_ENOMEM, "%s: chat template: out of memory", label);
    }
    if (len)
        memcpy(t->src, src, len);
    t->src[len] = '\0';
    t->src_len = len;
    t->lim = (jinja_limits){JINJA_DEFAULT_MAX_STEPS, JINJA_DEFAULT_MAX_DEPTH,
                            JINJA_DEFAULT_MAX_CALL_DEPTH, JINJA_DEFAULT_MAX_OUTPUT};
    jrt_init(&t->rt, CHAT_PARSE_MAX_MEMORY);
    int rc = parse_template(t, err);
    if (rc) {
        chat_template_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void chat_template_destroy(chat_template *t)
{
    if (!t)
        return;
    jrt_free(&t->rt);
    free(t->label);
    free(t->src);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *chat_template_label(const chat_template *t) { return t->label; }

/* ---- loading from a tokenizer folder ---- */

/* A special token from tokenizer_config.json: a string or {"content": s}. */
static int special_token(const json_doc *d, int obj, const char *key, char **out, pg_error *err)
{
    *out = NULL;
    int v = json_obj_get(d, obj, key);
    if (v < 0 || json_is_null(d, v))
        return 0;
    if (json_is_object(d, v))
        v = json_obj_get(d, v, "content");
    if (!json_is_string(d, v))
        return pg_error_set(err, PG_EFORMAT, "tokenizer_config.json: %s: expected a string or {\"content\": string}", key);
    size_t n;
    return json_get_string(d, v, out, &n, err);
}

/* "chat_template" value: a string, or a list of {"name", "template"}. */
static int template_from_json(const json_doc *d, int v, const char *file, char **out, size_t *len,
                              pg_error *err)
{
    *out = NULL;
    if (json_is_string(d, v))
        return json_get_string(d, v, out, len, err);
    if (json_is_array(d, v)) {
        int n = json_size(d, v);
        for (int k = 0; k < n; k++) {
            int e = json_arr_at(d, v, k);
            int name = json_obj_get(d, e, "name");
            int tmpl = json_obj_get(d, e, "template");
            if (json_is_string(d, name) && json_str_eq(d, name, "default") && json_is_string(d, tmpl))
                return json_get_string(d, tmpl, out, len, err);
        }
        return pg_error_set(err, PG_EFORMAT, "%s: chat_template: a list without a template named \"default\"", file);
    }
    return pg_error_set(err, PG_EFORMAT, "%s: chat_template: expected a string or a list of {\"name\", \"template\"}", file);
}

int chat_template_load(chat_template **out, const char *tokenizer_dir, const char *override_path,
                       pg_error *err)
{
    *out = NULL;
    char *cfg_path = NULL, *cfg = NULL, *tmpl = NULL, *bos = NULL, *eos = NULL, *label = NULL;
    size_t cfg_len = 0, tmpl_len = 0;
    json_doc doc = {0};
    bool have_doc = false;
    int rc = 0;
    if (tokenizer_dir) {
        cfg_path = pg_path_join(tokenizer_dir, "tokenizer_config.json");
        if (!cfg_path) {
            rc = pg_error_set(err, PG_ENOMEM, "chat template: out of memory");
            goto done;
        }
        if (pg_file_exists(cfg_path)) {
            rc = pg_read_file(cfg_path, CHAT_MAX_FILE_BYTES, &cfg, &cfg_len, err);
            if (rc)
                goto done;
            rc = json_parse(&doc, cfg, cfg_len, cfg_path, err);
            if (rc)
                goto done;
            have_doc = true;
            if (!json_is_object(&doc, 0)) {
                rc = pg_error_set(err, PG_EFORMAT, "%s: expected a JSON object", cfg_path);
                goto done;
            }
            if ((rc = special_token(&doc, 0, "bos_token", &bos, err)) ||
                (rc = special_token(&doc, 0, "eos_token", &eos, err))) {
                pg_error_wrap(err, rc, "%s", cfg_path);
                goto done;
            }
        }
    }
    if (override_path) {
        rc = pg_read_file(override_path, CHAT_MAX_FILE_BYTES, &tmpl, &tmpl_len, err);
        if (rc)
            goto done;
        label = dup_or_null(override_path);
    } else if (tokenizer_dir) {
        /* transformers' PreTrainedTokenizerBase._from_pretrained: "if
         * independent chat template file(s) exist, they take priority over
         * template entries in the tokenizer config" (chat_template.jinja,
         * since 4.47); chat_template.json is the older processor file. */
        char *jinja_path = pg_path_join(tokenizer_dir, "chat_template.jinja");
        char *json_path = pg_path_join(tokenizer_dir, "chat_template.json");
        int v = have_doc ? json_obj_get(&doc, 0, "chat_template") : -1;
        if (!jinja_path || !json_path) {
            rc = pg_error_set(err, PG_ENOMEM, "chat template: out of memory");
        } else if (pg_file_exists(jinja_path)) {
            rc = pg_read_file(jinja_path, CHAT_MAX_FILE_BYTES, &tmpl, &tmpl_len, err);
            label = jinja_path;
            jinja_path = NULL;
        } else if (v >= 0 && !json_is_null(&doc, v)) {
            rc = template_from_json(&doc, v, cfg_path, &tmpl, &tmpl_len, err);
            label = dup_or_null(cfg_path);
        } else if (pg_file_exists(json_path)) {
            char *js = NULL;
            size_t js_len = 0;
            json_doc jd = {0};
            rc = pg_read_file(json_path, CHAT_MAX_FILE_BYTES, &js, &js_len, err);
            if (!rc)
                rc = json_parse(&jd, js, js_len, json_path, err);
            if (!rc) {
                int tv = json_obj_get(&jd, 0, "chat_template");
                if (tv < 0)
                    rc = pg_error_set(err, PG_EFORMAT, "%s: no \"chat_template\" key", json_path);
                else
                    rc = template_from_json(&jd, tv, json_path, &tmpl, &tmpl_len, err);
                json_doc_free(&jd);
            }
            pg_file_free(js);
            label = json_path;
            json_path = NULL;
        }
        free(jinja_path);
        free(json_path);
        if (rc)
            goto done;
    }
    if (!tmpl)
        goto done; /* no template anywhere: *out stays NULL */
    rc = chat_template_create(out, tmpl, tmpl_len, label ? label : "chat template", bos, eos, err);
done:
    if (have_doc)
        json_doc_free(&doc);
    pg_file_free(cfg);
    free(cfg_path);
    free(tmpl);
    free(bos);
    free(eos);
    free(label);
    return rc;
}

/* ---- rendering ---- */

typedef struct render_ctx {
    jinja_rt *rt;
    const json_doc *doc;
    pg_error *err;
} render_ctx;

/* A JSON string token as a value, unescaped straight into the arena (no
 * malloc that a longjmp could leak). */
static jv json_string_value(render_ctx *c, int i)
{
    size_t raw_len;
    json_raw(c->doc, i, &raw_len);
    char *buf = jrt_alloc(c->rt, raw_len + 1); /* unescaping never grows */
    size_t n = 0;
    if (json_get_string_buf(c->doc, i, buf, raw_len + 1, &n, NULL) != 0)
        jrt_fail(c->rt, "bad string in request");
    return jv_str_n(c->rt, buf, n);
}

/* JSON -> value, as Python's json.loads: integers without '.', 'e' or 'E'
 * are ints (int64 here; larger ones become floats), the rest floats. */
static jv from_json(render_ctx *c, int i, int depth)
{
    const json_doc *d = c->doc;
    if (depth > JSON_MAX_DEPTH)
        jrt_fail(c->rt, "request nested too deeply");
    if (json_is_null(d, i))
        return jv_none();
    if (json_is_bool(d, i)) {
        size_t n;
        const char *r = json_raw(d, i, &n);
        return jv_bool(r[0] == 't');
    }
    if (json_is_number(d, i)) {
        size_t n;
        const char *r = json_raw(d, i, &n);
        bool is_float = memchr(r, '.', n) || memchr(r, 'e', n) || memchr(r, 'E', n);
        int64_t iv;
        if (!is_float && json_get_int(d, i, INT64_MIN, INT64_MAX, &iv, NULL) == 0)
            return jv_int(iv);
        if (!is_float) { /* beyond int64: Python keeps every digit */
            jv big = jv_str_n(c->rt, r, n);
            big.type = JV_BIGINT;
            return big;
        }
        double f;
        if (json_get_double(d, i, &f, NULL) != 0)
            jrt_fail(c->rt, "bad number in request");
        return jv_float(f);
    }
    if (json_is_string(d, i))
        return json_string_value(c, i);
    if (json_is_array(d, i)) {
        int n = json_size(d, i);
        jv l = jv_list_new(c->rt, (size_t)n);
        int e = i + 1;
        for (int k = 0; k < n; k++) {
            jv_list_push(c->rt, l, from_json(c, e, depth + 1));
            e = json_skip(d, e);
        }
        return l;
    }
    int n = json_size(d, i);
    jv o = jv_dict_new(c->rt, (size_t)n);
    int e = i + 1;
    for (int k = 0; k < n; k++) {
        jv key = from_json(c, e, depth + 1);
        e = json_skip(d, e);
        jv_dict_set(c->rt, o, key, from_json(c, e, depth + 1));
        e = json_skip(d, e);
    }
    return o;
}

/* messages: content given as a list of parts becomes the parts' texts
 * joined with "\n" (vLLM's "string" content format). */
static int build_messages(render_ctx *c, int arr, jv *out)
{
    const json_doc *d = c->doc;
    if (!json_is_array(d, arr))
        return pg_error_set(c->err, PG_EINVAL, "chat request: \"messages\": expected an array");
    int n = json_size(d, arr);
    jv msgs = jv_list_new(c->rt, (size_t)n);
    for (int k = 0; k < n; k++) {
        int m = json_arr_at(d, arr, k);
        if (!json_is_object(d, m))
            return pg_error_set(c->err, PG_EINVAL, "chat request: messages[%d]: expected an object", k);
        int role = json_obj_get(d, m, "role");
        if (!json_is_string(d, role))
            return pg_error_set(c->err, PG_EINVAL, "chat request: messages[%d]: \"role\" must be a string", k);
        jv msg = from_json(c, m, 1);
        int content = json_obj_get(d, m, "content");
        if (json_is_array(d, content)) {
            jsb b;
            jsb_init(&b, c->rt, (size_t)1 << 30);
            int np = json_size(d, content);
            int written = 0;
            for (int q = 0; q < np; q++) {
                int part = json_arr_at(d, content, q);
                int type = json_obj_get(d, part, "type");
                int text = json_obj_get(d, part, "text");
                if (!json_is_object(d, part) || !json_is_string(d, text) ||
                    (type >= 0 && !json_str_eq(d, type, "text")))
                    return pg_error_set(c->err, PG_EINVAL,
                                        "chat request: messages[%d].content[%d]: only {\"type\": \"text\", \"text\": ...} parts are supported", k, q);
                jv part_text = json_string_value(c, text);
                if (written++)
                    jsb_putc(&b, '\n');
                jsb_put(&b, part_text.u.s->s, part_text.u.s->len);
            }
            jv_dict_set_str(c->rt, msg, "content", jsb_value(&b));
        }
        jv_list_push(c->rt, msgs, msg);
    }
    *out = msgs;
    return 0;
}

static int get_bool(render_ctx *c, int obj, const char *key, bool dflt, bool *out)
{
    int v = json_obj_get(c->doc, obj, key);
    *out = dflt;
    if (v < 0 || json_is_null(c->doc, v))
        return 0;
    if (!json_is_bool(c->doc, v))
        return pg_error_set(c->err, PG_EINVAL, "chat request: \"%s\": expected true or false", key);
    return json_get_bool(c->doc, v, out, c->err);
}

static bool py_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }

/* continue_final_message: append the tag to the final message's content
 * (a copy of that message), as transformers does. */
static int tag_final_message(const chat_template *t, jinja_rt *rt, jv messages, jv *final_text,
                             pg_error *err)
{
    jv_list *ml = messages.u.list;
    jv last = ml->len ? ml->items[ml->len - 1] : jv_none();
    jv content = last.type == JV_DICT ? jv_dict_get_str(last, "content", 7) : jv_absent();
    if (content.type != JV_STR)
        return pg_error_set(err, PG_EINVAL,
                            "chat request: continue_final_message is set but the final message has no \"content\" to continue");
    if (!strstr(t->src, "content"))
        return pg_error_set(err, PG_EINVAL,
                            "chat request: continue_final_message is set to \"content\" but this is not an accepted field in the chat_template");
    *final_text = content;
    jsb b;
    jsb_init(&b, rt, (size_t)1 << 30);
    jsb_put(&b, content.u.s->s, content.u.s->len);
    jsb_puts(&b, CFM_TAG);
    jv copy = jv_dict_new(rt, last.u.dict->len);
    for (size_t i = 0; i < last.u.dict->len; i++)
        jv_dict_set(rt, copy, last.u.dict->keys[i], last.u.dict->vals[i]);
    jv_dict_set_str(rt, copy, "content", jsb_value(&b));
    ml->items[ml->len - 1] = copy;
    return 0;
}

int chat_template_render(const chat_template *t, const json_doc *doc, int obj,
                         const chat_render_opts *opts, char **out, size_t *out_len, pg_error *err)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!json_is_object(doc, obj))
        return pg_error_set(err, PG_EINVAL, "chat request: expected a JSON object");
    int msgs_tok = json_obj_get(doc, obj, "messages");
    if (msgs_tok < 0)
        return pg_error_set(err, PG_EINVAL, "chat request: \"messages\" is required");
    bool agp, cfm;
    render_ctx c0 = {NULL, doc, err};
    int rc = get_bool(&c0, obj, "add_generation_prompt", opts->default_add_generation_prompt, &agp);
    if (!rc)
        rc = get_bool(&c0, obj, "continue_final_message", false, &cfm);
    if (rc)
        return rc;
    if (cfm && agp)
        return pg_error_set(err, PG_EINVAL,
                            "chat request: continue_final_message and add_generation_prompt are not compatible (set add_generation_prompt to false)");
    int kwargs = json_obj_get(doc, obj, "chat_template_kwargs");
    if (kwargs >= 0 && !json_is_null(doc, kwargs) && !json_is_object(doc, kwargs))
        return pg_error_set(err, PG_EINVAL, "chat request: \"chat_template_kwargs\": expected an object");

    /* on the heap: it is changed between setjmp and longjmp */
    jinja_rt *const rtp = malloc(sizeof *rtp);
    if (!rtp)
        return pg_error_set(err, PG_ENOMEM, "%s: chat template: out of memory", t->label);
    jrt_init(rtp, JINJA_DEFAULT_MAX_MEMORY);
    jmp_buf jb;
    rtp->on_error = &jb;
    /* volatile: read after longjmp */
    volatile int status = 0;
    if (setjmp(jb)) {
        if (status == 0) {
            if (rtp->line)
                pg_error_set(err, PG_EFORMAT, "%s: chat template: line %d: %s", t->label, rtp->line, rtp->msg);
            else
                pg_error_set(err, PG_EFORMAT, "%s: chat template: %s", t->label, rtp->msg);
            status = PG_EFORMAT;
        }
        jrt_free(rtp);
        free(rtp);
        return status;
    }
    jinja_rt *rt = rtp;
    render_ctx c = {rt, doc, err};
    jv vars = jv_dict_new(rt, 16);
    if (t->bos)
        jv_dict_set_str(rt, vars, "bos_token", jv_cstr(rt, t->bos));
    if (t->eos)
        jv_dict_set_str(rt, vars, "eos_token", jv_cstr(rt, t->eos));
    if (kwargs >= 0 && json_is_object(doc, kwargs)) {
        jv kw = from_json(&c, kwargs, 1);
        for (size_t i = 0; i < kw.u.dict->len; i++)
            jv_dict_set(rt, vars, kw.u.dict->keys[i], kw.u.dict->vals[i]);
    }
    jv messages;
    rc = build_messages(&c, msgs_tok, &messages);
    if (rc) {
        status = rc;
        longjmp(jb, 1);
    }
    /* continue_final_message: tag the final message's content */
    jv final_text = jv_absent();
    if (cfm) {
        status = tag_final_message(t, rt, messages, &final_text, err);
        if (status)
            longjmp(jb, 1);
    }
    jv_dict_set_str(rt, vars, "messages", messages);
    int tools = json_obj_get(doc, obj, "tools");
    jv_dict_set_str(rt, vars, "tools", tools >= 0 ? from_json(&c, tools, 1) : jv_none());
    int documents = json_obj_get(doc, obj, "documents");
    jv_dict_set_str(rt, vars, "documents", documents >= 0 ? from_json(&c, documents, 1) : jv_none());
    jv_dict_set_str(rt, vars, "add_generation_prompt", jv_bool(agp));

    jv text = jinja_render(rt, t->root, vars, &t->lim, opts->now_unix);
    const char *s = text.u.s->s;
    size_t n = text.u.s->len;
    if (cfm) {
        /* transformers: the final message (stripped) and the tag must both
         * appear; cut at the last tag */
        jv stripped = jv_str_n(rt, final_text.u.s->s, final_text.u.s->len);
        const jv_str *fs = stripped.u.s;
        size_t a = 0, e = fs->len;
        while (a < e && py_space((unsigned char)fs->s[a]))
            a++;
        while (e > a && py_space((unsigned char)fs->s[e - 1]))
            e--;
        const char *tag = CFM_TAG;
        size_t tag_len = strlen(tag), tag_strip = tag_len - 1;
        const char *loc = NULL;
        for (size_t i = n >= tag_strip ? n - tag_strip + 1 : 0; i-- > 0;)
            if (memcmp(s + i, tag, tag_strip) == 0) {
                loc = s + i;
                break;
            }
        if (!loc || (e > a && !jv_memmem(s, n, fs->s + a, e - a))) {
            status = pg_error_set(err, PG_EFORMAT,
                                  "%s: chat template: continue_final_message is set but the final message does not appear in the chat after applying the chat template",
                                  t->label);
            longjmp(jb, 1);
        }
        size_t cut = (size_t)(loc - s);
        if (!(cut + tag_len <= n && memcmp(loc, tag, tag_len) == 0))
            while (cut > 0 && py_space((unsigned char)s[cut - 1]))
                cut--;
        n = cut;
    }
    char *res = malloc(n + 1);
    if (!res) {
        status = pg_error_set(err, PG_ENOMEM, "%s: chat template: out of memory", t->label);
        longjmp(jb, 1);
    }
    memcpy(res, s, n);
    res[n] = '\0';
    jrt_free(rt);
    free(rtp);
    *out = res;
    if (out_len)
        *out_len = n;
    return 0;
}
