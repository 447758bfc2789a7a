/* http.c — the libmicrohttpd daemon: routing, body intake with a size limit, authentication,
 * responses, /health, /v1/models, /metrics. Generation lives in openai_handlers.c.
 *
 * Threading: MHD_USE_THREAD_PER_CONNECTION, so a handler may block while it waits for tokens
 * (it polls the engine in 100 ms slices and checks for a vanished client or a stopping server
 * between slices), and a streaming content reader may block the same way. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/gen.h"
#include "server/server_internal.h"

#define DEFAULT_MAX_BODY (8u << 20)
#define DEFAULT_MAX_CONNECTIONS 512

static const char *status_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

enum MHD_Result ds_http_respond(ds_server *s, struct MHD_Connection *c, int status,
                                const char *content_type, char *body_owned, size_t len,
                                const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body_owned ? body_owned : "",
                                                             body_owned ? MHD_RESPMEM_MUST_FREE
                                                                        : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body_owned);
        return MHD_NO;
    }
    if (content_type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (retry_after) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ds_metrics_count_http(&s->metrics, status);
    return ret;
}

enum MHD_Result ds_http_error(ds_server *s, struct MHD_Connection *c, const ds_oai_error *e) {
    char *body = ds_oai_error_json(e);
    const char *retry = e->status == 503 || e->status == 429 ? "1" : NULL;
    return ds_http_respond(s, c, e->status, "application/json", body, body ? strlen(body) : 0,
                           retry);
}

static enum MHD_Result simple_error(ds_server *s, struct MHD_Connection *c, int status,
                                    const char *code, const char *msg) {
    ds_oai_error e;
    ds_oai_error_set(&e, status, status_type(status), code, NULL, "%s", msg);
    return ds_http_error(s, c, &e);
}

static enum MHD_Result too_large(ds_server *s, struct MHD_Connection *c) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes",
             s->o.max_body_bytes);
    return simple_error(s, c, 413, "request_too_large", msg);
}

bool ds_http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true; /* orderly shutdown by the peer */
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    return false;
}

/* ---- routes ------------------------------------------------------------------------------ */

static ds_route route_of(const char *url) {
    if (!strcmp(url, "/v1/completions")) return DS_ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return DS_ROUTE_CHAT;
    if (!strcmp(url, "/v1/models")) return DS_ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return DS_ROUTE_MODEL;
    /* /ping: vLLM's (and SageMaker's) liveness path, the same as /health */
    if (!strcmp(url, "/health") || !strcmp(url, "/ping")) return DS_ROUTE_HEALTH;
    if (!strcmp(url, "/version")) return DS_ROUTE_VERSION;
    if (!strcmp(url, "/metrics")) return DS_ROUTE_METRICS;
    if (!strcmp(url, "/tokenize")) return DS_ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return DS_ROUTE_DETOKENIZE;
    return DS_ROUTE_NONE;
}

static bool route_is_post(ds_route r) {
    return r == DS_ROUTE_COMPLETIONS || r == DS_ROUTE_CHAT || r == DS_ROUTE_TOKENIZE ||
           r == DS_ROUTE_DETOKENIZE;
}

/* Constant-time comparison of the bearer token with the key. */
static bool authorized(const ds_server *s, struct MHD_Connection *c) {
    if (!s->api_key || !s->api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    const char *tok = h + 7;
    size_t lt = strlen(tok), lk = strlen(s->api_key);
    unsigned diff = (unsigned)(lt ^ lk);
    for (size_t i = 0; i < lt; i++) diff |= (unsigned char)tok[i] ^ (unsigned char)s->api_key[i % (lk ? lk : 1)];
    return diff == 0;
}

/* The model object of served name i (the /v1/models list entry, and /v1/models/{id}). */
static cJSON *model_object(const ds_server *s, int i) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->o.served_names[i]);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(long long)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "deltaserve");
    cJSON_AddStringToObject(m, "root", s->model_root ? s->model_root : s->o.served_names[0]);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->o.max_model_len);
    cJSON *info = s->info_json ? cJSON_Parse(s->info_json) : NULL;
    if (!info) info = cJSON_CreateObject();
    cJSON_AddNumberToObject(info, "vocab_size", s->o.vocab);
    cJSON_AddItemToObject(m, "deltaserve", info);
    return m;
}

