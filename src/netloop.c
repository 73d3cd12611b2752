/* netloop.c -- the C lane's own event loop: plain client connections are
 * read, run through the lane and answered without a Python call per
 * request.
 *
 * WHY
 * ===
 *
 * One request at a time (redis-benchmark -P 1, most application code), a
 * request the C lane runs in 0.3-2 us cost the server 8-12 us of CPU when
 * the bytes came through asyncio: the event loop's callback into Python,
 * the Python glue around lane_run(), the flush callback and the Python
 * transport's write (perf: 46% of the server's samples in libpython, 6% in
 * cffi, 1% in the core). Syscalls were not the difference: per request
 * both rcp11 and redis-server make one read and one write, and a syscall's
 * entry costs ~0.16 us on the development VM (io_uring would save two of
 * those per request while adding a ring to manage: not worth it here; the
 * kernel's TCP work per request is the same whichever call starts it). So
 * this file moves the loop, not the syscalls, into C: the sockets of plain
 * connections belong to it, and Python is called once per batch of ready
 * connections, not once per request.
 *
 * WHERE IT SITS
 * =============
 *
 *   uvloop (Python's event loop)
 *     │ the loop's epoll descriptor is readable          one Python call
 *     ▼                                                   per batch
 *   nl_poll(): epoll_wait(0) over the connections ─┐
 *     │ for each ready connection: one read()       │ the lane's replies
 *     ▼                                             │ wait in conn->out
 *   lane_run(read) ── consumed ──> replies, AOF bytes, counters, keys
 *     │ the rest (a request the lane does not run)
 *     ▼
 *   data callback ──> Python's Connection.data_received() (the general
 *                     path, as for any asyncio connection)
 *   ...
 *   Python: fold the batch (counters, AOF bytes, touched keys), then its
 *           flush: persistence first (the AOF rule), then nl_flush():
 *           one write() per connection with output.
 *
 * The nested epoll descriptor is how the two loops meet: uvloop watches it
 * like any socket, it is readable while a connection here is, and nothing
 * else about uvloop changes (timers, other sockets, TLS connections, the
 * cron). TLS connections stay asyncio's: their bytes are encrypted.
 *
 * ROUNDS
 * ======
 *
 * One request at a time (50 clients, -P 1), a poll finds ~5 requests, and
 * more arrive while their replies are written. nl_run() serves those in
 * C: poll, flush, poll again, up to `rounds` polls within `budget_us`,
 * and returns to Python only after the last, or as soon as Python is
 * needed before anything leaves: bytes or a close were handed over (it
 * folds the batch first), the lane's writes left AOF bytes (the AOF takes
 * them before their replies), a flush hit an output limit. The rounds are
 * one batch, so Python's fold, its switches and uvloop's callback are paid
 * once for all of them (server CPU per request, -P 1: TWRITE 5.6 -> 5.0 us,
 * TREAD 100 9.1 -> 7.8 us). Nothing is flushed in C while Python has a
 * flush of its own pending or persistence is not settled (AOF bytes not
 * written, offset reservations not synced, a write error): Python's flush
 * comes first, and while it fails it drops the replies behind it (a read
 * must not show a write the AOF did not take). rcp11/server/netloop.py
 * asks for one round then.
 *
 * COALESCING
 * ==========
 *
 * A server that needs less CPU per request than its clients catches up
 * with them and goes to sleep in epoll between their requests, and then
 * each request's send() wakes it up: on loopback the sender pays that
 * wake-up in its own system call (perf on redis-benchmark at -P 1: 15% of
 * its samples against this loop, 7% against redis-server, which sleeps
 * less because it is slower). So when a poll found NL_COALESCE_EVENTS or
 * more ready connections and the next finds fewer (the server is ahead),
 * the replies of that poll are flushed and the loop sleeps coalesce_us
 * (nanosleep: not in epoll, so arriving requests wake nobody) before the
 * next poll, which then reads many requests at once. One wait per burst;
 * never with fewer than NL_COALESCE_EVENTS clients ready, so one client or
 * one pipelining client never waits; never while Python must act first
 * (the rounds stop before). 50 clients one request at a time, 2-core VM:
 * server CPU per TWRITE 5.1-5.5 -> 4.4 us, redis-benchmark's own per
 * request 6.0-6.6 -> 5.5 us, 8-17% more requests per second, p99 +0.08 ms.
 *
 * WHO RUNS WHAT
 * =============
 *
 * The lane (lane.c) decides request by request what it may run, exactly as
 * when Python calls it; this file adds only when it may be called at all:
 *
 *   - Python's switches (nl_set_switches), set before every poll and after
 *     every hand-over: whether the lane runs at all (MONITOR, loading,
 *     rename-command, blocked clients waiting to be served), TWRITE
 *     (MISCONF, maxmemory) and its AOF copy, and the AOF room;
 *   - per connection, lane_ok (nl_conn_set_lane), which Python sets after
 *     it is done with the connection: its parser idle, its own replies
 *     handed here, not blocked, held, closing, inside MULTI, RESP3 or
 *     unauthenticated. Every hand-over clears it: from then on the
 *     connection's bytes go to Python until Python sets it again, so a
 *     connection is at any time either the lane's or Python's, and its
 *     replies keep their order: the lane's wait in conn->out, Python's are
 *     appended behind them at its flush, and the lane runs the connection
 *     again only once Python's replies are there.
 *
 * What the lane stops before goes to Python as bytes, through the data
 * callback, with the rest of the read; Python parses and runs it as it does
 * for an asyncio connection. Before that call, Python folds the batch so
 * far (AOF bytes first, so the AOF keeps the order in which commands ran),
 * and after it the key cache is forgotten: Python may have changed
 * anything.
 *
 * A request split across reads: when the lane ends in the middle of one,
 * the start is kept in conn->in (up to carry_limit) and the next read is
 * appended to it, so a pipeline streamed in big reads stays in the lane.
 * Past carry_limit (the query buffer limit, bounded) the bytes go to Python,
 * whose parser applies client-query-buffer-limit.
 *
 * KEYS
 * ====
 *
 * The lane asks for each new key once per lane_run(); here the answer is
 * kept for the whole batch, so Python's resolver runs once per key per
 * batch, not per request. A batch ends at every hand-over and every return
 * to Python, the only moments anything else can change a key (its type,
 * TTL, watchers, waiters, reservation mark). At most NL_MAX_KEYS keys per
 * batch; the next one is refused (the lane stops, Python runs the request).
 *
 * OUTPUT
 * ======
 *
 *   conn->out:  | written | may leave (after an AOF flush) | lane replies of this batch |
 *               0        sent                            ready                        len
 *
 * nl_flush() (Python calls it after persistence.flush()) moves `ready` to
 * `len` and writes. nl_conn_write() (Python's replies, also written after
 * that flush) does the same. When the AOF could not take the batch's
 * writes, nl_drop_unflushed() cuts `len` back to `ready`: no reply leaves
 * that may acknowledge or show an unlogged write. A write the socket does
 * not take whole arms EPOLLOUT; the water callback tells Python when the
 * pending output passes its mark (asyncio's pause_writing) and when it
 * is back under it (resume_writing), so the output limits and the
 * backpressure of rcp11/server/connection.py work unchanged. A flush that
 * would take a connection's pending output past the hard limit
 * (nl_set_hard_limit) sends none of the new bytes and tells Python (water
 * 2), which closes the client as its own write would.
 *
 * A run's replies stop at the connection's output mark (the output limits
 * are Python's to look at past it, as between two of its commands) and at
 * the poll's budget: one run builds at most poll_reply_bytes
 * (nl_set_limits), and once the poll's runs built that much the
 * connections not read yet wait in their sockets for the next poll (read
 * first then), so a poll builds at most twice the budget before Python
 * flushes it and other clients are answered. A run is not cut by the
 * clock, so without this one read of TREADs under a high output limit
 * (70 MB of replies for 64 KB of requests) held every other client for as
 * long as it took. A run the budget stops hands the rest of its read to
 * Python, whose turns read the clock.
 *
 * A read of 0 bytes (the peer closed) closes the connection as soon as its
 * output is written; a read or write error closes it at once. The closed
 * callback tells Python, once. The struct lives until Python frees it
 * (nl_conn_free): Python may still hold it, and an epoll event of this
 * poll may still name it (a closed connection's events are skipped).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "netloop.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

/* Bytes one read() asks for. Redis reads 16 KB; libuv (asyncio's transport
 * before this file) 64 KB. A 100-entry TWRITE of 100-byte messages is
 * 10.7 KB, a Kafka-style 500-entry batch 53 KB: 64 KB reads take either
 * in one call. */
