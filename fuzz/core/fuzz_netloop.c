/* fuzz_netloop.c -- libFuzzer harness for the C lane's event loop
 * (src/netloop.c) over a real socket. Run by fuzz/core/run.sh (harness
 * "netloop").
 *
 * The input's first byte picks how the rest is cut into reads (chunk sizes
 * from a small generator), how many bytes of an unfinished request the loop
 * may hold (carry_limit), the output mark and the replies a poll may
 * build; the rest is what one client sends. Each chunk is written into a
 * socketpair, then nl_poll() (or nl_run(), with or without the AOF copy)
 * reads it, runs the lane and hands the rest over; nl_flush() writes the
 * replies, which the harness reads back. Python's side is a stand-in: it keeps what
 * was handed over and never gives the connection back to the lane. Streams
 * "s" (writable) and "t" (read-only) exist, as in fuzz_lane.c.
 *
 * Checked on every input:
 *   - every byte sent is accounted for once, in order: the lane consumed a
 *     prefix (N bytes), Python got the bytes right after it, back to back,
 *     and what is still held (carried) is the rest;
 *   - the replies the client read are exactly what lane_run() gives for
 *     that prefix in one call on fresh streams, and so is the AOF copy
 *     (the batch's runs back to back);
 *   - the stream's next offset accounts for every message written;
 *   - the connection closes only when the client does.
 * The sanitizers catch any out-of-bounds access and any leak.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netloop.h"

static mn_stream *s_stream, *t_stream;
static mn_buf handed, aof;
static int closed_calls;

static int resolve_key(const char *key, size_t len, mn_stream **stream, uint64_t *limit) {
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

/* Streams only: lease reads and TACKs through the loop are checked by
 * tests/test_dispatch_lane.py's differential test (their replies carry
 * the wall clock's deadline, which two runs here would not share). */
static int loop_resolve(nl_loop *loop, const char *key, size_t len, mn_stream **stream,
                        ag_group **group, uint64_t *limit) {
    (void)loop;
    *group = NULL;
    return resolve_key(key, len, stream, limit);
}

static int lane_resolve(lane_call *call, const char *key, size_t len, mn_stream **stream,
                        ag_group **group, uint64_t *limit) {
    (void)call;
    *group = NULL;
    return resolve_key(key, len, stream, limit);
}

static void add(mn_buf *b, const char *p, size_t len) {
    if (b->cap - b->len < len) {
        size_t want = b->cap ? b->cap : 256;
        while (want - b->len < len) want *= 2;
        char *q = realloc(b->data, want);
        if (q == NULL) abort();
        b->data = q;
        b->cap = want;
    }
    if (len) memcpy(b->data + b->len, p, len);
    b->len += len;
}

static void on_data(nl_loop *loop, void *owner, const char *data, size_t len) {
    (void)loop;
    (void)owner;
    add(&handed, data, len);
}

static void on_closed(void *owner, int err) {
    (void)owner;
    (void)err;
    closed_calls++;
}

static void on_water(void *owner, int over) {
    (void)owner;
    (void)over;
}

static void fresh_streams(void) {
    if (s_stream) mn_stream_free(s_stream);
    if (t_stream) mn_stream_free(t_stream);
    s_stream = mn_stream_new(4, 0);
    t_stream = mn_stream_new(4, 0);
    mn_append(t_stream, "abcdef", (uint32_t[]){1, 2, 3}, 3, MN_NOW);
}

/* Fold the batch: the lane's consumed bytes and AOF runs. */
static uint64_t take_batch(nl_loop *loop) {
    uint64_t consumed = nl_batch_counts(loop)->net_input_bytes;
    for (size_t i = 0; i < nl_batch_aof_runs(loop); i++) {
        const char *p;
        size_t n;
        nl_batch_aof_run(loop, i, &p, &n);
        add(&aof, p, n);
    }
    nl_batch_reset(loop);
    return consumed;
}

