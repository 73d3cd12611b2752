"""The files of the data directory never overwrite one another.

dbfilename and appendfilename are plain file names (redis-server's rule),
never empty, `.` or `..`, never a name the server uses for its temporary or
lock files, never the same file as each other, as the snapshot's offsets
file, or as the pidfile, logfile or config file: in redis.conf, on the
command line and through CONFIG SET, with Redis-like errors. (A SAVE with
dbfilename set to the AOF's name replaced the AOF while the server kept
appending to the deleted file: acknowledged writes lost, offsets reused.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from conftest import free_port, tr, tw

from rcp11.config import Config, ConfigError


def set_error(config: Config, name: str, value: str) -> str:
    with pytest.raises(ConfigError) as info:
        config.set(name, value)
    return info.value.message


@pytest.mark.parametrize("directive", ["dbfilename", "appendfilename"])
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "{d} can't be empty"),
        (".", "{d} can't be a path, just a filename"),
        ("..", "{d} can't be a path, just a filename"),
        ("../x.rcp", "{d} can't be a path, just a filename"),
        ("/etc/passwd", "{d} can't be a path, just a filename"),
        ("sub/x", "{d} can't be a path, just a filename"),
        ("a\\b", "{d} can't be a path, just a filename"),
        ("temp-rcp11-1.snap", "{d} can't start with 'temp-rcp11-'"),
        ("temp-rewriteaof-rcp11-9.aof", "{d} can't start with 'temp-rewriteaof-rcp11-'"),
        ("rcp11.lock", "{d} can't be 'rcp11.lock'"),
    ],
)
def test_bad_names_are_refused_everywhere(
    tmp_path: Path, directive: str, value: str, reason: str
) -> None:
    reason = reason.format(d=directive)
    if directive == "dbfilename":
        message = set_error(Config(), directive, value)
        assert message.startswith(
            f"ERR CONFIG SET failed (possibly related to argument '{directive}') - {reason}"
        )
    quoted = '"' + value.replace("\\", "\\\\") + '"'
    conf = tmp_path / "bad.conf"
    conf.write_text(f"port 7000\n{directive} {quoted}\n")
    with pytest.raises(ConfigError) as info:
        Config().load_file(str(conf))
    text = info.value.fatal_message()
    assert f"'{conf}', at line 2" in text and reason in text
    with pytest.raises(ConfigError) as info:
        Config().apply_args([f"--{directive}", value])
    assert reason in info.value.fatal_message()


@pytest.mark.parametrize(
    ("dbfilename", "appendfilename", "reason"),
    [
        (
            "appendonly.aof",
            "appendonly.aof",
            "dbfilename and appendfilename can't name the same file",
        ),
        (
            "data",
            "data.offsets",
            "dbfilename's offsets file (data.offsets) can't be the appendfilename",
        ),
    ],
)
def test_snapshot_and_aof_names_must_differ(
    tmp_path: Path, dbfilename: str, appendfilename: str, reason: str
) -> None:
    config = Config()
    config.apply_args(["--appendfilename", appendfilename])
    config.check()
    assert set_error(config, "dbfilename", dbfilename) == (
        f"ERR CONFIG SET failed (possibly related to argument 'dbfilename') - {reason}"
    )
    assert config.get("dbfilename") == "dump.rcp"  # unchanged
    # In a file and on the command line the clash shows once both are read,
    # naming where the later of the two was set.
    conf = tmp_path / "clash.conf"
    conf.write_text(f"dbfilename {dbfilename}\nhz 10\n")
    config = Config()
    config.load_file(str(conf))
    config.apply_args(["--appendfilename", appendfilename])
    with pytest.raises(ConfigError) as info:
        config.check()
    text = info.value.fatal_message()
    assert "from the command line, at argument group 1" in text and reason in text
    assert f"--appendfilename {appendfilename}" in text


def test_data_files_must_not_be_the_pidfile_logfile_or_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "rcp11.conf"
    conf.write_text(f"dir {tmp_path}\n")
    config = Config()
    config.load_file(str(conf))
    config.check()
    assert "the same file as the config file" in set_error(config, "dbfilename", "rcp11.conf")
    config = Config()
    config.apply_args(["--dir", str(tmp_path), "--pidfile", str(tmp_path / "dump.rcp")])
    with pytest.raises(ConfigError, match="can't be the same file as pidfile"):
        config.check()
    config = Config()
    config.apply_args(["--dir", str(tmp_path), "--logfile", str(tmp_path / "x.offsets")])
    config.check()
    assert "can't be the same file as logfile" in set_error(config, "dbfilename", "x")


def test_config_set_of_other_directives_still_works() -> None:
    config = Config()
    config.set_many([("dbfilename", "snap.rcp"), ("hz", "20")])
    assert config.get("dbfilename") == "snap.rcp"


# ---------------------------------------------------------------------------
# Through a real server
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_save_can_never_replace_the_aof(server_factory) -> None:
    """The issue's reproduction: CONFIG SET dbfilename appendonly.aof; SAVE."""
    srv = server_factory(appendonly="yes", appendfsync="always", enable_protected_configs="yes")
    client = srv.client()
    tw(client, "s", "a")
    for bad in ("appendonly.aof", "", "..", "x/y", "temp-rcp11-1.snap"):
        with pytest.raises(redis.ResponseError, match="CONFIG SET failed .*'dbfilename'"):
            client.config_set("dbfilename", bad)
    assert client.config_get("dbfilename") == {"dbfilename": "dump.rcp"}
    assert client.save()
    assert tw(client, "s", "b") == 1
    srv.kill9()
    srv.start()
    client = srv.client()
    assert tr(client, "s", 0, 2) == [b"a", b"b"]
    assert tw(client, "s", "c") > 1


def test_aof_name_clashing_with_the_snapshot_refuses_to_start(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rcp11",
            "server",
            "--port",
            str(port),
            "--dir",
            str(tmp_path),
            "--appendfilename",
            "dump.rcp",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "*** FATAL CONFIG FILE ERROR" in done.stderr
    assert "dbfilename and appendfilename can't name the same file" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was touched


@pytest.mark.slow
def test_redis_cli_sees_the_refusal(server_factory) -> None:
    from conftest import require

    require("redis-cli")
    srv = server_factory(enable_protected_configs="yes")
    done = subprocess.run(
        ["redis-cli", "-p", str(srv.port), "CONFIG", "SET", "dbfilename", "appendonly.aof"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert "dbfilename and appendfilename can't name the same file" in done.stdout
