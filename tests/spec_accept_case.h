/* spec_accept_case.h — one scenario of backend.h spec_accept and the pos_shift / out_shift
 * lowering it feeds, runnable on any backend: test_spec_ops.c checks the CPU reference against
 * the expected values written here, test_cuda_ops.c the CUDA backend against both.
 *
 * Five sequences verify 0, 1, 2, 3 and 3 drafts whose ids sit in the token buffer (the rows'
 * tokens entries hold other ids, so a kernel that ignored token_src would compare the wrong
 * drafts), the target ids come from argmax_logits over one-hot rows with an identity lm_head
 * (so the test chooses them), and the drafts match as: (none), all, the first only, none, all:
 * m = 1, 2, 2, 1, 4. The target ids stay on the device (argmax_logits without host ids); the
 * host reads them and the counts with copy_tokens. Then
 *  - each row's next token (token-buffer entry next_at + row) is read back through token_src and
 *    an identity embedding;
 *  - a batch laid out like the verification with pos_shift / out_shift = its sequence's own
 *    shift entry has its out rows (the last row of each sequence) gathered from one-hot rows:
 *    row r lands where out_rows[s] − (rows − m) points; its positions and n_past, read back by
 *    the caller's read_meta, are lowered by the same amounts;
 *  - spec_accept again over the same verification, now as if it had been lowered by the first
 *    call's own shifts (pos_shift = them), into another part of the table: its cumulative
 *    entries are 2·(rows − m); a batch lowered by those with slot_ring = SA_RING (seq_slot and
 *    state_out_slots on each sequence's ring) has its positions lowered and its slots rotated
 *    back by 2·(rows − m), which wraps the ring for the last sequence. */
#ifndef DS_TEST_SPEC_ACCEPT_CASE_H
#define DS_TEST_SPEC_ACCEPT_CASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "core/tensor.h"
#include "testlib.h"

enum { SA_V = 64, SA_S = 5, SA_DRAFTS = 9, SA_T = SA_S + SA_DRAFTS };
enum { SA_IDS_AT = 16, SA_NEXT_AT = 32, SA_M_AT = 48 };
enum { SA_SHIFT_AT = 8, SA_SHIFT_AT2 = 40, SA_RING = 5 };

static const int sa_n_draft[SA_S] = {0, 1, 2, 3, 3};
static const int sa_want_m[SA_S] = {1, 2, 2, 1, 4};

typedef struct sa_result {
    int32_t n_emitted[SA_S];
    int32_t next[SA_T];       /* each row's next token, read back through the embedding */
    int32_t gathered[SA_S];   /* the row each lowered out row picked */
    int32_t positions[SA_T];  /* the lowered batch's positions (read_meta) */
    int32_t n_past[SA_S];
    int32_t ids[SA_T];        /* the target ids, kept on the device only, read by copy_tokens */
    int32_t m2[SA_S];         /* the second spec_accept's counts */
    int32_t ring_positions[SA_T], ring_n_past[SA_S]; /* the ring batch, lowered */
    int32_t ring_slot[SA_S], ring_state_out[SA_T];
} sa_result;

/* Reads the current batch's positions [T], n_past [S], seq_slot [S] and state-out slots [T]
 * as the backend's ops see them (slots, state_out NULL: not read). */
typedef void (*sa_read_meta)(ds_backend *be, int T, int S, int32_t *positions, int32_t *n_past,
                             int32_t *slots, int32_t *state_out);

/* sa_read_meta of the CPU backend: the lowered batch as its ops read it (cpu_spec.c points the
 * batch at its copies). */
static void sa_cpu_read_meta(ds_backend *be, int T, int S, int32_t *positions, int32_t *n_past,
                             int32_t *slots, int32_t *state_out) {
    const ds_batch *b = &ds_cpu_of(be)->batch;
    memcpy(positions, b->positions, (size_t)T * sizeof(int32_t));
    memcpy(n_past, b->seq_n_past, (size_t)S * sizeof(int32_t));
    if (slots) memcpy(slots, b->seq_slot, (size_t)S * sizeof(int32_t));
    if (state_out) memcpy(state_out, b->state_out_slots, (size_t)T * sizeof(int32_t));
}

/* The ring batch's slots before lowering: sequence s on ring s, at place s % SA_RING; its row
 * j's state-out slot j + 1 places on (rows of sequences with no drafts: −1). */
static int32_t sa_ring_slot(int s) { return s * SA_RING + s % SA_RING; }
static int32_t sa_ring_out(int s, int j, int n_rows) {
    if (n_rows == 1) return -1;
    return ds_slot_ring_back(sa_ring_slot(s), SA_RING, -(j + 1));
}

/* Index of the largest of each row of an act-dtype [R, SA_V] buffer (rows are one-hot). */
static void sa_row_argmax(ds_backend *be, const void *d, int R, int32_t *out) {
    const size_t n = (size_t)R * SA_V;
    float *v = malloc(n * sizeof(float));
    test_backend_to_host(be, d, be->ops->act_dtype, n, v);
    for (int r = 0; r < R; r++) {
        int best = 0;
        for (int j = 1; j < SA_V; j++)
            if (v[(size_t)r * SA_V + j] > v[(size_t)r * SA_V + best]) best = j;
        out[r] = best;
    }
    free(v);
}

