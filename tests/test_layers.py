"""The layers of rcp11/ (docs/DESIGN.md): imports point down only, imports
for type hints included, and where a lower module states what it needs of
an object above it (a Protocol), the real object keeps that contract."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

from conftest import persistence_in_process

from rcp11.blocking import Waiter
from rcp11.commands import execute
from rcp11.config import Config
from rcp11.keyspace import KeyRemovals, KeyspaceOwner, Watcher
from rcp11.persistence.parts import Engine, SaveStatus
from rcp11.retention import Retention
from rcp11.server.connection import Front
from rcp11.server.listeners import Server
from rcp11.server.netloop import CTransport, LoopOwner, NetLoop
from rcp11.state import ClientState, RetentionHooks, ServerState
from rcp11.storage.netloop import ConnectionUser, LoopUser

PACKAGE = Path(__file__).resolve().parent.parent / "rcp11"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the rcp11 modules it imports anywhere in its text (under
    `if TYPE_CHECKING:` too). `from package import name` counts as an
    import of the submodule when `name` is one, else of the package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module in modules and not node.level:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _import_graph()
    assert "rcp11.persistence.engine" in graph["rcp11.persistence"]  # the graph is read
    assert _cycles(graph) == []


def _importers_of(module: str) -> list[str]:
    """The rcp11 modules whose text imports `module` (or a name from it)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                # `from rcp11 import _macronode` names it too.
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            if module in names:
                found.append(_module_name(path))
    return found


def test_the_storage_package_is_the_only_door_to_the_c_core() -> None:
    """Only rcp11/storage/ imports the compiled core (ffi, lib): the C lane
    and its event loop included, everything above sees Python objects."""
    importers = _importers_of("rcp11._macronode")
    assert importers == ["rcp11.storage.binding"]


def _keeps(obj: Any, protocol: type) -> None:
    """obj has every attribute the protocol declares, and its methods take
    the protocol's parameters."""
    for name in getattr(protocol, "__annotations__", {}):
        assert hasattr(obj, name), (protocol.__name__, name)
    for name, want in vars(protocol).items():
        if name.startswith("_") or not inspect.isfunction(want):
            continue
        have = inspect.signature(getattr(obj, name))
        assert list(have.parameters) == list(inspect.signature(want).parameters)[1:], (
            protocol.__name__,
            name,
        )


def test_the_contracts_stated_below_are_kept_above(tmp_path: Path) -> None:
    state, persistence = persistence_in_process(tmp_path)
    _keeps(persistence, Engine)
    _keeps(persistence.saves, SaveStatus)
    _keeps(ClientState(), Waiter)
    plain = ServerState(Config())
    _keeps(Retention(plain, lambda: None), RetentionHooks)
    _keeps(plain, KeyspaceOwner)
    _keeps(plain.persistence, KeyRemovals)
    _keeps(persistence, KeyRemovals)
    _keeps(ClientState(), Watcher)
    loop = asyncio.new_event_loop()
    try:
        server = Server(plain, loop)
        _keeps(server, Front)
        _keeps(server, LoopOwner)
        netloop = NetLoop(server)
        try:
            _keeps(netloop, LoopUser)
        finally:
            netloop.close()
        _keeps(CTransport.__new__(CTransport), ConnectionUser)
    finally:
        loop.close()
    assert persistence.replay is execute


def test_the_server_starts_without_importing_numpy() -> None:
    """numpy is imported where it is used (Stream.append_joined, the Spark
    columns), not by what the server loads at start-up: it would cost every
    server process ~11 MB of memory and its import time."""
    import subprocess
    import sys

    program = (
        "import sys, rcp11.__main__, rcp11.server, rcp11.commands, rcp11.persistence, "
        "rcp11.storage; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
