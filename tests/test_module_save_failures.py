"""A value the module cannot serialise fails its save or AOF rewrite
loudly: the previous file stays, Redis reports the failure, the log names
the key -- never a truncated rewrite or an RDB value that loads short.

Inside Redis an allocation that fails ends the server in the allocator, so
the failure cannot be provoked from outside. These tests load a test build
of the module (tests/c/module_child_nomem.h force-included) whose storage
cores cannot allocate in Redis's fork children, where BGSAVE and
BGREWRITEAOF serialise, and allocate as usual in the server itself. What
this leaves untested is the server-side case (SAVE, DUMP): there the module
writes a value its loader refuses by name (src/module_rdb.c).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import redis
from conftest import REPO, RedisModuleServer, require, tr, tw, wait_for
from test_module_persistence import reseal

pytestmark = pytest.mark.slow

CHILD_NOMEM = REPO / "tests" / "c" / "module_child_nomem.h"


@pytest.fixture(scope="module")
def nomem_module(tmp_path_factory: pytest.TempPathFactory) -> str:
    require("redis-server")
    sys.path.insert(0, str(REPO / "src"))
    import build_module

    out = tmp_path_factory.mktemp("nomem")
    return build_module.build(
        str(out / "rcp11-child-nomem.so"), str(out / "obj"), ["-include", str(CHILD_NOMEM)]
    )


def persistence(client: redis.Redis) -> dict[str, Any]:
    return client.info("persistence")


def wait_bgsave(client: redis.Redis) -> str:
    wait_for(lambda: not persistence(client)["rdb_bgsave_in_progress"], timeout=30)
    return persistence(client)["rdb_last_bgsave_status"]


def wait_rewrite(client: redis.Redis) -> str:
    def done() -> bool:
        info = persistence(client)
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    wait_for(done, timeout=30)
    return persistence(client)["aof_last_bgrewrite_status"]


def lease_group(client: redis.Redis) -> None:
    """An acknowledged group key "g" alone: its stream is deleted (the group
    stays), so the save meets only the group."""
    tw(client, "s", "a")
    tr(client, "s", 0, 1, "GROUP", "g", "LEASE", 60_000)
    assert client.delete("s") == 1
    assert client.type("g") == b"rcp11-grp"


@pytest.mark.parametrize("kind", ["stream", "group"])
def test_failed_bgsave_keeps_the_previous_rdb_file(
    module_factory: Any, nomem_module: str, kind: str
) -> None:
    srv: RedisModuleServer = module_factory(loadmodule=nomem_module)
    client = srv.client()
    if kind == "stream":
        for i in range(3):
            tw(client, "s", f"m{i}")
    else:
        lease_group(client)
    client.save()  # in the server itself: serialises as usual
    saved = (srv.dir / "dump.rdb").read_bytes()
    client.set("after", "the save")
    client.bgsave()
    assert wait_bgsave(client) == "err"
    what = "a stream header of key 's'" if kind == "stream" else "an acknowledged group of key 'g'"
    assert f"cannot serialize {what}" in srv.log()
    assert "Background saving terminated by signal 6" in srv.log()
    assert (srv.dir / "dump.rdb").read_bytes() == saved
    assert not list(srv.dir.glob("temp-*.rdb"))
    # The server lives on, and a restart loads the previous snapshot whole.
    assert client.get("after") == b"the save"
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.get("after") is None
    if kind == "stream":
        assert tr(client, "s", 0, 10) == [b"m0", b"m1", b"m2"]
    else:
        assert client.type("g") == b"rcp11-grp"
    client.close()


@pytest.mark.parametrize("kind", ["stream", "group"])
@pytest.mark.parametrize("preamble", ["no", "yes"])
def test_failed_aof_rewrite_keeps_the_previous_aof(
    module_factory: Any, nomem_module: str, kind: str, preamble: str
) -> None:
    srv: RedisModuleServer = module_factory(
        loadmodule=nomem_module,
        appendonly="yes",
        appendfsync="always",
        aof_use_rdb_preamble=preamble,
        **{"rcp11.stream-node-max-entries": 2},
    )
    client = srv.client()
    if kind == "stream":
        # Several nodes, a cut and a tail: what the old rewrite wrote after
        # it stopped early (TEVICT, RCP11.SKIPTO) made a short stream look
        # whole.
        for i in range(5):
            tw(client, "s", f"m{i}")
        client.execute_command("TEVICT", "s", 0)
    else:
        lease_group(client)
    client.bgrewriteaof()
    assert wait_rewrite(client) == "err"
    log = srv.log()
    assert "cannot serialize" in log
    assert "Background AOF rewrite terminated by signal 6" in log
    if kind == "stream":
        assert tw(client, "s", "after the rewrite") == 5
    client.close()
    # The AOF as it was, plus what came after the failed rewrite, loads.
    srv.kill9()
    srv.start()
    client = srv.client()
    if kind == "stream":
        assert tr(client, "s", 0, 10) == [None, b"m1", b"m2", b"m3", b"m4", b"after the rewrite"]
    else:
        assert client.type("g") == b"rcp11-grp"
    client.close()


@pytest.mark.parametrize("part", ["header", "node"])
def test_value_saved_with_an_empty_blob_is_refused_by_name(module_factory: Any, part: str) -> None:
    # What the server itself writes for a part it could not serialise (a
    # SAVE or a DUMP: no fork child to end): a RESTORE, and a server
    # starting from such a file, refuse it and say why.
    srv: RedisModuleServer = module_factory(rdbcompression="no")
    client = srv.client()
    tw(client, "s", *[b"precious-payload-%04d" % n for n in range(100)])
    body = bytearray(client.dump("s")[:-8])
    if part == "header":
        at = body.index(b"MNST")
        assert body[at - 1] == 52  # the header's length, one byte
        body[at - 1 : at + 52] = b"\x00"
    else:
        at = body.index(b"MNND")
        assert body[at - 2] & 0xC0 == 0x40  # a 14-bit length, two bytes
        length = (body[at - 2] & 0x3F) << 8 | body[at - 1]
        body[at - 2 : at + length] = b"\x00"
    with pytest.raises(redis.ResponseError, match="Bad data format"):
        client.restore("restored", 0, reseal(bytes(body)))
    assert client.exists("restored") == 0
    assert f"a stream {part} was not saved whole" in srv.log()
    client.close()
