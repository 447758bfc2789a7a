#include "runtime/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* ---- sequences ------------------------------------------------------------------------------ */

void ds_sched_seq_init(ds_sched_seq *q, const int32_t *tokens, int n_prompt, int max_new,
                       void *owner) {
    DS_ASSERT(n_prompt > 0 && max_new > 0);
    /* The last generated token is sampled but never fed, so it needs no cache position. */
    *q = (ds_sched_seq){.n_tokens = n_prompt, .max_tokens = n_prompt + max_new - 1, .slot = -1,
                        .tokens = tokens, .owner = owner};
}

void ds_sched_seq_advance(ds_sched_seq *q, int n_fed, bool sampled) {
    DS_ASSERT(q->state == DS_SCHED_RUNNING && n_fed > 0 && q->n_computed + n_fed <= q->n_tokens);
    q->n_computed += n_fed;
    if (sampled) {
        DS_ASSERT(q->n_computed == q->n_tokens);
        q->n_tokens++;
    }
}

void ds_sched_seq_advance_spec(ds_sched_seq *q, int n_known, int n_emitted) {
    DS_ASSERT(q->state == DS_SCHED_RUNNING && n_known > 0 && n_emitted >= 1 &&
              q->n_computed + n_known == q->n_tokens);
    q->n_computed += n_known + n_emitted - 1;
    q->n_tokens += n_emitted;
    q->n_draft = 0;
    DS_ASSERT(q->n_computed + 1 == q->n_tokens && q->n_computed <= q->max_tokens);
}

void ds_sched_seq_set_drafts(ds_sched_seq *q, int n) {
    DS_ASSERT(n >= 0 && q->n_computed + 1 == q->n_tokens && q->n_tokens + n <= q->max_tokens + 1);
    q->n_draft = n;
}

/* ---- intrusive queues ----------------------------------------------------------------------- */

static void queue_push_back(ds_sched_queue *l, ds_sched_seq *q) {
    q->prev = l->tail;
    q->next = NULL;
    if (l->tail) l->tail->next = q;
    else l->head = q;
    l->tail = q;
    l->n++;
}

static void queue_push_front(ds_sched_queue *l, ds_sched_seq *q) {
    q->prev = NULL;
    q->next = l->head;
    if (l->head) l->head->prev = q;
    else l->tail = q;
    l->head = q;
    l->n++;
}

static void queue_unlink(ds_sched_queue *l, ds_sched_seq *q) {
    if (q->prev) q->prev->next = q->next;
    else l->head = q->next;
    if (q->next) q->next->prev = q->prev;
    else l->tail = q->prev;
    q->prev = q->next = NULL;
    DS_ASSERT(l->n > 0);
    l->n--;
}

/* ---- lifetime ------------------------------------------------------------------------------- */

void ds_scheduler_init(ds_scheduler *s, int max_num_seqs, int max_num_batched_tokens,
                       ds_kv_blocks *kv, ds_state_slots *slots) {
    DS_ASSERT(max_num_seqs > 0 && max_num_batched_tokens > 0);
    DS_ASSERT(kv->n_seqs >= max_num_seqs && slots->n_slots >= max_num_seqs);
    *s = (ds_scheduler){.max_num_seqs = max_num_seqs,
                        .max_num_batched_tokens = max_num_batched_tokens,
                        .kv = kv,
                        .slots = slots};
    s->snap = ds_xcalloc((size_t)max_num_seqs, sizeof *s->snap);
    s->plan.items = ds_xcalloc((size_t)max_num_seqs, sizeof *s->plan.items);
    ds_prefix_cache_init(&s->pc, slots->n_slots);
}

void ds_scheduler_free(ds_scheduler *s) {
    ds_prefix_cache_free(&s->pc);
    free(s->snap);
    free(s->plan.items);
    *s = (ds_scheduler){0};
}

void ds_scheduler_set_spec(ds_scheduler *s, int k) {
    DS_ASSERT(k >= 0);
    s->num_spec = k;
}

bool ds_scheduler_fits(const ds_scheduler *s, int64_t max_tokens) {
    int64_t blocks = ds_kv_blocks_for_tokens(s->kv, max_tokens);
    return blocks <= s->kv->n_blocks && blocks <= s->kv->max_blocks_per_seq;
}

