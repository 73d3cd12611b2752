/* module_internal.h -- what the module's files share: module.c (the
 * streams, TREAD, blocking, housekeeping), module_ack.c (acknowledged
 * groups: lease reads, TACK, TGROUP) and module_rdb.c (both data types'
 * callbacks that turn values into bytes and back: RDB, DUMP, the AOF
 * rewrite, DEBUG DIGEST, COPY).
 *
 * Prefixes name the owner: rl_ is the module's stream side ("rcp11-log",
 * the stream type's name: module.c, module_rdb.c's stream callbacks, and
 * rl_resv_ in module_reserve.c), ra_ the acknowledged groups ("rcp11-grp":
 * module_ack.c, module_rdb.c's group callbacks), of_ the offsets file
 * (module_offsets_file.c). The storage core's are mn_ (macronode.c) and
 * ag_ (ackgroup.c).
 *
 * Everything declared here is internal to the module: the module is built
 * with -fvisibility=hidden, so only RedisModule_OnLoad leaves the .so.
 */
#ifndef RCP11_MODULE_INTERNAL_H
#define RCP11_MODULE_INTERNAL_H

#include <stdint.h>

#include "macronode.h"
#include "rcp11_module_api.h"

/* Encoding version of a stream's RDB value (module_rdb.c draws it): 2 adds
 * the stream's offset reservation mark after the nodes (module_reserve.c).
 * rl_rdb_load() reads 1 and 2 and refuses others. */
#define RL_ENCVER 2
/* Encoding version of an acknowledged group's RDB value (one ag_serialize
 * blob). */
#define RA_ENCVER 1

/* Most messages a read copies out of the core in one call. */
#define RL_READ_BATCH_MAX 4096

/* 2^63: one past the largest offset, the largest next offset. */
#define RL_OFFSET_END ((uint64_t)1 << 63)

/* Error messages quote at most this many bytes of a key name. */
#define RL_QUOTE_MAX 128

/* How long a timer that must not wake writers while clients are paused
 * (CLIENT PAUSE, a failover) waits before it tries again. */
#define RL_PAUSED_RETRY_MS 10

/* Error texts: the contract's, worded as the Python server words them
 * (rcp11/errors/). */
#define RL_WRONGTYPE "WRONGTYPE Operation against a key holding the wrong kind of value"
#define RL_ERR_OVERFLOW "ERR stream offset would exceed 2^63-1"
#define RL_ERR_OFFSET "ERR offset is not an integer or out of range"
#define RL_ERR_COUNT "ERR count is not an integer or out of range"
#define RL_ERR_TIMEOUT "ERR timeout is not an integer or out of range"
#define RL_ERR_NEGATIVE_COUNT "ERR count must be >= 0"
#define RL_ERR_NEGATIVE_TIMEOUT "ERR timeout is negative"
#define RL_ERR_GROUP_IS_KEY "ERR the group key must be a different key than the stream key"
#define RL_ERR_GROUP_AND_GROUPNEW "ERR GROUP and GROUPNEW cannot be used together"
#define RL_ERR_BACKLOG "ERR BACKLOG count must be an integer >= 0"
#define RL_ERR_READONLY "READONLY You can't write against a read only replica."
#define RL_ERR_TOOBIG "ERR message too big (the limit is 4294967259 bytes)"
#define RL_ERR_SKIPTO "ERR next offset must be an integer between 0 and 2^63"
#define RL_ERR_TIME "ERR time is not an integer or out of range"
#define RL_ERR_INTERNAL_FMT                                                                    \
    "ERR %s is internal: only a primary's replication stream and the AOF may send it"
#define RL_ERR_NODE "ERR bad stream node blob"
/* Acknowledged groups (docs/PROTOCOL.md, "Acknowledged groups"). */
#define RL_ERR_LEASE "ERR LEASE must be an integer from 1 to 2147483647 (milliseconds)"
#define RL_ERR_LEASE_NEEDS_GROUP "ERR LEASE needs GROUP or GROUPNEW"
#define RL_ERR_CONSUMER_NEEDS_LEASE "ERR CONSUMER needs LEASE"
#define RL_ERR_ACK_NEEDS_LEASE "ERR ACK needs LEASE"
#define RL_ERR_NONULLS_LEASE "ERR NONULLS cannot be used with LEASE"
#define RL_ERR_WITHTIMES_LEASE "ERR WITHTIMES cannot be used with LEASE"
#define RL_ERR_PACKED_LEASE "ERR PACKED cannot be used with LEASE"
#define RL_ERR_CONSUMER_TOO_LONG "ERR consumer name is longer than 256 bytes"
#define RL_ERR_NEGATIVE_OFFSET "ERR offset must be >= 0"

