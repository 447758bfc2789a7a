/* cpu_backend.c — the CPU reference backend: context, memory, weights, batch, op table.
 *
 * fp32 arithmetic throughout; activations are F32; weights stay in their checkpoint dtype
 * (bf16/f16/f32) and are converted on the fly inside the kernels. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_internal.h"

/* ---- memory ---------------------------------------------------------------------------------- */

/* Every block starts with a 64-byte header (total size + how it was obtained) so the returned
 * pointer stays 64-byte aligned. Large blocks come from mmap: zeroed lazily by the kernel, so a
 * big KV pool costs nothing until it is touched. */
#define CPU_ALLOC_HEADER   64
#define CPU_ALLOC_MMAP_MIN ((size_t)4 << 20)

typedef struct alloc_header {
    size_t total;
    int from_mmap;
} alloc_header;

void *ds_cpu_aligned_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - CPU_ALLOC_HEADER) return NULL;
    size_t total = bytes + CPU_ALLOC_HEADER;
    void *base = NULL;
    int from_mmap = total >= CPU_ALLOC_MMAP_MIN;
    if (from_mmap) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
    } else {
        if (posix_memalign(&base, 64, total) != 0) return NULL;
        memset(base, 0, total);
    }
    alloc_header *h = base;
    h->total = total;
    h->from_mmap = from_mmap;
    return (char *)base + CPU_ALLOC_HEADER;
}

void ds_cpu_aligned_free(void *p) {
    if (!p) return;
    alloc_header *h = (alloc_header *)((char *)p - CPU_ALLOC_HEADER);
    if (h->from_mmap)
        munmap(h, h->total);
    else
        free(h);
}

static float *buf_reserve(ds_cpu_buf *b, size_t n_floats) {
    size_t bytes = n_floats * sizeof(float);
    if (bytes > b->bytes || !b->p) {
        ds_cpu_aligned_free(b->p);
        b->p = ds_cpu_aligned_alloc(bytes ? bytes : 64);
        DS_ASSERT(b->p != NULL);
        b->bytes = bytes;
    }
    return b->p;
}

float *ds_cpu_scratch(ds_cpu *cpu, int tid, int level, size_t n_floats) {
    DS_ASSERT(tid >= 0 && tid < cpu->n_threads && level >= 0 && level < DS_CPU_SCRATCH_LEVELS);
    return buf_reserve(&cpu->scratch[tid * DS_CPU_SCRATCH_LEVELS + level], n_floats);
}

float *ds_cpu_work(ds_cpu *cpu, int which, size_t n_floats) {
    DS_ASSERT(which >= 0 && which < DS_CPU_WORK_COUNT);
    return buf_reserve(&cpu->work[which], n_floats);
}

const ds_batch *ds_cpu_batch(ds_cpu *cpu) {
    DS_ASSERT(cpu->has_batch);
    return &cpu->batch;
}

static void *cpu_alloc(ds_backend *be, size_t bytes) {
    (void)be;
    return ds_cpu_aligned_alloc(bytes);
}

static void cpu_free(ds_backend *be, void *p) {
    (void)be;
    ds_cpu_aligned_free(p);
}

static void cpu_copy(ds_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static ds_status cpu_synchronize(ds_backend *be, ds_error *err) {
    (void)be;
    (void)err;
    return DS_OK; /* every op has finished when it returns */
}

/* ---- weights: the CPU computes straight from the host views ---------------------------------- */

static ds_status cpu_prepare_weights(ds_backend *be, const ds_config *cfg,
                                     const ds_model_weights *host, ds_model_weights *out,
                                     ds_error *err) {
    (void)be;
    (void)cfg;
    (void)err;
    *out = *host; /* shallow: layers/mtp/owner stay the host's */
    return DS_OK;
}

static void cpu_release_weights(ds_backend *be, ds_model_weights *w) {
    (void)be;
    memset(w, 0, sizeof *w); /* the host owns everything the views point at */
}

/* ---- batch ---------------------------------------------------------------------------------- */

static void cpu_set_batch(ds_backend *be, const ds_batch *b) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(b->n_tokens >= 0 && b->n_seqs >= 0);
    cpu->batch = *b;
    cpu->has_batch = true;
    if (b->pos_shift || b->out_shift) ds_cpu_shift_batch(cpu);
}

