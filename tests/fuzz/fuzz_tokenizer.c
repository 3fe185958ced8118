/* fuzz_tokenizer: the tokenizer loader, encoder, decoder and stream.
 *
 * An input that starts with '{' is a tokenizer.json (optionally followed by
 * a NUL and a tokenizer_config.json) for tok_load_from_memory; when it loads,
 * a fixed text is encoded with it. Any other input is text for two fixed
 * small tokenizers (SentencePiece flavour with byte fallback; byte-level
 * with the Llama-3 Split regex): encode (invalid UTF-8 must be an error, not
 * a crash), decode the ids, and read the input's bytes as ids for decode and
 * the incremental decoder (whose output must be whole UTF-8 characters). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sp_json[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true},"
    "{\"id\":11,\"content\":\"<X>\",\"special\":false,\"lstrip\":true,\"rstrip\":true,"
    "\"single_word\":true,\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
    "\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{"
    "\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
    "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":"
    "\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"<0xF0>\":5,\"<0x9F>\":6,"
    "\"\\u2581\":7,\"a\":8,\"b\":9,\"\\u2581a\":10,\"ab\":12,\"\\u2581ab\":13},"
    "\"merges\":[\"a b\",[\"\\u2581\",\"ab\"],\"\\u2581 a\"]}}";

static const char bl_json[] =
    "{\"added_tokens\":[{\"id\":9,\"content\":\"<|eot|>\",\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
    "{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|"
    " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"\\u00c3\":0,\"\\u00a9\":1,"
    "\"\\u0120\":2,\"h\":3,\"i\":4,\"\\u0120h\":5,\"\\u0120hi\":6,\"\\u00f0\":7,\"\\u00ff\":8},"
    "\"merges\":[\"\\u0120 h\",\"\\u0120h i\"]}}";

static bool whole_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (i + k > n)
            return false;
        i += k;
    }
    return true;
}

static void exercise(tokenizer *t, const uint8_t *data, size_t size)
{
    int32_t *ids = NULL;
    size_t n = 0;
    pg_error err;
    if (tok_encode(t, (const char *)data, size, (size & 1) != 0, &ids, &n, &err) == 0) {
        char *text;
        size_t tl;
        if (tok_decode(t, ids, n, false, &text, &tl, &err) == 0)
            free(text);
        free(ids);
    }
    /* the bytes as ids (mostly in range, some not) */
    int32_t V = tok_vocab_size(t);
    size_t m = size < 512 ? size : 512;
    int32_t *raw = malloc((m + 1) * sizeof *raw);
    if (!raw)
        return;
    for (size_t i = 0; i < m; i++)
        raw[i] = (int32_t)(data[i] % (unsigned)(V + 2)) - 1;
    char *text;
    size_t tl;
    if (tok_decode_ex(t, raw, m, TOK_DECODE_SKIP_SPECIAL | TOK_DECODE_CLEANUP, &text, &tl, &err) == 0)
        free(text);
    tok_stream *s;
    size_t np = m / 3;
    if (tok_stream_create(&s, t, (size & 2) != 0, raw, np, &err) == 0) {
        const char *p;
        size_t k;
        for (size_t i = np; i < m; i++)
            if (tok_stream_push(s, raw[i], &p, &k, &err) == 0 &&
                !whole_utf8((const unsigned char *)p, k))
                abort(); /* never half a character */
        if (tok_stream_finish(s, &p, &k, &err) == 0 && !whole_utf8((const unsigned char *)p, k))
            abort();
        tok_stream_free(s);
    }
    free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pg_error err;
    tokenizer *t = NULL;
    if (size > 0 && data[0] == '{') {
        const uint8_t *nul = memchr(data, 0, size);
        size_t jl = nul ? (size_t)(nul - data) : size;
        const char *cj = nul ? (const char *)nul + 1 : NULL;
        size_t cl = nul ? size - jl - 1 : 0;
        if (tok_load_from_memory(&t, (const char *)data, jl, cj, cl, "fuzz", &err) == 0) {
            static const uint8_t text[] = "Hello, world! 1234 caf\xC3\xA9 <s> \xF0\x9F\x99\x82";
            exercise(t, text, sizeof text - 1);
            tok_free(t);
        }
        return 0;
    }
    if (tok_load_from_memory(&t, sp_json, sizeof sp_json - 1, NULL, 0, "sp", &err) == 0) {
        exercise(t, data, size);
        tok_free(t);
    } else {
        abort(); /* the fixed tokenizer must load */
    }
    if (tok_load_from_memory(&t, bl_json, sizeof bl_json - 1, NULL, 0, "bl", &err) == 0) {
        exercise(t, data, size);
        tok_free(t);
    } else {
        abort();
    }
    return 0;
}
