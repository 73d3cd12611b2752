/* netloop.h -- the C lane's own event loop: plain client sockets read,
 * run through the lane and written without a Python call per request (see
 * the essay at the top of netloop.c).
 *
 * Like lane.h, the part between CDEF-BEGIN and CDEF-END is fed to cffi's
 * cdef() (src/build_macronode.py builds it into rcp11._macronode), so it
 * stays cdef-clean.
 */
#ifndef RCP11_NETLOOP_H
#define RCP11_NETLOOP_H

#include <stddef.h>
#include <stdint.h>

#include "lane.h"

/* CDEF-BEGIN */

/* What no request can change during one poll, set by Python before it and
 * after every hand-over (nl_set_switches). */
#define NL_LANE 256      /* the lane may run at all (no MONITOR, loading, ...) */
/* with lane_run()'s flags: LANE_WRITES (TWRITE may run), LANE_LOG_WRITES
 * (and is copied to the AOF) and LANE_MEMORY_ROOM (maxmemory). */

typedef struct nl_loop nl_loop;
typedef struct nl_conn nl_conn;

/* Python's side, as function pointers (nl_set_callbacks, with the owner
 * that nl_loop_owner() gives the callbacks back: the loop itself never
 * reads it):
 *   resolve   the lane's key resolver (lane_resolve_fn), asked once per key
 *             per batch;
 *   data      bytes the lane does not run, in order, for the connection's
 *             owner; the lane stays off for it until nl_conn_set_lane();
 *   closed    the socket is closed (err: 0 for end of file or a close asked
 *             for, else the errno that broke it); called once;
 *   water     pending output went over (1) or back to (0) the water mark,
 *             or a flush would have taken it past the hard limit (2). */
typedef int (*nl_resolve_fn)(nl_loop *loop, const char *key, size_t key_len, mn_stream **stream,
                             ag_group **group, uint64_t *write_limit);
typedef void (*nl_data_fn)(nl_loop *loop, void *owner, const char *data, size_t len);
typedef void (*nl_closed_fn)(void *owner, int err);
typedef void (*nl_water_fn)(void *owner, int over);

/* What the lane ran since the last nl_batch_reset(): Python adds these to
 * its counters (INFO stats, commandstats). */
typedef struct nl_counts {
    uint64_t twrite_calls, twrite_usec, tread_calls, tread_usec;
    uint64_t messages_written, messages_read, messages_evicted;
    uint64_t group_changes;     /* lease reads and TACKs that changed a group */
    uint64_t net_input_bytes;   /* request bytes the lane consumed */
    uint64_t net_output_bytes;  /* reply bytes the lane queued */
    uint64_t runs;              /* lane_run() calls that ran something */
    uint64_t aof_failed;        /* 1: AOF bytes were lost (no memory) */
} nl_counts;

/* A new loop (its epoll descriptor, its lane_call), or NULL (no memory,
 * or epoll refused). */
nl_loop *nl_loop_new(void);
void nl_loop_free(nl_loop *loop);
int nl_loop_fd(nl_loop *loop);
void nl_set_callbacks(nl_loop *loop, void *owner, nl_resolve_fn resolve, nl_data_fn data,
                      nl_closed_fn closed, nl_water_fn water);
void *nl_loop_owner(nl_loop *loop);
/* Parser limits (proto-max-bulk-len, arguments per request), requests
 * per lane run, and the poll's reply budget (0: no cap): one run builds at
 * most that much (the rest of its read goes to Python), and once the
 * poll's runs built that much the connections not read yet wait for the
 * next poll. */
void nl_set_limits(nl_loop *loop, uint64_t max_bulk_len, uint64_t max_multibulk_len,
                   uint64_t max_commands, size_t poll_reply_bytes);
/* aof_room: AOF bytes the batch may add; memory_room: what its TWRITEs
 * may grow the streams by (with LANE_MEMORY_ROOM); slow_usec: lane
 * commands that run this long are recorded (nl_batch_slow). */
void nl_set_switches(nl_loop *loop, int switches, size_t aof_room, int64_t memory_room,
                     uint64_t slow_usec);
/* The append time of TWRITEs while the switches hold LANE_FIXED_TIME. */
void nl_set_fixed_ms(nl_loop *loop, int64_t ms);
/* client-output-buffer-limit's hard bytes (0: none), checked at flush. */
void nl_set_hard_limit(nl_loop *loop, size_t hard_limit);

/* One connection on a connected, non-blocking socket the loop now owns
 * (it closes it). NULL: no memory or epoll refused it (fd left open). */
