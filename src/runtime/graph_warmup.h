/* graph_warmup.h — every serving step shape recorded as a step graph before the server takes
 * requests, and a report of the shapes that could not be (catalogue items 14 and 15).
 *
 * Step graphs (step_graph.h) are recorded at a shape's first step. Without a warmup a shape
 * the backend cannot record is found in the middle of serving and then runs eagerly for the
 * server's whole life, silently. ds_graph_warmup runs one step of every shape the engine can
 * form, on scratch sequences, through the same runner path and graph keys serving uses
 * (ds_runner_step_graphed), so serving replays those recordings from its first step:
 *  - plain decoding (k = 0): greedy decode steps of n = 1 .. max_num_seqs sequences, one token
 *    each (n tokens);
 *  - speculative decoding with k drafts: greedy verifications of n sequences each feeding its
 *    last token + k drafts, n · (1 + k) tokens (the steady state: every running decode carries
 *    k drafts; catalogue 15: sizes derived from concurrency × (1 + k), not from a fixed list),
 *    for every n whose n · (1 + k) tokens fit the step's token budget (max_num_batched_tokens;
 *    the scheduler trims drafts past it, so larger uniform shapes never occur).
 * With drafts chained on the device (spec.h "draft passes"), the k draft passes that follow each
 * of those verifications are recorded too (pass 0 over its rows, passes 1..k-1 of n sequences),
 * after all verifications, so those keep the graph table first.
 * With sampled verifications on the device (runner.h dev_sample), the same verification shapes
 * once more as sampled ones (logits + spec_sample: their own graphs), each through
 * ds_runner_step_ahead like serving (verification, acceptance and draft passes), last.
 * Other shapes (verifications whose sequences carry different draft counts near their token
 * limit, steps with prefill chunks) are not graphed, or are recorded at first use (uniform
 * draft counts below k), as before.
 *
 * At most DS_GRAPH_WARMUP_MAX shapes (the CUDA backend keeps 64 graphs; a 65th recording is
 * refused), smallest n first; the rest are left to first use and listed as skipped.
 *
 * Scratch sequences: sequence i of a shape uses state slot i and KV blocks taken from the pool
 * (ds_kv_blocks_append on row i), feeds token 0 at position 0 (its drafts: whatever the runner
 * holds, valid ids), and gives the blocks back in reverse order, so the pool's free list ends
 * as it began. Every GDN state slot of the cache is reset afterwards (cache_reset_slot); the
 * KV rows the scratch steps wrote are never read by a real sequence, which reads only the
 * positions it has written itself (kv_blocks.h). Needs a pool that no sequence holds yet
 * (engine start-up), else it refuses. */
#ifndef DS_GRAPH_WARMUP_H
#define DS_GRAPH_WARMUP_H

#include <stdbool.h>
#include <stdio.h>

#include "core/status.h"
#include "runtime/kv_blocks.h"
#include "runtime/runner.h"

#define DS_GRAPH_WARMUP_ALL (-1) /* every shape up to DS_GRAPH_WARMUP_MAX */
#define DS_GRAPH_WARMUP_MAX 64   /* the CUDA backend's graph table (cuda_internal.h) */

/* One step shape: n_seqs sequences of n_tokens tokens in all. */
typedef struct ds_graph_shape {
    int n_seqs, n_tokens;
    char why[DS_ERROR_MSG_MAX]; /* eager: the backend's reason */
} ds_graph_shape;

typedef struct ds_graph_report {
    int k;            /* draft tokens per verification (0: plain decode steps) */
    int max_seqs;     /* the runner's sequences per step */
    int limit;        /* shapes asked for (DS_GRAPH_WARMUP_ALL, 0 = none, N) */
    bool off;         /* the runner graphs no steps (off_why says why): nothing was run */
    char off_why[DS_ERROR_MSG_MAX];
    int n_formable;   /* shapes the engine can form (n = 1 .. n_formable) */
    int n_run;        /* shapes the warmup ran (n = 1 .. n_run): the limit, at most 64 */
    int n_captured;   /* of those, recorded: replayed from now on */
    int n_eager;      /* of those, not recordable: eager[0 .. n_eager), run eagerly */
    ds_graph_shape *eager;
    /* speculative with device-chained drafts (spec.h): the k draft passes after each of the
     * n_run verification shapes, recorded after all verifications */
    int n_draft_run, n_draft_captured, n_draft_eager;
    /* sampled verifications decided on the device (runner.h ds_runner_set_sampling): the same
     * n_run shapes, recorded last (the greedy steps keep the graph table first) */
    int n_sampled_run, n_sampled_captured;
    double seconds;   /* wall time of the warmup */
} ds_graph_report;

/* Runs the warmup described above for up to `limit` shapes (DS_GRAPH_WARMUP_ALL: all; 0: none,
 * the report says so) and fills *rep (ds_graph_report_free it). A shape that cannot be
 * recorded is not an error (it is listed); an error is a step that failed eagerly too (device
 * failure) or a pool already in use. */
ds_status ds_graph_warmup(ds_runner *r, ds_kv_blocks *kv, int limit, ds_graph_report *rep,
                          ds_error *err);
void ds_graph_report_free(ds_graph_report *rep);

/* The start-up report, lines starting with `prefix`: shapes captured of those run, the time,
 * every shape that fell back with its reason, the shapes left to first use. */
void ds_graph_report_print(const ds_graph_report *rep, const char *prefix, FILE *f);

/* Shapes of r's serving steps with a recorded graph (*captured) and shapes whose recording
 * failed and that run eagerly (*eager), whenever they were tried: at warmup or at first use
 * while serving. Only the thread that runs r's steps may call it. */
void ds_graph_count(const ds_runner *r, int *captured, int *eager);
/* The same for the draft passes alone (speculative runners; 0 and 0 otherwise). */
void ds_graph_count_drafts(const ds_runner *r, int *captured, int *eager);

#endif
