/* config: Hugging Face LLaMA-family config.json / generation_config.json
 * -> plain data (see config.h). Key names and defaults follow transformers'
 * LlamaConfig (models/llama/configuration_llama.py), and for Qwen2 / Qwen3
 * Qwen2Config / Qwen3Config (models/qwen2|qwen3/configuration_*.py), for
 * the mixtures of experts MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig
 * (parse_moe); keys
 * we do not use are ignored, since real configs carry many. A JSON null
 * counts as absent (except num_key_value_heads and sliding_window on Qwen,
 * where null and absent differ). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "json.h"

#define CONFIG_MAX_BYTES (4u * 1024u * 1024u)

/* Value of key in the root object, or -1 when absent or null. */
static int get_key(const json_doc *d, const char *key)
{
    int v = json_obj_get(d, 0, key);
    return json_is_null(d, v) ? -1 : v;
}

/* Optional integer in [lo, hi]: *out unchanged when absent. */
static int opt_int(const json_doc *d, int obj, const char *key, int64_t lo, int64_t hi, int32_t *out,
                   const char *label, pg_error *err)
{
    int v = json_obj_get(d, obj, key);
    if (v < 0 || json_is_null(d, v))
        return PG_OK;
    int64_t x;
    int rc = json_get_int(d, v, lo, hi, &x, err);
    if (rc)
        return pg_error_wrap(err, PG_EFORMAT, "%s: %s", label, key);
    *out = (int32_t)x;
    return PG_OK;
}

static int req_int(const json_doc *d, const char *key, int64_t lo, int64_t hi, int32_t *out,
                   const char *label, pg_error *err)
{
    if (get_key(d, key) < 0)
        return pg_error_set(err, PG_EFORMAT, "%s: missing %s (expected an integer in [%lld, %lld])", label, key,
                            (long long)lo, (long long)hi);
    return opt_int(d, 0, key, lo, hi, out, label, err);
}

/* Optional number in [lo, hi] (lo_open: lo itself excluded). */
static int opt_float(const json_doc *d, int obj, const char *key, double lo, int lo_open, double hi, float *out,
                     bool *present, const char *label, pg_error *err)
{
    int v = json_obj_get(d, obj, key);
    if (v < 0 || json_is_null(d, v))
        return PG_OK;
    double x;
    int rc = json_get_double(d, v, &x, err);
    if (rc)
        return pg_error_wrap(err, PG_EFORMAT, "%s: %s", label, key);
    /* the open bound is checked after rounding to float: 1e-85 is > 0 as a
     * double but 0 as a float (found by fuzz_config) */
    float f = (float)x;
    if (x < lo || (lo_open && !((double)f > lo)) || x > hi)
        return pg_error_set(err, PG_EFORMAT, "%s: %s: expected a number in %c%g, %g] (as a float), got %g", label,
                            key, lo_open ? '(' : '[', lo, hi, x);
    *out = f;
    if (present)
        *present = true;
    return PG_OK;
}

static int opt_bool(const json_doc *d, int obj, const char *key, bool *out, bool *present, const char *label,
                    pg_error *err)
{
    int v = json_obj_get(d, obj, key);
    if (v < 0 || json_is_null(d, v))
        return PG_OK;
    if (json_get_bool(d, v, out, err))
        return pg_error_wrap(err, PG_EFORMAT, "%s: %s", label, key);
    if (present)
        *present = true;
    return PG_OK;
}

/* Appends the eos id(s) at key (an int or a list of ints) to cfg, skipping
 * ids already there. */
static int add_eos(llama_config *cfg, const json_doc *d, const char *label, pg_error *err)
{
    int v = get_key(d, "eos_token_id");
    if (v < 0)
        return PG_OK;
    int n = 1, j = v;
    if (json_is_array(d, v)) {
        n = json_size(d, v);
        j = v + 1;
    }
    for (int k = 0; k < n; k++, j = json_skip(d, j)) {
        int64_t id;
        if (j >= d->ntok || json_get_int(d, j, 0, (int64_t)cfg->vocab_size - 1, &id, err))
            return pg_error_wrap(err, PG_EFORMAT, "%s: eos_token_id", label);
        bool dup = false;
        for (int m = 0; m < cfg->n_eos_token_ids; m++)
            dup = dup || cfg->eos_token_ids[m] == (int32_t)id;
        if (dup)
            continue;
        if (cfg->n_eos_token_ids == LLAMA_MAX_EOS)
            return pg_error_set(err, PG_EFORMAT, "%s: eos_token_id: expected at most %d distinct ids", label,
                                LLAMA_MAX_EOS);
        cfg->eos_token_ids[cfg->n_eos_token_ids++] = (int32_t)id;
    }
    return PG_OK;
}

/* One RoPE dict (rope_scaling, or transformers 5's rope_parameters) ->
 * scaling + optional theta. `name` is the key, for messages. */
typedef struct rope_dict {
    bool present;
    llama_rope_scaling scaling;
    bool has_theta;
    float theta;
    bool has_original_max;  /* original_max_position_embeddings given */
} rope_dict;

