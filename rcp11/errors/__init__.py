"""Every error text rcp11 gives, in one package. This module (the
package's __init__) holds the exception classes and re-exports every text,
so code writes ``from rcp11 import errors`` and ``errors.WRONGTYPE``
without knowing which module of the package defines it.

Handlers raise CommandError(text); the dispatcher turns it into an -error
reply. Texts include their error code (ERR, WRONGTYPE, NOAUTH, OOM, ...).
Where a text belongs, by who reads it:

- wire.py: what any command and the request framing answer
- server.py: the server's own commands (connection, transactions, keys, admin)
- streams.py: the stream commands (TWRITE, TREAD, TSEEK, TCONCAT, groups)
- config.py: CONFIG SET, directive values refused, start-up and data directory
- spark.py: the Spark data source's (raised in Spark, never sent by the server)

The modules import nothing from this __init__ (only streams.py uses
wire.py), so the package has no cycle, and the whole of it is pure Python:
ship.py sends it to Spark executors as it is.
"""

from __future__ import annotations

# Each module's public names, re-exported: a text added to a module is
# reachable as errors.NAME at once, with no second list here to forget.
from rcp11.errors.config import *  # noqa: F403
from rcp11.errors.server import *  # noqa: F403
from rcp11.errors.spark import *  # noqa: F403
from rcp11.errors.streams import *  # noqa: F403
from rcp11.errors.wire import *  # noqa: F403


class CommandError(Exception):
    """A command failed with a client-visible error; nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(Exception):
    """The client sent bytes that are not RESP; the connection is closed
    after the error reply is written."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PersistenceError(Exception):
    """A persistence file cannot be loaded; the message names the file, the
    byte offset when known, and the problem."""
