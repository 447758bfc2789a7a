/* tok_internal.h — the tokenizer's internal data and the functions its files share.
 * Public API: tokenizer.h. */
#ifndef DS_TOK_INTERNAL_H
#define DS_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

/* Ids live in [0, TOK_MAX_IDS): bounds the per-id tables a hostile file can make us allocate. */
#define TOK_MAX_IDS (1 << 24)
#define TOK_NONE UINT32_MAX

/* ---- growable byte buffer ----------------------------------------------------------------- */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;

ds_status tok_buf_reserve(tok_buf *b, size_t extra, ds_error *err);
ds_status tok_buf_append(tok_buf *b, const void *data, size_t n, ds_error *err);
void tok_buf_free(tok_buf *b);

/* ---- string → id map (open addressing; keys are (offset, length) into a caller's arena) ---- */
typedef struct tok_strmap_slot {
    uint32_t off, len; /* key bytes: base[off .. off+len) */
    int32_t val;       /* -1: empty slot */
    uint32_t hash;
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slots; /* [cap] */
    uint32_t cap;           /* power of two */
    uint32_t count;
} tok_strmap;

uint32_t tok_hash_bytes(const void *p, size_t n);
ds_status tok_strmap_init(tok_strmap *m, size_t expected, ds_error *err);
/* Inserts or overwrites; key bytes must already be in base at off. */
ds_status tok_strmap_put(tok_strmap *m, const char *base, uint32_t off, uint32_t len, int32_t val,
                         ds_error *err);
int32_t tok_strmap_get(const tok_strmap *m, const char *base, const char *key, size_t len);
void tok_strmap_free(tok_strmap *m);

/* ---- BPE merge table: (left id, right id) → (rank, merged id) ------------------------------ */
typedef struct tok_pair_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX: empty */
    uint32_t rank;
    int32_t merged;
} tok_pair_slot;

typedef struct tok_pairmap {
    tok_pair_slot *slots; /* [cap] */
    uint64_t mask;        /* cap - 1 */
} tok_pairmap;

ds_status tok_pairmap_init(tok_pairmap *m, size_t expected, ds_error *err);
/* Later duplicates overwrite earlier ones, as HF's HashMap collect does. */
void tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, uint32_t rank, int32_t merged);
const tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right);
void tok_pairmap_free(tok_pairmap *m);

/* ---- UTF-8 ---------------------------------------------------------------------------------- */
typedef enum tok_utf8_kind {
    TOK_UTF8_OK,         /* a valid character of *len bytes */
    TOK_UTF8_INVALID,    /* *len bytes form one maximal invalid subpart: one U+FFFD */
    TOK_UTF8_INCOMPLETE, /* the buffer ends inside a character that could still be valid */
} tok_utf8_kind;

tok_utf8_kind tok_utf8_next(const unsigned char *s, size_t n, size_t *len);
/* Appends s to out with invalid subparts replaced by U+FFFD. With final == false an incomplete
 * trailing character is left unconsumed; returns how many bytes of s were consumed. */
ds_status tok_utf8_lossy_append(tok_buf *out, const unsigned char *s, size_t n, bool final,
                                size_t *consumed, ds_error *err);
/* Decodes the (valid) character at s; returns its code point and sets *len. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t n, size_t *len);
size_t tok_utf8_encode(uint32_t cp, char out[4]);
bool tok_is_whitespace(uint32_t cp); /* Unicode White_Space (Rust's char::is_whitespace) */
bool tok_is_word_char(uint32_t cp);  /* approximates the regex \w of Rust's regex crate */

/* ---- byte-level alphabet (GPT-2's bytes_to_unicode) ----------------------------------------- */
/* Code point that byte b is written as in byte-level vocabularies. */
uint32_t tok_bytelevel_char(uint8_t b);
/* Byte written as code point cp, or -1 when cp is not in the alphabet. */
int tok_bytelevel_byte(uint32_t cp);
/* Appends the byte-level spelling of raw bytes. */
ds_status tok_bytelevel_encode(tok_buf *out, const unsigned char *s, size_t n, ds_error *err);

/* ---- normalizer ----------------------------------------------------------------------------- */
#define TOK_MAX_NORM 8
typedef struct tok_normalizer {
    int n_ops;
    int ops[TOK_MAX_NORM]; /* utf8proc option sets, applied in order */
} tok_normalizer;

/* Normalizes s; *out points either at s (unchanged) or into buf. */
ds_status tok_normalize(const tok_normalizer *nz, const char *s, size_t n, tok_buf *buf,
                        const char **out, size_t *out_len, ds_error *err);

/* ---- pre-tokenizer -------------------------------------------------------------------------- */
typedef enum tok_split_behavior {
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_REMOVED,
} tok_split_behavior;

typedef struct tok_split {
    pcre2_code *re;
    tok_split_behavior behavior;
    bool invert;
} tok_split;

#define TOK_MAX_SPLITS 16
typedef struct tok_pretok {
    int n_splits;
    tok_split splits[TOK_MAX_SPLITS]; /* applied in order, before the byte-level step */
    bool add_prefix_space;            /* ByteLevel: prepend ' ' to pieces not starting with one */
    pcre2_code *bl_re;                /* ByteLevel use_regex: GPT-2's split pattern, else NULL */
} tok_pretok;

