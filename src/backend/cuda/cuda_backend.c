/* cuda_backend.c — the CUDA backend's context: creation, memory, synchronisation, the batch
 * upload, and the op table (ops live in cuda_ops.c, weights in cuda_weights.c, caches in
 * cuda_cache.c, step graphs in cuda_graph.c, kernels in cuda_*.cu), the launch counter, the
 * per-kernel profile (DS_CUDA_PROFILE=1) and the copy-bandwidth measurement.
 *
 * One stream per backend; ops only enqueue work on it. Errors are sticky: the first failing
 * CUDA/cuBLASLt call or launch is recorded with file:line and returned by synchronize(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_host.h"
#include "backend/cuda/cuda_internal.h"
#include "core/env.h"

/* Errors that only invalidate an open stream capture (the device is fine). */
static int capture_error(cudaError_t e) {
    return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
           e == cudaErrorStreamCaptureMerge || e == cudaErrorStreamCaptureUnmatched ||
           e == cudaErrorStreamCaptureUnjoined || e == cudaErrorStreamCaptureIsolation ||
           e == cudaErrorStreamCaptureImplicit || e == cudaErrorCapturedEvent ||
           e == cudaErrorStreamCaptureWrongThread;
}

int ds_cuda_check(ds_cuda_ctx *ctx, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    if (ctx->capturing && capture_error(e)) {
        if (!ctx->cap_failed) {
            ctx->cap_failed = 1;
            snprintf(ctx->cap_why, sizeof ctx->cap_why, "%s:%d: %s: %s", file, line, what,
                     cudaGetErrorName(e));
        }
        return 1;
    }
    if (!ctx->failed) {
        ctx->failed = 1;
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s:%d: %s: %s (%s)", file, line, what,
                 cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return 1;
}

int ds_cuda_check_lt(ds_cuda_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                     int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    if (!ctx->failed) {
        ctx->failed = 1;
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s:%d: %s: cuBLAS status %d", file, line, what,
                 (int)s);
    }
    return 1;
}

ds_cuda_ctx *ds_cuda_ctx_of(ds_backend *be) { return (ds_cuda_ctx *)be->impl; }

void ds_cuda_launched(ds_cuda_ctx *ctx, const char *name, int64_t a, int64_t b, const char *file,
                      int line) {
    ds_cuda_check(ctx, cudaGetLastError(), name, file, line);
    ctx->n_launches++;
    if (ctx->prof_open && ctx->prof_n < DS_CUDA_PROF_EVENTS) {
        const int i = ctx->prof_n++;
        ctx->prof_name[i] = name;
        ctx->prof_a[i] = a;
        ctx->prof_b[i] = b;
        DS_CU(ctx, cudaEventRecord(ctx->prof_ev[i], ctx->stream));
    }
}

int ds_cuda_refuse_in_capture(ds_cuda_ctx *ctx, const char *what) {
    if (!ctx->capturing) return 0;
    if (!ctx->cap_failed) {
        ctx->cap_failed = 1;
        snprintf(ctx->cap_why, sizeof ctx->cap_why, "%s waits for the device", what);
    }
    return 1;
}

/* DS_CUDA_DIAG_SKIP: a pattern matches a kernel whose mangled name contains it; two aliases
 * split the add + norm GEMV by its output type at one-sequence steps: "router" (fp32 logits, the
 * MoE router | shared gate_up) and "mixer_in" (bf16, the GDN in_proj and the attention qkv). */
static int diag_matches(const char *name, const char *pat, size_t n) {
    char p[96];
    if (n == 0 || n >= sizeof p) return 0;
    memcpy(p, pat, n);
    p[n] = 0;
    if (!strcmp(p, "router")) return strstr(name, "gemv_add_norm_kernel") && strstr(name, "EfEv");
    if (!strcmp(p, "mixer_in"))
        return strstr(name, "gemv_add_norm_kernel") && strstr(name, "E13__nv_bfloat16Ev");
    return strstr(name, p) != NULL;
}

int ds_cuda_diag_skip(ds_cuda_ctx *ctx, const void *kernel) {
    for (int i = 0; i < ctx->diag_n; i++)
        if (ctx->diag_fn[i] == kernel) return ctx->diag_drop[i];
    const char *name = NULL;
    int drop = 0;
    if (cudaFuncGetName(&name, kernel) == cudaSuccess && name) {
        for (const char *p = ctx->diag_skip; *p;) {
            const char *e = strchr(p, ',');
            const size_t n = e ? (size_t)(e - p) : strlen(p);
            if (diag_matches(name, p, n)) drop = 1;
            p += n + (e ? 1 : 0);
        }
        if (drop) fprintf(stderr, "DS_CUDA_DIAG_SKIP: dropping every launch of %s\n", name);
    }
    if (ctx->diag_n < 64) {
        ctx->diag_fn[ctx->diag_n] = kernel;
        ctx->diag_drop[ctx->diag_n++] = (unsigned char)drop;
    }
    return drop;
}

/* ---- profile (DS_CUDA_PROFILE=1) ------------------------------------------------------------
 * Each eager step (set_batch to set_batch) records an event after every kernel; the time from
 * the previous event (the step's start for the first kernel) is charged to the kernel. A spin
 * kernel queued before the step's start event gives the host a head start, so the kernels run
 * back to back as in a graph replay and what is charged is device time (kernel + the device's
 * own launch latency), not the host's launch pace. The first window of each kind (decode,
 * other) is not charged: it holds one-time costs — lazy loading of the kernels' modules (cuBLASLt's
 * above all), cuBLASLt's plan heuristics — that a 15 ms head start does not cover; s20-run3
 * charged them to the prefill's cuBLASLt GEMMs (18.6 ms a step over 5 steps at batch 1, 10.1
 * over 12 at batch 8, for GEMMs of tens of µs). Printed at destroy. */
#define DS_CUDA_PROF_HEAD_START_US 15000.0

static void prof_add(ds_cuda_ctx *c, const char *name, int64_t a, int64_t b, int decode, double ms) {
    for (int i = 0; i < c->prof_tab_n; i++) {
        ds_cuda_prof_entry *e = &c->prof_tab[i];
        if (e->a == a && e->b == b && e->decode == decode && !strcmp(e->name, name)) {
            e->count++;
            e->ms += ms;
            return;
        }
    }
    if (c->prof_tab_n == DS_CUDA_PROF_ENTRIES) return;
    c->prof_tab[c->prof_tab_n++] =
        (ds_cuda_prof_entry){.name = name, .a = a, .b = b, .decode = decode, .count = 1, .ms = ms};
}

