/* module_ack.c -- acknowledged consumer groups inside redis-server.
 *
 * docs/PROTOCOL.md ("Acknowledged groups") is the contract; docs/MODULE.md
 * says what is particular to the module. This file adds to module.c:
 *
 *   the data type "rcp11-grp"      what a group key holds in acknowledged
 *                                  mode: src/ackgroup.c's ag_group, as is
 *   TREAD ... LEASE ms [CONSUMER name] [ACK start count]
 *                                  (module.c parses TREAD and calls ra_tread)
 *   TACK groupkey start count [start count ...]
 *   TGROUP INFO key groupkey | TGROUP PENDING key groupkey offset count | TGROUP HELP
 *   RCP11.LEASE, RCP11.GROUP       internal: what the AOF and replicas get
 *
 * REPLICATION AND THE AOF
 * =======================
 *
 * A lease read depends on the clock (which leases ran out, the deadline it
 * gives), so it never travels as itself. It reaches replicas and the AOF as
 * what it did, in absolute terms:
 *
 *   TACK g start count                                (its ACK, if it acked)
 *   RCP11.LEASE g key floor start count deadline deliveries consumer
 *
 * RCP11.LEASE creates the group if missing (at `floor`) or turns a plain
 * group key into one (at the offset it held), drops pending offsets below
 * `floor` (evicted from the stream), and leases start..start+count-1 until
 * the absolute `deadline`: a replica and a replayed AOF end with the same
 * ranges, deadlines, owners and delivery counts as the primary. TACK is
 * deterministic and goes verbatim. An AOF rewrite without the RDB preamble
 * emits one `RCP11.GROUP key <blob>` per group (ag_serialize's format);
 * RDB files, DUMP/RESTORE, COPY and full syncs carry the same blob as the
 * type's value. The callbacks that write and read it are module_rdb.c's.
 *
 * BLOCKING
 * ========
 *
 * A lease reader with nothing to deliver blocks on the stream key like any
 * TREAD (module.c's rl_block, Redis's FIFO per key gives the fairness). A
 * write wakes it; so must a lease that runs out, which no write signals: a
 * module timer set to the group's earliest deadline signals the stream key
 * then. A timer never propagates anything itself, but the readers it wakes
 * do (RCP11.LEASE): while clients are paused (CLIENT PAUSE, a failover)
 * Redis 7.0 aborts on any propagation outside a command, so a timer that
 * fires then (RedisModule_AvoidReplicaTraffic) tries again a little later.
 * Timers are never stopped: one that fires for a reader gone meanwhile
 * signals a key nobody waits on, which costs nothing.
 */

#include <stdio.h>
#include <string.h>

#include "ackgroup.h"
#include "module_internal.h"
#include "module_reserve.h"

/* The data type's name is written into every RDB file holding a group:
 * never change it. Redis requires exactly 9 characters. */
#define RA_TYPE_NAME "rcp11-grp"

#define RA_ERR_NO_SUCH_KEY "ERR no such key"
#define RA_ERR_BAD_LEASE "ERR bad RCP11.LEASE arguments"
#define RA_ERR_BAD_GROUP "ERR bad acknowledged group blob"

static RedisModuleType *ra_type;

int ra_holds_group(RedisModuleKey *key) {
    return RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_MODULE &&
           RedisModule_ModuleTypeGetType(key) == ra_type;
}

/* ------------------------------------------------------------------------
 * Opening a group key
 * --------------------------------------------------------------------- */

/* A group key as a lease read or TGROUP finds it. */
typedef struct ra_open {
    RedisModuleKey *key;
    ag_group *g;  /* the group (new when `created`); NULL: missing, or plain */
    int missing;  /* no such key */
    int plain;    /* a string: a plain group at `plain_pos` */
    uint64_t plain_pos;
    int created;  /* g is new (missing or plain before): store it */
    uint64_t base; /* where a group created for a missing key started */
} ra_open;

/* Reply "-ERR group key '<g>' belongs to stream '<s>'". */
static void ra_reply_other_stream(RedisModuleCtx *ctx, RedisModuleString *group,
                                  const ag_group *g) {
    size_t glen;
    const char *gp = RedisModule_StringPtrLen(group, &glen);
    size_t glimit = glen < RL_QUOTE_MAX ? glen : RL_QUOTE_MAX;
    size_t slen = ag_stream_name_len(g);
    size_t slimit = slen < RL_QUOTE_MAX ? slen : RL_QUOTE_MAX;
    size_t gsize = glimit * 3 + 8, ssize = slimit * 3 + 8;
    char *gq = RedisModule_Alloc(gsize), *sq = RedisModule_Alloc(ssize);
    rl_quote(gp, glen, RL_QUOTE_MAX, gq, gsize);
    rl_quote(ag_stream_name(g), slen, RL_QUOTE_MAX, sq, ssize);
    size_t msg_size = strlen(gq) + strlen(sq) + 64;
    char *msg = RedisModule_Alloc(msg_size);
    snprintf(msg, msg_size, "ERR group key '%s' belongs to stream '%s'", gq, sq);
    RedisModule_ReplyWithError(ctx, msg);
    RedisModule_Free(msg);
    RedisModule_Free(sq);
    RedisModule_Free(gq);
}

