/* stop.h — stop strings on the detokenised output stream.
 *
 * The engine feeds the matcher the new text of every generated token (the UTF-8 chunk its
 * incremental detokeniser produced, possibly empty) and streams out only what the matcher
 * releases. The matcher holds back the shortest tail that could still grow into a stop string
 * (and an incomplete UTF-8 sequence at the very end), so no byte of a stop string ever reaches
 * the client unless include_stop_str_in_output is set.
 *
 * Semantics (vLLM detokenizer + OpenAI):
 *  - The match that completes first in the text stream wins (earliest end; at equal ends the
 *    longer stop string), which makes the outcome independent of how the text was chunked.
 *  - The output is truncated before the stop string, or after it with
 *    include_stop_str_in_output; text after it (even within the same chunk) is dropped.
 *  - Stop strings are only checked once more than min_tokens tokens were fed (vLLM checks when
 *    len(output_token_ids) > min_tokens); a match must end in text fed after that point.
 *  - When generation ends for another reason (EOS, length), ds_stop_matcher_flush releases the
 *    held-back tail. As in vLLM, the text of a finishing EOS / stop_token_id token is not fed
 *    (it is not part of the output) unless include_stop_str_in_output. */
#ifndef DS_SAMPLING_STOP_H
#define DS_SAMPLING_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "sampling/params.h"

typedef struct ds_stop_matcher {
    char **stops;       /* [n_stops] owned copies */
    size_t *stop_len;   /* [n_stops] bytes */
    int n_stops;
    size_t keep;        /* bytes of history kept in win: max(longest stop - 1, 3) */
    bool include_stop;
    int min_tokens;
    int n_fed;          /* feed calls so far (= tokens) */
    char *win;          /* [keep] the last bytes of the text fed so far */
    size_t win_len;
    size_t held;        /* trailing bytes of win not released yet (≤ win_len) */
    uint64_t n_bytes;   /* total bytes fed */
    char *buf;          /* win + new chunk; released text points into it */
    size_t buf_cap;
    bool stopped;
} ds_stop_matcher;

typedef struct ds_stop_result {
    const char *text;      /* text safe to emit now; valid until the next call on the matcher */
    size_t len;
    int stop_index;        /* which stop string matched (index into the init array), or -1 */
    uint64_t match_offset; /* byte offset of that stop string in the whole fed text */
} ds_stop_result;

/* Copies the stop strings (validated by ds_sampling_params_validate: non-empty, ≤
 * DS_SAMPLING_MAX_STOP_LEN bytes, UTF-8). n_stops may be 0: the matcher then only holds back an
 * incomplete trailing UTF-8 sequence. Free with ds_stop_matcher_free (also after failure). */
ds_status ds_stop_matcher_init(ds_stop_matcher *m, const char *const *stops, int n_stops,
                               bool include_stop_str_in_output, int min_tokens, ds_error *err);
/* Same, from a request's parameters (stop, include_stop_str_in_output, min_tokens). */
ds_status ds_stop_matcher_init_params(ds_stop_matcher *m, const ds_sampling_params *p,
                                      ds_error *err);
void ds_stop_matcher_free(ds_stop_matcher *m);

/* Feeds the text of one generated token (len may be 0). After a match, r->stop_index >= 0 and
 * later feeds release nothing. Fails only with DS_ERR_NOMEM. */
ds_status ds_stop_matcher_feed(ds_stop_matcher *m, const char *text, size_t len,
                               ds_stop_result *r, ds_error *err);

/* End of generation without a stop string: releases everything still held. */
void ds_stop_matcher_flush(ds_stop_matcher *m, ds_stop_result *r);

#endif