#define NL_READ_BYTES (64 * 1024)

/* Events taken from epoll per poll: more connections than that are served
 * at the next poll (uvloop calls again while the descriptor is readable). */
#define NL_MAX_EVENTS 256

/* A poll that finds fewer ready connections than this, after one that
 * found at least this many, waits nl_set_coalesce()'s time first (see
 * COALESCING). */
#define NL_COALESCE_EVENTS 4
/* Keys whose resolution a batch keeps (see KEYS). */
#define NL_MAX_KEYS 64

/* A buffer that grew past this for one big reply or request is freed once
 * empty, not kept for the next (Redis frees its big reply blocks too). */
#define NL_KEEP_BYTES (256 * 1024)

/* Connection flags. */
#define NL_LANE_OK 1       /* Python lets the lane run the next read */
#define NL_READ_PAUSED 2   /* pause_reading */
#define NL_CLOSING 4       /* close once the output is written */
#define NL_CLOSED 8        /* the descriptor is closed */
#define NL_OVER_WATER 16   /* pending output went over the water mark */
#define NL_DIRTY 32        /* on the loop's dirty list */
#define NL_TOUCHED 64      /* in the batch's owners */
#define NL_FREED 128       /* Python let go of it (freed after the poll) */
#define NL_RAN 256         /* the lane ran a request since nl_conn_activity */
#define NL_FIRST 512       /* its read waited for the next poll: read first then */

