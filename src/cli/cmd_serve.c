/* deltaserve serve — the OpenAI-compatible HTTP server:
 *   deltaserve serve -m DIR [--host H] [--port P] [--api-key KEY] [--served-model-name NAME]
 *   (or `deltaserve serve DIR ...` and the other vLLM spellings of cli/vllm_compat.h)
 *                    [--max-num-seqs N] [--max-model-len N] [--max-queue N] [--memory-fraction F]
 *                    [--device D] [--threads N] ...
 * --dummy-weights [--seed N] serves seeded random weights of -m DIR's config.json (no checkpoint
 * needed: benchmarks of full-size shapes); --tokenizer DIR takes the tokenizer and chat template
 * from another checkpoint (required when -m DIR has no tokenizer.json). The tokenizer's ids must
 * all lie inside the model's vocabulary. --num-speculative-tokens k turns on MTP speculative
 * decoding in the engine (runtime/spec.h). --warmup-graphs all|off|N: step shapes recorded as
 * graphs before the server listens (runtime/graph_warmup.h); the report of what was recorded
 * and which shapes fell back to eager (with the backend's reason) goes to stderr.
 *
 * Loads the model and tokenizer, sizes the caches, starts the engine thread and the HTTP
 * server, prints "listening on http://HOST:PORT" to stderr, and runs until SIGINT/SIGTERM,
 * then shuts down cleanly (in-flight requests are aborted).
 *
 * Cache sizing: the KV pool holds max_num_seqs × max_model_len tokens when that fits in
 * --memory-fraction of the memory that is free after the weights are loaded (device memory on
 * CUDA, MemAvailable on the CPU); otherwise as many blocks as fit (requests then queue, or are
 * preempted, under KV pressure). --num-kv-blocks overrides the computation. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "cli/engine.h"
#include "cli/vllm_compat.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "server/server.h"

#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown"
#endif

/* --num-speculative-tokens bound (the engine takes up to DS_SPEC_MAX_K; beyond 4 the MTP's
 * acceptance makes longer drafts a loss) */
#define SERVE_MAX_SPEC 4

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltaserve serve -m DIR [options]\n"
            "  --host H                    address to listen on (default 127.0.0.1)\n"
            "  --port P                    TCP port (default 8000; 0 = any free port)\n"
            "  --api-key KEY               require 'Authorization: Bearer KEY' on /v1/*\n"
            "                              (default: $DELTASERVE_API_KEY when set)\n"
            "  --served-model-name NAME    model name clients use (repeatable; default: DIR)\n"
            "  --max-num-seqs N            concurrent sequences holding caches (default 16)\n"
            "  --max-model-len N           prompt + output tokens per request (default: the\n"
            "                              model's max_position_embeddings)\n"
            "  --max-num-batched-tokens N  token budget per engine step (default 2048)\n"
            "  --max-queue N               waiting requests before 503 (default 256)\n"
            "  --block-size N              KV block size in tokens (default 16)\n"
            "  --memory-fraction F         share of the memory free after loading the weights\n"
            "                              that the caches may use (default 0.9;\n"
            "                              alias --gpu-memory-utilization)\n"
            "  --num-kv-blocks N           KV pool size in blocks (overrides the fraction)\n"
            "  --max-body-bytes N          larger request bodies get 413 (default 8388608)\n"
            "  --max-connections N         concurrent HTTP connections (default 512)\n"
            "  --generation-config auto|none  sampling defaults from the model's\n"
            "                              generation_config.json (auto, as vLLM) or OpenAI's\n"
            "  --dummy-weights             seeded random weights from DIR's config.json\n"
            "  --seed N                    seed of --dummy-weights (default 1)\n"
            "  --tokenizer DIR             tokenizer + chat template from DIR (default: -m DIR;\n"
            "                              required when -m DIR has no tokenizer.json)\n"
            "  --num-speculative-tokens K  MTP draft tokens per step, 0..%d (default 0 = off)\n"
            "  --[no-]enable-prefix-caching  keep finished requests' caches for prompts that\n"
            "                              continue them: multi-turn chat, agent loops (default\n"
            "                              on; runtime/prefix_cache.h)\n"
            "  --warmup-graphs all|off|N   record the step graph of every decode (or\n"
            "                              verification) shape before listening: all (default,\n"
            "                              up to %d), off (at first use), or the N smallest;\n"
            "                              stderr lists the shapes that fell back to eager\n"
            "  --device cpu|cuda|auto      --threads N\n"
            "vLLM command lines (cli/vllm_compat.h): `serve DIR` as -m DIR; option names with\n"
            "underscores; --speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": K}'\n"
            "(also qwen3_next_mtp) as --num-speculative-tokens K; --reasoning-parser qwen3,\n"
            "--tool-call-parser qwen3_coder|qwen3_xml|hermes, --enable-auto-tool-choice,\n"
            "--tensor-parallel-size 1, --dtype auto|bfloat16, --trust-remote-code and\n"
            "--language-model-only are what deltaserve does anyway (other values: an error).\n"
            "--seed is the dummy weights' seed, not a sampling seed.\n",
            SERVE_MAX_SPEC, DS_GRAPH_WARMUP_MAX);
}

