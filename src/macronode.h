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
#define MN_ABI_VERSION 13

/* Version byte of the blobs mn_serialize_header() and mn_node_serialize()
 * write. Loading also accepts the versions listed in macronode.c. */
#define MN_FORMAT_VERSION 4

#define MN_DEFAULT_MAX_ENTRIES 1000
#define MN_MAX_MAX_ENTRIES 1000000

/* The largest offset a message can get is 2^63-1, so the next offset of a
 * stream ranges over 0..2^63 and is returned as uint64_t. */
#define MN_MAX_OFFSET 9223372036854775807

/* A serialized node (frame + offset table + time deltas + blob) must fit
 * in 4 GB - 1, so a single message is a little below that: 4294967295 - 40
 * (frame) - 4 (its offset table entry) - 8 (its time delta at the widest).
 * Larger messages are MN_ERR_TOOBIG. */
#define MN_MAX_MESSAGE_BYTES 4294967243

/* Return codes: 0 is success, negative values are errors. */
#define MN_OK 0
#define MN_ERR_NOMEM -1      /* allocation failed; nothing was changed */
#define MN_ERR_OVERFLOW -2   /* the write would pass offset 2^63-1 */
#define MN_ERR_TOOBIG -3     /* a message or node blob over 4 GB - 1 */
#define MN_ERR_CORRUPT -4    /* a serialized blob failed validation */
#define MN_ERR_ARG -5        /* an argument out of its documented range */
#define MN_ERR_CAP -6        /* a reply over the caller's cap (mn_read_resp_capped) */

/* now_ms argument meaning "the wall clock, read by the core". */
#define MN_NOW -1

/* mn_oldest_append_ms() of a stream with no message: later than any time,
 * so an empty stream is never the oldest. */
#define MN_TIME_NONE 9223372036854775807

/* The latest append time a message can get: an append at a later time (an
 * AOF annotation or a replicated time says anything up to 2^63-1) counts
 * at this one, and a blob holding a later time is corrupt, so that a
 * stream holding a message never reads as empty (MN_TIME_NONE). */
#define MN_TIME_MAX 9223372036854775806

/* Compression depth: the newest 0..MN_MAX_COMPRESSION_DEPTH sealed nodes
 * stay raw (a 16-bit header field: 65M messages of 1000-message nodes). */
#define MN_MAX_COMPRESSION_DEPTH 65535

/* Styles for mn_read_resp(): how an evicted/lost offset is encoded, and
 * whether each message comes with its append time (OR it in). */
#define MN_NULL_RESP2 0      /* "$-1\r\n" */
#define MN_NULL_RESP3 1      /* "_\r\n"   */
#define MN_READ_WITH_TIMES 2 /* TREAD WITHTIMES: see mn_read_resp */

typedef struct mn_stream mn_stream;
typedef struct mn_node mn_node;

/* A growable byte buffer owned by C; free with mn_buf_free(). Functions that
 * take an mn_buf append to it (len grows), they never truncate it. */
typedef struct mn_buf {
    char *data;
    size_t len;
    size_t cap;
} mn_buf;

/* What an eviction by retention took; the mn_evict_* functions that take
 * one add to it (zero it first), so a caller can sum over streams. */
typedef struct mn_evicted {
    uint64_t messages; /* readable messages evicted */
    uint64_t bytes;    /* their payload bytes */
    uint64_t nodes;    /* nodes freed */
    uint64_t memory;   /* bytes given back to the allocator (mn_memory_bytes) */
} mn_evicted;

/* One node as mn_node_get_info() describes it (for tests, DEBUG, INFO). */
typedef struct mn_node_info {
    uint64_t first;      /* offset of message 0 (evicted or not) */
    uint32_t count;      /* messages held */
    uint8_t compressed;  /* 1: the blob is zlib chunks */
    uint8_t zlevel;      /* level last compressed or tried at, 0 = never */
    uint8_t time_width;  /* bytes per message of its time deltas (0..8) */
    int64_t first_ms;    /* append time of message 0 */
    int64_t last_ms;     /* append time of message count-1 */
    uint64_t memory;     /* bytes it holds (struct, tables, blob) */
} mn_node_info;

