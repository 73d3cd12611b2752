/* driver.c -- exercises every function of macronode.h under AddressSanitizer
 * and UBSan (see run_sanitizers.sh). Exits non-zero on the first mismatch;
 * the sanitizers abort on any memory error, undefined behaviour or leak.
 *
 * macronode.c is compiled with alloc_hook.h force-included, so its
 * allocations come to the counting allocator below. That gives two checks
 * a sanitizer cannot make: mn_memory_bytes() must equal the bytes the core
 * really holds, and an operation whose k-th allocation fails must leave the
 * stream exactly as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>
#include <zlib.h>

#include "check.h"
#include "count_alloc.h"
#include "macronode.h"

/* The counting allocator (count_alloc.c): live_bytes is what the core holds,
 * fail_after = k makes the (k+1)-th allocation from now and every later one
 * fail, -1 never. Macros keep the tests below short. */
#define live_bytes count_alloc_live()
#define SET_FAIL_AFTER(k) count_alloc_fail_after(k)

/* ------------------------------------------------------------------------
 * Checks
 * --------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* memcmp() for possibly empty (and then possibly NULL) ranges. */
static int same(const char *a, const char *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* The clock the random tests append with: it moves forward by 0..2 ms per
 * append (often not at all), so many messages share a time. */
static int64_t test_clock = 1700000000000;

/* The message at offset o is a function of o, so the model only needs to
 * know which offsets are readable. Every ninth message compresses well. */
static uint32_t msg_len(uint64_t o) {
    return (uint32_t)((o * 2654435761u >> 7) % 90);
}

static void msg_fill(uint64_t o, char *out) {
    uint32_t len = msg_len(o);
    for (uint32_t i = 0; i < len; i++)
        out[i] = (char)(o % 9 == 0 ? 'a' + (i % 3) : (int)((o * 131 + i * 7) & 0xff));
}

#define MODEL_CAP 300000

typedef struct model {
    uint64_t next;
    int64_t clock;                 /* the stream's clock */
    unsigned char readable[MODEL_CAP];
    int64_t ms[MODEL_CAP];         /* append time of each offset */
} model;

static model the_model;

static void model_reset(model *m) {
    m->next = 0;
    m->clock = 0;
    memset(m->readable, 0, sizeof m->readable);
}

static void check_counters(const mn_stream *s, const model *m) {
    uint64_t length = 0, payload = 0, first = m->next;
    for (uint64_t o = 0; o < m->next; o++) {
        if (!m->readable[o]) continue;
        if (first == m->next) first = o;
        length++;
        payload += msg_len(o);
    }
    CHECK(mn_next_offset(s) == m->next);
    CHECK(mn_first_offset(s) == first);
    CHECK(mn_length(s) == length);
    CHECK(mn_payload_bytes(s) == payload);
    CHECK((mn_num_nodes(s) == 0) == (length == 0));
    CHECK(mn_num_compressed_nodes(s) <= mn_num_nodes(s));
}

/* mn_readable_run (TREAD ... NONULLS): the first readable offset at or
 * after start (start <= next), and the readable offsets in a row from
 * there, at most n. */
static void check_readable_run(const mn_stream *s, const model *m, uint64_t start, uint64_t n) {
    uint64_t run;
    uint64_t got = mn_readable_run(s, start, n, &run);
    uint64_t o = start;
    while (o < m->next && !m->readable[o]) o++;
    CHECK(got == o);
    uint64_t want = 0;
    while (want < n && o + want < m->next && m->readable[o + want]) want++;
    CHECK(run == want);
}

static uint64_t get_le(const unsigned char *p, int width) {
    uint64_t v = 0;
    for (int i = 0; i < width; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* mn_read_packed (TREAD ... PACKED): lengths (0xFFFFFFFF for null), the
 * messages back to back, times (-1 for null), little-endian, as the model
 * says; times_le NULL leaves the times out. */
static void check_packed(mn_stream *s, const model *m, uint64_t start, uint64_t n,
                         unsigned char *lens_le, unsigned char *times_le) {
    static char expect[100];
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_packed(s, start, n, &out, lens_le, times_le) == MN_OK);
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t o = start + i;
        uint64_t len = get_le(lens_le + 4 * i, 4);
        int64_t t = times_le ? (int64_t)get_le(times_le + 8 * i, 8) : 0;
        if (!m->readable[o]) {
            CHECK(len == 0xFFFFFFFFu && (!times_le || t == -1));
            continue;
        }
        CHECK(len == msg_len(o) && (!times_le || t == m->ms[o]));
        msg_fill(o, expect);
        CHECK(pos + len <= out.len && same(out.data + pos, expect, (size_t)len));
        pos += (size_t)len;
    }
    CHECK(pos == out.len);

    /* The reply TREAD ... PACKED sends, in one buffer: the same tables as
     * bulk strings after a prefix, sized before it is built. */
    static char want[64 + 12 * 3000 + 100 * 3000];
    size_t w = (size_t)snprintf(want, 64, "*2\r\n$%llu\r\n", (unsigned long long)(4 * n));
    memcpy(want + w, lens_le, 4 * n);
    w += 4 * n;
    w += (size_t)snprintf(want + w, 64, "\r\n$%zu\r\n", out.len);
    if (out.len) memcpy(want + w, out.data, out.len);
    w += out.len;
    w += (size_t)snprintf(want + w, 64, "\r\n");
    if (times_le) {
        w += (size_t)snprintf(want + w, 64, "$%llu\r\n", (unsigned long long)(8 * n));
        memcpy(want + w, times_le, 8 * n);
        w += 8 * n;
        w += (size_t)snprintf(want + w, 64, "\r\n");
    }
    mn_buf got, none;
    mn_buf_init(&got);
    mn_buf_init(&none);
    uint64_t needed = 0, over = 0;
    int t = times_le != NULL;
    CHECK(mn_read_packed_resp(s, start, n, t, "*2\r\n", 4, UINT64_MAX, &needed, &got) == MN_OK);
    CHECK(got.len == w && needed == w && same(got.data, want, w));
    CHECK(mn_read_packed_resp(s, start, n, t, "*2\r\n", 4, needed - 1, &over, &none) == MN_ERR_CAP);
    CHECK(over == needed && none.len == 0);
    mn_buf_free(&got);
    mn_buf_free(&none);
    mn_buf_free(&out);
}

static void check_read(mn_stream *s, const model *m, uint64_t start, uint64_t n) {
    static char expect[200 * 100];
    static int64_t lens[200];
    CHECK(n <= 200);
    check_readable_run(s, m, start, n);
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_copy(s, start, n, &out, lens) == MN_OK);
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t o = start + i;
        if (!m->readable[o]) {
            CHECK(lens[i] == -1);
            continue;
        }
        CHECK(lens[i] == (int64_t)msg_len(o));
        msg_fill(o, expect);
        CHECK(pos + msg_len(o) <= out.len);
        CHECK(same(out.data + pos, expect, msg_len(o)));
        pos += msg_len(o);
    }
    CHECK(pos == out.len);
    mn_buf_free(&out);

    static int64_t times[200];
    CHECK(mn_read_times(s, start, n, times) == MN_OK);
    for (uint64_t i = 0; i < n; i++)
        CHECK(times[i] == (m->readable[start + i] ? m->ms[start + i] : -1));
    static unsigned char lens_le[4 * 200], times_le[8 * 200];
    check_packed(s, m, start, n, lens_le, (start & 1) ? NULL : times_le);

    for (int style = 0; style <= (MN_NULL_RESP3 | MN_READ_WITH_TIMES); style++) {
        int resp3 = style & MN_NULL_RESP3, with_times = style & MN_READ_WITH_TIMES;
        mn_buf_init(&out);
        CHECK(mn_read_resp(s, start, n, style, &out) == MN_OK);
        pos = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t o = start + i;
            char head[64];
            int head_len;
            if (!m->readable[o]) {
                head_len = snprintf(head, sizeof head, "%s",
                                    resp3 ? "_\r\n" : with_times ? "$-1\r\n$-1\r\n" : "$-1\r\n");
                CHECK(pos + (size_t)head_len <= out.len);
                CHECK(memcmp(out.data + pos, head, (size_t)head_len) == 0);
                pos += (size_t)head_len;
                continue;
            }
            head_len = snprintf(head, sizeof head, "%s$%u\r\n", with_times && resp3 ? "*2\r\n" : "",
                                msg_len(o));
            CHECK(pos + (size_t)head_len + msg_len(o) + 2 <= out.len);
            CHECK(memcmp(out.data + pos, head, (size_t)head_len) == 0);
            pos += (size_t)head_len;
            msg_fill(o, expect);
            CHECK(same(out.data + pos, expect, msg_len(o)));
            pos += msg_len(o);
            CHECK(memcmp(out.data + pos, "\r\n", 2) == 0);
            pos += 2;
            if (with_times) {
                head_len = snprintf(head, sizeof head, ":%lld\r\n", (long long)m->ms[o]);
                CHECK(pos + (size_t)head_len <= out.len);
                CHECK(memcmp(out.data + pos, head, (size_t)head_len) == 0);
                pos += (size_t)head_len;
            }
        }
        CHECK(pos == out.len);
        mn_buf_free(&out);
    }
}

/* Node times are their messages' (a node's last message is always
 * readable; its first when not evicted) and never decrease; the oldest
 * readable message's time is the stream's oldest. */
static void check_times(const mn_stream *s, const model *m) {
    mn_node_info info;
    int64_t last = 0;
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node)) {
        mn_node_get_info(node, &info);
        uint64_t end = info.first + info.count;
        CHECK(end <= m->next && m->readable[end - 1]);
        CHECK(info.last_ms == m->ms[end - 1]);
        CHECK(!m->readable[info.first] || info.first_ms == m->ms[info.first]);
        CHECK(info.first_ms >= last && info.last_ms >= info.first_ms);
        last = info.last_ms;
    }
    CHECK(mn_last_append_ms(s) == m->clock);
    uint64_t first = mn_first_offset(s);
    CHECK(mn_oldest_append_ms(s) == (first < m->next ? m->ms[first] : MN_TIME_NONE));
}

