/* reorder: a ring of `capacity` slots indexed by seq % capacity. */
#include "reorder.h"

#include <stdlib.h>

#include "pg_error.h"

typedef struct rslot {
    char *data;   /* NULL = empty */
    size_t len;
} rslot;

struct cli_reorder {
    rslot *ring;  /* [cap]: slot of seq is ring[seq % cap], valid for next <= seq < next + cap */
    size_t cap;
    uint64_t next;
    size_t held;
};

int cli_reorder_create(cli_reorder **out, size_t capacity)
{
    *out = NULL;
    if (capacity == 0)
        return PG_EINVAL;
    cli_reorder *r = calloc(1, sizeof *r);
    if (!r)
        return PG_ENOMEM;
    r->ring = calloc(capacity, sizeof *r->ring);
    if (!r->ring) {
        free(r);
        return PG_ENOMEM;
    }
    r->cap = capacity;
    *out = r;
    return PG_OK;
}

void cli_reorder_destroy(cli_reorder *r)
{
    if (!r)
        return;
    for (size_t k = 0; k < r->cap; k++)
        free(r->ring[k].data);
    free(r->ring);
    free(r);
}

bool cli_reorder_can_admit(const cli_reorder *r, uint64_t seq)
{
    return seq >= r->next && seq - r->next < r->cap;
}

int cli_reorder_put(cli_reorder *r, uint64_t seq, char *data, size_t len)
{
    if (!cli_reorder_can_admit(r, seq))
        return PG_EINVAL;
    rslot *s = &r->ring[seq % r->cap];
    if (s->data)
        return PG_EINVAL;
    s->data = data;
    s->len = len;
    r->held++;
    return PG_OK;
}

bool cli_reorder_pop_next(cli_reorder *r, char **data, size_t *len)
{
    rslot *s = &r->ring[r->next % r->cap];
    if (!s->data)
        return false;
    *data = s->data;
    *len = s->len;
    s->data = NULL;
    r->held--;
    r->next++;
    return true;
}

bool cli_reorder_pop_any(cli_reorder *r, char **data, size_t *len)
{
    if (r->held == 0)
        return false;
    while (!r->ring[r->next % r->cap].data)
        r->next++;
    return cli_reorder_pop_next(r, data, len);
}

void cli_reorder_skip_next(cli_reorder *r)
{
    rslot *s = &r->ring[r->next % r->cap];
    if (s->data) {
        free(s->data);
        s->data = NULL;
        r->held--;
    }
    r->next++;
}

uint64_t cli_reorder_next(const cli_reorder *r) { return r->next; }
size_t cli_reorder_held(const cli_reorder *r) { return r->held; }
