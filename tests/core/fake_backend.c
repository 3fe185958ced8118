/* fake_backend: a recording, checking stand-in for the model (see fake_backend.h). */
#include "fake_backend.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_pool.h"

#define FAKE_MAX_SEQS 64

typedef struct fake_slot {
    int32_t token, position;
    int64_t writer;            /* sequence id, -1 = never written */
    uint64_t prefix;           /* prefix_step() over the writer's tokens 0..position */
    uint32_t epoch;            /* the block's kv_pool epoch when written */
} fake_slot;

typedef struct fake_hist {
    int32_t *t;                /* tokens fed at positions n_prompt + i */
    int32_t n, cap;
} fake_hist;

typedef struct fake_req {
    int32_t *prompt;
    int32_t n_prompt;
    fake_hist seqs[FAKE_MAX_SEQS];
} fake_req;

struct fake_backend {
    fake_backend_params p;
    fake_slot *store;          /* [num_blocks * block_size] */
    fake_req *reqs;            /* [n_reqs] by request id */
    int32_t n_reqs;
    const engine *e;
    char err[512];
    bool failed;
    fake_backend_counts c;
    fake_backend_step_fn on_step;
    void *on_step_user;
};

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

#define FAKE_PREFIX_ROOT UINT64_C(0x243f6a8885a308d3)

/* Extends a hash of tokens 0..pos-1 by the token at pos. */
static uint64_t prefix_step(uint64_t h, int32_t token)
{
    return mix(h + (uint64_t)(uint32_t)token * UINT64_C(0x9e3779b97f4a7c15) + 1u);
}

static int fail(fake_backend *f, pg_error *err, const char *fmt, ...)
{
    if (!f->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->err, sizeof f->err, fmt, ap);
        va_end(ap);
        f->failed = true;
    }
    return pg_error_set(err, PG_EINVAL, "fake backend: %s", f->err);
}

fake_backend *fake_backend_create(const fake_backend_params *p)
{
    fake_backend *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->p = *p;
    size_t n = (size_t)p->num_blocks * (size_t)p->block_size;
    f->store = malloc(n * sizeof *f->store);
    if (!f->store) {
        free(f);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) f->store[i] = (fake_slot){-1, -1, -1, 0, 0};
    return f;
}

void fake_backend_destroy(fake_backend *f)
{
    if (!f) return;
    for (int32_t r = 0; r < f->n_reqs; r++) {
        free(f->reqs[r].prompt);
        for (int k = 0; k < FAKE_MAX_SEQS; k++) free(f->reqs[r].seqs[k].t);
    }
    free(f->reqs);
    free(f->store);
    free(f);
}

void fake_backend_attach(fake_backend *f, const engine *e) { f->e = e; }
const char *fake_backend_error(const fake_backend *f) { return f->failed ? f->err : NULL; }
fake_backend_counts fake_backend_get_counts(const fake_backend *f) { return f->c; }

void fake_backend_on_step(fake_backend *f, fake_backend_step_fn fn, void *user)
{
    f->on_step = fn;
    f->on_step_user = user;
}

void fake_backend_set_prompt(fake_backend *f, uint64_t request_id, const int32_t *prompt,
                             int32_t n)
{
    if ((int64_t)request_id >= f->n_reqs) {
        int32_t nn = (int32_t)request_id + 1;
        if (nn < 2 * f->n_reqs) nn = 2 * f->n_reqs;
        fake_req *nr = realloc(f->reqs, (size_t)nn * sizeof *nr);
        if (!nr) abort();
        memset(nr + f->n_reqs, 0, (size_t)(nn - f->n_reqs) * sizeof *nr);
        f->reqs = nr;
        f->n_reqs = nn;
    }
    fake_req *r = &f->reqs[request_id];
    r->prompt = malloc((size_t)n * sizeof *prompt);
    if (!r->prompt) abort();
    memcpy(r->prompt, prompt, (size_t)n * sizeof *prompt);
    r->n_prompt = n;
}

/* The token sequence sid must have at position pos, or -1 if unknown yet. */
static int32_t expected_token(const fake_backend *f, uint64_t sid, int32_t pos)
{
    uint64_t rid = sid >> 8;
    const fake_req *r = &f->reqs[rid];
    if (pos < r->n_prompt) return r->prompt[pos];
    const fake_hist *h = &r->seqs[sid & 0xff];
    int32_t i = pos - r->n_prompt;
    return i < h->n ? h->t[i] : -1;
}