/* [R, SA_V] one-hot rows: row r has a 1 at ids[r]. */
static void *sa_one_hot(ds_backend *be, const int32_t *ids, int R) {
    float *v = calloc((size_t)R * SA_V, sizeof(float));
    for (int r = 0; r < R; r++) v[(size_t)r * SA_V + ids[r]] = 1.0f;
    void *d = test_backend_from_host(be, v, (size_t)R * SA_V);
    free(v);
    return d;
}

static ds_tensor sa_view(ds_backend *be, void *d, int64_t rows, int64_t cols) {
    return (ds_tensor){.data = d, .dtype = be->ops->act_dtype, .ndim = 2, .ne = {rows, cols}};
}

/* The verification's layout: seq_start, and per row its drafts' token-buffer entry (−1 for a
 * sequence's first row), its draft id, its target id. */
typedef struct sa_layout {
    int32_t start[SA_S + 1];
    int32_t src[SA_T], draft[SA_T], target[SA_T];
} sa_layout;

static void sa_layout_make(sa_layout *L) {
    int t = 0, e = 0;
    for (int s = 0; s < SA_S; s++) {
        L->start[s] = t;
        const int r0 = t;
        L->src[t] = -1;
        L->draft[t] = -1;
        t++;
        for (int j = 0; j < sa_n_draft[s]; j++, t++, e++) {
            L->src[t] = e; /* drafts at token-buffer entries 0..SA_DRAFTS-1 */
            L->draft[t] = 3 + 5 * e % 50;
        }
        /* target of row r0 + j: the next row's draft while it is to match, else another id */
        for (int j = 0; j <= sa_n_draft[s]; j++) {
            const int r = r0 + j;
            const bool match = j < sa_want_m[s] - 1;
            L->target[r] = match ? L->draft[r + 1] : 60 - (r % 7);
        }
    }
    L->start[SA_S] = t;
}

