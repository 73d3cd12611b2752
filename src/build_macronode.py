"""cffi recipe for rcp11._macronode (API mode, out of line).

The cdef is read from src/macronode.h between its CDEF markers, so the C
header stays the single description of the API.
"""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "macronode.h")


def _cdef_text() -> str:
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*)/\* CDEF-END \*/", text, re.S)
    if match is None:
        raise RuntimeError("macronode.h lost its CDEF-BEGIN/CDEF-END markers")
    return match.group(1)


def _extra_compile_args() -> list[str]:
    args = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
    # RCP11_CFLAGS lets CI build a sanitized extension without a second recipe.
    args += os.environ.get("RCP11_CFLAGS", "").split()
    return args


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "rcp11._macronode",
    '#include "macronode.h"',
    sources=[os.path.relpath(os.path.join(HERE, "macronode.c"))],
    include_dirs=[os.path.relpath(HERE)],
    libraries=["z"],
    extra_compile_args=_extra_compile_args(),
    extra_link_args=os.environ.get("RCP11_LDFLAGS", "").split(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