static void drain(int fd, mn_buf *into) {
    char tmp[65536];
    for (;;) {
        ssize_t r = read(fd, tmp, sizeof tmp);
        if (r <= 0) return;
        add(into, tmp, (size_t)r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned seed = data[0];
    const char *stream = (const char *)data + 1;
    size_t total = size - 1;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    int big = 1 << 20;
    for (int i = 0; i < 2; i++) {
        setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);

    fresh_streams();
    mn_buf_init(&handed);
    mn_buf_init(&aof);
    closed_calls = 0;
    mn_buf received;
    mn_buf_init(&received);
    nl_loop *loop = nl_loop_new();
    if (loop == NULL) abort();
    nl_set_callbacks(loop, NULL, loop_resolve, on_data, on_closed, on_water);
    nl_set_limits(loop, 1 << 20, 1 << 16, (seed & 8) ? 3 : 4096, (seed & 16) ? 64 : 0);
    /* Without the AOF copy, nl_run() flushes and polls again in C. */
    int log_writes = (seed & 64) ? 0 : LANE_LOG_WRITES;
    nl_set_switches(loop, NL_LANE | LANE_WRITES | log_writes, (size_t)1 << 40, 0, UINT64_MAX);
    nl_conn *conn = nl_conn_new(loop, sv[0], &sv[0]);
    if (conn == NULL) abort();
    size_t carry = (seed & 1) ? 16 : (size_t)4 << 20;
    size_t mark = (seed & 2) ? 40 : (size_t)1 << 40;
    nl_conn_set_lane(conn, 1, mark, carry);

    uint64_t consumed = 0;
    size_t at = 0;
    unsigned gen = seed * 2654435761u + 1;
    while (at < total) {
        gen = gen * 1103515245u + 12345u;
        size_t n = (seed & 4) ? 1 + (gen >> 16) % 37 : total - at;
        if (n > total - at) n = total - at;
        if (write(sv[1], stream + at, n) != (ssize_t)n) abort();
        at += n;
        if (((seed & 32) ? nl_run(loop, 1 + (int)(gen >> 20) % 4, 1000) : nl_poll(loop)) < 0)
            abort();
        consumed += take_batch(loop);
        nl_flush(loop);
        drain(sv[1], &received);
    }
    /* Replies the socket did not take at once go out as it drains. */
    for (int i = 0; i < 1000 && nl_conn_pending(conn); i++) {
        nl_poll(loop);
        consumed += take_batch(loop);
        drain(sv[1], &received);
    }
    if (nl_conn_pending(conn) || closed_calls) abort(); /* the peer keeps it open */

    /* Every byte once, in order. */
    size_t carried = nl_conn_carried(conn);
    if (consumed + handed.len + carried != total) abort();
    if (handed.len && memcmp(handed.data, stream + consumed, handed.len)) abort();

    /* The replies and the AOF are the lane's over the consumed prefix. */
    uint64_t written = mn_next_offset(s_stream);
    fresh_streams();
    lane_call ref;
    lane_call_init(&ref);
    lane_call_reset(&ref);
    ref.resolve = lane_resolve;
    ref.max_bulk_len = 1 << 20;
    ref.max_multibulk_len = 1 << 16;
    ref.max_commands = (uint64_t)1 << 40;
    if (lane_run(&ref, stream, (size_t)consumed, (size_t)1 << 40, LANE_WRITES | log_writes,
                 (size_t)1 << 40, 0) != consumed)
        abort();
    if (ref.reply.len != received.len ||
        (received.len && memcmp(ref.reply.data, received.data, received.len)))
        abort();
    if (ref.aof.len != aof.len || (aof.len && memcmp(ref.aof.data, aof.data, aof.len))) abort();
    if (mn_next_offset(s_stream) != written || written != ref.messages_written) abort();

    /* The client leaves: the loop closes the connection, once. */
    close(sv[1]);
    nl_poll(loop);
    nl_flush(loop);
    if (closed_calls != 1 || !nl_conn_closed(conn)) abort();
    nl_conn_free(conn);
    nl_loop_free(loop);
    lane_call_free(&ref);
    /* The harness's own buffers (add(), the plain allocator). */
    free(handed.data);
    free(aof.data);
    free(received.data);
    return 0;
}
