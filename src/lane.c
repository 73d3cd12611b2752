/* lane.c -- the C lane: the hot stream commands run straight from the read
 * buffer, in front of the Python general path.
 *
 * WHERE IT SITS
 * =============
 *
 *   socket read ──> lane_run(buf) ──consumed──> RequestParser(buf[consumed:])
 *                      │                                 │
 *                      │ TWRITE, TREAD key off count     │ everything else
 *                      ▼                                 ▼
 *                  mn_append / mn_read_resp      commands.run_pipeline()
 *                      │                                 │
 *                      └──── reply bytes, AOF bytes ─────┘ (same out list)
 *
 * The Python general path (rcp11/commands) is the reference: for every
 * request the lane runs, the reply, the AOF bytes, the stream and every
 * counter must be what that path would have produced. The lane therefore
 * runs a request only when it can prove that; at the first request it
 * cannot, it stops and returns how many bytes it consumed, and Python
 * parses and runs the rest (rcp11/commands/lane.py decides, once per call,
 * what no request can change: MULTI, MONITOR, AUTH, rename-command,
 * loading, RESP3, MISCONF; and how much memory maxmemory leaves).
 *
 * WHAT IT RUNS
 * ============
 *
 *   TWRITE key value                      -> :<offset>
 *   TWRITE key [BACKLOG n] ENTRIES e...   -> :<first offset>
 *   TREAD key offset count [WITHINFO] [NONULLS] [WITHTIMES]
 *                                         -> *n bulks (WITHINFO: *n+1, *4 info first;
 *                                            WITHTIMES: *2n, a bulk and a time each)
 *   TREAD key offset count [WITHINFO] [NONULLS] [WITHTIMES] BLOCK ms   (any order)
 *                                         -> the same reply, when it answers at once
 *
 * A BLOCK read is two commands in one: a read that answers at once, and a
 * wait. The general path waits exactly when the start offset (offset, or
 * next - |offset| floored at 0) is at or past the stream's next offset;
 * below it, the reply, the counters (calls, usec, messages read) and the
 * absence of any AOF record are those of the same read without BLOCK, and
 * the timeout is parsed and then never used. So the lane runs the first
 * half and hands the second over:
 *
 *               start < next ──> read as without BLOCK (the lane)
 *   TREAD .. BLOCK ms ─┤
 *               start >= next ─> stop before it (LANE_STOP_WAIT): Python
 *                                parses it again and blocks the client
 *
 * The wait never runs here: the blocking registry, timeouts, CLIENT
 * UNBLOCK and the pipeline that resumes afterwards are Python's. A missing
 * key is refused by the resolver, so a BLOCK read on it (which always
 * waits) stops the lane too.
 *
 * Anything else stops the lane before it: another command, GROUP or
 * GROUPNEW, any argument the Python path would answer with an error (bad
 * arity, a number that is not canonical, a negative count or timeout,
 * BLOCK without its value, an option twice, an unknown option), and any
 * key the resolver refuses (missing, wrong type, a TTL; a waiter or a
 * WATCH stops writes only; see lane_resolve_fn). The lane never produces
 * an error reply: errors, with their counters and texts, stay in one place.
 *
 * THE REQUEST FORM
 * ================
 *
 * Only the canonical form of a RESP request is read, the one every client
 * library writes and the one the AOF holds:
 *
 *   *<argc>\r\n  ( $<len>\r\n <len bytes> \r\n ){argc}
 *
 * with argc and len written in decimal without sign or leading zeros
 * (argc >= 1). Such a request is exactly encode_command(argv) of its
 * arguments, so when the AOF is on, a TWRITE is logged by copying its
 * request bytes verbatim: no re-encoding. Inline requests, "*0", a
 * non-canonical length, or a length over the configured limits stop the
 * lane, and the Python parser gives its protocol error (or parses the
 * form it accepts). The parser does not use hiredis's reader: that reader
 * copies every fed byte into its own buffer, accepts non-canonical
 * lengths (the AOF copy would then differ), and would still need this
 * check of the framing; reading the canonical form in place is one pass
 * with no copy.
 *
 * An argument is a (pointer, length) pair into the caller's buffer:
 *
 *   buf:  *3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$5\r\nhello\r\n
 *                     ^ args[0]        ^ args[1] ^ args[2]
 *
 * Entries of TWRITE ... ENTRIES are not contiguous in the buffer (headers
 * sit between them), so they are copied back to back into a scratch
 * buffer for one atomic mn_append(); the simple form appends in place.
 *
 * MEMORY
 * ======
 *
 * The reply and AOF buffers are mn_bufs that the core appends to
 * (mn_read_resp_prefixed) and frees (mn_buf_free) as well as this file:
 * both must get their memory from one allocator, so a build that routes
 * the core's allocations elsewhere (tests/c/alloc_hook.h) routes the lane's
 * too. Scratch (argument table, joined entries, lengths) lives in the
 * lane_call and is reused from read to read.
 *
 * LIMITS
 * ======
 *
 * The caller bounds each run: max_commands requests (the pipeline reads
 * the clock between turns), reply_mark bytes of reply (output limits are
 * looked at between commands; a TREAD whose reply would pass the mark is
 * left to the general path, which refuses a reply over the client's hard
 * limit without building it), and aof_room bytes of AOF (the AOF's disk
 * space is reserved ahead; the general path asks again when it nears the
 * end of the reservation). Each key gets a write_limit: a TWRITE whose next
 * offset would pass it (an offset reservation must be written first, or
 * the offset would pass 2^63-1) stops the lane.
 *
 * EXEC runs its queued TWRITEs and TREADs through the lane too
 * (rcp11/commands/lane.py run_queued): they are encoded canonically and run
 * here as a read is, with LANE_FIXED_TIME giving every TWRITE the
 * transaction's one append time, as the general path does inside EXEC.
 * Whatever the lane stops before, the general path runs, so a stop is never
 * wrong there either (EXEC refuses for MISCONF and OOM as a whole, before
 * any command runs; a stop for memory or MISCONF is then only slower).
 *
 * With maxmemory, the general path refuses a TWRITE (or evicts, under
 * streams-oldest) when the used memory before it is over the limit. The
 * caller passes memory_room, the limit minus the used memory when the run
 * starts; the lane adds up what its TWRITEs (and their BACKLOG evictions)
 * change in each stream's memory (mn_memory_bytes, which is exactly what
 * the general path counts for a stream), and what its lease reads change in
 * their groups' memory (ag_memory_bytes), and stops before the TWRITE that
 * finds it over the room. No new key is created here (the resolver
 * refuses missing keys), so nothing else in the used memory moves.
 *
 * SLOW COMMANDS
 * =============
 *
 * A command that ran at least slow_usec microseconds (the smaller of the
 * slow log's and the latency monitor's thresholds) is recorded in slow[]
 * with where its request sits in the buffer, so Python can show it in
 * SLOWLOG GET with its arguments; the run stops once slow[] is full, so
 * none goes unrecorded (with the slow log at 0, every command is slow and
 * a run is LANE_MAX_SLOW commands).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif

#include "lane.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Argument counts beyond this stop the lane (the general path has no such
 * limit): TWRITE ENTRIES with more entries than this is rare, and the
 * argument table stays small. */
