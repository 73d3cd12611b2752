"""The installed programs as a shell user meets them: --version, and output
into a pipe whose reader is gone (`rcp11-server --help | head -1`) ends
quietly instead of with a BrokenPipeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rcp11 import __version__

PROGRAMS = {
    "rcp11-server": [
        sys.executable,
        "-c",
        "import sys; from rcp11.server import main; sys.exit(main())",
    ],
    "rcp11": [
        sys.executable,
        "-c",
        "import sys; from rcp11.__main__ import main; sys.exit(main())",
    ],
}


def run_into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """argv with stdout a pipe whose read end is already closed: its first
    write fails with EPIPE, every time (not only when `head` wins a race)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    ("program", "args"),
    [
        ("rcp11-server", ["--help"]),
        ("rcp11-server", ["--version"]),
        ("rcp11", ["--help"]),
        ("rcp11", ["--version"]),
        ("rcp11", ["consume", "--help"]),
        ("rcp11", ["server", "--help"]),
        ("rcp11", ["module-path", "--help"]),
    ],
)
def test_output_into_a_closed_pipe_ends_quietly(program: str, args: list[str]) -> None:
    done = run_into_closed_pipe(PROGRAMS[program] + args)
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_rcp11_version() -> None:
    done = subprocess.run(PROGRAMS["rcp11"] + ["--version"], capture_output=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.decode().strip() == f"rcp11 {__version__}"


def test_every_package_is_installed_by_pip_install() -> None:
    # `pip install .` (the README's quick start) installs the packages
    # setuptools finds from pyproject.toml; the tests run from an editable
    # install, which finds any folder, so a package left out breaks only a
    # user's install (rcp11.errors and rcp11.resp once were, from a list).
    # Every folder of rcp11/ holding Python code must be one of them. Asked
    # in a process of its own, as a build asks, away from this session's state.
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    program = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from setuptools.config.pyprojecttoml import apply_configuration\n"
        "from setuptools.dist import Distribution\n"
        "print(' '.join(apply_configuration(Distribution(), 'pyproject.toml').packages))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    shipped = set(done.stdout.split())
    with_code = {
        ".".join(path.parent.relative_to(root).parts)
        for path in (root / "rcp11").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert with_code <= shipped, sorted(with_code - shipped)
