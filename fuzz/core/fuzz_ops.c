/* fuzz_ops.c -- libFuzzer harness: sequences of storage core operations
 * decoded from the fuzz input, checked against a model.
 *
 * Build and run with fuzz/core/run.sh (clang -fsanitize=fuzzer,address,
 * undefined, macronode.c compiled with tests/c/alloc_hook.h so that every
 * allocation of the core goes through the counting allocator).
 *
 * THE MODEL
 * =========
 *
 * Two streams, A and B (B is the source of concatenations). For each, the
 * model keeps the readable messages in offset order -- offset, length, the
 * seed their bytes are made from and their append time -- and the next
 * offset and the stream's clock. Whatever the core does with nodes, chunks
 * and compression, every read must give back exactly the model's bytes and
 * nulls, every message's time must be the model's (reads with times, a
 * node's first and last), a seek by time and retention by age must be
 * exact to the message, and the counting allocator must hold exactly what
 * mn_memory_bytes() says. The wall clock the appends use moves forward
 * (by anything up to 2^62 ms: every time width), and, sometimes, back.
 *
 * INPUT
 * =====
 *
 * A sequence of operations, each an opcode byte and its arguments, read
 * from the input with little helpers that return zeros once the input is
 * used up (so every input is valid). One opcode arms failure injection for
 * the next operation: its k-th allocation fails; the operation must then
 * report MN_ERR_NOMEM and leave both streams exactly as the model says.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "count_alloc.h"
#include "macronode.h"

/* Bounds that keep one input fast: the model and the checks are linear in
 * the messages held. */
#define MAX_PAYLOAD (3u << 17)   /* bytes appended per run */
#define MAX_MESSAGES 8000        /* messages appended per run */
#define MAX_BATCH 300            /* messages per append call */
#define MAX_READ 400             /* offsets per read call */
#define MAX_OPS 400              /* operations per input */

