"""The persistence contract (rcp11/state.py PersistenceHooks) is complete and
both implementations keep it: the server and the commands call nothing else,
so a method missing from one side would be an AttributeError at run time."""

from __future__ import annotations

import inspect
import subprocess
import sys

from rcp11.config import Config
from rcp11.persistence import Persistence
from rcp11.state import NullPersistence, PersistenceHooks, ServerState


def _hook_names() -> list[str]:
    return [
        name
        for name, value in vars(PersistenceHooks).items()
        if not name.startswith("_") and inspect.isfunction(value)
    ]


def test_every_hook_is_implemented_with_the_same_parameters() -> None:
    names = _hook_names()
    assert {"flush", "lastsave", "save", "bgsave", "bgrewriteaof", "shutdown"} <= set(names)
    for impl in (NullPersistence, Persistence):
        for name in names:
            want = inspect.signature(getattr(PersistenceHooks, name))
            have = inspect.signature(getattr(impl, name))
            assert list(have.parameters) == list(want.parameters), (impl, name)
            assert have.return_annotation == want.return_annotation, (impl, name)
        assert hasattr(impl, "aof_state")


def test_null_persistence_answers_every_hook() -> None:
    null = NullPersistence()
    assert null.flush() is True
    assert isinstance(null.lastsave(), int)
    assert null.write_refused() is None
    assert null.info() == {}
    assert null.shutdown(None) is True
    assert ServerState(Config()).persistence.aof_state == "off"


def test_a_broken_persistence_install_stops_the_server_loudly() -> None:
    """Importing persistence failing is a start-up failure with the cause
    shown, never a server that runs on without persistence."""
    code = (
        "import sys; sys.modules['rcp11.persistence'] = None\n"
        "from rcp11.server import main\n"
        "main(['--port', '0'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "rcp11.persistence" in proc.stderr