/* mn_seek_time(t) is the first readable message at or after t. */
static void check_seek(const mn_stream *s, const model *m, int64_t t) {
    uint64_t exact = m->next;
    for (uint64_t o = 0; o < m->next; o++) {
        if (m->readable[o] && m->ms[o] >= t) {
            exact = o;
            break;
        }
    }
    CHECK(mn_seek_time(s, t) == exact);
}

/* With no scan pending, every sealed node has the form its rank asks for:
 * raw among the newest `depth` (or without compression), else compressed
 * at the stream's level or tried at it; the active node is raw. */
static void check_forms(const mn_stream *s) {
    if (mn_compress_pending(s)) return;
    /* (a node appended whole by mn_append_node_blob may be a compressed
     * tail: test_append_node_blob checks that case itself) */
    static mn_node_info info[400000];
    uint64_t n = 0;
    for (const mn_node *node = mn_first_node(s); node; node = mn_node_next(node)) {
        CHECK(n < 400000);
        mn_node_get_info(node, &info[n++]);
    }
    int level = mn_compression_level(s);
    for (uint64_t i = 0; i < n; i++) {
        if (i == n - 1) {
            CHECK(!info[i].compressed);
            break;
        }
        uint64_t rank = n - 2 - i;
        if (level == 0 || rank < mn_compression_depth(s)) CHECK(!info[i].compressed);
        else CHECK(info[i].zlevel == level);
    }
}

static void check_all(mn_stream *s, const model *m) {
    check_counters(s, m);
    check_times(s, m);
    CHECK(live_bytes == mn_memory_bytes(s));
    for (uint64_t start = 0; start < m->next; start += 200) {
        uint64_t n = m->next - start < 200 ? m->next - start : 200;
        check_read(s, m, start, n);
    }
}

/* ------------------------------------------------------------------------
 * Operations on stream + model
 * --------------------------------------------------------------------- */

static int do_append(mn_stream *s, model *m, size_t n) {
    static char buf[400 * 100];
    static uint32_t lens[400];
    CHECK(n <= 400);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        lens[i] = msg_len(m->next + i);
        msg_fill(m->next + i, buf + pos);
        pos += lens[i];
    }
    /* Mostly forward, sometimes back (a wall clock stepped back). */
    /* Mostly 0..2 ms forward, sometimes back (clamped by the core), rarely
     * a jump that needs 4- or 8-byte time deltas. */
    uint64_t step = rnd_below(1000);
    test_clock += step < 900   ? (int64_t)rnd_below(3)
                  : step < 998 ? -(int64_t)rnd_below(50)
                  : step < 999 ? 70000
                               : (int64_t)1 << 33;
    int64_t first = n == 1 ? mn_append_one(s, buf, lens[0], test_clock)
                           : mn_append(s, buf, lens, n, test_clock);
    if (first < 0) return (int)first;
    CHECK(first == (int64_t)m->next);
    if (test_clock > m->clock) m->clock = test_clock;
    for (size_t i = 0; i < n; i++) {
        m->readable[m->next + i] = 1;
        m->ms[m->next + i] = m->clock;
    }
    m->next += n;
    return MN_OK;
}

static uint64_t model_evict(model *m, uint64_t upto) {
    uint64_t count = 0;
    for (uint64_t o = 0; o <= upto && o < m->next; o++) {
        count += m->readable[o];
        m->readable[o] = 0;
    }
    return count;
}

static void serialize(const mn_stream *s, mn_buf **blobs, size_t *n_blobs) {
    size_t n = (size_t)mn_num_nodes(s) + 1;
    mn_buf *b = malloc(n * sizeof *b);
    CHECK(b != NULL);
    mn_buf_init(&b[0]);
    CHECK(mn_serialize_header(s, &b[0]) == MN_OK);
    size_t i = 1;
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node), i++) {
        CHECK(i < n);
        mn_buf_init(&b[i]);
        CHECK(mn_node_serialize(node, &b[i]) == MN_OK);
        CHECK(mn_validate_node_blob(b[i].data, b[i].len) == MN_OK);
    }
    CHECK(i == n);
    *blobs = b;
    *n_blobs = n;
}

static void free_blobs(mn_buf *blobs, size_t n) {
    for (size_t i = 0; i < n; i++) mn_buf_free(&blobs[i]);
    free(blobs);
}

static mn_stream *load(mn_buf *blobs, size_t n) {
    int err = 1;
    mn_stream *s = mn_load_header(blobs[0].data, blobs[0].len, 0, &err);
    if (s == NULL) {
        CHECK(err < 0);
        return NULL;
    }
    CHECK(err == MN_OK);
    for (size_t i = 1; i < n; i++) {
        if (mn_load_node(s, blobs[i].data, blobs[i].len) != MN_OK) {
            mn_stream_free(s);
            return NULL;
        }
    }
    if (mn_load_finish(s) != MN_OK) {
        mn_stream_free(s);
        return NULL;
    }
    return s;
}

/* Dump, load, check the copy serializes to the same bytes, return it. */
static mn_stream *roundtrip(mn_stream *s) {
    mn_buf *blobs, *again;
    size_t n, n_again;
    serialize(s, &blobs, &n);
    mn_stream *copy = load(blobs, n);
    CHECK(copy != NULL);
    CHECK(mn_num_compressed_nodes(copy) == mn_num_compressed_nodes(s));
    CHECK(mn_max_entries(copy) == mn_max_entries(s));
    CHECK(mn_compression_level(copy) == mn_compression_level(s));
    serialize(copy, &again, &n_again);
    CHECK(n == n_again);
    for (size_t i = 0; i < n; i++) {
        CHECK(blobs[i].len == again[i].len);
        CHECK(same(blobs[i].data, again[i].data, blobs[i].len));
    }
    free_blobs(blobs, n);
    free_blobs(again, n_again);
    mn_stream_free(s);
    return copy;
}

/* Rebuild s node by node as the Redis module's AOF rewrite does: a stream
 * raised to the first node's offset, every node blob appended whole, the
 * evicted prefix of the first node evicted, the next offset raised. */
static mn_stream *rebuild(const mn_stream *s, size_t keep_nodes) {
    mn_stream *t = mn_stream_new(mn_max_entries(s), mn_compression_level(s));
    CHECK(t != NULL && mn_stream_set_compression_depth(t, mn_compression_depth(s)) == MN_OK);
    mn_buf b;
    mn_buf_init(&b);
    size_t i = 0;
    uint64_t node_first = mn_next_offset(s);
    for (const mn_node *node = mn_first_node(s); node && i < keep_nodes; node = mn_node_next(node), i++) {
        b.len = 0;
        CHECK(mn_node_serialize(node, &b) == MN_OK);
        if (i == 0) {
            mn_node_info info;
            mn_node_get_info(node, &info);
            node_first = info.first;
            CHECK(mn_raise_next_offset(t, node_first) == MN_OK);
        }
        CHECK(mn_append_node_blob(t, b.data, b.len) == MN_OK);
    }
    mn_buf_free(&b);
    if (keep_nodes < (size_t)-1) return t;
    if (mn_first_offset(s) > node_first && mn_num_nodes(t))
        CHECK(mn_evict_upto(t, (int64_t)mn_first_offset(s) - 1) >= 0);
    if (mn_next_offset(s) > mn_next_offset(t)) CHECK(mn_raise_next_offset(t, mn_next_offset(s)) == MN_OK);
    return t;
}

/* ------------------------------------------------------------------------
 * Tests
 * --------------------------------------------------------------------- */