static int parse_rope_dict(rope_dict *out, const json_doc *d, const char *name, bool type_required,
                           const char *label, pg_error *err)
{
    memset(out, 0, sizeof *out);
    int rs = get_key(d, name);
    if (rs < 0)
        return PG_OK;
    if (!json_is_object(d, rs))
        return pg_error_set(err, PG_EFORMAT, "%s: %s: expected null or an object", label, name);
    if (json_size(d, rs) == 0) /* {} is "not set" in both versions */
        return PG_OK;
    out->present = true;
    int rc;
    if ((rc = opt_float(d, rs, "rope_theta", 0.0, 1, 1e12, &out->theta, &out->has_theta, label, err)))
        return rc;
    float prf = 1.0f;
    if ((rc = opt_float(d, rs, "partial_rotary_factor", 0.0, 1, 1.0, &prf, NULL, label, err)))
        return rc;
    if (prf != 1.0f)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: %s.partial_rotary_factor %g: partial rotary embeddings are not supported (only 1.0)",
                            label, name, (double)prf);
    /* transformers >= 4.45 spells it rope_type; older configs say type;
     * transformers 5 defaults it to "default" */
    int tv = json_obj_get(d, rs, "rope_type");
    if (tv < 0)
        tv = json_obj_get(d, rs, "type");
    char type[32] = "default";
    if (tv >= 0 || type_required) {
        if (!json_is_string(d, tv))
            return pg_error_set(err, PG_EFORMAT, "%s: %s: expected a string rope_type (or type)", label, name);
        if (json_get_string_buf(d, tv, type, sizeof type, NULL, NULL))
            snprintf(type, sizeof type, "(too long)");
    }
    llama_rope_scaling *r = &out->scaling;
    r->type = LLAMA_ROPE_NONE;
    if (strcmp(type, "default") == 0)
        return PG_OK;
    if (strcmp(type, "linear") != 0 && strcmp(type, "llama3") != 0)
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "%s: %s type '%s' is not supported (supported: default, linear, llama3)", label, name, type);
    r->factor = 0.0f;
    if ((rc = opt_float(d, rs, "factor", 0.0, 1, 1e6, &r->factor, NULL, label, err)))
        return rc;
    if (r->factor <= 0.0f)
        return pg_error_set(err, PG_EFORMAT, "%s: %s: missing factor (expected a number > 0)", label, name);
    if (strcmp(type, "linear") == 0) {
        r->type = LLAMA_ROPE_LINEAR;
        return PG_OK;
    }
    /* llama3: transformers' _compute_llama3_parameters */
    r->type = LLAMA_ROPE_LLAMA3;
    if ((rc = opt_float(d, rs, "low_freq_factor", 0.0, 1, 1e6, &r->low_freq_factor, NULL, label, err)) ||
        (rc = opt_float(d, rs, "high_freq_factor", 0.0, 1, 1e6, &r->high_freq_factor, NULL, label, err)) ||
        (rc = opt_int(d, rs, "original_max_position_embeddings", 1, 1 << 24, &r->original_max_position_embeddings,
                      label, err)))
        return rc;
    out->has_original_max = r->original_max_position_embeddings > 0;
    if (r->low_freq_factor <= 0.0f || r->high_freq_factor <= 0.0f)
        return pg_error_set(err, PG_EFORMAT, "%s: %s llama3: expected factor, low_freq_factor and high_freq_factor",
                            label, name);
    if (!(r->high_freq_factor > r->low_freq_factor))
        return pg_error_set(err, PG_EFORMAT, "%s: %s llama3: expected high_freq_factor > low_freq_factor, got %g <= %g",
                            label, name, (double)r->high_freq_factor, (double)r->low_freq_factor);
    return PG_OK;
}

static bool same_scaling(const llama_rope_scaling *a, const llama_rope_scaling *b)
{
    if (a->type != b->type)
        return false;
    if (a->type == LLAMA_ROPE_NONE)
        return true;
    if (a->factor != b->factor)
        return false;
    return a->type != LLAMA_ROPE_LLAMA3 ||
           (a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
            a->original_max_position_embeddings == b->original_max_position_embeddings);
}

static const char *scaling_name(llama_rope_scaling_type t)
{
    return t == LLAMA_ROPE_LINEAR ? "linear" : t == LLAMA_ROPE_LLAMA3 ? "llama3" : "default";
}

/* Takes one value from up to three places that must agree; refuses a
 * disagreement with both values. */
static int agree_float(float *out, bool *have, const char *what, float v, bool has_v, const char *where,
                       const char **first, const char *label, pg_error *err)
{
    if (!has_v)
        return PG_OK;
    if (*have && *out != v)
        return pg_error_set(err, PG_EFORMAT, "%s: %s disagree: %s says %g, %s says %g", label, what, *first,
                            (double)*out, where, (double)v);
    *out = v;
    *have = true;
    *first = where;
    return PG_OK;
}

