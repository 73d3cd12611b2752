/* ackgroup.c -- the state of an acknowledged consumer group.
 *
 * WHAT IT HOLDS
 * =============
 *
 * A plain consumer group is one number, the next offset of its stream it
 * will deliver. An acknowledged group (docs/PROTOCOL.md, "Acknowledged
 * groups") also remembers what it delivered and nobody acknowledged yet, so
 * that a consumer that dies mid-batch loses nothing: its lease runs out and
 * the batch goes to the next reader.
 *
 * Offsets are dense and a read delivers consecutive offsets, so what is
 * pending is kept as *ranges*, never per message:
 *
 *   ag_group
 *   +----------------------------------------------------------------+
 *   | stream name ("jobs")       next = 1200                         |
 *   | totals: delivered, redelivered, acked, dropped                 |
 *   | ranges (sorted by start, disjoint, each >= 1 offset):          |
 *   |   [ 900.. 999]  deadline 1795468800000  owner 0  deliveries 2  |
 *   |   [1000..1099]  deadline 1795468830000  owner 1  deliveries 1  |
 *   |   [1100..1199]  deadline 1795468831000  owner 0  deliveries 1  |
 *   | owners: slot 0 "w1" (2 ranges), slot 1 "w2" (1 range)          |
 *   +----------------------------------------------------------------+
 *
 * Every offset below `next` was delivered at least once; an offset below
 * `next` and in no range was acknowledged (or dropped). Ranges are maximal:
 * two that touch differ in deadline, owner or delivery count (a lease
 * merges with a neighbour it equals). A range costs 32
 * bytes whatever its length; owner names are interned in a small table of
 * slots with a count of the ranges naming each, so a name is stored once
 * and its slot is freed (and reused) when its last range goes.
 *
 * OPERATIONS
 * ==========
 *
 *   ag_floor(f)         drop pending offsets < f (evicted), next = max(next, f)
 *   ag_pick(now, f, e)  the lowest range with deadline <= now holding offsets
 *                       in f..e-1 (the stream's readable ones), else from
 *                       max(next, f) to e: what to deliver (changes nothing)
 *   ag_lease(s, n, ..)  offsets s..s+n-1 become one range (deadline, owner,
 *                       deliveries), whatever they were; next = max(next, s+n)
 *   ag_ack(s, n)        offsets s..s+n-1 stop being pending
 *   ag_take(...)        a lease read in one call: pick, floor, lease
 *
 * Removing a span from the ranges trims the ranges at its two ends and
 * deletes the ones inside (a span strictly inside one range splits it, the
 * only way the number of ranges grows besides a lease), so each operation
 * is a binary search plus a memmove: O(log R + R) for R ranges, and R is
 * the number of batches in flight. The functions that allocate (a split, a
 * new range, a new owner name) reserve first, so AG_ERR_NOMEM leaves the
 * group as it was.
 *
 * ag_pick() must find the lowest *expired* range, which is not the lowest
 * range. The group keeps `min_deadline`, a lower bound of every range's
 * deadline (a lease lowers it; acknowledging or dropping only removes
 * ranges, so the bound stays valid). While now < min_deadline nothing has
 * expired and the pick costs O(1), the common case; otherwise it walks the
 * ranges in offset order up to the first expired one, and a walk that finds
 * none stores the exact minimum it saw.
 *
 * Deadlines are absolute unix milliseconds given by the caller (the
 * server's clock at the read plus the lease), so a replay of the same
 * operations (the AOF, a replica) rebuilds the same group whatever its
 * clock says.
 *
 * THE BLOB (ag_serialize / ag_load), little-endian:
 *
 *   offset  size  field
 *   ------  ----  -------------------------------------------------------
 *        0     4  magic "MNAG"
 *        4     1  format version (AG_FORMAT_VERSION = 1)
 *        5     3  zero
 *        8     8  next offset (<= 2^63)
 *       16     8  delivered
 *       24     8  redelivered
 *       32     8  acknowledged
 *       40     8  dropped
 *       48     8  R: number of ranges
 *       56     4  O: number of owners
 *       60     4  S: stream name length
 *       64     S  stream name
 *              O  owners: u32 length (<= AG_MAX_OWNER_BYTES), the name
 *         32 * R  ranges in offset order: u64 start, u64 count, i64 deadline,
 *                 u32 deliveries, u32 owner (0..O-1)
 *              4  CRC32 of every byte before it
 *
 * Owners are numbered densely in the blob (free slots left out) and each is
 * named by at least one range. ag_load() checks every field against the
 * blob's length before it allocates, and the ranges' order, bounds,
 * disjointness and owners before it trusts them: a damaged blob is
 * AG_ERR_CORRUPT, never a crash.
 */

