/* module_reserve.c -- no offset is ever handed out twice, inside Redis.
 *
 * THE PROMISE
 * ===========
 *
 * docs/PROTOCOL.md promises that an offset, once returned to a writer, is
 * never returned for another message of that stream: not after kill -9,
 * not after an AOF that lost its tail (appendfsync everysec and a power
 * loss), not after a failover to a replica that had not received the last
 * writes. rcp11-server keeps it with a reservations file (rcp11/persistence/
 * reservations.py). Inside Redis the data may live on other machines, so
 * the same idea is applied twice: a stream's offsets are reserved ahead of
 * use, and a reservation must be durable here AND applied by every online
 * replica before an offset in it is handed out.
 *
 * Each stream carries (in the core's embedder block, rv_state):
 *
 *     next <= confirmed <= mark
 *
 *   mark       the highest reservation made (primary) or received (replica)
 *   confirmed  offsets below it are reserved in this node's offsets file,
 *              fsynced, and acknowledged by every online replica (their
 *              replication offset is past the RCP11.RESERVE that made it)
 *
 * A primary hands out offsets below `confirmed` only, and only while the
 * mark is filed under the stream's current key (rv_state.filed): the file
 * knows marks by key, so a stream that arrived by RENAME, MOVE, RESTORE or
 * DEBUG RELOAD reserves again under its new name first. A write that needs
 * more makes a reservation (mark = what it needs + a step sized by the
 * write rate, doubled while reservations come less than a second apart):
 *
 *   1. append LIVE(db, key, mark) to the offsets file (write(2); a full
 *      disk refuses the write with -MISCONF before anything happened);
 *   2. propagate RCP11.RESERVE key mark to the AOF and the replicas, which
 *      raise their copy of the mark (and write it to their own file);
 *   3. wait, the client blocked, until the file is fsynced (by the
 *      offsets file's background thread) and the replicas' acknowledged
 *      offset passed the reservation; then run the command again (rerun),
 *      which now finds it confirmed.
 *
 * A write also reserves ahead, before it needs to (rl_resv_wrote): when
 * the next offset comes within half a step of the mark, so that at a
 * steady rate no write ever waits -- only a stream's first write and bursts
 * do, for an fsync and one round trip to the replicas. With no replica
 * online (and rcp11.reservation-min-replicas 0) nothing is waited for but
 * the file: the reservation is confirmed at once and the hook fsyncs the
 * file before any reply of the event-loop turn is sent (Redis writes
 * replies after the hook); a reservation made after the hook, or for a
 * client whose earlier reply is still being written (its write handler
 * could send this reply before the hook), is fsynced inline. Reservations
 * made ahead wait for the background fsync, so a steady writer never stops
 * the event loop for one.
 *
 *   TWRITE k x ──> admit: next+1 <= confirmed? ── yes ──> append, reply
 *                      │ no
 *                      v
 *                  LIVE(k, m) to the file, RCP11.RESERVE k m to replicas
 *                      │
 *                      v
 *       block ··· hook: fsync; INFO replication: every online replica's
 *                 ack >= offset after RESERVE? ── no ──> REPLCONF GETACK,
 *                      │ yes                              wait (timeout:
 *                      v                                  -NOREPLICAS)
 *                  rerun TWRITE: append, reply
 *
 * Redis 7.0 has no module call that asks replicas for an acknowledgement,
 * so the hook sends REPLCONF GETACK * to the replicas only (RM_Replicate
 * with "A"), as WAIT does, and reads their acknowledged offsets from INFO
 * replication. The hook is REDISMODULE_EVENT_EVENTLOOP before-sleep: in
 * Redis 7.0 it runs after the commands of a turn and before blocked module
 * clients are served, the AOF is written and replies are sent.
 *
 * When the replicas do not acknowledge within rcp11.reservation-timeout-ms,
 * rcp11.reservation-on-timeout decides: `refuse` (the default) answers
 * -NOREPLICAS and writes nothing, as min-replicas-to-write would; `write`
 * runs the write anyway (counted in INFO): a failover in that window may
 * hand those offsets out again. Inside MULTI/EXEC, Lua or RM_Call a client
 * cannot block: a write that needs an unconfirmed reservation (a stream's
 * first write, a burst past the reserve ahead) gets the choice at once,
 * from rcp11.reservation-in-multi: `write` (the default, so that
 * transactions keep working: the Spark sink's commit is one) or `refuse`
 * (-NOREPLICAS; the reservation is still sent, so a retry passes).
 * A replica that comes online has not read the reservations confirmed
 * without it yet (by the file alone, or by the other replicas) (they sit behind everything sent during its sync): until
 * it acknowledged the offset of its arrival (rv.barrier_*), writes inside
 * them reserve and wait as new ones do (rv_confirmed_holds).
 * Replicas not online (in a full sync, disconnected) are not waited for;
 * rcp11.reservation-min-replicas refuses writes while fewer are online.
 *
 * RECOVERY: RAISE TO THE MARK
 * ===========================
 *
 * A node that may hand out offsets again after losing some raises each
 * stream to its mark before its first write, so that a gap of nulls
 * replaces reuse:
 *
 *   - at start-up: marks come from the offsets file (what this node
 *     reserved, fsynced) and from the loaded RDB/AOF (RCP11.RESERVE, the
 *     mark saved in RDB values: what it received); the higher wins. A
 *     stream the files lost altogether comes back empty at its mark when
 *     it is next written. After a clean SHUTDOWN of a primary the file
 *     holds each stream's next offset exactly (tight), so a clean restart
 *     leaves no gap.
 *   - at promotion (ROLE_CHANGED now-master): the marks it received.
 *
 * Both bump rv.epoch; a stream whose epoch is older is raised by the
 * first write that touches it (rv_catch_up), which propagates
 * RCP11.SKIPTO key mark ahead of the write, so replicas and the AOF hold
 * the raise before anything written after it. A stream nobody writes is
 * never raised: it hands nothing out. Keys whose stream is gone keep their
 * mark in rv_missing (a replica that got RCP11.RESERVE before the stream
 * was created, a file mark after a crash): a stream created there by a
 * primary after the epoch changed starts at that mark.
 *
 * THE OFFSETS FILE
 * ================
 *
 * module_offsets_file.c keeps the marks (format, fold, deletions, torn
 * ends, compaction, clean shutdowns); this file tells it when.
 *
 * READ-COMMITTED (rcp11.read-committed yes)
 * =========================================
 *
 * TREAD and blocked readers on a primary see only offsets that every online
 * replica acknowledged, so a reader never sees a message a failover could
 * take back. Writes are numbered by turn (rc.seq); a write notes (turn,
 * next offset) in its stream (two checkpoints kept). When a reader finds
 * writes it may not see yet (rc.wanted), the hook pairs the turns written
 * since with the replication offset after them and asks the replicas for
 * theirs; once their acknowledged offset passes it, those checkpoints
 * become the streams' `committed` ends and the readers waiting are
 * signalled. Writes nobody reads cost nothing; a reader of fresh data pays
 * a round trip to the replicas (bench/module_bench.py measures it).
 * Replicas answer reads from what they have: read committed data from the
 * primary.
 */

#include "module_reserve.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module_offsets_file.h"

/* ------------------------------------------------------------------------
 * Constants
 * --------------------------------------------------------------------- */

#define RV_OFFSET_END ((uint64_t)1 << 63)
/* Reservation steps, as rcp11-server's (rcp11/limits.py): a stream's step
 * doubles while its reservations come less than RV_PACE_FAST_MS apart and
 * halves after RV_PACE_SLOW_MS without one. A failover or crash leaves a
 * gap of at most about one step. */
#define RV_STEP_MIN 1024
#define RV_STEP_MAX ((uint64_t)1 << 22)
#define RV_PACE_FAST_MS 1000
#define RV_PACE_SLOW_MS 10000
/* While writers wait, the hook runs at least this often (a timer). */
#define RV_TICK_MS 10
/* REPLCONF GETACK goes out when a new reservation or write waits and the
 * last one was answered, else again after this long. */