/* ------------------------------------------------------------------------
 * Input decoding
 * --------------------------------------------------------------------- */

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static uint8_t in_u8(input *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static uint16_t in_u16(input *in) { return (uint16_t)(in_u8(in) | (in_u8(in) << 8)); }

static uint32_t in_u32(input *in) { return (uint32_t)in_u16(in) | ((uint32_t)in_u16(in) << 16); }

static uint64_t in_u64(input *in) { return (uint64_t)in_u32(in) | ((uint64_t)in_u32(in) << 32); }

/* A value in 0..limit, biased toward the ends and small values. */
static uint64_t in_pick(input *in, uint64_t limit) {
    uint8_t how = in_u8(in);
    if (limit == 0) return 0;
    switch (how % 4) {
    case 0: return limit;
    case 1: return in_u8(in) % (limit + 1);
    case 2: return limit - in_u8(in) % (limit + 1);
    default: return in_u64(in) % (limit + 1 == 0 ? limit : limit + 1);
    }
}

/* ------------------------------------------------------------------------
 * Messages and the model
 * --------------------------------------------------------------------- */

static uint8_t msg_byte(uint32_t seed, uint32_t j) {
    /* A third of the messages compress well, the rest hardly. */
    if (seed % 3 == 0) return (uint8_t)('a' + j % 3);
    uint32_t x = seed * 2654435761u + j * 40503u;
    return (uint8_t)(x ^ (x >> 13));
}

typedef struct msg {
    uint64_t off;
    uint32_t len;
    uint32_t seed;
    int64_t ms;        /* append time */
} msg;

typedef struct model {
    msg *m;            /* readable messages m[head .. len-1], by offset */
    size_t head, len, cap;
    uint64_t next;
    uint64_t payload;  /* bytes of the readable messages */
    int64_t clock;     /* the stream's clock: newest append time */
} model;

typedef struct world {
    mn_stream *s[2];
    model m[2];
    uint32_t seeds;     /* next message seed */
    uint64_t appended;  /* bytes appended so far */
    uint64_t messages;  /* messages appended so far */
    long fail_k;        /* failure injection for the next operation, -1 none */
    int fail_armed;     /* the operation running has failure injection */
    int64_t wall;       /* the clock appends pass */
} world;

static void model_push(model *m, uint64_t off, uint32_t len, uint32_t seed, int64_t ms) {
    if (m->len == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->m = realloc(m->m, m->cap * sizeof(msg));
        CHECK(m->m != NULL);
    }
    m->m[m->len++] = (msg){off, len, seed, ms};
    m->payload += len;
}

static size_t model_count(const model *m) { return m->len - m->head; }

/* Index of the first readable message with offset >= off. */
static size_t model_lower(const model *m, uint64_t off) {
    size_t lo = m->head, hi = m->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->m[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static uint64_t model_first(const model *m) {
    return m->head < m->len ? m->m[m->head].off : m->next;
}

/* The readable message at offset off, or NULL. */
static const msg *model_at(const model *m, uint64_t off) {
    size_t i = model_lower(m, off);
    return i < m->len && m->m[i].off == off ? &m->m[i] : NULL;
}

/* Drop readable messages with offset < cut; how many. */
static uint64_t model_evict_below(model *m, uint64_t cut) {
    size_t i = model_lower(m, cut);
    uint64_t n = i - m->head;
    for (size_t j = m->head; j < i; j++) m->payload -= m->m[j].len;
    m->head = i;
    if (m->head == m->len) m->head = m->len = 0;
    return n;
}

/* ------------------------------------------------------------------------
 * Checks
 * --------------------------------------------------------------------- */

static void check_counters(world *w) {
    for (int k = 0; k < 2; k++) {
        const mn_stream *s = w->s[k];
        const model *m = &w->m[k];
        CHECK(mn_next_offset(s) == m->next);
        CHECK(mn_first_offset(s) == model_first(m));
        CHECK(mn_length(s) == model_count(m));
        CHECK(mn_payload_bytes(s) == m->payload);
        CHECK((mn_num_nodes(s) == 0) == (model_count(m) == 0));
        CHECK(mn_num_compressed_nodes(s) <= mn_num_nodes(s));
        CHECK(mn_last_append_ms(s) == m->clock);
        int64_t oldest = mn_oldest_append_ms(s);
        if (model_count(m) == 0) CHECK(oldest == MN_TIME_NONE);
        else CHECK(oldest == m->m[m->head].ms);
    }
    CHECK(count_alloc_live() == mn_memory_bytes(w->s[0]) + mn_memory_bytes(w->s[1]));
}

/* g's bytes at out[pos], then pos past them. */
static size_t check_msg_at(const mn_buf *out, size_t pos, const msg *g) {
    CHECK(pos + g->len <= out->len);
    for (uint32_t j = 0; j < g->len; j++) CHECK((uint8_t)out->data[pos + j] == msg_byte(g->seed, j));
    return pos + g->len;
}

/* Read [start, start + n) both ways and compare with the model. Returns
 * MN_ERR_NOMEM (appending nothing) only under failure injection. */
static int check_read(world *w, int k, uint64_t start, uint64_t n) {
    mn_stream *s = w->s[k];
    const model *m = &w->m[k];
    static int64_t lens[MAX_READ];
    CHECK(n <= MAX_READ);
    mn_buf out;
    mn_buf_init(&out);
    int rc = mn_read_copy(s, start, n, &out, lens);
    if (rc == MN_ERR_NOMEM && out.len == 0) { /* injected */
        mn_buf_free(&out);
        return rc;
    }
    CHECK(rc == MN_OK);
    size_t pos = 0, i = model_lower(m, start);
    for (uint64_t o = start; o < start + n; o++) {
        uint64_t x = o - start;
        if (i < m->len && m->m[i].off == o) {
            const msg *g = &m->m[i++];
            CHECK(lens[x] == (int64_t)g->len);
            pos = check_msg_at(&out, pos, g);
        } else {
            CHECK(lens[x] == -1);
        }
    }
    CHECK(pos == out.len);
    mn_buf_free(&out);

    static int64_t times[MAX_READ];
    CHECK(mn_read_times(s, start, n, times) == MN_OK); /* allocates nothing */
    i = model_lower(m, start);
    for (uint64_t o = start; o < start + n; o++) {
        if (i < m->len && m->m[i].off == o) CHECK(times[o - start] == m->m[i++].ms);
        else CHECK(times[o - start] == -1);
    }

    /* TREAD ... PACKED's tables: little-endian lengths (0xFFFFFFFF for
     * null) and times (-1), the messages back to back; times only on
     * every other read. */
    static unsigned char lens_le[4 * MAX_READ], times_le[8 * MAX_READ];
    int packed_times = (start & 1) == 0;
    mn_buf_init(&out);
    rc = mn_read_packed(s, start, n, &out, lens_le, packed_times ? times_le : NULL);
    if (rc == MN_ERR_NOMEM && out.len == 0) { /* injected */
        mn_buf_free(&out);
        return rc;
    }
    CHECK(rc == MN_OK);
    pos = 0;
    i = model_lower(m, start);
    for (uint64_t o = start; o < start + n; o++) {
        uint64_t x = o - start, len = 0, t = 0;
        for (int b = 0; b < 4; b++) len |= (uint64_t)lens_le[4 * x + b] << (8 * b);
        for (int b = 0; b < 8; b++) t |= (uint64_t)times_le[8 * x + b] << (8 * b);
        if (i < m->len && m->m[i].off == o) {
            const msg *g = &m->m[i++];
            CHECK(len == g->len && (!packed_times || (int64_t)t == g->ms));
            pos = check_msg_at(&out, pos, g);
        } else {
            CHECK(len == 0xFFFFFFFFu && (!packed_times || (int64_t)t == -1));
        }
    }
    CHECK(pos == out.len);
    /* The same tables as the reply's bulk strings, in one buffer. */
    mn_buf resp;
    mn_buf_init(&resp);
    uint64_t needed = 0;
    rc = mn_read_packed_resp(s, start, n, packed_times, "", 0, UINT64_MAX, &needed, &resp);
    if (rc == MN_ERR_NOMEM && resp.len == 0) { /* injected */
        mn_buf_free(&resp);
        mn_buf_free(&out);
        return rc;
    }
    CHECK(rc == MN_OK && resp.len == needed);
    const struct {
        const void *p;
        size_t len;
    } parts[3] = {{lens_le, 4 * n}, {out.data, out.len}, {times_le, 8 * n}};
    pos = 0;
    for (int part = 0; part < (packed_times ? 3 : 2); part++) {
        char head[32];
        size_t hl = (size_t)snprintf(head, sizeof head, "$%zu\r\n", parts[part].len);
        CHECK(pos + hl + parts[part].len + 2 <= resp.len && memcmp(resp.data + pos, head, hl) == 0);
        pos += hl;
        CHECK(parts[part].len == 0 || memcmp(resp.data + pos, parts[part].p, parts[part].len) == 0);
        pos += parts[part].len;
        CHECK(memcmp(resp.data + pos, "\r\n", 2) == 0);
        pos += 2;
    }
    CHECK(pos == resp.len);
    mn_buf_free(&resp);
    mn_buf_free(&out);

    for (int style = 0; style <= (MN_NULL_RESP3 | MN_READ_WITH_TIMES); style++) {
        int resp3 = style & MN_NULL_RESP3, with_times = style & MN_READ_WITH_TIMES;
        mn_buf_init(&out);
        rc = mn_read_resp_prefixed(s, start, n, style, "*", 1, &out);
        if (rc == MN_ERR_NOMEM && out.len == 0) { /* injected */
            mn_buf_free(&out);
            return rc;
        }
        CHECK(rc == MN_OK);
        pos = 1;
        i = model_lower(m, start);
        for (uint64_t o = start; o < start + n; o++) {
            char head[48];
            int hl;
            if (i < m->len && m->m[i].off == o) {
                const msg *g = &m->m[i++];
                hl = snprintf(head, sizeof head, "%s$%u\r\n", with_times && resp3 ? "*2\r\n" : "",
                              g->len);
                CHECK(pos + (size_t)hl + g->len + 2 <= out.len);
                CHECK(memcmp(out.data + pos, head, (size_t)hl) == 0);
                pos = check_msg_at(&out, pos + (size_t)hl, g);
                CHECK(memcmp(out.data + pos, "\r\n", 2) == 0);
                pos += 2;
                if (with_times) {
                    hl = snprintf(head, sizeof head, ":%lld\r\n", (long long)g->ms);
                    CHECK(pos + (size_t)hl <= out.len && memcmp(out.data + pos, head, (size_t)hl) == 0);
                    pos += (size_t)hl;
                }
            } else {
                const char *null = resp3 ? "_\r\n" : with_times ? "$-1\r\n$-1\r\n" : "$-1\r\n";
                size_t nl = strlen(null);
                CHECK(pos + nl <= out.len && memcmp(out.data + pos, null, nl) == 0);
                pos += nl;
            }
        }
        CHECK(pos == out.len);
        mn_buf_free(&out);
    }
    return MN_OK;
}

/* Nodes in order, not overlapping, times never decreasing; a node's last
 * message is readable (nodes wholly evicted are freed) and its time is the
 * node's last_ms; so is message 0's first_ms when readable. */
static void check_nodes(world *w, int k) {
    const model *m = &w->m[k];
    mn_node_info info;
    uint64_t end = 0, nodes = 0, compressed = 0;
    int64_t last = 0;
    for (const mn_node *node = mn_first_node(w->s[k]); node != NULL; node = mn_node_next(node)) {
        mn_node_get_info(node, &info);
        CHECK(info.count >= 1 && info.first >= end);
        CHECK(info.first_ms >= last && info.last_ms >= info.first_ms);
        const msg *g = model_at(m, info.first + info.count - 1);
        CHECK(g != NULL && g->ms == info.last_ms);
        g = model_at(m, info.first);
        CHECK(g == NULL || g->ms == info.first_ms);
        CHECK(info.memory > 0 && (!info.compressed || info.zlevel >= 1));
        end = info.first + info.count;
        last = info.last_ms;
        nodes++;
        compressed += info.compressed;
    }
    CHECK(nodes == mn_num_nodes(w->s[k]) && compressed == mn_num_compressed_nodes(w->s[k]));
    CHECK(last <= m->clock);
}

/* Every readable message of both streams, in reads of up to MAX_READ
 * offsets placed on the messages (offsets may be spread up to 2^63). */
static void check_all(world *w) {
    check_counters(w);
    for (int k = 0; k < 2; k++) {
        check_nodes(w, k);
        const model *m = &w->m[k];
        size_t i = m->head;
        while (i < m->len) {
            uint64_t start = m->m[i].off;
            uint64_t room = m->next - start;
            uint64_t n = room < MAX_READ ? room : MAX_READ;
            CHECK(check_read(w, k, start, n) == MN_OK);
            i = model_lower(m, start + n);
        }
    }
}

/* ------------------------------------------------------------------------
 * Operations
 * --------------------------------------------------------------------- */

static int room_for(world *w, uint64_t messages, uint64_t bytes) {
    return w->messages + messages <= MAX_MESSAGES && w->appended + bytes <= MAX_PAYLOAD;
}

static int op_append(world *w, int k, input *in, int one) {
    static char buf[MAX_PAYLOAD];
    static uint32_t lens[MAX_BATCH];
    size_t n = one ? 1 : 1 + in_u8(in) % MAX_BATCH;
    uint8_t shape = in_u8(in);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t len;
        switch (shape % 4) {
        case 0: len = 100; break;                             /* the common case */
        case 1: len = in_u8(in) % 40; break;                  /* tiny, empty ones too */
        case 2: len = in_u8(in); break;
        default: len = (uint32_t)in_u8(in) * 97 + in_u8(in); /* up to ~25 KB: chunks */
        }
        lens[i] = len;
        total += len;
    }
    if (!room_for(w, n, total)) return MN_OK;
    model *m = &w->m[k];
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < lens[i]; j++) buf[pos + j] = (char)msg_byte(w->seeds + (uint32_t)i, j);
        pos += lens[i];
    }
    int64_t first = one ? mn_append_one(w->s[k], buf, lens[0], w->wall)
                        : mn_append(w->s[k], buf, lens, n, w->wall);
    if (n > MN_MAX_OFFSET + 1ULL - m->next) {
        CHECK(first == MN_ERR_OVERFLOW);
        return MN_OK;
    }
    if (first < 0) return (int)first;
    CHECK((uint64_t)first == m->next);
    if (w->wall > m->clock) m->clock = w->wall;
    for (size_t i = 0; i < n; i++) model_push(m, m->next + i, lens[i], w->seeds + (uint32_t)i, m->clock);
    m->next += n;
    w->seeds += (uint32_t)n;
    w->appended += total;
    w->messages += n;
    return MN_OK;
}

