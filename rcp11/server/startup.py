"""Start-up: `rcp11-server [redis.conf] [--directive value ...]` (and
`python -m rcp11 server ...`). The command line and the config, daemonize,
logging, the open-files limit, then the wiring of the state, the front end
(listeners.py) and persistence, in the order redis-server binds and loads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from rcp11 import __version__
from rcp11.commands import execute, rename_command, serve_ready
from rcp11.config import Config, ConfigError
from rcp11.datafiles import release_data_dirs
from rcp11.libc import can_measure_unused, tune_malloc
from rcp11.limits import (
    MALLOC_MMAP_THRESHOLD,
    MALLOC_TRIM_THRESHOLD,
    MALLOC_TRIM_THRESHOLD_UNMEASURED,
    RESERVED_FDS,
    SERVE_SECONDS,
)
from rcp11.logs import VERBOSE, setup_logging
from rcp11.persistence import Persistence, PersistenceError
from rcp11.retention import Retention
from rcp11.server.listeners import Server
from rcp11.state import ServerState
from rcp11.stdio import quiet_broken_pipe

log = logging.getLogger("rcp11")

USAGE = """Usage: rcp11-server [/path/to/redis.conf] [options]
       rcp11-server -v or --version
       rcp11-server -h or --help

A Redis-protocol server for antirez's RCP 11 stream data type.

Options are config directives written as --name value, applied after the
config file (a value may be several words, e.g. --save 3600 1 300 100).

Examples:
       rcp11-server                    (built-in defaults: 127.0.0.1:6379)
       rcp11-server /etc/rcp11/redis.conf
       rcp11-server --port 7777 --appendonly yes --appendfsync always
       rcp11-server redis.conf --loglevel verbose --save ""
"""


def parse_command_line(argv: list[str]) -> tuple[str | None, list[str]]:
    """[config file] [--directive value ...] as redis-server takes them."""
    if argv and not argv[0].startswith("--"):
        return argv[0], argv[1:]
    return None, argv


def load_config(argv: list[str]) -> Config:
    path, args = parse_command_line(argv)
    config = Config()
    if path is not None:
        config.load_file(path)
    config.apply_args(args)
    config.check()
    apply_renames(config)
    return config


def apply_renames(config: Config) -> None:
    """The file's and the arguments' rename-command lines, in their order
    (as Redis applies them while it reads the file)."""
    for old, new, source, line, text in config.renames:
        try:
            rename_command(old, new)
        except ValueError as exc:
            raise ConfigError(str(exc), source=source, line=line, text=text) from None


def daemonize() -> None:
    """Detach like redis-server: double fork so the daemon is not a session
    leader (cannot reacquire a terminal), stdio to /dev/null."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)