struct nl_conn {
    nl_loop *loop;
    int fd;
    int flags;
    uint32_t events;  /* epoll interest registered now */
    int last_command; /* lane_call.last_command of the lane's last run */
    int64_t read_us;  /* when the loop last read bytes of it (see nl_conn_activity) */
    uint64_t waited;  /* with NL_FIRST: the poll its read first waited at */
    void *owner;
    mn_buf in;        /* the start of a request the lane waits to complete */
    mn_buf out;       /* see OUTPUT */
    size_t sent, ready;
    size_t output_mark, carry_limit, water;
};

typedef struct nl_key {
    size_t at, len;   /* the key's bytes in loop->key_bytes */
    mn_stream *stream;
    ag_group *group;  /* an acknowledged group's key: its state, not a stream */
    uint64_t write_limit;
    int allowed;
    int written;
} nl_key;

typedef struct nl_slow {
    nl_conn *conn;
    size_t at, len;   /* the request's bytes in loop->slow_bytes */
    uint64_t usec;
} nl_slow;

typedef struct nl_aof_run {
    int64_t ms;
    size_t end;       /* the run's bytes end here in loop->aof */
} nl_aof_run;

struct nl_loop {
    lane_call call;   /* first: the lane's resolver finds the loop from it */
    int epfd;
    int switches;
    size_t aof_room;
    int64_t memory_room;   /* what the batch's TWRITEs may grow (LANE_MEMORY_ROOM) */
    int64_t memory_grown;  /* what they grew so far */
    size_t hard_limit;  /* client-output-buffer-limit normal's hard bytes */
    size_t poll_reply_bytes; /* lane replies one poll builds at most (0: no cap) */
    size_t poll_replied;     /* what this poll's runs built so far */
    uint64_t polls;          /* nl_poll()s that had events, for nl_conn.waited */
    uint64_t python_calls;   /* data, closed and water callbacks so far (nl_run) */
    int64_t coalesce_us;     /* nl_set_coalesce(): 0 is off */
    int poll_reads;          /* connections the last nl_poll() read (COALESCING) */
    int polling;
    int64_t now_us;   /* CLOCK_REALTIME at this poll's start */
    void *owner;      /* nl_set_callbacks()'s, for the callbacks */
    nl_resolve_fn resolve;
    nl_data_fn on_data;
    nl_closed_fn on_closed;
    nl_water_fn on_water;
    char *rbuf;
    /* Connections with output not yet allowed out or not yet written. */
    nl_conn **dirty;
    size_t ndirty, dirty_cap;
    /* Connections freed by Python during a poll, freed after it. */
    nl_conn **zombies;
    size_t nzombies, zombie_cap;
    /* The batch. */
    nl_counts counts;
    nl_key keys[NL_MAX_KEYS];
    size_t nkeys;
    mn_buf key_bytes;
    mn_buf aof;
    nl_aof_run *runs;
    size_t nruns, runs_cap;
    nl_slow *slow;
    size_t nslow, slow_cap;
    mn_buf slow_bytes;
    nl_conn **touched;   /* the lane ran requests for these (NL_TOUCHED) */
    size_t ntouched, touched_cap;
    void **owners;       /* their owners, built by nl_batch_owners() */
    size_t owners_cap;
};

/* ------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------- */

/* Append item to a growable array of pointers. */
static int push_ptr(void ***items, size_t *n, size_t *cap, void *item) {
    if (*n == *cap) {
        size_t want = *cap ? *cap * 2 : 64;
        void **p = realloc(*items, want * sizeof *p);
        if (p == NULL) return -1;
        *items = p;
        *cap = want;
    }
    (*items)[(*n)++] = item;
    return 0;
}

