/* lora_adapter: a PEFT LoRA adapter folder as f32 matrices (see lora_adapter.h). */
#include "lora_adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file_io.h"
#include "json.h"
#include "lora_config.h"

#define LORA_CONFIG_MAX_BYTES ((size_t)4 << 20)
#define LORA_MODULE_MAX 256

static const char *const proj_names[LORA_NPROJ] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

const char *lora_proj_name(lora_proj p)
{
    return (unsigned)p < LORA_NPROJ ? proj_names[p] : "?";
}

const char *lora_proj_block(lora_proj p)
{
    return p <= LORA_O ? "self_attn" : "mlp";
}

void lora_proj_dims(const llama_config *b, lora_proj p, int32_t *in, int32_t *out)
{
    const int32_t H = b->hidden_size, I = b->intermediate_size;
    const int32_t Q = b->num_attention_heads * b->head_dim, KV = b->num_key_value_heads * b->head_dim;
    switch (p) {
    case LORA_Q: *in = H; *out = Q; break;
    case LORA_K:
    case LORA_V: *in = H; *out = KV; break;
    case LORA_O: *in = Q; *out = H; break;
    case LORA_GATE:
    case LORA_UP: *in = H; *out = I; break;
    default: *in = I; *out = H; break;
    }
}

void lora_adapter_free(lora_adapter *a)
{
    if (!a) return;
    if (a->w)
        for (size_t k = 0; k < (size_t)a->n_layers * LORA_NPROJ; k++) {
            free(a->w[k].A);
            free(a->w[k].B);
        }
    free(a->w);
    free(a);
}

static bool starts(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* A tensor name -> (layer, projection, is_a). Returns 0 on success, else
 * fills err with why the tensor is refused. */
static int parse_name(const char *full, const llama_config *base, int32_t *layer, lora_proj *proj,
                      bool *is_a, const char *label, pg_error *err)
{
    const char *s = starts(full, "base_model.model.") ? full + strlen("base_model.model.") : full;
    if (strstr(full, "lora_embedding_"))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': LoRA on an embedding is not supported "
                            "(embedding targets are refused)", label, full);
    if (strstr(full, "lora_magnitude_vector"))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': a DoRA magnitude vector ('use_dora' "
                            "adapters are not supported)", label, full);
    if (strstr(full, "modules_to_save"))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': a 'modules_to_save' copy (not "
                            "supported)", label, full);
    if (strstr(full, "trainable_tokens"))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': trained token embeddings "
                            "('trainable_token_indices', added tokens) are not supported", label, full);
    /* ... .lora_A[.adapter_name].weight */
    const char *la = strstr(s, ".lora_A."), *lb = strstr(s, ".lora_B.");
    const char *l = la ? la : lb;
    if (!l || (la && lb)) goto not_lora;
    *is_a = l == la;
    const char *tail = l + strlen(".lora_A.");
    const char *dot = strchr(tail, '.');
    if (strcmp(tail, "weight") != 0) {
        if (!*is_a && (strcmp(tail, "bias") == 0 || (dot && strcmp(dot, ".bias") == 0)))
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': a lora_B bias ('lora_bias' adapters "
                                "are not supported)", label, full);
        if (!dot || dot == tail || strcmp(dot, ".weight") != 0) goto not_lora;
    }
    size_t ml = (size_t)(l - s);
    char module[LORA_MODULE_MAX];
    if (ml >= sizeof module) goto not_lora;
    memcpy(module, s, ml);
    module[ml] = 0;
    if (strcmp(module, "lm_head") == 0 || strcmp(module, "model.embed_tokens") == 0)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s': LoRA on '%s' is not supported "
                            "(embedding / lm_head targets are refused)", label, full, module);
    if (!starts(module, "model.layers.")) goto not_lora;
    const char *num = module + strlen("model.layers."), *e = num;
    int64_t L = 0;
    while (*e >= '0' && *e <= '9' && e - num < 9) L = L * 10 + (*e++ - '0');
    if (e == num || *e != '.' || (num[0] == '0' && e - num > 1)) goto not_lora;
    for (int p = 0; p < LORA_NPROJ; p++) {
        char want[64];
        snprintf(want, sizeof want, ".%s.%s", lora_proj_block((lora_proj)p), proj_names[p]);
        if (strcmp(e, want) == 0) {
            if (L >= base->num_hidden_layers)
                return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': layer %lld, the base model has %d layers",
                                    label, full, (long long)L, base->num_hidden_layers);
            *layer = (int32_t)L;
            *proj = (lora_proj)p;
            return 0;
        }
    }
