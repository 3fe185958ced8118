/* id_set: open-addressing hash set of byte strings (see id_set.h). */
#include "id_set.h"

#include <stdlib.h>
#include <string.h>

#include "pg_error.h"
#include "request_parse.h"

typedef struct slot {
    char *key;      /* NULL = empty */
    size_t len;
    uint64_t hash;
    int64_t value;
} slot;

struct cli_id_set {
    slot *slots;    /* [cap], cap a power of two */
    size_t cap, count;
};

cli_id_set *cli_id_set_create(void)
{
    cli_id_set *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cap = 64;
    s->slots = calloc(s->cap, sizeof *s->slots);
    if (!s->slots) {
        free(s);
        return NULL;
    }
    return s;
}

void cli_id_set_destroy(cli_id_set *s)
{
    if (!s)
        return;
    for (size_t k = 0; k < s->cap; k++)
        free(s->slots[k].key);
    free(s->slots);
    free(s);
}

static slot *find(const cli_id_set *s, const char *key, size_t len, uint64_t h)
{
    size_t mask = s->cap - 1;
    for (size_t k = (size_t)h & mask;; k = (k + 1) & mask) {
        slot *e = &s->slots[k];
        if (!e->key || (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0))
            return e;
    }
}

static int grow(cli_id_set *s)
{
    size_t ncap = s->cap * 2;
    slot *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return PG_ENOMEM;
    slot *old = s->slots;
    size_t ocap = s->cap;
    s->slots = ns;
    s->cap = ncap;
    for (size_t k = 0; k < ocap; k++)
        if (old[k].key)
            *find(s, old[k].key, old[k].len, old[k].hash) = old[k];
    free(old);
    return PG_OK;
}

int cli_id_set_add(cli_id_set *s, const char *key, size_t len, int64_t value, int64_t *existing)
{
    uint64_t h = cli_hash64(key, len);
    slot *e = find(s, key, len, h);
    if (e->key) {
        if (existing)
            *existing = e->value;
        return 0;
    }
    if ((s->count + 1) * 4 > s->cap * 3) {
        if (grow(s) != PG_OK)
            return PG_ENOMEM;
        e = find(s, key, len, h);
    }
    e->key = malloc(len + 1);
    if (!e->key)
        return PG_ENOMEM;
    memcpy(e->key, key, len);
    e->key[len] = '\0';
    e->len = len;
    e->hash = h;
    e->value = value;
    s->count++;
    return 1;
}

bool cli_id_set_has(const cli_id_set *s, const char *key, size_t len)
{
    return find(s, key, len, cli_hash64(key, len))->key != NULL;
}

bool cli_id_set_get(const cli_id_set *s, const char *key, size_t len, int64_t *value)
{
    const slot *e = find(s, key, len, cli_hash64(key, len));
    if (!e->key)
        return false;
    *value = e->value;
    return true;
}

size_t cli_id_set_count(const cli_id_set *s) { return s->count; }