static void set_interest(nl_conn *c) {
    if (c->flags & NL_CLOSED) return;
    uint32_t want = 0;
    if (!(c->flags & (NL_READ_PAUSED | NL_CLOSING))) want |= EPOLLIN;
    if (c->sent < c->ready) want |= EPOLLOUT;
    if (want == c->events) return;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = want;
    ev.data.ptr = c;
    if (epoll_ctl(c->loop->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) c->events = want;
}

/* Close the descriptor and tell Python (once). */
static void close_now(nl_conn *c, int err) {
    if (c->flags & NL_CLOSED) return;
    epoll_ctl(c->loop->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->flags |= NL_CLOSED;
    c->flags &= ~NL_LANE_OK;
    c->out.len = c->sent = c->ready = 0;
    c->in.len = 0;
    c->loop->python_calls++;
    if (c->loop->on_closed != NULL && !(c->flags & NL_FREED)) c->loop->on_closed(c->owner, err);
}

static void mark_dirty(nl_conn *c) {
    if (c->flags & NL_DIRTY) return;
    nl_loop *loop = c->loop;
    if (push_ptr((void ***)&loop->dirty, &loop->ndirty, &loop->dirty_cap, c) == 0)
        c->flags |= NL_DIRTY;
}

static void water_check(nl_conn *c) {
    if (c->flags & NL_CLOSED || c->water == 0 || c->loop->on_water == NULL) return;
    size_t pending = c->out.len - c->sent;
    if (pending > c->water && !(c->flags & NL_OVER_WATER)) {
        c->flags |= NL_OVER_WATER;
        c->loop->python_calls++;
        c->loop->on_water(c->owner, 1);
    } else if (pending <= c->water && (c->flags & NL_OVER_WATER)) {
        c->flags &= ~NL_OVER_WATER;
        c->loop->python_calls++;
        c->loop->on_water(c->owner, 0);
    }
}

/* Write out[sent, ready) as far as the socket takes it. */
static void write_some(nl_conn *c) {
    while (c->sent < c->ready && !(c->flags & NL_CLOSED)) {
        ssize_t w = write(c->fd, c->out.data + c->sent, c->ready - c->sent);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            close_now(c, errno);
            return;
        }
        c->sent += (size_t)w;
    }
    if (c->sent == c->out.len) {
        c->sent = c->ready = c->out.len = 0;
        if (c->out.cap > NL_KEEP_BYTES) mn_buf_free(&c->out);
        if (c->flags & NL_CLOSING) {
            close_now(c, 0);
            return;
        }
    }
    set_interest(c);
    water_check(c);
}

/* ------------------------------------------------------------------------
 * The loop and its connections
 * --------------------------------------------------------------------- */

static int resolve_cached(lane_call *call, const char *key, size_t key_len, mn_stream **stream,
                          ag_group **group, uint64_t *write_limit);

nl_loop *nl_loop_new(void) {
    nl_loop *loop = calloc(1, sizeof *loop);
    if (loop == NULL) return NULL;
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    loop->rbuf = malloc(NL_READ_BYTES);
    if (loop->epfd < 0 || loop->rbuf == NULL) {
        if (loop->epfd >= 0) close(loop->epfd);
        free(loop->rbuf);
        free(loop);
        return NULL;
    }
    lane_call_init(&loop->call);
    loop->call.resolve = resolve_cached;
    loop->call.max_bulk_len = 512u * 1024 * 1024;
    loop->call.max_multibulk_len = 1024 * 1024;
    loop->call.max_commands = 4096;
    mn_buf_init(&loop->key_bytes);
    mn_buf_init(&loop->aof);
    mn_buf_init(&loop->slow_bytes);
    return loop;
}

static void free_conn_memory(nl_conn *c) {
    mn_buf_free(&c->in);
    mn_buf_free(&c->out);
    free(c);
}

void nl_loop_free(nl_loop *loop) {
    if (loop == NULL) return;
    for (size_t i = 0; i < loop->nzombies; i++) free_conn_memory(loop->zombies[i]);
    close(loop->epfd);
    lane_call_free(&loop->call);
    mn_buf_free(&loop->key_bytes);
    mn_buf_free(&loop->aof);
    mn_buf_free(&loop->slow_bytes);
    free(loop->slow);
    free(loop->rbuf);
    free(loop->dirty);
    free(loop->zombies);
    free(loop->runs);
    free(loop->touched);
    free(loop->owners);
    free(loop);
}

int nl_loop_fd(nl_loop *loop) { return loop->epfd; }

void *nl_loop_owner(nl_loop *loop) { return loop->owner; }

void nl_set_callbacks(nl_loop *loop, void *owner, nl_resolve_fn resolve, nl_data_fn data,
                      nl_closed_fn closed, nl_water_fn water) {
    loop->owner = owner;
    loop->resolve = resolve;
    loop->on_data = data;
    loop->on_closed = closed;
    loop->on_water = water;
}

void nl_set_limits(nl_loop *loop, uint64_t max_bulk_len, uint64_t max_multibulk_len,
                   uint64_t max_commands, size_t poll_reply_bytes) {
    loop->call.max_bulk_len = max_bulk_len;
    loop->call.max_multibulk_len = max_multibulk_len;
    loop->call.max_commands = max_commands;
    loop->poll_reply_bytes = poll_reply_bytes;
}

void nl_set_switches(nl_loop *loop, int switches, size_t aof_room, int64_t memory_room,
                     uint64_t slow_usec) {
    loop->switches = switches;
    loop->aof_room = aof_room;
    loop->memory_room = memory_room;
    loop->call.slow_usec = slow_usec;
}

void nl_set_hard_limit(nl_loop *loop, size_t hard_limit) { loop->hard_limit = hard_limit; }

void nl_set_fixed_ms(nl_loop *loop, int64_t ms) { loop->call.fixed_ms = ms; }

nl_conn *nl_conn_new(nl_loop *loop, int fd, void *owner) {
    nl_conn *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->loop = loop;
    c->fd = fd;
    c->owner = owner;
    mn_buf_init(&c->in);
    mn_buf_init(&c->out);
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        free(c);
        return NULL;
    }
    c->events = EPOLLIN;
    return c;
}

void nl_conn_set_lane(nl_conn *c, int ok, size_t output_mark, size_t carry_limit) {
    if (c->flags & NL_CLOSED) return;
    if (ok)
        c->flags |= NL_LANE_OK;
    else
        c->flags &= ~NL_LANE_OK;
    c->output_mark = output_mark;
    c->carry_limit = carry_limit;
}

int nl_conn_write(nl_conn *c, const char *data, size_t len) {
    if (c->flags & NL_CLOSED) return -1;
    if (mn_buf_append(&c->out, data, len)) {
        close_now(c, ENOMEM);
        return -1;
    }
    c->ready = c->out.len;
    write_some(c);
    return 0;
}

