/* rcp11_module_api.h -- the part of the Redis module API that module.c uses.
 *
 * No Debian or PyPI package ships redismodule.h, so this header declares,
 * from Redis's module API reference, exactly the names, signatures,
 * constant values and structure layouts module.c needs, and nothing more.
 * Every value below was checked against redis-server 7.0 (the oldest server
 * the module supports): a wrong context flag or a shifted structure field
 * would not fail to compile, it would silently misbehave.
 *
 * How the API is reached: redis-server dlopen()s the module and calls
 * RedisModule_OnLoad(ctx, argv, argc). The first pointer-sized word of ctx is
 * the server's GetApi(name, &fnptr); every other function is looked up by
 * its name, "RedisModule_" + Name, into a function pointer of the same name.
 * RCP11_MODULE_API below lists each function once; module.c expands the list
 * to define the pointers and to look them all up (a NULL left behind means
 * the server is too old, and loading fails with a message).
 */
#ifndef RCP11_MODULE_API_H
#define RCP11_MODULE_API_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------
 * Constants
 * --------------------------------------------------------------------- */

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

/* OpenKey modes. */
#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

/* KeyType() answers. */
#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_MODULE 6

/* ReplyWithArray() length to be set later with ReplySetArrayLength(). */
#define REDISMODULE_POSTPONED_LEN -1

/* GetContextFlags() bits (values of redis 7.0; 5 and up for the ones used
 * here). SLAVE and READONLY are 1<<3 and 1<<4, not the 1<<7/1<<8 one might
 * guess from their order in the documentation. */
#define REDISMODULE_CTX_FLAGS_LUA (1 << 0)
#define REDISMODULE_CTX_FLAGS_MULTI (1 << 1)
#define REDISMODULE_CTX_FLAGS_MASTER (1 << 2)
#define REDISMODULE_CTX_FLAGS_SLAVE (1 << 3)
#define REDISMODULE_CTX_FLAGS_READONLY (1 << 4)
#define REDISMODULE_CTX_FLAGS_REPLICATED (1 << 12)
#define REDISMODULE_CTX_FLAGS_LOADING (1 << 13)
#define REDISMODULE_CTX_FLAGS_DENY_BLOCKING (1 << 21)
#define REDISMODULE_CTX_FLAGS_RESP3 (1 << 22)

/* SetModuleOptions() bits. */
#define REDISMODULE_OPTIONS_HANDLE_IO_ERRORS (1 << 0)
#define REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED (1 << 1)

/* Keyspace notification classes (SubscribeToKeyspaceEvents). */
#define REDISMODULE_NOTIFY_GENERIC (1 << 2)
#define REDISMODULE_NOTIFY_STRING (1 << 3)
#define REDISMODULE_NOTIFY_EXPIRED (1 << 8)
#define REDISMODULE_NOTIFY_EVICTED (1 << 9)
#define REDISMODULE_NOTIFY_MODULE (1 << 13)

/* Server events (SubscribeToServerEvent): FLUSHDB, fired before
 * (subevent 0) and after (subevent 1) FLUSHDB/FLUSHALL and full resyncs. */
#define REDISMODULE_EVENT_FLUSHDB 2
#define REDISMODULE_SUBEVENT_FLUSHDB_END 1
/* SWAPDB: two databases traded places (RedisModuleSwapDbInfo). */
#define REDISMODULE_EVENT_SWAPDB 11
/* ROLE_CHANGED: this server became a primary (0) or a replica (1). */
#define REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED 0
#define REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER 0
#define REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA 1
/* LOADING: an RDB (0), AOF (1) or full sync (2) load starts; ended (3) or
 * failed (4). Fired with server.loading already cleared at the end. */
#define REDISMODULE_EVENT_LOADING 3
#define REDISMODULE_SUBEVENT_LOADING_ENDED 3
#define REDISMODULE_SUBEVENT_LOADING_FAILED 4
/* SHUTDOWN: fired once the final AOF fsync and RDB save succeeded. */
#define REDISMODULE_EVENT_SHUTDOWN 5
/* REPLICA_CHANGE: a replica came online (0, its sync done) or an online one
 * went away (1). */
