/* deltaserve generate — stream a continuation of a prompt:
 *   deltaserve generate -m DIR (-p TEXT | --tokens 1,2,3) [-n N] [sampling options]
 *                       [--num-speculative-tokens K] [--print-ids] [--device D] [--threads N]
 *                       [--tensor-parallel-size N]
 * Text streams to stdout as it is generated (never half a UTF-8 character); with --print-ids
 * stdout gets the generated ids instead, one line, comma-separated. Timing goes to stderr, and
 * with --num-speculative-tokens (MTP speculative decoding, runtime/spec.h) the acceptance rate
 * and mean accepted length. With --tensor-parallel-size N > 1 the model runs as N
 * tensor-parallel ranks on the CPU backend (parallel/tp.h); the CUDA path is not built yet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "cli/engine.h"
#include "model/loader.h"
#include "parallel/tp.h"
#include "runtime/spec.h"
#include "sampling/sampler.h"
#include "sampling/stop.h"
#include "tokenizer/tokenizer.h"

#define GEN_MAX_STOPS DS_SAMPLING_MAX_STOP

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltaserve generate -m DIR (-p TEXT | --tokens ID,ID,...) [options]\n"
            "  -n N                     tokens to generate (default 64)\n"
            "  --temperature T          0 = greedy (default 0)\n"
            "  --top-p P --top-k K --min-p P\n"
            "  --repetition-penalty R --presence-penalty P --frequency-penalty P\n"
            "  --seed S                 same seed, same output\n"
            "  --min-tokens N --ignore-eos --stop STR (repeatable)\n"
            "  --num-speculative-tokens K  MTP speculative decoding, K draft tokens a step\n"
            "                           (1..%d; needs a checkpoint with an MTP head)\n"
            "  --print-ids              print the generated ids (one line) instead of text\n"
            "  --device cpu|cuda|auto   --threads N\n"
            "  --tensor-parallel-size N run as N tensor-parallel ranks (CPU backend only;\n"
            "                           --threads is split among them)\n",
            DS_SPEC_MAX_K);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct gen_args {
    ds_cli_engine_opts eng;
    const char *prompt, *tokens;
    bool print_ids;
    int n_spec; /* --num-speculative-tokens (0 = off) */
    int tp;     /* --tensor-parallel-size (1 = off) */
    ds_sampling_params sp;
    const char *stops[GEN_MAX_STOPS];
} gen_args;

