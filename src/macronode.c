/* macronode.c -- the rcp11 storage core: one stream as a skiplist of
 * macronodes.
 *
 * THE DATA STRUCTURE
 * ==================
 *
 * An RCP 11 stream is an append-only log: message k of a key gets the
 * logical offset k (0, 1, 2, ...), offsets never change, the oldest messages
 * may be evicted, and a range of offsets is read by position. Storing every
 * message in its own allocation would cost a pointer, a length and malloc's
 * own header per message, more than the payload for small messages. So
 * messages are packed into *macronodes*:
 *
 *   +--------------------------- mn_node ----------------------------+
 *   | first = 5000 (logical offset of message 0 of this node)         |
 *   | count = 3                                                        |
 *   | ends  --> [ 11 | 15 | 27 ]     uint32 offset table              |
 *   | blob  --> "hello world" "ping" "hi there 42"   (back to back)    |
 *   | prev, fwd[0..level-1]                                            |
 *   +------------------------------------------------------------------+
 *
 * Message i of a node starts at ends[i-1] (0 for i == 0) and ends at
 * ends[i], so its length is the difference of two successive table entries
 * and its offset is first + i. A node holds at most max_entries messages
 * (stream-node-max-entries, 1000 by default, fixed per stream at creation);
 * 100-byte messages then cost 100 + 4 bytes plus the node's own bookkeeping
 * shared by 1000 messages.
 *
 * The nodes of a stream form a skiplist (William Pugh, "Skip Lists: A
 * Probabilistic Alternative to Balanced Trees", CACM 1990) ordered by each
 * node's first offset, so finding the node of an offset takes O(log nodes)
 * expected steps. It differs from Pugh's list in three ways, all following
 * from the log's access pattern:
 *
 *   - Insertions only ever happen at the tail and deletions only at the head
 *     (eviction), so no search is needed to delete: freeing a prefix of k
 *     nodes walks level 0 and repoints the head's forward pointers, O(k).
 *   - Every node also has a backward pointer (prev) and the stream keeps the
 *     tail, which makes appending O(1) for messages going into the last node
 *     (a new node costs one O(log nodes) walk to find where to link it), and
 *     lets a lookup try the last two nodes before descending: consumers that
 *     follow the stream read near its end.
 *   - A lookup returns the last node whose first offset is <= the wanted
 *     offset; the offset may still lie past that node's end, because offsets
 *     can be skipped (see GAPS), and then it reads as null.
 *
 * Each node's forward pointer array is allocated to the node's level (a
 * flexible array member), so the average node carries 4/3 pointers with
 * the probability 1/4 that Pugh recommends for speed and space.
 *
 * NODE LIFE CYCLE
 * ===============
 *
 * The last node of a stream is the *active* node: appends go there until it
 * holds max_entries messages. A node that becomes full is shrunk to fit
 * (offset table and blob reallocated to exactly what they hold), so sealed
 * nodes carry no slack. When a new node is started after a node, that node
 * is *sealed*: shrunk to fit if it was not full, and one node's worth of
 * compression work is done (see COMPRESSION). The active node is never
 * compressed, so appends never decompress anything.
 *
 * Tiny streams stay tiny: while a stream has a single node its table and
 * blob grow geometrically with the messages it holds. Nodes started after
 * another one allocate the full table (max_entries entries) and a blob of
 * the size the node before them reached at creation, because such a
 * stream evidently receives more than a node's worth of messages, and
 * like messages: so they are not grown, moved and shrunk by realloc, which
 * leaves holes in the heap (MN_BLOB_PREDICT_HEADROOM_PERMILLE), plus a
 * headroom as large as successive nodes have been seen to differ: none
 * for messages of one size, whose nodes are then never resized at all
 * (MN_SPREAD_HEADROOM_PCT). A node whose messages outgrow that grows
 * geometrically; every node gives back its slack when it is sealed or
 * full.
 *
 * A stream may also cap the bytes of a node (mn_stream_set_max_node_bytes,
 * no cap by default): a node then ends at max_entries messages or before
 * its messages pass the cap, whichever comes first, and no blob is sized
 * ahead beyond the cap. The reason is the allocator. jemalloc (Redis's)
 * rounds every request up to a size class, and above 64 KiB its classes
 * are 16 KiB apart: 1000 messages of 100 bytes ask for 100,000 bytes and
 * get 114,688, 15% more than they use, and Redis's used_memory counts it.
 * With a cap equal to a size class -- the module picks the class below
 * max_entries messages of the stream's average size: 96 KiB, 98,304 bytes,
 * for 100-byte messages -- the node ends at 983 such messages, 98,300
 * bytes, and fills its class.
 * glibc's malloc (the Python server) has no such classes: no cap there.
 *
 *   max_entries 1000, no cap:   | 100,000 bytes used |14,688 slack| 112 KiB
 *   cap 98,304:                 | 98,300 bytes used              |  96 KiB
 *
 * COMPRESSION
 * ===========
 *
 * A compressed node keeps its offset table raw (eviction and sizing never
 * inflate anything) and replaces its blob by *chunks*: independent zlib
 * streams of whole messages, each at least MN_COMPRESS_CHUNK_BYTES raw
 * (the last may be shorter), preceded by a small chunk table (layout at
 * mn_chunk_count()). Inflating a whole 1000-message node to read 100 of its
 * messages would make random reads of compressed streams ~100x slower than
 * raw ones; with chunks a read inflates only the one or two it touches.
 * Inflated chunks go to a per-stream cache of MN_CACHE_SLOTS entries, so a
 * consumer reading 100 messages at a time inflates each chunk once. The
 * cache is counted in memory_bytes and its entries are dropped when their
 * node is freed or inflated.
 *
 * Which nodes are compressed follows Redis's list-compress-depth: with a
 * level (1..9), the newest `depth` sealed nodes stay raw -- consumers near
 * the tail read them without inflating anything -- and older ones are
 * compressed if that saves at least MN_COMPRESS_MIN_SAVING_PCT percent (a
 * node that does not stays raw, its zlevel saying it was tried). A sealed
 * node's *rank* is its distance from the tail: 0 for the newest sealed
 * node. Each seal makes every sealed node one rank older, so exactly one
 * node reaches rank depth: the stream keeps a pointer to it (`boundary`,
 * moved one node forward per seal, O(1)) and compresses it then. So work
 * is spread over appends, one node per node sealed, never a burst.
 *
 * A change of level or depth, a load and a concatenation bring nodes whose
 * form the current settings may not want. They start a *scan*: a cursor
 * that walks from the newest sealed node to the oldest and conforms each
 * node (compress, recompress at the new level, or inflate), at one node
 * per node sealed and as far as the caller's cron asks
 * (mn_compress_step(), bounded in nodes conformed and in nodes looked at:
 * MN_SCAN_VISITS_PER_NODE). The cursor's rank grows by one per seal; both
 * pointers are cleared when eviction frees their node (all older nodes go
 * with it). A failed allocation while conforming leaves the node as it
 * is: readable, only not in its form.
 *
 * MEMORY ACCOUNTING
 * =================
 *
 * mn_memory_bytes() is the sum of the sizes this file asked the allocator
 * for and still holds: the stream struct, the head's forward pointers, each
 * node's struct, table (offsets and times) and blob, and the decompression
 * cache. It is
 * updated at every malloc, realloc and free (tests/c/driver.c checks it
 * against a counting allocator); the allocator's own per-block overhead is
 * not included.
 *
 * GAPS
 * ====
 *
 * mn_raise_next_offset() skips offsets: it is how the server recovers offset
 * reservations after a crash (messages that may have been acknowledged but
 * were lost must never have their offset given to another message). Skipped
 * offsets belong to no node and read as null forever; the next append starts
 * a new node at the raised offset. So nodes cover offset ranges with holes
 * between them, and every lookup is prepared for an offset in no node.
 *
 * TIME INDEX
 * ==========
 *
 * Every message has an append time (unix ms), the now_ms its append passed
 * -- the caller's clock, not the core's: the server passes its cached time,
 * a Redis module Redis's, tests their own -- raised to the stream's clock
 * (the newest time ever appended) when it is earlier, so times never
 * decrease along a stream even when the wall clock steps back. The clock
 * is an argument of the append functions rather than a per-stream setter:
 * a setter would cost a second call per append from Python and from a C
 * caller alike, and could be forgotten.
 *
 * Every node keeps the time of each of its messages, compactly: the time
 * of its message 0 (first_ms, in the node struct) and, per message, the
 * difference to it -- a *delta*, in a table beside the offset table. All
 * deltas of a node have one width, 0, 1, 2, 4 or 8 bytes: once the node
 * is sealed, the narrowest that holds its largest delta, the last
 * message's (times never decrease). A node whose messages all got one
 * millisecond (a TWRITE of many entries, a burst) stores no delta at all:
 *
 *   node, time width 2:         message  0     1     2     3   ...
 *     first_ms = 1700000000000    deltas [ 0 |  0  |  3  | 250 | ... ]  uint16
 *                                  time = first_ms + deltas[i]
 *
 *   width  largest delta     a node spanning it at 1000 messages per node
 *   -----  ----------------  -------------------------------------------
 *       0  0                 one millisecond (batches, bursts)
 *       1  255 ms            >= ~4,000 messages/s
 *       2  65.5 s            >= ~16 messages/s
 *       4  49.7 days         slower
 *       8  2^63 - 2 ms       a node filling over more than 49.7 days
 *
 * Fixed width per node rather than varints: the time of message i is one
 * load (a TREAD WITHTIMES reads it per message), a seek bisects the
 * deltas, and at 1,000 messages per node a varint would save at most a
 * byte per message over the width-2 case. The width is chosen when a node
 * is allocated -- the width the node before it needed, as streams keep
 * their rate, so that a node is rarely widened (re-encoded into a new
 * table, at most four times in its life) -- and narrowed to what it needs
 * when it is sealed (MN_TIME_WIDTHS). 100-byte messages at 1,000 per
 * second cost 2 bytes per message, 2% of the payload.
 *
 * So times are exact: mn_seek_time() descends the skiplist on the nodes'
 * last times to the first node with a message at or after the wanted time,
 * then bisects that node's deltas; retention by age evicts whole nodes
 * whose newest message expired, then the expired messages of the first
 * node left (logically, as TEVICT does: its memory goes with its last
 * message).
 *
 * Blobs of format 3 (below) kept only the times of every 64th message of
 * a node and of its last one. Loaded, each of its messages takes the time
 * of the next kept one at or after it (its own when kept): never earlier
 * than the real time, so a seek among those messages stays what format 3
 * promised -- never late, up to 63 messages early -- and everything
 * appended after the load is exact.
 *
 * CONCATENATION
 * =============
 *
 * mn_stream_concat() appends another stream's readable messages at the
 * next offsets. Offsets are only the node's first plus an index, so a
 * node holding no evicted message can move from one skiplist to the other
 * as it is: unlinked from src, its first offset renumbered, linked after
 * dst's tail; its blob, compression, chunks and offset table stay, and its
 * times are raised to dst's clock where older (its deltas rewritten when
 * some are older, O(messages); no message is touched). Only the readable part of a partially evicted first node is
 * copied -- its evicted messages would otherwise take offsets -- and so is
 * a source small enough to fit in dst's active node, which would otherwise
 * be sealed half full for each small source appended. Copies go through
 * the two phases of appending, so the whole operation still allocates
 * everything before it changes anything.
 *
 * EVICTION
 * ========
 *
 * Eviction is exact and logical: the stream's `first` is the oldest readable
 * offset, and every offset below it reads as null. Every node whose messages
 * are all below `first` is freed at once; the first remaining node may be
 * partially evicted: it keeps its memory (payload bytes and length count
 * only readable messages) until the rest of it is evicted. Evicting
 * everything frees every node, including the active one, and the next append
 * starts a fresh, tiny node at the kept next offset.
 *
 * INVARIANTS
 * ==========
 *
 *   - Nodes are ordered by first offset and do not overlap: a node's first is
 *     >= the end (first + count) of the node before it.
 *   - Every node holds 1..max_entries messages (as max_entries was when it
 *     was filled: it can be changed) and at least one readable
 *     message: nodes entirely below `first` are freed.
 *   - first == next when the stream has no node; otherwise the first node
 *     contains `first`.
 *   - next <= 2^63, so the largest offset of a message is 2^63-1.
 *   - A node's raw blob plus its offset table plus the serialized frame fit
 *     in 4 GB - 1 (MN_NODE_BYTES_LIMIT), so a serialized node always fits a
 *     32-bit length.
 *   - The core compresses only sealed nodes, never the tail, and appends
 *     never go into a compressed node. A node appended whole
 *     (mn_append_node_blob) may arrive compressed and stay the tail until
 *     an append starts a node after it; then it is conformed like any.
 *   - With a byte cap, every node started under it holds at most
 *     max_node_bytes raw bytes, or one message.
 *   - With no scan pending, every sealed node has the form its rank asks
 *     for (see COMPRESSION), but for conforming that failed to allocate.
 *   - Times never decrease: within a node delta i <= delta i+1, last_ms is
 *     first_ms + the last delta, and a node's first_ms >= the previous
 *     node's last_ms; no time is later than the stream's clock or earlier
 *     than 0. A node's time width holds its last delta.
 *
 * SERIALIZATION
 * =============
 *
 * A stream serializes to one header blob and one blob per node, first to
 * last. Multi-byte fields are little-endian and are read and written through
 * the mn_get_* / mn_put_* accessors, never by casting structs onto bytes, so
 * the format is the same on every host. A node blob is a near-plain copy of
 * the node in memory: a compressed node stays compressed.
 *
 * Stream header blob, format 4 (MN_HEADER_BYTES = 52 bytes):
 *
 *   OFFSET  SIZE  DESCRIPTION
 *   ------  ----  -----------------------------------------------------
 *        0     4  magic "MNST"
 *        4     1  format version, MN_FORMAT_VERSION (4)
 *        5     1  compression level for nodes sealed from now on (0..9)
 *        6     2  compression depth (0..MN_MAX_COMPRESSION_DEPTH)
 *        8     8  next offset (0..2^63)
 *       16     8  first offset: oldest readable offset, == next when empty
 *       24     8  number of node blobs that follow
 *       32     4  max_entries (1..MN_MAX_MAX_ENTRIES)
 *       36     4  reserved, zero
 *       40     8  clock: the newest append time (unix ms, 0..MN_TIME_MAX)
 *       48     4  CRC32 (zlib) of bytes 0..47
 *
 * Node blob, format 4 (40 + (4 + W) * count + stored_len bytes, W the
 * time width):
 *
 *   OFFSET      SIZE        DESCRIPTION
 *   ----------  ----------  -----------------------------------------------
 *            0           4  magic "MNND"
 *            4           1  format version, MN_FORMAT_VERSION (4)
 *            5           1  flags: bit 0 set = blob is zlib chunks
 *            6           1  zlevel: zlib level the node was last compressed,
 *                           or tried, at (0 = never; >= 1 when compressed)
 *            7           1  W, time width: bytes per time delta, the
 *                           narrowest of 0, 1, 2, 4, 8 that holds the last
 *                           delta (one encoding per node)
 *            8           8  first: logical offset of message 0
 *           16           4  count: messages in the node (1..max_entries)
 *           20           4  raw_len: uncompressed blob bytes == ends[count-1]
 *           24           4  stored_len: blob bytes as stored below; equal to
 *                           raw_len when raw, smaller when compressed
 *           28           8  first_ms: append time of message 0
 *           36   4 * count  offset table: ends[i], end of message i in the
 *                           raw blob, non-decreasing
 *    D = 36 + 4*count       time deltas: message i was appended at first_ms
 *                W * count  + delta[i]; delta[0] == 0, non-decreasing,
 *                           first_ms + delta[count-1] <= MN_TIME_MAX
 *   D + W * count           blob: raw messages, or the compressed blob
 *           stored_len      exactly as in memory (chunk table + zlib
 *                           streams, see mn_chunk_count())
 *   end - 4              4  CRC32 (zlib) of every byte before it
 *
 * Older formats still load; all nodes of a stream have the header's
 * version.
 *
 * Format 3 (times of every 64th message): the header is format 4's. The
 * node blob has byte 7 reserved (zero), last_ms (the append time of
 * message count-1) at 28, and instead of the deltas ceil(count / 64)
 * int64 times[k], the time of message 64k, non-decreasing, <= last_ms
 * (40 + 4 * count + 8 * ceil(count / 64) + stored_len bytes). Its
 * messages take the time of the next kept one (see TIME INDEX).
 *
 * Format 2 (before the time index): its header is the first 36 bytes above
 * with bytes 6..7 reserved (zero), then the CRC32 at 36 (40 bytes); its
 * node blob is the first 28 bytes above with bytes 6..7 reserved, then the
 * offset table, the blob and the CRC32 (no times). Its messages have no
 * recorded time: they count as appended at the loader's clock
 * (mn_load_header's now_ms), which becomes the stream's clock, and a
 * compressed format-2 node counts as compressed at the stream's level.
 *
 * Evicted messages of a partially evicted first node are serialized with it
 * (the header's first offset says which ones are gone), so a loaded stream
 * is the same stream: same offsets, evictions, gaps and compressed nodes.
 * mn_validate_node_blob() checks a blob from disk before anything trusts it;
 * loading rejects nodes that overlap, pass the next offset, or are entirely
 * evicted.
 *
 * mn_append_node_blob() appends one such node blob to a live stream, whole
 * and at its own offsets: a stream rebuilt from its node blobs one call at
 * a time (the Redis module's AOF rewrite emits one command per node) gets
 * back its offsets, bytes, compression and append times exactly; only a
 * partially evicted first node needs an eviction afterwards, and an
 * evicted tail a raised next offset. A format-3 node blob (an AOF rewritten
 * before format 4) is appended too, its times as a load gives them.
 */

