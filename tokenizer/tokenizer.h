/* tokenizer: a Hugging Face tokenizer.json (BPE), as the Llama and Qwen
 * families use it — the SentencePiece flavour (Prepend/Replace "▁" normalizer
 * or Metaspace, byte_fallback) and the byte-level flavour (ByteLevel + Split
 * regex run with PCRE2, Qwen's NFC normalizer run with utf8proc) — with
 * added/special tokens, the TemplateProcessing post-processor, the matching
 * decoder, and an incremental decoder for generation (tokenizer/README.md).
 * Behaviour is Hugging Face's (goldens: ../shared/goldens/tokenize-*.jsonl).
 */
#ifndef PG_TOKENIZER_H
#define PG_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef struct tokenizer tokenizer; /* opaque, immutable after load: shareable across threads */

/* Loads DIR/tokenizer.json (+ DIR/tokenizer_config.json when present, for
 * bos/eos, add_bos_token/add_eos_token and clean_up_tokenization_spaces).
 * On error *out is NULL and the message names the file and the field;
 * unsupported components (Unigram/WordPiece models, Lowercase, ...) give
 * PG_EUNSUPPORTED. Free with tok_free. */
int tok_load(tokenizer **out, const char *dir, pg_error *err);
/* Same from memory (pure; fuzz target). config_json may be NULL. */
int tok_load_from_memory(tokenizer **out, const char *json, size_t len,
                         const char *config_json, size_t config_len,
                         const char *label, pg_error *err);
void tok_free(tokenizer *t); /* accepts NULL */

/* 1 + the largest id of the model vocab and the added tokens (an id below
 * it may still have no piece: tok_piece NULL). */
int32_t tok_vocab_size(const tokenizer *t);
/* tokenizer_config.json's bos_token, else the post-processor's first
 * prefix token; -1 if none. */
int32_t tok_bos_id(const tokenizer *t);
/* tokenizer_config.json's eos_token, else a special "</s>"; -1 if none. */
int32_t tok_eos_id(const tokenizer *t);
bool tok_is_special(const tokenizer *t, int32_t id);
/* The vocabulary string of id (borrowed, valid until tok_free), NULL if out of range. */
const char *tok_piece(const tokenizer *t, int32_t id);

/* The bytes token id adds to a decoded text when it is not the text's first
 * token (what a structured-output automaton must see): the decoder's
 * per-token steps ("\u2581" -> " "), then a ByteFallback "<0xHH>" piece is
 * that one byte and a ByteLevel piece its GPT-2 bytes, with no UTF-8
 * repair (a token may hold part of a character). Special tokens and ids
 * without a piece give no bytes (*bytes NULL, *len 0). On success *bytes is
 * malloc'd (caller frees), NUL-terminated. */
int tok_token_bytes(const tokenizer *t, int32_t id, char **bytes, size_t *len, pg_error *err);

/* Encodes len bytes of UTF-8 text (invalid UTF-8 is an error, PG_EINVAL).
 * Text that spells an added token (e.g. "<s>") becomes that token's id even
 * without add_special, as in HF (added tokens are split out first). With
 * add_special the post-processor's tokens (BOS) are added; for the Llama
 * tokenizer classes tokenizer_config.json's add_bos_token/add_eos_token
 * decide them, as transformers' LlamaTokenizerFast does. On success *ids is
 * malloc'd (caller frees) with *n_ids entries. */
int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, pg_error *err);

/* Decodes ids to UTF-8 (invalid byte sequences become U+FFFD, as HF does:
 * a ByteFallback run of <0xHH> tokens that is not valid UTF-8 gives one
 * U+FFFD per byte, Rust tokenizers' rule; ByteLevel bytes are decoded like
 * String::from_utf8_lossy). Ids without a piece (out of range) are skipped,
 * as HF skips them. Added tokens go through the decoder like any piece;
 * skip_special drops only those marked special (Qwen's <think>, <tool_call>
 * are added tokens that are not special: they stay).
 * *text is malloc'd and NUL-terminated; *len excludes the NUL. */
int tok_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, bool skip_special,
               char **text, size_t *len, pg_error *err);

/* tok_decode with options. TOK_DECODE_CLEANUP applies transformers'
 * clean_up_tokenization (" ." -> ".", " ?" -> "?", " !" -> "!", " ," -> ",",
 * " ' " -> "'", " n't" -> "n't", " 'm", " 's", " 've", " 're") after the
 * decoder, as Python transformers' decode does when the tokenizer_config's
 * clean_up_tokenization_spaces is true (see tok_cleanup_default). tok_decode
 * and the stream never clean up (they are the tokenizers-library decode, and
 * what vLLM streams). */
enum { TOK_DECODE_SKIP_SPECIAL = 1u, TOK_DECODE_CLEANUP = 2u };
int tok_decode_ex(const tokenizer *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **text, size_t *len, pg_error *err);
/* tokenizer_config.json's clean_up_tokenization_spaces (false when absent). */
bool tok_cleanup_default(const tokenizer *t);

/* Incremental decoder for generation. It is seeded with the prompt's ids and
 * then fed generated ids one at a time; the concatenation of everything it
 * emits equals decode(prompt + generated) minus decode(prompt) (so a leading
 * space the decoder would strip at the start of a text is kept), and it never
 * emits part of a UTF-8 sequence: bytes of an unfinished character are held
 * back until a later token completes them, or until tok_stream_finish.
 * With byte fallback (Llama 2) a run of <0xHH> tokens is emitted when the
 * next non-byte token (or finish) closes it, since one bad byte turns the
 * whole run into U+FFFDs. If the prompt itself ends inside such a run or
 * character and generation changes how it decodes (half an emoji completed),
 * decode(prompt) is not a prefix of the whole decode; the stream then emits
 * that completed text too (what the prompt held back is not lost). */
typedef struct tok_stream tok_stream;
int tok_stream_create(tok_stream **out, const tokenizer *t, bool skip_special,
                      const int32_t *prompt_ids, size_t n_prompt, pg_error *err);
/* Feeds one id. *new_text (borrowed, valid until the next call) receives the
 * newly final bytes, *new_len may be 0. */
int tok_stream_push(tok_stream *s, int32_t id, const char **new_text, size_t *new_len,
                    pg_error *err);
/* Flushes what is held back (an unfinished sequence becomes U+FFFD). */
int tok_stream_finish(tok_stream *s, const char **new_text, size_t *new_len, pg_error *err);
void tok_stream_free(tok_stream *s); /* accepts NULL */

#endif /* PG_TOKENIZER_H */
