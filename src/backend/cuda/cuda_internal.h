/* cuda_internal.h — private to the CUDA backend: the backend context, error checking and the
 * kernel launchers.
 *
 * This header is shared by the C host code (cuda_*.c, compiled by the C compiler with the
 * project's warnings) and the kernels (cuda_*.cu, compiled by nvcc as C++). It therefore uses
 * only plain C types and the CUDA runtime / cuBLASLt C headers; of the project's headers it
 * includes only backend/spec_sampling.h, plain C types too (core/status.h uses C11 `_Noreturn`,
 * which C++ rejects). The .c files translate the
 * ds_* views into the raw pointers and sizes the launchers take.
 *
 * Every launcher is asynchronous on ctx->stream, never synchronises, never allocates and never
 * reads device memory on the host, so a whole step can be captured into a CUDA graph. */
#ifndef DS_CUDA_INTERNAL_H
#define DS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/spec_sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Capacities fixed at backend creation (documented in docs/cuda_notes.md). A batch larger than
 * these is an internal error (the runner chunks prefill to DS_CUDA_MAX_TOKENS tokens). */
#define DS_CUDA_MAX_TOKENS 2048      /* tokens per step (T) */
#define DS_CUDA_MAX_SEQS 256         /* sequences per step (S) */
#define DS_CUDA_META_INTS (1 << 21)  /* int32 batch metadata per step, block table included */
#define DS_CUDA_META_BUFS 4          /* pinned staging buffers of it, used in turn */
#define DS_CUDA_COPY_BUFS 4          /* pinned buffers of copy_tokens, used in turn */
#define DS_CUDA_GEMV_MAX_ROWS 8      /* linear rows served by the GEMV; more go to cuBLASLt */
#define DS_CUDA_SPLITK_WS_FLOATS (1 << 20) /* fp32 split-K partials of the GEMV */
#define DS_CUDA_SPLITK_COUNTERS 4096 /* per-launch tile counters (self-resetting) */
#define DS_CUDA_LT_WS_BYTES (32u << 20) /* cuBLASLt workspace */
#define DS_CUDA_LT_CACHE 48          /* cached cuBLASLt plans */
#define DS_CUDA_ATTN_SPLIT_ROWS 1024 /* S·nsplit bound of the decode-attention workspace */
#define DS_CUDA_ATTN_MAX_SPLIT 128 /* the most splits any step takes (shared-memory arrays) */
#define DS_CUDA_ATTN_MAX_SPLIT_BATCH 64 /* … in steps of two or more tokens (one token: attn_max_split1) */
#define DS_CUDA_AMAX_BLOCKS 65536    /* lm_head row blocks of the fused argmax (V ≤ 1 Mi rows) */
#define DS_CUDA_BAN_INTS (1 << 16)   /* banned-id table of the fused argmax (rows · ids per row) */
#define DS_CUDA_MAX_GRAPHS 64        /* captured step graphs kept at once */
#define DS_CUDA_PROF_EVENTS 8192     /* kernels timed per profiled step (DS_CUDA_PROFILE) */
#define DS_CUDA_PROF_ENTRIES 512     /* distinct (kernel, shape) rows of the profile */
#define DS_CUDA_MAX_OUTS 64          /* host outputs (argmax_logits, copy_tokens) pending at
                                        once */

/* The batch as the kernels see it: device pointers into one metadata buffer. */
typedef struct ds_cuda_batch {
    int n_tokens;             /* T */
    int n_seqs;               /* S */
    int max_blocks;           /* row length of block_table */
    int n_out;
    const int32_t *tokens;    /* [T] */
    const int32_t *positions; /* [T] */
    const int32_t *seq_start; /* [S+1] */
    const int32_t *seq_slot;  /* [S] */
    const int32_t *n_past;    /* [S] */
    const int32_t *block_table; /* [S, max_blocks] */
    const int32_t *out_rows;  /* [n_out] */
    const int32_t *tok_seq;   /* [T] sequence index of each token (derived on the host) */
    const int32_t *state_out; /* [T] GDN snapshot slot per token or -1, or NULL (ds_batch) */
    const int32_t *token_src; /* [T] token-buffer entry per token or -1 (ds_batch; -1s if NULL) */
    /* ds_batch.pos_shift [S] / out_shift [n_out] (-1s where one is NULL), or both NULL when
     * the batch has neither: set_batch then launches no batch_shift_kernel */
    const int32_t *pos_shift;
    const int32_t *out_shift;
    int slot_ring;            /* ds_batch.slot_ring (0: seq_slot / state_out as given) */
} ds_cuda_batch;

/* Host outputs on their way: the stream copies device ids into pinned memory, synchronize
 * hands them to the caller's buffers (argmax_logits). */
typedef struct ds_cuda_host_out {
    int32_t *host;         /* the caller's buffer */
    const int32_t *pinned; /* where the stream's copy lands */
    int n;
} ds_cuda_host_out;
typedef struct ds_cuda_outs {
    int n;
    ds_cuda_host_out o[DS_CUDA_MAX_OUTS];
} ds_cuda_outs;

/* Host-side facts about the current batch, derived in set_batch from the host arrays (launch
 * configuration only; kernels never depend on them for correctness beyond grid sizes). */
typedef struct ds_cuda_batch_info {
    int max_seq_tokens; /* max over sequences of tokens in this step */
    int max_ctx;        /* max over sequences of n_past + tokens */
} ds_cuda_batch_info;

/* One cached cuBLASLt plan (descriptors + the heuristic's algorithm) for a GEMM shape. */
typedef struct ds_cuda_lt_plan {
    int used;
    int64_t m, n, k, lda, ldb, ldc;
    int ctype; /* cudaDataType of C/D */
    uint32_t align[3]; /* byte alignment of A, B, C/D the plan was chosen for */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} ds_cuda_lt_plan;

/* A captured decode step (cuda_graph.c): replayable while the batch has the same shape. */
typedef struct ds_cuda_graph {
    int used;
    uint64_t key;
    int T, S, n_out, max_blocks, max_seq_tokens, has_state_out; /* batch shape at capture */
    int has_shift;         /* recorded with batch_shift_kernel (ds_batch pos_shift / out_shift) */
    int slot_ring;         /* recorded with this ds_batch.slot_ring (the shift kernel rotates slots) */
    cudaGraphExec_t exec;
    uint64_t n_kernels;    /* kernels recorded (added to the launch count per replay) */
    ds_cuda_outs outs;     /* host outputs of argmax_logits recorded in the graph */
} ds_cuda_graph;