void ds_scheduler_add(ds_scheduler *s, ds_sched_seq *q) {
    DS_ASSERT(q->state == DS_SCHED_NONE && q->slot < 0 && q->n_tokens > q->n_computed);
    DS_ASSERT(ds_scheduler_fits(s, q->max_tokens));
    q->state = DS_SCHED_WAITING;
    queue_push_back(&s->waiting, q);
}

/* Frees the caches of a running sequence. */
static void release_caches(ds_scheduler *s, ds_sched_seq *q) {
    DS_ASSERT(q->slot >= 0);
    ds_kv_blocks_release(s->kv, q->slot);
    ds_state_slots_release(s->slots, q->slot);
    q->slot = -1;
}

/* ---- prefix cache --------------------------------------------------------------------------- */

/* Frees the caches of the least recently stored entry other than the one holding `except`;
 * false when there is none. */
static bool evict_entry(ds_scheduler *s, int except) {
    const int slot = ds_prefix_cache_oldest(&s->pc, except);
    if (slot < 0) return false;
    ds_prefix_cache_take(&s->pc, slot);
    ds_kv_blocks_release(s->kv, slot);
    ds_state_slots_release(s->slots, slot);
    s->prefix_evicted++;
    return true;
}

void ds_scheduler_set_prefix_caching(ds_scheduler *s, bool on) {
    s->prefix_caching = on;
    if (!on)
        while (evict_entry(s, -1)) {}
}

int ds_scheduler_prefix_blocks(const ds_scheduler *s) {
    int n = 0;
    for (int i = 0; i < s->pc.n; i++) n += ds_kv_blocks_held(s->kv, s->pc.e[i].slot);
    return n;
}

void ds_scheduler_retire(ds_scheduler *s, ds_sched_seq *q) {
    /* the entry's L + 1 tokens: its n_computed cached ones and the last, sampled one */
    if (!s->prefix_caching || q->state != DS_SCHED_RUNNING || q->n_computed < 1 ||
        q->n_tokens != q->n_computed + 1) {
        ds_scheduler_remove(s, q);
        return;
    }
    /* positions from n_computed on are rewritten by the next owner before anything reads them */
    ds_kv_blocks_truncate(s->kv, q->slot, q->n_computed);
    if (!ds_prefix_cache_store(&s->pc, q->slot, q->tokens, q->n_computed)) {
        ds_scheduler_remove(s, q);
        return;
    }
    s->prefix_stored++;
    queue_unlink(&s->running, q);
    q->slot = -1;
    q->state = DS_SCHED_NONE;
}

void ds_scheduler_remove(ds_scheduler *s, ds_sched_seq *q) {
    switch (q->state) {
    case DS_SCHED_WAITING: queue_unlink(&s->waiting, q); break;
    case DS_SCHED_RUNNING:
        queue_unlink(&s->running, q);
        release_caches(s, q);
        break;
    case DS_SCHED_NONE: return;
    }
    q->state = DS_SCHED_NONE;
}

/* ---- planning ------------------------------------------------------------------------------- */

static bool in_plan(const ds_scheduler *s, const ds_sched_seq *q) {
    return q->plan_step == s->step;
}

static void plan_add(ds_scheduler *s, ds_sched_seq *q, int n, int n_draft, bool fresh,
                     bool resumed) {
    ds_sched_plan *p = &s->plan;
    bool logits = q->n_computed + n == q->n_tokens;
    DS_ASSERT(n_draft == 0 || logits);
    q->plan_step = s->step;
    q->plan_index = p->n_items;
    p->items[p->n_items++] = (ds_sched_item){
        .seq = q, .n_tokens = n, .n_draft = n_draft, .wants_logits = logits, .fresh_slot = fresh,
        .resumed = resumed};
    p->n_tokens += n + n_draft;
    p->n_out += logits;
}

/* KV positions a sequence must hold to feed n tokens now: the chunk itself, plus, when the chunk
 * reaches the last known token of a speculating sequence, the MTP draft positions after it
 * (spec.h: drafting for the next step writes the MTP's KV up to k − 1 positions past the last
 * accepted token), capped at what the sequence can ever hold. */
