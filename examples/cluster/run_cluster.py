"""Start a Redis Cluster of rcp11 module nodes on this machine and run the
Spark pipeline example (examples/spark_pipeline.py) against it.

    .venv/bin/python examples/cluster/run_cluster.py            # 3 primaries + 3 replicas, live
    .venv/bin/python examples/cluster/run_cluster.py -- --once  # arguments after -- go to the pipeline
    .venv/bin/python examples/cluster/run_cluster.py --keep     # leave the cluster running afterwards

Each node is ``redis-server --loadmodule "$(python -m rcp11 module-path)"``
with cluster mode on, listening on 127.0.0.1 (a free port, and its cluster
bus port 10000 above it), with its files in a temporary directory. The
cluster is made with ``redis-cli --cluster create``. The pipeline is given
one node's port; the rcp11 Spark source and sink find the cluster from it
(option ``cluster``, auto-detected) and read and write each stream on the
primary that owns it. Needs redis-server and redis-cli 7.0 or later.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
PIPELINE = HERE.parent / "spark_pipeline.py"
# redis-cli's --cluster create, and each node's cluster view, settle in
# seconds on loopback; give a slow machine ample time.
SETTLE_TIMEOUT_S = 60.0
NODE_TIMEOUT_MS = 3000


def module_path() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rcp11", "module-path"], capture_output=True, text=True
    )
    path = done.stdout.strip()
    if done.returncode != 0 or not os.path.isfile(path):
        # module-path says what is missing and how to build it.
        raise SystemExit(done.stderr.strip() or f"the rcp11 Redis module is not built ({path})")
    return path


def free_node_port(taken: Collection[int] = ()) -> int:
    """A free port whose cluster bus port (+10000) is free as well, and not
    one of `taken` (ports handed out for nodes that do not listen yet).
    The tests' clusters (tests/harness/cluster.py) take theirs here too."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port in taken or port + 10000 > 65535:
            continue
        try:
            with socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise SystemExit("no free port pair for a cluster node")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


class Cluster:
    """The nodes' processes and where their files are."""

    def __init__(self, primaries: int, replicas: int, directory: Path) -> None:
        self.directory = directory
        self.ports: list[int] = []
        self.processes: list[subprocess.Popen] = []
        try:
            self._start(primaries, replicas)
        except BaseException:  # a node that would not start, a timeout, Ctrl-C
            self.stop()
            raise

    def _start(self, primaries: int, replicas: int) -> None:
        directory = self.directory
        module = module_path()
        for _ in range(primaries * (1 + replicas)):
            port = free_node_port(self.ports)
            node_dir = directory / str(port)
            node_dir.mkdir(parents=True)
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
            argv += ["--loadmodule", module, "--cluster-enabled", "yes"]
            argv += ["--cluster-config-file", "nodes.conf"]
            argv += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
            argv += ["--appendonly", "yes", "--dir", str(node_dir)]
            argv += ["--logfile", str(node_dir / "redis.log")]
            self.processes.append(subprocess.Popen(argv))
            self.ports.append(port)
        for port in self.ports:
            wait_until(lambda port=port: answers(port), f"the node on port {port}")
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        create = ["redis-cli", "--cluster", "create", *addresses]
        create += ["--cluster-replicas", str(replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=SETTLE_TIMEOUT_S)
        if done.returncode != 0:
            raise SystemExit("redis-cli --cluster create failed:\n" + done.stdout + done.stderr)
        for port in self.ports:
            wait_until(lambda port=port: self.state(port) == "ok", f"cluster_state:ok on {port}")

    @staticmethod
    def state(port: int) -> str:
        try:
            return str(redis.Redis(port=port).cluster("info")["cluster_state"])
        except redis.RedisError:
            return "unreachable"

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passed = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--primaries", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1, help="replicas per primary")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--dir", default=None, help="where the nodes keep their files")
    args = parser.parse_args(own)
    for program in ("redis-server", "redis-cli"):
        if shutil.which(program) is None:
            raise SystemExit(f"{program} is not installed (Debian: apt-get install redis)")

    # A directory of our own goes when the nodes stop; one given by --dir,
    # or the nodes' files while --keep leaves them running, stays.
    temporary = args.dir is None
    directory = Path(args.dir or tempfile.mkdtemp(prefix="rcp11-cluster-"))
    try:
        cluster = Cluster(args.primaries, args.replicas, directory)
    except BaseException:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    print(f"cluster of {args.primaries} primaries up on ports {cluster.ports}", flush=True)
    print(f"node files in {directory}", flush=True)
    try:
        pipeline = [sys.executable, str(PIPELINE), "--port", str(cluster.ports[0]), *passed]
        return subprocess.run(pipeline).returncode
    finally:
        if args.keep:
            print(f"left running: redis-cli -c -p {cluster.ports[0]}", flush=True)
        else:
            cluster.stop()
            if temporary:
                shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