static enum MHD_Result respond_json(ds_server *s, struct MHD_Connection *c, cJSON *root) {
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return ds_http_respond(s, c, 200, "application/json", body, body ? strlen(body) : 0, NULL);
}

static enum MHD_Result handle_models(ds_server *s, struct MHD_Connection *c) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (int i = 0; i < s->o.n_served_names; i++) cJSON_AddItemToArray(data, model_object(s, i));
    return respond_json(s, c, root);
}

/* GET /v1/models/{id}: the served name's object, else 404 model_not_found. The id is the rest
 * of the path as libmicrohttpd decoded it (a name with '/' in it, "org/model", included). */
static enum MHD_Result handle_model(ds_server *s, struct MHD_Connection *c, const char *url) {
    const char *id = url + strlen("/v1/models/");
    for (int i = 0; i < s->o.n_served_names; i++)
        if (!strcmp(id, s->o.served_names[i])) return respond_json(s, c, model_object(s, i));
    char msg[320];
    snprintf(msg, sizeof msg, "the model '%.200s' does not exist", id);
    return simple_error(s, c, 404, "model_not_found", msg);
}

static enum MHD_Result handle_version(ds_server *s, struct MHD_Connection *c) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", s->o.version ? s->o.version : "unknown");
    return respond_json(s, c, root);
}