/* mn_readable_run (TREAD ... NONULLS) against the model: the first
 * readable offset at or after start, and the readable offsets in a row
 * from there, at most max. */
static void check_readable_run(world *w, int k, uint64_t start, uint64_t max) {
    const model *m = &w->m[k];
    uint64_t run;
    uint64_t got = mn_readable_run(w->s[k], start, max, &run);
    size_t i = model_lower(m, start);
    if (i >= m->len) {
        CHECK(got == (start > m->next ? start : m->next) && run == 0);
        return;
    }
    CHECK(got == m->m[i].off);
    uint64_t want = 0;
    while (want < max && i + want < m->len && m->m[i + want].off == got + want) want++;
    CHECK(run == want);
}

static int op_read(world *w, int k, input *in) {
    const model *m = &w->m[k];
    /* Start near a readable message most of the time: offsets may span
     * up to 2^63. */
    uint64_t start;
    if (model_count(m) && in_u8(in) % 4) {
        const msg *g = &m->m[m->head + in_u16(in) % model_count(m)];
        uint64_t back = in_u8(in) % 8;
        start = g->off >= back ? g->off - back : 0;
    } else {
        start = in_pick(in, m->next);
    }
    uint64_t room = m->next - start;
    uint64_t n = in_pick(in, room < MAX_READ ? room : MAX_READ);
    check_readable_run(w, k, start, n);
    return check_read(w, k, start, n);
}