/* Open the group key `group` of the stream `stream` for `mode`. An
 * acknowledged group of another stream, a bad plain position or another
 * type replies the error and returns 0 (the key is closed). */
static int ra_open_group(RedisModuleCtx *ctx, RedisModuleString *group, RedisModuleString *stream,
                         int mode, ra_open *o) {
    memset(o, 0, sizeof(*o));
    o->key = RedisModule_OpenKey(ctx, group, mode);
    int type = RedisModule_KeyType(o->key);
    if (type == REDISMODULE_KEYTYPE_EMPTY) {
        o->missing = 1;
        return 1;
    }
    if (ra_holds_group(o->key)) {
        o->g = RedisModule_ModuleTypeGetValue(o->key);
        size_t len;
        const char *name = RedisModule_StringPtrLen(stream, &len);
        if (ag_stream_name_len(o->g) == len && memcmp(ag_stream_name(o->g), name, len) == 0)
            return 1;
        ra_reply_other_stream(ctx, group, o->g);
    } else if (type == REDISMODULE_KEYTYPE_STRING) {
        size_t len;
        const char *p = RedisModule_StringDMA(o->key, &len, REDISMODULE_READ);
        if (rl_parse_offset(p, len, RL_OFFSET_END, &o->plain_pos)) {
            o->plain = 1;
            return 1;
        }
        rl_reply_group_not_offset(ctx, group);
    } else {
        RedisModule_ReplyWithError(ctx, RL_WRONGTYPE);
    }
    RedisModule_CloseKey(o->key);
    o->key = NULL;
    return 0;
}

/* Make o->g exist for a lease read: a missing group starts at `base`, a
 * plain one at the offset it held. 0 when memory failed (replied). */
static int ra_materialize(RedisModuleCtx *ctx, RedisModuleString *stream, ra_open *o,
                          uint64_t base) {
    if (o->g != NULL) return 1;
    size_t len;
    const char *name = RedisModule_StringPtrLen(stream, &len);
    o->base = base;
    o->g = ag_new(name, len, o->plain ? o->plain_pos : base);
    if (o->g == NULL) {
        RedisModule_ReplyWithError(ctx, "ERR out of memory");
        return 0;
    }
    o->created = 1;
    return 1;
}

/* The floor RCP11.LEASE carries: the stream's first offset, except that a
 * group created for a missing key is created by the replay at `floor`, so
 * there it is the group's start. */
static uint64_t ra_logged_floor(const ra_open *o, uint64_t floor) {
    return o->missing && o->base > floor ? o->base : floor;
}

/* The stream's offsets a lease read may deliver: from its first readable
 * offset to the end a reader may see (rcp11.read-committed: what every
 * online replica acknowledged; module_reserve.c). */
static void ra_bounds(RedisModuleCtx *ctx, mn_stream *s, uint64_t *floor, uint64_t *end) {
    *end = rl_resv_readable_next(ctx, s);
    *floor = s ? mn_first_offset(s) : 0;
    if (*floor > *end) *floor = *end;
}

/* A lease reader that waits while messages past the readable end exist
 * (written, not acknowledged by the replicas yet) is woken once they are. */
static void ra_wait_committed(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s,
                              uint64_t end) {
    if (s != NULL && end < mn_next_offset(s)) rl_resv_reader_waits(ctx, key);
}

/* Store a created group into its key (replacing a plain group's string). */
static void ra_store(ra_open *o) {
    if (o->created) {
        RedisModule_ModuleTypeSetValue(o->key, ra_type, o->g);
        o->created = 0;
    }
}

/* A group that was created but not stored is freed. */
static void ra_close(ra_open *o) {
    if (o->created) ag_free(o->g);
    o->g = NULL;
    o->created = 0;
    if (o->key != NULL) RedisModule_CloseKey(o->key);
    o->key = NULL;
}

/* ------------------------------------------------------------------------
 * Lease reads
 * --------------------------------------------------------------------- */

/* The reader's consumer name (the empty name when none was given). */
static const char *ra_consumer(RedisModuleString *consumer, size_t *len) {
    if (consumer == NULL) {
        *len = 0;
        return "";
    }
    return RedisModule_StringPtrLen(consumer, len);
}

/* Replicate `RCP11.LEASE g key floor start count deadline deliveries
 * consumer` (offsets up to 2^63, which no long long holds: as text). */
