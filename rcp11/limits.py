"""Every limit of the server, in one place, each with its reason.

A limit is a bound a client, a file or another module can run into: the
largest offset, the integer range, how big a request may be, how much
output a client may leave unread, how long one client runs before others
get their turn, how far ahead the disk is reserved. Tuning that only shapes
how one module does its own I/O (the size of one os.write, a retry delay)
stays beside the code it tunes.

The offset ceiling is the C core's (src/macronode.c, MN_MAX_OFFSET): it is
imported, never written again here.
"""

from __future__ import annotations

from rcp11.storage import MAX_OFFSET

# --- offsets and integers ---------------------------------------------------

# The largest message offset, 2^63-1 (the C core's). A stream that wrote it
# has next offset MAX_OFFSET + 1 = 2^63, which no RESP integer holds: replies
# show the ceiling instead, and a group key may hold 2^63 (past the last
# possible message), written by the server itself.
NEXT_OFFSET_CEILING = MAX_OFFSET + 1
# Redis's long long: what INCR, TTLs and every integer argument fit in.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Redis's int: directives such as maxclients and timeout.
INT_MAX = 2**31 - 1

assert MAX_OFFSET == INT64_MAX, "offsets are RESP integers: the core's ceiling is 2^63-1"

# --- requests (rcp11/resp/; Redis's networking.c values) ------------------

# An inline command, or a count line, longer than this without its newline
# is refused instead of buffered forever.
INLINE_MAX_SIZE = 64 * 1024
# proto-max-bulk-len and client-query-buffer-limit defaults, and the largest
# argument count of one request.
DEFAULT_MAX_BULK_LEN = 512 * 1024 * 1024
DEFAULT_QUERY_BUFFER_LIMIT = 1024 * 1024 * 1024
DEFAULT_MAX_MULTIBULK_LEN = INT_MAX
# Before AUTH, Redis 7 refuses big requests so that an unauthenticated peer
# cannot make the server allocate much.
UNAUTHENTICATED_MAX_MULTIBULK_LEN = 10
UNAUTHENTICATED_MAX_BULK_LEN = 16384
# Bytes parsed per call at most: a 256 KB read of tiny pipelined commands is
# thousands of them, and the server runs what one call returns before it
# lets other clients have their turn.
PARSE_SPAN = 32 * 1024

# --- output and fairness (rcp11/server/, rcp11/commands/pipeline.py) --------

# asyncio buffers writes without bound; past this much unsent output in the
# transport the connection stops reading requests (pause_writing) until it
# drains back to it (resume_writing). One mark for both, so that a drain is
# always signalled once the buffer was over it.
TRANSPORT_WATER = 1024 * 1024
# Without a hard output limit, a client whose pending output (queued replies
# plus the transport's buffer) passes this stops running commands until the
# transport drains to TRANSPORT_WATER: one reply beyond it at most, so memory
# stays bounded whatever the client pipelines.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024
# A client runs commands for at most this long before other clients get a
# turn (Redis reads 16 KB per client per event-loop iteration; one read here
# can hold thousands of pipelined commands).
TURN_SECONDS = 0.002
# Waking blocked readers (thousands served by one write) goes on for at
# most this long before other clients get a turn; the rest are served in
# the next event-loop iterations, in the order they blocked.
SERVE_SECONDS = 0.005
# The clock is read every this many commands (or after a run), so a short
# pipeline always runs in one go.
COMMANDS_BETWEEN_CLOCKS = 64
# Error codes INFO errorstats counts apart (Redis's ERROR_STATS_NUMBER):
# past it the table stops growing until CONFIG RESETSTAT.
ERROR_STATS_KINDS = 128
# glibc keeps freed memory for reuse (a server whose keys were all deleted
# stayed at 405 MB RSS): once used_memory has stayed this far below its
# level at the last trim ...
TRIM_AFTER_FREED = 16 * 1024 * 1024
# ... for this long, the cron gives it back with malloc_trim(0). Memory a
# workload frees and soon needs again (a stream deleted and written anew,
# a FLUSHALL before a reload) is reused instead: given back at once, every
# page of it came back through a page fault (TWRITE ENTRIES 100 after a
# DEL: 9.3-10.3 us of server CPU per request against 8.0-9.3 reusing it).
# jemalloc's dirty pages decay over 10 s, which redis-server gets.
TRIM_DECAY_SECONDS = 5.0
# Replies to pipelined reads are buffers of hundreds of KB (32 x TREAD 100
# of 100-byte messages: 340 KB), made and freed for every batch. glibc
# mmap()s each buffer over its threshold (128 KB until it adapts) and trims
# the heap's top once that much is free, so every reply was written into
# fresh pages: 2.5 page faults per TREAD, twice redis-server's kernel time
# per request (bench/redis_suite.py's kernel column). Buffers below this
# come from the heap and are reused ...
MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
# ... and the heap's top is never given back by free() itself (glibc trims
# at once past its threshold): the cron's trim above decides when
# (mallopt takes an int: 1 GiB) ...
MALLOC_TRIM_THRESHOLD = 1024 * 1024 * 1024
# ... where it can tell unused memory from used (glibc 2.33+ and /proc);
# elsewhere glibc trims the top past this much free (50 clients' pipelines
# in flight reach tens of MB).
MALLOC_TRIM_THRESHOLD_UNMEASURED = 64 * 1024 * 1024
# Descriptors the server needs besides client sockets: listeners, log, AOF,
# snapshot files, the fsync thread's duplicate (Redis reserves 32 too).
RESERVED_FDS = 32