/* RoPE. transformers <= 4.x keeps rope_theta at the top level and the
 * scaling in rope_scaling; transformers 5 keeps both in rope_parameters
 * (configuration_utils.py / modeling_rope_utils.py
 * RotaryEmbeddingConfigMixin: rope_type defaults to "default", rope_theta
 * to the top-level value then 10000, and for llama3
 * original_max_position_embeddings to a top-level key of that name, else
 * max_position_embeddings). Both layouts are read; where two places give a
 * value and they differ, the file is refused naming both: transformers
 * would silently let one win, and a wrong theta is invisible in output. */
static int parse_rope(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    rope_dict rs, rp;
    int rc;
    if ((rc = parse_rope_dict(&rs, d, "rope_scaling", true, label, err)) ||
        (rc = parse_rope_dict(&rp, d, "rope_parameters", false, label, err)))
        return rc;
    if (rs.present && rp.present && !same_scaling(&rs.scaling, &rp.scaling))
        return pg_error_set(err, PG_EFORMAT, "%s: rope_scaling (%s, factor %g) and rope_parameters (%s, factor %g) disagree",
                            label, scaling_name(rs.scaling.type), (double)rs.scaling.factor,
                            scaling_name(rp.scaling.type), (double)rp.scaling.factor);
    c->rope_scaling = rp.present ? rp.scaling : rs.scaling;

    float top_theta = 0.0f, prf = 1.0f;
    bool has_top_theta = false, have = false;
    const char *first = NULL;
    if ((rc = opt_float(d, 0, "rope_theta", 0.0, 1, 1e12, &top_theta, &has_top_theta, label, err)) ||
        (rc = opt_float(d, 0, "partial_rotary_factor", 0.0, 1, 1.0, &prf, NULL, label, err)))
        return rc;
    if (prf != 1.0f)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: partial_rotary_factor %g: partial rotary embeddings are not supported (only 1.0)",
                            label, (double)prf);
    /* LlamaConfig / RotaryEmbeddingConfigMixin default_theta; MixtralConfig
     * sets default_theta = 1e6 */
    c->rope_theta = strcmp(c->architecture, "MixtralForCausalLM") == 0 ? 1000000.0f : 10000.0f;
    if ((rc = agree_float(&c->rope_theta, &have, "rope_theta", top_theta, has_top_theta, "rope_theta", &first, label,
                          err)) ||
        (rc = agree_float(&c->rope_theta, &have, "rope_theta", rp.theta, rp.has_theta, "rope_parameters.rope_theta",
                          &first, label, err)) ||
        (rc = agree_float(&c->rope_theta, &have, "rope_theta", rs.theta, rs.has_theta, "rope_scaling.rope_theta",
                          &first, label, err)))
        return rc;

    llama_rope_scaling *r = &c->rope_scaling;
    if (r->type == LLAMA_ROPE_LLAMA3) {
        int32_t top_orig = 0;
        if ((rc = opt_int(d, 0, "original_max_position_embeddings", 1, 1 << 24, &top_orig, label, err)))
            return rc;
        bool in_dict = rp.present ? rp.has_original_max : rs.has_original_max;
        if (top_orig > 0 && in_dict && top_orig != r->original_max_position_embeddings)
            return pg_error_set(err, PG_EFORMAT,
                                "%s: original_max_position_embeddings disagree: the top level says %d, the rope dict says %d",
                                label, (int)top_orig, (int)r->original_max_position_embeddings);
        if (top_orig > 0)
            r->original_max_position_embeddings = top_orig;
        else if (!in_dict)
            r->original_max_position_embeddings = c->max_position_embeddings;
    }
    return PG_OK;
}

/* Mistral's sliding window (MistralConfig: sliding_window defaults to 4096
 * when the key is absent; null means full attention). The model applies it
 * in every layer's attention (model.c -> step_batch.sliding_window: the
 * token at p sees keys p - W < j <= p, transformers' masking_utils
 * sliding_window_overlay). LlamaConfig has no such key; a Llama config
 * that sets one is refused rather than guessed at. */
static int parse_sliding_window(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    bool mistral = strcmp(c->architecture, "MistralForCausalLM") == 0;
    /* MixtralConfig: sliding_window defaults to None; set, every layer's
     * MixtralAttention gets it (modeling_mixtral.py sliding_window=
     * config.sliding_window), as Mistral */
    bool mixtral = strcmp(c->architecture, "MixtralForCausalLM") == 0;
    int v = json_obj_get(d, 0, "sliding_window");
    c->sliding_window = 0;
    if (v < 0) {
        if (mistral)
            c->sliding_window = 4096;
        return PG_OK;
    }
    if (json_is_null(d, v))
        return PG_OK;
    if (!mistral && !mixtral)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: sliding_window is set for %s: LlamaConfig has no sliding window (supported: MistralForCausalLM's)",
                            label, c->architecture);
    return opt_int(d, 0, "sliding_window", 1, 1 << 24, &c->sliding_window, label, err);
}