static void ra_replicate_lease(RedisModuleCtx *ctx, RedisModuleString *group,
                               RedisModuleString *stream, uint64_t floor, const ag_choice *c,
                               int64_t deadline, RedisModuleString *consumer) {
    char f[24], st[24], n[24], d[24], dl[24];
    snprintf(f, sizeof(f), "%llu", (unsigned long long)floor);
    snprintf(st, sizeof(st), "%llu", (unsigned long long)c->start);
    snprintf(n, sizeof(n), "%llu", (unsigned long long)c->count);
    snprintf(d, sizeof(d), "%lld", (long long)deadline);
    snprintf(dl, sizeof(dl), "%lu", (unsigned long)c->deliveries);
    size_t clen;
    const char *cp = ra_consumer(consumer, &clen);
    RedisModule_Replicate(ctx, "RCP11.LEASE", "sscccccb", group, stream, f, st, n, d, dl, cp,
                          clen);
}

/* Deliver what `c` says (count may be 0) to the reader of ctx: drop the
 * evicted, lease, store, reply with the lease read's header, signal and
 * replicate. `changed`: the group already changed (created, acknowledged)
 * and must be replicated even when this delivers nothing. */
static void ra_deliver(RedisModuleCtx *ctx, RedisModuleString *stream, mn_stream *s,
                       RedisModuleString *group, ra_open *o, const ag_choice *c, int64_t now,
                       long long lease_ms, RedisModuleString *consumer, int changed) {
    uint64_t floor = s ? mn_first_offset(s) : 0;
    uint64_t next_before = ag_next(o->g);
    if (ag_floor(o->g, floor) > 0 || ag_next(o->g) != next_before) changed = 1;
    int64_t deadline = 0;
    if (c->count > 0) {
        deadline = now + lease_ms;
        size_t clen;
        const char *cp = ra_consumer(consumer, &clen);
        ag_lease(o->g, c->start, c->count, deadline, c->deliveries, cp, clen);
        changed = 1;
    }
    long long extra[2] = {(long long)c->deliveries, (long long)deadline};
    rl_reply_range(ctx, s, c->start, (long long)c->count, 1, 0, 0, extra, 2);
    if (!changed) return;
    ra_store(o);
    RedisModule_SignalModifiedKey(ctx, group);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tlease", group);
    ra_replicate_lease(ctx, group, stream, ra_logged_floor(o, floor), c, deadline, consumer);
}

/* The timers that wake blocked lease readers when a lease runs out: one
 * per stream key and deadline, signalling the key in its database. The
 * soonest one armed for each key is remembered (ra_armed, by
 * "<db><key>"), so readers that block again and again arm no new timer
 * while one early enough is pending. */
typedef struct ra_timer {
    int db;
    RedisModuleString *key;
    int64_t at; /* the deadline it is set for */
} ra_timer;

static RedisModuleDict *ra_armed; /* "<db><key>" -> ra_timer, the soonest armed */

static char *ra_timer_name(int db, RedisModuleString *key, size_t *len) {
    size_t klen;
    const char *k = RedisModule_StringPtrLen(key, &klen);
    char *name = RedisModule_Alloc(klen + 4);
    uint32_t d = (uint32_t)db;
    memcpy(name, &d, 4);
    memcpy(name + 4, k, klen);
    *len = klen + 4;
    return name;
}

static void ra_timer_fire(RedisModuleCtx *ctx, void *data) {
    ra_timer *t = data;
    if (RedisModule_AvoidReplicaTraffic()) {
        /* Clients are paused: the readers woken now would propagate. */
        RedisModule_CreateTimer(ctx, RL_PAUSED_RETRY_MS, ra_timer_fire, t);
        return;
    }
    if (RedisModule_SelectDb(ctx, t->db) == REDISMODULE_OK) RedisModule_SignalKeyAsReady(ctx, t->key);
    size_t len;
    char *name = ra_timer_name(t->db, t->key, &len);
    int nokey;
    if (RedisModule_DictGetC(ra_armed, name, len, &nokey) == t)
        RedisModule_DictDelC(ra_armed, name, len, NULL);
    RedisModule_Free(name);
    RedisModule_FreeString(NULL, t->key);
    RedisModule_Free(t);
}

/* Make sure the waiting reader w is woken when the earliest lease of g it
 * could take runs out. */