/* Per-kernel timing of eager steps (env DS_CUDA_PROFILE=1): an event after every launch. */
typedef struct ds_cuda_prof_entry {
    const char *name;
    int64_t a, b;          /* shape tag (e.g. GEMV N, K) */
    int decode;            /* recorded in a decode step (every sequence one token) */
    uint64_t count;
    double ms;
} ds_cuda_prof_entry;

typedef struct ds_cuda_ctx {
    int device;
    char name[256];               /* device name */
    int sm_count;
    size_t smem_optin;            /* max dynamic shared memory per block */
    cudaStream_t stream;

    /* sticky error: the first failure, with file:line */
    int failed;
    char errmsg[480];

    uint64_t n_launches;          /* kernels launched since the last take_launch_count */
    double copy_gbps;             /* measured once by copy_bandwidth_gbps (0 = not yet) */

    /* graph capture (cuda_graph.c) */
    int capturing;                /* between graph_begin and graph_end */
    int cap_failed;               /* an op that cannot be captured ran during the capture */
    char cap_why[160];
    uint64_t cap_key, cap_launch0;
    cudaStream_t side;            /* uncaptured stream for set_batch's upload during a capture */
    ds_cuda_graph graphs[DS_CUDA_MAX_GRAPHS];
    ds_cuda_outs pending;         /* host ids argmax_logits delivers at the next synchronize */
    ds_cuda_outs cap_outs;        /* argmax_logits outputs recorded during the capture */

    /* profile (DS_CUDA_PROFILE=1): events of the current eager step */
    int prof_on;
    int prof_open, prof_n, prof_decode;
    cudaEvent_t prof_start;
    cudaEvent_t *prof_ev;         /* [DS_CUDA_PROF_EVENTS] */
    const char **prof_name;       /* [DS_CUDA_PROF_EVENTS] */
    int64_t *prof_a, *prof_b;     /* [DS_CUDA_PROF_EVENTS] */
    ds_cuda_prof_entry *prof_tab; /* [DS_CUDA_PROF_ENTRIES] */
    int prof_tab_n;
    uint64_t prof_steps[2];       /* windows profiled: [0] other steps, [1] decode steps */
    uint64_t prof_skipped[2];     /* the first window of each kind, not charged (prof_close) */
    int profiler_step, profiler_seen, profiler_running; /* DS_CUDA_PROFILER_STEP (ncu) */
    int profiler_prefill, profiler_pf_seen;              /* DS_CUDA_PROFILER_PREFILL (ncu) */

    /* batch metadata: pinned staging (double-buffered, guarded by events) → device buffer */
    int32_t *h_meta[DS_CUDA_META_BUFS]; /* pinned [DS_CUDA_META_INTS] each, used in turn */
    cudaEvent_t meta_done[DS_CUDA_META_BUFS]; /* recorded after the upload from h_meta[i] */
    int meta_flip;
    int32_t *d_meta;              /* device [DS_CUDA_META_INTS] */
    ds_cuda_batch batch;          /* device view of the current batch */
    ds_cuda_batch_info info;
    /* host copy of the current batch (for host-side invariant checks) */
    int32_t *h_cur;               /* points into the h_meta buffer just uploaded */
    int h_positions_off, h_seq_start_off, h_seq_slot_off, h_block_table_off, h_tok_seq_off;
    int h_state_out_off;          /* -1 when the batch has no state_out_slots */

    /* GEMV: output rows per warp (1, 2 or 4; env DS_CUDA_GEMV_ROWS at create, default 4) */
    int gemv_rows;
    /* MoE expert GEMVs of decode-sized steps (T ≤ DS_CUDA_GEMV_MAX_ROWS): the largest chunk of
     * one expert's assignments served per weight pass (1, 2, 4 or 8; env DS_CUDA_MOE_RMAX at
     * create, default 2). Larger chunks need more registers, and the kernel carrying them runs
     * at lower occupancy even when (as at batch ≤ 8, nearly always) experts get 1-2 tokens;
     * an expert with more assignments takes several passes over its weights (L2-hot). */
    int moe_rmax;
    /* the same bound for larger steps (prefill; env DS_CUDA_MOE_RMAX_PREFILL, default 4) */
    int moe_rmax_prefill;
    /* measurement knobs of the prefill kernels (env at create): warps along N of the grouped
     * expert GEMM's block (DS_CUDA_MOE_GEMM_WN, 2 or 4, default 2: cuda_moe_gemm.cu) and state
     * columns per warp of the GDN prefill recurrence (DS_CUDA_GDN_SCAN_COLS, 2 or 4, default
     * 2: cuda_gdn_prefill.cu) */
    int moe_gemm_wn, gdn_scan_cols;
    /* pipeline stages of the grouped expert GEMM (DS_CUDA_MOE_GEMM_STAGES, 2, 3 or 4; default
     * 2; 3 and 4 only at WN = 2, BK = 32; 3 also at BK = 64) */
    int moe_gemm_stages;
    /* the grouped expert GEMM's K per stage (DS_CUDA_MOE_GEMM_BK, 32, 64 or 128; default 64
     * since session 19) and weight rows per tile (DS_CUDA_MOE_GEMM_BN, 128, or 256 with 8
     * warps; default 256 since session 24; 64 lost, s20-run1): cuda_moe_gemm.cu */
    int moe_gemm_bk, moe_gemm_bn;
    /* column tiles per block of the grouped GEMM's down pass (DS_CUDA_MOE_GEMM_DOWN_TILES, 1,
     * 2 or 4; default 1): its tile lookup and row setup paid once per that many tiles */
    int moe_gemm_down_tiles;
    /* the grouped expert GEMM's warps skip their 16-row fragments past the tile's assignments
     * (1, default since session 24; DS_CUDA_MOE_GEMM_SKIP=0: all four): same bits */
    int moe_gemm_skip;
    /* the grouped expert GEMM fed by TMA into a producer / consumer ring (cuda_moe_gemm_tma.cu;
     * 1, default since session 25; DS_CUDA_MOE_GEMM_TMA=0: the tiled kernel) where it
     * applies: same bits */
    int moe_gemm_tma;
    /* the TMA kernel's two passes in one launch, a down item waiting for its M tile's gate_up
     * items (1, default since session 25; DS_CUDA_MOE_GEMM_FUSE=0: two launches): same bits */
    int moe_gemm_fuse;
    /* the fewest tokens a step's routed experts take the grouped GEMM at (DS_CUDA_MOE_GEMM_MIN_T,
     * 2 … DS_CUDA_GEMV_MAX_ROWS + 1, the default: decode-sized steps take the expert GEMVs) */
    int moe_gemm_min_t;
    /* the TMA kernel's weight boxes read with an L2 evict-first policy, so that the
     * activations and outputs (re-read) stay in L2 (DS_CUDA_MOE_GEMM_EVICT=1; 0, default) */
    int moe_gemm_evict;
    /* the TMA kernel can run here (a tensor-map encoder, its shared memory, sm_90 code for this
     * device): set by ds_cuda_moe_gemm_tma_init */
    int moe_gemm_tma_ok;
    long moe_gemm_tma_runs; /* MoE steps the TMA kernel served (tests check that it ran) */
    /* a cuBLASLt GEMM whose row count is not a multiple of 8 as two, the 8-aligned rows then
     * the rest (1, default: the prefill router GEMM, 1281 rows at 35B-A3B, prefill of 1024
     * tokens 51.87 vs 54.71 ms, s9-run8; DS_CUDA_LT_SPLIT=0: one GEMM; ds_cuda_gemm_lt) */
    int lt_split;
    /* the prefill router GEMM over the fused matrix's zero-padded row count (moe_ldl: 1288
     * rows at 35B-A3B) as one cuBLASLt GEMM instead of the 8-aligned rows plus a one-row GEMM
     * (7 µs a layer at 1024 tokens, H100 s21-run3). Default 1 (prefill of 1024 tokens 40.60
     * vs 40.90 / 40.96 ms, H200 s23-run1); DS_CUDA_ROUTER_PAD=0: the split, for before/after */
    int router_pad;
    /* the grouped expert GEMM's per-assignment outputs y [A, H] stored in bf16 instead of fp32
     * and read so by the combine (prefill-sized steps only: 64 MB less written and read a layer
     * at 1024 tokens of 35B-A3B). Default 1 (prefill of 1024 tokens 40.32 vs 40.90 / 40.96 ms;
     * MoE rel L2 vs the CPU 2.98e-3 vs 2.80e-3; H200 s23-run1); DS_CUDA_MOE_Y16=0: fp32 y. Not
     * the same bits: each expert's output is rounded once more */
    int moe_y16;
    /* the GDN prefill recurrence in chunks of 64 tokens (1, default; cuda_gdn_chunked.cu) or
     * token by token (DS_CUDA_GDN_CHUNKED=0: the session-4 scan, for before/after runs) */
    int gdn_chunked;
    /* the chunked GDN kernels' tensor-core products in one tf32 pass instead of 3xTF32
     * (cuda_gdn_chunked.cu). Default 1 (GDN prefill of 2048 tokens 0.501 vs 0.631 ms, rel L2 vs
     * the CPU 1.68e-3 vs 1.66e-3; prefill of 1024 tokens 38.93 vs 40.90 / 40.96 ms; H200
     * s23-run1); DS_CUDA_GDN_TF32=0: 3xTF32. Not the same bits */
    int gdn_tf32;
    /* the GDN prefill prep kernel loads its channel's inputs for all its tokens before the token
     * loop (1, default since session 26) or token by token (DS_CUDA_GDN_PREP_PRELOAD=0, for
     * before/after runs; cuda_gdn_prefill.cu). Same bits */
    int gdn_prep_preload;
    /* the chunked GDN prefill computes v (conv + SiLU of the value channels) in its chunk_prep
     * launch from the projection (1, default since session 26), or the prep launch computes it
     * into scratch for chunk_prep to read (DS_CUDA_GDN_V_IN_CHUNK=0, for before/after runs;
     * cuda_gdn_chunked.cu v_to_shared). Same bits */
    int gdn_v_in_chunk;
    /* with one-pass products (gdn_tf32): the chunked GDN's product operands q̂, S, δ, δ'
     * rounded to tf32 once where written, not at every load (W, P, k̂ still at each load), and
     * the fragments by ldmatrix
     * (1, default since session 27; DS_CUDA_GDN_TF32_STORED=0 for before/after runs;
     * cuda_gdn_chunked.cu). Same bits */
    int gdn_tf32_stored;
    /* measurement knobs of the decode expert GEMVs (env at create): output rows per warp of the
     * gate_up launch (DS_CUDA_MOE_GU_ROWS, 2 or 4, default 2) and of the down launch
     * (DS_CUDA_MOE_DOWN_ROWS, 4, 8 or 16; default 0: 4 at T = 1, else 16) */
    int moe_gu_rows, moe_down_rows;
    /* tensor-core GEMV: a warp's last partial batch of k steps loaded at once (1, default) or
     * one step at a time (DS_CUDA_TC_TAIL=0; the session-5 kernel, for before/after runs) */
    int tc_tail;
    /* tensor-core GEMVs for one-sequence steps too (DS_CUDA_TC_ONE_SEQ=1; default 0: CUDA cores,
     * cuda_gemv.cu ds_cuda_gemv) */
    int tc_one_seq;
    /* the routing kernels stage the shared expert's activations with all loads in flight (1,
     * default) or one element at a time (DS_CUDA_ROUTE_BATCHED=0, for before/after runs); since
     * session 26 also the prefill route kernel, and the prefill group kernel's copy of the ids */
    int route_batched;
    /* decode routing (E ≤ 256) with each lane's probabilities in registers (1, default;
     * DS_CUDA_ROUTE_REGS=0: rescanned from shared memory every argmax round, for before/after
     * runs; cuda_moe_route.cuh route_in_registers). Same ids and weights. */
    int route_regs;
    /* one-token steps group their k routed experts in the routed gate_up launch from each
     * selection's rank among the k (one warp, one barrier) instead of the block-wide counts
     * and scans (1, default; DS_CUDA_ROUTE_RANKS=0: the scans, for before/after runs;
     * cuda_moe_experts.cuh group_one_token). Same groups; duplicates (NaN logits) take the
     * scans. */
    int route_ranks;
    /* decode routing from registers takes each top-k round's argmax with two hardware warp
     * reductions (redux.sync) instead of a shuffle butterfly (1, default; DS_CUDA_ROUTE_REDUX=0:
     * the butterfly, for before/after runs; cuda_moe_route.cuh route_in_registers). Same ids and
     * weights. */
    int route_redux;
    /* decode attention scores with 8 lanes a key (4 keys a warp pass, 3 shuffle levels) instead
     * of up to 32 lanes a key (1 key a pass at head_dim 256, 5 levels) (1, default;
     * DS_CUDA_ATTN_LANES8=0: the wide form, for before/after runs; cuda_attention.cu) */
    int attn_lanes8;
    /* decode steps of two or more sequences of one token each: the attention's q/k norm, RoPE
     * and KV write done inside the decode kernel, no attn_prep launch (1, default;
     * DS_CUDA_ATTN_FUSE_PREP=0: the prep launch, for before/after runs; cuda_attention.cu).
     * Same bits. */
    int attn_fuse_prep;
    /* with attn_fuse_prep: also in steps of one sequence of one token (1, default;
     * DS_CUDA_ATTN_FUSE_PREP1=0: the prep launch there, for before/after runs). Same bits as
     * the prep launch. With attn_split_grain's 16 at batch 1: 2.823 / 2.827 vs 2.837 / 2.839
     * ms (either alone: 2.832 / 2.836 and 2.826 / 2.837; H100, s34-run2; the grain does not
     * change the bench's ranges, see attn_split_grain). */
    int attn_fuse_prep1;
    /* decode attention: a split's key count is rounded up to a multiple of this: 0 (default)
     * 16 in steps of one token, 32 — the kernels' tile — otherwise; DS_CUDA_ATTN_SPLIT_GRAIN=16
     * or 32 everywhere, for before/after runs. At batch 1 (64 splits) 16 changes the ranges
     * only up to 1024 keys (64 splits of 16 instead of 32 of 32); past that ⌈L / 64⌉ > 16
     * rounds to 32 either way, so the bench's batch-1 steps (1033-1544 keys) run the same
     * ranges with both values (cuda_notes session 35: s34-run2's "16 alone" line was noise).
     * At batch 4 / 8 even (s34-run2). Other key ranges, so other roundings (test_cuda_ops
     * compares with the CPU). */
    int attn_split_grain;
    /* decode attention's combine with a token's splits spread over 16 warps, all of a warp's
     * loads issued at once, unused splits not read (attn_combine_warps_kernel) instead of
     * every thread walking the splits four loads at a time (1, default; DS_CUDA_ATTN_COMBINE_WARPS=0:
     * the walk, for before/after runs; cuda_attention.cu). s35-run1 (H100), two rounds: batch 1
     * 2.821 / 2.822 vs 2.851 / 2.852 ms, batch 4 / 8 −0.1 to −0.2 %; after 8192 tokens 2.929 vs
     * 2.963 ms. Another order of summation (test_cuda_ops compares both with the CPU). */
    int attn_combine_warps;
    /* decode attention: the most splits in a step of one token (batch 1): 128 (default) or 64
     * (DS_CUDA_ATTN_MAX_SPLIT1=64, as steps of more tokens; for before/after runs). With the
     * warps' combine, s35-run1 (H100): after 8192 tokens 2.868 vs 2.929 ms; after 1024 even
     * (2.820 / 2.816 vs 2.821 / 2.822). With the 32-key grain the ranges are the same up to
     * 2048 keys (⌈L / 64⌉ ≤ 32); past that each block holds half the tiles (after 8192 keys 2
     * instead of 4: a tile is ~4.7 µs a layer at batch 1, cuda_notes session 34 item 3); with
     * the 16-key grain (batch 1's default) 1024-2048 keys take ~L/16 splits of 16. Other key
     * ranges, so test_cuda_ops compares both caps with the CPU (at 1500 keys: 94 splits of 16
     * against 47 of 32, and at short contexts). */
    int attn_max_split1;
    /* one-token steps (batch 1): every launch asks for the largest shared-memory carveout
     * (cudaLaunchAttributePreferredSharedMemoryCarveout; 1, default; DS_CUDA_CARVEOUT1=0: no
     * request, for before/after runs). The device-wide preference (DS_CUDA_PREFER_SHARED=1)
     * made batch 1 −1.4 % and batch 4 / 8 +13 % (s35-run1, H100): an SM changes its split only
     * when idle, so the decode attention's ~80 KB blocks wait for their GEMV neighbours to
     * drain; at batch 4 / 8 the kernels lean on L1. Per launch at batch 1 only (s35-run2, H100,
     * two rounds): 2.765 / 2.760 vs 2.795 / 2.798 ms, after 8192 tokens 2.790 vs 2.849;
     * batch 4 / 8 do not take it. Launch attribute only: the same bits. */
    int carveout1;
    /* decode attention's score and P·V products as bf16 m16n8k16 MMAs (attn_decode_tc_kernel;
     * G ≤ 8 query heads a kv head, head_dim ≥ 64) instead of FMAs from shared memory: 2
     * (default) in steps whose prep is fused (sequences of one token each; batch 1 too with
     * attn_fuse_prep1, since session 34), where it was faster; 1 in every decode-kernel step
     * (verification too; with the prep launch it was slower at batch 1 after 1024 tokens,
     * faster after 8192); 0 never (DS_CUDA_ATTN_DEC_TC; s31-run2; cuda_attention.cu). Not the
     * same bits (sum order; P as bf16 hi + lo). */
    int attn_dec_tc;
    /* decode attention: each block's first key tile, below the lowest position its sequence
     * writes in this step, copied before the PDL wait, while the prep launch (or the qkv
     * projection) still runs (1, default; DS_CUDA_ATTN_KV_EARLY=0: after the wait, for
     * before/after runs; s32-run1; cuda_attention.cu dec_fresh_position). Same bits. */
    int attn_kv_early;
    /* prefill attention: the next K / V tile copied in under the current tile's work, query
     * tiles last first (1, default; DS_CUDA_ATTN_PF_PIPE=0: session 20's kernel, for
     * before/after runs; cuda_attention.cu). Same bits. */
    int attn_pf_pipe;
    /* with attn_pf_pipe: the prefill attention's P·V as bf16 MMAs on P's bf16 halves hi + lo
     * (1, default; DS_CUDA_ATTN_PF_PV16=0: the 3xTF32-style form; cuda_attention.cu). Not the
     * same bits (P = hi + lo to ~2⁻¹⁷). */
    int attn_pf_pv16;
    /* with attn_pf_pv16: the prefill attention's softmax in the S warps' registers (1, default;
     * DS_CUDA_ATTN_PF_SMR=0: a softmax phase of its own; cuda_attention.cu). Not the same bits. */
    int attn_pf_smr;
    /* prefill attention's P as one bf16 (no lo half) and its shared memory cut to 109 KB so two
     * blocks share an SM (1, default since session 24; DS_CUDA_ATTN_PF_P1=0: hi + lo halves;
     * with SMR only; cuda_attention.cu). Not the same bits */
    int attn_pf_p1;
    /* the GDN decode kernel reads its state before its PDL wait (1, default; DS_CUDA_GDN_EARLY=0:
     * after, for before/after runs; cuda_gdn.cu) */
    int gdn_early;
    /* CUDA-core GEMV: each warp's first batch of weights loaded into registers before the PDL
     * wait (1; DS_CUDA_GEMV_PRELOAD=0: after, for before/after runs; 2, default since session
     * 19: the second batch too where a warp has two, one input row; cuda_gemv.cu) */
    int gemv_preload;
    /* the expert down launch of decode steps of 2+ tokens stages SiLU(g)·u in shared memory
     * (1, default; DS_CUDA_MOE_DOWN_STAGED=0: the per-warp loader, for before/after runs;
     * cuda_moe_experts.cuh moe_down_staged_kernel) */
    int moe_down_staged;
    /* row tiles each block of the staged down launch serves (DS_CUDA_MOE_DOWN_TILES: 1 (64 rows,
     * the session-7 launch), 2, 4 (default) or 8 (32 rows each); cuda_moe_experts.cuh
     * moe_down_staged_kernel). Same bits for every value. */
    int moe_down_tiles;
    /* the largest step (tokens) routed inside the gate_up launch when DS_OPT_MOE_ROUTE_FUSED
     * (DS_CUDA_ROUTE_FUSED_MAX_T, 1-8; default 1: larger steps route in their own launch).
     * Same ids, weights and outputs. */
    int route_fused_max_t;
    /* the fused lm_head + argmax (cuda_argmax.cuh): blocks fold their bests into atomic keys
     * (1, default since session 20) or write partials for the last block to merge
     * (DS_CUDA_AMAX_ATOMIC=0), and the CUDA-core kernel's row tiles per block
     * (DS_CUDA_AMAX_TILES, 1-64; default 1). Same ids for every value. */
    int amax_atomic, amax_tiles;
    /* output rows a warp of the one-token down + combine launch (DS_CUDA_MOE_DC_ROWS: 2, 4 or
     * 8 (default since session 19); cuda_moe.cu). Same sums for every value. */
    int moe_dc_rows;
    /* the lm_head of multi-sequence steps (logits and fused argmax) on tensor cores (1, default;
     * DS_CUDA_LM_HEAD_TC=0: the CUDA cores, for before/after runs; ds_cuda_lm_head_tc) */
    int lm_head_tc;
    /* the add + RMSNorm kernels (add_rmsnorm, the MoE combine + norm) keep a row of ≤ 4096
     * values in registers between their two passes and load the norm weights before their PDL
     * wait (1, default; DS_CUDA_NORM_REGS=0: two passes over memory, for before/after runs;
     * cuda_norm.cuh) */
    int norm_regs;
    /* the MoE router of one-sequence decode steps computes the residual add + RMSNorm before
     * it in every block instead of a launch of its own (1, default; DS_CUDA_GEMV_NORM=0: the
     * add_rmsnorm launch, for before/after runs; cuda_gemv_norm.cu). Same bits. */
    int gemv_norm;
    /* one-token MoE steps do the combine + residual add in the down launch and leave the norm
     * to the next layer's input projection (ds_cuda_op_linear_rmsnorm) instead of a combine +
     * norm launch (DS_CUDA_MOE_DOWN_COMBINE, default 1; cuda_moe_experts.cuh
     * moe_down_combine_kernel). Same bits by construction, tested so. */
    int moe_down_combine;
    /* one-token MoE steps: the down + combine launch's routed warps wait for the gate_up
     * launch's routing through a flag (d_route_flag), then load their first weights before the
     * PDL wait, as the shared expert's warp does (1, default; DS_CUDA_MOE_DOWN_EARLY=0: after
     * the wait, for before/after runs; the same sums; cuda_moe_experts.cuh). 1 vs 0: batch 1
     * 2.884 / 2.885 vs 2.927 / 2.928 ms; batch 4 / 8 do not take it (H100, s34-run1) */
    int moe_down_early;
    /* GEMV split-K: K is split until a launch has this many blocks per SM — CUDA-core GEMV 2
     * (DS_CUDA_SPLITK_PER_SM, 1..8), tensor-core GEMV 0 = never (DS_CUDA_TC_SPLITK_PER_SM,
     * 0..8), for measurements (cuda_gemv.cuh gemv_split_k). Another value changes the order of
     * the sums, not their independence of the step's row count. */
    int splitk_per_sm, tc_splitk_per_sm;
    /* CUDA-core GEMVs too narrow to fill the chip without split K at 4 rows a warp take 1 row a
     * warp unsplit where that gives a block per SM (1, default; DS_CUDA_GEMV_NARROW=0: split,
     * for before/after runs; cuda_gemv.cuh gemv_plan) */
    int gemv_narrow;

    /* Optimisation switches (catalogue items; env at create, README "Switches"), 1 = on:
     * moe_fast_route   DS_OPT_MOE_FAST_ROUTE: decode routing from shared memory
     * moe_route_fused  DS_OPT_MOE_ROUTE_FUSED: decode routing inside the routed experts'
     *                  gate_up launch (every block routes for itself; no routing launch)
     * tc_gemv          DS_OPT_TC_GEMV: the decode GEMVs (R ≤ 8 rows, K % 256 == 0; not the
     *                  lm_head logits) on tensor cores (cuda_gemv_tc.cu)
     * moe_fuse_shared  DS_OPT_SHARED_EXPERT: the shared expert's down projection in the routed
     *                  experts' launch (catalogue item 1, fused variant)
     * fuse_norm        DS_OPT_FUSED_NORM: the residual add + RMSNorm after the MoE block in
     *                  the MoE's combine kernel
     * pdl              DS_OPT_PDL: programmatic dependent launch of the step's kernels
     *                  (cuda_launch.cuh)
     * prefetch         DS_OPT_PREFETCH: weights prefetched into L2 while a kernel waits for its
     *                  predecessor, the routed experts' weights right after routing (catalogue
     *                  item 11; needs pdl to overlap anything)
     * moe_gemm         DS_OPT_MOE_GEMM: routed experts of steps above DS_CUDA_GEMV_MAX_ROWS
     *                  tokens as a grouped tensor-core GEMM (cuda_moe_gemm.cu)
     * gdn_prefill      DS_OPT_GDN_PREFILL: Gated DeltaNet of steps with a run of at least
     *                  DS_CUDA_GDN_PREFILL_MIN_TOKENS tokens of one sequence in four launches,
     *                  the recurrence one warp per state column (cuda_gdn_prefill.cu) */
    struct {
        int moe_fast_route, moe_route_fused, moe_fuse_shared, fuse_norm, pdl, prefetch, moe_gemm,
            gdn_prefill, tc_gemv;
    } opt;

    /* GEMV split-K */
    float *d_splitk_ws;           /* [DS_CUDA_SPLITK_WS_FLOATS] */
    int *d_splitk_cnt;            /* [DS_CUDA_SPLITK_COUNTERS], zero between launches */
    /* [2]: the routing-done flag a one-token gate_up launch sets and the down + combine launch
     * waits on, and that launch's count of finished blocks; both zero between MoE blocks */
    int *d_route_flag;

    /* cuBLASLt */
    cublasLtHandle_t lt;
    void *d_lt_ws;                /* [DS_CUDA_LT_WS_BYTES] */
    ds_cuda_lt_plan lt_plans[DS_CUDA_LT_CACHE];
    int lt_next;

    /* argmax */
    int32_t *d_ids;               /* [DS_CUDA_MAX_TOKENS] */
    int32_t *h_ids;               /* pinned [DS_CUDA_MAX_TOKENS] */
    int32_t *d_tokbuf;            /* [DS_TOKEN_BUF] the token buffer (backend.h token_src) */
    int32_t *h_tokbuf;            /* pinned [DS_TOKEN_BUF] its ids on their way to the host */
    int32_t *h_copy[DS_CUDA_COPY_BUFS]; /* pinned [DS_TOKEN_BUF] each: copy_tokens, in turn */
    int copy_flip;
    int32_t *d_shift;             /* [DS_SHIFT_TABLE] the shift table (backend.h spec_accept) */
    cudaEvent_t mark_event;       /* backend.h mark / wait_mark: the last mark */
    int mark_outs;                /* host outputs pending when it was recorded */
    float *d_amax_v;              /* fused lm_head argmax partials [2][DS_CUDA_AMAX_BLOCKS · 8]:
                                     plain, then without the banned ids */
    int32_t *d_amax_i;            /* [2][DS_CUDA_AMAX_BLOCKS · 8] */
    int *d_amax_cnt;              /* [1], zero between launches */
    unsigned long long *d_amax_key; /* [2][8] the atomic keys of amax_atomic, zero between launches */
    /* banned ids of the fused argmax (set_argmax_bans): [0] = rows B, [1] = ids per row n_ban,
     * then the table [B, n_ban] (-1 padded); a fixed address read by every launch, so graph
     * replays see the current table */
    int32_t *d_bans;              /* device [2 + DS_CUDA_BAN_INTS] */
    int32_t *h_bans;              /* pinned staging [2 + DS_CUDA_BAN_INTS] */
    cudaEvent_t bans_done;        /* recorded after the last upload from h_bans */
    /* spec_sample's per-sequence parameters (set_spec_sampling), at a fixed address as d_bans */
    ds_spec_sampling *d_samp;     /* device [DS_SPEC_SAMPLING_MAX] */
    ds_spec_sampling *h_samp;     /* pinned staging [DS_SPEC_SAMPLING_MAX] */
    cudaEvent_t samp_done;        /* recorded after the last upload from h_samp */

    /* DS_CUDA_DIAG_SKIP (a measurement of where a step's time goes, never for serving: the
     * outputs are garbage): comma-separated kernel patterns whose launches ds_launch drops, so
     * that a step's time without them gives their marginal cost inside the PDL chain
     * (ds_cuda_diag_skip; NULL when unset). Decisions cached per kernel function. The pattern
     * gdn_nostore matches no kernel: the GDN decode kernel runs but skips its state and conv
     * history stores (cuda_gdn.cu; s36-run1, H100: batch 1 / 4 / 8 2.637 / 4.982 / 7.443 vs
     * 2.738 / 5.293 / 7.969 ms); diag_gdn_nostore: whether it was given. */
    const char *diag_skip;
    int diag_gdn_nostore;
    int diag_n;
    const void *diag_fn[64];
    unsigned char diag_drop[64];

    /* MoE scratch (sized by prepare_weights from the model; freed at destroy) */
    size_t moe_scratch_bytes;
    void *d_moe_scratch;
    size_t gdn_scratch_bytes;     /* cuda_gdn_prefill.cu's scratch, 0 when the shape has none */
    void *d_gdn_scratch;
} ds_cuda_ctx;

