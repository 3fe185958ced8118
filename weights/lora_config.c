/* lora_config: PEFT adapter_config.json and PEFT's module rules (see lora_config.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "lora_config.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json.h"

/* Compiles a Python regex for PCRE2 with `opts` (PCRE2_ANCHORED /
 * PCRE2_ENDANCHORED give re.match / re.fullmatch). */
static int compile_re(void **out, const char *pat, size_t len, uint32_t opts, const char *label,
                      const char *key, pg_error *err)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts | PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': regex '%.*s' does not compile at offset %zu: %s",
                            label, key, (int)len, pat, (size_t)eo, (const char *)msg);
    }
    *out = re;
    return 0;
}

/* Matches re against s; returns 1/0 and, when g1 is given, group 1's value
 * as a non-negative integer (-1 when unset or not digits). A match error
 * (PCRE2's match limit: catastrophic backtracking) counts as no match
 * (weights/README.md). */
static int run_re(const void *re, const char *s, int64_t *g1)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern((const pcre2_code *)re, NULL);
    if (!md) return 0;
    int m = pcre2_match((const pcre2_code *)re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    if (m > 0 && g1) {
        *g1 = -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (m > 1 && ov[2] != PCRE2_UNSET && ov[3] > ov[2] && ov[3] - ov[2] < 10) {
            int64_t v = 0;
            size_t k;
            for (k = ov[2]; k < ov[3] && s[k] >= '0' && s[k] <= '9'; k++) v = v * 10 + (s[k] - '0');
            if (k == ov[3]) *g1 = v;
        }
    }
    pcre2_match_data_free(md);
    return m > 0;
}

/* A string token into a malloc'd string; refuses embedded NULs. */
static int dup_string(const json_doc *d, int t, char **out, const char *label, const char *key,
                      pg_error *err)
{
    size_t n;
    if (!json_is_string(d, t))
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': expected a string", label, key);
    int rc = json_get_string(d, t, out, &n, err);
    if (rc) return rc;
    if (strlen(*out) != n) {
        free(*out);
        *out = NULL;
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': string holds a NUL", label, key);
    }
    return 0;
}

/* A list of strings (or, when allow_str, one string: *is_str set). */
static int read_names(const json_doc *d, int t, char ***list, int32_t *n, char **one, bool *is_str,
                      const char *label, const char *key, pg_error *err)
{
    *is_str = false;
    if (json_is_string(d, t)) {
        *is_str = true;
        return dup_string(d, t, one, label, key, err);
    }
    if (!json_is_array(d, t))
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': expected a list of strings or a string", label, key);
    int m = json_size(d, t);
    if (m > LORA_MAX_LIST)
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': %d entries, at most %d", label, key, m, LORA_MAX_LIST);
    *list = calloc((size_t)m + 1, sizeof **list);
    if (!*list) return pg_error_set(err, PG_ENOMEM, "%s: '%s': out of memory", label, key);
    for (int k = 0, e = t + 1; k < m; k++, e = json_skip(d, e)) {
        int rc = dup_string(d, e, &(*list)[k], label, key, err);
        if (rc) return rc;
        (*n)++;
    }
    return 0;
}

/* Keys whose being set changes the math or the model beyond LoRA on our
 * seven projections. Set: not null, not false, not an empty list/object. */
