"""The Redis module built with AddressSanitizer and UBSan, loaded into
redis-server with the sanitizer runtime preloaded, runs the module's tests.

Preloading libasan also routes redis-server's own malloc (Debian's Redis
calls jemalloc's unprefixed malloc) to ASan's allocator, so every block the
module gets from RedisModule_Alloc has redzones: heap overflows, use after
free and double frees in module.c or the core abort the server, and the
test run fails. UBSan aborts on the first undefined behaviour.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require

# Debian's redis-server only: valkey-server 8.1 dlopen()s modules with
# RTLD_DEEPBIND, which the ASan runtime refuses ("incompatible with sanitizer
# runtime"). The module's code is the same on both hosts.
pytestmark = pytest.mark.slow

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

# The module's own tests, and the stream tests' module runs. Not the test
# that starts redis-server without the preload (it cannot load an ASan
# module), nor the cluster (covered unsanitized; six sanitized servers would
# double the run).
SELECTED = [
    "tests/test_streams.py",
    "tests/test_streams_errors.py",
    "tests/test_groups_blocking.py",
    "tests/test_protocol.py",
    "tests/test_commands_introspection.py",
    "tests/test_config.py",
    "tests/test_tools_redis_cli.py",
    "tests/test_module.py",
    "tests/test_module_persistence.py",
    "tests/test_module_databases.py",
    "tests/test_module_save_failures.py",
    "tests/test_module_replication.py",
    "tests/test_module_time.py",
    "tests/test_module_append_times.py",
    "tests/test_module_pause.py",
    "tests/test_module_offsets.py",
    "tests/test_module_failover.py",
    "tests/test_module_acl.py",
    "tests/test_groups_acked.py",
    "tests/test_module_acked.py",
]
KEYWORDS = "module and not rcp11 and not refuses_arguments"


def runtime(name: str) -> str:
    cc = os.environ.get("CC", "cc")
    path = subprocess.run(
        [cc, f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path):
        pytest.fail(f"{cc} has no {name}: install the compiler's sanitizer runtime")
    return path


@pytest.mark.timeout(900)  # its child process's own timeout fires first
def test_module_tests_pass_under_asan_and_ubsan(tmp_path: Path) -> None:
    require("redis-server")
    require(os.environ.get("CC", "cc"))
    sys.path.insert(0, str(REPO / "src"))
    import build_module

    module = build_module.build(
        str(tmp_path / "rcp11-asan.so"), str(tmp_path / "obj"), [*SANITIZE, "-g", "-O1"]
    )
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    env = dict(os.environ)
    env.update(
        RCP11_MODULE_PATH=module,
        RCP11_MODULE_PRELOAD=f"{runtime('libasan.so')}:{runtime('libubsan.so')}",
        # Redis frees little at exit by design: leaks are not findings here.
        ASAN_OPTIONS=f"detect_leaks=0:halt_on_error=1:abort_on_error=0:log_path={reports_dir}/asan",
        UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:log_path={reports_dir}/ubsan",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", KEYWORDS]
        + SELECTED,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = "".join(p.read_text(errors="replace") for p in sorted(reports_dir.iterdir()))
    assert done.returncode == 0 and not reports, (
        reports[-6000:] + done.stdout[-4000:] + done.stderr[-2000:]
    )
    assert " passed" in done.stdout
