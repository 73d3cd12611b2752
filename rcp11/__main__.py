"""python -m rcp11 server|module-path|produce|consume|bench ... (see --help)."""

from __future__ import annotations

import sys
from pathlib import Path

from rcp11.stdio import quiet_broken_pipe

# The Redis module is package data, built by `pip install .` next to this file.
MODULE_FILE = "rcp11.so"

_MODULE_PATH_HELP = """\
usage: rcp11 module-path (or: python -m rcp11 module-path)

Print the path of the rcp11 Redis module (built by `pip install .`), so that
redis-server 7.0 or newer can load it:

    redis-server --loadmodule "$({python} -m rcp11 module-path)"

It adds TWRITE, TREAD, TEVICT and TCONCAT and the data type rcp11-log to
redis-server; its configs are rcp11.stream-node-max-entries,
rcp11.stream-compression and rcp11.stream-compression-level.
Exits with status 1 when the module was not built.
"""


def module_path() -> Path:
    """Where the Redis module lives (it may not exist: see module_main)."""
    return Path(__file__).resolve().parent / MODULE_FILE


def module_main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        # The Python running this is the one with the module: show it in full
        # (`python` alone may be another one, or none, as on Debian).
        print(_MODULE_PATH_HELP.format(python=sys.executable), end="")
        return 0
    if args:
        print(f"module-path takes no arguments (got {args[0]!r}); see --help", file=sys.stderr)
        return 2
    path = module_path()
    if not path.is_file():
        print(
            f"the Redis module was not built ({path} is missing): run pip install .",
            file=sys.stderr,
        )
        return 1
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return quiet_broken_pipe(lambda: _main(args))


def _main(args: list[str]) -> int:
    if args and args[0] == "server":
        from rcp11.server import main as server_main

        return server_main(args[1:]) or 0
    if args and args[0] == "module-path":
        return module_main(args[1:])
    from rcp11.cli import main as cli_main

    return cli_main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