#define REDISMODULE_EVENT_REPLICA_CHANGE 6
#define REDISMODULE_SUBEVENT_REPLICA_CHANGE_ONLINE 0
#define REDISMODULE_SUBEVENT_REPLICA_CHANGE_OFFLINE 1
/* EVENTLOOP: before the event loop sleeps (0) -- after commands ran and
 * before the AOF is written, replies are sent and blocked clients are
 * served -- and right after it wakes (1). */
#define REDISMODULE_EVENT_EVENTLOOP 15
#define REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP 0
#define REDISMODULE_SUBEVENT_EVENTLOOP_AFTER_SLEEP 1

/* Module configs (Register*Config). MEMORY: the value may be given with a
 * unit ("64mb"), as maxmemory is. */
#define REDISMODULE_CONFIG_DEFAULT 0
#define REDISMODULE_CONFIG_IMMUTABLE (1ULL << 0)
#define REDISMODULE_CONFIG_MEMORY (1ULL << 7)

/* RedisModuleTypeMethods.version: 4 covers the fields up to copy2. */
#define REDISMODULE_TYPE_METHOD_VERSION 4

/* CallReplyType() answers used here. */
#define REDISMODULE_REPLY_STRING 0

/* Key-spec flags (SetCommandInfo). Exactly one of RO/RW/OW/RM per spec, and
 * at most one of UPDATE/INSERT/DELETE. */
#define REDISMODULE_CMD_KEY_RO (1ULL << 0)
#define REDISMODULE_CMD_KEY_RW (1ULL << 1)
#define REDISMODULE_CMD_KEY_OW (1ULL << 2)
#define REDISMODULE_CMD_KEY_RM (1ULL << 3)
#define REDISMODULE_CMD_KEY_ACCESS (1ULL << 4)
#define REDISMODULE_CMD_KEY_UPDATE (1ULL << 5)
#define REDISMODULE_CMD_KEY_INSERT (1ULL << 6)
#define REDISMODULE_CMD_KEY_DELETE (1ULL << 7)

/* Key-spec search kinds. 0 ends the key_specs array. */
typedef enum {
    REDISMODULE_KSPEC_BS_INVALID = 0,
    REDISMODULE_KSPEC_BS_UNKNOWN = 1,
    REDISMODULE_KSPEC_BS_INDEX = 2,
    REDISMODULE_KSPEC_BS_KEYWORD = 3
} RedisModuleKeySpecBeginSearchType;

typedef enum {
    REDISMODULE_KSPEC_FK_OMITTED = 0,
    REDISMODULE_KSPEC_FK_UNKNOWN = 1,
    REDISMODULE_KSPEC_FK_RANGE = 2,
    REDISMODULE_KSPEC_FK_KEYNUM = 3
} RedisModuleKeySpecFindKeysType;

/* ------------------------------------------------------------------------
 * Opaque types and callbacks
 * --------------------------------------------------------------------- */

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleCommand RedisModuleCommand;
typedef struct RedisModuleUser RedisModuleUser;
/* RM_ACLAddLogEntry's reason: a command the user may not run. */
#define REDISMODULE_ACL_LOG_CMD 1
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleIO RedisModuleIO;
typedef struct RedisModuleType RedisModuleType;
typedef struct RedisModuleDigest RedisModuleDigest;
typedef struct RedisModuleBlockedClient RedisModuleBlockedClient;
typedef struct RedisModuleInfoCtx RedisModuleInfoCtx;
typedef struct RedisModuleDict RedisModuleDict;
typedef struct RedisModuleDefragCtx RedisModuleDefragCtx;
typedef struct RedisModuleDictIter RedisModuleDictIter;
typedef struct RedisModuleScanCursor RedisModuleScanCursor;
typedef struct RedisModuleKeyOptCtx RedisModuleKeyOptCtx;
typedef struct RedisModuleServerInfoData RedisModuleServerInfoData;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef uint64_t RedisModuleTimerID;
typedef struct RedisModuleCommandFilter RedisModuleCommandFilter;
typedef struct RedisModuleCommandFilterCtx RedisModuleCommandFilterCtx;
typedef void (*RedisModuleCommandFilterFunc)(RedisModuleCommandFilterCtx *filter);
/* RegisterCommandFilter flags: not for the module's own RM_Call. */
#define REDISMODULE_CMDFILTER_NOSELF (1 << 0)

