/* sampling_params: how one request is decoded and when it stops (vLLM's
 * SamplingParams semantics and names). Plain data. The engine deep-copies
 * it at engine_add_request, so the caller keeps ownership of its arrays. */
#ifndef PG_SAMPLING_PARAMS_H
#define PG_SAMPLING_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "pg_error.h"

/* Caps that validate() enforces: n (parallel samples per request) and
 * logprobs (vLLM's default max_logprobs = 20). */
#define SAMPLING_PARAMS_MAX_N 64
#define SAMPLING_PARAMS_MAX_LOGPROBS 20
/* Beam width cap: vLLM's beam search asks for 2 * beam_width logprobs a
 * step, which its max_logprobs (20) bounds. */
#define SAMPLING_PARAMS_MAX_BEAM (SAMPLING_PARAMS_MAX_LOGPROBS / 2)

typedef struct sampling_params {
    int32_t n;                    /* [1, SAMPLING_PARAMS_MAX_N] parallel samples (share the prompt's blocks) */
    int32_t max_tokens;           /* >= 1; -1 = until the context (max_model_len) is full */
    int32_t min_tokens;           /* eos / stop tokens / stop strings blocked before this many */
    float temperature;            /* >= 0; < 1e-5 (vLLM's _SAMPLING_EPS) = greedy (ties -> lowest id) */
    float top_p;                  /* (0, 1] */
    int32_t top_k;                /* -1 or 0 = off, else >= 1 */
    float min_p;                  /* [0, 1] */
    float presence_penalty;       /* [-2, 2] */
    float frequency_penalty;      /* [-2, 2] */
    float repetition_penalty;     /* > 0, 1 = off (applies to prompt and output tokens) */
    uint64_t seed;                /* the request's RNG seed (the CLI fills it from --seed and
                                     the request index when a line gives none) */
    bool ignore_eos;
    const int32_t *stop_token_ids; size_t n_stop_token_ids;
    const char *const *stop;      size_t n_stop;   /* stop strings (UTF-8, NUL-terminated) */
    bool include_stop_str_in_output;
    bool skip_special_tokens;     /* for the output text (default true) */
    int32_t logprobs;             /* -1 = none; k in [0, 20]: the sampled token's logprob plus the top k */
    int32_t prompt_logprobs;      /* -1 = none; k in [0, 20]: each prompt token's logprob (from
                                     the raw logits of the positions before it) plus the top k.
                                     Such a request reads no prefix-cache hit (vLLM's
                                     skip_reading_prefix_cache) but on blocks wholly before
                                     position prompt_logprobs_from - 1, whose rows it does
                                     not need; its chunks return the logits of every scored
                                     position (engine forward_rows) */
    int32_t prompt_logprobs_from; /* >= 0, with prompt_logprobs: only prompt tokens p >= this
                                     get logprobs; the logits rows before are not computed and
                                     the entries stay empty (NaN, rank 0). 0 (default): all.
                                     `pagedgen perplexity` scores each window's second half */
    /* structured outputs (vLLM's StructuredOutputsParams): GRAMMAR_NONE, or
     * the kind of constraint and its text (grammar.h: a schema as JSON, a
     * regex, a JSON array of choices; none for json_object), copied and
     * compiled by engine_add_request */
    grammar_kind structured_kind;
    const char *structured;       size_t structured_len;
    /* beam search (vLLM's BeamSearchParams / the OpenAI bodies' use_beam_search:
     * core/beam_search.h): n is the beam width, in [1, SAMPLING_PARAMS_MAX_BEAM];
     * greedy temperature only; the fields vLLM's beam search ignores (stop
     * strings and ids, min_tokens, logprobs, prompt_logprobs, penalties,
     * top_p/top_k/min_p, structured outputs) are refused by name */
    bool use_beam_search;
    double length_penalty;        /* score = cum_logprob / seq_len^length_penalty; default 1 */
    /* the LoRA adapter the request runs under (vLLM's lora_request; issue 33):
     * 0 (default) the base model, k >= 1 the engine's adapter slot k - 1
     * (engine_params n_loras). Not a sampling parameter as such, but it
     * travels with the request the same way (fanned-out children copy it) */
    int32_t lora;
} sampling_params;

/* vLLM's defaults: n 1, max_tokens 16, temperature 1, top_p 1, top_k -1,
 * min_p 0, penalties off, skip_special_tokens true, logprobs -1. */
sampling_params sampling_params_default(void);

/* Checks ranges; the message names the field ("top_p must be in (0, 1], got 0"). */
int sampling_params_validate(const sampling_params *p, pg_error *err);

#endif /* PG_SAMPLING_PARAMS_H */