/* The architectures read, with the model_type that names each when
 * "architectures" is absent (transformers' AutoModel does the same). */
static const struct {
    const char *arch, *model_type;
} arch_table[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},  /* Qwen2 and Qwen2.5 */
    {"Qwen3ForCausalLM", "qwen3"},  /* Qwen3 dense */
    {"MixtralForCausalLM", "mixtral"},       /* mixture of experts */
    {"Qwen2MoeForCausalLM", "qwen2_moe"},    /* Qwen1.5-MoE, Qwen2-MoE */
    {"Qwen3MoeForCausalLM", "qwen3_moe"},    /* Qwen3-30B-A3B, ... */
};
/* The bare transformer of each family (no lm_head): how embedding models
 * built on them name themselves (e5-mistral-7b-instruct: MistralModel;
 * gte-Qwen2: Qwen2Model). The same config class reads them (transformers'
 * MistralModel takes a MistralConfig), so they are read as the causal-LM
 * architecture; such a checkpoint serves embedding lines only (no lm_head:
 * model.c refuses generation). */
static const struct {
    const char *base, *arch;
} base_table[] = {
    {"LlamaModel", "LlamaForCausalLM"},
    {"MistralModel", "MistralForCausalLM"},
    {"Qwen2Model", "Qwen2ForCausalLM"},
    {"Qwen3Model", "Qwen3ForCausalLM"},
};
/* Refused by name: mixtures of experts whose routing or experts differ
 * from the three above (sigmoid or grouped routers, biased experts, MLA
 * attention, ...). */
static const struct {
    const char *arch, *model_type;
} moe_table[] = {
    {"GptOssForCausalLM", "gpt_oss"},
    {"DeepseekV2ForCausalLM", "deepseek_v2"},
    {"DeepseekV3ForCausalLM", "deepseek_v3"},
    {"OlmoeForCausalLM", "olmoe"},
    {"PhimoeForCausalLM", "phimoe"},
    {"Qwen3NextForCausalLM", "qwen3_next"},
    {"Llama4ForCausalLM", "llama4_text"},
};
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static int parse_architecture(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    static const char *const supported =
        "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM (and their bare LlamaModel, MistralModel, Qwen2Model, Qwen3Model for embeddings)";
    int a = get_key(d, "architectures");
    if (a < 0) {
        /* no architectures: fall back on model_type, as transformers' AutoModel does */
        int mt = get_key(d, "model_type");
        for (size_t k = 0; k < ARRAY_LEN(moe_table); k++)
            if (json_str_eq(d, mt, moe_table[k].model_type))
                return pg_error_set(err, PG_EUNSUPPORTED, "%s: model_type '%s' (%s) is a mixture-of-experts model not implemented here (%s)",
                                    label, moe_table[k].model_type, moe_table[k].arch, supported);
        for (size_t k = 0; k < ARRAY_LEN(arch_table); k++)
            if (json_str_eq(d, mt, arch_table[k].model_type)) {
                snprintf(c->architecture, sizeof c->architecture, "%s", arch_table[k].arch);
                return PG_OK;
            }
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: no architectures and no llama/mistral/qwen2/qwen3/mixtral/qwen2_moe/qwen3_moe model_type (%s)",
                            label, supported);
    }
    int first = json_is_array(d, a) && json_size(d, a) >= 1 ? a + 1 : -1;
    if (!json_is_string(d, first))
        return pg_error_set(err, PG_EFORMAT, "%s: architectures: expected a list of strings", label);
    if (json_size(d, a) == 1 && !json_get_string_buf(d, first, c->architecture, sizeof c->architecture, NULL, NULL)) {
        for (size_t k = 0; k < ARRAY_LEN(arch_table); k++)
            if (strcmp(c->architecture, arch_table[k].arch) == 0)
                return PG_OK;
        for (size_t k = 0; k < ARRAY_LEN(base_table); k++)
            if (strcmp(c->architecture, base_table[k].base) == 0) {
                snprintf(c->architecture, sizeof c->architecture, "%s", base_table[k].arch);
                return PG_OK;
            }
        for (size_t k = 0; k < ARRAY_LEN(moe_table); k++)
            if (strcmp(c->architecture, moe_table[k].arch) == 0)
                return pg_error_set(err, PG_EUNSUPPORTED, "%s: architectures [\"%s\"] is a mixture-of-experts model not implemented here (%s)",
                                    label, moe_table[k].arch, supported);
    }
    char raw[64];
    size_t n;
    const char *s = json_raw(d, a, &n);
    snprintf(raw, sizeof raw, "%.*s", (int)(n > 60 ? 60 : n), s);
    return pg_error_set(err, PG_EUNSUPPORTED, "%s: architectures %s not supported (%s)", label, raw, supported);
}

typedef enum cfg_family {
    FAM_LLAMA,
    FAM_MISTRAL,
    FAM_QWEN2,
    FAM_QWEN3,
    FAM_MIXTRAL,
    FAM_QWEN2_MOE,
    FAM_QWEN3_MOE
} cfg_family;