static int op_evict_upto(world *w, int k, input *in) {
    model *m = &w->m[k];
    uint64_t upto = in_pick(in, m->next + 3);
    if (upto > (uint64_t)INT64_MAX) upto = INT64_MAX;
    uint64_t expect = model_evict_below(m, upto + 1);
    CHECK(mn_evict_upto(w->s[k], (int64_t)upto) == (int64_t)expect);
    return MN_OK;
}

static int op_evict_keep(world *w, int k, input *in) {
    model *m = &w->m[k];
    uint64_t keep = in_pick(in, 2000);
    uint64_t expect = keep < m->next ? model_evict_below(m, m->next - keep) : 0;
    CHECK(mn_evict_keep(w->s[k], keep) == (int64_t)expect);
    return MN_OK;
}

static int op_raise(world *w, int k, input *in) {
    model *m = &w->m[k];
    const uint64_t limit = MN_MAX_OFFSET + 1ULL;
    uint64_t to;
    switch (in_u8(in) % 4) {
    case 0: to = m->next + in_u8(in) % 50; break;
    case 1: to = limit - in_u16(in) % 3000; break; /* near 2^63 */
    case 2: to = m->next + in_u64(in) % (limit - m->next + 1); break;
    default: to = m->next - (m->next > 0); break;  /* below next: refused */
    }
    int rc = mn_raise_next_offset(w->s[k], to);
    if (to < m->next || to > limit) {
        CHECK(rc == MN_ERR_ARG);
        return MN_OK;
    }
    CHECK(rc == MN_OK);
    m->next = to;
    return MN_OK;
}

