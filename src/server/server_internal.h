/* server_internal.h — what the server's files share: the server object, per-connection state
 * and the handlers (http.c routes, openai_handlers.c generates). */
#ifndef DS_SERVER_INTERNAL_H
#define DS_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "sampling/json_grammar.h"
#include "server/metrics.h"
#include "server/openai_req.h"
#include "server/server.h"
#include "server/strbuf.h"

struct ds_server {
    ds_server_opts o;          /* strings owned (copied at start) */
    char *names_buf[DS_SERVER_MAX_NAMES];
    char *host, *api_key, *model_root, *info_json;
    ds_engine *eng;
    const ds_tokenizer *tok;
    ds_json_vocab json_vocab;  /* the tokenizer's byte strings for JSON mode (json_mode.c) */
    const ds_chat_formatter *chat;
    struct MHD_Daemon *daemon;
    int port;
    ds_metrics metrics;
    atomic_bool stopping;
    atomic_ullong next_id;
    unsigned long long id_salt;
};

typedef enum ds_route {
    DS_ROUTE_NONE = 0,
    DS_ROUTE_COMPLETIONS,
    DS_ROUTE_CHAT,
    DS_ROUTE_MODELS,
    DS_ROUTE_HEALTH,
    DS_ROUTE_METRICS,
    DS_ROUTE_TOKENIZE,
    DS_ROUTE_DETOKENIZE,
    DS_ROUTE_MODEL,   /* GET /v1/models/{id}: OpenAI's models.retrieve */
    DS_ROUTE_VERSION, /* GET /version (vLLM) */
} ds_route;

/* Per connection-request state (MHD's con_cls). */
typedef struct ds_conn {
    ds_server *srv;
    ds_route route;
    ds_strbuf body;
    bool too_large;
    bool responded; /* a response was queued early (401/413) */
    double t_arrival;
} ds_conn;

/* ---- http.c helpers used by the handlers ---- */
/* Queues a JSON (or other) body with status; counts it in the metrics. */
enum MHD_Result ds_http_respond(ds_server *s, struct MHD_Connection *c, int status,
                                const char *content_type, char *body_owned, size_t len,
                                const char *retry_after);
enum MHD_Result ds_http_error(ds_server *s, struct MHD_Connection *c, const ds_oai_error *e);
/* True when the peer closed the connection (checked while waiting for tokens). */
bool ds_http_client_gone(struct MHD_Connection *c);

/* ---- json_mode.c ---- */
/* The byte strings of tok's ids [0, vocab) for JSON mode's mask: special tokens and tokens
 * without bytes never continue a document (NULL). False when out of memory. */
bool ds_json_vocab_build(const ds_tokenizer *tok, ds_json_vocab *v);

/* ---- openai_handlers.c ---- */
enum MHD_Result ds_handle_generate(ds_conn *cs, struct MHD_Connection *c);
enum MHD_Result ds_handle_tokenize(ds_conn *cs, struct MHD_Connection *c);
enum MHD_Result ds_handle_detokenize(ds_conn *cs, struct MHD_Connection *c);

#endif