/* Error recording (cuda_backend.c). Returns 1 when `e` is a failure. */
int ds_cuda_check(ds_cuda_ctx *ctx, cudaError_t e, const char *what, const char *file, int line);
int ds_cuda_check_lt(ds_cuda_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                     int line);
#define DS_CU(ctx, call) ds_cuda_check((ctx), (call), #call, __FILE__, __LINE__)
#define DS_LT(ctx, call) ds_cuda_check_lt((ctx), (call), #call, __FILE__, __LINE__)
/* After every kernel launch: checks it, counts it (take_launch_count) and, when profiling,
 * records an event tagged with the kernel name and a shape (a, b). */
void ds_cuda_launched(ds_cuda_ctx *ctx, const char *name, int64_t a, int64_t b, const char *file,
                      int line);
#define DS_CU_LAUNCHED(ctx, name) ds_cuda_launched((ctx), (name), 0, 0, __FILE__, __LINE__)
#define DS_CU_LAUNCHED2(ctx, name, a, b) ds_cuda_launched((ctx), (name), (a), (b), __FILE__, __LINE__)
/* An op that cannot run inside a capture (it waits for the device) was called during one: the
 * capture is marked failed (graph_end reports why) and the op does nothing. Returns 1 then. */
int ds_cuda_refuse_in_capture(ds_cuda_ctx *ctx, const char *what);
/* Whether ds_launch drops launches of `kernel` (ctx->diag_skip; cuda_backend.c). */
int ds_cuda_diag_skip(ds_cuda_ctx *ctx, const void *kernel);

