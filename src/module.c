/* module.c -- the rcp11 streams inside redis-server: a Redis module.
 *
 * WHAT IT IS
 * ==========
 *
 * rcp11-server is one process on one machine. This file builds the same
 * storage core (macronode.c, compiled into the module unchanged) a second
 * way: as a module that gives redis-server 7.0+ the RCP 11 commands
 *
 *     TWRITE key entry
 *     TWRITE key [BACKLOG count] ENTRIES entry [entry ...]
 *     TREAD key offset count [BLOCK ms] [GROUP gk | GROUPNEW gk] [WITHINFO] [NONULLS]
 *           [WITHTIMES] [PACKED]
 *     TEVICT key offset
 *     TCONCAT dst src [src ...]
 *     TSEEK key unix-time-ms
 *
 * and a data type named "rcp11-log" (TYPE answers it). Redis then brings
 * what one process cannot: replicas, failover, Sentinel, Redis Cluster,
 * ACLs, TLS. The semantics and every error text are the contract's
 * (docs/PROTOCOL.md); the Python server's command tests run against both
 * servers, so the two cannot drift apart unnoticed.
 *
 *     redis-server --loadmodule "$(python -m rcp11 module-path)"
 *
 * A key's value is the core's mn_stream itself: no wrapper, the module value
 * pointer Redis stores is the stream. Everything the core allocates goes
 * through RedisModule_Alloc (src/module_alloc.h is force-included into
 * macronode.c), so used_memory, maxmemory and MEMORY USAGE see the data.
 *
 * THE COMMANDS IN REDIS'S TERMS
 * =============================
 *
 *   command       flags                          keys (key specs)
 *   -----------   ----------------------------   -----------------------------
 *   twrite        write deny-oom fast            1: RW INSERT
 *   tread         readonly may-replicate         1: RO ACCESS; after GROUP or
 *                 blocking getkeys-api              GROUPNEW: RW UPDATE
 *   tevict        write fast                     1: RW DELETE
 *   tconcat       write deny-oom                 1: RW INSERT; 2..: RW DELETE
 *   tseek         readonly fast                  1: RO ACCESS
 *   rcp11.skipto  write deny-oom                 1: RW INSERT
 *   rcp11.twriteat write deny-oom                1: RW INSERT  (internal)
 *   rcp11.node    write deny-oom                 1: RW INSERT  (internal)
 *   rcp11.reserve write                          1: RW UPDATE  (internal,
 *                                                   module_reserve.c)
 *
 * ACL categories (where the server has the API, Redis 7.2+ and Valkey 8)
 * follow Redis's stream commands, plus the module's own @rcp11: see
 * rl_commands. Redis 7.0 has no such API; the load logs that.
 *
 * TREAD is "readonly" so that replicas serve plain reads. A group read moves
 * its group key, which is a write: TREAD refuses it itself on a read-only
 * replica (-READONLY, as Redis words it), and "may-replicate" tells Redis
 * that it may propagate (CLIENT PAUSE WRITE holds it back).
 *
 * The key specs (RedisModule_SetCommandInfo, 7.0) name the group key too,
 * so COMMAND GETKEYS, ACLs and redis-py's RedisCluster see it. Redis 7.0's
 * Cluster does not read key specs when it checks slots (it uses first/last/
 * step, or the module's own answer): so TREAD also has "getkeys-api" and
 * answers key-position requests itself (rl_tread_keys), and a group key in
 * another slot is -CROSSSLOT, never written on a node that does not own it.
 * In a cluster a stream and its group keys must hash to one slot: give them
 * one hash tag, "{events}" and "{events}:readers" (docs/MODULE.md).
 *
 * Commands that change a key signal it themselves (WATCH, client-side
 * caching: the module sets NO_IMPLICIT_SIGNAL_MODIFIED, so merely opening a
 * key for writing invalidates nothing) and announce keyspace events:
 * "twrite", "tevict", "tconcat" in the module class, "set" for a group key
 * a group read moved, "del" for each TCONCAT source.
 *
 * BLOCKING
 * ========
 *
 * TREAD ... BLOCK blocks with RedisModule_BlockClientOnKeys on the stream
 * key; every command that adds messages calls SignalKeyAsReady, and after
 * the command Redis calls rl_tread_wake() for each client blocked on the
 * key, in the order they blocked. The callback rereads the stream (and the
 * group key) and either replies (REDISMODULE_OK: the client is unblocked) or
 * returns REDISMODULE_ERR and keeps its place. That order gives the
 * contract's group fairness for free: the first blocked reader of a group
 * takes up to its count from the group key's position and moves the key,
 * the next one continues from there, a reader that got nothing keeps its
 * place, and a served reader that blocks again joins the end of the queue.
 *
 * Redis 7.0 does not wake module clients on everything that matters to
 * them, so a keyspace-event hook (rl_on_keyspace_event) fills the gaps
 * while anyone is blocked:
 *   - a SET that turns the stream key into a string signals it, so its
 *     readers get -WRONGTYPE at once instead of waiting forever;
 *   - a SET / DEL / INCR / expiry of a group key signals the streams its
 *     readers wait on (rl_groups maps group keys to their waiters), so a
 *     rewound group serves at once. When the group key disappeared, its
 *     readers remember the position the group would now start at (the
 *     contract recreates the key at that moment; a keyspace-event callback
 *     must not write, so the key is written when they are served);
 *   - FLUSHDB / FLUSHALL fire no per-key event: a server-event hook
 *     (rl_on_flush) makes every group reader of the flushed database start
 *     over at offset 0.
 *
 * One rule keeps Redis's propagation sound: the wake callback writes and
 * replicates only when it replies. Redis propagates what a served client's
 * callback replicated right after serving it; a callback that returned
 * REDISMODULE_ERR after replicating would leave the write unpropagated.
 *
 * Inside MULTI/EXEC, Lua or RM_Call (context flags MULTI, LUA,
 * DENY_BLOCKING) TREAD never blocks: it reads what is there, as the
 * contract says for transactions (Redis would answer an error instead).
 *
 * PAUSES
 * ======
 *
 * While clients are paused (CLIENT PAUSE WRITE or ALL, and on a primary
 * during FAILOVER and CLUSTER FAILOVER, which pause writes until the
 * replica has caught up) Redis holds back every command that may
 * replicate, and aborts if anything reaches the AOF or a replica all the
 * same (7.0: "ASSERTION FAILED ... areClientsPaused()"). Two things in the
 * module write outside a client command, and both wait while
 * RedisModule_AvoidReplicaTraffic() says clients are paused:
 *   - the housekeeping timer (retention's TEVICT, compression) skips its
 *     ticks and takes the pass up where it was once the pause is over;
 *   - a blocked group reader woken during a pause (a TWRITE queued in a
 *     MULTI before CLIENT PAUSE, a group key changed there) keeps its place
 *     instead of moving its group key (a SET that replicates, or for a
 *     lease reader RCP11.LEASE: module_ack.c does the same); its stream
 *     is signalled again by the first tick after the pause (rl_pause.wakes),
 *     and the readers are served in the order they blocked. Plain readers
 *     write nothing and are served at once, as Redis serves readers of its
 *     own types.
 * A pause that ends in a failover makes this server a replica, which
 * neither evicts nor keeps group readers (Redis unblocks them with an
 * error): the new primary applies retention from then on.
 * Keyspace-event, flush and config callbacks only signal keys or set flags.
 *
 * REPLICATION AND THE AOF
 * =======================
 *
 * Redis feeds replicas and the AOF from one stream of commands; a module
 * command chooses what goes in it:
 *
 *   TWRITE key e / TWRITE key ENTRIES e...  verbatim, when the messages got
 *                                           the stream's clock as it was;
 *                                           else RCP11.TWRITEAT key <ms> e...
 *   TWRITE key BACKLOG n ENTRIES e...       RCP11.TWRITEAT key <ms> e...
 *                                           + TEVICT key <last evicted offset>
 *   TEVICT key -n / TEVICT key o            TEVICT key <last evicted offset>,
 *                                           only when something was evicted
 *   TREAD ... GROUP gk                      SET gk <new position>
 *   TCONCAT, RCP11.SKIPTO                   verbatim
 *   RCP11.TWRITEAT, RCP11.NODE              verbatim (a replica's own AOF
 *                                           and its replicas)
 *   retention (the timer, primary only)     TEVICT key <last evicted offset>
 *   an offset reservation (module_reserve)  RCP11.RESERVE key <mark>, before
 *                                           the offsets in it are handed out
 *   a stream raised to its mark             RCP11.SKIPTO key <mark>, before
 *                                           the write after a start-up or a
 *                                           promotion
 *
 * Cuts are replicated as absolute offsets, so a replica ends exactly where
 * its primary is whatever it held before. Appends are replicated with the
 * append time the primary gave the messages (<ms>: the stream's clock after
 * the append, so already clamped to never go back), so a replica and a
 * replayed AOF record the primary's times, not their own: TSEEK answers and
 * retention by age are the primary's after a failover or a restart.
 *
 * Most writes at high rates land in the millisecond of the write before
 * them: their time is the stream's clock, unchanged. Those go verbatim
 * (RM_ReplicateVerbatim, no allocation; RM_Replicate costs a command lookup
 * and several allocations, ~10% of a TWRITE's server CPU), and a plain
 * TWRITE that arrives from the primary or the AOF (context flags
 * REPLICATED or LOADING) appends at the receiver's copy of the stream's
 * clock: the same value, since every step that moves a clock is
 * deterministic and RDB values carry it. A rewritten AOF keeps it too (see
 * PERSISTENCE).
 * RCP11.TWRITEAT (and RCP11.NODE, below) set append times, which no client
 * may do: they answer an error unless the context flags say REPLICATED
 * (sent by this server's primary) or LOADING (the AOF; no client command
 * runs while a server loads), so MULTI, Lua and RM_Call cannot reach them
 * either. An AOF written before RCP11.TWRITEAT holds plain TWRITEs, which
 * still load: a stream's first one appends at replay time, the next ones at
 * the stream's clock. Several commands replicated by
 * one call are wrapped in MULTI/EXEC by Redis. Replicas refuse every write
 * (-READONLY), group reads included; a replicated TWRITE wakes the
 * replica's own blocked readers.
 *
 * PERSISTENCE
 * ===========
 *
 * RDB values, DUMP payloads and a rewritten AOF are module_rdb.c's: the
 * data type's callbacks that turn a stream into bytes and back, where
 * bytes from outside come in. This file keeps the type's memory and free
 * callbacks, which only account.
 *
 * Durability is Redis's for the data (docs/MODULE.md): with appendonly yes
 * and appendfsync always a reply leaves only after the AOF write is on
 * disk; with everysec, or with snapshots only, a crash loses the last
 * writes; a failover loses what the replica had not received, unless the
 * writer waited with WAIT. Offsets are the module's own: module_reserve.c
 * reserves them ahead in its offsets file and on every online replica, so
 * lost messages read as null and their offsets are never handed out again.
 *
 * RETENTION AND COMPRESSION
 * =========================
 *
 * rcp11.stream-retention-ms and rcp11.stream-retention-bytes (0: off) are
 * applied by one module timer, the module's cron, never by a command:
 *
 *    tick (every RL_TICK_MS while a pass is under way, RL_IDLE_MS between)
 *      |
 *      v
 *    RedisModule_Scan step over db 0, 1, ... (cursor kept across ticks)
 *      |  for each stream met, while the tick's allowance lasts:
 *      |    configs -> stream (level, depth, node size: O(1) setters)
 *      |    mn_evict_older_than(now - retention-ms)   expired messages (whole
 *      |    mn_evict_over_bytes(retention-bytes)      nodes first), whole nodes,
 *      |    mn_compress_step                          the core's conforming scan
 *      |    cut? -> Replicate("TEVICT key <last evicted offset>")
 *      v
 *    allowance: RL_TICK_NODES nodes, ~RL_TICK_KEYS keys per tick
 *
 * So a large expiry is spread over many ticks of a few nodes each and no
 * client waits behind it. A key met once the allowance is spent waits for
 * the next pass, which starts at once when this one found work. Only a
 * primary evicts (a replica, and a server loading its files, follow the
 * logged cuts): every eviction reaches replicas and the AOF as an absolute
 * TEVICT, wrapped with the tick's other cuts in MULTI/EXEC by Redis, so a
 * replica and a replayed AOF end with the same streams whatever their
 * clocks. Append times come from Redis's clock (RedisModule_Milliseconds,
 * through rl_now_ms) and travel with RDB blobs, with RCP11.TWRITEAT in the
 * replication stream and the AOF, and with RCP11.NODE in a rewritten AOF:
 * a promoted replica or a restarted server ages messages by the times the
 * primary gave them.
 *
 * The same pass finishes compression scans (a change of level or depth, a
 * load, a TCONCAT), so configs also reach idle streams: rl_house.dirty asks
 * for a pass even when no retention is set.
 *
 * CONFIGS AND INFO
 * ================
 *
 * Module configs (CONFIG GET/SET, redis.conf, --rcp11.<name> on the command
 * line): rcp11.stream-node-max-entries (1000), rcp11.stream-compression
 * (no|zlib), rcp11.stream-compression-level (6),
 * rcp11.stream-compression-depth (0), rcp11.stream-retention-ms (0) and
 * rcp11.stream-retention-bytes (0, a memory value: "64mb"). They reach an
 * existing stream at its next write or when the housekeeping pass comes
 * by. INFO rcp11 shows a section "rcp11_streams" whose
 * fields are the Python server's INFO streams fields, prefixed "rcp11_" as
 * Redis prefixes module fields, with the configs in force and what
 * retention evicted (retention_evicted_messages, retention_evicted_bytes,
 * retention_runs: ticks that evicted something, the contract's names).
 * The totals are kept as running sums: every
 * command adds the difference it made to a stream (rl_account), and the free
 * callback, which Redis may run on its lazy-free thread, subtracts with
 * atomic operations.
 */

#include "rcp11_module_api.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ackgroup.h"
#include "macronode.h"
#include "module_internal.h"
#include "module_reserve.h"

/* ------------------------------------------------------------------------
 * Constants
 * --------------------------------------------------------------------- */

#define RL_MODULE_NAME "rcp11"
#define RL_MODULE_VERSION 1
/* The data type's name is written into every RDB file holding a stream:
 * never change it. Redis requires exactly 9 characters. */
#define RL_TYPE_NAME "rcp11-log"
/* Key specs (SetCommandInfo) and module configs need 7.0. */
#define RL_MIN_REDIS_VERSION 0x00070000

/* A TREAD reply is copied out of the core in batches sized to about this
 * many payload bytes (at the stream's average message size), so that one
 * read of 100 small messages is one core call while a read of huge
 * messages never holds more than a batch in the scratch buffer (at most
 * RL_READ_BATCH_MAX messages, module_internal.h). */
#define RL_READ_BATCH_BYTES (256 * 1024)
/* Scratch buffers above this size are given back after the command that
 * grew them, so one huge read does not pin its memory. */