static cfg_family family_of(const char *arch)
{
    if (strcmp(arch, "MixtralForCausalLM") == 0)
        return FAM_MIXTRAL;
    if (strcmp(arch, "Qwen2MoeForCausalLM") == 0)
        return FAM_QWEN2_MOE;
    if (strcmp(arch, "Qwen3MoeForCausalLM") == 0)
        return FAM_QWEN3_MOE;
    if (strcmp(arch, "MistralForCausalLM") == 0)
        return FAM_MISTRAL;
    if (strcmp(arch, "Qwen2ForCausalLM") == 0)
        return FAM_QWEN2;
    if (strcmp(arch, "Qwen3ForCausalLM") == 0)
        return FAM_QWEN3;
    return FAM_LLAMA;
}

static void set_window_layer(llama_family *f, int32_t l)
{
    f->window_layers[l / 64] |= (uint64_t)1 << (l % 64);
}

/* Qwen2Config / Qwen3Config's sliding window (configuration_qwen2.py and
 * configuration_qwen3.py, transformers v4 commit caa31776 / 1f3ae2b3 and
 * v5 main 008e5743, identical here): sliding_window (default 4096) counts
 * only when use_sliding_window (default false) is true, else it is None;
 * layer_types defaults to "sliding_attention" for the layers i >=
 * max_window_layers (default 28) when the window is not None, else
 * "full_attention"; an explicit layer_types (one entry per layer) wins.
 * modeling_qwen2.py / modeling_qwen3.py give a sliding layer
 * config.sliding_window. Every layer sliding -> cfg->sliding_window (the
 * engine frees blocks behind it); some -> family.layer_window + mask. A
 * sliding layer with no window (use_sliding_window false) is refused:
 * transformers' behaviour there is not defined by the config. */
static int parse_qwen_window(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    bool use = false;
    int32_t window = 4096, max_window_layers = 28;
    int rc;
    if ((rc = opt_bool(d, 0, "use_sliding_window", &use, NULL, label, err)) ||
        (rc = opt_int(d, 0, "max_window_layers", 0, 1 << 24, &max_window_layers, label, err)))
        return rc;
    int v = json_obj_get(d, 0, "sliding_window");
    bool have_window = use;
    if (v >= 0 && json_is_null(d, v))
        have_window = false;
    else if ((rc = opt_int(d, 0, "sliding_window", 1, 1 << 24, &window, label, err)))
        return rc;
    const int32_t L = c->num_hidden_layers;
    llama_family *f = &c->family;
    int32_t n_sliding = 0;
    int lt = get_key(d, "layer_types");
    if (lt >= 0) {
        if (!json_is_array(d, lt) || json_size(d, lt) != L)
            return pg_error_set(err, PG_EFORMAT, "%s: layer_types: expected a list of %d strings (num_hidden_layers), got %s",
                                label, (int)L, json_is_array(d, lt) ? "another length" : "a non-list");
        int j = lt + 1;
        for (int32_t l = 0; l < L; l++, j = json_skip(d, j)) {
            if (json_str_eq(d, j, "sliding_attention")) {
                set_window_layer(f, l);
                n_sliding++;
            } else if (!json_str_eq(d, j, "full_attention")) {
                return pg_error_set(err, PG_EUNSUPPORTED, "%s: layer_types[%d]: expected \"full_attention\" or \"sliding_attention\"",
                                    label, (int)l);
            }
        }
        if (n_sliding > 0 && !have_window)
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: layer_types marks %d sliding_attention layers but the window is None (use_sliding_window false or sliding_window null): refused rather than run as full attention",
                                label, (int)n_sliding);
    } else if (have_window) {
        for (int32_t l = max_window_layers; l < L; l++, n_sliding++)
            set_window_layer(f, l);
    }
    c->sliding_window = 0;
    if (n_sliding == 0) {
        memset(f->window_layers, 0, sizeof f->window_layers);
    } else if (n_sliding == L) {
        memset(f->window_layers, 0, sizeof f->window_layers);
        c->sliding_window = window;
    } else {
        f->layer_window = window;
    }
    return PG_OK;
}

/* Qwen2MoeConfig / Qwen3MoeConfig windows: refused when on. The two
 * transformers versions disagree on which layers slide (v5 main 008e5743:
 * Qwen2-MoE's default layer_types slide the even layers below
 * max_window_layers, Qwen3MoeAttention gives every layer
 * config.sliding_window), and no released MoE checkpoint sets
 * use_sliding_window; an explicit all-"full_attention" layer_types is
 * accepted. */