static int op_settings(world *w, int k, input *in) {
    uint8_t what = in_u8(in) % 3;
    if (what == 2) {
        uint32_t bytes = (uint32_t)in_pick(in, 3000);
        CHECK(mn_stream_set_max_node_bytes(w->s[k], bytes) == MN_OK);
        CHECK(mn_max_node_bytes(w->s[k]) == bytes);
    } else if (what == 0) {
        int level = in_u8(in) % 11; /* 10 is out of range */
        int rc = mn_stream_set_compression(w->s[k], level);
        CHECK(rc == (level <= 9 ? MN_OK : MN_ERR_ARG));
        if (level <= 9) CHECK(mn_compression_level(w->s[k]) == level);
    } else {
        uint32_t max = (uint32_t)in_pick(in, 1100);
        int rc = mn_stream_set_max_entries(w->s[k], max);
        CHECK(rc == (max >= 1 ? MN_OK : MN_ERR_ARG));
        if (max >= 1) CHECK(mn_max_entries(w->s[k]) == max);
    }
    return MN_OK;
}

/* Serialize both ways and load: the copy must serialize identically. A
 * failed allocation anywhere keeps the original. */
static int serialize_all(const mn_stream *s, mn_buf **blobs, size_t *n) {
    size_t count = (size_t)mn_num_nodes(s) + 1;
    mn_buf *b = calloc(count, sizeof *b);
    CHECK(b != NULL);
    int rc = mn_serialize_header(s, &b[0]);
    size_t i = 1;
    for (const mn_node *node = mn_first_node(s); node != NULL && rc == MN_OK; node = mn_node_next(node))
        rc = mn_node_serialize(node, &b[i++]);
    *blobs = b;
    *n = count;
    return rc;
}

static void free_blobs(mn_buf *b, size_t n) {
    for (size_t i = 0; i < n; i++) mn_buf_free(&b[i]);
    free(b);
}

/* Rebuild stream k node by node, as the Redis module's AOF rewrite does:
 * raised to the first node's offset, every node blob appended whole
 * (mn_append_node_blob), the first node's evicted prefix evicted, the next
 * offset raised. The same stream comes back, but for its clock, which
 * becomes the newest time it still holds. */