/* ---- launchers (cuda_*.cu) -------------------------------------------------------------- */
/* dtype codes match ds_dtype: 0 F32, 1 BF16, 2 F16 */

/* GEMV: out[r, n] (row stride ldo, out_f32 ? float : bf16) = Σ_k x[r, k] · W[n, k] for r < R ≤ 8,
 * W [N, K] bf16 row-major, x bf16 with row stride ldx. K % 8 == 0; 16-byte aligned rows. */
void ds_cuda_gemv(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                  int64_t ldx, int R, void *out, int64_t ldo, int out_f32);
/* The same on tensor cores (cuda_gemv_tc.cu; ds_cuda_gemv takes it when ctx->opt.tc_gemv): returns
 * 0, launching nothing, unless K % 256 == 0 and 1 ≤ R ≤ 8. The lm_head logits take it only
 * where ds_cuda_lm_head_tc says so, their values must equal the fused argmax's. */
int ds_cuda_gemv_tc(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                    int64_t ldx, int R, void *out, int64_t ldo, int out_f32);
/* Whether this step's lm_head [N, K] (logits and fused argmax alike) runs on tensor cores: a
 * multi-sequence step (ds_cuda_gemv's rule), K % 256 == 0, no split K (cuda_gemv_tc.cu). */
int ds_cuda_lm_head_tc(const ds_cuda_ctx *ctx, int64_t N, int64_t K);
/* The fused lm_head + argmax on tensor cores for R ≤ 8 input rows, batch rows row0.. (bans). */
void ds_cuda_argmax_gemv_tc(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                            int64_t ldx, int R, int32_t *ids, int row0);
/* ds_cuda_gemv on the CUDA cores only. */
void ds_cuda_gemv_cores(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                        int64_t ldx, int R, void *out, int64_t ldo, int out_f32);
/* ds_cuda_gemv_cores with its input the residual add + RMSNorm of the previous outputs
 * (cuda_gemv_norm.cu): x = bf16(rmsnorm(bf16(resid + delta)) · norm_w) [R, K] (delta NULL:
 * rmsnorm(resid)), written to normed by one block; out [R, N] (fp32 when out_f32, else bf16) =
 * x · Wᵀ. resid and delta are only read. Only where ds_cuda_gemv_add_norm_ok(ctx, R, K) (this
 * step's GEMV on the CUDA cores, R ≤ 8, x within 48 KB of shared memory, ctx->gemv_norm): the
 * same bits as add_rmsnorm (or rmsnorm) + ds_cuda_gemv then. */