#define RL_SCRATCH_KEEP_BYTES (1024 * 1024)
/* Housekeeping (see RETENTION AND COMPRESSION above): one module timer. While a pass over the keyspace is under way it
 * ticks every RL_TICK_MS and each tick frees or compresses at most
 * RL_TICK_NODES nodes and looks at no more than about RL_TICK_KEYS keys, so
 * a tick costs tens of microseconds whatever the backlog: a 1 GB expiry of
 * 1000-message nodes of 100 bytes is ~10,000 nodes, gone in ~6 s of 10 ms
 * ticks, and no client waits on it. Between passes it ticks every
 * RL_IDLE_MS, and starts a new pass only when there is work (a retention
 * set, or a compression scan to finish). */
#define RL_TICK_MS 10
#define RL_IDLE_MS 100
#define RL_TICK_NODES 16
#define RL_TICK_KEYS 256
/* Node byte caps (rl_node_bytes_for) apply between these sizes. Below 4
 * KiB a node's rounding is a few bytes per message at most and a cap would
 * only make nodes short; above 1 GiB a node is a handful of huge messages,
 * each alone in its class whatever the cap. */
#define RL_NODE_BYTES_MIN 4096
#define RL_NODE_BYTES_MAX ((uint64_t)1 << 30)
/* ------------------------------------------------------------------------
 * The module API pointers (declared in rcp11_module_api.h)
 * --------------------------------------------------------------------- */

#define RL_DEFINE_API(ret, name, params) ret(*RedisModule_##name) params = NULL;
RCP11_MODULE_API(RL_DEFINE_API)
RCP11_MODULE_API_RESERVE(RL_DEFINE_API)
RCP11_MODULE_API_OPTIONAL(RL_DEFINE_API)
#undef RL_DEFINE_API

typedef int (*rl_getapi_fn)(const char *name, void *fnptr);

/* Fill every API pointer. Returns the name of the first missing function
 * (the server is too old), or NULL. */
static const char *rl_load_api(RedisModuleCtx *ctx) {
    rl_getapi_fn getapi;
    void *first_word = ((void **)ctx)[0];
    memcpy(&getapi, &first_word, sizeof(getapi));
#define RL_LOOKUP_API(ret, name, params)                                                   \
    if (getapi("RedisModule_" #name, (void *)&RedisModule_##name) != REDISMODULE_OK ||    \
        RedisModule_##name == NULL)                                                        \
        return #name;
    RCP11_MODULE_API(RL_LOOKUP_API)
    RCP11_MODULE_API_RESERVE(RL_LOOKUP_API)
#undef RL_LOOKUP_API
#define RL_LOOKUP_OPTIONAL(ret, name, params)                                              \
    if (getapi("RedisModule_" #name, (void *)&RedisModule_##name) != REDISMODULE_OK)      \
        RedisModule_##name = NULL;
    RCP11_MODULE_API_OPTIONAL(RL_LOOKUP_OPTIONAL)
#undef RL_LOOKUP_OPTIONAL
    return NULL;
}

/* ------------------------------------------------------------------------
 * Module state: configs, INFO totals, scratch buffers
 * --------------------------------------------------------------------- */

static RedisModuleType *rl_type;

static struct {
    long long max_entries;     /* rcp11.stream-node-max-entries */
    int compression;           /* rcp11.stream-compression: 0 no, 1 zlib */
    long long level;           /* rcp11.stream-compression-level */
    long long depth;           /* rcp11.stream-compression-depth */
    long long retention_ms;    /* rcp11.stream-retention-ms, 0: off */
    long long retention_bytes; /* rcp11.stream-retention-bytes, 0: off */
} rl_config = {MN_DEFAULT_MAX_ENTRIES, 0, 6, 0, 0, 0};

/* What retention evicted since the server started (INFO), and the state of
 * the housekeeping pass. Main thread only. */
static struct {
    uint64_t messages, bytes, runs;
} rl_retention;

static struct {
    RedisModuleScanCursor *cursor;
    int db;      /* the database the pass is in */
    int active;  /* a pass is under way */
    int dirty;   /* streams may need conforming to the configs: pass again */
    int worked;  /* the pass under way evicted or compressed something */
} rl_house;

/* INFO totals over every stream of every database. Updated by commands on
 * the main thread and by rl_free(), which Redis may call on its lazy-free
 * thread: always through __atomic builtins. */
static struct {
    uint64_t streams, messages, nodes, compressed, payload, memory;
} rl_totals;

/* Scratch for TREAD replies (grown by the core) and for the entries of a
 * TWRITE (grown here). Main thread only. */
mn_buf rl_read_buf;
int64_t rl_read_lens[RL_READ_BATCH_MAX];
int64_t rl_read_times[RL_READ_BATCH_MAX]; /* WITHTIMES, DEBUG DIGEST */
static char *rl_write_buf;
static size_t rl_write_cap;
static uint32_t *rl_write_lens;
static size_t rl_write_lens_cap;

/* Set while the module announces its own group-key write: the readers that
 * write concerns are being served right now. */
static int rl_own_event;

/* Work put off while clients are paused (see PAUSES). Main thread only. */
typedef struct rl_deferred_wake {
    int db;
    RedisModuleString *key; /* the stream key (own copy) */
} rl_deferred_wake;

static struct {
    RedisModuleDict *wakes; /* "<db><stream key>" -> rl_deferred_wake */
    uint64_t ticks;         /* INFO: housekeeping ticks with work that waited */
    uint64_t group_wakes;   /* INFO: group readers kept waiting */
} rl_pause;

static int rl_level(void) { return rl_config.compression ? (int)rl_config.level : 0; }

static void rl_total_add(uint64_t *field, uint64_t delta) {
    __atomic_fetch_add(field, delta, __ATOMIC_RELAXED);
}

static uint64_t rl_total_get(uint64_t *field) { return __atomic_load_n(field, __ATOMIC_RELAXED); }

void rl_snap_take(const mn_stream *s, rl_snap *out) {
    if (s == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    out->messages = mn_length(s);
    out->nodes = mn_num_nodes(s);
    out->compressed = mn_num_compressed_nodes(s);
    out->payload = mn_payload_bytes(s);
    out->memory = mn_memory_bytes(s);
}

/* Add what changed in s since `before` to the totals (unsigned wrap-around
 * makes a decrease a subtraction). s NULL: the stream is gone. */
void rl_account(const mn_stream *s, const rl_snap *before) {
    rl_snap after;
    rl_snap_take(s, &after);
    if (after.messages != before->messages)
        rl_total_add(&rl_totals.messages, after.messages - before->messages);
    if (after.nodes != before->nodes) rl_total_add(&rl_totals.nodes, after.nodes - before->nodes);
    if (after.compressed != before->compressed)
        rl_total_add(&rl_totals.compressed, after.compressed - before->compressed);
    if (after.payload != before->payload)
        rl_total_add(&rl_totals.payload, after.payload - before->payload);
    if (after.memory != before->memory)
        rl_total_add(&rl_totals.memory, after.memory - before->memory);
}

/* A stream came into being (created, loaded, copied): count it whole. */
static void rl_account_new(const mn_stream *s) {
    rl_snap none;
    rl_snap_take(NULL, &none);
    rl_total_add(&rl_totals.streams, 1);
    rl_account(s, &none);
}

void rl_stream_loaded(const mn_stream *s) {
    rl_account_new(s);
    if (mn_compress_pending(s)) rl_house.dirty = 1;
}

void rl_release_scratch(void) {
    if (rl_read_buf.cap > RL_SCRATCH_KEEP_BYTES) {
        mn_buf_free(&rl_read_buf);
        mn_buf_init(&rl_read_buf);
    }
    if (rl_write_cap > RL_SCRATCH_KEEP_BYTES) {
        RedisModule_Free(rl_write_buf);
        rl_write_buf = NULL;
        rl_write_cap = 0;
    }
    if (rl_write_lens_cap * sizeof(uint32_t) > RL_SCRATCH_KEEP_BYTES) {
        RedisModule_Free(rl_write_lens);
        rl_write_lens = NULL;
        rl_write_lens_cap = 0;
    }
}

static void rl_reserve_write(size_t bytes, size_t count) {
    if (bytes > rl_write_cap) {
        rl_write_buf = RedisModule_Realloc(rl_write_buf, bytes);
        rl_write_cap = bytes;
    }
    if (count > rl_write_lens_cap) {
        rl_write_lens = RedisModule_Realloc(rl_write_lens, count * sizeof(uint32_t));
        rl_write_lens_cap = count;
    }
}

/* Configs reach an existing stream at its next write, or when the
 * housekeeping pass comes by (every setter is O(1): it governs nodes filled
 * from now on, or starts a compression scan that the pass carries out). */
static void rl_apply_config(mn_stream *s);

/* A new, empty stream with the current configs. */
static mn_stream *rl_stream_new(void) {
    mn_stream *s = mn_stream_new((uint32_t)rl_config.max_entries, rl_level());
    if (s != NULL) rl_apply_config(s);
    return s;
}

/* A new stream stored at an empty key opened for writing, counted in INFO
 * (module_reserve.c brings a lost stream back at its mark this way). */
mn_stream *rl_stream_create(RedisModuleKey *key) {
    mn_stream *s = rl_stream_new();
    if (s == NULL) return NULL;
    RedisModule_ModuleTypeSetValue(key, rl_type, s);
    rl_account_new(s);
    return s;
}


/* The largest jemalloc size class at or below `bytes` (bytes >= 64). Above
 * 64 bytes jemalloc spaces its classes four to a doubling: between 2^n and
 * 2^(n+1) they are 2^n + i * 2^(n-2), i = 0..3 (..., 64 KiB, 80, 96, 112,
 * 128 KiB, 160, ...). Flooring to a multiple of 2^(n-2) gives the class. */
static uint64_t rl_size_class_floor(uint64_t bytes) {
    int n = 63 - __builtin_clzll(bytes);
    uint64_t step = (uint64_t)1 << (n - 2);
    return bytes & ~(step - 1);
}

/* The node byte cap of a stream (see RL_NODE_BYTES_*): the size class just
 * below what max_entries messages of the stream's average size take, so a
 * node ends a few messages early and its blob fills its class exactly,
 * instead of spilling into the next class (1000 x 100 bytes asks 100,000
 * and gets 114,688; capped at 98,304 it takes 983 messages and wastes 4
 * bytes). 0 (no cap) while the stream has no message to average, and for
 * nodes too small or too large for the rounding to matter. */
static uint32_t rl_node_bytes_for(const mn_stream *s) {
    uint64_t length = mn_length(s);
    if (length == 0) return 0;
    uint64_t full = mn_payload_bytes(s) / length * (uint64_t)rl_config.max_entries;
    if (full < RL_NODE_BYTES_MIN || full > RL_NODE_BYTES_MAX) return 0;
    return (uint32_t)rl_size_class_floor(full);
}

static void rl_apply_config(mn_stream *s) {
    if (mn_max_entries(s) != (uint32_t)rl_config.max_entries)
        mn_stream_set_max_entries(s, (uint32_t)rl_config.max_entries);
    if (mn_compression_level(s) != rl_level()) mn_stream_set_compression(s, rl_level());
    if (mn_compression_depth(s) != (uint32_t)rl_config.depth)
        mn_stream_set_compression_depth(s, (uint32_t)rl_config.depth);
    uint32_t cap = rl_node_bytes_for(s);
    if (mn_max_node_bytes(s) != cap) mn_stream_set_max_node_bytes(s, cap);
}

/* ------------------------------------------------------------------------
 * Small helpers: errors, parsing, keys
 * --------------------------------------------------------------------- */

/* How many bytes of p[0..len) form one valid UTF-8 character; 0 when the
 * first byte starts none. Sets *bad to the length of the maximal invalid
 * subpart otherwise (the lead byte and the continuation bytes that were
 * still allowed after it): Unicode's "maximal subpart" practice, which
 * Python's "replace" decoding follows, so one U+FFFD stands for it.
 *
 *     lead      2nd byte   3rd, 4th     what the narrower ranges exclude
 *     00..7F    -          -
 *     C2..DF    80..BF     -            C0, C1: overlong 2-byte forms
 *     E0        A0..BF     80..BF       overlong 3-byte forms
 *     E1..EC    80..BF     80..BF
 *     ED        80..9F     80..BF       the surrogates D800..DFFF
 *     EE..EF    80..BF     80..BF
 *     F0        90..BF     80..BF x2    overlong 4-byte forms
 *     F1..F3    80..BF     80..BF x2
 *     F4        80..8F     80..BF x2    above U+10FFFF
 */
static size_t rl_utf8_char(const unsigned char *p, size_t len, size_t *bad) {
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k < n; k++) {
        if (k >= len || p[k] < lo || p[k] > hi) {
            *bad = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return n;
}

/* Copy up to `limit` bytes of a client-given name into out (size outsize)
 * for an error message, as the server's errors.quoted_arg() does: valid
 * UTF-8 is kept, each maximal invalid subpart becomes one U+FFFD, CR/LF,
 * which cannot appear in an error reply, become spaces, and a NUL byte
 * ends the name (an error reply is a C string here). Each input byte
 * yields at most 3 output bytes. */
void rl_quote(const char *p, size_t len, size_t limit, char *out, size_t outsize) {
    const unsigned char *u = (const unsigned char *)p;
    size_t o = 0;
    if (len > limit) len = limit;
    for (size_t i = 0; i < len && u[i] != '\0' && o + 4 < outsize;) {
        size_t bad = 0;
        size_t n = rl_utf8_char(u + i, len - i, &bad);
        if (n == 0) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += bad;
            continue;
        }
        if (n == 1 && (u[i] == '\r' || u[i] == '\n')) {
            out[o++] = ' ';
        } else {
            memcpy(out + o, p + i, n);
            o += n;
        }
        i += n;
    }
    out[o] = '\0';
}

/* Reply "-<prefix>'<quoted name>'<suffix>". */
int rl_reply_quoted(RedisModuleCtx *ctx, const char *prefix, const RedisModuleString *name,
                    size_t limit, const char *suffix) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(name, &len);
    size_t quoted_size = (len < limit ? len : limit) * 3 + 8;
    char *quoted = RedisModule_Alloc(quoted_size);
    rl_quote(p, len, limit, quoted, quoted_size);
    size_t msg_size = strlen(prefix) + strlen(quoted) + strlen(suffix) + 4;
    char *msg = RedisModule_Alloc(msg_size);
    snprintf(msg, msg_size, "%s'%s'%s", prefix, quoted, suffix);
    RedisModule_ReplyWithError(ctx, msg);
    RedisModule_Free(msg);
    RedisModule_Free(quoted);
    return REDISMODULE_OK;
}

/* Whether arg is `word` (upper case ASCII), ignoring case. */
int rl_arg_is(const RedisModuleString *arg, const char *word) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(arg, &len);
    if (len != strlen(word)) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        if (c != word[i]) return 0;
    }
    return 1;
}

int rl_same_string(const RedisModuleString *a, const RedisModuleString *b) {
    size_t alen, blen;
    const char *pa = RedisModule_StringPtrLen(a, &alen);
    const char *pb = RedisModule_StringPtrLen(b, &blen);
    return alen == blen && memcmp(pa, pb, alen) == 0;
}

/* A decimal offset as the server writes it: "0" or [1-9][0-9]*, at most
 * max. Returns 1 and sets *out when it is one. */
int rl_parse_offset(const char *p, size_t len, uint64_t max, uint64_t *out) {
    if (len == 0 || len > 20 || (p[0] == '0' && len > 1)) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        uint64_t digit = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - digit) / 10) return 0;
        v = v * 10 + digit;
    }
    if (v > max) return 0;
    *out = v;
    return 1;
}

