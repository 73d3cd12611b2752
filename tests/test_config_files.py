"""redis.conf and the command line, as a user starts the server with them
(docs/PROTOCOL.md section 7, "Configuration"): the file forms redis-server
accepts, the shipped redis.conf as is, directives of several words,
command-line arguments over the file, and a bad line or argument that
refuses the start naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import (
    REPO,
    free_port,
    run_server,
    tr,
    tw,
)


@pytest.mark.slow
def test_config_file_forms_like_redis(server_factory: Any, tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "my.conf"
    conf.write_text(
        f"# comment\nPORT {port}\nsave 100 1\nsave 50 2\nMaxMemory 2mb\n"
        f'requirepass "p w"\nloglevel "verbose"\ndir {tmp_path}\nlogfile "{tmp_path}/log"\n'
        "stream-compression zlib\nappendonly no\n"
    )
    # The file as written, nothing added on the command line.
    srv = server_factory(conf, defaults=False, port=port)
    cl = srv.client(password="p w")
    got = cl.config_get("*")
    assert got["save"] == "100 1 50 2"
    assert got["maxmemory"] == "2097152"
    assert got["loglevel"] == "verbose"
    assert got["stream-compression"] == "zlib"
    assert cl.info("server")["config_file"] == str(conf)


@pytest.mark.slow
def test_shipped_redis_conf_as_is(server_factory: Any, tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text((REPO / "redis.conf").read_text())
    # The file as shipped, only the port changed on the command line.
    srv = server_factory(conf, defaults=False, port=port, extra_args=["--port", str(port)])
    cl = srv.client()
    got = cl.config_get("*")
    assert (got["appendonly"], got["appendfsync"], got["protected-mode"]) == (
        "yes",
        "everysec",
        "yes",
    )
    tw(cl, "events", "hello")
    assert cl.execute_command("TWRITE", "events", "ENTRIES", "a", "b", "c") == 1
    tr(cl, "events", 0, 10, "GROUP", "readers")
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert tr(cl, "events", 0, 4) == [b"hello", b"a", b"b", b"c"]
    assert cl.get("readers") == b"4"
    assert (tmp_path / "appendonly.aof").exists() or list(tmp_path.rglob("appendonly.aof*"))


@pytest.mark.slow
def test_multi_word_directive_values_on_the_command_line(
    server_factory: Any, tmp_path: Path
) -> None:
    port = free_port()
    args = ["--port", str(port), "--dir", str(tmp_path)]
    args += ["--save", "3600", "1", "300", "100", "--logfile", str(tmp_path / "log")]
    args += ["--client-output-buffer-limit", "normal", "1mb", "512kb", "10"]
    srv = server_factory(defaults=False, port=port, extra_args=args)
    got = srv.client().config_get("*")
    assert got["save"] == "3600 1 300 100"
    assert got["client-output-buffer-limit"].startswith("normal 1048576 524288 10")


@pytest.mark.slow
def test_config_file_and_args(tmp_path: Path, server_factory) -> None:
    conf = tmp_path / "my.conf"
    conf.write_text("# my server\nhz 20\nmaxmemory 100mb\n")
    srv = server_factory(conf=conf)
    client = srv.client()
    assert client.config_get("hz") == {"hz": "20"}
    assert client.config_get("maxmemory") == {"maxmemory": str(100 * 1024 * 1024)}
    assert client.config_get("port") == {"port": str(srv.port)}
    client.config_set("hz", "30")
    client.config_rewrite()
    text = conf.read_text()
    assert text.startswith("# my server\nhz 30\n")


def test_bad_config_file_exits_naming_the_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("port 7000\n# fine so far\nappendfsync sometimes\n")
    result = run_server(str(conf), "--port", str(free_port()))
    assert result.returncode != 0
    assert "at line 3" in result.stderr
    assert str(conf) in result.stderr
    assert "appendfsync sometimes" in result.stderr


@pytest.mark.slow
def test_bad_argument_exits(tmp_path: Path) -> None:
    result = run_server("--port", "notaport")
    assert result.returncode != 0
    assert "argument couldn't be parsed into an integer" in result.stderr
    result = run_server("--nosuchdirective", "1")
    assert result.returncode != 0
    assert "Bad directive" in result.stderr


def test_config_file_error_names_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("port 0\n# comment\nappendfsync sometimes\n")
    # This interpreter, not whatever `python` PATH finds first.
    proc = run_server(str(conf), cwd=tmp_path, timeout=30)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "line 3" in text and "appendfsync sometimes" in text


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--foo", "bar"], "foo"),
        (["--port", "abc"], "port"),
        (["--stream-compression", "lz4"], "stream-compression"),
        (["--stream-node-max-entries", "0"], "stream-node-max-entries"),
        (["--save", "100"], "save"),
    ],
)
def test_bad_command_line_directive_refuses_to_start(
    tmp_path: Path, args: list[str], named: str
) -> None:
    proc = run_server("--port", str(free_port()), *args, cwd=tmp_path)
    assert proc.returncode != 0
    assert named in proc.stdout + proc.stderr


@pytest.mark.slow
def test_missing_config_file_refuses_to_start(tmp_path: Path) -> None:
    """One line, as redis-server says it: no banner about a line 0."""
    missing = tmp_path / "nope.conf"
    proc = run_server(str(missing), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"Fatal error, can't open config file '{missing}': No such file or directory\n"
    )
    # A directory, and a file an `include` names: the include's line is shown.
    assert run_server(str(tmp_path), cwd=tmp_path).stderr.splitlines() == [
        f"Fatal error, can't open config file '{tmp_path}': Is a directory"
    ]
    conf = tmp_path / "main.conf"
    conf.write_text("port 0\ninclude nope.conf\n")
    text = run_server(str(conf), cwd=tmp_path).stderr
    assert f"file '{conf}', at line 2" in text and ">>> 'include nope.conf'" in text
    assert f"can't open config file '{missing}'" in text
