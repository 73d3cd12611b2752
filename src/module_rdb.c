/* module_rdb.c -- the data types' callbacks: where a value becomes bytes
 * and where bytes from outside (an RDB file, a DUMP payload from any
 * client's RESTORE, a primary's full sync) become a value again.
 *
 *   rcp11-log (streams, module.c)     rl_rdb_save / rl_rdb_load,
 *                                     rl_aof_rewrite, rl_digest, rl_copy
 *   rcp11-grp (groups, module_ack.c)  ra_rdb_save / ra_rdb_load,
 *                                     ra_aof_rewrite, ra_digest, ra_copy
 *
 * module.c and module_ack.c register the types (and keep the memory and
 * free callbacks, which only count). Everything loaded here is checked by
 * the cores' validators (mn_load_header / mn_load_node / mn_load_finish,
 * ag_load) before anything trusts it; RCP11.NODE and RCP11.GROUP, which
 * replay a rewritten AOF, use the same validators from module.c and
 * module_ack.c.
 *
 * THE STREAM'S FORMATS
 * ====================
 *
 * RDB (snapshots, DUMP/RESTORE/MIGRATE, full resync, DEBUG RELOAD) stores a
 * stream as the core's own serialized blobs, written by rl_rdb_save():
 *
 *   +----------------------+---------------------+-------------+-----+----------------+
 *   | unsigned: node count | buffer: header blob | buffer: node | ... | unsigned: mark |
 *   |   (RDB length enc.)  |  52 bytes, "MNST"   |  blob 1, "MNND"    | (encver >= 2)  |
 *   +----------------------+---------------------+-------------+-----+----------------+
 *
 * The header and node blobs are macronode.c's little-endian formats (drawn
 * in its header comment), each with a CRC32; a compressed node stays
 * compressed and every message keeps its append time (a node's first time
 * and a delta per message). The blobs carry their own format version, so
 * RDB files written before the core's format 4 (times of every 64th
 * message only) load too, with the core's reading of those times.
 * RL_ENCVER (Redis's per-type encoding version) is 2: version 2 added the
 * stream's offset reservation mark after the nodes (module_reserve.c), so
 * that a full sync, DUMP/RESTORE and MIGRATE carry it; version 1 values
 * (no mark) still load. The type name "rcp11-log" is written into every
 * RDB file, so it never changes. rl_rdb_load() validates every blob with
 * the core's validator
 * before trusting it: a corrupt or truncated value makes the load fail with
 * a logged reason (RESTORE answers an error, a server refuses to start from
 * a corrupt file), never a crash.
 *
 * An AOF rewrite without an RDB preamble (rl_aof_rewrite) emits the same
 * blobs as commands, so that append times (which live in the nodes' time
 * deltas, not in any command) come back exactly:
 *
 *   RCP11.NODE key <node blob 1>     node by node: offsets, bytes,
 *   RCP11.NODE key <node blob 2>     compression and append times as
 *   ...                              they are (mn_append_node_blob)
 *   TEVICT key <first offset - 1>    if the first node is partly evicted
 *   RCP11.SKIPTO key <next offset>   if the tail is evicted, or no node
 *
 * except that a stream whose clock is past its nodes' times (its newest
 * messages were evicted) ends with RCP11.SKIPTO key <next - 1>,
 * RCP11.TWRITEAT key <clock> "" and TEVICT key <next - 1>: the clock comes
 * back too. Offsets, evictions, the next offset, every message's time and
 * the clock come back exactly. A node blob is checked like an RDB one
 * before it is trusted; one of format 3 (an AOF rewritten before format 4)
 * is taken too.
 *
 * A rewritten AOF ends a stream with RCP11.RESERVE key <mark> when its
 * mark is past its next offset.
 *
 * An acknowledged group is one ag_serialize blob (ackgroup.c draws it), in
 * an RDB value (encoding version RA_ENCVER) and as `RCP11.GROUP key <blob>`
 * in a rewritten AOF.
 *
 * A VALUE THAT CANNOT BE SAVED
 * ============================
 *
 * Serialising allocates a buffer and checks a node's size. Inside Redis an
 * allocation that fails ends the server in the allocator (module_alloc.h),
 * and the core never builds a node too large to serialise, so this is a
 * broken invariant, not a case to live with. It never passes in silence:
 *
 *   - the reason, the type and the key are logged at warning level;
 *   - in a fork child (BGSAVE, an AOF rewrite, a full sync to a replica,
 *     on disk or diskless) the child ends at once by SIGABRT. Redis then
 *     reports the save or rewrite as failed ("terminated by signal 6",
 *     INFO rdb_last_bgsave_status / aof_last_bgrewrite_status: err),
 *     removes its temporary file and keeps the previous RDB file or AOF;
 *     with save rules and stop-writes-on-bgsave-error (the default)
 *     writes answer -MISCONF until a save succeeds. A truncated AOF rewrite (nodes
 *     missing, then the stream's end written as if whole) or an RDB value
 *     that loads short is never produced;
 *   - in the server itself (SAVE, DUMP, MIGRATE, SHUTDOWN's save, DEBUG
 *     RELOAD) ending the process would lose every write not saved yet, and
 *     Redis 7.0's module API has no call that fails a save: the value is
 *     written with an empty blob where the unsaved part goes, which
 *     rl_rdb_load / ra_rdb_load refuse by name ("... was not saved whole"),
 *     so RESTORE answers an error and a server does not start from such a
 *     file rather than load a stream short;
 *   - DEBUG DIGEST logs that its digest is incomplete; COPY answers an
 *     error (Redis: "module key failed to copy") and logs why.
 */