/* The stream at an opened key: *s is NULL for an empty key. Returns 0 when
 * the key holds something else. */
int rl_stream_of(RedisModuleKey *key, mn_stream **s) {
    int type = RedisModule_KeyType(key);
    if (type == REDISMODULE_KEYTYPE_EMPTY) {
        *s = NULL;
        return 1;
    }
    if (type == REDISMODULE_KEYTYPE_MODULE && RedisModule_ModuleTypeGetType(key) == rl_type) {
        *s = RedisModule_ModuleTypeGetValue(key);
        return 1;
    }
    return 0;
}

/* Open a key that must hold a stream or nothing: *key is the opened key
 * (NULL for a missing key opened READ only, which the API allows everywhere
 * a key goes), *s the stream (NULL for an empty key). When the key holds
 * something else, replies -WRONGTYPE and returns 0. */
int rl_open_stream(RedisModuleCtx *ctx, RedisModuleString *name, int mode, RedisModuleKey **key,
                   mn_stream **s) {
    *key = RedisModule_OpenKey(ctx, name, mode);
    if (rl_stream_of(*key, s)) return 1;
    RedisModule_CloseKey(*key);
    RedisModule_ReplyWithError(ctx, RL_WRONGTYPE);
    return 0;
}

/* Where `start` falls for a negative offset -n: next - n, floored at 0. */
static uint64_t rl_resolve_offset(long long offset, uint64_t next) {
    if (offset >= 0) return (uint64_t)offset;
    uint64_t back = (uint64_t)(-(offset + 1)) + 1;
    return back >= next ? 0 : next - back;
}

/* ------------------------------------------------------------------------
 * Appends: every write of messages goes through these two, so the core's
 * append signature is used in one place.
 * --------------------------------------------------------------------- */

/* The module's clock: Redis's, shifted by the debug-clock-offset-ms module
 * argument (0 unless a test loads the module with it, to play a primary
 * whose clock is far from its replica's). Append times, retention's "now"
 * and the loading of old blobs all read it. */
static int64_t rl_clock_offset_ms;

int64_t rl_now_ms(void) { return RedisModule_Milliseconds() + rl_clock_offset_ms; }

/* at_ms: the append time the messages get at the least (the core raises it
 * to the stream's clock): rl_now_ms() for a client's TWRITE, the primary's
 * time for a replicated or replayed RCP11.TWRITEAT. */
static int64_t rl_append_one(mn_stream *s, const char *p, size_t len, int64_t at_ms) {
    return mn_append_one(s, p, (uint32_t)len, at_ms);
}

static int64_t rl_append_many(mn_stream *s, const char *buf, const uint32_t *lens, size_t n,
                              int64_t at_ms) {
    return mn_append(s, buf, lens, n, at_ms);
}

/* Reply the error for a core return code that a checked command can still
 * meet. */
static int rl_reply_core_error(RedisModuleCtx *ctx, int64_t rc) {
    if (rc == MN_ERR_OVERFLOW) return RedisModule_ReplyWithError(ctx, RL_ERR_OVERFLOW);
    if (rc == MN_ERR_TOOBIG) return RedisModule_ReplyWithError(ctx, RL_ERR_TOOBIG);
    if (rc == MN_ERR_NOMEM) return RedisModule_ReplyWithError(ctx, "ERR out of memory");
    return RedisModule_ReplyWithError(ctx, "ERR internal error in the stream core");
}

/* ------------------------------------------------------------------------
 * Replies
 * --------------------------------------------------------------------- */

/* Messages per core call for a read of this stream (see
 * RL_READ_BATCH_BYTES). */
uint64_t rl_read_batch(const mn_stream *s) {
    uint64_t length = mn_length(s);
    uint64_t avg = length ? mn_payload_bytes(s) / length : 0;
    uint64_t batch = avg ? RL_READ_BATCH_BYTES / avg : RL_READ_BATCH_MAX;
    if (batch < 1) batch = 1;
    if (batch > RL_READ_BATCH_MAX) batch = RL_READ_BATCH_MAX;
    return batch;
}

/* Reply the messages at offsets [start, start + n), a null for each evicted
 * one. The caller checked start + n <= next offset. With times (WITHTIMES,
 * the contract's ZRANGE WITHSCORES shape), each message is followed by its
 * append time in RESP2 (two nulls for an evicted offset) and paired with
 * it in RESP3 (one null):
 *
 *   RESP2   "m1"  :t1  nil  nil  "m3"  :t3      (the caller sent *2n)
 *   RESP3   ["m1" :t1]  nil  ["m3" :t3]         (the caller sent *n)
 */
static void rl_reply_messages(RedisModuleCtx *ctx, mn_stream *s, uint64_t start, uint64_t n,
                              int times, int resp3) {
    uint64_t batch = rl_read_batch(s);
    int per_null = times && !resp3 ? 2 : 1;
    while (n > 0) {
        uint64_t k = n < batch ? n : batch;
        rl_read_buf.len = 0;
        int rc = mn_read_copy(s, start, k, &rl_read_buf, rl_read_lens);
        if (rc == MN_OK && times) rc = mn_read_times(s, start, k, rl_read_times);
        if (rc != MN_OK) {
            /* Cannot happen for a checked range; the array length is already
             * sent, so keep the reply well-formed. */
            RedisModule_Log(ctx, "warning", "rcp11: read failed (%d) at offset %llu", rc,
                            (unsigned long long)start);
            for (uint64_t i = 0; i < n * per_null; i++) RedisModule_ReplyWithNull(ctx);
            return;
        }
        const char *p = rl_read_buf.data;
        for (uint64_t i = 0; i < k; i++) {
            if (rl_read_lens[i] < 0) {
                for (int j = 0; j < per_null; j++) RedisModule_ReplyWithNull(ctx);
                continue;
            }
            if (times && resp3) RedisModule_ReplyWithArray(ctx, 2);
            RedisModule_ReplyWithStringBuffer(ctx, p, (size_t)rl_read_lens[i]);
            if (times) RedisModule_ReplyWithLongLong(ctx, (long long)rl_read_times[i]);
            p += rl_read_lens[i];
        }
        start += k;
        n -= k;
    }
}

/* TREAD ... PACKED (docs/PROTOCOL.md): the messages at [start, start + n)
 * as bulk strings, the same in RESP2 and RESP3 (mn_read_packed):
 *
 *   lengths   n x uint32 LE, 0xFFFFFFFF for an evicted offset
 *   messages  the messages back to back
 *   times     (withtimes) n x int64 LE, -1 for an evicted offset
 *
 * The caller sent the array header (2 or 3 elements, after WITHINFO's). */
static void rl_reply_packed(RedisModuleCtx *ctx, mn_stream *s, uint64_t start, uint64_t n,
                            int withtimes) {
    int parts = withtimes ? 3 : 2;
    if (n == 0) {
        for (int i = 0; i < parts; i++) RedisModule_ReplyWithStringBuffer(ctx, "", 0);
        return;
    }
    /* The tables come from malloc, which fails softly (RedisModule_Alloc
     * ends the server): a read over a long run of evicted offsets asks for
     * 4 (12) bytes per offset, which may be more than there is. */
    int fits = n <= SIZE_MAX / 8;
    unsigned char *lens = fits ? malloc((size_t)n * 4) : NULL;
    unsigned char *times = fits && withtimes ? malloc((size_t)n * 8) : NULL;
    rl_read_buf.len = 0;
    if (lens != NULL && (times != NULL || !withtimes) &&
        mn_read_packed(s, start, n, &rl_read_buf, lens, times) == MN_OK) {
        RedisModule_ReplyWithStringBuffer(ctx, (const char *)lens, (size_t)n * 4);
        RedisModule_ReplyWithStringBuffer(ctx, rl_read_buf.data, rl_read_buf.len);
        if (times) RedisModule_ReplyWithStringBuffer(ctx, (const char *)times, (size_t)n * 8);
    } else {
        /* Out of memory (a checked range fails no other way); the array
         * length is sent: keep the reply well-formed. */
        for (; parts > 0; parts--) RedisModule_ReplyWithError(ctx, "ERR out of memory");
    }
    free(lens);
    free(times);
}

/* TREAD's reply for offsets start.. (at most count of them), with the
 * WITHINFO header (and nextra more integers after its four: a lease read's
 * deliveries and deadline), the WITHTIMES times and in the PACKED form when
 * asked. Returns how many offsets it holds (nulls included): the group key
 * moves by that much. s may be NULL. */
uint64_t rl_reply_range(RedisModuleCtx *ctx, mn_stream *s, uint64_t start, long long count,
                        int withinfo, int withtimes, int packed, const long long *extra, int nextra) {
    /* The end a reader may see (rcp11.read-committed: what the replicas
     * acknowledged). */
    uint64_t next = rl_resv_readable_next(ctx, s);
    uint64_t n = start < next ? next - start : 0;
    if (n > (uint64_t)count) n = (uint64_t)count;
    int resp3 = (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_RESP3) != 0;
    /* RESP2 times: two elements per offset (n is far below 2^62: a reply
     * that large could not be built anyway); PACKED: two or three. */
    long elements = (long)(withtimes && !resp3 ? 2 * n : n);
    if (packed) elements = withtimes ? 3 : 2;
    if (withinfo) {
        uint64_t first = s ? mn_first_offset(s) : 0;
        if (first > next) first = next;
        RedisModule_ReplyWithArray(ctx, elements + 1);
        RedisModule_ReplyWithArray(ctx, 4 + nextra);
        /* next may be 2^63, which no RESP integer holds: the info reports
         * the ceiling instead, as the Python server does. */
        RedisModule_ReplyWithLongLong(ctx, (long long)(first < RL_OFFSET_END ? first : RL_OFFSET_END - 1));
        RedisModule_ReplyWithLongLong(ctx, next == 0 ? -1 : (long long)(next - 1));
        RedisModule_ReplyWithLongLong(ctx, (long long)(start < RL_OFFSET_END ? start : RL_OFFSET_END - 1));
        RedisModule_ReplyWithLongLong(ctx, (long long)n);
        for (int i = 0; i < nextra; i++) RedisModule_ReplyWithLongLong(ctx, extra[i]);
    } else {
        RedisModule_ReplyWithArray(ctx, elements);
    }
    if (packed) {
        rl_snap before;
        if (s) rl_snap_take(s, &before);
        rl_reply_packed(ctx, s, start, n, withtimes);
        if (s) rl_account(s, &before);
    } else if (n > 0) {
        rl_snap before;
        rl_snap_take(s, &before);
        rl_reply_messages(ctx, s, start, n, withtimes, resp3);
        rl_account(s, &before); /* reading a compressed node fills its cache */
    }
    rl_release_scratch();
    return n;
}


/* TREAD ... NONULLS: start at the first readable offset at or after
 * *start (past evicted offsets and gaps) and cover only the readable
 * offsets in a row from there, at most *count. s may be NULL. */
static void rl_skip_nulls(const mn_stream *s, uint64_t *start, long long *count) {
    uint64_t run = 0;
    if (s != NULL) *start = mn_readable_run(s, *start, (uint64_t)*count, &run);
    *count = (long long)run;
}

/* ------------------------------------------------------------------------
 * Group keys
 * --------------------------------------------------------------------- */

/* Read a group key: *missing set when it does not exist, else *pos. On a
 * bad value replies the error and returns REDISMODULE_ERR. */
static int rl_group_position(RedisModuleCtx *ctx, RedisModuleString *group, int *missing,
                             uint64_t *pos) {
    RedisModuleKey *key = RedisModule_OpenKey(ctx, group, REDISMODULE_READ);
    int type = RedisModule_KeyType(key);
    *missing = type == REDISMODULE_KEYTYPE_EMPTY;
    *pos = 0;
    if (*missing) {
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    if (type != REDISMODULE_KEYTYPE_STRING) {
        /* An acknowledged group read without LEASE would lose what it
         * read: say what the key holds. */
        int acked = ra_holds_group(key);
        RedisModule_CloseKey(key);
        if (acked)
            rl_reply_quoted(ctx, "ERR group key ", group, RL_QUOTE_MAX,
                            " holds an acknowledged group: read it with LEASE");
        else
            RedisModule_ReplyWithError(ctx, RL_WRONGTYPE);
        return REDISMODULE_ERR;
    }
    size_t len;
    const char *p = RedisModule_StringDMA(key, &len, REDISMODULE_READ);
    /* 2^63 is the position past a stream's last possible message: the
     * module writes it itself, so it must read it back. */
    int ok = rl_parse_offset(p, len, RL_OFFSET_END, pos);
    RedisModule_CloseKey(key);
    if (!ok) {
        rl_reply_group_not_offset(ctx, group);
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

void rl_reply_group_not_offset(RedisModuleCtx *ctx, RedisModuleString *group) {
    rl_reply_quoted(ctx, "ERR group key ", group, RL_QUOTE_MAX,
                    " does not hold a valid offset (an integer >= 0)");
}

/* Where a group without a group key starts: the oldest readable message,
 * or (GROUPNEW) the next message written. */
uint64_t rl_group_default(const mn_stream *s, int group_new) {
    if (s == NULL) return 0;
    return group_new ? mn_next_offset(s) : mn_first_offset(s);
}

/* Write a group key and replicate it as the SET it is. */
static void rl_set_group(RedisModuleCtx *ctx, RedisModuleString *group, uint64_t pos) {
    char digits[24];
    int len = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)pos);
    RedisModuleString *value = RedisModule_CreateString(ctx, digits, (size_t)len);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, group, REDISMODULE_WRITE);
    RedisModule_StringSet(key, value);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, group);
    rl_own_event = 1;
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_STRING, "set", group);
    rl_own_event = 0;
    RedisModule_Replicate(ctx, "SET", "ss", group, value);
    RedisModule_FreeString(ctx, value);
}

/* ------------------------------------------------------------------------
 * Blocked readers
 *
 * Each blocked TREAD owns an rl_wait (its privdata). Group readers are also
 * linked into their group's rl_group, found in rl_groups by the key
 * "<db as 4 bytes><group key name>", so that a change of the group key can
 * signal the streams they wait on.
 * --------------------------------------------------------------------- */

struct rl_group {
    rl_wait *head, *tail;
    size_t name_len;
    char name[]; /* the rl_groups key */
};

static RedisModuleDict *rl_groups;
static uint64_t rl_waiting; /* blocked TREADs: the keyspace hook idles at 0 */

/* "<db as 4 bytes><key name>": a key of one database, as rl_groups and
 * rl_pause.wakes name it. The caller frees it. */