/* Records (or checks) that sequence sid feeds token at pos. */
static int feed(fake_backend *f, uint64_t sid, int32_t pos, int32_t token, pg_error *err)
{
    uint64_t rid = sid >> 8;
    if ((int64_t)rid >= f->n_reqs || !f->reqs[rid].prompt)
        return fail(f, err, "request %llu has no registered prompt", (unsigned long long)rid);
    fake_req *r = &f->reqs[rid];
    if ((sid & 0xff) >= FAKE_MAX_SEQS) return fail(f, err, "sequence index too large");
    if (pos < r->n_prompt) {
        if (r->prompt[pos] != token)
            return fail(f, err, "seq %llx position %d: fed %d, prompt has %d",
                        (unsigned long long)sid, (int)pos, (int)token, (int)r->prompt[pos]);
        return PG_OK;
    }
    fake_hist *h = &r->seqs[sid & 0xff];
    int32_t i = pos - r->n_prompt;
    if (i < h->n) {
        if (h->t[i] != token)
            return fail(f, err, "seq %llx position %d: recomputation fed %d, earlier %d",
                        (unsigned long long)sid, (int)pos, (int)token, (int)h->t[i]);
        return PG_OK;
    }
    if (i != h->n)
        return fail(f, err, "seq %llx: position %d fed before position %d",
                    (unsigned long long)sid, (int)pos, (int)(r->n_prompt + h->n));
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 16;
        h->t = realloc(h->t, (size_t)h->cap * sizeof *h->t);
        if (!h->t) abort();
    }
    h->t[h->n++] = token;
    return PG_OK;
}

