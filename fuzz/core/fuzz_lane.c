/* fuzz_lane.c -- libFuzzer harness for the C lane's parser and commands
 * (src/lane.c). Run by fuzz/core/run.sh (harness "lane").
 *
 * The input is a read buffer. Two streams exist: "s" (writable) and "t"
 * (read-only: offset 0 evicted, 1 and 2, a gap, 10 and 11), and "g", an
 * acknowledged group of "s"; other keys are refused. Checked on every input:
 *   - the lane consumes a prefix made of whole canonical requests: running
 *     it again on exactly that prefix consumes all of it and produces the
 *     same replies (but for the append times TREAD WITHTIMES shows: the
 *     second run writes a little later) and AOF bytes (requests are judged
 *     only by their own bytes, never by what follows);
 *   - the AOF copy is the TWRITE requests verbatim, so it is a sequence of
 *     canonical requests that the lane itself consumes whole;
 *   - the stream's next offset accounts for every message written;
 *   - a stop before a TREAD ... BLOCK that would wait (LANE_STOP_WAIT) is
 *     the request's own verdict on the streams as they are: run alone on
 *     the rest of the buffer, the lane stops at once for the same reason,
 *     having answered and written nothing.
 * The sanitizers catch any out-of-bounds read of the buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lane.h"

static mn_stream *s_stream, *t_stream;
static ag_group *g_group;

/* lane_run() with the call's own reply_mark, writes, log_writes, aof_room,
 * memory_limited and memory_room. */
static size_t run_lane(lane_call *call, const char *buf, size_t len) {
    int flags = (call->writes ? LANE_WRITES : 0) | (call->log_writes ? LANE_LOG_WRITES : 0);
    if (call->memory_limited) flags |= LANE_MEMORY_ROOM;
    return lane_run(call, buf, len, call->reply_mark, flags, call->aof_room, call->memory_room);
}

static int resolve(lane_call *call, const char *key, size_t len, mn_stream **stream,
                   ag_group **group, uint64_t *limit) {
    (void)call;
    if (len == 1 && key[0] == 'g') {
        *group = g_group;
        return LANE_KEY_READ | LANE_KEY_WRITE;
    }
    if (len == 1 && key[0] == 's') {
        *stream = s_stream;
        *limit = 9223372036854775807ULL;
        return LANE_KEY_READ | LANE_KEY_WRITE;
    }
    if (len == 1 && key[0] == 't') {
        *stream = t_stream;
        return LANE_KEY_READ;
    }
    return 0;
}

/* The reply with every append time (":" and 13 digits, unix ms from 2001
 * on; no offset here gets that large) zeroed, so that two runs compare. */
static void zero_times(char *p, size_t len) {
    for (size_t i = 0; i + 16 <= len; i++) {
        if (p[i] != ':' || p[i + 14] != '\r' || p[i + 15] != '\n') continue;
        size_t d = 1;
        while (d <= 13 && p[i + d] >= '0' && p[i + d] <= '9') d++;
        if (d == 14 && (i == 0 || p[i - 1] == '\n')) memset(p + i + 1, '0', 13);
    }
}

static void setup(lane_call *call) {
    if (s_stream) mn_stream_free(s_stream);
    if (t_stream) mn_stream_free(t_stream);
    ag_free(g_group);
    g_group = ag_new("s", 1, 0);
    s_stream = mn_stream_new(4, 0);
    t_stream = mn_stream_new(4, 0);
    mn_append(t_stream, "abcdef", (uint32_t[]){1, 2, 3}, 3, MN_NOW);
    /* A gap (as a crash recovery leaves) and more messages after it, with
     * the first one evicted: TREAD ... NONULLS steps over both. */
    mn_raise_next_offset(t_stream, 10);
    mn_append(t_stream, "ghij", (uint32_t[]){2, 2}, 2, MN_NOW);
    mn_evict_upto(t_stream, 0);
    lane_call_reset(call);
    call->resolve = resolve;
    call->max_bulk_len = 1 << 20;
    call->max_multibulk_len = 1 << 16;
    call->max_commands = 1 << 20;
    call->reply_mark = (size_t)1 << 40;
    call->writes = 1;
    call->log_writes = 1;
    call->aof_room = (size_t)1 << 40;
    /* One time for every run's lease reads: the prefix run below must give
     * the same deadlines, whenever the clock ticks. */
    call->lease_clock_ms = 1700000000000;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lane_call a, b;
    lane_call_init(&a);
    lane_call_init(&b);
    /* The buffer exactly as long as the input: reads past it are caught. */
    char *buf = malloc(size ? size : 1);
    if (buf == NULL) return 0;
    if (size) memcpy(buf, data, size);

    setup(&a);
    int64_t memory_at_start =
        (int64_t)mn_memory_bytes(s_stream) + (int64_t)ag_memory_bytes(g_group);
    size_t used = run_lane(&a, buf, size);
    if (used > size) abort();
    /* The memory the run reports growing is what the stream and the group
     * (its lease reads' pending ranges) grew by. */
    int64_t memory_now = (int64_t)mn_memory_bytes(s_stream) + (int64_t)ag_memory_bytes(g_group);
    if (a.memory_grown != memory_now - memory_at_start) abort();
    uint64_t next_s = mn_next_offset(s_stream);
    if (next_s != a.messages_written) abort();
    if ((a.twrite_calls + a.group_changes == 0) != (a.aof.len == 0)) abort();
    /* A lease read leases what it read, never past the stream's end. */
    if (ag_next(g_group) > next_s || ag_pending(g_group) > ag_next(g_group)) abort();
    if (a.stop == LANE_STOP_WAIT) {
        lane_call w;
        lane_call_init(&w);
        lane_call_reset(&w);
        w.resolve = resolve;
        w.max_bulk_len = a.max_bulk_len;
        w.max_multibulk_len = a.max_multibulk_len;
        w.max_commands = a.max_commands;
        if (lane_run(&w, buf + used, size - used, (size_t)1 << 40, LANE_WRITES, 0, 0) != 0) abort();
        if (w.stop != LANE_STOP_WAIT || w.reply.len || w.tread_calls) abort();
        if (mn_next_offset(s_stream) != next_s) abort();
        lane_call_free(&w);
    }

    /* The same prefix alone: consumed whole, same output. */
    setup(&b);
    if (run_lane(&b, buf, used) != used) abort();
    zero_times(a.reply.data, a.reply.len);
    zero_times(b.reply.data, b.reply.len);
    if (b.reply.len != a.reply.len || (a.reply.len && memcmp(a.reply.data, b.reply.data, a.reply.len)))
        abort();
    if (b.aof.len != a.aof.len || (a.aof.len && memcmp(a.aof.data, b.aof.data, a.aof.len)))
        abort();

    /* The AOF copy of writes alone (no group records, which are Python's to
     * replay) replays whole through the lane, as the same writes. */
    if (a.aof.len && a.group_changes == 0) {
        setup(&b);
        char *aof = malloc(a.aof.len);
        if (aof == NULL) abort();
        memcpy(aof, a.aof.data, a.aof.len);
        if (run_lane(&b, aof, a.aof.len) != a.aof.len) abort();
        if (b.twrite_calls != a.twrite_calls || b.tread_calls != 0) abort();
        if (mn_next_offset(s_stream) != next_s) abort();
        free(aof);
    }
    free(buf);
    lane_call_free(&a);
    lane_call_free(&b);
    return 0;
}
