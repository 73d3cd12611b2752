"""The data source on a standalone Spark cluster (a Master and a Worker
started from the pip-installed PySpark, on loopback) whose executors never
installed rcp11 nor redis-py: ``register(spark)`` ships them. A batch read
and write run the executors' side of streaming queries as well (the same
partition reader and staging writer); the driver side is the driver's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess, free_port, wait_for

from rcp11.client import Client

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]

# On the executors' PYTHONPATH (spark.executorEnv). In Python processes
# running in the Worker's directory (the executors'; the driver's own
# planning workers get the same environment but run elsewhere) it hides
# rcp11 and redis-py unless they come from a zip Spark shipped, as on a
# machine that never had them installed. The driver's machine has rcp11:
# its program imports it to call register().
HIDING_SITECUSTOMIZE = """
import importlib.machinery
import os
import sys

HIDDEN = {"rcp11", "redis"}
WORKER_DIR = %r


class ShippedOnly:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in HIDDEN:
            return None
        shipped = [entry for entry in sys.path if ".zip" in entry]
        spec = importlib.machinery.PathFinder.find_spec(name, shipped)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} on this worker", name=name)
        return spec


if os.getcwd().startswith(WORKER_DIR):
    sys.meta_path.insert(0, ShippedOnly)
"""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def http_json(url: str) -> Any:
    """The JSON at url, or None while the server is not up or not answering
    it yet (a Master starting up served its HTML page at /json/ once)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.load(reply)
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Spark's own standalone cluster (a Master and a Worker), not a Redis
    Cluster (the `cluster` fixture of the module's tests)."""
    workdir = tmp_path_factory.mktemp("cluster")
    hiding = workdir / "hiding"
    hiding.mkdir()
    work_dir = workdir / "work"
    (hiding / "sitecustomize.py").write_text(HIDING_SITECUSTOMIZE % str(work_dir))
    home = spark_home()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYTHONPATH", None)
    master_port, master_ui, worker_ui = free_port(), free_port(), free_port()
    spark_class = str(home / "bin" / "spark-class")
    processes = []
    log = open(workdir / "cluster.log", "ab")  # noqa: SIM115 (closed below)
    try:
        processes.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master"]
                + ["--host", "127.0.0.1", "--port", str(master_port)]
                + ["--webui-port", str(master_ui)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"spark://127.0.0.1:{master_port}"
        processes.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url]
                + ["--host", "127.0.0.1", "--webui-port", str(worker_ui)]
                + ["--cores", "2", "--memory", "1g", "--work-dir", str(work_dir)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        state = f"http://127.0.0.1:{master_ui}/json/"
        wait_for(lambda: (http_json(state) or {}).get("aliveworkers") == 1, timeout=120)
        yield {"url": url, "hiding": str(hiding)}
    finally:
        for process in processes:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def spark(spark_cluster: dict[str, Any]) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    # PySpark sends this with every Python function it runs on executors.
    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.Builder()  # not .builder: its options outlive sessions
        .master(spark_cluster["url"])
        .appName("rcp11-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .config("spark.executorEnv.PYTHONPATH", spark_cluster["hiding"])
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("OFF")
    yield session
    session.stop()
    if saved is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = saved


def import_on_executor(spark: Any, module: str) -> str:
    def attempt(_: Any) -> str:
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"ImportError: {exc}"
        return "imported"

    return spark.sparkContext.parallelize([0], 1).map(attempt).collect()[0]


def test_register_ships_the_client_to_executors_without_rcp11(
    spark: Any, shared_server: ServerProcess
) -> None:
    from rcp11.spark import register

    client = Client(port=shared_server.port)
    client.flushall()
    client.twrite("a", *[b"a%d" % i for i in range(500)])
    client.twrite("b", *[b"b%d" % i for i in range(300)])

    # The executors cannot import rcp11 (nor redis-py) on their own.
    assert import_on_executor(spark, "rcp11").startswith("ImportError")
    assert import_on_executor(spark, "redis").startswith("ImportError")

    register(spark)
    assert import_on_executor(spark, "rcp11.spark.datasource") == "imported"

    df = (
        spark.read.format("rcp11")
        .option("port", shared_server.port)
        .option("minPartitions", 3)
        .load("a,b")
    )
    assert df.count() == 800
    df.select("value").write.format("rcp11").option("port", shared_server.port).option(
        "stream", "copy"
    ).mode("append").save()
    assert sorted(client.tread("copy", 0, 1000)) == sorted(
        [b"a%d" % i for i in range(500)] + [b"b%d" % i for i in range(300)]
    )

    client.close()