/* GetClientInfoById() fills version 1 of this layout. */
typedef struct RedisModuleClientInfo {
    uint64_t version; /* 1 */
    uint64_t flags;
    uint64_t id;
    char addr[46];
    uint16_t port;
    uint16_t db; /* the selected database */
} RedisModuleClientInfo;

/* A server event: its id and the version of the data it comes with. */
typedef struct RedisModuleEvent {
    uint64_t id;
    uint64_t dataver;
} RedisModuleEvent;

/* The data of REDISMODULE_EVENT_FLUSHDB (dataver 1). */
typedef struct RedisModuleFlushInfo {
    uint64_t version;
    int32_t sync;
    int32_t dbnum; /* -1: every database */
} RedisModuleFlushInfo;

/* The data of REDISMODULE_EVENT_SWAPDB (dataver 1). */
typedef struct RedisModuleSwapDbInfo {
    uint64_t version;
    int32_t dbnum_first;
    int32_t dbnum_second;
} RedisModuleSwapDbInfo;

typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);
typedef int (*RedisModuleNotificationFunc)(RedisModuleCtx *ctx, int type, const char *event,
                                           RedisModuleString *key);
typedef void (*RedisModuleInfoFunc)(RedisModuleInfoCtx *ctx, int for_crash_report);
typedef void (*RedisModuleFreePrivdataFunc)(RedisModuleCtx *ctx, void *privdata);
typedef void (*RedisModuleEventCallback)(RedisModuleCtx *ctx, RedisModuleEvent eid,
                                         uint64_t subevent, void *data);
/* A timer's callback: ctx has the database of the context that created it
 * selected; commands it replicates go out, in MULTI/EXEC, when it returns. */
typedef void (*RedisModuleTimerProc)(RedisModuleCtx *ctx, void *data);
/* Scan's callback, once per key of the selected database; key is opened
 * for reading (or NULL). */
typedef void (*RedisModuleScanCB)(RedisModuleCtx *ctx, RedisModuleString *keyname,
                                  RedisModuleKey *key, void *privdata);

typedef long long (*RedisModuleConfigGetNumericFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetNumericFunc)(const char *name, long long val, void *privdata,
                                               RedisModuleString **err);
typedef int (*RedisModuleConfigGetEnumFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetEnumFunc)(const char *name, int val, void *privdata,
                                            RedisModuleString **err);
typedef int (*RedisModuleConfigApplyFunc)(RedisModuleCtx *ctx, void *privdata,
                                          RedisModuleString **err);
/* A function another thread asks the main thread to run
 * (EventLoopAddOneShot, 7.0): it wakes the event loop. */
typedef void (*RedisModuleEventLoopOneShotFunc)(void *user_data);
typedef int (*RedisModuleConfigGetBoolFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetBoolFunc)(const char *name, int val, void *privdata,
                                            RedisModuleString **err);
typedef RedisModuleString *(*RedisModuleConfigGetStringFunc)(const char *name, void *privdata);
typedef int (*RedisModuleConfigSetStringFunc)(const char *name, RedisModuleString *val,
                                              void *privdata, RedisModuleString **err);

/* ------------------------------------------------------------------------
 * Data type callbacks: the layout CreateDataType() reads, field by field,
 * up to the fields its `version` covers. Version 1 ends after `free`,
 * version 2 after aux_save_triggers, version 3 after defrag, version 4
 * after copy2.
 * --------------------------------------------------------------------- */