static void test_random_operations(uint32_t max_entries, int level, int steps) {
    model *m = &the_model;
    model_reset(m);
    mn_stream *s = mn_stream_new(max_entries, level);
    CHECK(s != NULL);
    for (int step = 0; step < steps; step++) {
        uint64_t op = rnd_below(100);
        if (m->next > MODEL_CAP - 1000) break;
        if (op < 45) {
            CHECK(do_append(s, m, 1 + (size_t)rnd_below(rnd_below(4) ? 20 : 400)) == MN_OK);
        } else if (op < 55) {
            uint64_t upto = m->next ? rnd_below(m->next + 10) : 0;
            uint64_t expect = model_evict(m, upto);
            CHECK(mn_evict_upto(s, (int64_t)upto) == (int64_t)expect);
        } else if (op < 60) {
            uint64_t keep = rnd_below(600);
            uint64_t expect = keep < m->next ? model_evict(m, m->next - keep - 1) : 0;
            CHECK(mn_evict_keep(s, keep) == (int64_t)expect);
        } else if (op < 65) {
            uint64_t skip = rnd_below(50);
            CHECK(mn_raise_next_offset(s, m->next + skip) == MN_OK);
            m->next += skip;
        } else if (op < 66) {
            s = roundtrip(s);
        } else if (op < 68) {
            /* Node by node (the module's AOF rewrite); the clock becomes
             * the newest time still held. */
            mn_stream *t = rebuild(s, (size_t)-1);
            CHECK(mn_max_node_bytes(s) == 0 || mn_stream_set_max_node_bytes(t, mn_max_node_bytes(s)) == MN_OK);
            CHECK(mn_last_append_ms(t) <= m->clock);
            m->clock = mn_last_append_ms(t);
            mn_stream_free(s);
            s = t;
        } else if (op < 69) {
            if (rnd_below(2)) CHECK(mn_stream_set_compression(s, (int)rnd_below(10)) == MN_OK);
            else CHECK(mn_stream_set_compression_depth(s, (uint32_t)rnd_below(8)) == MN_OK);
        } else if (op < 70) {
            if (rnd_below(3)) {
                uint32_t max = 1 + (uint32_t)rnd_below(rnd_below(2) ? 8 : 1500);
                CHECK(mn_stream_set_max_entries(s, max) == MN_OK);
                CHECK(mn_max_entries(s) == max);
            } else {
                uint32_t bytes = rnd_below(3) ? (uint32_t)rnd_below(3000) : 0;
                CHECK(mn_stream_set_max_node_bytes(s, bytes) == MN_OK);
                CHECK(mn_max_node_bytes(s) == bytes);
            }
        } else if (op < 72) {
            check_seek(s, m, m->clock - (int64_t)rnd_below(300));
        } else if (op < 74) {
            uint64_t before = mn_num_compressed_nodes(s);
            uint32_t budget = (uint32_t)rnd_below(4);
            int rc = mn_compress_step(s, budget);
            CHECK(rc == mn_compress_pending(s));
            uint64_t after = mn_num_compressed_nodes(s);
            CHECK((after > before ? after - before : before - after) <= budget);
            check_forms(s);
        } else if (op < 75) {
            /* Retention by age, a few nodes per call: only older messages go. */
            int64_t cutoff = m->clock - (int64_t)rnd_below(400);
            mn_evicted ev = {0, 0, 0, 0};
            int rc = mn_evict_older_than(s, cutoff, rnd_below(4), &ev);
            CHECK(rc == 0 || rc == 1);
            uint64_t gone = 0;
            for (uint64_t o = 0; o < mn_first_offset(s); o++) {
                if (m->readable[o]) CHECK(m->ms[o] < cutoff);
                gone += m->readable[o];
                m->readable[o] = 0;
            }
            CHECK(ev.messages == gone);
        } else {
            uint64_t start = rnd_below(m->next + 1);
            uint64_t room = m->next - start;
            check_read(s, m, start, rnd_below((room < 200 ? room : 200) + 1));
        }
        CHECK(live_bytes == mn_memory_bytes(s));
        if (step % 50 == 0) check_counters(s, m);
    }
    check_all(s, m);
    check_forms(s);
    s = roundtrip(s);
    check_all(s, m);
    while (mn_compress_step(s, 3)) {}
    check_forms(s);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

static void test_arguments(void) {
    CHECK(mn_abi_version() == MN_ABI_VERSION);
    CHECK(mn_stream_new(0, 0) == NULL);
    CHECK(mn_stream_new(MN_MAX_MAX_ENTRIES + 1, 0) == NULL);
    CHECK(mn_stream_new(10, -1) == NULL);
    CHECK(mn_stream_new(10, 10) == NULL);
    mn_stream *s = mn_stream_new(10, 0);
    CHECK(mn_stream_set_compression(s, 10) == MN_ERR_ARG);
    CHECK(mn_stream_set_max_entries(s, 0) == MN_ERR_ARG);
    CHECK(mn_stream_set_max_entries(s, MN_MAX_MAX_ENTRIES + 1) == MN_ERR_ARG);
    uint32_t len = 1;
    CHECK(mn_append(s, "x", &len, 0, 0) == MN_ERR_ARG);
    CHECK(mn_append(s, NULL, &len, 1, 0) == MN_ERR_ARG);
    CHECK(mn_append_one(s, NULL, 0, 0) == 0);
    CHECK(mn_evict_upto(s, 0) == 1);
    /* Lengths are checked before the buffer is read, so a lie is safe. */
    uint32_t huge[2] = {1, (uint32_t)MN_MAX_MESSAGE_BYTES + 1};
    CHECK(mn_append(s, "x", huge, 2, 0) == MN_ERR_TOOBIG);
    CHECK(mn_length(s) == 0 && mn_next_offset(s) == 1);
    CHECK(mn_append(s, "x", &len, 1, 0) == 1);
    CHECK(mn_evict_upto(s, -1) == MN_ERR_ARG);
    CHECK(mn_raise_next_offset(s, 0) == MN_ERR_ARG);
    CHECK(mn_raise_next_offset(s, ((uint64_t)1 << 63) + 1) == MN_ERR_ARG);
    mn_buf out;
    mn_buf_init(&out);
    int64_t lens[4];
    CHECK(mn_read_resp(s, 1, 2, MN_NULL_RESP2, &out) == MN_ERR_ARG);
    CHECK(mn_read_resp(s, 3, 0, MN_NULL_RESP2, &out) == MN_ERR_ARG);
    CHECK(mn_read_resp(s, 1, 1, 7, &out) == MN_ERR_ARG);
    CHECK(mn_read_copy(s, 1, 2, &out, lens) == MN_ERR_ARG);
    CHECK(mn_read_resp(s, 2, 0, MN_NULL_RESP3, &out) == MN_OK && out.len == 0);
    /* Output is appended, never truncated. */
    CHECK(mn_read_resp(s, 0, 2, MN_NULL_RESP3, &out) == MN_OK);
    CHECK(mn_read_resp(s, 1, 1, MN_NULL_RESP3, &out) == MN_OK);
    CHECK(out.len == 17 && memcmp(out.data, "_\r\n$1\r\nx\r\n$1\r\nx\r\n", 17) == 0);
    /* A prefix goes first; an error appends nothing, not even the prefix. */
    out.len = 0;
    CHECK(mn_read_resp_prefixed(s, 0, 2, MN_NULL_RESP2, "*2\r\n", 4, &out) == MN_OK);
    CHECK(out.len == 16 && memcmp(out.data, "*2\r\n$-1\r\n$1\r\nx\r\n", 16) == 0);
    CHECK(mn_read_resp_prefixed(s, 0, 3, MN_NULL_RESP2, "*3\r\n", 4, &out) == MN_ERR_ARG);
    CHECK(mn_read_resp_prefixed(s, 0, 1, MN_NULL_RESP2, NULL, 4, &out) == MN_ERR_ARG);
    CHECK(mn_read_resp_prefixed(s, 2, 0, MN_NULL_RESP3, "*0\r\n", 4, &out) == MN_OK);
    CHECK(out.len == 20 && memcmp(out.data + 16, "*0\r\n", 4) == 0);
    mn_buf_free(&out);
    mn_stream_free(s);
    mn_stream_free(NULL);
    CHECK(live_bytes == 0);
}

static void test_offset_limit(void) {
    const uint64_t end = (uint64_t)1 << 63;
    mn_stream *s = mn_stream_new(4, 0);
    CHECK(mn_raise_next_offset(s, end - 3) == MN_OK);
    CHECK(mn_first_offset(s) == end - 3);
    const char data[] = "abcd";
    uint32_t lens[4] = {1, 1, 1, 1};
    CHECK(mn_append(s, data, lens, 4, 0) == MN_ERR_OVERFLOW);
    CHECK(mn_length(s) == 0 && mn_num_nodes(s) == 0 && mn_next_offset(s) == end - 3);
    CHECK(mn_append(s, data, lens, 3, 0) == (int64_t)(end - 3));
    CHECK(mn_next_offset(s) == end);
    CHECK(mn_append(s, data, lens, 1, 0) == MN_ERR_OVERFLOW);
    CHECK(mn_append_one(s, data, 1, 0) == MN_ERR_OVERFLOW);
    CHECK(mn_raise_next_offset(s, end) == MN_OK);
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_resp(s, end - 3, 3, MN_NULL_RESP2, &out) == MN_OK);
    CHECK(out.len == 21 && memcmp(out.data, "$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", 21) == 0);
    CHECK(mn_read_resp(s, end, 0, MN_NULL_RESP2, &out) == MN_OK);
    mn_buf_free(&out);
    CHECK(mn_evict_keep(s, 1) == 2);
    CHECK(mn_first_offset(s) == end - 1);
    s = roundtrip(s);
    CHECK(mn_evict_upto(s, INT64_MAX) == 1);
    CHECK(mn_first_offset(s) == end && mn_num_nodes(s) == 0);
    s = roundtrip(s);
    CHECK(mn_next_offset(s) == end);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* Flip bytes and truncate a blob: the validator must reject every variant. */
static void check_blob_rejects_corruption(const mn_buf *blob) {
    char *copy = malloc(blob->len + 1);
    CHECK(copy != NULL);
    CHECK(mn_validate_node_blob(blob->data, blob->len) == MN_OK);
    for (size_t pos = 0; pos < blob->len; pos++) {
        static const unsigned char masks[3] = {0x01, 0x80, 0xff};
        for (int k = 0; k < 3; k++) {
            memcpy(copy, blob->data, blob->len);
            copy[pos] = (char)(copy[pos] ^ masks[k]);
            CHECK(mn_validate_node_blob(copy, blob->len) == MN_ERR_CORRUPT);
        }
    }
    for (size_t cut = 0; cut < blob->len; cut++) {
        /* A fresh allocation of exactly `cut` bytes, so ASan catches any
         * read past the claimed length. */
        char *shorter = malloc(cut ? cut : 1);
        CHECK(shorter != NULL);
        memcpy(shorter, blob->data, cut);
        CHECK(mn_validate_node_blob(shorter, cut) == MN_ERR_CORRUPT);
        free(shorter);
    }
    memcpy(copy, blob->data, blob->len);
    copy[blob->len] = 0;
    CHECK(mn_validate_node_blob(copy, blob->len + 1) == MN_ERR_CORRUPT);
    CHECK(mn_validate_node_blob(NULL, 0) == MN_ERR_CORRUPT);
    free(copy);
}

static void test_validation(void) {
    mn_stream *raw = mn_stream_new(3, 0);
    const char data[] = "abcdef";
    uint32_t lens[4] = {2, 0, 3, 1};
    CHECK(mn_append(raw, data, lens, 4, 0) == 0);
    mn_stream *packed = mn_stream_new(40, 9);
    char text[41 * 8];
    uint32_t plens[41];
    for (int i = 0; i < 41; i++) {
        memcpy(text + 8 * i, i % 2 ? "hellohel" : "worldwor", 8);
        plens[i] = 8;
    }
    CHECK(mn_append(packed, text, plens, 41, 0) == 0);
    CHECK(mn_num_compressed_nodes(packed) == 1);

    mn_buf *blobs;
    size_t n;
    serialize(raw, &blobs, &n);
    check_blob_rejects_corruption(&blobs[1]);
    /* Headers: every flipped byte and truncation is refused at load. */
    for (size_t pos = 0; pos < blobs[0].len; pos++) {
        blobs[0].data[pos] ^= 0x10;
        int err = 0;
        CHECK(mn_load_header(blobs[0].data, blobs[0].len, 0, &err) == NULL && err == MN_ERR_CORRUPT);
        blobs[0].data[pos] ^= 0x10;
    }
    for (size_t cut = 0; cut < blobs[0].len; cut++)
        CHECK(mn_load_header(blobs[0].data, cut, 0, NULL) == NULL);
    /* Nodes out of order, repeated, missing or extra are refused. */
    mn_buf swapped[3] = {blobs[0], blobs[2], blobs[1]};
    CHECK(load(swapped, 3) == NULL);
    mn_buf repeated[3] = {blobs[0], blobs[1], blobs[1]};
    CHECK(load(repeated, 3) == NULL);
    CHECK(load(blobs, 2) == NULL);
    mn_buf extra[4] = {blobs[0], blobs[1], blobs[2], blobs[2]};
    CHECK(load(extra, 4) == NULL);
    free_blobs(blobs, n);

    serialize(packed, &blobs, &n);
    CHECK(n == 3);
    check_blob_rejects_corruption(&blobs[1]);
    /* A compressed last node cannot come from a dump. */
    mn_buf *pblobs = blobs;
    mn_stream *s = mn_load_header(pblobs[0].data, pblobs[0].len, 0, NULL);
    CHECK(s != NULL);
    CHECK(mn_load_node(s, pblobs[1].data, pblobs[1].len) == MN_OK);
    CHECK(mn_load_finish(s) == MN_ERR_CORRUPT);
    mn_stream_free(s);
    free_blobs(blobs, n);

    /* 20 KB messages: the sealed node is five zlib chunks. */
    mn_stream *chunked = mn_stream_new(5, 1);
    static char big[6 * 20000];
    uint32_t big_lens[6];
    for (int i = 0; i < 6; i++) {
        memset(big + 20000 * i, 'A' + i, 20000);
        big_lens[i] = 20000;
    }
    CHECK(mn_append(chunked, big, big_lens, 6, 0) == 0);
    CHECK(mn_num_compressed_nodes(chunked) == 1);
    serialize(chunked, &blobs, &n);
    check_blob_rejects_corruption(&blobs[1]);
    free_blobs(blobs, n);
    mn_buf out;
    int64_t out_lens[6];
    mn_buf_init(&out);
    CHECK(mn_read_copy(chunked, 1, 5, &out, out_lens) == MN_OK);
    CHECK(out.len == 5 * 20000 && same(out.data, big + 20000, 5 * 20000));
    mn_buf_free(&out);
    mn_stream_free(chunked);
    mn_stream_free(raw);
    mn_stream_free(packed);
    CHECK(live_bytes == 0);
}

/* Every allocation an operation makes may fail; the operation must then
 * report MN_ERR_NOMEM and leave the stream unchanged. */
static void test_allocation_failures(void) {
    model *m = &the_model;
    for (int level = 0; level <= 6; level += 6) {
        model_reset(m);
        mn_stream *s = mn_stream_new(10, level);
        CHECK(do_append(s, m, 25) == MN_OK);
        CHECK(mn_evict_upto(s, 3) == 4);
        model_evict(m, 3);
        for (long k = 0;; k++) {
            uint64_t memory = mn_memory_bytes(s);
            SET_FAIL_AFTER(k);
            int rc = do_append(s, m, 37);
            SET_FAIL_AFTER(-1);
            CHECK(live_bytes == mn_memory_bytes(s));
            if (rc == MN_OK) break;
            CHECK(rc == MN_ERR_NOMEM);
            check_counters(s, m);
            CHECK(mn_memory_bytes(s) >= memory); /* capacity may have grown */
        }
        check_all(s, m);
        for (long k = 0;; k++) {
            mn_buf out;
            mn_buf_init(&out);
            SET_FAIL_AFTER(k);
            int rc = mn_read_resp(s, 0, m->next, MN_NULL_RESP2, &out);
            SET_FAIL_AFTER(-1);
            CHECK(rc == MN_OK || (rc == MN_ERR_NOMEM && out.len == 0));
            mn_buf_free(&out);
            CHECK(live_bytes == mn_memory_bytes(s));
            if (rc == MN_OK) break;
        }
        for (long k = 0;; k++) {
            mn_buf *blobs;
            size_t n;
            serialize(s, &blobs, &n);
            SET_FAIL_AFTER(k);
            mn_stream *copy = load(blobs, n);
            SET_FAIL_AFTER(-1);
            free_blobs(blobs, n);
            if (copy != NULL) {
                mn_stream_free(s);
                s = copy;
                break;
            }
        }
        check_all(s, m);
        for (long k = 0;; k++) {
            mn_buf out;
            mn_buf_init(&out);
            SET_FAIL_AFTER(k);
            int rc = mn_node_serialize(mn_first_node(s), &out);
            if (rc == MN_OK) rc = mn_serialize_header(s, &out);
            SET_FAIL_AFTER(-1);
            mn_buf_free(&out);
            if (rc == MN_OK) break;
            CHECK(rc == MN_ERR_NOMEM);
        }
        mn_stream_free(s);
        CHECK(live_bytes == 0);
    }
}

/* Bulk string headers at every digit-count boundary up to 7 digits. */
static void test_resp_lengths(void) {
    static const uint32_t lens[] = {0,    1,     9,     10,     99,     100,     999,
                                    1000, 9999,  10000, 99999,  100000, 999999,  1000000,
                                    1234567};
    const size_t n = sizeof lens / sizeof lens[0];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += lens[i];
    char *buf = malloc(total);
    CHECK(buf != NULL);
    for (size_t i = 0; i < total; i++) buf[i] = (char)('a' + i % 26);
    mn_stream *s = mn_stream_new(4, 1);
    CHECK(mn_append(s, buf, lens, n, 0) == 0);
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_resp(s, 0, n, MN_NULL_RESP2, &out) == MN_OK);
    size_t pos = 0, src = 0;
    for (size_t i = 0; i < n; i++) {
        char head[32];
        int head_len = snprintf(head, sizeof head, "$%u\r\n", lens[i]);
        CHECK(pos + (size_t)head_len + lens[i] + 2 <= out.len);
        CHECK(memcmp(out.data + pos, head, (size_t)head_len) == 0);
        pos += (size_t)head_len;
        CHECK(same(out.data + pos, buf + src, lens[i]));
        pos += lens[i] + 2;
        src += lens[i];
    }
    CHECK(pos == out.len);
    /* The capped read: one byte short of the reply refuses it, says its
     * size and appends nothing; exactly its size builds the same bytes. */
    size_t whole = out.len;
    mn_buf capped;
    mn_buf_init(&capped);
    uint64_t needed = 0;
    CHECK(mn_read_resp_capped(s, 0, n, MN_NULL_RESP2, "*15\r\n", 5, whole + 4, &needed,
                              &capped) == MN_ERR_CAP);
    CHECK(needed == whole + 5 && capped.len == 0);
    CHECK(mn_read_resp_capped(s, 0, n, MN_NULL_RESP2, "*15\r\n", 5, whole + 5, &needed,
                              &capped) == MN_OK);
    CHECK(capped.len == whole + 5 && memcmp(capped.data + 5, out.data, whole) == 0);
    mn_buf_free(&capped);
    mn_buf_free(&out);
    mn_stream_free(s);
    free(buf);
    CHECK(live_bytes == 0);
}

