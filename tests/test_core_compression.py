"""Compression depth (like list-compress-depth) in the storage core, through
rcp11.storage, and the stream-compression-depth directive of the server."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import tw
from core_recipes import json_line

from rcp11.storage import MAX_COMPRESSION_DEPTH, InvalidArgumentError, Stream


def forms(s: Stream) -> list[str]:
    """Nodes newest first: 'A' active, 'z' compressed, 'r' raw."""
    nodes = s.nodes()
    return ["A"] + ["z" if n.compressed else "r" for n in reversed(nodes[:-1])]


def json_stream(nodes: int, depth: int, level: int = 6) -> Stream:
    s = Stream(max_entries=50, compression_level=level, compression_depth=depth)
    for k in range(nodes):
        s.append([json_line(i) for i in range(50 * k, 50 * k + 50)])
    return s


def test_newest_sealed_nodes_stay_raw() -> None:
    s = json_stream(10, depth=3)  # 10 full nodes: 9 sealed, the last active
    assert forms(s) == ["A", "r", "r", "r"] + ["z"] * 6
    assert s.compression_depth == 3 and not s.compress_pending
    s.append([json_line(500)])  # seals node 9: node 6 reaches rank 3
    assert forms(s) == ["A", "r", "r", "r"] + ["z"] * 7


def test_depth_zero_compresses_every_sealed_node() -> None:
    assert forms(json_stream(4, depth=0)) == ["A", "z", "z", "z"]


def test_one_node_per_node_sealed() -> None:
    s = Stream(max_entries=50, compression_level=6, compression_depth=2)
    counts = []
    for k in range(8):
        s.append([json_line(i) for i in range(50 * k, 50 * k + 50)])
        counts.append(s.num_compressed_nodes)
    # appending one node's worth at a time adds at most one compressed node
    assert all(b - a <= 1 for a, b in zip(counts[:-1], counts[1:], strict=True))
    assert counts[-1] == 8 - 1 - 2


def test_reads_near_the_tail_inflate_nothing() -> None:
    s = json_stream(40, depth=4)
    memory = s.memory_bytes
    tail = s.next_offset - 5 * 50  # the active node and the 4 raw ones
    for start in range(tail, s.next_offset - 100, 37):
        assert s.read(start, 100) == [json_line(i) for i in range(start, start + 100)]
    assert s.memory_bytes == memory  # no chunk was inflated into the cache
    s.read(0, 100)
    assert s.memory_bytes > memory


def test_changes_apply_gradually_to_existing_nodes() -> None:
    s = json_stream(12, depth=0)
    assert forms(s).count("z") == 11
    s.set_compression_depth(5)
    assert s.compress_pending and forms(s).count("z") == 11
    steps = 0
    while s.compress_step(1):
        steps += 1
    assert forms(s) == ["A"] + ["r"] * 5 + ["z"] * 6
    assert steps == 5  # one inflate per step, then a step that only looks
    s.set_compression(0)
    assert not s.compress_step(100)
    assert forms(s) == ["A"] + ["r"] * 11
    assert [m.decode() for m in s.read(0, 600)] == [json_line(i).decode() for i in range(600)]


def test_a_change_of_level_recompresses() -> None:
    s = json_stream(6, depth=0, level=1)
    assert {n.zlevel for n in s.nodes()[:-1]} == {1}
    s.set_compression(9)
    while s.compress_step(2):
        pass
    assert {n.zlevel for n in s.nodes()[:-1]} == {9}
    assert all(n.compressed for n in s.nodes()[:-1])


def test_depth_is_saved_and_loaded_streams_conform() -> None:
    s = json_stream(8, depth=2)
    copy = Stream.load(s.dump())
    assert copy.compression_depth == 2 and forms(copy) == forms(s)
    assert not copy.compress_step(100) and forms(copy) == forms(s)


def test_depth_bounds() -> None:
    s = Stream()
    s.set_compression_depth(MAX_COMPRESSION_DEPTH)
    with pytest.raises(InvalidArgumentError):
        s.set_compression_depth(MAX_COMPRESSION_DEPTH + 1)
    with pytest.raises(InvalidArgumentError):
        Stream(compression_depth=-1)


@pytest.mark.slow
def test_stream_compression_depth_directive(server_factory: Any) -> None:
    srv = server_factory(stream_node_max_entries=10, stream_compression="zlib")
    client = srv.client()
    try:
        assert client.config_get("stream-compression-depth") == {"stream-compression-depth": "0"}
        tw(client, "s", *[f"message number {i}" for i in range(95)])
        assert client.info("streams")["stream_compressed_nodes"] == 9
        client.config_set("stream-compression-depth", 3)
        # Existing nodes follow as nodes are sealed: the 3 newest sealed
        # nodes are inflated one per node sealed.
        tw(client, "s", *[f"message number {i}" for i in range(95, 125)])
        assert client.info("streams")["stream_compressed_nodes"] == 12 - 3
        tw(client, "fresh", *[f"message number {i}" for i in range(95)])
        assert client.info("streams")["stream_compressed_nodes"] == 9 + 9 - 3
        with pytest.raises(Exception, match="stream-compression-depth"):
            client.config_set("stream-compression-depth", 70000)
    finally:
        client.close()
