/* module_offsets_file.c -- the Redis module's offsets file: every stream's
 * reservation mark, durable before an offset below it is handed out
 * (module_reserve.c decides when; this file keeps them).
 *
 * THE FILE (rcp11.offsets-file, in Redis's `dir`)
 * ===============================================
 *
 *   header  "RCP11OFF" | u32 version 1 | u32 0                  16 bytes
 *   batch   u32 payload length | u32 crc32(payload) | payload   repeated
 *
 *   record in a payload (little-endian)
 *   kind 1 LIVE     u32 db | u32 key length | key | u64 mark
 *   kind 2 DELETED  u32 db | u32 key length | key     the live mark of the
 *                                                     key becomes a deleted mark
 *   kind 3 DELMARK  u32 db | u32 key length | key | u64 mark  (rewrites)
 *   kind 4 FLUSH    i32 db (-1: all)                 every live mark of db
 *                                                     becomes a deleted mark
 *   kind 5 CLEAN    u8 tight                         a clean shutdown; only
 *                                                     as the last record
 *   kind 6 SWAP     i32 db | i32 db                  SWAPDB: the two databases'
 *                                                     marks trade places
 *
 * Folding the records gives per key a live mark (a stream is there) and a
 * deleted mark (a stream was deleted there; should an older AOF bring it
 * back, it goes up to that mark). At start-up a live mark raises the stream
 * or, the key being empty, becomes the mark of a stream created there
 * later; a deleted mark only raises a stream the files brought back, so a
 * key deleted before a crash stays deleted and a new stream there starts
 * at 0. Deletions come from the data type's unlink2 callback (DEL, UNLINK,
 * expiry, eviction, overwrite, RENAME and MOVE sources, TCONCAT sources)
 * and the FLUSHDB event (SWAPDB moves marks along); they are written with
 * the next batch, not
 * fsynced: a lost one costs a gap, never a reuse. A torn last batch is
 * dropped and every mark raised by OF_TORN_MARGIN (a file damaged at its
 * end looks the same as one torn by a crash); damage before the last batch
 * fails the module's load with the reason, as a corrupt RDB does. The file
 * is rewritten from its fold at start-up and when it grows (temp file,
 * fsync, rename, fsync of the directory), and from the keyspace at a clean
 * SHUTDOWN. A lock keeps a second server off it: a POSIX record lock
 * (fcntl), which a fork does not pass on, so a BGSAVE or AOF rewrite child
 * left running by a kill -9 of its parent does not keep the restarted
 * server out (an flock, shared with the child, did). Such a lock goes
 * when the process closes any descriptor of the file: nothing here closes
 * one of the current file but a rewrite replacing it. If `dir` changes
 * (CONFIG SET dir), or the file is deleted or renamed away under the
 * server, it is written at its path again at the next write, or by the
 * hook within OF_CHECK_MS: the marks must be where a restart looks. A file
 * found there that another running server holds is never taken (writes
 * that need a reservation answer -MISCONF), and a stopped one's marks are
 * folded in as floors.
 *
 * Records wait in a buffer: a reservation writes the buffer at once (so a
 * full disk refuses it before anything happens) and the before-sleep hook
 * fsyncs it before replies are sent (of_sync); deletions are written with
 * the next batch and fsynced only along with a reservation.
 */

/* -std=c11 hides POSIX: ask for it (open flags, pread, ftruncate, fcntl). */
#define _GNU_SOURCE

#include "module_offsets_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------------------
 * Constants and state
 * --------------------------------------------------------------------- */

#define OF_OFFSET_END ((uint64_t)1 << 63)
/* How far every mark goes up when the file's last batch is cut short:
 * more than one reservation can move a mark (a command's entries, <= the
 * query buffer limit of 1 GB, plus the largest reservation step). */
#define OF_TORN_MARGIN ((uint64_t)1 << 30)
/* The file is rewritten from its fold once it grew by this much and by
 * more than its size after the last rewrite. */
#define OF_COMPACT_MIN_BYTES (1024 * 1024)
/* How often the before-sleep hook checks that the path still leads to the
 * file (a stat(2) of each). */
#define OF_CHECK_MS 100

#define OF_MAGIC "RCP11OFF"
#define OF_VERSION 1
#define OF_HEADER_BYTES 16
#define OF_BATCH_HEADER 8

enum { OF_LIVE = 1, OF_DELETED = 2, OF_DELMARK = 3, OF_FLUSH = 4, OF_CLEAN = 5, OF_SWAP = 6 };