#define LANE_MAX_ARGS 65536

/* Digits of a canonical length: 18 cannot overflow int64; larger lengths
 * are over every limit anyway. */
#define LANE_MAX_DIGITS 18

/* The largest value a RESP integer reply (and a stream offset) takes. */
#define LANE_INT64_MAX 9223372036854775807LL

typedef struct lane_arg {
    const char *p;
    size_t len;
} lane_arg;

void lane_call_init(lane_call *call) {
    memset(call, 0, sizeof *call);
    call->slow_usec = UINT64_MAX;
    mn_buf_init(&call->reply);
    mn_buf_init(&call->aof);
    mn_buf_init(&call->scratch_entries);
}

void lane_call_reset(lane_call *call) {
    call->reply.len = 0;
    call->aof.len = 0;
    call->stop = LANE_STOP_END;
    call->last_command = 0;
    call->twrite_calls = call->twrite_usec = 0;
    call->tread_calls = call->tread_usec = 0;
    call->messages_written = call->messages_read = call->messages_evicted = 0;
    call->group_changes = 0;
    call->memory_grown = 0;
    call->nslow = 0;
    call->append_ms = -1;
    call->nkeys = 0;
}

void lane_call_free(lane_call *call) {
    mn_buf_free(&call->reply);
    mn_buf_free(&call->aof);
    mn_buf_free(&call->scratch_entries);
    free(call->scratch_args);
    free(call->scratch_lens);
    call->scratch_args = NULL;
    call->scratch_lens = NULL;
    call->scratch_args_cap = call->scratch_lens_cap = 0;
}

/* ------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------- */

static int buf_reserve(mn_buf *b, size_t more) {
    if (b->cap - b->len >= more) return 0;
    size_t want = b->cap ? b->cap : 256;
    while (want - b->len < more) {
        if (want > SIZE_MAX / 2) return -1;
        want *= 2;
    }
    char *p = realloc(b->data, want);
    if (p == NULL) return -1;
    b->data = p;
    b->cap = want;
    return 0;
}