static int parse_qwen_moe_window(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    bool use = false;
    int rc;
    if ((rc = opt_bool(d, 0, "use_sliding_window", &use, NULL, label, err)))
        return rc;
    if (use)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: use_sliding_window is true: sliding windows of %s are not supported",
                            label, c->architecture);
    int lt = get_key(d, "layer_types");
    if (lt < 0)
        return PG_OK;
    if (!json_is_array(d, lt) || json_size(d, lt) != c->num_hidden_layers)
        return pg_error_set(err, PG_EFORMAT, "%s: layer_types: expected a list of %d strings (num_hidden_layers)",
                            label, (int)c->num_hidden_layers);
    int j = lt + 1;
    for (int32_t l = 0; l < c->num_hidden_layers; l++, j = json_skip(d, j))
        if (!json_str_eq(d, j, "full_attention"))
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: layer_types[%d]: expected \"full_attention\" (%s windows are not supported)",
                                label, (int)l, c->architecture);
    return PG_OK;
}

/* The mixture of experts (config.h llama_family: n_experts ...), as
 * transformers v5 main 008e5743 reads it (configuration_mixtral.py,
 * configuration_qwen2_moe.py, configuration_qwen3_moe.py; modeling_*.py's
 * decoder layers and SparseMoeBlocks):
 *   Mixtral: num_local_experts 8, num_experts_per_tok 2, the experts are
 *     intermediate_size wide, every layer sparse, the top-k weights always
 *     renormalized (MixtralSparseMoeBlock); router_jitter_noise is training
 *     only (ignored).
 *   Qwen2-MoE: num_experts 60, num_experts_per_tok 4, moe_intermediate_size
 *     1408, shared_expert_intermediate_size 5632, norm_topk_prob false.
 *   Qwen3-MoE: num_experts 128, num_experts_per_tok 8, moe_intermediate_size
 *     768, norm_topk_prob false, no shared expert.
 *   Qwen: layer l is sparse iff l not in mlp_only_layers (default []) and
 *     num_experts > 0 and (l + 1) % decoder_sparse_step == 0 (default 1);
 *     other layers are a dense MLP of intermediate_size. */
static int parse_moe(llama_config *c, const json_doc *d, cfg_family fam, const char *label, pg_error *err)
{
    llama_family *f = &c->family;
    const bool mixtral = fam == FAM_MIXTRAL;
    const int32_t L = c->num_hidden_layers;
    int32_t E = mixtral ? 8 : fam == FAM_QWEN2_MOE ? 60 : 128;
    int32_t k = mixtral ? 2 : fam == FAM_QWEN2_MOE ? 4 : 8;
    int32_t Ie = mixtral ? c->intermediate_size : fam == FAM_QWEN2_MOE ? 1408 : 768;
    int32_t Is = fam == FAM_QWEN2_MOE ? 5632 : 0;
    int32_t step = 1;
    bool norm = mixtral;
    int rc;
    if ((rc = opt_int(d, 0, mixtral ? "num_local_experts" : "num_experts", mixtral ? 1 : 0, 1 << 16, &E, label,
                      err)) ||
        (rc = opt_int(d, 0, "num_experts_per_tok", 1, 1 << 16, &k, label, err)))
        return rc;
    if (!mixtral &&
        ((rc = opt_int(d, 0, "moe_intermediate_size", 1, 1 << 22, &Ie, label, err)) ||
         (rc = opt_bool(d, 0, "norm_topk_prob", &norm, NULL, label, err)) ||
         (rc = opt_int(d, 0, "decoder_sparse_step", 1, 1 << 24, &step, label, err))))
        return rc;
    if (fam == FAM_QWEN2_MOE && (rc = opt_int(d, 0, "shared_expert_intermediate_size", 0, 1 << 22, &Is, label, err)))
        return rc;
    if (E > 0 && k > E)
        return pg_error_set(err, PG_EFORMAT, "%s: num_experts_per_tok: expected at most %s %d, got %d", label,
                            mixtral ? "num_local_experts" : "num_experts", (int)E, (int)k);
    memset(f->moe_layers, 0, sizeof f->moe_layers);
    if (E > 0)
        for (int32_t l = 0; l < L; l++)
            if (mixtral || (l + 1) % step == 0)
                f->moe_layers[l / 64] |= (uint64_t)1 << (l % 64);
    int ml = get_key(d, "mlp_only_layers");
    if (!mixtral && ml >= 0) {
        if (!json_is_array(d, ml))
            return pg_error_set(err, PG_EFORMAT, "%s: mlp_only_layers: expected a list of layer indices", label);
        int j = ml + 1;
        for (int n = 0; n < json_size(d, ml); n++, j = json_skip(d, j)) {
            int64_t l;
            /* transformers tests `layer_idx not in mlp_only_layers`: an
             * index past the layers changes nothing, nor do we */
            if (json_get_int(d, j, 0, INT32_MAX, &l, err))
                return pg_error_wrap(err, PG_EFORMAT, "%s: mlp_only_layers[%d]", label, n);
            if (l < L)
                f->moe_layers[l / 64] &= ~((uint64_t)1 << (l % 64));
        }
    }
    f->n_experts = E;
    f->n_experts_per_tok = k;
    f->moe_intermediate_size = Ie;
    f->shared_expert_intermediate_size = Is;
    f->norm_topk_prob = norm;
    f->moe_mixtral_keys = mixtral;
    return PG_OK;
}