int nl_conn_carry(nl_conn *c, const char *data, size_t len) {
    if (c->flags & NL_CLOSED) return -1;
    if (c->in.len || mn_buf_append(&c->in, data, len)) return -1;
    return 0;
}

size_t nl_conn_pending(nl_conn *c) { return c->out.len - c->sent; }

size_t nl_conn_carried(nl_conn *c) { return c->in.len; }

void nl_conn_set_water(nl_conn *c, size_t water) { c->water = water; }

void nl_conn_pause_reading(nl_conn *c, int paused) {
    if (paused)
        c->flags |= NL_READ_PAUSED;
    else
        c->flags &= ~NL_READ_PAUSED;
    set_interest(c);
}

void nl_conn_close(nl_conn *c, int now) {
    if (c->flags & NL_CLOSED) return;
    if (now || c->sent == c->out.len) {
        close_now(c, 0);
        return;
    }
    /* What waits beyond `ready` was never allowed out: the caller closes
     * after its own flush, so it is all allowed now. */
    c->ready = c->out.len;
    c->flags |= NL_CLOSING;
    write_some(c);
}

int nl_conn_closed(nl_conn *c) { return (c->flags & NL_CLOSED) != 0; }

int nl_conn_activity(nl_conn *c, int64_t *read_us) {
    *read_us = c->read_us;
    if (!(c->flags & NL_RAN)) return 0;
    c->flags &= ~NL_RAN;
    return c->last_command;
}

void nl_conn_free(nl_conn *c) {
    if (c == NULL) return;
    nl_loop *loop = c->loop;
    c->flags |= NL_FREED;
    close_now(c, 0);
    for (size_t i = 0; i < loop->ndirty; i++)
        if (loop->dirty[i] == c) loop->dirty[i] = NULL;
    for (size_t i = 0; i < loop->ntouched; i++)
        if (loop->touched[i] == c) loop->touched[i] = NULL;
    for (size_t i = 0; i < loop->nslow; i++)
        if (loop->slow[i].conn == c) loop->slow[i].conn = NULL;
    if (loop->polling) {
        /* An event of this poll may still point at it. */
        if (push_ptr((void ***)&loop->zombies, &loop->nzombies, &loop->zombie_cap, c) == 0) return;
    }
    free_conn_memory(c);
}

/* ------------------------------------------------------------------------
 * The batch
 * --------------------------------------------------------------------- */

static nl_loop *loop_of(lane_call *call) {
    return (nl_loop *)(void *)((char *)call - offsetof(nl_loop, call));
}

/* lane_resolve_fn: the batch's answer for a key, asking Python once. */
static int resolve_cached(lane_call *call, const char *key, size_t key_len, mn_stream **stream,
                          ag_group **group, uint64_t *write_limit) {
    nl_loop *loop = loop_of(call);
    for (size_t i = 0; i < loop->nkeys; i++) {
        nl_key *k = &loop->keys[i];
        if (k->len == key_len && memcmp(loop->key_bytes.data + k->at, key, key_len) == 0) {
            *stream = k->stream;
            *group = k->group;
            *write_limit = k->write_limit;
            return k->allowed;
        }
    }
    if (loop->nkeys == NL_MAX_KEYS || loop->resolve == NULL) return 0;
    size_t at = loop->key_bytes.len;
    if (mn_buf_append(&loop->key_bytes, key, key_len)) return 0;
    nl_key *k = &loop->keys[loop->nkeys++];
    k->at = at;
    k->len = key_len;
    k->stream = NULL;
    k->group = NULL;
    k->write_limit = 0;
    k->written = 0;
    k->allowed = loop->resolve(loop, key, key_len, &k->stream, &k->group, &k->write_limit);
    if (k->stream == NULL && k->group == NULL) k->allowed = 0;
    *stream = k->stream;
    *group = k->group;
    *write_limit = k->write_limit;
    return k->allowed;
}

static void touch(nl_loop *loop, nl_conn *c) {
    if (c->flags & NL_TOUCHED) return;
    if (push_ptr((void ***)&loop->touched, &loop->ntouched, &loop->touched_cap, c) == 0)
        c->flags |= NL_TOUCHED;
}

/* Fold one lane_run() into the batch and the connection; 0, or -1 when
 * the lane's output could not be kept (no memory: the connection breaks,
 * as a write the socket refuses would break it). */