/* Closes the open window: waits for its last event and charges the kernels. */
static void prof_close(ds_cuda_ctx *c) {
    if (!c->prof_open) return;
    c->prof_open = 0;
    if (c->prof_n == 0) return;
    if (DS_CU(c, cudaEventSynchronize(c->prof_ev[c->prof_n - 1]))) return;
    if (c->prof_skipped[c->prof_decode] == 0) {
        c->prof_skipped[c->prof_decode] = 1;
        return;
    }
    cudaEvent_t prev = c->prof_start;
    for (int i = 0; i < c->prof_n; i++) {
        float ms = 0.f;
        DS_CU(c, cudaEventElapsedTime(&ms, prev, c->prof_ev[i]));
        prof_add(c, c->prof_name[i], c->prof_a[i], c->prof_b[i], c->prof_decode, ms);
        prev = c->prof_ev[i];
    }
    c->prof_steps[c->prof_decode]++;
}

static void prof_open(ds_cuda_ctx *c, int decode) {
    prof_close(c);
    if (!c->prof_on || c->capturing) return;
    c->prof_open = 1;
    c->prof_n = 0;
    c->prof_decode = decode;
    /* head start: the host enqueues the whole step (kernels + events, ~5 ms at 35B-A3B) while
     * the device spins, so the events measure device time without host launch gaps */
    ds_cuda_spin(c, DS_CUDA_PROF_HEAD_START_US);
    DS_CU(c, cudaEventRecord(c->prof_start, c->stream));
}

static int prof_cmp(const void *x, const void *y) {
    const ds_cuda_prof_entry *a = x, *b = y;
    if (a->decode != b->decode) return b->decode - a->decode;
    return (a->ms < b->ms) - (a->ms > b->ms);
}

static void prof_print(ds_cuda_ctx *c) {
    prof_close(c);
    if (!c->prof_on || !c->prof_tab_n) return;
    qsort(c->prof_tab, (size_t)c->prof_tab_n, sizeof *c->prof_tab, prof_cmp);
    for (int d = 1; d >= 0; d--) {
        const double steps = (double)c->prof_steps[d];
        if (steps == 0) continue;
        double total = 0;
        for (int i = 0; i < c->prof_tab_n; i++)
            if (c->prof_tab[i].decode == d) total += c->prof_tab[i].ms;
        fprintf(stderr,
                "CUDA profile, %s steps (%.0f; the first, with one-time costs, not counted): %.1f us per "
                "step (device time, kernels back to back)\n",
                d ? "decode" : "other", steps, total * 1e3 / steps);
        fprintf(stderr, "  %-32s %10s %10s %12s %7s\n", "kernel", "shape a", "shape b",
                "us per step", "calls");
        for (int i = 0; i < c->prof_tab_n; i++) {
            const ds_cuda_prof_entry *e = &c->prof_tab[i];
            if (e->decode != d) continue;
            fprintf(stderr, "  %-32s %10lld %10lld %12.2f %7.1f\n", e->name, (long long)e->a,
                    (long long)e->b, e->ms * 1e3 / steps, (double)e->count / steps);
        }
    }
}

/* ---- lifetime ---------------------------------------------------------------------------- */