static int64_t kv_target_from(const ds_scheduler *s, const ds_sched_seq *q, int n_computed,
                              int n_known, int n_fed) {
    int64_t target = (int64_t)n_computed + n_fed;
    if (s->num_spec > 0 && q->spec && n_computed + n_known == q->n_tokens) {
        int64_t ahead = target + s->num_spec - 1;
        if (ahead > q->max_tokens) ahead = q->max_tokens;
        if (ahead > target) target = ahead;
    }
    return target;
}

static int64_t kv_target(const ds_scheduler *s, const ds_sched_seq *q, int n_known, int n_fed) {
    return kv_target_from(s, q, q->n_computed, n_known, n_fed);
}

static void plan_drop(ds_scheduler *s, ds_sched_seq *q) {
    ds_sched_plan *p = &s->plan;
    int i = q->plan_index;
    DS_ASSERT(i >= 0 && i < p->n_items && p->items[i].seq == q);
    p->n_tokens -= p->items[i].n_tokens + p->items[i].n_draft;
    p->n_out -= p->items[i].wants_logits;
    memmove(&p->items[i], &p->items[i + 1], (size_t)(p->n_items - i - 1) * sizeof p->items[0]);
    p->n_items--;
    for (int k = i; k < p->n_items; k++) p->items[k].seq->plan_index = k;
    q->plan_step = 0;
}

/* Running → front of the waiting queue, caches freed, everything to be recomputed. */
static void preempt(ds_scheduler *s, ds_sched_seq *q) {
    if (in_plan(s, q)) plan_drop(s, q);
    queue_unlink(&s->running, q);
    release_caches(s, q);
    q->n_computed = 0;
    q->n_draft = 0;
    q->state = DS_SCHED_WAITING;
    queue_push_front(&s->waiting, q);
    s->n_preemptions++;
    s->plan.n_preempted++;
}

/* Gives running sequence q the blocks for n_fed more tokens (n_known of them known, the rest
 * drafts) and the speculative lookahead, preempting the newest running sequences as needed.
 * Returns false when q itself had to be preempted. */
static bool reserve_running(ds_scheduler *s, ds_sched_seq *q, int n_known, int n_fed) {
    int64_t target = kv_target(s, q, n_known, n_fed);
    while (!ds_kv_blocks_can_append(s->kv, q->slot, target)) {
        if (evict_entry(s, -1)) continue; /* cached prefixes go before anyone is preempted */
        ds_sched_seq *victim = s->running.tail;
        DS_ASSERT(victim != NULL);
        preempt(s, victim);
        if (victim == q) return false;
    }
    bool ok = ds_kv_blocks_append(s->kv, q->slot, target);
    DS_ASSERT(ok);
    return true;
}

/* Plans the running sequences of one kind: decodes (1 token left) or prefills (more). */
static void plan_running(ds_scheduler *s, bool decodes, int *budget) {
    /* Snapshot: preemption unlinks sequences from the running queue while we walk it. */
    int n = 0, n_dec = 0;
    for (ds_sched_seq *q = s->running.head; q; q = q->next) {
        s->snap[n++] = q;
        n_dec += q->n_tokens - q->n_computed == 1;
    }
    /* Draft tokens only from the budget left once every decode has its one token. */
    int spare = decodes && *budget > n_dec ? *budget - n_dec : 0;
    for (int i = 0; i < n && *budget > 0; i++) {
        ds_sched_seq *q = s->snap[i];
        if (q->state != DS_SCHED_RUNNING || in_plan(s, q)) continue; /* preempted / planned */
        int left = q->n_tokens - q->n_computed;
        DS_ASSERT(left >= 1);
        if ((left == 1) != decodes) continue;
        int take = left < *budget ? left : *budget;
        int n_draft = decodes && s->num_spec > 0 ? q->n_draft : 0;
        if (n_draft > spare) n_draft = spare;
        if (n_draft > *budget - take) n_draft = *budget - take;
        int before = s->plan.n_tokens;
        if (!reserve_running(s, q, take, take + n_draft)) continue;
        /* Victims dropped from the plan gave their tokens back. */
        *budget += before - s->plan.n_tokens;
        plan_add(s, q, take, n_draft, false, false);
        *budget -= take + n_draft;
        spare -= n_draft;
    }
}