/* Returns 0 to continue, else the exit code (help → -1 mapped to 0). */
static int parse_args(int argc, char **argv, gen_args *a) {
    const char *cmd = "generate";
    bool bad = false;
    ds_sampling_params_init(&a->sp);
    a->sp.temperature = 0.0f;
    a->sp.max_tokens = 64;
    a->tp = 1;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        double d;
        uint64_t u;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(argv[i], "--print-ids")) {
            a->print_ids = true;
        } else if (!strcmp(argv[i], "--ignore-eos")) {
            a->sp.ignore_eos = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad))) {
            a->eng.model_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "-p", cmd, &bad))) {
            a->prompt = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokens", cmd, &bad))) {
            a->tokens = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "-n", cmd, &bad))) {
            if (!ds_arg_int(cmd, "-n", v, 1, 1 << 24, &n)) return 2;
            a->sp.max_tokens = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--num-speculative-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--num-speculative-tokens", v, 0, DS_SPEC_MAX_K, &n)) return 2;
            a->n_spec = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tensor-parallel-size", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--tensor-parallel-size", v, 1, DS_TP_MAX_RANKS, &n)) return 2;
            a->tp = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--temperature", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--temperature", v, 0, 1e6, &d)) return 2;
            a->sp.temperature = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--top-p", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--top-p", v, 1e-9, 1, &d)) return 2;
            a->sp.top_p = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--top-k", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--top-k", v, -1, 1 << 24, &n)) return 2;
            a->sp.top_k = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--min-p", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--min-p", v, 0, 1, &d)) return 2;
            a->sp.min_p = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--repetition-penalty", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--repetition-penalty", v, 1e-6, 1e6, &d)) return 2;
            a->sp.repetition_penalty = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--presence-penalty", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--presence-penalty", v, -2, 2, &d)) return 2;
            a->sp.presence_penalty = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--frequency-penalty", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--frequency-penalty", v, -2, 2, &d)) return 2;
            a->sp.frequency_penalty = (float)d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--seed", cmd, &bad))) {
            if (!ds_arg_u64(cmd, "--seed", v, &u)) return 2;
            a->sp.seed = u;
            a->sp.has_seed = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "--min-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--min-tokens", v, 0, 1 << 24, &n)) return 2;
            a->sp.min_tokens = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--stop", cmd, &bad))) {
            if (a->sp.n_stop >= GEN_MAX_STOPS) {
                fprintf(stderr, "deltaserve generate: --stop: at most %d stop strings\n",
                        GEN_MAX_STOPS);
                return 2;
            }
            a->stops[a->sp.n_stop++] = v;
            a->sp.stop = a->stops;
        } else if ((v = ds_arg_value(argc, argv, &i, "--device", cmd, &bad))) {
            a->eng.device = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--threads", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--threads", v, 0, 1024, &n)) return 2;
            a->eng.threads = (int)n;
        } else if (!bad) {
            fprintf(stderr, "deltaserve generate: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (bad) return 2;
    if (a->tp > 1 && a->n_spec > 0) {
        fprintf(stderr, "deltaserve generate: --tensor-parallel-size > 1 does not support "
                        "--num-speculative-tokens yet (the MTP head is not sharded)\n");
        return 2;
    }
    if (!a->eng.model_dir || (!a->prompt == !a->tokens)) {
        fprintf(stderr, "deltaserve generate: -m DIR and exactly one of -p / --tokens are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* Writes released text to stdout immediately (streaming). */
static void emit(const char *text, size_t len) {
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
}

/* Output side of one run: ids, detokeniser, stop strings. */
typedef struct gen_out {
    const gen_args *a;
    ds_tokenizer *tok;
    ds_sampler *sampler;
    ds_stop_matcher *stop;
    ds_detok *detok;
    int32_t *ids; /* [max_tokens] */
    int n;
    const char *why;
} gen_out;

/* Records one generated token (already accepted by the sampler) and streams its text. Returns
 * 1 when generation ends with it, 0 to go on, -1 on error (message printed). */
static int out_token(gen_out *o, int token) {
    ds_error err = {0};
    o->ids[o->n++] = token;
    int stop_token = -1;
    ds_finish_reason fr = ds_sampler_finish_reason(o->sampler, token, o->n, &stop_token);
    bool stop_hit = false;
    /* The text of a finishing EOS / stop id is not output (vLLM), unless asked for. */
    bool feed_text = fr != DS_FINISH_STOP || o->sampler->params.include_stop_str_in_output;
    if (o->tok && !o->a->print_ids && feed_text) {
        const char *text;
        size_t len;
        ds_stop_result sr;
        if (ds_detok_push(o->detok, token, &text, &len, &err) != DS_OK ||
            ds_stop_matcher_feed(o->stop, text, len, &sr, &err) != DS_OK) {
            fprintf(stderr, "deltaserve generate: %s\n", err.msg);
            return -1;
        }
        emit(sr.text, sr.len);
        stop_hit = sr.stop_index >= 0;
    }
    if (stop_hit || fr != DS_FINISH_NONE) {
        o->why = stop_hit ? "stop string" : ds_finish_reason_name(fr);
        return 1;
    }
    return 0;
}

/* Feeds n tokens of sequence 0 and writes the last position's logits: one model, or the
 * tensor-parallel ranks (their logits gathered). */
typedef ds_status (*feed_fn)(void *model, const int32_t *tokens, int n, float *logits,
                             ds_error *err);

static ds_status feed_session(void *model, const int32_t *tokens, int n, float *logits,
                              ds_error *err) {
    return ds_session_feed(model, 0, tokens, n, false, logits, err);
}

static ds_status feed_tp(void *model, const int32_t *tokens, int n, float *logits, ds_error *err) {
    return ds_tp_feed(model, 0, tokens, n, false, logits, NULL, err);
}

/* Plain decoding: one token per forward. Returns 0 or 1 (error printed). */
static int run_plain(feed_fn feed, void *model, gen_out *o, const int32_t *prompt,
                     size_t n_prompt, float *logits, double *t_prefill) {
    ds_error err = {0};
    double t0 = now_s();
    if (feed(model, prompt, (int)n_prompt, logits, &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        return 1;
    }
    *t_prefill = now_s() - t0;
    for (;;) {
        ds_sample_result res;
        if (ds_sampler_sample(o->sampler, logits, o->n, &res, &err) != DS_OK ||
            ds_sampler_accept(o->sampler, res.token, &err) != DS_OK) {
            fprintf(stderr, "deltaserve generate: %s\n", err.msg);
            return 1;
        }
        int r = out_token(o, res.token);
        if (r < 0) return 1;
        if (r > 0) return 0;
        if (feed(model, &o->ids[o->n - 1], 1, logits, &err) != DS_OK) {
            fprintf(stderr, "deltaserve generate: %s\n", err.msg);
            return 1;
        }
    }
}

/* MTP speculative decoding: up to k + 1 tokens per target forward. Returns 0 or 1. */
static int run_spec(ds_cli_engine *e, gen_out *o, const int32_t *prompt, size_t n_prompt,
                    double *t_prefill, ds_spec_stats *stats) {
    ds_error err = {0};
    const int k = o->a->n_spec;
    /* The CLI engine's session has one GDN slot per sequence: replace it with a speculative one
     * (k + 2 state slots, KV lookahead). */
    ds_session_free(&e->sess);
    e->sess_ready = false;
    if (ds_session_init_spec(&e->sess, &e->model, 1, (int)n_prompt + o->a->sp.max_tokens, k,
                             &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        return 1;
    }
    e->sess_ready = true;
    ds_spec_gen g;
    if (ds_spec_gen_init(&g, &e->sess, 0, k, o->sampler, &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: --num-speculative-tokens: %s\n", err.msg);
        ds_spec_gen_free(&g);
        return 1;
    }
    int32_t toks[DS_SPEC_MAX_K + 1];
    ds_sample_result res[DS_SPEC_MAX_K + 1];
    int n = 0, rc = 1;
    double t0 = now_s();
    if (ds_spec_gen_prefill(&g, prompt, (int)n_prompt, toks, res, &n, &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        goto done;
    }
    *t_prefill = now_s() - t0;
    for (;;) {
        for (int i = 0; i < n; i++) {
            int r = out_token(o, toks[i]);
            if (r < 0) goto done;
            if (r > 0) {
                rc = 0;
                goto done;
            }
        }
        DS_ASSERT(!g.finished);
        if (ds_spec_gen_step(&g, toks, res, &n, &err) != DS_OK) {
            fprintf(stderr, "deltaserve generate: %s\n", err.msg);
            goto done;
        }
    }
done:
    *stats = g.stats;
    ds_spec_gen_free(&g);
    return rc;
}

/* --tensor-parallel-size N > 1: host weights + the N-rank CPU model (parallel/tp.h). */
typedef struct tp_engine {
    ds_config cfg;
    ds_model_weights host;
    bool host_loaded;
    ds_tp_model *tp;
} tp_engine;

static void tp_engine_close(tp_engine *t) {
    ds_tp_model_free(t->tp);
    if (t->host_loaded) ds_model_weights_free(&t->host);
    *t = (tp_engine){0};
}

/* Returns 0, or the exit code (message printed). */
static int tp_engine_open(tp_engine *t, const gen_args *a, int max_len) {
    *t = (tp_engine){0};
    ds_error err = {0};
    const char *dev = a->eng.device;
    bool cuda = dev && !strcmp(dev, "cuda");
    if (!dev || !strcmp(dev, "auto")) {
        ds_backend *probe = NULL;
        if (ds_backend_cuda_create(0, &probe, &err) == DS_OK) {
            probe->ops->destroy(probe);
            cuda = true;
        }
        err = (ds_error){0};
    }
    if (cuda) {
        fprintf(stderr, "deltaserve generate: --tensor-parallel-size %d on CUDA is not built yet "
                        "(only the CPU reference exists): use --device cpu\n", a->tp);
        return 2;
    }
    if (dev && strcmp(dev, "cpu") && strcmp(dev, "auto")) {
        fprintf(stderr, "deltaserve generate: --device: unknown device '%s' (cpu, cuda, auto)\n",
                dev);
        return 2;
    }
    if (ds_model_load(a->eng.model_dir, &t->cfg, &t->host, &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        return 1;
    }
    t->host_loaded = true;
    if (max_len > t->cfg.max_position) max_len = t->cfg.max_position;
    ds_tp_opts o = {.n_ranks = a->tp,
                    /* --threads is the total: split among the ranks (0 = all cores) */
                    .threads_per_rank =
                        a->eng.threads > 0 ? (a->eng.threads + a->tp - 1) / a->tp : 0,
                    .max_tokens = 256,
                    .max_out = 1,
                    .n_slots = 1,
                    .max_len = max_len};
    ds_status st = ds_tp_model_create(&t->cfg, &t->host, &o, &t->tp, &err);
    if (st != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        tp_engine_close(t);
        return st == DS_ERR_INVALID_ARG ? 2 : 1;
    }
    return 0;
}

int ds_cmd_generate(int argc, char **argv) {
    gen_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;

    ds_error err = {0};
    ds_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    if (a.prompt || !a.print_ids) {
        if (ds_tokenizer_load(a.eng.model_dir, &tok, &err) != DS_OK) {
            fprintf(stderr, "deltaserve generate: %s%s\n", err.msg,
                    a.prompt ? "" : " (use --print-ids to generate ids without a tokenizer)");
            return 1;
        }
    }
    if (a.prompt) {
        if (ds_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, &prompt, &n_prompt, &err)) {
            fprintf(stderr, "deltaserve generate: -p: %s\n", err.msg);
            ds_tokenizer_free(tok);
            return 1;
        }
        if (n_prompt == 0) {
            fprintf(stderr, "deltaserve generate: -p: the prompt encodes to no tokens\n");
            ds_tokenizer_free(tok);
            return 2;
        }
    } else if (!ds_arg_ids("generate", "--tokens", a.tokens, 0, &prompt, &n_prompt)) {
        ds_tokenizer_free(tok);
        return 2;
    }

    ds_cli_engine e = {0};
    tp_engine te = {0};
    a.eng.max_len = (int)n_prompt + a.sp.max_tokens;
    a.eng.max_tokens = 256;
    a.eng.max_out = a.n_spec + 1; /* a verification asks for logits of k + 1 rows */
    if (a.tp > 1) {
        if ((rc = tp_engine_open(&te, &a, a.eng.max_len)) != 0) {
            free(prompt);
            ds_tokenizer_free(tok);
            return rc;
        }
    } else if (!ds_cli_engine_open(&e, &a.eng, "generate")) {
        free(prompt);
        ds_tokenizer_free(tok);
        return 1;
    }
    const ds_config *cfg = a.tp > 1 ? &te.cfg : &e.cfg;
    const int V = cfg->vocab;
    ds_sampler sampler;
    ds_stop_matcher stop;
    ds_detok detok;
    bool sampler_ok = false, stop_ok = false;
    int32_t *out_ids = malloc(sizeof(int32_t) * (size_t)a.sp.max_tokens);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (tok) ds_detok_init(&detok, tok, true);
    rc = 1;
    if (!out_ids || !logits) {
        fprintf(stderr, "deltaserve generate: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= V) {
            fprintf(stderr, "deltaserve generate: prompt token %d is outside the vocabulary (%d)\n",
                    prompt[i], V);
            rc = 2;
            goto done;
        }
    if (ds_sampler_init(&sampler, &a.sp, V, cfg->eos_ids, cfg->n_eos, &err) != DS_OK) {
        ds_sampler_free(&sampler);
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        rc = 2;
        goto done;
    }
    sampler_ok = true;
    ds_status st = ds_stop_matcher_init_params(&stop, &sampler.params, &err);
    stop_ok = true; /* freed even after a failed init, as stop.h asks */
    if (st != DS_OK || ds_sampler_add_prompt(&sampler, prompt, (int)n_prompt, &err) != DS_OK) {
        fprintf(stderr, "deltaserve generate: %s\n", err.msg);
        goto done;
    }

    gen_out o = {.a = &a, .tok = tok, .sampler = &sampler, .stop = &stop, .detok = &detok,
                 .ids = out_ids, .why = "length"};
    ds_spec_stats stats = {0};
    double t_prefill = 0, t0 = now_s();
    if (a.tp > 1 ? run_plain(feed_tp, te.tp, &o, prompt, n_prompt, logits, &t_prefill)
        : a.n_spec > 0 ? run_spec(&e, &o, prompt, n_prompt, &t_prefill, &stats)
                       : run_plain(feed_session, &e.sess, &o, prompt, n_prompt, logits, &t_prefill))
        goto done;
    double t_decode = now_s() - t0 - t_prefill;
    if (tok && !a.print_ids) {
        const char *text;
        size_t len;
        ds_stop_result sr;
        if (ds_detok_flush(&detok, &text, &len, &err) == DS_OK &&
            ds_stop_matcher_feed(&stop, text, len, &sr, &err) == DS_OK)
            emit(sr.text, sr.len);
        ds_stop_matcher_flush(&stop, &sr);
        emit(sr.text, sr.len);
        printf("\n");
    }
    if (a.print_ids) {
        for (int i = 0; i < o.n; i++) printf(i ? ",%d" : "%d", out_ids[i]);
        printf("\n");
    }
    fflush(stdout); /* keep stdout's last line ahead of the stderr summary on a terminal */
    char dev_name[64];
    if (a.tp > 1)
        snprintf(dev_name, sizeof dev_name, "cpu, tensor parallel %d", a.tp);
    else
        snprintf(dev_name, sizeof dev_name, "%s", e.be->ops->name);
    fprintf(stderr,
            "[%s] prompt %zu tokens in %.1f ms (%.1f tok/s); generated %d tokens in %.1f ms "
            "(%.2f tok/s); finish: %s\n",
            dev_name, n_prompt, t_prefill * 1e3, (double)n_prompt / t_prefill, o.n,
            t_decode * 1e3, o.n > 1 ? (double)(o.n - 1) / t_decode : 0.0, o.why);
    if (a.n_spec > 0) {
        fprintf(stderr, "acceptance rate: %.2f, mean accepted length: %.2f (k=%d, %llu steps, "
                "%llu of %llu draft tokens accepted; per position:",
                ds_spec_acceptance_rate(&stats), ds_spec_mean_accepted_len(&stats), a.n_spec,
                (unsigned long long)stats.n_drafts, (unsigned long long)stats.n_accepted_tokens,
                (unsigned long long)stats.n_draft_tokens);
        for (int i = 0; i < a.n_spec; i++) fprintf(stderr, " %.2f", ds_spec_pos_rate(&stats, i));
        fprintf(stderr, ")\n");
    }
    rc = 0;
done:
    if (stop_ok) ds_stop_matcher_free(&stop);
    if (sampler_ok) ds_sampler_free(&sampler);
    if (tok) ds_detok_free(&detok);
    free(out_ids);
    free(logits);
    ds_cli_engine_close(&e);
    tp_engine_close(&te);
    free(prompt);
    ds_tokenizer_free(tok);
    return rc;
}
