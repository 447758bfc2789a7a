/* cuda_spec.cu — speculative acceptance on the device (backend.h spec_accept) and the lowering
 * of the draft passes' positions by it (ds_batch.pos_shift / out_shift). Both are one small
 * block: a verification has at most DS_CUDA_MAX_SEQS sequences of ≤ DS_SPEC_MAX_K + 1 rows. The
 * CPU reference is cpu_spec.c. */
#include "cuda_launch.cuh"

#define SPEC_THREADS 256

/* One thread per sequence s of the verification: m = 1 + the leading drafts equal to the
 * target id of the row before them; each row's next token; the shift; m itself. */
__global__ void __launch_bounds__(SPEC_THREADS)
    spec_accept_kernel(int S, const int32_t *__restrict__ seq_start,
                       const int32_t *__restrict__ tokens, const int32_t *__restrict__ token_src,
                       int32_t *__restrict__ tokbuf, int ids_at, int next_at, int m_at,
                       int32_t *__restrict__ shift) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int r0 = seq_start[s], r1 = seq_start[s + 1];
        const int32_t *ids = tokbuf + ids_at;
        int m = 1;
        while (r0 + m < r1 && ids[r0 + m - 1] == batch_row_token(tokens, token_src, tokbuf, r0 + m)) m++;
        const int last = r0 + m - 1;
        for (int t = r0; t < r1; t++) tokbuf[next_at + t] = ids[t < last ? t : last];
        shift[s] = (r1 - r0) - m;
        tokbuf[m_at + s] = m;
    }
}

extern "C" void ds_cuda_spec_accept(ds_cuda_ctx *ctx, int ids_at, int next_at, int m_at) {
    const ds_cuda_batch *b = &ctx->batch;
    if (b->n_seqs <= 0) return;
    ds_launch(ctx, spec_accept_kernel, 1, SPEC_THREADS, 0, b->n_seqs, b->seq_start, b->tokens,
              b->token_src, ctx->d_tokbuf, ids_at, next_at, m_at, ctx->d_shift);
    DS_CU_LAUNCHED2(ctx, "spec_accept_kernel", b->n_seqs, b->n_tokens);
}

/* Lowers the current batch's positions and n_past by their sequence's shift entry, and its
 * out rows by theirs (entries −1: unchanged), in the metadata buffer itself. */
__global__ void __launch_bounds__(SPEC_THREADS)
    batch_shift_kernel(int T, int S, int n_out, const int32_t *__restrict__ tok_seq,
                       const int32_t *__restrict__ pos_shift,
                       const int32_t *__restrict__ out_shift, const int32_t *__restrict__ shift,
                       int32_t *__restrict__ positions, int32_t *__restrict__ n_past,
                       int32_t *__restrict__ out_rows) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        const int e = pos_shift[tok_seq[t]];
        if (e >= 0) positions[t] -= shift[e];
    }
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int e = pos_shift[s];
        if (e >= 0) n_past[s] -= shift[e];
    }
    for (int r = threadIdx.x; r < n_out; r += blockDim.x) {
        const int e = out_shift[r];
        if (e >= 0) out_rows[r] -= shift[e];
    }
}

extern "C" void ds_cuda_batch_shift(ds_cuda_ctx *ctx) {
    const ds_cuda_batch *b = &ctx->batch;
    ds_launch(ctx, batch_shift_kernel, 1, SPEC_THREADS, 0, b->n_tokens, b->n_seqs, b->n_out,
              b->tok_seq, b->pos_shift, b->out_shift, (const int32_t *)ctx->d_shift,
              (int32_t *)b->positions, (int32_t *)b->n_past, (int32_t *)b->out_rows);
    DS_CU_LAUNCHED2(ctx, "batch_shift_kernel", b->n_tokens, b->n_seqs);
}