int mn_abi_version(void);

void mn_buf_init(mn_buf *b);
void mn_buf_free(mn_buf *b);
/* Room for `extra` more bytes (geometric growth); append len bytes.
 * MN_OK, or MN_ERR_NOMEM / MN_ERR_TOOBIG with the buffer unchanged. */
int mn_buf_reserve(mn_buf *b, size_t extra);
int mn_buf_append(mn_buf *b, const char *p, size_t len);

/* max_entries: messages per macronode, 1..MN_MAX_MAX_ENTRIES.
 * compression_level: 0 = off, 1..9 = zlib level for sealed nodes.
 * Returns NULL on allocation failure or bad arguments. */
mn_stream *mn_stream_new(uint32_t max_entries, int compression_level);
void mn_stream_free(mn_stream *s);

/* Compression, like Redis's list-compress-depth: with a level (1..9) the
 * newest `depth` sealed nodes stay raw and older ones are zlib-compressed
 * (the active node never is); depth 0 compresses every sealed node. The
 * work is spread: each node sealed by an append brings one node to its
 * form (the one that just got older than depth). A change of level or
 * depth -- and a load or a concatenation, which bring nodes formed under
 * other settings -- starts a scan that conforms existing nodes (compress,
 * recompress at the new level, or inflate) from the newest to the oldest,
 * one node per node sealed, and as fast as the caller's cron calls
 * mn_compress_step(s, max_nodes): it conforms at most max_nodes nodes and
 * looks at no more than 1024 per node, then returns 1 if the scan goes on,
 * 0 when every node has its form. mn_compress_pending: is a scan going
 * on. A node that does not compress by at least 10% stays raw (and is not
 * tried again at that level). */
int mn_stream_set_compression(mn_stream *s, int compression_level);
int mn_stream_set_compression_depth(mn_stream *s, uint32_t depth);
uint32_t mn_compression_depth(const mn_stream *s);
int mn_compress_step(mn_stream *s, uint32_t max_nodes);
int mn_compress_pending(const mn_stream *s);
/* Messages per node for nodes filled from now on (1..MN_MAX_MAX_ENTRIES);
 * nodes already holding more keep them. */
int mn_stream_set_max_entries(mn_stream *s, uint32_t max_entries);
/* A cap on a node's raw blob, like Redis's stream-node-max-bytes: a node
 * takes no message that would bring its messages past max_bytes bytes (a
 * larger message goes alone into a node of its own), and a node started
 * after another one is never allocated a larger blob than that. 0, the
 * default, is no cap (nodes end at max_entries). For nodes filled from now
 * on; not saved with the stream (the caller sets it again after a load).
 * Set to an allocator size class (a Redis module: jemalloc's), it makes
 * node blobs fill their allocation instead of being rounded up to the next
 * class (see MN_BLOB_PREDICT_HEADROOM_PERMILLE in macronode.c). */
int mn_stream_set_max_node_bytes(mn_stream *s, uint32_t max_bytes);
uint32_t mn_max_node_bytes(const mn_stream *s);

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

/* Per-stream state of whoever embeds the core (the Redis module keeps a
 * stream's offset reservation there): `bytes` zeroed bytes the core
 * allocates on the first call with bytes > 0, the same block on every call
 * after that (bytes 0: NULL until then). Freed with the stream; never
 * serialized, copied or counted in mn_memory_bytes. NULL when the
 * allocation failed. */
void *mn_embedder_state(mn_stream *s, size_t bytes);

