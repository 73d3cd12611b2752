/* lane_driver.c -- exercises src/lane.c under AddressSanitizer and UBSan
 * (see run_sanitizers.sh). Exits non-zero on the first mismatch.
 *
 * lane.c and macronode.c are compiled with alloc_hook.h force-included, so
 * every allocation (the lane's argument table, joined entries, reply and
 * AOF buffers; the core's nodes and read buffers) comes to the failing
 * allocator below. That checks what a sanitizer cannot: when an allocation
 * fails, the lane stops before the request, with nothing appended,
 * answered or logged.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lane.h"

static long fail_after = -1; /* allocations left before failing; -1 = never */

static int should_fail(void) {
    if (fail_after < 0) return 0;
    if (fail_after == 0) return 1;
    fail_after--;
    return 0;
}

void *mn_test_malloc(size_t size) { return should_fail() ? NULL : malloc(size); }
void *mn_test_calloc(size_t n, size_t size) { return should_fail() ? NULL : calloc(n, size); }
void *mn_test_realloc(void *p, size_t size) { return should_fail() ? NULL : realloc(p, size); }
void mn_test_free(void *p) { free(p); }

/* lane_run() with the call's own reply_mark, writes, log_writes, aof_room,
 * memory_limited and memory_room. */
static size_t run_lane(lane_call *call, const char *buf, size_t len) {
    int flags = (call->writes ? LANE_WRITES : 0) | (call->log_writes ? LANE_LOG_WRITES : 0);
    if (call->memory_limited) flags |= LANE_MEMORY_ROOM;
    return lane_run(call, buf, len, call->reply_mark, flags, call->aof_room, call->memory_room);
}

static int failures;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                    \
        }                                                                  \
    } while (0)

/* ------------------------------------------------------------------------
 * A keyspace for the resolver: "s" and "t" are streams ("s" writable up
 * to write_limit_s, "t" read-only, and so are "k..." keys, which read
 * "t"), "g" an acknowledged group of "s" (writable) and "h" one of "t",
 * everything else is refused.
 * --------------------------------------------------------------------- */

static mn_stream *stream_s, *stream_t;
static ag_group *group_g, *group_h;
static uint64_t write_limit_s = 9223372036854775807ULL;
static int resolved;

static int resolve(lane_call *call, const char *key, size_t len, mn_stream **stream,
                   ag_group **group, uint64_t *limit) {
    (void)call;
    resolved++;
    if (len == 1 && (key[0] == 'g' || key[0] == 'h')) {
        *group = key[0] == 'g' ? group_g : group_h;
        return LANE_KEY_READ | LANE_KEY_WRITE;
    }
    if (len == 1 && key[0] == 's') {
        *stream = stream_s;
        *limit = write_limit_s;
        return LANE_KEY_READ | LANE_KEY_WRITE;
    }
    if ((len == 1 && key[0] == 't') || (len > 1 && key[0] == 'k')) {
        *stream = stream_t;
        return LANE_KEY_READ;
    }
    return 0;
}

static void fresh(lane_call *call) {
    if (stream_s) mn_stream_free(stream_s);
    if (stream_t) mn_stream_free(stream_t);
    ag_free(group_g);
    ag_free(group_h);
    stream_s = mn_stream_new(3, 0);
    stream_t = mn_stream_new(3, 0);
    group_g = ag_new("s", 1, 0);
    group_h = ag_new("t", 1, 0);
    mn_append_one(stream_t, "t0", 2, MN_NOW);
    write_limit_s = 9223372036854775807ULL;
    resolved = 0;
    lane_call_reset(call);
    call->lease_clock_ms = 0; /* the wall clock */
    call->resolve = resolve;
    call->max_bulk_len = 512u << 20;
    call->max_multibulk_len = 1024 * 1024;
    call->max_commands = 1000;
    call->reply_mark = (size_t)1 << 40;
    call->writes = 1;
    call->log_writes = 1;
    call->aof_room = (size_t)1 << 40;
    call->memory_limited = 0;
    call->memory_room = 0;
}

/* Build a canonical request from NUL-terminated words into out. */
static size_t req(char *out, int argc, const char **argv) {
    size_t n = (size_t)sprintf(out, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) n += (size_t)sprintf(out + n, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);
    return n;
}

static int reply_is(const lane_call *call, const char *want) {
    size_t n = strlen(want);
    return call->reply.len == n && memcmp(call->reply.data, want, n) == 0;
}