#define RV_GETACK_RETRY_MS 100
/* No acknowledgement progress for this long: a stalled replica. */
#define RV_STALLED_MS 10
/* Read-committed turns waiting for their acknowledgement (a ring). */
#define RV_RC_TURNS 256

#define RV_DEFAULT_FILE "rcp11-offsets.dat"

/* Why a blocked writer is let go. */
enum { RV_WAITING = 0, RV_GO, RV_REFUSE_TIMEOUT, RV_REFUSE_ROLE, RV_REFUSE_FILE };

#define RV_ERR_NOREPLICAS                                                                      \
    "NOREPLICAS the replicas did not acknowledge the offset reservation in time "              \
    "(rcp11.reservation-timeout-ms); nothing was written"
#define RV_ERR_NOREPLICAS_NOW                                                                  \
    "NOREPLICAS the offset reservation is not acknowledged by the replicas yet and a "         \
    "transaction or script cannot wait; nothing was written, retry"
#define RV_ERR_READONLY "READONLY You can't write against a read only replica."

/* ------------------------------------------------------------------------
 * Per-stream state, kept in the core's embedder block
 * --------------------------------------------------------------------- */

typedef struct rv_state {
    uint64_t mark;      /* highest reservation made or received */
    uint64_t confirmed; /* offsets below are durable and acknowledged */
    uint64_t id;        /* identity for in-flight confirmations, 0: none yet */
    uint64_t epoch;     /* rv.epoch when last caught up (0: loaded at start-up) */
    uint64_t step;      /* reservation size, 0: RV_STEP_MIN */
    int64_t last_ms;    /* when the last reservation was made */
    uint64_t committed; /* read-committed: offsets below are acknowledged */
    uint64_t rc_epoch;  /* rv.rc_epoch `committed` belongs to */
    uint64_t ck_seq[2]; /* checkpoints: turn (0: empty) ... */
    uint64_t ck_next[2];/* ... and the next offset after it */
    uint64_t filed;     /* rv_name_hash() of the key the mark was reserved
                         * under (0: none): the offsets file knows marks by
                         * key, so a stream that arrived under another name
                         * (RENAME, MOVE, RESTORE, DEBUG RELOAD) reserves
                         * again before `confirmed` counts */
    uint64_t confirm_gen; /* rv.online_gen + 1 when `confirmed` was set (0:
                           * never): by the replicas online then only */
} rv_state;

/* A stream's state, allocated by the core on first use (main thread). */
static rv_state *rv_of(mn_stream *s) { return mn_embedder_state(s, sizeof(rv_state)); }

/* The same without allocating (a fork child saving): zero state if none. */
static const rv_state *rv_peek(mn_stream *s) {
    static const rv_state none;
    const rv_state *st = mn_embedder_state(s, 0);
    return st ? st : &none;
}

/* ------------------------------------------------------------------------
 * Module state
 * --------------------------------------------------------------------- */

static struct {
    /* configs */
    long long timeout_ms;   /* rcp11.reservation-timeout-ms */
    long long min_replicas; /* rcp11.reservation-min-replicas */
    int on_timeout;         /* rcp11.reservation-on-timeout: 0 refuse, 1 write */
    int in_multi;           /* rcp11.reservation-in-multi: 0 refuse, 1 write */
    int read_committed;     /* rcp11.read-committed */
    RedisModuleString *file_name; /* rcp11.offsets-file */

    uint64_t epoch;    /* bumped at start-up recovery and at each promotion */
    uint64_t rc_epoch; /* bumped at each promotion */
    uint64_t next_id;
    int recovered;     /* start-up recovery done (first before-sleep) */
    int after_hook;    /* the before-sleep hook ran in this event-loop turn */
    uint64_t turn;     /* event-loop turns (after-sleep events) */
    /* rv_reply_may_leave_now's answer for one client in this turn: a
     * client's output state does not change while its commands run, and
     * asking (CLIENT LIST) costs more than a write. */
    unsigned long long early_client;
    uint64_t early_turn;
    int early;
    int loading;       /* Redis is loading a file or a full sync */
    int rerunning;     /* a blocked writer's command runs again */
    int timer;         /* a tick timer is pending */
    int urgent;        /* a reply of this turn waits for the file's fsync */
    long long replicas_online;
    /* A replica that comes online has not seen what was confirmed without
     * it: until it acknowledged the replication offset of its arrival
     * (barrier_target, -1: read at the next hook), those confirmations do
     * not count (rv_confirmed_holds). */
    uint64_t online_gen;
    int barrier_pending;
    long long barrier_target;
    long long getack_target; /* replication offset the last GETACK asked for */
    long long getack_ms;
    long long info_ms; /* when the hook last read INFO replication */
    long long progress_ms; /* when the acknowledged offset last moved */
    long long acked_seen;  /* the acknowledged offset then */

    /* INFO */
    uint64_t reservations, waits, refused, unconfirmed, raised, getacks;
} rv = {.timeout_ms = 1000, .in_multi = 1, .rc_epoch = 1, .getack_target = -1};

/* Keys without a stream that have a mark: "<db u32><name>" -> rv_state. */
static RedisModuleDict *rv_missing;

/* Reservations propagated and not yet known applied by the replicas. */
typedef struct rv_flight {
    struct rv_flight *next;
    RedisModuleString *key;
    int db;
    uint64_t id, mark;
    uint64_t gen;     /* the file's generation holding it (of_live_gen) */
    long long target; /* replication offset after it, -1: not read yet */
} rv_flight;
static rv_flight *rv_flights, **rv_flights_tail = &rv_flights;
/* The first flight without a target: the ones after it have none either
 * (targets go out in order, and the file's generations only grow), so the
 * hook's work is what changed, not every flight (a replica that stalls
 * while many streams reserve piles them up). NULL: none. */
static rv_flight *rv_unassigned;

/* Writers blocked until their reservation is confirmed (in block order). */
typedef struct rv_waiter {
    struct rv_waiter *prev, *next;
    RedisModuleBlockedClient *bc;
    RedisModuleString *key;
    int db;
    int listed;
    int verdict;
    uint64_t n;
    int64_t deadline_ms;
    RedisModuleCmdFunc rerun;
} rv_waiter;
static rv_waiter *rv_waiters_head, *rv_waiters_tail;
static uint64_t rv_waiting;

/* Read-committed turns: writes of turn `seq` are acknowledged once the
 * replicas' offset passes `target`. */
static struct {
    uint64_t seq;       /* the current turn (writes now belong to it) */
    int dirty;          /* the current turn wrote */
    int wanted;         /* a reader found writes not acknowledged yet */
    uint64_t acked_seq; /* every turn up to it is acknowledged */
    struct {
        uint64_t seq;
        long long target;
    } turns[RV_RC_TURNS];
    unsigned head, count;
    RedisModuleDict *signal; /* "<db><key>" of readers to wake on progress */
} rc = {.seq = 1};

/* ------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------- */

static int64_t rv_now_ms(void) { return RedisModule_Milliseconds(); }

static uint64_t rv_max(uint64_t a, uint64_t b) { return a > b ? a : b; }

static uint64_t rv_add_sat(uint64_t a, uint64_t b) {
    return b >= RV_OFFSET_END - a ? RV_OFFSET_END : a + b;
}

/* The mark as it stands: never below the next offset (an old RDB, a
 * SKIPTO past it). */
static uint64_t rv_mark(mn_stream *s) { return rv_max(rv_peek(s)->mark, mn_next_offset(s)); }

/* The name a mark is filed under in the offsets file, as a 64-bit FNV-1a
 * hash of the database and the key (never 0, which means "none"). */
