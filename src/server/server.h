/* server.h — deltaserve's OpenAI-compatible HTTP server (libmicrohttpd, one thread per
 * connection). HTTP threads parse, validate, tokenise and submit to the engine, then stream the
 * request's events out; they never touch the model.
 *
 * Endpoints: POST /v1/completions and /v1/chat/completions, GET /v1/models, GET /health,
 * GET /metrics (Prometheus). With an API key set, every /v1 path needs "Authorization: Bearer KEY".
 *
 *   ds_server_start(engine, tok, &opts, &srv, &err);   // listening when it returns
 *   ... ds_server_port(srv) ...
 *   ds_server_stop(srv);   // aborts in-flight requests, joins every connection thread
 * The engine and tokenizer must outlive the server. */
#ifndef DS_SERVER_H
#define DS_SERVER_H

#include <stddef.h>

#include "core/status.h"
#include "runtime/engine.h"
#include "server/chat_format.h"
#include "server/openai_req.h"
#include "tokenizer/tokenizer.h"

#define DS_SERVER_MAX_NAMES 8

typedef struct ds_server_opts {
    const char *host;               /* IPv4/IPv6 literal or name; default "127.0.0.1" */
    int port;                       /* 0 = an ephemeral port (see ds_server_port) */
    const char *api_key;            /* NULL/"" = no authentication */
    const char *served_names[DS_SERVER_MAX_NAMES]; /* accepted "model" values; [0] is reported */
    int n_served_names;
    const char *model_root;         /* model directory, reported as "root" in /v1/models */
    size_t max_body_bytes;          /* larger bodies get 413; 0 = 8 MiB */
    int max_connections;            /* concurrent connections (threads); 0 = 512 */
    int max_model_len;              /* the engine's context limit (for 400 context_length) */
    int vocab;                      /* model vocabulary (token-id prompts are checked) */
    const ds_chat_formatter *chat;  /* NULL = the built-in Qwen3.5 formatter */
    const char *info_json;          /* optional JSON object merged into /v1/models as "deltaserve" */
    ds_oai_defaults defaults;       /* sampling defaults (generation_config.json), may be empty */
    const char *version;            /* GET /version's "version" (borrowed); NULL = "unknown" */
} ds_server_opts;

typedef struct ds_server ds_server;

ds_status ds_server_start(ds_engine *eng, const ds_tokenizer *tok, const ds_server_opts *o,
                          ds_server **out, ds_error *err);
/* The port actually bound (useful with port 0). */
int ds_server_port(const ds_server *s);
/* Stops accepting, ends in-flight requests (aborting their engine requests), joins, frees. */
void ds_server_stop(ds_server *s);

#endif
