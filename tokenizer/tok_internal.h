/* tok_internal: the tokenizer's private data, shared by tokenizer.c and the
 * tok_*.c files (one pipeline stage per file). Nothing here is public API.
 *
 * Encoding follows Hugging Face tokenizers' pipeline:
 *   added-token split (raw text) -> normalizer per piece (Prepend/Replace/
 *   Strip, NFC & co. via utf8proc) -> added-token split
 *   (normalized tokens) -> pre-tokenizer (Sequence of Split/ByteLevel/
 *   Metaspace/Digits, run depth-first) -> BPE per word -> post-processor.
 * Every table is built at load; encode/decode only read them (a tokenizer
 * is immutable and thread-shareable; per-call scratch lives in tok_enc).
 */
#ifndef PG_TOK_INTERNAL_H
#define PG_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "json.h"
#include "pg_error.h"
#include "tokenizer.h"

/* ---- growable byte buffer (per call scratch) ---- */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;
bool tok_buf_reserve(tok_buf *b, size_t extra);
bool tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_free(tok_buf *b);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 prefix of s (strict: no overlongs, surrogates
 * or code points above U+10FFFF). */
size_t tok_utf8_valid_prefix(const unsigned char *s, size_t n);
/* Length in bytes of the char starting with lead byte c (1 for invalid). */
static inline size_t tok_utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
/* Decodes the (valid) char at s; *n receives its length. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t *n);
size_t tok_utf8_encode(char *out, uint32_t cp);
/* Unicode White_Space (what Rust's char::is_whitespace tests). */
bool tok_is_whitespace(uint32_t cp);

/* Incremental, lossy UTF-8 validation with "substitution of maximal
 * subparts" (Unicode ch. 3; what Rust's String::from_utf8_lossy and the
 * WHATWG TextDecoder do): bytes in, valid UTF-8 out, U+FFFD per maximal
 * invalid subpart. pend holds an unfinished sequence. */
typedef struct tok_utf8_lossy {
    unsigned char pend[4];
    int npend, need;
} tok_utf8_lossy;
/* Feeds one byte; appends what became final to out. */
bool tok_utf8_lossy_byte(tok_utf8_lossy *u, unsigned char c, tok_buf *out);
/* End of input: an unfinished sequence becomes one U+FFFD. */
bool tok_utf8_lossy_flush(tok_utf8_lossy *u, tok_buf *out);

/* ---- hashing ---- */
static inline uint64_t tok_hash_bytes(const void *p, size_t n)
{
    /* FNV-1a 64 with a final avalanche (fast enough for short pieces). */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}
static inline uint64_t tok_hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* merges hash slot: (left<<32|right) -> rank, new id (one cache line per probe) */
typedef struct tok_merge_slot {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
} tok_merge_slot;

/* ---- added tokens (tok_added.c) ---- */
typedef struct tok_added_token {
    int32_t id;
    char *content; /* owned, NUL-terminated; content_len true length */
    size_t content_len;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added_token;

/* Byte trie over added-token contents (leftmost-longest matching). */
typedef struct tok_trie_node {
    int32_t child, sibling; /* node indices, -1 none */
    int32_t token;          /* index into tokenizer.added, -1 none */
    unsigned char byte;
} tok_trie_node;
typedef struct tok_trie {
    tok_trie_node *nodes;
    int32_t n, cap;
    int32_t root[256]; /* first-level node per byte, -1 none */
} tok_trie;

/* ---- normalizer (tok_normalize.c) ---- */
enum tok_norm_kind { TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_STRIP, TOK_NORM_UNICODE };
typedef struct tok_norm {
    enum tok_norm_kind kind;
    int form;                    /* unicode: utf8proc_option_t flags (NFC, NFD, NFKC, NFKD) */
    char *a; size_t a_len;       /* prepend text / replace pattern (string) */
    char *b; size_t b_len;       /* replace content */
    pcre2_code *re;              /* replace pattern (regex), else NULL */
    bool left, right;            /* strip */
} tok_norm;

/* ---- pre-tokenizer (tok_pretok.c) ---- */
enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE, TOK_PRE_DIGITS };
enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS,
};
enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
typedef struct tok_pre {
    enum tok_pre_kind kind;
    pcre2_code *re;                   /* split / bytelevel (use_regex) / digits */
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space;            /* bytelevel */
    char repl[8]; size_t repl_len;    /* metaspace replacement char (UTF-8) */
    enum tok_prepend_scheme scheme;   /* metaspace */
    bool split;                       /* metaspace */
} tok_pre;
#define TOK_MAX_PRE 8

