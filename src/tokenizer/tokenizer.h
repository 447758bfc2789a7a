/* tokenizer.h — byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
 *
 * Supported (anything else in the file is refused with DS_ERR_UNSUPPORTED naming the field):
 *   model        BPE over byte-level symbols; merges as "a b" strings or ["a", "b"] pairs;
 *                ignore_merges; dropout null/0; no continuing_subword_prefix/end_of_word_suffix,
 *                no byte_fallback.
 *   added_tokens special and non-special, lstrip / rstrip / single_word / normalized, matched
 *                leftmost-longest before the pre-tokenizer (as HF's AddedVocabulary does).
 *   normalizer   null, NFC, NFD, NFKC, NFKD, Sequence of those.
 *   pre_tokenizer Split (Regex or String pattern; behavior Isolated or Removed; invert),
 *                ByteLevel (add_prefix_space, use_regex) as the last step, Sequence of those.
 *   decoder      ByteLevel (or a Sequence holding only ByteLevel).
 *   post_processor is ignored: encode never adds BOS/EOS (the caller decides, see bos_id).
 * Input text that is not valid UTF-8 has each invalid sequence replaced by U+FFFD before
 * encoding (HF only accepts valid strings, so this never changes valid input).
 *
 * Thread safety: a loaded ds_tokenizer is immutable; encode/decode may run concurrently on it
 * from several threads. A ds_detok belongs to one thread. */
#ifndef DS_TOKENIZER_H
#define DS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ds_tokenizer ds_tokenizer;

/* path: a tokenizer.json file, or a directory holding one. tokenizer_config.json beside it is
 * read when present (bos/eos/pad token strings, chat_template). *out owned by the caller. */
ds_status ds_tokenizer_load(const char *path, ds_tokenizer **out, ds_error *err);
/* Same from an in-memory tokenizer.json (no tokenizer_config.json). name is used in messages. */
ds_status ds_tokenizer_load_json(const char *json, size_t len, const char *name, ds_tokenizer **out,
                                 ds_error *err);
void ds_tokenizer_free(ds_tokenizer *tok);

/* Encodes len bytes of text. parse_special: match added tokens marked special inline (HF's
 * default); when false they are tokenized as plain text (non-special added tokens such as
 * Qwen's <think> still match, as HF does with encode_special_tokens=True).
 * *ids is malloc'd and owned by the caller (may be NULL when *n_ids == 0). */
ds_status ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len,
                              bool parse_special, int32_t **ids, size_t *n_ids, ds_error *err);

/* Whole-sequence decode: the bytes of every token, joined, invalid UTF-8 replaced by U+FFFD
 * (one per maximal invalid subpart, as Rust's from_utf8_lossy). Ids with no token are skipped
 * (as HF does). *text is malloc'd, NUL-terminated, owned by the caller. */
ds_status ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special, char **text, size_t *len, ds_error *err);

/* One past the largest id (model vocab and added tokens). */
size_t ds_tokenizer_vocab_size(const ds_tokenizer *tok);
/* Id of a token given as spelled in tokenizer.json ("<|im_end|>", "Ġthe"); -1 if none.
 * Added tokens are looked up first, as HF does. */
int32_t ds_tokenizer_token_to_id(const ds_tokenizer *tok, const char *token);
/* The token's string as spelled in tokenizer.json; NULL for an id with no token. */
const char *ds_tokenizer_id_to_token(const ds_tokenizer *tok, int32_t id);
/* The raw bytes the token decodes to (not NUL-terminated); NULL for an id with no token. */
const char *ds_tokenizer_token_bytes(const ds_tokenizer *tok, int32_t id, size_t *len);
/* True for added tokens marked "special" (skipped by decode with skip_special). */
bool ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id);
/* From tokenizer_config.json (bos_token/eos_token/pad_token); -1 when absent or unknown. */
int32_t ds_tokenizer_bos_id(const ds_tokenizer *tok);
int32_t ds_tokenizer_eos_id(const ds_tokenizer *tok);
int32_t ds_tokenizer_pad_id(const ds_tokenizer *tok);
/* tokenizer_config.json "chat_template" when it is a string; NULL otherwise. */
const char *ds_tokenizer_chat_template(const ds_tokenizer *tok);

/* Incremental detokeniser: push ids as they are generated, get back the text completed by each.
 * Never returns half a UTF-8 character: the bytes of an incomplete character are held until a
 * later token completes it; bytes that can no longer form a valid character become U+FFFD.
 * The concatenation of all pushes and the flush equals ds_tokenizer_decode of the same ids. */
typedef struct ds_detok {
    const ds_tokenizer *tok;
    bool skip_special;
    unsigned char pending[4]; /* bytes of an incomplete trailing character (at most 3) */
    size_t n_pending;
    char *buf; /* returned text, valid until the next push/flush/free */
    size_t buf_cap;
} ds_detok;

void ds_detok_init(ds_detok *d, const ds_tokenizer *tok, bool skip_special);
/* *text (NUL-terminated) / *len receive the newly completed text; may be empty. */
ds_status ds_detok_push(ds_detok *d, int32_t id, const char **text, size_t *len, ds_error *err);
/* Ends the sequence: held bytes become U+FFFD. Resets d for reuse. */
ds_status ds_detok_flush(ds_detok *d, const char **text, size_t *len, ds_error *err);
void ds_detok_free(ds_detok *d);

#endif