typedef struct RedisModuleTypeMethods {
    uint64_t version;
    void *(*rdb_load)(RedisModuleIO *rdb, int encver);
    void (*rdb_save)(RedisModuleIO *rdb, void *value);
    void (*aof_rewrite)(RedisModuleIO *aof, RedisModuleString *key, void *value);
    size_t (*mem_usage)(const void *value);
    void (*digest)(RedisModuleDigest *digest, void *value);
    void (*free)(void *value);
    /* version 2 */
    int (*aux_load)(RedisModuleIO *rdb, int encver, int when);
    void (*aux_save)(RedisModuleIO *rdb, int when);
    int aux_save_triggers;
    /* version 3 */
    size_t (*free_effort)(RedisModuleString *key, const void *value);
    void (*unlink)(RedisModuleString *key, const void *value);
    void *(*copy)(RedisModuleString *fromkey, RedisModuleString *tokey, const void *value);
    int (*defrag)(RedisModuleDefragCtx *ctx, RedisModuleString *key, void **value);
    /* version 4: the same callbacks given the key's name and database */
    size_t (*mem_usage2)(RedisModuleKeyOptCtx *ctx, const void *value, size_t sample_size);
    size_t (*free_effort2)(RedisModuleKeyOptCtx *ctx, const void *value);
    void (*unlink2)(RedisModuleKeyOptCtx *ctx, const void *value);
    void *(*copy2)(RedisModuleKeyOptCtx *ctx, const void *value);
} RedisModuleTypeMethods;

/* ------------------------------------------------------------------------
 * Command info (SetCommandInfo, 7.0): key specs and argument docs.
 * --------------------------------------------------------------------- */

typedef struct RedisModuleCommandKeySpec {
    const char *notes;
    uint64_t flags; /* REDISMODULE_CMD_KEY_* */
    RedisModuleKeySpecBeginSearchType begin_search_type;
    union {
        struct {
            int pos; /* argv index of the first key */
        } index;
        struct {
            const char *keyword; /* the key follows this word */
            int startfrom;       /* argv index where the search starts */
        } keyword;
    } bs;
    RedisModuleKeySpecFindKeysType find_keys_type;
    union {
        struct {
            int lastkey; /* relative to the first key; -1: up to the last argument */
            int keystep;
            int limit;
        } range;
        struct {
            int keynumidx;
            int firstkey;
            int keystep;
        } keynum;
    } fk;
} RedisModuleCommandKeySpec;

typedef struct RedisModuleCommandHistoryEntry {
    const char *since;
    const char *changes;
} RedisModuleCommandHistoryEntry;

/* Argument types and flags (COMMAND DOCS, and the hints redis-cli and
 * valkey-cli show from it). */
#define REDISMODULE_ARG_TYPE_STRING 0
#define REDISMODULE_ARG_TYPE_INTEGER 1
#define REDISMODULE_ARG_TYPE_KEY 3
#define REDISMODULE_ARG_TYPE_PURE_TOKEN 6
#define REDISMODULE_ARG_TYPE_ONEOF 7 /* one of its sub-arguments */
#define REDISMODULE_ARG_TYPE_BLOCK 8 /* all of its sub-arguments */
#define REDISMODULE_CMD_ARG_OPTIONAL (1 << 0)
#define REDISMODULE_CMD_ARG_MULTIPLE (1 << 1)

/* One argument of a command; an array of them ends with a NULL name. The
 * server steps through the array by the size the version record reports.
 * display_text came with Redis 7.2: 7.2 and Valkey 8 read it in every
 * element, 7.0 steps over it. */
typedef struct RedisModuleCommandArg {
    const char *name;
    int type;           /* REDISMODULE_ARG_TYPE_* */
    int key_spec_index; /* type KEY: index into key_specs; else -1 */
    const char *token;  /* the word before the value, or the PURE_TOKEN */
    const char *summary;
    const char *since;
    int flags; /* REDISMODULE_CMD_ARG_* */
    const char *deprecated_since;
    struct RedisModuleCommandArg *subargs; /* ONEOF and BLOCK */
    const char *display_text;              /* the name shown in hints */
} RedisModuleCommandArg;

/* The server walks the arrays above with these element sizes. */
typedef struct RedisModuleCommandInfoVersion {
    int version;
    size_t sizeof_historyentry;
    size_t sizeof_keyspec;
    size_t sizeof_arg;
} RedisModuleCommandInfoVersion;