/* Append n messages stored back to back in buf; lens[i] is the length of
 * message i. Atomic: on error nothing is appended. Returns the offset of the
 * first message (>= 0) or a negative MN_ERR_*. n == 0 is MN_ERR_ARG.
 *
 * now_ms is the append time (unix ms) the caller's clock says: the server's
 * cached time, Redis's in a module, the test's own; MN_NOW (any negative
 * value) makes the core read the wall clock itself (C11 timespec_get), for
 * callers with no clock at hand. The messages get max(now_ms,
 * mn_last_append_ms(s)): a stream's times never go back, even when the wall
 * clock does. */
int64_t mn_append(mn_stream *s, const char *buf, const uint32_t *lens, size_t n,
                  int64_t now_ms);
/* The same for one message of len bytes (the common TWRITE). */
int64_t mn_append_one(mn_stream *s, const char *buf, uint32_t len, int64_t now_ms);

/* Evict every message with offset <= offset. Returns how many readable
 * messages this call evicted (>= 0), or a negative MN_ERR_*. */
int64_t mn_evict_upto(mn_stream *s, int64_t offset);
/* Keep the newest `keep` offsets (offsets >= next - keep), evict the rest. */
int64_t mn_evict_keep(mn_stream *s, uint64_t keep);

/* Concatenation (TCONCAT): append every readable message of src to dst,
 * in order, at dst's next offsets (contiguous: src's evicted offsets and
 * gaps are not carried over). Returns the offset the first one got (dst's
 * next offset when src holds none) or a negative MN_ERR_*. Atomic: on an
 * error neither stream changed.
 *
 * Whole nodes move by relinking -- renumbered, keeping their compression
 * and time index -- so the cost is per node, not per message. Copied
 * instead: the readable part of a partially evicted first node, and all of
 * src when it fits in dst's active node (so that appending small streams
 * leaves no small nodes behind). A node that moves keeps its size even
 * when dst's max_entries is smaller.
 *
 * Times: every message keeps its append time, raised to dst's clock where
 * earlier (a stream's times never decrease); dst's clock becomes the last
 * message's time if later.
 *
 * src is left empty -- no node, no readable message, next offset unchanged
 * -- for the caller to free. dst == src is MN_ERR_ARG; messages that would
 * pass offset 2^63-1 are MN_ERR_OVERFLOW. */
int64_t mn_stream_concat(mn_stream *dst, mn_stream *src);

/* mn_stream_concat() of srcs[0], ..., srcs[n-1] into dst, in that order:
 * one call for the many sources of one TCONCAT. Returns the offset the
 * first message got (dst's next offset when they hold none) or the error
 * of the first source that failed; *done is the number of sources
 * appended (n on success). Atomic per source only: on an error the
 * sources before the one that failed stay appended (and empty). */
int64_t mn_stream_concat_many(mn_stream *dst, mn_stream **srcs, size_t n, size_t *done);
/* The sum of mn_length() of streams[0..n) (UINT64_MAX if it would not fit). */
uint64_t mn_length_sum(mn_stream **streams, size_t n);

/* Time index. Every message has an append time (see mn_append), kept per
 * message (a node stores deltas from its first message's time: 0 to 8
 * bytes per message, 2 at 1,000 messages per second).
 *
 * mn_last_append_ms: the stream's clock, the time the newest message ever
 * appended got (0 before the first append).
 *
 * mn_seek_time: the offset of the first readable message appended at or
 * after unix_ms, or the next offset when there is none. Exact, O(log
 * nodes + log max_entries). (Messages loaded from format-3 blobs, which
 * kept every 64th time, have the time of the next kept one: among them a
 * seek may land up to 63 messages early, never late.)
 *
 * mn_read_times: the append time of each offset start..start+n-1 into
 * times[i], -1 for an offset that reads as null (same range rules as
 * mn_read_copy). */
int64_t mn_last_append_ms(const mn_stream *s);
uint64_t mn_seek_time(const mn_stream *s, int64_t unix_ms);
int mn_read_times(const mn_stream *s, uint64_t start, uint64_t n, int64_t *times);