static struct {
    int fd;
    char *path;
    dev_t dir_dev;
    ino_t dir_ino;
    unsigned char *buf; /* records not yet written */
    size_t len, cap;
    uint64_t size;      /* bytes in the file */
    uint64_t base_size; /* its size after the last rewrite */
    uint64_t fsyncs;
    /* Generations: every batch written (or rewrite) is one; `synced` says
     * up to which one the file is fsynced. A mark is durable once synced
     * reaches the generation it was written in (live_gen for the newest). */
    uint64_t written, live_gen, synced;
    int live_buffered;  /* a mark waits in the buffer */
    int received;       /* ... one from the primary: fsync before acks go */
    int failing;        /* the last write or fsync failed */
    char error[160];
    RedisModuleDict *fold; /* the file's marks, until the start-up recovery */
    int clean, tight;
    long long checked_ms; /* when of_sync last looked at the path */
    uint64_t rewrites;    /* files written whole (of_rewrite): a compaction
                           * that started before one is stale */
    /* The background fsync (of_thread_main): it fsyncs a duplicate of fd
     * up to `requested`; `lock` guards fd, written, synced, requested,
     * fsyncs and bg_errno against it. */
    pthread_t thread;
    int bg_fd;   /* the descriptor the thread fsyncs now, -1 */
    int retired; /* a replaced file's descriptor the thread closes, -1 */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    uint64_t requested;
    int bg_errno;
} of = {.fd = -1, .bg_fd = -1, .retired = -1, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* ------------------------------------------------------------------------
 * Keys of per-key tables
 * --------------------------------------------------------------------- */

char *of_key(int db, const char *name, size_t len, size_t *out_len) {
    char *k = RedisModule_Alloc(len + 4);
    uint32_t d = (uint32_t)db;
    k[0] = (char)(d & 0xff);
    k[1] = (char)((d >> 8) & 0xff);
    k[2] = (char)((d >> 16) & 0xff);
    k[3] = (char)((d >> 24) & 0xff);
    memcpy(k + 4, name, len);
    *out_len = len + 4;
    return k;
}

int of_key_db(const char *k) {
    const unsigned char *u = (const unsigned char *)k;
    return (int)((uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 |
                 (uint32_t)u[3] << 24);
}

void of_swap_keys(RedisModuleDict *d, int a, int b) {
    if (a == b) return;
    size_t count = 0, cap = 0;
    char **keys = NULL;
    size_t *lens = NULL;
    void **values = NULL;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(d, "^", NULL, 0);
    size_t klen;
    void *value;
    char *k;
    while ((k = RedisModule_DictNextC(it, &klen, &value)) != NULL) {
        int db = of_key_db(k);
        if (db != a && db != b) continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            keys = RedisModule_Realloc(keys, cap * sizeof(*keys));
            lens = RedisModule_Realloc(lens, cap * sizeof(*lens));
            values = RedisModule_Realloc(values, cap * sizeof(*values));
        }
        keys[count] = RedisModule_Alloc(klen);
        memcpy(keys[count], k, klen);
        lens[count] = klen;
        values[count++] = value;
    }
    RedisModule_DictIteratorStop(it);
    for (size_t i = 0; i < count; i++) RedisModule_DictDelC(d, keys[i], lens[i], NULL);
    for (size_t i = 0; i < count; i++) {
        size_t nlen;
        int db = of_key_db(keys[i]) == a ? b : a;
        char *moved = of_key(db, keys[i] + 4, lens[i] - 4, &nlen);
        RedisModule_DictSetC(d, moved, nlen, values[i]);
        RedisModule_Free(moved);
        RedisModule_Free(keys[i]);
    }
    RedisModule_Free(keys);
    RedisModule_Free(lens);
    RedisModule_Free(values);
}

static uint64_t of_max(uint64_t a, uint64_t b) { return a > b ? a : b; }

static uint64_t of_add_sat(uint64_t a, uint64_t b) {
    return b >= OF_OFFSET_END - a ? OF_OFFSET_END : a + b;
}

/* ------------------------------------------------------------------------
 * The offsets file: encoding
 * --------------------------------------------------------------------- */

static void of_put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void of_put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t of_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t of_get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A growing byte buffer: the pending records (of.buf), or the records a
 * compaction encodes on its own thread. */
typedef struct of_bytes {
    unsigned char *data;
    size_t len, cap;
} of_bytes;

static void of_bytes_reserve(of_bytes *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    b->data = RedisModule_Realloc(b->data, cap);
    b->cap = cap;
}

/* Append one record to b. */
static void of_put_record(of_bytes *b, int kind, int db, const char *key, size_t klen,
                          uint64_t mark) {
    of_bytes_reserve(b, 1 + 4 + 4 + klen + 8);
    unsigned char *p = b->data + b->len;
    *p++ = (unsigned char)kind;
    if (kind == OF_FLUSH) {
        of_put32(p, (uint32_t)db);
        b->len += 5;
        return;
    }
    if (kind == OF_SWAP) {
        of_put32(p, (uint32_t)db);
        of_put32(p + 4, (uint32_t)mark);
        b->len += 9;
        return;
    }
    if (kind == OF_CLEAN) {
        *p = (unsigned char)mark;
        b->len += 2;
        return;
    }
    of_put32(p, (uint32_t)db);
    of_put32(p + 4, (uint32_t)klen);
    memcpy(p + 8, key, klen);
    p += 8 + klen;
    size_t n = 1 + 8 + klen;
    if (kind != OF_DELETED) {
        of_put64(p, mark);
        n += 8;
    }
    b->len += n;
}

static void of_buf_reserve(size_t more) {
    of_bytes b = {of.buf, of.len, of.cap};
    of_bytes_reserve(&b, more);
    of.buf = b.data;
    of.cap = b.cap;
}

/* Append one record to the pending buffer. */
static void of_record(int kind, int db, const char *key, size_t klen, uint64_t mark) {
    of_bytes b = {of.buf, of.len, of.cap};
    of_put_record(&b, kind, db, key, klen, mark);
    of.buf = b.data;
    of.len = b.len;
    of.cap = b.cap;
    if (kind == OF_LIVE) of.live_buffered = 1;
}

static int of_write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A whole file image from a buffer of records: header and one batch. */
static unsigned char *of_image(const unsigned char *records, size_t len, size_t *out_len) {
    unsigned char *img = RedisModule_Alloc(OF_HEADER_BYTES + OF_BATCH_HEADER + len);
    memcpy(img, OF_MAGIC, 8);
    of_put32(img + 8, OF_VERSION);
    of_put32(img + 12, 0);
    size_t n = OF_HEADER_BYTES;
    if (len > 0) {
        of_put32(img + n, (uint32_t)len);
        of_put32(img + n + 4, (uint32_t)crc32(0L, records, (uInt)len));
        memcpy(img + n + OF_BATCH_HEADER, records, len);
        n += OF_BATCH_HEADER + len;
    }
    *out_len = n;
    return img;
}

/* ------------------------------------------------------------------------
 * The offsets file: folding its records into marks
 * --------------------------------------------------------------------- */

static of_marks *of_fold_get(RedisModuleDict *fold, int db, const char *key, size_t klen) {
    size_t dlen;
    char *k = of_key(db, key, klen, &dlen);
    int nokey;
    of_marks *m = RedisModule_DictGetC(fold, k, dlen, &nokey);
    if (nokey || m == NULL) {
        m = RedisModule_Calloc(1, sizeof(*m));
        RedisModule_DictSetC(fold, k, dlen, m);
    }
    RedisModule_Free(k);
    return m;
}

static void of_marks_delete(of_marks *m) {
    if (!m->has_live) return;
    m->deleted = m->has_deleted ? of_max(m->deleted, m->live) : m->live;
    m->has_deleted = 1;
    m->has_live = 0;
}

void of_fold_free(RedisModuleDict *fold) {
    if (fold == NULL) return;
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(fold, "^", NULL, 0);
    void *value;
    while (RedisModule_DictNextC(it, NULL, &value) != NULL) RedisModule_Free(value);
    RedisModule_DictIteratorStop(it);
    RedisModule_FreeDict(NULL, fold);
}

/* Apply one batch's records. Returns 0, or -1 when a record runs past the
 * batch (a batch whose CRC matched: damage, not a tear). */
static int of_fold_batch(RedisModuleDict *fold, const unsigned char *p, size_t len, int *clean,
                         int *tight) {
    size_t i = 0;
    while (i < len) {
        int kind = p[i++];
        *clean = 0;
        if (kind == OF_FLUSH) {
            if (len - i < 4) return -1;
            int db = (int)of_get32(p + i);
            i += 4;
            RedisModuleDictIter *it = RedisModule_DictIteratorStartC(fold, "^", NULL, 0);
            char *k;
            void *value;
            while ((k = RedisModule_DictNextC(it, NULL, &value)) != NULL)
                if (db == -1 || of_key_db(k) == db) of_marks_delete(value);
            RedisModule_DictIteratorStop(it);
            continue;
        }
        if (kind == OF_SWAP) {
            if (len - i < 8) return -1;
            int a = (int)of_get32(p + i), b = (int)of_get32(p + i + 4);
            i += 8;
            of_swap_keys(fold, a, b);
            continue;
        }
        if (kind == OF_CLEAN) {
            if (len - i < 1) return -1;
            *clean = 1;
            *tight = p[i++] != 0;
            continue;
        }
        if (kind != OF_LIVE && kind != OF_DELETED && kind != OF_DELMARK) return -1;
        if (len - i < 8) return -1;
        int db = (int)of_get32(p + i);
        uint32_t klen = of_get32(p + i + 4);
        i += 8;
        if (len - i < klen) return -1;
        const char *key = (const char *)p + i;
        i += klen;
        of_marks *m = of_fold_get(fold, db, key, klen);
        if (kind == OF_DELETED) {
            of_marks_delete(m);
            continue;
        }
        if (len - i < 8) return -1;
        uint64_t mark = of_get64(p + i);
        i += 8;
        if (kind == OF_LIVE) {
            m->live = m->has_live ? of_max(m->live, mark) : mark;
            m->has_live = 1;
        } else {
            m->deleted = m->has_deleted ? of_max(m->deleted, mark) : mark;
            m->has_deleted = 1;
        }
    }
    return 0;
}

/* Fold a whole file image. Returns the marks (and *clean, *tight, *torn),
 * or NULL with the reason in err: a bad header, or damage before the last
 * batch. A last batch cut short or failing its CRC is dropped and every
 * mark raised by OF_TORN_MARGIN. */
static RedisModuleDict *of_fold_image(const unsigned char *data, size_t len, int *clean,
                                      int *tight, int *torn, char *err, size_t errlen) {
    *clean = *tight = *torn = 0;
    if (len < OF_HEADER_BYTES || memcmp(data, OF_MAGIC, 8) != 0) {
        snprintf(err, errlen, "not an rcp11 offsets file (bad header)");
        return NULL;
    }
    if (of_get32(data + 8) != OF_VERSION) {
        snprintf(err, errlen, "offsets file version %u is not %d (a newer module?)",
                 of_get32(data + 8), OF_VERSION);
        return NULL;
    }
    RedisModuleDict *fold = RedisModule_CreateDict(NULL);
    size_t at = OF_HEADER_BYTES;
    while (at < len) {
        size_t left = len - at;
        int last_ok = 1;
        uint32_t plen = 0;
        if (left < OF_BATCH_HEADER) {
            last_ok = 0;
        } else {
            plen = of_get32(data + at);
            if ((uint64_t)plen > left - OF_BATCH_HEADER) last_ok = 0;
            else if (of_get32(data + at + 4) !=
                     (uint32_t)crc32(0L, data + at + OF_BATCH_HEADER, (uInt)plen))
                last_ok = -1;
        }
        if (last_ok != 1) {
            /* The batch is cut short or damaged: fine only as the last one. */
            size_t end = last_ok == 0 ? len : at + OF_BATCH_HEADER + plen;
            if (end < len) {
                snprintf(err, errlen, "damaged batch at byte %zu, with more after it", at);
                of_fold_free(fold);
                return NULL;
            }
            *torn = 1;
            break;
        }
        if (of_fold_batch(fold, data + at + OF_BATCH_HEADER, plen, clean, tight) != 0) {
            snprintf(err, errlen, "malformed record in the batch at byte %zu", at);
            of_fold_free(fold);
            return NULL;
        }
        at += OF_BATCH_HEADER + plen;
    }
    if (*torn) {
        *clean = 0;
        RedisModuleDictIter *it = RedisModule_DictIteratorStartC(fold, "^", NULL, 0);
        void *value;
        while (RedisModule_DictNextC(it, NULL, &value) != NULL) {
            of_marks *m = value;
            if (m->has_live) m->live = of_add_sat(m->live, OF_TORN_MARGIN);
            if (m->has_deleted) m->deleted = of_add_sat(m->deleted, OF_TORN_MARGIN);
        }
        RedisModule_DictIteratorStop(it);
    }
    return fold;
}

/* The records that rebuild a fold: LIVE and DELMARK per key, into out. */
static void of_fold_records(RedisModuleDict *fold, of_bytes *out);

/* The same into the pending buffer. */
static void of_fold_pending(RedisModuleDict *fold) {
    of_bytes b = {of.buf, of.len, of.cap};
    of_fold_records(fold, &b);
    of.buf = b.data;
    of.len = b.len;
    of.cap = b.cap;
}

void of_fold_each(RedisModuleDict *fold, of_fold_fn *fn, void *arg) {
    RedisModuleDictIter *it = RedisModule_DictIteratorStartC(fold, "^", NULL, 0);
    size_t klen;
    void *value;
    char *k;
    while ((k = RedisModule_DictNextC(it, &klen, &value)) != NULL)
        fn(arg, of_key_db(k), k + 4, klen - 4, value);
    RedisModule_DictIteratorStop(it);
}

static void of_put_marks(void *arg, int db, const char *name, size_t len, of_marks *m) {
    of_bytes *out = arg;
    if (m->has_deleted) of_put_record(out, OF_DELMARK, db, name, len, m->deleted);
    if (m->has_live) of_put_record(out, OF_LIVE, db, name, len, m->live);
}

static void of_fold_records(RedisModuleDict *fold, of_bytes *out) {
    of_fold_each(fold, of_put_marks, out);
}

/* ------------------------------------------------------------------------
 * The offsets file: opening, writing, syncing, rewriting
 * --------------------------------------------------------------------- */

static int of_fsync_dir(void) {
    int fd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static void of_remember_dir(void) {
    struct stat st;
    if (stat(".", &st) == 0) {
        of.dir_dev = st.st_dev;
        of.dir_ino = st.st_ino;
    }
}

/* Lock (type F_WRLCK) or test for another process's lock (F_RDLCK, which
 * a writer's lock conflicts with): 0 when free. */
static int of_lock(int fd, short type) {
    struct flock lk;
    memset(&lk, 0, sizeof(lk));
    lk.l_type = type;
    lk.l_whence = SEEK_SET;
    if (type == F_WRLCK) return fcntl(fd, F_SETLK, &lk);
    if (fcntl(fd, F_GETLK, &lk) != 0) return -1;
    return lk.l_type == F_UNLCK ? 0 : -1;
}

/* Open (creating) the file and lock it. Returns the fd or -1 (err set). */
static int of_open_locked(char *err, size_t errlen) {
    int fd = open(of.path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", of.path, strerror(errno));
        return -1;
    }
    if (of_lock(fd, F_WRLCK) != 0) {
        snprintf(err, errlen, "%s is in use by another server (one file per server: give each "
                              "its own dir or rcp11.offsets-file)", of.path);
        close(fd);
        return -1;
    }
    return fd;
}

/* Read what the fd holds from byte 0. */
static unsigned char *of_read_fd(int fd, size_t *len) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    size_t n = (size_t)st.st_size;
    unsigned char *data = RedisModule_Alloc(n ? n : 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, data + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            RedisModule_Free(data);
            return NULL;
        }
        got += (size_t)r;
    }
    *len = n;
    return data;
}