/* ------------------------------------------------------------------------ */

static void test_twrite_forms_and_aof(lane_call *call) {
    fresh(call);
    char buf[1024];
    size_t n = 0;
    const char *a[] = {"twrite", "s", "hello"};
    const char *b[] = {"TWRITE", "s", "BACKLOG", "2", "ENTRIES", "x", "y", "z"};
    const char *c[] = {"TWRITE", "s", "ENTRIES"}; /* the simple form: writes "ENTRIES" */
    n += req(buf + n, 3, a);
    size_t first_len = n;
    n += req(buf + n, 8, b);
    n += req(buf + n, 3, c);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(reply_is(call, ":0\r\n:1\r\n:4\r\n"));
    CHECK(call->aof.len == n && memcmp(call->aof.data, buf, n) == 0);
    CHECK(call->twrite_calls == 3 && call->messages_written == 5);
    CHECK(call->messages_evicted == 2); /* BACKLOG 2 kept offsets 2 and 3 */
    CHECK(mn_next_offset(stream_s) == 5 && mn_first_offset(stream_s) == 2);
    CHECK(call->nkeys == 1 && call->keys[0].written && resolved == 1);
    CHECK(call->stop == LANE_STOP_END);
    (void)first_len;
}

static void test_tread(lane_call *call) {
    fresh(call);
    mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, MN_NOW);
    mn_evict_upto(stream_s, 0);
    char buf[512];
    size_t n = 0;
    const char *a[] = {"TREAD", "s", "0", "10"};
    const char *b[] = {"tread", "s", "-2", "1", "withinfo"};
    const char *c[] = {"TREAD", "s", "-9223372036854775808", "0", "WITHINFO"};
    const char *d[] = {"TREAD", "t", "5", "3"};
    n += req(buf + n, 4, a);
    n += req(buf + n, 5, b);
    n += req(buf + n, 5, c);
    n += req(buf + n, 4, d);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(reply_is(call, "*3\r\n$-1\r\n$1\r\nb\r\n$1\r\nc\r\n"
                         "*2\r\n*4\r\n:1\r\n:2\r\n:1\r\n:1\r\n$1\r\nb\r\n"
                         "*1\r\n*4\r\n:1\r\n:2\r\n:0\r\n:0\r\n"
                         "*0\r\n"));
    CHECK(call->tread_calls == 4 && call->messages_read == 4 && call->aof.len == 0);
    /* A read whose reply would take the run past reply_mark is not built:
     * the lane stops before it (the general path holds it to the client's
     * hard limit). Its reply, "*3\r\n" and three "$1\r\nx\r\n", is 25 bytes. */
    fresh(call);
    mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, MN_NOW);
    n = req(buf, 4, a);
    call->reply_mark = 24;
    CHECK(run_lane(call, buf, n) == 0 && call->stop == LANE_STOP_BUDGET && call->reply.len == 0);
    fresh(call);
    mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, MN_NOW);
    call->reply_mark = 25;
    CHECK(run_lane(call, buf, n) == n && call->reply.len == 25);
}

/* TREAD ... WITHTIMES: a flat message, time, message, time ... (RESP2,
 * the lane's only protocol), with WITHINFO and BLOCK in any order; twice
 * is the general path's error to give. */
static void test_tread_withtimes(lane_call *call) {
    fresh(call);
    mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, 1700000000000);
    mn_append_one(stream_s, "dd", 2, 1700000000123);
    mn_evict_upto(stream_s, 0);
    char buf[1024];
    size_t n = 0;
    const char *a[] = {"TREAD", "s", "0", "10", "WITHTIMES"};
    const char *b[] = {"tread", "s", "-2", "1", "withtimes", "WITHINFO"};
    const char *c[] = {"TREAD", "s", "3", "5", "WITHINFO", "BLOCK", "0", "withtimes"};
    const char *d[] = {"TREAD", "s", "9", "5", "WITHTIMES"};
    n += req(buf + n, 5, a);
    n += req(buf + n, 6, b);
    n += req(buf + n, 8, c);
    n += req(buf + n, 5, d);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(reply_is(call, "*8\r\n$-1\r\n$-1\r\n$1\r\nb\r\n:1700000000000\r\n"
                         "$1\r\nc\r\n:1700000000000\r\n$2\r\ndd\r\n:1700000000123\r\n"
                         "*3\r\n*4\r\n:1\r\n:3\r\n:2\r\n:1\r\n$1\r\nc\r\n:1700000000000\r\n"
                         "*3\r\n*4\r\n:1\r\n:3\r\n:3\r\n:1\r\n$2\r\ndd\r\n:1700000000123\r\n"
                         "*0\r\n"));
    CHECK(call->tread_calls == 4 && call->messages_read == 6 && call->stop == LANE_STOP_END);
    fresh(call);
    const char *twice[] = {"TREAD", "s", "0", "1", "WITHTIMES", "withtimes"};
    n = req(buf, 6, twice);
    CHECK(run_lane(call, buf, n) == 0 && call->stop == LANE_STOP_REQUEST);
}

