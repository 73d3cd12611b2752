"""The network front end of rcp11-server, one file per job:

    startup.py        the command line, config, logging, wiring, main()
    listeners.py      Server: listeners, connections, the flush, cron, shutdown
    sockets.py        binding TCP addresses and the unix socket
    connection.py     Connection: one client's read path and output
    admission.py      who may connect (maxclients, protected mode), its ClientState
    output_limits.py  client-output-buffer-limit and backpressure marks
    trim.py           memory freed by deletions given back (malloc_trim)

It knows no command names and formats no replies: commands run through
rcp11.commands.run_pipeline().
"""

from __future__ import annotations

from rcp11.server.connection import Connection
from rcp11.server.listeners import Server
from rcp11.server.startup import load_config, main, run

__all__ = ["Connection", "Server", "load_config", "main", "run"]