/* Key specs (SetCommandInfo): the key at argv[pos], or right after `word`
 * searched from argv[from] on. */
#define RL_KEY_AT(at, fl)                                                                     \
    {.flags = (fl), .begin_search_type = REDISMODULE_KSPEC_BS_INDEX, .bs.index.pos = (at),    \
     .find_keys_type = REDISMODULE_KSPEC_FK_RANGE, .fk.range = {0, 1, 0}}
#define RL_KEY_AFTER(word, from, fl)                                                          \
    {.flags = (fl), .begin_search_type = REDISMODULE_KSPEC_BS_KEYWORD,                        \
     .bs.keyword = {(word), (from)}, .find_keys_type = REDISMODULE_KSPEC_FK_RANGE,            \
     .fk.range = {0, 1, 0}}

/* Argument docs (COMMAND DOCS) for SetCommandInfo. */
#define RL_ARG(nm, ty, tok, fl)                                                               \
    {.name = (nm), .type = REDISMODULE_ARG_TYPE_##ty, .key_spec_index = -1, .token = (tok),  \
     .flags = (fl)}
#define RL_KEY_ARG(nm, spec, tok, fl)                                                         \
    {.name = (nm), .type = REDISMODULE_ARG_TYPE_KEY, .key_spec_index = (spec), .token = (tok), \
     .flags = (fl)}
#define RL_GROUP_ARG(nm, ty, sub, fl)                                                         \
    {.name = (nm), .type = REDISMODULE_ARG_TYPE_##ty, .key_spec_index = -1, .subargs = (sub),  \
     .flags = (fl)}
#define RL_OPTIONAL REDISMODULE_CMD_ARG_OPTIONAL
#define RL_MULTIPLE REDISMODULE_CMD_ARG_MULTIPLE

/* TREAD's parsed arguments. */
typedef struct rl_tread_args {
    long long offset, count, block_ms;
    int block, withinfo, withtimes, packed, group_new, nonulls;
    RedisModuleString *group;
    /* LEASE ms [CONSUMER name] [ACK start count]: an acknowledged read */
    int lease;
    long long lease_ms;
    RedisModuleString *consumer; /* NULL: the empty name */
    int ack;
    long long ack_start, ack_count;
} rl_tread_args;

/* A blocked TREAD (its BlockClientOnKeys privdata). Group readers are also
 * linked into their group's rl_group (module.c), so that a change of the
 * group key can signal the streams they wait on. */
typedef struct rl_group rl_group;

typedef struct rl_wait {
    RedisModuleString *key;   /* the stream key (own copy) */
    RedisModuleString *group; /* the group key (own copy), NULL: plain read */
    uint64_t start;           /* plain read: absolute start offset */
    uint64_t fallback;        /* group read: start if the group key vanished */
    int has_fallback;
    long long count;
    int withinfo;
    int withtimes;
    int packed;
    int group_new;
    int nonulls;
    int db;
    rl_group *owner;
    struct rl_wait *prev, *next;
    /* A lease read (module_ack.c): its lease and consumer (own copy or
     * NULL). */
    int lease;
    long long lease_ms;
    RedisModuleString *consumer;
} rl_wait;

/* module.c */
int64_t rl_now_ms(void);
/* A stream's share of the INFO totals, taken before something changes it;
 * rl_account adds what changed since (s NULL: the stream is gone). */
typedef struct rl_snap {
    uint64_t messages, nodes, compressed, payload, memory;
} rl_snap;
void rl_snap_take(const mn_stream *s, rl_snap *out);
void rl_account(const mn_stream *s, const rl_snap *before);
/* A stream came into being outside a command (loaded, copied): count it in
 * INFO, and let the housekeeping pass finish its compression. */
void rl_stream_loaded(const mn_stream *s);
/* Scratch for reading messages out of the core (main thread only), sized
 * per stream by rl_read_batch(); rl_release_scratch() gives a grown one
 * back. */