static int fake_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    fake_backend *f = ctx;
    const int32_t bs = f->p.block_size;
    const kv_pool *pool = engine_kv_pool(f->e);
    const uint64_t *sids = engine_step_seq_ids(f->e);
    f->c.steps++;
    f->c.tokens += (uint64_t)b->num_tokens;
    for (int32_t s = 0; f->p.follow_tokens && s < b->num_seqs; s++) {
        uint64_t rid = sids[s] >> 8;
        if ((int64_t)rid >= f->n_reqs || !f->reqs[rid].prompt || (sids[s] & 0xff) >= FAKE_MAX_SEQS)
            return fail(f, err, "seq %llx: no registered prompt", (unsigned long long)sids[s]);
        int32_t n;
        const int32_t *toks = engine_step_seq_tokens(f->e, s, &n);
        fake_req *r = &f->reqs[rid];
        fake_hist *h = &r->seqs[sids[s] & 0xff];
        int32_t n_gen = n - r->n_prompt;
        if (n_gen > h->cap) {
            h->cap = n_gen + 16;
            h->t = realloc(h->t, (size_t)h->cap * sizeof *h->t);
            if (!h->t) abort();
        }
        if (n_gen > 0) memcpy(h->t, toks + r->n_prompt, (size_t)n_gen * sizeof *h->t);
        h->n = n_gen > 0 ? n_gen : 0;
    }
    if (b->num_tokens < 1 || b->num_seqs < 1 || b->block_size != bs || b->query_start[0] != 0 ||
        b->query_start[b->num_seqs] != b->num_tokens)
        return fail(f, err, "malformed batch: T %d S %d bs %d", (int)b->num_tokens,
                    (int)b->num_seqs, (int)b->block_size);
    if (f->on_step) f->on_step(f->on_step_user, sids, b->query_start, b->positions, b->num_seqs);
    int32_t max_seq = 0, max_q = 0, l = 0;
    /* pass 1: shape checks and KV writes (as kv_write precedes attention) */
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t q0 = b->query_start[s], q1 = b->query_start[s + 1];
        int32_t len = b->seq_lens[s], ql = q1 - q0;
        if (ql < 1 || len < ql) return fail(f, err, "seq row %d: q_len %d, seq_len %d", (int)s, (int)ql, (int)len);
        if (len > max_seq) max_seq = len;
        if (ql > max_q) max_q = ql;
        if ((len + bs - 1) / bs > b->block_table_stride)
            return fail(f, err, "seq row %d: %d tokens do not fit stride %d", (int)s, (int)len,
                        (int)b->block_table_stride);
        for (int s2 = 0; s2 < s; s2++)
            if (sids[s2] == sids[s]) return fail(f, err, "sequence twice in one batch");
        const int32_t *bt = &b->block_tables[(size_t)s * (size_t)b->block_table_stride];
        /* the prefix before the first query token was fed in earlier steps */
        uint64_t ph = FAKE_PREFIX_ROOT;
        for (int32_t pos = 0; pos < len - ql; pos++) {
            int32_t want = expected_token(f, sids[s], pos);
            if (want < 0)
                return fail(f, err, "seq %llx: context position %d was never fed",
                            (unsigned long long)sids[s], (int)pos);
            ph = prefix_step(ph, want);
        }
        for (int32_t t = q0; t < q1; t++) {
            int32_t pos = len - ql + (t - q0);
            if (b->positions[t] != pos)
                return fail(f, err, "token %d: position %d, expected %d", (int)t,
                            (int)b->positions[t], (int)pos);
            int32_t blk = bt[pos / bs];
            if (blk < 0 || blk >= f->p.num_blocks)
                return fail(f, err, "token %d: block %d out of range", (int)t, (int)blk);
            if (b->slots[t] != blk * bs + pos % bs)
                return fail(f, err, "token %d: slot %d, block table says %d", (int)t,
                            (int)b->slots[t], (int)(blk * bs + pos % bs));
            int32_t ref = kv_pool_block_ref(pool, blk);
            if (ref != 1 && !(ref > 1 && kv_pool_block_cached(pool, blk)))
                return fail(f, err, "seq %llx writes position %d into block %d with ref %d",
                            (unsigned long long)sids[s], (int)pos, (int)blk, (int)ref);
            int rc = feed(f, sids[s], pos, b->token_ids[t], err);
            if (rc) return rc;
            ph = prefix_step(ph, b->token_ids[t]);
            f->store[b->slots[t]] = (fake_slot){b->token_ids[t], pos, (int64_t)sids[s], ph,
                                                kv_pool_block_epoch(pool, blk)};
            f->c.slot_writes++;
        }
        if (l < b->num_logits && b->logits_rows[l] < q1) {
            if (b->logits_rows[l] != q1 - 1)
                return fail(f, err, "logits row %d is not a sequence's last token", (int)l);
            l++;
        }
    }
    if (l != b->num_logits || max_seq != b->max_seq_len || max_q != b->max_query_len)
        return fail(f, err, "batch: logits rows %d/%d, max_seq_len %d/%d, max_query_len %d/%d",
                    (int)l, (int)b->num_logits, (int)b->max_seq_len, (int)max_seq,
                    (int)b->max_query_len, (int)max_q);
    /* every block in the prefix cache holds K/V written since the block was
     * last taken: one committed before it was computed (or whose step was
     * undone) would be shared unwritten */
    for (int32_t blk = 0; blk < f->p.num_blocks; blk++) {
        if (!kv_pool_block_cached(pool, blk)) continue;
        for (int32_t i = 0; i < bs; i++) {
            const fake_slot *sl = &f->store[(size_t)blk * (size_t)bs + (size_t)i];
            if (sl->writer < 0 || sl->epoch != kv_pool_block_epoch(pool, blk) ||
                sl->position % bs != i)
                return fail(f, err, "block %d is in the prefix cache but its slot %d was not "
                            "written since the block was taken", (int)blk, (int)i);
        }
    }
    /* pass 2: attention reads. The last query token's context (0..len-1)
     * covers every other query token's, so it is read in full once. */
    l = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t len = b->seq_lens[s];
        const int32_t *bt = &b->block_tables[(size_t)s * (size_t)b->block_table_stride];
        uint64_t h = mix(f->p.salt ^ (uint64_t)(len - 1));
        uint64_t ph = FAKE_PREFIX_ROOT;
        /* sliding window: the first query token reads from lo on, so may a
         * table drop blocks wholly below lo (null entries); none above */
        int32_t first_q = len - (b->query_start[s + 1] - b->query_start[s]);
        int32_t lo = f->p.attn_window > 0 && first_q - f->p.attn_window + 1 > 0
                         ? first_q - f->p.attn_window + 1 : 0;
        if (f->p.attn_window > 0) {
            /* blocks held now against the bound of the window: the blocks
             * touching [lo, len) (ceil(W/B) + 1 + the chunk's) */
            int32_t held = 0, ql = len - first_q;
            for (int32_t k = 0; k < (len + bs - 1) / bs; k++) held += bt[k] >= 0;
            int32_t bound = (f->p.attn_window - 1 + ql + bs - 1) / bs + 1;
            if (held > f->c.max_held_blocks) f->c.max_held_blocks = held;
            if (held - bound > f->c.max_held_over_bound) f->c.max_held_over_bound = held - bound;
        }
        for (int32_t pos = 0; pos < len; pos++) {
            int32_t want = expected_token(f, sids[s], pos);
            ph = prefix_step(ph, want);
            if (bt[pos / bs] < 0) {
                if (pos >= lo || (pos / bs + 1) * bs > lo)
                    return fail(f, err, "seq %llx: block table entry %d is null but holds "
                                "position %d (the queries read from %d on)",
                                (unsigned long long)sids[s], (int)(pos / bs), (int)pos, (int)lo);
                f->c.null_entries_skipped++;
                continue;
            }
            const fake_slot *sl = &f->store[bt[pos / bs] * bs + pos % bs];
            f->c.slot_reads++;
            if (sl->writer < 0)
                return fail(f, err, "seq %llx reads position %d from a never written slot",
                            (unsigned long long)sids[s], (int)pos);
            if (sl->epoch != kv_pool_block_epoch(pool, bt[pos / bs]))
                return fail(f, err, "seq %llx reads position %d from a stale slot (written "
                            "by %llx before block %d was taken again)",
                            (unsigned long long)sids[s], (int)pos,
                            (unsigned long long)sl->writer, (int)bt[pos / bs]);
            if (sl->position != pos || sl->token != want)
                return fail(f, err, "seq %llx position %d reads (token %d, position %d) written "
                            "by %llx, expected token %d", (unsigned long long)sids[s], (int)pos,
                            (int)sl->token, (int)sl->position, (unsigned long long)sl->writer,
                            (int)want);
            if (sl->prefix != ph)
                return fail(f, err, "seq %llx position %d reads a slot written by %llx after "
                            "a different prefix", (unsigned long long)sids[s], (int)pos,
                            (unsigned long long)sl->writer);
            if (pos >= len - f->p.window) h = mix(h ^ (uint64_t)(uint32_t)sl->token);
        }
        int32_t q1 = b->query_start[s + 1];
        if (l < b->num_logits && b->logits_rows[l] == q1 - 1) {
            float *row = logits + (size_t)l * (size_t)f->p.vocab_size;
            for (int32_t v = 0; v < f->p.vocab_size; v++) {
                uint64_t z = mix(h + (uint64_t)v * UINT64_C(0x9e3779b97f4a7c15));
                row[v] = (float)(z % 2001) * 0.004f - 4.0f; /* [-4, 4] */
            }
            l++;
        }
    }
    return PG_OK;
}