/* 100-byte messages in full nodes stay within 104.5 bytes each. */
static void test_memory_per_message(void) {
    static char buf[1000 * 100];
    static uint32_t lens[1000];
    memset(buf, 'x', sizeof buf);
    for (int i = 0; i < 1000; i++) lens[i] = 100;
    mn_stream *s = mn_stream_new(1000, 0);
    for (int i = 0; i < 20; i++) CHECK(mn_append(s, buf, lens, 1000, 0) == 1000 * i);
    CHECK(mn_memory_bytes(s) * 10 <= 20000 * 1045);
    CHECK(live_bytes == mn_memory_bytes(s));
    CHECK(mn_evict_keep(s, 0) == 20000);
    CHECK(mn_num_nodes(s) == 0 && mn_next_offset(s) == 20000);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* Rewrite the CRC32 of a blob after editing it, so that the checks behind
 * the checksum are what refuses it. */
static void fix_crc(mn_buf *b) {
    uint32_t crc = (uint32_t)crc32(crc32(0L, NULL, 0), (const unsigned char *)b->data, (unsigned)(b->len - 4));
    for (int i = 0; i < 4; i++) b->data[b->len - 4 + (size_t)i] = (char)(crc >> (8 * i));
}

static void put_i64(char *p, int64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (char)((uint64_t)v >> (8 * i));
}

/* Node blob, format 4: time width at 7, first_ms at 28, deltas after the
 * offset table. */
#define NODE_WIDTH_AT 7
#define NODE_FIRST_MS_AT 28
#define NODE_DELTAS_AT(count) (36 + 4 * (size_t)(count))

static void put_le(char *p, uint64_t v, int width) {
    for (int i = 0; i < width; i++) p[i] = (char)(v >> (8 * i));
}

static void test_time_index(void) {
    /* One message per 10 ms, 150 per node: deltas of 2 bytes. */
    mn_stream *s = mn_stream_new(150, 0);
    CHECK(mn_last_append_ms(s) == 0 && mn_seek_time(s, 5) == 0);
    CHECK(mn_oldest_append_ms(s) == MN_TIME_NONE && mn_oldest_node_memory(s) == 0);
    for (int64_t i = 0; i < 400; i++) CHECK(mn_append_one(s, "m", 1, 1000 + 10 * i) == i);
    CHECK(mn_last_append_ms(s) == 1000 + 3990);
    CHECK(mn_oldest_append_ms(s) == 1000);
    for (int64_t t = 900; t <= 5100; t++) {
        uint64_t exact = t <= 1000 ? 0 : t > 4990 ? 400 : (uint64_t)((t - 1000 + 9) / 10);
        CHECK(mn_seek_time(s, t) == exact);
    }
    int64_t times[400];
    CHECK(mn_read_times(s, 0, 400, times) == MN_OK);
    for (int i = 0; i < 400; i++) CHECK(times[i] == 1000 + 10 * i);
    CHECK(mn_read_times(s, 0, 401, times) == MN_ERR_ARG && mn_read_times(s, 401, 0, times) == MN_ERR_ARG);
    CHECK(mn_read_times(s, 400, 0, NULL) == MN_OK);
    /* Eviction: the answer is never an evicted offset; the oldest time is
     * the first readable message's. */
    CHECK(mn_evict_upto(s, 170) == 171);
    CHECK(mn_seek_time(s, 0) == 171);
    CHECK(mn_seek_time(s, 1000 + 10 * 180) == 180 && mn_seek_time(s, 1000 + 10 * 180 - 3) == 180);
    CHECK(mn_oldest_append_ms(s) == 1000 + 10 * 171);
    CHECK(mn_read_times(s, 169, 3, times) == MN_OK);
    CHECK(times[0] == -1 && times[1] == -1 && times[2] == 1000 + 10 * 171);
    /* The clock never goes back. */
    mn_stream *c = mn_stream_new(10, 0);
    CHECK(mn_append_one(c, "a", 1, 0) == 0 && mn_last_append_ms(c) == 0);
    CHECK(mn_append_one(c, "b", 1, 100) == 1 && mn_append_one(c, "c", 1, 40) == 2);
    CHECK(mn_last_append_ms(c) == 100 && mn_seek_time(c, 100) == 1 && mn_seek_time(c, 101) == 3);
    /* MN_NOW (any negative time): the core reads the wall clock. */
    struct timespec ts;
    CHECK(timespec_get(&ts, TIME_UTC) == TIME_UTC);
    int64_t before = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    CHECK(mn_append_one(c, "d", 1, MN_NOW) == 3 && mn_append_one(c, "e", 1, -77) == 4);
    CHECK(timespec_get(&ts, TIME_UTC) == TIME_UTC);
    int64_t after = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    CHECK(mn_last_append_ms(c) >= before && mn_last_append_ms(c) <= after);
    mn_stream_free(c);

    /* Saved and loaded with the stream. */
    mn_buf *blobs;
    size_t n;
    serialize(s, &blobs, &n);
    mn_stream *copy = load(blobs, n);
    CHECK(copy != NULL && mn_last_append_ms(copy) == mn_last_append_ms(s));
    for (int64_t t = 2000; t < 5100; t += 7) CHECK(mn_seek_time(copy, t) == mn_seek_time(s, t));
    mn_stream_free(copy);
    /* Deltas out of order or not starting at 0, an unknown width, times
     * past the stream's clock or before the previous node's, are refused. */
    CHECK(n == 3);
    mn_buf *node = &blobs[1]; /* 150 messages from offset 150, width 2 */
    CHECK(node->data[NODE_WIDTH_AT] == 2);
    char *deltas = node->data + NODE_DELTAS_AT(150);
    put_le(deltas + 2, 1491, 2); /* delta 1 past delta 2 */
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_ERR_CORRUPT);
    put_le(deltas + 2, 10, 2);
    put_le(deltas, 1, 2); /* message 0 is first_ms itself */
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_ERR_CORRUPT);
    put_le(deltas, 0, 2);
    node->data[NODE_WIDTH_AT] = 3;
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_ERR_CORRUPT);
    node->data[NODE_WIDTH_AT] = 2;
    put_i64(node->data + NODE_FIRST_MS_AT, MN_TIME_MAX - 100); /* the last delta passes it */
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_ERR_CORRUPT);
    put_i64(node->data + NODE_FIRST_MS_AT, 1000 + 10 * 150);
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_OK);
    node = &blobs[2]; /* 100 messages from offset 300 */
    put_i64(node->data + NODE_FIRST_MS_AT, 1000 + 10 * 299 - 1); /* before node 1's last */
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_OK);
    CHECK(load(blobs, n) == NULL);
    put_i64(node->data + NODE_FIRST_MS_AT, 1000 + 10 * 300);
    fix_crc(node);
    CHECK((copy = load(blobs, n)) != NULL);
    mn_stream_free(copy);
    put_i64(node->data + NODE_FIRST_MS_AT, 1000 + 10 * 300 + 1); /* its last past the clock */
    fix_crc(node);
    CHECK(mn_validate_node_blob(node->data, node->len) == MN_OK);
    CHECK(load(blobs, n) == NULL);
    free_blobs(blobs, n);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* A node's deltas widen as its times spread (re-encoded: an allocation
 * that may fail, leaving the stream as it was) and its memory is counted
 * at every width. */