not_lora:
    return pg_error_set(err, PG_EUNSUPPORTED, "%s: tensor '%s' is not the lora_A / lora_B weight of a "
                        "q/k/v/o/gate/up/down projection (only those are supported)", label, full);
}

static void shape_str(char *buf, size_t cap, const st_tensor *t)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int fill(lora_weights *w, bool is_a, const st_tensor *t, const char *label, pg_error *err)
{
    const int64_t want0 = is_a ? w->r : w->out, want1 = is_a ? w->in : w->r;
    if (t->ndim != 2 || t->shape[0] != want0 || t->shape[1] != want1) {
        char got[160];
        shape_str(got, sizeof got, t);
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected [%lld,%lld] (%s), got %s", label,
                            t->name, (long long)want0, (long long)want1,
                            is_a ? "[r, in_features]" : "[out_features, r]", got);
    }
    if (!st_dtype_is_float_weight(t->dtype))
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': dtype %s, expected F32, F16 or BF16", label,
                            t->name, st_dtype_name(t->dtype));
    float **dst = is_a ? &w->A : &w->B;
    if (*dst)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': a second %s for this module (with and without "
                            "the adapter name?)", label, t->name, is_a ? "lora_A" : "lora_B");
    size_t n = (size_t)want0 * (size_t)want1;
    *dst = malloc(n * sizeof(float));
    if (!*dst) return pg_error_set(err, PG_ENOMEM, "%s: tensor '%s': out of memory", label, t->name);
    pg_convert_to_f32(*dst, t->data, t->dtype, n);
    return 0;
}

static int build(lora_adapter *a, const lora_config *c, const char *clabel, const st_tensor *ts, size_t nt,
                 const char *label, const llama_config *base, pg_error *err)
{
    snprintf(a->base_model_name_or_path, sizeof a->base_model_name_or_path, "%s", c->base_model_name_or_path);
    a->r = c->r;
    a->lora_alpha = c->lora_alpha;
    a->use_rslora = c->use_rslora;
    a->n_layers = base->num_hidden_layers;
    /* PEFT's all-linear leaves out the output embedding; a list or regex
     * that selects lm_head or the input embedding is refused */
    if (!c->targets_all_linear) {
        static const char *const emb[] = {"lm_head", "model.embed_tokens"};
        for (int k = 0; k < 2; k++)
            if (lora_config_targets(c, emb[k]))
                return pg_error_set(err, PG_EUNSUPPORTED, "%s: 'target_modules' selects '%s': embedding / "
                                    "lm_head targets are not supported", clabel, emb[k]);
    }
    a->w = calloc((size_t)a->n_layers * LORA_NPROJ, sizeof *a->w);
    if (!a->w) return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    for (int32_t l = 0; l < a->n_layers; l++)
        for (int p = 0; p < LORA_NPROJ; p++) {
            char module[LORA_MODULE_MAX];
            snprintf(module, sizeof module, "model.layers.%d.%s.%s", l, lora_proj_block((lora_proj)p),
                     proj_names[p]);
            if (!lora_config_targets(c, module)) continue;
            lora_weights *w = &a->w[(size_t)l * LORA_NPROJ + (size_t)p];
            double alpha;
            lora_config_rank_alpha(c, module, &w->r, &alpha);
            w->scale = (float)lora_config_scale(c, w->r, alpha);
            lora_proj_dims(base, (lora_proj)p, &w->in, &w->out);
            a->n_adapted++;
            if (w->r > a->max_rank) a->max_rank = w->r;
        }
    if (a->n_adapted == 0)
        return pg_error_set(err, PG_EFORMAT, "%s: 'target_modules' selects none of the base model's "
                            "q/k/v/o/gate/up/down projections", clabel);
    for (size_t k = 0; k < nt; k++) {
        const st_tensor *t = &ts[k];
        int32_t l = 0;
        lora_proj p = LORA_Q;
        bool is_a = false;
        int rc = parse_name(t->name, base, &l, &p, &is_a, label, err);
        if (rc) return rc;
        lora_weights *w = &a->w[(size_t)l * LORA_NPROJ + (size_t)p];
        if (w->r == 0)
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': module model.layers.%d.%s.%s is not "
                                "selected by adapter_config.json (target_modules / layers_to_transform / "
                                "exclude_modules)", label, t->name, l, lora_proj_block(p), proj_names[p]);
        if ((rc = fill(w, is_a, t, label, err))) return rc;
    }
    for (int32_t l = 0; l < a->n_layers; l++)
        for (int p = 0; p < LORA_NPROJ; p++) {
            const lora_weights *w = &a->w[(size_t)l * LORA_NPROJ + (size_t)p];
            if (w->r && (!w->A || !w->B))
                return pg_error_set(err, PG_EFORMAT, "%s: tensor 'base_model.model.model.layers.%d.%s.%s.%s."
                                    "weight' not found (the config selects this module)", label, l,
                                    lora_proj_block((lora_proj)p), proj_names[p], w->A ? "lora_B" : "lora_A");
        }
    return 0;
}

