/* module_offsets_file.h -- the Redis module's offsets file: per-key
 * reservation marks, fsynced before offsets below them are handed out
 * (format and rules in module_offsets_file.c; module_reserve.c decides when
 * to reserve). Main thread only. */
#ifndef RCP11_MODULE_OFFSETS_FILE_H
#define RCP11_MODULE_OFFSETS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "rcp11_module_api.h"

/* A key's marks, folded from the file: live (a stream is there) and
 * deleted (one was deleted there). */
typedef struct of_marks {
    uint64_t live, deleted;
    int has_live, has_deleted;
} of_marks;

/* "<db u32 LE><name>": how the fold and the module's per-key tables name a
 * key (a RedisModuleDict key); of_key_db reads the database back. */
char *of_key(int db, const char *name, size_t len, size_t *out_len);
int of_key_db(const char *k);

/* Open (creating) and lock the file, relative to Redis's `dir`, and fold
 * it. ERR with the reason logged: in use by another server, damaged. */
int of_open(RedisModuleCtx *ctx, const char *path);
/* The marks folded at open (once; NULL afterwards), and whether the file
 * ended with a clean shutdown whose marks are exact (tight). */
RedisModuleDict *of_take_fold(int *clean, int *tight);
void of_fold_free(RedisModuleDict *fold);
/* Call fn for each key of a fold, in key order: its database, its name
 * (without the database prefix) and its marks. */
typedef void of_fold_fn(void *arg, int db, const char *name, size_t len, of_marks *m);
void of_fold_each(RedisModuleDict *fold, of_fold_fn *fn, void *arg);
/* The file starts over from a fold (after the start-up recovery). */
void of_restart(RedisModuleDict *fold);

/* A reservation, written at once (a full disk refuses it here): 0, or -1
 * with of_error() set and nothing recorded. fsynced by of_sync/of_fsync. */
int of_reserve(int db, const char *key, size_t klen, uint64_t mark);
/* A mark received from the primary (a replica): written and fsynced by the
 * next of_sync, before the replica's acknowledgement leaves. */
void of_received(int db, const char *key, size_t klen, uint64_t mark);
/* A stream left its key; a database was flushed (-1: all). Written with
 * the next batch, not fsynced for their own sake. */
void of_deleted(int db, const char *key, size_t klen);
void of_flushed(int db);
/* SWAPDB a b: the two databases' marks trade places. */
void of_swapped(int a, int b);
/* The same for a table keyed by of_key (values move, untouched). */
void of_swap_keys(RedisModuleDict *d, int a, int b);

/* fsync what a mark waits for, now, on this thread: 0 or -1. */
int of_fsync(void);
/* The before-sleep hook's part: write what waits, fsync, compact when
 * large. urgent: replies about to be sent depend on the fsync, done here;
 * if it fails the server exits, as Redis does when its AOF fsync fails
 * under appendfsync always. Marks from the primary are fsynced here too
 * (before the replica's acknowledgement is sent). Other marks -- made
 * ahead of need -- are fsynced by a background thread, so the event loop
 * does not stop for them. */
void of_sync(int urgent);
/* Every write of the file is a generation: marks written so far are in
 * generation of_live_gen(), durable once of_synced() reaches it. */
uint64_t of_live_gen(void);
uint64_t of_synced(void);

/* A clean shutdown rewrites the file from the keyspace: the marks, then a
 * CLEAN record (tight: the marks are the next offsets exactly). */
void of_clean_begin(void);
void of_clean_mark(int db, const char *key, size_t klen, uint64_t mark);
void of_clean_commit(int tight);

int of_is_open(void);
int of_pending(void); /* a mark is not fsynced yet */
int of_failing(void); /* the last write or fsync failed (of_error says how) */
const char *of_error(void);
const char *of_path(void);
uint64_t of_size(void);
uint64_t of_fsyncs(void);
/* Compactions installed (INFO). */
uint64_t of_compactions(void);

#endif /* RCP11_MODULE_OFFSETS_FILE_H */