static int take_run(nl_loop *loop, nl_conn *c, const char *buf, size_t consumed) {
    lane_call *call = &loop->call;
    nl_counts *n = &loop->counts;
    loop->memory_grown += call->memory_grown;
    for (size_t i = 0; i < call->nslow; i++) {
        /* The read buffer is reused: the slow request is kept as bytes. */
        const lane_slow *sl = &call->slow[i];
        if (loop->nslow == loop->slow_cap) {
            size_t want = loop->slow_cap ? loop->slow_cap * 2 : 8;
            nl_slow *p = realloc(loop->slow, want * sizeof *p);
            if (p == NULL) break;
            loop->slow = p;
            loop->slow_cap = want;
        }
        size_t at = loop->slow_bytes.len;
        if (mn_buf_append(&loop->slow_bytes, buf + sl->start, sl->len)) break;
        loop->slow[loop->nslow++] = (nl_slow){c, at, sl->len, sl->usec};
    }
    n->twrite_calls += call->twrite_calls;
    n->twrite_usec += call->twrite_usec;
    n->tread_calls += call->tread_calls;
    n->tread_usec += call->tread_usec;
    n->messages_written += call->messages_written;
    n->messages_read += call->messages_read;
    n->messages_evicted += call->messages_evicted;
    n->group_changes += call->group_changes;
    n->net_input_bytes += consumed;
    n->net_output_bytes += call->reply.len;
    n->runs++;
    loop->poll_replied += call->reply.len;
    for (size_t i = 0; i < call->nkeys; i++) {
        const lane_key *ck = &call->keys[i];
        if (!ck->written) continue;
        for (size_t j = 0; j < loop->nkeys; j++) {
            nl_key *k = &loop->keys[j];
            if (ck->group != NULL ? k->group == ck->group : k->stream == ck->stream)
                k->written = 1;
        }
    }
    int failed = 0;
    if (call->aof.len) {
        if (loop->nruns == 0 || loop->runs[loop->nruns - 1].ms != call->append_ms) {
            if (loop->nruns == loop->runs_cap) {
                size_t want = loop->runs_cap ? loop->runs_cap * 2 : 8;
                nl_aof_run *p = realloc(loop->runs, want * sizeof *p);
                if (p == NULL) {
                    failed = 1;
                } else {
                    loop->runs = p;
                    loop->runs_cap = want;
                }
            }
            if (!failed) loop->runs[loop->nruns++].ms = call->append_ms;
        }
        /* Written streams must be logged: without room the server has no
         * honest way on (Python refuses every write from then on). */
        if (failed || mn_buf_append(&loop->aof, call->aof.data, call->aof.len)) {
            loop->counts.aof_failed = 1;
            failed = 1;
        } else {
            loop->runs[loop->nruns - 1].end = loop->aof.len;
        }
    }
    c->last_command = call->last_command;
    c->flags |= NL_RAN;
    touch(loop, c);
    if (c->out.len == 0) {
        /* The usual case: hand the reply buffer over instead of copying it. */
        mn_buf spare = c->out;
        c->out = call->reply;
        call->reply = spare;
        c->sent = c->ready = 0;
    } else if (mn_buf_append(&c->out, call->reply.data, call->reply.len)) {
        close_now(c, ENOMEM);
        return -1;
    }
    /* A big request's or reply's buffers are not kept for the next run:
     * their peak would stay in used_memory, held against maxmemory. */
    if (call->reply.cap > NL_KEEP_BYTES || call->aof.cap > NL_KEEP_BYTES ||
        call->scratch_entries.cap > NL_KEEP_BYTES)
        lane_call_free(call); /* buffers only: the call stays usable */
    if (c->out.len > c->ready) mark_dirty(c);
    return failed ? -1 : 0;
}

/* Hand data to Python; the lane stays off for the connection until Python
 * sets it again, and the batch's keys are forgotten. */
static void hand_over(nl_loop *loop, nl_conn *c, const char *data, size_t len) {
    c->flags &= ~NL_LANE_OK;
    loop->python_calls++;
    if (loop->on_data != NULL) loop->on_data(loop, c->owner, data, len);
    loop->nkeys = 0;
    loop->key_bytes.len = 0;
}

