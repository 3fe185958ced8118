/* fuzz_grammar: grammar_compile over arbitrary bytes (the first byte picks
 * the kind: JSON schema, regex or choice), then masks along a walk over a
 * small fixed vocabulary: every masked-in token must advance the state, the
 * mask must equal feeding each token's bytes (the brute-force reference),
 * and the cached mask must equal the walk. Budgeted ends: bytes_to_end is
 * 0 exactly where the text can end, no token lowers it by more than its
 * length, and grammar_mask_budget keeps exactly the tokens that fit a
 * budget taken from the input (or, when none fits and the text cannot end,
 * the closest ones). Compile limits keep each input bounded in time and memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const vocab_text[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\"a", "a\"", "\\", "\\\"", "\\u00", "0", "1", "9", "-",
    ".", "e", "true", "false", "null", "nu", "ll", " ", "a", "b", "ab", "z", "\xc3\xa9", "\xc3",
    "\xa9", "\xe2\x82", "\xac", "{\"", "\":", "\",\"", "x", "yes", "no", "T", "Z", "+",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    static const grammar_kind kinds[] = {GRAMMAR_JSON_SCHEMA, GRAMMAR_REGEX, GRAMMAR_CHOICE,
                                         GRAMMAR_JSON_OBJECT};
    grammar_kind kind = kinds[data[0] % 4];
    grammar *g = NULL;
    if (grammar_compile(&g, kind, (const char *)data + 1, size - 1, NULL) != PG_OK) {
        if (g)
            abort();
        return 0;
    }
    enum { NV = sizeof vocab_text / sizeof vocab_text[0] };
    const char *bytes[NV];
    uint32_t lens[NV];
    for (int i = 0; i < NV; i++) {
        bytes[i] = vocab_text[i];
        lens[i] = (uint32_t)strlen(vocab_text[i]);
    }
    grammar_vocab *v = NULL;
    if (grammar_vocab_create(&v, NV, bytes, lens, NULL) != PG_OK)
        abort();
    grammar_cache *cache = NULL;
    if (grammar_cache_create(&cache, g, v, 1 << 16, NULL) != PG_OK)
        abort();
    uint64_t mask[1], cmask[1];
    grammar_state st;
    grammar_state_init(g, &st);
    for (int step = 0; step < 64; step++) {
        int32_t cnt = grammar_mask(g, v, &st, mask);
        if (cnt < 0 || grammar_mask_cached(cache, &st, cmask) != cnt || cmask[0] != mask[0])
            abort();
        int32_t pick = -1, seen = 0;
        for (int i = 0; i < NV; i++) {
            grammar_state t = st;
            bool ref = grammar_advance(g, &t, (const uint8_t *)bytes[i], lens[i]);
            if (ref != (bool)((mask[0] >> i) & 1))
                abort();
            if (ref && seen++ == (int32_t)(data[step % size] % (cnt ? cnt : 1)))
                pick = i;
        }
        if (seen != cnt)
            abort();
        /* budgeted ends against the brute force */
        bool can_end = grammar_can_end(g, &st);
        int32_t d = grammar_bytes_to_end(g, &st);
        if (d >= 0) {
            if (d == INT32_MAX || (d == 0) != can_end)
                abort();
            int32_t budget = (int32_t)(data[(step * 7 + 3) % size] % 24) - 2;
            int32_t after[NV], best = INT32_MAX;
            bool any_fit = false;
            for (int i = 0; i < NV; i++) {
                after[i] = INT32_MAX;
                if (!((mask[0] >> i) & 1))
                    continue;
                grammar_state t = st;
                if (!grammar_advance(g, &t, (const uint8_t *)bytes[i], lens[i]))
                    abort();
                after[i] = grammar_bytes_to_end(g, &t);
                if (after[i] < 0 || after[i] == INT32_MAX || after[i] < d - (int32_t)lens[i])
                    abort();
                any_fit |= after[i] <= budget;
                if (after[i] < best)
                    best = after[i];
            }
            uint64_t bmask[1] = {mask[0]};
            int32_t limit = any_fit || can_end ? budget : best;
            int32_t bcnt = grammar_mask_budget(g, v, &st, bmask, budget, can_end), want = 0;
            for (int i = 0; i < NV; i++) {
                bool keep = ((mask[0] >> i) & 1) && after[i] <= limit;
                want += keep;
                if (keep != (bool)((bmask[0] >> i) & 1))
                    abort();
            }
            if (bcnt != want)
                abort();
        }
        if (pick < 0)
            break;
        if (!grammar_advance(g, &st, (const uint8_t *)bytes[pick], lens[pick]))
            abort();
    }
    (void)grammar_can_end(g, &st);
    grammar_cache_destroy(cache);
    grammar_vocab_destroy(v);
    grammar_destroy(g);
    return 0;
}