#include "ackgroup.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define AG_MAGIC "MNAG"
#define AG_HEADER_BYTES 64
#define AG_RANGE_BYTES 32

typedef struct ag_range {
    uint64_t start, end; /* offsets start..end-1 */
    int64_t deadline;
    uint32_t deliveries;
    uint32_t owner;
} ag_range;

typedef struct ag_owner {
    char *name; /* NULL: a free slot */
    uint32_t len;
    uint32_t refs; /* ranges naming it */
} ag_owner;

struct ag_group {
    char *stream;
    size_t stream_len;
    uint64_t next;
    uint64_t pending; /* offsets in the ranges */
    ag_totals totals;
    ag_range *ranges;
    uint64_t num_ranges, cap_ranges;
    ag_owner *owners;
    uint32_t num_owners, cap_owners; /* slots in the table, used or free */
    uint64_t owner_bytes;            /* bytes of the names, for memory accounting */
    int64_t min_deadline;            /* <= every range's deadline (see ag_pick) */
};

/* ------------------------------------------------------------------------
 * Little-endian fields and buffers
 * --------------------------------------------------------------------- */

static void ag_put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void ag_put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t ag_get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t ag_get_u64(const unsigned char *p) {
    return (uint64_t)ag_get_u32(p) | ((uint64_t)ag_get_u32(p + 4) << 32);
}

static uint32_t ag_crc32(const unsigned char *p, size_t len) {
    return (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), p, len);
}

/* Room for `extra` more bytes in out (the storage core's buffer type,
 * grown with the same allocator so mn_buf_free() frees it). */
static int ag_buf_reserve(mn_buf *out, size_t extra) {
    if (extra > SIZE_MAX - out->len) return AG_ERR_NOMEM;
    size_t need = out->len + extra;
    if (need <= out->cap) return AG_OK;
    size_t cap = out->cap < SIZE_MAX / 2 ? out->cap * 2 : SIZE_MAX;
    if (cap < need) cap = need;
    char *p = realloc(out->data, cap);
    if (p == NULL) return AG_ERR_NOMEM;
    out->data = p;
    out->cap = cap;
    return AG_OK;
}

/* ------------------------------------------------------------------------
 * Life cycle and accessors
 * --------------------------------------------------------------------- */

ag_group *ag_new(const char *stream, size_t stream_len, uint64_t next) {
    if (next > AG_OFFSET_END || (stream == NULL && stream_len > 0)) return NULL;
    ag_group *g = calloc(1, sizeof(*g));
    if (g == NULL) return NULL;
    g->stream = malloc(stream_len ? stream_len : 1);
    if (g->stream == NULL) {
        free(g);
        return NULL;
    }
    if (stream_len) memcpy(g->stream, stream, stream_len);
    g->stream_len = stream_len;
    g->next = next;
    g->min_deadline = AG_NO_DEADLINE;
    return g;
}

void ag_free(ag_group *g) {
    if (g == NULL) return;
    for (uint32_t i = 0; i < g->num_owners; i++) free(g->owners[i].name);
    free(g->owners);
    free(g->ranges);
    free(g->stream);
    free(g);
}

const char *ag_stream_name(const ag_group *g) { return g->stream; }
size_t ag_stream_name_len(const ag_group *g) { return g->stream_len; }
uint64_t ag_next(const ag_group *g) { return g->next; }
uint64_t ag_pending(const ag_group *g) { return g->pending; }
uint64_t ag_num_ranges(const ag_group *g) { return g->num_ranges; }
void ag_get_totals(const ag_group *g, ag_totals *out) { *out = g->totals; }

uint64_t ag_memory_bytes(const ag_group *g) {
    /* The name is allocated with at least one byte (ag_new). */
    return sizeof(*g) + (g->stream_len ? g->stream_len : 1) + g->cap_ranges * sizeof(ag_range) +
           (uint64_t)g->cap_owners * sizeof(ag_owner) + g->owner_bytes;
}

/* ------------------------------------------------------------------------
 * Owners
 * --------------------------------------------------------------------- */