static char *rl_db_key(int db, RedisModuleString *name, size_t *len) {
    size_t nlen;
    const char *n = RedisModule_StringPtrLen(name, &nlen);
    char *k = RedisModule_Alloc(nlen + 4);
    uint32_t d = (uint32_t)db;
    memcpy(k, &d, 4);
    memcpy(k + 4, n, nlen);
    *len = nlen + 4;
    return k;
}

static void rl_group_link(rl_wait *w) {
    size_t len;
    char *k = rl_db_key(w->db, w->group, &len);
    int nokey;
    rl_group *g = RedisModule_DictGetC(rl_groups, k, len, &nokey);
    if (nokey || g == NULL) {
        g = RedisModule_Alloc(sizeof(rl_group) + len);
        g->head = g->tail = NULL;
        g->name_len = len;
        memcpy(g->name, k, len);
        RedisModule_DictSetC(rl_groups, g->name, len, g);
    }
    RedisModule_Free(k);
    w->owner = g;
    w->next = NULL;
    w->prev = g->tail;
    if (g->tail) g->tail->next = w;
    else g->head = w;
    g->tail = w;
}

static void rl_group_unlink(rl_wait *w) {
    rl_group *g = w->owner;
    if (g == NULL) return;
    if (w->prev) w->prev->next = w->next;
    else g->head = w->next;
    if (w->next) w->next->prev = w->prev;
    else g->tail = w->prev;
    if (g->head == NULL) {
        RedisModule_DictDelC(rl_groups, g->name, g->name_len, NULL);
        RedisModule_Free(g);
    }
    w->owner = NULL;
}

static void rl_wait_free(RedisModuleCtx *ctx, void *privdata) {
    (void)ctx;
    rl_wait *w = privdata;
    rl_group_unlink(w);
    RedisModule_FreeString(NULL, w->key);
    if (w->group) RedisModule_FreeString(NULL, w->group);
    if (w->consumer) RedisModule_FreeString(NULL, w->consumer);
    RedisModule_Free(w);
    rl_waiting--;
}

/* Remember to signal w's stream once clients are no longer paused. */
void rl_defer_wake(rl_wait *w) {
    size_t len;
    char *k = rl_db_key(w->db, w->key, &len);
    int nokey;
    RedisModule_DictGetC(rl_pause.wakes, k, len, &nokey);
    if (nokey) {
        rl_deferred_wake *d = RedisModule_Alloc(sizeof(*d));
        d->db = w->db;
        d->key = RedisModule_CreateStringFromString(NULL, w->key);
        RedisModule_DictSetC(rl_pause.wakes, k, len, d);
    }
    RedisModule_Free(k);
    rl_pause.group_wakes++;
}

/* Signal the streams whose group readers waited out a pause: Redis serves
 * them before it next sleeps. */
static void rl_wake_deferred(RedisModuleCtx *ctx) {
    if (RedisModule_DictSize(rl_pause.wakes) == 0) return;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(rl_pause.wakes, "^", NULL, 0);
    void *value;
    while (RedisModule_DictNextC(it, NULL, &value) != NULL) {
        rl_deferred_wake *d = value;
        if (RedisModule_SelectDb(ctx, d->db) == REDISMODULE_OK)
            RedisModule_SignalKeyAsReady(ctx, d->key);
        RedisModule_FreeString(NULL, d->key);
        RedisModule_Free(d);
    }
    RedisModule_DictIteratorStop(it);
    RedisModule_FreeDict(NULL, rl_pause.wakes);
    rl_pause.wakes = RedisModule_CreateDict(NULL);
}

/* Serve a blocked reader if its stream has something at its start offset.
 * Returns REDISMODULE_OK when it replied (also with an error), ERR to keep
 * it waiting. Writes and replicates only when it replies (see BLOCKING). */
static int rl_tread_wake(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    rl_wait *w = RedisModule_GetBlockedClientPrivateData(ctx);
    if (w->lease) return ra_wake(ctx, w);
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, w->key, REDISMODULE_READ, &key, &s))
        return REDISMODULE_OK; /* -WRONGTYPE went to the reader */
    uint64_t next = rl_resv_readable_next(ctx, s);
    uint64_t start = w->start, pos = 0;
    int missing = 0;
    if (w->group) {
        if (rl_group_position(ctx, w->group, &missing, &pos) != REDISMODULE_OK) {
            RedisModule_CloseKey(key);
            return REDISMODULE_OK; /* the error went to the reader */
        }
        start = !missing ? pos : w->has_fallback ? w->fallback : rl_group_default(s, w->group_new);
    }
    long long count = w->count;
    if (w->nonulls) rl_skip_nulls(s, &start, &count);
    if (start >= next) {
        /* Written but not acknowledged yet (read-committed): woken again
         * once it is. */
        if (s != NULL && start < mn_next_offset(s)) rl_resv_reader_waits(ctx, w->key);
        RedisModule_CloseKey(key);
        return REDISMODULE_ERR;
    }
    if (w->group && RedisModule_AvoidReplicaTraffic()) {
        /* Serving would move the group key while writes are paused. */
        RedisModule_CloseKey(key);
        rl_defer_wake(w);
        return REDISMODULE_ERR;
    }
    uint64_t n = rl_reply_range(ctx, s, start, count, w->withinfo, w->withtimes, w->packed, NULL, 0);
    RedisModule_CloseKey(key);
    if (w->group && (missing || start + n != pos)) rl_set_group(ctx, w->group, start + n);
    return REDISMODULE_OK;
}

static int rl_tread_timeout(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithNullArray(ctx);
}

void rl_block(RedisModuleCtx *ctx, RedisModuleString *stream_key, rl_wait *w,
              long long block_ms) {
    w->db = RedisModule_GetSelectedDb(ctx);
    w->key = RedisModule_CreateStringFromString(NULL, stream_key);
    if (w->group) {
        w->group = RedisModule_CreateStringFromString(NULL, w->group);
        rl_group_link(w);
    }
    rl_waiting++;
    RedisModule_BlockClientOnKeys(ctx, rl_tread_wake, rl_tread_timeout, rl_wait_free, block_ms,
                                  &stream_key, 1, w);
}

/* Readers waiting on key, or on a group stored at key, look again. */
static void rl_wake_on_keyspace_event(RedisModuleCtx *ctx, RedisModuleString *key) {
    /* Readers of this key as a stream: they reread it (and may get
     * -WRONGTYPE). A no-op for keys nobody blocks on. */
    RedisModule_SignalKeyAsReady(ctx, key);
    if (RedisModule_DictSize(rl_groups) == 0) return;
    size_t len;
    char *k = rl_db_key(RedisModule_GetSelectedDb(ctx), key, &len);
    int nokey;
    rl_group *g = RedisModule_DictGetC(rl_groups, k, len, &nokey);
    RedisModule_Free(k);
    if (nokey || g == NULL) return;
    RedisModuleKey *gk = RedisModule_OpenKey(ctx, key, REDISMODULE_READ);
    int missing = RedisModule_KeyType(gk) == REDISMODULE_KEYTYPE_EMPTY;
    RedisModule_CloseKey(gk);
    for (rl_wait *w = g->head; w != NULL; w = w->next) {
        if (missing) {
            /* The group starts over from here, as if the key had been
             * recreated now. */
            RedisModuleKey *sk = RedisModule_OpenKey(ctx, w->key, REDISMODULE_READ);
            mn_stream *s;
            w->fallback = rl_stream_of(sk, &s) ? rl_group_default(s, w->group_new) : 0;
            w->has_fallback = 1;
            RedisModule_CloseKey(sk);
        }
        RedisModule_SignalKeyAsReady(ctx, w->key);
    }
}

/* The database MOVE took its key from (its move_from event), until the
 * move_to event that follows; -1 when none is under way. */
static int rl_move_from_db = -1;

/* COPY ... DB of a key of another type has no copy callback to tell its
 * database: the command filter notes the client's database as COPY comes
 * in (Valkey only: Redis 7.0 gives a filter no client id, and needs none). */
static unsigned long long rl_copy_client; /* 0: none */
static int rl_copy_client_db;

static void rl_copy_filter(RedisModuleCommandFilterCtx *f) {
    if (RedisModule_CommandFilterArgsCount(f) < 5) return; /* COPY src dst DB n */
    if (!rl_arg_is(RedisModule_CommandFilterArgGet(f, 0), "COPY")) return;
    unsigned long long id = RedisModule_CommandFilterGetClientId(f);
    RedisModuleClientInfo ci;
    memset(&ci, 0, sizeof(ci));
    ci.version = 1;
    if (id == 0 || RedisModule_GetClientInfoById(&ci, id) != REDISMODULE_OK) return;
    rl_copy_client = id;
    rl_copy_client_db = ci.db;
}

static int rl_register_copy_filter(RedisModuleCtx *ctx) {
    if (RedisModule_RegisterCommandFilter == NULL || RedisModule_CommandFilterArgsCount == NULL ||
        RedisModule_CommandFilterArgGet == NULL || RedisModule_CommandFilterGetClientId == NULL ||
        RedisModule_GetClientInfoById == NULL)
        return REDISMODULE_OK;
    return RedisModule_RegisterCommandFilter(ctx, rl_copy_filter, REDISMODULE_CMDFILTER_NOSELF)
               ? REDISMODULE_OK
               : REDISMODULE_ERR;
}

/* Keyspace events (GENERIC, STRING, EXPIRED, EVICTED) while readers wait:
 * Redis 7.0 signals neither a stream key overwritten by SET nor any change
 * of a group key, so signal them here. Reads only: a keyspace-event
 * callback must not write.
 *
 * Valkey 8.1 runs this callback on the client running the command and
 * selects the event's database on it without selecting the old one back:
 * after MOVE's move_to or COPY ... DB's copy_to the user's connection
 * would stay on the target database, and the command be logged to the AOF
 * and the replicas under it (SELECT 1, MOVE s 1: the key is gone on
 * replay). So the callback selects the command's own database again: for
 * move_to the one of move_from just before, for copy_to the one the copy
 * callback (rl_copy, ra_copy) saw, or else rl_copy_filter's. It propagates
 * nothing. On Redis 7.0 the callback has a client of its own, and this
 * changes nothing. */
static int rl_on_keyspace_event(RedisModuleCtx *ctx, int type, const char *event,
                                RedisModuleString *key) {
    (void)type;
    int back = -1;
    if (strcmp(event, "move_from") == 0) {
        rl_move_from_db = RedisModule_GetSelectedDb(ctx);
    } else if (strcmp(event, "move_to") == 0) {
        back = rl_move_from_db;
        rl_move_from_db = -1;
    } else if (strcmp(event, "copy_to") == 0) {
        back = rl_copy_from_db;
        if (back < 0 && rl_copy_client != 0 && RedisModule_GetClientId(ctx) == rl_copy_client)
            back = rl_copy_client_db;
        rl_copy_from_db = -1;
        rl_copy_client = 0;
    }
    if (rl_waiting != 0 && !rl_own_event) rl_wake_on_keyspace_event(ctx, key);
    if (back >= 0 && back != RedisModule_GetSelectedDb(ctx)) RedisModule_SelectDb(ctx, back);
    return REDISMODULE_OK;
}

/* FLUSHDB / FLUSHALL (and a replica's full resync) drop streams and group
 * keys without a keyspace event per key: every group reader of a flushed
 * database starts over at offset 0, the start of the stream that will be
 * created next. */
static void rl_on_flush(RedisModuleCtx *ctx, RedisModuleEvent eid, uint64_t subevent, void *data) {
    (void)ctx;
    (void)eid;
    const RedisModuleFlushInfo *info = data;
    if (subevent != REDISMODULE_SUBEVENT_FLUSHDB_END || rl_waiting == 0) return;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(rl_groups, "^", NULL, 0);
    void *value;
    while (RedisModule_DictNextC(it, NULL, &value) != NULL) {
        for (rl_wait *w = ((rl_group *)value)->head; w != NULL; w = w->next) {
            if (info->dbnum != -1 && info->dbnum != w->db) continue;
            w->fallback = 0;
            w->has_fallback = 1;
        }
    }
    RedisModule_DictIteratorStop(it);
}

/* ------------------------------------------------------------------------
 * TWRITE key entry | TWRITE key [BACKLOG count] ENTRIES entry [entry ...]
 * --------------------------------------------------------------------- */

/* Parse the options form. Sets *entries_at (argv index of the first entry)
 * and *backlog (-1: none). Replies the error and returns ERR. */
static int rl_twrite_options(RedisModuleCtx *ctx, RedisModuleString **argv, int argc,
                             int *entries_at, long long *backlog) {
    *backlog = -1;
    int i = 2;
    for (;;) {
        if (i >= argc) {
            RedisModule_ReplyWithError(ctx, "ERR syntax error, ENTRIES is missing");
            return REDISMODULE_ERR;
        }
        if (rl_arg_is(argv[i], "ENTRIES")) {
            i++;
            break;
        }
        if (rl_arg_is(argv[i], "BACKLOG")) {
            if (*backlog != -1) {
                RedisModule_ReplyWithError(ctx, "ERR syntax error, BACKLOG given more than once");
                return REDISMODULE_ERR;
            }
            if (i + 1 >= argc) {
                RedisModule_ReplyWithError(ctx, "ERR syntax error, BACKLOG needs a count");
                return REDISMODULE_ERR;
            }
            if (RedisModule_StringToLongLong(argv[i + 1], backlog) != REDISMODULE_OK ||
                *backlog < 0) {
                RedisModule_ReplyWithError(ctx, RL_ERR_BACKLOG);
                return REDISMODULE_ERR;
            }
            i += 2;
            continue;
        }
        /* No ENTRIES after the word: most likely it was forgotten
         * (TWRITE s BACKLOG 3 a b), so the error says that first. */
        int entries_follow = 0;
        for (int k = i + 1; k < argc && !entries_follow; k++)
            entries_follow = rl_arg_is(argv[k], "ENTRIES");
        rl_reply_quoted(ctx,
                        entries_follow ? "ERR syntax error, unknown option "
                                       : "ERR syntax error, ENTRIES is missing, unknown option ",
                        argv[i], SIZE_MAX, " (expected BACKLOG or ENTRIES)");
        return REDISMODULE_ERR;
    }
    if (i >= argc) {
        RedisModule_ReplyWithError(ctx, "ERR syntax error, no entry after ENTRIES");
        return REDISMODULE_ERR;
    }
    *entries_at = i;
    return REDISMODULE_OK;
}

/* What an append did, for the caller's replication and reply. */
typedef struct rl_appended {
    int64_t first;          /* offset of the first message */
    int64_t at_ms;          /* the append time the messages got */
    int64_t clock_before;   /* the stream's clock before (0: new stream) */
    uint64_t first_before;  /* the stream's first offset before a BACKLOG cut */
    uint64_t first_after;   /* ... and after it */
    mn_stream *stream;      /* the stream written */
} rl_appended;

/* at_ms for rl_append_entries(): the stream's own clock (its newest append
 * time), or the module's clock for a stream that never had a message. */