#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* madvise() under -std=c11 */
#endif
#include "macronode.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>
#ifndef MN_HOSTED_ALLOCATOR
#include <sys/mman.h>
#endif

/* ------------------------------------------------------------------------
 * Constants
 * --------------------------------------------------------------------- */

/* 2^63: one past the largest offset; the largest value next can take. */
#define MN_OFFSET_END ((uint64_t)1 << 63)

/* Pugh's p = 1/4: fewer pointers per node than 1/2 for the same expected
 * search cost within a constant factor. 32 levels index 4^32 nodes, far
 * more than memory can hold. */
#define MN_SKIPLIST_P_BITS 2
#define MN_SKIPLIST_MAX_LEVEL 32

/* Compressing a blob smaller than this is not worth the zlib header and the
 * inflate on every read. */
#define MN_COMPRESS_MIN_BYTES 64
/* A compressed node costs an inflate on read; keep the raw form unless this
 * saves at least this share of the blob. */
#define MN_COMPRESS_MIN_SAVING_PCT 10

/* A compressed node is a sequence of independent zlib streams ("chunks"),
 * each holding whole messages and at least this many raw bytes (but the
 * last). A read inflates only the chunks it needs: 100 messages of 200
 * bytes touch two or three chunks, not the whole node. Measured on JSON log
 * lines (bench/core_bench.py): 16 KB chunks need ~5% more memory than
 * 32 KB ones (zlib's window) and make a random 100-message read ~1.6x
 * faster; 8 KB chunks cost another 6% for little more speed. */
#define MN_COMPRESS_CHUNK_BYTES 16384

/* Inflated chunks kept per stream: enough for a reader whose range spans a
 * few chunks and a second reader elsewhere, small enough (8 x ~16 KB) to be
 * negligible next to the nodes themselves. */
#define MN_CACHE_SLOTS 8

/* A scan step (mn_compress_step, one per sealed node) conforms at most a
 * given number of nodes and looks at most this many nodes per node it may
 * conform: looking is a few loads (~20 ns), so a step of one node is at
 * most ~20 us of looking -- bounded even when a scan walks a stream of a
 * million nodes that are all in form already. */
#define MN_SCAN_VISITS_PER_NODE 1024

/* Compressed blob layout: a chunk count, then (first message, end of zlib
 * data) per chunk, then the zlib streams. See the big comment. */
#define MN_CHUNK_COUNT_BYTES 4
#define MN_CHUNK_ENTRY_BYTES 8

/* The offset table of a lone node grows by half, and by at least this many
 * entries: a 1-message stream keeps a 1-entry table. */
#define MN_TABLE_MIN_GROWTH 4

/* Blobs of active nodes grow by half, but not past the node's projected
 * full size (average message so far x max_entries) plus this share of it.
 * Overshooting the full size would be slack until the node fills, and would
 * push 100 KB nodes of 100-byte messages past malloc's mmap threshold
 * (128 KB), where every node costs an mmap and a munmap. Sealed or full
 * nodes have no slack at all. */
#define MN_BLOB_PROJECTION_HEADROOM_PCT 12

/* A node started after another one takes, at once, the blob size the node
 * before it reached, scaled to max_entries, plus this much (per mille). A
 * blob grown by realloc from a few messages to ~100 KB moves (malloc, copy,
 * free) whenever another stream allocated behind it, and the holes it
 * leaves stay resident: sized ahead, a node is neither grown nor shrunk
 * when its messages are like the last node's. The headroom covers the
 * node-to-node spread of 1000 messages of mixed sizes (about 1% for sizes
 * of 50..150 bytes) so that a node rarely has to grow; what it does not
 * use is given back when the node is sealed. Measured, fresh process,
 * glibc malloc, 2M messages of 50..150 bytes appended one at a time to 10
 * / 300 streams (RSS growth / memory_bytes): 1.046 / 1.083 growing every
 * node, 1.004 / 1.037 sized ahead with 0, 1.010 / 1.003 with 15, 1.013 /
 * 1.008 with 50 (bench/core_bench.py has the uniform 100-byte cases). */
#define MN_BLOB_PREDICT_HEADROOM_PERMILLE 15

/* ...but only while the spread is unknown. Every blob sized ahead is
 * shrunk when its node is sealed, and when another allocation sits after
 * it (a read buffer, a reply) the bytes given back stay a hole between
 * nodes: with messages of one size the 1.5% is never used and never
 * reused. So the stream tracks how much successive projections differ (a
 * moving mean, weight 1/MN_SPREAD_WEIGHT for the newest) and, once it has
 * seen two, sizes ahead by MN_SPREAD_HEADROOM_PCT percent of that mean,
 * capped by the fixed per mille: 0 for messages of one size; for 50..150
 * bytes the mean is ~0.9% of a node and the headroom ~1.4%, about the
 * fixed one. Measured through the server (bench/rss_probe.py --server
 * quick: 1M entries of 100 bytes, RSS growth / the core's accounting),
 * three runs each: 1.015, 1.006, 1.016 with the fixed headroom; 1.010,
 * 1.010, 1.010 with this one. */
#define MN_SPREAD_WEIGHT 8
#define MN_SPREAD_HEADROOM_PCT 150

/* Time deltas (see TIME INDEX): a node's deltas all have one width, the
 * narrowest of these that holds its largest one. 0 is a node of one
 * millisecond; 8 bytes hold any delta between two times (0..MN_TIME_MAX),
 * so no append ever has to start a node because of its time. A node is
 * allocated at the width the node before it needed (steady streams are
 * then never re-encoded), widened when a delta outgrows it, and narrowed
 * when it is sealed if it was given more than it used. */
#define MN_TIME_WIDTH_MAX 8

/* Format 3 kept the time of every 64th message of a node (and of its
 * last); see TIME INDEX for how those nodes load. */
#define MN_V3_TIME_EVERY 64

/* Serialized formats (MN_FORMAT_VERSION is in macronode.h). Versions 3
 * (times of every 64th message) and 2 (before the time index) still load;
 * see SERIALIZATION. Format 3's header and node frame are format 4's
 * sizes. */
#define MN_FORMAT_VERSION_V3 3
#define MN_FORMAT_VERSION_V2 2
#define MN_HEADER_BYTES 52
#define MN_HEADER_BYTES_V2 40
#define MN_NODE_FRAME_BYTES 40    /* fixed node fields + CRC32 */
#define MN_NODE_FIXED_BYTES 36    /* node fields before the offset table */
#define MN_NODE_FRAME_BYTES_V2 32
#define MN_NODE_FIXED_BYTES_V2 28
#define MN_NODE_FLAG_COMPRESSED 1u
/* The level a compressed version 2 node is taken to have when its stream's
 * level is 0 (zlib's default: the format did not record it). */
#define MN_V2_ZLEVEL 6

/* A serialized node, raw blob included, must fit a 32-bit length. */
#define MN_NODE_BYTES_LIMIT ((uint64_t)UINT32_MAX)

/* The largest message alone in a node, with its offset table entry and a
 * time delta of the widest width, is exactly that limit, so every message
 * mn_append() accepts fits an empty node whatever its time. */
_Static_assert(MN_NODE_FRAME_BYTES + 4 + MN_TIME_WIDTH_MAX + (uint64_t)MN_MAX_MESSAGE_BYTES ==
                   MN_NODE_BYTES_LIMIT,
               "MN_MAX_MESSAGE_BYTES must fill a one-message node exactly");

static const char MN_HEADER_MAGIC[4] = {'M', 'N', 'S', 'T'};
static const char MN_NODE_MAGIC[4] = {'M', 'N', 'N', 'D'};

/* ------------------------------------------------------------------------
 * Types
 * --------------------------------------------------------------------- */

/* A node's offset table and time deltas share one allocation (one malloc
 * per node fewer), sized for `cap` messages at time width tw (0, 1, 2, 4
 * or 8 bytes; see TIME INDEX):
 *
 *   +---------------------------+-----------------------------------+
 *   | uint32 ends[cap]          | deltas[cap], tw bytes each        |
 *   +---------------------------+-----------------------------------+
 *   ^ ends                      ^ ends + cap (4-aligned; read with memcpy)
 *
 * Message i was appended at first_ms + deltas[i]; entries past the
 * messages held are unused. Resizing the table moves the deltas with it,
 * and a new width re-encodes them (mn_node_retable()). */
struct mn_node {
    uint64_t first;     /* logical offset of message 0 */
    mn_node *prev;      /* backward pointer, NULL for the first node */
    char *blob;         /* messages back to back, or their zlib chunks */
    uint32_t *ends;     /* offset table + time deltas, room for `cap` */
    int64_t first_ms;   /* append time of message 0 */
    int64_t last_ms;    /* append time of message count-1 */
    uint32_t count;     /* messages held */
    uint32_t cap;       /* messages the table has room for */
    uint32_t blob_cap;  /* bytes allocated in blob (== stored bytes when
                           compressed) */
    uint8_t level;      /* entries in fwd */
    uint8_t compressed; /* blob is zlib chunks of ends[count-1] raw bytes */
    uint8_t zlevel;     /* zlib level it was last compressed, or tried, at;
                           0 = never (or inflated since) */
    uint8_t tw;         /* time width: bytes per delta (0, 1, 2, 4, 8) */
    mn_node *fwd[];     /* forward pointers, one per level */
};

typedef struct mn_cache_slot {
    const mn_node *node; /* NULL when the slot is free */
    char *raw;           /* inflated chunk */
    uint32_t chunk;      /* which chunk of node */
    uint32_t len;
    uint32_t last_use;
} mn_cache_slot;

typedef struct mn_cache {
    mn_cache_slot slot[MN_CACHE_SLOTS];
    uint32_t clock;
} mn_cache;

struct mn_stream {
    uint64_t next;           /* offset the next message gets */
    uint64_t first;          /* oldest readable offset */
    uint64_t length;         /* readable messages */
    uint64_t payload;        /* bytes of readable messages */
    uint64_t memory;         /* bytes allocated for this stream, all told */
    uint64_t num_nodes;
    uint64_t num_compressed;
    uint64_t rng;            /* xorshift64 state for node levels */
    uint64_t load_expected;  /* node count announced by a header being loaded */
    int64_t clock;           /* append time of the newest message ever (ms);
                                appends never stamp an earlier time */
    mn_node **head;          /* head forward pointers, head_cap allocated */
    mn_node *tail;           /* the active node */
    mn_cache *cache;         /* allocated on the first read of a compressed chunk */
    uint32_t max_entries;
    uint32_t max_node_bytes; /* raw blob bytes a node may fill, 0 = no cap */
    uint8_t level;           /* levels in use (<= head_cap) */
    uint8_t head_cap;
    uint8_t compression;     /* zlib level for nodes sealed from now on */
    uint8_t load_version;    /* format of the blobs being loaded */
    uint16_t depth;          /* newest sealed nodes kept raw */
    mn_node *boundary;       /* the sealed node of rank depth, or NULL */
    mn_node *scan;           /* next node the scan conforms, or NULL */
    uint64_t scan_rank;      /* its rank */
    uint64_t last_projection; /* full size projected for the newest node
                                 started after another, 0 before the first */
    uint64_t spread;         /* mean difference of successive projections,
                                UINT64_MAX until two were seen */
    uint8_t time_width;      /* the width the newest sealed node needed: new
                                nodes start at it (see TIME INDEX) */
    void *embedder;          /* the embedder's block (mn_embedder_state) */
};

/* ------------------------------------------------------------------------
 * Little-endian accessors for serialized blobs
 * --------------------------------------------------------------------- */

