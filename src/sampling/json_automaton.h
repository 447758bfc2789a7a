/* json_automaton.h — what JSON mode (json_grammar.c) and structured outputs (json_schema.c)
 * share: JSON's byte classes, the whitespace-run rule, and the token mask over a byte automaton.
 * Internal to sampling/. */
#ifndef DS_SAMPLING_JSON_AUTOMATON_H
#define DS_SAMPLING_JSON_AUTOMATON_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "sampling/json_grammar.h"

static inline bool json_is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline bool json_is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline bool json_is_hex(uint8_t c) {
    return json_is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* One whitespace byte between tokens (json_grammar.h): a run is " ", or "\n" then at most
 * DS_JSON_MAX_INDENT of [ \t]. *ws counts the run's bytes, *nl says it began with '\n'; false
 * (nothing changed) when c cannot continue the run. */
static inline bool json_ws_run(uint8_t *ws, bool *nl, uint8_t c) {
    if (*ws == 0) {
        if (c != ' ' && c != '\n') return false;
        *nl = c == '\n';
        *ws = 1;
        return true;
    }
    if (!*nl || (c != ' ' && c != '\t') || *ws > DS_JSON_MAX_INDENT) return false;
    (*ws)++;
    return true;
}

/* One byte into an automaton's state (a plain value); false when c cannot be fed (the state may
 * then be changed: callers step copies). */
typedef bool (*json_step_fn)(void *state, const void *ctx, uint8_t c);

#define JSON_MASK_MAX_STATE 512 /* bytes of the largest state json_mask_run copies */

/* The token mask of JSON mode over any byte automaton: −inf for every id in [0, n_logits) whose
 * bytes cannot all be fed from `state` (size bytes, stepped by step(copy, ctx, byte)); end_ids
 * (EOS, stop ids) keep their logits exactly when `done`, and then alone. Cost: a 256-entry
 * table of allowed first bytes rules most ids out unread; inside a string (in_string) tokens of
 * plain bytes (v->plain) stay allowed unread; elsewhere a table of allowed byte pairs rules out
 * the many tokens that start with an allowed space and fail on their second byte. static inline
 * so that each automaton's step is called directly (its one caller per file inlines it). */
static inline void json_mask_run(const void *state, size_t size, json_step_fn step, const void *ctx,
                                 bool done, bool in_string, const ds_json_vocab *v,
                                 const int *end_ids, int n_end, float *logits, int n_logits) {
    DS_ASSERT(size <= JSON_MASK_MAX_STATE);
    unsigned char t[JSON_MASK_MAX_STATE], t1[JSON_MASK_MAX_STATE];
    float saved[256];
    const int n_saved = n_end < 256 ? n_end : 256;
    for (int i = 0; i < n_saved; i++)
        saved[i] = end_ids[i] >= 0 && end_ids[i] < n_logits ? logits[end_ids[i]] : -INFINITY;
    bool first_ok[256];
    for (int c = 0; c < 256; c++) {
        memcpy(t, state, size);
        first_ok[c] = !done && step(t, ctx, (uint8_t)c);
    }
    static _Thread_local bool second_ok[256][256];
    const bool pairs = !in_string && !done;
    for (int c1 = 0; pairs && c1 < 256; c1++) {
        if (!first_ok[c1]) continue;
        memcpy(t1, state, size);
        step(t1, ctx, (uint8_t)c1);
        for (int c2 = 0; c2 < 256; c2++) {
            memcpy(t, t1, size);
            second_ok[c1][c2] = step(t, ctx, (uint8_t)c2);
        }
    }
    DS_ASSERT(v->head && v->plain); /* ds_json_vocab_index */
    for (int id = 0; id < n_logits; id++) {
        const uint32_t len = id < v->n ? v->len[id] : 0; /* 0: no bytes */
        const uint16_t h = len ? v->head[id] : 0;
        if (!len || !first_ok[h & 0xff]) {
            logits[id] = -INFINITY;
            continue;
        }
        if (in_string && v->plain[id]) continue; /* stays inside the string */
        if (pairs && len >= 2 && !second_ok[h & 0xff][h >> 8]) {
            logits[id] = -INFINITY;
            continue;
        }
        memcpy(t, state, size);
        for (uint32_t i = 0; i < len; i++) {
            if (!step(t, ctx, v->bytes[id][i])) {
                logits[id] = -INFINITY;
                break;
            }
        }
    }
    for (int i = 0; i < n_saved; i++)
        if (end_ids[i] >= 0 && end_ids[i] < n_logits)
            logits[end_ids[i]] = done ? saved[i] : -INFINITY;
}

#endif
