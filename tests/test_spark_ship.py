"""What ``register(spark)`` ships (rcp11/spark/ship.py): every rcp11 module
the data source imports, followed import by import, is in the zip, so an
executor that never installed rcp11 can import it; nothing of the server
side goes. Fast and without Spark; tests/test_spark_cluster.py runs the zip
on real executors."""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

from rcp11.spark.ship import VENDOR_DIR, client_zip

PACKAGE = Path(__file__).resolve().parent.parent / "rcp11"


def _module_file(name: str) -> Path | None:
    """The file of rcp11 module `name`, or None when it is not one."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(path: Path) -> set[str]:
    """The rcp11 modules this file imports anywhere (functions included:
    the data source imports pyspark-side code lazily)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in found if n.split(".")[0] == "rcp11" and _module_file(n)}


def _needed_by_the_data_source() -> set[str]:
    """Every rcp11 file reached from rcp11.spark's modules, as zip names;
    a module's parent packages count, since importing it runs them."""
    todo = [f"rcp11.spark.{p.stem}" for p in (PACKAGE / "spark").glob("*.py")]
    todo = [name.removesuffix(".__init__") for name in todo]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        module_file = _module_file(name)
        assert module_file is not None, name
        todo += sorted(_imports(module_file))
    return {
        str(_module_file(name).relative_to(PACKAGE.parent))  # type: ignore[union-attr]
        for name in seen
    }


def test_the_zip_holds_every_rcp11_module_the_data_source_imports() -> None:
    with zipfile.ZipFile(client_zip()) as archive:
        names = set(archive.namelist())
    needed = _needed_by_the_data_source()
    # The error texts are a package of several rooms: all of them are needed.
    assert {"rcp11/errors/__init__.py", "rcp11/errors/spark.py"} <= needed
    assert needed <= names, sorted(needed - names)
    # The client side only: no server, no C core.
    shipped = {n for n in names if not n.startswith(f"{VENDOR_DIR}/")}
    assert not [
        n for n in shipped if n.startswith(("rcp11/server/", "rcp11/commands/", "rcp11/storage/"))
    ]


def test_the_shipped_zip_imports_the_data_source_alone(tmp_path: Path) -> None:
    """A fresh interpreter that finds rcp11 in the zip first imports the data
    source and formats an error text from every room it uses."""
    import subprocess

    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import rcp11, rcp11.spark.datasource, rcp11.errors as e;"
        "assert rcp11.__file__.startswith(sys.argv[1]), rcp11.__file__;"
        "print(e.spark_not_a_stream('s')); print(e.WRONGTYPE)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, client_zip()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "rcp11 data source: key 's' is not a stream (WRONGTYPE)",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ]
