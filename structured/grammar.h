/* grammar: constrained decoding (structured outputs). A constraint — a JSON
 * schema (subset), "any JSON object", a regex (subset) or a list of choices —
 * is compiled into an automaton over BYTES (the UTF-8 text the model emits),
 * and for a sequence in some automaton state the token mask says which
 * vocabulary tokens keep it alive.
 *
 * The automaton is a recursive transition network made deterministic: a set
 * of rules, each a byte DFA whose transitions either consume the byte
 * (goto) or call another rule (push the return state, the callee consumes
 * the byte); a rule in an accepting state whose DFA has no move on the byte
 * returns to its caller. Rules exist only where the language recurses (any
 * nested JSON value, a recursive $ref); everything else is inlined into one
 * DFA. A state is the stack of DFA states, at most GRAMMAR_MAX_DEPTH deep
 * (deeper nesting is refused: a bounded language). JSON is compact: no
 * whitespace anywhere outside strings (vLLM/xgrammar's
 * disable_any_whitespace mode); object members come in the order the schema
 * lists them. Strings are valid UTF-8. The supported subset and the limits
 * are in cli/README.md ("Structured outputs").
 *
 * The token mask walks a byte trie of the vocabulary (grammar_vocab, built
 * once per tokenizer from each token's decoded bytes), stepping the
 * automaton along each edge and skipping the subtree at the first dead byte.
 */
#ifndef PG_GRAMMAR_H
#define PG_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef enum grammar_kind {
    GRAMMAR_NONE = 0,
    GRAMMAR_JSON_SCHEMA,  /* src: the schema as JSON text */
    GRAMMAR_JSON_OBJECT,  /* src ignored: any JSON object */
    GRAMMAR_REGEX,        /* src: the pattern (UTF-8), matched against the whole output */
    GRAMMAR_CHOICE,       /* src: a JSON array of strings; the output is one of them */
} grammar_kind;

/* Limits (a per-request error past them, never a hang): */
#define GRAMMAR_MAX_DEPTH 32            /* automaton stack: JSON nesting of recursive rules */
#define GRAMMAR_MAX_NFA_STATES 200000   /* Thompson NFA before determinization */
#define GRAMMAR_MAX_DFA_STATES 100000   /* all rules together */
#define GRAMMAR_MAX_WORK 40000000       /* subset-construction steps (a deterministic time bound) */
#define GRAMMAR_MAX_SRC_BYTES (1 << 20) /* schema / regex text */

/* A compiled constraint: immutable, shareable across sequences and threads. */
typedef struct grammar grammar;

/* Compiles src[0, len). Errors (PG_EINVAL / PG_EUNSUPPORTED, *out NULL):
 * malformed input, a keyword outside the subset ("json schema: unsupported
 * keyword 'not'"), a schema or regex whose language is empty, or a limit
 * above exceeded. */
int grammar_compile(grammar **out, grammar_kind kind, const char *src, size_t len,
                    pg_error *err);
void grammar_destroy(grammar *g); /* accepts NULL */
/* Sizes for reports and tests. */
int32_t grammar_num_states(const grammar *g);
int32_t grammar_num_rules(const grammar *g);

/* The automaton state of one sequence: plain data (copy it to fork, keep it
 * across preemption). st[0 .. n) is the stack of DFA states, top last. */
typedef struct grammar_state {
    int32_t n;
    int32_t st[GRAMMAR_MAX_DEPTH];
} grammar_state;

void grammar_state_init(const grammar *g, grammar_state *s);
/* Feeds bytes; true when every byte was accepted. On false *s is unchanged. */
bool grammar_advance(const grammar *g, grammar_state *s, const uint8_t *bytes, size_t n);
/* True when the text so far is a complete match (EOS may follow). */
bool grammar_can_end(const grammar *g, const grammar_state *s);

/* The vocabulary as the automaton sees it: for every id its decoded bytes
 * (empty or NULL: a token that never matches, e.g. a special token). */
typedef struct grammar_vocab grammar_vocab;
/* bytes[id] / lens[id] for id < vocab_size are copied. */
int grammar_vocab_create(grammar_vocab **out, int32_t vocab_size, const char *const *bytes,
                         const uint32_t *lens, pg_error *err);
void grammar_vocab_destroy(grammar_vocab *v); /* accepts NULL */
int32_t grammar_vocab_size(const grammar_vocab *v);
int32_t grammar_vocab_trie_nodes(const grammar_vocab *v);
/* The bytes of id (borrowed), *len 0 for a token that never matches. */
const uint8_t *grammar_vocab_bytes(const grammar_vocab *v, int32_t id, uint32_t *len);

/* Words of a mask over v: ceil(vocab / 64). */
size_t grammar_mask_words(const grammar_vocab *v);
/* mask[grammar_mask_words(v)]: bit id set iff the token's bytes can all be
 * fed to s (grammar_advance would return true). Terminators (EOS) are the
 * caller's business (grammar_can_end). Returns the number of bits set,
 * -1 when out of memory (mask then all zero).
 * Thread-safe for distinct masks (g and v are only read). */
int32_t grammar_mask(const grammar *g, const grammar_vocab *v, const grammar_state *s,
                     uint64_t *mask);

/* The longest token's byte length. */
int32_t grammar_vocab_max_len(const grammar_vocab *v);

/* Fewest bytes that must still be fed to s before grammar_can_end holds
 * (0: it holds now); INT32_MAX when it never can; -1 when the grammar was
 * too large to measure. */
int32_t grammar_bytes_to_end(const grammar *g, const grammar_state *s);
/* Budgeted ends: clears from mask (a mask for s) every token after which
 * more than budget_bytes bytes would be needed to reach a complete match,
 * so that a sequence whose vocabulary spells every byte as one token (byte
 * fallback, byte-level BPE) can always end before max_tokens. Only tokens
 * long enough to break the budget are fed (none while the budget is
 * ample). When no token fits and !can_end (eos cannot end it either), the
 * tokens that come closest are kept instead. Returns the bits left set.
 * A pure function of (g, v, s, budget_bytes, can_end): deterministic. */
int32_t grammar_mask_budget(const grammar *g, const grammar_vocab *v, const grammar_state *s,
                            uint64_t *mask, int32_t budget_bytes, bool can_end);

/* A per-(grammar, vocabulary) cache of masks by automaton top state (the
 * walk from the top frame alone, with the tokens whose fate depends on the
 * frames below checked one by one at mask time): a state seen again costs
 * a copy of the mask plus those few tokens. Mutable: one thread at a time.
 * Entries are added until they hold max_bytes, then masks are walked. g and
 * v are borrowed and must outlive it. */
typedef struct grammar_cache grammar_cache;
int grammar_cache_create(grammar_cache **out, const grammar *g, const grammar_vocab *v,
                         size_t max_bytes, pg_error *err);
void grammar_cache_destroy(grammar_cache *c); /* accepts NULL */
size_t grammar_cache_bytes(const grammar_cache *c);
/* The same mask as grammar_mask(g, v, s, mask), through the cache. */
int32_t grammar_mask_cached(grammar_cache *c, const grammar_state *s, uint64_t *mask);

#endif /* PG_GRAMMAR_H */
