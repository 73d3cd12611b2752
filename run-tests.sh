#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run
# it all: lint, the C core under AddressSanitizer/UBSan, and pytest.
# Usage: ./run-tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    command -v redis-server >/dev/null || need+=(redis-server)
    command -v redis-cli >/dev/null || need+=(redis-tools)
    command -v java >/dev/null || need+=(default-jre-headless)
    command -v cc >/dev/null || need+=(build-essential)
    dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
    if [ ${#need[@]} -gt 0 ]; then
        echo "== apt-get install ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    # The Debian package starts a redis-server on 6379; tests never use it.
fi

echo "== pip install -e .[test,bench]"
python3 -m pip install -q --disable-pip-version-check -e '.[test,bench]'

echo "== ruff"
python3 -m ruff check rcp11 tests bench src/build_macronode.py
python3 -m ruff format --check rcp11 tests bench src/build_macronode.py

echo "== C core under AddressSanitizer + UBSan"
bash tests/c/run_sanitizers.sh

echo "== pytest"
python3 -m pytest -q "$@"