/* TREAD ... BLOCK: run when it answers at once (the same reply as without
 * BLOCK), stopped before it (LANE_STOP_WAIT) when it would wait, and
 * stopped (LANE_STOP_REQUEST) for every timeout or option the general path
 * refuses. */
static void test_tread_block(lane_call *call) {
    fresh(call);
    mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, MN_NOW);
    char buf[1024];
    size_t n = 0;
    const char *a[] = {"TREAD", "s", "0", "2", "BLOCK", "0"};
    const char *b[] = {"tread", "s", "-1", "5", "block", "100", "withinfo"};
    const char *c[] = {"TREAD", "s", "2", "1", "WITHINFO", "BLOCK", "9223372036854775807"};
    const char *d[] = {"TREAD", "s", "1", "0", "BLOCK", "5"}; /* count 0: answers at once */
    const char *e[] = {"TREAD", "s", "-100", "1", "BLOCK", "5"}; /* floored at 0 */
    n += req(buf + n, 6, a);
    n += req(buf + n, 7, b);
    n += req(buf + n, 7, c);
    n += req(buf + n, 6, d);
    n += req(buf + n, 6, e);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(reply_is(call, "*2\r\n$1\r\na\r\n$1\r\nb\r\n"
                         "*2\r\n*4\r\n:0\r\n:2\r\n:2\r\n:1\r\n$1\r\nc\r\n"
                         "*2\r\n*4\r\n:0\r\n:2\r\n:2\r\n:1\r\n$1\r\nc\r\n"
                         "*0\r\n"
                         "*1\r\n$1\r\na\r\n"));
    CHECK(call->tread_calls == 5 && call->messages_read == 5 && call->aof.len == 0);
    CHECK(call->stop == LANE_STOP_END);

    /* Reads that would wait: at the next offset, past it, at the largest
     * offset, with count 0 at the tail; each after a read that runs. */
    static const char *const waits[][7] = {
        {"TREAD", "s", "3", "1", "BLOCK", "0"},
        {"TREAD", "s", "1000", "1", "WITHINFO", "BLOCK", "10"},
        {"TREAD", "s", "9223372036854775807", "1", "BLOCK", "1"},
        {"TREAD", "k1", "5", "1", "BLOCK", "0"}, /* k1 reads t (one message) */
        {"TREAD", "k1", "1", "0", "BLOCK", "0"}, /* count 0 at the tail waits too */
    };
    static const int wait_argcs[] = {6, 7, 6, 6, 6};
    /* Timeouts and options the general path refuses or parses itself. */
    static const char *const refused[][8] = {
        {"TREAD", "s", "0", "1", "BLOCK", "-1"},
        {"TREAD", "s", "0", "1", "BLOCK", "01"},
        {"TREAD", "s", "0", "1", "BLOCK", "+1"},
        {"TREAD", "s", "0", "1", "BLOCK", "1.5"},
        {"TREAD", "s", "0", "1", "BLOCK", ""},
        {"TREAD", "s", "0", "1", "BLOCK", "9223372036854775808"},
        {"TREAD", "s", "0", "1", "BLOCK", "-9223372036854775808"},
        {"TREAD", "s", "0", "1", "BLOCK"},
        {"TREAD", "s", "0", "1", "WITHINFO", "BLOCK"},
        {"TREAD", "s", "0", "1", "BLOCK", "WITHINFO"},
        {"TREAD", "s", "0", "1", "BLOCK", "1", "BLOCK", "1"},
        {"TREAD", "s", "0", "1", "BLOCK", "1", "WITHINFO", "WITHINFO"},
        {"TREAD", "s", "0", "1", "BLOCK", "1", "GROUP", "g"},
        {"TREAD", "s", "0", "1", "GROUPNEW", "g", "BLOCK", "1"},
        {"TREAD", "s", "0", "1", "BLOCK", "1", "bogus"},
        {"TREAD", "s", "0", "1", "BLOCKS", "1"},
    };
    static const int refused_argcs[] = {6, 6, 6, 6, 6, 6, 6, 5, 6, 6, 8, 8, 8, 8, 7, 6};
    for (size_t i = 0; i < 5 + 16; i++) {
        int waiting = i < 5;
        const char *const *stopper = waiting ? waits[i] : refused[i - 5];
        int argc = waiting ? wait_argcs[i] : refused_argcs[i - 5];
        fresh(call);
        mn_append(stream_s, "abc", (uint32_t[]){1, 1, 1}, 3, MN_NOW);
        const char *ok[] = {"TREAD", "s", "0", "1", "BLOCK", "0"};
        size_t head = req(buf, 6, ok);
        n = head + req(buf + head, argc, (const char **)stopper);
        CHECK(run_lane(call, buf, n) == head);
        CHECK(reply_is(call, "*1\r\n$1\r\na\r\n"));
        CHECK(call->tread_calls == 1 && call->messages_read == 1);
        CHECK(call->stop == (waiting ? LANE_STOP_WAIT : LANE_STOP_REQUEST));
    }
}