static void mn_put_u16le(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void mn_put_u32le(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void mn_put_u64le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t mn_get_u16le(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t mn_get_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t mn_get_u64le(const unsigned char *p) {
    return (uint64_t)mn_get_u32le(p) | ((uint64_t)mn_get_u32le(p + 4) << 32);
}

static uint32_t mn_crc32(const unsigned char *p, size_t len) {
    return (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), p, len);
}

/* ------------------------------------------------------------------------
 * Buffers
 * --------------------------------------------------------------------- */

int mn_abi_version(void) { return MN_ABI_VERSION; }

void *mn_embedder_state(mn_stream *s, size_t bytes) {
    if (s->embedder == NULL && bytes > 0) s->embedder = calloc(1, bytes);
    return s->embedder;
}

void mn_buf_init(mn_buf *b) {
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void mn_buf_free(mn_buf *b) {
    free(b->data);
    mn_buf_init(b);
}

/* Make room for `extra` more bytes; grows geometrically so repeated small
 * appends stay linear. */
int mn_buf_reserve(mn_buf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len) return MN_ERR_TOOBIG;
    size_t need = b->len + extra;
    if (need <= b->cap) return MN_OK;
    size_t cap = b->cap < SIZE_MAX / 2 ? b->cap * 2 : SIZE_MAX;
    if (cap < need) cap = need;
    char *p = realloc(b->data, cap);
    if (p == NULL) return MN_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    return MN_OK;
}

int mn_buf_append(mn_buf *b, const char *p, size_t len) {
    int rc = mn_buf_reserve(b, len);
    if (rc != MN_OK) return rc;
    if (len) memcpy(b->data + b->len, p, len);
    b->len += len;
    return MN_OK;
}

/* ------------------------------------------------------------------------
 * Nodes
 * --------------------------------------------------------------------- */

static size_t mn_node_struct_bytes(uint8_t level) {
    return sizeof(mn_node) + (size_t)level * sizeof(mn_node *);
}

static uint64_t mn_node_end(const mn_node *n) { return n->first + n->count; }

/* Raw (uncompressed) blob bytes held by the node. */
static uint32_t mn_node_raw_bytes(const mn_node *n) {
    return n->count ? n->ends[n->count - 1] : 0;
}

static uint32_t mn_msg_start(const mn_node *n, uint32_t i) {
    return i ? n->ends[i - 1] : 0;
}

/* The narrowest time width (bytes per delta) that holds delta. */
static uint8_t mn_width_for(uint64_t delta) {
    return delta == 0 ? 0 : delta <= 0xFF ? 1 : delta <= 0xFFFF ? 2 : delta <= 0xFFFFFFFFu ? 4 : 8;
}

/* Bytes of a table allocation for `cap` messages at time width tw (layout
 * at struct mn_node). */
static size_t mn_table_bytes(uint32_t cap, uint8_t tw) { return (size_t)cap * (4 + (size_t)tw); }

static unsigned char *mn_node_deltas(const mn_node *n) { return (unsigned char *)(n->ends + n->cap); }

/* Delta i of a table of width tw (native byte order: memory only). */
static uint64_t mn_delta_get(const unsigned char *d, uint8_t tw, uint32_t i) {
    switch (tw) {
    case 1: return d[i];
    case 2: { uint16_t v; memcpy(&v, d + 2 * (size_t)i, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, d + 4 * (size_t)i, 4); return v; }
    case 8: { uint64_t v; memcpy(&v, d + 8 * (size_t)i, 8); return v; }
    default: return 0;
    }
}

/* Store delta i (which fits width tw). */
static void mn_delta_put(unsigned char *d, uint8_t tw, uint32_t i, uint64_t v) {
    switch (tw) {
    case 1: d[i] = (unsigned char)v; break;
    case 2: { uint16_t x = (uint16_t)v; memcpy(d + 2 * (size_t)i, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(d + 4 * (size_t)i, &x, 4); break; }
    case 8: memcpy(d + 8 * (size_t)i, &v, 8); break;
    default: break;
    }
}

/* The append time of message i of n. */
static int64_t mn_node_time(const mn_node *n, uint32_t i) {
    return n->first_ms + (int64_t)mn_delta_get(mn_node_deltas(n), n->tw, i);
}

/* The narrowest width that holds every delta of n. */
static uint8_t mn_node_width_needed(const mn_node *n) {
    return mn_width_for((uint64_t)(n->last_ms - n->first_ms));
}

/* Record that message i of n, just written, was appended at t (not before
 * message i-1; the width holds t - first_ms, see mn_append_plan()). */
static void mn_node_stamp(mn_node *n, uint32_t i, int64_t t) {
    if (i == 0) n->first_ms = t;
    mn_delta_put(mn_node_deltas(n), n->tw, i, (uint64_t)(t - n->first_ms));
    n->last_ms = t;
}

/* The caller's time, or the wall clock for MN_NOW (any negative value),
 * at most MN_TIME_MAX. */
static int64_t mn_now_ms(int64_t now_ms) {
    if (now_ms >= 0) return now_ms > MN_TIME_MAX ? MN_TIME_MAX : now_ms;
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0;
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Bytes of a serialized node of `count` messages at time width tw and
 * `stored` blob bytes. */
static uint64_t mn_node_serialized_bytes(uint32_t count, uint8_t tw, uint64_t stored) {
    return MN_NODE_FRAME_BYTES + (4 + (uint64_t)tw) * count + stored;
}

/* The same at the widest time width: what a node may grow to whatever the
 * times of its messages. */
static uint64_t mn_node_bytes_bound(uint32_t count, uint64_t stored) {
    return mn_node_serialized_bytes(count, MN_TIME_WIDTH_MAX, stored);
}

/* Can a node holding `count` messages of `bytes` raw bytes take one more of
 * `len` bytes? At most max_entries messages, at most the stream's
 * max_node_bytes of them (an empty node takes any message), and always
 * serializable within a 32-bit length. */
static int mn_node_fits(const mn_stream *s, uint32_t count, uint64_t bytes, uint32_t len) {
    if (count >= s->max_entries) return 0;
    if (count > 0 && s->max_node_bytes && bytes + len > s->max_node_bytes) return 0;
    return mn_node_bytes_bound(count + 1, bytes + len) <= MN_NODE_BYTES_LIMIT;
}

/* Pugh's random level with p = 1/4, from a xorshift64 generator private to
 * the stream (deterministic, so runs are reproducible). */
static uint8_t mn_random_level(mn_stream *s) {
    uint64_t x = s->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s->rng = x;
    uint8_t level = 1;
    while (level < MN_SKIPLIST_MAX_LEVEL && (x & ((1u << MN_SKIPLIST_P_BITS) - 1)) == 0) {
        level++;
        x >>= MN_SKIPLIST_P_BITS;
    }
    return level;
}

/* Bytes a node holds from the allocator: struct, tables and blob. */
static uint64_t mn_node_memory(const mn_node *n) {
    return mn_node_struct_bytes(n->level) + mn_table_bytes(n->cap, n->tw) + n->blob_cap;
}

#ifndef MN_HOSTED_ALLOCATOR
/* A node blob this big is made resident in one system call when it is
 * allocated (mn_populate), not a page fault at a time as messages fill it.
 * Appending 100-byte messages to a growing stream, a third of the server's
 * CPU went to those faults (the kernel's exception entry, the page-table
 * lock and the memory cgroup's charge, once per 4 KB); populated in one
 * call, `TWRITE b ENTRIES <100 x 100B>` one request at a time cost the
 * server 9.6-10.0 us per request instead of 11.0-11.5. The pages are the
 * blob's own, counted by s->memory from the start: what becomes resident
 * early is at most one node per stream that is still filling. The Redis
 * module leaves pages to the host's allocator. */
#define MN_POPULATE_MIN 65536
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels say EINVAL */
#endif

static void mn_populate(void *p, size_t len) {
    uintptr_t page = 4096;
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + len) & ~(page - 1);
    /* A refusal (an old kernel, no memory now) only means the faults come
     * one at a time, as without it. */
    if (end > start) (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
}
#endif

/* Allocate an unlinked node with room for `cap` messages in its tables, at
 * time width tw, and `blob_cap` blob bytes. Counts the memory. NULL on
 * failure. */
static mn_node *mn_node_alloc(mn_stream *s, uint8_t level, uint32_t cap, uint8_t tw,
                              uint32_t blob_cap) {
    if (cap == 0) cap = 1;
    if (blob_cap == 0) blob_cap = 1;
    mn_node *n = malloc(mn_node_struct_bytes(level));
    if (n == NULL) return NULL;
    memset(n, 0, mn_node_struct_bytes(level));
    n->level = level;
    n->tw = tw;
    n->ends = malloc(mn_table_bytes(cap, tw));
    n->blob = malloc(blob_cap);
    if (n->ends == NULL || n->blob == NULL) {
        free(n->ends);
        free(n->blob);
        free(n);
        return NULL;
    }
    n->cap = cap;
    n->blob_cap = blob_cap;
    s->memory += mn_node_memory(n);
#ifndef MN_HOSTED_ALLOCATOR
    if (blob_cap >= MN_POPULATE_MIN) mn_populate(n->blob, blob_cap);
#endif
    return n;
}

/* What an allocation for `len` bytes asks malloc for: an empty chunk or
 * blob still takes one byte, so that NULL only ever means failure. */
static size_t mn_alloc_size(size_t len) { return len ? len : 1; }

static void mn_cache_forget(mn_stream *s, const mn_node *n) {
    if (s->cache == NULL) return;
    for (int i = 0; i < MN_CACHE_SLOTS; i++) {
        mn_cache_slot *slot = &s->cache->slot[i];
        if (slot->node == n) {
            s->memory -= mn_alloc_size(slot->len);
            free(slot->raw);
            slot->node = NULL;
            slot->raw = NULL;
            slot->len = 0;
            slot->chunk = 0;
        }
    }
}

/* Free an unlinked node (or one being unlinked) and its accounting. */
static void mn_node_release(mn_stream *s, mn_node *n) {
    mn_cache_forget(s, n);
    s->memory -= mn_node_memory(n);
    free(n->ends);
    free(n->blob);
    free(n);
}

/* Give the tables room for `cap` (>= count) messages at time width tw
 * (which holds every delta held). At the same width the table is
 * reallocated and the deltas, which sit after the offset table, move: up
 * after growing, down before shrinking (and back if the shrink fails). A
 * new width re-encodes them into a new allocation. Nothing changes on
 * failure. */
static int mn_node_retable(mn_stream *s, mn_node *n, uint32_t cap, uint8_t tw) {
    if (cap == 0) cap = 1;
    if (cap == n->cap && tw == n->tw) return MN_OK;
    size_t old_bytes = mn_table_bytes(n->cap, n->tw);
    if (tw == n->tw) {
        size_t used = (size_t)n->count * tw;
        size_t from = (size_t)n->cap * 4, to = (size_t)cap * 4;
        char *old = (char *)n->ends;
        if (to < from && used) memmove(old + to, old + from, used);
        char *p = realloc(old, mn_table_bytes(cap, tw));
        if (p == NULL) {
            if (to < from && used) memmove(old + from, old + to, used);
            return MN_ERR_NOMEM;
        }
        if (to > from && used) memmove(p + to, p + from, used);
        n->ends = (uint32_t *)(void *)p;
    } else {
        uint32_t *p = malloc(mn_table_bytes(cap, tw));
        if (p == NULL) return MN_ERR_NOMEM;
        memcpy(p, n->ends, (size_t)n->count * 4);
        unsigned char *from = mn_node_deltas(n), *to = (unsigned char *)(p + cap);
        for (uint32_t i = 0; i < n->count; i++) mn_delta_put(to, tw, i, mn_delta_get(from, n->tw, i));
        free(n->ends);
        n->ends = p;
    }
    s->memory = s->memory - old_bytes + mn_table_bytes(cap, tw);
    n->cap = cap;
    n->tw = tw;
    return MN_OK;
}

static int mn_node_resize_blob(mn_stream *s, mn_node *n, uint32_t cap) {
    if (cap == 0) cap = 1;
    if (cap == n->blob_cap) return MN_OK;
    char *p = realloc(n->blob, cap);
    if (p == NULL) return MN_ERR_NOMEM;
    s->memory = s->memory - n->blob_cap + cap;
    n->blob = p;
    n->blob_cap = cap;
    return MN_OK;
}

/* Give back the slack of a full or sealed node: table and blob cut to
 * what they hold, deltas narrowed to the width they need, which the next
 * node starts at (MN_TIME_WIDTH_MAX). A failed shrink leaves the node
 * larger but correct, so errors are ignored. */
static void mn_node_shrink(mn_stream *s, mn_node *n) {
    s->time_width = mn_node_width_needed(n);
    if (n->compressed) return;
    (void)mn_node_retable(s, n, n->count, s->time_width);
    (void)mn_node_resize_blob(s, n, mn_node_raw_bytes(n));
}

/* Compressed blobs. All fields little-endian, written through the
 * accessors so that the blob is its own serialized form:
 *
 *   OFFSET           SIZE         DESCRIPTION
 *   ---------------  -----------  ------------------------------------------
 *                0            4  nchunks (>= 1)
 *        4 + 8 * k            4  chunk k: index of its first message (0 for
 *                                k = 0, increasing)
 *        8 + 8 * k            4  chunk k: end of its zlib stream, counted
 *                                from the start of the zlib area
 *    4 + 8*nchunks          ...  the zlib streams, back to back; chunk k
 *                                inflates to the raw bytes of messages
 *                                first(k) .. first(k+1)-1
 */
static uint32_t mn_chunk_count(const mn_node *n) {
    return mn_get_u32le((const unsigned char *)n->blob);
}

static uint32_t mn_chunk_first_msg(const mn_node *n, uint32_t k) {
    return mn_get_u32le((const unsigned char *)n->blob + MN_CHUNK_COUNT_BYTES +
                        (size_t)k * MN_CHUNK_ENTRY_BYTES);
}

static uint32_t mn_chunk_zend(const mn_node *n, uint32_t k) {
    return mn_get_u32le((const unsigned char *)n->blob + MN_CHUNK_COUNT_BYTES +
                        (size_t)k * MN_CHUNK_ENTRY_BYTES + 4);
}

/* One past the last message of chunk k. */
static uint32_t mn_chunk_end_msg(const mn_node *n, uint32_t k) {
    return k + 1 < mn_chunk_count(n) ? mn_chunk_first_msg(n, k + 1) : n->count;
}

/* The chunk holding message i: the last chunk whose first message <= i. */
static uint32_t mn_chunk_of(const mn_node *n, uint32_t i) {
    uint32_t lo = 0, hi = mn_chunk_count(n); /* answer in [lo, hi) */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mn_chunk_first_msg(n, mid) <= i) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The end (exclusive) of the chunk starting at message i: messages are
 * added while the chunk holds fewer than MN_COMPRESS_CHUNK_BYTES. */
static uint32_t mn_chunk_plan_end(const mn_node *n, uint32_t i) {
    uint32_t from = mn_msg_start(n, i);
    uint32_t j = i + 1;
    while (j < n->count && n->ends[j - 1] - from < MN_COMPRESS_CHUNK_BYTES) j++;
    return j;
}

/* Replace a sealed node's blob by its zlib chunks when that saves at least
 * MN_COMPRESS_MIN_SAVING_PCT. Any failure keeps the raw form. */
static void mn_node_compress(mn_stream *s, mn_node *n) {
    uint32_t raw = mn_node_raw_bytes(n);
    if (raw < MN_COMPRESS_MIN_BYTES) {
        n->zlevel = s->compression; /* tried: not worth it */
        return;
    }
    uint64_t nchunks = 0, bound = 0;
    for (uint32_t i = 0, j; i < n->count; i = j) {
        j = mn_chunk_plan_end(n, i);
        bound += compressBound(n->ends[j - 1] - mn_msg_start(n, i));
        nchunks++;
    }
    uint64_t header = MN_CHUNK_COUNT_BYTES + nchunks * MN_CHUNK_ENTRY_BYTES;
    if (header + bound > UINT32_MAX) return; /* zlib counts in 32 bits */
    unsigned char *out = malloc((size_t)(header + bound));
    if (out == NULL) return;
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit(&zs, s->compression) != Z_OK) {
        free(out);
        return;
    }
    mn_put_u32le(out, (uint32_t)nchunks);
    uint64_t zlen = 0, k = 0;
    int ok = 1;
    for (uint32_t i = 0, j; i < n->count && ok; i = j, k++) {
        j = mn_chunk_plan_end(n, i);
        uint32_t from = mn_msg_start(n, i);
        uint32_t len = n->ends[j - 1] - from;
        uLong chunk_bound = compressBound(len);
        ok = deflateReset(&zs) == Z_OK;
        zs.next_in = (Bytef *)(n->blob + from);
        zs.avail_in = len;
        zs.next_out = out + header + zlen;
        zs.avail_out = (uInt)chunk_bound;
        ok = ok && deflate(&zs, Z_FINISH) == Z_STREAM_END;
        zlen += chunk_bound - zs.avail_out;
        unsigned char *entry = out + MN_CHUNK_COUNT_BYTES + k * MN_CHUNK_ENTRY_BYTES;
        mn_put_u32le(entry, i);
        mn_put_u32le(entry + 4, (uint32_t)zlen);
    }
    deflateEnd(&zs);
    uint64_t total = header + zlen;
    uint64_t max_len = (uint64_t)raw - (uint64_t)raw * MN_COMPRESS_MIN_SAVING_PCT / 100;
    if (ok && total > max_len) n->zlevel = s->compression; /* tried: does not pay */
    char *exact = ok && total <= max_len ? realloc(out, (size_t)total) : NULL;
    if (exact == NULL) {
        free(out);
        return;
    }
    s->memory = s->memory - n->blob_cap + total;
    free(n->blob);
    n->blob = exact;
    n->blob_cap = (uint32_t)total;
    n->compressed = 1;
    n->zlevel = s->compression;
    s->num_compressed++;
}

/* Inflate zlib data into exactly `len` bytes, consuming all of it. */
static int mn_inflate_exact(char *dst, uint32_t len, const unsigned char *src, uint32_t src_len) {
    uLongf out_len = len;
    uLong in_len = src_len;
    Bytef one;
    int zrc = uncompress2(len ? (Bytef *)dst : &one, &out_len, src, &in_len);
    if (zrc == Z_MEM_ERROR) return MN_ERR_NOMEM;
    if (zrc != Z_OK || out_len != len || in_len != src_len) return MN_ERR_CORRUPT;
    return MN_OK;
}

/* Where the raw bytes of chunk k of a compressed node start in its raw
 * blob, and how many there are. */
static uint32_t mn_chunk_raw_start(const mn_node *n, uint32_t k) {
    return mn_msg_start(n, mn_chunk_first_msg(n, k));
}

static uint32_t mn_chunk_raw_len(const mn_node *n, uint32_t k) {
    return mn_msg_start(n, mn_chunk_end_msg(n, k)) - mn_chunk_raw_start(n, k);
}

/* Inflate chunk k of a compressed node into dst (mn_chunk_raw_len bytes). */
static int mn_chunk_inflate(const mn_node *n, uint32_t k, char *dst) {
    uint32_t zfrom = k ? mn_chunk_zend(n, k - 1) : 0;
    const unsigned char *zarea = (const unsigned char *)n->blob + MN_CHUNK_COUNT_BYTES +
                                 (size_t)mn_chunk_count(n) * MN_CHUNK_ENTRY_BYTES;
    return mn_inflate_exact(dst, mn_chunk_raw_len(n, k), zarea + zfrom, mn_chunk_zend(n, k) - zfrom);
}

/* Raw bytes of chunk k of a compressed node, from the cache or inflated
 * into it. NULL with *err set on failure. */
static const char *mn_chunk_raw(mn_stream *s, const mn_node *n, uint32_t k, int *err) {
    if (s->cache == NULL) {
        s->cache = calloc(1, sizeof(mn_cache));
        if (s->cache == NULL) {
            *err = MN_ERR_NOMEM;
            return NULL;
        }
        s->memory += sizeof(mn_cache);
    }
    mn_cache *c = s->cache;
    c->clock++;
    mn_cache_slot *victim = NULL; /* a free slot, else the least recently used */
    for (int i = 0; i < MN_CACHE_SLOTS; i++) {
        mn_cache_slot *slot = &c->slot[i];
        if (slot->node == n && slot->chunk == k) {
            slot->last_use = c->clock;
            return slot->raw;
        }
        if (victim == NULL || (victim->node != NULL && (slot->node == NULL ||
                                                        slot->last_use < victim->last_use)))
            victim = slot;
    }
    uint32_t len = mn_chunk_raw_len(n, k);
    char *raw = malloc(mn_alloc_size(len));
    if (raw == NULL) {
        *err = MN_ERR_NOMEM;
        return NULL;
    }
    int rc = mn_chunk_inflate(n, k, raw);
    if (rc != MN_OK) {
        free(raw);
        *err = rc;
        return NULL;
    }
    if (victim->node != NULL) {
        s->memory -= mn_alloc_size(victim->len);
        free(victim->raw);
    }
    victim->node = n;
    victim->chunk = k;
    victim->raw = raw;
    victim->len = len;
    victim->last_use = c->clock;
    s->memory += mn_alloc_size(len);
    return raw;
}

/* Where the raw bytes of a node's messages are: `raw` holds messages
 * [.., msg_hi) and message i starts at raw + mn_msg_start(i) - base. */
typedef struct mn_cursor {
    const char *raw;
    uint32_t base;
    uint32_t msg_hi;
} mn_cursor;

/* Point the cursor at message i of n (inflating its chunk if needed). */
static int mn_cursor_seek(mn_stream *s, const mn_node *n, uint32_t i, mn_cursor *cur) {
    if (!n->compressed) {
        cur->raw = n->blob;
        cur->base = 0;
        cur->msg_hi = n->count;
        return MN_OK;
    }
    uint32_t k = mn_chunk_of(n, i);
    int err = MN_OK;
    const char *raw = mn_chunk_raw(s, n, k, &err);
    if (raw == NULL) return err;
    cur->raw = raw;
    cur->base = mn_msg_start(n, mn_chunk_first_msg(n, k));
    cur->msg_hi = mn_chunk_end_msg(n, k);
    return MN_OK;
}

/* ------------------------------------------------------------------------
 * Skiplist
 * --------------------------------------------------------------------- */

/* Make the head hold at least `level` forward pointers. */
static int mn_head_reserve(mn_stream *s, uint8_t level) {
    if (level <= s->head_cap) return MN_OK;
    mn_node **p = realloc(s->head, (size_t)level * sizeof(mn_node *));
    if (p == NULL) return MN_ERR_NOMEM;
    for (uint8_t l = s->head_cap; l < level; l++) p[l] = NULL;
    s->memory += (uint64_t)(level - s->head_cap) * sizeof(mn_node *);
    s->head = p;
    s->head_cap = level;
    return MN_OK;
}

/* The last node whose first offset is <= off, or NULL when there is none.
 * Consumers mostly read the newest messages, so the tail and the node
 * before it (via the backward pointer) are tried before the descent. */
static mn_node *mn_seek(const mn_stream *s, uint64_t off) {
    mn_node *tail = s->tail;
    if (tail != NULL && tail->first <= off) return tail;
    if (tail != NULL && tail->prev != NULL && tail->prev->first <= off) return tail->prev;
    mn_node *x = NULL;
    for (int l = (int)s->level - 1; l >= 0; l--) {
        mn_node *next = x ? x->fwd[l] : s->head[l];
        while (next != NULL && next->first <= off) {
            x = next;
            next = x->fwd[l];
        }
    }
    return x;
}

/* For each level, the forward slot that a node appended at the end must be
 * stored in. The head must already hold every level that will be used. */
static void mn_tail_slots(mn_stream *s, mn_node ***slot) {
    mn_node *x = NULL;
    for (int l = (int)s->level - 1; l >= 0; l--) {
        mn_node *next = x ? x->fwd[l] : s->head[l];
        while (next != NULL) {
            x = next;
            next = x->fwd[l];
        }
        slot[l] = x ? &x->fwd[l] : &s->head[l];
    }
    for (int l = s->level; l < s->head_cap; l++) slot[l] = &s->head[l];
}

/* The sealed node `rank` places behind the tail (rank 0 = the newest
 * sealed node), or NULL. O(rank). */
static mn_node *mn_node_at_rank(const mn_stream *s, uint64_t rank) {
    mn_node *x = s->tail ? s->tail->prev : NULL;
    for (; x != NULL && rank > 0; rank--) x = x->prev;
    return x;
}

/* Link node n after the tail; slot comes from mn_tail_slots() and is
 * advanced so that several nodes can be linked in a row. The old tail is
 * now sealed and every sealed node one rank older: the compression
 * boundary moves one node toward the tail (see COMPRESSION). */
static void mn_link_tail(mn_stream *s, mn_node *n, mn_node ***slot) {
    for (int l = 0; l < n->level; l++) {
        *slot[l] = n;
        n->fwd[l] = NULL;
        slot[l] = &n->fwd[l];
    }
    if (n->level > s->level) s->level = n->level;
    n->prev = s->tail;
    s->tail = n;
    s->num_nodes++;
    if (n->compressed) s->num_compressed++;
    if (n->prev == NULL) return;
    if (s->scan != NULL) s->scan_rank++;
    if (s->num_nodes - 1 > s->depth) /* a node has rank depth */
        s->boundary = s->boundary ? s->boundary->fwd[0] : mn_node_at_rank(s, s->depth);
}

/* Unlink and free the first node. */
static void mn_unlink_first(mn_stream *s) {
    mn_node *n = s->head[0];
    /* Nodes older than the boundary or the scan go first: once they go,
     * no sealed node has rank depth, and nothing is left to scan. */
    if (s->boundary == n) s->boundary = NULL;
    if (s->scan == n) s->scan = NULL;
    for (int l = 0; l < n->level; l++) s->head[l] = n->fwd[l];
    if (n->fwd[0] != NULL) n->fwd[0]->prev = NULL;
    if (s->tail == n) s->tail = NULL;
    s->num_nodes--;
    if (n->compressed) s->num_compressed--;
    mn_node_release(s, n);
    while (s->level > 0 && s->head[s->level - 1] == NULL) s->level--;
}

/* ------------------------------------------------------------------------
 * Compression depth
 * --------------------------------------------------------------------- */

/* Give a compressed node its raw blob back. Any failure keeps it
 * compressed. */
static int mn_node_inflate(mn_stream *s, mn_node *n) {
    uint32_t raw = mn_node_raw_bytes(n);
    char *blob = malloc(mn_alloc_size(raw));
    if (blob == NULL) return MN_ERR_NOMEM;
    int rc = MN_OK;
    for (uint32_t k = 0; k < mn_chunk_count(n) && rc == MN_OK; k++)
        rc = mn_chunk_inflate(n, k, blob + mn_chunk_raw_start(n, k));
    if (rc != MN_OK) {
        free(blob);
        return rc;
    }
    mn_cache_forget(s, n);
    s->memory = s->memory - n->blob_cap + mn_alloc_size(raw);
    free(n->blob);
    n->blob = blob;
    n->blob_cap = (uint32_t)mn_alloc_size(raw);
    n->compressed = 0;
    n->zlevel = 0;
    s->num_compressed--;
    return MN_OK;
}

/* Bring a sealed node to the form its rank asks for: zlib at the stream's
 * level (or tried at it) when the stream compresses and rank >= depth,
 * raw otherwise. Returns 1 when that took a compression or an inflate, 0
 * when the node already had its form. Failures keep the node as it is
 * (readable either way). */
static int mn_node_conform(mn_stream *s, mn_node *n, uint64_t rank) {
    if (s->compression == 0 || rank < s->depth) {
        if (!n->compressed) return 0;
        (void)mn_node_inflate(s, n);
        return 1;
    }
    if (n->zlevel == s->compression) return 0;
    if (n->compressed && mn_node_inflate(s, n) != MN_OK) return 1;
    mn_node_compress(s, n);
    return 1;
}

/* Look at nodes again from the newest sealed one to the oldest (after a
 * change of level or depth, a load or a concatenation). */
static void mn_scan_restart(mn_stream *s) {
    s->scan = s->tail ? s->tail->prev : NULL;
    s->scan_rank = 0;
}

/* One bounded step of the scan: conform at most max_nodes nodes, look at
 * most max_nodes * MN_SCAN_VISITS_PER_NODE. */
static void mn_scan_step(mn_stream *s, uint64_t max_nodes) {
    uint64_t visits = max_nodes * MN_SCAN_VISITS_PER_NODE;
    while (s->scan != NULL && max_nodes > 0 && visits > 0) {
        mn_node *x = s->scan;
        max_nodes -= (uint64_t)mn_node_conform(s, x, s->scan_rank);
        visits--;
        s->scan = x->prev;
        s->scan_rank++;
    }
}

/* A node just stopped being the tail: no slack, and one node's worth of
 * compression work -- the node that just reached rank depth, or else one
 * step of a pending scan -- so that compressing is spread over appends,
 * one node per node sealed. */
static void mn_node_seal(mn_stream *s, mn_node *n) {
    mn_node_shrink(s, n);
    /* A node appended whole may come compressed and be the last node until
     * now: conform it from here on, at its rank. */
    if (n->compressed) mn_scan_restart(s);
    if (s->boundary != NULL && mn_node_conform(s, s->boundary, s->depth)) return;
    mn_scan_step(s, 1);
}

int mn_stream_set_compression_depth(mn_stream *s, uint32_t depth) {
    if (s == NULL || depth > MN_MAX_COMPRESSION_DEPTH) return MN_ERR_ARG;
    if (depth == s->depth) return MN_OK;
    s->depth = (uint16_t)depth;
    s->boundary = mn_node_at_rank(s, depth);
    mn_scan_restart(s);
    return MN_OK;
}

uint32_t mn_compression_depth(const mn_stream *s) { return s->depth; }

int mn_compress_step(mn_stream *s, uint32_t max_nodes) {
    if (s == NULL) return MN_ERR_ARG;
    mn_scan_step(s, max_nodes);
    return s->scan != NULL;
}

int mn_compress_pending(const mn_stream *s) { return s->scan != NULL; }

/* ------------------------------------------------------------------------
 * Streams
 * --------------------------------------------------------------------- */

mn_stream *mn_stream_new(uint32_t max_entries, int compression_level) {
    if (max_entries < 1 || max_entries > MN_MAX_MAX_ENTRIES) return NULL;
    if (compression_level < 0 || compression_level > 9) return NULL;
    mn_stream *s = calloc(1, sizeof(mn_stream));
    if (s == NULL) return NULL;
    s->max_entries = max_entries;
    s->compression = (uint8_t)compression_level;
    s->rng = 0x9E3779B97F4A7C15ULL;
    s->spread = UINT64_MAX; /* unknown: see MN_SPREAD_HEADROOM_PCT */
    s->memory = sizeof(mn_stream);
    return s;
}

void mn_stream_free(mn_stream *s) {
    if (s == NULL) return;
    mn_node *n = s->head_cap ? s->head[0] : NULL;
    while (n != NULL) {
        mn_node *next = n->fwd[0];
        free(n->ends);
        free(n->blob);
        free(n);
        n = next;
    }
    if (s->cache != NULL) {
        for (int i = 0; i < MN_CACHE_SLOTS; i++) free(s->cache->slot[i].raw);
        free(s->cache);
    }
    free(s->head);
    free(s->embedder);
    free(s);
}

int mn_stream_set_compression(mn_stream *s, int compression_level) {
    if (compression_level < 0 || compression_level > 9) return MN_ERR_ARG;
    if (compression_level == s->compression) return MN_OK;
    s->compression = (uint8_t)compression_level;
    mn_scan_restart(s);
    return MN_OK;
}

int mn_stream_set_max_entries(mn_stream *s, uint32_t max_entries) {
    if (max_entries < 1 || max_entries > MN_MAX_MAX_ENTRIES) return MN_ERR_ARG;
    /* A smaller value leaves fuller nodes as they are (appends start a new
     * node); a larger one lets the last node grow its table on demand. */
    s->max_entries = max_entries;
    return MN_OK;
}

int mn_stream_set_max_node_bytes(mn_stream *s, uint32_t max_bytes) {
    if (s == NULL) return MN_ERR_ARG;
    /* Like max_entries: a fuller last node keeps its messages, and the next
     * append starts a new node. */
    s->max_node_bytes = max_bytes;
    return MN_OK;
}

uint32_t mn_max_node_bytes(const mn_stream *s) { return s->max_node_bytes; }

uint64_t mn_next_offset(const mn_stream *s) { return s->next; }
uint64_t mn_first_offset(const mn_stream *s) { return s->num_nodes ? s->first : s->next; }
uint64_t mn_length(const mn_stream *s) { return s->length; }
uint64_t mn_num_nodes(const mn_stream *s) { return s->num_nodes; }
uint64_t mn_num_compressed_nodes(const mn_stream *s) { return s->num_compressed; }
uint64_t mn_payload_bytes(const mn_stream *s) { return s->payload; }
uint64_t mn_memory_bytes(const mn_stream *s) { return s->memory; }
uint32_t mn_max_entries(const mn_stream *s) { return s->max_entries; }
int mn_compression_level(const mn_stream *s) { return s->compression; }

int mn_raise_next_offset(mn_stream *s, uint64_t next) {
    if (next < s->next || next > MN_OFFSET_END) return MN_ERR_ARG;
    s->next = next;
    if (s->num_nodes == 0) s->first = next;
    return MN_OK;
}

/* ------------------------------------------------------------------------
 * Append
 * --------------------------------------------------------------------- */

/* Appending is two-phase so that it is atomic. Phase one (mn_append_plan)
 * plans where every message goes and allocates everything: growth of the
 * tail's table and blob, every new node, and head levels. Only growth of
 * capacity happens there, which changes no content, so an allocation
 * failure can return with nothing appended. Phase two (mn_append_commit)
 * copies and links and cannot fail (the sealing it does may fail to shrink
 * or compress, which only costs memory). mn_stream_concat() uses the same
 * two phases for the messages it copies.
 */
typedef struct mn_plan {
    size_t to_tail;  /* messages that go into the tail */
    uint64_t tbytes; /* the tail's raw bytes once they are in */
    mn_node *chain;  /* new nodes, in order, chained through fwd[0] */
} mn_plan;

static void mn_plan_abort(mn_stream *s, mn_plan *p) {
    while (p->chain != NULL) {
        mn_node *next_new = p->chain->fwd[0];
        mn_node_release(s, p->chain);
        p->chain = next_new;
    }
}

/* Bytes to size a node ahead beyond its projected full size, and the
 * projection recorded (see MN_SPREAD_HEADROOM_PCT). */
static uint64_t mn_predict_headroom(mn_stream *s, uint64_t projected) {
    uint64_t fixed = projected * MN_BLOB_PREDICT_HEADROOM_PERMILLE / 1000;
    uint64_t last = s->last_projection;
    s->last_projection = projected;
    if (last == 0) return fixed;
    uint64_t diff = projected > last ? projected - last : last - projected;
    if (s->spread == UINT64_MAX) s->spread = diff;
    else s->spread = s->spread - s->spread / MN_SPREAD_WEIGHT + diff / MN_SPREAD_WEIGHT;
    uint64_t headroom = s->spread * MN_SPREAD_HEADROOM_PCT / 100;
    return headroom < fixed ? headroom : fixed;
}

/* Phase one for n messages of the given lengths (checked by the caller),
 * message k to be appended at times[k], or all at t when times is NULL:
 * times not earlier than any time in the stream, non-decreasing. */
static int mn_append_plan(mn_stream *s, const uint32_t *lens, size_t n, const int64_t *times,
                          int64_t t, mn_plan *p) {
    const uint32_t max = s->max_entries;
    mn_node *tail = s->tail;
    size_t i = 0;
    uint32_t tcount = 0;
    uint64_t tbytes = 0;
    p->chain = NULL;
    if (tail != NULL && mn_node_end(tail) == s->next && !tail->compressed) {
        tcount = tail->count;
        tbytes = mn_node_raw_bytes(tail);
        while (i < n && mn_node_fits(s, tcount, tbytes, lens[i])) {
            tbytes += lens[i];
            tcount++;
            i++;
        }
    }
    p->to_tail = i;
    p->tbytes = tbytes;
    if (i > 0) {
        uint64_t cap = tail->cap;
        if (tcount > tail->cap) {
            /* Only a lone first node, or a last node rebuilt by a load or
             * moved by a concatenation (both exactly sized), has a short
             * table: grow it by half. */
            cap = (uint64_t)tail->cap + tail->cap / 2;
            if (cap < (uint64_t)tail->cap + MN_TABLE_MIN_GROWTH)
                cap = (uint64_t)tail->cap + MN_TABLE_MIN_GROWTH;
            if (cap < tcount) cap = tcount;
            if (cap > max || tcount == max) cap = max;
        }
        /* The deltas must hold the last new message's (see TIME INDEX). */
        int64_t last = times ? times[i - 1] : t;
        uint8_t tw = mn_width_for((uint64_t)(last - tail->first_ms));
        if (tw < tail->tw) tw = tail->tw;
        if (mn_node_retable(s, tail, (uint32_t)cap, tw) != MN_OK) return MN_ERR_NOMEM;
        if (tbytes > tail->blob_cap) {
            uint64_t cap = (uint64_t)tail->blob_cap + tail->blob_cap / 2;
            uint64_t projected = tbytes * max / tcount;
            projected += projected * MN_BLOB_PROJECTION_HEADROOM_PCT / 100;
            if (s->max_node_bytes && projected > s->max_node_bytes) projected = s->max_node_bytes;
            if (cap > projected) cap = projected;
            if (cap < tbytes || tcount == max) cap = tbytes;
            if (cap > MN_NODE_BYTES_LIMIT) cap = tbytes;
            if (mn_node_resize_blob(s, tail, (uint32_t)cap) != MN_OK) return MN_ERR_NOMEM;
        }
    }
    /* The new nodes, chained in order through fwd[0] until phase two links
     * them into the skiplist. */
    mn_node *chain_last = NULL;
    uint8_t top_level = 0;
    int lone = (s->num_nodes == 0);
    /* The node before each new one: the tail as this append leaves it. */
    uint64_t prev_count = tail != NULL ? tcount : 0, prev_bytes = tbytes;
    while (i < n) {
        uint32_t count = 0;
        uint64_t bytes = 0;
        size_t from = i;
        while (i < n && mn_node_fits(s, count, bytes, lens[i])) {
            bytes += lens[i];
            count++;
            i++;
        }
        if (count == 0) { /* cannot happen (see MN_MAX_MESSAGE_BYTES); never loop */
            mn_plan_abort(s, p);
            return MN_ERR_TOOBIG;
        }
        uint32_t cap = (lone && count < max) ? count : max;
        uint64_t blob_cap = bytes;
        if (!lone && count < max && prev_count > 0) {
            /* It will likely fill like the node before it: give it that
             * size now (see MN_BLOB_PREDICT_HEADROOM_PERMILLE). */
            uint64_t predicted = prev_bytes * max / prev_count;
            predicted += mn_predict_headroom(s, predicted);
            if (s->max_node_bytes && predicted > s->max_node_bytes) predicted = s->max_node_bytes;
            if (predicted > blob_cap && mn_node_bytes_bound(max, predicted) <= MN_NODE_BYTES_LIMIT)
                blob_cap = predicted;
        }
        prev_count = count;
        prev_bytes = bytes;
        /* Deltas wide enough for its messages; the last new node becomes
         * the active one and takes later appends, so it starts at the
         * width the stream's nodes have been needing. */
        uint8_t tw = times ? mn_width_for((uint64_t)(times[i - 1] - times[from])) : 0;
        if (i == n && tw < s->time_width) tw = s->time_width;
        uint8_t level = mn_random_level(s);
        mn_node *node = mn_node_alloc(s, level, cap, tw, (uint32_t)blob_cap);
        if (node == NULL) {
            mn_plan_abort(s, p);
            return MN_ERR_NOMEM;
        }
        node->count = count; /* provisional: phase two fills the table */
        if (p->chain == NULL) p->chain = node;
        else chain_last->fwd[0] = node;
        chain_last = node;
        if (level > top_level) top_level = level;
        lone = 0;
    }
    if (top_level > 0 && mn_head_reserve(s, top_level) != MN_OK) {
        mn_plan_abort(s, p);
        return MN_ERR_NOMEM;
    }
    return MN_OK;
}

/* Phase two: n messages back to back in buf (total bytes), message k
 * appended at times[k], or all at t when times is NULL. Advances next,
 * length and payload; the caller sets the clock. */
static void mn_append_commit(mn_stream *s, const char *buf, const uint32_t *lens, size_t n,
                             uint64_t total, const int64_t *times, int64_t t, mn_plan *p) {
    mn_node *tail = s->tail;
    size_t consumed = 0; /* bytes of buf copied so far (buf may be NULL if all empty) */
    if (p->to_tail > 0) {
        uint32_t end = mn_node_raw_bytes(tail);
        size_t bytes = (size_t)(p->tbytes - end);
        if (bytes) memcpy(tail->blob + end, buf, bytes);
        consumed = bytes;
        for (size_t k = 0; k < p->to_tail; k++) {
            end += lens[k];
            tail->ends[tail->count] = end;
            mn_node_stamp(tail, tail->count++, times ? times[k] : t);
        }
        if (tail->count == s->max_entries) mn_node_shrink(s, tail);
    }
    if (p->chain != NULL) {
        mn_node **slot[MN_SKIPLIST_MAX_LEVEL];
        mn_tail_slots(s, slot);
        uint64_t offset = s->next + p->to_tail;
        size_t k = p->to_tail;
        mn_node *node = p->chain;
        while (node != NULL) {
            mn_node *next_new = node->fwd[0];
            uint32_t count = node->count;
            uint32_t end = 0;
            for (uint32_t j = 0; j < count; j++) {
                end += lens[k + j];
                node->ends[j] = end;
                mn_node_stamp(node, j, times ? times[k + j] : t);
            }
            if (end) memcpy(node->blob, buf + consumed, end);
            consumed += end;
            k += count;
            node->first = offset;
            offset += count;
            mn_node *old_tail = s->tail;
            mn_link_tail(s, node, slot);
            if (old_tail != NULL) mn_node_seal(s, old_tail);
            node = next_new;
        }
        p->chain = NULL;
    }
    s->next += n;
    s->length += n;
    s->payload += total;
}

int64_t mn_append(mn_stream *s, const char *buf, const uint32_t *lens, size_t n, int64_t now_ms) {
    if (s == NULL || lens == NULL || n == 0) return MN_ERR_ARG;
    if ((uint64_t)n > MN_OFFSET_END - s->next) return MN_ERR_OVERFLOW;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if ((uint64_t)lens[i] > (uint64_t)MN_MAX_MESSAGE_BYTES) return MN_ERR_TOOBIG;
        total += lens[i];
    }
    if (total > 0 && buf == NULL) return MN_ERR_ARG;
    /* Every message gets the same time: now_ms, or the stream's clock when
     * that is later; it becomes the clock once the append cannot fail. */
    int64_t t = mn_now_ms(now_ms);
    if (t < s->clock) t = s->clock;
    mn_plan plan;
    int rc = mn_append_plan(s, lens, n, NULL, t, &plan);
    if (rc != MN_OK) return rc;
    int64_t first_offset = (int64_t)s->next;
    s->clock = t;
    mn_append_commit(s, buf, lens, n, total, NULL, t, &plan);
    return first_offset;
}

int64_t mn_append_one(mn_stream *s, const char *buf, uint32_t len, int64_t now_ms) {
    return mn_append(s, buf, &len, 1, now_ms);
}

/* ------------------------------------------------------------------------
 * Eviction
 * --------------------------------------------------------------------- */

/* Raw bytes of messages [from, to) of a node (indexes). */
static uint64_t mn_span_bytes(const mn_node *n, uint32_t from, uint32_t to) {
    return (uint64_t)mn_msg_start(n, to) - mn_msg_start(n, from);
}

/* Evict the whole first node (there is one), adding what went to ev. */
static void mn_evict_first_node(mn_stream *s, mn_evicted *ev) {
    mn_node *n = s->head[0];
    uint64_t lo = n->first > s->first ? n->first : s->first;
    uint64_t messages = mn_node_end(n) - lo;
    uint64_t bytes = mn_span_bytes(n, (uint32_t)(lo - n->first), n->count);
    uint64_t memory = s->memory;
    mn_unlink_first(s);
    s->length -= messages;
    s->payload -= bytes;
    s->first = s->num_nodes ? s->head[0]->first : s->next;
    ev->messages += messages;
    ev->bytes += bytes;
    ev->nodes++;
    ev->memory += memory - s->memory;
}

int64_t mn_evict_upto(mn_stream *s, int64_t offset) {
    if (offset < 0) return MN_ERR_ARG;
    uint64_t cut = (uint64_t)offset + 1;
    if (cut > s->next) cut = s->next;
    if (s->num_nodes == 0) {
        s->first = s->next;
        return 0;
    }
    if (cut <= s->first) return 0;
    mn_evicted ev = {0, 0, 0, 0};
    while (s->num_nodes && mn_node_end(s->head[0]) <= cut) mn_evict_first_node(s, &ev);
    if (s->num_nodes) {
        mn_node *n = s->head[0];
        uint64_t lo = s->first; /* n contains first */
        if (cut > lo) {
            ev.messages += cut - lo;
            s->length -= cut - lo;
            s->payload -= mn_span_bytes(n, (uint32_t)(lo - n->first), (uint32_t)(cut - n->first));
            s->first = cut;
        }
    }
    return (int64_t)ev.messages;
}

int64_t mn_evict_keep(mn_stream *s, uint64_t keep) {
    if (keep >= s->next) return 0;
    return mn_evict_upto(s, (int64_t)(s->next - keep - 1));
}

/* ------------------------------------------------------------------------
 * Time index and retention
 * --------------------------------------------------------------------- */

int64_t mn_last_append_ms(const mn_stream *s) { return s->clock; }

/* The index of the first message of n appended at or after unix_ms (count
 * when none is): a bisection of its deltas, which never decrease. */
static uint32_t mn_node_seek_time(const mn_node *n, int64_t unix_ms) {
    if (n->first_ms >= unix_ms) return 0;
    if (n->last_ms < unix_ms) return n->count;
    uint64_t want = (uint64_t)(unix_ms - n->first_ms); /* a delta > 0 */
    const unsigned char *d = mn_node_deltas(n);
    uint32_t lo = 1, hi = n->count - 1; /* the answer is in [lo, hi] */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mn_delta_get(d, n->tw, mid) < want) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

uint64_t mn_seek_time(const mn_stream *s, int64_t unix_ms) {
    if (s->num_nodes == 0) return s->next;
    /* Times never decrease along the list, so the skiplist can descend on
     * last_ms: x ends as the last node whose newest message is older than
     * unix_ms, and the answer lies in the node after it. */
    mn_node *x = NULL;
    for (int l = (int)s->level - 1; l >= 0; l--) {
        mn_node *next = x ? x->fwd[l] : s->head[l];
        while (next != NULL && next->last_ms < unix_ms) {
            x = next;
            next = x->fwd[l];
        }
    }
    const mn_node *n = x ? x->fwd[0] : s->head[0];
    if (n == NULL) return s->next;
    /* An answer among evicted messages: the first readable one is the
     * first at or after unix_ms then (times never decrease). */
    uint64_t off = n->first + mn_node_seek_time(n, unix_ms);
    return off > s->first ? off : s->first;
}

int mn_evict_older_than(mn_stream *s, int64_t cutoff_ms, uint64_t max_nodes, mn_evicted *ev) {
    if (s == NULL || ev == NULL) return MN_ERR_ARG;
    for (; s->num_nodes && s->head[0]->last_ms < cutoff_ms; max_nodes--) {
        if (max_nodes == 0) return 1;
        mn_evict_first_node(s, ev);
    }
    /* The expired messages of the node left first, exactly: evicted the
     * way mn_evict_upto() evicts, the node kept for its newer ones. */
    if (s->num_nodes) {
        const mn_node *n = s->head[0];
        uint64_t cut = n->first + mn_node_seek_time(n, cutoff_ms);
        if (cut > s->first) {
            ev->messages += cut - s->first;
            ev->bytes += mn_span_bytes(n, (uint32_t)(s->first - n->first), (uint32_t)(cut - n->first));
            mn_evict_upto(s, (int64_t)cut - 1);
        }
    }
    return 0;
}

int mn_evict_over_bytes(mn_stream *s, uint64_t max_payload, uint64_t max_nodes, mn_evicted *ev) {
    if (s == NULL || ev == NULL) return MN_ERR_ARG;
    for (; s->payload > max_payload && s->num_nodes > 1; max_nodes--) {
        if (max_nodes == 0) return 1;
        mn_evict_first_node(s, ev);
    }
    return 0;
}

int mn_evict_oldest_node(mn_stream *s, mn_evicted *ev) {
    if (s == NULL || ev == NULL) return MN_ERR_ARG;
    if (s->num_nodes == 0) return 0;
    mn_evict_first_node(s, ev);
    return 1;
}

int64_t mn_oldest_append_ms(const mn_stream *s) {
    if (s->num_nodes == 0) return MN_TIME_NONE;
    const mn_node *n = s->head[0];
    return mn_node_time(n, (uint32_t)(s->first - n->first));
}

uint64_t mn_oldest_node_memory(const mn_stream *s) {
    if (s->num_nodes == 0) return 0;
    const mn_node *n = s->head[0];
    uint64_t bytes = mn_node_memory(n);
    if (s->cache != NULL) {
        for (int i = 0; i < MN_CACHE_SLOTS; i++)
            if (s->cache->slot[i].node == n) bytes += mn_alloc_size(s->cache->slot[i].len);
    }
    return bytes;
}

/* ------------------------------------------------------------------------
 * Concatenation
 * --------------------------------------------------------------------- */

/* Raise every time of n below floor to floor (a node moving to a stream
 * whose clock is later). The deltas only shrink: the width still holds
 * them. */
static void mn_node_raise_times(mn_node *n, int64_t floor) {
    if (n->first_ms >= floor) return;
    unsigned char *d = mn_node_deltas(n);
    if (n->last_ms <= floor) {
        if (n->tw) memset(d, 0, (size_t)n->count * n->tw);
        n->first_ms = n->last_ms = floor;
        return;
    }
    for (uint32_t i = 0; i < n->count; i++) {
        int64_t t = mn_node_time(n, i);
        mn_delta_put(d, n->tw, i, t > floor ? (uint64_t)(t - floor) : 0);
    }
    n->first_ms = floor;
}

/* Messages a concatenation copies rather than moves, gathered back to
 * back with their lengths and times (allocated with malloc: they are
 * scratch, not counted in any stream's memory). */
typedef struct mn_gather {
    char *buf;
    uint32_t *lens;
    int64_t *times;
    size_t n;
    uint64_t bytes;
} mn_gather;

static void mn_gather_free(mn_gather *g) {
    free(g->buf);
    free(g->lens);
    free(g->times);
    memset(g, 0, sizeof *g);
}

/* Gather messages i.. of node `from` and all of the nodes after it up to
 * `stop` (excluded), times raised to at least `floor`. Inflates what is
 * compressed into scratch memory, not into the stream's cache. */
static int mn_gather_messages(const mn_node *from, uint32_t i, const mn_node *stop,
                              int64_t floor, mn_gather *g) {
    memset(g, 0, sizeof *g);
    for (const mn_node *x = from; x != stop; x = x->fwd[0]) {
        uint32_t lo = x == from ? i : 0;
        g->n += x->count - lo;
        g->bytes += mn_span_bytes(x, lo, x->count);
    }
    if (g->bytes > SIZE_MAX) return MN_ERR_TOOBIG;
    g->buf = malloc(g->bytes ? (size_t)g->bytes : 1);
    g->lens = malloc(g->n * sizeof(uint32_t));
    g->times = malloc(g->n * sizeof(int64_t));
    if (g->buf == NULL || g->lens == NULL || g->times == NULL) {
        mn_gather_free(g);
        return MN_ERR_NOMEM;
    }
    size_t m = 0, pos = 0;
    for (const mn_node *x = from; x != stop; x = x->fwd[0]) {
        uint32_t lo = x == from ? i : 0;
        uint32_t start = mn_msg_start(x, lo);
        if (!x->compressed) {
            memcpy(g->buf + pos, x->blob + start, mn_node_raw_bytes(x) - start);
        } else {
            for (uint32_t k = mn_chunk_of(x, lo); k < mn_chunk_count(x); k++) {
                uint32_t len = mn_chunk_raw_len(x, k), at = mn_chunk_raw_start(x, k);
                char *raw = malloc(mn_alloc_size(len));
                int rc = raw == NULL ? MN_ERR_NOMEM : mn_chunk_inflate(x, k, raw);
                if (rc == MN_OK) {
                    uint32_t skip = start > at ? start - at : 0;
                    memcpy(g->buf + pos + (at + skip - start), raw + skip, len - skip);
                }
                free(raw);
                if (rc != MN_OK) {
                    mn_gather_free(g);
                    return rc;
                }
            }
        }
        pos += mn_node_raw_bytes(x) - start;
        for (uint32_t j = lo; j < x->count; j++, m++) {
            g->lens[m] = x->ends[j] - mn_msg_start(x, j);
            int64_t t = mn_node_time(x, j);
            g->times[m] = t > floor ? t : floor;
        }
    }
    return MN_OK;
}

/* Does all of src fit in dst's active node? Then it is copied there
 * rather than leaving dst's active node behind half full. */
static int mn_concat_fits_tail(const mn_stream *dst, const mn_stream *src) {
    const mn_node *tail = dst->tail;
    if (tail == NULL || tail->compressed || mn_node_end(tail) != dst->next) return 0;
    if (src->length > (uint64_t)dst->max_entries - tail->count || tail->count >= dst->max_entries)
        return 0;
    if (dst->max_node_bytes && (uint64_t)mn_node_raw_bytes(tail) + src->payload > dst->max_node_bytes)
        return 0;
    return mn_node_bytes_bound(tail->count + (uint32_t)src->length,
                               (uint64_t)mn_node_raw_bytes(tail) + src->payload) <=
           MN_NODE_BYTES_LIMIT;
}

int64_t mn_stream_concat(mn_stream *dst, mn_stream *src) {
    if (dst == NULL || src == NULL || dst == src) return MN_ERR_ARG;
    const int64_t first_offset = (int64_t)dst->next;
    if (src->num_nodes == 0) return first_offset;
    if (src->length > MN_OFFSET_END - dst->next) return MN_ERR_OVERFLOW;
    const int64_t floor = dst->clock;

    /* Phase one: gather what is copied (all of src when it fits dst's
     * active node, else the readable part of a partially evicted first
     * node), plan its append, make dst's head tall enough for the nodes
     * that move. Nothing visible changes; a failure undoes it all. */
    mn_node *head = src->head[0];
    mn_node *move_from = head;
    mn_gather g;
    memset(&g, 0, sizeof g);
    int rc = MN_OK;
    if (mn_concat_fits_tail(dst, src)) move_from = NULL;
    else if (src->first > head->first) move_from = head->fwd[0];
    if (move_from != head)
        rc = mn_gather_messages(head, (uint32_t)(src->first - head->first), move_from, floor, &g);
    mn_plan plan = {0, 0, NULL};
    if (rc == MN_OK && g.n) rc = mn_append_plan(dst, g.lens, g.n, g.times, 0, &plan);
    uint8_t top = 0;
    for (const mn_node *x = move_from; x != NULL; x = x->fwd[0])
        if (x->level > top) top = x->level;
    if (rc == MN_OK && top && mn_head_reserve(dst, top) != MN_OK) {
        mn_plan_abort(dst, &plan);
        rc = MN_ERR_NOMEM;
    }
    if (rc != MN_OK) {
        mn_gather_free(&g);
        return rc;
    }

    /* Phase two: append the copies, then relink the nodes that move after
     * dst's tail, renumbered, their times raised to dst's clock where
     * older. Then src keeps no node. */
    if (g.n) mn_append_commit(dst, g.buf, g.lens, g.n, g.bytes, g.times, 0, &plan);
    mn_gather_free(&g);
    mn_node *x = head, *next;
    for (; x != move_from; x = next) { /* copied: freed */
        next = x->fwd[0];
        mn_node_release(src, x);
    }
    mn_node **slot[MN_SKIPLIST_MAX_LEVEL];
    mn_tail_slots(dst, slot);
    for (; x != NULL; x = next) {
        next = x->fwd[0];
        mn_cache_forget(src, x);
        uint64_t memory = mn_node_memory(x);
        src->memory -= memory;
        dst->memory += memory;
        mn_node_raise_times(x, floor);
        x->first = dst->next;
        dst->next += x->count;
        dst->length += x->count;
        dst->payload += mn_node_raw_bytes(x);
        mn_node *old_tail = dst->tail;
        mn_link_tail(dst, x, slot);
        if (old_tail != NULL) mn_node_shrink(dst, old_tail);
    }
    if (dst->tail->last_ms > dst->clock) dst->clock = dst->tail->last_ms;
    /* The nodes that moved came with src's compression: conform them (and
     * the rest) gradually, not all in this call. */
    mn_scan_restart(dst);
    for (int l = 0; l < src->head_cap; l++) src->head[l] = NULL;
    src->boundary = src->scan = NULL;
    src->tail = NULL;
    src->level = 0;
    src->num_nodes = src->num_compressed = 0;
    src->length = src->payload = 0;
    src->first = src->next;
    return first_offset;
}

int64_t mn_stream_concat_many(mn_stream *dst, mn_stream **srcs, size_t n, size_t *done) {
    *done = 0;
    if (dst == NULL || (n && srcs == NULL)) return MN_ERR_ARG;
    const int64_t first_offset = (int64_t)dst->next;
    for (size_t i = 0; i < n; i++) {
        int64_t rc = mn_stream_concat(dst, srcs[i]);
        if (rc < 0) return rc;
        *done = i + 1;
    }
    return first_offset;
}

uint64_t mn_length_sum(mn_stream **streams, size_t n) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t length = streams[i]->length;
        if (length > UINT64_MAX - total) return UINT64_MAX; /* saturates */
        total += length;
    }
    return total;
}