#define _POSIX_C_SOURCE 200809L /* getpid */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ackgroup.h"
#include "macronode.h"
#include "module_internal.h"
#include "module_reserve.h"

/* ------------------------------------------------------------------------
 * Failing loudly
 * --------------------------------------------------------------------- */

/* The process that loaded the module: the server. Any other is one of its
 * fork children. */
static pid_t rl_server_pid;

void rl_rdb_pid_at_load(void) { rl_server_pid = getpid(); }

/* The key name of a save, quoted for the log ("?" when Redis gives none). */
static void rl_io_key(RedisModuleIO *io, RedisModuleString *key, char *out, size_t outsize) {
    const RedisModuleString *name = key != NULL ? key : RedisModule_GetKeyNameFromIO(io);
    if (name == NULL) {
        snprintf(out, outsize, "?");
        return;
    }
    size_t len;
    const char *p = RedisModule_StringPtrLen(name, &len);
    rl_quote(p, len, RL_QUOTE_MAX, out, outsize);
}

/* A value could not be serialised (see A VALUE THAT CANNOT BE SAVED): log
 * why at warning level, and in a fork child end it so that its save or
 * rewrite fails. Returns in the server itself: the caller then writes what
 * the loader refuses. The default action of SIGABRT, not Redis's crash
 * handler: this is no crash to report, and the handler's memory test would
 * walk the child's whole dataset. */
static void rl_cannot_save(RedisModuleIO *io, RedisModuleString *key, const char *what, int rc) {
    char name[RL_QUOTE_MAX * 3 + 1];
    rl_io_key(io, key, name, sizeof(name));
    int child = getpid() != rl_server_pid;
    RedisModule_LogIOError(io, "warning",
                           "rcp11: cannot serialize %s of key '%s' (error %d): %s", what, name,
                           rc,
                           child ? "failing this save / rewrite, the previous file stays"
                                 : "its value is saved as one no server loads");
    if (child) {
        signal(SIGABRT, SIG_DFL);
        abort();
    }
}

/* ------------------------------------------------------------------------
 * rcp11-log: streams
 * --------------------------------------------------------------------- */

/* The layout is drawn above. A blob that cannot be serialised fails the
 * save in a fork child; in the server it is saved empty, which
 * rl_rdb_load refuses (A VALUE THAT CANNOT BE SAVED). The value keeps its
 * shape either way, so the reservation mark stays its last field. */
void rl_rdb_save(RedisModuleIO *io, void *value) {
    mn_stream *s = value;
    mn_buf b;
    mn_buf_init(&b);
    RedisModule_SaveUnsigned(io, mn_num_nodes(s));
    int rc = mn_serialize_header(s, &b);
    if (rc != MN_OK) {
        rl_cannot_save(io, NULL, "a stream header", rc);
        b.len = 0;
    }
    RedisModule_SaveStringBuffer(io, b.len ? b.data : "", b.len);
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node)) {
        b.len = 0;
        rc = mn_node_serialize(node, &b);
        if (rc != MN_OK) {
            rl_cannot_save(io, NULL, "a stream node", rc);
            b.len = 0;
        }
        RedisModule_SaveStringBuffer(io, b.len ? b.data : "", b.len);
    }
    mn_buf_free(&b);
    rl_resv_rdb_save(io, s); /* encoding version 2: the reservation mark */
}

/* An empty blob is what rl_rdb_save writes for a part it could not
 * serialise (no valid blob is empty): named as such, not as corruption. */
