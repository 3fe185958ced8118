/* scheduler: FCFS continuous batching with chunked prefill and preemption
 * by recomputation (see scheduler.h). */
#include "scheduler.h"

#include <assert.h>
#include <stdlib.h>

#include "pooling.h"

typedef struct req_list {
    request *head, *tail;
    int32_t n;
} req_list;

struct scheduler {
    scheduler_params p;
    kv_pool *pool;
    int32_t block_size;
    req_list running, waiting;
    sched_entry *entries;   /* [max_num_seqs] */
    int32_t *cow;           /* [max_num_seqs][2] */
    int32_t *hits;          /* [max blocks of one sequence] */
    request *children[SAMPLING_PARAMS_MAX_N]; /* fan_out scratch */
    int32_t max_blocks;
};

static void list_push_back(req_list *l, request *r)
{
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r; else l->head = r;
    l->tail = r;
    l->n++;
}

static void list_push_front(req_list *l, request *r)
{
    r->prev = NULL;
    r->next = l->head;
    if (l->head) l->head->prev = r; else l->tail = r;
    l->head = r;
    l->n++;
}

static void list_remove(req_list *l, request *r)
{
    if (r->prev) r->prev->next = r->next; else l->head = r->next;
    if (r->next) r->next->prev = r->prev; else l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

int scheduler_create(scheduler **out, const scheduler_params *p, kv_pool *pool, pg_error *err)
{
    *out = NULL;
    scheduler *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->pool = pool;
    s->block_size = kv_pool_block_size(pool);
    s->max_blocks = (p->max_model_len + s->block_size - 1) / s->block_size;
    s->entries = calloc((size_t)p->max_num_seqs, sizeof *s->entries);
    s->cow = calloc((size_t)p->max_num_seqs * 2, sizeof *s->cow);
    s->hits = calloc((size_t)s->max_blocks + 1, sizeof *s->hits);
    if (!s->entries || !s->cow || !s->hits) goto oom;
    *out = s;
    return PG_OK;
oom:
    scheduler_destroy(s);
    return pg_error_set(err, PG_ENOMEM, "scheduler: out of memory");
}

void scheduler_destroy(scheduler *s)
{
    if (!s) return;
    free(s->entries);
    free(s->cow);
    free(s->hits);
    free(s);
}

void scheduler_add(scheduler *s, request *r) { list_push_back(&s->waiting, r); }

void scheduler_remove(scheduler *s, request *r) { list_remove(&s->running, r); }
void scheduler_remove_waiting(scheduler *s, request *r) { list_remove(&s->waiting, r); }

void scheduler_remove_either(scheduler *s, request *r)
{
    for (request *w = s->waiting.head; w; w = w->next)
        if (w == r) {
            list_remove(&s->waiting, r);
            return;
        }
    list_remove(&s->running, r);
}

int32_t scheduler_num_running(const scheduler *s) { return s->running.n; }
int32_t scheduler_num_waiting(const scheduler *s) { return s->waiting.n; }
request *scheduler_running(const scheduler *s) { return s->running.head; }
request *scheduler_waiting(const scheduler *s) { return s->waiting.head; }

int32_t scheduler_running_seqs(const scheduler *s)
{
    int32_t n = 0;
    for (const request *r = s->running.head; r; r = r->next) n += request_seq_slots(r);
    return n;
}

static bool shared_prompt(const scheduler *s) { return s->p.layout == KV_LAYOUT_PAGED; }

/* Releases every block of r and sends it to the front of the waiting queue. */
static void preempt(scheduler *s, request *r)
{
    for (int32_t i = 0; i < r->n; i++) {
        sequence *q = &r->seqs[i];
        kv_pool_table_release(s->pool, q->table);
        q->num_computed = 0;
    }
    r->forked = false;
    request_root(r)->n_preemptions++;
    list_remove(&s->running, r);
    list_push_front(&s->waiting, r);
}

/* Whether r prefills one token a step: prompt logprobs on the per-step
 * path (scheduler_params plp_one_per_step); otherwise its chunks are as
 * any request's and every row of a chunk gets logits (engine forward_rows). */
static bool one_row(const scheduler *s, const request *r)
{
    return r->plp && s->p.plp_one_per_step;
}

/* The tokens of q below end that are known: a placeholder (the overlapped
 * loop's, sequence_push_placeholder) is scheduled but not committed — its
 * block's hash would name a token not sampled yet; the engine commits it
 * once the id is in (engine_overlap.c). */
static int32_t known_end(const sequence *q, int32_t end)
{
    int32_t known = q->n_tokens - q->n_placeholder;
    return end < known ? end : known;
}

static void add_entry(sched_step *out, sequence *q, int32_t n_new, int32_t target)
{
    sched_entry *e = &out->entries[out->n_entries++];
    e->seq = q;
    e->n_new = n_new;
    e->samples = target == q->n_tokens && q->num_computed + n_new == q->n_tokens;
    out->n_tokens += n_new;
}

/* Schedules the live sequences of running request r. Returns false when r
 * itself had to be preempted. */
static bool schedule_running(scheduler *s, request *r, sched_step *out, int32_t *budget)
{
    int32_t first_entry = out->n_entries, first_cow = out->n_cow, tokens_before = out->n_tokens;
    for (int32_t i = 0; i < r->n && *budget > 0; i++) {
        sequence *q = &r->seqs[i];
        int32_t target = request_seq_target(r, q, shared_prompt(s));
        int32_t n_new = target - q->num_computed;
        if (n_new <= 0) continue;
        if (n_new > *budget) n_new = *budget;
        if (one_row(s, r) && q->num_computed < r->n_prompt) n_new = 1; /* a row a step */
        for (;;) {
            int32_t src, dst;
            int rc = kv_pool_allocate(s->pool, q->table, NULL, 0, n_new, &src, &dst);
            if (rc == PG_OK) {
                if (src >= 0) {
                    out->cow[2 * out->n_cow] = src;
                    out->cow[2 * out->n_cow + 1] = dst;
                    out->n_cow++;
                }
                break;
            }
            assert(rc == PG_ENOSPACE);
            request *victim = s->running.tail;
            if (victim == r) {
                /* undo what r got this step, then preempt it */
                out->n_entries = first_entry;
                out->n_cow = first_cow;
                out->n_tokens = tokens_before;
                preempt(s, r);
                out->n_preempted++;
                return false;
            }
            preempt(s, victim);
            out->n_preempted++;
        }
        add_entry(out, q, n_new, target);
        *budget -= n_new;
    }
    /* r keeps what it got: its blocks full by the end of this step become
     * findable now (an admission later in this step may share them) */
    for (int32_t i = first_entry; i < out->n_entries; i++) {
        const sched_entry *en = &out->entries[i];
        kv_pool_commit(s->pool, en->seq->table, en->seq->tokens,
                       known_end(en->seq, en->seq->num_computed + en->n_new));
    }
    return true;
}

/* Drops q's blocks that no query from position q->num_computed on reads
 * (sliding window; see scheduler.h). */
static void drop_out_of_window(scheduler *s, sequence *q)
{
    if (s->p.sliding_window <= 0 || s->p.layout != KV_LAYOUT_PAGED || q->table < 0) return;
    kv_pool_drop_before(s->pool, q->table, q->num_computed - s->p.sliding_window + 1);
}

/* Whether admitting r keeps the running requests' distinct adapters
 * within max_loras (scheduler.h). */
static bool lora_fits(const scheduler *s, const request *r)
{
    const int32_t a = r->sp.lora;
    if (s->p.max_loras <= 0 || a == 0) return true;
    int32_t distinct = 0;
    for (const request *x = s->running.head; x; x = x->next) {
        const int32_t b = x->sp.lora;
        if (b == a) return true;
        if (b == 0) continue;
        bool seen = false;
        for (const request *y = s->running.head; y != x && !seen; y = y->next) seen = y->sp.lora == b;
        distinct += !seen;
    }
    return distinct < s->p.max_loras;
}

/* Tries to admit the head of the waiting queue; false when it cannot. */
static bool admit(scheduler *s, request *r, sched_step *out, int32_t *budget, int32_t *n_seqs)
{
    int32_t bs = s->block_size;
    if (*n_seqs + request_seq_slots(r) > s->p.max_num_seqs) return false;
    if (!lora_fits(s, r)) return false;
    if (s->p.layout == KV_LAYOUT_CONTIGUOUS) {
        int32_t need = r->n_live * s->max_blocks;
        if (need > kv_pool_num_free(s->pool)) return false;
        for (int32_t i = 0; i < r->n; i++) {
            sequence *q = &r->seqs[i];
            if (q->finished) continue;
            int rc = kv_pool_reserve(s->pool, q->table, s->max_blocks);
            assert(rc == PG_OK);
            (void)rc;
            int32_t n_new = q->n_tokens < *budget ? q->n_tokens : *budget;
            if (one_row(s, r) && n_new > 1) n_new = 1; /* prompt logprobs: a row a step */
            if (n_new <= 0) continue;
            rc = kv_pool_allocate(s->pool, q->table, NULL, 0, n_new, NULL, NULL);
            assert(rc == PG_OK);
            add_entry(out, q, n_new, q->n_tokens);
            *budget -= n_new;
        }
    } else {
        sequence *q = request_leader(r);
        int32_t target = request_seq_target(r, q, true);
        int32_t max_hit_blocks = (target - 1) / bs; /* the last token is always computed */
        /* prompt logprobs need the rows of positions prompt_logprobs_from - 1
         * on: hits only on blocks wholly before it (a cached block holds K/V,
         * not rows), none on the one-row-a-step path or without a start
         * (vLLM's skip_reading_prefix_cache); mean and cls pooling need every
         * prompt row: no hit at all */
        if (r->plp) {
            int32_t cap = one_row(s, r) || r->plp_from < 1 ? 0 : (r->plp_from - 1) / bs;
            if (cap < max_hit_blocks) max_hit_blocks = cap;
        }
        bool all_rows = request_root(r)->pooler && pooler_needs_all_rows(request_root(r)->pooler);
        int32_t n_hits = all_rows ? 0 : kv_pool_match_prefix_key(s->pool, (uint32_t)r->sp.lora, q->tokens,
                                                                     max_hit_blocks, s->hits);
        int32_t n_new = target - n_hits * bs;
        if (n_new > *budget) n_new = *budget;
        if (one_row(s, r) && n_new > 1) n_new = 1; /* a row a step */
        if (n_hits > 0 && s->p.sliding_window > 0 &&
            !kv_pool_can_allocate(s->pool, q->table, s->hits, n_hits, n_new)) {
            /* the hits are referenced before those behind the window are
             * dropped again: in a pool sized for windows, recompute instead */
            n_hits = 0;
            n_new = target < *budget ? target : *budget;
            if (one_row(s, r) && n_new > 1) n_new = 1;
        }
        if (!kv_pool_can_allocate(s->pool, q->table, s->hits, n_hits, n_new)) return false;
        if (s->p.watermark_blocks > 0 && s->running.n > 0 &&
            kv_pool_free_after(s->pool, q->table, s->hits, n_hits, target - n_hits * bs) <
                s->p.watermark_blocks)
            return false;
        int rc = kv_pool_allocate(s->pool, q->table, s->hits, n_hits, n_new, NULL, NULL);
        assert(rc == PG_OK);
        (void)rc;
        q->num_computed = n_hits * bs;
        /* the blocks this chunk fills are findable from now on (a request
         * admitted after this one in the same step shares them) */
        kv_pool_commit(s->pool, q->table, q->tokens, known_end(q, q->num_computed + n_new));
        drop_out_of_window(s, q); /* prefix hits behind the first query's window */
        if (s->p.prefix_caching) out->prefix_queries += (uint64_t)max_hit_blocks;
        out->prefix_hits += (uint64_t)n_hits;
        add_entry(out, q, n_new, target);
        *budget -= n_new;
    }
    *n_seqs += request_seq_slots(r);
    list_remove(&s->waiting, r);
    list_push_back(&s->running, r);
    out->n_admitted++;
    return true;
}

/* Whether the waiting request r (the queue head) runs as independent
 * children instead of one group (see scheduler.h). */
static bool should_fan_out(const scheduler *s, const request *r, int32_t n_seqs)
{
    if (r->parent || r->beam || r->n_live < 2) return false;
    if (r->must_fan_out || r->n_live > s->p.max_num_seqs) return true;
    /* the group would wait for sequence slots while some are free: its
     * children start now and lose no sharing when the prompt's full blocks
     * are found in the prefix cache (contiguous KV shares nothing anyway) */
    return n_seqs < s->p.max_num_seqs && n_seqs + r->n_live > s->p.max_num_seqs &&
           (s->p.prefix_caching || s->p.layout == KV_LAYOUT_CONTIGUOUS);
}

/* Replaces the waiting head r by its children, in index order. */
static int fan_out(scheduler *s, request *r, pg_error *err)
{
    int32_t n;
    if (request_fan_out(r, s->children, &n))
        return pg_error_set(err, PG_ENOMEM, "scheduler: out of memory splitting request %llu",
                            (unsigned long long)r->id);
    list_remove(&s->waiting, r);
    for (int32_t k = n - 1; k >= 0; k--) list_push_front(&s->waiting, s->children[k]);
    return PG_OK;
}

int scheduler_schedule(scheduler *s, sched_step *out, pg_error *err)
{
    out->entries = s->entries;
    out->cow = s->cow;
    out->n_entries = out->n_cow = out->n_tokens = 0;
    out->n_preempted = out->n_admitted = 0;
    out->prefix_queries = out->prefix_hits = 0;
    int32_t budget = s->p.max_num_batched_tokens;
    /* blocks behind the window are free before anything is allocated */
    for (request *r = s->running.head; r; r = r->next)
        for (int32_t i = 0; i < r->n; i++)
            if (!r->seqs[i].finished) drop_out_of_window(s, &r->seqs[i]);
    /* victims come off the tail, so r->next is read after serving r */
    for (request *r = s->running.head; r && budget > 0; r = r->next)
        if (!schedule_running(s, r, out, &budget)) break; /* r was the last one */
    if (out->n_preempted > 0) return PG_OK;
    int32_t n_seqs = scheduler_running_seqs(s);
    while (s->waiting.head && budget > 0) {
        if (should_fan_out(s, s->waiting.head, n_seqs)) {
            int rc = fan_out(s, s->waiting.head, err);
            if (rc) return rc;
            continue;
        }
        if (!admit(s, s->waiting.head, out, &budget, &n_seqs)) break;
    }
    return PG_OK;
}