#define RL_AT_STREAM_CLOCK (-2)

/* The body of TWRITE and RCP11.TWRITEAT: append the n messages entries[]
 * to the stream `name` at append time at_ms (raised to the stream's clock),
 * then keep the newest `backlog` offsets (-1: no cut). Signals the key.
 * Returns 1, or replies the error and returns 0 with nothing changed. */
static int rl_append_entries(RedisModuleCtx *ctx, RedisModuleString *name,
                             RedisModuleString **entries, size_t n, int64_t at_ms,
                             long long backlog, rl_appended *out) {
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE, &key, &s)) return 0;
    uint64_t next = s ? mn_next_offset(s) : 0;
    if ((uint64_t)n > RL_OFFSET_END - next) {
        RedisModule_CloseKey(key);
        RedisModule_ReplyWithError(ctx, RL_ERR_OVERFLOW);
        return 0;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        RedisModule_StringPtrLen(entries[i], &len);
        if ((uint64_t)len > MN_MAX_MESSAGE_BYTES) {
            RedisModule_CloseKey(key);
            RedisModule_ReplyWithError(ctx, RL_ERR_TOOBIG);
            return 0;
        }
        total += len;
    }

    out->clock_before = s ? mn_last_append_ms(s) : 0;
    if (at_ms == RL_AT_STREAM_CLOCK) at_ms = out->clock_before > 0 ? out->clock_before : rl_now_ms();
    int created = s == NULL;
    if (created) s = rl_stream_new();
    else rl_apply_config(s);
    rl_snap before;
    rl_snap_take(created ? NULL : s, &before);
    int64_t first;
    if (n == 1) {
        size_t len;
        const char *p = RedisModule_StringPtrLen(entries[0], &len);
        first = rl_append_one(s, p, len, at_ms);
    } else {
        rl_reserve_write(total ? total : 1, n);
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t len;
            const char *p = RedisModule_StringPtrLen(entries[i], &len);
            memcpy(rl_write_buf + at, p, len);
            rl_write_lens[i] = (uint32_t)len;
            at += len;
        }
        first = rl_append_many(s, rl_write_buf, rl_write_lens, n, at_ms);
        rl_release_scratch();
    }
    if (first < 0) {
        if (created) mn_stream_free(s);
        RedisModule_CloseKey(key);
        rl_reply_core_error(ctx, first);
        return 0;
    }
    if (created) {
        RedisModule_ModuleTypeSetValue(key, rl_type, s);
        rl_total_add(&rl_totals.streams, 1);
        rl_resv_created(ctx, name, s);
    }
    out->stream = s;
    out->first = first;
    out->at_ms = mn_last_append_ms(s);
    out->first_before = mn_first_offset(s);
    if (backlog >= 0) mn_evict_keep(s, (uint64_t)backlog);
    out->first_after = mn_first_offset(s);
    rl_account(s, &before);
    RedisModule_CloseKey(key);

    RedisModule_SignalModifiedKey(ctx, name);
    RedisModule_SignalKeyAsReady(ctx, name);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "twrite", name);
    return 1;
}

static int rl_twrite(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 3) return RedisModule_WrongArity(ctx);
    int entries_at = 2;
    long long backlog = -1;
    if (argc > 3 && rl_twrite_options(ctx, argv, argc, &entries_at, &backlog) != REDISMODULE_OK)
        return REDISMODULE_OK;
    size_t n = (size_t)(argc - entries_at);
    /* No offset is handed out twice: the reservation covering them must be
     * confirmed first (module_reserve.c); else the client waits, and this
     * command runs again once it is. */
    if (!rl_resv_admit(ctx, argv[1], n, rl_twrite)) return REDISMODULE_OK;
    /* A plain TWRITE from this server's primary or from the AOF is one
     * whose messages got the stream's clock there (below): so here too. */
    int64_t at_ms = RL_AT_STREAM_CLOCK;
    if (!(RedisModule_GetContextFlags(ctx) &
          (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)))
        at_ms = rl_now_ms();
    rl_appended a;
    if (!rl_append_entries(ctx, argv[1], argv + entries_at, n, at_ms, backlog, &a))
        return REDISMODULE_OK;
    rl_resv_wrote(ctx, argv[1], a.stream);
    /* Replicas and the AOF must append at the time the messages got here.
     * When that is the stream's clock as it was (writes within one
     * millisecond, the common case at high rates), the command goes
     * verbatim and the receiver appends at its copy of the stream's clock,
     * which equals this one (see REPLICATION AND THE AOF): no
     * RM_Replicate, which costs a command lookup and several allocations
     * per call (~10% of a TWRITE's server CPU). Otherwise the time goes
     * along in RCP11.TWRITEAT, and a cut as an absolute offset. */
    if (backlog < 0 && a.clock_before > 0 && a.at_ms == a.clock_before) {
        RedisModule_ReplicateVerbatim(ctx);
        return RedisModule_ReplyWithLongLong(ctx, a.first);
    }
    /* The time's string is kept while the clock stays on one millisecond
     * (RM_Replicate only takes a reference to an "s" argument). */
    static RedisModuleString *at_str;
    static int64_t at_str_ms = -1;
    if (at_str_ms != a.at_ms) {
        if (at_str != NULL) RedisModule_FreeString(NULL, at_str);
        at_str = RedisModule_CreateStringFromLongLong(NULL, (long long)a.at_ms);
        at_str_ms = a.at_ms;
    }
    RedisModule_Replicate(ctx, "RCP11.TWRITEAT", "ssv", argv[1], at_str, argv + entries_at, n);
    if (a.first_after != a.first_before)
        RedisModule_Replicate(ctx, "TEVICT", "sl", argv[1], (long long)(a.first_after - 1));
    return RedisModule_ReplyWithLongLong(ctx, a.first);
}

/* Internal commands (RCP11.TWRITEAT, RCP11.NODE) set append times, which no
 * client may: they run only from the replication link (REPLICATED: sent by
 * this server's primary) or while the server loads its AOF (LOADING: no
 * client command runs then). */
int rl_internal_refused(RedisModuleCtx *ctx, const char *what) {
    int flags = RedisModule_GetContextFlags(ctx);
    if (flags & (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)) return 0;
    char msg[160];
    snprintf(msg, sizeof(msg), RL_ERR_INTERNAL_FMT, what);
    RedisModule_ReplyWithError(ctx, msg);
    return 1;
}

/* RCP11.TWRITEAT key unix-ms entry [entry ...]: TWRITE as replicas and the
 * AOF receive it: the messages are appended at the primary's time unix-ms
 * (raised to the stream's clock, as every append), so TSEEK and retention
 * by age answer on a replica and after an AOF replay as on the primary. */
static int rl_twriteat(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 4) return RedisModule_WrongArity(ctx);
    if (rl_internal_refused(ctx, "RCP11.TWRITEAT")) return REDISMODULE_OK;
    long long at_ms;
    if (RedisModule_StringToLongLong(argv[2], &at_ms) != REDISMODULE_OK || at_ms < 0)
        return RedisModule_ReplyWithError(ctx, RL_ERR_TIME);
    rl_appended a;
    if (!rl_append_entries(ctx, argv[1], argv + 3, (size_t)(argc - 3), at_ms, -1, &a))
        return REDISMODULE_OK;
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithLongLong(ctx, a.first);
}

/* ------------------------------------------------------------------------
 * TREAD key offset count [BLOCK ms] [GROUP gk | GROUPNEW gk] [WITHINFO] [NONULLS]
 *       [WITHTIMES] [PACKED]
 * --------------------------------------------------------------------- */

/* ACK start count at argv[at]: an acknowledgement before a lease read. */
static int rl_tread_ack_option(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, int at,
                               rl_tread_args *a) {
    const char *refused = NULL;
    if (at + 2 >= argc) refused = "ERR syntax error, ACK needs a start and a count";
    else if (RedisModule_StringToLongLong(argv[at + 1], &a->ack_start) != REDISMODULE_OK)
        refused = RL_ERR_OFFSET;
    else if (a->ack_start < 0) refused = RL_ERR_NEGATIVE_OFFSET;
    else if (RedisModule_StringToLongLong(argv[at + 2], &a->ack_count) != REDISMODULE_OK)
        refused = RL_ERR_COUNT;
    else if (a->ack_count < 0) refused = RL_ERR_NEGATIVE_COUNT;
    if (refused != NULL) {
        RedisModule_ReplyWithError(ctx, refused);
        return REDISMODULE_ERR;
    }
    a->ack = 1;
    return REDISMODULE_OK;
}

/* Options in any order, each at most once. Replies the error and returns
 * ERR. */
static int rl_tread_options(RedisModuleCtx *ctx, RedisModuleString **argv, int argc,
                            rl_tread_args *a) {
    /* BLOCK, GROUP, GROUPNEW, LEASE and CONSUMER take a value, ACK two; the
     * rest are a word alone. */
    static const char *const names[] = {"WITHINFO", "BLOCK",   "GROUP",     "GROUPNEW", "LEASE",
                                        "CONSUMER", "ACK",     "NONULLS",   "WITHTIMES", "PACKED"};
    enum { N_OPTIONS = sizeof(names) / sizeof(names[0]) };
    int seen[N_OPTIONS] = {0};
    for (int i = 4; i < argc;) {
        int opt = -1;
        for (int k = 0; k < N_OPTIONS; k++)
            if (rl_arg_is(argv[i], names[k])) opt = k;
        if (opt < 0) {
            rl_reply_quoted(ctx, "ERR syntax error, unknown option ", argv[i], SIZE_MAX, "");
            return REDISMODULE_ERR;
        }
        char msg[96];
        if (seen[opt]) {
            snprintf(msg, sizeof(msg), "ERR syntax error, %s given more than once", names[opt]);
            RedisModule_ReplyWithError(ctx, msg);
            return REDISMODULE_ERR;
        }
        seen[opt] = 1;
        if (opt == 0 || opt >= 7) { /* a word alone */
            if (opt == 0) a->withinfo = 1;
            else if (opt == 7) a->nonulls = 1;
            else if (opt == 8) a->withtimes = 1;
            else a->packed = 1;
            i++;
            continue;
        }
        if (opt == 6) {
            if (rl_tread_ack_option(ctx, argv, argc, i, a) != REDISMODULE_OK)
                return REDISMODULE_ERR;
            i += 3;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(msg, sizeof(msg), "ERR syntax error, %s needs a value", names[opt]);
            RedisModule_ReplyWithError(ctx, msg);
            return REDISMODULE_ERR;
        }
        RedisModuleString *value = argv[i + 1];
        i += 2;
        if (opt == 4) {
            if (RedisModule_StringToLongLong(value, &a->lease_ms) != REDISMODULE_OK ||
                a->lease_ms < 1 || a->lease_ms > AG_MAX_LEASE_MS) {
                RedisModule_ReplyWithError(ctx, RL_ERR_LEASE);
                return REDISMODULE_ERR;
            }
            a->lease = 1;
        } else if (opt == 5) {
            size_t len;
            RedisModule_StringPtrLen(value, &len);
            if (len > AG_MAX_OWNER_BYTES) {
                RedisModule_ReplyWithError(ctx, RL_ERR_CONSUMER_TOO_LONG);
                return REDISMODULE_ERR;
            }
            a->consumer = value;
        } else if (opt == 1) {
            if (RedisModule_StringToLongLong(value, &a->block_ms) != REDISMODULE_OK) {
                RedisModule_ReplyWithError(ctx, RL_ERR_TIMEOUT);
                return REDISMODULE_ERR;
            }
            if (a->block_ms < 0) {
                RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_TIMEOUT);
                return REDISMODULE_ERR;
            }
            a->block = 1;
        } else {
            if (a->group != NULL) {
                RedisModule_ReplyWithError(ctx, RL_ERR_GROUP_AND_GROUPNEW);
                return REDISMODULE_ERR;
            }
            a->group = value;
            a->group_new = opt == 3;
        }
    }
    /* CONSUMER and ACK belong to a lease read, and a lease to a group. */
    const char *refused = NULL;
    if (!a->lease && a->consumer != NULL) refused = RL_ERR_CONSUMER_NEEDS_LEASE;
    else if (!a->lease && a->ack) refused = RL_ERR_ACK_NEEDS_LEASE;
    else if (a->lease && a->group == NULL) refused = RL_ERR_LEASE_NEEDS_GROUP;
    else if (a->lease && a->nonulls) refused = RL_ERR_NONULLS_LEASE;
    else if (a->lease && a->withtimes) refused = RL_ERR_WITHTIMES_LEASE;
    else if (a->lease && a->packed) refused = RL_ERR_PACKED_LEASE;
    if (refused != NULL) {
        RedisModule_ReplyWithError(ctx, refused);
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

/* A key-position request (Cluster's slot check, COMMAND GETKEYS without key
 * specs): the stream key and the group key, found as the parser finds it. */
static void rl_tread_keys(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc > 1) RedisModule_KeyAtPos(ctx, 1);
    for (int i = 4; i < argc;) {
        if (rl_arg_is(argv[i], "WITHINFO") || rl_arg_is(argv[i], "NONULLS") ||
            rl_arg_is(argv[i], "WITHTIMES") || rl_arg_is(argv[i], "PACKED")) {
            i++;
        } else if (rl_arg_is(argv[i], "BLOCK") || rl_arg_is(argv[i], "LEASE") ||
                   rl_arg_is(argv[i], "CONSUMER")) {
            i += 2;
        } else if (rl_arg_is(argv[i], "ACK")) {
            i += 3;
        } else if (rl_arg_is(argv[i], "GROUP") || rl_arg_is(argv[i], "GROUPNEW")) {
            if (i + 1 < argc) RedisModule_KeyAtPos(ctx, i + 1);
            i += 2;
        } else {
            break; /* a syntax error: the command will say so */
        }
    }
}

/* A group read moves its group key: a write, though TREAD is a read (so
 * that +@read users read streams). Besides TREAD, the user needs the
 * permission of RCP11.GROUPMOVE, a command in @write and @rcp11 that is
 * never run: +@read alone or +@all -@write cannot move groups, +@rcp11
 * can, and on Redis 7.0 (no categories) a rule names it
 * (docs/MODULE.md, ACLs). ACL DRYRUN cannot see this check. */
#define RL_GROUPMOVE "rcp11.groupmove"

static int rl_groupmove(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 2) return RedisModule_WrongArity(ctx);
    return RedisModule_ReplyWithError(
        ctx, "ERR RCP11.GROUPMOVE is not run: it is the ACL permission a group read "
             "(TREAD ... GROUP or GROUPNEW) needs to move its group key");
}

/* Whether the client's user may move the group key (see RL_GROUPMOVE);
 * when not, replies -NOPERM and logs it in ACL LOG, as Redis refuses. */