static const struct {
    const char *key, *why;
} refused_keys[] = {
    {"use_dora", "DoRA (weight-decomposed LoRA) is not supported"},
    {"modules_to_save", "fully trained modules saved beside the adapter are not supported"},
    {"lora_bias", "a bias on lora_B is not supported"},
    {"trainable_token_indices", "trained (added) token embeddings are not supported"},
    {"target_parameters", "LoRA on nn.Parameter targets is not supported"},
    {"layer_replication", "replicated layers are not supported"},
    {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
    {"use_qalora", "QALoRA is not supported"},
    {"use_bdlora", "block-diagonal LoRA is not supported"},
    {"arrow_config", "Arrow routing is not supported"},
    {"velora_config", "VeLoRA is not supported"},
    {"kasa_config", "KaSA is not supported"},
    {"monteclora_config", "MonteCLoRA is not supported"},
};

static bool is_set(const json_doc *d, int t)
{
    if (t < 0 || json_is_null(d, t)) return false;
    if (json_is_bool(d, t)) {
        bool b = false;
        json_get_bool(d, t, &b, NULL);
        return b;
    }
    if (json_is_array(d, t) || json_is_object(d, t)) return json_size(d, t) > 0;
    return true;
}

static int get_bool(const json_doc *d, int obj, const char *key, bool *out, const char *label,
                    pg_error *err)
{
    int t = json_obj_get(d, obj, key);
    if (t < 0 || json_is_null(d, t)) return 0;
    if (json_get_bool(d, t, out, err))
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': expected true or false", label, key);
    return 0;
}

static int read_pattern(const json_doc *d, int obj, const char *key, bool integer, lora_pattern **out,
                        int32_t *n, const char *label, pg_error *err)
{
    int t = json_obj_get(d, obj, key);
    if (t < 0 || json_is_null(d, t)) return 0;
    if (!json_is_object(d, t))
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': expected an object", label, key);
    int m = json_size(d, t);
    if (m > LORA_MAX_LIST)
        return pg_error_set(err, PG_EFORMAT, "%s: '%s': %d entries, at most %d", label, key, m, LORA_MAX_LIST);
    *out = calloc((size_t)m + 1, sizeof **out);
    if (!*out) return pg_error_set(err, PG_ENOMEM, "%s: '%s': out of memory", label, key);
    for (int k = 0, kt = t + 1; k < m; k++) {
        lora_pattern *p = &(*out)[k];
        int rc = dup_string(d, kt, &p->key, label, key, err);
        if (rc) return rc;
        (*n)++;
        int v = kt + 1;
        if (integer) {
            int64_t r;
            if (json_get_int(d, v, 1, LORA_MAX_RANK, &r, NULL))
                return pg_error_set(err, PG_EFORMAT, "%s: '%s': '%s': expected an integer in [1, %d]",
                                    label, key, p->key, LORA_MAX_RANK);
            p->value = (double)r;
        } else if (json_get_double(d, v, &p->value, NULL)) {
            return pg_error_set(err, PG_EFORMAT, "%s: '%s': '%s': expected a number", label, key, p->key);
        }
        /* get_pattern_key: re.match(rf"(.*\.)?({key})$", module) */
        size_t kl = strlen(p->key);
        char *pat = malloc(kl + 16);
        if (!pat) return pg_error_set(err, PG_ENOMEM, "%s: '%s': out of memory", label, key);
        int pl = snprintf(pat, kl + 16, "(.*\\.)?(%s)", p->key);
        rc = compile_re(&p->re, pat, (size_t)pl, PCRE2_ANCHORED | PCRE2_ENDANCHORED, label, key, err);
        free(pat);
        if (rc) return rc;
        kt = json_skip(d, v);
    }
    return 0;
}

static int parse_doc(lora_config *c, const json_doc *d, const char *label, pg_error *err)
{
    int rc;
    if (!json_is_object(d, 0)) return pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
    c->r = 8;
    c->lora_alpha = 8;

    int t = json_obj_get(d, 0, "peft_type");
    if (t >= 0 && !json_is_null(d, t) && !json_str_eq(d, t, "LORA")) {
        size_t n;
        const char *s = json_raw(d, t, &n);
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: 'peft_type' is %.*s: only LORA adapters are supported",
                            label, (int)(n > 64 ? 64 : n), s);
    }
    for (size_t k = 0; k < sizeof refused_keys / sizeof refused_keys[0]; k++)
        if (is_set(d, json_obj_get(d, 0, refused_keys[k].key)))
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: '%s' is set: %s", label, refused_keys[k].key,
                                refused_keys[k].why);
    t = json_obj_get(d, 0, "bias");
    if (t >= 0 && !json_is_null(d, t) && !json_str_eq(d, t, "none")) {
        size_t n;
        const char *s = json_raw(d, t, &n);
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: 'bias' is '%.*s': only \"none\" is supported "
                            "(trained biases of the base layers are not)", label, (int)(n > 64 ? 64 : n), s);
    }
    if ((t = json_obj_get(d, 0, "r")) >= 0 && !json_is_null(d, t)) {
        int64_t v;
        if (json_get_int(d, t, 1, LORA_MAX_RANK, &v, NULL))
            return pg_error_set(err, PG_EFORMAT, "%s: 'r': expected an integer in [1, %d]", label, LORA_MAX_RANK);
        c->r = (int32_t)v;
    }
    if ((t = json_obj_get(d, 0, "lora_alpha")) >= 0 && !json_is_null(d, t) &&
        json_get_double(d, t, &c->lora_alpha, NULL))
        return pg_error_set(err, PG_EFORMAT, "%s: 'lora_alpha': expected a number", label);
    if ((rc = get_bool(d, 0, "use_rslora", &c->use_rslora, label, err))) return rc;
    if ((rc = get_bool(d, 0, "fan_in_fan_out", &c->fan_in_fan_out, label, err))) return rc;
    if ((t = json_obj_get(d, 0, "base_model_name_or_path")) >= 0 && json_is_string(d, t)) {
        size_t n;
        if (json_get_string_buf(d, t, c->base_model_name_or_path, sizeof c->base_model_name_or_path, &n,
                                NULL))
            snprintf(c->base_model_name_or_path, sizeof c->base_model_name_or_path, "(too long)");
    }

    /* target_modules */
    t = json_obj_get(d, 0, "target_modules");
    if (t < 0 || json_is_null(d, t))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: 'target_modules' is absent: PEFT would pick a default "
                            "per architecture; name the modules", label);
    char *one = NULL;
    if ((rc = read_names(d, t, &c->targets, &c->n_targets, &one, &c->targets_is_regex, label,
                         "target_modules", err)))
        return rc;
    if (c->targets_is_regex) {
        if (strcasecmp(one, "all-linear") == 0) {
            c->targets_all_linear = true;
        } else {
            rc = compile_re(&c->targets_re, one, strlen(one), PCRE2_ANCHORED | PCRE2_ENDANCHORED, label,
                            "target_modules", err);
        }
        free(one);
        if (rc) return rc;
    } else if (c->n_targets == 0) {
        return pg_error_set(err, PG_EFORMAT, "%s: 'target_modules' is an empty list", label);
    }
    /* exclude_modules */
    t = json_obj_get(d, 0, "exclude_modules");
    if (t >= 0 && !json_is_null(d, t)) {
        one = NULL;
        if ((rc = read_names(d, t, &c->excludes, &c->n_excludes, &one, &c->exclude_is_regex, label,
                             "exclude_modules", err)))
            return rc;
        if (c->exclude_is_regex) {
            rc = *one ? compile_re(&c->exclude_re, one, strlen(one), PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                                   label, "exclude_modules", err) : 0;
            free(one);
            if (rc) return rc;
        }
    }

    if ((rc = read_pattern(d, 0, "rank_pattern", true, &c->rank_pattern, &c->n_rank_pattern, label, err)))
        return rc;
    if ((rc = read_pattern(d, 0, "alpha_pattern", false, &c->alpha_pattern, &c->n_alpha_pattern, label, err)))
        return rc;

    /* layers_to_transform: an int or a list of ints */
    t = json_obj_get(d, 0, "layers_to_transform");
    if (t >= 0 && !json_is_null(d, t)) {
        if (c->targets_is_regex)
            return pg_error_set(err, PG_EFORMAT, "%s: 'layers_to_transform' cannot be used when "
                                "'target_modules' is a string (PEFT's LoraConfig refuses it)", label);
        int m = json_is_array(d, t) ? json_size(d, t) : 1;
        if (m > LORA_MAX_LIST)
            return pg_error_set(err, PG_EFORMAT, "%s: 'layers_to_transform': too many entries", label);
        c->layers = calloc((size_t)m + 1, sizeof *c->layers);
        if (!c->layers) return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        for (int k = 0, e = json_is_array(d, t) ? t + 1 : t; k < m; k++, e = json_skip(d, e))
            if (json_get_int(d, e, 0, INT32_MAX, &c->layers[k], NULL))
                return pg_error_set(err, PG_EFORMAT, "%s: 'layers_to_transform': expected an integer >= 0 "
                                    "or a list of them", label);
        c->n_layers = m;
        /* PEFT: an empty list means no layer selection */
        c->has_layers = m > 0;
    }
    t = json_obj_get(d, 0, "layers_pattern");
    if (t >= 0 && !json_is_null(d, t)) {
        char **pats = NULL;
        int32_t np = 0;
        bool is_str = false;
        one = NULL;
        rc = read_names(d, t, &pats, &np, &one, &is_str, label, "layers_pattern", err);
        if (!rc && c->targets_is_regex)
            rc = pg_error_set(err, PG_EFORMAT, "%s: 'layers_pattern' cannot be used when 'target_modules' "
                              "is a string (PEFT's LoraConfig refuses it)", label);
        bool nonempty = is_str ? *one != 0 : np > 0;
        if (!rc && nonempty && json_obj_get(d, 0, "layers_to_transform") < 0)
            rc = pg_error_set(err, PG_EFORMAT, "%s: 'layers_pattern' without 'layers_to_transform' (PEFT's "
                              "LoraConfig refuses it)", label);
        if (!rc && nonempty) {
            int32_t cnt = is_str ? 1 : np;
            c->layers_re = calloc((size_t)cnt, sizeof *c->layers_re);
            if (!c->layers_re) rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
            for (int32_t k = 0; !rc && k < cnt; k++) {
                const char *p = is_str ? one : pats[k];
                size_t pl = strlen(p);
                char *full = malloc(pl + 32);
                if (!full) {
                    rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
                    break;
                }
                /* re.match(rf".*?\.{pattern}\.(\d+)\.", key) */
                int fl = snprintf(full, pl + 32, ".*?\\.%s\\.(\\d+)\\.", p);
                rc = compile_re(&c->layers_re[k], full, (size_t)fl, PCRE2_ANCHORED, label, "layers_pattern",
                                err);
                free(full);
                if (!rc) c->n_layers_re++;
            }
        }
        free(one);
        for (int32_t k = 0; k < np; k++) free(pats[k]);
        free(pats);
        if (rc) return rc;
    }
    return 0;
}