typedef struct RedisModuleCommandInfo {
    const RedisModuleCommandInfoVersion *version;
    const char *summary;
    const char *complexity;
    const char *since;
    RedisModuleCommandHistoryEntry *history;
    const char *tips;
    int arity;
    RedisModuleCommandKeySpec *key_specs; /* ends with begin_search_type 0 */
    RedisModuleCommandArg *args;
} RedisModuleCommandInfo;

/* ------------------------------------------------------------------------
 * Functions: X(return type, Name, (parameters)), looked up as
 * "RedisModule_" #Name. Grouped by the Redis version that added them.
 * --------------------------------------------------------------------- */

#define RCP11_MODULE_API(X)                                                                    \
    /* 4.0 */                                                                                  \
    X(void *, Alloc, (size_t bytes))                                                           \
    X(void *, Calloc, (size_t nmemb, size_t size))                                             \
    X(void *, Realloc, (void *ptr, size_t bytes))                                              \
    X(void, Free, (void *ptr))                                                                 \
    X(int, CreateCommand, (RedisModuleCtx * ctx, const char *name, RedisModuleCmdFunc cmdfunc, \
                           const char *strflags, int firstkey, int lastkey, int keystep))      \
    X(void, SetModuleAttribs, (RedisModuleCtx * ctx, const char *name, int ver, int apiver))   \
    X(int, IsModuleNameBusy, (const char *name))                                               \
    X(int, WrongArity, (RedisModuleCtx * ctx))                                                 \
    X(long long, Milliseconds, (void))                                                         \
    X(int, ReplyWithLongLong, (RedisModuleCtx * ctx, long long ll))                            \
    X(int, ReplyWithError, (RedisModuleCtx * ctx, const char *err))                            \
    X(int, ReplyWithSimpleString, (RedisModuleCtx * ctx, const char *msg))                     \
    X(int, ReplyWithArray, (RedisModuleCtx * ctx, long len))                                   \
    X(void, ReplySetArrayLength, (RedisModuleCtx * ctx, long len))                             \
    X(int, ReplyWithStringBuffer, (RedisModuleCtx * ctx, const char *buf, size_t len))         \
    X(int, ReplyWithNull, (RedisModuleCtx * ctx))                                              \
    X(RedisModuleKey *, OpenKey, (RedisModuleCtx * ctx, RedisModuleString * keyname, int mode)) \
    X(void, CloseKey, (RedisModuleKey * kp))                                                   \
    X(int, KeyType, (RedisModuleKey * kp))                                                     \
    X(int, DeleteKey, (RedisModuleKey * key))                                                  \
    X(int, StringSet, (RedisModuleKey * key, RedisModuleString * str))                         \
    X(char *, StringDMA, (RedisModuleKey * key, size_t *len, int mode))                        \
    X(RedisModuleString *, CreateString, (RedisModuleCtx * ctx, const char *ptr, size_t len))  \
    X(RedisModuleString *, CreateStringFromLongLong, (RedisModuleCtx * ctx, long long ll))     \
    X(RedisModuleString *, CreateStringFromString,                                             \
      (RedisModuleCtx * ctx, const RedisModuleString *str))                                    \
    X(void, FreeString, (RedisModuleCtx * ctx, RedisModuleString * str))                       \
    X(const char *, StringPtrLen, (const RedisModuleString *str, size_t *len))                 \
    X(int, StringToLongLong, (const RedisModuleString *str, long long *ll))                    \
    X(int, IsKeysPositionRequest, (RedisModuleCtx * ctx))                                      \
    X(void, KeyAtPos, (RedisModuleCtx * ctx, int pos))                                         \
    X(int, Replicate, (RedisModuleCtx * ctx, const char *cmdname, const char *fmt, ...))       \
    X(int, ReplicateVerbatim, (RedisModuleCtx * ctx))                                          \
    X(RedisModuleType *, CreateDataType, (RedisModuleCtx * ctx, const char *name, int encver,  \
                                          RedisModuleTypeMethods *typemethods))                \
    X(int, ModuleTypeSetValue, (RedisModuleKey * key, RedisModuleType * mt, void *value))      \
    X(RedisModuleType *, ModuleTypeGetType, (RedisModuleKey * key))                            \
    X(void *, ModuleTypeGetValue, (RedisModuleKey * key))                                      \
    X(void, SaveUnsigned, (RedisModuleIO * io, uint64_t value))                                \
    X(uint64_t, LoadUnsigned, (RedisModuleIO * io))                                            \
    X(void, SaveStringBuffer, (RedisModuleIO * io, const char *str, size_t len))               \
    X(char *, LoadStringBuffer, (RedisModuleIO * io, size_t *lenptr))                          \
    X(void, EmitAOF, (RedisModuleIO * io, const char *cmdname, const char *fmt, ...))          \
    X(void, Log, (RedisModuleCtx * ctx, const char *level, const char *fmt, ...))              \
    X(void, LogIOError, (RedisModuleIO * io, const char *levelstr, const char *fmt, ...))      \
    X(void, DigestAddStringBuffer, (RedisModuleDigest * md, const char *ele, size_t len))      \
    X(void, DigestAddLongLong, (RedisModuleDigest * md, long long ele))                        \
    X(void, DigestEndSequence, (RedisModuleDigest * md))                                       \
    X(int, SelectDb, (RedisModuleCtx * ctx, int newid))                                        \
    /* 5.0 */                                                                                  \
    X(RedisModuleTimerID, CreateTimer,                                                         \
      (RedisModuleCtx * ctx, long long period, RedisModuleTimerProc callback, void *data))      \
    X(int, GetContextFlags, (RedisModuleCtx * ctx))                                            \
    X(int, GetSelectedDb, (RedisModuleCtx * ctx))                                              \
    X(int, ReplyWithNullArray, (RedisModuleCtx * ctx))                                         \
    X(int, SubscribeToKeyspaceEvents,                                                          \
      (RedisModuleCtx * ctx, int types, RedisModuleNotificationFunc cb))                       \
    X(RedisModuleDict *, CreateDict, (RedisModuleCtx * ctx))                                   \
    X(void *, DictGetC, (RedisModuleDict * d, void *key, size_t keylen, int *nokey))           \
    X(int, DictSetC, (RedisModuleDict * d, void *key, size_t keylen, void *ptr))               \
    X(int, DictDelC, (RedisModuleDict * d, void *key, size_t keylen, void *oldval))            \
    X(uint64_t, DictSize, (RedisModuleDict * d))                                               \
    X(RedisModuleDictIter *, DictIteratorStartC,                                               \
      (RedisModuleDict * d, const char *op, void *key, size_t keylen))                         \
    X(void *, DictNextC, (RedisModuleDictIter * di, size_t *keylen, void **dataptr))           \
    X(void, DictIteratorStop, (RedisModuleDictIter * di))                                      \
    X(void, FreeDict, (RedisModuleCtx * ctx, RedisModuleDict * d))                             \
    /* 6.0 */                                                                                  \
    X(RedisModuleBlockedClient *, BlockClientOnKeys,                                           \
      (RedisModuleCtx * ctx, RedisModuleCmdFunc reply_callback,                                \
       RedisModuleCmdFunc timeout_callback, RedisModuleFreePrivdataFunc free_privdata,        \
       long long timeout_ms, RedisModuleString **keys, int numkeys, void *privdata))          \
    X(void, SignalKeyAsReady, (RedisModuleCtx * ctx, RedisModuleString * key))                 \
    X(void *, GetBlockedClientPrivateData, (RedisModuleCtx * ctx))                             \
    X(int, IsIOError, (RedisModuleIO * io))                                                    \
    X(const RedisModuleString *, GetKeyNameFromIO, (RedisModuleIO * io))                       \
    X(void, SetModuleOptions, (RedisModuleCtx * ctx, int options))                             \
    X(int, SignalModifiedKey, (RedisModuleCtx * ctx, RedisModuleString * keyname))             \
    X(int, NotifyKeyspaceEvent,                                                                \
      (RedisModuleCtx * ctx, int type, const char *event, RedisModuleString *key))             \
    X(int, RegisterInfoFunc, (RedisModuleCtx * ctx, RedisModuleInfoFunc cb))                   \
    X(int, InfoAddSection, (RedisModuleInfoCtx * ctx, const char *name))                       \
    X(int, InfoAddFieldULongLong,                                                              \
      (RedisModuleInfoCtx * ctx, const char *field, unsigned long long value))                 \
    X(int, InfoAddFieldCString, (RedisModuleInfoCtx * ctx, const char *field, const char *value)) \
    X(int, GetServerVersion, (void))                                                           \
    X(unsigned long long, DbSize, (RedisModuleCtx * ctx))                                      \
    X(RedisModuleScanCursor *, ScanCursorCreate, (void))                                       \
    X(void, ScanCursorRestart, (RedisModuleScanCursor * cursor))                               \
    X(void, ScanCursorDestroy, (RedisModuleScanCursor * cursor))                               \
    X(int, Scan, (RedisModuleCtx * ctx, RedisModuleScanCursor * cursor, RedisModuleScanCB fn,  \
                  void *privdata))                                                             \
    X(int, SubscribeToServerEvent,                                                             \
      (RedisModuleCtx * ctx, RedisModuleEvent event, RedisModuleEventCallback callback))       \
    /* true while clients are paused (CLIENT PAUSE, FAILOVER, CLUSTER FAILOVER) */             \
    X(int, AvoidReplicaTraffic, (void))                                                        \
    /* 7.0 */                                                                                  \
    X(int, ReplyWithMap, (RedisModuleCtx * ctx, long len))                                     \
    X(int, CreateSubcommand,                                                                   \
      (RedisModuleCommand * parent, const char *name, RedisModuleCmdFunc cmdfunc,             \
       const char *strflags, int firstkey, int lastkey, int keystep))                         \
    X(RedisModuleCommand *, GetCommand, (RedisModuleCtx * ctx, const char *name))              \
    X(int, SetCommandInfo, (RedisModuleCommand * command, const RedisModuleCommandInfo *info)) \
    X(int, RegisterNumericConfig,                                                              \
      (RedisModuleCtx * ctx, const char *name, long long default_val, unsigned int flags,      \
       long long min, long long max, RedisModuleConfigGetNumericFunc getfn,                    \
       RedisModuleConfigSetNumericFunc setfn, RedisModuleConfigApplyFunc applyfn,              \
       void *privdata))                                                                        \
    X(int, RegisterEnumConfig,                                                                 \
      (RedisModuleCtx * ctx, const char *name, int default_val, unsigned int flags,            \
       const char **enum_values, const int *int_values, int num_enum_vals,                     \
       RedisModuleConfigGetEnumFunc getfn, RedisModuleConfigSetEnumFunc setfn,                 \
       RedisModuleConfigApplyFunc applyfn, void *privdata))                                    \
    X(int, LoadConfigs, (RedisModuleCtx * ctx))                                              \
    /* 7.0: a group read checks that its user may move a group key */                          \
    X(RedisModuleString *, GetCurrentUserName, (RedisModuleCtx * ctx))                         \
    X(RedisModuleUser *, GetModuleUserFromUserName, (RedisModuleString * name))                \
    X(int, FreeModuleUser, (RedisModuleUser * user))                                           \
    X(int, ACLCheckCommandPermissions,                                                         \
      (RedisModuleUser * user, RedisModuleString **argv, int argc))                             \
    X(int, ACLAddLogEntry, (RedisModuleCtx * ctx, RedisModuleUser * user,                      \
                            RedisModuleString * object, int reason))