def write_pidfile(path: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    except OSError as exc:
        log.warning("Failed to write PID file: %s", exc.strerror)
        return False


def adjust_open_files_limit(config: Config) -> None:
    """Raise the soft RLIMIT_NOFILE so maxclients connections fit; if the
    hard limit does not allow it, lower maxclients as Redis does."""
    try:
        import resource
    except ImportError:
        return
    wanted = config.get("maxclients") + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft < wanted:
        allowed = max(1, soft - RESERVED_FDS)
        log.warning(
            "You requested maxclients of %d requiring at least %d max file descriptors; "
            "the limit is %d, so maxclients is now %d.",
            config.get("maxclients"),
            wanted,
            soft,
            allowed,
        )
        config.set("maxclients", str(allowed))
    else:
        log.log(VERBOSE, "Increased maximum number of open files to %d", soft)


def new_event_loop() -> tuple[asyncio.AbstractEventLoop, str]:
    """uvloop's loop when it is installed (a dependency), else asyncio's;
    and its name for INFO's multiplexing_api."""
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed: running on asyncio's event loop (slower).")
        return asyncio.new_event_loop(), "asyncio"
    return uvloop.new_event_loop(), "uvloop"


def persistence_mode(config: Config) -> str:
    parts = []
    if config.get("appendonly"):
        parts.append(
            f"AOF ({config.get('appendfilename')}, appendfsync {config.get('appendfsync')})"
        )
    rules = config.get("save")
    if rules:
        parts.append("snapshots (save " + " ".join(f"{s} {c}" for s, c in rules) + ")")
    return " + ".join(parts) if parts else "none (data is lost on restart)"


def run(config: Config) -> int:
    """Everything after the configuration is known; returns the exit code."""
    if config.get("daemonize"):
        daemonize()
    setup_logging(config)
    pid = os.getpid()
    log.info("oO0OoO0OoO0Oo rcp11 is starting oO0OoO0OoO0Oo")
    log.info("rcp11 version=%s, bits=64, pid=%d, just started", __version__, pid)
    if config.path:
        log.info("Configuration loaded (file '%s')", config.path)
    else:
        log.warning(
            "Warning: no config file specified, using the default config. In order to "
            "specify a config file use rcp11-server /path/to/redis.conf"
        )
    adjust_open_files_limit(config)
    # Reply buffers from the heap, reused, not fresh mmap()s; freed memory
    # given back by the cron (limits.py).
    trim = MALLOC_TRIM_THRESHOLD if can_measure_unused() else MALLOC_TRIM_THRESHOLD_UNMEASURED
    tune_malloc(MALLOC_MMAP_THRESHOLD, trim)
    # Relative pidfile and logfile paths mean the directory the server was
    # started from, not `dir`.
    pidfile = os.path.abspath(config.get("pidfile")) if config.get("pidfile") else ""
    try:
        os.chdir(config.get("dir"))
    except OSError as exc:
        log.warning("Can't chdir to '%s': %s", config.get("dir"), exc.strerror)
        return 1
    loop, multiplexing_api = new_event_loop()
    asyncio.set_event_loop(loop)

    # Wired here, explicitly: the state, the front end on it, and the
    # persistence engine, which replays the AOF through the command layer.
    state = ServerState(config)
    state.multiplexing_api = multiplexing_api
    server = Server(state, loop)
    persistence = Persistence(state, execute)
    state.persistence = persistence
    state.retention = Retention(state, lambda: serve_ready(state))
    # Wake-ups of many blocked readers in slices: the loop serves the rest
    # (Server.flush schedules it), other clients get turns in between.
    state.serve_seconds = SERVE_SECONDS
    # The order matters (as redis-server): the port first, so "Address
    # already in use" comes before any data is read; then the data
    # directory's lock, so a second server on a directory in use stops
    # before it touches a file there (it once deleted the running server's
    # temporary files); then the unix socket and the pidfile; then the data.
    try:
        server.bind_tcp()
        persistence.lock_dir()
        server.bind_unix()
    except (SystemExit, PersistenceError) as exc:
        log.warning("%s", exc)
        release_data_dirs()  # if it was taken: the unix socket failed
        loop.close()
        return 1
    if pidfile:
        if not write_pidfile(pidfile):
            pidfile = ""
    log.info("rcp11 %s running standalone, port %d, pid %d", __version__, config.get("port"), pid)
    log.info("Persistence: %s", persistence_mode(config))
    log.info("Server initialized")
    try:
        persistence.load()
        state.apply_stream_settings()
    except Exception as exc:
        log.warning("Fatal error loading the data on disk: %s. Exiting.", exc)
        log.debug("Details:", exc_info=True)
        _remove_pidfile(pidfile)
        release_data_dirs()
        loop.close()
        return 1

    # Signal handlers before the listeners: once a listener accepts, a
    # client may see the server up, and a SIGTERM or Ctrl-C from then on
    # must shut down cleanly (save, AOF flush), not kill the process.
    for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
        loop.add_signal_handler(signum, server.on_signal, name)
    failed: list[SystemExit] = []

    async def start() -> None:
        try:
            await server.serve()
        except SystemExit as exc:
            failed.append(exc)
            loop.stop()
            return
        server.start_cron()
        if config.get("port"):
            log.info("Ready to accept connections tcp")
        if server.unix_path:
            log.info("Ready to accept connections unix")

    # The listeners start inside run_forever(), never in a run of their own:
    # uvloop sets signals aside while the loop is stopped, so a SIGINT sent
    # by a client that saw the server answer between two runs was lost.
    starting = loop.create_task(start())
    try:
        loop.run_forever()
    finally:
        if failed:
            log.warning("%s", failed[0])
        _remove_pidfile(pidfile)
        loop.close()
        # Last: every file of the directory is written by now.
        release_data_dirs()
        if not failed:
            log.warning("rcp11 is now ready to exit, bye bye...")
    del starting
    return 1 if failed else server.exit_code


def _remove_pidfile(path: str) -> None:
    if path:
        log.info("Removing the pid file.")
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return quiet_broken_pipe(lambda: _main(args))


def _main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args and args[0] in ("-v", "--version"):
        print(
            f"rcp11 server v={__version__} python={sys.version.split()[0]} "
            f"bits={64 if sys.maxsize > 2**32 else 32}"
        )
        return 0
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(exc.fatal_message(), file=sys.stderr)
        return 1
    return run(config)
