/* rope_table: see rope_table.h. */
#include "rope_table.h"

#include <math.h>

/* 2π as the f32 that torch gets from `2 * math.pi` in a float32 expression. */
#define ROPE_TWO_PI_F 6.28318530717958647692f

int rope_inv_freq(float *inv_freq, int32_t head_dim, float theta,
                  const llama_rope_scaling *scaling, pg_error *err)
{
    if (head_dim <= 0 || head_dim % 2 != 0)
        return pg_error_set(err, PG_EINVAL, "rope: head_dim must be even and > 0, got %d",
                            (int)head_dim);
    if (!(theta > 0.0f) || !isfinite(theta))
        return pg_error_set(err, PG_EINVAL, "rope: rope_theta must be > 0, got %g",
                            (double)theta);
    llama_rope_scaling_type type = scaling ? scaling->type : LLAMA_ROPE_NONE;
    if (type != LLAMA_ROPE_NONE && type != LLAMA_ROPE_LINEAR && type != LLAMA_ROPE_LLAMA3)
        return pg_error_set(err, PG_EUNSUPPORTED, "rope: unknown rope_scaling type %d",
                            (int)type);
    if (type != LLAMA_ROPE_NONE && (!(scaling->factor > 0.0f) || !isfinite(scaling->factor)))
        return pg_error_set(err, PG_EINVAL, "rope: rope_scaling.factor must be > 0, got %g",
                            (double)scaling->factor);
    if (type == LLAMA_ROPE_LLAMA3) {
        if (!(scaling->low_freq_factor < scaling->high_freq_factor) ||
            !(scaling->low_freq_factor > 0.0f))
            return pg_error_set(err, PG_EINVAL,
                                "rope: llama3 scaling needs 0 < low_freq_factor < "
                                "high_freq_factor, got %g and %g",
                                (double)scaling->low_freq_factor,
                                (double)scaling->high_freq_factor);
        if (scaling->original_max_position_embeddings <= 0)
            return pg_error_set(err, PG_EINVAL,
                                "rope: llama3 scaling needs original_max_position_embeddings "
                                "> 0, got %d", (int)scaling->original_max_position_embeddings);
    }

    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        /* HF: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), float32;
         * llama2.c run.c: 1.0f / powf(10000.0f, head_dim / (float)head_size)
         * with its head_dim = 2i. Same f32 expression, same bits. */
        float f = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        if (type == LLAMA_ROPE_LINEAR) {
            /* _compute_linear_scaling_rope_parameters: inv_freq /= factor */
            f /= scaling->factor;
        } else if (type == LLAMA_ROPE_LLAMA3) {
            /* _compute_llama3_parameters */
            float old_ctx = (float)scaling->original_max_position_embeddings;
            float low_freq_wavelen = old_ctx / scaling->low_freq_factor;
            float high_freq_wavelen = old_ctx / scaling->high_freq_factor;
            float wavelen = ROPE_TWO_PI_F / f;
            if (wavelen < high_freq_wavelen) {
                /* high frequency: unchanged */
            } else if (wavelen > low_freq_wavelen) {
                f = f / scaling->factor;
            } else {
                float smooth = (old_ctx / wavelen - scaling->low_freq_factor) /
                               (scaling->high_freq_factor - scaling->low_freq_factor);
                f = (1.0f - smooth) * f / scaling->factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
    return PG_OK;
}