int lora_adapter_build(lora_adapter **out, const char *config_json, size_t config_len,
                       const char *config_label, const st_tensor *tensors, size_t n_tensors,
                       const char *tensors_label, const llama_config *base, pg_error *err)
{
    *out = NULL;
    const char *label = tensors_label;
    lora_config c;
    int rc = lora_config_parse(&c, config_json, config_len, config_label, err);
    if (rc) return rc;
    lora_adapter *a = calloc(1, sizeof *a);
    if (!a) {
        lora_config_free(&c);
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    }
    rc = build(a, &c, config_label, tensors, n_tensors, tensors_label, base, err);
    lora_config_free(&c);
    if (rc) {
        lora_adapter_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int lora_adapter_load(lora_adapter **out, const char *dir, const llama_config *base, pg_error *err)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/new_embeddings.safetensors", dir);
    if (exists(path))
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: adapters with added tokens are not supported", path);
    snprintf(path, sizeof path, "%s/added_tokens.json", dir);
    if (exists(path)) {
        char *txt = NULL;
        size_t len = 0;
        int rc = pg_read_file(path, LORA_CONFIG_MAX_BYTES, &txt, &len, err);
        if (rc) return rc;
        json_doc d;
        rc = json_parse(&d, txt, len, path, err);
        bool added = !rc && (!json_is_object(&d, 0) || json_size(&d, 0) > 0);
        if (!rc) json_doc_free(&d);
        free(txt);
        if (rc) return rc;
        if (added)
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: adapters with added tokens are not supported", path);
    }
    char st_path[4096];
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    if (!exists(st_path)) {
        snprintf(path, sizeof path, "%s/adapter_model.bin", dir);
        if (exists(path))
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: pickled adapters are not read; save the adapter with "
                                "safe_serialization (adapter_model.safetensors)", path);
        return pg_error_set(err, PG_EIO, "%s: not found", st_path);
    }
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *cfg = NULL;
    size_t cfg_len = 0;
    int rc = pg_read_file(path, LORA_CONFIG_MAX_BYTES, &cfg, &cfg_len, err);
    if (rc) return rc;
    st_file *f = NULL;
    rc = st_open(&f, st_path, err);
    if (rc) {
        free(cfg);
        return rc;
    }
    size_t n = st_count(f);
    st_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    if (!ts) {
        rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", st_path);
    } else {
        for (size_t k = 0; k < n; k++) ts[k] = *st_at(f, k);
        rc = lora_adapter_build(out, cfg, cfg_len, path, ts, n, st_path, base, err);
    }
    free(ts);
    st_close(f);
    free(cfg);
    return rc;
}
