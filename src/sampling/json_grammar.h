/* json_grammar.h — JSON mode (OpenAI's response_format {"type": "json_object"}): the output is
 * one JSON object, and nothing after it.
 *
 * Two parts:
 *  - a byte-level pushdown automaton for RFC 8259 JSON whose top level must be an object
 *    (ds_json_state, ds_json_feed): feeding a byte that cannot continue a valid document
 *    fails and leaves the state unchanged; ds_json_done says the object is closed;
 *  - the token mask (ds_json_mask): given the state and the byte strings of the vocabulary
 *    (ds_json_vocab, built once from the tokenizer), every token whose bytes cannot all be fed
 *    gets −inf, and the end ids (EOS, stop ids) are allowed exactly when the object is closed,
 *    as the only tokens then. So a sampled (or greedy) output that ends by EOS is a complete
 *    object, and one cut by max_tokens is a prefix of one.
 *
 * Bounds, so a model cannot loop forever inside the grammar's freedom (a small model happily
 * emits newlines without end): at most DS_JSON_MAX_DEPTH nested containers (opening one more is
 * refused), and whitespace between tokens is one space, or one newline followed by at most
 * DS_JSON_MAX_INDENT spaces or tabs (llama.cpp's json.gbnf rule; compact and pretty-printed
 * output both fit). Strings take any byte ≥ 0x20 except '"' and '\\' (tokens may split UTF-8
 * sequences, so those are not checked); escapes are JSON's.
 *
 * Cost per masked step: the bytes of every token whose first byte the state accepts (a
 * 256-entry pre-check rules out the rest). */
#ifndef DS_SAMPLING_JSON_GRAMMAR_H
#define DS_SAMPLING_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DS_JSON_MAX_DEPTH 64
#define DS_JSON_MAX_INDENT 20

typedef struct ds_json_state {
    uint64_t arrays; /* bit d: the container at depth d (1-based: bit d − 1) is an array */
    uint8_t depth;   /* open containers */
    uint8_t lex;     /* what the next byte may be (json_grammar.c) */
    uint8_t aux;     /* literal position / hex digits left */
    uint8_t flags;   /* the string being read is a key; the whitespace run began with '\n' */
    uint8_t ws;      /* whitespace bytes in a row */
} ds_json_state;

/* The state before the first byte. */
void ds_json_init(ds_json_state *s);

/* Feeds one byte; false (state unchanged) when it cannot continue a valid document. */
bool ds_json_feed(ds_json_state *s, uint8_t c);

/* Feeds n bytes; false (state unchanged) when one of them fails. */
bool ds_json_feed_bytes(ds_json_state *s, const uint8_t *b, size_t n);

/* The top-level object is closed: only the end may follow. */
bool ds_json_done(const ds_json_state *s);

/* Inside a string's body (not in an escape): every "plain" byte (ds_json_vocab.plain) may
 * come. */
bool ds_json_in_string(const ds_json_state *s);

/* The vocabulary's byte strings (borrowed from the tokenizer, which must outlive it). */
typedef struct ds_json_vocab {
    int n;                  /* ids [0, n) */
    const uint8_t **bytes;  /* [n] NULL: the id never continues a document (special, empty) */
    uint32_t *len;          /* [n] */
    uint8_t *plain;         /* [n] 1: every byte may sit inside a string as it is (≥ 0x20, not
                               '"' or '\\'), so inside a string the token is allowed unread
                               (ds_json_vocab_index) */
    uint16_t *head;         /* [n] first byte | second byte << 8 (0 when absent): the mask's
                               pre-checks read these in order, not the scattered bytes */
} ds_json_vocab;

/* Fills v->plain and v->head from bytes / len (call once after filling them). False when out of
 * memory. */
bool ds_json_vocab_index(ds_json_vocab *v);

/* Frees the arrays (not the bytes). */
void ds_json_vocab_free(ds_json_vocab *v);

/* Sets logits[id] = −inf for every id in [0, n_logits) the state does not allow (ids past the
 * vocabulary included). end_ids [n_end] (EOS, stop ids) are allowed exactly when the object is
 * closed; then nothing else is. */
void ds_json_mask(const ds_json_state *s, const ds_json_vocab *v, const int *end_ids, int n_end,
                  float *logits, int n_logits);

/* Feeds token id's bytes (an end id feeds nothing); false when they cannot be fed. */
bool ds_json_feed_token(ds_json_state *s, const ds_json_vocab *v, int id);

#endif