/* A new file was renamed into place, fsynced whole: open and lock it in
 * place of the old one (which the fsync thread closes if it is on it).
 * of.fd is -1 when it cannot be opened (err set). */
static void of_reopen(char *err, size_t errlen) {
    pthread_mutex_lock(&of.lock);
    if (of.fd >= 0 && of.fd == of.bg_fd) {
        if (of.retired >= 0) close(of.retired);
        of.retired = of.fd;
    } else if (of.fd >= 0) {
        close(of.fd);
    }
    of.fd = of_open_locked(err, errlen);
    of.written++;
    of.synced = of.live_gen = of.written;
    pthread_mutex_unlock(&of.lock);
}

/* Replace the file by a header and the pending buffer (which is consumed):
 * temp file, fsync, rename, fsync of the directory, then the new file is
 * opened and locked. Returns 0 or -1 (err set, the old file kept). */
static int of_rewrite(char *err, size_t errlen) {
    size_t img_len;
    unsigned char *img = of_image(of.buf, of.len, &img_len);
    size_t tlen = strlen(of.path) + 16;
    char *tmp = RedisModule_Alloc(tlen);
    snprintf(tmp, tlen, "%s.tmp", of.path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int ok = fd >= 0 && of_write_all(fd, img, img_len) == 0 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    ok = ok && rename(tmp, of.path) == 0 && of_fsync_dir() == 0;
    if (!ok) {
        snprintf(err, errlen, "cannot rewrite %s: %s", of.path, strerror(errno));
        unlink(tmp);
        RedisModule_Free(tmp);
        RedisModule_Free(img);
        return -1;
    }
    RedisModule_Free(tmp);
    RedisModule_Free(img);
    of_reopen(err, errlen);
    of.rewrites++;
    if (of.fd < 0) return -1;
    of.size = of.base_size = img_len;
    of.len = 0;
    of.live_buffered = 0;
    of_remember_dir();
    return 0;
}

static void of_log(const char *what) {
    RedisModuleCtx *none = NULL;
    RedisModule_Log(none, "warning", "rcp11: %s", what);
}

/* Fold the file as it is plus the pending records, and rewrite it from
 * that (compaction, or a move to a new `dir`). The old file is read
 * through its fd, so this works after `dir` changed. */
/* A foreign file's marks into *into (arg): the higher of each pair. */
static void of_merge_marks(void *arg, int db, const char *name, size_t len, of_marks *m) {
    of_marks *mine = of_fold_get(arg, db, name, len);
    if (m->has_live) mine->live = mine->has_live ? of_max(mine->live, m->live) : m->live;
    if (m->has_deleted)
        mine->deleted = mine->has_deleted ? of_max(mine->deleted, m->deleted) : m->deleted;
    mine->has_live |= m->has_live;
    mine->has_deleted |= m->has_deleted;
}

/* Another file at the path than this server's (its dir changed to one
 * that holds a file): never one a running server holds (its lock), and a
 * stopped server's marks are kept, folded into *into as floors. Returns
 * 0, or -1 with the reason logged. */
static int of_fold_foreign(RedisModuleDict *into) {
    /* Compared before it is opened: closing a descriptor of this server's
     * own file would drop its lock. */
    struct stat st, own;
    if (stat(of.path, &st) != 0) return 0; /* none */
    if (of.fd >= 0 && fstat(of.fd, &own) == 0 && st.st_dev == own.st_dev &&
        st.st_ino == own.st_ino)
        return 0;
    int fd = open(of.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char err[PATH_MAX + 200];
    if (of_lock(fd, F_RDLCK) != 0) {
        snprintf(err, sizeof(err),
                 "%s is in use by another server (one file per server: give each its own dir or "
                 "rcp11.offsets-file)", of.path);
        of_log(err);
        close(fd);
        errno = EBUSY;
        return -1;
    }
    size_t len = 0;
    unsigned char *data = of_read_fd(fd, &len);
    close(fd);
    if (data == NULL) return -1;
    int clean, tight, torn;
    RedisModuleDict *fold = len ? of_fold_image(data, len, &clean, &tight, &torn, err, sizeof(err))
                                : RedisModule_CreateDict(NULL);
    RedisModule_Free(data);
    if (fold == NULL) {
        snprintf(err + strlen(err), sizeof(err) - strlen(err),
                 " (%s, found in place of this server's: not overwritten)", of.path);
        of_log(err);
        errno = EINVAL;
        return -1;
    }
    of_fold_each(fold, of_merge_marks, into);
    of_fold_free(fold);
    return 0;
}

static int of_compact(void) {
    char err[200];
    size_t len = 0;
    unsigned char *data = of.fd >= 0 ? of_read_fd(of.fd, &len) : NULL;
    if (data == NULL) return -1;
    /* The pending records belong after the file's: append them as a batch
     * of the image before folding. */
    size_t total = len + (of.len ? OF_BATCH_HEADER + of.len : 0);
    data = RedisModule_Realloc(data, total ? total : 1);
    if (of.len) {
        of_put32(data + len, (uint32_t)of.len);
        of_put32(data + len + 4, (uint32_t)crc32(0L, of.buf, (uInt)of.len));
        memcpy(data + len + OF_BATCH_HEADER, of.buf, of.len);
    }
    int clean, tight, torn;
    RedisModuleDict *fold = of_fold_image(data, total, &clean, &tight, &torn, err, sizeof(err));
    RedisModule_Free(data);
    if (fold == NULL) {
        of_log(err);
        return -1;
    }
    if (of_fold_foreign(fold) != 0) {
        int saved_errno = errno;
        of_fold_free(fold);
        errno = saved_errno;
        return -1;
    }
    size_t saved = of.len;
    int saved_live = of.live_buffered;
    unsigned char *saved_buf = RedisModule_Alloc(saved ? saved : 1);
    memcpy(saved_buf, of.buf, saved);
    of.len = 0;
    of_fold_pending(fold);
    of_fold_free(fold);
    int rc = of_rewrite(err, sizeof(err));
    if (rc != 0) {
        /* Keep the pending records for the old file. */
        of.len = 0;
        of_buf_reserve(saved);
        memcpy(of.buf, saved_buf, saved);
        of.len = saved;
        of.live_buffered = saved_live;
        of_log(err);
    }
    RedisModule_Free(saved_buf);
    return rc;
}

/* Whether the file's path no longer leads to the file this server
 * writes: `dir` moved (CONFIG SET dir), or the file was deleted or
 * replaced under it (an operator's rm or mv). Its marks would then be in
 * a file nobody finds after a crash: the caller writes them to the path
 * again. */
static int of_file_moved(void) {
    struct stat st, own;
    if (stat(".", &st) == 0 && (st.st_dev != of.dir_dev || st.st_ino != of.dir_ino)) return 1;
    if (of.fd < 0 || fstat(of.fd, &own) != 0) return 0;
    if (stat(of.path, &st) != 0) return errno == ENOENT;
    return st.st_dev != own.st_dev || st.st_ino != own.st_ino;
}

/* The path leads elsewhere (of_file_moved): write the file there again
 * from what this server's file holds and the pending records. */
static int of_follow_path(void) {
    char msg[PATH_MAX + 128];
    snprintf(msg, sizeof(msg),
             "offsets file %s was deleted, replaced or its dir changed: writing it there again",
             of.path);
    of_log(msg);
    return of_compact() == 0 ? 0 : -1;
}

/* Write the pending records as one batch. 0, or -1 with errno. */
static int of_write(void) {
    if (of.len == 0) return 0;
    if (of_file_moved()) return of_follow_path(); /* writes them too */
    size_t n = OF_BATCH_HEADER + of.len;
    unsigned char *batch = RedisModule_Alloc(n);
    of_put32(batch, (uint32_t)of.len);
    of_put32(batch + 4, (uint32_t)crc32(0L, of.buf, (uInt)of.len));
    memcpy(batch + OF_BATCH_HEADER, of.buf, of.len);
    int rc = of_write_all(of.fd, batch, n);
    int saved_errno = errno;
    RedisModule_Free(batch);
    if (rc != 0) {
        /* A partial batch would read as a torn end and hide later ones. */
        if (ftruncate(of.fd, (off_t)of.size) != 0) { /* nothing more to do */
        }
        errno = saved_errno;
        return -1;
    }
    of.size += n;
    of.len = 0;
    pthread_mutex_lock(&of.lock);
    of.written++;
    if (of.live_buffered) of.live_gen = of.written;
    pthread_mutex_unlock(&of.lock);
    of.live_buffered = 0;
    return 0;
}

uint64_t of_synced(void) {
    pthread_mutex_lock(&of.lock);
    uint64_t synced = of.synced;
    pthread_mutex_unlock(&of.lock);
    return synced;
}

uint64_t of_live_gen(void) { return of.live_gen; }

int of_pending(void) { return of.live_buffered || of.live_gen > of_synced(); }

/* fsync on this thread, now, when a mark waits for it (deletion records
 * are written but not fsynced for their own sake: losing one costs a gap,
 * not a reuse). */
int of_fsync(void) {
    if (!of_pending()) return 0;
    if (of_write() != 0) return -1;
    pthread_mutex_lock(&of.lock);
    uint64_t gen = of.written;
    pthread_mutex_unlock(&of.lock);
    if (fsync(of.fd) != 0) return -1;
    pthread_mutex_lock(&of.lock);
    if (gen > of.synced) of.synced = gen;
    of.fsyncs++;
    pthread_mutex_unlock(&of.lock);
    of.received = 0;
    return 0;
}

/* Run on the main thread after a background fsync: nothing to do but be
 * an event, after which the before-sleep hook looks at what is durable. */
static void of_synced_wakeup(void *user_data) { (void)user_data; }

/* The background fsync: fsyncs the file's descriptor up to the
 * generation asked for, so that marks made ahead of need are made durable
 * without stopping the event loop (a rewrite meanwhile leaves the
 * descriptor it works on open for it: bg_fd, retired; no duplicate is
 * made, whose close would drop the file's lock). When done it
 * wakes the event loop (EventLoopAddOneShot is the one module call other
 * threads may make), so that what waited for it goes on. */
static void *of_thread_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&of.lock);
    for (;;) {
        while (of.requested <= of.synced) pthread_cond_wait(&of.wake, &of.lock);
        int fd = of.fd;
        of.bg_fd = fd;
        uint64_t gen = of.written;
        pthread_mutex_unlock(&of.lock);
        int rc = fd >= 0 ? fsync(fd) : -1;
        int err = errno;
        pthread_mutex_lock(&of.lock);
        of.bg_fd = -1;
        if (fd >= 0 && of.retired == fd) {
            close(fd);
            of.retired = -1;
        }
        if (rc == 0) {
            if (gen > of.synced) of.synced = gen;
            of.fsyncs++;
        } else {
            of.bg_errno = err ? err : EIO;
            of.requested = of.synced; /* asked again by the next hook */
        }
        pthread_mutex_unlock(&of.lock);
        RedisModule_EventLoopAddOneShot(of_synced_wakeup, NULL);
        pthread_mutex_lock(&of.lock);
    }
    return NULL;
}