static uint64_t rv_name_hash(int db, RedisModuleString *name) {
    size_t len;
    const unsigned char *p = (const unsigned char *)RedisModule_StringPtrLen(name, &len);
    uint64_t h = 0xcbf29ce484222325ULL;
    uint32_t d = (uint32_t)db;
    for (int i = 0; i < 4; i++) h = (h ^ ((d >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h ? h : 1;
}

/* Whether nothing needs acknowledging: no replica online, none required. */
static int rv_immediate(void) { return rv.replicas_online == 0 && rv.min_replicas == 0; }

/* Whether the stream's `confirmed` still holds at this key. Not when it
 * arrived here by another route than its own writes (RENAME, MOVE,
 * RESTORE, DEBUG RELOAD: its mark is filed under another name, or
 * nowhere), nor when a replica came online since it was confirmed (by
 * the file alone, or by the replicas online then) that has not
 * acknowledged the offset of its arrival yet (the reservation may still
 * sit in its output buffer: promoted now, it would hand those offsets out
 * again). Then `confirmed` drops to the next offset and the next write
 * reserves anew. */
static int rv_confirmed_holds(rv_state *st, uint64_t name_hash, uint64_t next) {
    if (st->filed == name_hash &&
        (st->confirm_gen == rv.online_gen + 1 || !rv.barrier_pending || rv_immediate()))
        return 1;
    if (st->confirmed > next) st->confirmed = next;
    return 0;
}

static char *rv_dict_key_of(int db, RedisModuleString *name, size_t *out_len) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(name, &len);
    return of_key(db, p, len, out_len);
}

/* The mark of a missing key; created (zero, this epoch) when asked to. */
static rv_state *rv_missing_get(int db, RedisModuleString *name, int create) {
    size_t klen;
    char *k = rv_dict_key_of(db, name, &klen);
    int nokey;
    rv_state *st = RedisModule_DictGetC(rv_missing, k, klen, &nokey);
    if ((nokey || st == NULL) && create) {
        st = RedisModule_Calloc(1, sizeof(*st));
        st->epoch = rv.epoch;
        RedisModule_DictSetC(rv_missing, k, klen, st);
    } else if (nokey) {
        st = NULL;
    }
    RedisModule_Free(k);
    return st;
}

static void rv_missing_del(int db, RedisModuleString *name) {
    size_t klen;
    char *k = rv_dict_key_of(db, name, &klen);
    rv_state *st = NULL;
    if (RedisModule_DictDelC(rv_missing, k, klen, &st) == REDISMODULE_OK && st != NULL)
        RedisModule_Free(st);
    RedisModule_Free(k);
}

/* Drop every missing-key mark of db (-1: all): the keys found in one pass,
 * then deleted. */
static void rv_missing_flush(int db) {
    size_t count = 0, cap = 0;
    char **keys = NULL;
    size_t *lens = NULL;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(rv_missing, "^", NULL, 0);
    size_t klen;
    void *value;
    char *k;
    while ((k = RedisModule_DictNextC(it, &klen, &value)) != NULL) {
        if (db != -1 && of_key_db(k) != db) continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            keys = RedisModule_Realloc(keys, cap * sizeof(*keys));
            lens = RedisModule_Realloc(lens, cap * sizeof(*lens));
        }
        keys[count] = RedisModule_Alloc(klen);
        memcpy(keys[count], k, klen);
        lens[count++] = klen;
        RedisModule_Free(value);
    }
    RedisModule_DictIteratorStop(it);
    for (size_t i = 0; i < count; i++) {
        RedisModule_DictDelC(rv_missing, keys[i], lens[i], NULL);
        RedisModule_Free(keys[i]);
    }
    RedisModule_Free(keys);
    RedisModule_Free(lens);
}

static void rv_replicate_offset(RedisModuleCtx *ctx, const char *command, RedisModuleString *key,
                                uint64_t offset) {
    char digits[24];
    snprintf(digits, sizeof(digits), "%llu", (unsigned long long)offset);
    RedisModule_Replicate(ctx, command, "sc", key, digits);
}

/* ------------------------------------------------------------------------
 * Replicas: how many are online, what they acknowledged
 * --------------------------------------------------------------------- */

typedef struct rv_repl {
    long long offset;  /* master_repl_offset */
    long long online;  /* replicas in state online */
    long long min_ack; /* the lowest offset they acknowledged */
} rv_repl;

/* "key=value" in a comma-separated INFO value. */
static const char *rv_info_item(const char *line, const char *key) {
    size_t klen = strlen(key);
    for (const char *p = line; p && *p;) {
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') return p + klen + 1;
        p = strchr(p, ',');
        if (p) p++;
    }
    return NULL;
}

static void rv_read_repl(rv_repl *r) {
    RedisModuleServerInfoData *info = RedisModule_GetServerInfo(NULL, "replication");
    const char *v = RedisModule_ServerInfoGetFieldC(info, "master_repl_offset");
    r->offset = v ? strtoll(v, NULL, 10) : 0;
    r->online = 0;
    r->min_ack = LLONG_MAX;
    for (int i = 0;; i++) {
        char field[24];
        snprintf(field, sizeof(field), "slave%d", i);
        const char *line = RedisModule_ServerInfoGetFieldC(info, field);
        if (line == NULL) break;
        const char *state = rv_info_item(line, "state");
        const char *offset = rv_info_item(line, "offset");
        if (state == NULL || strncmp(state, "online,", 7) != 0 || offset == NULL) continue;
        long long ack = strtoll(offset, NULL, 10);
        r->online++;
        if (ack < r->min_ack) r->min_ack = ack;
    }
    RedisModule_FreeServerInfo(NULL, info);
}

/* The replication offset everything up to which counts as acknowledged:
 * LLONG_MAX with no replica to wait for, -1 while fewer than
 * rcp11.reservation-min-replicas are online. */
static long long rv_acked(const rv_repl *r) {
    if (r->online < rv.min_replicas) return -1;
    if (r->online == 0) return LLONG_MAX;
    return r->min_ack;
}

static void rv_on_replica_change(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                                 void *data) {
    (void)ctx;
    (void)eid;
    (void)data;
    if (subevent == REDISMODULE_SUBEVENT_REPLICA_CHANGE_ONLINE) {
        rv.replicas_online++;
        rv.online_gen++;
        rv.barrier_pending = 1;
        rv.barrier_target = -1;
    } else if (rv.replicas_online > 0) {
        rv.replicas_online--;
    }
}

/* ------------------------------------------------------------------------
 * Reserving, confirming, catching up
 * --------------------------------------------------------------------- */

/* Reserve so that offsets below need may be handed out: a new mark, in
 * the file (written) and in the replication stream. 0 when the file
 * refused it (nothing changed). */
static int rv_reserve(RedisModuleCtx *ctx, RedisModuleString *key, int db, rv_state *st,
                      uint64_t need, uint64_t n) {
    int64_t now = rv_now_ms();
    uint64_t step = st->step ? st->step : RV_STEP_MIN;
    if (st->last_ms != 0 && now - st->last_ms < RV_PACE_FAST_MS)
        step = step * 2 < RV_STEP_MAX ? step * 2 : RV_STEP_MAX;
    else if (st->last_ms != 0 && now - st->last_ms > RV_PACE_SLOW_MS)
        step = step / 2 > RV_STEP_MIN ? step / 2 : RV_STEP_MIN;
    uint64_t ahead = n > step / 2 ? 2 * n : step;
    uint64_t mark = rv_max(rv_add_sat(need, ahead), st->mark);
    size_t klen;
    const char *k = RedisModule_StringPtrLen(key, &klen);
    if (of_reserve(db, k, klen, mark) != 0) return 0;
    st->mark = mark;
    st->filed = rv_name_hash(db, key);
    st->step = step;
    st->last_ms = now;
    if (st->id == 0) st->id = ++rv.next_id;
    rv_replicate_offset(ctx, "RCP11.RESERVE", key, mark);
    rv.reservations++;
    rv_flight *f = RedisModule_Calloc(1, sizeof(*f));
    f->key = RedisModule_CreateStringFromString(NULL, key);
    f->db = db;
    f->id = st->id;
    f->mark = mark;
    f->gen = of_live_gen();
    f->target = -1;
    *rv_flights_tail = f;
    rv_flights_tail = &f->next;
    if (rv_unassigned == NULL) rv_unassigned = f;
    return 1;
}

static void rv_flight_free(rv_flight *f) {
    RedisModule_FreeString(NULL, f->key);
    RedisModule_Free(f);
}

static void rv_flights_clear(void) {
    while (rv_flights) {
        rv_flight *f = rv_flights;
        rv_flights = f->next;
        rv_flight_free(f);
    }
    rv_flights_tail = &rv_flights;
    rv_unassigned = NULL;
}

/* A reservation is applied everywhere it must be: raise `confirmed` of the
 * stream (or missing key) it was made for, if that is still the one. */
static void rv_confirm(RedisModuleCtx *ctx, rv_flight *f) {
    if (RedisModule_SelectDb(ctx, f->db) != REDISMODULE_OK) return;
    RedisModuleKey *key = RedisModule_OpenKey(ctx, f->key, REDISMODULE_READ);
    mn_stream *s;
    if (rl_stream_of(key, &s)) {
        rv_state *st = s ? rv_of(s) : rv_missing_get(f->db, f->key, 0);
        if (st != NULL && st->id == f->id && f->mark > st->confirmed) {
            st->confirmed = f->mark < st->mark ? f->mark : st->mark;
            st->confirm_gen = rv.online_gen + 1;
        }
    }
    RedisModule_CloseKey(key);
}

/* A primary's first write to a stream after start-up or a promotion
 * raises it to its mark (see RECOVERY), ahead of the write in the
 * replication stream. Nothing beyond the next offset is confirmed yet in
 * this role. */
static void rv_catch_up(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s) {
    rv_state *st = rv_of(s);
    st->epoch = rv.epoch;
    uint64_t next = mn_next_offset(s);
    if (st->mark > next) {
        mn_raise_next_offset(s, st->mark);
        rv_replicate_offset(ctx, "RCP11.SKIPTO", key, st->mark);
        RedisModule_SignalModifiedKey(ctx, key);
        rv.raised++;
        next = st->mark;
    }
    st->mark = next;
    st->confirmed = next;
}

/* Whether the reply of the running command could reach the client before
 * the hook fsyncs: after the hook in this turn, or when the client still
 * has output from an earlier turn (Redis then installed a write handler,
 * which may send in this turn's event processing). */
static int rv_reply_may_leave_now(RedisModuleCtx *ctx) {
    if (rv.after_hook) return 1;
    unsigned long long id = RedisModule_GetClientId(ctx);
    if (id == 0) return 0;
    if (rv.early_turn == rv.turn && rv.early_client == id) return rv.early;
    RedisModuleCallReply *r = RedisModule_Call(ctx, "CLIENT", "ccl", "LIST", "ID", (long long)id);
    int early = 0;
    if (r != NULL && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_STRING) {
        size_t len;
        const char *p = RedisModule_CallReplyStringPtr(r, &len);
        for (size_t i = 0; i + 7 < len; i++) {
            if (memcmp(p + i, " events=", 8) != 0) continue;
            for (size_t j = i + 8; j < len && p[j] != ' ' && p[j] != '\n'; j++)
                if (p[j] == 'w') early = 1;
            break;
        }
    }
    if (r != NULL) RedisModule_FreeCallReply(r);
    rv.early_client = id;
    rv.early_turn = rv.turn;
    rv.early = early;
    return early;
}

/* ------------------------------------------------------------------------
 * Blocked writers
 * --------------------------------------------------------------------- */

static void rv_waiter_unlink(rv_waiter *w) {
    if (!w->listed) return;
    if (w->prev) w->prev->next = w->next;
    else rv_waiters_head = w->next;
    if (w->next) w->next->prev = w->prev;
    else rv_waiters_tail = w->prev;
    w->listed = 0;
    rv_waiting--;
}

static void rv_waiter_free(RedisModuleCtx *ctx, void *privdata) {
    (void)ctx;
    rv_waiter *w = privdata;
    rv_waiter_unlink(w);
    RedisModule_FreeString(NULL, w->key);
    RedisModule_Free(w);
}

/* Let a blocked writer go with a verdict; its reply callback runs right
 * after the hook. */
static void rv_release(rv_waiter *w, int verdict) {
    w->verdict = verdict;
    rv_waiter_unlink(w);
    RedisModule_UnblockClient(w->bc, w);
}

static int rv_unblocked(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    rv_waiter *w = RedisModule_GetBlockedClientPrivateData(ctx);
    switch (w->verdict) {
    case RV_REFUSE_TIMEOUT:
        rv.refused++;
        return RedisModule_ReplyWithError(ctx, RV_ERR_NOREPLICAS);
    case RV_REFUSE_ROLE:
        return RedisModule_ReplyWithError(ctx, RV_ERR_READONLY);
    case RV_REFUSE_FILE: {
        char msg[256];
        snprintf(msg, sizeof(msg), "MISCONF rcp11 cannot reserve offsets: %s", of_error());
        return RedisModule_ReplyWithError(ctx, msg);
    }
    default:
        rv.rerunning = 1;
        w->rerun(ctx, argv, argc);
        rv.rerunning = 0;
        return REDISMODULE_OK;
    }
}

static void rv_tick(RedisModuleCtx *ctx, void *data) {
    (void)ctx;
    (void)data;
    rv.timer = 0; /* the hook runs after this event and re-arms if needed */
}

static void rv_arm_timer(RedisModuleCtx *ctx) {
    if (rv.timer) return;
    rv.timer = 1;
    RedisModule_CreateTimer(ctx, RV_TICK_MS, rv_tick, NULL);
}

/* ------------------------------------------------------------------------
 * Admission: the write path
 * --------------------------------------------------------------------- */

/* A write that cannot wait for its reservation's confirmation: inside a
 * transaction or script (rcp11.reservation-in-multi), or run again after
 * its wait (rcp11.reservation-on-timeout write let it go unconfirmed). */
static int rv_cannot_wait(RedisModuleCtx *ctx) {
    if (rv.rerunning ? rv.on_timeout == 1 : rv.in_multi == 1) {
        rv.unconfirmed++;
        return 1;
    }
    rv.refused++;
    RedisModule_ReplyWithError(ctx, RV_ERR_NOREPLICAS_NOW);
    return 0;
}

static int rv_reply_misconf(RedisModuleCtx *ctx) {
    char msg[256];
    snprintf(msg, sizeof(msg), "MISCONF rcp11 cannot reserve offsets: %s", of_error());
    RedisModule_ReplyWithError(ctx, msg);
    return 0;
}

int rl_resv_admit(RedisModuleCtx *ctx, RedisModuleString *name, uint64_t n,
                  RedisModuleCmdFunc rerun) {
    int flags = RedisModule_GetContextFlags(ctx);
    /* The primary's commands and the AOF replay what was admitted there; a
     * writable replica's own writes stay local (and carry no promise). */
    if (flags & (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)) return 1;
    if (!(flags & REDISMODULE_CTX_FLAGS_MASTER)) return 1;
    int db = RedisModule_GetSelectedDb(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    mn_stream *s;
    if (!rl_stream_of(key, &s)) {
        RedisModule_CloseKey(key);
        return 1; /* the command answers -WRONGTYPE */
    }
    rv_state *st;
    if (s != NULL) {
        st = rv_of(s);
        if (st->epoch != rv.epoch) rv_catch_up(ctx, name, s);
    } else {
        st = rv_missing_get(db, name, 1);
        if (st->epoch != rv.epoch) {
            /* A mark from before the crash or promotion: the stream comes
             * back empty at it. */
            s = rl_stream_create(key);
            if (s == NULL) {
                RedisModule_CloseKey(key);
                return 1;
            }
            *rv_of(s) = *st;
            rv_missing_del(db, name);
            rv_catch_up(ctx, name, s);
            st = rv_of(s);
        }
    }
    uint64_t next = s ? mn_next_offset(s) : 0;
    if (n > RV_OFFSET_END - next) {
        RedisModule_CloseKey(key);
        return 1; /* the command answers the overflow */
    }
    uint64_t need = next + n;
    int holds = rv_confirmed_holds(st, rv_name_hash(db, name), next);
    if (need <= st->confirmed) {
        RedisModule_CloseKey(key);
        return 1;
    }
    uint64_t mark = s ? rv_mark(s) : st->mark;
    if ((need > mark || !holds) && !rv_reserve(ctx, name, db, st, need, n)) {
        RedisModule_CloseKey(key);
        return rv_reply_misconf(ctx);
    }
    RedisModule_CloseKey(key);
    if (rv_immediate()) {
        /* Nothing to wait for but the fsync, before the reply leaves. */
        if (rv_reply_may_leave_now(ctx)) {
            if (of_fsync() != 0) return rv_reply_misconf(ctx);
        } else {
            rv.urgent = 1;
        }
        st->confirmed = st->mark;
        st->confirm_gen = rv.online_gen + 1;
        return 1;
    }
    if ((flags & (REDISMODULE_CTX_FLAGS_MULTI | REDISMODULE_CTX_FLAGS_LUA |
                  REDISMODULE_CTX_FLAGS_DENY_BLOCKING)) ||
        rv.rerunning)
        return rv_cannot_wait(ctx);
    rv_waiter *w = RedisModule_Calloc(1, sizeof(*w));
    w->key = RedisModule_CreateStringFromString(NULL, name);
    w->db = db;
    w->n = n;
    w->rerun = rerun;
    w->deadline_ms = rv_now_ms() + rv.timeout_ms;
    w->bc = RedisModule_BlockClient(ctx, rv_unblocked, NULL, rv_waiter_free, 0);
    w->listed = 1;
    w->prev = rv_waiters_tail;
    if (rv_waiters_tail) rv_waiters_tail->next = w;
    else rv_waiters_head = w;
    rv_waiters_tail = w;
    rv_waiting++;
    rv.waits++;
    rv_arm_timer(ctx);
    return 0;
}

/* ------------------------------------------------------------------------
 * Read-committed
 * --------------------------------------------------------------------- */

static int rv_rc_active(RedisModuleCtx *ctx) {
    if (!rv.read_committed) return 0;
    int flags = RedisModule_GetContextFlags(ctx);
    return (flags & REDISMODULE_CTX_FLAGS_MASTER) &&
           !(flags & (REDISMODULE_CTX_FLAGS_LOADING | REDISMODULE_CTX_FLAGS_REPLICATED));
}

/* Move checkpoints whose turn is acknowledged into `committed`. */
static void rv_ck_advance(rv_state *st) {
    while (st->ck_seq[0] != 0 && st->ck_seq[0] <= rc.acked_seq) {
        st->committed = st->ck_next[0];
        st->ck_seq[0] = st->ck_seq[1];
        st->ck_next[0] = st->ck_next[1];
        st->ck_seq[1] = 0;
    }
}

static void rv_ck_push(rv_state *st, uint64_t next) {
    rv_ck_advance(st);
    uint64_t seq = rc.seq;
    rc.dirty = 1;
    if (st->ck_seq[1] == seq || (st->ck_seq[1] == 0 && st->ck_seq[0] == seq)) {
        st->ck_next[st->ck_seq[1] == seq ? 1 : 0] = next;
    } else if (st->ck_seq[0] == 0) {
        st->ck_seq[0] = seq;
        st->ck_next[0] = next;
    } else {
        /* The second slot takes the newest turn (a full second slot is
         * overwritten: its end then waits for the newer turn). */
        st->ck_seq[1] = seq;
        st->ck_next[1] = next;
    }
}

/* A stream this primary has not tracked yet (a promotion, the option just
 * turned on): what it holds must be acknowledged before readers see it. */
static void rv_rc_adopt(rv_state *st, uint64_t next) {
    if (st->rc_epoch == rv.rc_epoch) return;
    st->rc_epoch = rv.rc_epoch;
    if (st->committed > next) st->committed = next;
    st->ck_seq[0] = st->ck_seq[1] = 0;
    if (st->committed < next) rv_ck_push(st, next);
}

uint64_t rl_resv_readable_next(RedisModuleCtx *ctx, mn_stream *s) {
    if (s == NULL) return 0;
    uint64_t next = mn_next_offset(s);
    if (!rv_rc_active(ctx)) return next;
    rv_state *st = rv_of(s);
    if (rv_immediate()) {
        st->committed = next;
        st->rc_epoch = rv.rc_epoch;
        st->ck_seq[0] = st->ck_seq[1] = 0;
        return next;
    }
    rv_rc_adopt(st, next);
    rv_ck_advance(st);
    if (st->committed >= next) return next;
    rc.wanted = 1; /* the hook asks the replicas for their offset */
    return st->committed;
}

void rl_resv_reader_waits(RedisModuleCtx *ctx, RedisModuleString *key) {
    if (!rv_rc_active(ctx)) return;
    size_t klen;
    char *k = rv_dict_key_of(RedisModule_GetSelectedDb(ctx), key, &klen);
    RedisModule_DictReplaceC(rc.signal, k, klen, NULL);
    RedisModule_Free(k);
    rc.wanted = 1;
    rv_arm_timer(ctx);
}

/* The hook's part: pair the writes since the last push (when a reader
 * wants them) with the replication offset after them, move the
 * acknowledged turns on, wake readers. */
static void rv_rc_hook(RedisModuleCtx *ctx, long long offset, long long acked, int paused,
                       int push) {
    if (push) {
        if (rc.count == RV_RC_TURNS) {
            /* Full: the newest entry covers this turn too (later ack). */
            unsigned last = (rc.head + rc.count - 1) % RV_RC_TURNS;
            rc.turns[last].seq = rc.seq;
            rc.turns[last].target = offset;
        } else {
            unsigned at = (rc.head + rc.count) % RV_RC_TURNS;
            rc.turns[at].seq = rc.seq;
            rc.turns[at].target = offset;
            rc.count++;
        }
        rc.dirty = 0;
        rc.wanted = 0;
        rc.seq++;
    }
    int moved = 0;
    while (rc.count > 0 && rc.turns[rc.head].target <= acked) {
        rc.acked_seq = rc.turns[rc.head].seq;
        rc.head = (rc.head + 1) % RV_RC_TURNS;
        rc.count--;
        moved = 1;
    }
    if (rc.count == 0 && acked >= 0 && rc.acked_seq < rc.seq - 1) {
        rc.acked_seq = rc.seq - 1;
        moved = 1;
    }
    if (paused || RedisModule_DictSize(rc.signal) == 0 || !moved) return;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(rc.signal, "^", NULL, 0);
    size_t klen;
    char *k;
    while ((k = RedisModule_DictNextC(it, &klen, NULL)) != NULL) {
        if (RedisModule_SelectDb(ctx, of_key_db(k)) != REDISMODULE_OK)
            continue;
        RedisModuleString *name = RedisModule_CreateString(NULL, k + 4, klen - 4);
        RedisModule_SignalKeyAsReady(ctx, name);
        RedisModule_FreeString(NULL, name);
    }
    RedisModule_DictIteratorStop(it);
    RedisModule_FreeDict(NULL, rc.signal);
    rc.signal = RedisModule_CreateDict(NULL);
}

static void rv_rc_reset(void) {
    rc.count = 0;
    rc.head = 0;
    rc.dirty = 0;
    rc.acked_seq = rc.seq;
    rc.seq++;
}

/* ------------------------------------------------------------------------
 * After a write; a stream is created
 * --------------------------------------------------------------------- */

void rl_resv_wrote(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s) {
    int flags = RedisModule_GetContextFlags(ctx);
    if (!(flags & REDISMODULE_CTX_FLAGS_MASTER) ||
        (flags & (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)))
        return;
    rv_state *st = rv_of(s);
    uint64_t next = mn_next_offset(s);
    /* Reserve ahead: the next reservation is confirmed before it is needed
     * (one at a time: none while one is in flight). */
    uint64_t step = st->step ? st->step : RV_STEP_MIN;
    uint64_t mark = rv_mark(s);
    if (st->epoch == rv.epoch && st->confirmed >= mark && mark - next < step / 2 &&
        mark < RV_OFFSET_END && !of_failing())
        rv_reserve(ctx, key, RedisModule_GetSelectedDb(ctx), st, next, 0);
    if (!rv.read_committed) return;
    if (rv_immediate()) {
        st->committed = next;
        st->rc_epoch = rv.rc_epoch;
        st->ck_seq[0] = st->ck_seq[1] = 0;
        return;
    }
    rv_rc_adopt(st, next);
    rv_ck_push(st, next);
}

void rl_resv_created(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s) {
    rv_state *st = rv_of(s);
    st->epoch = rv.epoch;
    st->rc_epoch = rv.rc_epoch;
    if (RedisModule_DictSize(rv_missing) == 0) return;
    int db = RedisModule_GetSelectedDb(ctx);
    rv_state *m = rv_missing_get(db, key, 0);
    if (m == NULL) return;
    /* The key's reservation moves into its stream; a mark from before a
     * crash or promotion keeps its old epoch, so the first write raises
     * the stream to it. */
    uint64_t mark = rv_max(st->mark, m->mark);
    *st = *m;
    st->mark = mark;
    st->rc_epoch = rv.rc_epoch;
    rv_missing_del(db, key);
}

/* ------------------------------------------------------------------------
 * The before-sleep hook
 * --------------------------------------------------------------------- */

/* One key of the offsets file's fold at start-up: a stream there continues
 * at its mark (exactly, after a clean shutdown; else above both marks), a
 * key with no stream keeps its mark for a stream created there later. */
typedef struct rv_recovery {
    RedisModuleCtx *ctx;
    int exact;
    uint64_t streams, missing;
} rv_recovery;

static void rv_recover_key(void *arg, int db, const char *k, size_t klen, of_marks *m) {
    rv_recovery *r = arg;
    if (RedisModule_SelectDb(r->ctx, db) != REDISMODULE_OK) return;
    RedisModuleString *name = RedisModule_CreateString(NULL, k, klen);
    RedisModuleKey *key = RedisModule_OpenKey(r->ctx, name, REDISMODULE_READ);
    mn_stream *s;
    if (rl_stream_of(key, &s) && s != NULL) {
        rv_state *st = rv_of(s);
        if (r->exact && m->has_live) {
            st->mark = m->live;
        } else {
            if (m->has_live) st->mark = rv_max(st->mark, m->live);
            if (m->has_deleted) st->mark = rv_max(st->mark, m->deleted);
        }
        r->streams++;
    } else if (s == NULL && m->has_live &&
               RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY) {
        rv_state *st = rv_missing_get(db, name, 1);
        st->mark = m->has_deleted ? rv_max(m->live, m->deleted) : m->live;
        st->epoch = 0; /* a floor: before the epoch bump below */
        r->missing++;
    }
    RedisModule_CloseKey(key);
    RedisModule_FreeString(NULL, name);
}

/* Start-up: the file's marks meet the loaded streams (see RECOVERY). */
static void rv_recover(RedisModuleCtx *ctx) {
    rv.recovered = 1;
    int clean, tight;
    RedisModuleDict *fold = of_take_fold(&clean, &tight);
    int exact = clean && tight;
    uint64_t streams = 0, missing = 0;
    if (fold != NULL) {
        rv_recovery rec = {ctx, exact, 0, 0};
        of_fold_each(fold, rv_recover_key, &rec);
        streams = rec.streams;
        missing = rec.missing;
        RedisModule_SelectDb(ctx, 0);
        /* The file starts over from its fold (no clean mark any more). */
        of_restart(fold);
        of_fold_free(fold);
    }
    rv.epoch++;
    rv_repl r;
    rv_read_repl(&r);
    rv.replicas_online = r.online;
    if (streams || missing)
        RedisModule_Log(ctx, "notice",
                        "rcp11: offsets file %s: %llu streams will continue at their marks, "
                        "%llu deleted-or-lost keys keep theirs (%s)",
                        of_path(), (unsigned long long)streams, (unsigned long long)missing,
                        exact ? "after a clean shutdown: no gap" : "a gap of nulls may show");
}

/* Evaluate the blocked writers: release the confirmed, reserve again for
 * those whose reservation others used up, time out the rest. */
static void rv_serve_waiters(RedisModuleCtx *ctx, int paused) {
    int64_t now = rv_now_ms();
    RedisModuleDict *granted = RedisModule_CreateDict(NULL); /* db+key -> offsets let go */
    rv_waiter *w = rv_waiters_head;
    while (w != NULL) {
        rv_waiter *next_w = w->next;
        if (RedisModule_SelectDb(ctx, w->db) != REDISMODULE_OK) {
            rv_release(w, RV_REFUSE_TIMEOUT);
            w = next_w;
            continue;
        }
        size_t klen;
        char *k = rv_dict_key_of(w->db, w->key, &klen);
        int nokey;
        uintptr_t pending = (uintptr_t)RedisModule_DictGetC(granted, k, klen, &nokey);
        RedisModuleKey *key = RedisModule_OpenKey(ctx, w->key, REDISMODULE_READ);
        mn_stream *s = NULL;
        int stream_or_empty = rl_stream_of(key, &s);
        /* A missing key whose mark a flush dropped meanwhile gets one again
         * (below) rather than waiting for nothing. */
        rv_state *st = !stream_or_empty ? NULL
                       : s ? rv_of(s)
                           : rv_missing_get(w->db, w->key, 1);
        uint64_t next = s ? mn_next_offset(s) : 0;
        uint64_t need = rv_add_sat(rv_add_sat(next, (uint64_t)pending), w->n);
        int holds = st != NULL && rv_confirmed_holds(st, rv_name_hash(w->db, w->key), next);
        int verdict = RV_WAITING;
        if (!stream_or_empty) {
            verdict = RV_GO; /* the rerun answers -WRONGTYPE */
        } else if (st != NULL && need <= st->confirmed && (s == NULL || st->epoch == rv.epoch)) {
            verdict = RV_GO;
        } else if (now >= w->deadline_ms) {
            verdict = rv.on_timeout == 1 ? RV_GO : RV_REFUSE_TIMEOUT;
        } else if (of_failing()) {
            verdict = RV_REFUSE_FILE;
        } else if (!paused && st != NULL && (s == NULL || st->epoch == rv.epoch) &&
                   (need > (s ? rv_mark(s) : st->mark) || !holds)) {
            /* Others used the reservation up meanwhile, or what confirmed
             * it does not hold here (rv_confirmed_holds): a new one. */
            if (!rv_reserve(ctx, w->key, w->db, st, need, w->n)) verdict = RV_REFUSE_FILE;
        }
        RedisModule_CloseKey(key);
        if (verdict == RV_GO && paused) verdict = RV_WAITING; /* the rerun would propagate */
        if (verdict == RV_GO) {
            RedisModule_DictReplaceC(granted, k, klen, (void *)(pending + (uintptr_t)w->n));
            rv_release(w, verdict);
        } else if (verdict != RV_WAITING) {
            rv_release(w, verdict);
        }
        RedisModule_Free(k);
        w = next_w;
    }
    RedisModule_FreeDict(NULL, granted);
}

static void rv_before_sleep(RedisModuleCtx *ctx) {
    if (!rv.recovered) rv_recover(ctx);
    of_sync(rv.urgent);
    rv.urgent = 0;
    rv.after_hook = 1;
    int primary = RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_MASTER;
    if (!primary) {
        /* A replica now: writers waiting here were never admitted. */
        while (rv_waiters_head) rv_release(rv_waiters_head, RV_REFUSE_ROLE);
        rv_flights_clear();
        return;
    }
    /* Read-committed asks the replicas only for writes a reader wants:
     * writes nobody reads yet cost nothing here. */
    int rc_want = rv.read_committed && (rc.wanted || RedisModule_DictSize(rc.signal) > 0);
    int rc_push = rc_want && rc.dirty;
    int flights_new = rv_unassigned != NULL;
    int waiting = rv_flights != NULL || rv.barrier_pending || (rv.read_committed && rc.count > 0);
    if (!flights_new && !rc_push && !waiting && rv_waiters_head == NULL) return;
    /* INFO replication is read for new work, and while an acknowledgement
     * is awaited; a replica that made no progress for RV_STALLED_MS is
     * asked at most once a millisecond (a busy server, a stopped replica). */
    int64_t now = rv_now_ms();
    if (!flights_new && !rc_push && now - rv.progress_ms > RV_STALLED_MS && now == rv.info_ms) {
        rv_arm_timer(ctx);
        return;
    }
    rv.info_ms = now;
    int paused = RedisModule_AvoidReplicaTraffic();
    rv_repl r;
    rv_read_repl(&r);
    rv.replicas_online = r.online;
    long long acked = rv_acked(&r);
    if (acked > rv.acked_seen || !waiting) {
        rv.acked_seen = acked;
        rv.progress_ms = now;
    }
    /* Reservations propagated before now get this offset as their target,
     * if the file holds them fsynced; those acknowledged are confirmed. */
    int assigned = 0;
    uint64_t synced = of_synced();
    for (; rv_unassigned != NULL && rv_unassigned->gen <= synced;
         rv_unassigned = rv_unassigned->next) {
        rv_unassigned->target = r.offset;
        assigned = 1;
    }
    while (rv_flights != NULL && rv_flights->target >= 0 && rv_flights->target <= acked) {
        rv_flight *f = rv_flights;
        rv_flights = f->next;
        if (rv_flights == NULL) rv_flights_tail = &rv_flights;
        rv_confirm(ctx, f);
        rv_flight_free(f);
    }
    if (rv.barrier_pending) {
        /* The replicas that came online hold what was sent before: the
         * confirmations made without them count again. */
        if (rv.barrier_target < 0) {
            rv.barrier_target = r.offset;
            assigned = 1;
        }
        if (r.online == 0 || acked >= rv.barrier_target) rv.barrier_pending = 0;
    }
    if (rv.read_committed) rv_rc_hook(ctx, r.offset, acked, paused, rc_push);
    rv_serve_waiters(ctx, paused);
    RedisModule_SelectDb(ctx, 0);
    /* Ask the replicas for their offset: as WAIT does, to them only. */
    waiting = rv_flights != NULL || rv.barrier_pending || (rv.read_committed && rc.count > 0);
    if (waiting && r.online > 0 && !paused &&
        (((assigned || rc_push) && r.min_ack >= rv.getack_target) ||
         now - rv.getack_ms >= RV_GETACK_RETRY_MS)) {
        RedisModule_Replicate(ctx, "REPLCONF", "Acc", "GETACK", "*");
        rv.getack_target = r.offset;
        rv.getack_ms = now;
        rv.getacks++;
    }
    if (rv_waiters_head != NULL || waiting || RedisModule_DictSize(rc.signal) > 0)
        rv_arm_timer(ctx);
}

static void rv_on_eventloop(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                            void *data) {
    (void)eid;
    (void)data;
    if (subevent == REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP) rv_before_sleep(ctx);
    else {
        rv.after_hook = 0;
        rv.turn++;
    }
}

/* ------------------------------------------------------------------------
 * Other server events
 * --------------------------------------------------------------------- */

static void rv_on_role(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)ctx;
    (void)eid;
    (void)data;
    rv_flights_clear();
    if (subevent == REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER) {
        /* Every stream is raised to what it received, at its next write. */
        rv.epoch++;
        rv.rc_epoch++;
        rv_rc_reset();
        rv_repl r;
        rv_read_repl(&r);
        rv.replicas_online = r.online;
    }
}

static void rv_on_loading(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                          void *data) {
    (void)ctx;
    (void)eid;
    (void)data;
    rv.loading = subevent != REDISMODULE_SUBEVENT_LOADING_ENDED &&
                 subevent != REDISMODULE_SUBEVENT_LOADING_FAILED;
}

static void rv_on_flush(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)ctx;
    (void)eid;
    const RedisModuleFlushInfo *info = data;
    if (subevent != REDISMODULE_SUBEVENT_FLUSHDB_END) return;
    rv_missing_flush(info->dbnum);
    of_flushed(info->dbnum);
}