/* ------------------------------------------------------------------------
 * Reads
 * --------------------------------------------------------------------- */

/* Walks the offsets [pos, end) as a sequence of runs: either `nulls`
 * offsets that read as null, or messages [from, to) of one node. */
typedef struct mn_range {
    const mn_stream *s;
    uint64_t pos, end;
    const mn_node *node; /* first node that may hold pos */
} mn_range;

typedef struct mn_run {
    const mn_node *node; /* NULL for a run of nulls */
    uint64_t nulls;
    uint32_t from, to;
} mn_run;

static void mn_range_init(mn_range *r, const mn_stream *s, uint64_t start, uint64_t n) {
    r->s = s;
    r->pos = start;
    r->end = start + n;
    uint64_t readable = start > s->first ? start : s->first;
    const mn_node *node = s->num_nodes ? mn_seek(s, readable) : NULL;
    if (node == NULL) node = s->num_nodes ? s->head[0] : NULL;
    else if (mn_node_end(node) <= readable) node = node->fwd[0];
    r->node = node;
}

static int mn_range_next(mn_range *r, mn_run *run) {
    if (r->pos >= r->end) return 0;
    const mn_node *node = r->node;
    /* Offsets below first are evicted, whatever node they were in. */
    uint64_t stop = r->end;
    if (r->pos < r->s->first && r->s->first < stop) stop = r->s->first;
    if (r->pos < r->s->first || node == NULL || r->pos < node->first) {
        if (node != NULL && node->first < stop && r->pos >= r->s->first) stop = node->first;
        run->node = NULL;
        run->nulls = stop - r->pos;
        r->pos = stop;
        return 1;
    }
    uint64_t node_end = mn_node_end(node);
    if (node_end < stop) stop = node_end;
    run->node = node;
    run->nulls = 0;
    run->from = (uint32_t)(r->pos - node->first);
    run->to = (uint32_t)(stop - node->first);
    r->pos = stop;
    if (stop == node_end) r->node = node->fwd[0];
    return 1;
}