static void of_failed(const char *what) {
    snprintf(of.error, sizeof(of.error), "%s %s: %s", what, of.path,
             strerror(errno));
    if (!of.failing) of_log(of.error);
    of.failing = 1;
}

int of_reserve(int db, const char *k, size_t klen, uint64_t mark) {
    size_t before = of.len;
    of_record(OF_LIVE, db, k, klen, mark);
    if (of_write() != 0) {
        of.len = before;
        of.live_buffered = 0;
        of_failed("cannot write");
        return -1;
    }
    of.failing = 0;
    return 0;
}

/* ------------------------------------------------------------------------
 * Compaction off the event loop
 *
 * Folding and writing a large file stops a server for a long time (156 ms
 * for 6 MB, 190,000 keys), so of_sync hands it to a thread of its own: the
 * main thread reads the file (a copy from the page cache) and starts the
 * job; the thread folds it and writes and fsyncs `<path>.compact` beside
 * it; the main thread then appends what it wrote to the file meanwhile
 * (whole batches), fsyncs that, and renames the temporary file over the
 * file. A job that finds the file rewritten meanwhile (of.rewrites: a
 * clean shutdown, a moved dir) or the dir changed is dropped; a failed one
 * is tried again after OF_COMPACT_RETRY_MS.
 * --------------------------------------------------------------------- */