/* Retention, in whole nodes (like Kafka's segments), oldest first. Each
 * call frees at most max_nodes nodes, adds what it evicted to *ev, and
 * returns 1 when it stopped at max_nodes with more to evict, 0 when done
 * (or a negative MN_ERR_*). Evicted offsets read as null, as with
 * mn_evict_upto.
 *
 * mn_evict_older_than: evicts every message appended before cutoff_ms:
 * whole nodes whose newest message is older (the active node too: the
 * stream is then empty and keeps its next offset), then the older
 * messages of the first node left, as mn_evict_upto would (the node's
 * memory goes with its last message). max_nodes bounds the nodes freed.
 * mn_evict_over_bytes: evicts the oldest nodes while the readable payload
 * exceeds max_payload, never the active node: the stream keeps at most
 * max_payload bytes plus the active node's. */
int mn_evict_older_than(mn_stream *s, int64_t cutoff_ms, uint64_t max_nodes, mn_evicted *ev);
int mn_evict_over_bytes(mn_stream *s, uint64_t max_payload, uint64_t max_nodes, mn_evicted *ev);

/* For a maxmemory policy that evicts the oldest data across streams:
 * mn_oldest_append_ms is the append time of the oldest readable message
 * (MN_TIME_NONE when the stream is empty); mn_oldest_node_memory is what evicting the oldest node gives
 * back (0 when empty); mn_evict_oldest_node evicts it, the active node
 * included, returning 1, or 0 when the stream is empty. All O(1). */
int64_t mn_oldest_append_ms(const mn_stream *s);
uint64_t mn_oldest_node_memory(const mn_stream *s);
int mn_evict_oldest_node(mn_stream *s, mn_evicted *ev);

/* Read n offsets starting at start (the caller clamps: start + n <= next,
 * else MN_ERR_ARG). Appends n RESP bulk strings (a null, per style, for
 * each offset that is evicted or lost) to out. No array header is written:
 * the caller knows n and writes it. style is MN_NULL_RESP2 or
 * MN_NULL_RESP3, with MN_READ_WITH_TIMES for each message's append time:
 * then RESP2 gets two elements per offset (the message, then its time as
 * an integer; two nulls for an evicted one), RESP3 one two-element array
 * per offset (a null for an evicted one), as Redis's ZRANGE WITHSCORES. */
int mn_read_resp(mn_stream *s, uint64_t start, uint64_t n, int style,
                 mn_buf *out);
/* The same, with `prefix_len` bytes of `prefix` (e.g. the caller's array
 * header) written first, so that the whole reply is one buffer. Nothing is
 * appended on error. */
int mn_read_resp_prefixed(mn_stream *s, uint64_t start, uint64_t n, int style,
                          const char *prefix, size_t prefix_len, mn_buf *out);
/* The same, unless the reply (prefix included) would be over max_len
 * bytes: then MN_ERR_CAP, its size in *needed (when not NULL), and nothing
 * is appended or decompressed (the size comes from the nodes' message ends
 * alone), so a reply over a client's output limit is refused unbuilt. */
int mn_read_resp_capped(mn_stream *s, uint64_t start, uint64_t n, int style,
                        const char *prefix, size_t prefix_len, uint64_t max_len,
                        uint64_t *needed, mn_buf *out);

/* Where a read that skips unreadable offsets starts: the first readable
 * offset at or after `offset` (evicted offsets and gaps left by
 * mn_raise_next_offset are not), and in *run how many offsets from there
 * are readable without an unreadable one between them, at most max. When
 * nothing at or after `offset` is readable: max(offset, next), *run 0.
 * O(log nodes) plus one step per node the run covers. */
uint64_t mn_readable_run(const mn_stream *s, uint64_t offset, uint64_t max, uint64_t *run);

/* Same range, for callers that want the messages themselves: appends the
 * payloads back to back to out and writes lens[i] (-1 for null). */
int mn_read_copy(mn_stream *s, uint64_t start, uint64_t n, mn_buf *out,
                 int64_t *lens);