int ds_cuda_gemv_add_norm_ok(const ds_cuda_ctx *ctx, int R, int64_t K);
void ds_cuda_gemv_add_norm(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                           const void *resid, const void *delta, const float *norm_w, float eps,
                           void *normed, int R, void *out, int64_t ldo, int out_f32);
/* Same contract through cuBLASLt (any R). */
void ds_cuda_gemm_lt(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                     int64_t ldx, int R, void *out, int64_t ldo, int out_f32);

void ds_cuda_embed(ds_cuda_ctx *ctx, const void *table, int table_dtype, int64_t V, int64_t H,
                   void *out);
void ds_cuda_rmsnorm(ds_cuda_ctx *ctx, const void *x, const float *w, float eps, int64_t R,
                     int64_t D, void *out);
void ds_cuda_add_rmsnorm(ds_cuda_ctx *ctx, void *residual, const void *delta, const float *w,
                         float eps, int64_t R, int64_t D, void *out);
void ds_cuda_silu_mul(ds_cuda_ctx *ctx, const void *gu, int64_t R, int64_t I, void *out);
void ds_cuda_gather_rows(ds_cuda_ctx *ctx, const void *x, int64_t H, int elem_size, void *out);
void ds_cuda_argmax(ds_cuda_ctx *ctx, const float *logits, int R, int64_t V, int32_t *d_ids);
/* cuda_spec.cu: backend.h spec_accept over the current batch (device side), and the lowering
 * of the current batch by its pos_shift / out_shift (launched by set_batch, recorded with it
 * into a graph being captured). */