static int buf_add(mn_buf *b, const char *p, size_t len) {
    if (buf_reserve(b, len)) return -1;
    if (len) memcpy(b->data + b->len, p, len);
    b->len += len;
    return 0;
}

/* "<c><int>\r\n" (c is ':' or '*'). */
static int buf_add_int(mn_buf *b, char c, int64_t v) {
    char tmp[32];
    char *end = tmp + sizeof tmp;
    char *p = end;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    *--p = '\n';
    *--p = '\r';
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    *--p = c;
    return buf_add(b, p, (size_t)(end - p));
}

/* A canonical decimal length at p (digits up to "\r\n"): no sign, no
 * leading zero. Returns the index after "\r\n", 0 when the line is not
 * complete yet, -1 when it is not canonical. */
static long read_length(const char *p, size_t avail, uint64_t *out) {
    size_t i = 0;
    uint64_t v = 0;
    while (i < avail && p[i] >= '0' && p[i] <= '9') {
        if (i == LANE_MAX_DIGITS) return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
        i++;
    }
    if (i == avail || (i + 1 == avail && p[i] == '\r')) return 0;
    if (i == 0 || (p[0] == '0' && i > 1) || p[i] != '\r' || p[i + 1] != '\n') return -1;
    *out = v;
    return (long)(i + 2);
}

/* Redis's string2ll() as rcp11.commands.args.parse_int reads it: "0", or
 * an optional '-' then 1-9 then digits, within int64. */
static int parse_int64(const char *p, size_t len, int64_t *out) {
    if (len == 0 || len > 20) return -1;
    size_t i = 0;
    int neg = 0;
    if (p[0] == '-') {
        neg = 1;
        i = 1;
        if (len == 1) return -1;
    }
    if (p[i] == '0') {
        if (len == 1) {
            *out = 0;
            return 0;
        }
        return -1;
    }
    uint64_t v = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (neg) {
        if (v > (uint64_t)LANE_INT64_MAX + 1) return -1;
        *out = v == (uint64_t)LANE_INT64_MAX + 1 ? (-LANE_INT64_MAX - 1) : -(int64_t)v;
    } else {
        if (v > (uint64_t)LANE_INT64_MAX) return -1;
        *out = (int64_t)v;
    }
    return 0;
}

static int word_is(const lane_arg *a, const char *upper) {
    size_t n = strlen(upper);
    if (a->len != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = a->p[i];
        if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
        if (c != upper[i]) return 0;
    }
    return 1;
}