extern mn_buf rl_read_buf;
extern int64_t rl_read_lens[RL_READ_BATCH_MAX];
extern int64_t rl_read_times[RL_READ_BATCH_MAX];
uint64_t rl_read_batch(const mn_stream *s);
void rl_release_scratch(void);
void rl_quote(const char *p, size_t len, size_t limit, char *out, size_t outsize);
int rl_reply_quoted(RedisModuleCtx *ctx, const char *prefix, const RedisModuleString *name,
                    size_t limit, const char *suffix);
int rl_arg_is(const RedisModuleString *arg, const char *word);
int rl_same_string(const RedisModuleString *a, const RedisModuleString *b);
int rl_parse_offset(const char *p, size_t len, uint64_t max, uint64_t *out);
int rl_stream_of(RedisModuleKey *key, mn_stream **s);
int rl_open_stream(RedisModuleCtx *ctx, RedisModuleString *name, int mode, RedisModuleKey **key,
                   mn_stream **s);
uint64_t rl_group_default(const mn_stream *s, int group_new);
int rl_internal_refused(RedisModuleCtx *ctx, const char *what);
void rl_reply_group_not_offset(RedisModuleCtx *ctx, RedisModuleString *group);
/* TREAD's reply for offsets start.. (at most count of them): the WITHINFO
 * header (when withinfo) followed by the `nextra` integers of `extra` (a
 * lease read's), each message's time (withtimes), the PACKED form (packed).
 * Returns how many offsets it holds. s may be NULL. */
uint64_t rl_reply_range(RedisModuleCtx *ctx, mn_stream *s, uint64_t start, long long count,
                        int withinfo, int withtimes, int packed, const long long *extra, int nextra);
/* SetCommandInfo for the command (or "parent|sub") `name`: its arity,
 * summary, version it came with, key specs, argument docs and complexity.
 * Logs what failed. */
int rl_set_command_info(RedisModuleCtx *ctx, const char *name, int arity, const char *summary,
                        const char *since, RedisModuleCommandKeySpec *specs,
                        RedisModuleCommandArg *args, const char *complexity);
/* Put the command `name` in the ACL categories `acl` ("write fast"), and
 * in @rcp11 where the server can add it; nothing where it cannot (Redis
 * 7.0). After OnLoad has set the categories of module.c's commands. */
int rl_set_command_acl(RedisModuleCtx *ctx, const char *name, const char *acl);
/* A blocked group reader that would write while clients are paused keeps
 * its place: its stream is signalled again once the pause is over. */
void rl_defer_wake(rl_wait *w);
/* Block the client of ctx on stream_key with w (filled by the caller). */
void rl_block(RedisModuleCtx *ctx, RedisModuleString *stream_key, rl_wait *w, long long block_ms);

/* module_ack.c */
/* Create the rcp11-grp data type and the TACK, TGROUP, RCP11.LEASE and
 * RCP11.GROUP commands (OnLoad). */
int ra_register(RedisModuleCtx *ctx);
/* Whether an opened key holds an acknowledged group. */
int ra_holds_group(RedisModuleKey *key);
/* TREAD ... LEASE, after module.c parsed and checked its arguments: the
 * stream is opened for reading as `key` / s (closed by this call). */
int ra_tread(RedisModuleCtx *ctx, RedisModuleString *stream_name, RedisModuleKey *key,
             mn_stream *s, rl_tread_args *a, int may_block);
/* A blocked lease read woken: REDISMODULE_OK when it replied, ERR to keep
 * waiting (then it changed nothing). */
int ra_wake(RedisModuleCtx *ctx, rl_wait *w);

/* module_rdb.c: the data types' callbacks, registered by module.c
 * (rcp11-log) and module_ack.c (rcp11-grp). rl_rdb_pid_at_load() is called
 * once from OnLoad: the process that loaded the module is the server, any
 * other is a fork child (BGSAVE, an AOF rewrite). */
void rl_rdb_pid_at_load(void);
void rl_rdb_save(RedisModuleIO *io, void *value);
void *rl_rdb_load(RedisModuleIO *io, int encver);
void rl_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value);
void rl_digest(RedisModuleDigest *md, void *value);
void *rl_copy(RedisModuleKeyOptCtx *ctx, const void *value);
extern int rl_copy_from_db;
void ra_rdb_save(RedisModuleIO *io, void *value);
void *ra_rdb_load(RedisModuleIO *io, int encver);
void ra_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value);
void ra_digest(RedisModuleDigest *md, void *value);
void *ra_copy(RedisModuleKeyOptCtx *ctx, const void *value);

#endif /* RCP11_MODULE_INTERNAL_H */
