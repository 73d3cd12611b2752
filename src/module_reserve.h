/* module_reserve.h -- offset reservations for the Redis module: what
 * module.c calls (module_reserve.c has the design), and the two things
 * module_reserve.c takes from module.c. */
#ifndef RCP11_MODULE_RESERVE_H
#define RCP11_MODULE_RESERVE_H

#include <stdint.h>

#include "macronode.h"
#include "rcp11_module_api.h"

/* ---- from module.c ---------------------------------------------------- */

/* The stream at an opened key (*s NULL for an empty key); 0 when the key
 * holds another type. */
int rl_stream_of(RedisModuleKey *key, mn_stream **s);
/* Store a new empty stream (the current configs) at an empty key opened for
 * writing, counted in INFO. NULL when it cannot. */
mn_stream *rl_stream_create(RedisModuleKey *key);

/* ---- to module.c ------------------------------------------------------ */

/* Loading: the configs (before RedisModule_LoadConfigs), then the rest: the
 * offsets file is read (a damaged one fails the load, with the reason in
 * the log), the server events, RCP11.RESERVE. */
int rl_resv_register_configs(RedisModuleCtx *ctx);
int rl_resv_init(RedisModuleCtx *ctx);

/* A command that hands out `n` offsets of the stream at `key` asks first.
 * 1: go on. 0: the client was answered (refused) or blocked until the
 * reservation is confirmed, when `rerun(ctx, argv, argc)` runs the command
 * again; the command returns REDISMODULE_OK at once. Commands from the
 * primary or the AOF always go on. */
int rl_resv_admit(RedisModuleCtx *ctx, RedisModuleString *key, uint64_t n,
                  RedisModuleCmdFunc rerun);
/* After a command added messages to s (at key): reserve ahead, and note
 * the new end for read-committed readers. */
void rl_resv_wrote(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s);
/* A stream came into being at key by a command (any origin): it takes the
 * reservation the key had while it was missing. */
void rl_resv_created(RedisModuleCtx *ctx, RedisModuleString *key, mn_stream *s);

/* RCP11.RESERVE key mark: raise a stream's reservation (the replication
 * stream and the AOF only). In module.c's command table. */
int rl_resv_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* The end of what a reader may see: the next offset, or with
 * rcp11.read-committed the end of what the replicas acknowledged. */
uint64_t rl_resv_readable_next(RedisModuleCtx *ctx, mn_stream *s);
/* A reader waits on key for offsets below the next offset that are not
 * acknowledged yet: signal it when they are. */
void rl_resv_reader_waits(RedisModuleCtx *ctx, RedisModuleString *key);

/* The mark in RDB values (after the nodes, encoding version 2) and in a
 * rewritten AOF. */
void rl_resv_rdb_save(RedisModuleIO *io, mn_stream *s);
int rl_resv_rdb_load(RedisModuleIO *io, mn_stream *s, int encver);
void rl_resv_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, mn_stream *s);

/* The data type's unlink2 callback: a stream left its key. */
void rl_resv_unlink(RedisModuleKeyOptCtx *ctx, const void *value);

void rl_resv_info(RedisModuleInfoCtx *ctx);

#endif /* RCP11_MODULE_RESERVE_H */
