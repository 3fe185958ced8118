/* rope_table: the RoPE inverse frequencies of a LLaMA config, with the
 * config's scaling folded in, as Hugging Face transformers computes them
 * (modeling_rope_utils.py: _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_llama3_parameters).
 * Pure functions, f32 arithmetic like the reference (torch float32 tensors;
 * llama2.c run.c's `1.0f / powf(10000.0f, head_dim / (float)head_size)`).
 *
 * The executor's rope op then rotates pair (i, i + hd/2) of every q and k
 * head by angle = position * inv_freq[i] (rotate_half convention).
 */
#ifndef PG_ROPE_TABLE_H
#define PG_ROPE_TABLE_H

#include <stdint.h>

#include "config.h"
#include "pg_error.h"

/* Fills inv_freq[head_dim / 2] (f32, host):
 *   default: inv_freq[i] = 1.0f / powf(theta, (float)(2i) / (float)head_dim)
 *   linear:  default / factor   (the same as dividing positions by factor)
 *   llama3:  per wavelength 2π / inv_freq: below original_max_position_embeddings
 *            / high_freq_factor kept, above .../low_freq_factor divided by
 *            factor, in between interpolated smoothly.
 * Refuses (PG_EINVAL, nothing written) an odd or non-positive head_dim, a
 * theta <= 0, a factor <= 0 and, for llama3, low_freq_factor >=
 * high_freq_factor or original_max_position_embeddings <= 0. scaling may be
 * NULL (no scaling). */
int rope_inv_freq(float *inv_freq, int32_t head_dim, float theta,
                  const llama_rope_scaling *scaling, pg_error *err);

#endif /* PG_ROPE_TABLE_H */
