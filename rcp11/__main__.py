"""python -m rcp11 server|produce|consume|bench ... (see --help)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "server":
        from rcp11.server import main as server_main

        return server_main(args[1:]) or 0
    from rcp11.cli import main as cli_main

    return cli_main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