/* mn_read_packed over more offsets than one of its chunks (1024), across
 * nodes, evicted ones first, with and without times. */
static void test_read_packed(void) {
    model *m = &the_model;
    model_reset(m);
    mn_stream *s = mn_stream_new(100, 3);
    static char msg[100];
    for (uint64_t o = 0; o < 3000; o++) {
        msg_fill(o, msg);
        int64_t t = 1700000000000 + (int64_t)(o / 7);
        CHECK(mn_append_one(s, msg, msg_len(o), t) == (int64_t)o);
        m->readable[o] = 1;
        m->ms[o] = t;
    }
    m->next = 3000;
    CHECK(mn_evict_upto(s, 499) == 500);
    memset(m->readable, 0, 500);
    static unsigned char lens_le[4 * 3000], times_le[8 * 3000];
    check_packed(s, m, 0, 3000, lens_le, times_le);
    check_packed(s, m, 1000, 2000, lens_le, NULL);
    check_packed(s, m, 3000, 0, lens_le, times_le);
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_packed(s, 0, 3001, &out, lens_le, NULL) == MN_ERR_ARG && out.len == 0);
    CHECK(mn_read_packed(s, 0, 1, &out, NULL, NULL) == MN_ERR_ARG);
    mn_buf_free(&out);
    mn_stream_free(s);
}

static void test_time_widths(void) {
    static const int64_t gaps[] = {0, 200, 300, 70000, (int64_t)1 << 33, 1};
    mn_stream *s = mn_stream_new(1000, 0);
    int64_t t = 1700000000000, expect[60];
    uint64_t k = 0;
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        t += gaps[g];
        for (int i = 0; i < 10; i++, k++) {
            /* The first append at widths 1, 2, 4 and 8 re-encodes the
             * deltas: with that allocation failing, nothing changes. */
            if (i == 0 && g >= 1 && g <= 4) {
                SET_FAIL_AFTER(0);
                int64_t rc = mn_append_one(s, "w", 1, t);
                SET_FAIL_AFTER(-1);
                CHECK(rc == MN_ERR_NOMEM);
                CHECK(mn_next_offset(s) == k && mn_last_append_ms(s) == t - gaps[g]);
                CHECK(live_bytes == mn_memory_bytes(s));
            }
            CHECK(mn_append_one(s, "w", 1, t) == (int64_t)k);
            expect[k] = t;
            CHECK(live_bytes == mn_memory_bytes(s));
        }
    }
    int64_t times[60];
    CHECK(mn_read_times(s, 0, k, times) == MN_OK);
    for (uint64_t i = 0; i < k; i++) CHECK(times[i] == expect[i]);
    for (uint64_t i = 0; i < k; i++) CHECK(mn_seek_time(s, expect[i]) <= i && times[mn_seek_time(s, expect[i])] == expect[i]);
    mn_buf *blobs;
    size_t n;
    serialize(s, &blobs, &n);
    CHECK(n == 2 && blobs[1].data[NODE_WIDTH_AT] == 8);
    mn_stream *copy = load(blobs, n);
    CHECK(copy != NULL && mn_read_times(copy, 0, k, times) == MN_OK);
    for (uint64_t i = 0; i < k; i++) CHECK(times[i] == expect[i]);
    mn_stream_free(copy);
    free_blobs(blobs, n);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* Nodes of 10 messages of 3 bytes; node k appended at time 1000 * k. */
static mn_stream *retention_stream(int nodes) {
    mn_stream *s = mn_stream_new(10, 0);
    for (int k = 0; k < nodes; k++)
        for (int i = 0; i < 10; i++) CHECK(mn_append_one(s, "abc", 3, 1000 * k) == 10 * k + i);
    return s;
}

static void test_retention(void) {
    mn_stream *s = retention_stream(6);
    mn_evicted ev = {0, 0, 0, 0};
    uint64_t memory = mn_memory_bytes(s);
    CHECK(mn_evict_upto(s, 4) == 5); /* the first node is partially evicted */
    /* Older than 3500: nodes 0..3, two per call. */
    CHECK(mn_evict_older_than(s, 3500, 2, &ev) == 1);
    CHECK(ev.nodes == 2 && ev.messages == 15 && ev.bytes == 45);
    CHECK(mn_first_offset(s) == 20 && mn_length(s) == 40);
    CHECK(mn_evict_older_than(s, 3500, 2, &ev) == 0);
    CHECK(ev.nodes == 4 && ev.messages == 35 && ev.bytes == 105);
    CHECK(mn_evict_older_than(s, 3500, 2, &ev) == 0 && ev.nodes == 4);
    CHECK(ev.memory == memory - mn_memory_bytes(s) && live_bytes == mn_memory_bytes(s));
    CHECK(mn_oldest_append_ms(s) == 4000);
    /* Inside a node, exactly the expired messages go (the node stays). */
    CHECK(mn_append_one(s, "abc", 3, 9000) == 60);
    CHECK(mn_append_one(s, "abc", 3, 9500) == 61);
    CHECK(mn_evict_older_than(s, 9200, 100, &ev) == 0);
    CHECK(mn_first_offset(s) == 61 && mn_length(s) == 1 && mn_num_nodes(s) == 1);
    CHECK(ev.messages == 56 && ev.bytes == 168 && ev.nodes == 6);
    /* The active node goes once all its messages expired; the offsets stay. */
    CHECK(mn_evict_older_than(s, 9501, 0, &ev) == 1);
    CHECK(mn_evict_older_than(s, 9501, 100, &ev) == 0);
    CHECK(mn_num_nodes(s) == 0 && mn_length(s) == 0 && mn_next_offset(s) == 62);
    CHECK(mn_first_offset(s) == 62 && mn_payload_bytes(s) == 0);
    CHECK(ev.messages == 62 - 5 && ev.nodes == 7);
    CHECK(mn_append_one(s, "x", 1, 1) == 62 && mn_last_append_ms(s) == 9500);
    mn_stream_free(s);

    /* By size: oldest whole nodes while the payload exceeds the limit, never
     * the active node. */
    s = retention_stream(5); /* 150 bytes, 30 per node */
    memset(&ev, 0, sizeof ev);
    CHECK(mn_evict_over_bytes(s, 150, 10, &ev) == 0 && ev.nodes == 0);
    CHECK(mn_evict_over_bytes(s, 100, 1, &ev) == 1 && ev.nodes == 1);
    CHECK(mn_evict_over_bytes(s, 100, 10, &ev) == 0 && ev.nodes == 2);
    CHECK(mn_payload_bytes(s) == 90 && mn_first_offset(s) == 20);
    CHECK(mn_evict_over_bytes(s, 0, 10, &ev) == 0);
    CHECK(mn_num_nodes(s) == 1 && mn_payload_bytes(s) == 30 && ev.bytes == 120);
    CHECK(live_bytes == mn_memory_bytes(s));
    /* The oldest node, whatever it is, for a maxmemory policy. */
    uint64_t node_memory = mn_oldest_node_memory(s);
    memory = mn_memory_bytes(s);
    memset(&ev, 0, sizeof ev);
    CHECK(mn_evict_oldest_node(s, &ev) == 1 && ev.messages == 10 && ev.memory == node_memory);
    CHECK(memory - node_memory == mn_memory_bytes(s) && live_bytes == mn_memory_bytes(s));
    CHECK(mn_evict_oldest_node(s, &ev) == 0 && ev.nodes == 1);
    CHECK(mn_evict_older_than(NULL, 0, 1, &ev) == MN_ERR_ARG);
    CHECK(mn_evict_over_bytes(s, 0, 1, NULL) == MN_ERR_ARG);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* Serialize a stream into one buffer (header and nodes back to back). */
static void dump_into(const mn_stream *s, mn_buf *out) {
    mn_buf_init(out);
    CHECK(mn_serialize_header(s, out) == MN_OK);
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node))
        CHECK(mn_node_serialize(node, out) == MN_OK);
}

