/* lane.h -- the C lane: TWRITE and TREAD (no plain GROUP; a lease read of
 * an acknowledged group when it delivers new messages; BLOCK only when it
 * answers at once) run straight from a connection's read buffer (see the
 * essay at the top of lane.c).
 *
 * Like macronode.h, the part between CDEF-BEGIN and CDEF-END is fed to
 * cffi's cdef() (src/build_macronode.py builds both files into
 * rcp11._macronode), so it stays cdef-clean.
 */
#ifndef RCP11_LANE_H
#define RCP11_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "ackgroup.h"
#include "macronode.h"

/* CDEF-BEGIN */

/* Keys one lane_run() call may resolve; the next new key stops the lane. */
#define LANE_MAX_KEYS 16

/* Slow commands one lane_run() call records (SLOWLOG, LATENCY: see
 * lane_slow); the run stops after the last one it has room for. */
#define LANE_MAX_SLOW 8

/* What the resolver allows for a key (bits of its return value). */
#define LANE_KEY_READ 1
#define LANE_KEY_WRITE 2

/* Why lane_run() stopped (lane_call.stop). */
#define LANE_STOP_END 0       /* the buffer ended (maybe mid-request) */
#define LANE_STOP_REQUEST 1   /* a request the lane does not run: the rest is Python's */
#define LANE_STOP_KEY 2       /* a key the resolver refused, or a full key table */
#define LANE_STOP_BUDGET 3    /* output mark, AOF room, command budget, or no memory */
#define LANE_STOP_WAIT 4      /* a TREAD ... BLOCK with nothing to read yet: it waits */

struct lane_call;

/* Asked once per call for each new key: fills *stream (a stream) or
 * *group (an acknowledged group) and *write_limit (the highest next offset
 * a write may reach without asking Python, e.g. the key's offset
 * reservation mark) and returns LANE_KEY_* bits, or 0 (nothing may run on
 * this key: the lane stops before the request). */
typedef int (*lane_resolve_fn)(struct lane_call *call, const char *key, size_t key_len,
                               mn_stream **stream, ag_group **group, uint64_t *write_limit);

typedef struct lane_key {
    const char *key;        /* into the caller's buffer */
    size_t key_len;
    mn_stream *stream;
    ag_group *group;
    uint64_t write_limit;
    int allowed;            /* LANE_KEY_* */
    int written;            /* a TWRITE or a lease ran on it: it changed */
} lane_key;

/* A command that ran at least lane_call.slow_usec: where its request is
 * in the buffer lane_run() was given, and how long it ran. */
typedef struct lane_slow {
    size_t start, len;
    uint64_t usec;
} lane_slow;

typedef struct lane_call {
    /* In, set by the caller before lane_run(). */
    lane_resolve_fn resolve;
    void *owner;                 /* the caller's, for its resolver (never read here) */
    uint64_t max_bulk_len;       /* proto-max-bulk-len */
    uint64_t max_multibulk_len;  /* arguments per request */
    uint64_t max_commands;       /* requests to run at most */
    uint64_t slow_usec;          /* record commands that run this long (UINT64_MAX: none) */
    /* In, set by lane_run() from its arguments (one cffi call, no field
     * sets from Python per read). */
    size_t reply_mark;           /* stop once reply.len passed this */
    int writes;                  /* 0: TWRITE stops the lane (MISCONF, maxmemory...) */
    int log_writes;              /* 1: copy each TWRITE request to aof */
    size_t aof_room;             /* aof.len may reach this before a TWRITE */
    int memory_limited;          /* 1: maxmemory is set (memory_room applies) */
    int64_t memory_room;         /* used memory may grow by this before a TWRITE */
    int fixed_time;              /* 1: TWRITEs append at fixed_ms (LANE_FIXED_TIME) */
    int64_t fixed_ms;            /* set by the caller: a transaction's one append time */
    int64_t lease_clock_ms;      /* 0: lease reads read the wall clock; else their time (tests) */
    /* Out: emptied by each lane_run() (lane_call_reset()), then filled. */
    mn_buf reply;
    mn_buf aof;
    int stop;                    /* LANE_STOP_* */
    int last_command;            /* 0 none, 1 TWRITE, 2 TREAD */
    uint64_t twrite_calls, twrite_usec, tread_calls, tread_usec;
    uint64_t messages_written, messages_read, messages_evicted;
    /* Changes lease reads logged (a TACK for an ACK, an RCP11.LEASE each):
     * what they add to the server's dirty counter. */
    uint64_t group_changes;
    int64_t memory_grown;        /* what the run's TWRITEs added to the streams' memory */
    size_t nslow;
    lane_slow slow[LANE_MAX_SLOW];
    /* The append time (unix ms) of every TWRITE of the run: the wall clock
     * read once, at the first (-1: none ran). Python dates the run's AOF
     * bytes with it, so a replay appends them at the same time. */
    int64_t append_ms;
    size_t nkeys;
    lane_key keys[LANE_MAX_KEYS];
    /* Scratch (argument table, joined entries); freed by lane_call_free. */
    void *scratch_args;
    size_t scratch_args_cap;
    mn_buf scratch_entries;
    uint32_t *scratch_lens;
    size_t scratch_lens_cap;
} lane_call;

void lane_call_init(lane_call *call);
/* Forget the output of the last run (buffers are kept, emptied); every
 * lane_run() starts with it. */
void lane_call_reset(lane_call *call);
void lane_call_free(lane_call *call);

/* lane_run() flags. */
#define LANE_WRITES 1         /* TWRITE may run */
#define LANE_LOG_WRITES 2     /* and its request is copied to aof */
#define LANE_MEMORY_ROOM 4    /* maxmemory: a TWRITE runs while memory_grown <= memory_room */
#define LANE_FIXED_TIME 8     /* TWRITEs append at fixed_ms (set before the call), not the clock */

/* Run the requests at the start of buf[0..len) while the lane can run them
 * exactly as the Python general path would; returns how many bytes it
 * consumed (whole requests only). reply_mark, flags, aof_room and
 * memory_room set the fields of the same names. */
size_t lane_run(lane_call *call, const char *buf, size_t len, size_t reply_mark, int flags,
                size_t aof_room, int64_t memory_room);

/* CDEF-END */

#endif /* RCP11_LANE_H */