static void ag_owner_unref(ag_group *g, uint32_t slot) {
    ag_owner *o = &g->owners[slot];
    if (--o->refs > 0) return;
    g->owner_bytes -= o->len ? o->len : 1;
    free(o->name);
    o->name = NULL;
    o->len = 0;
}

/* The slot of `name`, interned if new (with no reference yet: the caller
 * adds its range's). *slot is set; AG_ERR_NOMEM leaves the table as it
 * was, apart from spare capacity. */
static int ag_owner_slot(ag_group *g, const char *name, size_t len, uint32_t *slot) {
    uint32_t free_slot = UINT32_MAX;
    for (uint32_t i = 0; i < g->num_owners; i++) {
        ag_owner *o = &g->owners[i];
        if (o->name == NULL) {
            if (free_slot == UINT32_MAX) free_slot = i;
        } else if (o->len == len && memcmp(o->name, name, len) == 0) {
            *slot = i;
            return AG_OK;
        }
    }
    if (free_slot == UINT32_MAX) {
        if (g->num_owners == g->cap_owners) {
            if (g->cap_owners >= UINT32_MAX / 2) return AG_ERR_NOMEM;
            uint32_t cap = g->cap_owners ? g->cap_owners * 2 : 4;
            ag_owner *owners = realloc(g->owners, (size_t)cap * sizeof(ag_owner));
            if (owners == NULL) return AG_ERR_NOMEM;
            g->owners = owners;
            g->cap_owners = cap;
        }
        free_slot = g->num_owners;
        g->owners[free_slot].name = NULL;
        g->owners[free_slot].len = 0;
        g->owners[free_slot].refs = 0;
        g->num_owners++;
    }
    char *copy = malloc(len ? len : 1);
    if (copy == NULL) return AG_ERR_NOMEM; /* the new slot stays free */
    if (len) memcpy(copy, name, len);
    g->owners[free_slot].name = copy;
    g->owners[free_slot].len = (uint32_t)len;
    g->owners[free_slot].refs = 0;
    g->owner_bytes += len ? len : 1;
    *slot = free_slot;
    return AG_OK;
}

uint32_t ag_num_owners(const ag_group *g) { return g->num_owners; }

const char *ag_owner_name(const ag_group *g, uint32_t slot, size_t *len) {
    if (slot >= g->num_owners || g->owners[slot].name == NULL) {
        *len = 0;
        return NULL;
    }
    *len = g->owners[slot].len;
    return g->owners[slot].name;
}

/* ------------------------------------------------------------------------
 * Ranges
 * --------------------------------------------------------------------- */

static int ag_reserve_ranges(ag_group *g, uint64_t extra) {
    if (g->num_ranges + extra <= g->cap_ranges) return AG_OK;
    uint64_t cap = g->cap_ranges ? g->cap_ranges * 2 : 4;
    if (cap < g->num_ranges + extra) cap = g->num_ranges + extra;
    if (cap > SIZE_MAX / sizeof(ag_range)) return AG_ERR_NOMEM;
    ag_range *ranges = realloc(g->ranges, (size_t)cap * sizeof(ag_range));
    if (ranges == NULL) return AG_ERR_NOMEM;
    g->ranges = ranges;
    g->cap_ranges = cap;
    return AG_OK;
}

/* Give back most of the table once it is mostly empty (a burst of batches
 * acknowledged), so a group's memory follows what is pending. */
static void ag_shrink_ranges(ag_group *g) {
    if (g->cap_ranges <= 16 || g->num_ranges > g->cap_ranges / 4) return;
    uint64_t cap = g->num_ranges * 2 > 16 ? g->num_ranges * 2 : 16;
    ag_range *ranges = realloc(g->ranges, (size_t)cap * sizeof(ag_range));
    if (ranges == NULL) return; /* keeping the larger table is harmless */
    g->ranges = ranges;
    g->cap_ranges = cap;
}

