"""rcp11: a Redis-protocol server for antirez's RCP 11 stream data type.

Importing the package loads nothing else: rcp11.client needs no C and no
server code.

Run from a source checkout after `pip install .` (not -e), Python finds the
checkout's rcp11/ first (`python -m` puts the current directory at the head
of sys.path), and that copy has no compiled parts: pip built them into the
environment. This package then steps aside for the installed one, so
`python -m rcp11 ...`, the examples and the benchmarks run the build the
Quick start made. A checkout with its own build (`pip install -e .`) is
used as it is.
"""

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES

# The one place the version is written: pyproject.toml reads it from here
# (setuptools' dynamic `attr`), the server, INFO and the CLIs import it.
__version__ = "0.1.0"


def _has_build(package_dir: str) -> bool:
    """Whether the storage core is compiled in package_dir for this Python."""
    return any(
        os.path.isfile(os.path.join(package_dir, "_macronode" + suffix))
        for suffix in EXTENSION_SUFFIXES
    )


def _installed_copy() -> str | None:
    """The directory of an installed, built rcp11 to use instead of this
    one, or None: only when this is an unbuilt source checkout (the C core's
    sources beside it; a zip Spark ships or an installed copy never is)."""
    here = os.path.dirname(os.path.realpath(__file__))
    checkout = os.path.dirname(here)
    if _has_build(here) or not os.path.isfile(os.path.join(checkout, "src", "macronode.c")):
        return None
    for entry in sys.path:
        candidate = os.path.realpath(os.path.join(entry or os.getcwd(), "rcp11"))
        if candidate == here or not os.path.isfile(os.path.join(candidate, "__init__.py")):
            continue
        if _has_build(candidate):
            return candidate
    return None


def _use_installed_copy(package_dir: str) -> None:
    """Put the installed package in this one's place in sys.modules; the
    import that is running now then hands that one out (importlib takes
    what sys.modules holds once the package's code has run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        __name__,
        os.path.join(package_dir, "__init__.py"),
        submodule_search_locations=[package_dir],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


_installed = _installed_copy()
if _installed is not None:
    _use_installed_copy(_installed)