void ds_cuda_spec_accept(ds_cuda_ctx *ctx, int ids_at, int next_at, int m_at, int shift_at);
void ds_cuda_batch_shift(ds_cuda_ctx *ctx);
/* cuda_spec_sample.cu: backend.h spec_sample over the current batch, logits [T, V] f32. */
void ds_cuda_spec_sample(ds_cuda_ctx *ctx, const float *logits, int64_t V, int ids_at);
/* a one-thread kernel that keeps the stream busy for us microseconds (profiling head start) */
void ds_cuda_spin(ds_cuda_ctx *ctx, double us);
/* d_ids[r] = argmax_n Σ_k x[r, k]·W[n, k] for r < R (any R; chunks of 8), without writing
 * logits: one GEMV pass with a per-block (max, index) and a last-block reduction per chunk.
 * Same dot products as ds_cuda_gemv (no split-K), lowest index on ties, NaN never wins.
 * Rows r < ctx->d_bans[0] exclude the ids of their row of the ban table (backend.h
 * set_argmax_bans; the plain argmax when nothing is left). */
void ds_cuda_argmax_gemv(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                         int64_t ldx, int R, int32_t *d_ids);
/* out[r] = [a[r] | b[r]] (bf16 rows). */
void ds_cuda_concat(ds_cuda_ctx *ctx, const void *a, int64_t A, const void *b, int64_t B,
                    int64_t R, void *out);