static void ra_arm_timer(RedisModuleCtx *ctx, rl_wait *w, const ag_group *g, uint64_t floor,
                         uint64_t end, int64_t now) {
    int64_t deadline = ag_earliest_deadline(g, floor, end);
    if (deadline == AG_NO_DEADLINE) return;
    if (deadline <= now) deadline = now + 1;
    size_t len;
    char *name = ra_timer_name(w->db, w->key, &len);
    int nokey;
    ra_timer *armed = RedisModule_DictGetC(ra_armed, name, len, &nokey);
    if (!nokey && armed != NULL && armed->at <= deadline) {
        RedisModule_Free(name); /* one is set early enough */
        return;
    }
    ra_timer *t = RedisModule_Alloc(sizeof(*t));
    t->db = w->db;
    t->key = RedisModule_CreateStringFromString(NULL, w->key);
    t->at = deadline;
    RedisModule_CreateTimer(ctx, (long long)(deadline - now), ra_timer_fire, t);
    /* The later timer still fires (and signals once); the key now
     * remembers the sooner one. */
    RedisModule_DictReplaceC(ra_armed, name, len, t);
    RedisModule_Free(name);
}

int ra_tread(RedisModuleCtx *ctx, RedisModuleString *stream_name, RedisModuleKey *key,
             mn_stream *s, rl_tread_args *a, int may_block) {
    ra_open o;
    if (!ra_open_group(ctx, a->group, stream_name, REDISMODULE_READ | REDISMODULE_WRITE, &o)) {
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    if (!ra_materialize(ctx, stream_name, &o, rl_group_default(s, a->group_new))) {
        ra_close(&o);
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    int changed = o.created;
    int64_t now = rl_now_ms();
    int64_t acked = 0;
    if (a->ack) acked = ag_ack(o.g, (uint64_t)a->ack_start, (uint64_t)a->ack_count);
    if (acked > 0) {
        RedisModule_Replicate(ctx, "TACK", "sll", a->group, a->ack_start, a->ack_count);
        changed = 1;
    }
    uint64_t floor, end;
    ra_bounds(ctx, s, &floor, &end);
    ag_choice c;
    ag_pick(o.g, now, floor, end, (uint64_t)a->count, &c);
    if (c.count > 0 || !may_block) {
        ra_deliver(ctx, stream_name, s, a->group, &o, &c, now, a->lease_ms, a->consumer, changed);
        ra_close(&o);
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    /* Nothing to deliver: what changed (the group created, acknowledged,
     * its evicted part dropped) is kept and replicated now, as a read that
     * returns nothing would; then the reader waits. */
    uint64_t next_before = ag_next(o.g);
    if (ag_floor(o.g, floor) > 0 || ag_next(o.g) != next_before) changed = 1;
    if (changed) {
        ra_store(&o);
        RedisModule_SignalModifiedKey(ctx, a->group);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tlease", a->group);
        ag_choice none = {ag_next(o.g), 0, 0};
        ra_replicate_lease(ctx, a->group, stream_name, ra_logged_floor(&o, floor), &none, 0, NULL);
    }
    rl_wait *w = RedisModule_Calloc(1, sizeof(rl_wait));
    w->group = a->group;
    w->group_new = a->group_new;
    w->count = a->count;
    w->withinfo = 1;
    w->lease = 1;
    w->lease_ms = a->lease_ms;
    if (a->consumer != NULL) w->consumer = RedisModule_CreateStringFromString(NULL, a->consumer);
    rl_block(ctx, stream_name, w, a->block_ms);
    ra_arm_timer(ctx, w, o.g, floor, end, now);
    ra_wait_committed(ctx, stream_name, s, end);
    ra_close(&o);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

int ra_wake(RedisModuleCtx *ctx, rl_wait *w) {
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, w->key, REDISMODULE_READ, &key, &s))
        return REDISMODULE_OK; /* -WRONGTYPE went to the reader */
    ra_open o;
    if (!ra_open_group(ctx, w->group, w->key, REDISMODULE_READ | REDISMODULE_WRITE, &o)) {
        RedisModule_CloseKey(key);
        return REDISMODULE_OK; /* the error went to the reader */
    }
    /* A group key deleted while the reader waited starts over where the
     * group would start now (module.c's keyspace hook noted it). */
    uint64_t base = w->has_fallback ? w->fallback : rl_group_default(s, w->group_new);
    if (!ra_materialize(ctx, w->key, &o, base)) {
        ra_close(&o);
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    int64_t now = rl_now_ms();
    uint64_t floor, end;
    ra_bounds(ctx, s, &floor, &end);
    ag_choice c;
    ag_pick(o.g, now, floor, end, (uint64_t)w->count, &c);
    if (c.count == 0 || RedisModule_AvoidReplicaTraffic()) {
        /* Keep waiting, changing nothing (see module.c's BLOCKING); while
         * clients are paused a delivery would replicate RCP11.LEASE, so it
         * waits for the pause to end (module.c's PAUSES). */
        if (c.count == 0) {
            ra_arm_timer(ctx, w, o.g, floor, end, now);
            ra_wait_committed(ctx, w->key, s, end);
        } else {
            rl_defer_wake(w);
        }
        ra_close(&o);
        RedisModule_CloseKey(key);
        return REDISMODULE_ERR;
    }
    ra_deliver(ctx, w->key, s, w->group, &o, &c, now, w->lease_ms, w->consumer, o.created);
    ra_close(&o);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * TACK groupkey start count [start count ...]
 * --------------------------------------------------------------------- */

static int ra_tack(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 4 || (argc - 2) % 2 != 0) return RedisModule_WrongArity(ctx);
    /* Every pair is checked before anything changes. */
    for (int i = 2; i < argc; i += 2) {
        long long start, count;
        if (RedisModule_StringToLongLong(argv[i], &start) != REDISMODULE_OK)
            return RedisModule_ReplyWithError(ctx, RL_ERR_OFFSET);
        if (start < 0) return RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_OFFSET);
        if (RedisModule_StringToLongLong(argv[i + 1], &count) != REDISMODULE_OK)
            return RedisModule_ReplyWithError(ctx, RL_ERR_COUNT);
        if (count < 0) return RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_COUNT);
    }
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key);
    if (type == REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    if (!ra_holds_group(key)) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, RL_WRONGTYPE);
    }
    ag_group *g = RedisModule_ModuleTypeGetValue(key);
    long long total = 0;
    for (int i = 2; i < argc; i += 2) {
        long long start, count;
        RedisModule_StringToLongLong(argv[i], &start);
        RedisModule_StringToLongLong(argv[i + 1], &count);
        int64_t acked = ag_ack(g, (uint64_t)start, (uint64_t)count);
        if (acked > 0) total += acked;
    }
    RedisModule_CloseKey(key);
    if (total > 0) {
        RedisModule_SignalModifiedKey(ctx, argv[1]);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tack", argv[1]);
        RedisModule_ReplicateVerbatim(ctx);
    }
    return RedisModule_ReplyWithLongLong(ctx, total);
}