/* ---- lifetime ------------------------------------------------------------------------------- */

static void cpu_destroy(ds_backend *be) {
    if (!be) return;
    ds_cpu *cpu = be->impl;
    if (cpu) {
        ds_threadpool_destroy(cpu->pool);
        if (cpu->scratch)
            for (int i = 0; i < cpu->n_threads * DS_CPU_SCRATCH_LEVELS; i++)
                ds_cpu_aligned_free(cpu->scratch[i].p);
        free(cpu->scratch);
        for (int i = 0; i < DS_CPU_WORK_COUNT; i++) ds_cpu_aligned_free(cpu->work[i].p);
        free(cpu->inv_freq);
        free(cpu->bans);
        free(cpu->shifted);
        free(cpu);
    }
    free(be);
}

static const ds_backend_ops cpu_ops = {
    .name = "cpu",
    .act_dtype = DS_DTYPE_F32,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .prepare_weights = cpu_prepare_weights,
    .release_weights = cpu_release_weights,
    .cache_create = ds_cpu_cache_create,
    .cache_free = ds_cpu_cache_free,
    .cache_reset_slot = ds_cpu_cache_reset_slot,
    .set_batch = cpu_set_batch,
    .embed = ds_cpu_op_embed,
    .rmsnorm = ds_cpu_op_rmsnorm,
    .add_rmsnorm = ds_cpu_op_add_rmsnorm,
    .linear = ds_cpu_op_linear,
    .silu_mul = ds_cpu_op_silu_mul,
    .gather_rows = ds_cpu_op_gather_rows,
    .attention = ds_cpu_op_attention,
    .gdn = ds_cpu_op_gdn,
    .moe = ds_cpu_op_moe,
    .logits = ds_cpu_op_logits,
    .argmax = ds_cpu_op_argmax,
    .copy_bandwidth_gbps = ds_cpu_copy_bandwidth_gbps,
    .device_name = ds_cpu_device_name,
    .concat = ds_cpu_op_concat,
    .argmax_logits = ds_cpu_op_argmax_logits,
    .set_argmax_bans = ds_cpu_set_argmax_bans,
    .copy_tokens = ds_cpu_op_copy_tokens,
    .spec_accept = ds_cpu_op_spec_accept,
    .set_spec_sampling = ds_cpu_set_spec_sampling,
    .spec_sample = ds_cpu_op_spec_sample,
};

ds_status ds_backend_cpu_create(int n_threads, ds_backend **out, ds_error *err) {
    *out = NULL;
    if (n_threads < 0 || n_threads > 4096)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cpu backend: bad thread count %d", n_threads);
    ds_backend *be = calloc(1, sizeof *be);
    ds_cpu *cpu = calloc(1, sizeof *cpu);
    if (!be || !cpu) {
        free(be);
        free(cpu);
        return ds_error_set(err, DS_ERR_NOMEM, "cpu backend: out of memory");
    }
    be->ops = &cpu_ops;
    be->impl = cpu;
    cpu->pool = ds_threadpool_create(n_threads);
    if (!cpu->pool) {
        cpu_destroy(be);
        return ds_error_set(err, DS_ERR_INTERNAL, "cpu backend: cannot start %d threads",
                            n_threads);
    }
    cpu->n_threads = ds_threadpool_size(cpu->pool);
    cpu->scratch = calloc((size_t)cpu->n_threads * DS_CPU_SCRATCH_LEVELS, sizeof *cpu->scratch);
    if (!cpu->scratch) {
        cpu_destroy(be);
        return ds_error_set(err, DS_ERR_NOMEM, "cpu backend: out of memory");
    }
    *out = be;
    return DS_OK;
}

void ds_cpu_set_gdn_mode(ds_backend *be, ds_cpu_gdn_mode mode) {
    DS_ASSERT(be->ops == &cpu_ops);
    ds_cpu_of(be)->gdn_mode = mode;
}

int ds_cpu_n_threads(const ds_backend *be) {
    DS_ASSERT(be->ops == &cpu_ops);
    return ((const ds_cpu *)be->impl)->n_threads;
}
