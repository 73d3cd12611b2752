"""One RCP 11 stream over the C storage core (src/macronode.c):
:class:`Stream`. C return codes become the exceptions of
rcp11/storage/errors.py; C memory is owned through ``ffi.gc``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rcp11.storage.binding import (
    DEFAULT_MAX_ENTRIES,
    INT64_MAX,
    MAX_MAX_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_OFFSET,
    NOW,
    UINT64_MAX,
    clamp_ms,
    ffi,
    lib,
)
from rcp11.storage.buffers import release_scratch, scratch_buffer, serialized
from rcp11.storage.errors import (
    CorruptDataError,
    InvalidArgumentError,
    MessageTooBigError,
    StorageMemoryError,
    check,
    check_depth,
    check_level,
    error,
    max_nodes_arg,
    range_error,
)
from rcp11.storage.records import MUTATIONS, Evicted, NodeInfo

if TYPE_CHECKING:  # numpy is imported where it is used: not at server start
    import numpy as np


# Message lengths go to mn_append() as a uint32 array.array through
# ffi.from_buffer: for 100 messages that is ~4 us cheaper than letting cffi
# convert a list of ints, or than a numpy array.
_LENS_TYPECODE = "I"
if array(_LENS_TYPECODE).itemsize != 4:  # pragma: no cover - exotic ABI only
    _LENS_TYPECODE = "L" if array("L").itemsize == 4 else ""
    if not _LENS_TYPECODE:
        raise ImportError("no 32-bit unsigned array.array typecode on this platform")


# read_resp_capped(): no cap, and where the core says how big a refused reply was.
_NO_CAP = 2**64 - 1
_needed = ffi.new("uint64_t *")


def _evicted(ev: Any, rc: int) -> Evicted:
    check(rc)
    return Evicted(ev.messages, ev.bytes, ev.nodes, ev.memory, rc == 1)


def _new_stream_handle(ptr: object) -> object:
    if ptr == ffi.NULL:
        raise StorageMemoryError("out of memory", lib.MN_ERR_NOMEM)
    return ffi.gc(ptr, lib.mn_stream_free)


def total_length(streams: Sequence[Stream]) -> int:
    """The readable messages of all the streams, in one C call."""
    if not streams:
        return 0
    handles = ffi.new("mn_stream *[]", [stream._s for stream in streams])
    return lib.mn_length_sum(handles, len(streams))


class Stream:
    """One RCP 11 stream: append-only messages addressed by logical offset.

    Not thread-safe: cffi runs the C calls without the GIL, so one thread
    (the server's event loop) must own a stream. A forked child may read
    its copy freely.
    """

    __slots__ = ("_next", "_s", "_version")

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        compression_level: int = 0,
        compression_depth: int = 0,
    ) -> None:
        if not 1 <= max_entries <= MAX_MAX_ENTRIES:
            raise InvalidArgumentError(
                f"max_entries must be between 1 and {MAX_MAX_ENTRIES}", lib.MN_ERR_ARG
            )
        check_level(compression_level)
        check_depth(compression_depth)
        self._s = _new_stream_handle(lib.mn_stream_new(max_entries, compression_level))
        lib.mn_stream_set_compression_depth(self._s, compression_depth)
        # Bumped by every mutation so that dump() can notice a concurrent change.
        self._version = 0
        # mn_next_offset() mirrored here: TWRITE and TREAD read it on every
        # call and a cffi call costs ~250 ns. Only append(), append_joined(),
        # raise_next_offset() and load() change it.
        self._next = 0

    # -- counters -------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def first_offset(self) -> int:
        return lib.mn_first_offset(self._s)

    @property
    def last_offset(self) -> int:
        return self._next - 1

    @property
    def length(self) -> int:
        return lib.mn_length(self._s)

    @property
    def num_nodes(self) -> int:
        return lib.mn_num_nodes(self._s)

    @property
    def num_compressed_nodes(self) -> int:
        return lib.mn_num_compressed_nodes(self._s)

    @property
    def payload_bytes(self) -> int:
        return lib.mn_payload_bytes(self._s)

    @property
    def memory_bytes(self) -> int:
        return lib.mn_memory_bytes(self._s)

    @property
    def max_entries(self) -> int:
        return lib.mn_max_entries(self._s)

    @property
    def max_node_bytes(self) -> int:
        """Cap on the message bytes of a node (0: none); see set_max_node_bytes."""
        return lib.mn_max_node_bytes(self._s)

    @property
    def compression_level(self) -> int:
        return lib.mn_compression_level(self._s)

    @property
    def compression_depth(self) -> int:
        return lib.mn_compression_depth(self._s)

    @property
    def compress_pending(self) -> bool:
        """A change of compression level or depth (or a load, a concat) is
        still being applied to existing nodes (see compress_step)."""
        return bool(lib.mn_compress_pending(self._s))

    @property
    def last_append_ms(self) -> int:
        """The stream's clock: the time its newest message ever got (0 before any)."""
        return lib.mn_last_append_ms(self._s)

    @property
    def oldest_append_ms(self) -> int | None:
        """Append time of the oldest readable message; None when the stream
        holds no message."""
        ms = lib.mn_oldest_append_ms(self._s)
        return None if ms == lib.MN_TIME_NONE else ms

    @property
    def oldest_node_memory(self) -> int:
        """Bytes that evict_oldest_node() would give back (0 when empty)."""
        return lib.mn_oldest_node_memory(self._s)

    def __len__(self) -> int:
        return lib.mn_length(self._s)

    def __repr__(self) -> str:
        return (
            f"<Stream first={self.first_offset} next={self.next_offset} length={self.length} "
            f"nodes={self.num_nodes} compressed={self.num_compressed_nodes} "
            f"memory={self.memory_bytes}>"
        )

    # -- writes ---------------------------------------------------------

    def append(self, entries: Sequence[bytes], now_ms: int | None = None) -> int:
        """Append entries atomically in one C call; return the first one's offset.

        now_ms: their append time (unix ms; None or negative: the wall clock,
        read by the core). A time before the stream's last_append_ms counts as
        last_append_ms.
        """
        if now_ms is None:
            ms = NOW
        elif 0 <= now_ms <= INT64_MAX:
            ms = now_ms
        else:
            ms = NOW if now_ms < 0 else INT64_MAX
        n = len(entries)
        if n == 1:
            data = entries[0]
            if type(data) is not bytes:
                data = bytes(data)
            size = len(data)
            if size > MAX_MESSAGE_BYTES:
                raise MessageTooBigError("message too big", lib.MN_ERR_TOOBIG)
            first = lib.mn_append_one(self._s, data, size, ms)
        elif n == 0:
            raise InvalidArgumentError("nothing to append", lib.MN_ERR_ARG)
        else:
            try:
                lens = array(_LENS_TYPECODE, map(len, entries))
            except OverflowError:
                raise MessageTooBigError("message too big", lib.MN_ERR_TOOBIG) from None
            # mn_append() rejects lengths between MAX_MESSAGE_BYTES and 2^32-1.
            first = lib.mn_append(
                self._s, b"".join(entries), ffi.from_buffer("uint32_t[]", lens), n, ms
            )
        self._version += 1
        MUTATIONS.ticks += 1
        if first < 0:
            raise error(first)
        self._next = first + n
        return first

    def append_joined(
        self, data: bytes, lens: Sequence[int] | np.ndarray, now_ms: int | None = None
    ) -> int:
        """Append messages stored back to back in data; lens[i] is message i's length
        (now_ms as for append())."""
        import numpy as np  # the bulk loaders' call (bench, tests): the server never makes it

        sizes = np.asarray(lens, dtype=np.int64)
        if sizes.ndim != 1 or sizes.size == 0:
            raise InvalidArgumentError("lens must be a non-empty 1-D sequence", lib.MN_ERR_ARG)
        if int(sizes.sum()) != len(data):
            raise InvalidArgumentError("lens do not add up to len(data)", lib.MN_ERR_ARG)
        ms = NOW if now_ms is None else clamp_ms(now_ms)
        if sizes.min() < 0:
            raise InvalidArgumentError("negative message length", lib.MN_ERR_ARG)
        if sizes.max() > MAX_MESSAGE_BYTES:
            raise MessageTooBigError("message too big", lib.MN_ERR_TOOBIG)
        lens32 = np.ascontiguousarray(sizes, dtype=np.uint32)
        lens_ptr = ffi.from_buffer("uint32_t[]", lens32)
        first = lib.mn_append(self._s, ffi.from_buffer(data), lens_ptr, lens32.size, ms)
        self._version += 1
        MUTATIONS.ticks += 1
        if first < 0:
            raise error(first)
        self._next = first + lens32.size
        return first

    def evict_upto(self, offset: int) -> int:
        """Evict every message with offset <= offset; return how many were evicted."""
        if offset < 0:
            raise InvalidArgumentError("offset must be >= 0", lib.MN_ERR_ARG)
        offset = min(offset, MAX_OFFSET)
        self._version += 1
        MUTATIONS.ticks += 1
        return check(lib.mn_evict_upto(self._s, offset))

    def evict_keep(self, keep: int) -> int:
        """Keep the newest `keep` offsets, evict the rest; return how many were evicted."""
        if keep < 0:
            raise InvalidArgumentError("keep must be >= 0", lib.MN_ERR_ARG)
        self._version += 1
        MUTATIONS.ticks += 1
        return check(lib.mn_evict_keep(self._s, min(keep, 2**64 - 1)))

    def raise_next_offset(self, next_offset: int) -> None:
        """Skip offsets up to next_offset (they read as null forever)."""
        if not self.next_offset <= next_offset <= MAX_OFFSET + 1:
            raise InvalidArgumentError(
                f"next offset must be between {self.next_offset} and 2^63", lib.MN_ERR_ARG
            )
        self._version += 1
        MUTATIONS.ticks += 1
        check(lib.mn_raise_next_offset(self._s, next_offset))
        self._next = next_offset

    def concat(self, src: Stream) -> int:
        """Append every readable message of src (in order, contiguous offsets)
        atomically; src is left empty (its next offset kept). Whole nodes
        move instead of being copied. Returns the first appended offset
        (next_offset when src held none)."""
        if src is self:
            raise InvalidArgumentError("cannot concatenate a stream to itself", lib.MN_ERR_ARG)
        return self.concat_many((src,))

    def concat_many(self, sources: Sequence[Stream]) -> int:
        """concat() of each source in turn, in one C call (TCONCAT may name
        a hundred thousand). Returns the first appended offset. On an error
        (raised) the sources before the one that failed stay appended."""
        self._version += 1
        for src in sources:
            src._version += 1
        if not sources:
            return self._next
        done = ffi.new("size_t *")
        handles = ffi.new("mn_stream *[]", [src._s for src in sources])
        try:
            return check(lib.mn_stream_concat_many(self._s, handles, len(sources), done))
        finally:
            self._next = lib.mn_next_offset(self._s)

    # -- time index and retention ----------------------------------------

    def seek_time(self, unix_ms: int) -> int:
        """Offset of the first readable message appended at or after unix_ms
        (next_offset if none). Exact (but among messages loaded from a
        format-3 dump: never later, at most 63 messages earlier)."""
        return lib.mn_seek_time(self._s, clamp_ms(unix_ms))

    def evict_older_than(self, cutoff_ms: int, max_nodes: int | None = None) -> Evicted:
        """Evict every message appended before cutoff_ms: whole nodes
        (oldest first, at most max_nodes freed; the active node too once
        all its messages are older), then the older messages of the first
        node left."""
        ev = ffi.new("mn_evicted *")
        self._version += 1
        rc = lib.mn_evict_older_than(self._s, clamp_ms(cutoff_ms), max_nodes_arg(max_nodes), ev)
        return _evicted(ev, rc)

    def evict_over_bytes(self, max_payload: int, max_nodes: int | None = None) -> Evicted:
        """Evict whole oldest nodes (at most max_nodes) while the payload
        exceeds max_payload bytes, never the active node."""
        if max_payload < 0:
            raise InvalidArgumentError("max_payload must be >= 0", lib.MN_ERR_ARG)
        ev = ffi.new("mn_evicted *")
        self._version += 1
        rc = lib.mn_evict_over_bytes(
            self._s, min(max_payload, UINT64_MAX), max_nodes_arg(max_nodes), ev
        )
        return _evicted(ev, rc)

    def evict_oldest_node(self) -> Evicted:
        """Evict the oldest node, the active one included (nodes == 0: empty)."""
        ev = ffi.new("mn_evicted *")
        self._version += 1
        check(lib.mn_evict_oldest_node(self._s, ev))
        return _evicted(ev, 0)

    def nodes(self) -> list[NodeInfo]:
        """Every node, first to last."""
        info = ffi.new("mn_node_info *")
        out = []
        node = lib.mn_first_node(self._s)
        while node != ffi.NULL:
            lib.mn_node_get_info(node, info)
            out.append(
                NodeInfo(
                    info.first,
                    info.count,
                    bool(info.compressed),
                    info.zlevel,
                    info.first_ms,
                    info.last_ms,
                    info.memory,
                    info.time_width,
                )
            )
            node = lib.mn_node_next(node)
        return out

    # -- settings -------------------------------------------------------

    def set_max_entries(self, max_entries: int) -> None:
        """Messages per node for nodes filled from now on."""
        if not 1 <= max_entries <= MAX_MAX_ENTRIES:
            raise InvalidArgumentError(
                f"max_entries must be between 1 and {MAX_MAX_ENTRIES}", lib.MN_ERR_ARG
            )
        check(lib.mn_stream_set_max_entries(self._s, max_entries))

    def set_max_node_bytes(self, max_bytes: int) -> None:
        """Nodes filled from now on end before their messages pass max_bytes
        (0: no cap, the default; a larger message goes alone into a node)."""
        if not 0 <= max_bytes < 2**32:
            raise InvalidArgumentError("max_bytes must be between 0 and 2^32-1", lib.MN_ERR_ARG)
        check(lib.mn_stream_set_max_node_bytes(self._s, max_bytes))

    def set_compression(self, level: int) -> None:
        """zlib level (0 = off): nodes sealed from now on, and existing ones
        gradually (one per node sealed, or compress_step())."""
        check_level(level)
        check(lib.mn_stream_set_compression(self._s, level))

    def set_compression_depth(self, depth: int) -> None:
        """Keep the newest `depth` sealed nodes raw (like list-compress-depth);
        existing nodes follow gradually."""
        check_depth(depth)
        check(lib.mn_stream_set_compression_depth(self._s, depth))

    def compress_step(self, max_nodes: int = 1) -> bool:
        """Bring at most max_nodes existing nodes to the form the level and
        depth ask for (a bounded step for a cron); True while more remain."""
        if not 0 <= max_nodes < 2**32:
            raise InvalidArgumentError("max_nodes must be between 0 and 2^32-1", lib.MN_ERR_ARG)
        # No _version bump: conforming nodes changes their blobs, never which
        # nodes there are, so a dump() in progress stays valid.
        return bool(check(lib.mn_compress_step(self._s, max_nodes)))

    # -- reads ----------------------------------------------------------

    def read_resp(
        self, start: int, count: int, resp3: bool, prefix: bytes = b"", times: bool = False
    ) -> bytes:
        """RESP bulk strings for offsets start..start+count-1 (nulls for missing ones),
        after `prefix` (typically the reply's array header). With times, each
        message comes with its append time: RESP2 message, time, message,
        time ... (two nulls for a missing offset), RESP3 [message, time]
        pairs (a null for a missing offset), as TREAD WITHTIMES answers.

        The range must lie within 0..next_offset. This is TREAD's fast path:
        one C call that formats straight from the nodes, then one copy
        (joining a header afterwards would copy the reply a second time).
        """
        reply = self.read_resp_capped(start, count, resp3, prefix, None, times)
        assert isinstance(reply, bytes)
        return reply

    def read_resp_capped(
        self,
        start: int,
        count: int,
        resp3: bool,
        prefix: bytes,
        cap: int | None,
        times: bool = False,
    ) -> bytes | int:
        """read_resp(), unless the reply would be over cap bytes (None: no
        cap): then its size, and nothing is built."""
        style = (lib.MN_NULL_RESP3 if resp3 else lib.MN_NULL_RESP2) | (
            lib.MN_READ_WITH_TIMES if times else 0
        )
        return self._capped(lib.mn_read_resp_capped, start, count, style, prefix, cap)

    def _capped(
        self, build: Any, start: int, count: int, how: int, prefix: bytes, cap: int | None
    ) -> bytes | int:
        """A reply the core builds after prefix in the scratch buffer
        (mn_read_resp_capped, mn_read_packed_resp), or its size when it
        would be over cap bytes (None: no cap)."""
        if start < 0 or count < 0:
            raise range_error(start, count, self._next)
        buf = scratch_buffer()
        needed = _needed
        try:
            limit = _NO_CAP if cap is None else max(cap, 0)
            rc = build(self._s, start, count, how, prefix, len(prefix), limit, needed, buf)
            if rc == lib.MN_ERR_CAP:
                return int(needed[0])
            if rc:
                raise (range_error(start, count, self._next) if rc == lib.MN_ERR_ARG else error(rc))
            return ffi.unpack(buf.data, buf.len) if buf.len else b""
        finally:
            release_scratch(buf)

    def readable_run(self, offset: int, count: int) -> tuple[int, int]:
        """(start, n): the first readable offset at or after `offset`
        (evicted offsets and crash gaps are not readable) and how many
        readable offsets follow it without a null between them, at most
        count. Nothing readable at or after offset: (max(offset,
        next_offset), 0). What TREAD ... NONULLS reads."""
        if offset < 0 or count < 0:
            raise range_error(offset, count, self._next)
        run = ffi.new("uint64_t *")
        start = lib.mn_readable_run(self._s, offset, count, run)
        return start, run[0]

    def read(self, start: int, count: int) -> list[bytes | None]:
        """Messages at offsets start..start+count-1; None for evicted or lost ones."""
        if start < 0 or count < 0 or start + count > self.next_offset:
            raise range_error(start, count, self.next_offset)
        if count == 0:
            return []
        lens = array("q", bytes(8 * count))  # int64 per message, -1: evicted or lost
        buf = ffi.new("mn_buf *")
        try:
            check(lib.mn_read_copy(self._s, start, count, buf, ffi.from_buffer("int64_t[]", lens)))
            data = ffi.unpack(buf.data, buf.len) if buf.len else b""
        finally:
            lib.mn_buf_free(buf)
        out: list[bytes | None] = []
        pos = 0
        for size in lens.tolist():
            if size < 0:
                out.append(None)
            else:
                out.append(data[pos : pos + size])
                pos += size
        return out

    def read_packed_capped(
        self, start: int, count: int, times: bool, prefix: bytes, cap: int | None
    ) -> bytes | int:
        """TREAD ... PACKED's reply for offsets start..start+count-1 after
        `prefix`: the lengths (little-endian uint32, 0xFFFFFFFF for a
        missing offset), the messages back to back, and with times their
        append times (little-endian int64, -1 for a missing offset), as
        bulk strings; unless it would be over cap bytes (None: no cap):
        then its size, and nothing is built."""
        return self._capped(lib.mn_read_packed_resp, start, count, int(times), prefix, cap)

    def read_times(self, start: int, count: int) -> list[int | None]:
        """Append times (unix ms) of offsets start..start+count-1; None for
        evicted or lost ones."""
        if start < 0 or count < 0 or start + count > self.next_offset:
            raise range_error(start, count, self.next_offset)
        if count == 0:
            return []
        times = array("q", bytes(8 * count))
        check(lib.mn_read_times(self._s, start, count, ffi.from_buffer("int64_t[]", times)))
        return [None if t < 0 else t for t in times.tolist()]

    # -- persistence ----------------------------------------------------

    def written_in_c(self) -> None:
        """The C lane (rcp11/storage/lane.py, netloop.py) appended to this
        stream through its mn_stream: take up its next offset and count the
        change (dump() notices it)."""
        self._next = lib.mn_next_offset(self._s)
        self._version += 1

    def dump(self) -> Iterator[bytes]:
        """The header blob, then one blob per node, first to last.

        The stream must not change while the iterator is consumed (node
        pointers would dangle); a change raises RuntimeError.
        """
        version = self._version
        yield serialized(lib.mn_serialize_header, self._s)
        node = lib.mn_first_node(self._s)
        while node != ffi.NULL:
            if self._version != version:
                raise RuntimeError("Stream changed during dump()")
            blob = serialized(lib.mn_node_serialize, node)
            node = lib.mn_node_next(node)
            yield blob

    def append_node_blob(self, blob: bytes) -> None:
        """Append one node blob of dump() whole, at its own offsets (which
        must start at or after next_offset): its messages keep their bytes,
        compression and append times. CorruptDataError for a bad blob."""
        self._version += 1
        MUTATIONS.ticks += 1
        check(lib.mn_append_node_blob(self._s, ffi.from_buffer(blob), len(blob)))
        self._next = lib.mn_next_offset(self._s)

    @classmethod
    def load(cls, blobs: Iterable[bytes], now_ms: int | None = None) -> Stream:
        """Rebuild a stream from dump() output; CorruptDataError if anything is off.

        Older dumps load too: format 3's messages take the time of the next
        message whose time it kept (every 64th); format 2's (before the time
        index) count as appended at now_ms (default: the wall clock)."""
        ms = NOW if now_ms is None else clamp_ms(now_ms)
        it = iter(blobs)
        header = next(it, None)
        if header is None:
            raise CorruptDataError("no stream header", lib.MN_ERR_CORRUPT)
        err = ffi.new("int *")
        ptr = lib.mn_load_header(ffi.from_buffer(header), len(header), ms, err)
        if ptr == ffi.NULL:
            check(err[0] if err[0] < 0 else lib.MN_ERR_CORRUPT)
        stream = cls.__new__(cls)
        stream._s = ffi.gc(ptr, lib.mn_stream_free)
        stream._version = 0
        stream._next = lib.mn_next_offset(ptr)
        for blob in it:
            check(lib.mn_load_node(stream._s, ffi.from_buffer(blob), len(blob)))
        check(lib.mn_load_finish(stream._s))
        return stream


def validate_node_blob(blob: bytes) -> bool:
    """True when a node blob passes every check a load would make on it alone."""
    rc = lib.mn_validate_node_blob(ffi.from_buffer(blob), len(blob))
    if rc == lib.MN_ERR_NOMEM:
        check(rc)
    return rc == lib.MN_OK
