/* deltaserve bench — the offline engine benchmark (docs: ../shared/docs/benchmarking.md):
 *   deltaserve bench -m DIR [--dummy-weights] [--prompt-len 1024] [--batch 1,4,8]
 *                    [--steps 512] [--warmup 8] [--json-out FILE] [--device D] [--threads N]
 * Measures prefill time for one prompt and the decode step time at each batch size over a long
 * generation (greedy, argmax on the device, tokens fed back), and prints per step the kernels
 * launched, the bytes of weights and state read (estimated from the shape), the achieved GB/s
 * and its ratio to the copy bandwidth the backend measured at start. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "cli/engine.h"
#include "model/dummy_weights.h"
#include "model/loader.h"
#include "model/model_info.h"

#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown"
#endif

#define BENCH_MAX_BATCHES 16

typedef struct bench_args {
    const char *model_dir, *device, *json_out, *batches_arg;
    bool dummy;
    uint64_t seed;
    int threads, prompt_len, steps, warmup, repeats;
} bench_args;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy-style linear percentile of sorted v[n]. */
static double percentile(const double *v, int n, double q) {
    if (n == 1) return v[0];
    double pos = q / 100.0 * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

/* Bytes one decode step must read at batch B: every non-expert weight once, the experts the
 * batch selects (expected distinct count under uniform routing), the lm_head, GDN state read
 * and written (fp32) per sequence, and the KV cache of each sequence's context. */
static double step_bytes(const ds_config *c, int B, int ctx, size_t weight_bytes) {
    ds_model_info mi;
    ds_model_info_compute(c, DS_DTYPE_BF16, DS_DTYPE_BF16, &mi);
    double active = (double)mi.params_active;
    if (c->is_moe && B > 1) {
        double E = c->n_experts, k = c->top_k;
        double distinct = E * (1.0 - pow(1.0 - k / E, B));
        double per_expert = 3.0 * c->hidden * (double)c->moe_inter;
        active += (double)c->n_layers * (distinct - k) * per_expert;
    }
    return active * (double)weight_bytes + 2.0 * (double)B * (double)mi.gdn_state_bytes +
           (double)B * (double)ctx * (double)mi.kv_bytes_per_token;
}

static int parse(int argc, char **argv, bench_args *a) {
    const char *cmd = "bench";
    bool bad = false;
    *a = (bench_args){.prompt_len = 1024, .steps = 512, .warmup = 8, .repeats = 3,
                      .batches_arg = "1,4,8", .seed = 1};
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltaserve bench -m DIR [--dummy-weights] [--seed S] [--prompt-len N]\n"
                   "       [--batch 1,4,8] [--steps N] [--warmup N] [--json-out FILE]\n"
                   "       [--device cpu|cuda|auto] [--threads N]\n");
            return -1;
        } else if (!strcmp(argv[i], "--dummy-weights")) {
            a->dummy = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad))) {
            a->model_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--device", cmd, &bad))) {
            a->device = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--json-out", cmd, &bad))) {
            a->json_out = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--batch", cmd, &bad))) {
            a->batches_arg = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--seed", cmd, &bad))) {
            if (!ds_arg_u64(cmd, "--seed", v, &a->seed)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--threads", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--threads", v, 0, 1024, &n)) return 2;
            a->threads = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--prompt-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--prompt-len", v, 1, 1 << 20, &n)) return 2;
            a->prompt_len = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--steps", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--steps", v, 1, 1 << 20, &n)) return 2;
            a->steps = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--warmup", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--warmup", v, 0, 1 << 20, &n)) return 2;
            a->warmup = (int)n;
        } else if (!bad) {
            fprintf(stderr, "deltaserve bench: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if (!a->model_dir) {
        fprintf(stderr, "deltaserve bench: -m DIR is required (a checkpoint, or a config with "
                        "--dummy-weights)\n");
        return 2;
    }
    return 0;
}