/* SWAPDB: marks follow the data (streams carry theirs; the per-key tables
 * are moved), so that a confirmation or a recovery finds its stream. */
static void rv_on_swapdb(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                         void *data) {
    (void)ctx;
    (void)eid;
    (void)subevent;
    const RedisModuleSwapDbInfo *info = data;
    int a = info->dbnum_first, b = info->dbnum_second;
    of_swapped(a, b);
    of_swap_keys(rv_missing, a, b);
    of_swap_keys(rc.signal, a, b);
    for (rv_flight *f = rv_flights; f != NULL; f = f->next)
        if (f->db == a || f->db == b) f->db = f->db == a ? b : a;
}

/* Clean shutdown: the file is rewritten from the keyspace. A primary's
 * marks are the next offsets exactly (nothing beyond was handed out), so a
 * restart leaves no gap; a replica keeps what it received. */
typedef struct rv_scan_ctx {
    int db, tight;
} rv_scan_ctx;

static void rv_shutdown_key(RedisModuleCtx *ctx, RedisModuleString *keyname, RedisModuleKey *key,
                            void *privdata) {
    rv_scan_ctx *sc = privdata;
    mn_stream *s;
    RedisModuleKey *own = key == NULL ? RedisModule_OpenKey(ctx, keyname, REDISMODULE_READ) : NULL;
    int stream = rl_stream_of(key ? key : own, &s) && s != NULL;
    if (own) RedisModule_CloseKey(own);
    if (!stream) return;
    size_t klen;
    const char *k = RedisModule_StringPtrLen(keyname, &klen);
    /* Exact only where this process caught the stream up: a stream not
     * written since the start-up or promotion still owes its raise. */
    int caught_up = rv_peek(s)->epoch == rv.epoch;
    of_clean_mark(sc->db, k, klen, sc->tight && caught_up ? mn_next_offset(s) : rv_mark(s));
}

