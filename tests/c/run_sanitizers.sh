#!/usr/bin/env bash
# Build the storage core with AddressSanitizer (+ LeakSanitizer) and UBSan
# and run tests/c/driver.c against it. Any finding fails the run.
# Usage: tests/c/run_sanitizers.sh   (from anywhere; needs cc and zlib1g-dev)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/../../src"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cc="${CC:-cc}"
flags=(-std=c11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Werror
       -fsanitize=address,undefined -fno-sanitize-recover=all -I"$src")

# The core gets the counting allocator hooks; the driver does not.
"$cc" "${flags[@]}" -include "$here/alloc_hook.h" -c "$src/macronode.c" -o "$out/macronode.o"
"$cc" "${flags[@]}" -c "$here/driver.c" -o "$out/driver.o"
"$cc" "${flags[@]}" "$out/macronode.o" "$out/driver.o" -lz -o "$out/driver"

ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=99" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$out/driver"