/* TREAD ... PACKED's parts for the same range: appends the payloads back
 * to back to out, writes each offset's length as a little-endian uint32 to
 * lens_le (4n bytes; 0xFFFFFFFF for null) and, when times_le is not NULL,
 * its append time as a little-endian int64 to times_le (8n bytes; -1 for
 * null). Nothing is appended on error. */
int mn_read_packed(mn_stream *s, uint64_t start, uint64_t n, mn_buf *out,
                   unsigned char *lens_le, unsigned char *times_le);
/* The same as TREAD ... PACKED's RESP, after prefix: the lengths, the
 * messages and (times) the times as two or three bulk strings in one
 * buffer, as mn_read_resp_capped writes the plain reply: MN_ERR_CAP with
 * the size in *needed when it would be over max_len, nothing appended or
 * decompressed then. (*needed is set whenever it is not NULL.) */
int mn_read_packed_resp(mn_stream *s, uint64_t start, uint64_t n, int times, const char *prefix,
                        size_t prefix_len, uint64_t max_len, uint64_t *needed, mn_buf *out);

/* Serialization. The stream header records next/first offsets, max_entries,
 * compression level and node count; each node serializes to a self-describing
 * little-endian blob with a CRC32. Nodes are visited first to last. */
int mn_serialize_header(const mn_stream *s, mn_buf *out);
const mn_node *mn_first_node(const mn_stream *s);
const mn_node *mn_node_next(const mn_node *node);
void mn_node_get_info(const mn_node *node, mn_node_info *out);
int mn_node_serialize(const mn_node *node, mn_buf *out);

/* Check a blob from disk before trusting it: sizes, counts, monotonic
 * offsets, bounds and checksum; a compressed node's chunk table, and that
 * every chunk inflates to exactly its messages. MN_OK, MN_ERR_CORRUPT, or
 * MN_ERR_NOMEM when the inflate buffer cannot be allocated. */
int mn_validate_node_blob(const char *blob, size_t len);

/* Rebuild: create a stream from a header blob, then add node blobs in order.
 * Each blob is validated; a bad one is MN_ERR_CORRUPT and leaves the stream
 * as it was. mn_load_finish() checks the whole stream against the header.
 * Blobs of format version 3 (times of every 64th message) load with each
 * message at the time of the next kept one (see mn_seek_time). Blobs of
 * format version 2 (before the time index) load too; their messages have
 * no recorded time and count as appended at now_ms, the loader's clock
 * (MN_NOW: the wall clock; ignored for the later formats): a seek by a
 * time up to now_ms starts at them, and retention by age keeps them for
 * its full period after the upgrade. Saved again, they keep now_ms. */
mn_stream *mn_load_header(const char *blob, size_t len, int64_t now_ms, int *err);
int mn_load_node(mn_stream *s, const char *blob, size_t len);
int mn_load_finish(mn_stream *s);

/* Append one node blob of the current format (as mn_node_serialize wrote
 * it), or of format 3, to a live stream, whole: its messages keep their
 * offsets, bytes,
 * compression and append times (raised to the stream's clock where
 * earlier), so a stream rebuilt node by node is the stream that was
 * serialized -- how the Redis module's AOF rewrite keeps append times.
 * The blob's first offset must be >= the stream's next offset (MN_ERR_ARG
 * otherwise); the offsets in between read as null, and the next offset
 * becomes the node's end. Every message of the node is readable: evict a
 * prefix afterwards with mn_evict_upto. The node may arrive compressed and
 * stay the last node; appends then start a new node after it. Existing
 * nodes keep their form; a scan (mn_compress_step) conforms them all once
 * the caller stops appending nodes. Validated like mn_load_node
 * (MN_ERR_CORRUPT, nothing changed); MN_ERR_NOMEM changes nothing either. */
int mn_append_node_blob(mn_stream *s, const char *blob, size_t len);

/* CDEF-END */

#endif /* RCP11_MACRONODE_H */
