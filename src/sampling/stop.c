#include "sampling/stop.h"

#include <stdlib.h>
#include <string.h>

ds_status ds_stop_matcher_init(ds_stop_matcher *m, const char *const *stops, int n_stops,
                               bool include_stop_str_in_output, int min_tokens, ds_error *err) {
    memset(m, 0, sizeof *m);
    if (n_stops < 0 || (n_stops > 0 && !stops))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "stop: bad stop string array (%d)", n_stops);
    m->include_stop = include_stop_str_in_output;
    m->min_tokens = min_tokens;
    size_t longest = 0;
    if (n_stops > 0) {
        m->stops = calloc((size_t)n_stops, sizeof *m->stops);
        m->stop_len = calloc((size_t)n_stops, sizeof *m->stop_len);
        if (!m->stops || !m->stop_len) goto nomem;
        m->n_stops = n_stops;
        for (int i = 0; i < n_stops; i++) {
            if (!stops[i] || !stops[i][0])
                return ds_error_set(err, DS_ERR_INVALID_ARG, "stop[%d] is empty", i);
            size_t n = strlen(stops[i]);
            m->stops[i] = malloc(n + 1);
            if (!m->stops[i]) goto nomem;
            memcpy(m->stops[i], stops[i], n + 1);
            m->stop_len[i] = n;
            if (n > longest) longest = n;
        }
    }
    /* History needed: a match ending in the next chunk may start up to longest-1 bytes back;
     * and up to 3 bytes of an incomplete UTF-8 sequence may be held. */
    m->keep = longest > 4 ? longest - 1 : 3;
    m->win = malloc(m->keep);
    if (!m->win) goto nomem;
    return DS_OK;
nomem:
    return ds_error_set(err, DS_ERR_NOMEM, "out of memory for the stop-string matcher");
}

ds_status ds_stop_matcher_init_params(ds_stop_matcher *m, const ds_sampling_params *p,
                                      ds_error *err) {
    return ds_stop_matcher_init(m, p->stop, p->n_stop, p->include_stop_str_in_output,
                                p->min_tokens, err);
}

void ds_stop_matcher_free(ds_stop_matcher *m) {
    if (m->stops)
        for (int i = 0; i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->stop_len);
    free(m->win);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

/* Length of an incomplete (but so far well-formed) UTF-8 sequence at the end of b[0..n). */
static size_t utf8_incomplete_tail(const char *b, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)b[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t need = 1;
        if (c >= 0xC2 && c <= 0xDF) need = 2;
        else if (c >= 0xE0 && c <= 0xEF) need = 3;
        else if (c >= 0xF0 && c <= 0xF4) need = 4;
        return need > k ? k : 0;
    }
    return 0;
}

/* Longest suffix of b[0..n) that is a proper prefix of some stop string. */
static size_t stop_prefix_tail(const ds_stop_matcher *m, const char *b, size_t n) {
    size_t best = 0;
    for (int j = 0; j < m->n_stops; j++) {
        const char *s = m->stops[j];
        size_t kmax = m->stop_len[j] - 1;
        if (kmax > n) kmax = n;
        for (size_t k = kmax; k > best; k--)
            if (b[n - k] == s[0] && memcmp(b + n - k, s, k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

static ds_status ensure_buf(ds_stop_matcher *m, size_t need) {
    if (m->buf && need <= m->buf_cap) return DS_OK;
    size_t cap = m->buf_cap ? m->buf_cap : 256;
    while (cap < need) cap *= 2;
    char *b = realloc(m->buf, cap);
    if (!b) return DS_ERR_NOMEM;
    m->buf = b;
    m->buf_cap = cap;
    return DS_OK;
}

ds_status ds_stop_matcher_feed(ds_stop_matcher *m, const char *text, size_t len,
                               ds_stop_result *r, ds_error *err) {
    r->text = "";
    r->len = 0;
    r->stop_index = -1;
    r->match_offset = 0;
    if (m->stopped) return DS_OK;
    m->n_fed++;

    const size_t n = m->win_len + len;
    if (ensure_buf(m, n) != DS_OK)
        return ds_error_set(err, DS_ERR_NOMEM, "out of memory in the stop-string matcher");
    char *b = m->buf;
    memcpy(b, m->win, m->win_len);
    if (len) memcpy(b + m->win_len, text, len);
    const size_t emit_start = m->win_len - m->held; /* b[emit_start..) not yet released */
    const uint64_t base = m->n_bytes - m->win_len;  /* stream offset of b[0] */
    m->n_bytes += len;

    if (m->n_stops > 0 && len > 0 && m->n_fed > m->min_tokens) {
        int best = -1;
        size_t best_start = 0, best_end = 0;
        for (int j = 0; j < m->n_stops; j++) {
            const size_t L = m->stop_len[j];
            if (L > n) continue;
            /* Only matches that end inside the new chunk: older text was searched before. */
            const size_t from = m->win_len + 1 > L ? m->win_len + 1 - L : 0;
            const char *hit = memmem(b + from, n - from, m->stops[j], L);
            if (!hit) continue;
            const size_t st = (size_t)(hit - b), end = st + L;
            if (best < 0 || end < best_end || (end == best_end && st < best_start)) {
                best = j;
                best_start = st;
                best_end = end;
            }
        }
        if (best >= 0) {
            size_t cut = m->include_stop ? best_end : best_start;
            if (cut < emit_start) cut = emit_start; /* cannot happen: a match's head is held */
            r->text = b + emit_start;
            r->len = cut - emit_start;
            r->stop_index = best;
            r->match_offset = base + best_start;
            m->stopped = true;
            m->held = 0;
            return DS_OK;
        }
    }

    size_t hold = m->include_stop ? 0 : stop_prefix_tail(m, b, n);
    size_t u = utf8_incomplete_tail(b, n);
    if (u > hold) hold = u;
    size_t emit_end = n - hold;
    if (emit_end < emit_start) emit_end = emit_start;
    r->text = b + emit_start;
    r->len = emit_end - emit_start;

    const size_t w = n < m->keep ? n : m->keep;
    memcpy(m->win, b + n - w, w);
    m->win_len = w;
    m->held = n - emit_end;
    DS_ASSERT(m->held <= m->win_len);
    return DS_OK;
}

void ds_stop_matcher_flush(ds_stop_matcher *m, ds_stop_result *r) {
    r->stop_index = -1;
    r->match_offset = 0;
    r->text = m->win ? m->win + (m->win_len - m->held) : "";
    r->len = m->held;
    m->held = 0;
}