static int parse_doc(llama_config *c, const json_doc *d, const char *label, pg_error *err)
{
    int rc;
    if (!json_is_object(d, 0))
        return pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
    if ((rc = parse_architecture(c, d, label, err)))
        return rc;
    if ((rc = req_int(d, "hidden_size", 1, 1 << 20, &c->hidden_size, label, err)) ||
        (rc = req_int(d, "intermediate_size", 1, 1 << 22, &c->intermediate_size, label, err)) ||
        (rc = req_int(d, "num_hidden_layers", 1, 4096, &c->num_hidden_layers, label, err)) ||
        (rc = req_int(d, "num_attention_heads", 1, 4096, &c->num_attention_heads, label, err)) ||
        (rc = req_int(d, "vocab_size", 1, 1 << 24, &c->vocab_size, label, err)))
        return rc;
    const cfg_family fam = family_of(c->architecture);
    const bool qwen = fam == FAM_QWEN2 || fam == FAM_QWEN3;
    const bool qwen_moe = fam == FAM_QWEN2_MOE || fam == FAM_QWEN3_MOE;
    int nh = c->num_attention_heads;
    /* absent: LlamaConfig's None -> nh; Qwen2Config / Qwen3Config's 32;
     * Qwen2MoeConfig 16, Qwen3MoeConfig 4, MixtralConfig 8.
     * null: nh for every family ("for backward compatibility") */
    c->num_key_value_heads = nh;
    if (json_obj_get(d, 0, "num_key_value_heads") < 0)
        c->num_key_value_heads = qwen ? 32 : fam == FAM_QWEN2_MOE ? 16 : fam == FAM_QWEN3_MOE ? 4
                                 : fam == FAM_MIXTRAL ? 8 : nh;
    if ((rc = opt_int(d, 0, "num_key_value_heads", 1, nh, &c->num_key_value_heads, label, err)))
        return rc;
    if (c->num_key_value_heads > nh || nh % c->num_key_value_heads != 0)
        return pg_error_set(err, PG_EFORMAT, "%s: num_key_value_heads: expected a divisor of num_attention_heads %d, got %d%s",
                            label, nh, c->num_key_value_heads,
                            fam == FAM_LLAMA || fam == FAM_MISTRAL || json_obj_get(d, 0, "num_key_value_heads") >= 0
                                ? "" : fam == FAM_MIXTRAL ? " (the Mixtral default when absent)"
                                                          : " (the Qwen default when absent)");
    /* absent: hidden_size / nh (LlamaConfig; modeling_qwen2.py's getattr
     * default; MixtralConfig's None; Qwen3MoeConfig has no head_dim and
     * Qwen3MoeAttention's getattr falls back on it too), Qwen3Config's 128 */
    c->head_dim = fam == FAM_QWEN3 ? 128 : 0;
    if ((rc = opt_int(d, 0, "head_dim", 2, 4096, &c->head_dim, label, err)))
        return rc;
    if (c->head_dim == 0) {
        if (c->hidden_size % nh != 0)
            return pg_error_set(err, PG_EFORMAT, "%s: no head_dim and hidden_size %d is not a multiple of num_attention_heads %d",
                                label, c->hidden_size, nh);
        c->head_dim = c->hidden_size / nh;
    }
    if (c->head_dim % 2 != 0)
        return pg_error_set(err, PG_EFORMAT, "%s: head_dim: expected an even number (rope rotates pairs), got %d", label,
                            c->head_dim);
    /* Qwen2Config / Qwen3Config / Qwen2MoeConfig / Qwen3MoeConfig;
     * MixtralConfig 4096 * 32; LlamaConfig */
    c->max_position_embeddings = qwen || qwen_moe ? 32768 : fam == FAM_MIXTRAL ? 131072 : 2048;
    /* LlamaConfig and the Qwen configs; MixtralConfig 1e-5 */
    c->rms_norm_eps = fam == FAM_MIXTRAL ? 1e-5f : 1e-6f;
    if ((rc = opt_int(d, 0, "max_position_embeddings", 1, 1 << 24, &c->max_position_embeddings, label, err)) ||
        (rc = opt_float(d, 0, "rms_norm_eps", 0.0, 1, 1.0, &c->rms_norm_eps, NULL, label, err)) ||
        (rc = opt_bool(d, 0, "tie_word_embeddings", &c->tie_word_embeddings, NULL, label, err)))
        return rc;
    if ((rc = parse_rope(c, d, label, err)))
        return rc;
    if ((rc = qwen ? parse_qwen_window(c, d, label, err)
                   : qwen_moe ? parse_qwen_moe_window(c, d, label, err) : parse_sliding_window(c, d, label, err)))
        return rc;
    if ((fam == FAM_MIXTRAL || qwen_moe) && (rc = parse_moe(c, d, fam, label, err)))
        return rc;

    if (!qwen && !qwen_moe) {
        static const char *const biases[] = {"attention_bias", "mlp_bias"};
        for (int k = 0; k < 2; k++) {
            bool b = false;
            if ((rc = opt_bool(d, 0, biases[k], &b, NULL, label, err)))
                return rc;
            if (b)
                return pg_error_set(err, PG_EUNSUPPORTED, "%s: %s is true: biases are not supported (LLaMA projections have none)",
                                    label, biases[k]);
        }
    }
    /* Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False, whatever
     * the config says (Qwen2Config has no attention_bias). Qwen3Attention:
     * q_norm/k_norm always; attention_bias (default false) would add biases
     * to q, k, v and o_proj. */
    c->family.qkv_bias = fam == FAM_QWEN2;
    c->family.qk_norm = fam == FAM_QWEN3 || fam == FAM_QWEN3_MOE;
    /* Qwen2MoeAttention: q/k/v_proj bias=config.qkv_bias (Qwen2MoeConfig
     * default true), o_proj none */
    if (fam == FAM_QWEN2_MOE) {
        bool b = true;
        if ((rc = opt_bool(d, 0, "qkv_bias", &b, NULL, label, err)))
            return rc;
        c->family.qkv_bias = b;
    }
    if (fam == FAM_QWEN3 || fam == FAM_QWEN3_MOE) {
        bool b = false;
        if ((rc = opt_bool(d, 0, "attention_bias", &b, NULL, label, err)))
            return rc;
        if (b)
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: attention_bias is true: Qwen3's q/k/v/o_proj biases are not supported",
                                label);
    }
    int act = get_key(d, "hidden_act");
    if (act >= 0 && !json_str_eq(d, act, "silu"))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: hidden_act: expected \"silu\", got %s", label,
                            json_is_string(d, act) ? "another activation" : "a non-string");

    c->bos_token_id = -1;
    if ((rc = opt_int(d, 0, "bos_token_id", 0, c->vocab_size - 1, &c->bos_token_id, label, err)))
        return rc;
    return add_eos(c, d, label, err);
}

