/* bench_client.h — one streaming request of the serving benchmark (libcurl easy handle, run
 * on the calling thread) and what was measured. */
#ifndef DS_BENCH_CLIENT_H
#define DS_BENCH_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "bench/bench_serve.h"

typedef struct ds_bench_request {
    /* in */
    const char *url;      /* full endpoint URL */
    const char *body;     /* JSON with "stream": true and stream_options.include_usage */
    const char *api_key;  /* NULL: no Authorization header */
    double timeout_s;
    /* out */
    bool ok;
    char error[256];
    long http_status;
    int prompt_tokens, output_tokens; /* from the usage chunk (-1 when absent) */
    int cached_tokens;    /* usage.prompt_tokens_details.cached_tokens (-1 when absent) */
    int32_t *out_ids;     /* [n_out_ids] the choices' token_ids (a body with return_token_ids) */
    int n_out_ids, cap_out_ids;
    int n_content_chunks;
    double t_send;        /* monotonic seconds */
    double t_end;
    double ttft, e2el;    /* seconds from send */
    double *itl;          /* [n_itl] gaps between content chunks (owned) */
    int n_itl, cap_itl;
    /* private */
    double t_prev;
    bool done_seen, error_seen;
    ds_sse_reader sse;
    ds_strbuf errbody;
} ds_bench_request;

double ds_bench_now(void);
/* Blocking; fills the out fields. */
void ds_bench_request_run(ds_bench_request *r);
void ds_bench_request_free(ds_bench_request *r);
/* One SSE event's data (the stream's reader calls it; public for tests): a chunk whose choice
 * has text, content, reasoning or token ids counts as a token arrival (TTFT, then ITL). */
void ds_bench_request_event(ds_bench_request *r, const char *data, size_t len);

/* GET url (with the key) into *body (malloc'd). Returns the HTTP status or -1 (error in err). */
long ds_bench_http_get(const char *url, const char *api_key, double timeout_s, char **body,
                       char *err, size_t err_cap);

#endif