static int op_rebuild(world *w, int k) {
    mn_stream *s = w->s[k];
    mn_stream *copy = mn_stream_new(mn_max_entries(s), mn_compression_level(s));
    if (copy == NULL) return MN_ERR_NOMEM;
    CHECK(mn_stream_set_compression_depth(copy, mn_compression_depth(s)) == MN_OK);
    CHECK(mn_stream_set_max_node_bytes(copy, mn_max_node_bytes(s)) == MN_OK);
    mn_buf b;
    mn_buf_init(&b);
    int rc = MN_OK;
    for (const mn_node *node = mn_first_node(s); node != NULL && rc == MN_OK; node = mn_node_next(node)) {
        b.len = 0;
        rc = mn_node_serialize(node, &b);
        if (rc != MN_OK) break;
        if (node == mn_first_node(s)) {
            mn_node_info info;
            mn_node_get_info(node, &info);
            CHECK(mn_raise_next_offset(copy, info.first) == MN_OK);
        }
        rc = mn_append_node_blob(copy, b.data, b.len);
    }
    mn_buf_free(&b);
    if (rc != MN_OK) {
        CHECK(rc == MN_ERR_NOMEM);
        mn_stream_free(copy);
        return rc;
    }
    if (mn_num_nodes(copy) && mn_first_offset(s) > mn_first_offset(copy))
        CHECK(mn_evict_upto(copy, (int64_t)mn_first_offset(s) - 1) >= 0);
    if (mn_next_offset(s) > mn_next_offset(copy))
        CHECK(mn_raise_next_offset(copy, mn_next_offset(s)) == MN_OK);
    CHECK(mn_num_nodes(copy) == mn_num_nodes(s));
    CHECK(mn_num_compressed_nodes(copy) == mn_num_compressed_nodes(s));
    CHECK(mn_last_append_ms(copy) <= mn_last_append_ms(s));
    w->m[k].clock = mn_last_append_ms(copy);
    mn_stream_free(s);
    w->s[k] = copy;
    return MN_OK;
}

static int op_roundtrip(world *w, int k, input *in) {
    if (in_u8(in) % 2) return op_rebuild(w, k);
    mn_buf *blobs, *again;
    size_t n, n2;
    int rc = serialize_all(w->s[k], &blobs, &n);
    if (rc != MN_OK) {
        free_blobs(blobs, n);
        return rc;
    }
    for (size_t i = 1; i < n; i++) {
        rc = mn_validate_node_blob(blobs[i].data, blobs[i].len);
        if (rc != MN_OK) {
            CHECK(rc == MN_ERR_NOMEM);
            free_blobs(blobs, n);
            return rc;
        }
    }
    int err = 1;
    mn_stream *copy = mn_load_header(blobs[0].data, blobs[0].len, w->wall, &err);
    if (copy == NULL) {
        CHECK(err == MN_ERR_NOMEM);
        free_blobs(blobs, n);
        return err;
    }
    for (size_t i = 1; i < n && rc == MN_OK; i++) rc = mn_load_node(copy, blobs[i].data, blobs[i].len);
    if (rc == MN_OK) rc = mn_load_finish(copy);
    if (rc != MN_OK) {
        CHECK(rc == MN_ERR_NOMEM);
        mn_stream_free(copy);
        free_blobs(blobs, n);
        return rc;
    }
    rc = serialize_all(copy, &again, &n2);
    if (rc == MN_OK) {
        CHECK(n == n2);
        for (size_t i = 0; i < n; i++)
            CHECK(blobs[i].len == again[i].len && memcmp(blobs[i].data, again[i].data, blobs[i].len) == 0);
        CHECK(mn_max_entries(copy) == mn_max_entries(w->s[k]));
        CHECK(mn_compression_level(copy) == mn_compression_level(w->s[k]));
        CHECK(mn_num_compressed_nodes(copy) == mn_num_compressed_nodes(w->s[k]));
        CHECK(mn_last_append_ms(copy) == mn_last_append_ms(w->s[k]));
        mn_stream_free(w->s[k]);
        w->s[k] = copy;
    } else {
        CHECK(rc == MN_ERR_NOMEM);
        mn_stream_free(copy);
    }
    free_blobs(again, n2);
    free_blobs(blobs, n);
    return rc;
}

/* The wall clock moves: mostly forward a little, sometimes a lot, and
 * sometimes back (the stream's clock must not). */
static int op_clock(world *w, input *in) {
    uint8_t how = in_u8(in);
    switch (how % 4) {
    case 0: w->wall += in_u8(in); break;
    case 1: w->wall += (int64_t)in_u32(in); break;
    case 2: w->wall -= in_u16(in); break;
    default: w->wall = (int64_t)(in_u64(in) >> 2); break; /* anywhere */
    }
    /* Negative is MN_NOW, the real wall clock: the model could not follow. */
    if (w->wall < 0) w->wall = 0;
    return MN_OK;
}

/* A time near a readable message's, or anywhere. */
static int64_t in_time(const model *m, input *in) {
    if (model_count(m) && in_u8(in) % 4) {
        const msg *g = &m->m[m->head + in_u16(in) % model_count(m)];
        return g->ms + (int8_t)in_u8(in) % 3;
    }
    return (int64_t)in_u64(in);
}

