"""Build recipe for the Redis module rcp11/rcp11.so (src/module.c, with its
offset reservations src/module_reserve.c and their file
src/module_offsets_file.c, its acknowledged groups src/module_ack.c, and
the data types' serialising callbacks src/module_rdb.c;
plus the storage core src/macronode.c and the group state src/ackgroup.c,
unchanged).

setup.py runs it from build_ext, so `pip install .` (and `pip install -e .`)
ship the module as package data next to the cffi extension; `python -m rcp11
module-path` prints where it landed. The C cores are compiled with
src/module_alloc.h force-included, which routes their allocations to
RedisModule_Alloc so that Redis's used_memory and maxmemory see them.

Environment (for CI's sanitizer run): RCP11_MODULE_CFLAGS and
RCP11_MODULE_LDFLAGS are appended to the compile and link lines.

    python src/build_module.py OUTPUT.so     builds one module directly
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_FILE = "rcp11.so"  # inside the rcp11 package

# -fvisibility=hidden: only RedisModule_OnLoad is exported, so the core's
# symbols cannot clash with another module's.
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def build(output: str, build_temp: str, extra_cflags: list[str] | None = None) -> str:
    """Compile and link the module into `output`; returns it."""
    cflags = CFLAGS + shlex.split(os.environ.get("RCP11_MODULE_CFLAGS", "")) + (extra_cflags or [])
    ldflags = shlex.split(os.environ.get("RCP11_MODULE_LDFLAGS", ""))
    os.makedirs(build_temp, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    cc = _compiler()
    objects = []
    # The C cores allocate through Redis (module_alloc.h); the module's own
    # files call RedisModule_Alloc themselves.
    alloc = ["-include", os.path.join(HERE, "module_alloc.h")]
    units = [
        ("macronode.c", alloc),
        ("ackgroup.c", alloc),
        ("module.c", []),
        ("module_reserve.c", []),
        ("module_offsets_file.c", []),
        ("module_ack.c", []),
        ("module_rdb.c", []),
    ]
    for source, extra in units:
        obj = os.path.join(build_temp, source.replace(".c", ".module.o"))
        _run([*cc, *cflags, *extra, "-I", HERE, "-c", os.path.join(HERE, source), "-o", obj])
        objects.append(obj)
    _run([*cc, "-shared", *cflags, *objects, "-lz", *ldflags, "-o", output])
    return output


def _run(argv: list[str]) -> None:
    print(" ".join(shlex.quote(a) for a in argv), flush=True)
    subprocess.run(argv, check=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as temp:
        build(argv[0], temp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