static void cu_destroy(ds_backend *be) {
    if (!be) return;
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        prof_print(c);
        ds_cuda_graphs_free(c);
        if (c->prof_ev) {
            for (int i = 0; i < DS_CUDA_PROF_EVENTS; i++)
                if (c->prof_ev[i]) cudaEventDestroy(c->prof_ev[i]);
        }
        if (c->prof_start) cudaEventDestroy(c->prof_start);
        free(c->prof_ev);
        free(c->prof_name);
        free(c->prof_a);
        free(c->prof_b);
        free(c->prof_tab);
        cudaFree(c->d_amax_v);
        cudaFree(c->d_amax_i);
        cudaFree(c->d_amax_cnt);
        cudaFree(c->d_amax_key);
        cudaFree(c->d_bans);
        if (c->h_bans) cudaFreeHost(c->h_bans);
        if (c->bans_done) cudaEventDestroy(c->bans_done);
        cudaFree(c->d_samp);
        if (c->h_samp) cudaFreeHost(c->h_samp);
        if (c->samp_done) cudaEventDestroy(c->samp_done);
        if (c->side) cudaStreamDestroy(c->side);
        for (int i = 0; i < DS_CUDA_LT_CACHE; i++) {
            ds_cuda_lt_plan *p = &c->lt_plans[i];
            if (!p->used) continue;
            cublasLtMatmulDescDestroy(p->op);
            cublasLtMatrixLayoutDestroy(p->a);
            cublasLtMatrixLayoutDestroy(p->b);
            cublasLtMatrixLayoutDestroy(p->c);
        }
        if (c->lt) cublasLtDestroy(c->lt);
        cudaFree(c->d_lt_ws);
        cudaFree(c->d_splitk_ws);
        cudaFree(c->d_splitk_cnt);
        cudaFree(c->d_route_flag);
        cudaFree(c->d_meta);
        cudaFree(c->d_ids);
        cudaFree(c->d_tokbuf);
        cudaFree(c->d_shift);
        cudaFree(c->d_moe_scratch);
        cudaFree(c->d_gdn_scratch);
        for (int i = 0; i < DS_CUDA_META_BUFS; i++) {
            if (c->h_meta[i]) cudaFreeHost(c->h_meta[i]);
            if (c->meta_done[i]) cudaEventDestroy(c->meta_done[i]);
        }
        if (c->h_ids) cudaFreeHost(c->h_ids);
        for (int i = 0; i < DS_CUDA_COPY_BUFS; i++)
            if (c->h_copy[i]) cudaFreeHost(c->h_copy[i]);
        if (c->h_tokbuf) cudaFreeHost(c->h_tokbuf);
        if (c->mark_event) cudaEventDestroy(c->mark_event);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

/* ---- memory ------------------------------------------------------------------------------- */

static void *cu_alloc(ds_backend *be, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* an OOM is reported by NULL, not as a sticky device error */
        return NULL;
    }
    if (DS_CU(c, cudaMemsetAsync(p, 0, bytes, c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(ds_backend *be, void *p) {
    if (!p) return;
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    ds_cuda_graphs_free(c); /* a graph may read or write p */
    DS_CU(c, cudaFree(p)); /* cudaFree waits for the device: never inside a step */
}

/* upload/download return with the host buffer reusable (they wait for the stream). */
static void cu_upload(ds_backend *be, void *dst, const void *src, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (!bytes || ds_cuda_refuse_in_capture(c, "upload")) return;
    DS_CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    DS_CU(c, cudaStreamSynchronize(c->stream));
}

static void cu_download(ds_backend *be, void *dst, const void *src, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (!bytes || ds_cuda_refuse_in_capture(c, "download")) return;
    DS_CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    DS_CU(c, cudaStreamSynchronize(c->stream));
}

/* After a wait that covered them: the first n pending host outputs (argmax_logits ids,
 * spec_accept counts, copied to pinned memory by the stream) handed to the callers' buffers and
 * dropped from the list (it is in queue order); the device's sticky error, if any. */
static ds_status deliver_outputs(ds_cuda_ctx *c, int n, ds_error *err) {
    for (int i = 0; i < n && !c->failed; i++)
        memcpy(c->pending.o[i].host, c->pending.o[i].pinned, sizeof(int32_t) * (size_t)c->pending.o[i].n);
    memmove(c->pending.o, c->pending.o + n, sizeof c->pending.o[0] * (size_t)(c->pending.n - n));
    c->pending.n -= n;
    c->mark_outs = 0;
    if (c->failed) return ds_error_set(err, DS_ERR_DEVICE, "CUDA backend: %s", c->errmsg);
    return DS_OK;
}

static ds_status cu_synchronize(ds_backend *be, ds_error *err) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (ds_cuda_refuse_in_capture(c, "synchronize"))
        return ds_error_set(err, DS_ERR_INTERNAL, "CUDA backend: synchronize inside a graph capture");
    DS_CU(c, cudaStreamSynchronize(c->stream));
    return deliver_outputs(c, c->pending.n, err);
}

/* backend.h mark / wait_mark: an event after the queued work; the host outputs pending then
 * are the ones wait_mark hands over (the pending list is in queue order). */
static void cu_mark(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(!c->capturing);
    DS_CU(c, cudaEventRecord(c->mark_event, c->stream));
    c->mark_outs = c->pending.n;
}

static ds_status cu_wait_mark(ds_backend *be, ds_error *err) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(!c->capturing && c->mark_outs <= c->pending.n);
    DS_CU(c, cudaEventSynchronize(c->mark_event));
    return deliver_outputs(c, c->mark_outs, err);
}

/* ---- device facts ----------------------------------------------------------------------------- */

static const char *cu_device_name(ds_backend *be) { return ds_cuda_ctx_of(be)->name; }

static size_t cu_free_memory(ds_backend *be) {
    (void)be;
    size_t fr = 0, total = 0;
    return cudaMemGetInfo(&fr, &total) == cudaSuccess ? fr : 0;
}

static uint64_t cu_take_launch_count(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const uint64_t n = c->n_launches;
    c->n_launches = 0;
    return n;
}

/* Device-to-device copy of 2 GiB (1 GiB, then 256 MiB if memory is short), timed with events
 * over 10 copies after a warm-up; bytes read + written. Measured once, then cached. */
static double cu_copy_bandwidth_gbps(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (c->copy_gbps > 0 || c->capturing) return c->copy_gbps;
    void *a = NULL, *b = NULL;
    size_t bytes = (size_t)2 << 30;
    for (; bytes >= ((size_t)256 << 20); bytes /= 4) {
        if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) break;
        (void)cudaGetLastError();
        cudaFree(a);
        a = b = NULL;
    }
    if (!a || !b) return 0.0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const int iters = 10;
    float ms = 0.f;
    if (!DS_CU(c, cudaEventCreate(&e0)) && !DS_CU(c, cudaEventCreate(&e1))) {
        DS_CU(c, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream));
        DS_CU(c, cudaEventRecord(e0, c->stream));
        for (int i = 0; i < iters; i++)
            DS_CU(c, cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice,
                                     c->stream));
        DS_CU(c, cudaEventRecord(e1, c->stream));
        DS_CU(c, cudaEventSynchronize(e1));
        DS_CU(c, cudaEventElapsedTime(&ms, e0, e1));
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (ms > 0.f && !c->failed) c->copy_gbps = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
    return c->copy_gbps;
}

/* ---- batch ------------------------------------------------------------------------------- */

/* Packs the host arrays into pinned staging and uploads them with one async copy. The staging
 * buffers (DS_CUDA_META_BUFS) are used in turn; before refilling one we wait for its previous
 * upload (issued DS_CUDA_META_BUFS batches ago: a chained verification and its draft passes
 * are queued while the device still runs the step before, so two would make the host wait for
 * it), so the host never overwrites bytes a pending copy still reads.
 * A batch with pos_shift / out_shift is lowered on the device by batch_shift_kernel, launched
 * here (so a capture records it) unless `shift` is 0: a graph replay, whose graph has it. */
