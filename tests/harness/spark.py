"""A local SparkSession with the rcp11 data source registered."""

from __future__ import annotations

import os
from typing import Any

# py4j's callback server (what foreachBatch calls back through) waits on its
# socket with select(), which fails for descriptors >= 1024; a long test
# session has more open by the time Spark starts. So a few low descriptors
# are held from the start and given to the callback server, started with
# the first Spark session (it lives as long as the process's gateway).
_LOW_FDS = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]


def _start_callback_server(session: Any) -> None:
    from pyspark.java_gateway import ensure_callback_server_started

    while _LOW_FDS:
        os.close(_LOW_FDS.pop())
    ensure_callback_server_started(session.sparkContext._gateway)


# What every test session adds to the package's local settings: a retry
# for a failed task (the default master "local[2,2]") and a quiet log.
def local_spark(
    app: str,
    master: str = "local[2,2]",
    settings: dict[str, str] | None = None,
    log_level: str = "OFF",
) -> Any:
    """rcp11.spark.local_session for one test module (or a driver a test
    runs), plus py4j's callback server on a low descriptor. The default
    master retries a failed task once; "local[2]" fails the job at once."""
    from rcp11.spark import local_session

    session = local_session(app, master, settings, log_level)
    _start_callback_server(session)
    return session