/* Digits of v in decimal; comparisons instead of divisions, as this runs
 * twice per message of every read. */
static size_t mn_decimal_len(uint32_t v) {
    if (v < 100000) return v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : 5;
    return v < 1000000 ? 6 : v < 10000000 ? 7 : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10;
}

static char *mn_write_decimal(char *p, uint32_t v, size_t digits) {
    for (size_t i = digits; i > 0; i--) {
        p[i - 1] = (char)('0' + v % 10);
        v /= 10;
    }
    return p + digits;
}

static int mn_check_range(const mn_stream *s, uint64_t start, uint64_t n) {
    if (start > s->next || n > s->next - start) return MN_ERR_ARG;
    return MN_OK;
}

/* Digits of a time (0..MN_TIME_MAX) in decimal. */
static size_t mn_decimal_len64(uint64_t v) {
    size_t digits = 1;
    while (v >= 10) {
        v /= 10;
        digits++;
    }
    return digits;
}

static char *mn_write_decimal64(char *p, uint64_t v, size_t digits) {
    for (size_t i = digits; i > 0; i--) {
        p[i - 1] = (char)('0' + v % 10);
        v /= 10;
    }
    return p + digits;
}

/* The bytes of the RESP of a checked range in a style (see
 * mn_read_resp_capped), nulls of null_len bytes each: from the nodes'
 * message ends and times alone. UINT64_MAX when the sum would wrap around
 * 2^64 (up to 2^63 offsets of a stream may read as null): too big for any
 * buffer. */