void ds_cuda_upload_batch(ds_backend *be, const ds_batch *b, int shift) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int T = b->n_tokens, S = b->n_seqs, mb = b->max_blocks, no = b->n_out;
    DS_ASSERT(T >= 0 && T <= DS_CUDA_MAX_TOKENS);
    DS_ASSERT(S >= 0 && S <= DS_CUDA_MAX_SEQS);
    DS_ASSERT(no >= 0 && no <= DS_CUDA_MAX_TOKENS);
    DS_ASSERT(mb >= 0);
    const int has_so = b->state_out_slots != NULL;
    const int has_shift = b->pos_shift != NULL || b->out_shift != NULL;
    const int64_t total = 4 * (int64_t)T + (S + 1) + 2 * (int64_t)S + no + (int64_t)S * mb +
                          (has_so ? T : 0) + (has_shift ? (int64_t)S + no : 0);
    DS_ASSERT(total <= DS_CUDA_META_INTS);

    const int f = c->meta_flip;
    DS_CU(c, cudaEventSynchronize(c->meta_done[f]));
    int32_t *h = c->h_meta[f];
    int64_t o = 0;
    const int64_t o_tokens = o; o += T;
    const int64_t o_pos = o; o += T;
    const int64_t o_start = o; o += S + 1;
    const int64_t o_slot = o; o += S;
    const int64_t o_past = o; o += S;
    const int64_t o_out = o; o += no;
    const int64_t o_tokseq = o; o += T;
    const int64_t o_bt = o; o += (int64_t)S * mb;
    const int64_t o_so = o; o += has_so ? T : 0;
    const int64_t o_tsrc = o; o += T;
    const int64_t o_pshift = o; o += has_shift ? S : 0;
    const int64_t o_oshift = o; o += has_shift ? no : 0;

    if (T) {
        memcpy(h + o_tokens, b->tokens, sizeof(int32_t) * (size_t)T);
        memcpy(h + o_pos, b->positions, sizeof(int32_t) * (size_t)T);
    }
    memcpy(h + o_start, b->seq_start, sizeof(int32_t) * (size_t)(S + 1));
    if (S) {
        memcpy(h + o_slot, b->seq_slot, sizeof(int32_t) * (size_t)S);
        memcpy(h + o_past, b->seq_n_past, sizeof(int32_t) * (size_t)S);
    }
    if (no) memcpy(h + o_out, b->out_rows, sizeof(int32_t) * (size_t)no);
    if (S && mb) memcpy(h + o_bt, b->block_table, sizeof(int32_t) * (size_t)S * (size_t)mb);
    if (has_so && T) memcpy(h + o_so, b->state_out_slots, sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) {
        const int32_t src = b->token_src ? b->token_src[t] : -1;
        DS_ASSERT(src < DS_TOKEN_BUF);
        h[o_tsrc + t] = src;
    }
    if (has_shift) {
        for (int s = 0; s < S; s++) {
            h[o_pshift + s] = b->pos_shift ? b->pos_shift[s] : -1;
            DS_ASSERT(h[o_pshift + s] < DS_SHIFT_TABLE);
        }
        for (int r = 0; r < no; r++) {
            h[o_oshift + r] = b->out_shift ? b->out_shift[r] : -1;
            DS_ASSERT(h[o_oshift + r] < DS_SHIFT_TABLE);
        }
    }
    int max_tok = 0, max_ctx = 0;
    DS_ASSERT(b->seq_start[0] == 0 && b->seq_start[S] == T);
    for (int s = 0; s < S; s++) {
        const int n = b->seq_start[s + 1] - b->seq_start[s];
        DS_ASSERT(n >= 0);
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) h[o_tokseq + t] = s;
        if (n > max_tok) max_tok = n;
        if (b->seq_n_past[s] + n > max_ctx) max_ctx = b->seq_n_past[s] + n;
    }
    for (int r = 0; r < no; r++) DS_ASSERT(b->out_rows[r] >= 0 && b->out_rows[r] < T);

    if (c->capturing) {
        /* Not recorded: uploaded now on the side stream (graph_begin drained the main stream,
         * so no kernel of an earlier step still reads d_meta). A replay's batch is uploaded by
         * graph_launch before the graph runs. */
        if (total > 0) {
            DS_CU(c, cudaMemcpyAsync(c->d_meta, h, sizeof(int32_t) * (size_t)total,
                                     cudaMemcpyHostToDevice, c->side));
            DS_CU(c, cudaStreamSynchronize(c->side));
        }
    } else {
        if (total > 0)
            DS_CU(c, cudaMemcpyAsync(c->d_meta, h, sizeof(int32_t) * (size_t)total,
                                     cudaMemcpyHostToDevice, c->stream));
        DS_CU(c, cudaEventRecord(c->meta_done[f], c->stream));
        c->meta_flip = (f + 1) % DS_CUDA_META_BUFS;
    }

    ds_cuda_batch *d = &c->batch;
    d->n_tokens = T;
    d->n_seqs = S;
    d->max_blocks = mb;
    d->n_out = no;
    d->tokens = c->d_meta + o_tokens;
    d->positions = c->d_meta + o_pos;
    d->seq_start = c->d_meta + o_start;
    d->seq_slot = c->d_meta + o_slot;
    d->n_past = c->d_meta + o_past;
    d->out_rows = c->d_meta + o_out;
    d->tok_seq = c->d_meta + o_tokseq;
    d->block_table = c->d_meta + o_bt;
    d->state_out = has_so ? c->d_meta + o_so : NULL;
    d->token_src = c->d_meta + o_tsrc;
    d->pos_shift = has_shift ? c->d_meta + o_pshift : NULL;
    d->out_shift = has_shift ? c->d_meta + o_oshift : NULL;
    DS_ASSERT(b->slot_ring == 0 || (b->slot_ring >= 2 && b->pos_shift));
    d->slot_ring = b->slot_ring;
    c->info.max_seq_tokens = max_tok;
    c->info.max_ctx = max_ctx;
    c->h_cur = h;
    c->h_positions_off = (int)o_pos;
    c->h_seq_start_off = (int)o_start;
    c->h_seq_slot_off = (int)o_slot;
    c->h_block_table_off = (int)o_bt;
    c->h_tok_seq_off = (int)o_tokseq;
    c->h_state_out_off = has_so ? (int)o_so : -1;
    const int decode = T > 0 && max_tok == 1;
    prof_open(c, decode);
    /* DS_CUDA_PROFILER_STEP=N: the N-th decode step (from 1) runs between cudaProfilerStart and
     * cudaProfilerStop, so `ncu --profile-from-start off` sees exactly one decode step;
     * DS_CUDA_PROFILER_PREFILL=N: the same for the N-th step that is not a decode step */
    if ((c->profiler_step > 0 || c->profiler_prefill > 0) && !c->capturing) {
        if (c->profiler_running) {
            DS_CU(c, cudaProfilerStop());
            c->profiler_running = 0;
            c->profiler_step = c->profiler_prefill = 0;
        } else if ((decode && ++c->profiler_seen == c->profiler_step) ||
                   (!decode && T > 0 && ++c->profiler_pf_seen == c->profiler_prefill)) {
            DS_CU(c, cudaProfilerStart());
            c->profiler_running = 1;
        }
    }
    if (has_shift && shift) ds_cuda_batch_shift(c); /* the step's first kernel */
}

void ds_cuda_set_batch(ds_backend *be, const ds_batch *b) { ds_cuda_upload_batch(be, b, 1); }

/* ---- op table ----------------------------------------------------------------------------- */