static void sa_run(ds_backend *be, sa_read_meta read_meta, sa_result *res) {
    const ds_backend_ops *op = be->ops;
    sa_layout L;
    sa_layout_make(&L);
    memset(res, 0, sizeof *res);
    /* identity lm_head and embedding table */
    float *eye = calloc((size_t)SA_V * SA_V, sizeof(float));
    for (int i = 0; i < SA_V; i++) eye[(size_t)i * SA_V + i] = 1.0f;
    void *d_eye = test_backend_from_host(be, eye, (size_t)SA_V * SA_V);
    free(eye);
    ds_linear head = {.n_parts = 1, .n_out = SA_V, .n_in = SA_V};
    head.parts[0] = sa_view(be, d_eye, SA_V, SA_V);
    const ds_tensor table = head.parts[0];

    /* the drafts into the token buffer, entries 0.. */
    int32_t drafts[SA_DRAFTS], got[SA_T];
    for (int t = 0, e = 0; t < SA_T; t++)
        if (L.src[t] >= 0) drafts[e++] = L.draft[t];
    void *d_dr = sa_one_hot(be, drafts, SA_DRAFTS);
    ds_tensor x_dr = sa_view(be, d_dr, SA_DRAFTS, SA_V);
    op->argmax_logits(be, &x_dr, &head, got, 0);

    /* the verification batch; its tokens entries of draft rows are decoys */
    int32_t tokens[SA_T], pos[SA_T], past[SA_S], slot[SA_S], bt[SA_S], rows_out[SA_S];
    for (int t = 0; t < SA_T; t++) tokens[t] = L.src[t] >= 0 ? (L.draft[t] + 1) % SA_V : 7 + t;
    for (int s = 0; s < SA_S; s++) {
        past[s] = 10 * (s + 1);
        slot[s] = s;
        bt[s] = 0;
        for (int t = L.start[s]; t < L.start[s + 1]; t++) pos[t] = past[s] + (t - L.start[s]);
        rows_out[s] = L.start[s + 1] - 1;
    }
    ds_batch vb = {.n_tokens = SA_T, .n_seqs = SA_S, .tokens = tokens, .positions = pos,
                   .seq_start = L.start, .seq_slot = slot, .seq_n_past = past,
                   .block_table = bt, .max_blocks = 1, .n_out = 0, .out_rows = rows_out,
                   .token_src = L.src};
    op->set_batch(be, &vb);
    void *d_tg = sa_one_hot(be, L.target, SA_T);
    ds_tensor x_tg = sa_view(be, d_tg, SA_T, SA_V);
    op->argmax_logits(be, &x_tg, &head, NULL, SA_IDS_AT); /* kept on the device only */
    op->spec_accept(be, SA_IDS_AT, SA_NEXT_AT, SA_M_AT, SA_SHIFT_AT);
    /* the host's one copy: the target ids and the counts */
    op->copy_tokens(be, SA_IDS_AT, SA_T, res->ids);
    op->copy_tokens(be, SA_M_AT, SA_S, res->n_emitted);
    ds_error err = {0};
    (void)op->synchronize(be, &err);

    /* next tokens through token_src and the identity embedding */
    int32_t nsrc[SA_T];
    for (int t = 0; t < SA_T; t++) nsrc[t] = SA_NEXT_AT + t;
    ds_batch nb = vb;
    nb.token_src = nsrc;
    op->set_batch(be, &nb);
    void *d_emb = be->ops->alloc(be, (size_t)SA_T * SA_V * ds_dtype_size(op->act_dtype) + 16);
    ds_tensor emb = sa_view(be, d_emb, SA_T, SA_V);
    op->embed(be, &table, &emb);
    (void)op->synchronize(be, &err);
    sa_row_argmax(be, d_emb, SA_T, res->next);

    /* the verification's layout lowered: out rows (each sequence's last row) and positions */
    int32_t pshift[SA_S], oshift[SA_S], rowid[SA_T];
    for (int s = 0; s < SA_S; s++) pshift[s] = oshift[s] = SA_SHIFT_AT + 2 * s;
    for (int t = 0; t < SA_T; t++) rowid[t] = t;
    ds_batch sb = vb;
    sb.token_src = NULL;
    sb.n_out = SA_S;
    sb.pos_shift = pshift;
    sb.out_shift = oshift;
    op->set_batch(be, &sb);
    void *d_rows = sa_one_hot(be, rowid, SA_T);
    void *d_g = be->ops->alloc(be, (size_t)SA_S * SA_V * ds_dtype_size(op->act_dtype) + 16);
    ds_tensor xr = sa_view(be, d_rows, SA_T, SA_V), gr = sa_view(be, d_g, SA_S, SA_V);
    op->gather_rows(be, &xr, &gr);
    (void)op->synchronize(be, &err);
    sa_row_argmax(be, d_g, SA_S, res->gathered);
    read_meta(be, SA_T, SA_S, res->positions, res->n_past, NULL, NULL);

    /* the verification again, as if lowered by the first call's own shifts: cumulative 2·r */
    ds_batch vb2 = vb;
    vb2.pos_shift = pshift;
    op->set_batch(be, &vb2);
    op->spec_accept(be, SA_IDS_AT, SA_NEXT_AT, SA_M_AT, SA_SHIFT_AT2);
    op->copy_tokens(be, SA_M_AT, SA_S, res->m2);
    (void)op->synchronize(be, &err);
    int32_t cshift[SA_S], rslot[SA_S], rout[SA_T];
    for (int s = 0; s < SA_S; s++) {
        cshift[s] = SA_SHIFT_AT2 + 2 * s + 1;
        rslot[s] = sa_ring_slot(s);
        const int n_rows = L.start[s + 1] - L.start[s];
        for (int t = L.start[s]; t < L.start[s + 1]; t++)
            rout[t] = sa_ring_out(s, t - L.start[s], n_rows);
    }
    ds_batch rb = vb;
    rb.token_src = NULL;
    rb.seq_slot = rslot;
    rb.state_out_slots = rout;
    rb.pos_shift = cshift;
    rb.slot_ring = SA_RING;
    op->set_batch(be, &rb);
    (void)op->synchronize(be, &err);
    read_meta(be, SA_T, SA_S, res->ring_positions, res->ring_n_past, res->ring_slot,
              res->ring_state_out);
    void *bufs[] = {d_eye, d_dr, d_tg, d_emb, d_rows, d_g};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) op->free(be, bufs[i]);
}

/* Number of entries of res that differ from what spec_accept must give (0: all as specified). */
static int sa_mismatches(const sa_result *res) {
    sa_layout L;
    sa_layout_make(&L);
    int bad = 0;
    for (int s = 0; s < SA_S; s++) {
        const int m = sa_want_m[s], rows = L.start[s + 1] - L.start[s], last = L.start[s] + m - 1;
        const int d2 = 2 * (rows - m); /* the ring batch's shift */
        bad += res->n_emitted[s] != m;
        bad += res->m2[s] != m;
        bad += res->gathered[s] != last;
        bad += res->n_past[s] != 10 * (s + 1) - (rows - m);
        bad += res->ring_n_past[s] != 10 * (s + 1) - d2;
        bad += res->ring_slot[s] != ds_slot_ring_back(sa_ring_slot(s), SA_RING, d2);
        for (int t = L.start[s]; t < L.start[s + 1]; t++) {
            const int j = t - L.start[s];
            bad += res->ids[t] != L.target[t];
            bad += res->next[t] != L.target[t < last ? t : last];
            bad += res->positions[t] != 10 * (s + 1) + j - (rows - m);
            bad += res->ring_positions[t] != 10 * (s + 1) + j - d2;
            const int32_t so = sa_ring_out(s, j, rows);
            bad += res->ring_state_out[t] != (so < 0 ? -1 : ds_slot_ring_back(so, SA_RING, d2));
        }
    }
    return bad;
}

#endif
