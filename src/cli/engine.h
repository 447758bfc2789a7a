/* engine.h — what every model-running CLI command sets up: config + weights from a model
 * directory, a backend (--device), the model bound to it, and a session. */
#ifndef DS_CLI_ENGINE_H
#define DS_CLI_ENGINE_H

#include <stdbool.h>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/session.h"

typedef struct ds_cli_engine_opts {
    const char *model_dir; /* -m */
    const char *device;    /* --device cpu|cuda|auto (default auto) */
    int threads;           /* --threads (0 = all cores) */
    int max_len;           /* context length for the session */
    int n_slots;
    int max_tokens;        /* rows per step */
    int max_out;           /* logit rows per step */
} ds_cli_engine_opts;

typedef struct ds_cli_engine {
    ds_config cfg;
    ds_model_weights host;
    bool host_loaded;
    ds_backend *be;
    ds_model model;
    bool model_ready;
    ds_session sess;
    bool sess_ready;
} ds_cli_engine;

/* Opens everything; prints a message naming what was wrong and returns false on failure
 * (everything opened so far is released). */
bool ds_cli_engine_open(ds_cli_engine *e, const ds_cli_engine_opts *o, const char *cmd);
void ds_cli_engine_close(ds_cli_engine *e);

/* Picks the backend named by `device` ("cpu", "cuda", "auto"/NULL). */
ds_status ds_cli_backend_create(const char *device, int threads, ds_backend **out, ds_error *err);

#endif