/* ------------------------------------------------------------------------
 * TGROUP INFO | PENDING | HELP
 * --------------------------------------------------------------------- */

static void ra_reply_cstring(RedisModuleCtx *ctx, const char *text) {
    RedisModule_ReplyWithStringBuffer(ctx, text, strlen(text));
}

/* Open the stream `key` and the group for TGROUP: 0 when it replied an
 * error (everything closed). */
static int ra_open_for_tgroup(RedisModuleCtx *ctx, RedisModuleString **argv, RedisModuleKey **key,
                              mn_stream **s, ra_open *o) {
    if (!rl_open_stream(ctx, argv[2], REDISMODULE_READ, key, s)) return 0;
    if (!ra_open_group(ctx, argv[3], argv[2], REDISMODULE_READ, o)) {
        RedisModule_CloseKey(*key);
        return 0;
    }
    if (o->missing) {
        ra_close(o);
        RedisModule_CloseKey(*key);
        RedisModule_ReplyWithError(ctx, RA_ERR_NO_SUCH_KEY);
        return 0;
    }
    return 1;
}

static void ra_info_consumers(RedisModuleCtx *ctx, const ag_group *g, uint64_t floor,
                              int64_t now) {
    uint32_t n = g ? ag_num_owners(g) : 0;
    if (n == 0) {
        RedisModule_ReplyWithArray(ctx, 0);
        return;
    }
    uint64_t *pending = RedisModule_Alloc(n * sizeof(uint64_t));
    uint64_t *expired = RedisModule_Alloc(n * sizeof(uint64_t));
    int64_t *latest = RedisModule_Alloc(n * sizeof(int64_t));
    ag_owner_stats(g, floor, now, pending, expired, latest);
    long shown = 0;
    for (uint32_t k = 0; k < n; k++) shown += pending[k] > 0;
    RedisModule_ReplyWithArray(ctx, shown);
    for (uint32_t k = 0; k < n; k++) {
        if (pending[k] == 0) continue;
        size_t len;
        const char *name = ag_owner_name(g, k, &len);
        RedisModule_ReplyWithMap(ctx, 4);
        ra_reply_cstring(ctx, "name");
        RedisModule_ReplyWithStringBuffer(ctx, name ? name : "", len);
        ra_reply_cstring(ctx, "pending");
        RedisModule_ReplyWithLongLong(ctx, (long long)pending[k]);
        ra_reply_cstring(ctx, "expired");
        RedisModule_ReplyWithLongLong(ctx, (long long)expired[k]);
        ra_reply_cstring(ctx, "lease-deadline");
        RedisModule_ReplyWithLongLong(ctx, latest[k]);
    }
    RedisModule_Free(latest);
    RedisModule_Free(expired);
    RedisModule_Free(pending);
}