static int rl_may_move_group(RedisModuleCtx *ctx, RedisModuleString *group) {
    if (RedisModule_GetContextFlags(ctx) &
        (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING))
        return 1;
    RedisModuleString *name = RedisModule_GetCurrentUserName(ctx);
    if (name == NULL) return 1; /* no client: the server itself */
    RedisModuleUser *user = RedisModule_GetModuleUserFromUserName(name);
    int ok = 1;
    if (user != NULL) {
        static RedisModuleString *command;
        if (command == NULL) command = RedisModule_CreateString(NULL, RL_GROUPMOVE, strlen(RL_GROUPMOVE));
        RedisModuleString *check[2] = {command, group};
        ok = RedisModule_ACLCheckCommandPermissions(user, check, 2) == REDISMODULE_OK;
        if (!ok) {
            RedisModule_ACLAddLogEntry(ctx, user, command, REDISMODULE_ACL_LOG_CMD);
            size_t len;
            const char *p = RedisModule_StringPtrLen(name, &len);
            char quoted[RL_QUOTE_MAX * 3 + 8];
            rl_quote(p, len, RL_QUOTE_MAX, quoted, sizeof(quoted));
            char msg[RL_QUOTE_MAX * 3 + 200];
            snprintf(msg, sizeof(msg),
                     "NOPERM User %s has no permissions to run the '" RL_GROUPMOVE
                     "' command, which a group read needs to move its group key",
                     quoted);
            RedisModule_ReplyWithError(ctx, msg);
        }
        RedisModule_FreeModuleUser(user);
    }
    RedisModule_FreeString(NULL, name);
    return ok;
}

static int rl_tread(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_IsKeysPositionRequest(ctx)) {
        rl_tread_keys(ctx, argv, argc);
        return REDISMODULE_OK;
    }
    if (argc < 4) return RedisModule_WrongArity(ctx);
    rl_tread_args a;
    memset(&a, 0, sizeof(a));
    if (RedisModule_StringToLongLong(argv[2], &a.offset) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_OFFSET);
    if (RedisModule_StringToLongLong(argv[3], &a.count) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_COUNT);
    if (a.count < 0) return RedisModule_ReplyWithError(ctx, RL_ERR_NEGATIVE_COUNT);
    if (argc > 4 && rl_tread_options(ctx, argv, argc, &a) != REDISMODULE_OK) return REDISMODULE_OK;

    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, argv[1], REDISMODULE_READ, &key, &s)) return REDISMODULE_OK;
    uint64_t next = rl_resv_readable_next(ctx, s);
    /* Messages past `next` are written but not acknowledged (read-committed):
     * a reader blocking for them is woken once they are. */
    int unacknowledged = s != NULL && next < mn_next_offset(s);
    int flags = RedisModule_GetContextFlags(ctx);
    int may_block = a.block && !(flags & (REDISMODULE_CTX_FLAGS_MULTI | REDISMODULE_CTX_FLAGS_LUA |
                                          REDISMODULE_CTX_FLAGS_DENY_BLOCKING |
                                          REDISMODULE_CTX_FLAGS_LOADING));
    long long count = a.count;
    if (a.group == NULL) {
        uint64_t start = rl_resolve_offset(a.offset, next);
        if (a.nonulls) rl_skip_nulls(s, &start, &count);
        if (start >= next && may_block) {
            RedisModule_CloseKey(key);
            if (unacknowledged) rl_resv_reader_waits(ctx, argv[1]);
            rl_wait *w = RedisModule_Calloc(1, sizeof(rl_wait));
            w->start = start;
            w->count = a.count;
            w->withinfo = a.withinfo;
            w->withtimes = a.withtimes;
            w->packed = a.packed;
            w->nonulls = a.nonulls;
            rl_block(ctx, argv[1], w, a.block_ms);
            return REDISMODULE_OK;
        }
        rl_reply_range(ctx, s, start, count, a.withinfo, a.withtimes, a.packed, NULL, 0);
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }

    if (rl_same_string(a.group, argv[1])) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, RL_ERR_GROUP_IS_KEY);
    }
    /* A group read writes its group key: a read-only replica refuses it. */
    if ((flags & REDISMODULE_CTX_FLAGS_READONLY) && !(flags & REDISMODULE_CTX_FLAGS_REPLICATED)) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, RL_ERR_READONLY);
    }
    if (!rl_may_move_group(ctx, a.group)) {
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    if (a.lease) return ra_tread(ctx, argv[1], key, s, &a, may_block);
    int missing;
    uint64_t pos;
    if (rl_group_position(ctx, a.group, &missing, &pos) != REDISMODULE_OK) {
        RedisModule_CloseKey(key);
        return REDISMODULE_OK;
    }
    uint64_t start = missing ? rl_group_default(s, a.group_new) : pos;
    if (a.nonulls) rl_skip_nulls(s, &start, &count);
    if (start >= next && may_block) {
        RedisModule_CloseKey(key);
        if (unacknowledged) rl_resv_reader_waits(ctx, argv[1]);
        /* Created now, so a GROUPNEW reader gets what is written next. */
        if (missing) rl_set_group(ctx, a.group, start);
        rl_wait *w = RedisModule_Calloc(1, sizeof(rl_wait));
        w->group = a.group;
        w->group_new = a.group_new;
        w->count = a.count;
        w->withinfo = a.withinfo;
        w->withtimes = a.withtimes;
        w->packed = a.packed;
        w->nonulls = a.nonulls;
        rl_block(ctx, argv[1], w, a.block_ms);
        return REDISMODULE_OK;
    }
    uint64_t n = rl_reply_range(ctx, s, start, count, a.withinfo, a.withtimes, a.packed, NULL, 0);
    RedisModule_CloseKey(key);
    if (missing || start + n != pos) rl_set_group(ctx, a.group, start + n);
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * TEVICT key offset
 * --------------------------------------------------------------------- */

static int rl_tevict(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    long long offset;
    if (RedisModule_StringToLongLong(argv[2], &offset) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_OFFSET);
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE, &key, &s))
        return REDISMODULE_OK;
    if (s == NULL) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    rl_snap before;
    rl_snap_take(s, &before);
    uint64_t first_before = mn_first_offset(s);
    int64_t evicted;
    if (offset >= 0) {
        evicted = mn_evict_upto(s, offset);
    } else {
        uint64_t keep = (uint64_t)(-(offset + 1)) + 1;
        evicted = mn_evict_keep(s, keep);
    }
    uint64_t first_after = mn_first_offset(s);
    rl_account(s, &before);
    RedisModule_CloseKey(key);
    if (evicted < 0) return rl_reply_core_error(ctx, evicted);
    if (first_after != first_before) {
        RedisModule_SignalModifiedKey(ctx, argv[1]);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tevict", argv[1]);
        RedisModule_Replicate(ctx, "TEVICT", "sl", argv[1], (long long)(first_after - 1));
    }
    return RedisModule_ReplyWithLongLong(ctx, evicted);
}

/* ------------------------------------------------------------------------
 * TCONCAT dst src [src ...]
 * --------------------------------------------------------------------- */

/* Append every readable message of src to dst: the core relinks whole
 * sealed nodes and copies only what it must (mn_stream_concat), leaving src
 * empty for the caller to delete. The caller checked that dst has room. */
static int64_t rl_concat_one(mn_stream *dst, mn_stream *src) {
    int64_t first = mn_stream_concat(dst, src);
    return first < 0 ? first : MN_OK;
}

/* A source argument for the duplicate check: its bytes and position. */
typedef struct {
    const char *p;
    size_t len;
    int index;
} rl_arg_ref;

static int rl_arg_ref_cmp(const void *a, const void *b) {
    const rl_arg_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The first source (in argument order) that is the destination or repeats
 * an earlier source, 0 if none; *repeated says which. Sorted, so 100k
 * sources cost milliseconds (a pairwise check took 48 s). */
static int rl_first_bad_source(RedisModuleString **argv, int argc, int *repeated) {
    int first = 0;
    *repeated = 0;
    for (int i = 2; i < argc && !first; i++)
        if (rl_same_string(argv[i], argv[1])) first = i;
    rl_arg_ref *refs = RedisModule_Alloc((size_t)(argc - 2) * sizeof *refs);
    for (int i = 2; i < argc; i++) {
        refs[i - 2].p = RedisModule_StringPtrLen(argv[i], &refs[i - 2].len);
        refs[i - 2].index = i;
    }
    qsort(refs, (size_t)(argc - 2), sizeof *refs, rl_arg_ref_cmp);
    for (int k = 1; k < argc - 2; k++) {
        const rl_arg_ref *a = &refs[k - 1], *b = &refs[k];
        if (a->len == b->len && memcmp(a->p, b->p, a->len) == 0 && (!first || b->index < first)) {
            first = b->index; /* a later copy: the earlier one came first */
            *repeated = 1;
        }
    }
    RedisModule_Free(refs);
    return first;
}

static int rl_tconcat(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 3) return RedisModule_WrongArity(ctx);
    int repeated;
    int bad = rl_first_bad_source(argv, argc, &repeated);
    if (bad)
        return rl_reply_quoted(ctx, "ERR source key ", argv[bad], RL_QUOTE_MAX,
                               repeated ? " is given more than once" : " is the destination key");
    RedisModuleKey **keys = RedisModule_Calloc((size_t)argc, sizeof(RedisModuleKey *));
    mn_stream **streams = RedisModule_Calloc((size_t)argc, sizeof(mn_stream *));
    int wrongtype = 0;
    for (int i = 1; i < argc && !wrongtype; i++) {
        keys[i] = RedisModule_OpenKey(ctx, argv[i], REDISMODULE_READ | REDISMODULE_WRITE);
        if (!rl_stream_of(keys[i], &streams[i])) wrongtype = 1;
    }
    uint64_t dst_next = streams[1] ? mn_next_offset(streams[1]) : 0;
    uint64_t adding = 0;
    int overflow = 0;
    for (int i = 2; i < argc && !wrongtype; i++) {
        uint64_t len = streams[i] ? mn_length(streams[i]) : 0;
        if (len > RL_OFFSET_END - dst_next - adding) overflow = 1;
        else adding += len;
    }
    if (!wrongtype && !overflow && adding > 0) {
        /* Offsets are handed out: the reservation must be confirmed first
         * (module_reserve.c), which may also raise or bring back dst. */
        if (!rl_resv_admit(ctx, argv[1], adding, rl_tconcat)) {
            for (int i = 1; i < argc; i++)
                if (keys[i]) RedisModule_CloseKey(keys[i]);
            RedisModule_Free(keys);
            RedisModule_Free(streams);
            return REDISMODULE_OK;
        }
        RedisModule_CloseKey(keys[1]);
        keys[1] = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
        rl_stream_of(keys[1], &streams[1]);
        dst_next = streams[1] ? mn_next_offset(streams[1]) : 0;
        overflow = adding > RL_OFFSET_END - dst_next;
    }
    int rc = MN_OK;
    if (!wrongtype && !overflow) {
        mn_stream *dst = streams[1];
        int created = dst == NULL;
        if (created) dst = rl_stream_new();
        else rl_apply_config(dst);
        rl_snap before;
        rl_snap_take(created ? NULL : dst, &before);
        for (int i = 2; i < argc && rc == MN_OK; i++) {
            if (streams[i] == NULL || mn_length(streams[i]) == 0) continue;
            rl_snap src_before;
            rl_snap_take(streams[i], &src_before);
            rc = (int)rl_concat_one(dst, streams[i]);
            rl_account(streams[i], &src_before); /* its read cache, freed with it */
        }
        if (created) {
            RedisModule_ModuleTypeSetValue(keys[1], rl_type, dst);
            rl_total_add(&rl_totals.streams, 1);
            rl_resv_created(ctx, argv[1], dst);
        }
        rl_account(dst, &before);
        if (adding > 0) rl_resv_wrote(ctx, argv[1], dst);
        if (mn_compress_pending(dst)) rl_house.dirty = 1; /* moved nodes to conform */
        for (int i = 2; i < argc; i++)
            if (streams[i]) RedisModule_DeleteKey(keys[i]);
    }
    for (int i = 1; i < argc; i++)
        if (keys[i]) RedisModule_CloseKey(keys[i]);
    RedisModule_Free(keys);
    RedisModule_Free(streams);
    rl_release_scratch();
    if (wrongtype) return RedisModule_ReplyWithError(ctx, RL_WRONGTYPE);
    if (overflow) return RedisModule_ReplyWithError(ctx, RL_ERR_OVERFLOW);
    if (rc != MN_OK) {
        /* Unreachable inside Redis (allocation failure aborts the server);
         * say so loudly if the core ever reports anything else. */
        RedisModule_Log(ctx, "warning", "rcp11: TCONCAT failed in the core (%d)", rc);
    }
    for (int i = 1; i < argc; i++) RedisModule_SignalModifiedKey(ctx, argv[i]);
    RedisModule_SignalKeyAsReady(ctx, argv[1]);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tconcat", argv[1]);
    for (int i = 2; i < argc; i++)
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "del", argv[i]);
    RedisModule_ReplicateVerbatim(ctx);
    if (rc != MN_OK) return rl_reply_core_error(ctx, rc);
    return RedisModule_ReplyWithLongLong(ctx, (long long)dst_next);
}

/* ------------------------------------------------------------------------
 * TSEEK key unix-time-ms: the offset of the first readable message appended
 * at or after that time (the core's per-message times, mn_seek_time: exact
 * but among messages loaded from format 3), the next offset when none is, 0 for a
 * missing key. Any integer is a time: one before the first message answers
 * the first readable offset.
 * --------------------------------------------------------------------- */

static int rl_tseek(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    long long unix_ms;
    if (RedisModule_StringToLongLong(argv[2], &unix_ms) != REDISMODULE_OK)
        return RedisModule_ReplyWithError(ctx, RL_ERR_TIME);
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, argv[1], REDISMODULE_READ, &key, &s)) return REDISMODULE_OK;
    uint64_t offset = s ? mn_seek_time(s, (int64_t)unix_ms) : 0;
    RedisModule_CloseKey(key);
    /* A next offset of 2^63 (a stream filled to the last offset) is no RESP
     * integer: the ceiling stands for it, as in TREAD's WITHINFO. */
    return RedisModule_ReplyWithLongLong(
        ctx, (long long)(offset < RL_OFFSET_END ? offset : RL_OFFSET_END - 1));
}

/* ------------------------------------------------------------------------
 * RCP11.SKIPTO key next-offset: create the stream if missing and raise its
 * next offset (never lower it); the offsets skipped read as null. The AOF
 * rewrite's way to rebuild evicted prefixes and evicted tails.
 * --------------------------------------------------------------------- */

static int rl_skipto(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    size_t len;
    const char *p = RedisModule_StringPtrLen(argv[2], &len);
    uint64_t target;
    if (!rl_parse_offset(p, len, RL_OFFSET_END, &target))
        return RedisModule_ReplyWithError(ctx, RL_ERR_SKIPTO);
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE, &key, &s))
        return REDISMODULE_OK;
    int created = s == NULL;
    if (created) {
        s = rl_stream_new();
        RedisModule_ModuleTypeSetValue(key, rl_type, s);
        rl_account_new(s);
        rl_resv_created(ctx, argv[1], s);
    }
    if (target > mn_next_offset(s)) mn_raise_next_offset(s, target);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* ------------------------------------------------------------------------
 * RCP11.NODE key node-blob: append one serialized node (the core's checked
 * blob format, as RDB files hold it) to the stream, creating it if missing.
 * Its messages keep their offsets and append times. What an AOF rewrite
 * without the RDB preamble emits, so a replayed stream keeps every time.
 * --------------------------------------------------------------------- */