static int op_seek(world *w, int k, input *in) {
    const model *m = &w->m[k];
    int64_t t = in_time(m, in);
    /* exact: the first readable message appended at or after t */
    size_t i = m->head;
    while (i < m->len && m->m[i].ms < t) i++;
    CHECK(mn_seek_time(w->s[k], t) == (i < m->len ? m->m[i].off : m->next));
    return MN_OK;
}

static int op_retain(world *w, int k, input *in) {
    model *m = &w->m[k];
    mn_stream *s = w->s[k];
    mn_evicted ev = {0, 0, 0, 0};
    uint64_t budget = in_u8(in) % 5;
    uint64_t memory = mn_memory_bytes(s), before_first = model_first(m), payload = m->payload;
    size_t before = model_count(m);
    int rc;
    uint8_t what = in_u8(in) % 3;
    int exact = 0; /* retention by age done: a cut inside a node */
    if (what == 0) {
        int64_t cutoff = in_time(m, in);
        rc = mn_evict_older_than(s, cutoff, budget, &ev);
        /* Nothing unexpired went; done, every expired message went. */
        for (size_t i = m->head; i < m->len && m->m[i].off < mn_first_offset(s); i++)
            if (m->m[i].off >= before_first) CHECK(m->m[i].ms < cutoff);
        if (rc == 0) {
            size_t first = model_lower(m, mn_first_offset(s));
            CHECK(first == m->len || m->m[first].ms >= cutoff);
            exact = 1;
        }
    } else if (what == 1) {
        uint64_t limit = in_pick(in, payload + 200);
        rc = mn_evict_over_bytes(s, limit, budget, &ev);
        if (rc == 0) CHECK(mn_payload_bytes(s) <= limit || mn_num_nodes(s) == 1);
    } else {
        uint64_t node_memory = mn_oldest_node_memory(s);
        rc = mn_evict_oldest_node(s, &ev);
        CHECK(rc == (before > 0) && ev.nodes == (uint64_t)rc);
        CHECK(ev.memory == node_memory);
        rc = 0;
    }
    CHECK(rc == 0 || rc == 1);
    if (rc == 1) CHECK(ev.nodes == budget);
    CHECK(ev.memory == memory - mn_memory_bytes(s));
    /* Whole nodes: the stream now starts at a node's first offset. */
    mn_node_info info;
    if (mn_num_nodes(s) && ev.nodes && !exact) {
        mn_node_get_info(mn_first_node(s), &info);
        CHECK(mn_first_offset(s) == info.first);
    }
    uint64_t gone = model_evict_below(m, mn_first_offset(s));
    CHECK(ev.messages == gone && gone == before - model_count(m));
    CHECK(ev.bytes == payload - m->payload);
    return MN_OK;
}

/* Concatenate the other stream into stream k: the model moves its
 * messages over, times raised to k's clock (whether the core copies them
 * or moves their nodes). */
static int op_concat(world *w, int k) {
    model *d = &w->m[k], *s = &w->m[1 - k];
    int64_t rc = mn_stream_concat(w->s[k], w->s[1 - k]);
    if (model_count(s) > MN_MAX_OFFSET + 1ULL - d->next) {
        CHECK(rc == MN_ERR_OVERFLOW);
        return MN_OK;
    }
    if (rc < 0) return (int)rc;
    CHECK((uint64_t)rc == d->next);
    int64_t floor = d->clock;
    size_t n = model_count(s);
    for (size_t i = 0; i < n; i++) {
        const msg *g = &s->m[s->head + i];
        model_push(d, d->next + i, g->len, g->seed, g->ms > floor ? g->ms : floor);
    }
    d->next += n;
    if (n) d->clock = d->m[d->len - 1].ms;
    model_evict_below(s, s->next);
    return MN_OK;
}

/* Compression depth: set it, take a bounded step, or run a scan to its
 * end and check that every sealed node has the form its rank asks for. */