static int ra_tgroup_info(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 4) return RedisModule_WrongArity(ctx);
    RedisModuleKey *key;
    mn_stream *s;
    ra_open o;
    if (!ra_open_for_tgroup(ctx, argv, &key, &s, &o)) return REDISMODULE_OK;
    uint64_t floor = s ? mn_first_offset(s) : 0, end = s ? mn_next_offset(s) : 0;
    int64_t now = rl_now_ms();
    uint64_t next = o.g ? ag_next(o.g) : o.plain_pos;
    uint64_t from = next > floor ? next : floor;
    uint64_t pending = 0, expired = 0, ranges = 0;
    ag_totals totals;
    memset(&totals, 0, sizeof(totals));
    if (o.g) {
        pending = ag_pending_from(o.g, floor, now, &expired, &ranges);
        ag_get_totals(o.g, &totals);
    }
    RedisModule_ReplyWithMap(ctx, 11);
    ra_reply_cstring(ctx, "mode");
    ra_reply_cstring(ctx, o.g ? "acknowledged" : "plain");
    ra_reply_cstring(ctx, "next-offset");
    RedisModule_ReplyWithLongLong(ctx, (long long)(next < RL_OFFSET_END ? next : RL_OFFSET_END - 1));
    ra_reply_cstring(ctx, "lag");
    RedisModule_ReplyWithLongLong(ctx, (long long)(end > from ? end - from : 0));
    ra_reply_cstring(ctx, "pending");
    RedisModule_ReplyWithLongLong(ctx, (long long)pending);
    ra_reply_cstring(ctx, "pending-ranges");
    RedisModule_ReplyWithLongLong(ctx, (long long)ranges);
    ra_reply_cstring(ctx, "expired");
    RedisModule_ReplyWithLongLong(ctx, (long long)expired);
    ra_reply_cstring(ctx, "delivered");
    RedisModule_ReplyWithLongLong(ctx, (long long)totals.delivered);
    ra_reply_cstring(ctx, "redelivered");
    RedisModule_ReplyWithLongLong(ctx, (long long)totals.redelivered);
    ra_reply_cstring(ctx, "acknowledged");
    RedisModule_ReplyWithLongLong(ctx, (long long)totals.acked);
    ra_reply_cstring(ctx, "dropped");
    RedisModule_ReplyWithLongLong(ctx, (long long)totals.dropped);
    ra_reply_cstring(ctx, "consumers");
    ra_info_consumers(ctx, o.g, floor, now);
    ra_close(&o);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

static int ra_tgroup_pending(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 6) return RedisModule_WrongArity(ctx);
    long long offset, count;
    if (RedisModule_StringToLongLong(argv[4], &offset) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_OFFSET);
    if (offset < 0) return RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_OFFSET);
    if (RedisModule_StringToLongLong(argv[5], &count) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_COUNT);
    if (count < 0) return RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_COUNT);
    RedisModuleKey *key;
    mn_stream *s;
    ra_open o;
    if (!ra_open_for_tgroup(ctx, argv, &key, &s, &o)) return REDISMODULE_OK;
    uint64_t floor = s ? mn_first_offset(s) : 0;
    uint64_t from = (uint64_t)offset > floor ? (uint64_t)offset : floor;
    uint64_t i = o.g ? ag_range_index(o.g, from) : 0, total = o.g ? ag_num_ranges(o.g) : 0;
    uint64_t n = total - i < (uint64_t)count ? total - i : (uint64_t)count;
    RedisModule_ReplyWithArray(ctx, (long)n);
    for (uint64_t k = 0; k < n; k++) {
        ag_range_info r;
        ag_range_get(o.g, i + k, &r);
        uint64_t start = r.start > floor ? r.start : floor; /* evicted offsets left out */
        size_t len;
        const char *name = ag_owner_name(o.g, r.owner, &len);
        RedisModule_ReplyWithArray(ctx, 5);
        RedisModule_ReplyWithLongLong(ctx, (long long)start);
        RedisModule_ReplyWithLongLong(ctx, (long long)(r.start + r.count - start));
        RedisModule_ReplyWithStringBuffer(ctx, name ? name : "", len);
        RedisModule_ReplyWithLongLong(ctx, (long long)r.deliveries);
        RedisModule_ReplyWithLongLong(ctx, r.deadline_ms);
    }
    ra_close(&o);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

static int ra_tgroup_help(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 2) return RedisModule_WrongArity(ctx);
    static const char *const lines[] = {
        "TGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "INFO <key> <groupkey>",
        "    A group of the stream <key>: its next offset, lag, pending, expired and",
        "    delivered offsets, and the consumers holding leases.",
        "PENDING <key> <groupkey> <offset> <count>",
        "    Up to <count> pending ranges from <offset> on: start, count, consumer,",
        "    deliveries, lease deadline.",
        "HELP",
        "    Prints this help.",
    };
    size_t n = sizeof(lines) / sizeof(lines[0]);
    RedisModule_ReplyWithArray(ctx, (long)n);
    for (size_t i = 0; i < n; i++) RedisModule_ReplyWithSimpleString(ctx, lines[i]);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * Internal: RCP11.LEASE and RCP11.GROUP (replication and the AOF)
 * --------------------------------------------------------------------- */