/* What the offset reservations (module_reserve.c) use besides the above:
 * blocking a writer until its reservation is confirmed, the replicas'
 * acknowledged offsets (INFO replication), a wake-up from the fsync thread,
 * the unlinked key's name, and its configs. Redis 6.0 / 7.0. */
#define RCP11_MODULE_API_RESERVE(X)                                                            \
    X(RedisModuleBlockedClient *, BlockClient,                                                 \
      (RedisModuleCtx * ctx, RedisModuleCmdFunc reply_callback,                                \
       RedisModuleCmdFunc timeout_callback, RedisModuleFreePrivdataFunc free_privdata,        \
       long long timeout_ms))                                                                  \
    X(int, UnblockClient, (RedisModuleBlockedClient * bc, void *privdata))                     \
    X(int, EventLoopAddOneShot, (RedisModuleEventLoopOneShotFunc func, void *user_data))       \
    X(int, DictReplaceC, (RedisModuleDict * d, void *key, size_t keylen, void *ptr))           \
    X(unsigned long long, GetClientId, (RedisModuleCtx * ctx))                                 \
    X(RedisModuleServerInfoData *, GetServerInfo, (RedisModuleCtx * ctx, const char *section)) \
    X(void, FreeServerInfo, (RedisModuleCtx * ctx, RedisModuleServerInfoData * data))          \
    X(const char *, ServerInfoGetFieldC, (RedisModuleServerInfoData * data, const char *field)) \
    X(RedisModuleCallReply *, Call, (RedisModuleCtx * ctx, const char *cmdname, const char *fmt, ...)) \
    X(int, CallReplyType, (RedisModuleCallReply * reply))                                      \
    X(const char *, CallReplyStringPtr, (RedisModuleCallReply * reply, size_t *len))           \
    X(void, FreeCallReply, (RedisModuleCallReply * reply))                                     \
    X(const RedisModuleString *, GetKeyNameFromOptCtx, (RedisModuleKeyOptCtx * ctx))           \
    X(int, GetDbIdFromOptCtx, (RedisModuleKeyOptCtx * ctx))                                    \
    X(int, RegisterBoolConfig,                                                                 \
      (RedisModuleCtx * ctx, const char *name, int default_val, unsigned int flags,            \
       RedisModuleConfigGetBoolFunc getfn, RedisModuleConfigSetBoolFunc setfn,                 \
       RedisModuleConfigApplyFunc applyfn, void *privdata))                                    \
    X(int, RegisterStringConfig,                                                               \
      (RedisModuleCtx * ctx, const char *name, const char *default_val, unsigned int flags,    \
       RedisModuleConfigGetStringFunc getfn, RedisModuleConfigSetStringFunc setfn,             \
       RedisModuleConfigApplyFunc applyfn, void *privdata))