/* Requests the general path must answer stop the lane before them. */
static void test_stops(lane_call *call) {
    static const char *const stoppers[][9] = {
        {"GET", "s"},
        {"TWRITE", "s"},
        {"TWRITE", "x", "v"},                      /* refused key */
        {"TWRITE", "t", "v"},                      /* read-only key */
        {"TWRITE", "s", "BACKLOG", "1", "x"},      /* no ENTRIES */
        {"TWRITE", "s", "BACKLOG", "-1", "ENTRIES", "x"},
        {"TWRITE", "s", "BACKLOG", "1", "BACKLOG", "1", "ENTRIES", "x"},
        {"TWRITE", "s", "ENTRIES", "ENTRIES"},     /* fine: one entry "ENTRIES"... */
        {"TREAD", "s", "01", "1"},
        {"TREAD", "s", "0", "-1"},
        {"TREAD", "s", "1", "1", "BLOCK", "0"},    /* at the tail: it would wait */
        {"TREAD", "s", "0", "1", "WITHINFO", "WITHINFO"},
        {"TREAD", "s", "9223372036854775808", "1"},
        {"TREAD", "x", "0", "1"},
    };
    static const int argcs[] = {2, 2, 3, 3, 5, 6, 8, 4, 4, 4, 6, 6, 4, 4};
    for (size_t i = 0; i < sizeof argcs / sizeof argcs[0]; i++) {
        fresh(call);
        char buf[1024];
        const char *ok[] = {"TWRITE", "s", "a"};
        size_t head = req(buf, 3, ok);
        size_t n = head + req(buf + head, argcs[i], (const char **)stoppers[i]);
        size_t used = run_lane(call, buf, n);
        if (i == 7) { /* the one that is not a stopper */
            CHECK(used == n);
            continue;
        }
        CHECK(used == head);
        CHECK(reply_is(call, ":0\r\n"));
        CHECK(call->aof.len == head);
        CHECK(mn_next_offset(stream_s) == 1);
        CHECK(call->stop == LANE_STOP_REQUEST || call->stop == LANE_STOP_KEY ||
              call->stop == LANE_STOP_WAIT);
    }
}

