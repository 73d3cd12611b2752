"""Our error messages first in what Spark shows.

Every method Spark calls on the data source runs in a Python worker. A
failure reaches the user as Spark's line (`[PYTHON_DATA_SOURCE_ERROR] Failed
to create Python data source instance: `, `PythonException: ...`) followed
by the worker's text for the exception: by default the traceback, with the
message last, under the rest. The worker formats that text when the
exception leaves its loop and then exits; it leaves the traceback out when
SPARK_HIDE_TRACEBACK is set in its environment at that moment (what
`spark.sql.execution.pyspark.udf.hideTraceback.enabled` does).

So when one of our own errors (its message starts with errors.SPARK_PREFIX:
a bad option, data loss, an unreachable server...) leaves a method Spark
called, inside a Spark worker, this sets SPARK_HIDE_TRACEBACK for that
worker: Spark's line is then followed by our message alone. Our messages
say what to change; their tracebacks would only show where the check is.
Anything else (a bug) keeps its traceback, and so does every error outside
Spark's workers (tests, the driver's own calls).

This file is shipped to executors with the rest of the package (ship.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from rcp11.errors.spark import SPARK_PREFIX

F = TypeVar("F", bound=Callable[..., Any])

# Every method Spark calls on a data source, its readers and its writers.
SPARK_CALLS = (
    "__init__",
    "schema",
    "reader",
    "streamReader",
    "writer",
    "streamWriter",
    "partitions",
    "read",
    "initialOffset",
    "latestOffset",
    "reportLatestOffset",
    "prepareForTriggerAvailableNow",
    "commit",
    "abort",
    "write",
    "stop",
)


def _in_spark_worker() -> bool:
    """A Python process Spark started for a task or a planning step: its
    main module is one of PySpark's (pyspark.daemon, pyspark.worker,
    pyspark.sql.worker.*, the streaming runners)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return bool(spec and spec.name.startswith("pyspark."))


def message_first(exc: BaseException) -> None:
    """Make the Spark worker about to report exc show its message alone
    when exc is one of ours (see above)."""
    if str(exc).startswith(SPARK_PREFIX) and _in_spark_worker():
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def _guarded_iterator(items: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from items
    except Exception as exc:
        message_first(exc)
        raise


def _guard(method: F) -> F:
    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except Exception as exc:
            message_first(exc)
            raise
        if inspect.isgenerator(result):
            return _guarded_iterator(result)
        return result

    return guarded  # type: ignore[return-value]


def guard_methods(cls: type, names: tuple[str, ...]) -> None:
    """Wrap the methods Spark calls on cls (those cls defines itself). Call
    it in the module that defines cls: Spark's workers unpickle a reader
    or writer by its class's module alone."""
    for name in names:
        method = cls.__dict__.get(name)
        if callable(method):
            setattr(cls, name, _guard(method))