static int op_compress(world *w, int k, input *in) {
    mn_stream *s = w->s[k];
    uint8_t how = in_u8(in) % 3;
    if (how == 0) {
        uint32_t depth = in_u8(in) % 7;
        CHECK(mn_stream_set_compression_depth(s, depth) == MN_OK);
        CHECK(mn_compression_depth(s) == depth);
        return MN_OK;
    }
    if (how == 1) {
        uint32_t budget = in_u8(in) % 4;
        uint64_t before = mn_num_compressed_nodes(s);
        int rc = mn_compress_step(s, budget);
        CHECK(rc == mn_compress_pending(s));
        uint64_t after = mn_num_compressed_nodes(s);
        CHECK((after > before ? after - before : before - after) <= budget);
        return MN_OK;
    }
    if (w->fail_armed) return MN_OK; /* conforming under failures may not finish */
    /* A fresh scan (an earlier one may have met injected failures). */
    uint32_t depth = mn_compression_depth(s);
    CHECK(mn_stream_set_compression_depth(s, depth ? depth - 1 : 1) == MN_OK);
    CHECK(mn_stream_set_compression_depth(s, depth) == MN_OK);
    while (mn_compress_step(s, 4)) {}
    size_t n = (size_t)mn_num_nodes(s), i = 0;
    int level = mn_compression_level(s);
    mn_node_info info;
    for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node), i++) {
        mn_node_get_info(node, &info);
        if (i + 1 == n) {
            CHECK(!info.compressed);
            break;
        }
        size_t rank = n - 2 - i;
        if (level == 0 || rank < depth) CHECK(!info.compressed);
        else CHECK(info.zlevel == level);
    }
    return MN_OK;
}

enum {
    OP_APPEND,
    OP_APPEND_ONE,
    OP_READ,
    OP_EVICT_UPTO,
    OP_EVICT_KEEP,
    OP_RAISE,
    OP_SETTINGS,
    OP_ROUNDTRIP,
    OP_FAIL_NEXT,
    OP_CLOCK,
    OP_SEEK,
    OP_RETAIN,
    OP_CONCAT,
    OP_COMPRESS,
    OP_COUNT
};

static int run_op(world *w, uint8_t op, input *in) {
    int k = (op >> 7) & 1; /* the top bit picks the stream */
    switch (op % OP_COUNT) {
    case OP_APPEND: return op_append(w, k, in, 0);
    case OP_APPEND_ONE: return op_append(w, k, in, 1);
    case OP_READ: return op_read(w, k, in);
    case OP_EVICT_UPTO: return op_evict_upto(w, k, in);
    case OP_EVICT_KEEP: return op_evict_keep(w, k, in);
    case OP_RAISE: return op_raise(w, k, in);
    case OP_SETTINGS: return op_settings(w, k, in);
    case OP_ROUNDTRIP: return op_roundtrip(w, k, in);
    case OP_CLOCK: return op_clock(w, in);
    case OP_SEEK: return op_seek(w, k, in);
    case OP_RETAIN: return op_retain(w, k, in);
    case OP_CONCAT: return op_concat(w, k);
    case OP_COMPRESS: return op_compress(w, k, in);
    default: return MN_OK;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* FUZZ_TRACE=1 prints each operation (to reduce a crash by hand). */
    static int trace = -1;
    if (trace < 0) trace = getenv("FUZZ_TRACE") != NULL;
    input in = {data, size};
    world w;
    memset(&w, 0, sizeof w);
    w.fail_k = -1;
    w.wall = 1700000000000;
    uint8_t setup = in_u8(&in);
    uint32_t max_a = 1 + in_u16(&in) % 1200, max_b = 1 + in_u8(&in) % 64;
    w.s[0] = mn_stream_new(max_a, setup % 10);
    w.s[1] = mn_stream_new(max_b, (setup / 10) % 10);
    CHECK(w.s[0] != NULL && w.s[1] != NULL);
    for (int ops = 0; in.n > 0 && ops < MAX_OPS; ops++) {
        uint8_t op = in_u8(&in);
        if (op % OP_COUNT == OP_FAIL_NEXT) {
            w.fail_k = in_u8(&in) % 24;
            continue;
        }
        long k = w.fail_k;
        w.fail_k = -1;
        w.fail_armed = k >= 0;
        count_alloc_fail_after(k);
        int rc = run_op(&w, op, &in);
        count_alloc_fail_after(-1);
        if (trace)
            fprintf(stderr, "op %d stream %d fail_k %ld rc %d next %llu length %llu nodes %llu\n",
                    op % OP_COUNT, op >> 7, k, rc, (unsigned long long)mn_next_offset(w.s[op >> 7]),
                    (unsigned long long)mn_length(w.s[op >> 7]), (unsigned long long)mn_num_nodes(w.s[op >> 7]));
        count_alloc_failures();
        if (rc != MN_OK) {
            /* Only an injected failure may fail, and it changes nothing. */
            CHECK(k >= 0 && rc == MN_ERR_NOMEM);
            check_all(&w);
        }
        check_counters(&w);
    }
    check_all(&w);
    for (int k = 0; k < 2; k++) {
        mn_stream_free(w.s[k]);
        free(w.m[k].m);
    }
    CHECK(count_alloc_live() == 0);
    return 0;
}
