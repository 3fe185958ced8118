/* lora_config: a PEFT adapter_config.json (LoRA) as plain data, and PEFT's
 * rules for which module a key selects (target_modules, exclude_modules,
 * layers_to_transform / layers_pattern, rank_pattern / alpha_pattern).
 * Knows nothing about tensors (lora_adapter.h reads those).
 *
 * The rules are PEFT's (huggingface/peft 5d602fdb, v0.20.0-47):
 * tuners_utils.py check_target_module_exists, utils/other.py
 * match_target_against_key (re.fullmatch) and get_pattern_key
 * (re.match(rf"(.*\.)?({key})$")), tuners/lora/layer.py update_layer
 * (scale alpha / r, or alpha / sqrt(r) with use_rslora). Python regexes run
 * on PCRE2 (UTF + UCP), which agrees with Python's `re` on the syntax these
 * files use (alternation, classes, quantifiers, groups). weights/README.md
 * lists every key and refusal. */
#ifndef PG_LORA_CONFIG_H
#define PG_LORA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

#define LORA_MAX_RANK 4096          /* r's range (and every rank_pattern value) */
#define LORA_MAX_LIST 4096          /* entries of any list or pattern dict */

/* One rank_pattern / alpha_pattern entry, in the file's order (PEFT takes
 * the first key that matches). */
typedef struct lora_pattern {
    char *key;        /* owned */
    void *re;         /* owned pcre2_code: ^(.*\.)?(key)$ */
    double value;     /* r (an integer) or alpha */
} lora_pattern;

typedef struct lora_config {
    int32_t r;                 /* default 8 */
    double lora_alpha;         /* default 8 */
    bool use_rslora;           /* scale alpha / sqrt(r) instead of alpha / r */
    bool fan_in_fan_out;       /* read; PEFT resets it to false on nn.Linear (all ours) */
    char base_model_name_or_path[512]; /* for printing only; "" when absent */

    /* target_modules: a list (a module matches an entry when its name equals
     * it or ends with "." + it) or one string (a regex that must fullmatch the
     * name; "all-linear", any case, is every projection of ours) */
    bool targets_is_regex, targets_all_linear;
    char **targets; int32_t n_targets;  /* the list (owned) */
    void *targets_re;                   /* the regex (owned pcre2_code) */
    /* exclude_modules: same two forms; an excluded module is never adapted */
    bool exclude_is_regex;
    char **excludes; int32_t n_excludes;
    void *exclude_re;

    lora_pattern *rank_pattern; int32_t n_rank_pattern;
    lora_pattern *alpha_pattern; int32_t n_alpha_pattern;

    /* layers_to_transform (an int or a list) and layers_pattern (a string or
     * a list): only for list targets, only for non-exact matches (PEFT) */
    int64_t *layers; int32_t n_layers; bool has_layers;
    void **layers_re; int32_t n_layers_re; /* .*?\.{pattern}\.(\d+)\. each */
} lora_config;

/* Parses adapter_config.json text (pure; `label` names the file). Refuses,
 * naming the key: peft_type other than LORA; target_modules absent or null
 * (PEFT would fill in a per-architecture default); use_dora,
 * modules_to_save, lora_bias, trainable_token_indices (added tokens),
 * target_parameters, layer_replication, alora_invocation_tokens,
 * use_qalora, use_bdlora / arrow_config / velora_config / kasa_config /
 * monteclora_config set; bias other than "none"; a regex that does not
 * compile; layers_to_transform or layers_pattern with a regex
 * target_modules, layers_pattern without layers_to_transform (PEFT's
 * LoraConfig.__post_init__). On error *out is zeroed (nothing to free). */
int lora_config_parse(lora_config *out, const char *json, size_t len, const char *label,
                      pg_error *err);
void lora_config_free(lora_config *c); /* accepts a zeroed one */

/* Whether PEFT adapts the module named `module` ("model.layers.3.self_attn.q_proj",
 * the name in the base model, without "base_model.model."): 1 yes, 0 no. */
int lora_config_targets(const lora_config *c, const char *module);

/* The rank and alpha PEFT gives `module` (rank_pattern / alpha_pattern
 * first matching key, else r / lora_alpha), and the scale s. */
void lora_config_rank_alpha(const lora_config *c, const char *module, int32_t *r, double *alpha);
double lora_config_scale(const lora_config *c, int32_t r, double alpha);

#endif /* PG_LORA_CONFIG_H */