static void rv_on_shutdown(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent,
                           void *data) {
    (void)eid;
    (void)subevent;
    (void)data;
    if (!of_is_open() || !rv.recovered) return;
    rv_scan_ctx sc;
    sc.tight = (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_MASTER) != 0;
    of_clean_begin();
    RedisModuleScanCursor *cursor = RedisModule_ScanCursorCreate();
    for (sc.db = 0; RedisModule_SelectDb(ctx, sc.db) == REDISMODULE_OK; sc.db++) {
        RedisModule_ScanCursorRestart(cursor);
        while (RedisModule_Scan(ctx, cursor, rv_shutdown_key, &sc)) {
        }
    }
    RedisModule_ScanCursorDestroy(cursor);
    /* Marks of keys whose stream is gone: floors (a replica: all). */
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(rv_missing, "^", NULL, 0);
    size_t klen;
    void *value;
    char *k;
    while ((k = RedisModule_DictNextC(it, &klen, &value)) != NULL) {
        rv_state *st = value;
        if (sc.tight && st->epoch == rv.epoch) continue; /* a writer that never wrote */
        of_clean_mark(of_key_db(k), k + 4, klen - 4, st->mark);
    }
    RedisModule_DictIteratorStop(it);
    of_clean_commit(sc.tight);
}