static int rl_unsaved(RedisModuleIO *io, size_t len, const char *what) {
    if (len != 0) return 0;
    RedisModule_LogIOError(io, "warning",
                           "rcp11: %s was not saved whole (the save logged why): refused", what);
    return 1;
}

void *rl_rdb_load(RedisModuleIO *io, int encver) {
    if (encver < 1 || encver > RL_ENCVER) {
        RedisModule_LogIOError(io, "warning",
                               "rcp11: stream encoding version %d is not %d (a newer module?)",
                               encver, RL_ENCVER);
        return NULL;
    }
    uint64_t count = RedisModule_LoadUnsigned(io);
    if (RedisModule_IsIOError(io)) return NULL;
    size_t len;
    char *blob = RedisModule_LoadStringBuffer(io, &len);
    if (RedisModule_IsIOError(io) || blob == NULL) return NULL;
    if (rl_unsaved(io, len, "a stream header")) {
        RedisModule_Free(blob);
        return NULL;
    }
    int err = MN_OK;
    mn_stream *s = mn_load_header(blob, len, rl_now_ms(), &err);
    RedisModule_Free(blob);
    if (s == NULL) {
        RedisModule_LogIOError(io, "warning", "rcp11: corrupt stream header (%d)", err);
        return NULL;
    }
    for (uint64_t i = 0; i < count; i++) {
        blob = RedisModule_LoadStringBuffer(io, &len);
        if (RedisModule_IsIOError(io) || blob == NULL) {
            mn_stream_free(s);
            return NULL;
        }
        if (rl_unsaved(io, len, "a stream node")) {
            RedisModule_Free(blob);
            mn_stream_free(s);
            return NULL;
        }
        int rc = mn_load_node(s, blob, len);
        RedisModule_Free(blob);
        if (rc != MN_OK) {
            RedisModule_LogIOError(io, "warning", "rcp11: corrupt stream node %llu of %llu (%d)",
                                   (unsigned long long)i + 1, (unsigned long long)count, rc);
            mn_stream_free(s);
            return NULL;
        }
    }
    int rc = mn_load_finish(s);
    if (rc != MN_OK) {
        RedisModule_LogIOError(io, "warning", "rcp11: stream does not match its header (%d)", rc);
        mn_stream_free(s);
        return NULL;
    }
    if (rl_resv_rdb_load(io, s, encver) != REDISMODULE_OK) {
        mn_stream_free(s);
        return NULL;
    }
    rl_stream_loaded(s);
    return s;
}

/* Emit `command key offset` (RCP11.SKIPTO, TEVICT) into a rewritten AOF. */
static void rl_emit_offset(RedisModuleIO *aof, const char *command, RedisModuleString *key,
                           uint64_t offset) {
    char digits[24];
    int len = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)offset);
    RedisModule_EmitAOF(aof, command, "sb", key, digits, (size_t)len);
}

/* Rebuild the stream node by node (see PERSISTENCE): RCP11.NODE per node
 * (offsets, bytes, compression and append times as they are), TEVICT for an
 * evicted prefix of the first node, then the end: RCP11.SKIPTO for an
 * evicted tail, or, when the stream's clock is past its last node's newest
 * time (its newest messages were evicted), a message at the last offset,
 * appended at the clock and evicted again, so that the rebuilt stream's
 * clock is this one (a verbatim TWRITE after it appends at that clock).
 * Runs in the rewrite child: it allocates its own buffer. A node that
 * cannot be serialised ends the child (rl_cannot_save): the rewrite fails
 * and the previous AOF stays, never a stream rebuilt short with its end
 * written as if whole. */
void rl_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value) {
    mn_stream *s = value;
    uint64_t first = mn_first_offset(s), end = mn_next_offset(s);
    int64_t clock = mn_last_append_ms(s), nodes_last_ms = 0;
    const mn_node *node = mn_first_node(s);
    mn_node_info info;
    uint64_t nodes_start = 0, nodes_end = 0;
    if (node != NULL) {
        mn_node_get_info(node, &info);
        nodes_start = nodes_end = info.first;
    }
    mn_buf buf;
    mn_buf_init(&buf);
    for (; node != NULL; node = mn_node_next(node)) {
        mn_node_get_info(node, &info);
        buf.len = 0;
        int rc = mn_node_serialize(node, &buf);
        if (rc != MN_OK) {
            rl_cannot_save(aof, key, "a stream node for the AOF rewrite", rc);
            /* Only a rewrite in the server itself gets here (Redis 7.0
             * rewrites in a child): emit nothing more for this key, no
             * end that would make the stream look whole. */
            mn_buf_free(&buf);
            return;
        }
        RedisModule_EmitAOF(aof, "RCP11.NODE", "sb", key, buf.data, buf.len);
        nodes_end = info.first + info.count;
        nodes_last_ms = info.last_ms;
    }
    mn_buf_free(&buf);
    if (first > nodes_start && nodes_end > nodes_start)
        rl_emit_offset(aof, "TEVICT", key, first - 1);
    if (clock > nodes_last_ms && mn_length(s) == 0 && end > nodes_end) {
        if (end - 1 > nodes_end || nodes_end == 0) rl_emit_offset(aof, "RCP11.SKIPTO", key, end - 1);
        RedisModule_EmitAOF(aof, "RCP11.TWRITEAT", "slc", key, (long long)clock, "");
        rl_emit_offset(aof, "TEVICT", key, end - 1);
    } else if (end > nodes_end || nodes_end == 0) {
        rl_emit_offset(aof, "RCP11.SKIPTO", key, end);
    }
    rl_resv_aof_rewrite(aof, key, s);
}