/* Framing the lane does not read, and every prefix of a good buffer. */
static void test_framing(lane_call *call) {
    static const char *const bad[] = {
        "*03\r\n$5\r\nTREAD\r\n$1\r\ns\r\n$1\r\n0\r\n",
        "*3\r\n$06\r\nTWRITE\r\n$1\r\ns\r\n$1\r\na\r\n",
        "*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$1\r\naXY",
        "*0\r\n",
        "*-1\r\n",
        "PING\r\n",
        "*1\r\n:5\r\n",
        "*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$-1\r\n",
        "*2\r\n$4\r\nPING\r\n$99999999999999999999\r\n",
        "*3\n$6\r\nTWRITE\r\n$1\r\ns\r\n$1\r\na\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fresh(call);
        CHECK(run_lane(call, bad[i], strlen(bad[i])) == 0);
        CHECK(call->reply.len == 0 && mn_next_offset(stream_s) == 0);
    }
    char buf[256];
    const char *a[] = {"TWRITE", "s", "hello"};
    size_t one = req(buf, 3, a);
    size_t n = one + req(buf + one, 3, a);
    for (size_t cut = 0; cut <= n; cut++) {
        fresh(call);
        size_t used = run_lane(call, buf, cut);
        CHECK(used == (cut >= n ? n : cut >= one ? one : 0));
        CHECK(mn_next_offset(stream_s) == (used == n ? 2u : used == one ? 1u : 0u));
    }
    /* Limits: a bulk over max_bulk_len, more arguments than allowed. */
    fresh(call);
    call->max_bulk_len = 4;
    CHECK(run_lane(call, buf, n) == 0);
    fresh(call);
    call->max_multibulk_len = 2;
    CHECK(run_lane(call, buf, n) == 0);
}

static void test_budgets(lane_call *call) {
    char buf[4096];
    size_t n = 0;
    const char *a[] = {"TWRITE", "s", "hello"};
    size_t one = req(buf, 3, a);
    for (int i = 0; i < 10; i++) n += req(buf + n, 3, a);
    fresh(call);
    call->max_commands = 4;
    CHECK(run_lane(call, buf, n) == 4 * one && call->stop == LANE_STOP_BUDGET);
    fresh(call);
    call->reply_mark = 9; /* ":0\r\n:1\r\n:2\r\n" passes it after the third */
    CHECK(run_lane(call, buf, n) == 3 * one);
    fresh(call);
    /* Checked before each TWRITE, as the general path checks its margin
     * before each command: the third starts at the room and runs. */
    call->aof_room = 2 * one;
    CHECK(run_lane(call, buf, n) == 3 * one);
    fresh(call);
    write_limit_s = 6; /* next offset 6 needs no reservation, 7 does */
    CHECK(run_lane(call, buf, n) == 6 * one && call->stop == LANE_STOP_KEY);
    /* maxmemory: what the run's TWRITEs grew the stream by is held to the
     * room before each TWRITE, as the general path holds the used memory to
     * the limit before each command. */
    fresh(call);
    call->memory_limited = 1;
    call->memory_room = -1; /* already over the limit: none runs */
    CHECK(run_lane(call, buf, n) == 0 && call->stop == LANE_STOP_BUDGET);
    fresh(call);
    call->memory_limited = 1; /* at the limit: the first runs (its node grows memory) */
    uint64_t memory_before = mn_memory_bytes(stream_s);
    CHECK(run_lane(call, buf, n) == one && call->stop == LANE_STOP_BUDGET);
    CHECK(call->memory_grown > 0);
    CHECK(call->memory_grown == (int64_t)(mn_memory_bytes(stream_s) - memory_before));
    fresh(call);
    call->memory_limited = 1;
    call->memory_room = 1 << 30;
    memory_before = mn_memory_bytes(stream_s);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(call->memory_grown == (int64_t)(mn_memory_bytes(stream_s) - memory_before));
    fresh(call);
    call->writes = 0;
    CHECK(run_lane(call, buf, n) == 0);
    fresh(call);
    call->log_writes = 0;
    CHECK(run_lane(call, buf, n) == n && call->aof.len == 0);
    /* The offset ceiling: 2^63-1 is the last offset a message can get. */
    fresh(call);
    mn_raise_next_offset(stream_s, 9223372036854775807ULL - 1);
    CHECK(run_lane(call, buf, n) == 2 * one);
    CHECK(mn_next_offset(stream_s) == 9223372036854775808ULL);
    /* More keys than the table holds. */
    fresh(call);
    n = 0;
    char key[LANE_MAX_KEYS + 2][16];
    for (int i = 0; i < LANE_MAX_KEYS + 1; i++) {
        snprintf(key[i], sizeof key[i], "k%02d", i);
        const char *r[] = {"TREAD", key[i], "0", "1"};
        n += req(buf + n, 4, r);
    }
    size_t each = n / (LANE_MAX_KEYS + 1);
    CHECK(run_lane(call, buf, n) == LANE_MAX_KEYS * each && call->stop == LANE_STOP_KEY);
    CHECK(call->nkeys == LANE_MAX_KEYS && call->tread_calls == LANE_MAX_KEYS);
}