/* ---- decoder (tok_decode.c) ---- */
enum tok_dstep_kind { TOK_DEC_REPLACE, TOK_DEC_STRIP, TOK_DEC_METASPACE };
typedef struct tok_dstep {
    enum tok_dstep_kind kind;
    char *a; size_t a_len;  /* replace pattern / metaspace replacement / strip content */
    char *b; size_t b_len;  /* replace content */
    int start, stop;        /* strip */
    bool first_only;        /* metaspace: drop replacement chars of the first token */
} tok_dstep;
#define TOK_MAX_DSTEPS 8
enum tok_dec_mode {
    TOK_DECM_NONE,      /* no decoder: tokens joined with " " */
    TOK_DECM_CONCAT,    /* per-token steps (+ ByteFallback) + Fuse */
    TOK_DECM_BYTELEVEL, /* per-token steps, then GPT-2 chars -> bytes, lossy UTF-8 */
};
typedef struct tok_decoder {
    enum tok_dec_mode mode;
    tok_dstep steps[TOK_MAX_DSTEPS];
    int n_steps;
    bool byte_fallback;           /* ByteFallback step present */
    char strip_ch[8]; size_t strip_ch_len; int strip_start; /* Strip after Fuse */
} tok_decoder;

/* ---- the tokenizer ---- */
struct tokenizer {
    /* id -> piece (added tokens' content overrides the model's); pointers
     * into mv_arena or added[].content */
    int32_t n_ids;
    const char **piece;  /* [n_ids], NULL: no piece */
    uint32_t *piece_len; /* [n_ids] */
    uint8_t *is_special; /* [n_ids] */

    /* BPE model (tok_bpe.c): model vocab ids [0, mv_n) */
    int32_t mv_n;
    char *mv_arena;          /* model pieces, NUL-separated */
    uint32_t *mv_off, *mv_len; /* [mv_n], mv_off UINT32_MAX: no piece */
    int32_t *vhash;          /* [vhash_cap] model id or -1 */
    size_t vhash_cap;
    tok_merge_slot *merges;  /* open addressing, key UINT64_MAX: empty */
    size_t mcap;
    int32_t char_id[0x800];  /* model id of each 1-2 byte char, -1 none */
    int32_t byte_id[256];    /* <0xXX> ids, -1 none */
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;         /* -1 none */

    tok_added_token *added;
    int32_t n_added;
    tok_trie trie_raw;      /* normalized == false */
    tok_trie trie_norm;     /* normalized == true, keys normalized */

    tok_norm *norm;
    int n_norm;
    tok_pre pre[TOK_MAX_PRE];
    int n_pre;

    int32_t *tmpl_prefix, *tmpl_suffix; /* post-processor ids around $A */
    size_t n_prefix, n_suffix;

    tok_decoder dec;
    bool cleanup;           /* tokenizer_config clean_up_tokenization_spaces */
    int32_t bos_id, eos_id;
};

/* Per-call encoder scratch. */
typedef struct tok_enc {
    const tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    tok_buf norm_buf, norm_tmp;
    int32_t *ucs; size_t ucs_cap;       /* NFC & co.: code points (utf8proc_int32_t) */
    tok_buf depth_buf[TOK_MAX_PRE + 1];
    tok_buf map_buf[TOK_MAX_PRE + 1];   /* ByteLevel: the mapped word */
    pcre2_match_context *mctx;          /* with a JIT stack, when regexes exist */
    pcre2_jit_stack *jit;
    /* BPE scratch */
    void *sym; size_t sym_cap;
    void *heap; size_t heap_cap;
    pg_error *err;
} tok_enc;