uint64_t ag_range_index(const ag_group *g, uint64_t offset) {
    uint64_t lo = 0, hi = g->num_ranges;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (g->ranges[mid].end <= offset) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int ag_range_get(const ag_group *g, uint64_t i, ag_range_info *out) {
    if (i >= g->num_ranges) return AG_ERR_ARG;
    const ag_range *r = &g->ranges[i];
    out->start = r->start;
    out->count = r->end - r->start;
    out->deadline_ms = r->deadline;
    out->deliveries = r->deliveries;
    out->owner = r->owner;
    return AG_OK;
}

/* Whether removing [a, b) splits a range in two (the one case that needs
 * a table slot more). */
static int ag_span_splits(const ag_group *g, uint64_t a, uint64_t b) {
    uint64_t i = ag_range_index(g, a);
    return i < g->num_ranges && g->ranges[i].start < a && g->ranges[i].end > b;
}

/* Remove offsets [a, b) from the ranges; returns how many were pending and
 * sets *at to the index where a range starting at `a` would now go. The
 * caller reserved a slot when ag_span_splits(). */
static uint64_t ag_remove_span(ag_group *g, uint64_t a, uint64_t b, uint64_t *at) {
    uint64_t i = ag_range_index(g, a), removed = 0;
    ag_range *r = g->ranges;
    if (i < g->num_ranges && r[i].start < a && r[i].end > b) {
        /* Strictly inside one range: split it around the span. */
        memmove(&r[i + 2], &r[i + 1], (size_t)(g->num_ranges - i - 1) * sizeof(ag_range));
        r[i + 1] = r[i];
        r[i + 1].start = b;
        r[i].end = a;
        g->owners[r[i].owner].refs++;
        g->num_ranges++;
        removed = b - a;
        g->pending -= removed;
        *at = i + 1;
        return removed;
    }
    if (i < g->num_ranges && r[i].start < a) {
        removed += r[i].end - a; /* its tail: r[i].end <= b here */
        r[i].end = a;
        i++;
    }
    uint64_t j = i;
    while (j < g->num_ranges && r[j].end <= b) {
        removed += r[j].end - r[j].start;
        ag_owner_unref(g, r[j].owner);
        j++;
    }
    if (j < g->num_ranges && r[j].start < b) {
        removed += b - r[j].start; /* its head */
        r[j].start = b;
    }
    if (j > i) {
        memmove(&r[i], &r[j], (size_t)(g->num_ranges - j) * sizeof(ag_range));
        g->num_ranges -= j - i;
    }
    g->pending -= removed;
    *at = i;
    return removed;
}

int64_t ag_floor(ag_group *g, uint64_t floor) {
    if (floor > AG_OFFSET_END) return AG_ERR_ARG;
    uint64_t dropped = 0, at;
    if (g->num_ranges > 0 && g->ranges[0].start < floor) {
        /* A prefix never splits a range. */
        dropped = ag_remove_span(g, 0, floor, &at);
        g->totals.dropped += dropped;
        ag_shrink_ranges(g);
    }
    if (g->next < floor) g->next = floor;
    return (int64_t)dropped;
}

void ag_pick(ag_group *g, int64_t now_ms, uint64_t floor, uint64_t end, uint64_t count,
             ag_choice *out) {
    uint64_t from = g->next > floor ? g->next : floor;
    out->start = from;
    out->count = 0;
    out->deliveries = 0;
    if (count == 0) return;
    if (g->min_deadline <= now_ms) {
        int64_t seen = AG_NO_DEADLINE;
        for (uint64_t i = 0; i < g->num_ranges; i++) {
            const ag_range *r = &g->ranges[i];
            uint64_t first = r->start > floor ? r->start : floor;
            if (r->deadline <= now_ms && first < r->end && first < end) {
                uint64_t stop = r->end < end ? r->end : end;
                out->start = first;
                out->count = stop - first < count ? stop - first : count;
                out->deliveries = r->deliveries < UINT32_MAX ? r->deliveries + 1 : UINT32_MAX;
                return; /* min_deadline stays a valid lower bound */
            }
            if (r->deadline < seen) seen = r->deadline;
        }
        g->min_deadline = seen;
    }
    if (from < end) {
        out->count = end - from < count ? end - from : count;
        out->deliveries = 1;
    }
}

static int ag_same_lease(const ag_range *a, const ag_range *b) {
    return a->end == b->start && a->deadline == b->deadline && a->owner == b->owner &&
           a->deliveries == b->deliveries;
}

/* Ranges are kept maximal: the range at `at` absorbs a neighbour that
 * touches it with the same lease (one reader's batches leased within one
 * millisecond, or a lease over part of a range it equals). */
static void ag_merge_around(ag_group *g, uint64_t at) {
    ag_range *r = g->ranges;
    if (at + 1 < g->num_ranges && ag_same_lease(&r[at], &r[at + 1])) {
        r[at].end = r[at + 1].end;
        ag_owner_unref(g, r[at + 1].owner);
        memmove(&r[at + 1], &r[at + 2], (size_t)(g->num_ranges - at - 2) * sizeof(ag_range));
        g->num_ranges--;
    }
    if (at > 0 && ag_same_lease(&r[at - 1], &r[at])) {
        r[at - 1].end = r[at].end;
        ag_owner_unref(g, r[at].owner);
        memmove(&r[at], &r[at + 1], (size_t)(g->num_ranges - at - 1) * sizeof(ag_range));
        g->num_ranges--;
    }
}

int ag_lease(ag_group *g, uint64_t start, uint64_t count, int64_t deadline_ms,
             uint32_t deliveries, const char *owner, size_t owner_len) {
    if (count == 0) return AG_OK;
    if (deliveries == 0 || owner_len > AG_MAX_OWNER_BYTES || (owner == NULL && owner_len > 0) ||
        start > AG_OFFSET_END || count > AG_OFFSET_END - start)
        return AG_ERR_ARG;
    uint64_t end = start + count;
    /* Everything that may allocate comes first: a split, the new range,
     * the owner's name. */
    if (ag_reserve_ranges(g, 1 + (uint64_t)ag_span_splits(g, start, end)) != AG_OK)
        return AG_ERR_NOMEM;
    uint32_t slot;
    if (ag_owner_slot(g, owner, owner_len, &slot) != AG_OK) return AG_ERR_NOMEM;
    g->owners[slot].refs++; /* before the removal, which may unref it */
    uint64_t at;
    ag_remove_span(g, start, end, &at);
    ag_range *r = g->ranges;
    memmove(&r[at + 1], &r[at], (size_t)(g->num_ranges - at) * sizeof(ag_range));
    r[at].start = start;
    r[at].end = end;
    r[at].deadline = deadline_ms;
    r[at].deliveries = deliveries;
    r[at].owner = slot;
    g->num_ranges++;
    ag_merge_around(g, at);
    g->pending += count;
    g->totals.delivered += count;
    if (deliveries > 1) g->totals.redelivered += count;
    if (deadline_ms < g->min_deadline) g->min_deadline = deadline_ms;
    if (g->next < end) g->next = end;
    return AG_OK;
}

int ag_take(ag_group *g, int64_t now_ms, uint64_t floor, uint64_t end, uint64_t count,
            int64_t lease_ms, const char *owner, size_t owner_len, ag_choice *out,
            int64_t *deadline_ms) {
    *deadline_ms = 0;
    ag_pick(g, now_ms, floor, end, count, out);
    if (out->count == 0) return AG_OK;
    if (floor > AG_OFFSET_END || lease_ms < 0 || now_ms > INT64_MAX - lease_ms) return AG_ERR_ARG;
    /* The floor drops only what the lease cannot be (below `floor`), and
     * never allocates: when the lease then fails, the group keeps a
     * smaller evicted part and no other change. */
    ag_floor(g, floor);
    int rc = ag_lease(g, out->start, out->count, now_ms + lease_ms, out->deliveries, owner,
                      owner_len);
    if (rc == AG_OK) *deadline_ms = now_ms + lease_ms;
    return rc;
}

int64_t ag_ack(ag_group *g, uint64_t start, uint64_t count) {
    if (count == 0 || g->num_ranges == 0) return 0;
    uint64_t end = count > UINT64_MAX - start ? UINT64_MAX : start + count;
    if (ag_span_splits(g, start, end) && ag_reserve_ranges(g, 1) != AG_OK) return AG_ERR_NOMEM;
    uint64_t at;
    uint64_t acked = ag_remove_span(g, start, end, &at);
    g->totals.acked += acked;
    ag_shrink_ranges(g);
    return (int64_t)acked;
}

int64_t ag_earliest_deadline(const ag_group *g, uint64_t floor, uint64_t end) {
    int64_t earliest = AG_NO_DEADLINE;
    for (uint64_t i = ag_range_index(g, floor); i < g->num_ranges && g->ranges[i].start < end; i++)
        if (g->ranges[i].deadline < earliest) earliest = g->ranges[i].deadline;
    return earliest;
}

/* The part of range r at or above floor: its length (0 when none). */
static uint64_t ag_len_from(const ag_range *r, uint64_t floor) {
    if (r->end <= floor) return 0;
    return r->end - (r->start > floor ? r->start : floor);
}

uint64_t ag_pending_from(const ag_group *g, uint64_t floor, int64_t now_ms, uint64_t *expired,
                         uint64_t *ranges) {
    uint64_t pending = 0;
    *expired = 0;
    *ranges = 0;
    for (uint64_t i = ag_range_index(g, floor); i < g->num_ranges; i++) {
        uint64_t n = ag_len_from(&g->ranges[i], floor);
        pending += n;
        if (g->ranges[i].deadline <= now_ms) *expired += n;
        (*ranges)++;
    }
    return pending;
}

void ag_owner_stats(const ag_group *g, uint64_t floor, int64_t now_ms, uint64_t *pending,
                    uint64_t *expired, int64_t *latest_deadline) {
    for (uint32_t k = 0; k < g->num_owners; k++) {
        pending[k] = expired[k] = 0;
        latest_deadline[k] = 0;
    }
    for (uint64_t i = ag_range_index(g, floor); i < g->num_ranges; i++) {
        const ag_range *r = &g->ranges[i];
        uint64_t n = ag_len_from(r, floor);
        pending[r->owner] += n;
        if (r->deadline <= now_ms) expired[r->owner] += n;
        if (r->deadline > latest_deadline[r->owner]) latest_deadline[r->owner] = r->deadline;
    }
}

/* ------------------------------------------------------------------------
 * Copy and the blob
 * --------------------------------------------------------------------- */

ag_group *ag_copy(const ag_group *g) {
    mn_buf b;
    mn_buf_init(&b);
    ag_group *copy = NULL;
    int err;
    if (ag_serialize(g, &b) == AG_OK) copy = ag_load(b.data, b.len, &err);
    mn_buf_free(&b);
    return copy;
}

int ag_serialize(const ag_group *g, mn_buf *out) {
    /* Owners are renumbered densely, in slot order: dense[slot]. */
    uint32_t *dense = NULL;
    uint32_t used = 0;
    size_t names = 0;
    if (g->num_owners > 0) {
        dense = malloc((size_t)g->num_owners * sizeof(uint32_t));
        if (dense == NULL) return AG_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < g->num_owners; i++) {
        if (g->owners[i].name == NULL) continue;
        dense[i] = used++;
        names += 4 + g->owners[i].len;
    }
    size_t size = AG_HEADER_BYTES + g->stream_len + names + (size_t)g->num_ranges * AG_RANGE_BYTES + 4;
    if (ag_buf_reserve(out, size) != AG_OK) {
        free(dense);
        return AG_ERR_NOMEM;
    }
    unsigned char *base = (unsigned char *)out->data + out->len;
    unsigned char *p = base;
    memset(p, 0, AG_HEADER_BYTES);
    memcpy(p, AG_MAGIC, 4);
    p[4] = AG_FORMAT_VERSION;
    ag_put_u64(p + 8, g->next);
    ag_put_u64(p + 16, g->totals.delivered);
    ag_put_u64(p + 24, g->totals.redelivered);
    ag_put_u64(p + 32, g->totals.acked);
    ag_put_u64(p + 40, g->totals.dropped);
    ag_put_u64(p + 48, g->num_ranges);
    ag_put_u32(p + 56, used);
    ag_put_u32(p + 60, (uint32_t)g->stream_len);
    p += AG_HEADER_BYTES;
    if (g->stream_len) memcpy(p, g->stream, g->stream_len);
    p += g->stream_len;
    for (uint32_t i = 0; i < g->num_owners; i++) {
        const ag_owner *o = &g->owners[i];
        if (o->name == NULL) continue;
        ag_put_u32(p, o->len);
        if (o->len) memcpy(p + 4, o->name, o->len);
        p += 4 + o->len;
    }
    for (uint64_t i = 0; i < g->num_ranges; i++) {
        const ag_range *r = &g->ranges[i];
        ag_put_u64(p, r->start);
        ag_put_u64(p + 8, r->end - r->start);
        ag_put_u64(p + 16, (uint64_t)r->deadline);
        ag_put_u32(p + 24, r->deliveries);
        ag_put_u32(p + 28, dense[r->owner]);
        p += AG_RANGE_BYTES;
    }
    ag_put_u32(p, ag_crc32(base, (size_t)(p - base)));
    out->len += size;
    free(dense);
    return AG_OK;
}

/* ag_load()'s checks, in the order of the blob; returns the group or NULL
 * with *err set. */
ag_group *ag_load(const char *blob, size_t len, int *err) {
    const unsigned char *p = (const unsigned char *)blob;
    *err = AG_ERR_CORRUPT;
    if (blob == NULL || len < AG_HEADER_BYTES + 4 || memcmp(p, AG_MAGIC, 4) != 0 ||
        p[4] != AG_FORMAT_VERSION || p[5] != 0 || p[6] != 0 || p[7] != 0)
        return NULL;
    if (ag_get_u32(p + len - 4) != ag_crc32(p, len - 4)) return NULL;
    uint64_t next = ag_get_u64(p + 8);
    uint64_t num_ranges = ag_get_u64(p + 48);
    uint32_t num_owners = ag_get_u32(p + 56);
    uint32_t stream_len = ag_get_u32(p + 60);
    size_t body = len - 4 - AG_HEADER_BYTES; /* bytes for name, owners, ranges */
    if (next > AG_OFFSET_END || stream_len > body) return NULL;
    body -= stream_len;
    /* Each owner takes >= 4 bytes and each range 32: bound both counts by
     * what is left before allocating anything. */
    if (num_owners > body / 4 || num_ranges > body / AG_RANGE_BYTES) return NULL;
    if (num_owners > num_ranges) return NULL; /* every owner names a range */
    ag_group *g = ag_new((const char *)p + AG_HEADER_BYTES, stream_len, next);
    if (g == NULL) {
        *err = AG_ERR_NOMEM;
        return NULL;
    }
    g->totals.delivered = ag_get_u64(p + 16);
    g->totals.redelivered = ag_get_u64(p + 24);
    g->totals.acked = ag_get_u64(p + 32);
    g->totals.dropped = ag_get_u64(p + 40);
    const unsigned char *q = p + AG_HEADER_BYTES + stream_len;
    const unsigned char *stop = p + len - 4;
    if (num_owners > 0) {
        g->owners = calloc(num_owners, sizeof(ag_owner));
        if (g->owners == NULL) goto nomem;
        g->cap_owners = num_owners;
    }
    for (uint32_t i = 0; i < num_owners; i++) {
        if ((size_t)(stop - q) < 4) goto corrupt;
        uint32_t n = ag_get_u32(q);
        if (n > AG_MAX_OWNER_BYTES || (size_t)(stop - q - 4) < n) goto corrupt;
        /* A name appears once: ranges name owners by slot. */
        for (uint32_t k = 0; k < i; k++)
            if (g->owners[k].len == n && memcmp(g->owners[k].name, q + 4, n) == 0) goto corrupt;
        g->owners[i].name = malloc(n ? n : 1);
        if (g->owners[i].name == NULL) goto nomem;
        if (n) memcpy(g->owners[i].name, q + 4, n);
        g->owners[i].len = n;
        g->num_owners = i + 1;
        g->owner_bytes += n ? n : 1;
        q += 4 + n;
    }
    if ((size_t)(stop - q) != num_ranges * AG_RANGE_BYTES) goto corrupt;
    if (num_ranges > 0) {
        g->ranges = malloc((size_t)num_ranges * sizeof(ag_range));
        if (g->ranges == NULL) goto nomem;
        g->cap_ranges = num_ranges;
    }
    uint64_t prev_end = 0;
    for (uint64_t i = 0; i < num_ranges; i++, q += AG_RANGE_BYTES) {
        uint64_t start = ag_get_u64(q), count = ag_get_u64(q + 8);
        uint32_t deliveries = ag_get_u32(q + 24), owner = ag_get_u32(q + 28);
        if (count == 0 || start < prev_end || start > next || count > next - start ||
            deliveries == 0 || owner >= num_owners)
            goto corrupt;
        ag_range *r = &g->ranges[i];
        r->start = start;
        r->end = start + count;
        r->deadline = (int64_t)ag_get_u64(q + 16);
        r->deliveries = deliveries;
        r->owner = owner;
        g->owners[owner].refs++;
        g->num_ranges = i + 1;
        g->pending += count;
        if (r->deadline < g->min_deadline) g->min_deadline = r->deadline;
        prev_end = r->end;
    }
    for (uint32_t i = 0; i < num_owners; i++)
        if (g->owners[i].refs == 0) goto corrupt;
    *err = AG_OK;
    return g;
nomem:
    ag_free(g);
    *err = AG_ERR_NOMEM;
    return NULL;
corrupt:
    ag_free(g);
    return NULL;
}
