/* fuzz_lora_config: PEFT adapter_config.json text through lora_config_parse
 * (lora_config.h), then PEFT's module rules on every module name of a
 * 3-layer Llama and a few others. What is accepted must hold the documented
 * ranges; a refusal must say why. (The tensors' side, lora_adapter_build,
 * is mutated in tests/weights/test_lora_adapter.c.) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const projs[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    lora_config c;
    pg_error err;
    err.msg[0] = '\0';
    if (lora_config_parse(&c, (const char *)data, size, "adapter_config.json", &err) != PG_OK) {
        if (err.msg[0] == '\0' || c.targets || c.rank_pattern || c.layers) abort();
        return 0;
    }
    if (c.r < 1 || c.r > LORA_MAX_RANK) abort();
    char name[128];
    for (int l = 0; l < 3; l++)
        for (int p = 0; p < 7; p++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, projs[p]);
            int t = lora_config_targets(&c, name);
            if (t != 0 && t != 1) abort();
            int32_t r;
            double alpha;
            lora_config_rank_alpha(&c, name, &r, &alpha);
            if (r < 1 || r > LORA_MAX_RANK) abort();
            (void)lora_config_scale(&c, r, alpha);
        }
    (void)lora_config_targets(&c, "lm_head");
    (void)lora_config_targets(&c, "model.embed_tokens");
    (void)lora_config_targets(&c, "model.layers.1.experts.2.w1");
    lora_config_free(&c);
    return 0;
}