/* Allocation failure at every step: the lane stops before a request,
 * with nothing appended to the stream that was not answered. */
static void test_allocation_failures(lane_call *call) {
    char buf[2048];
    size_t n = 0;
    const char *a[] = {"TWRITE", "s", "ENTRIES", "a", "b", "c", "d", "e", "f", "g"};
    const char *b[] = {"TREAD", "s", "0", "100"};
    for (int i = 0; i < 6; i++) n += req(buf + n, 10, a);
    n += req(buf + n, 4, b);
    for (long k = 0; k < 80; k++) {
        lane_call_free(call);
        lane_call_init(call);
        fresh(call);
        fail_after = k;
        size_t used = run_lane(call, buf, n);
        fail_after = -1;
        uint64_t answered = 0;
        for (size_t i = 0; i < call->reply.len; i++) answered += call->reply.data[i] == ':';
        CHECK(mn_next_offset(stream_s) == 7 * answered);
        CHECK(call->twrite_calls == answered);
        CHECK(used <= n);
    }
}

/* Lease reads of an acknowledged group: the ones that deliver new messages
 * run (reply, group, AOF records as rcp11/commands/groups.py writes them);
 * redeliveries, empty reads, another stream's group, plain group reads and
 * bad options stop the lane before them. */
static void test_lease_reads(lane_call *call) {
    fresh(call);
    call->lease_clock_ms = 1700000000000;
    mn_append(stream_s, "abcde", (uint32_t[]){1, 1, 1, 1, 1}, 5, MN_NOW);
    mn_evict_upto(stream_s, 0); /* the group starts below: offset 0 is dropped */
    char buf[1024];
    size_t n = 0;
    const char *a[] = {"TREAD", "s", "0", "2", "GROUP", "g", "LEASE", "1000", "CONSUMER", "w1"};
    const char *b[] = {"tread", "s", "0", "9", "lease", "5", "groupnew", "g", "ACK", "1", "2",
                       "WITHINFO"};
    n += req(buf + n, 10, a);
    n += req(buf + n, 12, b);
    CHECK(run_lane(call, buf, n) == n);
    CHECK(call->tread_calls == 2 && call->messages_read == 4 && call->group_changes == 3);
    CHECK(ag_pending(group_g) == 2 && ag_next(group_g) == 5);
    ag_range_info r;
    CHECK(ag_range_get(group_g, 0, &r) == AG_OK && r.start == 3 && r.count == 2 && r.deliveries == 1);
    /* The reply's headers, then the AOF: TACK before the second lease. */
    const char *head = "*3\r\n*6\r\n:1\r\n:4\r\n:1\r\n:2\r\n:1\r\n:";
    CHECK(call->reply.len > strlen(head) && memcmp(call->reply.data, head, strlen(head)) == 0);
    /* The lease clock given (fuzz/core's prefix check): deadline = it + 1000. */
    CHECK(memcmp(call->reply.data + strlen(head), "1700000001000\r\n", 15) == 0);
    const char *tack = "*4\r\n$4\r\nTACK\r\n$1\r\ng\r\n$1\r\n1\r\n$1\r\n2\r\n";
    CHECK(call->aof.len > strlen(tack));
    const char *second = memmem(call->aof.data, call->aof.len, tack, strlen(tack));
    CHECK(second != NULL);
    const char *lease = "*9\r\n$11\r\nRCP11.LEASE\r\n$1\r\ng\r\n$1\r\ns\r\n"
                        "$1\r\n1\r\n$1\r\n1\r\n$1\r\n2\r\n"; /* floor 1, start 1, count 2 */
    CHECK(call->aof.len > strlen(lease) && memcmp(call->aof.data, lease, strlen(lease)) == 0);
    CHECK(call->keys[1].written && !call->keys[0].written);

    /* Stoppers, each after a lease read that runs. */
    static const char *const stoppers[][10] = {
        {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "9"},       /* nothing new left */
        {"TREAD", "t", "0", "1", "GROUP", "g", "LEASE", "9"},       /* g belongs to s */
        {"TREAD", "s", "0", "1", "GROUP", "g"},                     /* a plain group read */
        {"TREAD", "s", "0", "1", "GROUP", "x", "LEASE", "9"},       /* missing group key */
        {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "0"},
        {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "2147483648"},
        {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "9", "LEASE", "9"},
        {"TREAD", "s", "0", "1", "GROUP", "g", "GROUPNEW", "g", "LEASE", "9"},
        {"TREAD", "s", "0", "1", "GROUP", "g", "ACK", "1", "LEASE", "9"},
        {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "9", "ACK", "-1"},
        {"TREAD", "s", "0", "0", "GROUP", "g", "LEASE", "9"},       /* count 0 */
        {"TREAD", "s", "0", "1", "GROUP", "s", "LEASE", "9"},       /* group is the stream */
        {"TREAD", "s", "0", "1", "CONSUMER", "c", "GROUP", "g"},
    };
    static const int argcs[] = {8, 8, 6, 8, 8, 8, 10, 10, 10, 10, 8, 8, 8};
    for (size_t i = 0; i < sizeof argcs / sizeof argcs[0]; i++) {
        fresh(call);
        mn_append(stream_s, "ab", (uint32_t[]){1, 1}, 2, MN_NOW);
        const char *ok[] = {"TREAD", "s", "0", "1", "GROUP", "g", "LEASE", "9"};
        size_t head = req(buf, 8, ok);
        if (i == 0) head += req(buf + head, 8, ok); /* takes the last message */
        size_t all = head + req(buf + head, argcs[i], (const char **)stoppers[i]);
        CHECK(run_lane(call, buf, all) == head);
        CHECK(call->tread_calls == (i == 0 ? 2u : 1u));
        CHECK(ag_pending(group_g) == (i == 0 ? 2u : 1u));
    }
    /* Without writes (MISCONF, maxmemory) a lease read stops the lane. */
    fresh(call);
    mn_append(stream_s, "ab", (uint32_t[]){1, 1}, 2, MN_NOW);
    call->writes = 0;
    n = req(buf, 10, a);
    CHECK(run_lane(call, buf, n) == 0 && ag_pending(group_g) == 0);
}