/* ------------------------------------------------------------------------
 * RCP11.RESERVE key mark (replication stream and AOF only)
 * --------------------------------------------------------------------- */

static int rv_parse_u64(RedisModuleString *arg, uint64_t max, uint64_t *out) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(arg, &len);
    if (len == 0 || len > 20 || (p[0] == '0' && len > 1)) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (v > max) return 0;
    *out = v;
    return 1;
}

int rl_resv_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    int flags = RedisModule_GetContextFlags(ctx);
    if (!(flags & (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)))
        return RedisModule_ReplyWithError(
            ctx, "ERR RCP11.RESERVE is internal: only a primary's replication stream and the "
                 "AOF may send it");
    uint64_t mark;
    if (!rv_parse_u64(argv[2], RV_OFFSET_END, &mark))
        return RedisModule_ReplyWithError(ctx, "ERR mark must be an integer between 0 and 2^63");
    int db = RedisModule_GetSelectedDb(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ);
    mn_stream *s;
    if (rl_stream_of(key, &s)) {
        rv_state *st = s ? rv_of(s) : rv_missing_get(db, argv[1], 1);
        if (mark > st->mark) st->mark = mark;
    }
    RedisModule_CloseKey(key);
    /* A replica keeps what it received in its own file, fsynced by the
     * hook before its next acknowledgement leaves. */
    if (!(flags & REDISMODULE_CTX_FLAGS_LOADING) && !rv.loading) {
        size_t klen;
        const char *k = RedisModule_StringPtrLen(argv[1], &klen);
        of_received(db, k, klen, mark);
    }
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* ------------------------------------------------------------------------
 * RDB, AOF, unlink
 * --------------------------------------------------------------------- */