static int ra_parse_u64(RedisModuleString *arg, uint64_t max, uint64_t *out) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(arg, &len);
    return rl_parse_offset(p, len, max, out);
}

/* RCP11.LEASE groupkey key floor start count deadline deliveries consumer */
static int ra_lease_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 9) return RedisModule_WrongArity(ctx);
    if (rl_internal_refused(ctx, "RCP11.LEASE")) return REDISMODULE_OK;
    uint64_t floor, start, count, deliveries;
    long long deadline;
    size_t clen;
    const char *consumer = RedisModule_StringPtrLen(argv[8], &clen);
    if (!ra_parse_u64(argv[3], RL_OFFSET_END, &floor) ||
        !ra_parse_u64(argv[4], RL_OFFSET_END, &start) ||
        !ra_parse_u64(argv[5], RL_OFFSET_END - start, &count) ||
        RedisModule_StringToLongLong(argv[6], &deadline) != REDISMODULE_OK ||
        !ra_parse_u64(argv[7], UINT32_MAX, &deliveries) || (count > 0 && deliveries == 0) ||
        clen > AG_MAX_OWNER_BYTES)
        return RedisModule_ReplyWithError(ctx, RA_ERR_BAD_LEASE);
    ra_open o;
    if (!ra_open_group(ctx, argv[1], argv[2], REDISMODULE_READ | REDISMODULE_WRITE, &o))
        return REDISMODULE_OK;
    if (!ra_materialize(ctx, argv[2], &o, floor)) {
        ra_close(&o);
        return REDISMODULE_OK;
    }
    ag_floor(o.g, floor);
    ag_lease(o.g, start, count, (int64_t)deadline, (uint32_t)deliveries, consumer, clen);
    ra_store(&o);
    ra_close(&o);
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* RCP11.GROUP key blob: the group as ag_serialize wrote it, replacing what
 * the key holds (an AOF rewritten without the RDB preamble). */
static int ra_group_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    if (rl_internal_refused(ctx, "RCP11.GROUP")) return REDISMODULE_OK;
    size_t len;
    const char *blob = RedisModule_StringPtrLen(argv[2], &len);
    int err;
    ag_group *g = ag_load(blob, len, &err);
    if (g == NULL) return RedisModule_ReplyWithError(ctx, RA_ERR_BAD_GROUP);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModule_ModuleTypeSetValue(key, ra_type, g);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* ------------------------------------------------------------------------
 * The data type
 * --------------------------------------------------------------------- */

static size_t ra_mem_usage(const void *value) { return (size_t)ag_memory_bytes(value); }

static void ra_free(void *value) { ag_free(value); }

static size_t ra_free_effort(RedisModuleString *key, const void *value) {
    (void)key;
    return (size_t)ag_num_ranges(value) + 1;
}

/* ------------------------------------------------------------------------
 * Registration
 * --------------------------------------------------------------------- */

static RedisModuleCommandKeySpec ra_tack_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_UPDATE), {0}};
static RedisModuleCommandKeySpec ra_tgroup_specs[] = {
    RL_KEY_AT(2, REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_ACCESS),
    RL_KEY_AT(3, REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_ACCESS), {0}};
/* RCP11.LEASE writes its group key and reads the stream's name only. */
static RedisModuleCommandKeySpec ra_lease_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_UPDATE),
    RL_KEY_AT(2, REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_ACCESS), {0}};
static RedisModuleCommandKeySpec ra_group_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_OW | REDISMODULE_CMD_KEY_UPDATE), {0}};