typedef struct serve_args {
    const char *model_dir, *device, *host, *api_key;
    const char *tokenizer_dir; /* --tokenizer (NULL: model_dir) */
    bool dummy;                /* --dummy-weights */
    uint64_t seed;             /* --seed for them */
    const char *names[DS_SERVER_MAX_NAMES];
    int n_names;
    int threads, port;
    ds_engine_opts eng;
    bool max_model_len_set;
    double mem_fraction;
    long num_kv_blocks;
    long max_body, max_conns;
    bool gen_config;
} serve_args;

static bool has_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* -m / --model / vLLM's positional model: the same directory may be named twice, not two. */
static bool set_model(serve_args *a, const char *dir) {
    if (a->model_dir && strcmp(a->model_dir, dir)) {
        fprintf(stderr, "deltaserve serve: two models given ('%s' and '%s')\n", a->model_dir, dir);
        return false;
    }
    a->model_dir = dir;
    return true;
}

static int parse_args(int argc, char **argv, serve_args *a) {
    const char *cmd = "serve";
    bool bad = false;
    ds_engine_opts_default(&a->eng);
    a->host = "127.0.0.1";
    a->port = 8000;
    a->mem_fraction = 0.9;
    a->max_body = 8 << 20;
    a->max_conns = 512;
    a->gen_config = true;
    a->api_key = getenv("DELTASERVE_API_KEY");
    a->seed = 1;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        double d;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return -1;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "--model", cmd, &bad))) {
            if (!set_model(a, v)) return 2;
        } else if (!strcmp(argv[i], "--dummy-weights")) {
            a->dummy = true;
        } else if (!strcmp(argv[i], "--enable-prefix-caching")) {
            a->eng.prefix_caching = true;
        } else if (!strcmp(argv[i], "--no-enable-prefix-caching")) {
            a->eng.prefix_caching = false;
        } else if ((v = ds_arg_value(argc, argv, &i, "--seed", cmd, &bad))) {
            if (!ds_arg_u64(cmd, "--seed", v, &a->seed)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokenizer", cmd, &bad))) {
            a->tokenizer_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--num-speculative-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--num-speculative-tokens", v, 0, SERVE_MAX_SPEC, &n)) return 2;
            a->eng.num_speculative_tokens = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--warmup-graphs", cmd, &bad))) {
            if (!strcmp(v, "all")) {
                a->eng.warmup_graphs = DS_GRAPH_WARMUP_ALL;
            } else if (!strcmp(v, "off")) {
                a->eng.warmup_graphs = 0;
            } else if (v[0] >= '0' && v[0] <= '9') {
                if (!ds_arg_int(cmd, "--warmup-graphs", v, 0, 1 << 20, &n)) return 2;
                a->eng.warmup_graphs = (int)n;
            } else {
                fprintf(stderr, "deltaserve serve: --warmup-graphs: '%s' is not all, off or a "
                                "number of shapes\n", v);
                return 2;
            }
        } else if ((v = ds_arg_value(argc, argv, &i, "--host", cmd, &bad))) {
            a->host = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--port", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--port", v, 0, 65535, &n)) return 2;
            a->port = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--api-key", cmd, &bad))) {
            a->api_key = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--served-model-name", cmd, &bad))) {
            if (a->n_names >= DS_SERVER_MAX_NAMES) {
                fprintf(stderr, "deltaserve serve: --served-model-name: at most %d names\n",
                        DS_SERVER_MAX_NAMES);
                return 2;
            }
            if (!v[0]) {
                fprintf(stderr, "deltaserve serve: --served-model-name: empty name\n");
                return 2;
            }
            a->names[a->n_names++] = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-num-seqs", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-num-seqs", v, 1, 4096, &n)) return 2;
            a->eng.max_num_seqs = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-model-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-model-len", v, 2, 1 << 24, &n)) return 2;
            a->eng.max_model_len = (int)n;
            a->max_model_len_set = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-num-batched-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-num-batched-tokens", v, 1, 1 << 20, &n)) return 2;
            a->eng.max_num_batched_tokens = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-queue", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-queue", v, 1, 1 << 20, &n)) return 2;
            a->eng.max_queue = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--block-size", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--block-size", v, 1, 4096, &n)) return 2;
            a->eng.block_size = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--memory-fraction", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "--gpu-memory-utilization", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--memory-fraction", v, 0.01, 1.0, &d)) return 2;
            a->mem_fraction = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--num-kv-blocks", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--num-kv-blocks", v, 1, 1L << 30, &n)) return 2;
            a->num_kv_blocks = n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-body-bytes", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-body-bytes", v, 1024, 1L << 32, &n)) return 2;
            a->max_body = n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-connections", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--max-connections", v, 1, 65536, &n)) return 2;
            a->max_conns = n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--generation-config", cmd, &bad))) {
            if (strcmp(v, "auto") && strcmp(v, "none") && strcmp(v, "vllm")) {
                fprintf(stderr, "deltaserve serve: --generation-config: '%s' is not auto or none\n",
                        v);
                return 2;
            }
            a->gen_config = !strcmp(v, "auto");
        } else if ((v = ds_arg_value(argc, argv, &i, "--device", cmd, &bad))) {
            a->device = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--threads", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--threads", v, 0, 1024, &n)) return 2;
            a->threads = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--speculative-config", cmd, &bad))) {
            int k = 0;
            if (!ds_vllm_spec_config(v, SERVE_MAX_SPEC, &k)) return 2;
            a->eng.num_speculative_tokens = k;
        } else if ((v = ds_arg_value(argc, argv, &i, "--reasoning-parser", cmd, &bad))) {
            if (!ds_vllm_parser_ok("--reasoning-parser", v)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tool-call-parser", cmd, &bad))) {
            if (!ds_vllm_parser_ok("--tool-call-parser", v)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tensor-parallel-size", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "-tp", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--tensor-parallel-size", v, 1, 1 << 16, &n)) return 2;
            if (n != 1) {
                fprintf(stderr, "deltaserve serve: --tensor-parallel-size %ld: deltaserve serves a "
                                "model on one device\n",
                        n);
                return 2;
            }
        } else if ((v = ds_arg_value(argc, argv, &i, "--dtype", cmd, &bad))) {
            if (strcmp(v, "auto") && strcmp(v, "bfloat16") && strcmp(v, "bf16")) {
                fprintf(stderr, "deltaserve serve: --dtype: '%s' is not supported; weights and "
                                "activations are bf16 (auto or bfloat16)\n",
                        v);
                return 2;
            }
        } else if (ds_vllm_noop_flag(argv[i])) {
            /* vLLM flags for what deltaserve does anyway (cli/vllm_compat.h) */
        } else if (argv[i][0] != '-' && !bad) { /* vLLM's `serve MODEL` */
            if (!set_model(a, argv[i])) return 2;
        } else if (!bad) {
            fprintf(stderr, "deltaserve serve: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (bad) return 2;
    if (!a->model_dir) {
        fprintf(stderr, "deltaserve serve: -m DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (a->eng.max_num_batched_tokens < a->eng.max_num_seqs) {
        fprintf(stderr, "deltaserve serve: --max-num-batched-tokens (%d) must be >= "
                        "--max-num-seqs (%d)\n",
                a->eng.max_num_batched_tokens, a->eng.max_num_seqs);
        return 2;
    }
    if (a->n_names == 0) a->names[a->n_names++] = a->model_dir;
    if (!a->tokenizer_dir) {
        /* a config-only directory (as under configs/) is a usage error with --dummy-weights;
         * without it a missing tokenizer is a load failure like a missing checkpoint (exit 1) */
        if (a->dummy && !has_file(a->model_dir, "tokenizer.json")) {
            fprintf(stderr, "deltaserve serve: %s has no tokenizer.json (--dummy-weights needs "
                            "only its config.json); name a checkpoint directory that has one "
                            "with --tokenizer DIR\n",
                    a->model_dir);
            return 2;
        }
        a->tokenizer_dir = a->model_dir;
    }
    return 0;
}

/* Bytes free for caches on the backend's memory (0 when unknown): the backend's free_memory op,
 * else (the CPU backend) the host's MemAvailable. */
static size_t free_memory(ds_backend *be, char *device_name, size_t cap) {
    const char *dn = be->ops->device_name ? be->ops->device_name(be) : NULL;
    snprintf(device_name, cap, "%.200s", dn ? dn : be->ops->name);
    if (be->ops->free_memory) return be->ops->free_memory(be);
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

/* Cache bytes: per KV block (all attention layers, K and V) and per GDN state slot. */
static void cache_sizes(const ds_config *c, const ds_backend *be, int block_size,
                        double *per_block, double *per_slot) {
    int n_attn = c->n_mtp_layers, n_gdn = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->layer_types[i] == DS_LAYER_FULL_ATTN) n_attn++;
        else n_gdn++;
    }
    double kv_elt = strcmp(be->ops->name, "cpu") ? 2.0 : 4.0; /* bf16 on devices, f32 on CPU */
    *per_block = (double)n_attn * 2.0 * block_size * c->n_kv_heads * c->head_dim * kv_elt;
    double conv = (double)ds_config_gdn_conv_dim(c) * (c->gdn_conv_kernel - 1) * 4.0;
    double state = (double)c->gdn_v_heads * c->gdn_k_dim * c->gdn_v_dim * 4.0;
    *per_slot = n_gdn * (conv + state);
}


int ds_cmd_serve(int argc, char **argv_in) {
    serve_args a = {0};
    /* vLLM's underscore spellings of option names; a's strings point into this copy */
    char **argv = ds_vllm_normalize_args(argc, argv_in);
    if (!argv) {
        fprintf(stderr, "deltaserve serve: out of memory\n");
        return 1;
    }
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        ds_vllm_args_free(argc, argv);
        return rc < 0 ? 0 : rc;
    }

    /* Every thread started from here inherits this mask, so SIGINT/SIGTERM reach sigwait below
     * and nobody dies of SIGPIPE on a vanished client. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ds_error err = {0};
    ds_tokenizer *tok = NULL;
    ds_config cfg;
    ds_model_weights host = {0};
    bool host_ok = false, model_ok = false;
    ds_backend *be = NULL;
    ds_model model;
    ds_engine *eng = NULL;
    ds_server *srv = NULL;
    ds_chat_formatter *chat = NULL;
    char *info = NULL;
    rc = 1;
    if (ds_tokenizer_load(a.tokenizer_dir, &tok, &err) != DS_OK) goto fail;
    /* The checkpoint's chat template (or the built-in Qwen3.5 one); a template that does not
     * compile stops the server here rather than failing every chat request. */
    if (ds_chat_formatter_from_dir(a.tokenizer_dir, &chat, &err) != DS_OK) goto fail;
    fprintf(stderr, "deltaserve serve: chat template: %s (tool calls: %s form)\n", chat->name,
            chat->tool_format == DS_TOOL_FORMAT_XML ? "XML" : "JSON");
    if (a.dummy) {
        if (ds_config_load(a.model_dir, &cfg, &err) != DS_OK) goto fail;
    } else {
        if (ds_model_load(a.model_dir, &cfg, &host, &err) != DS_OK) goto fail;
        host_ok = true;
    }
    if (a.tokenizer_dir != a.model_dir && ds_tokenizer_vocab_size(tok) > (size_t)cfg.vocab) {
        /* a tokenizer from another checkpoint: its ids would index past the embedding table */
        ds_error_set(&err, DS_ERR_INVALID_ARG,
                     "--tokenizer %s has token ids up to %zu but the model's vocabulary (%s/"
                     "config.json vocab_size) is %d; use a tokenizer whose ids are all < %d",
                     a.tokenizer_dir, ds_tokenizer_vocab_size(tok) - 1, a.model_dir, cfg.vocab,
                     cfg.vocab);
        rc = 2;
        goto fail;
    }
    if ((int)ds_tokenizer_vocab_size(tok) > cfg.vocab)
        fprintf(stderr, "deltaserve serve: warning: the tokenizer has %zu ids but the model's "
                        "vocabulary is %d; prompts using the extra ids are refused\n",
                ds_tokenizer_vocab_size(tok), cfg.vocab);
    if (ds_cli_backend_create(a.device, a.threads, &be, &err) != DS_OK) goto fail;
    if (!a.max_model_len_set) a.eng.max_model_len = cfg.max_position > 0 ? cfg.max_position : 4096;
    if (cfg.max_position > 0 && a.eng.max_model_len > cfg.max_position) {
        ds_error_set(&err, DS_ERR_INVALID_ARG,
                     "--max-model-len %d exceeds the model's max_position_embeddings %d",
                     a.eng.max_model_len, cfg.max_position);
        rc = 2;
        goto fail;
    }
    /* logits rows: one per sequence, k + 1 per verification with speculative decoding */
    const int max_out = a.eng.max_num_seqs * (a.eng.num_speculative_tokens + 1);
    const int max_tokens = a.eng.max_num_batched_tokens > max_out ? a.eng.max_num_batched_tokens
                                                                   : max_out;
    if ((a.dummy ? ds_model_init_dummy(&model, be, &cfg, a.seed, max_tokens, max_out, &err)
                 : ds_model_init(&model, be, &cfg, &host, max_tokens, max_out, &err)) != DS_OK)
        goto fail;
    model_ok = true;

    char device_name[256] = "unknown";
    size_t avail = free_memory(be, device_name, sizeof device_name);
    double per_block, per_slot;
    cache_sizes(&cfg, be, a.eng.block_size, &per_block, &per_slot);
    long long full = ((long long)a.eng.max_model_len + a.eng.block_size - 1) / a.eng.block_size *
                     a.eng.max_num_seqs;
    long long blocks = full;
    if (a.num_kv_blocks > 0) {
        blocks = a.num_kv_blocks;
    } else if (avail > 0 && per_block > 0) {
        /* speculative decoding keeps k + 2 GDN states per sequence (runner.h) */
        const int k = a.eng.num_speculative_tokens;
        double budget = a.mem_fraction * (double)avail -
                        per_slot * a.eng.max_num_seqs * (k > 0 ? k + 2 : 1);
        long long fit = budget > 0 ? (long long)(budget / per_block) : 0;
        if (fit < blocks) blocks = fit;
    }
    long long one = ((long long)a.eng.max_model_len + a.eng.block_size - 1) / a.eng.block_size;
    if (blocks < one) {
        ds_error_set(&err, DS_ERR_NOMEM,
                     "the KV pool (%lld blocks of %d tokens, %.1f MiB each, from %.0f%% of %.1f "
                     "GiB free) cannot hold one request of --max-model-len %d; lower "
                     "--max-model-len or raise --memory-fraction",
                     blocks, a.eng.block_size, per_block / 1048576.0, a.mem_fraction * 100,
                     (double)avail / 1073741824.0, a.eng.max_model_len);
        goto fail;
    }
    a.eng.num_kv_blocks = blocks > 0x7fffffffLL ? 0x7fffffff : (int)blocks;
    if (ds_engine_create(&model, &a.eng, &eng, &err) != DS_OK) goto fail;
    ds_graph_report_print(ds_engine_graph_report(eng), "deltaserve serve: ", stderr);

    /* What /v1/models reports under "deltaserve" (benchmarks record it). */
    cJSON *ij = cJSON_CreateObject();
    cJSON_AddStringToObject(ij, "backend", be->ops->name);
    cJSON_AddStringToObject(ij, "device", device_name);
    cJSON_AddStringToObject(ij, "model_type", cfg.model_type);
    cJSON_AddNumberToObject(ij, "hidden_size", cfg.hidden);
    cJSON_AddNumberToObject(ij, "num_hidden_layers", cfg.n_layers);
    cJSON_AddNumberToObject(ij, "num_experts", cfg.n_experts);
    cJSON_AddNumberToObject(ij, "max_num_seqs", a.eng.max_num_seqs);
    cJSON_AddNumberToObject(ij, "kv_blocks", a.eng.num_kv_blocks);
    cJSON_AddNumberToObject(ij, "block_size", a.eng.block_size);
    cJSON_AddBoolToObject(ij, "dummy_weights", a.dummy);
    cJSON_AddNumberToObject(ij, "num_speculative_tokens", a.eng.num_speculative_tokens);
    info = cJSON_PrintUnformatted(ij);
    cJSON_Delete(ij);

    ds_oai_defaults defaults = {0};
    if (a.gen_config && ds_oai_defaults_load(a.model_dir, &defaults, &err) != DS_OK) goto fail;
    if (defaults.has_temperature || defaults.has_top_p || defaults.has_top_k || defaults.has_min_p ||
        defaults.has_repetition_penalty) {
        fprintf(stderr, "deltaserve serve: sampling defaults from generation_config.json:");
        if (defaults.has_temperature) fprintf(stderr, " temperature %g", defaults.temperature);
        if (defaults.has_top_p) fprintf(stderr, " top_p %g", defaults.top_p);
        if (defaults.has_top_k) fprintf(stderr, " top_k %d", defaults.top_k);
        if (defaults.has_min_p) fprintf(stderr, " min_p %g", defaults.min_p);
        if (defaults.has_repetition_penalty)
            fprintf(stderr, " repetition_penalty %g", defaults.repetition_penalty);
        fprintf(stderr, " (--generation-config none for OpenAI's)\n");
    }
    ds_server_opts so = {
        .host = a.host,
        .port = a.port,
        .api_key = a.api_key,
        .n_served_names = a.n_names,
        .model_root = a.model_dir,
        .max_body_bytes = (size_t)a.max_body,
        .max_connections = (int)a.max_conns,
        .max_model_len = a.eng.max_model_len,
        .vocab = cfg.vocab,
        .info_json = info,
        .defaults = defaults,
        .chat = chat,
        .version = DS_GIT_COMMIT, /* CMakeLists.txt: git describe of the source tree */
    };
    for (int i = 0; i < a.n_names; i++) so.served_names[i] = a.names[i];
    if (ds_server_start(eng, tok, &so, &srv, &err) != DS_OK) goto fail;

    fprintf(stderr,
            "deltaserve serve: model '%s' (%s) on %s [%s]; max_model_len %d, max_num_seqs %d, "
            "KV pool %d blocks x %d tokens (%.1f MiB), max_queue %d%s%s",
            a.names[0], a.model_dir, be->ops->name, device_name, a.eng.max_model_len,
            a.eng.max_num_seqs, a.eng.num_kv_blocks, a.eng.block_size,
            per_block * a.eng.num_kv_blocks / 1048576.0, a.eng.max_queue,
            a.api_key && a.api_key[0] ? ", API key required" : "",
            a.dummy ? ", DUMMY WEIGHTS" : "");
    if (a.eng.num_speculative_tokens > 0)
        fprintf(stderr, ", speculative decoding k=%d", a.eng.num_speculative_tokens);
    fprintf(stderr, "\n");
    fprintf(stderr, "deltaserve serve: listening on http://%s%s%s:%d\n",
            strchr(a.host, ':') ? "[" : "", a.host, strchr(a.host, ':') ? "]" : "",
            ds_server_port(srv));
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "deltaserve serve: %s received, shutting down\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "deltaserve serve: %s\n", err.msg[0] ? err.msg : ds_status_name(err.status));
done:
    ds_server_stop(srv);
    ds_engine_destroy(eng);
    free(info);
    if (model_ok) ds_model_free(&model);
    if (be) be->ops->destroy(be);
    if (host_ok) ds_model_weights_free(&host);
    ds_tokenizer_free(tok);
    ds_chat_formatter_free(chat);
    ds_vllm_args_free(argc, argv);
    return rc;
}