/* Allocation failure at every step of lease reads: a request that stops
 * is not answered, and whatever its group lost before the failure (an
 * acknowledgement) is in the AOF, so Python's run of it continues right. */
static void test_lease_allocation_failures(lane_call *call) {
    char buf[2048];
    size_t n = 0;
    const char *a[] = {"TREAD", "s", "0", "3", "GROUP", "g", "LEASE", "99", "CONSUMER", "w"};
    const char *b[] = {"TREAD", "s", "0", "3", "GROUP", "g", "LEASE", "99", "ACK", "1", "1"};
    n += req(buf + n, 10, a);
    for (int i = 0; i < 4; i++) n += req(buf + n, 11, b);
    for (long k = 0; k < 60; k++) {
        lane_call_free(call);
        lane_call_init(call);
        fresh(call);
        mn_append(stream_s, "abcdefghijklmnop", (uint32_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                                           1, 1, 1, 1}, 16, MN_NOW);
        fail_after = k;
        size_t used = run_lane(call, buf, n);
        fail_after = -1;
        /* Each answered read leased 3 messages; an ACK that ran before a
         * failure shows in pending and in the TACK records. */
        uint64_t tacks = 0;
        for (const char *p = call->aof.data; call->aof.len && p != NULL;) {
            p = memmem(p, call->aof.len - (size_t)(p - call->aof.data), "TACK", 4);
            if (p != NULL) {
                tacks++;
                p += 4;
            }
        }
        CHECK(ag_next(group_g) == 3 * call->tread_calls);
        CHECK(ag_pending(group_g) == 3 * call->tread_calls - tacks);
        CHECK(used <= n);
    }
}

int main(void) {
    lane_call call;
    lane_call_init(&call);
    test_twrite_forms_and_aof(&call);
    test_tread(&call);
    test_tread_withtimes(&call);
    test_tread_block(&call);
    test_stops(&call);
    test_framing(&call);
    test_budgets(&call);
    test_allocation_failures(&call);
    test_lease_reads(&call);
    test_lease_allocation_failures(&call);
    lane_call_free(&call);
    mn_stream_free(stream_s);
    mn_stream_free(stream_t);
    ag_free(group_g);
    ag_free(group_h);
    if (failures) {
        fprintf(stderr, "lane_driver: %d check(s) failed\n", failures);
        return 1;
    }
    printf("lane_driver: all checks passed\n");
    return 0;
}