# --- the AOF's disk reservation and the C lane ------------------------------

# Disk space kept preallocated ahead of the AOF's end, largest slice that
# fits first; a write command is refused (MISCONF) when less than the margin
# is left, so a full disk shows before a command runs, not after.
AOF_SPACE_SLICES = (8 << 20, 1 << 20, 256 << 10)
AOF_SPACE_MARGIN = 128 << 10
# Requests the C lane (src/lane.c) runs per read at most before the rest
# goes to run_pipeline(), which reads the clock between turns: a lane
# request of a small message costs well under a microsecond, so this keeps
# a turn to a few milliseconds.
LANE_MAX_COMMANDS = 4096
# Replies one lane run builds at most, the C socket loop's runs of one
# poll before it leaves the connections not read yet for the next poll
# (src/netloop.c), and run_pipeline() between two looks at the clock. A run is not cut by the clock, so under an output limit far
# above this (`normal 256mb 0 0`) one 64 KB read of TREADs of 44 KB built
# 70 MB (50-200 ms) before any other client was answered. The same as
# OUTPUT_HIGH_WATER, so that with no output limit (a run already stops
# there) nothing changes.
LANE_RUN_REPLY_BYTES = OUTPUT_HIGH_WATER
# The start of a request split across reads, at most this long, is read by
# the lane again with the next read (one copy of it and of the read): a
# pipeline streamed in big reads keeps the lane. A request still arriving
# past this (a big value) is the parser's alone, or every read would copy it.
LANE_MAX_CARRY = 64 << 10

# --- offset reservations (rcp11/persistence/reservations.py) ----------------

# Reservation steps: small for slow streams (a crash leaves a short gap),
# growing to amortize fsyncs on hot streams.
RESERVATION_MIN_STEP = 1024
RESERVATION_MAX_STEP = 1 << 22
# How far the marks go up when the offsets file's last batch is cut short.
# One reservation moves a mark by at most 3 x the entries of one command plus
# RESERVATION_MAX_STEP; a command fits in client-query-buffer-limit (1 GB at
# most by default, >= 6 bytes per entry), so 2^30 covers any lost batch.
TORN_BATCH_MARGIN = 1 << 30

__all__ = [
    "AOF_SPACE_MARGIN",
    "AOF_SPACE_SLICES",
    "COMMANDS_BETWEEN_CLOCKS",
    "DEFAULT_MAX_BULK_LEN",
    "DEFAULT_MAX_MULTIBULK_LEN",
    "DEFAULT_QUERY_BUFFER_LIMIT",
    "ERROR_STATS_KINDS",
    "INLINE_MAX_SIZE",
    "INT64_MAX",
    "INT64_MIN",
    "LANE_MAX_CARRY",
    "LANE_MAX_COMMANDS",
    "LANE_RUN_REPLY_BYTES",
    "INT_MAX",
    "MAX_OFFSET",
    "NEXT_OFFSET_CEILING",
    "OUTPUT_HIGH_WATER",
    "PARSE_SPAN",
    "RESERVATION_MAX_STEP",
    "RESERVATION_MIN_STEP",
    "RESERVED_FDS",
    "SERVE_SECONDS",
    "TORN_BATCH_MARGIN",
    "TRANSPORT_WATER",
    "TURN_SECONDS",
    "UNAUTHENTICATED_MAX_BULK_LEN",
    "UNAUTHENTICATED_MAX_MULTIBULK_LEN",
]