static const ds_backend_ops cuda_ops = {
    .name = "cuda",
    .act_dtype = DS_DTYPE_BF16,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .synchronize = cu_synchronize,
    .prepare_weights = ds_cuda_prepare_weights,
    .release_weights = ds_cuda_release_weights,
    .cache_create = ds_cuda_cache_create,
    .cache_free = ds_cuda_cache_free,
    .cache_reset_slot = ds_cuda_cache_reset_slot,
    .set_batch = ds_cuda_set_batch,
    .embed = ds_cuda_op_embed,
    .rmsnorm = ds_cuda_op_rmsnorm,
    .add_rmsnorm = ds_cuda_op_add_rmsnorm,
    .linear = ds_cuda_op_linear,
    .silu_mul = ds_cuda_op_silu_mul,
    .gather_rows = ds_cuda_op_gather_rows,
    .attention = ds_cuda_op_attention,
    .gdn = ds_cuda_op_gdn,
    .moe = ds_cuda_op_moe,
    .moe_add_rmsnorm = ds_cuda_op_moe_add_rmsnorm,
    .moe_sublayer = ds_cuda_op_moe_sublayer,
    .linear_rmsnorm = ds_cuda_op_linear_rmsnorm,
    .logits = ds_cuda_op_logits,
    .argmax = ds_cuda_op_argmax,
    .dummy_weights = ds_cuda_dummy_weights,
    .copy_bandwidth_gbps = cu_copy_bandwidth_gbps,
    .take_launch_count = cu_take_launch_count,
    .device_name = cu_device_name,
    .concat = ds_cuda_op_concat,
    .argmax_logits = ds_cuda_op_argmax_logits,
    .set_argmax_bans = ds_cuda_set_argmax_bans,
    .copy_tokens = ds_cuda_op_copy_tokens,
    .spec_accept = ds_cuda_op_spec_accept,
    .set_spec_sampling = ds_cuda_set_spec_sampling,
    .spec_sample = ds_cuda_op_spec_sample,
    .mark = cu_mark,
    .wait_mark = cu_wait_mark,
    .graph_begin = ds_cuda_graph_begin,
    .graph_end = ds_cuda_graph_end,
    .graph_launch = ds_cuda_graph_launch,
    .free_memory = cu_free_memory,
};

#define CREATE_CHECK(call)                                                                      \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            st = ds_error_set(err,                                                              \
                              e_ == cudaErrorMemoryAllocation ? DS_ERR_NOMEM : DS_ERR_DEVICE,   \
                              "CUDA backend: %s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                          \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

/* A measurement knob that is on unless its variable is set to 0 (README "Switches": each knob's
 * before/after; any value atoi reads as 0 turns it off). */
static int knob_on(const char *name) {
    const char *v = getenv(name);
    return !(v && atoi(v) == 0);
}

