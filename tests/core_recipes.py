"""Deterministic streams built through rcp11.storage, shared by the format
tests and the fuzz seed generator (fuzz/core/make_seeds.py).

tests/data/macronode-v<N>/*.bin are these recipes dumped by the format-N
core (2: before the time index; 3: times of every 64th message of a node):
a loader must keep reading them. A recipe added later has no dump of the
older formats.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from rcp11.storage import Stream

T0 = 1_700_000_000_000  # recipes append at fixed times, so dumps are reproducible


def msg(i: int) -> bytes:
    """A distinct message per offset, of varying length (0..40 bytes)."""
    return (b"m%d-" % i + b"x" * (i % 37))[: i % 41]


def json_line(i: int) -> bytes:
    """A compressible JSON log line."""
    return b'{"ts":%d,"level":"%s","path":"/api/v1/items/%d","status":%d,"user":"u%05d"}' % (
        1_700_000_000_000 + 17 * i,
        b"info" if i % 7 else b"warn",
        i % 977,
        200,
        i % 311,
    )


def raw_with_gaps() -> Stream:
    """Raw nodes of 10, a partially evicted first node, a raised gap."""
    s = Stream(max_entries=10)
    for i in range(95):
        s.append([msg(i)], now_ms=T0 + 3 * i)
    s.evict_upto(13)
    s.raise_next_offset(102)
    s.append([msg(i) for i in range(102, 122)], now_ms=T0 + 1000)
    return s


def zlib_nodes() -> Stream:
    """zlib level 6, nodes of 50 JSON lines, 20 evicted."""
    s = Stream(max_entries=50, compression_level=6)
    for start in range(0, 230, 37):
        s.append([json_line(i) for i in range(start, min(230, start + 37))], now_ms=T0 + start)
    s.evict_upto(19)
    return s


def chunked() -> Stream:
    """8 KB messages, nodes of 5, zlib level 1: one node of three chunks."""
    s = Stream(max_entries=5, compression_level=1)
    s.append([bytes([65 + i % 26]) * 8000 + b"%d" % i for i in range(8)], now_ms=T0)
    return s


def empty_raised() -> Stream:
    """No node at all, next offset raised and everything evicted."""
    s = Stream(max_entries=1000)
    s.append([b"a", b"b"], now_ms=T0)
    s.evict_upto(1)
    s.raise_next_offset(1 << 40)
    return s


def depth_concat() -> Stream:
    """zlib with compression depth 2, nodes moved in by a concatenation."""
    s = Stream(max_entries=20, compression_level=6, compression_depth=2)
    s.append([json_line(i) for i in range(150)], now_ms=T0)
    src = Stream(max_entries=20, compression_level=1)
    src.append([json_line(i) for i in range(150, 230)], now_ms=T0 - 10)
    src.evict_upto(4)
    s.concat(src)
    return s


def timed() -> Stream:
    """Nodes of 200 one message at a time, 7 ms apart: times inside nodes
    differ (format 3 kept every 64th), a partially evicted first node."""
    s = Stream(max_entries=200)
    for i in range(450):
        s.append([msg(i)], now_ms=T0 + 7 * i)
    s.evict_upto(29)
    return s


RECIPES: dict[str, Callable[[], Stream]] = {
    "raw_with_gaps": raw_with_gaps,
    "zlib_nodes": zlib_nodes,
    "chunked": chunked,
    "empty_raised": empty_raised,
    "depth_concat": depth_concat,
    "timed": timed,
}


def pack_blobs(blobs: Iterable[bytes], flags: int = 1) -> bytes:
    """The fuzz/core blobs harness input: a flags byte, then each blob as a
    little-endian u32 length and its bytes (flags bit 0: a whole dump)."""
    return bytes([flags]) + b"".join(struct.pack("<I", len(b)) + b for b in blobs)


def unpack_blobs(data: bytes) -> list[bytes]:
    """The inverse of pack_blobs() for well-formed input."""
    blobs, pos = [], 1
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        blobs.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return blobs