static int rl_node(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    if (rl_internal_refused(ctx, "RCP11.NODE")) return REDISMODULE_OK;
    mn_stream *s;
    RedisModuleKey *key;
    if (!rl_open_stream(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE, &key, &s))
        return REDISMODULE_OK;
    int created = s == NULL;
    if (created) s = rl_stream_new();
    rl_snap before;
    rl_snap_take(created ? NULL : s, &before);
    size_t len;
    const char *blob = RedisModule_StringPtrLen(argv[2], &len);
    int rc = mn_append_node_blob(s, blob, len);
    if (rc != MN_OK) {
        if (created) mn_stream_free(s);
        RedisModule_CloseKey(key);
        if (rc == MN_ERR_NOMEM) return RedisModule_ReplyWithError(ctx, "ERR out of memory");
        return RedisModule_ReplyWithError(ctx, RL_ERR_NODE);
    }
    if (created) {
        RedisModule_ModuleTypeSetValue(key, rl_type, s);
        rl_total_add(&rl_totals.streams, 1);
        rl_resv_created(ctx, argv[1], s);
    }
    rl_account(s, &before);
    if (mn_compress_pending(s)) rl_house.dirty = 1;
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_SignalKeyAsReady(ctx, argv[1]);
    RedisModule_ReplicateVerbatim(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* ------------------------------------------------------------------------
 * Housekeeping: retention and compression, in bounded steps from a timer
 * --------------------------------------------------------------------- */

/* One tick's allowance, shared by the keys a Scan step hands over. */
typedef struct rl_budget {
    uint64_t nodes;  /* nodes this tick may still free or compress */
    uint64_t keys;   /* keys it may still look at */
    int evict;       /* retention applies here (a primary, not loading) */
    int evicted;     /* this tick evicted something */
    int64_t now_ms;
} rl_budget;

/* Apply retention to one stream within the budget. Returns what was evicted
 * (and counts the nodes against the budget). */
static void rl_retain(mn_stream *s, rl_budget *b, mn_evicted *ev) {
    if (rl_config.retention_ms > 0 && b->nodes > 0) {
        uint64_t before = ev->nodes;
        mn_evict_older_than(s, b->now_ms - rl_config.retention_ms, b->nodes, ev);
        b->nodes -= ev->nodes - before < b->nodes ? ev->nodes - before : b->nodes;
    }
    if (rl_config.retention_bytes > 0 && b->nodes > 0) {
        uint64_t before = ev->nodes;
        mn_evict_over_bytes(s, (uint64_t)rl_config.retention_bytes, b->nodes, ev);
        b->nodes -= ev->nodes - before < b->nodes ? ev->nodes - before : b->nodes;
    }
}

/* Scan callback: bring one stream to its configs and its retention. A key
 * met after the budget ran out is left for the next pass. Retention goes
 * to replicas and the AOF as the absolute cut TEVICT key <last evicted>,
 * so they end where this server is whatever their clocks say. */
static void rl_house_key(RedisModuleCtx *ctx, RedisModuleString *keyname, RedisModuleKey *seen,
                         void *privdata) {
    rl_budget *b = privdata;
    if (b->keys > 0) b->keys--;
    if (b->nodes == 0) return;
    /* Scan opened the key for reading (or not at all): skip other types
     * without opening it again. */
    if (seen != NULL && (RedisModule_KeyType(seen) != REDISMODULE_KEYTYPE_MODULE ||
                         RedisModule_ModuleTypeGetType(seen) != rl_type))
        return;
    RedisModuleKey *key = RedisModule_OpenKey(ctx, keyname, REDISMODULE_READ | REDISMODULE_WRITE);
    mn_stream *s;
    if (!rl_stream_of(key, &s) || s == NULL) {
        RedisModule_CloseKey(key);
        return;
    }
    rl_snap before;
    rl_snap_take(s, &before);
    rl_apply_config(s);
    uint64_t first_before = mn_first_offset(s);
    mn_evicted ev;
    memset(&ev, 0, sizeof(ev));
    if (b->evict) rl_retain(s, b, &ev);
    if (b->nodes > 0 && mn_compress_pending(s)) {
        /* A compress step conforms at most its allowance; count it spent
         * unless the scan finished. */
        uint64_t allowance = b->nodes;
        b->nodes = mn_compress_step(s, (uint32_t)allowance) == 1 ? 0 : b->nodes - 1;
    }
    if (mn_compress_pending(s)) rl_house.dirty = 1;
    uint64_t first_after = mn_first_offset(s);
    if (ev.nodes > 0 || mn_num_compressed_nodes(s) != before.compressed) rl_house.worked = 1;
    rl_account(s, &before);
    RedisModule_CloseKey(key);
    if (first_after != first_before) {
        rl_retention.messages += ev.messages;
        rl_retention.bytes += ev.bytes;
        b->evicted = 1;
        RedisModule_SignalModifiedKey(ctx, keyname);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, "tevict", keyname);
        RedisModule_Replicate(ctx, "TEVICT", "sl", keyname, (long long)(first_after - 1));
    }
}

/* One tick of the pass: Scan steps over the databases in turn until the
 * budget is spent or the pass is over. Returns whether the pass goes on. */
static int rl_house_step(RedisModuleCtx *ctx) {
    int flags = RedisModule_GetContextFlags(ctx);
    rl_budget b;
    memset(&b, 0, sizeof(b));
    b.nodes = RL_TICK_NODES;
    b.keys = RL_TICK_KEYS;
    /* A replica follows its primary's cuts, and retention never runs on a
     * half-loaded dataset. */
    b.evict = (rl_config.retention_ms > 0 || rl_config.retention_bytes > 0) &&
              !(flags & (REDISMODULE_CTX_FLAGS_SLAVE | REDISMODULE_CTX_FLAGS_LOADING));
    b.now_ms = rl_now_ms();
    if (!rl_house.active) {
        if (!b.evict && !rl_house.dirty) return 0;
        rl_house.active = 1;
        rl_house.dirty = 0;
        rl_house.worked = 0;
        rl_house.db = 0;
        RedisModule_ScanCursorRestart(rl_house.cursor);
    }
    while (b.nodes > 0 && b.keys > 0) {
        if (RedisModule_SelectDb(ctx, rl_house.db) != REDISMODULE_OK) {
            rl_house.active = 0; /* past the last database: the pass is over */
            break;
        }
        int more = RedisModule_DbSize(ctx) > 0 &&
                   RedisModule_Scan(ctx, rl_house.cursor, rl_house_key, &b);
        if (!more) {
            rl_house.db++;
            RedisModule_ScanCursorRestart(rl_house.cursor);
            if (b.keys > 0) b.keys--; /* an empty database costs a little too */
        }
    }
    if (b.evicted) rl_retention.runs++;
    /* A pass that found work is followed by another one at once: a stream
     * with a large backlog loses RL_TICK_NODES nodes per tick, not per
     * pass. */
    return rl_house.active || b.nodes == 0 || rl_house.worked;
}

static void rl_tick(RedisModuleCtx *ctx, void *data) {
    (void)data;
    if (RedisModule_AvoidReplicaTraffic()) {
        /* Clients are paused: nothing may reach the AOF or the replicas
         * (see PAUSES). Look again soon, to resume as the pause ends. */
        if (rl_house.active || rl_house.dirty || rl_config.retention_ms > 0 ||
            rl_config.retention_bytes > 0 || RedisModule_DictSize(rl_pause.wakes) > 0)
            rl_pause.ticks++;
        RedisModule_CreateTimer(ctx, RL_TICK_MS, rl_tick, NULL);
        return;
    }
    rl_wake_deferred(ctx);
    int going = rl_house_step(ctx);
    RedisModule_CreateTimer(ctx, going ? RL_TICK_MS : RL_IDLE_MS, rl_tick, NULL);
}

/* ------------------------------------------------------------------------
 * Data type callbacks: memory and free (serialising ones: module_rdb.c)
 * --------------------------------------------------------------------- */

static size_t rl_mem_usage(const void *value) { return (size_t)mn_memory_bytes(value); }

/* May run on Redis's lazy-free thread: touches only the stream and the
 * atomic totals. */
static void rl_free(void *value) {
    mn_stream *s = value;
    rl_snap share;
    rl_snap_take(s, &share);
    /* Subtract the stream's whole share (adding 0 - x wraps to -x). */
    rl_total_add(&rl_totals.messages, 0 - share.messages);
    rl_total_add(&rl_totals.nodes, 0 - share.nodes);
    rl_total_add(&rl_totals.compressed, 0 - share.compressed);
    rl_total_add(&rl_totals.payload, 0 - share.payload);
    rl_total_add(&rl_totals.memory, 0 - share.memory);
    rl_total_add(&rl_totals.streams, 0 - (uint64_t)1);
    mn_stream_free(s);
}

/* Redis frees values whose effort exceeds its threshold (64) on the
 * lazy-free thread (UNLINK, FLUSHALL ASYNC, lazyfree-* configs). */
static size_t rl_free_effort(RedisModuleString *key, const void *value) {
    (void)key;
    return (size_t)mn_num_nodes(value) + 1;
}

/* ------------------------------------------------------------------------
 * INFO and configs
 * --------------------------------------------------------------------- */

static void rl_info(RedisModuleInfoCtx *ctx, int for_crash_report) {
    (void)for_crash_report;
    RedisModule_InfoAddSection(ctx, "streams");
    RedisModule_InfoAddFieldULongLong(ctx, "streams", rl_total_get(&rl_totals.streams));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_messages", rl_total_get(&rl_totals.messages));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_nodes", rl_total_get(&rl_totals.nodes));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_compressed_nodes",
                                      rl_total_get(&rl_totals.compressed));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_payload_bytes",
                                      rl_total_get(&rl_totals.payload));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_memory_bytes", rl_total_get(&rl_totals.memory));
    RedisModule_InfoAddFieldULongLong(ctx, "stream_node_max_entries",
                                      (unsigned long long)rl_config.max_entries);
    RedisModule_InfoAddFieldCString(ctx, "stream_compression",
                                    rl_config.compression ? "zlib" : "no");
    RedisModule_InfoAddFieldULongLong(ctx, "stream_compression_depth",
                                      (unsigned long long)rl_config.depth);
    RedisModule_InfoAddFieldULongLong(ctx, "stream_retention_ms",
                                      (unsigned long long)rl_config.retention_ms);
    RedisModule_InfoAddFieldULongLong(ctx, "stream_retention_bytes",
                                      (unsigned long long)rl_config.retention_bytes);
    RedisModule_InfoAddFieldULongLong(ctx, "retention_evicted_messages", rl_retention.messages);
    RedisModule_InfoAddFieldULongLong(ctx, "retention_evicted_bytes", rl_retention.bytes);
    RedisModule_InfoAddFieldULongLong(ctx, "retention_runs", rl_retention.runs);
    RedisModule_InfoAddFieldULongLong(ctx, "blocked_readers", rl_waiting);
    RedisModule_InfoAddFieldULongLong(ctx, "paused_housekeeping_ticks", rl_pause.ticks);
    RedisModule_InfoAddFieldULongLong(ctx, "paused_group_wakes", rl_pause.group_wakes);
    rl_resv_info(ctx);
}

static long long rl_get_numeric(const char *name, void *privdata) {
    (void)name;
    return *(long long *)privdata;
}

static int rl_set_numeric(const char *name, long long value, void *privdata,
                          RedisModuleString **err) {
    (void)name;
    (void)err;
    *(long long *)privdata = value; /* Redis checked min and max */
    rl_house.dirty = 1;             /* the housekeeping pass brings streams along */
    return REDISMODULE_OK;
}

static int rl_get_enum(const char *name, void *privdata) {
    (void)name;
    return *(int *)privdata;
}

static int rl_set_enum(const char *name, int value, void *privdata, RedisModuleString **err) {
    (void)name;
    (void)err;
    *(int *)privdata = value;
    rl_house.dirty = 1;
    return REDISMODULE_OK;
}

static int rl_register_configs(RedisModuleCtx *ctx) {
    static const char *compression_names[] = {"no", "zlib"};
    static const int compression_values[] = {0, 1};
    if (RedisModule_RegisterNumericConfig(ctx, "stream-node-max-entries", MN_DEFAULT_MAX_ENTRIES,
                                          REDISMODULE_CONFIG_DEFAULT, 1, MN_MAX_MAX_ENTRIES,
                                          rl_get_numeric, rl_set_numeric, NULL,
                                          &rl_config.max_entries) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterEnumConfig(ctx, "stream-compression", 0, REDISMODULE_CONFIG_DEFAULT,
                                       compression_names, compression_values, 2, rl_get_enum,
                                       rl_set_enum, NULL, &rl_config.compression) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterNumericConfig(ctx, "stream-compression-level", 6,
                                          REDISMODULE_CONFIG_DEFAULT, 1, 9, rl_get_numeric,
                                          rl_set_numeric, NULL, &rl_config.level) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterNumericConfig(ctx, "stream-compression-depth", 0,
                                          REDISMODULE_CONFIG_DEFAULT, 0, MN_MAX_COMPRESSION_DEPTH,
                                          rl_get_numeric, rl_set_numeric, NULL,
                                          &rl_config.depth) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (RedisModule_RegisterNumericConfig(ctx, "stream-retention-ms", 0, REDISMODULE_CONFIG_DEFAULT,
                                          0, LLONG_MAX, rl_get_numeric, rl_set_numeric, NULL,
                                          &rl_config.retention_ms) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    /* A memory config: "64mb" and "1gb" are accepted, as for maxmemory. */
    if (RedisModule_RegisterNumericConfig(ctx, "stream-retention-bytes", 0,
                                          REDISMODULE_CONFIG_MEMORY, 0, LLONG_MAX, rl_get_numeric,
                                          rl_set_numeric, NULL,
                                          &rl_config.retention_bytes) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (rl_resv_register_configs(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    return RedisModule_LoadConfigs(ctx);
}

/* ------------------------------------------------------------------------
 * Command table and key specs
 * --------------------------------------------------------------------- */

static const RedisModuleCommandInfoVersion rl_info_version = {
    1, sizeof(RedisModuleCommandHistoryEntry), sizeof(RedisModuleCommandKeySpec),
    sizeof(RedisModuleCommandArg)};

static RedisModuleCommandKeySpec rl_twrite_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_INSERT), {0}};
static RedisModuleCommandKeySpec rl_tread_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_ACCESS),
    RL_KEY_AFTER("GROUP", 4, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_UPDATE),
    RL_KEY_AFTER("GROUPNEW", 4, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_UPDATE),
    {0}};
static RedisModuleCommandKeySpec rl_tevict_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_DELETE), {0}};
static RedisModuleCommandKeySpec rl_tconcat_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_INSERT),
    {.flags = REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_DELETE,
     .begin_search_type = REDISMODULE_KSPEC_BS_INDEX,
     .bs.index.pos = 2,
     .find_keys_type = REDISMODULE_KSPEC_FK_RANGE,
     .fk.range = {-1, 1, 0}},
    {0}};