/* Admits waiting head q into `slot` (a free one, or an entry's holding n_cached positions) with
 * its first chunk of `take` tokens, whose blocks (up to `target` positions) are free. */
static void admit(ds_scheduler *s, ds_sched_seq *q, int slot, int n_cached, int take,
                  int64_t target) {
    bool ok = ds_kv_blocks_append(s->kv, slot, target);
    DS_ASSERT(ok);
    queue_unlink(&s->waiting, q);
    if (!q->admitted) {
        s->prefix_queries += (uint64_t)q->n_tokens;
        s->prefix_hits += (uint64_t)n_cached;
        q->n_reused = n_cached;
        q->admitted = true;
    }
    q->slot = slot;
    q->n_computed = n_cached;
    q->state = DS_SCHED_RUNNING;
    queue_push_back(&s->running, q);
    plan_add(s, q, take, 0, n_cached == 0, n_cached > 0);
}

/* Admits waiting head q by taking over the prefix-cache entry its tokens continue, evicting
 * other entries for the blocks of its first chunk. False when none matches or the blocks are
 * not there even so (the entry stays). */
static bool admit_cached(ds_scheduler *s, ds_sched_seq *q, int *budget) {
    int n_cached = 0;
    const int slot = ds_prefix_cache_match(&s->pc, q->tokens, q->n_tokens, &n_cached);
    if (slot < 0) return false;
    const int left = q->n_tokens - n_cached;
    const int take = left < *budget ? left : *budget;
    const int64_t target = kv_target_from(s, q, n_cached, take, take);
    while (ds_kv_blocks_missing(s->kv, slot, target) > ds_kv_blocks_n_free(s->kv))
        if (!evict_entry(s, slot)) return false;
    if (!ds_kv_blocks_can_append(s->kv, slot, target)) return false;
    ds_prefix_cache_take(&s->pc, slot);
    admit(s, q, slot, n_cached, take, target);
    *budget -= take;
    return true;
}

static void plan_waiting(ds_scheduler *s, int *budget) {
    while (s->waiting.head && *budget > 0 && s->running.n < s->max_num_seqs) {
        ds_sched_seq *q = s->waiting.head;
        DS_ASSERT(q->n_computed == 0);
        if (s->prefix_caching && admit_cached(s, q, budget)) continue;
        int take = q->n_tokens < *budget ? q->n_tokens : *budget;
        int64_t target = kv_target(s, q, take, take);
        const int need = ds_kv_blocks_for_tokens(s->kv, target);
        /* strict FCFS: when the head does not fit even with every cached prefix evicted, nobody
         * overtakes it (and the entries stay) */
        if (s->pc.n == 0 && ds_state_slots_n_free(s->slots) == 0) break;
        if (need > ds_kv_blocks_n_free(s->kv) + ds_scheduler_prefix_blocks(s)) break;
        while ((ds_state_slots_n_free(s->slots) == 0 || need > ds_kv_blocks_n_free(s->kv)) &&
               evict_entry(s, -1)) {}
        DS_ASSERT(ds_state_slots_n_free(s->slots) > 0 && need <= ds_kv_blocks_n_free(s->kv));
        int slot = ds_state_slots_alloc(s->slots);
        DS_ASSERT(slot >= 0 && ds_kv_blocks_held(s->kv, slot) == 0);
        admit(s, q, slot, 0, take, target);
        *budget -= take;
    }
}

const ds_sched_plan *ds_scheduler_schedule(ds_scheduler *s) {
    ds_sched_plan *p = &s->plan;
    s->step++; /* sequences of earlier plans are out of this one (steps start at 1) */
    p->n_items = p->n_tokens = p->n_out = p->n_preempted = 0;

    int budget = s->max_num_batched_tokens;
    plan_running(s, true, &budget);
    plan_running(s, false, &budget);
    /* After a preemption the pool is short: admitting now would only evict again (vLLM does
     * the same). */
    if (p->n_preempted == 0) plan_waiting(s, &budget);
    DS_ASSERT(budget >= 0 && p->n_tokens + budget == s->max_num_batched_tokens);
    return p;
}