#define OF_COMPACT_SUFFIX ".compact"
#define OF_COMPACT_RETRY_MS 10000

static struct {
    int running;         /* a job is out (main thread) */
    int dirfd;           /* its dir */
    char *tmp;           /* its temporary file, relative to dirfd */
    uint64_t rewrites;   /* of.rewrites when it started */
    unsigned char *data; /* the file as it was: the thread frees it */
    size_t len;
    long long retry_ms;  /* not before then after a failure */
    /* under of.lock: */
    int done;
    int err;             /* errno of a failure, 0 */
    size_t out_len;      /* bytes the thread wrote */
    uint64_t installed;  /* INFO */
} oc = {.dirfd = -1};

static void *of_compact_main(void *arg) {
    (void)arg;
    char err[200];
    int clean, tight, torn, rc = -1, saved_errno = EINVAL;
    size_t out_len = 0;
    RedisModuleDict *fold = of_fold_image(oc.data, oc.len, &clean, &tight, &torn, err,
                                          sizeof(err));
    RedisModule_Free(oc.data);
    oc.data = NULL;
    if (fold != NULL) {
        of_bytes records = {NULL, 0, 0};
        of_fold_records(fold, &records);
        of_fold_free(fold);
        unsigned char *img = of_image(records.data, records.len, &out_len);
        RedisModule_Free(records.data);
        int fd = openat(oc.dirfd, oc.tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        rc = fd >= 0 && of_write_all(fd, img, out_len) == 0 && fsync(fd) == 0 ? 0 : -1;
        saved_errno = errno;
        if (fd >= 0) close(fd); /* another file than the locked one */
        RedisModule_Free(img);
    }
    pthread_mutex_lock(&of.lock);
    oc.done = 1;
    oc.err = rc == 0 ? 0 : (saved_errno ? saved_errno : EIO);
    oc.out_len = out_len;
    pthread_mutex_unlock(&of.lock);
    RedisModule_EventLoopAddOneShot(of_synced_wakeup, NULL);
    return NULL;
}

/* Start a job: the file is written (of_write) and its path is its own. */
static void of_compact_start(void) {
    size_t len = 0;
    unsigned char *data = of_read_fd(of.fd, &len);
    if (data == NULL) return;
    int dirfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        RedisModule_Free(data);
        return;
    }
    size_t tlen = strlen(of.path) + sizeof(OF_COMPACT_SUFFIX);
    oc.tmp = RedisModule_Alloc(tlen);
    snprintf(oc.tmp, tlen, "%s" OF_COMPACT_SUFFIX, of.path);
    oc.dirfd = dirfd;
    oc.data = data;
    oc.len = len;
    oc.rewrites = of.rewrites;
    oc.done = 0;
    oc.running = 1;
    pthread_t thread;
    if (pthread_create(&thread, NULL, of_compact_main, NULL) != 0) {
        RedisModule_Free(oc.data);
        oc.data = NULL;
        RedisModule_Free(oc.tmp);
        oc.tmp = NULL;
        close(oc.dirfd);
        oc.dirfd = -1;
        oc.running = 0;
        of_compact(); /* on this thread, then */
        return;
    }
    pthread_detach(thread);
}

