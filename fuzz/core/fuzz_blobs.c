/* fuzz_blobs.c -- libFuzzer harness: arbitrary bytes given to the blob
 * validator and the loader (mn_validate_node_blob, mn_load_header,
 * mn_load_node, mn_load_finish).
 *
 * INPUT
 * =====
 *
 *   OFFSET  SIZE  DESCRIPTION
 *   ------  ----  ---------------------------------------------------------
 *        0     1  flags: bit 0 set = a dump (header blob, then node blobs),
 *                 clear = one node blob; bit 1 set = rewrite each blob's
 *                 CRC32 before use, so that mutations reach the checks
 *                 behind the checksum
 *        1   ...  one node blob (bit 0 clear), or blobs each preceded by
 *                 its length as a little-endian u32 (a short last one is
 *                 taken as it is)
 *
 * The seeds (corpus/blobs/) are real dumps written by fuzz/core/
 * make_seeds.py, old formats included. A blob the validator accepts must
 * also load; a dump that loads must read back completely -- its messages'
 * times never decreasing, every one found by a seek -- serialize to exactly
 * the input blobs, take appends and evictions, and free every byte.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "count_alloc.h"
#include "macronode.h"

#define MAX_BLOBS 4096

static uint32_t get_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* A private copy of each blob (so ASan sees reads past its end), with the
 * CRC rewritten when asked. */
static char *blob_copy(const uint8_t *p, size_t len, int fix_crc) {
    char *b = malloc(len ? len : 1);
    CHECK(b != NULL);
    memcpy(b, p, len);
    if (fix_crc && len >= 8) {
        uint32_t crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), (const Bytef *)b, len - 4);
        for (int i = 0; i < 4; i++) b[len - 4 + (size_t)i] = (char)(crc >> (8 * i));
    }
    return b;
}

/* Everything a loaded stream must do: read back, re-serialize to the very
 * same blobs (when they came from a dump of the current format), take an
 * append, an eviction and a read, and free every byte it holds. */
static void exercise(mn_stream *s, char **blobs, const size_t *lens, size_t n, int same_format) {
    CHECK(count_alloc_live() == mn_memory_bytes(s));
    uint64_t next = mn_next_offset(s), first = mn_first_offset(s);
    CHECK(first <= next);
    uint64_t total = 0;
    int64_t prev = 0;
    int seen = 0;
    static int64_t times[1000];
    for (uint64_t start = first; start < next && total < (1u << 20);) {
        uint64_t room = next - start, count = room < 1000 ? room : 1000;
        mn_buf out;
        mn_buf_init(&out);
        CHECK(mn_read_resp(s, start, count, MN_NULL_RESP2 | MN_READ_WITH_TIMES, &out) == MN_OK);
        total += count;
        mn_buf_free(&out);
        CHECK(mn_read_times(s, start, count, times) == MN_OK);
        for (uint64_t i = 0; i < count; i++) {
            if (times[i] < 0) continue; /* a gap */
            CHECK(times[i] >= prev && times[i] <= mn_last_append_ms(s));
            /* a seek by its time finds it, or an earlier message of that time */
            uint64_t found = mn_seek_time(s, times[i]);
            if (times[i] > prev || !seen) CHECK(found == start + i);
            else CHECK(found < start + i);
            prev = times[i];
            seen = 1;
        }
        start += count;
    }
    if (same_format) {
        mn_buf b;
        mn_buf_init(&b);
        CHECK(mn_serialize_header(s, &b) == MN_OK);
        CHECK(b.len == lens[0] && memcmp(b.data, blobs[0], b.len) == 0);
        mn_buf_free(&b);
        size_t i = 1;
        for (const mn_node *node = mn_first_node(s); node != NULL; node = mn_node_next(node), i++) {
            CHECK(i < n);
            mn_buf_init(&b);
            CHECK(mn_node_serialize(node, &b) == MN_OK);
            CHECK(b.len == lens[i] && memcmp(b.data, blobs[i], b.len) == 0);
            mn_buf_free(&b);
        }
        CHECK(i == n);
    }
    uint64_t length = mn_length(s);
    int64_t clock = mn_last_append_ms(s);
    /* An earlier time than the clock (a negative one means "now"). */
    int64_t at = mn_append_one(s, "hello", 5, clock > 0 ? clock - 1 : 0);
    if (next == MN_MAX_OFFSET + 1ULL) {
        CHECK(at == MN_ERR_OVERFLOW);
    } else {
        CHECK(at == (int64_t)next);
        CHECK(mn_length(s) == length + 1);
        mn_buf out;
        mn_buf_init(&out);
        CHECK(mn_read_resp(s, next, 1, MN_NULL_RESP2, &out) == MN_OK);
        CHECK(out.len == 11 && memcmp(out.data, "$5\r\nhello\r\n", 11) == 0);
        mn_buf_free(&out);
        CHECK(mn_last_append_ms(s) == clock); /* never back */
        CHECK(mn_seek_time(s, clock + 1) == next + 1);
        CHECK(mn_seek_time(s, clock) <= next);
    }
    CHECK(count_alloc_live() == mn_memory_bytes(s));
    CHECK(mn_evict_keep(s, 1) >= 0);
    CHECK(mn_length(s) <= 1);
    CHECK(count_alloc_live() == mn_memory_bytes(s));
}

