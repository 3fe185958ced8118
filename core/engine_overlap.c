/* engine_overlap: the engine loop over an asynchronous backend
 * (engine_backend step_defer / step_wait: the CUDA executor) — the host
 * schedules and builds step N+1 while the device runs step N, and only
 * what reads N's sampled ids waits for them (vLLM v1's async scheduling,
 * vllm/v1/core/sched/async_scheduler.py: one output placeholder per
 * request scheduled for a token not sampled yet; SGLang's overlap
 * scheduler, scheduler.py event_loop_overlap).
 *
 * One engine_step call:
 *   launch N (only when no step is in flight: the first, or after a step
 *     that could not be overlapped);
 *   ahead: every sequence sampling in N that will not stop on a length cap
 *     it already knows gets a placeholder token (sequence_push_placeholder),
 *     then N+1 is scheduled (scheduler_schedule: admissions, preemptions,
 *     block allocation for the placeholder's slot; a block whose last token
 *     is a placeholder is not committed to the prefix cache) and built
 *     (positions, slots, block tables, seq_lens, logits rows: all known);
 *   wait for N (step_wait), take the placeholders off, finish N: sampling
 *     of the rows the host samples, stop rules, detokenization, retiring;
 *   N+1's entries of sequences that finished in N are removed, and then
 *     N+1 is built again (else only each entry's last token id is patched
 *     in); the blocks of its placeholders are committed; the grammar masks,
 *     penalties, seeds of N+1's device rows are marked (they read N's ids);
 *     launch N+1, which stays in flight into the next call.
 *
 * Serial order for a step (nothing built ahead of it) when its finish needs
 * the arrays of its own build, or forks: prompt logprob rows, embedding
 * requests, a group forking right after its prompt (engine_phase_needs_serial).
 * Everything else overlaps: greedy, sampled (seeded), penalties,
 * min_tokens, logprobs, stop ids and strings, grammars, n > 1 after its
 * fork, preemption: none of them changes what N+1 schedules, only how its
 * rows are sampled, and that is set up after N's ids are in.
 *
 * Blocks: a stream runs its steps in order, so a block N writes and N+1's
 * schedule frees (a preemption) or hands to another sequence is written by
 * N first, then by N+1. A sequence finished by N has no row in N+1 (removed
 * above, its blocks released in N's finish before N+1 is launched).
 *
 * Output bytes are the serial loop's: the batches differ (a sequence ending
 * in N held its blocks and a seat through N+1's schedule; a preemption may
 * pick another victim), every row is batch-invariant (ARCHITECTURE.md), and
 * a sequence's RNG moves only when its row is accepted. */
#include <stdlib.h>
#include <string.h>

#include "engine_phase.h"
#include "sequence.h"

struct engine_overlap {
    sched_entry *ent[2];       /* [max_seqs] the two steps' entries */
    int32_t *cow[2];           /* [max_seqs][2] */
    sched_step cur, next;      /* cur: launched; next: built ahead */
    int cur_buf;               /* which of ent/cow cur uses */
    step_batch b_cur, b_next;
    bool launched;             /* cur was launched and is not finished */
    bool deferred;             /* ... with step_defer: step_wait comes */
    sequence **ph;             /* [max_seqs] sequences holding a placeholder */
    int32_t n_ph, max_seqs;
};

int engine_overlap_create(engine_overlap **out, int32_t max_seqs, pg_error *err)
{
    engine_overlap *ov = calloc(1, sizeof *ov);
    if (ov) {
        ov->max_seqs = max_seqs;
        for (int i = 0; i < 2; i++) {
            ov->ent[i] = calloc((size_t)max_seqs, sizeof *ov->ent[i]);
            ov->cow[i] = calloc((size_t)max_seqs * 2, sizeof *ov->cow[i]);
        }
        ov->ph = calloc((size_t)max_seqs, sizeof *ov->ph);
    }
    if (!ov || !ov->ent[0] || !ov->ent[1] || !ov->cow[0] || !ov->cow[1] || !ov->ph) {
        engine_overlap_destroy(ov);
        *out = NULL;
        return pg_error_set(err, PG_ENOMEM, "engine: out of memory for the overlapped loop");
    }
    *out = ov;
    return PG_OK;
}

void engine_overlap_destroy(engine_overlap *ov)
{
    if (!ov) return;
    for (int i = 0; i < 2; i++) {
        free(ov->ent[i]);
        free(ov->cow[i]);
    }
    free(ov->ph);
    free(ov);
}

/* A copy of the scheduler's step (its arrays are reused by the next call)
 * into buffer set `buf`. */
static void keep_step(engine_overlap *ov, sched_step *dst, const sched_step *src, int buf)
{
    *dst = *src;
    dst->entries = ov->ent[buf];
    dst->cow = ov->cow[buf];
    memcpy(dst->entries, src->entries, (size_t)src->n_entries * sizeof *src->entries);
    memcpy(dst->cow, src->cow, (size_t)src->n_cow * 2 * sizeof *src->cow);
}

static int launch_cur(engine_overlap *ov, engine *e, step_timer *tm, pg_error *err)
{
    bool async = true;
    int rc = engine_phase_launch(e, &ov->cur, &ov->b_cur, &async, tm, err);
    ov->launched = rc == PG_OK;
    ov->deferred = rc == PG_OK && async;
    return rc;
}

static void pop_placeholders(engine_overlap *ov)
{
    for (int32_t i = 0; i < ov->n_ph; i++) sequence_pop_placeholder(ov->ph[i]);
    ov->n_ph = 0;
}

