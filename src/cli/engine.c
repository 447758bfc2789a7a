#include "cli/engine.h"

#include <stdio.h>
#include <string.h>

#include "model/loader.h"

ds_status ds_cli_backend_create(const char *device, int threads, ds_backend **out, ds_error *err) {
    if (!device || !strcmp(device, "auto")) {
        ds_error ignored = {0};
        if (ds_backend_cuda_create(0, out, &ignored) == DS_OK) return DS_OK;
        return ds_backend_cpu_create(threads, out, err);
    }
    if (!strcmp(device, "cpu")) return ds_backend_cpu_create(threads, out, err);
    if (!strcmp(device, "cuda")) return ds_backend_cuda_create(0, out, err);
    return ds_error_set(err, DS_ERR_INVALID_ARG, "--device: unknown device '%s' (cpu, cuda, auto)",
                        device);
}

bool ds_cli_engine_open(ds_cli_engine *e, const ds_cli_engine_opts *o, const char *cmd) {
    *e = (ds_cli_engine){0};
    ds_error err = {0};
    if (!o->model_dir) {
        fprintf(stderr, "deltaserve %s: -m DIR is required\n", cmd);
        return false;
    }
    if (ds_model_load(o->model_dir, &e->cfg, &e->host, &err) != DS_OK) goto fail;
    e->host_loaded = true;
    if (ds_cli_backend_create(o->device, o->threads, &e->be, &err) != DS_OK) goto fail;
    int max_len = o->max_len;
    if (max_len <= 0 || max_len > e->cfg.max_position) max_len = e->cfg.max_position;
    int max_tokens = o->max_tokens > 0 ? o->max_tokens : 512;
    int max_out = o->max_out > 0 ? o->max_out : 1;
    if (max_out > max_tokens) max_out = max_tokens;
    if (ds_model_init(&e->model, e->be, &e->cfg, &e->host, max_tokens, max_out, &err) != DS_OK)
        goto fail;
    e->model_ready = true;
    if (ds_session_init(&e->sess, &e->model, o->n_slots > 0 ? o->n_slots : 1, max_len, &err) !=
        DS_OK)
        goto fail;
    e->sess_ready = true;
    return true;
fail:
    fprintf(stderr, "deltaserve %s: %s\n", cmd, err.msg[0] ? err.msg : ds_status_name(err.status));
    ds_cli_engine_close(e);
    return false;
}

void ds_cli_engine_close(ds_cli_engine *e) {
    if (e->sess_ready) ds_session_free(&e->sess);
    if (e->model_ready) ds_model_free(&e->model);
    if (e->be) e->be->ops->destroy(e->be);
    if (e->host_loaded) ds_model_weights_free(&e->host);
    *e = (ds_cli_engine){0};
}