static void run_single(const uint8_t *data, size_t size, int fix_crc) {
    char *blob = blob_copy(data, size, fix_crc);
    int rc = mn_validate_node_blob(blob, size);
    CHECK(rc == MN_OK || rc == MN_ERR_CORRUPT);
    /* Appended whole to a live stream (the module's AOF rewrite): a valid
     * blob with times is taken, anything else changes nothing. */
    mn_stream *s = mn_stream_new(10, 6);
    CHECK(s != NULL);
    CHECK(mn_append_one(s, "x", 1, 5) == 0);
    uint64_t memory = mn_memory_bytes(s);
    /* the current format, or format 3 (an AOF rewritten before it) */
    int current = size > 4 && ((unsigned char)blob[4] == MN_FORMAT_VERSION || (unsigned char)blob[4] == 3);
    int appended = mn_append_node_blob(s, blob, size);
    if (rc == MN_OK && current) {
        /* a node at offset 0 overlaps "x": refused as an argument */
        CHECK(appended == MN_OK || appended == MN_ERR_ARG);
    } else {
        CHECK(appended == MN_ERR_CORRUPT);
    }
    if (appended == MN_OK) {
        char *b[1] = {blob};
        exercise(s, b, &size, 1, 0);
    } else {
        CHECK(mn_memory_bytes(s) == memory && mn_length(s) == 1 && mn_next_offset(s) == 1);
    }
    mn_stream_free(s);
    free(blob);
    CHECK(count_alloc_live() == 0);
}

static void run_dump(const uint8_t *data, size_t size, int fix_crc) {
    static char *blobs[MAX_BLOBS];
    static size_t lens[MAX_BLOBS];
    size_t n = 0, pos = 0;
    while (pos < size && n < MAX_BLOBS) {
        size_t len;
        if (size - pos < 4) {
            len = size - pos;
        } else {
            len = get_u32le(data + pos);
            pos += 4;
            if (len > size - pos) len = size - pos;
        }
        blobs[n] = blob_copy(data + pos, len, fix_crc);
        lens[n++] = len;
        pos += len;
    }
    if (n == 0) return;
    int err = 1;
    mn_stream *s = mn_load_header(blobs[0], lens[0], 1700000000000, &err);
    CHECK((s == NULL) == (err != MN_OK));
    CHECK(s != NULL || err == MN_ERR_CORRUPT);
    int rc = s != NULL ? MN_OK : MN_ERR_CORRUPT;
    size_t loaded = 1;
    for (; loaded < n && rc == MN_OK; loaded++) {
        int valid = mn_validate_node_blob(blobs[loaded], lens[loaded]);
        CHECK(valid == MN_OK || valid == MN_ERR_CORRUPT);
        uint64_t memory = mn_memory_bytes(s), nodes = mn_num_nodes(s), length = mn_length(s);
        rc = mn_load_node(s, blobs[loaded], lens[loaded]);
        CHECK(rc == MN_OK || rc == MN_ERR_CORRUPT);
        if (rc == MN_OK) {
            CHECK(valid == MN_OK); /* the loader trusts nothing the validator refuses */
        } else {
            /* A refused node changes nothing. */
            CHECK(mn_num_nodes(s) == nodes && mn_length(s) == length);
            CHECK(mn_memory_bytes(s) == memory);
        }
    }
    if (rc == MN_OK) rc = mn_load_finish(s);
    CHECK(rc == MN_OK || rc == MN_ERR_CORRUPT);
    if (rc == MN_OK) {
        /* Only unmodified dumps of the current format serialize back
         * byte for byte; anything the loader accepted reads back. */
        exercise(s, blobs, lens, n, lens[0] > 4 && (unsigned char)blobs[0][4] == MN_FORMAT_VERSION);
    }
    mn_stream_free(s);
    for (size_t i = 0; i < n; i++) free(blobs[i]);
    CHECK(count_alloc_live() == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t flags = data[0];
    if (flags & 1) run_dump(data + 1, size - 1, (flags & 2) != 0);
    else run_single(data + 1, size - 1, (flags & 2) != 0);
    return 0;
}
