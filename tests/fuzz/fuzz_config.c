/* fuzz_config: llama_config_parse (and merge_generation on top) over
 * arbitrary text. What is accepted must hold the documented invariants. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llama_config c;
    pg_error err;
    const char *text = (const char *)data;
    if (llama_config_parse(&c, text, size, "config.json", &err) != PG_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
        c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim <= 0 || c.head_dim % 2 != 0 ||
        c.vocab_size <= 0 || c.n_eos_token_ids < 0 || c.n_eos_token_ids > LLAMA_MAX_EOS ||
        !(c.rms_norm_eps > 0.0f) || !(c.rope_theta > 0.0f) || memchr(c.architecture, '\0', sizeof c.architecture) == NULL)
        abort();
    for (int i = 0; i < c.n_eos_token_ids; i++)
        if (c.eos_token_ids[i] < 0 || c.eos_token_ids[i] >= c.vocab_size)
            abort();
    /* the same text as a generation_config: all or nothing */
    llama_config before = c;
    if (llama_config_merge_generation(&c, text, size, "generation_config.json", &err) != PG_OK &&
        memcmp(&c, &before, sizeof c) != 0)
        abort();
    if (c.n_eos_token_ids > LLAMA_MAX_EOS)
        abort();
    return 0;
}
