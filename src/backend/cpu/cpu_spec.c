/* cpu_spec.c — speculative acceptance on the "device" (backend.h spec_accept) and the lowering
 * of the batches queued behind it by its shifts (ds_batch.pos_shift / out_shift / slot_ring). The CPU runs every op
 * when called, so these are plain loops over the current batch; they are the reference the
 * CUDA kernels (cuda_spec.cu) are tested against. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

void ds_cpu_op_spec_accept(ds_backend *be, int ids_at, int next_at, int m_at, int shift_at) {
    ds_cpu *cpu = ds_cpu_of(be);
    const ds_batch *b = ds_cpu_batch(cpu);
    const int S = b->n_seqs, T = b->n_tokens;
    DS_ASSERT(shift_at >= 0 && shift_at + 2 * S <= DS_SHIFT_TABLE && ids_at >= 0 &&
              ids_at + T <= DS_TOKEN_BUF && next_at >= 0 && next_at + T <= DS_TOKEN_BUF &&
              m_at >= 0 && m_at + S <= DS_TOKEN_BUF);
    for (int s = 0; s < S; s++) {
        const int r0 = b->seq_start[s], r1 = b->seq_start[s + 1];
        DS_ASSERT(r1 > r0);
        const int32_t *ids = cpu->tokbuf + ids_at;
        int m = 1; /* row r0 + m − 1 decides the first token not taken from the drafts */
        while (r0 + m < r1 && ids[r0 + m - 1] == ds_cpu_row_token(b->tokens, b->token_src, cpu->tokbuf, r0 + m)) m++;
        for (int t = r0; t < r1; t++) {
            const int last = r0 + m - 1;
            cpu->tokbuf[next_at + t] = ids[t < last ? t : last];
        }
        /* the shift this verification was lowered by (read before any entry is written:
         * backend.h says they are not among them) */
        const int e = b->pos_shift ? b->pos_shift[s] : -1;
        DS_ASSERT(e < DS_SHIFT_TABLE && (e < shift_at || e >= shift_at + 2 * S));
        const int32_t before = e >= 0 ? cpu->shift[e] : 0;
        cpu->shift[shift_at + 2 * s] = (r1 - r0) - m;
        cpu->shift[shift_at + 2 * s + 1] = before + (r1 - r0) - m;
        cpu->tokbuf[m_at + s] = m;
    }
}

void ds_cpu_shift_batch(ds_cpu *cpu) {
    ds_batch *b = &cpu->batch;
    const int T = b->n_tokens, S = b->n_seqs, no = b->n_out;
    const int R = b->slot_ring;
    DS_ASSERT(R == 0 || (R >= 2 && b->pos_shift));
    const size_t need = (size_t)T + (size_t)S + (size_t)no +
                        (R ? (size_t)S + (b->state_out_slots ? (size_t)T : 0) : 0);
    if (need > cpu->shifted_cap) {
        free(cpu->shifted);
        cpu->shifted = malloc(need * sizeof(int32_t));
        DS_ASSERT(cpu->shifted); /* bounded by the batch, as the scratch buffers (abort on OOM) */
        cpu->shifted_cap = need;
    }
    int32_t *pos = cpu->shifted, *past = pos + T, *rows = past + S, *slot = rows + no;
    int32_t *so = slot + S;
    for (int s = 0; s < S; s++) {
        const int e = b->pos_shift ? b->pos_shift[s] : -1;
        DS_ASSERT(e < DS_SHIFT_TABLE);
        const int32_t d = e >= 0 ? cpu->shift[e] : 0;
        past[s] = b->seq_n_past[s] - d;
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) pos[t] = b->positions[t] - d;
        if (!R) continue;
        slot[s] = ds_slot_ring_back(b->seq_slot[s], R, d);
        if (b->state_out_slots)
            for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++)
                so[t] = b->state_out_slots[t] < 0 ? -1
                                                  : ds_slot_ring_back(b->state_out_slots[t], R, d);
    }
    for (int r = 0; r < no; r++) {
        const int e = b->out_shift ? b->out_shift[r] : -1;
        DS_ASSERT(e < DS_SHIFT_TABLE);
        rows[r] = b->out_rows[r] - (e >= 0 ? cpu->shift[e] : 0);
    }
    b->positions = pos;
    b->seq_n_past = past;
    b->out_rows = rows;
    if (R) {
        b->seq_slot = slot;
        if (b->state_out_slots) b->state_out_slots = so;
    }
}
