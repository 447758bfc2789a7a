#include "bench/bench_client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

double ds_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void add_itl(ds_bench_request *r, double gap) {
    if (r->n_itl == r->cap_itl) {
        int cap = r->cap_itl ? 2 * r->cap_itl : 64;
        double *p = realloc(r->itl, (size_t)cap * sizeof *p);
        if (!p) return;
        r->itl = p;
        r->cap_itl = cap;
    }
    r->itl[r->n_itl++] = gap;
}

static bool nonempty_string(const cJSON *v) { return cJSON_IsString(v) && v->valuestring[0]; }

/* Appends a chunk's token_ids (multi-turn conversations feed them back). */
static void add_ids(ds_bench_request *r, const cJSON *ids) {
    const cJSON *x;
    cJSON_ArrayForEach(x, ids) {
        if (!cJSON_IsNumber(x)) continue;
        if (r->n_out_ids == r->cap_out_ids) {
            int cap = r->cap_out_ids ? 2 * r->cap_out_ids : 256;
            int32_t *p = realloc(r->out_ids, (size_t)cap * sizeof *p);
            if (!p) {
                snprintf(r->error, sizeof r->error, "out of memory for token_ids");
                r->error_seen = true;
                return;
            }
            r->out_ids = p;
            r->cap_out_ids = cap;
        }
        r->out_ids[r->n_out_ids++] = (int32_t)x->valuedouble;
    }
}

void ds_bench_request_event(ds_bench_request *r, const char *data, size_t len) {
    double now = ds_bench_now();
    r->t_end = now;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done_seen = true;
        return;
    }
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (!o) {
        snprintf(r->error, sizeof r->error, "unparsable stream event: %.80s", data);
        r->error_seen = true;
        return;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        snprintf(r->error, sizeof r->error, "stream error: %.200s",
                 cJSON_IsString(m) ? m->valuestring : "(no message)");
        r->error_seen = true;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *c0 = cJSON_IsArray(choices) ? choices->child : NULL;
    if (c0) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c0, "token_ids");
        if (cJSON_IsArray(ids)) add_ids(r, ids);
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        /* a token arrived: text, or token ids (return_token_ids) where the detokenizer holds the
         * text back — random ids of dummy weights are mostly incomplete UTF-8, whose text came
         * in bursts (TTFT of 300 ms for a 100 ms prefill, s17-run1); vLLM's client likewise
         * counts every chunk, text or not */
        bool content = (cJSON_IsArray(ids) && cJSON_GetArraySize(ids) > 0) ||
                       nonempty_string(cJSON_GetObjectItemCaseSensitive(c0, "text")) ||
                       (delta && (nonempty_string(cJSON_GetObjectItemCaseSensitive(delta, "content")) ||
                                  nonempty_string(cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content"))));
        if (content) {
            if (r->n_content_chunks == 0) r->ttft = now - r->t_send;
            else add_itl(r, now - r->t_prev);
            r->t_prev = now;
            r->n_content_chunks++;
        }
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(usage)) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        if (cJSON_IsNumber(p)) r->prompt_tokens = p->valueint;
        if (cJSON_IsNumber(c)) r->output_tokens = c->valueint;
        const cJSON *det = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(det, "cached_tokens");
        if (cJSON_IsNumber(ct)) r->cached_tokens = ct->valueint;
    }
    cJSON_Delete(o);
}

static void on_data(void *ctx, const char *data, size_t len) { ds_bench_request_event(ctx, data, len); }

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    ds_bench_request *r = ud;
    size_t n = size * nmemb;
    if (r->http_status != 200) ds_strbuf_append(&r->errbody, ptr, n);
    else ds_sse_feed(&r->sse, ptr, n);
    return n;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud) {
    ds_bench_request *r = ud;
    size_t n = size * nitems;
    int code;
    if (n > 9 && !memcmp(buf, "HTTP/", 5) && sscanf(buf, "HTTP/%*s %d", &code) == 1)
        r->http_status = code; /* the last status line wins (100 Continue first) */
    return n;
}

void ds_bench_request_run(ds_bench_request *r) {
    r->ok = false;
    r->error[0] = 0;
    r->prompt_tokens = r->output_tokens = r->cached_tokens = -1;
    r->n_out_ids = 0;
    ds_sse_init(&r->sse, on_data, r);
    ds_strbuf_init(&r->errbody);
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(r->error, sizeof r->error, "curl_easy_init failed");
        return;
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, "Accept: text/event-stream");
    hdr = curl_slist_append(hdr, "Expect:");
    char auth[512];
    if (r->api_key && r->api_key[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->api_key);
        hdr = curl_slist_append(hdr, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, r->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (r->timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(r->timeout_s * 1000));
    r->t_send = ds_bench_now();
    CURLcode cc = curl_easy_perform(h);
    double t_done = ds_bench_now();
    if (!r->t_end) r->t_end = t_done;
    r->e2el = r->t_end - r->t_send;
    if (cc != CURLE_OK) {
        snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(cc));
    } else if (r->http_status != 200) {
        const char *msg = NULL;
        cJSON *o = r->errbody.data ? cJSON_Parse(r->errbody.data) : NULL;
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        if (cJSON_IsString(m)) msg = m->valuestring;
        snprintf(r->error, sizeof r->error, "HTTP %ld: %.200s", r->http_status,
                 msg ? msg : (r->errbody.data ? r->errbody.data : ""));
        cJSON_Delete(o);
    } else if (!r->error_seen && !r->done_seen) {
        snprintf(r->error, sizeof r->error, "the stream ended without [DONE]");
    } else if (!r->error_seen) {
        r->ok = true;
        if (r->output_tokens < 0) r->output_tokens = r->n_content_chunks;
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    ds_sse_free(&r->sse);
    ds_strbuf_free(&r->errbody);
}

void ds_bench_request_free(ds_bench_request *r) {
    free(r->itl);
    r->itl = NULL;
    r->n_itl = r->cap_itl = 0;
    free(r->out_ids);
    r->out_ids = NULL;
    r->n_out_ids = r->cap_out_ids = 0;
}

static size_t on_get(char *ptr, size_t size, size_t nmemb, void *ud) {
    ds_strbuf_append(ud, ptr, size * nmemb);
    return size * nmemb;
}

long ds_bench_http_get(const char *url, const char *api_key, double timeout_s, char **body,
                       char *err, size_t err_cap) {
    *body = NULL;
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, err_cap, "curl_easy_init failed");
        return -1;
    }
    ds_strbuf b;
    ds_strbuf_init(&b);
    struct curl_slist *hdr = NULL;
    char auth[512];
    if (api_key && api_key[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        hdr = curl_slist_append(hdr, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_get);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode cc = curl_easy_perform(h);
    long status = -1;
    if (cc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else snprintf(err, err_cap, "%s: %s", url, curl_easy_strerror(cc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    *body = ds_strbuf_take(&b, NULL);
    return status;
}