/* Functions the module can do without, looked up the same way: NULL on a
 * server too old to have them (module.c checks before each use). */
#define RCP11_MODULE_API_OPTIONAL(X)                                                           \
    /* Redis 7.2, Valkey 8 */                                                                  \
    X(int, SetCommandACLCategories, (RedisModuleCommand * command, const char *aclflags))      \
    /* Redis 7.4, Valkey 8 */                                                                  \
    X(int, AddACLCategory, (RedisModuleCtx * ctx, const char *name))                           \
    /* Command filters (5.0, the client's id 7.2) and client info (6.0): used only where the   \
     * client's id is known (Valkey 8) */                                                      \
    X(RedisModuleCommandFilter *, RegisterCommandFilter,                                       \
      (RedisModuleCtx * ctx, RedisModuleCommandFilterFunc cb, int flags))                      \
    X(int, CommandFilterArgsCount, (RedisModuleCommandFilterCtx * fctx))                       \
    X(RedisModuleString *, CommandFilterArgGet, (RedisModuleCommandFilterCtx * fctx, int pos)) \
    X(unsigned long long, CommandFilterGetClientId, (RedisModuleCommandFilterCtx * fctx))      \
    X(int, GetClientInfoById, (void *ci, uint64_t id))

#define RCP11_DECLARE_API(ret, name, params) extern ret(*RedisModule_##name) params;
RCP11_MODULE_API(RCP11_DECLARE_API)
RCP11_MODULE_API_RESERVE(RCP11_DECLARE_API)
RCP11_MODULE_API_OPTIONAL(RCP11_DECLARE_API)
#undef RCP11_DECLARE_API

#endif /* RCP11_MODULE_API_H */