static uint64_t mn_resp_bytes(mn_stream *s, uint64_t start, uint64_t n, size_t null_len,
                              int times, int resp3) {
    /* Per message beyond its bulk string: ":" CRLF around the time, and
     * RESP3's pair header. */
    const uint64_t time_extra = times ? 3 + (resp3 ? 4 : 0) : 0;
    mn_range r;
    mn_run run;
    uint64_t size = 0;
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node == NULL) {
            if (run.nulls > (UINT64_MAX - 1 - size) / null_len) return UINT64_MAX;
            size += run.nulls * null_len;
            continue;
        }
        const uint32_t *ends = run.node->ends;
        uint32_t prev = mn_msg_start(run.node, run.from);
        size += ends[run.to - 1] - prev;
        for (uint32_t i = run.from; i < run.to; i++) {
            size += 5 + mn_decimal_len(ends[i] - prev);
            prev = ends[i];
        }
        if (times) {
            size += (uint64_t)(run.to - run.from) * time_extra;
            for (uint32_t i = run.from; i < run.to; i++)
                size += mn_decimal_len64((uint64_t)mn_node_time(run.node, i));
        }
    }
    return size;
}

int mn_read_resp(mn_stream *s, uint64_t start, uint64_t n, int style, mn_buf *out) {
    return mn_read_resp_prefixed(s, start, n, style, NULL, 0, out);
}

int mn_read_resp_prefixed(mn_stream *s, uint64_t start, uint64_t n, int style,
                          const char *prefix, size_t prefix_len, mn_buf *out) {
    return mn_read_resp_capped(s, start, n, style, prefix, prefix_len, UINT64_MAX, NULL, out);
}

/* The RESP of a read, per offset (style = null style | MN_READ_WITH_TIMES):
 *
 *   style                 a message                        an evicted offset
 *   --------------------  -------------------------------  -----------------
 *   RESP2                 $<len>\r\n<bytes>\r\n            $-1\r\n
 *   RESP3                 $<len>\r\n<bytes>\r\n            _\r\n
 *   RESP2 + WITH_TIMES    $<len>\r\n<bytes>\r\n:<ms>\r\n   $-1\r\n$-1\r\n
 *   RESP3 + WITH_TIMES    *2\r\n$<len>\r\n<bytes>\r\n      _\r\n
 *                         :<ms>\r\n
 *
 * As Redis's ZRANGE WITHSCORES: a flat message, time, message, time ...
 * in RESP2 (two elements per offset, two nulls for an evicted one), pairs
 * in RESP3 (one element per offset, a null for an evicted one). */
int mn_read_resp_capped(mn_stream *s, uint64_t start, uint64_t n, int style,
                        const char *prefix, size_t prefix_len, uint64_t max_len,
                        uint64_t *needed, mn_buf *out) {
    if (s == NULL || out == NULL || (prefix == NULL && prefix_len > 0)) return MN_ERR_ARG;
    if ((style & ~(MN_NULL_RESP3 | MN_READ_WITH_TIMES)) != 0) return MN_ERR_ARG;
    int rc = mn_check_range(s, start, n);
    if (rc != MN_OK) return rc;
    const int resp3 = (style & MN_NULL_RESP3) != 0, times = (style & MN_READ_WITH_TIMES) != 0;
    const char *null_text = resp3 ? "_\r\n" : times ? "$-1\r\n$-1\r\n" : "$-1\r\n";
    const size_t null_len = strlen(null_text);

    /* Pass one sizes the reply so the buffer is reserved once. */
    mn_range r;
    mn_run run;
    uint64_t body = mn_resp_bytes(s, start, n, null_len, times, resp3);
    if (body == UINT64_MAX || body > UINT64_MAX - 1 - prefix_len) return MN_ERR_TOOBIG;
    uint64_t size = prefix_len + body;
    if (size > max_len) {
        if (needed != NULL) *needed = size;
        return MN_ERR_CAP;
    }
    if (size > SIZE_MAX) return MN_ERR_TOOBIG;
    if (size == 0) return MN_OK; /* n == 0, no prefix */
    rc = mn_buf_reserve(out, (size_t)size);
    if (rc != MN_OK) return rc;

    /* Pass two copies. */
    size_t old_len = out->len;
    char *p = out->data + out->len;
    if (prefix_len) memcpy(p, prefix, prefix_len);
    p += prefix_len;
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node == NULL) {
            for (uint64_t i = 0; i < run.nulls; i++) {
                memcpy(p, null_text, null_len);
                p += null_len;
            }
            continue;
        }
        const uint32_t *ends = run.node->ends;
        uint32_t prev = mn_msg_start(run.node, run.from);
        mn_cursor cur = {NULL, 0, 0};
        for (uint32_t i = run.from; i < run.to; i++) {
            if (i >= cur.msg_hi && (rc = mn_cursor_seek(s, run.node, i, &cur)) != MN_OK) {
                out->len = old_len;
                return rc;
            }
            uint32_t len = ends[i] - prev;
            if (times && resp3) {
                memcpy(p, "*2\r\n", 4);
                p += 4;
            }
            *p++ = '$';
            p = mn_write_decimal(p, len, mn_decimal_len(len));
            *p++ = '\r';
            *p++ = '\n';
            memcpy(p, cur.raw + (prev - cur.base), len);
            p += len;
            *p++ = '\r';
            *p++ = '\n';
            if (times) {
                uint64_t ms = (uint64_t)mn_node_time(run.node, i);
                *p++ = ':';
                p = mn_write_decimal64(p, ms, mn_decimal_len64(ms));
                *p++ = '\r';
                *p++ = '\n';
            }
            prev = ends[i];
        }
    }
    out->len = (size_t)(p - out->data);
    return MN_OK;
}

