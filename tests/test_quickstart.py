"""The Quick start as a new user follows it, and then every command
README.md and docs/ show, run as they are written.

A clean clone of HEAD; a virtual environment made by Debian's own python3
(PEP 668: nothing installs outside it); `pip install .`, not -e, so the
checkout holds no build of its own while `python -m` puts the checkout
first on sys.path; a shell with nothing of the test run's environment
(no VIRTUAL_ENV, no PYTHONPATH, Debian's python3 first on PATH). Every
command runs from the clone's directory, and each is first looked up in
the document that shows it, so the documents and this test cannot drift
apart. Ports are free ones instead of 6379: that is the only change made
to a command (plus a bound on the ones that run forever).

Not run here: ./run-tests.sh, benchmarks and fuzzers (the developer's
tools; the rest of the suite runs them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, answers_ping, free_port, require, wait_for

pytestmark = pytest.mark.slow

DEBIAN_PYTHON = Path("/usr/bin/python3")
README = REPO / "README.md"
MODULE_DOC = REPO / "docs" / "MODULE.md"
CLUSTER_README = REPO / "examples" / "cluster" / "README.md"


def documented(doc: Path, command: str) -> str:
    """command, after checking that doc shows it as it is."""
    assert command in doc.read_text(), f"{doc.name} no longer shows: {command}"
    return command


def code_block(doc: Path, after: str, language: str = "") -> str:
    """The first fenced block (```language) after the text `after`."""
    text = doc.read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start : text.index("```", start)]


def indented_lines(doc: Path, after: str, until: str) -> list[str]:
    """The indented (code) lines of doc between two texts, indent removed."""
    text = doc.read_text()
    start = text.index(after)
    part = text[start : text.index(until, start)]
    return [line[4:] for line in part.splitlines() if line.startswith("    ")]


class Shell:
    """A new user's shell in the clone: their environment, not the tests'."""

    def __init__(self, clone: Path, tmp: Path) -> None:
        self.clone = clone
        self.tmp = tmp
        ours = Path(sys.prefix) / "bin"
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != ours]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env.pop("PYSPARK_PYTHON", None)
        env["PATH"] = os.pathsep.join([str(DEBIAN_PYTHON.parent), *path])
        env["TMPDIR"] = str(tmp)  # what the commands leave behind is looked at
        self.env = env

    def run(self, command: str, timeout: float = 600, **env: str) -> str:
        """Run a shell command line; its stdout (a failure shows everything)."""
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.clone,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def start(self, command: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.clone,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def leftovers(self) -> list[str]:
        """What our programs left in the temporary directory."""
        return sorted(p.name for p in self.tmp.iterdir() if p.name.startswith("rcp11"))


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """The clone, after the Quick start's install."""
    require("git")
    require("redis-server")
    require("redis-cli")
    if not DEBIAN_PYTHON.is_file() or not (REPO / ".git").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs {DEBIAN_PYTHON} and a git checkout")
        pytest.skip(f"needs {DEBIAN_PYTHON} and a git checkout")
    base = tmp_path_factory.mktemp("quickstart")
    clone, tmp = base / "rcp11", base / "tmp"
    tmp.mkdir()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", head], check=True)
    user = Shell(clone, tmp)
    quick_start = documented(
        README,
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/rcp11-server redis.conf",
    )
    install, _, _ = quick_start.rpartition(" && ")
    user.run(install)
    assert not list((clone / "rcp11").glob("_macronode*")), "pip install . built into the checkout"
    yield user
    shutil.rmtree(base, ignore_errors=True)  # the environment alone is ~100 MB (~800 with Spark)


def stop(process: subprocess.Popen[str], port: int) -> None:
    subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"], capture_output=True)
    try:
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_up(process: subprocess.Popen[str], port: int) -> None:
    assert wait_for(lambda: answers_ping(port) or process.poll() is not None, timeout=60)
    assert process.poll() is None, process.stdout.read() if process.stdout else ""


def test_rcp11_server_on_the_shipped_config_answers_the_readme_session(shell: Shell) -> None:
    """.venv/bin/rcp11-server redis.conf, then README's "Using it" session
    with redis-cli, reply for reply."""
    port = free_port()
    server = shell.start(f".venv/bin/rcp11-server redis.conf --port {port}")
    try:
        wait_up(server, port)
        lines = indented_lines(README, "## Using it", "Commands (")
        commands = [i for i, line in enumerate(lines) if line.startswith("$ redis-cli ")]
        assert len(commands) >= 7
        for n, at in enumerate(commands):
            end = commands[n + 1] if n + 1 < len(commands) else len(lines)
            argv = shlex.split(lines[at][len("$ redis-cli ") :], comments=True)
            done = subprocess.run(
                ["redis-cli", "-p", str(port), "--no-raw", *argv],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.stdout.rstrip("\n").splitlines() == lines[at + 1 : end], lines[at]
        info = subprocess.run(
            ["redis-cli", "-p", str(port), "INFO", "server"], capture_output=True, text=True
        ).stdout
        assert f"executable:{shell.clone}/.venv/bin/rcp11-server" in info.splitlines()
    finally:
        stop(server, port)
    # A clean stop leaves the data (in the checkout: dir ./) and no lock;
    # git sees none of it.
    assert (shell.clone / "appendonly.aof").exists()
    assert not (shell.clone / "rcp11.lock").exists()
    assert shell.run("git status --porcelain") == ""


def test_the_module_loads_into_redis_server_from_module_path(shell: Shell) -> None:
    command = 'redis-server --loadmodule "$(.venv/bin/python -m rcp11 module-path)"'
    documented(README, command)
    documented(MODULE_DOC, command)
    path = Path(shell.run(".venv/bin/python -m rcp11 module-path").strip())
    assert path.is_file() and shell.clone / ".venv" in path.parents
    assert Path(shell.run(".venv/bin/rcp11 module-path").strip()) == path
    port = free_port()
    data = shell.tmp / "module-data"
    data.mkdir()
    server = shell.start(f"{command} --port {port} --save '' --dir {data}")
    try:
        wait_up(server, port)
        cli = ["redis-cli", "-p", str(port)]
        assert (
            subprocess.run([*cli, "TWRITE", "k", "hi"], capture_output=True, text=True).stdout
            == "0\n"
        )
        assert (
            subprocess.run([*cli, "TREAD", "k", "0", "1"], capture_output=True, text=True).stdout
            == "hi\n"
        )
    finally:
        stop(server, port)
    shutil.rmtree(data)


def test_python_m_rcp11_server_the_cli_and_the_client(shell: Shell) -> None:
    """`.venv/bin/python -m rcp11 server`, README's command-line lines
    against it, and its Python client snippet."""
    documented(README, "`.venv/bin/python -m rcp11 server ...` is the same")
    port = free_port()
    data = shell.tmp / "server-data"
    data.mkdir()
    server = shell.start(f".venv/bin/python -m rcp11 server --port {port} --dir {data}")
    try:
        wait_up(server, port)
        lines = indented_lines(README, "## Command line", "```python")
        assert len(lines) >= 5
        outputs = {}
        for line in lines:
            command = (
                line.split("  #")[0]
                .strip()
                .replace(".venv/bin/rcp11 ", f".venv/bin/rcp11 -p {port} ")
            )
            if "--follow" in command:
                follower = shell.start(command)
                try:
                    assert follower.stdout is not None
                    outputs[line] = [follower.stdout.readline().strip() for _ in range(3)]
                finally:
                    follower.kill()
                    follower.wait()
            else:
                outputs[line] = shell.run(command, timeout=120).splitlines()
        by_verb = {re.sub(r"\s+#.*", "", k).split("rcp11 ")[1]: v for k, v in outputs.items()}
        assert by_verb["consume nums --from -10"] == [str(n) for n in range(999_991, 1_000_001)]
        assert by_verb["consume nums --group g --follow"] == ["1", "2", "3"]
        assert len(by_verb["consume nums --since 10m"]) == 1_000_000
        timed = [line.split("\t") for line in by_verb["consume nums --from -3 --offsets --times"]]
        assert [(offset, message) for offset, _, message in timed] == [
            (str(n - 1), str(n)) for n in range(999_998, 1_000_001)
        ]
        assert all(abs(int(ms) - time.time() * 1000) < 3_600_000 for _, ms, _ in timed)
        assert "length: 1000000" in by_verb["info nums"]
        assert by_verb["streams -l"][1].split() == ["nums", "0", "999999", "1000000", "1000000"]
        # The follower printed three lines, but its reads moved the group by
        # whole batches: a group read is the acknowledgement.
        group, stream, current, end, lag = by_verb["groups nums g"][1].split()
        assert (group, stream, end) == ("g", "nums", "1000000")
        assert int(current) >= 3 and int(lag) == 1_000_000 - int(current)

        snippet = code_block(README, "## Command line", "python").replace(
            "port=6379", f"port={port}"
        )
        # `python -c` puts the current directory (the clone) first on
        # sys.path, as the REPL does: `import rcp11` finds the checkout.
        client = shell.start(f".venv/bin/python -c {shlex.quote(snippet)}", PYTHONUNBUFFERED="1")
        try:
            assert client.stdout is not None
            assert [client.stdout.readline().strip() for _ in range(2)] == ["0 b'a'", "1 b'b'"]
        finally:
            client.kill()
            client.wait()
    finally:
        stop(server, port)
    shutil.rmtree(data)


@pytest.fixture(scope="module")
def spark_shell(shell: Shell) -> Shell:
    require("java")
    shell.run(documented(README, ".venv/bin/pip install '.[spark]'"))
    return shell


def keys(port: int) -> list[str]:
    """The server's keys, as redis-cli lists them."""
    done = subprocess.run(
        ["redis-cli", "-p", str(port), "--raw", "KEYS", "*"], capture_output=True, text=True
    )
    return sorted(done.stdout.split())


def counts_shown(output: str) -> Counter[tuple[str, str]]:
    """The pipeline example's counts, each (window, action) shown once."""
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    counts = Counter({(r["window"], r["action"]): r["count"] for r in rows})
    assert len(counts) == len(rows)
    return counts


def test_the_spark_snippet_and_the_pipeline_example(spark_shell: Shell) -> None:
    """README's Spark snippet with PYSPARK_PYTHON exported as it says, then
    examples/spark_pipeline.py --once twice against the same server, as a
    user reruns it: each run shows its own counts (no double counts from
    the earlier run), removes its keys and leaves no directory behind.
    (Starting a server of its own when nothing answers:
    test_spark_example.py.)"""
    shell = spark_shell
    port = free_port()
    data = shell.tmp / "spark-data"
    data.mkdir()
    server = shell.start(f".venv/bin/rcp11-server --port {port} --dir {data}")
    try:
        wait_up(server, port)
        subprocess.run(
            ["redis-cli", "-p", str(port), "TWRITE", "events", "ENTRIES", "x", "y"],
            check=True,
            capture_output=True,
        )
        snippet = code_block(README, "### Spark", "python")
        snippet = snippet.replace('.option("port", 6379)', "").replace(
            '.format("rcp11")', f'.format("rcp11").option("port", {port})'
        )
        snippet = snippet.replace('"/tmp/copy"', repr(str(shell.tmp / "copy")))
        # The streaming copy starts at the end of `events` (Kafka's default):
        # one message written once it runs is what it copies.
        snippet += (
            "\nquery = spark.streams.active[0]\n"
            "query.processAllAvailable()\n"
            "from rcp11.client import Client\n"
            f"Client(port={port}).twrite('events', b'z')\n"
            "query.processAllAvailable()\n"
            f"print(spark.read.format('rcp11').option('port', {port}).load('copy').count())\n"
        )
        script = shell.tmp / "spark_snippet.py"
        script.write_text(snippet)
        export = documented(README, "export PYSPARK_PYTHON=$PWD/.venv/bin/python")
        out = shell.run(f"{export} && .venv/bin/python {script}")
        shown = [line.replace(" ", "") for line in out.splitlines()]
        assert "|text|" in shown and "|x|" in shown and "|y|" in shown
        assert out.strip().splitlines()[-1] == "1"
        shutil.rmtree(shell.tmp / "copy", ignore_errors=True)

        keys_before = keys(port)
        command = documented(README, ".venv/bin/python examples/spark_pipeline.py --once")
        for _ in range(2):
            out = shell.run(f"{command} --port {port} --events 1000")
            assert "starting a temporary one" not in out
            assert sum(counts_shown(out).values()) == 1000
            assert keys(port) == keys_before
            assert shell.leftovers() == []
    finally:
        stop(server, port)
    shutil.rmtree(data)


def test_the_cluster_example(spark_shell: Shell) -> None:
    """examples/cluster/run_cluster.py -- --once: module nodes loaded
    through `python -m rcp11 module-path` run from the checkout."""
    command = documented(README, ".venv/bin/python examples/cluster/run_cluster.py -- --once")
    documented(CLUSTER_README, command)
    out = spark_shell.run(command)
    assert "cluster of 3 primaries up on ports" in out
    assert sum(counts_shown(out).values()) == 5000
    assert spark_shell.leftovers() == []