static enum MHD_Result handle_metrics(ds_server *s, struct MHD_Connection *c) {
    ds_engine_stats st;
    ds_engine_get_stats(s->eng, &st);
    ds_strbuf out;
    ds_strbuf_init(&out);
    ds_metrics_render(&s->metrics, &st, s->o.served_names[0], &out);
    size_t len = 0;
    char *body = ds_strbuf_take(&out, &len);
    return ds_http_respond(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    ds_server *s = cls;
    ds_conn *cs = *con_cls;
    if (!cs) { /* first call: headers only */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        cs->srv = s;
        cs->route = route_of(url);
        cs->t_arrival = ds_now_s();
        ds_strbuf_init(&cs->body);
        *con_cls = cs;
        bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
        bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
        if (cs->route == DS_ROUTE_NONE) {
            cs->responded = true;
            char msg[256];
            snprintf(msg, sizeof msg, "no route for %.200s", url);
            return simple_error(s, c, 404, NULL, msg);
        }
        if (route_is_post(cs->route) ? !post : !get) {
            cs->responded = true;
            char msg[256];
            snprintf(msg, sizeof msg, "method %.16s is not allowed on %.200s", method, url);
            return simple_error(s, c, 405, NULL, msg);
        }
        if (!strncmp(url, "/v1/", 4) && !authorized(s, c)) {
            cs->responded = true;
            return simple_error(s, c, 401, "invalid_api_key",
                                "incorrect or missing API key (send Authorization: Bearer KEY)");
        }
        if (post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes) {
                cs->responded = true;
                return too_large(s, c);
            }
            return MHD_YES; /* the body follows */
        }
    }
    if (cs->responded) { /* discard whatever is still uploaded */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_large) {
            if (cs->body.len + *upload_size > s->o.max_body_bytes) {
                cs->too_large = true;
                ds_strbuf_free(&cs->body);
            } else {
                ds_strbuf_append(&cs->body, upload_data, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is here */
    cs->responded = true;
    switch (cs->route) {
    case DS_ROUTE_HEALTH:
        return ds_http_respond(s, c, 200, NULL, NULL, 0, NULL);
    case DS_ROUTE_MODELS:
        return handle_models(s, c);
    case DS_ROUTE_MODEL:
        return handle_model(s, c, url);
    case DS_ROUTE_VERSION:
        return handle_version(s, c);
    case DS_ROUTE_METRICS:
        return handle_metrics(s, c);
    case DS_ROUTE_COMPLETIONS:
    case DS_ROUTE_CHAT: {
        if (cs->too_large) return too_large(s, c);
        if (!ds_strbuf_ok(&cs->body))
            return simple_error(s, c, 500, NULL, "out of memory reading the body");
        cs->t_arrival = ds_now_s();
        return ds_handle_generate(cs, c);
    }
    case DS_ROUTE_TOKENIZE:
    case DS_ROUTE_DETOKENIZE:
        if (cs->too_large) return too_large(s, c);
        if (!ds_strbuf_ok(&cs->body))
            return simple_error(s, c, 500, NULL, "out of memory reading the body");
        return cs->route == DS_ROUTE_TOKENIZE ? ds_handle_tokenize(cs, c) : ds_handle_detokenize(cs, c);
    default:
        return simple_error(s, c, 404, NULL, "no route");
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    ds_conn *cs = *con_cls;
    if (!cs) return;
    ds_strbuf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ---- start / stop ------------------------------------------------------------------------- */

static char *dup_or_null(const char *s) { return s ? ds_xstrdup(s) : NULL; }

static void server_free(ds_server *s) {
    for (int i = 0; i < DS_SERVER_MAX_NAMES; i++) free(s->names_buf[i]);
    free(s->host);
    free(s->api_key);
    free(s->model_root);
    free(s->info_json);
    ds_metrics_free(&s->metrics);
    ds_json_vocab_free(&s->json_vocab);
    free(s);
}

ds_status ds_server_start(ds_engine *eng, const ds_tokenizer *tok, const ds_server_opts *o,
                          ds_server **out, ds_error *err) {
    *out = NULL;
    if (!eng || !tok || !o || o->n_served_names < 1 || o->n_served_names > DS_SERVER_MAX_NAMES)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "server: an engine, a tokenizer and 1..%d served model names are "
                            "required", DS_SERVER_MAX_NAMES);
    if (o->port < 0 || o->port > 65535)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "--port: %d is outside [0, 65535]", o->port);
    ds_server *s = ds_xcalloc(1, sizeof *s);
    s->o = *o;
    for (int i = 0; i < o->n_served_names; i++) {
        s->names_buf[i] = ds_xstrdup(o->served_names[i]);
        s->o.served_names[i] = s->names_buf[i];
    }
    s->host = ds_xstrdup(o->host ? o->host : "127.0.0.1");
    s->api_key = dup_or_null(o->api_key);
    s->model_root = dup_or_null(o->model_root);
    s->info_json = dup_or_null(o->info_json);
    if (!s->o.max_body_bytes) s->o.max_body_bytes = DEFAULT_MAX_BODY;
    if (s->o.max_connections <= 0) s->o.max_connections = DEFAULT_MAX_CONNECTIONS;
    s->eng = eng;
    s->tok = tok;
    if (!ds_json_vocab_build(tok, &s->json_vocab)) {
        server_free(s);
        return ds_error_set(err, DS_ERR_NOMEM, "server: out of memory for the JSON-mode "
                            "vocabulary table");
    }
    s->chat = o->chat ? o->chat : ds_chat_formatter_qwen35();
    ds_metrics_init(&s->metrics);
    atomic_init(&s->stopping, false);
    atomic_init(&s->next_id, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt = (unsigned long long)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (unsigned long long)ts.tv_sec;

    /* Resolve host:port (numeric or a name such as localhost / ::). */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", o->port);
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->host, port_s, &hints, &ai);
    if (gai != 0 || !ai) {
        ds_error_set(err, DS_ERR_INVALID_ARG, "--host: cannot resolve '%s': %s", s->host,
                     gai_strerror(gai));
        server_free(s);
        return DS_ERR_INVALID_ARG;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        ds_error_set(err, DS_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this "
                     "machine?)", s->host, o->port);
        server_free(s);
        return DS_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return DS_OK;
}

int ds_server_port(const ds_server *s) { return s->port; }

void ds_server_stop(ds_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true); /* handlers notice within one 100 ms wait */
    MHD_stop_daemon(s->daemon);
    server_free(s);
}