/* Message `id` of the concatenation tests: 0..299 bytes, compressible
 * when id is even. */
static uint32_t cat_len(uint32_t id) { return (id * 37) % 300; }

static void cat_fill(uint32_t id, char *out) {
    for (uint32_t j = 0; j < cat_len(id); j++)
        out[j] = (char)(id % 2 ? (id * 31 + j * 17) & 0xff : 'a' + j % 4);
}

/* Append messages first_id .. first_id + n - 1 at time t. */
static void cat_append(mn_stream *s, uint32_t first_id, uint32_t n, int64_t t) {
    static char buf[400 * 300];
    static uint32_t lens[400];
    CHECK(n <= 400);
    if (n == 0) return;
    size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = cat_len(first_id + i);
        cat_fill(first_id + i, buf + pos);
        pos += lens[i];
    }
    int64_t rc = mn_append(s, buf, lens, n, t);
    if (rc < 0) fprintf(stderr, "cat_append(%u, %u): %lld\n", first_id, n, (long long)rc);
    CHECK(rc >= 0);
}

/* dst holds ids [0, a) at offsets from 0 with the first `gone` evicted;
 * its messages from `at` on must be ids want[0..n-1]. */
static void cat_check(mn_stream *s, uint64_t at, const uint32_t *want, size_t n) {
    static char expect[300];
    mn_buf out;
    mn_buf_init(&out);
    static int64_t lens[2000];
    CHECK(n <= 2000 && mn_next_offset(s) == at + n);
    CHECK(mn_read_copy(s, at, n, &out, lens) == MN_OK);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(lens[i] == (int64_t)cat_len(want[i]));
        cat_fill(want[i], expect);
        CHECK(same(out.data + pos, expect, cat_len(want[i])));
        pos += cat_len(want[i]);
    }
    mn_buf_free(&out);
}

/* One concatenation: dst (max_entries dmax, level dlevel) holds ids
 * 1000.. of which some evicted; src (smax, slevel) holds ids 0..sn-1 with
 * the first `sgone` evicted and a gap; every allocation that can fail is
 * made to fail once first, and must leave both streams as they were. */
static void concat_case(uint32_t dmax, int dlevel, uint32_t dn, uint32_t smax, int slevel,
                        uint32_t sn, uint32_t sgone, int expect_moved) {
    static uint32_t want[2000];
    for (long k = 0;; k++) {
        mn_stream *dst = mn_stream_new(dmax, dlevel), *src = mn_stream_new(smax, slevel);
        if (dn) cat_append(dst, 1000, dn, 5000);
        if (dn > 3) CHECK(mn_evict_upto(dst, 2) == 3);
        size_t n = 0;
        uint64_t dfirst = mn_first_offset(dst);
        for (uint64_t o = dfirst; o < mn_next_offset(dst); o++) want[n++] = 1000 + (uint32_t)o;
        cat_append(src, 0, sn / 2, 1000);
        CHECK(mn_raise_next_offset(src, mn_next_offset(src) + 7) == MN_OK); /* a gap */
        cat_append(src, sn / 2, sn - sn / 2, 9000);
        if (sgone) CHECK(mn_evict_upto(src, sgone - 1) == sgone);
        for (uint32_t id = sgone; id < sn; id++) want[n++] = id;
        uint64_t dnext = mn_next_offset(dst), snext = mn_next_offset(src);
        uint64_t slength = mn_length(src), spayload = mn_payload_bytes(src);
        uint64_t dlength = mn_length(dst), dpayload = mn_payload_bytes(dst);
        mn_buf before_d, before_s;
        dump_into(dst, &before_d);
        dump_into(src, &before_s);
        /* Nodes of src that hold no evicted message; they move unless all of
         * src fits in dst's active node. */
        static const mn_node *whole[100];
        size_t nwhole = 0;
        for (const mn_node *node = mn_first_node(src); node; node = mn_node_next(node)) {
            mn_node_info info;
            mn_node_get_info(node, &info);
            if (info.first >= mn_first_offset(src) && nwhole < 100) whole[nwhole++] = node;
        }

        SET_FAIL_AFTER(k);
        int64_t rc = mn_stream_concat(dst, src);
        SET_FAIL_AFTER(-1);
        CHECK(live_bytes == mn_memory_bytes(dst) + mn_memory_bytes(src) + before_d.cap + before_s.cap);
        if (rc == MN_ERR_NOMEM) {
            mn_buf after_d, after_s;
            dump_into(dst, &after_d);
            dump_into(src, &after_s);
            CHECK(after_d.len == before_d.len && same(after_d.data, before_d.data, after_d.len));
            CHECK(after_s.len == before_s.len && same(after_s.data, before_s.data, after_s.len));
            mn_buf_free(&after_d);
            mn_buf_free(&after_s);
        } else {
            CHECK(rc == (int64_t)dnext);
            CHECK(mn_length(dst) == dlength + slength && mn_payload_bytes(dst) == dpayload + spayload);
            CHECK(mn_first_offset(dst) == (dlength ? dfirst : dnext));
            cat_check(dst, mn_first_offset(dst), want, n);
            CHECK(mn_num_nodes(src) == 0 && mn_length(src) == 0 && mn_payload_bytes(src) == 0);
            CHECK(mn_next_offset(src) == snext && mn_first_offset(src) == snext);
            size_t moved = 0;
            for (const mn_node *node = mn_first_node(dst); node; node = mn_node_next(node))
                for (size_t i = 0; i < nwhole; i++) moved += node == whole[i];
            CHECK(moved == (expect_moved ? nwhole : 0));
            /* Times: raised to dst's clock, never decreasing. */
            int64_t last = 0;
            mn_node_info info;
            for (const mn_node *node = mn_first_node(dst); node; node = mn_node_next(node)) {
                mn_node_get_info(node, &info);
                CHECK(info.first_ms >= last && info.last_ms >= info.first_ms);
                last = info.last_ms;
            }
            CHECK(mn_last_append_ms(dst) == (dn ? 9000 > 5000 ? 9000 : 5000 : 9000));
            mn_stream *copy = roundtrip(dst);
            cat_check(copy, mn_first_offset(copy), want, n);
            cat_append(copy, 1, 3, 0); /* appends go on */
            dst = copy;
            /* src takes appends again, from its kept next offset */
            cat_append(src, 5, 2, 0);
            CHECK(mn_first_offset(src) == snext && mn_length(src) == 2);
        }
        mn_buf_free(&before_d);
        mn_buf_free(&before_s);
        mn_stream_free(dst);
        mn_stream_free(src);
        CHECK(live_bytes == 0);
        if (rc != MN_ERR_NOMEM) break;
    }
}

static void test_concat(void) {
    /* whole nodes move; partially evicted first node copied */
    concat_case(10, 0, 25, 10, 0, 95, 13, 1);
    /* compressed nodes move compressed, into a compressing and a raw dst */
    concat_case(10, 0, 25, 10, 6, 95, 13, 1);
    concat_case(50, 1, 120, 40, 9, 300, 0, 1);
    /* small src: copied into dst's active node; larger nodes than dst's */
    concat_case(100, 0, 30, 100, 0, 40, 0, 0);
    concat_case(100, 6, 30, 7, 6, 40, 3, 0);
    concat_case(3, 0, 8, 200, 0, 450, 1, 1);
    /* empty dst, one-message src */
    concat_case(10, 0, 0, 10, 0, 30, 0, 1);
    concat_case(10, 0, 12, 10, 0, 1, 0, 0);
    mn_stream *a = mn_stream_new(10, 0), *b = mn_stream_new(10, 0);
    CHECK(mn_stream_concat(a, a) == MN_ERR_ARG && mn_stream_concat(NULL, b) == MN_ERR_ARG);
    CHECK(mn_stream_concat(a, b) == 0);
    CHECK(mn_raise_next_offset(a, ((uint64_t)1 << 63) - 2) == MN_OK);
    cat_append(b, 0, 3, 0);
    CHECK(mn_stream_concat(a, b) == MN_ERR_OVERFLOW && mn_length(b) == 3);
    CHECK(mn_evict_upto(b, 0) == 1);
    CHECK(mn_stream_concat(a, b) == (int64_t)(((uint64_t)1 << 63) - 2));
    CHECK(mn_next_offset(a) == (uint64_t)1 << 63 && mn_length(b) == 0);
    mn_stream_free(a);
    mn_stream_free(b);
    CHECK(live_bytes == 0);
}

