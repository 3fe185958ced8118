/* sampling_params: vLLM's SamplingParams defaults and range checks
 * (vllm/sampling_params.py, SamplingParams._verify_args). */
#include "sampling_params.h"

#include <math.h>

static int beam_params_validate(const sampling_params *p, pg_error *err);

sampling_params sampling_params_default(void)
{
    sampling_params p = {
        .n = 1,
        .max_tokens = 16,
        .min_tokens = 0,
        .temperature = 1.0f,
        .top_p = 1.0f,
        .top_k = -1,
        .min_p = 0.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .repetition_penalty = 1.0f,
        .seed = 0,
        .ignore_eos = false,
        .stop_token_ids = NULL, .n_stop_token_ids = 0,
        .stop = NULL, .n_stop = 0,
        .include_stop_str_in_output = false,
        .skip_special_tokens = true,
        .logprobs = -1,
        .prompt_logprobs = -1,
        .structured_kind = GRAMMAR_NONE,
        .structured = NULL, .structured_len = 0,
        .use_beam_search = false,
        .length_penalty = 1.0,
    };
    return p;
}

int sampling_params_validate(const sampling_params *p, pg_error *err)
{
    if (!p)
        return pg_error_set(err, PG_EINVAL, "sampling params: expected a pointer, got NULL");
    if (p->lora < 0)
        return pg_error_set(err, PG_EINVAL, "lora must be >= 0 (0: the base model), got %d", (int)p->lora);
    if (p->n < 1 || p->n > SAMPLING_PARAMS_MAX_N)
        return pg_error_set(err, PG_EINVAL, "n must be in [1, %d], got %d",
                            SAMPLING_PARAMS_MAX_N, (int)p->n);
    if (p->max_tokens < 1 && p->max_tokens != -1)
        return pg_error_set(err, PG_EINVAL, "max_tokens must be at least 1 (or -1 for no limit), got %d",
                            (int)p->max_tokens);
    if (p->min_tokens < 0)
        return pg_error_set(err, PG_EINVAL, "min_tokens must be greater than or equal to 0, got %d",
                            (int)p->min_tokens);
    if (p->max_tokens != -1 && p->min_tokens > p->max_tokens)
        return pg_error_set(err, PG_EINVAL,
                            "min_tokens must be less than or equal to max_tokens=%d, got %d",
                            (int)p->max_tokens, (int)p->min_tokens);
    /* !(x >= 0) also rejects NaN */
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return pg_error_set(err, PG_EINVAL, "temperature must be non-negative and finite, got %g",
                            (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return pg_error_set(err, PG_EINVAL, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (p->top_k < -1)
        return pg_error_set(err, PG_EINVAL, "top_k must be -1 or 0 (disable), or at least 1, got %d",
                            (int)p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return pg_error_set(err, PG_EINVAL, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return pg_error_set(err, PG_EINVAL, "presence_penalty must be in [-2, 2], got %g",
                            (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return pg_error_set(err, PG_EINVAL, "frequency_penalty must be in [-2, 2], got %g",
                            (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return pg_error_set(err, PG_EINVAL, "repetition_penalty must be greater than zero, got %g",
                            (double)p->repetition_penalty);
    if (p->prompt_logprobs_from < 0)
        return pg_error_set(err, PG_EINVAL, "prompt_logprobs_from must be >= 0, got %d",
                            (int)p->prompt_logprobs_from);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > SAMPLING_PARAMS_MAX_LOGPROBS)
        return pg_error_set(err, PG_EINVAL, "prompt_logprobs must be -1 (none) or in [0, %d], got %d",
                            SAMPLING_PARAMS_MAX_LOGPROBS, (int)p->prompt_logprobs);
    if (p->logprobs < -1 || p->logprobs > SAMPLING_PARAMS_MAX_LOGPROBS)
        return pg_error_set(err, PG_EINVAL, "logprobs must be -1 (none) or in [0, %d], got %d",
                            SAMPLING_PARAMS_MAX_LOGPROBS, (int)p->logprobs);
    if (p->n_stop_token_ids > 0 && !p->stop_token_ids)
        return pg_error_set(err, PG_EINVAL, "stop_token_ids: expected %zu ids, got NULL",
                            p->n_stop_token_ids);
    for (size_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0)
            return pg_error_set(err, PG_EINVAL, "stop_token_ids[%zu] must be non-negative, got %d",
                                i, (int)p->stop_token_ids[i]);
    if (p->n_stop > 0 && !p->stop)
        return pg_error_set(err, PG_EINVAL, "stop: expected %zu strings, got NULL", p->n_stop);
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || p->stop[i][0] == '\0')
            return pg_error_set(err, PG_EINVAL, "stop[%zu] must be a non-empty string, got %s",
                                i, p->stop[i] ? "\"\"" : "NULL");
    if (p->structured_kind < GRAMMAR_NONE || p->structured_kind > GRAMMAR_CHOICE)
        return pg_error_set(err, PG_EINVAL, "structured outputs: unknown constraint kind %d",
                            (int)p->structured_kind);
    if (p->structured_kind != GRAMMAR_NONE && p->structured_kind != GRAMMAR_JSON_OBJECT &&
        !p->structured)
        return pg_error_set(err, PG_EINVAL, "structured outputs: expected the constraint text, got NULL");
    if (p->use_beam_search) return beam_params_validate(p, err);
    return PG_OK;
}

/* Beam search takes vLLM's BeamSearchParams only (beam_width = n,
 * max_tokens, ignore_eos, temperature, length_penalty,
 * include_stop_str_in_output): vllm/entrypoints/openai/protocol.py
 * to_beam_search_params drops every other field, so here a line that
 * sets one is refused by name rather than silently run without it. */
static int beam_params_validate(const sampling_params *p, pg_error *err)
{
    const char *bad = NULL;
    if (p->n > SAMPLING_PARAMS_MAX_BEAM)
        return pg_error_set(err, PG_EINVAL, "beam search: n (the beam width) must be in [1, %d] "
                            "(2 * n logprobs a step, at most %d), got %d", SAMPLING_PARAMS_MAX_BEAM,
                            SAMPLING_PARAMS_MAX_LOGPROBS, (int)p->n);
    if (!isfinite(p->length_penalty))
        return pg_error_set(err, PG_EINVAL, "beam search: length_penalty must be finite, got %g",
                            p->length_penalty);
    if (p->temperature >= 1e-5f)
        return pg_error_set(err, PG_EINVAL, "beam search: temperature %g is not supported (only 0: "
                            "vLLM adds the token it samples at temperature > 0 to the candidates)",
                            (double)p->temperature);
    if (p->n_stop > 0) bad = "stop";
    else if (p->n_stop_token_ids > 0) bad = "stop_token_ids";
    else if (p->min_tokens > 0) bad = "min_tokens";
    else if (p->logprobs >= 0) bad = "logprobs";
    else if (p->prompt_logprobs >= 0) bad = "prompt_logprobs";
    else if (p->presence_penalty != 0.0f) bad = "presence_penalty";
    else if (p->frequency_penalty != 0.0f) bad = "frequency_penalty";
    else if (p->repetition_penalty != 1.0f) bad = "repetition_penalty";
    else if (p->top_p != 1.0f) bad = "top_p";
    else if (p->top_k > 0) bad = "top_k";
    else if (p->min_p != 0.0f) bad = "min_p";
    else if (p->structured_kind != GRAMMAR_NONE) bad = "structured outputs";
    if (bad)
        return pg_error_set(err, PG_EINVAL, "beam search: %s is not supported (vLLM's beam search "
                            "ignores it)", bad);
    return PG_OK;
}