int llama_config_parse(llama_config *out, const char *json, size_t len, const char *label, pg_error *err)
{
    memset(out, 0, sizeof *out);
    out->bos_token_id = -1;
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc)
        return rc;
    llama_config c;
    memset(&c, 0, sizeof c);
    rc = parse_doc(&c, &d, label, err);
    json_doc_free(&d);
    if (rc == PG_OK)
        *out = c;
    return rc;
}

int llama_config_merge_generation(llama_config *cfg, const char *json, size_t len, const char *label, pg_error *err)
{
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc)
        return rc;
    llama_config c = *cfg; /* all or nothing: cfg changes only on success */
    if (!json_is_object(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
        goto out;
    }
    int32_t bos = -1;
    if ((rc = opt_int(&d, 0, "bos_token_id", 0, c.vocab_size - 1, &bos, label, err)) ||
        (rc = add_eos(&c, &d, label, err)) ||
        (rc = opt_float(&d, 0, "temperature", 0.0, 0, 1e6, &c.temperature, &c.has_temperature, label, err)) ||
        (rc = opt_float(&d, 0, "top_p", 0.0, 1, 1.0, &c.top_p, &c.has_top_p, label, err)) ||
        (rc = opt_bool(&d, 0, "do_sample", &c.do_sample, &c.has_do_sample, label, err)) ||
        (rc = opt_float(&d, 0, "repetition_penalty", 0.0, 1, 1e6, &c.repetition_penalty,
                        &c.has_repetition_penalty, label, err)) ||
        (rc = opt_float(&d, 0, "min_p", 0.0, 0, 1.0, &c.min_p, &c.has_min_p, label, err)))
        goto out;
    int32_t max_new = -1;
    if ((rc = opt_int(&d, 0, "max_new_tokens", 1, INT32_MAX, &max_new, label, err)))
        goto out;
    if (max_new >= 1) {
        c.max_new_tokens = max_new;
        c.has_max_new_tokens = true;
    }
    if (c.bos_token_id < 0)
        c.bos_token_id = bos;
    int32_t top_k = -1;
    if ((rc = opt_int(&d, 0, "top_k", 0, INT32_MAX, &top_k, label, err)))
        goto out;
    if (top_k >= 0) {
        c.top_k = top_k;
        c.has_top_k = true;
    }
    *cfg = c;
out:
    json_doc_free(&d);
    return rc;
}

int llama_config_load(llama_config *out, const char *model_dir, pg_error *err)
{
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = pg_read_file(path, CONFIG_MAX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    llama_config c;
    rc = llama_config_parse(&c, text, len, path, err);
    pg_file_free(text);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    if (pg_file_exists(path)) {
        rc = pg_read_file(path, CONFIG_MAX_BYTES, &text, &len, err);
        if (rc)
            return rc;
        rc = llama_config_merge_generation(&c, text, len, path, err);
        pg_file_free(text);
        if (rc)
            return rc;
    }
    *out = c;
    return PG_OK;
}