int mn_read_times(const mn_stream *s, uint64_t start, uint64_t n, int64_t *times) {
    if (s == NULL || (n > 0 && times == NULL)) return MN_ERR_ARG;
    int rc = mn_check_range(s, start, n);
    if (rc != MN_OK) return rc;
    mn_range r;
    mn_run run;
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node == NULL) {
            for (uint64_t i = 0; i < run.nulls; i++) *times++ = -1;
            continue;
        }
        for (uint32_t i = run.from; i < run.to; i++) *times++ = mn_node_time(run.node, i);
    }
    return MN_OK;
}

uint64_t mn_readable_run(const mn_stream *s, uint64_t offset, uint64_t max, uint64_t *run) {
    *run = 0;
    uint64_t pos = offset > s->first ? offset : s->first;
    if (s->num_nodes == 0 || pos >= s->next) return offset > s->next ? offset : s->next;
    /* The node holding pos, or the first one after it (pos is in a gap). */
    const mn_node *node = mn_seek(s, pos);
    if (node == NULL) node = s->head[0];
    else if (mn_node_end(node) <= pos) node = node->fwd[0];
    if (node == NULL) return s->next; /* only a gap up to next: nothing readable */
    if (pos < node->first) pos = node->first;
    /* Nodes that follow each other without a hole continue the run; walk
     * only as far as max asks, so the cost is that of reading it. */
    uint64_t end = mn_node_end(node);
    while (end - pos < max && node->fwd[0] != NULL && node->fwd[0]->first == end) {
        node = node->fwd[0];
        end = mn_node_end(node);
    }
    *run = end - pos < max ? end - pos : max;
    return pos;
}

/* The messages' bytes in offsets start..start+n-1 (a checked range). */
static uint64_t mn_range_bytes(mn_stream *s, uint64_t start, uint64_t n) {
    mn_range r;
    mn_run run;
    uint64_t size = 0;
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node != NULL) size += mn_span_bytes(run.node, run.from, run.to);
    }
    return size;
}

int mn_read_copy(mn_stream *s, uint64_t start, uint64_t n, mn_buf *out, int64_t *lens) {
    if (s == NULL || out == NULL || (n > 0 && lens == NULL)) return MN_ERR_ARG;
    int rc = mn_check_range(s, start, n);
    if (rc != MN_OK) return rc;
    mn_range r;
    mn_run run;
    uint64_t size = mn_range_bytes(s, start, n);
    if (size > SIZE_MAX) return MN_ERR_TOOBIG;
    rc = mn_buf_reserve(out, (size_t)size);
    if (rc != MN_OK) return rc;
    size_t old_len = out->len;
    int64_t *len_out = lens;
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node == NULL) {
            for (uint64_t i = 0; i < run.nulls; i++) *len_out++ = -1;
            continue;
        }
        /* Copy chunk by chunk (a raw node is one chunk). */
        for (uint32_t i = run.from; i < run.to;) {
            mn_cursor cur;
            if ((rc = mn_cursor_seek(s, run.node, i, &cur)) != MN_OK) {
                out->len = old_len;
                return rc;
            }
            uint32_t stop = cur.msg_hi < run.to ? cur.msg_hi : run.to;
            uint32_t from = mn_msg_start(run.node, i);
            uint32_t bytes = mn_msg_start(run.node, stop) - from;
            if (bytes) memcpy(out->data + out->len, cur.raw + (from - cur.base), bytes);
            out->len += bytes;
            i = stop;
        }
        uint32_t prev = mn_msg_start(run.node, run.from);
        for (uint32_t i = run.from; i < run.to; i++) {
            *len_out++ = (int64_t)(run.node->ends[i] - prev);
            prev = run.node->ends[i];
        }
    }
    return MN_OK;
}

/* Little-endian stores, whatever the host's byte order (PACKED's tables
 * are a wire format). */
static void mn_put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Chunks of MN_PACKED_CHUNK offsets: the lengths and times pass through an
 * int64 table on the stack (8 KB) instead of one allocated for n, so a
 * large read costs no allocation beyond the payload's. */
#define MN_PACKED_CHUNK 1024

int mn_read_packed(mn_stream *s, uint64_t start, uint64_t n, mn_buf *out,
                   unsigned char *lens_le, unsigned char *times_le) {
    if (s == NULL || out == NULL || (n > 0 && lens_le == NULL)) return MN_ERR_ARG;
    int rc = mn_check_range(s, start, n);
    if (rc != MN_OK) return rc;
    size_t old_len = out->len;
    int64_t values[MN_PACKED_CHUNK];
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < MN_PACKED_CHUNK ? n - done : MN_PACKED_CHUNK;
        if ((rc = mn_read_copy(s, start + done, k, out, values)) != MN_OK) {
            out->len = old_len;
            return rc;
        }
        for (uint64_t i = 0; i < k; i++)
            mn_put_le(lens_le + 4 * (done + i), values[i] < 0 ? 0xFFFFFFFFu : (uint64_t)values[i], 4);
        if (times_le != NULL) {
            if ((rc = mn_read_times(s, start + done, k, values)) != MN_OK) {
                out->len = old_len;
                return rc;
            }
            for (uint64_t i = 0; i < k; i++)
                mn_put_le(times_le + 8 * (done + i), (uint64_t)values[i], 8);
        }
        done += k;
    }
    return MN_OK;
}

/* A bulk string's bytes around x bytes of content: $<x>\r\n ... \r\n. */
static uint64_t mn_bulk_bytes(uint64_t x) { return 1 + mn_decimal_len64(x) + 2 + x + 2; }