void rl_resv_rdb_save(RedisModuleIO *io, mn_stream *s) { RedisModule_SaveUnsigned(io, rv_mark(s)); }

int rl_resv_rdb_load(RedisModuleIO *io, mn_stream *s, int encver) {
    rv_state *st = rv_of(s);
    st->epoch = rv.epoch;
    st->rc_epoch = rv.rc_epoch;
    if (encver < 2) return REDISMODULE_OK; /* written before marks were saved */
    uint64_t mark = RedisModule_LoadUnsigned(io);
    if (RedisModule_IsIOError(io)) return REDISMODULE_ERR;
    if (mark > RV_OFFSET_END) {
        RedisModule_LogIOError(io, "warning", "rcp11: stream reservation mark out of range");
        return REDISMODULE_ERR;
    }
    st->mark = mark;
    return REDISMODULE_OK;
}

void rl_resv_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, mn_stream *s) {
    uint64_t mark = rv_peek(s)->mark;
    if (mark <= mn_next_offset(s)) return;
    char digits[24];
    int len = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)mark);
    RedisModule_EmitAOF(aof, "RCP11.RESERVE", "sb", key, digits, (size_t)len);
}

void rl_resv_unlink(RedisModuleKeyOptCtx *ctx, const void *value) {
    (void)value;
    if (rv.loading) return;
    const RedisModuleString *name = RedisModule_GetKeyNameFromOptCtx(ctx);
    size_t klen;
    const char *k = RedisModule_StringPtrLen(name, &klen);
    of_deleted(RedisModule_GetDbIdFromOptCtx(ctx), k, klen);
}