/* TCONCAT's many sources in one call: in order, empty sources passed over;
 * an error stops at the failing source with those before it appended. */
static void test_concat_many(void) {
    mn_stream *dst = mn_stream_new(4, 0);
    mn_stream *src[4];
    for (int i = 0; i < 4; i++) src[i] = mn_stream_new(4, 0);
    cat_append(dst, 0, 2, 0);
    cat_append(src[0], 2, 5, 0); /* more than a node: nodes move */
    cat_append(src[2], 7, 1, 0);
    cat_append(src[3], 8, 3, 0);
    CHECK(mn_evict_upto(src[3], 0) == 1); /* id 8 evicted */
    CHECK(mn_length_sum(src, 4) == 5 + 0 + 1 + 2 && mn_length_sum(src, 0) == 0);
    size_t done = 99;
    CHECK(mn_stream_concat_many(dst, src, 0, &done) == 2 && done == 0);
    CHECK(mn_stream_concat_many(dst, src, 4, &done) == 2 && done == 4);
    static const uint32_t want[] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10};
    cat_check(dst, 0, want, 10);
    CHECK(mn_length_sum(src, 4) == 0);
    /* dst among the sources: MN_ERR_ARG there, the one before it moved */
    cat_append(src[1], 11, 1, 0);
    mn_stream *bad[3] = {src[1], dst, src[2]};
    CHECK(mn_stream_concat_many(dst, bad, 3, &done) == MN_ERR_ARG && done == 1);
    CHECK(mn_length(src[1]) == 0 && mn_length(dst) == 11);
    CHECK(mn_stream_concat_many(NULL, src, 4, &done) == MN_ERR_ARG && done == 0);
    for (int i = 0; i < 4; i++) mn_stream_free(src[i]);
    mn_stream_free(dst);
    CHECK(live_bytes == 0);
}

/* Compressible messages: 100 bytes of a repeated pattern. */
static void depth_append(mn_stream *s, uint32_t n) {
    static char buf[1000 * 100];
    static uint32_t lens[1000];
    CHECK(n <= 1000);
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = 100;
        for (int j = 0; j < 100; j++) buf[100 * i + (uint32_t)j] = (char)('a' + (i + (uint32_t)j) % 5);
    }
    CHECK(mn_append(s, buf, lens, n, 0) >= 0);
}

static uint64_t compressed_among(const mn_stream *s, uint64_t from_rank, uint64_t to_rank) {
    uint64_t n = mn_num_nodes(s), count = 0, i = 0;
    mn_node_info info;
    for (const mn_node *node = mn_first_node(s); node; node = mn_node_next(node), i++) {
        mn_node_get_info(node, &info);
        if (i + 1 == n) break;
        uint64_t rank = n - 2 - i;
        count += rank >= from_rank && rank < to_rank && info.compressed;
    }
    return count;
}

