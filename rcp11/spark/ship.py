"""The zip ``register(spark)`` ships to executors: the client-side modules
of rcp11 (never the server or the C core) and, off sys.path under
``_vendor/``, the driver's redis-py for executors that have none.

The zip is named after a hash of its content, so a second register() in
the same application adds nothing and a changed package gets a new name
(Spark refuses two different files under one name).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import rcp11

# Inside the shipped zip, redis-py sits here, off sys.path: an executor's own
# redis-py (and its hiredis) wins; this one is used only when there is none
# (rcp11/spark/__init__.py). Defined here, in a module that package
# imports, so the name has one definition.
VENDOR_DIR = "_vendor"

# What an executor needs to read and write: the client, the error texts,
# the data source. Nothing here imports rcp11's server side or its C core.
# Packages go whole (every .py in them), so a module added to one ships too.
CLIENT_MODULES = ("__init__.py",)
CLIENT_PACKAGES = ("client", "errors", "spark")

_built: dict[str, str] = {}


def _files() -> list[tuple[str, Path]]:
    """(name inside the zip, file on disk), sorted."""
    package = Path(rcp11.__file__).parent
    files = [(f"rcp11/{name}", package / name) for name in CLIENT_MODULES]
    for sub in CLIENT_PACKAGES:
        files += [(f"rcp11/{sub}/{p.name}", p) for p in sorted((package / sub).glob("*.py"))]
    try:
        import redis
    except ImportError:  # pragma: no cover - redis-py is a dependency of rcp11
        return files
    redis_dir = Path(redis.__file__).parent
    for path in sorted(redis_dir.rglob("*.py")):
        files.append((f"{VENDOR_DIR}/redis/{path.relative_to(redis_dir)}", path))
    return files


def client_zip() -> str:
    """Path of the zip for this package's current content (built once)."""
    files = _files()
    digest = hashlib.sha256()
    contents = []
    for name, path in files:
        data = path.read_bytes()
        digest.update(name.encode() + b"\0" + data)
        contents.append((name, data))
    key = digest.hexdigest()[:16]
    if key in _built and os.path.exists(_built[key]):
        return _built[key]
    directory = tempfile.mkdtemp(prefix="rcp11-spark-")
    # Spark serves the file to executors from here for as long as the
    # application runs: it goes when the driver's Python exits.
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = os.path.join(directory, f"rcp11-spark-{key}.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents:
            # A fixed timestamp: the same content gives the same zip bytes.
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    _built[key] = path
    return path