int lora_config_parse(lora_config *out, const char *json, size_t len, const char *label, pg_error *err)
{
    memset(out, 0, sizeof *out);
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc) return rc;
    rc = parse_doc(out, &d, label, err);
    json_doc_free(&d);
    if (rc) lora_config_free(out);
    return rc;
}

static void free_names(char **v, int32_t n)
{
    for (int32_t k = 0; k < n; k++) free(v[k]);
    free(v);
}

static void free_patterns(lora_pattern *p, int32_t n)
{
    for (int32_t k = 0; k < n; k++) {
        free(p[k].key);
        pcre2_code_free((pcre2_code *)p[k].re);
    }
    free(p);
}

void lora_config_free(lora_config *c)
{
    if (!c) return;
    free_names(c->targets, c->n_targets);
    free_names(c->excludes, c->n_excludes);
    pcre2_code_free((pcre2_code *)c->targets_re);
    pcre2_code_free((pcre2_code *)c->exclude_re);
    free_patterns(c->rank_pattern, c->n_rank_pattern);
    free_patterns(c->alpha_pattern, c->n_alpha_pattern);
    free(c->layers);
    for (int32_t k = 0; k < c->n_layers_re; k++) pcre2_code_free((pcre2_code *)c->layers_re[k]);
    free(c->layers_re);
    memset(c, 0, sizeof *c);
}