static void test_compression_depth(void) {
    mn_stream *s = mn_stream_new(10, 6);
    CHECK(mn_stream_set_compression_depth(s, 3) == MN_OK && mn_compression_depth(s) == 3);
    CHECK(mn_stream_set_compression_depth(s, MN_MAX_COMPRESSION_DEPTH + 1) == MN_ERR_ARG);
    /* One node at a time: each seal compresses the node that reached rank 3. */
    for (int i = 0; i < 10; i++) {
        depth_append(s, 10);
        CHECK(compressed_among(s, 0, 3) == 0);
        CHECK(mn_num_compressed_nodes(s) == (uint64_t)(i >= 4 ? i - 3 : 0));
    }
    check_forms(s);
    /* Deeper: the scan inflates ranks 3 and 4, one node per step. */
    CHECK(mn_stream_set_compression_depth(s, 5) == MN_OK && mn_compress_pending(s));
    CHECK(mn_compress_step(s, 1) == 1 && mn_num_compressed_nodes(s) == 5);
    CHECK(mn_compress_step(s, 1) == 1 && mn_num_compressed_nodes(s) == 4);
    CHECK(mn_compress_step(s, 1) == 0 && !mn_compress_pending(s));
    check_forms(s);
    /* Another level recompresses; level 0 inflates everything. */
    CHECK(mn_stream_set_compression(s, 9) == MN_OK);
    while (mn_compress_step(s, 2)) {}
    check_forms(s);
    CHECK(mn_num_compressed_nodes(s) == 4);
    CHECK(mn_stream_set_compression(s, 0) == MN_OK);
    /* Appends do the work too: one node per node sealed. */
    for (int i = 0; i < 4; i++) {
        depth_append(s, 10);
        CHECK(mn_num_compressed_nodes(s) == (uint64_t)(3 - i));
    }
    check_forms(s);
    CHECK(live_bytes == mn_memory_bytes(s));
    /* Allocation failures while conforming leave readable nodes, exact
     * accounting, and the scan going on. */
    CHECK(mn_stream_set_compression(s, 1) == MN_OK);
    for (long k = 0; mn_compress_pending(s); k++) {
        SET_FAIL_AFTER(k % 3);
        mn_compress_step(s, 1);
        SET_FAIL_AFTER(-1);
        CHECK(live_bytes == mn_memory_bytes(s));
        mn_buf out;
        mn_buf_init(&out);
        CHECK(mn_read_resp(s, 0, mn_next_offset(s), MN_NULL_RESP2, &out) == MN_OK);
        CHECK(out.len == mn_next_offset(s) * (100 + 8));
        mn_buf_free(&out);
    }
    /* Evicting the boundary and the scan's nodes, then going on. */
    CHECK(mn_stream_set_compression_depth(s, 2) == MN_OK);
    CHECK(mn_evict_upto(s, (int64_t)mn_next_offset(s) - 15) > 0);
    depth_append(s, 40);
    while (mn_compress_step(s, 1)) {}
    check_forms(s);
    /* A concatenation: moved nodes conform through the scan. */
    mn_stream *raw = mn_stream_new(10, 0);
    depth_append(raw, 200);
    CHECK(mn_stream_concat(s, raw) > 0 && mn_compress_pending(s));
    while (mn_compress_step(s, 1)) {}
    check_forms(s);
    CHECK(compressed_among(s, 2, 1000) == mn_num_nodes(s) - 3);
    /* Depth is saved with the stream. */
    s = roundtrip(s);
    CHECK(mn_compression_depth(s) == 2);
    mn_stream_free(raw);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* Regression (fuzz_ops, ops-crash-fbad9b8b): a zlib chunk can hold only
 * empty messages (they follow a message of >= 16 KB in a node). Its cache
 * entry is a 1-byte allocation, which memory_bytes counted as 0 bytes. */
static void test_regression_empty_chunk_in_cache(void) {
    static char big[20001];
    memset(big, 'z', sizeof big);
    uint32_t lens[4] = {20000, 0, 0, 1};
    mn_stream *s = mn_stream_new(3, 6);
    CHECK(mn_append(s, big, lens, 4, 0) == 0); /* node [big, "", ""] sealed, compressed */
    CHECK(mn_num_compressed_nodes(s) == 1);
    mn_buf out;
    mn_buf_init(&out);
    CHECK(mn_read_resp(s, 1, 2, MN_NULL_RESP2, &out) == MN_OK); /* inflates the empty chunk */
    CHECK(out.len == 12 && memcmp(out.data, "$0\r\n\r\n$0\r\n\r\n", 12) == 0);
    mn_buf_free(&out);
    CHECK(live_bytes == mn_memory_bytes(s));
    CHECK(mn_oldest_node_memory(s) + (mn_memory_bytes(s) - mn_oldest_node_memory(s)) == live_bytes);
    mn_evicted ev = {0, 0, 0, 0};
    uint64_t before = mn_memory_bytes(s), node = mn_oldest_node_memory(s);
    CHECK(mn_evict_oldest_node(s, &ev) == 1 && ev.memory == node && before - node == live_bytes);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}


/* ------------------------------------------------------------------------
 * Node byte cap and whole-node appends
 * --------------------------------------------------------------------- */

/* Memory of a node beyond its blob: struct (at most 32 levels) and tables. */
#define NODE_OVERHEAD_MAX(count) (sizeof(void *) * 40 + 8 + 4 * (uint64_t)(count) + 8 * (((uint64_t)(count) + 63) / 64))

static void test_max_node_bytes(void) {
    static char buf[1000 * 100];
    static uint32_t lens[1000];
    memset(buf, 'x', sizeof buf);
    for (int i = 0; i < 1000; i++) lens[i] = 100;
    mn_stream *s = mn_stream_new(1000, 0);
    CHECK(mn_max_node_bytes(s) == 0);
    CHECK(mn_stream_set_max_node_bytes(NULL, 5) == MN_ERR_ARG);
    CHECK(mn_stream_set_max_node_bytes(s, 98304) == MN_OK && mn_max_node_bytes(s) == 98304);
    /* 100-byte messages, 100 per append: nodes of 983 (98,300 bytes), and
     * no blob is ever allocated past the cap (the jemalloc size class). */
    for (int i = 0; i < 200; i++) {
        CHECK(mn_append(s, buf, lens, 100, 0) == 100 * i);
        mn_node_info info;
        for (const mn_node *node = mn_first_node(s); node; node = mn_node_next(node)) {
            mn_node_get_info(node, &info);
            CHECK(info.memory <= 98304 + NODE_OVERHEAD_MAX(1000));
            if (mn_node_next(node) != NULL) CHECK(info.count == 983);
        }
    }
    CHECK(mn_num_nodes(s) == 20000 / 983 + 1);
    CHECK(live_bytes == mn_memory_bytes(s));
    /* Sealed nodes hold exactly what they use; the active one is sized
     * ahead to the cap. */
    CHECK(mn_memory_bytes(s) <= 20000 * 100 + 98304 + mn_num_nodes(s) * NODE_OVERHEAD_MAX(1000));
    /* max_entries still ends nodes first when messages are small. */
    static uint32_t lens50[1000];
    for (int i = 0; i < 1000; i++) lens50[i] = 50;
    mn_stream *small = mn_stream_new(1000, 0);
    CHECK(mn_stream_set_max_node_bytes(small, 98304) == MN_OK);
    for (int i = 0; i < 5; i++) CHECK(mn_append(small, buf, lens50, 1000, 0) >= 0);
    CHECK(mn_num_nodes(small) == 5);
    mn_stream_free(small);
    /* A message over the cap goes alone; a fuller tail (cap lowered)
     * keeps its messages and the next append starts a node. */
    mn_stream *t = mn_stream_new(1000, 0);
    CHECK(mn_stream_set_max_node_bytes(t, 50) == MN_OK);
    uint32_t mixed[5] = {30, 30, 100, 10, 20};
    CHECK(mn_append(t, buf, mixed, 5, 0) == 0);
    uint32_t want[4] = {1, 1, 1, 2};
    uint32_t k = 0;
    mn_node_info info;
    for (const mn_node *node = mn_first_node(t); node; node = mn_node_next(node), k++) {
        mn_node_get_info(node, &info);
        CHECK(k < 4 && info.count == want[k]);
    }
    CHECK(k == 4 && mn_payload_bytes(t) == 190);
    CHECK(mn_stream_set_max_node_bytes(t, 0) == MN_OK);
    CHECK(mn_append(t, buf, lens, 30, 0) == 5 && mn_num_nodes(t) == 4); /* no cap: into the tail */
    CHECK(mn_stream_set_max_node_bytes(t, 1000) == MN_OK);
    CHECK(mn_append_one(t, buf, 1, 0) == 35 && mn_num_nodes(t) == 5);
    /* A concatenation into a capped active node copies only what fits. */
    mn_stream *src = mn_stream_new(1000, 0);
    CHECK(mn_append(src, buf, lens, 20, 0) == 0);
    CHECK(mn_stream_concat(t, src) == 36);
    CHECK(mn_num_nodes(t) == 6); /* 2,001 bytes would pass the cap: src's node moved */
    CHECK(live_bytes == mn_memory_bytes(s) + mn_memory_bytes(t) + mn_memory_bytes(src));
    mn_stream_free(src);
    mn_stream_free(t);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

/* The two streams read the same and their nodes are the same. */
static void check_same_stream(mn_stream *a, mn_stream *b) {
    CHECK(mn_next_offset(a) == mn_next_offset(b) && mn_first_offset(a) == mn_first_offset(b));
    CHECK(mn_length(a) == mn_length(b) && mn_payload_bytes(a) == mn_payload_bytes(b));
    CHECK(mn_num_nodes(a) == mn_num_nodes(b));
    CHECK(mn_num_compressed_nodes(a) == mn_num_compressed_nodes(b));
    const mn_node *x = mn_first_node(a), *y = mn_first_node(b);
    mn_buf bx, by;
    mn_buf_init(&bx);
    mn_buf_init(&by);
    for (; x && y; x = mn_node_next(x), y = mn_node_next(y)) {
        bx.len = by.len = 0;
        CHECK(mn_node_serialize(x, &bx) == MN_OK && mn_node_serialize(y, &by) == MN_OK);
        CHECK(bx.len == by.len && same(bx.data, by.data, bx.len));
    }
    CHECK(x == NULL && y == NULL);
    uint64_t n = mn_next_offset(a) - mn_first_offset(a);
    bx.len = by.len = 0;
    CHECK(mn_read_resp(a, mn_first_offset(a), n, MN_NULL_RESP2, &bx) == MN_OK);
    CHECK(mn_read_resp(b, mn_first_offset(b), n, MN_NULL_RESP2, &by) == MN_OK);
    CHECK(bx.len == by.len && same(bx.data, by.data, bx.len));
    mn_buf_free(&bx);
    mn_buf_free(&by);
    for (int64_t t = 0; t < 400; t += 3) CHECK(mn_seek_time(a, 1000 + t) == mn_seek_time(b, 1000 + t));
}

static void test_append_node_blob(void) {
    /* 10 messages per node, compressible, one append time per 10 ms; a
     * gap, a partially evicted first node, compressed nodes at depth 2. */
    mn_stream *s = mn_stream_new(10, 6);
    CHECK(mn_stream_set_compression_depth(s, 2) == MN_OK);
    static char buf[100 * 100];
    static uint32_t lens[100];
    for (int i = 0; i < 100; i++) {
        lens[i] = 100;
        for (int j = 0; j < 100; j++) buf[100 * i + j] = (char)('a' + (i + j) % 5);
    }
    for (int i = 0; i < 6; i++) CHECK(mn_append(s, buf, lens, 10, 1000 + 10 * i) >= 0);
    CHECK(mn_raise_next_offset(s, 65) == MN_OK);
    for (int i = 6; i < 12; i++) CHECK(mn_append(s, buf, lens, 7, 1000 + 10 * i) >= 0);
    CHECK(mn_evict_upto(s, 3) == 4);
    CHECK(mn_raise_next_offset(s, mn_next_offset(s) + 5) == MN_OK);
    while (mn_compress_step(s, 5)) {}
    CHECK(mn_num_compressed_nodes(s) > 0);
    mn_stream *t = rebuild(s, (size_t)-1);
    check_same_stream(s, t);
    /* Nothing to conform (the nodes came in their form)... */
    while (mn_compress_step(t, 1)) {}
    check_same_stream(s, t);
    CHECK(live_bytes == mn_memory_bytes(s) + mn_memory_bytes(t));
    /* ...and appends carry on as on the original. */
    CHECK(mn_append(s, buf, lens, 25, 2000) >= 0 && mn_append(t, buf, lens, 25, 2000) >= 0);
    check_same_stream(s, t);

    /* Refused, changing nothing: a node before the next offset, a corrupt
     * blob, a node of the previous format, no stream. */
    mn_buf b;
    mn_buf_init(&b);
    CHECK(mn_node_serialize(mn_first_node(s), &b) == MN_OK);
    uint64_t memory = mn_memory_bytes(t);
    CHECK(mn_append_node_blob(t, b.data, b.len) == MN_ERR_ARG);
    CHECK(mn_append_node_blob(NULL, b.data, b.len) == MN_ERR_ARG);
    b.data[40] ^= 1;
    CHECK(mn_append_node_blob(t, b.data, b.len) == MN_ERR_CORRUPT);
    b.data[40] ^= 1;
    b.data[4] = 2;
    fix_crc(&b);
    CHECK(mn_append_node_blob(t, b.data, b.len) == MN_ERR_CORRUPT);
    CHECK(mn_memory_bytes(t) == memory);
    check_same_stream(s, t);
    mn_buf_free(&b);

    /* Allocation failures change nothing; times are raised to the clock. */
    mn_stream *late = mn_stream_new(10, 0);
    CHECK(mn_append_one(late, "x", 1, 5000) == 0);
    CHECK(mn_raise_next_offset(late, 15) == MN_OK);
    mn_buf_init(&b);
    const mn_node *third = mn_node_next(mn_node_next(mn_first_node(s)));
    CHECK(mn_node_serialize(third, &b) == MN_OK);
    for (long k = 0;; k++) {
        uint64_t held = mn_memory_bytes(late);
        SET_FAIL_AFTER(k);
        int rc = mn_append_node_blob(late, b.data, b.len);
        SET_FAIL_AFTER(-1);
        /* (b's buffer comes from the core's allocator too) */
        CHECK(live_bytes == mn_memory_bytes(s) + mn_memory_bytes(t) + mn_memory_bytes(late) + b.cap);
        if (rc == MN_OK) break;
        CHECK(rc == MN_ERR_NOMEM && mn_next_offset(late) == 15 && mn_length(late) == 1);
        CHECK(mn_memory_bytes(late) >= held); /* the head may have grown */
    }
    mn_node_info info, orig;
    mn_node_get_info(third, &orig);
    mn_node_get_info(mn_node_next(mn_first_node(late)), &info);
    CHECK(info.first == orig.first && info.count == orig.count && info.compressed == orig.compressed);
    CHECK(info.first_ms == 5000 && info.last_ms == 5000 && mn_last_append_ms(late) == 5000);
    CHECK(mn_next_offset(late) == orig.first + orig.count && mn_length(late) == 1 + orig.count);
    mn_buf_free(&b);
    mn_stream_free(late);

    /* Cut short after a compressed node (an AOF cut there): that node is
     * the tail; appends start a node after it, a dump of it loads, and it
     * is conformed once sealed. */
    mn_stream *cut = rebuild(s, 2);
    mn_node_get_info(mn_node_next(mn_first_node(cut)), &info);
    CHECK(info.compressed && mn_num_nodes(cut) == 2);
    cut = roundtrip(cut);
    mn_node_get_info(mn_node_next(mn_first_node(cut)), &info);
    CHECK(info.compressed);
    uint64_t end = info.first + info.count;
    CHECK(mn_append(cut, buf, lens, 3, 3000) == (int64_t)end && mn_num_nodes(cut) == 3);
    while (mn_compress_step(cut, 1)) {}
    check_forms(cut); /* depth 2: both sealed nodes raw now */
    CHECK(mn_num_compressed_nodes(cut) == 0);
    CHECK(live_bytes == mn_memory_bytes(s) + mn_memory_bytes(t) + mn_memory_bytes(cut));
    mn_stream_free(cut);
    mn_stream_free(t);
    mn_stream_free(s);
    CHECK(live_bytes == 0);
}

int main(void) {
    test_arguments();
    test_offset_limit();
    test_validation();
    test_allocation_failures();
    test_memory_per_message();
    test_resp_lengths();
    test_time_index();
    test_time_widths();
    test_read_packed();
    test_retention();
    test_concat();
    test_concat_many();
    test_compression_depth();
    test_regression_empty_chunk_in_cache();
    test_max_node_bytes();
    test_append_node_blob();
    static const uint32_t sizes[] = {1, 3, 10, 100, 1000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int level = 0; level <= 9; level += 3) test_random_operations(sizes[i], level, 1500);
    }
    printf("macronode driver: all checks passed\n");
    return 0;
}
