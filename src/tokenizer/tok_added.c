/* tok_added.c — matching added tokens (specials like <|im_start|>) before pre-tokenization.
 *
 * Mirrors HF's AddedVocabulary::find_matches: a leftmost-longest, non-overlapping scan over all
 * tokens of one set; a match that is then rejected (a special token while specials are off, a
 * single_word token inside a word) is still consumed, so the scan resumes after it. lstrip /
 * rstrip widen an accepted match over the whitespace beside it. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static ds_status trie_new_node(tok_trie *t, uint8_t byte, int32_t *out, ds_error *err) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        tok_trie_node *nodes = realloc(t->nodes, sizeof *nodes * cap);
        if (!nodes)
            return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (added tokens)");
        t->nodes = nodes;
        t->cap = cap;
    }
    t->nodes[t->n] = (tok_trie_node){.child = -1, .sibling = -1, .added = -1, .byte = byte};
    *out = (int32_t)t->n++;
    return DS_OK;
}

ds_status tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added, ds_error *err) {
    DS_ASSERT(n > 0);
    ds_status st;
    int32_t root;
    if (t->n == 0 && (st = trie_new_node(t, 0, &root, err)) != DS_OK) return st;
    t->first[(unsigned char)s[0]] = true;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
        if (c < 0) {
            if ((st = trie_new_node(t, b, &c, err)) != DS_OK) return st;
            t->nodes[c].sibling = t->nodes[node].child; /* nodes may have moved: index again */
            t->nodes[node].child = c;
        }
        node = c;
    }
    /* A later duplicate replaces the earlier one, as re-adding a token does in HF. */
    t->nodes[node].added = added;
    return DS_OK;
}

void tok_trie_free(tok_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

/* Longest token starting at s[0]; returns its added index (or -1) and its length. */
static int32_t trie_longest(const tok_trie *t, const unsigned char *s, size_t n, size_t *len) {
    int32_t best = -1, node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != s[i]) c = t->nodes[c].sibling;
        if (c < 0) break;
        node = c;
        if (t->nodes[c].added >= 0) {
            best = t->nodes[c].added;
            *len = i + 1;
        }
    }
    return best;
}

static ds_status spans_push(tok_spans *o, size_t start, size_t end, int32_t added, ds_error *err) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 16;
        tok_span *v = realloc(o->v, sizeof *v * cap);
        if (!v) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (spans)");
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (tok_span){.start = start, .end = end, .added = added};
    return DS_OK;
}

/* Code point of the character ending just before s[pos] (pos > 0). */
static uint32_t char_before(const unsigned char *s, size_t pos, size_t *len) {
    size_t b = pos - 1;
    while (b > 0 && pos - b < 4 && (s[b] & 0xC0) == 0x80) b--;
    uint32_t cp = tok_utf8_decode(s + b, pos - b, len);
    if (b + *len != pos) { /* not a whole character: treat the last byte alone */
        *len = 1;
        return 0xFFFD;
    }
    return cp;
}

ds_status tok_find_added(const ds_tokenizer *tok, const tok_trie *trie, const char *text, size_t n,
                         bool parse_special, tok_spans *out, ds_error *err) {
    const unsigned char *s = (const unsigned char *)text;
    out->n = 0;
    size_t done = 0; /* end of the last accepted span */
    ds_status st;
    size_t i = 0;
    while (trie->n > 0 && i < n) {
        size_t len = 0;
        int32_t a = trie->first[s[i]] ? trie_longest(trie, s + i, n - i, &len) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        const tok_added *t = &tok->added[a];
        size_t start = i, stop = i + len;
        i = stop; /* the scan resumes after this match whether or not it is kept */
        if (t->special && !parse_special) continue;
        if (t->single_word) {
            size_t l;
            bool word_before = start > 0 && tok_is_word_char(char_before(s, start, &l));
            bool word_after = stop < n && tok_is_word_char(tok_utf8_decode(s + stop, n - stop, &l));
            if (word_before || word_after) continue;
        }
        if (t->lstrip) {
            while (start > done) {
                size_t l;
                if (!tok_is_whitespace(char_before(s, start, &l))) break;
                start -= l;
            }
        }
        if (t->rstrip) {
            while (stop < n) {
                size_t l;
                if (!tok_is_whitespace(tok_utf8_decode(s + stop, n - stop, &l))) break;
                stop += l;
            }
        }
        if (done < start && (st = spans_push(out, done, start, -1, err)) != DS_OK) return st;
        if ((st = spans_push(out, start, stop, a, err)) != DS_OK) return st;
        done = stop;
        if (i < done) i = done; /* rstrip swallowed text: never overlap */
    }
    if (done < n && (st = spans_push(out, done, n, -1, err)) != DS_OK) return st;
    return DS_OK;
}