/* The wall clock in unix ms, as the core reads it for MN_NOW. */
static int64_t wall_ms(void) {
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0;
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------
 * Parsing one request
 * --------------------------------------------------------------------- */

/* Parse the canonical request at buf[0..len). Returns its size and fills
 * call->scratch_args / *argc; 0 when it is not complete; -1 when the lane
 * must not read it (not canonical, over a limit, no memory). */
static long parse_request(lane_call *call, const char *buf, size_t len, size_t *argc) {
    if (len == 0) return 0;
    if (buf[0] != '*') return -1;
    uint64_t count;
    long at = read_length(buf + 1, len - 1, &count);
    if (at <= 0) return at;
    if (count == 0 || count > call->max_multibulk_len || count > LANE_MAX_ARGS) return -1;
    size_t pos = 1 + (size_t)at;
    if (call->scratch_args_cap < count) {
        size_t cap = call->scratch_args_cap ? call->scratch_args_cap : 64;
        while (cap < count) cap *= 2;
        void *p = realloc(call->scratch_args, cap * sizeof(lane_arg));
        if (p == NULL) return -1;
        call->scratch_args = p;
        call->scratch_args_cap = cap;
    }
    lane_arg *args = call->scratch_args;
    for (uint64_t i = 0; i < count; i++) {
        if (pos >= len) return 0;
        if (buf[pos] != '$') return -1;
        uint64_t blen;
        long h = read_length(buf + pos + 1, len - pos - 1, &blen);
        if (h <= 0) return h;
        if (blen > call->max_bulk_len) return -1;
        pos += 1 + (size_t)h;
        if (len - pos < blen + 2) return 0;
        if (buf[pos + blen] != '\r' || buf[pos + blen + 1] != '\n') return -1;
        args[i].p = buf + pos;
        args[i].len = (size_t)blen;
        pos += (size_t)blen + 2;
    }
    *argc = (size_t)count;
    return (long)pos;
}

/* Whether slot k may serve as a stream (group 0) or an acknowledged group
 * (group 1). */
static lane_key *slot_for(lane_key *k, int group) {
    return k->allowed && (group ? k->group != NULL : k->stream != NULL) ? k : NULL;
}

/* The key slot of `key` holding a stream (group 0) or an acknowledged
 * group (group 1), resolving it on first sight; NULL stops. */
static lane_key *key_slot(lane_call *call, const lane_arg *key, int group) {
    for (size_t i = 0; i < call->nkeys; i++) {
        lane_key *k = &call->keys[i];
        if (k->key_len == key->len && memcmp(k->key, key->p, key->len) == 0)
            return slot_for(k, group);
    }
    if (call->nkeys == LANE_MAX_KEYS) return NULL;
    lane_key *k = &call->keys[call->nkeys];
    k->key = key->p;
    k->key_len = key->len;
    k->stream = NULL;
    k->group = NULL;
    k->write_limit = 0;
    k->written = 0;
    k->allowed = call->resolve(call, key->p, key->len, &k->stream, &k->group, &k->write_limit);
    call->nkeys++; /* a refused key is remembered too: it is not asked twice */
    return slot_for(k, group);
}

/* ------------------------------------------------------------------------
 * The commands
 * --------------------------------------------------------------------- */

/* TWRITE. Returns 0 when it ran, -1 when the lane stops before it. */
static int run_twrite(lane_call *call, const lane_arg *args, size_t argc, const char *req,
                      size_t req_len) {
    if (argc < 3 || !call->writes) return -1;
    size_t first_entry = 2;
    int64_t backlog = -1;
    if (argc > 3) {
        size_t i = 2;
        for (;;) {
            if (i >= argc) return -1; /* ENTRIES is missing */
            if (word_is(&args[i], "ENTRIES")) {
                i++;
                break;
            }
            if (!word_is(&args[i], "BACKLOG") || backlog >= 0 || i + 1 >= argc) return -1;
            if (parse_int64(args[i + 1].p, args[i + 1].len, &backlog) || backlog < 0) return -1;
            i += 2;
        }
        if (i >= argc) return -1; /* no entry after ENTRIES */
        first_entry = i;
    }
    size_t n = argc - first_entry;
    if (call->log_writes && call->aof.len > call->aof_room) return -1;
    lane_key *k = key_slot(call, &args[1], 0);
    if (k == NULL) return -1;
    if (!(k->allowed & LANE_KEY_WRITE)) {
        call->stop = LANE_STOP_KEY;
        return -1;
    }
    if (call->memory_limited && call->memory_grown > call->memory_room) {
        call->stop = LANE_STOP_BUDGET; /* the general path refuses it, or evicts first */
        return -1;
    }
    uint64_t next = mn_next_offset(k->stream);
    uint64_t new_next = next + n;
    if (new_next - 1 > (uint64_t)LANE_INT64_MAX || new_next < next) return -1;
    uint64_t capped = new_next > (uint64_t)LANE_INT64_MAX ? (uint64_t)LANE_INT64_MAX : new_next;
    if (capped > k->write_limit) {
        call->stop = LANE_STOP_KEY;
        return -1;
    }
    for (size_t i = first_entry; i < argc; i++)
        if (args[i].len > MN_MAX_MESSAGE_BYTES) return -1;
    /* Room for the reply and the AOF copy first: once appended, the write
     * must be answered and logged. */
    if (buf_reserve(&call->reply, 32)) return -1;
    if (call->log_writes && buf_reserve(&call->aof, req_len)) return -1;
    uint64_t started = now_ns();
    if (call->append_ms < 0) call->append_ms = call->fixed_time ? call->fixed_ms : wall_ms();
    int64_t memory_before = (int64_t)mn_memory_bytes(k->stream);
    int64_t first;
    if (n == 1) {
        first = mn_append_one(k->stream, args[first_entry].p, (uint32_t)args[first_entry].len,
                              call->append_ms);
    } else {
        if (call->scratch_lens_cap < n) {
            uint32_t *p = realloc(call->scratch_lens, n * sizeof(uint32_t));
            if (p == NULL) return -1;
            call->scratch_lens = p;
            call->scratch_lens_cap = n;
        }
        mn_buf *joined = &call->scratch_entries;
        joined->len = 0;
        for (size_t i = 0; i < n; i++) {
            const lane_arg *e = &args[first_entry + i];
            if (buf_add(joined, e->p, e->len)) return -1;
            call->scratch_lens[i] = (uint32_t)e->len;
        }
        first = mn_append(k->stream, joined->data, call->scratch_lens, n, call->append_ms);
    }
    if (first < 0) return -1; /* nothing was appended: Python answers */
    k->written = 1;
    if (backlog >= 0) {
        int64_t evicted = mn_evict_keep(k->stream, (uint64_t)backlog);
        if (evicted > 0) call->messages_evicted += (uint64_t)evicted;
    }
    call->memory_grown += (int64_t)mn_memory_bytes(k->stream) - memory_before;
    buf_add_int(&call->reply, ':', first); /* reserved above: cannot fail */
    if (call->log_writes) buf_add(&call->aof, req, req_len);
    call->twrite_usec += (now_ns() - started) / 1000;
    call->twrite_calls++;
    call->messages_written += n;
    call->last_command = 1;
    return 0;
}

/* TREAD's options after key offset count, as the general path reads them
 * (any order, each at most once): WITHINFO, NONULLS, WITHTIMES and BLOCK
 * ms. Returns 0 and sets t's flags (block: 1 when BLOCK was given with a
 * valid timeout); -1 for anything the general path would refuse (an
 * option twice, an unknown one, BLOCK without a value, a timeout that is
 * not a canonical int64 or is negative) or that the lane does not run
 * (GROUP, GROUPNEW, PACKED).
 *
 *   args:  TREAD key offset count [WITHINFO] [NONULLS] [WITHTIMES] [BLOCK ms]
 *          0     1   2      3     4 ...                          (any order)
 *
 * The timeout's value is not kept: the lane runs a BLOCK read only when it
 * answers at once, and then the general path never looks at it either. */
typedef struct tread_flags {
    int withinfo, nonulls, withtimes, block;
} tread_flags;

static int tread_options(const lane_arg *args, size_t argc, tread_flags *t) {
    static const char *const words[] = {"WITHINFO", "NONULLS", "WITHTIMES"};
    int *flags[] = {&t->withinfo, &t->nonulls, &t->withtimes};
    t->withinfo = t->nonulls = t->withtimes = t->block = 0;
    for (size_t i = 4; i < argc;) {
        int word = -1;
        for (int w = 0; w < 3; w++)
            if (word_is(&args[i], words[w])) word = w;
        if (word >= 0) {
            if (*flags[word]) return -1;
            *flags[word] = 1;
            i++;
        } else if (word_is(&args[i], "BLOCK")) {
            int64_t timeout;
            if (t->block || i + 1 >= argc) return -1;
            if (parse_int64(args[i + 1].p, args[i + 1].len, &timeout) || timeout < 0) return -1;
            t->block = 1;
            i += 2;
        } else {
            return -1;
        }
    }
    return 0;
}

/* TREAD key offset count [WITHINFO] [NONULLS] [WITHTIMES] [BLOCK ms].
 * Returns 0 when it ran, -1 to stop. (The lane serves RESP2 only: WITHTIMES
 * is a flat message, time, message, time ... there.) A BLOCK read runs
 * only when it answers at once, which is when the general path's
 * (tread_command) does not wait: its start offset (with NONULLS, the first
 * readable one at or after it) is below the stream's next offset. At or
 * past it the general path would block (or, inside MULTI, which never
 * reaches the lane, answer): the lane stops before the request. Other
 * options: a lease read, or Python's. */
static int run_lease_read(lane_call *call, const lane_arg *args, size_t argc);

static int run_tread(lane_call *call, const lane_arg *args, size_t argc) {
    if (argc < 4) return -1;
    tread_flags t;
    if (argc > 9 || tread_options(args, argc, &t)) return run_lease_read(call, args, argc);
    int64_t offset, count;
    if (parse_int64(args[2].p, args[2].len, &offset)) return -1;
    if (parse_int64(args[3].p, args[3].len, &count) || count < 0) return -1;
    lane_key *k = key_slot(call, &args[1], 0);
    if (k == NULL || !(k->allowed & LANE_KEY_READ)) {
        call->stop = LANE_STOP_KEY;
        return -1;
    }
    uint64_t started = now_ns();
    uint64_t next = mn_next_offset(k->stream);
    uint64_t start;
    if (offset >= 0) {
        start = (uint64_t)offset;
    } else {
        uint64_t back = (uint64_t)0 - (uint64_t)offset;
        start = back >= next ? 0 : next - back;
    }
    uint64_t n;
    if (t.nonulls) {
        /* Past evicted offsets and crash gaps, up to the next null. */
        start = mn_readable_run(k->stream, start, (uint64_t)count, &n);
    } else {
        n = start < next ? next - start : 0;
        if ((uint64_t)count < n) n = (uint64_t)count;
    }
    if (t.block && start >= next) {
        call->stop = LANE_STOP_WAIT;
        return -1; /* it would wait: Python blocks the client */
    }
    /* Two elements per offset with times: a count past 2^62 offsets (no
     * reply that large fits in memory) is Python's to refuse. */
    if (t.withtimes && n > (uint64_t)LANE_INT64_MAX / 2) return -1;
    int64_t elements = t.withtimes ? 2 * (int64_t)n : (int64_t)n;
    char head[160];
    mn_buf h = {head, 0, sizeof head};
    /* head has room for two headers and four integers: no allocation. */
    if (t.withinfo) {
        uint64_t first = mn_first_offset(k->stream);
        if (first > (uint64_t)LANE_INT64_MAX) first = (uint64_t)LANE_INT64_MAX;
        uint64_t shown_start = start > (uint64_t)LANE_INT64_MAX ? (uint64_t)LANE_INT64_MAX : start;
        buf_add_int(&h, '*', elements + 1);
        buf_add_int(&h, '*', 4);
        buf_add_int(&h, ':', (int64_t)first);
        buf_add_int(&h, ':', (int64_t)(next - 1));
        buf_add_int(&h, ':', (int64_t)shown_start);
        buf_add_int(&h, ':', (int64_t)n);
    } else {
        buf_add_int(&h, '*', elements);
    }
    if (n == 0) {
        if (buf_add(&call->reply, h.data, h.len)) return -1;
    } else {
        /* A reply that would take the run past reply_mark is not built
         * here: the general path holds it to the client's hard output
         * limit (one TREAD of a million messages must not be built for a
         * client it will close). */
        uint64_t room = call->reply_mark > call->reply.len ? call->reply_mark - call->reply.len : 0;
        int style = MN_NULL_RESP2 | (t.withtimes ? MN_READ_WITH_TIMES : 0);
        int rc = mn_read_resp_capped(k->stream, start, n, style, h.data, h.len, room, NULL,
                                     &call->reply);
        if (rc == MN_ERR_CAP) call->stop = LANE_STOP_BUDGET;
        if (rc != MN_OK) return -1; /* nothing appended; Python answers (or fails) the same read */
    }
    call->tread_usec += (now_ns() - started) / 1000;
    call->tread_calls++;
    call->messages_read += n;
    call->last_command = 2;
    return 0;
}

/* ------------------------------------------------------------------------
 * Lease reads of acknowledged groups
 * --------------------------------------------------------------------- */

/* The options of TREAD key offset count GROUP|GROUPNEW g LEASE ms
 * [CONSUMER name] [ACK start count] [WITHINFO] [BLOCK ms]. */
typedef struct lane_lease {
    const lane_arg *group;
    const lane_arg *consumer; /* NULL: the empty name */
    int64_t lease_ms;
    int ack;
    int64_t ack_start, ack_count;
} lane_lease;

/* Parse a lease read's options as the general path does (any order, each
 * at most once); -1 for anything it would refuse or that is no lease read
 * (a plain GROUP read). The BLOCK timeout is checked, then not needed: the
 * lane runs only lease reads that deliver at once. */
static int lease_options(const lane_arg *args, size_t argc, lane_lease *o) {
    int withinfo = 0, block = 0, lease = 0, groups = 0;
    memset(o, 0, sizeof *o);
    for (size_t i = 4; i < argc;) {
        const lane_arg *a = &args[i];
        if (word_is(a, "WITHINFO")) {
            if (withinfo++) return -1;
            i++;
            continue;
        }
        if (word_is(a, "ACK")) {
            if (o->ack || i + 2 >= argc) return -1;
            if (parse_int64(args[i + 1].p, args[i + 1].len, &o->ack_start) || o->ack_start < 0)
                return -1;
            if (parse_int64(args[i + 2].p, args[i + 2].len, &o->ack_count) || o->ack_count < 0)
                return -1;
            o->ack = 1;
            i += 3;
            continue;
        }
        if (i + 1 >= argc) return -1;
        const lane_arg *v = &args[i + 1];
        int64_t n;
        if (word_is(a, "BLOCK")) {
            if (block++ || parse_int64(v->p, v->len, &n) || n < 0) return -1;
        } else if (word_is(a, "GROUP") || word_is(a, "GROUPNEW")) {
            /* Either once; the two together is an error too. */
            if (groups++) return -1;
            o->group = v;
        } else if (word_is(a, "LEASE")) {
            if (lease++ || parse_int64(v->p, v->len, &o->lease_ms) || o->lease_ms < 1 ||
                o->lease_ms > AG_MAX_LEASE_MS)
                return -1;
        } else if (word_is(a, "CONSUMER")) {
            if (o->consumer != NULL || v->len > AG_MAX_OWNER_BYTES) return -1;
            o->consumer = v;
        } else {
            return -1;
        }
        i += 2;
    }
    return lease && o->group != NULL ? 0 : -1;
}

/* One bulk string of an AOF record (room reserved by the caller). */
static void aof_bulk(mn_buf *b, const char *p, size_t len) {
    buf_add_int(b, '$', (int64_t)len);
    buf_add(b, p, len);
    buf_add(b, "\r\n", 2);
}

static void aof_number(mn_buf *b, int64_t v) {
    char tmp[32];
    mn_buf t = {tmp, 0, sizeof tmp};
    buf_add_int(&t, ':', v); /* ":<digits>\r\n": the digits are the bulk */
    aof_bulk(b, tmp + 1, t.len - 3);
}

/* `RCP11.LEASE g key floor start count deadline deliveries consumer`, as
 * rcp11/commands/groups.py logs it. */
static void aof_lease(lane_call *call, const lane_arg *stream, const lane_lease *o, uint64_t floor,
                      const ag_choice *c, int64_t deadline) {
    mn_buf *b = &call->aof;
    buf_add_int(b, '*', 9);
    aof_bulk(b, "RCP11.LEASE", 11);
    aof_bulk(b, o->group->p, o->group->len);
    aof_bulk(b, stream->p, stream->len);
    aof_number(b, (int64_t)floor);
    aof_number(b, (int64_t)c->start);
    aof_number(b, (int64_t)c->count);
    aof_number(b, deadline);
    aof_number(b, (int64_t)c->deliveries);
    if (o->consumer != NULL) aof_bulk(b, o->consumer->p, o->consumer->len);
    else aof_bulk(b, "", 0);
}

/* A lease read (docs/PROTOCOL.md, "Acknowledged groups"), when its group
 * exists, belongs to the stream and the read delivers new messages (so it
 * never waits and its pick cannot come up empty, whatever the ACK does):
 * the general path's lease_read() in C. Redeliveries only, empty reads,
 * missing or plain group keys and every error stay Python's. Returns 0
 * when it ran, -1 to stop (having changed nothing, or having logged what
 * changed when memory failed half way: Python then runs it again). */
static int run_lease_read(lane_call *call, const lane_arg *args, size_t argc) {
    lane_lease o;
    int64_t offset, count;
    if (lease_options(args, argc, &o)) return -1;
    if (parse_int64(args[2].p, args[2].len, &offset)) return -1;
    if (parse_int64(args[3].p, args[3].len, &count) || count <= 0) return -1;
    if (!call->writes) return -1; /* it changes the group: MISCONF, maxmemory */
    if (o.group->len == args[1].len && memcmp(o.group->p, args[1].p, args[1].len) == 0) return -1;
    if (call->log_writes && call->aof.len > call->aof_room) return -1;
    lane_key *s = key_slot(call, &args[1], 0);
    lane_key *g = s == NULL ? NULL : key_slot(call, o.group, 1);
    if (g == NULL || !(s->allowed & LANE_KEY_READ) || !(g->allowed & LANE_KEY_WRITE)) {
        call->stop = LANE_STOP_KEY;
        return -1;
    }
    ag_group *group = g->group;
    if (ag_stream_name_len(group) != args[1].len ||
        memcmp(ag_stream_name(group), args[1].p, args[1].len) != 0)
        return -1; /* another stream's group: Python's error */
    uint64_t floor = mn_first_offset(s->stream), end = mn_next_offset(s->stream);
    uint64_t from = ag_next(group) > floor ? ag_next(group) : floor;
    if (from >= end) return -1; /* nothing new: a redelivery, an empty read or a wait */
    const char *owner = o.consumer != NULL ? o.consumer->p : "";
    size_t owner_len = o.consumer != NULL ? o.consumer->len : 0;
    /* What the group's pending ranges grow (or shrink) counts against
     * maxmemory as a TWRITE's growth does: the general path's used memory
     * includes every group, so a later TWRITE of this run must see it. */
    int64_t group_memory = (int64_t)ag_memory_bytes(group);
    /* Room for the log first: once the group changed it must be logged. */
    if (call->log_writes &&
        buf_reserve(&call->aof, 512 + args[1].len + 2 * o.group->len + owner_len))
        return -1;
    uint64_t started = now_ns();
    int64_t now = call->lease_clock_ms ? call->lease_clock_ms : wall_ms();
    int64_t deadline = now + o.lease_ms;
    if (o.ack) {
        int64_t acked = ag_ack(group, (uint64_t)o.ack_start, (uint64_t)o.ack_count);
        if (acked < 0) return -1; /* out of memory, nothing changed */
        if (acked > 0) {
            g->written = 1;
            call->group_changes++;
            if (call->log_writes) {
                buf_add_int(&call->aof, '*', 4);
                aof_bulk(&call->aof, "TACK", 4);
                aof_bulk(&call->aof, o.group->p, o.group->len);
                aof_number(&call->aof, o.ack_start);
                aof_number(&call->aof, o.ack_count);
            }
        }
    }
    ag_choice c;
    ag_pick(group, now, floor, end, (uint64_t)count, &c); /* new messages: count >= 1 */
    char head[200];
    mn_buf h = {head, 0, sizeof head};
    uint64_t shown_first = floor > (uint64_t)LANE_INT64_MAX ? (uint64_t)LANE_INT64_MAX : floor;
    buf_add_int(&h, '*', (int64_t)c.count + 1);
    buf_add_int(&h, '*', 6);
    buf_add_int(&h, ':', (int64_t)shown_first);
    buf_add_int(&h, ':', (int64_t)(end - 1));
    buf_add_int(&h, ':', (int64_t)c.start);
    buf_add_int(&h, ':', (int64_t)c.count);
    buf_add_int(&h, ':', (int64_t)c.deliveries);
    buf_add_int(&h, ':', deadline);
    size_t before = call->reply.len;
    int floored = 0;
    int rc = mn_read_resp_prefixed(s->stream, c.start, c.count, MN_NULL_RESP2, h.data, h.len,
                                   &call->reply);
    if (rc == MN_OK) {
        ag_choice took;
        int64_t took_deadline;
        floored = 1;
        rc = ag_take(group, now, floor, end, (uint64_t)count, o.lease_ms, owner, owner_len, &took,
                     &took_deadline);
    }
    if (rc != MN_OK) {
        /* Out of memory half way: the reply goes, what changed is logged
         * (the ACK above; ag_take drops the evicted part before it leases,
         * which a lease of nothing at the floor records), and Python runs
         * the request again from there. */
        call->reply.len = before;
        call->stop = LANE_STOP_BUDGET;
        if (floored) {
            ag_choice none = {from, 0, 0};
            g->written = 1;
            call->group_changes++;
            if (call->log_writes) aof_lease(call, &args[1], &o, floor, &none, 0);
        }
        call->memory_grown += (int64_t)ag_memory_bytes(group) - group_memory;
        return -1;
    }
    call->memory_grown += (int64_t)ag_memory_bytes(group) - group_memory;
    g->written = 1;
    call->group_changes++;
    if (call->log_writes) aof_lease(call, &args[1], &o, floor, &c, deadline);
    call->tread_usec += (now_ns() - started) / 1000;
    call->tread_calls++;
    call->messages_read += c.count;
    call->last_command = 2;
    return 0;
}

/* ------------------------------------------------------------------------
 * The run
 * --------------------------------------------------------------------- */

size_t lane_run(lane_call *call, const char *buf, size_t len, size_t reply_mark, int flags,
                size_t aof_room, int64_t memory_room) {
    size_t pos = 0;
    uint64_t ran = 0;
    lane_call_reset(call);
    call->reply_mark = reply_mark;
    call->writes = (flags & LANE_WRITES) != 0;
    call->log_writes = (flags & LANE_LOG_WRITES) != 0;
    call->aof_room = aof_room;
    call->memory_limited = (flags & LANE_MEMORY_ROOM) != 0;
    call->memory_room = memory_room;
    call->fixed_time = (flags & LANE_FIXED_TIME) != 0;
    while (pos < len) {
        if (ran >= call->max_commands || call->reply.len > call->reply_mark) {
            call->stop = LANE_STOP_BUDGET;
            break;
        }
        size_t argc = 0;
        long size = parse_request(call, buf + pos, len - pos, &argc);
        if (size == 0) break; /* incomplete: Python buffers it */
        if (size < 0) {
            call->stop = LANE_STOP_REQUEST;
            break;
        }
        const lane_arg *args = call->scratch_args;
        int rc = -1;
        int stop_before = call->stop;
        /* Each command adds its own duration to one of these sums. */
        uint64_t usec_before = call->twrite_usec + call->tread_usec;
        if (word_is(&args[0], "TWRITE"))
            rc = run_twrite(call, args, argc, buf + pos, (size_t)size);
        else if (word_is(&args[0], "TREAD"))
            rc = run_tread(call, args, argc);
        if (rc) {
            if (call->stop == stop_before) call->stop = LANE_STOP_REQUEST;
            break;
        }
        uint64_t usec = call->twrite_usec + call->tread_usec - usec_before;
        int slow_table_full = 0;
        if (usec >= call->slow_usec) {
            lane_slow *slow = &call->slow[call->nslow++];
            slow->start = pos;
            slow->len = (size_t)size;
            slow->usec = usec;
            slow_table_full = call->nslow == LANE_MAX_SLOW;
        }
        pos += (size_t)size;
        ran++;
        if (slow_table_full) {
            call->stop = LANE_STOP_BUDGET;
            break;
        }
    }
    return pos;
}