static RedisModuleCommandKeySpec rl_tseek_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RO | REDISMODULE_CMD_KEY_ACCESS), {0}};
static RedisModuleCommandKeySpec rl_skipto_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_INSERT), {0}};
static RedisModuleCommandKeySpec rl_update_specs[] = {
    RL_KEY_AT(1, REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_UPDATE), {0}};

/* Argument docs: COMMAND DOCS shows them, and redis-cli and valkey-cli
 * build their hints from it (TWRITE key entry | [BACKLOG backlog] ENTRIES
 * entry [entry ...]), the same as rcp11-server's. A KEY argument names
 * its key spec by index (RL_ARG and friends: module_internal.h). */
static RedisModuleCommandArg rl_twrite_batch[] = {
    RL_ARG("backlog", INTEGER, "BACKLOG", RL_OPTIONAL),
    RL_ARG("entry", STRING, "ENTRIES", RL_MULTIPLE), {0}};
static RedisModuleCommandArg rl_twrite_forms[] = {
    RL_ARG("entry", STRING, NULL, 0), RL_GROUP_ARG("entries", BLOCK, rl_twrite_batch, 0), {0}};
static RedisModuleCommandArg rl_twrite_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_GROUP_ARG("form", ONEOF, rl_twrite_forms, 0), {0}};
static RedisModuleCommandArg rl_tread_groups[] = {
    RL_KEY_ARG("groupkey", 1, "GROUP", 0), RL_KEY_ARG("newgroupkey", 2, "GROUPNEW", 0), {0}};
static RedisModuleCommandArg rl_tread_ack[] = {
    RL_ARG("start", INTEGER, NULL, 0), RL_ARG("count", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg rl_tread_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0),
    RL_ARG("offset", INTEGER, NULL, 0),
    RL_ARG("count", INTEGER, NULL, 0),
    RL_ARG("milliseconds", INTEGER, "BLOCK", RL_OPTIONAL),
    RL_GROUP_ARG("group", ONEOF, rl_tread_groups, RL_OPTIONAL),
    RL_ARG("withinfo", PURE_TOKEN, "WITHINFO", RL_OPTIONAL),
    RL_ARG("nonulls", PURE_TOKEN, "NONULLS", RL_OPTIONAL),
    RL_ARG("withtimes", PURE_TOKEN, "WITHTIMES", RL_OPTIONAL),
    RL_ARG("packed", PURE_TOKEN, "PACKED", RL_OPTIONAL),
    RL_ARG("lease", INTEGER, "LEASE", RL_OPTIONAL),
    RL_ARG("consumer", STRING, "CONSUMER", RL_OPTIONAL),
    {.name = "ack", .type = REDISMODULE_ARG_TYPE_BLOCK, .key_spec_index = -1, .token = "ACK",
     .subargs = rl_tread_ack, .flags = RL_OPTIONAL},
    {0}};
static RedisModuleCommandArg rl_tevict_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("offset", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg rl_tconcat_docs[] = {
    RL_KEY_ARG("destination", 0, NULL, 0), RL_KEY_ARG("source", 1, NULL, RL_MULTIPLE), {0}};
static RedisModuleCommandArg rl_tseek_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("unix-time-ms", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg rl_skipto_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("next-offset", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg rl_twriteat_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("unix-time-ms", INTEGER, NULL, 0),
    RL_ARG("entry", STRING, NULL, RL_MULTIPLE), {0}};
static RedisModuleCommandArg rl_node_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("node-blob", STRING, NULL, 0), {0}};
static RedisModuleCommandArg rl_reserve_docs[] = {
    RL_KEY_ARG("key", 0, NULL, 0), RL_ARG("mark", INTEGER, NULL, 0), {0}};
static RedisModuleCommandArg rl_groupmove_docs[] = {RL_KEY_ARG("groupkey", 0, NULL, 0), {0}};

/* ACL categories (Redis 7.2+, Valkey 8), as Redis files its stream commands
 * (XADD write fast, XRANGE read slow, XREAD read slow blocking; @fast where
 * the command has the "fast" flag), plus the module's own category @rcp11
 * (Redis 7.4+, Valkey 8), which plays the part @stream plays for Redis's
 * streams: rcp11 streams are not in @stream, whose rules mean Redis's own
 * type. A group read moves its group key yet TREAD is @read: the key spec
 * marks the group key RW, so a user with read-only key permissions (%R~)
 * cannot move a group. */
typedef struct rl_command {
    const char *name;
    RedisModuleCmdFunc fn;
    const char *flags;
    int firstkey, lastkey, keystep;
    int arity;
    const char *summary;
    RedisModuleCommandKeySpec *keys;
    const char *acl; /* ACL categories, @rcp11 added where the server can */
    RedisModuleCommandArg *args;
    const char *complexity;
} rl_command;

static const rl_command rl_commands[] = {
    {"twrite", rl_twrite, "write deny-oom fast", 1, 1, 1, -3,
     "Append entries to a stream; returns the offset of the first", rl_twrite_specs,
     "write fast", rl_twrite_docs, "O(N) for N entries"},
    {"tread", rl_tread, "readonly may-replicate blocking getkeys-api", 1, 1, 1, -4,
     "Read a stream from an offset, or as a member of a group", rl_tread_specs,
     "read slow blocking", rl_tread_docs,
     "O(log N + M): N nodes in the stream, M offsets returned"},
    {"tevict", rl_tevict, "write fast", 1, 1, 1, 3, "Evict the oldest messages of a stream",
     rl_tevict_specs, "write fast", rl_tevict_docs, "O(N) for N nodes freed"},
    {"tconcat", rl_tconcat, "write deny-oom", 1, -1, 1, -3,
     "Append the readable messages of streams to a stream, then delete them", rl_tconcat_specs,
     "write slow", rl_tconcat_docs, "O(N) for N nodes in the sources"},
    {"tseek", rl_tseek, "readonly fast", 1, 1, 1, 3,
     "The offset of the first message appended at or after a unix time in ms", rl_tseek_specs,
     "read fast", rl_tseek_docs, "O(log N) for N nodes"},
    {"rcp11.skipto", rl_skipto, "write deny-oom", 1, 1, 1, 3,
     "Raise a stream's next offset (used by AOF rewrites)", rl_skipto_specs, "write fast",
     rl_skipto_docs, "O(1)"},
    {"rcp11.twriteat", rl_twriteat, "write deny-oom", 1, 1, 1, -4,
     "TWRITE at the primary's append time (replication and AOF only)", rl_twrite_specs,
     "write fast", rl_twriteat_docs, "O(N) for N entries"},
    {"rcp11.node", rl_node, "write deny-oom", 1, 1, 1, 3,
     "Append a serialized stream node (AOF rewrites only)", rl_skipto_specs, "write slow",
     rl_node_docs, "O(N) for the N bytes of the node"},
    {"rcp11.reserve", rl_resv_command, "write", 1, 1, 1, 3,
     "Raise a stream's offset reservation (replication and AOF only)", rl_update_specs,
     "write fast", rl_reserve_docs, "O(1)"},
    {RL_GROUPMOVE, rl_groupmove, "write fast", 1, 1, 1, 2,
     "The ACL permission a group read needs to move its group key (not run)", rl_update_specs,
     "write fast", rl_groupmove_docs, "O(1)"},
};

int rl_set_command_info(RedisModuleCtx *ctx, const char *name, int arity, const char *summary,
                        const char *since, RedisModuleCommandKeySpec *specs,
                        RedisModuleCommandArg *args, const char *complexity) {
    RedisModuleCommandInfo info;
    memset(&info, 0, sizeof(info));
    info.version = &rl_info_version;
    info.summary = summary;
    info.since = since;
    info.arity = arity;
    info.key_specs = specs;
    info.args = args;
    info.complexity = complexity;
    RedisModuleCommand *command = RedisModule_GetCommand(ctx, name);
    if (command == NULL || RedisModule_SetCommandInfo(command, &info) != REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "rcp11: cannot set the command info of %s", name);
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

/* The module's ACL category, when the server can add one (OnLoad only). */
#define RL_ACL_CATEGORY "rcp11"

/* What rl_set_acl_categories found: -1 the server cannot set categories,
 * 0 it can but not add @rcp11, 1 both. */
static int rl_acl_support = -1;

int rl_set_command_acl(RedisModuleCtx *ctx, const char *name, const char *acl) {
    if (rl_acl_support < 0) return REDISMODULE_OK;
    char categories[64];
    snprintf(categories, sizeof(categories), "%s%s", acl,
             rl_acl_support ? " " RL_ACL_CATEGORY : "");
    RedisModuleCommand *command = RedisModule_GetCommand(ctx, name);
    if (command == NULL ||
        RedisModule_SetCommandACLCategories(command, categories) != REDISMODULE_OK) {
        RedisModule_Log(ctx, "warning", "rcp11: cannot set the ACL categories of %s", name);
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

/* Put the commands in their ACL categories where the server has the API;
 * say at load what is missing where it has not (docs/MODULE.md, ACLs).
 * Before ra_register, which files its own commands with rl_set_command_acl. */
static int rl_set_acl_categories(RedisModuleCtx *ctx) {
    if (RedisModule_SetCommandACLCategories == NULL) {
        RedisModule_Log(ctx, "warning",
                        "rcp11: this server cannot put module commands in ACL categories "
                        "(Redis 7.0): TWRITE, TREAD, TEVICT, TCONCAT, TSEEK, TACK, TGROUP are in "
                        "none, so @read, @write and @rcp11 rules miss them; name the commands "
                        "in ACL rules instead (docs/MODULE.md, ACLs)");
        return REDISMODULE_OK;
    }
    int own = RedisModule_AddACLCategory != NULL &&
              RedisModule_AddACLCategory(ctx, RL_ACL_CATEGORY) == REDISMODULE_OK;
    if (!own)
        RedisModule_Log(ctx, "warning",
                        "rcp11: this server cannot add the ACL category @" RL_ACL_CATEGORY
                        " (Redis 7.2): the commands are in @read or @write only");
    rl_acl_support = own;
    for (size_t i = 0; i < sizeof(rl_commands) / sizeof(rl_commands[0]); i++)
        if (rl_set_command_acl(ctx, rl_commands[i].name, rl_commands[i].acl) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}

static int rl_create_commands(RedisModuleCtx *ctx) {
    for (size_t i = 0; i < sizeof(rl_commands) / sizeof(rl_commands[0]); i++) {
        const rl_command *c = &rl_commands[i];
        if (RedisModule_CreateCommand(ctx, c->name, c->fn, c->flags, c->firstkey, c->lastkey,
                                      c->keystep) != REDISMODULE_OK)
            return REDISMODULE_ERR;
        if (rl_set_command_info(ctx, c->name, c->arity, c->summary, "1.0.0", c->keys, c->args,
                                c->complexity) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

/* ------------------------------------------------------------------------
 * Loading
 * --------------------------------------------------------------------- */

__attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx *ctx,
                                                          RedisModuleString **argv, int argc) {
    const char *missing = rl_load_api(ctx);
    if (missing != NULL) return REDISMODULE_ERR; /* cannot even log: too old a server */
    if (RedisModule_IsModuleNameBusy(RL_MODULE_NAME)) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, RL_MODULE_NAME, RL_MODULE_VERSION, REDISMODULE_APIVER_1);
    if (RedisModule_GetServerVersion() < RL_MIN_REDIS_VERSION) {
        RedisModule_Log(ctx, "warning", "rcp11 needs redis-server 7.0 or newer");
        return REDISMODULE_ERR;
    }
    /* One argument exists, for tests only: "debug-clock-offset-ms N" shifts
     * the module's clock (rl_now_ms) by N ms. Everything else is a config. */
    long long offset_ms = 0;
    if (argc == 2 && rl_arg_is(argv[0], "DEBUG-CLOCK-OFFSET-MS") &&
        RedisModule_StringToLongLong(argv[1], &offset_ms) == REDISMODULE_OK) {
        rl_clock_offset_ms = offset_ms;
    } else if (argc != 0) {
        RedisModule_Log(ctx, "warning",
                        "rcp11 takes no module arguments but debug-clock-offset-ms <ms> "
                        "(tests); set the rcp11.* configs instead");
        return REDISMODULE_ERR;
    }
    if (mn_abi_version() != MN_ABI_VERSION) {
        RedisModule_Log(ctx, "warning", "rcp11: the storage core does not match its header");
        return REDISMODULE_ERR;
    }
    rl_rdb_pid_at_load();
    /* Serialising callbacks: module_rdb.c; memory and free: here. */
    RedisModuleTypeMethods methods;
    memset(&methods, 0, sizeof(methods));
    methods.version = REDISMODULE_TYPE_METHOD_VERSION;
    methods.rdb_load = rl_rdb_load;
    methods.rdb_save = rl_rdb_save;
    methods.aof_rewrite = rl_aof_rewrite;
    methods.mem_usage = rl_mem_usage;
    methods.digest = rl_digest;
    methods.free = rl_free;
    methods.free_effort = rl_free_effort;
    methods.copy2 = rl_copy;
    methods.unlink2 = rl_resv_unlink;
    rl_type = RedisModule_CreateDataType(ctx, RL_TYPE_NAME, RL_ENCVER, &methods);
    if (rl_type == NULL) return REDISMODULE_ERR;
    /* Corrupt or short RDB input comes back as an error to check, not an
     * abort; WATCH is signalled by the commands themselves, only when they
     * change something. */
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTIONS_HANDLE_IO_ERRORS |
                                          REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    if (rl_create_commands(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (rl_set_acl_categories(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (ra_register(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (rl_register_configs(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (rl_resv_init(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    if (RedisModule_RegisterInfoFunc(ctx, rl_info) != REDISMODULE_OK) return REDISMODULE_ERR;
    rl_groups = RedisModule_CreateDict(NULL);
    rl_pause.wakes = RedisModule_CreateDict(NULL);
    mn_buf_init(&rl_read_buf);
    if (RedisModule_SubscribeToKeyspaceEvents(
            ctx,
            REDISMODULE_NOTIFY_GENERIC | REDISMODULE_NOTIFY_STRING | REDISMODULE_NOTIFY_EXPIRED |
                REDISMODULE_NOTIFY_EVICTED,
            rl_on_keyspace_event) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    if (rl_register_copy_filter(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;
    RedisModuleEvent flush = {REDISMODULE_EVENT_FLUSHDB, 1};
    if (RedisModule_SubscribeToServerEvent(ctx, flush, rl_on_flush) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    rl_house.cursor = RedisModule_ScanCursorCreate();
    rl_house.dirty = 1; /* configs from redis.conf reach the streams it loads */
    RedisModule_CreateTimer(ctx, RL_IDLE_MS, rl_tick, NULL);
    return REDISMODULE_OK;
}