static char *mn_write_bulk_head(char *p, uint64_t x) {
    *p++ = '$';
    p = mn_write_decimal64(p, x, mn_decimal_len64(x));
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* TREAD ... PACKED's reply, written in one pass into one buffer: the three
 * bulk strings' sizes are known from the nodes' message ends before a
 * byte is copied, so each region is filled where it will stay.
 *
 *   prefix
 *   $<4n>\r\n    n x uint32 LE: a length, 0xFFFFFFFF for null  \r\n
 *   $<bytes>\r\n the messages back to back                      \r\n
 *   $<8n>\r\n    n x int64 LE: an append time, -1 for null      \r\n   (times)
 */
int mn_read_packed_resp(mn_stream *s, uint64_t start, uint64_t n, int times, const char *prefix,
                        size_t prefix_len, uint64_t max_len, uint64_t *needed, mn_buf *out) {
    if (s == NULL || out == NULL || (prefix == NULL && prefix_len > 0)) return MN_ERR_ARG;
    int rc = mn_check_range(s, start, n);
    if (rc != MN_OK) return rc;
    /* Past 2^59 offsets the tables' sizes could wrap: no buffer holds them. */
    if (n > UINT64_MAX / 32) return MN_ERR_TOOBIG;
    mn_range r;
    mn_run run;
    uint64_t payload = mn_range_bytes(s, start, n);
    uint64_t size = prefix_len + mn_bulk_bytes(4 * n) + mn_bulk_bytes(payload) +
                    (times ? mn_bulk_bytes(8 * n) : 0);
    if (needed != NULL) *needed = size;
    if (size > max_len) return MN_ERR_CAP;
    if (size > SIZE_MAX) return MN_ERR_TOOBIG;
    rc = mn_buf_reserve(out, (size_t)size);
    if (rc != MN_OK) return rc;

    char *p = out->data + out->len;
    if (prefix_len) memcpy(p, prefix, prefix_len);
    unsigned char *lens = (unsigned char *)mn_write_bulk_head(p + prefix_len, 4 * n);
    char *data = mn_write_bulk_head((char *)lens + 4 * n + 2, payload);
    unsigned char *stamps = NULL;
    memcpy(lens + 4 * n, "\r\n", 2);
    memcpy(data + payload, "\r\n", 2);
    if (times) {
        stamps = (unsigned char *)mn_write_bulk_head(data + payload + 2, 8 * n);
        memcpy(stamps + 8 * n, "\r\n", 2);
    }
    mn_range_init(&r, s, start, n);
    while (mn_range_next(&r, &run)) {
        if (run.node == NULL) {
            for (uint64_t i = 0; i < run.nulls; i++) {
                memset(lens, 0xFF, 4);
                lens += 4;
                if (stamps) {
                    memset(stamps, 0xFF, 8); /* -1 */
                    stamps += 8;
                }
            }
            continue;
        }
        const uint32_t *ends = run.node->ends;
        uint32_t prev = mn_msg_start(run.node, run.from);
        /* The bytes chunk by chunk (a raw node is one chunk), then the
         * lengths and times from the node's tables. */
        for (uint32_t i = run.from; i < run.to;) {
            mn_cursor cur;
            if ((rc = mn_cursor_seek(s, run.node, i, &cur)) != MN_OK) return rc; /* out unchanged */
            uint32_t stop = cur.msg_hi < run.to ? cur.msg_hi : run.to;
            uint32_t from = mn_msg_start(run.node, i);
            uint32_t bytes = mn_msg_start(run.node, stop) - from;
            if (bytes) memcpy(data, cur.raw + (from - cur.base), bytes);
            data += bytes;
            i = stop;
        }
        for (uint32_t i = run.from; i < run.to; i++) {
            mn_put_le(lens, ends[i] - prev, 4);
            lens += 4;
            prev = ends[i];
            if (stamps) {
                mn_put_le(stamps, (uint64_t)mn_node_time(run.node, i), 8);
                stamps += 8;
            }
        }
    }
    out->len += (size_t)size;
    return MN_OK;
}

/* ------------------------------------------------------------------------
 * Serialization
 * --------------------------------------------------------------------- */

int mn_serialize_header(const mn_stream *s, mn_buf *out) {
    int rc = mn_buf_reserve(out, MN_HEADER_BYTES);
    if (rc != MN_OK) return rc;
    unsigned char *p = (unsigned char *)out->data + out->len;
    memcpy(p, MN_HEADER_MAGIC, 4);
    p[4] = MN_FORMAT_VERSION;
    p[5] = s->compression;
    mn_put_u16le(p + 6, s->depth);
    mn_put_u64le(p + 8, s->next);
    mn_put_u64le(p + 16, mn_first_offset(s));
    mn_put_u64le(p + 24, s->num_nodes);
    mn_put_u32le(p + 32, s->max_entries);
    mn_put_u32le(p + 36, 0);
    mn_put_u64le(p + 40, (uint64_t)s->clock);
    mn_put_u32le(p + 48, mn_crc32(p, 48));
    out->len += MN_HEADER_BYTES;
    return MN_OK;
}

const mn_node *mn_first_node(const mn_stream *s) {
    return s->num_nodes ? s->head[0] : NULL;
}

const mn_node *mn_node_next(const mn_node *node) { return node->fwd[0]; }

void mn_node_get_info(const mn_node *node, mn_node_info *out) {
    out->first = node->first;
    out->count = node->count;
    out->compressed = node->compressed;
    out->zlevel = node->zlevel;
    out->time_width = node->tw;
    out->first_ms = node->first_ms;
    out->last_ms = node->last_ms;
    out->memory = mn_node_memory(node);
}

int mn_node_serialize(const mn_node *node, mn_buf *out) {
    uint32_t raw_len = mn_node_raw_bytes(node);
    uint32_t stored = node->compressed ? node->blob_cap : raw_len;
    uint8_t tw = mn_node_width_needed(node); /* an active node may be wider */
    uint64_t total = mn_node_serialized_bytes(node->count, tw, stored);
    if (total > MN_NODE_BYTES_LIMIT) return MN_ERR_TOOBIG;
    int rc = mn_buf_reserve(out, (size_t)total);
    if (rc != MN_OK) return rc;
    unsigned char *base = (unsigned char *)out->data + out->len;
    memcpy(base, MN_NODE_MAGIC, 4);
    base[4] = MN_FORMAT_VERSION;
    base[5] = node->compressed ? MN_NODE_FLAG_COMPRESSED : 0;
    base[6] = node->zlevel;
    base[7] = tw;
    mn_put_u64le(base + 8, node->first);
    mn_put_u32le(base + 16, node->count);
    mn_put_u32le(base + 20, raw_len);
    mn_put_u32le(base + 24, stored);
    mn_put_u64le(base + 28, (uint64_t)node->first_ms);
    unsigned char *p = base + MN_NODE_FIXED_BYTES;
    for (uint32_t i = 0; i < node->count; i++, p += 4) mn_put_u32le(p, node->ends[i]);
    const unsigned char *d = mn_node_deltas(node);
    for (uint32_t i = 0; i < node->count; i++, p += tw) {
        uint64_t delta = mn_delta_get(d, node->tw, i);
        for (uint8_t b = 0; b < tw; b++) p[b] = (unsigned char)(delta >> (8 * b));
    }
    if (stored) memcpy(p, node->blob, stored);
    p += stored;
    mn_put_u32le(p, mn_crc32(base, (size_t)(p - base)));
    out->len += (size_t)total;
    return MN_OK;
}

/* The fields of a node blob, once mn_parse_node_blob() has checked them. */
typedef struct mn_node_view {
    uint64_t first;
    uint32_t count, raw_len, stored;
    int compressed;
    int version;
    uint8_t zlevel;             /* 0 for version 2 */
    uint8_t tw;                 /* version 4: bytes per time delta */
    int64_t first_ms, last_ms;  /* versions 4 and 3 */
    const unsigned char *table; /* count little-endian uint32 */
    const unsigned char *times; /* version 4: count deltas of tw bytes; version 3:
                                   ceil(count / 64) int64 times; NULL for version 2 */
    const unsigned char *blob;  /* stored bytes */
} mn_node_view;

/* Start of message i in the raw blob, from a checked blob's offset table. */
static uint32_t mn_view_msg_start(const mn_node_view *v, uint32_t i) {
    return i ? mn_get_u32le(v->table + 4 * ((size_t)i - 1)) : 0;
}

/* Delta i of a version 4 blob (little-endian, tw bytes). */
static uint64_t mn_view_delta(const mn_node_view *v, uint32_t i) {
    const unsigned char *p = v->times + (size_t)v->tw * i;
    uint64_t delta = 0;
    for (uint8_t b = 0; b < v->tw; b++) delta |= (uint64_t)p[b] << (8 * b);
    return delta;
}

/* Time k of a version 3 blob's table (message 64k). */
static int64_t mn_view_v3_time(const mn_node_view *v, uint32_t k) {
    return (int64_t)mn_get_u64le(v->times + 8 * (size_t)k);
}

/* The append time of message i of a version 4 or 3 blob: a version 3
 * message takes the time of the next one whose time was kept (see TIME
 * INDEX). */
static int64_t mn_view_time(const mn_node_view *v, uint32_t i) {
    if (v->version != MN_FORMAT_VERSION_V3) return v->first_ms + (int64_t)mn_view_delta(v, i);
    uint32_t k = i / MN_V3_TIME_EVERY;
    if (i % MN_V3_TIME_EVERY == 0) return mn_view_v3_time(v, k);
    return (uint64_t)(k + 1) * MN_V3_TIME_EVERY < v->count ? mn_view_v3_time(v, k + 1) : v->last_ms;
}

/* Check a version 4 node's time deltas: the narrowest width that holds
 * them, message 0 at first_ms, never decreasing, the last one within
 * MN_TIME_MAX; sets last_ms. */
static int mn_check_deltas(mn_node_view *v) {
    if (v->tw != 0 && v->tw != 1 && v->tw != 2 && v->tw != 4 && v->tw != 8) return MN_ERR_CORRUPT;
    if (v->first_ms < 0 || v->first_ms > MN_TIME_MAX) return MN_ERR_CORRUPT;
    uint64_t prev = 0;
    for (uint32_t i = 0; i < v->count; i++) {
        uint64_t delta = mn_view_delta(v, i);
        if (delta < prev || (i == 0 && delta != 0)) return MN_ERR_CORRUPT;
        prev = delta;
    }
    if (prev > (uint64_t)(MN_TIME_MAX - v->first_ms)) return MN_ERR_CORRUPT;
    /* One encoding per node: the narrowest width (so that a blob loaded
     * and saved again is the same bytes). */
    if (v->tw != mn_width_for(prev)) return MN_ERR_CORRUPT;
    v->last_ms = v->first_ms + (int64_t)prev;
    return MN_OK;
}

/* Check a version 3 node's time table: checkpoints in order, the last
 * message not older than the last one, within 0..MN_TIME_MAX. */
static int mn_check_v3_times(mn_node_view *v) {
    int64_t prev = 0;
    for (uint32_t k = 0; (uint64_t)k * MN_V3_TIME_EVERY < v->count; k++) {
        int64_t t = mn_view_v3_time(v, k);
        if (t < prev) return MN_ERR_CORRUPT;
        prev = t;
    }
    if (v->last_ms < prev || v->last_ms > MN_TIME_MAX) return MN_ERR_CORRUPT;
    v->first_ms = mn_view_v3_time(v, 0);
    return MN_OK;
}

/* Check the frame of a version 4, 3 or 2 node blob (layouts in the big
 * comment) and fill v; the blob itself is checked by the caller. */
static int mn_parse_node_frame(const unsigned char *p, size_t len, mn_node_view *v) {
    if (p == NULL || len < MN_NODE_FRAME_BYTES_V2 || len > MN_NODE_BYTES_LIMIT) return MN_ERR_CORRUPT;
    if (memcmp(p, MN_NODE_MAGIC, 4) != 0) return MN_ERR_CORRUPT;
    v->version = p[4];
    int v2 = v->version == MN_FORMAT_VERSION_V2, v3 = v->version == MN_FORMAT_VERSION_V3;
    if (v->version != MN_FORMAT_VERSION && !v3 && !v2) return MN_ERR_CORRUPT;
    size_t frame = v2 ? MN_NODE_FRAME_BYTES_V2 : MN_NODE_FRAME_BYTES;
    size_t fixed = v2 ? MN_NODE_FIXED_BYTES_V2 : MN_NODE_FIXED_BYTES;
    if (len < frame || (p[5] & ~MN_NODE_FLAG_COMPRESSED) != 0) return MN_ERR_CORRUPT;
    v->compressed = (p[5] & MN_NODE_FLAG_COMPRESSED) != 0;
    v->zlevel = v2 ? 0 : p[6];
    v->tw = v2 || v3 ? 0 : p[7];
    if (v2 ? mn_get_u16le(p + 6) != 0 : v3 && p[7] != 0) return MN_ERR_CORRUPT;
    if (v->zlevel > 9 || (v->compressed && !v2 && v->zlevel == 0)) return MN_ERR_CORRUPT;
    v->first = mn_get_u64le(p + 8);
    v->count = mn_get_u32le(p + 16);
    v->raw_len = mn_get_u32le(p + 20);
    v->stored = mn_get_u32le(p + 24);
    v->first_ms = v->last_ms = 0;
    if (v3) v->last_ms = (int64_t)mn_get_u64le(p + 28);
    else if (!v2) v->first_ms = (int64_t)mn_get_u64le(p + 28);
    if (v->count < 1 || v->count > MN_MAX_MAX_ENTRIES) return MN_ERR_CORRUPT;
    if (v->first > MN_OFFSET_END - v->count) return MN_ERR_CORRUPT;
    uint64_t times_bytes = v2 ? 0
                           : v3 ? 8 * (uint64_t)((v->count - 1) / MN_V3_TIME_EVERY + 1)
                                : (uint64_t)v->tw * v->count;
    uint64_t expect = frame + 4 * (uint64_t)v->count + times_bytes + v->stored;
    if (expect != len) return MN_ERR_CORRUPT;
    /* Loaded, the node must fit a current-format blob too, at any width. */
    if (mn_node_bytes_bound(v->count, v->raw_len) > MN_NODE_BYTES_LIMIT) return MN_ERR_CORRUPT;
    if (mn_get_u32le(p + len - 4) != mn_crc32(p, len - 4)) return MN_ERR_CORRUPT;
    v->table = p + fixed;
    v->times = v2 ? NULL : v->table + 4 * (size_t)v->count;
    v->blob = v->table + 4 * (size_t)v->count + times_bytes;
    if (v2) return MN_OK;
    return v3 ? mn_check_v3_times(v) : mn_check_deltas(v);
}

static int mn_parse_node_blob(const char *blob, size_t len, mn_node_view *v) {
    int rc = mn_parse_node_frame((const unsigned char *)blob, len, v);
    if (rc != MN_OK) return rc;
    uint32_t prev = 0;
    for (uint32_t i = 0; i < v->count; i++) {
        uint32_t end = mn_get_u32le(v->table + 4 * (size_t)i);
        if (end < prev) return MN_ERR_CORRUPT;
        prev = end;
    }
    if (prev != v->raw_len) return MN_ERR_CORRUPT;
    if (!v->compressed) return v->stored == v->raw_len ? MN_OK : MN_ERR_CORRUPT;
    /* A compressed blob must be smaller than its raw form (nodes are only
     * compressed when that saves space); its chunk table must cover the
     * messages in order and the zlib area exactly, and every chunk must
     * inflate to exactly the raw bytes of its messages. */
    if (v->stored >= v->raw_len || v->stored < MN_CHUNK_COUNT_BYTES) return MN_ERR_CORRUPT;
    uint32_t nchunks = mn_get_u32le(v->blob);
    if (nchunks == 0 || nchunks > v->count) return MN_ERR_CORRUPT;
    uint64_t header = MN_CHUNK_COUNT_BYTES + (uint64_t)nchunks * MN_CHUNK_ENTRY_BYTES;
    if (header >= v->stored) return MN_ERR_CORRUPT;
    const unsigned char *zarea = v->blob + header;
    uint32_t zarea_len = (uint32_t)(v->stored - header);
    uint32_t largest = 0, prev_zend = 0;
    for (uint32_t k = 0; k < nchunks; k++) {
        const unsigned char *entry = v->blob + MN_CHUNK_COUNT_BYTES + (size_t)k * MN_CHUNK_ENTRY_BYTES;
        uint32_t first = mn_get_u32le(entry), zend = mn_get_u32le(entry + 4);
        uint32_t end_msg = k + 1 < nchunks ? mn_get_u32le(entry + MN_CHUNK_ENTRY_BYTES) : v->count;
        if ((k == 0 && first != 0) || first >= end_msg || end_msg > v->count) return MN_ERR_CORRUPT;
        if (zend <= prev_zend || zend > zarea_len) return MN_ERR_CORRUPT;
        uint32_t len = mn_view_msg_start(v, end_msg) - mn_view_msg_start(v, first);
        if (len > largest) largest = len;
        prev_zend = zend;
    }
    if (prev_zend != zarea_len) return MN_ERR_CORRUPT;
    char *raw = malloc(mn_alloc_size(largest));
    if (raw == NULL) return MN_ERR_NOMEM;
    int rc2 = MN_OK;
    prev_zend = 0;
    for (uint32_t k = 0; k < nchunks && rc2 == MN_OK; k++) {
        const unsigned char *entry = v->blob + MN_CHUNK_COUNT_BYTES + (size_t)k * MN_CHUNK_ENTRY_BYTES;
        uint32_t first = mn_get_u32le(entry), zend = mn_get_u32le(entry + 4);
        uint32_t end_msg = k + 1 < nchunks ? mn_get_u32le(entry + MN_CHUNK_ENTRY_BYTES) : v->count;
        uint32_t len = mn_view_msg_start(v, end_msg) - mn_view_msg_start(v, first);
        rc2 = mn_inflate_exact(raw, len, zarea + prev_zend, zend - prev_zend);
        prev_zend = zend;
    }
    free(raw);
    return rc2;
}

int mn_validate_node_blob(const char *blob, size_t len) {
    mn_node_view v;
    return mn_parse_node_blob(blob, len, &v);
}

mn_stream *mn_load_header(const char *blob, size_t len, int64_t now_ms, int *err) {
    const unsigned char *p = (const unsigned char *)blob;
    int dummy;
    if (err == NULL) err = &dummy;
    *err = MN_ERR_CORRUPT;
    if (p == NULL || len < MN_HEADER_BYTES_V2 || memcmp(p, MN_HEADER_MAGIC, 4) != 0) return NULL;
    int version = p[4];
    int timed = version == MN_FORMAT_VERSION || version == MN_FORMAT_VERSION_V3;
    if (timed) {
        if (len != MN_HEADER_BYTES || mn_get_u32le(p + 48) != mn_crc32(p, 48)) return NULL;
        if (mn_get_u32le(p + 36) != 0) return NULL;
    } else if (version == MN_FORMAT_VERSION_V2) {
        if (len != MN_HEADER_BYTES_V2 || mn_get_u32le(p + 36) != mn_crc32(p, 36)) return NULL;
        if (mn_get_u16le(p + 6) != 0) return NULL;
    } else {
        return NULL;
    }
    int level = p[5];
    unsigned depth = timed ? mn_get_u16le(p + 6) : 0;
    uint64_t next = mn_get_u64le(p + 8);
    uint64_t first = mn_get_u64le(p + 16);
    uint64_t nodes = mn_get_u64le(p + 24);
    uint32_t max_entries = mn_get_u32le(p + 32);
    /* A version 2 stream has no times: its messages count as appended now
     * (see SERIALIZATION). */
    int64_t clock = timed ? (int64_t)mn_get_u64le(p + 40) : mn_now_ms(now_ms);
    if (level > 9 || depth > MN_MAX_COMPRESSION_DEPTH || clock < 0 ||
        clock > MN_TIME_MAX)
        return NULL;
    if (next > MN_OFFSET_END || first > next) return NULL;
    if (max_entries < 1 || max_entries > MN_MAX_MAX_ENTRIES) return NULL;
    if ((nodes == 0) != (first == next)) return NULL;
    mn_stream *s = mn_stream_new(max_entries, level);
    if (s == NULL) {
        *err = MN_ERR_NOMEM;
        return NULL;
    }
    s->next = next;
    s->first = first;
    s->depth = (uint16_t)depth;
    s->clock = clock;
    s->load_expected = nodes;
    s->load_version = (uint8_t)version;
    *err = MN_OK;
    return s;
}

/* A node built from a checked blob, unlinked, with room in the head for its
 * level; times below `floor` are raised to it, and a version 2 blob's
 * messages get the stream's clock. Its deltas have the width they need.
 * NULL when an allocation failed (nothing changed but, possibly, the
 * head's capacity). */
static mn_node *mn_node_from_view(mn_stream *s, const mn_node_view *v, int64_t floor) {
    int timed = v->times != NULL;
    int64_t first_ms = timed ? mn_view_time(v, 0) : s->clock;
    int64_t last_ms = timed ? v->last_ms : s->clock;
    if (first_ms < floor) first_ms = floor;
    if (last_ms < floor) last_ms = floor;
    uint8_t level = mn_random_level(s);
    if (mn_head_reserve(s, level) != MN_OK) return NULL;
    mn_node *n = mn_node_alloc(s, level, v->count, mn_width_for((uint64_t)(last_ms - first_ms)),
                               v->stored);
    if (n == NULL) return NULL;
    n->first = v->first;
    n->count = v->count;
    n->compressed = (uint8_t)v->compressed;
    /* A version 2 blob does not say which level compressed it. */
    if (v->compressed && v->zlevel == 0) n->zlevel = s->compression ? s->compression : MN_V2_ZLEVEL;
    else n->zlevel = v->zlevel;
    for (uint32_t i = 0; i < v->count; i++) n->ends[i] = mn_get_u32le(v->table + 4 * (size_t)i);
    n->first_ms = first_ms;
    unsigned char *d = mn_node_deltas(n);
    for (uint32_t i = 0; timed && n->tw && i < v->count; i++) {
        int64_t t = mn_view_time(v, i);
        mn_delta_put(d, n->tw, i, t > first_ms ? (uint64_t)(t - first_ms) : 0);
    }
    n->last_ms = last_ms;
    if (v->stored) memcpy(n->blob, v->blob, v->stored);
    return n;
}

int mn_load_node(mn_stream *s, const char *blob, size_t len) {
    mn_node_view v;
    int rc = mn_parse_node_blob(blob, len, &v);
    if (rc != MN_OK) return rc;
    if (s->num_nodes >= s->load_expected || v.version != s->load_version) return MN_ERR_CORRUPT;
    /* v.count is bounded by MN_MAX_MAX_ENTRIES already: a node may hold more
     * than the stream's current max_entries if that was lowered later. */
    uint64_t end = v.first + v.count;
    if (end > s->next || end <= s->first) return MN_ERR_CORRUPT;
    if (s->tail != NULL) {
        if (v.first < mn_node_end(s->tail)) return MN_ERR_CORRUPT;
    } else if (v.first > s->first) {
        return MN_ERR_CORRUPT; /* the first node must hold the first offset */
    }
    if (v.times != NULL) {
        /* Times continue the previous node's and stop at the stream's clock. */
        int64_t after = s->tail != NULL ? s->tail->last_ms : 0;
        if (v.first_ms < after || v.last_ms > s->clock) return MN_ERR_CORRUPT;
    }
    mn_node *n = mn_node_from_view(s, &v, 0);
    if (n == NULL) return MN_ERR_NOMEM;
    mn_node **slot[MN_SKIPLIST_MAX_LEVEL];
    mn_tail_slots(s, slot);
    mn_link_tail(s, n, slot);
    uint64_t lo = v.first > s->first ? v.first : s->first;
    s->length += end - lo;
    s->payload += mn_span_bytes(n, (uint32_t)(lo - v.first), v.count);
    return MN_OK;
}

int mn_load_finish(mn_stream *s) {
    if (s->num_nodes != s->load_expected) return MN_ERR_CORRUPT;
    s->load_expected = 0;
    /* The nodes are as they were saved, under the settings of then. */
    mn_scan_restart(s);
    return MN_OK;
}

int mn_append_node_blob(mn_stream *s, const char *blob, size_t len) {
    if (s == NULL || s->load_expected) return MN_ERR_ARG;
    mn_node_view v;
    int rc = mn_parse_node_blob(blob, len, &v);
    if (rc != MN_OK) return rc;
    if (v.times == NULL) return MN_ERR_CORRUPT; /* version 2: no times to keep */
    if (v.first < s->next) return MN_ERR_ARG; /* v.first + count <= 2^63: parsed */
    mn_node *n = mn_node_from_view(s, &v, s->clock);
    if (n == NULL) return MN_ERR_NOMEM;
    /* Linked like a node a concatenation moves: the old active node gives
     * back its slack (no compression work now: the scan below conforms
     * every node at the rank it has once the caller is done appending). */
    mn_node *old_tail = s->tail;
    mn_node **slot[MN_SKIPLIST_MAX_LEVEL];
    mn_tail_slots(s, slot);
    mn_link_tail(s, n, slot);
    if (old_tail != NULL) mn_node_shrink(s, old_tail);
    if (s->num_nodes == 1) s->first = v.first;
    s->next = v.first + v.count;
    s->length += v.count;
    s->payload += v.raw_len;
    if (n->last_ms > s->clock) s->clock = n->last_ms;
    mn_scan_restart(s);
    return MN_OK;
}
