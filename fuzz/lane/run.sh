#!/usr/bin/env bash
# Build the libFuzzer harness of the C lane (fuzz_lane.c) and run it.
#
# Usage: fuzz/lane/run.sh [SECONDS] [--ci]
#   SECONDS  how long the harness runs (default 600)
#   --ci     fuzz into a scratch copy of the corpus (the repo's corpus is
#            not touched) and keep quiet unless the harness fails
# Without --ci, new coverage goes to fuzz/lane/work/ (not in git;
# `-merge=1` it into fuzz/lane/corpus/ to keep it) and crashes to
# fuzz/lane/crashes/. Every crash must become a regression check in
# tests/c/lane_driver.c and its input a file of the corpus.
#
# Needs clang and libclang-rt-dev (libFuzzer), zlib1g-dev.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-600}"
ci=0
[ "${2:-}" = "--ci" ] && ci=1

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cc="${CLANG:-clang}"
flags=(-std=c11 -g -O1 -Wall -Wextra -Werror -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$repo/src")
"$cc" "${flags[@]}" "$here/fuzz_lane.c" "$repo/src/lane.c" "$repo/src/macronode.c" -lz \
    -o "$out/fuzz_lane"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ "$ci" = 1 ]; then
    work="$out/corpus"
    crashes="$out/crash-"
    mkdir -p "$work"
else
    work="$here/work"
    mkdir -p "$work" "$here/crashes"
    crashes="$here/crashes/lane-"
fi
log="$out/fuzz_lane.log"
echo "== fuzz_lane for ${seconds}s"
if ! "$out/fuzz_lane" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=16384 -artifact_prefix="$crashes" -print_final_stats=1 \
        -dict="$here/lane.dict" "$work" "$here/corpus" >"$log" 2>&1; then
    tail -60 "$log"
    if [ "$ci" = 1 ]; then
        for f in "$out"/crash-*; do
            [ -e "$f" ] && echo "crashing input (base64): $(base64 -w0 "$f")"
        done
    fi
    exit 1
fi
grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" || true