static void read_conn(nl_loop *loop, nl_conn *c) {
    if (c->flags & (NL_READ_PAUSED | NL_CLOSING | NL_CLOSED)) return;
    int lane = (loop->switches & NL_LANE) && (c->flags & NL_LANE_OK);
    char *dst = loop->rbuf;
    int into_carry = c->in.len > 0;
    if (into_carry) {
        if (mn_buf_reserve(&c->in, NL_READ_BYTES)) {
            close_now(c, ENOMEM);
            return;
        }
        dst = c->in.data + c->in.len;
    }
    ssize_t r;
    do {
        r = read(c->fd, dst, NL_READ_BYTES);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) close_now(c, errno);
        return;
    }
    if (r == 0) {
        /* The peer is gone: what it sent is answered, then it is closed. */
        c->in.len = 0;
        nl_conn_close(c, 0);
        return;
    }
    c->read_us = loop->now_us;
    const char *buf = dst;
    size_t len = (size_t)r;
    if (into_carry) {
        c->in.len += len;
        buf = c->in.data;
        len = c->in.len;
    }
    if (!lane || c->out.len - c->sent > c->output_mark) {
        /* Python's: it also looks at the output limits first. */
        c->in.len = 0;
        hand_over(loop, c, buf, len);
        return;
    }
    size_t pending = c->out.len - c->sent;
    int flags =
        loop->switches & (LANE_WRITES | LANE_LOG_WRITES | LANE_MEMORY_ROOM | LANE_FIXED_TIME);
    size_t room = 0;
    if (flags & LANE_LOG_WRITES) {
        if (loop->aof.len <= loop->aof_room)
            room = loop->aof_room - loop->aof.len;
        else
            flags = 0; /* the AOF's room is used up: Python asks for more */
    }
    /* What this batch's earlier runs grew counts against maxmemory too. */
    int64_t memory_room = loop->memory_room - loop->memory_grown;
    /* The output limits' mark, and the poll's budget (see OUTPUT) as the
     * most one run may build: a run that stops there goes on in Python,
     * which reads the clock. The budget left is not the mark: then the
     * run that crossed it at -P 32 (50 clients with 350 KB of replies each
     * per read) went half to Python at every poll, at three times the
     * CPU per request. */
    size_t mark = c->output_mark - pending;
    if (loop->poll_reply_bytes && loop->poll_reply_bytes < mark) mark = loop->poll_reply_bytes;
    size_t consumed = lane_run(&loop->call, buf, len, mark, flags, room, memory_room);
    /* A run that consumed nothing may still have changed a group (a lease
     * read out of memory after its ACK: lane.c logs the ACK and stops
     * before the request, which Python runs again): its record and counts
     * are folded all the same. */
    if ((consumed || loop->call.group_changes) && take_run(loop, c, buf, consumed)) {
        if (c->flags & NL_CLOSED) return;
    }
    size_t rest = len - consumed;
    if (rest == 0) {
        c->in.len = 0;
        if (c->in.cap > NL_KEEP_BYTES) mn_buf_free(&c->in);
        return;
    }
    if (loop->call.stop == LANE_STOP_END && rest <= c->carry_limit) {
        /* The start of a request: kept until the rest arrives (Python
         * shows it as the client's query buffer). */
        touch(loop, c);
        if (into_carry) {
            memmove(c->in.data, c->in.data + consumed, rest);
            c->in.len = rest;
        } else if (mn_buf_append(&c->in, buf + consumed, rest)) {
            close_now(c, ENOMEM);
        }
        return;
    }
    if (into_carry) {
        /* hand_over() may re-enter this connection's buffers (a write from
         * Python): take the bytes out first. */
        mn_buf held = c->in;
        mn_buf_init(&c->in);
        hand_over(loop, c, held.data + consumed, rest);
        if (c->in.data == NULL) {
            held.len = 0;
            c->in = held;
        } else {
            mn_buf_free(&held);
        }
        return;
    }
    hand_over(loop, c, buf + consumed, rest);
}

int nl_poll(nl_loop *loop) {
    struct epoll_event evs[NL_MAX_EVENTS];
    int n;
    loop->poll_reads = 0;
    do {
        n = epoll_wait(loop->epfd, evs, NL_MAX_EVENTS, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return n;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    loop->now_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    loop->polling = 1;
    loop->poll_replied = 0;
    loop->polls++;
    /* Three passes: the connections whose read has waited longest first,
     * then the others that waited, then the rest. Waiting at a poll alone
     * is not enough: epoll hands level-triggered events back in the same
     * order, and a connection read at the last poll waits at this one, so
     * the first two connections that each fill the budget would take
     * every poll in turn and a third wait for ever. */
    uint64_t oldest = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        nl_conn *c = evs[i].data.ptr;
        if ((c->flags & NL_FIRST) && c->waited < oldest) oldest = c->waited;
    }
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < n; i++) {
            nl_conn *c = evs[i].data.ptr;
            uint32_t ev = evs[i].events;
            if (ev == 0) continue; /* handled in an earlier pass */
            if (pass < 2 && !(c->flags & NL_FIRST)) continue;
            if (pass == 0 && c->waited != oldest) continue;
            evs[i].events = 0;
            if (c->flags & NL_CLOSED) continue;
            if (ev & EPOLLOUT) write_some(c);
            if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                c->flags &= ~NL_FIRST;
                continue;
            }
            if (loop->poll_reply_bytes && loop->poll_replied >= loop->poll_reply_bytes) {
                /* The poll's budget is used: its bytes wait in the socket,
                 * which stays readable (level-triggered) for the next; a
                 * connection that waited already keeps its place. */
                if (!(c->flags & NL_FIRST)) {
                    c->flags |= NL_FIRST;
                    c->waited = loop->polls;
                }
                continue;
            }
            c->flags &= ~NL_FIRST;
            loop->poll_reads++;
            read_conn(loop, c);
        }
    }
    loop->polling = 0;
    for (size_t i = 0; i < loop->nzombies; i++) free_conn_memory(loop->zombies[i]);
    loop->nzombies = 0;
    return n;
}

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void nl_set_coalesce(nl_loop *loop, int64_t usec) { loop->coalesce_us = usec > 0 ? usec : 0; }

/* See COALESCING: wait a little for more ready connections before a poll
 * that would serve few, after one that served many. */