/* Schedules and builds the step after cur while the device runs cur: a
 * placeholder for each sequence that samples in cur and goes on unless
 * its token stops it. *built: next holds entries and b_next is built. */
static int prepare_ahead(engine_overlap *ov, engine *e, step_timer *tm, bool *built, pg_error *err)
{
    *built = false;
    int rc;
    for (int32_t i = 0; i < ov->cur.n_entries; i++) {
        sequence *q = ov->cur.entries[i].seq;
        const request *r = q->req;
        if (!ov->cur.entries[i].samples || q->finished) continue;
        /* sequence_accept's length cap: the token of N is its last */
        if (q->n_tokens - r->n_prompt + 1 >= r->max_output) continue;
        if ((rc = sequence_push_placeholder(q, err))) return rc;
        ov->ph[ov->n_ph++] = q;
    }
    step_timer t2 = *tm; /* its schedule and metadata laps go to "ahead" */
    memset(t2.ph, 0, sizeof t2.ph);
    sched_step st;
    if ((rc = engine_phase_schedule(e, &st, &t2, err))) return rc;
    keep_step(ov, &ov->next, &st, 1 - ov->cur_buf);
    if (ov->next.n_entries > 0) {
        engine_phase_build(e, &ov->next, &ov->b_next);
        *built = true;
        engine_phase_count_ahead(e, false);
    }
    engine_timer_lap(e, &t2, SP_METADATA);
    tm->ph[SP_AHEAD] += t2.ph[SP_SCHEDULE] + t2.ph[SP_METADATA];
    tm->t = t2.t;
    return PG_OK;
}

int engine_overlap_step(engine_overlap *ov, engine *e, pg_error *err)
{
    step_timer tm;
    engine_timer_start(e, &tm);
    int rc;
    if (!ov->launched) {
        if (engine_num_unfinished(e) == 0) return PG_OK;
        sched_step st;
        if ((rc = engine_phase_schedule(e, &st, &tm, err))) return rc;
        if (st.n_entries == 0) return engine_phase_end(e, err); /* all preempted: readmit */
        keep_step(ov, &ov->cur, &st, ov->cur_buf);
        engine_phase_build(e, &ov->cur, &ov->b_cur);
        if ((rc = launch_cur(ov, e, &tm, err))) return rc;
    }
    /* N = cur is in flight (or, not deferred, already done) */
    bool ahead = ov->deferred && !engine_phase_needs_serial(e, &ov->cur), built = false;
    ov->next.n_entries = 0;
    ov->next.n_preempted = 0;
    if (ahead && (rc = prepare_ahead(ov, e, &tm, &built, err))) return rc;
    if (ov->deferred) {
        const engine_backend *be = engine_phase_backend(e);
        ov->deferred = false;
        rc = be->step_wait(be->ctx, err);
        /* the executor's wait and copies as it reports them, the rest of
         * the call as waiting too */
        double before = tm.ph[SP_WAIT];
        engine_timer_lap(e, &tm, SP_WAIT);
        double total = tm.ph[SP_WAIT] - before, exec = engine_timer_take_exec(e, &tm);
        tm.ph[SP_WAIT] -= total > exec ? exec : total;
        if (rc) {
            pop_placeholders(ov);
            ov->launched = false;
            return rc;
        }
    }
    pop_placeholders(ov); /* before N's ids are accepted in their place */
    ov->launched = false;
    int32_t dropped = 0;
    if ((rc = engine_phase_finish(e, &ov->cur, &ov->b_cur, ahead ? &ov->next : NULL, &dropped, &tm,
                                  err)))
        return rc;
    const step_batch b_done = ov->b_cur; /* for the profile */
    if ((rc = engine_phase_end(e, err))) return rc;
    if (built && ov->next.n_entries > 0) {
        ov->cur_buf = 1 - ov->cur_buf;
        ov->cur = ov->next;
        if (dropped > 0) { /* rows of sequences N finished: the batch without them */
            /* and no copy-on-write into a block they gave back */
            const kv_pool *pool = engine_phase_pool(e);
            int32_t n = 0;
            for (int32_t k = 0; k < ov->cur.n_cow; k++)
                if (kv_pool_block_ref(pool, ov->cur.cow[2 * k + 1]) > 0) {
                    ov->cur.cow[2 * n] = ov->cur.cow[2 * k];
                    ov->cur.cow[2 * n + 1] = ov->cur.cow[2 * k + 1];
                    n++;
                }
            ov->cur.n_cow = n;
            engine_phase_build(e, &ov->cur, &ov->b_cur);
            engine_phase_count_ahead(e, true);
        } else {
            ov->b_cur = ov->b_next;
            engine_phase_patch(e, &ov->cur, &ov->b_cur);
        }
        /* blocks whose last token was a placeholder enter the prefix cache
         * now that the token is known (the scheduler's commit, deferred) */
        kv_pool *pool = engine_phase_pool(e);
        for (int32_t i = 0; i < ov->cur.n_entries; i++) {
            const sequence *q = ov->cur.entries[i].seq;
            kv_pool_commit(pool, q->table, q->tokens, q->num_computed + ov->cur.entries[i].n_new);
        }
        if ((rc = launch_cur(ov, e, &tm, err))) return rc;
    }
    engine_timer_done(e, &tm, &b_done);
    return PG_OK;
}

void engine_overlap_drain(engine_overlap *ov, engine *e)
{
    if (ov->deferred) {
        const engine_backend *be = engine_phase_backend(e);
        pg_error ignored;
        (void)be->step_wait(be->ctx, &ignored);
    }
    pop_placeholders(ov);
    ov->deferred = false;
    ov->launched = false;
}
