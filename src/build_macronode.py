"""cffi recipe for rcp11._macronode (API mode, out of line): the storage
core (src/macronode.c), the state of acknowledged groups (src/ackgroup.c),
the C lane in front of the Python commands (src/lane.c) and its event loop
(src/netloop.c), in one extension so the lane calls the core directly.

The cdef is read from src/macronode.h, src/ackgroup.h, src/lane.h and
src/netloop.h between their CDEF markers, so the C headers stay the single description
of the API. The
lane's key resolver is a Python callback (extern "Python").
"""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = ("macronode.h", "ackgroup.h", "lane.h", "netloop.h")

# The lane asks Python about each new key through this callback (its type
# is lane_resolve_fn; rcp11/storage/lane.py defines it); the C lane's event
# loop (src/netloop.c) calls the nl_ ones (rcp11/storage/netloop.py).
_EXTERN_PYTHON = """
extern "Python" int lane_resolve_key(struct lane_call *call, const char *key,
                                     size_t key_len, mn_stream **stream,
                                     ag_group **group, uint64_t *write_limit);
extern "Python" int nl_resolve_key(nl_loop *loop, const char *key, size_t key_len,
                                   mn_stream **stream, ag_group **group,
                                   uint64_t *write_limit);
extern "Python" void nl_on_data(nl_loop *loop, void *owner, const char *data, size_t len);
extern "Python" void nl_on_closed(void *owner, int err);
extern "Python" void nl_on_water(void *owner, int over);
"""


def _cdef_text() -> str:
    parts = []
    for name in HEADERS:
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            text = f.read()
        match = re.search(r"/\* CDEF-BEGIN \*/(.*)/\* CDEF-END \*/", text, re.S)
        if match is None:
            raise RuntimeError(f"{name} lost its CDEF-BEGIN/CDEF-END markers")
        parts.append(match.group(1))
    return "\n".join(parts) + _EXTERN_PYTHON


def _extra_compile_args() -> list[str]:
    args = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
    # RCP11_CFLAGS lets CI build a sanitized extension without a second recipe.
    args += os.environ.get("RCP11_CFLAGS", "").split()
    return args


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "rcp11._macronode",
    '#include "macronode.h"\n#include "ackgroup.h"\n#include "lane.h"\n#include "netloop.h"',
    sources=[
        os.path.relpath(os.path.join(HERE, name))
        for name in ("macronode.c", "ackgroup.c", "lane.c", "netloop.c")
    ],
    include_dirs=[os.path.relpath(HERE)],
    libraries=["z"],
    extra_compile_args=_extra_compile_args(),
    extra_link_args=os.environ.get("RCP11_LDFLAGS", "").split(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