/* DEBUG DIGEST and DEBUG DIGEST-VALUE: the logical content, so that a
 * replica and its primary digest equal whatever their node layouts, and
 * differ when a time was not kept. After the first readable and the last
 * offset, each item is three elements: a message is its length, its bytes
 * and its append time; or two: a run of null offsets (a gap left by
 * RCP11.SKIPTO, between nodes or after the last one) is -1 and the run's
 * length. A length is never -1, so no message reads as a gap; and a gap
 * costs two elements whatever its size (walking it offset by offset took
 * hours for a 2^40 gap, with the server stuck in DEBUG DIGEST). */
static void rl_digest_gap(RedisModuleDigest *md, uint64_t *gap) {
    if (*gap == 0) return;
    RedisModule_DigestAddLongLong(md, -1);
    RedisModule_DigestAddLongLong(md, (long long)*gap);
    *gap = 0;
}

void rl_digest(RedisModuleDigest *md, void *value) {
    mn_stream *s = value;
    rl_snap before;
    rl_snap_take(s, &before);
    uint64_t first = mn_first_offset(s), end = mn_next_offset(s);
    RedisModule_DigestAddLongLong(md, (long long)first);
    RedisModule_DigestAddLongLong(md, (long long)(end - 1));
    uint64_t pos = first; /* digested up to here */
    uint64_t gap = 0;     /* null offsets met and not digested yet */
    uint64_t batch = rl_read_batch(s);
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node)) {
        mn_node_info info;
        mn_node_get_info(node, &info);
        uint64_t from = info.first > pos ? info.first : pos, to = info.first + info.count;
        if (to <= from) continue; /* evicted */
        gap += from - pos;
        while (from < to) {
            uint64_t k = to - from < batch ? to - from : batch;
            rl_read_buf.len = 0;
            int rc = mn_read_copy(s, from, k, &rl_read_buf, rl_read_lens);
            if (rc == MN_OK) rc = mn_read_times(s, from, k, rl_read_times);
            if (rc != MN_OK) {
                /* The digest goes on without these messages: it then
                 * differs from a replica's, and the log says why. */
                RedisModule_Log(NULL, "warning",
                                "rcp11: DEBUG DIGEST cannot read offsets %llu..%llu (error %d): "
                                "the digest is incomplete",
                                (unsigned long long)from, (unsigned long long)(to - 1), rc);
                break;
            }
            const char *p = rl_read_buf.data;
            for (uint64_t i = 0; i < k; i++) {
                if (rl_read_lens[i] < 0) {
                    gap++;
                    continue;
                }
                rl_digest_gap(md, &gap);
                RedisModule_DigestAddLongLong(md, rl_read_lens[i]);
                RedisModule_DigestAddStringBuffer(md, p, (size_t)rl_read_lens[i]);
                RedisModule_DigestAddLongLong(md, (long long)rl_read_times[i]);
                p += rl_read_lens[i];
            }
            from += k;
        }
        pos = to;
    }
    gap += end > pos ? end - pos : 0;
    rl_digest_gap(md, &gap);
    RedisModule_DigestEndSequence(md);
    rl_account(s, &before);
    rl_release_scratch();
}

/* The database COPY copied a stream from, until its copy_to event (see
 * rl_on_keyspace_event); -1 when none is under way. */
int rl_copy_from_db = -1;

