/* macronode.h -- the public API of the rcp11 storage core.
 *
 * A stream (RCP 11 "stream data type") is a doubly linked skiplist of
 * macronodes; see the big comment at the top of macronode.c for the layout.
 *
 * This header has two readers: the C compiler and cffi's cdef(). The part
 * between the CDEF-BEGIN and CDEF-END markers is fed verbatim to
 * ffibuilder.cdef(), so it must stay cdef-clean: plain prototypes, integer
 * #defines, opaque struct typedefs, no include guards, no #include, no macros
 * with arguments.
 */
#ifndef RCP11_MACRONODE_H
#define RCP11_MACRONODE_H

#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */

/* Bumped whenever a prototype or the serialized format changes, so that a
 * stale compiled extension fails loudly at import instead of misbehaving. */
#define MN_ABI_VERSION 7

/* Version byte of the blobs mn_serialize_header() and mn_node_serialize()
 * write. Loading also accepts the versions listed in macronode.c. */
#define MN_FORMAT_VERSION 2

#define MN_DEFAULT_MAX_ENTRIES 1000
#define MN_MAX_MAX_ENTRIES 1000000

/* The largest offset a message can get is 2^63-1, so the next offset of a
 * stream ranges over 0..2^63 and is returned as uint64_t. */
#define MN_MAX_OFFSET 9223372036854775807

/* A serialized node (frame + offset table + blob) must fit in 4 GB - 1, so a
 * single message is a little below that: 4294967295 - 32 (frame) - 4 (its
 * offset table entry). Larger messages are MN_ERR_TOOBIG. */
#define MN_MAX_MESSAGE_BYTES 4294967259

/* Return codes: 0 is success, negative values are errors. */
#define MN_OK 0
#define MN_ERR_NOMEM -1      /* allocation failed; nothing was changed */
#define MN_ERR_OVERFLOW -2   /* the write would pass offset 2^63-1 */
#define MN_ERR_TOOBIG -3     /* a message or node blob over 4 GB - 1 */
#define MN_ERR_CORRUPT -4    /* a serialized blob failed validation */
#define MN_ERR_ARG -5        /* an argument out of its documented range */

/* Null styles for mn_read_resp(): how an evicted/lost offset is encoded. */
#define MN_NULL_RESP2 0      /* "$-1\r\n" */
#define MN_NULL_RESP3 1      /* "_\r\n"   */

typedef struct mn_stream mn_stream;
typedef struct mn_node mn_node;

/* A growable byte buffer owned by C; free with mn_buf_free(). Functions that
 * take an mn_buf append to it (len grows), they never truncate it. */
typedef struct mn_buf {
    char *data;
    size_t len;
    size_t cap;
} mn_buf;

int mn_abi_version(void);

void mn_buf_init(mn_buf *b);
void mn_buf_free(mn_buf *b);

/* max_entries: messages per macronode, 1..MN_MAX_MAX_ENTRIES.
 * compression_level: 0 = off, 1..9 = zlib level for sealed inner nodes.
 * Returns NULL on allocation failure or bad arguments. */
mn_stream *mn_stream_new(uint32_t max_entries, int compression_level);
void mn_stream_free(mn_stream *s);
int mn_stream_set_compression(mn_stream *s, int compression_level);
/* Messages per node for nodes filled from now on (1..MN_MAX_MAX_ENTRIES);
 * nodes already holding more keep them. */
int mn_stream_set_max_entries(mn_stream *s, uint32_t max_entries);

/* Offsets. next: offset the next appended message gets (0 for a new stream).
 * first: oldest readable offset, equal to next when nothing is readable. */
uint64_t mn_next_offset(const mn_stream *s);
uint64_t mn_first_offset(const mn_stream *s);
uint64_t mn_length(const mn_stream *s);             /* readable messages */
uint64_t mn_num_nodes(const mn_stream *s);
uint64_t mn_num_compressed_nodes(const mn_stream *s);
uint64_t mn_payload_bytes(const mn_stream *s);      /* readable message bytes */
uint64_t mn_memory_bytes(const mn_stream *s);       /* every byte it holds from malloc */
uint32_t mn_max_entries(const mn_stream *s);
int mn_compression_level(const mn_stream *s);

/* Raise the next offset to `next` (current next <= next <= 2^63). The
 * offsets skipped read as null forever; the following append starts a new
 * node at `next`. Used to recover offset reservations after a crash. */
int mn_raise_next_offset(mn_stream *s, uint64_t next);

/* Append n messages stored back to back in buf; lens[i] is the length of
 * message i. Atomic: on error nothing is appended. Returns the offset of the
 * first message (>= 0) or a negative MN_ERR_*. n == 0 is MN_ERR_ARG. */
int64_t mn_append(mn_stream *s, const char *buf, const uint32_t *lens, size_t n);
/* The same for one message of len bytes (the common TWRITE). */
int64_t mn_append_one(mn_stream *s, const char *buf, uint32_t len);

/* Evict every message with offset <= offset. Returns how many readable
 * messages this call evicted (>= 0), or a negative MN_ERR_*. */
int64_t mn_evict_upto(mn_stream *s, int64_t offset);
/* Keep the newest `keep` offsets (offsets >= next - keep), evict the rest. */
int64_t mn_evict_keep(mn_stream *s, uint64_t keep);

/* Read n offsets starting at start (the caller clamps: start + n <= next,
 * else MN_ERR_ARG). Appends n RESP bulk strings (a null, per null_style, for
 * each offset that is evicted or lost) to out. No array header is written:
 * the caller knows n and writes it. */
int mn_read_resp(mn_stream *s, uint64_t start, uint64_t n, int null_style,
                 mn_buf *out);
/* The same, with `prefix_len` bytes of `prefix` (e.g. the caller's array
 * header) written first, so that the whole reply is one buffer. Nothing is
 * appended on error. */
int mn_read_resp_prefixed(mn_stream *s, uint64_t start, uint64_t n, int null_style,
                          const char *prefix, size_t prefix_len, mn_buf *out);

/* Same range, for callers that want the messages themselves: appends the
 * payloads back to back to out and writes lens[i] (-1 for null). */
int mn_read_copy(mn_stream *s, uint64_t start, uint64_t n, mn_buf *out,
                 int64_t *lens);

/* Serialization. The stream header records next/first offsets, max_entries,
 * compression level and node count; each node serializes to a self-describing
 * little-endian blob with a CRC32. Nodes are visited first to last. */
int mn_serialize_header(const mn_stream *s, mn_buf *out);
const mn_node *mn_first_node(const mn_stream *s);
const mn_node *mn_node_next(const mn_node *node);
int mn_node_serialize(const mn_node *node, mn_buf *out);

/* Check a blob from disk before trusting it: sizes, counts, monotonic
 * offsets, bounds and checksum; a compressed node's chunk table, and that
 * every chunk inflates to exactly its messages. MN_OK, MN_ERR_CORRUPT, or
 * MN_ERR_NOMEM when the inflate buffer cannot be allocated. */
int mn_validate_node_blob(const char *blob, size_t len);

/* Rebuild: create a stream from a header blob, then add node blobs in order.
 * Each blob is validated; a bad one is MN_ERR_CORRUPT and leaves the stream
 * as it was. mn_load_finish() checks the whole stream against the header. */
mn_stream *mn_load_header(const char *blob, size_t len, int *err);
int mn_load_node(mn_stream *s, const char *blob, size_t len);
int mn_load_finish(mn_stream *s);

/* CDEF-END */

#endif /* RCP11_MACRONODE_H */