/* Argument docs (COMMAND DOCS), as rcp11-server's. */
static RedisModuleCommandArg ra_range_args[] = {
    RL_ARG("start", INTEGER, NULL, 0), RL_ARG("count", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg ra_tack_docs[] = {
    RL_KEY_ARG("groupkey", 0, NULL, 0), RL_GROUP_ARG("range", BLOCK, ra_range_args, RL_MULTIPLE),
    {0}};
static RedisModuleCommandArg ra_info_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_KEY_ARG("groupkey", 1, NULL, 0), {0}};
static RedisModuleCommandArg ra_pending_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_KEY_ARG("groupkey", 1, NULL, 0),
    RL_ARG("offset", INTEGER, NULL, 0), RL_ARG("count", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg ra_lease_docs[] = {
    RL_KEY_ARG("groupkey", 0, NULL, 0),  RL_KEY_ARG("key", 1, NULL, 0),
    RL_ARG("floor", INTEGER, NULL, 0),   RL_ARG("start", INTEGER, NULL, 0),
    RL_ARG("count", INTEGER, NULL, 0),   RL_ARG("deadline-ms", INTEGER, NULL, 0),
    RL_ARG("deliveries", INTEGER, NULL, 0), RL_ARG("consumer", STRING, NULL, 0), {0}};
static RedisModuleCommandArg ra_group_docs[] = {
    RL_KEY_ARG("groupkey", 0, NULL, 0), RL_ARG("group-blob", STRING, NULL, 0), {0}};

/* The commands of this file, created in this order ("tgroup|x": a
 * subcommand of the container "tgroup", created before them), with their
 * ACL categories as module.c files its own (rl_command). */
typedef struct ra_command {
    const char *name;
    RedisModuleCmdFunc fn;
    const char *flags;
    int firstkey, lastkey, keystep, arity;
    const char *summary;
    RedisModuleCommandKeySpec *specs;
    const char *acl;
    RedisModuleCommandArg *args;
    const char *complexity;
} ra_command;

static const ra_command ra_commands[] = {
    {"tack", ra_tack, "write fast", 1, 1, 1, -4,
     "Acknowledge offsets leased by an acknowledged group", ra_tack_specs, "write fast",
     ra_tack_docs, "O(N log R): N ranges acknowledged, R pending ranges"},
    {"rcp11.lease", ra_lease_command, "write", 1, 2, 1, 9,
     "Lease offsets of an acknowledged group (replication and AOF only)", ra_lease_specs,
     "write fast", ra_lease_docs, "O(log R) for R pending ranges"},
    {"rcp11.group", ra_group_command, "write", 1, 1, 1, 3,
     "Install a serialized acknowledged group (AOF rewrites only)", ra_group_specs, "write slow",
     ra_group_docs, "O(N) for the N bytes of the group"},
    {"tgroup|info", ra_tgroup_info, "readonly", 2, 3, 1, 4,
     "Describe a consumer group of a stream", ra_tgroup_specs, "read slow", ra_info_docs,
     "O(R + C): R pending ranges, C consumers"},
    {"tgroup|pending", ra_tgroup_pending, "readonly", 2, 3, 1, 6,
     "List the pending ranges of an acknowledged group", ra_tgroup_specs, "read slow",
     ra_pending_docs, "O(log R + M): R pending ranges, M returned"},
    {"tgroup|help", ra_tgroup_help, "readonly", 0, 0, 0, 2, "Show TGROUP's subcommands", NULL,
     "slow", NULL, "O(1)"},
};

/* The data type's callbacks: the group is an ag_group, saved as its blob
 * by module_rdb.c's ra_ callbacks. */
static RedisModuleTypeMethods ra_methods = {
    .version = REDISMODULE_TYPE_METHOD_VERSION,
    .rdb_load = ra_rdb_load,
    .rdb_save = ra_rdb_save,
    .aof_rewrite = ra_aof_rewrite,
    .mem_usage = ra_mem_usage,
    .digest = ra_digest,
    .free = ra_free,
    .free_effort = ra_free_effort,
    .copy2 = ra_copy,
};

int ra_register(RedisModuleCtx *ctx) {
    ra_armed = RedisModule_CreateDict(NULL);
    ra_type = RedisModule_CreateDataType(ctx, RA_TYPE_NAME, RA_ENCVER, &ra_methods);
    if (ra_type == NULL) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "tgroup", NULL, "", 0, 0, 0) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    RedisModuleCommand *tgroup = RedisModule_GetCommand(ctx, "tgroup");
    if (tgroup == NULL) return REDISMODULE_ERR;
    /* COMMAND DOCS of the container, as Redis's own (XINFO) have them. */
    if (rl_set_command_info(ctx, "tgroup", -2, "A container for acknowledged group commands",
                            "1.1.0", NULL, NULL, "Depends on subcommand.") != REDISMODULE_OK)
        return REDISMODULE_ERR;
    for (size_t i = 0; i < sizeof(ra_commands) / sizeof(ra_commands[0]); i++) {
        const ra_command *c = &ra_commands[i];
        int created;
        if (strncmp(c->name, "tgroup|", 7) == 0)
            created = RedisModule_CreateSubcommand(tgroup, c->name + 7, c->fn, c->flags,
                                                   c->firstkey, c->lastkey, c->keystep);
        else
            created = RedisModule_CreateCommand(ctx, c->name, c->fn, c->flags, c->firstkey,
                                                c->lastkey, c->keystep);
        if (created != REDISMODULE_OK) return REDISMODULE_ERR;
        /* Commands of this file came with version 1.1.0 of the module. */
        if (rl_set_command_info(ctx, c->name, c->arity, c->summary, "1.1.0", c->specs, c->args,
                                c->complexity) != REDISMODULE_OK ||
            rl_set_command_acl(ctx, c->name, c->acl) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}