typedef struct bench_ctx {
    ds_config cfg;
    ds_model_weights host;
    bool host_loaded;
    ds_backend *be;
    ds_model model;
    bool model_ready;
    ds_session sess;
    bool sess_ready;
} bench_ctx;

static void bench_close(bench_ctx *b) {
    if (b->sess_ready) ds_session_free(&b->sess);
    if (b->model_ready) ds_model_free(&b->model);
    if (b->be) b->be->ops->destroy(b->be);
    if (b->host_loaded) ds_model_weights_free(&b->host);
}

int ds_cmd_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    int32_t *batches = NULL;
    size_t n_batches = 0;
    if (!ds_arg_ids("bench", "--batch", a.batches_arg, 1025, &batches, &n_batches)) return 2;
    int max_batch = 1;
    for (size_t i = 0; i < n_batches; i++) {
        if (batches[i] < 1) {
            fprintf(stderr, "deltaserve bench: --batch: sizes must be ≥ 1\n");
            free(batches);
            return 2;
        }
        if (batches[i] > max_batch) max_batch = batches[i];
    }

    bench_ctx b = {0};
    ds_error err = {0};
    FILE *json = NULL;
    float *logits = NULL;
    double *times = NULL;
    int32_t *tokens = NULL, *ids = NULL, *slots = NULL;
    rc = 1;
    if (ds_config_load(a.model_dir, &b.cfg, &err) != DS_OK) goto fail;
    if (!a.dummy) {
        if (ds_model_load(a.model_dir, &b.cfg, &b.host, &err) != DS_OK) goto fail;
        b.host_loaded = true;
    }
    if (ds_cli_backend_create(a.device, a.threads, &b.be, &err) != DS_OK) goto fail;
    const int step_tokens = a.prompt_len < 512 ? a.prompt_len : 512;
    const int max_tokens = step_tokens > max_batch ? step_tokens : max_batch;
    double t_load = now_s();
    ds_status st = a.dummy ? ds_model_init_dummy(&b.model, b.be, &b.cfg, a.seed, max_tokens,
                                                 max_batch, &err)
                           : ds_model_init(&b.model, b.be, &b.cfg, &b.host, max_tokens, max_batch,
                                           &err);
    if (st != DS_OK) goto fail;
    b.model_ready = true;
    t_load = now_s() - t_load;
    const int ctx = a.prompt_len + a.warmup + a.steps + 1;
    if (ds_session_init(&b.sess, &b.model, max_batch, ctx, &err) != DS_OK) goto fail;
    b.sess_ready = true;
    const ds_backend_ops *op = b.be->ops;
    const char *device = op->device_name ? op->device_name(b.be) : op->name;
    double copy_gbps = op->copy_bandwidth_gbps ? op->copy_bandwidth_gbps(b.be) : 0.0;
    fprintf(stderr, "bench: %s on %s, weights ready in %.1f s, copy bandwidth %.0f GB/s\n",
            a.model_dir, device, t_load, copy_gbps);

    const int V = b.cfg.vocab;
    tokens = malloc(sizeof(int32_t) * (size_t)a.prompt_len);
    logits = malloc(sizeof(float) * (size_t)V);
    times = malloc(sizeof(double) * (size_t)(a.steps > a.repeats ? a.steps : a.repeats));
    ids = malloc(sizeof(int32_t) * (size_t)max_batch);
    slots = malloc(sizeof(int32_t) * (size_t)max_batch);
    if (!tokens || !logits || !times || !ids || !slots) {
        ds_error_set(&err, DS_ERR_NOMEM, "out of host memory");
        goto fail;
    }
    uint64_t rng = a.seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < a.prompt_len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }
    if (a.json_out && !(json = fopen(a.json_out, "a"))) {
        ds_error_set(&err, DS_ERR_IO, "--json-out: cannot open '%s'", a.json_out);
        goto fail;
    }

    /* Prefill: the prompt into slot 0, logits of the last token (time to first token). */
    for (int r = 0; r < a.repeats + 1; r++) {
        ds_session_reset(&b.sess, 0);
        double t0 = now_s();
        if (ds_session_feed(&b.sess, 0, tokens, a.prompt_len, false, logits, &err) != DS_OK)
            goto fail;
        if (r > 0) times[r - 1] = now_s() - t0; /* the first run is warm-up */
    }
    qsort(times, (size_t)a.repeats, sizeof(double), cmp_double);
    const double ttft_ms = times[a.repeats / 2] * 1e3;
    printf("prefill %d tokens: %.2f ms (median of %d)\n", a.prompt_len, ttft_ms, a.repeats);
    printf("%5s %10s %10s %10s %9s %12s %9s %9s %7s\n", "batch", "step_ms", "p10_ms", "p90_ms",
           "tok/s", "bytes/step", "GB/s", "kernels", "ratio");

    for (size_t bi = 0; bi < n_batches; bi++) {
        const int B = batches[bi];
        /* Every sequence gets the same prompt so the context length matches prefill's. */
        for (int s = 0; s < B; s++) {
            slots[s] = s;
            ds_session_reset(&b.sess, s);
            if (ds_session_feed(&b.sess, s, tokens, a.prompt_len, false, logits, &err) != DS_OK)
                goto fail;
            ids[s] = (int32_t)((s * 7919 + 1) % V);
        }
        ds_tensor lg = ds_view2d(b.model.s.logits.data, DS_DTYPE_F32, B, V);
        uint64_t launches = 0;
        for (int step = 0; step < a.warmup + a.steps; step++) {
            if (op->take_launch_count) op->take_launch_count(b.be);
            double t0 = now_s();
            if (ds_session_decode(&b.sess, slots, ids, B, NULL, &err) != DS_OK) goto fail;
            op->argmax(b.be, &lg, ids); /* greedy: only the ids come back to the host */
            double dt = now_s() - t0;
            if (op->take_launch_count) launches = op->take_launch_count(b.be);
            if (step >= a.warmup) times[step - a.warmup] = dt;
        }
        qsort(times, (size_t)a.steps, sizeof(double), cmp_double);
        double med = percentile(times, a.steps, 50) * 1e3;
        double p10 = percentile(times, a.steps, 10) * 1e3;
        double p90 = percentile(times, a.steps, 90) * 1e3;
        double bytes = step_bytes(&b.cfg, B, a.prompt_len + a.warmup + a.steps / 2, 2);
        double gbps = bytes / (med * 1e-3) * 1e-9;
        double ratio = copy_gbps > 0 ? gbps / copy_gbps : 0;
        printf("%5d %10.3f %10.3f %10.3f %9.1f %12.4g %9.1f %9llu %7.3f\n", B, med, p10, p90,
               B / (med * 1e-3), bytes, gbps, (unsigned long long)launches, ratio);
        if (json)
            fprintf(json,
                    "{\"commit\":\"%s\",\"gpu\":\"%s\",\"backend\":\"%s\",\"model\":\"%s\","
                    "\"dummy_weights\":%s,\"batch\":%d,\"prompt_len\":%d,\"steps\":%d,"
                    "\"step_ms\":%.4f,\"step_ms_p10\":%.4f,\"step_ms_p90\":%.4f,\"ttft_ms\":%.3f,"
                    "\"kernels_per_step\":%llu,\"bytes_per_step\":%.6g,\"achieved_gbps\":%.2f,"
                    "\"copy_gbps\":%.2f,\"ratio\":%.4f,\"date\":%lld}\n",
                    DS_GIT_COMMIT, device, op->name, a.model_dir, a.dummy ? "true" : "false", B,
                    a.prompt_len, a.steps, med, p10, p90, ttft_ms, (unsigned long long)launches,
                    bytes, gbps, copy_gbps, ratio, (long long)time(NULL));
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "deltaserve bench: %s\n", err.msg[0] ? err.msg : "failed");
    if (json) fclose(json);
    free(tokens);
    free(logits);
    free(times);
    free(ids);
    free(slots);
    free(batches);
    bench_close(&b);
    return rc;
}