/* COPY: a deep copy through the serialized form, which is exact. */
void *rl_copy(RedisModuleKeyOptCtx *ctx, const void *value) {
    const RedisModuleString *fromkey = RedisModule_GetKeyNameFromOptCtx(ctx);
    const mn_stream *s = value;
    mn_buf b;
    mn_buf_init(&b);
    int err = MN_OK;
    mn_stream *copy = NULL;
    if (mn_serialize_header(s, &b) == MN_OK)
        copy = mn_load_header(b.data, b.len, rl_now_ms(), &err);
    for (const mn_node *node = mn_first_node(s); copy != NULL && node != NULL;
         node = mn_node_next(node)) {
        b.len = 0;
        if (mn_node_serialize(node, &b) != MN_OK || mn_load_node(copy, b.data, b.len) != MN_OK) {
            mn_stream_free(copy);
            copy = NULL;
        }
    }
    if (copy != NULL && mn_load_finish(copy) != MN_OK) {
        mn_stream_free(copy);
        copy = NULL;
    }
    mn_buf_free(&b);
    if (copy == NULL) {
        char name[RL_QUOTE_MAX * 3 + 1];
        size_t len;
        const char *p = RedisModule_StringPtrLen(fromkey, &len);
        rl_quote(p, len, RL_QUOTE_MAX, name, sizeof(name));
        RedisModule_Log(NULL, "warning", "rcp11: COPY of '%s' could not copy the stream", name);
        return NULL;
    }
    /* Only a copy that succeeded is followed by its copy_to event. */
    rl_copy_from_db = RedisModule_GetDbIdFromOptCtx(ctx);
    rl_stream_loaded(copy);
    return copy;
}

/* ------------------------------------------------------------------------
 * rcp11-grp: acknowledged groups
 * --------------------------------------------------------------------- */

/* One blob; saved empty (refused by ra_rdb_load) when the server itself
 * cannot serialise it, see A VALUE THAT CANNOT BE SAVED. */
void ra_rdb_save(RedisModuleIO *io, void *value) {
    mn_buf b;
    mn_buf_init(&b);
    int rc = ag_serialize(value, &b);
    if (rc != AG_OK) {
        rl_cannot_save(io, NULL, "an acknowledged group", rc);
        b.len = 0;
    }
    RedisModule_SaveStringBuffer(io, b.len ? b.data : "", b.len);
    mn_buf_free(&b);
}

void *ra_rdb_load(RedisModuleIO *io, int encver) {
    if (encver != RA_ENCVER) {
        RedisModule_LogIOError(io, "warning",
                               "rcp11: group encoding version %d is not %d (a newer module?)",
                               encver, RA_ENCVER);
        return NULL;
    }
    size_t len;
    char *blob = RedisModule_LoadStringBuffer(io, &len);
    if (RedisModule_IsIOError(io) || blob == NULL) return NULL;
    if (rl_unsaved(io, len, "an acknowledged group")) {
        RedisModule_Free(blob);
        return NULL;
    }
    int err;
    ag_group *g = ag_load(blob, len, &err);
    RedisModule_Free(blob);
    if (g == NULL) RedisModule_LogIOError(io, "warning", "rcp11: corrupt acknowledged group (%d)", err);
    return g;
}

/* RCP11.GROUP key <blob>. A group that cannot be serialised fails the
 * rewrite (rl_cannot_save) rather than leave the key out of it. */
void ra_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value) {
    mn_buf b;
    mn_buf_init(&b);
    int rc = ag_serialize(value, &b);
    if (rc != AG_OK)
        rl_cannot_save(aof, key, "an acknowledged group for the AOF rewrite", rc);
    else
        RedisModule_EmitAOF(aof, "RCP11.GROUP", "sb", key, b.data, b.len);
    mn_buf_free(&b);
}

/* DEBUG DIGEST: the group's blob, the same on a primary and its replicas. */
void ra_digest(RedisModuleDigest *md, void *value) {
    mn_buf b;
    mn_buf_init(&b);
    int rc = ag_serialize(value, &b);
    if (rc == AG_OK)
        RedisModule_DigestAddStringBuffer(md, b.data, b.len);
    else
        RedisModule_Log(NULL, "warning",
                        "rcp11: DEBUG DIGEST cannot serialize an acknowledged group (error %d): "
                        "the digest is incomplete",
                        rc);
    RedisModule_DigestEndSequence(md);
    mn_buf_free(&b);
}

void *ra_copy(RedisModuleKeyOptCtx *ctx, const void *value) {
    ag_group *copy = ag_copy(value);
    if (copy == NULL)
        RedisModule_Log(NULL, "warning", "rcp11: COPY could not copy an acknowledged group");
    else
        rl_copy_from_db = RedisModule_GetDbIdFromOptCtx(ctx);
    return copy;
}