static int fake_copy_blocks(void *ctx, const int32_t *src_dst, int32_t n_pairs, pg_error *err)
{
    fake_backend *f = ctx;
    const kv_pool *pool = engine_kv_pool(f->e);
    const int32_t bs = f->p.block_size;
    for (int32_t k = 0; k < n_pairs; k++) {
        int32_t src = src_dst[2 * k], dst = src_dst[2 * k + 1];
        if (src < 0 || dst < 0 || src >= f->p.num_blocks || dst >= f->p.num_blocks || src == dst)
            return fail(f, err, "copy_blocks: bad pair %d -> %d", (int)src, (int)dst);
        if (kv_pool_block_ref(pool, dst) != 1 || kv_pool_block_ref(pool, src) < 1)
            return fail(f, err, "copy_blocks: %d (ref %d) -> %d (ref %d)", (int)src,
                        (int)kv_pool_block_ref(pool, src), (int)dst,
                        (int)kv_pool_block_ref(pool, dst));
        memcpy(&f->store[(size_t)dst * (size_t)bs], &f->store[(size_t)src * (size_t)bs],
               (size_t)bs * sizeof *f->store);
        for (int32_t i = 0; i < bs; i++)
            f->store[(size_t)dst * (size_t)bs + (size_t)i].epoch = kv_pool_block_epoch(pool, dst);
        f->c.block_copies++;
    }
    return PG_OK;
}

engine_backend fake_backend_iface(fake_backend *f)
{
    engine_backend be = {.ctx = f, .vocab_size = f->p.vocab_size, .forward = fake_forward,
                         .copy_blocks = fake_copy_blocks};
    return be;
}

int fake_backend_add_requests(fake_backend *f, engine *e, int nreq, int32_t vocab,
                              sampling_params (*params_of)(int k), pg_error *err)
{
    for (int k = 0; k < nreq; k++) {
        int32_t ids[10], n = 3 + k % 7;
        for (int32_t i = 0; i < n; i++)
            ids[i] = (int32_t)((k * 31 + i * 7 + 1) % vocab);
        sampling_params sp = params_of(k);
        uint64_t id;
        int rc = engine_add_request(e, ids, n, &sp, (void *)(intptr_t)k, &id, err);
        if (rc) {
            char why[sizeof err->msg];
            memcpy(why, err->msg, sizeof why);
            return pg_error_set(err, rc, "request %d: %s", k, why);
        }
        fake_backend_set_prompt(f, id, ids, n);
    }
    return 0;
}