bool tok_enc_push(tok_enc *e, int32_t id);

/* tok_bpe.c */
int tok_bpe_load(tokenizer *t, const json_doc *d, int model, const char *label, pg_error *err);
void tok_bpe_free(tokenizer *t);
int32_t tok_vocab_find(const tokenizer *t, const char *s, size_t n); /* model vocab; -1 */
int tok_bpe_word(tok_enc *e, const char *w, size_t n);

/* tok_added.c */
int tok_added_load(tokenizer *t, const json_doc *d, int arr, const char *label, pg_error *err);
int tok_trie_insert(tok_trie *tr, const char *s, size_t n, int32_t token);
void tok_trie_free(tok_trie *tr);
/* Longest added token in tr matching at s[pos..n): its index or -1, *mlen. */
int32_t tok_trie_match(const tok_trie *tr, const char *s, size_t n, size_t pos, size_t *mlen);
/* Splits s on tr's tokens; calls piece() for text pieces and pushes added
 * ids directly. base_off: offset of s in the original text. */
typedef int (*tok_piece_fn)(tok_enc *e, const char *s, size_t n, size_t orig_off);
int tok_added_split(tok_enc *e, const tok_trie *tr, const char *s, size_t n, size_t base_off,
                    tok_piece_fn piece);

/* tok_normalize.c */
int tok_norm_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err);
void tok_norm_free(tokenizer *t);
/* Normalizes s into out (out is overwritten). */
int tok_normalize(const tokenizer *t, tok_enc *e, const char *s, size_t n, tok_buf *out);

/* tok_pretok.c */
pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, const char *label,
                              pg_error *err);
int tok_pre_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err);
void tok_pre_free(tokenizer *t);
/* Pre-tokenizes s (at_start: s begins the original text) and BPE-encodes
 * every resulting word. */
int tok_pretok_run(tok_enc *e, const char *s, size_t n, bool at_start);
/* GPT-2 bytes_to_unicode: the code point standing for byte b. */
uint32_t tok_bytelevel_cp(unsigned b);
/* Inverse: byte of code point cp, or -1. */
int tok_bytelevel_byte(uint32_t cp);

/* tok_decode.c */
int tok_decoder_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err);
void tok_decoder_free(tokenizer *t);

/* json helpers shared by the loaders */
int tok_json_strdup(const json_doc *d, int i, char **out, size_t *len, const char *label,
                    const char *what, pg_error *err);
bool tok_json_bool(const json_doc *d, int obj, const char *key, bool dflt);

/* Sequence nodes ({"type": "Sequence", <key>: [steps]}) of the normalizer,
 * pre-tokenizer, decoder and post-processor, loaded by one recursive walk.
 * A step loader loads `node` at Sequence nesting depth `depth` (0 at the
 * top); ctx is the loader's own state. */
#define TOK_MAX_SEQ_DEPTH 4
typedef int (*tok_step_load_fn)(tokenizer *t, const json_doc *d, int node, const char *label,
                                int depth, void *ctx, pg_error *err);
/* node is a Sequence of `what` steps ("normalizer", ...: for messages) at
 * nesting depth `depth`: calls one() on every member of its `key` array, in
 * order, at depth + 1, and stops at the first error. Refuses (PG_EFORMAT)
 * a missing array and a Sequence nested deeper than TOK_MAX_SEQ_DEPTH, so
 * that a hostile file cannot exhaust the stack. */
int tok_load_sequence(tokenizer *t, const json_doc *d, int node, const char *key,
                      const char *what, const char *label, int depth, tok_step_load_fn one,
                      void *ctx, pg_error *err);

#endif /* PG_TOK_INTERNAL_H */