static void coalesce(nl_loop *loop) {
    struct timespec ts = {(time_t)(loop->coalesce_us / 1000000),
                          (long)(loop->coalesce_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int nl_run(nl_loop *loop, int rounds, int64_t budget_us) {
    uint64_t calls = loop->python_calls;
    int64_t start = rounds > 1 ? mono_us() : 0;
    int total = 0, last = 0;
    for (int round = 1;; round++) {
        int n = nl_poll(loop);
        if (n < 0) return total ? total : n;
        total += n;
        /* Few connections read after many (writes that only drained
         * output do not count): wait for more before the next poll. */
        int reads = loop->poll_reads;
        int quiet = loop->coalesce_us && reads < NL_COALESCE_EVENTS && last >= NL_COALESCE_EVENTS;
        /* Python is needed before these replies leave: it saw bytes or a
         * close (it folds the batch first), or the AOF must take the
         * lane's writes first. Then it flushes, as after one poll. */
        if ((n == 0 && !quiet) || round >= rounds || loop->python_calls != calls ||
            loop->nruns != 0 || loop->counts.aof_failed)
            break;
        if (n) nl_flush(loop);
        /* The flush closed a connection or hit a limit; or the rounds had
         * their time: timers and asyncio's connections wait for Python. */
        if (loop->python_calls != calls) break;
        int64_t spent = mono_us() - start;
        if (spent >= budget_us || (quiet && spent + loop->coalesce_us >= budget_us)) break;
        if (quiet) coalesce(loop);
        last = quiet ? 0 : reads; /* one wait per burst */
    }
    return total;
}

size_t nl_flush(nl_loop *loop) {
    size_t written = 0;
    /* write_some() may close a connection, which calls Python, which may
     * queue more: take the list as it is now. */
    size_t n = loop->ndirty;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        nl_conn *c = loop->dirty[i];
        if (c == NULL) continue;
        c->flags &= ~NL_DIRTY;
        if (c->flags & NL_CLOSED) continue;
        if (loop->hard_limit && c->out.len - c->sent > loop->hard_limit) {
            /* As Python's write: a reply that would take the output past
             * the hard limit closes the client before any of it leaves. */
            c->out.len = c->ready;
            loop->python_calls++;
            if (loop->on_water != NULL) loop->on_water(c->owner, 2);
            continue;
        }
        c->ready = c->out.len;
        write_some(c);
        written++;
    }
    memmove(loop->dirty, loop->dirty + n, (loop->ndirty - n) * sizeof *loop->dirty);
    loop->ndirty -= n;
    return written;
}

size_t nl_drop_unflushed(nl_loop *loop) {
    size_t closed = 0;
    for (size_t i = 0; i < loop->ntouched; i++)
        if (loop->touched[i] != NULL) loop->touched[i]->flags &= ~NL_TOUCHED;
    loop->ntouched = 0;
    for (size_t i = 0; i < loop->ndirty; i++) {
        nl_conn *c = loop->dirty[i];
        if (c == NULL) continue;
        c->flags &= ~NL_DIRTY;
        if (c->flags & NL_CLOSED) continue;
        c->out.len = c->ready;
        touch(loop, c);
        nl_conn_close(c, 0);
        closed++;
    }
    loop->ndirty = 0;
    return closed;
}

const nl_counts *nl_batch_counts(nl_loop *loop) { return &loop->counts; }

size_t nl_batch_keys(nl_loop *loop) { return loop->nkeys; }

int nl_batch_key_written(nl_loop *loop, size_t i) {
    return i < loop->nkeys ? loop->keys[i].written : 0;
}

size_t nl_batch_aof_runs(nl_loop *loop) { return loop->nruns; }

int64_t nl_batch_aof_run(nl_loop *loop, size_t i, const char **data, size_t *len) {
    size_t start = i ? loop->runs[i - 1].end : 0;
    *data = loop->aof.data + start;
    *len = loop->runs[i].end - start;
    return loop->runs[i].ms;
}

void **nl_batch_owners(nl_loop *loop, size_t *n) {
    *n = 0;
    if (loop->owners_cap < loop->ntouched) {
        void **p = realloc(loop->owners, loop->ntouched * sizeof *p);
        if (p == NULL) return loop->owners;
        loop->owners = p;
        loop->owners_cap = loop->ntouched;
    }
    for (size_t i = 0; i < loop->ntouched; i++)
        if (loop->touched[i] != NULL) loop->owners[(*n)++] = loop->touched[i]->owner;
    return loop->owners;
}

size_t nl_dirty(nl_loop *loop) { return loop->ndirty; }

size_t nl_batch_slow_count(nl_loop *loop) { return loop->nslow; }

uint64_t nl_batch_slow(nl_loop *loop, size_t i, void **owner, const char **request, size_t *len) {
    const nl_slow *sl = &loop->slow[i];
    *owner = sl->conn != NULL ? sl->conn->owner : NULL;
    *request = loop->slow_bytes.data + sl->at;
    *len = sl->len;
    return sl->usec;
}

int nl_batch_pending(nl_loop *loop) {
    return loop->counts.runs != 0 || loop->nkeys != 0 || loop->ntouched != 0;
}

void nl_batch_reset(nl_loop *loop) {
    memset(&loop->counts, 0, sizeof loop->counts);
    loop->nkeys = 0;
    loop->key_bytes.len = 0;
    loop->aof.len = 0;
    loop->nruns = 0;
    loop->nslow = 0;
    loop->slow_bytes.len = 0;
    loop->memory_grown = 0;
    if (loop->aof.cap > NL_KEEP_BYTES) mn_buf_free(&loop->aof);
    if (loop->slow_bytes.cap > NL_KEEP_BYTES) mn_buf_free(&loop->slow_bytes);
    for (size_t i = 0; i < loop->ntouched; i++) {
        nl_conn *c = loop->touched[i];
        if (c == NULL) continue;
        c->flags &= ~NL_TOUCHED;
    }
    loop->ntouched = 0;
}
