"""CONFIG GET, SET, RESETSTAT and REWRITE through a running server
(docs/PROTOCOL.md section 7, "Configuration"): values as redis-server 7
shows and refuses them, the stream directives reaching new and existing
streams, the network directives (port, bind, unixsocket, tcp-keepalive)
and maxmemory. redis.conf and the command line: test_config_files.py;
the Config class in process: test_config_directives.py."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    ServerProcess,
    answers_ping,
    exchange,
    free_port,
    mbulk,
    raw_pipeline,
    require,
    tr,
    tw,
    wait_for,
)

# -------------------------------------------------------- CONFIG GET and SET


def test_config_get_set(shared_client: redis.Redis, shared_client3: redis.Redis) -> None:
    assert shared_client.config_get("stream-node-max-entries") == {
        "stream-node-max-entries": "1000"
    }
    assert shared_client.config_set("maxmemory", "10mb")
    assert shared_client3.config_get("maxmem*")["maxmemory"] == "10485760"
    assert shared_client.execute_command("CONFIG", "SET", "maxmemory", "0", "timeout", "0") == b"OK"
    assert shared_client.config_resetstat()
    with pytest.raises(redis.ResponseError, match="without a config file"):
        shared_client.config_rewrite()


def test_config_get_lists_every_spec_directive(shared_client: redis.Redis) -> None:
    spec = (
        "bind port unixsocket protected-mode requirepass timeout tcp-keepalive maxclients"
        " maxmemory dir dbfilename save appendonly appendfilename appendfsync"
        " auto-aof-rewrite-percentage auto-aof-rewrite-min-size aof-load-truncated loglevel"
        " logfile daemonize pidfile proto-max-bulk-len client-query-buffer-limit"
        " client-output-buffer-limit stream-node-max-entries stream-compression"
        " stream-compression-level"
    ).split()
    everything = shared_client.config_get("*")
    assert [name for name in spec if name not in everything] == []
    assert everything["stream-node-max-entries"] == "1000"
    assert everything["stream-compression"] == "no"
    assert everything["bind"].split()[0] in ("127.0.0.1", "::1")
    assert everything["protected-mode"] == "yes"


MUTABLE = [
    ("protected-mode", "no", "no"),
    ("requirepass", "", ""),
    ("timeout", "0", "0"),
    ("tcp-keepalive", "60", "60"),
    ("maxclients", "500", "500"),
    ("maxmemory", "2mb", "2097152"),
    ("save", "100 1 50 2", "100 1 50 2"),
    ("appendfsync", "ALWAYS", "always"),
    ("auto-aof-rewrite-percentage", "50", "50"),
    ("auto-aof-rewrite-min-size", "1mb", "1048576"),
    ("aof-load-truncated", "no", "no"),
    ("loglevel", "debug", "debug"),
    ("proto-max-bulk-len", "2mb", "2097152"),
    ("client-query-buffer-limit", "2mb", "2097152"),
    ("client-output-buffer-limit", "normal 1mb 512kb 10", None),
    ("stream-node-max-entries", "50", "50"),
    ("stream-compression", "zlib", "zlib"),
    ("stream-compression-level", "9", "9"),
]


@pytest.mark.parametrize(("name", "value", "shown"), MUTABLE, ids=[m[0] for m in MUTABLE])
def test_config_set_round_trips(
    shared_client: redis.Redis, name: str, value: str, shown: Any
) -> None:
    before = shared_client.config_get(name)[name]
    try:
        assert shared_client.config_set(name, value)
        got = shared_client.config_get(name)[name]
        if shown is None:
            assert got.startswith("normal 1048576 524288 10")
        else:
            assert got == shown
        assert shared_client.ping()
    finally:
        shared_client.config_set(name, before)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("appendfsync", "sometimes"),
        ("stream-compression", "lz4"),
        ("stream-compression-level", "42"),
        ("stream-node-max-entries", "-1"),
        ("maxclients", "0"),
        ("appendonly", "maybe"),
        ("aof-load-truncated", "2"),
        ("tcp-keepalive", "x"),
    ],
)
def test_config_set_bad_value_is_refused_like_redis(
    shared_client: redis.Redis, name: str, value: str
) -> None:
    before = shared_client.config_get(name)[name]
    with pytest.raises(
        redis.ResponseError, match=f"CONFIG SET failed \\(possibly related to argument '{name}'\\)"
    ):
        shared_client.config_set(name, value)
    assert shared_client.config_get(name)[name] == before


@pytest.mark.parametrize("name", ["unixsocket", "daemonize", "pidfile", "logfile"])
def test_config_set_immutable_directives_say_so(shared_client: redis.Redis, name: str) -> None:
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        shared_client.config_set(name, "yes" if name == "daemonize" else "/tmp/elsewhere")


@pytest.mark.slow
def test_config_rewrite_keeps_comments_quotes_values_and_survives_a_restart(
    server_factory: Any, tmp_path: Path
) -> None:
    port = free_port()
    conf = tmp_path / "r.conf"
    conf.write_text(f"# keep me\nport {port}\nsave 3600 1\nloglevel notice\ndir {tmp_path}\n")
    srv = server_factory(conf, defaults=False, port=port)
    password = "a b\"c\\d'e"
    cl = srv.client()
    cl.config_set("save", "")
    cl.config_set("maxmemory", "3mb")
    cl.config_set("stream-node-max-entries", "77")
    cl.config_set("requirepass", password)
    assert cl.config_rewrite()
    assert conf.read_text().startswith("# keep me\n")
    with srv.raw() as raw:
        raw.send(mbulk("AUTH", password) + mbulk("SHUTDOWN", "NOSAVE"))
        assert raw.read_until_closed() == b"+OK\r\n"
    assert srv.proc is not None and srv.proc.wait(10) == 0
    srv.start()
    assert srv.exchange(b"PING\r\n", lines=1).startswith(b"-NOAUTH")
    cl = srv.client(password=password)
    got = cl.config_get("*")
    assert (got["save"], got["maxmemory"], got["stream-node-max-entries"]) == (
        "",
        "3145728",
        "77",
    )


# --------------------------------------------------------- stream directives


@pytest.mark.slow
def test_stream_node_size_reaches_existing_streams(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    client = srv.client()
    try:
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"a", b"b", b"c"])
        client.config_set("stream-node-max-entries", 10)
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"m%d" % i for i in range(97)])
        assert client.info("streams")["stream_nodes"] == 10
        assert client.execute_command("TREAD", "old", 0, 4) == [b"a", b"b", b"c", b"m0"]
    finally:
        client.close()
    srv.restart(stream_node_max_entries=50)
    client = srv.client()
    try:
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"n%d" % i for i in range(100)])
        assert client.info("streams")["stream_nodes"] == 12
        assert client.execute_command("TREAD", "old", 199, 1) == [b"n99"]
    finally:
        client.close()


@pytest.mark.slow
def test_stream_compression_reaches_existing_streams(server_factory: Any) -> None:
    srv = server_factory(save="3600 1", stream_node_max_entries=10)
    client = srv.client()
    try:
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"y" * 200] * 5)
        client.config_set("stream-compression", "zlib")
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"y" * 200] * 100)
        compressed = client.info("streams")["stream_compressed_nodes"]
        assert compressed > 0
        client.config_set("stream-compression", "no")
        # Turning compression off reaches the nodes already compressed, one
        # per node sealed: ten nodes sealed, the ten compressed ones inflated.
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"y" * 200] * 100)
        assert compressed == 10 and client.info("streams")["stream_compressed_nodes"] == 0
    finally:
        client.close()
    # A restart with compression on compresses what is sealed after it.
    srv.restart(stream_compression="zlib")
    client = srv.client()
    try:
        before = client.info("streams")["stream_compressed_nodes"]
        client.execute_command("TWRITE", "old", "ENTRIES", *[b"y" * 200] * 100)
        assert client.info("streams")["stream_compressed_nodes"] > before
        assert client.execute_command("TREAD", "old", 0, 1) == [b"y" * 200]
    finally:
        client.close()


def test_stream_node_max_entries_and_zlib_from_the_command_line(server_factory: Any) -> None:
    srv = server_factory(stream_node_max_entries=10, stream_compression="zlib")
    cl = srv.client()
    tw(cl, "s", *[f"message number {i}" for i in range(95)])
    info = cl.info("streams")
    assert info["stream_nodes"] == 10
    assert 1 <= info["stream_compressed_nodes"] <= 10
    assert info["stream_payload_bytes"] == sum(len(f"message number {i}") for i in range(95))
    assert tr(cl, "s", 43, 2) == [b"message number 43", b"message number 44"]
    cl.execute_command("TEVICT", "s", 44)  # inside a compressed node
    assert tr(cl, "s", 44, 2) == [None, b"message number 45"]


def test_config_set_stream_directives_apply_to_new_streams(shared_client: redis.Redis) -> None:
    shared_client.config_set("stream-node-max-entries", 10)
    shared_client.config_set("stream-compression", "zlib")
    try:
        tw(shared_client, "fresh", *[f"message number {i}" for i in range(100)])
        info = shared_client.info("streams")
        assert info["stream_nodes"] == 10 and info["stream_compressed_nodes"] >= 9
    finally:
        shared_client.config_set("stream-node-max-entries", 1000)
        shared_client.config_set("stream-compression", "no")


def test_config_set_stream_directives_apply_to_existing_streams(shared_client: redis.Redis) -> None:
    # redis-server 7 checks stream-node-max-entries on every append, so a
    # CONFIG SET takes effect for the streams already there.
    tw(shared_client, "old", "a", "b", "c")
    shared_client.config_set("stream-node-max-entries", 10)
    shared_client.config_set("stream-compression", "zlib")
    try:
        tw(shared_client, "old", *[f"message number {i}" for i in range(100)])
        info = shared_client.info("streams")
        assert info["stream_nodes"] >= 10
        assert info["stream_compressed_nodes"] >= 9
    finally:
        shared_client.config_set("stream-node-max-entries", 1000)
        shared_client.config_set("stream-compression", "no")


@pytest.mark.slow
def test_restart_with_new_stream_directives_applies_to_loaded_streams(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", *[f"message {i}" for i in range(5)])
    srv.restart(stream_compression="zlib", stream_node_max_entries=10)
    cl = srv.client()
    tw(cl, "s", *[f"message {i}" for i in range(100)])
    info = cl.info("streams")
    assert info["stream_nodes"] >= 10 and info["stream_compressed_nodes"] >= 9
    assert tr(cl, "s", 0, 1) == [b"message 0"]


# -------------------------------------------------------- network directives


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping() is True
    except redis.ConnectionError:
        return False


@pytest.mark.slow
def test_config_set_port_and_bind_rebind_like_redis(server_factory) -> None:
    srv = server_factory()
    client = srv.client()
    new_port = free_port()
    assert client.config_set("port", new_port)
    moved = redis.Redis(port=new_port, retry=None)
    try:
        assert wait_for(lambda: _answers(moved))
        assert moved.config_get("port") == {"port": str(new_port)}
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
        # A port someone else holds: refused, and the server stays where it is.
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        try:
            with pytest.raises(redis.ResponseError, match="Failed to bind"):
                moved.config_set("port", blocker.getsockname()[1])
        finally:
            blocker.close()
        assert moved.config_get("port") == {"port": str(new_port)}
        assert moved.config_set("bind", "127.0.0.1")
        assert moved.config_get("bind") == {"bind": "127.0.0.1"}
        assert _answers(redis.Redis(port=new_port, retry=None))
    finally:
        moved.shutdown(nosave=True)
        srv.proc.wait(10)


def test_unixsocket_with_unixsocketperm(server_factory, tmp_path: Path) -> None:
    path = str(tmp_path / "rcp11.sock")
    srv = server_factory(unixsocket=path, unixsocketperm="700")
    assert os.stat(path).st_mode & 0o777 == 0o700
    client = redis.Redis(unix_socket_path=path)
    assert client.execute_command("TWRITE", "u", "x") == 0
    assert srv.client().execute_command("TREAD", "u", "0", "1") == [b"x"]
    client.close()


@pytest.mark.slow
def test_config_set_port_moves_the_listener_like_redis7(server_factory: Any) -> None:
    srv = server_factory()
    admin = srv.client()
    new_port = free_port()
    assert admin.config_set("port", new_port)
    assert admin.ping()  # the connection that asked stays
    assert exchange(new_port, b"PING\r\n", lines=1) == b"+PONG\r\n"
    assert not answers_ping(srv.port)

    assert redis.Redis(port=new_port).config_get("port")["port"] == str(new_port)
    with pytest.raises(redis.ResponseError, match="port"):
        admin.config_set("port", 70000)


def test_config_set_bind_like_redis7(server_factory: Any) -> None:
    srv = server_factory()
    cl = srv.client()
    assert cl.config_set("bind", "127.0.0.1")
    assert cl.config_get("bind")["bind"] == "127.0.0.1"
    assert srv.client().ping()


def test_unixsocket_serves_redis_py_and_redis_cli(server_factory: Any, tmp_path: Path) -> None:
    path = tmp_path / "rcp11.sock"
    srv = server_factory(unixsocket=str(path))
    cl = redis.Redis(unix_socket_path=str(path), protocol=3)
    assert tw(cl, "s", "via unix") == 0
    assert tr(srv.client(), "s", 0, 1) == [b"via unix"]
    require("redis-cli")  # the redis-cli half: skipped only outside CI
    out = subprocess.run(
        ["redis-cli", "-s", str(path), "TREAD", "s", "0", "5"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "via unix"


@pytest.mark.slow
def test_tcp_keepalive_is_set_on_client_sockets(server_factory: Any) -> None:
    require("ss")  # iproute2; run-tests.sh installs it
    srv = server_factory(tcp_keepalive=100)
    with srv.raw() as raw:
        assert raw.call("PING") == b"+PONG\r\n"
        out = subprocess.run(
            ["ss", "-tnoH", "state", "established", f"( sport = :{srv.port} )"],
            capture_output=True,
            text=True,
        ).stdout
    assert "keepalive" in out
    seconds = int(out.split("keepalive,")[1].split("sec")[0].split("min")[0])
    assert 60 < seconds <= 100 or "min" in out.split("keepalive,")[1].split(",")[0]


# ----------------------------------------------------------------- maxmemory


def test_maxmemory_refuses_writes_with_oom(shared_client: redis.Redis) -> None:
    shared_client.execute_command("TWRITE", "s", "x" * 10_000)
    shared_client.config_set("maxmemory", "1000")
    try:
        with pytest.raises(redis.ResponseError, match="^command not allowed when used memory"):
            shared_client.execute_command("TWRITE", "s", "y")
        assert shared_client.execute_command("TREAD", "s", 0, 1) == [b"x" * 10_000]
        assert shared_client.delete("s") == 1
    finally:
        shared_client.config_set("maxmemory", "0")
    assert shared_client.execute_command("TWRITE", "s", "y") == 0


@pytest.mark.slow
def test_maxmemory_counts_the_clients_too(server_factory: Any) -> None:
    # As in redis-server, an empty server is not at zero bytes: `maxmemory 1`
    # refuses the very first write.
    srv = server_factory()
    client = srv.client()
    try:
        memory = client.info("memory")
        assert memory["used_memory_dataset"] == 0
        assert memory["used_memory"] > 0
        client.config_set("maxmemory", 1)
        with pytest.raises(redis.ResponseError, match="^command not allowed when used memory"):
            client.execute_command("TWRITE", "s", "x")
        assert client.exists("s") == 0
        client.config_set("maxmemory", 0)
        assert client.execute_command("TWRITE", "s", "x") == 0
    finally:
        client.close()


def test_maxmemory_refusal_raises_redis_py_out_of_memory_error(stream_client: redis.Redis) -> None:
    tw(stream_client, "s", "x" * 1000)
    stream_client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            tw(stream_client, "s", "x")
    finally:
        stream_client.config_set("maxmemory", 0)


def test_maxmemory_reached_in_the_middle_of_a_pipeline(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    try:
        out = raw_pipeline(
            shared_server.port,
            [
                ["TWRITE", "s", "a"],
                ["CONFIG", "SET", "maxmemory", "1"],
                ["TWRITE", "s", "b"],
                ["TWRITE", "s", "c"],
                ["TREAD", "s", "0", "5"],
                ["TEVICT", "s", "0"],
                ["CONFIG", "SET", "maxmemory", "0"],
                ["TWRITE", "s", "d"],
            ],
        )
    finally:
        shared_client.config_set("maxmemory", 0)
    oom = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
    assert out == b":0\r\n+OK\r\n" + oom * 2 + b"*1\r\n$1\r\na\r\n:1\r\n+OK\r\n:1\r\n"