/* Put a finished job's file in place: the file's newer batches appended,
 * fsynced, renamed over the file. Returns 0, or -1 with errno. */
static int of_compact_install(void) {
    size_t tail = (size_t)(of.size - oc.len);
    unsigned char *data = NULL;
    if (tail > 0) {
        data = RedisModule_Alloc(tail);
        for (size_t got = 0; got < tail;) {
            ssize_t r = pread(of.fd, data + got, tail - got, (off_t)(oc.len + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                RedisModule_Free(data);
                if (r == 0) errno = EIO;
                return -1;
            }
            got += (size_t)r;
        }
    }
    int fd = openat(oc.dirfd, oc.tmp, O_WRONLY | O_APPEND | O_CLOEXEC);
    int ok = fd >= 0 && (tail == 0 || of_write_all(fd, data, tail) == 0) && fsync(fd) == 0;
    int saved_errno = errno;
    if (fd >= 0) close(fd);
    RedisModule_Free(data);
    if (!ok || rename(oc.tmp, of.path) != 0 || of_fsync_dir() != 0) {
        if (ok) saved_errno = errno;
        errno = saved_errno;
        return -1;
    }
    char err[200];
    of_reopen(err, sizeof(err));
    if (of.fd < 0) {
        of_log(err);
        errno = EIO;
        return -1;
    }
    of.size = of.base_size = oc.out_len + tail;
    oc.installed++;
    return 0;
}

/* A job that is done: install it, or drop it (stale, failed). */
static void of_compact_finish(void) {
    pthread_mutex_lock(&of.lock);
    int done = oc.done, err = oc.err;
    pthread_mutex_unlock(&of.lock);
    if (!done) return;
    oc.running = 0;
    int installed = 0;
    if (err == 0 && oc.rewrites == of.rewrites && !of_file_moved()) {
        if (of_compact_install() == 0) installed = 1;
        else err = errno;
    }
    if (!installed) {
        unlinkat(oc.dirfd, oc.tmp, 0);
        if (err != 0) {
            char msg[PATH_MAX + 100];
            snprintf(msg, sizeof(msg), "cannot compact the offsets file %s: %s (tried again later)",
                     of.path, strerror(err));
            of_log(msg);
            oc.retry_ms = RedisModule_Milliseconds() + OF_COMPACT_RETRY_MS;
        }
    }
    close(oc.dirfd);
    oc.dirfd = -1;
    RedisModule_Free(oc.tmp);
    oc.tmp = NULL;
}

void of_sync(int urgent) {
    if (of.fd < 0) return;
    uint64_t synced_before = of.synced;
    int bg_errno = 0;
    pthread_mutex_lock(&of.lock);
    bg_errno = of.bg_errno;
    of.bg_errno = 0;
    synced_before = of.synced;
    pthread_mutex_unlock(&of.lock);
    if (bg_errno != 0) {
        errno = bg_errno;
        of_failed("cannot fsync");
    }
    if (of_write() != 0) {
        of_failed("cannot write");
    } else if (urgent || of.received) {
        /* Replies (or a replica's acknowledgement) leave after this hook:
         * fsync here. */
        if (of_fsync() != 0) of_failed("cannot fsync");
        else of.failing = 0;
    } else if (of_pending()) {
        pthread_mutex_lock(&of.lock);
        if (of.requested < of.written) {
            of.requested = of.written;
            pthread_cond_signal(&of.wake);
        }
        pthread_mutex_unlock(&of.lock);
    } else if (bg_errno == 0 && of_synced() > synced_before) {
        of.failing = 0;
    }
    if (of.failing && urgent) {
        RedisModule_Log(NULL, "warning",
                        "rcp11: %s, and offsets reserved in it are about to be sent to clients: "
                        "exiting so that no offset is ever handed out twice",
                        of.error);
        exit(1);
    }
    if (oc.running) of_compact_finish();
    uint64_t grown = of.size - of.base_size;
    if (!oc.running && !of.failing && of.len == 0 && grown > OF_COMPACT_MIN_BYTES &&
        grown > of.base_size && RedisModule_Milliseconds() >= oc.retry_ms && !of_file_moved())
        of_compact_start();
    /* A file deleted or replaced under a server that reserves nothing new
     * for a while is noticed here too, within OF_CHECK_MS. */
    long long now = RedisModule_Milliseconds();
    if (now - of.checked_ms >= OF_CHECK_MS) {
        of.checked_ms = now;
        if (of_file_moved() && of_follow_path() != 0) of_failed("cannot rewrite");
    }
}

/* The background fsync thread, started once the file is open. */
static int of_start_thread(RedisModuleCtx *ctx) {
    int rc = pthread_create(&of.thread, NULL, of_thread_main, NULL);
    if (rc != 0) {
        RedisModule_Log(ctx, "warning", "rcp11: cannot start the offsets file's fsync thread: %s",
                        strerror(rc));
        return REDISMODULE_ERR;
    }
    pthread_detach(of.thread);
    return REDISMODULE_OK;
}

int of_open(RedisModuleCtx *ctx, const char *path) {
    size_t plen = strlen(path);
    of.path = RedisModule_Alloc(plen + 1);
    memcpy(of.path, path, plen + 1);
    char err[256];
    of.fd = of_open_locked(err, sizeof(err));
    if (of.fd < 0) {
        RedisModule_Log(ctx, "warning", "rcp11: %s", err);
        return REDISMODULE_ERR;
    }
    of_remember_dir();
    /* A compaction's file left by a crash or a shutdown during one. */
    char *leftover = RedisModule_Alloc(plen + sizeof(OF_COMPACT_SUFFIX));
    snprintf(leftover, plen + sizeof(OF_COMPACT_SUFFIX), "%s" OF_COMPACT_SUFFIX, path);
    unlink(leftover);
    RedisModule_Free(leftover);
    size_t len = 0;
    unsigned char *data = of_read_fd(of.fd, &len);
    if (data == NULL) {
        RedisModule_Log(ctx, "warning", "rcp11: cannot read %s: %s", of.path,
                        strerror(errno));
        return REDISMODULE_ERR;
    }
    if (len == 0) {
        /* A new file: write its header (the rewrite fsyncs it and the
         * directory). */
        RedisModule_Free(data);
        of.fold = RedisModule_CreateDict(NULL);
        if (of_rewrite(err, sizeof(err)) != 0) {
            RedisModule_Log(ctx, "warning", "rcp11: %s", err);
            return REDISMODULE_ERR;
        }
        return of_start_thread(ctx);
    }
    int torn;
    of.fold = of_fold_image(data, len, &of.clean, &of.tight, &torn, err,
                                 sizeof(err));
    RedisModule_Free(data);
    if (of.fold == NULL) {
        RedisModule_Log(ctx, "warning",
                        "rcp11: offsets file %s: %s. Refusing to start: without it offsets "
                        "could be handed out twice. Move the file away to start anyway (the "
                        "marks saved in the RDB/AOF are used then).",
                        of.path, err);
        return REDISMODULE_ERR;
    }
    if (torn)
        RedisModule_Log(ctx, "warning",
                        "rcp11: offsets file %s: the last batch is cut short; every "
                        "reservation is raised by %llu so that no offset it may have covered "
                        "is handed out again",
                        of.path, (unsigned long long)OF_TORN_MARGIN);
    of.size = of.base_size = len;
    return of_start_thread(ctx);
}

/* ------------------------------------------------------------------------
 * What the reservations ask of the file
 * --------------------------------------------------------------------- */

RedisModuleDict *of_take_fold(int *clean, int *tight) {
    RedisModuleDict *fold = of.fold;
    of.fold = NULL;
    *clean = of.clean;
    *tight = of.tight;
    return fold;
}

void of_restart(RedisModuleDict *fold) {
    char err[200];
    of.len = 0;
    of_fold_pending(fold);
    if (of_rewrite(err, sizeof(err)) != 0) of_log(err);
}

void of_received(int db, const char *key, size_t klen, uint64_t mark) {
    of_record(OF_LIVE, db, key, klen, mark);
    of.received = 1;
}

void of_deleted(int db, const char *key, size_t klen) {
    if (of.fd >= 0) of_record(OF_DELETED, db, key, klen, 0);
}

void of_flushed(int db) {
    if (of.fd >= 0) of_record(OF_FLUSH, db, NULL, 0, 0);
}

void of_swapped(int a, int b) {
    if (of.fd >= 0) of_record(OF_SWAP, a, NULL, 0, (uint64_t)(uint32_t)b);
}

void of_clean_begin(void) { of.len = 0; }

void of_clean_mark(int db, const char *key, size_t klen, uint64_t mark) {
    of_record(OF_LIVE, db, key, klen, mark);
}

void of_clean_commit(int tight) {
    char err[200];
    of_record(OF_CLEAN, 0, NULL, 0, (uint64_t)tight);
    if (of_rewrite(err, sizeof(err)) != 0) of_log(err);
}

int of_is_open(void) { return of.fd >= 0; }
int of_failing(void) { return of.failing; }
const char *of_error(void) { return of.error; }
const char *of_path(void) { return of.path; }
uint64_t of_size(void) { return of.size; }
uint64_t of_compactions(void) { return oc.installed; }

uint64_t of_fsyncs(void) {
    pthread_mutex_lock(&of.lock);
    uint64_t fsyncs = of.fsyncs;
    pthread_mutex_unlock(&of.lock);
    return fsyncs;
}