/* Seeded uniform fill (counter-based: element i gets hash(seed, counter0 + i)), values in
 * [lo, hi), stored as bf16 (is_bf16) or f32. Independent of the launch shape. */
void ds_cuda_fill_uniform(ds_cuda_ctx *ctx, void *dst, int is_bf16, size_t n, uint64_t seed,
                          uint64_t counter0, float lo, float hi);

/* Attention (cuda_attention.cu). Caches: [n_blocks, block_size, nkv, hd] bf16. */
typedef struct ds_cuda_attn_args {
    int nh, nkv, hd, rot, block_size;
    float eps, scale;
    const float *q_norm, *k_norm; /* [hd] */
    const float *inv_freq;        /* [rot/2] */
    const void *qkv;              /* [T, nh·2hd + 2·nkv·hd] bf16 */
    void *out;                    /* [T, nh·hd] bf16 */
    void *k_cache, *v_cache;
    float *ws;                    /* decode split partials */
    int ws_rows;                  /* capacity in (seq, head, split) rows of hd + 2 floats */
    int split_grain;              /* decode: a split's keys are a multiple of this (16 or 32) */
} ds_cuda_attn_args;
void ds_cuda_attention(ds_cuda_ctx *ctx, const ds_cuda_attn_args *a);
/* Kernel attributes (dynamic shared-memory limits), set once at backend creation. */
void ds_cuda_attention_init(ds_cuda_ctx *ctx);
void ds_cuda_gdn_chunked_init(ds_cuda_ctx *ctx);
void ds_cuda_moe_init(ds_cuda_ctx *ctx);