/* key in list, or key ends with "." + entry */
static bool in_list(char *const *list, int32_t n, const char *key, bool *exact)
{
    size_t kl = strlen(key);
    bool found = false;
    *exact = false;
    for (int32_t k = 0; k < n; k++) {
        size_t el = strlen(list[k]);
        if (strcmp(list[k], key) == 0) {
            *exact = true;
            return true;
        }
        if (kl > el && key[kl - el - 1] == '.' && memcmp(key + kl - el, list[k], el) == 0) found = true;
    }
    return found;
}

int lora_config_targets(const lora_config *c, const char *module)
{
    bool exact;
    /* check_target_module_exists: exclude_modules first */
    if (c->exclude_re && run_re(c->exclude_re, module, NULL)) return 0;
    if (!c->exclude_is_regex && c->n_excludes > 0 && in_list(c->excludes, c->n_excludes, module, &exact))
        return 0;
    if (c->targets_all_linear) return 1; /* the caller asks only about projections */
    if (c->targets_is_regex) return run_re(c->targets_re, module, NULL);
    if (!in_list(c->targets, c->n_targets, module, &exact)) return 0;
    if (exact || !c->has_layers) return 1;
    /* layers_to_transform: the layer index from the name */
    int64_t idx = -1;
    bool got = false;
    if (c->n_layers_re == 0) {
        /* r".*?\.[^.]*\.(\d+)\." without a pattern: the first numbered segment */
        const char *p = module;
        while (!got && (p = strchr(p, '.')) != NULL) {
            const char *seg = p + 1, *dot = strchr(seg, '.');
            if (!dot) break;
            const char *num = dot + 1, *e = num;
            while (*e >= '0' && *e <= '9') e++;
            if (e > num && *e == '.' && e - num < 10) {
                idx = strtoll(num, NULL, 10);
                got = true;
            }
            p = seg;
        }
        /* (a leading segment without a dot before it cannot start the match) */
    } else {
        for (int32_t k = 0; k < c->n_layers_re && !got; k++)
            if (run_re(c->layers_re[k], module, &idx)) got = true;
    }
    if (!got || idx < 0) return 0;
    for (int32_t k = 0; k < c->n_layers; k++)
        if (c->layers[k] == idx) return 1;
    return 0;
}

void lora_config_rank_alpha(const lora_config *c, const char *module, int32_t *r, double *alpha)
{
    *r = c->r;
    *alpha = c->lora_alpha;
    for (int32_t k = 0; k < c->n_rank_pattern; k++)
        if (run_re(c->rank_pattern[k].re, module, NULL)) {
            *r = (int32_t)c->rank_pattern[k].value;
            break;
        }
    for (int32_t k = 0; k < c->n_alpha_pattern; k++)
        if (run_re(c->alpha_pattern[k].re, module, NULL)) {
            *alpha = c->alpha_pattern[k].value;
            break;
        }
}

double lora_config_scale(const lora_config *c, int32_t r, double alpha)
{
    return c->use_rslora ? alpha / sqrt((double)r) : alpha / (double)r;
}
