/* embed_prepare: an embedding line's pooling and token ids (see
 * embed_prepare.h). */
#include "embed_prepare.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

void cli_embed_default_pooling(cli_pooling flag, const st_pooling_config *stp, pooling_params *out,
                               const char **source)
{
    *out = (pooling_params){.type = POOLING_LAST, .normalize = true};
    *source = "vLLM's default: no sentence-transformers pooling config";
    if (stp->mode != ST_POOL_NONE) {
        out->type = stp->mode == ST_POOL_MEAN ? POOLING_MEAN : stp->mode == ST_POOL_CLS ? POOLING_CLS : POOLING_LAST;
        out->normalize = stp->normalize;
        *source = "modules.json";
    }
    if (flag != CLI_POOLING_AUTO) {
        out->type = flag == CLI_POOLING_MEAN ? POOLING_MEAN : flag == CLI_POOLING_CLS ? POOLING_CLS : POOLING_LAST;
        *source = "--pooling";
    }
}

const char *cli_embed_line_params(const cli_embed *em, const pooling_params *base,
                                  const st_pooling_config *stp, int32_t hidden_size, const char *model_name,
                                  pooling_params *out, char *msg, size_t cap)
{
    *out = *base;
    if (em->normalize >= 0)
        out->normalize = em->normalize != 0;
    if (em->dimensions <= 0)
        return NULL;
    if (!stp->is_matryoshka) {
        snprintf(msg, cap, "Model \"%s\" does not support matryoshka representation, changing output "
                 "dimensions will lead to poor results.", model_name);
        return msg;
    }
    if (stp->n_matryoshka_dims > 0) {
        bool ok = false;
        for (int32_t k = 0; k < stp->n_matryoshka_dims; k++)
            ok |= stp->matryoshka_dims[k] == em->dimensions;
        if (!ok) {
            int n = snprintf(msg, cap, "Model \"%s\" only supports [", model_name);
            for (int32_t k = 0; k < stp->n_matryoshka_dims && n > 0 && (size_t)n < cap; k++)
                n += snprintf(msg + n, cap - (size_t)n, "%s%d", k ? ", " : "", (int)stp->matryoshka_dims[k]);
            if (n > 0 && (size_t)n < cap)
                snprintf(msg + n, cap - (size_t)n, "] matryoshka dimensions, use other output dimensions will "
                         "lead to poor results.");
            return msg;
        }
    }
    if (em->dimensions > hidden_size) {
        snprintf(msg, cap, "dimensions %d exceeds the model's hidden size %d", (int)em->dimensions,
                 (int)hidden_size);
        return msg;
    }
    out->dimensions = em->dimensions;
    return NULL;
}

int cli_embed_input_ids(const cli_embed *em, int32_t k, const tokenizer *tok, int32_t vocab_size,
                        int32_t max_model_len, int32_t **ids, int32_t *n, pg_error *err)
{
    *ids = NULL;
    *n = 0;
    if (em->ids[k]) {
        for (int32_t j = 0; j < em->n_ids[k]; j++)
            if (em->ids[k][j] >= vocab_size)
                return pg_error_set(err, PG_EINVAL, "input[%d]: token id %d is outside the vocabulary (size %d)",
                                    (int)k, (int)em->ids[k][j], (int)vocab_size);
        if (!(*ids = malloc((size_t)em->n_ids[k] * sizeof **ids)))
            return pg_error_set(err, PG_ENOMEM, "out of memory");
        memcpy(*ids, em->ids[k], (size_t)em->n_ids[k] * sizeof **ids);
        *n = em->n_ids[k];
    } else {
        if (!tok)
            return pg_error_set(err, PG_EINVAL,
                                "a text input needs a tokenizer (give --tokenizer DIR, or token ids)");
        size_t nn = 0;
        pg_error e;
        if (tok_encode(tok, em->texts[k], em->text_lens[k], em->add_special_tokens, ids, &nn, &e) != PG_OK)
            return pg_error_set(err, PG_EINVAL, "input[%d]: %s", (int)k, e.msg);
        *n = (int32_t)nn;
    }
    if (*n < 1 || *n >= max_model_len) {
        int32_t got = *n;
        free(*ids);
        *ids = NULL;
        *n = 0;
        return pg_error_set(err, PG_EINVAL, "input[%d] is %s: %d tokens, but max_model_len is %d", (int)k,
                            got < 1 ? "empty" : "too long", (int)got, (int)max_model_len);
    }
    return PG_OK;
}