/* ---- added tokens --------------------------------------------------------------------------- */
typedef struct tok_added {
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

typedef struct tok_trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t added;   /* index into added[] of the token ending here, -1 if none */
    uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
    tok_trie_node *nodes; /* [n]; node 0 is the root */
    size_t n, cap;
    bool first[256]; /* bytes some token starts with: fast skip */
} tok_trie;

ds_status tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added, ds_error *err);
void tok_trie_free(tok_trie *t);

/* A piece of text: an added token (added >= 0) or a run of plain text (added == -1). */
typedef struct tok_span {
    size_t start, end;
    int32_t added;
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

/* Splits s into added-token and plain spans like HF's AddedVocabulary::find_matches. */
ds_status tok_find_added(const ds_tokenizer *tok, const tok_trie *trie, const char *s, size_t n,
                         bool parse_special, tok_spans *out, ds_error *err);

/* ---- the tokenizer -------------------------------------------------------------------------- */
struct ds_tokenizer {
    char *name; /* file path for messages */
    size_t n_ids;

    /* Per-id tables [n_ids]; TOK_NONE offset: the id has no token. */
    uint32_t *str_off, *str_len;     /* token as spelled in tokenizer.json, in strs */
    uint32_t *bytes_off, *bytes_len; /* raw bytes it decodes to, in strs */
    uint8_t *is_special;
    tok_buf strs; /* arena of every string above, NUL after each */

    tok_strmap vocab;     /* model vocab: spelling → id */
    tok_strmap added_by;  /* added tokens: content → id */
    int32_t byte_id[256]; /* id of each single-byte symbol; -1 when the vocab lacks it */
    tok_pairmap merges;
    bool ignore_merges;
    int32_t unk_id;

    tok_added *added; /* [n_added] */
    size_t n_added;
    tok_trie trie_raw;    /* added tokens with normalized == false, matched on raw text */
    tok_trie trie_norm;   /* normalized == true, matched (normalized) on normalized text */
    uint32_t max_ovector; /* largest capture-pair count over all regexes */

    tok_normalizer norm;
    tok_pretok pre;

    int32_t bos_id, eos_id, pad_id;
    char *chat_template;
};

/* Parses tokenizer.json's parts (tok_load_parts.c). */
ds_status tok_parse_normalizer(ds_tokenizer *tok, const void *json, ds_error *err);
ds_status tok_parse_pretokenizer(ds_tokenizer *tok, const void *json, ds_error *err);
ds_status tok_parse_decoder(ds_tokenizer *tok, const void *json, ds_error *err);
ds_status tok_parse_config(ds_tokenizer *tok, const char *path, ds_error *err);

/* ---- encode scratch (one per encode call; not shared between threads) ---------------------- */
typedef struct tok_piece {
    uint32_t off, len; /* into tok_scratch.pieces_buf */
} tok_piece;

typedef struct tok_sym {
    int32_t id;
    int32_t prev, next; /* linked list over symbols; -1 ends */
    uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
} tok_sym;

typedef struct tok_merge {
    uint32_t rank;
    uint32_t pos;
    int32_t merged;
} tok_merge;

typedef struct tok_scratch {
    pcre2_match_data *md;
    tok_buf piece_text; /* text the pieces point into */
    tok_piece *pieces, *pieces2;
    size_t n_pieces, cap_pieces, n_pieces2, cap_pieces2;
    tok_sym *syms;
    size_t cap_syms;
    tok_merge *heap;
    size_t cap_heap;
    tok_buf word; /* byte-level spelling for ignore_merges look-ups */
    int32_t *ids;
    size_t n_ids, cap_ids;
    /* Pre-token → ids cache for one encode call (words repeat a lot in long inputs). Entries
     * point into cache_keys and cache_ids; the table stops taking entries when half full. */
    bool use_cache;               /* long inputs only: the table costs more than short ones gain */
    struct tok_cache_slot *cache; /* [TOK_CACHE_SLOTS] or NULL */
    size_t cache_count;
    tok_buf cache_keys;
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
} tok_scratch;

#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_MAX_WORD 64
#define TOK_CACHE_MIN_INPUT 4096

typedef struct tok_cache_slot {
    uint32_t hash;
    uint32_t key_off, key_len; /* key_len 0: empty slot */
    uint32_t ids_off, ids_n;
} tok_cache_slot;

ds_status tok_scratch_push_id(tok_scratch *sc, int32_t id, ds_error *err);
/* Pre-tokenizes plain (normalized) text into sc->pieces. */
ds_status tok_pretokenize(const ds_tokenizer *tok, tok_scratch *sc, const char *s, size_t n,
                          ds_error *err);
/* Appends the BPE ids of one pre-token (raw bytes) to sc->ids. */
ds_status tok_bpe_word(const ds_tokenizer *tok, tok_scratch *sc, const unsigned char *s, size_t n,
                       ds_error *err);
/* Compiles a pre-tokenizer regex (UTF + UCP, JIT when available). */
ds_status tok_regex_compile(const char *pattern, size_t len, bool literal, const char *where,
                            pcre2_code **out, ds_error *err);

#endif