ds_status ds_backend_cuda_create(int device, ds_backend **out, ds_error *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "no CUDA device available (%s)",
                            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "CUDA device %d does not exist (%d present)",
                            device, n);
    ds_status st = DS_OK;
    ds_backend *be = ds_xcalloc(1, sizeof *be);
    ds_cuda_ctx *c = ds_xcalloc(1, sizeof *c);
    be->ops = &cuda_ops;
    be->impl = c;
    c->device = device;
    {
        const char *rows = getenv("DS_CUDA_GEMV_ROWS"); /* measurement knob, see cuda_notes.md */
        c->gemv_rows = rows ? atoi(rows) : 4; /* 4 vs 2: -4.8 % step at batch 1 (s3-run6) */
        const char *rmax = getenv("DS_CUDA_MOE_RMAX"); /* measurement knob, see cuda_notes.md */
        c->moe_rmax = rmax ? atoi(rmax) : 2;
        const char *rmax_pf = getenv("DS_CUDA_MOE_RMAX_PREFILL");
        c->moe_rmax_prefill = rmax_pf ? atoi(rmax_pf) : 4; /* 4 vs 8: TTFT -16 % (s3-run6) */
        const char *wn = getenv("DS_CUDA_MOE_GEMM_WN"); /* measurement knobs, cuda_notes.md */
        c->moe_gemm_wn = wn && atoi(wn) == 4 ? 4 : 2; /* 2 vs 4: prefill 1024 −4.6 % (s4-run6) */
        const char *gur = getenv("DS_CUDA_MOE_GU_ROWS"), *dnr = getenv("DS_CUDA_MOE_DOWN_ROWS");
        c->moe_gu_rows = gur && atoi(gur) == 4 ? 4 : 2;
        c->moe_down_rows = dnr && (atoi(dnr) == 4 || atoi(dnr) == 8 || atoi(dnr) == 16) ? atoi(dnr) : 0;
        c->tc_tail = knob_on("DS_CUDA_TC_TAIL");
        c->route_regs = knob_on("DS_CUDA_ROUTE_REGS");
        c->route_redux = knob_on("DS_CUDA_ROUTE_REDUX");
        c->route_ranks = knob_on("DS_CUDA_ROUTE_RANKS");
        c->attn_lanes8 = knob_on("DS_CUDA_ATTN_LANES8");
        c->attn_fuse_prep = knob_on("DS_CUDA_ATTN_FUSE_PREP");
        const char *fp1 = getenv("DS_CUDA_ATTN_FUSE_PREP1");
        c->attn_fuse_prep1 = !(fp1 && atoi(fp1) == 0); /* cuda_internal.h: its numbers */
        const char *grain = getenv("DS_CUDA_ATTN_SPLIT_GRAIN");
        c->attn_split_grain = grain && (atoi(grain) == 16 || atoi(grain) == 32) ? atoi(grain) : 0;
        c->attn_combine_warps = knob_on("DS_CUDA_ATTN_COMBINE_WARPS"); /* cuda_internal.h: its numbers */
        const char *ms1 = getenv("DS_CUDA_ATTN_MAX_SPLIT1");
        c->attn_max_split1 = ms1 && atoi(ms1) == 64 ? 64 : 128;
        c->carveout1 = knob_on("DS_CUDA_CARVEOUT1"); /* cuda_internal.h: its numbers */
        /* 2 (default) vs 0: 5.391 / 8.150 and 5.397 / 8.138 vs 5.451 / 8.254 and 5.456 / 8.260 ms
         * at batch 4 / 8; after 8192 tokens batch 8 8.523 vs 9.031 ms; batch 1 (1: on there
         * too) 2.949 / 2.954 vs 2.932 / 2.930 ms, after 8192 tokens 3.062 vs 3.126 (H100, s31-run2) */
        const char *dtc = getenv("DS_CUDA_ATTN_DEC_TC");
        c->attn_dec_tc = dtc && (atoi(dtc) == 0 || atoi(dtc) == 1) ? atoi(dtc) : 2;
        /* 1 (default) vs 0: 2.912 / 5.391 / 8.139 and 2.910 / 5.395 / 8.127 vs 2.930 / 5.397 /
         * 8.143 and 2.921 / 5.396 / 8.144 ms (H100, s32-run1) */
        c->attn_kv_early = knob_on("DS_CUDA_ATTN_KV_EARLY");
        /* prefill of 1024 tokens 48.60 / 48.67 (both off) → 48.10 (pipe) → 47.77 / 47.77 ms (pipe +
         * PV16); attention prefill of 2048 tokens 0.689 → 0.652 → 0.556 ms (H100, s21-run2) */
        c->attn_pf_pipe = knob_on("DS_CUDA_ATTN_PF_PIPE");
        c->attn_pf_pv16 = knob_on("DS_CUDA_ATTN_PF_PV16");
        /* 1 vs 0: attention prefill of 2048 tokens 0.514 vs 0.547 ms, prefill of 8192 tokens
         * 344.0 / 343.8 vs 349.0 ms (359.2 with session 20's kernel; H100, s21-run5/6) */
        c->attn_pf_smr = knob_on("DS_CUDA_ATTN_PF_SMR");
        c->gdn_tf32 = knob_on("DS_CUDA_GDN_TF32"); /* cuda_internal.h: its numbers */
        c->gdn_prep_preload = knob_on("DS_CUDA_GDN_PREP_PRELOAD");
        c->gdn_v_in_chunk = knob_on("DS_CUDA_GDN_V_IN_CHUNK");
        c->gdn_tf32_stored = knob_on("DS_CUDA_GDN_TF32_STORED");
        /* 1 vs 0: prefill of 8192 tokens 294.9 vs 319.1 / 319.0 ms (H100, s24-run1); attention
         * prefill of 2048 tokens 0.342 vs 0.517 ms, 1024 tokens even (H200, s23-run1) */
        c->attn_pf_p1 = knob_on("DS_CUDA_ATTN_PF_P1");
        c->route_batched = knob_on("DS_CUDA_ROUTE_BATCHED");
        const char *one = getenv("DS_CUDA_TC_ONE_SEQ");
        c->tc_one_seq = one && atoi(one) == 1;
        c->gdn_early = knob_on("DS_CUDA_GDN_EARLY");
        /* 0, 1 or 2 (default) batches before the PDL wait. 2 vs 1: batch 1 2.962 / 2.980 vs
         * 2.991 / 3.016 ms, batch 4 / 8 unchanged (H100, s19-run1, two rounds) */
        const char *gpre = getenv("DS_CUDA_GEMV_PRELOAD");
        c->gemv_preload = gpre && atoi(gpre) >= 0 && atoi(gpre) <= 2 ? atoi(gpre) : 2;
        c->moe_down_staged = knob_on("DS_CUDA_MOE_DOWN_STAGED");
        /* 4 vs 1: 4.529 / 6.722 vs 4.598 / 6.895 ms at batch 4 / 8 (2: 4.531 / 6.786, 8: 4.547 /
         * 6.764; s17-run2, one run) */
        const char *tiles = getenv("DS_CUDA_MOE_DOWN_TILES");
        c->moe_down_tiles = tiles && (atoi(tiles) == 1 || atoi(tiles) == 2 || atoi(tiles) == 8) ? atoi(tiles) : 4;
        c->diag_skip = getenv("DS_CUDA_DIAG_SKIP");
        if (c->diag_skip && !*c->diag_skip) c->diag_skip = NULL;
        c->diag_gdn_nostore = c->diag_skip && strstr(c->diag_skip, "gdn_nostore");
        /* 8 vs 4 rows a warp: batch 1 2.985 / 2.984 vs 2.991 / 3.016 ms; with PRELOAD 2 2.945
         * (H100, s19-run1) */
        const char *dcr = getenv("DS_CUDA_MOE_DC_ROWS");
        c->moe_dc_rows = dcr && (atoi(dcr) == 2 || atoi(dcr) == 4) ? atoi(dcr) : 8;
        const char *amt = getenv("DS_CUDA_AMAX_TILES"), *ama = getenv("DS_CUDA_AMAX_ATOMIC");
        /* keys vs partials: 2.933 / 5.548 / 8.383 vs 2.940 / 5.571 / 8.419 ms at batch 1 / 4 / 8
         * (H100, s20-run1) */
        c->amax_atomic = !(ama && atoi(ama) == 0);
        c->amax_tiles = amt && atoi(amt) >= 1 && atoi(amt) <= 64 ? atoi(amt) : 1;
        const char *fmt = getenv("DS_CUDA_ROUTE_FUSED_MAX_T");
        c->route_fused_max_t = fmt && atoi(fmt) >= 1 && atoi(fmt) <= 8 ? atoi(fmt) : 1;
        const char *cols = getenv("DS_CUDA_GDN_SCAN_COLS");
        c->gdn_scan_cols = cols && atoi(cols) == 4 ? 4 : 2;
        const char *stages = getenv("DS_CUDA_MOE_GEMM_STAGES");
        c->moe_gemm_stages = stages && (atoi(stages) == 3 || atoi(stages) == 4) ? atoi(stages) : 2;
        const char *gbk = getenv("DS_CUDA_MOE_GEMM_BK"), *gbn = getenv("DS_CUDA_MOE_GEMM_BN");
        /* BK 64 vs 32: prefill of 1024 tokens 48.37 / 48.48 vs 58.99 / 58.62 ms (BK 128 48.94,
         * BK 64 + 3 stages 49.32, BN 256 + BK 64 48.12; H100, s19-run1) */
        c->moe_gemm_bk = gbk && (atoi(gbk) == 32 || atoi(gbk) == 128) ? atoi(gbk) : 64;
        /* BN 256 vs 128 (BK 64): 48.12 vs 48.37 / 48.48 ms (s19-run1), 44.05 vs 44.38 / 44.45
         * (s24-run1), 43.91 vs 44.17 / 44.13 with the padding skip (s24-run4): −0.25 to −0.35 ms
         * in three runs, all on H100s; the default since session 24 */
        c->moe_gemm_bn = gbn && atoi(gbn) == 128 ? 128 : 256;
        const char *gdt = getenv("DS_CUDA_MOE_GEMM_DOWN_TILES");
        c->moe_gemm_down_tiles = gdt && (atoi(gdt) == 2 || atoi(gdt) == 4) ? atoi(gdt) : 1;
        /* 1 vs 0: prefill of 1024 tokens 43.86 / 44.05 vs 44.68 / 44.65 ms (H100, s24-run3) */
        c->moe_gemm_skip = knob_on("DS_CUDA_MOE_GEMM_SKIP");
        /* 1 vs 0: prefill of 1024 tokens 40.54 / 40.78 vs 42.93 / 42.90 ms; gate_up 15.6, down
         * 8.3 ms of its eager device time (H100, s25-run2) */
        c->moe_gemm_tma = knob_on("DS_CUDA_MOE_GEMM_TMA");
        /* 1 vs 0: prefill of 1024 tokens 40.03 / 39.80 vs 40.82 / 40.66 ms, 8192 tokens 264.9 vs
         * 267.0 (H100, s25-run3) */
        c->moe_gemm_fuse = knob_on("DS_CUDA_MOE_GEMM_FUSE");
        const char *gmt = getenv("DS_CUDA_MOE_GEMM_MIN_T");
        c->moe_gemm_min_t = gmt && atoi(gmt) >= 2 && atoi(gmt) <= DS_CUDA_GEMV_MAX_ROWS ? atoi(gmt)
                                                                                      : DS_CUDA_GEMV_MAX_ROWS + 1;
        const char *gev = getenv("DS_CUDA_MOE_GEMM_EVICT");
        c->moe_gemm_evict = gev && atoi(gev) == 1;
        c->lt_split = knob_on("DS_CUDA_LT_SPLIT");
        c->router_pad = knob_on("DS_CUDA_ROUTER_PAD"); /* cuda_internal.h: their numbers */
        c->moe_y16 = knob_on("DS_CUDA_MOE_Y16");
        c->norm_regs = knob_on("DS_CUDA_NORM_REGS");
        c->gemv_norm = knob_on("DS_CUDA_GEMV_NORM");
        /* batch 1 2.617 → 2.517 ms, 303 → 264 launches a step (s13-run1, two runs each; batch
         * 4 / 8 have no one-token MoE steps) */
        c->moe_down_combine = knob_on("DS_CUDA_MOE_DOWN_COMBINE");
        c->moe_down_early = knob_on("DS_CUDA_MOE_DOWN_EARLY"); /* cuda_internal.h: its numbers */
        c->gemv_narrow = knob_on("DS_CUDA_GEMV_NARROW");
        const char *spm = getenv("DS_CUDA_SPLITK_PER_SM"), *tspm = getenv("DS_CUDA_TC_SPLITK_PER_SM");
        c->splitk_per_sm = spm && atoi(spm) >= 1 && atoi(spm) <= 8 ? atoi(spm) : 2;
        /* tensor cores never split K: 0 / 1 / 2 blocks per SM at batch 4 4.760 / 4.824 / 4.956
         * ms, batch 8 7.100 / 7.175 / 7.306 ms (s11-run5, two runs each); the CUDA cores keep 2
         * (1: 2.724 / 2.701 vs 2.676 / 2.698 ms at batch 1, s11-run4) */
        c->tc_splitk_per_sm = tspm && atoi(tspm) >= 0 && atoi(tspm) <= 8 ? atoi(tspm) : 0;
        c->lm_head_tc = knob_on("DS_CUDA_LM_HEAD_TC");
        c->gdn_chunked = knob_on("DS_CUDA_GDN_CHUNKED");
        c->opt.moe_fast_route = ds_env_switch("DS_OPT_MOE_FAST_ROUTE", true);
        c->opt.moe_route_fused = ds_env_switch("DS_OPT_MOE_ROUTE_FUSED", true);
        c->opt.tc_gemv = ds_env_switch("DS_OPT_TC_GEMV", true);
        c->opt.moe_fuse_shared = ds_env_switch("DS_OPT_SHARED_EXPERT", true);
        c->opt.fuse_norm = ds_env_switch("DS_OPT_FUSED_NORM", true);
        c->opt.pdl = ds_env_switch("DS_OPT_PDL", true);
        /* default off: measured slower (docs/cuda_notes.md, session 3) */
        c->opt.prefetch = ds_env_switch("DS_OPT_PREFETCH", false);
        c->opt.moe_gemm = ds_env_switch("DS_OPT_MOE_GEMM", true);
        c->opt.gdn_prefill = ds_env_switch("DS_OPT_GDN_PREFILL", true);
    }
    CREATE_CHECK(cudaSetDevice(device));
    struct cudaDeviceProp prop;
    CREATE_CHECK(cudaGetDeviceProperties(&prop, device));
    c->sm_count = prop.multiProcessorCount;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    c->smem_optin = prop.sharedMemPerBlockOptin;
    CREATE_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CREATE_CHECK(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
    for (int i = 0; i < DS_CUDA_META_BUFS; i++) {
        CREATE_CHECK(cudaHostAlloc((void **)&c->h_meta[i], sizeof(int32_t) * DS_CUDA_META_INTS,
                                   cudaHostAllocDefault));
        CREATE_CHECK(cudaEventCreateWithFlags(&c->meta_done[i], cudaEventDisableTiming));
    }
    CREATE_CHECK(cudaMalloc((void **)&c->d_meta, sizeof(int32_t) * DS_CUDA_META_INTS));
    CREATE_CHECK(cudaMalloc((void **)&c->d_splitk_ws, sizeof(float) * DS_CUDA_SPLITK_WS_FLOATS));
    CREATE_CHECK(cudaMalloc((void **)&c->d_splitk_cnt, sizeof(int) * DS_CUDA_SPLITK_COUNTERS));
    CREATE_CHECK(cudaMemset(c->d_splitk_cnt, 0, sizeof(int) * DS_CUDA_SPLITK_COUNTERS));
    CREATE_CHECK(cudaMalloc((void **)&c->d_route_flag, sizeof(int) * 2));
    CREATE_CHECK(cudaMemset(c->d_route_flag, 0, sizeof(int) * 2));
    CREATE_CHECK(cudaMalloc(&c->d_lt_ws, DS_CUDA_LT_WS_BYTES));
    CREATE_CHECK(cudaMalloc((void **)&c->d_ids, sizeof(int32_t) * DS_CUDA_MAX_TOKENS));
    CREATE_CHECK(cudaHostAlloc((void **)&c->h_ids, sizeof(int32_t) * DS_CUDA_MAX_TOKENS,
                               cudaHostAllocDefault));
    CREATE_CHECK(cudaMalloc((void **)&c->d_tokbuf, sizeof(int32_t) * DS_TOKEN_BUF));
    CREATE_CHECK(cudaMemset(c->d_tokbuf, 0, sizeof(int32_t) * DS_TOKEN_BUF));
    CREATE_CHECK(cudaHostAlloc((void **)&c->h_tokbuf, sizeof(int32_t) * DS_TOKEN_BUF,
                               cudaHostAllocDefault));
    for (int i = 0; i < DS_CUDA_COPY_BUFS; i++)
        CREATE_CHECK(cudaHostAlloc((void **)&c->h_copy[i], sizeof(int32_t) * DS_TOKEN_BUF,
                                   cudaHostAllocDefault));
    CREATE_CHECK(cudaMalloc((void **)&c->d_shift, sizeof(int32_t) * DS_SHIFT_TABLE));
    CREATE_CHECK(cudaMemset(c->d_shift, 0, sizeof(int32_t) * DS_SHIFT_TABLE));
    CREATE_CHECK(cudaEventCreateWithFlags(&c->mark_event, cudaEventDisableTiming));
    CREATE_CHECK(cudaMalloc((void **)&c->d_amax_v, sizeof(float) * DS_CUDA_AMAX_BLOCKS * 8 * 2));
    CREATE_CHECK(cudaMalloc((void **)&c->d_amax_i, sizeof(int32_t) * DS_CUDA_AMAX_BLOCKS * 8 * 2));
    CREATE_CHECK(cudaMalloc((void **)&c->d_amax_cnt, sizeof(int)));
    CREATE_CHECK(cudaMemset(c->d_amax_cnt, 0, sizeof(int)));
    CREATE_CHECK(cudaMalloc((void **)&c->d_amax_key, sizeof(unsigned long long) * 16));
    CREATE_CHECK(cudaMemset(c->d_amax_key, 0, sizeof(unsigned long long) * 16));
    CREATE_CHECK(cudaMalloc((void **)&c->d_bans, sizeof(int32_t) * (2 + DS_CUDA_BAN_INTS)));
    CREATE_CHECK(cudaMemset(c->d_bans, 0, sizeof(int32_t) * 2)); /* no bans */
    CREATE_CHECK(cudaHostAlloc((void **)&c->h_bans, sizeof(int32_t) * (2 + DS_CUDA_BAN_INTS),
                               cudaHostAllocDefault));
    CREATE_CHECK(cudaEventCreateWithFlags(&c->bans_done, cudaEventDisableTiming));
    CREATE_CHECK(cudaMalloc((void **)&c->d_samp, sizeof(ds_spec_sampling) * DS_SPEC_SAMPLING_MAX));
    CREATE_CHECK(cudaHostAlloc((void **)&c->h_samp, sizeof(ds_spec_sampling) * DS_SPEC_SAMPLING_MAX,
                               cudaHostAllocDefault));
    CREATE_CHECK(cudaEventCreateWithFlags(&c->samp_done, cudaEventDisableTiming));
    {
        const char *step = getenv("DS_CUDA_PROFILER_STEP");
        c->profiler_step = step ? atoi(step) : 0;
        const char *pf = getenv("DS_CUDA_PROFILER_PREFILL");
        c->profiler_prefill = pf ? atoi(pf) : 0;
    }
    {
        const char *prof = getenv("DS_CUDA_PROFILE");
        if (prof && prof[0] && strcmp(prof, "0")) {
            c->prof_on = 1;
            c->prof_ev = ds_xcalloc(DS_CUDA_PROF_EVENTS, sizeof *c->prof_ev);
            c->prof_name = ds_xcalloc(DS_CUDA_PROF_EVENTS, sizeof *c->prof_name);
            c->prof_a = ds_xcalloc(DS_CUDA_PROF_EVENTS, sizeof *c->prof_a);
            c->prof_b = ds_xcalloc(DS_CUDA_PROF_EVENTS, sizeof *c->prof_b);
            c->prof_tab = ds_xcalloc(DS_CUDA_PROF_ENTRIES, sizeof *c->prof_tab);
            CREATE_CHECK(cudaEventCreate(&c->prof_start));
            for (int i = 0; i < DS_CUDA_PROF_EVENTS; i++) CREATE_CHECK(cudaEventCreate(&c->prof_ev[i]));
        }
    }
    {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            st = ds_error_set(err, DS_ERR_DEVICE,
                              "CUDA backend: cublasLtCreate failed (status %d)", (int)s);
            goto fail;
        }
    }
    /* DS_CUDA_PREFER_SHARED=1 (measurement knob, off: batch 1 −1.4 % but batch 4 / 8 +13 %,
     * s35-run1; one-token steps take it per launch instead, ctx->carveout1): every kernel
     * prefers the largest shared-memory carveout. An SM changes its L1 / shared split only when
     * idle, so a kernel that needs more shared memory than the running one's configuration
     * gives (the decode attention's ~80 KB blocks after GEMVs of a few KB) cannot start its
     * blocks beside its predecessor's under PDL; one configuration for all removes those
     * drains. The streamed weights bypass L1 anyway. */
    const char *pshared = getenv("DS_CUDA_PREFER_SHARED");
    if (pshared && atoi(pshared) == 1) CREATE_CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
    ds_cuda_attention_init(c);
    ds_cuda_gdn_chunked_init(c);
    ds_cuda_moe_init(c);
    if (c->failed) {
        st = ds_error_set(err, DS_ERR_DEVICE, "CUDA backend: %s", c->errmsg);
        goto fail;
    }
    CREATE_CHECK(cudaDeviceSynchronize());
    *out = be;
    return DS_OK;
fail:
    (void)cudaGetLastError();
    cu_destroy(be);
    return st;
}
