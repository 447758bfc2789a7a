/* cuda_spec.cu — speculative acceptance on the device (backend.h spec_accept) and the lowering
 * of the batches queued behind it by its shifts (ds_batch.pos_shift / out_shift / slot_ring). Both are one small
 * block: a verification has at most DS_CUDA_MAX_SEQS sequences of ≤ DS_SPEC_MAX_K + 1 rows. The
 * CPU reference is cpu_spec.c. */
#include "cuda_launch.cuh"

#define SPEC_THREADS 256

/* One thread per sequence s of the verification: m = 1 + the leading drafts equal to the
 * target id of the row before them; each row's next token; the shifts (own, and with the one
 * the verification was lowered by); m itself. The entries read are not among those written
 * (backend.h), so no thread reads what another writes. */
__global__ void __launch_bounds__(SPEC_THREADS)
    spec_accept_kernel(int S, const int32_t *__restrict__ seq_start,
                       const int32_t *__restrict__ tokens, const int32_t *__restrict__ token_src,
                       const int32_t *__restrict__ pos_shift, int32_t *__restrict__ tokbuf,
                       int ids_at, int next_at, int m_at, int shift_at, int32_t *shift) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int r0 = seq_start[s], r1 = seq_start[s + 1];
        const int32_t *ids = tokbuf + ids_at;
        int m = 1;
        while (r0 + m < r1 && ids[r0 + m - 1] == batch_row_token(tokens, token_src, tokbuf, r0 + m)) m++;
        const int last = r0 + m - 1;
        for (int t = r0; t < r1; t++) tokbuf[next_at + t] = ids[t < last ? t : last];
        const int e = pos_shift ? pos_shift[s] : -1;
        const int32_t before = e >= 0 ? shift[e] : 0;
        shift[shift_at + 2 * s] = (r1 - r0) - m;
        shift[shift_at + 2 * s + 1] = before + (r1 - r0) - m;
        tokbuf[m_at + s] = m;
    }
}

extern "C" void ds_cuda_spec_accept(ds_cuda_ctx *ctx, int ids_at, int next_at, int m_at,
                                    int shift_at) {
    const ds_cuda_batch *b = &ctx->batch;
    if (b->n_seqs <= 0) return;
    ds_launch(ctx, spec_accept_kernel, 1, SPEC_THREADS, 0, b->n_seqs, b->seq_start, b->tokens,
              b->token_src, b->pos_shift, ctx->d_tokbuf, ids_at, next_at, m_at, shift_at,
              ctx->d_shift);
    DS_CU_LAUNCHED2(ctx, "spec_accept_kernel", b->n_seqs, b->n_tokens);
}

/* backend.h ds_slot_ring_back on the device. */
__device__ __forceinline__ int32_t slot_ring_back(int32_t slot, int R, int32_t d) {
    const int32_t base = slot - slot % R;
    return base + (((slot - base - d) % R) + R) % R;
}

/* Lowers the current batch's positions and n_past by their sequence's shift entry, and its
 * out rows by theirs (entries −1: unchanged), in the metadata buffer itself; with slot_ring
 * R > 0 also rotates each sequence's slot and its tokens' state-out slots back by its shift. */
__global__ void __launch_bounds__(SPEC_THREADS)
    batch_shift_kernel(int T, int S, int n_out, int R, const int32_t *__restrict__ tok_seq,
                       const int32_t *__restrict__ pos_shift,
                       const int32_t *__restrict__ out_shift, const int32_t *__restrict__ shift,
                       int32_t *__restrict__ positions, int32_t *__restrict__ n_past,
                       int32_t *__restrict__ out_rows, int32_t *__restrict__ seq_slot,
                       int32_t *__restrict__ state_out) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        const int e = pos_shift[tok_seq[t]];
        if (e < 0) continue;
        positions[t] -= shift[e];
        if (R && state_out && state_out[t] >= 0)
            state_out[t] = slot_ring_back(state_out[t], R, shift[e]);
    }
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const int e = pos_shift[s];
        if (e < 0) continue;
        n_past[s] -= shift[e];
        if (R) seq_slot[s] = slot_ring_back(seq_slot[s], R, shift[e]);
    }
    for (int r = threadIdx.x; r < n_out; r += blockDim.x) {
        const int e = out_shift[r];
        if (e >= 0) out_rows[r] -= shift[e];
    }
}

extern "C" void ds_cuda_batch_shift(ds_cuda_ctx *ctx) {
    const ds_cuda_batch *b = &ctx->batch;
    ds_launch(ctx, batch_shift_kernel, 1, SPEC_THREADS, 0, b->n_tokens, b->n_seqs, b->n_out,
              b->slot_ring, b->tok_seq, b->pos_shift, b->out_shift,
              (const int32_t *)ctx->d_shift, (int32_t *)b->positions, (int32_t *)b->n_past,
              (int32_t *)b->out_rows, (int32_t *)b->seq_slot, (int32_t *)b->state_out);
    DS_CU_LAUNCHED2(ctx, "batch_shift_kernel", b->n_tokens, b->n_seqs);
}