/* ------------------------------------------------------------------------
 * INFO, configs, loading
 * --------------------------------------------------------------------- */

void rl_resv_info(RedisModuleInfoCtx *ctx) {
    RedisModule_InfoAddSection(ctx, "reservations");
    RedisModule_InfoAddFieldULongLong(ctx, "reservations", rv.reservations);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_fsyncs", of_fsyncs());
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_waits", rv.waits);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_waiting_writes", rv_waiting);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_refused_writes", rv.refused);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_unconfirmed_writes", rv.unconfirmed);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_raised_streams", rv.raised);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_getacks", rv.getacks);
    RedisModule_InfoAddFieldULongLong(ctx, "reservation_replicas_online",
                                      (unsigned long long)rv.replicas_online);
    RedisModule_InfoAddFieldULongLong(ctx, "offsets_file_bytes", of_size());
    RedisModule_InfoAddFieldULongLong(ctx, "offsets_file_compactions", of_compactions());
    RedisModule_InfoAddFieldULongLong(ctx, "offsets_file_failing", (unsigned long long)of_failing());
}

static long long rv_get_numeric(const char *name, void *privdata) {
    (void)name;
    return *(long long *)privdata;
}

static int rv_set_numeric(const char *name, long long value, void *privdata,
                          RedisModuleString **err) {
    (void)name;
    (void)err;
    *(long long *)privdata = value;
    return REDISMODULE_OK;
}

static int rv_get_enum(const char *name, void *privdata) {
    (void)name;
    return *(int *)privdata;
}

static int rv_set_enum(const char *name, int value, void *privdata, RedisModuleString **err) {
    (void)name;
    (void)err;
    *(int *)privdata = value;
    return REDISMODULE_OK;
}

static int rv_get_bool(const char *name, void *privdata) {
    (void)name;
    return *(int *)privdata;
}

static int rv_set_bool(const char *name, int value, void *privdata, RedisModuleString **err) {
    (void)name;
    (void)err;
    *(int *)privdata = value;
    return REDISMODULE_OK;
}

static RedisModuleString *rv_get_string(const char *name, void *privdata) {
    (void)name;
    return *(RedisModuleString **)privdata;
}

static int rv_set_string(const char *name, RedisModuleString *value, void *privdata,
                         RedisModuleString **err) {
    (void)name;
    size_t len;
    const char *p = RedisModule_StringPtrLen(value, &len);
    if (len == 0 || memchr(p, '\0', len) != NULL) {
        *err = RedisModule_CreateString(NULL, "the offsets file needs a name", 29);
        return REDISMODULE_ERR;
    }
    RedisModuleString **slot = privdata;
    if (*slot) RedisModule_FreeString(NULL, *slot);
    *slot = RedisModule_CreateStringFromString(NULL, value);
    return REDISMODULE_OK;
}

int rl_resv_register_configs(RedisModuleCtx *ctx) {
    static const char *policy_names[] = {"refuse", "write"};
    static const int policy_values[] = {0, 1};
    if (RedisModule_RegisterNumericConfig(ctx, "reservation-timeout-ms", 1000,
                                          REDISMODULE_CONFIG_DEFAULT, 0, 86400000, rv_get_numeric,
                                          rv_set_numeric, NULL, &rv.timeout_ms) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterNumericConfig(ctx, "reservation-min-replicas", 0,
                                          REDISMODULE_CONFIG_DEFAULT, 0, 1000000, rv_get_numeric,
                                          rv_set_numeric, NULL,
                                          &rv.min_replicas) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterEnumConfig(ctx, "reservation-on-timeout", 0, REDISMODULE_CONFIG_DEFAULT,
                                       policy_names, policy_values, 2, rv_get_enum, rv_set_enum,
                                       NULL, &rv.on_timeout) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterEnumConfig(ctx, "reservation-in-multi", 1, REDISMODULE_CONFIG_DEFAULT,
                                       policy_names, policy_values, 2, rv_get_enum, rv_set_enum,
                                       NULL, &rv.in_multi) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterBoolConfig(ctx, "read-committed", 0, REDISMODULE_CONFIG_DEFAULT,
                                       rv_get_bool, rv_set_bool, NULL,
                                       &rv.read_committed) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterStringConfig(ctx, "offsets-file", RV_DEFAULT_FILE,
                                         REDISMODULE_CONFIG_IMMUTABLE, rv_get_string,
                                         rv_set_string, NULL, &rv.file_name) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}

int rl_resv_init(RedisModuleCtx *ctx) {
    rv_missing = RedisModule_CreateDict(NULL);
    rc.signal = RedisModule_CreateDict(NULL);
    if (rv.file_name == NULL) rv.file_name = RedisModule_CreateString(NULL, RV_DEFAULT_FILE, strlen(RV_DEFAULT_FILE));
    size_t plen;
    const char *path = RedisModule_StringPtrLen(rv.file_name, &plen);
    if (of_open(ctx, path) != REDISMODULE_OK) return REDISMODULE_ERR;
    static const struct {
        uint64_t id;
        RedisModuleEventCallback cb;
    } events[] = {
        {REDISMODULE_EVENT_EVENTLOOP, rv_on_eventloop},
        {REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, rv_on_role},
        {REDISMODULE_EVENT_LOADING, rv_on_loading},
        {REDISMODULE_EVENT_FLUSHDB, rv_on_flush},
        {REDISMODULE_EVENT_SHUTDOWN, rv_on_shutdown},
        {REDISMODULE_EVENT_REPLICA_CHANGE, rv_on_replica_change},
        {REDISMODULE_EVENT_SWAPDB, rv_on_swapdb},
    };
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
        RedisModuleEvent e = {events[i].id, 1};
        if (RedisModule_SubscribeToServerEvent(ctx, e, events[i].cb) != REDISMODULE_OK) {
            RedisModule_Log(ctx, "warning", "rcp11: cannot subscribe to server event %llu",
                            (unsigned long long)events[i].id);
            return REDISMODULE_ERR;
        }
    }
    return REDISMODULE_OK;
}