/* Gated DeltaNet (cuda_gdn.cu). */
typedef struct ds_cuda_gdn_args {
    int hk, hv, dk, dv, kernel;
    float eps;
    const void *proj;             /* [T, conv_dim + hv·dv + 2hv] bf16 */
    const float *conv_w;          /* [conv_dim, kernel] */
    const float *neg_exp_A, *dt_bias; /* [hv] */
    const float *norm_w;          /* [dv] */
    float *state;                 /* layer's state, slot stride state_slot_stride floats */
    int64_t state_slot_stride;    /* floats per slot (all GDN layers of a slot are contiguous) */
    float *conv_hist;             /* layer's conv history, slot stride conv_slot_stride */
    int64_t conv_slot_stride;
    void *out;                    /* [T, hv·dv] bf16 */
} ds_cuda_gdn_args;
void ds_cuda_gdn(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a);
/* The prefill form (cuda_gdn_prefill.cu): runs it and returns true when the step suits it. */
#define DS_CUDA_GDN_PREFILL_MIN_TOKENS 16
bool ds_cuda_gdn_prefill(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a);
/* Bytes of its scratch for DS_CUDA_MAX_TOKENS tokens; 0 when it is not built for the shape. */
size_t ds_cuda_gdn_prefill_scratch_bytes(int hk, int hv, int dk, int dv, int kernel);

/* MoE (cuda_moe.cu). */
typedef struct ds_cuda_moe_args {
    int T;                        /* rows of x (≤ DS_CUDA_MAX_TOKENS) */
    int H, E, top_k, I, Is, norm_topk;
    const void *x;                /* [T, H] bf16 */
    const void *w_in;             /* [E + 2Is + (Is ? 1 : 0), H]: router | shared gate_up | shared
                                   * gate, then zero rows up to ds_cuda_moe_in_rows */
    const void *w_gu;             /* [E, 2I, H] */
    const void *w_down;           /* [E, H, I] */
    const void *w_sh_down;        /* [H, Is] or NULL */
    void *out;                    /* [T, H] bf16 (unused when residual is set) */
    /* fused residual add + RMSNorm (DS_OPT_FUSED_NORM; residual NULL: plain out):
     * residual [T, H] bf16 += the MoE output; normed [T, H] bf16 = rmsnorm(residual)·norm_w.
     * normed NULL: the residual add only, in the down launch (moe_down_combine_kernel), the
     * norm left to the caller; only where ds_cuda_moe_down_combine_ok */
    void *residual;
    const float *norm_w;          /* [H] */
    float eps;
    void *normed;
    /* the residual add + RMSNorm before the block folded into the router launch (NULL: x is
     * the input; else residual is set too, and T must pass ds_cuda_gemv_add_norm_ok): then x
     * is an output, x [T, H] = rmsnorm(bf16(residual + pre_delta)) · pre_norm_w written by the
     * router launch and read by the experts; the combine adds pre_delta to the residual too */
    const void *pre_delta;        /* [T, H] bf16, the mixer's output */
    const float *pre_norm_w;      /* [H] */
} ds_cuda_moe_args;
void ds_cuda_moe(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a);
/* Whether a MoE step of this shape can do its combine + residual add in the down launch and
 * leave the norm to the caller (args.normed NULL): one-token steps, k + 1 ≤ 16,
 * ctx->moe_down_combine (DS_CUDA_MOE_DOWN_COMBINE), DS_OPT_FUSED_NORM and, with a shared
 * expert, DS_OPT_SHARED_EXPERT. */
int ds_cuda_moe_down_combine_ok(const ds_cuda_ctx *ctx, int T, int H, int k, int I, int Is);
/* Rows prepare_weights lays out for the fused router | shared gate_up | shared gate matrix:
 * E + 2Is + (Is ? 1 : 0) rounded up to 8, the rows past those zero (the router logits' row
 * pitch too, so a GEMM over all of them writes only padding columns). */
int64_t ds_cuda_moe_in_rows(int E, int Is);
/* Bytes of MoE scratch needed for DS_CUDA_MAX_TOKENS tokens of this shape. */
size_t ds_cuda_moe_scratch_bytes(int H, int E, int top_k, int I, int Is);

#ifdef __cplusplus
}
#endif

#endif