nl_conn *nl_conn_new(nl_loop *loop, int fd, void *owner);
/* Whether the lane may run this connection's next reads, the pending
 * output at which Python must look at its output limits, and the most
 * bytes of an unfinished request the loop holds before handing it over. */
void nl_conn_set_lane(nl_conn *conn, int ok, size_t output_mark, size_t carry_limit);
/* The start of a request Python's parser held, handed back: the next read
 * is appended to it (the loop must hold nothing yet). 0, or -1 (closed,
 * already holding, no memory). */
int nl_conn_carry(nl_conn *conn, const char *data, size_t len);
/* Queue data and write what the socket takes now (Python's replies, after
 * the AOF flush). Returns 0, or -1 when the connection is closed. */
int nl_conn_write(nl_conn *conn, const char *data, size_t len);
size_t nl_conn_pending(nl_conn *conn);  /* output not written yet */
size_t nl_conn_carried(nl_conn *conn);  /* start of a request held */
void nl_conn_set_water(nl_conn *conn, size_t water);
void nl_conn_pause_reading(nl_conn *conn, int paused);
/* Close once the output is written (now = 0), or at once, dropping it. */
void nl_conn_close(nl_conn *conn, int now);
int nl_conn_closed(nl_conn *conn);
/* What CLIENT LIST shows of a connection the loop served, kept here rather
 * than told to Python per request: lane_call.last_command of the lane's last
 * run if it ran any since the last call (0: none), and when bytes of it were
 * last read (CLOCK_REALTIME, us; 0: never). */
int nl_conn_activity(nl_conn *conn, int64_t *read_us);
/* Python's transport is gone: free the connection (closing it first). */
void nl_conn_free(nl_conn *conn);

/* Read every ready connection once, run the lane, hand the rest over.
 * Returns the number of events handled, -1 on an epoll error. */
int nl_poll(nl_loop *loop);
/* nl_poll(), then, while what the lane ran needs nothing of Python (no
 * bytes, close or limit handed over, no AOF bytes), nl_flush() and
 * nl_poll() again: up to rounds polls, and no new one once budget_us
 * (monotonic) have passed. The requests that arrived meanwhile are served
 * without a return to Python; the batch is one for all the rounds, and
 * the last poll's replies wait for Python's flush. Returns the events
 * handled, -1 on an epoll error before any. */
int nl_run(nl_loop *loop, int rounds, int64_t budget_us);
/* COALESCING: once a poll of nl_run() found NL_COALESCE_EVENTS (4) or more
 * ready connections and the next finds fewer, the loop sleeps usec before
 * polling again (0: never). */
void nl_set_coalesce(nl_loop *loop, int64_t usec);
/* Write the output of every connection that has some (after the AOF
 * flush: the lane's replies leave only here). Returns connections written. */
size_t nl_flush(nl_loop *loop);
/* Connections with output queued since the last nl_flush(). */
size_t nl_dirty(nl_loop *loop);
/* The AOF could not take this batch's writes: drop every reply queued
 * since the last flush and close those connections once what was allowed
 * out before is written. Returns how many were closed; their owners are
 * in nl_batch_owners() until nl_batch_reset(). */
size_t nl_drop_unflushed(nl_loop *loop);

/* The batch since the last nl_batch_reset(): */
const nl_counts *nl_batch_counts(nl_loop *loop);
/* Keys resolved, in the order nl_resolve_fn was asked; written: a TWRITE
 * of the lane changed the stream, or a lease read or TACK the group. */
size_t nl_batch_keys(nl_loop *loop);
int nl_batch_key_written(nl_loop *loop, size_t i);
/* AOF bytes (TWRITE requests verbatim) as runs of one append time. */
size_t nl_batch_aof_runs(nl_loop *loop);
int64_t nl_batch_aof_run(nl_loop *loop, size_t i, const char **data, size_t *len);
/* Owners of the connections the lane ran requests for or holds the start
 * of a request of (or, after nl_drop_unflushed, closed); n set to how many. */
void **nl_batch_owners(nl_loop *loop, size_t *n);
/* Slow commands (SLOWLOG, LATENCY): their request, owner and time. */
size_t nl_batch_slow_count(nl_loop *loop);
uint64_t nl_batch_slow(nl_loop *loop, size_t i, void **owner, const char **request, size_t *len);
/* Whether anything above is set (the batch needs folding into Python). */
int nl_batch_pending(nl_loop *loop);
void nl_batch_reset(nl_loop *loop);

/* CDEF-END */

#endif /* RCP11_NETLOOP_H */
