#!/usr/bin/env bash
# Build the libFuzzer harnesses of the storage core (fuzz_ops, fuzz_blobs),
# of the C lane in front of it (fuzz_lane) and of the lane's event loop
# (fuzz_netloop) and run them.
#
# Usage: fuzz/core/run.sh [SECONDS_PER_FUZZER] [--ci | --seeds]
#   SECONDS_PER_FUZZER  how long each harness runs (default 600)
#   --ci                fuzz into a scratch directory (nothing in the tree
#                       is touched) and keep quiet unless a harness fails
#   --seeds             fuzz nothing: fold fuzz/core/runs/<harness>/ into the
#                       seeds, keeping the fewest inputs that reach every edge
#                       (python -m fuzz.seeds; `make fuzz-seeds`)
# Every run starts from the seeds in fuzz/core/corpus/<harness>/ (in git: a
# minimised set, see fuzz/seeds.py). Without --ci the corpus grows in
# fuzz/core/runs/<harness>/ (not in git) and crashes land in
# fuzz/core/crashes/. Every crash becomes a regression test in
# tests/c/driver.c (tests/c/lane_driver.c for fuzz_lane) and its input a
# seed named finding-<what> (kept by every minimisation, replayed by every
# run, CI's included). A harness with a <harness>.dict gets it as -dict.
#
# Needs clang and libclang-rt-dev (libFuzzer), zlib1g-dev.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-600}"
mode="${2:-}"
case "$mode" in
    "" | --ci | --seeds) ;;
    *) echo "usage: $0 [SECONDS_PER_FUZZER] [--ci | --seeds]" >&2; exit 2 ;;
esac

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cc="${CLANG:-clang}"
flags=(-std=c11 -g -O1 -Wall -Wextra -Werror -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -I"$repo/src" -I"$repo/tests/c")
# The core's allocations go to the counting allocator (alloc_hook.h), the
# harness's and the counting allocator's own do not.
# (alloc_hook.h includes stdlib.h first: the feature level is set before it.)
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -D_DEFAULT_SOURCE \
    -include "$repo/tests/c/alloc_hook.h" -c "$repo/src/macronode.c" -o "$out/macronode.o"
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$repo/tests/c/count_alloc.c" -o "$out/count_alloc.o"
# The C lane (src/lane.c, harness fuzz_lane.c) on top of the core, with the
# same allocator: the core appends to and frees the lane's buffers. (The
# POSIX level is set before alloc_hook.h includes stdlib.h.)
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -D_POSIX_C_SOURCE=200809L \
    -include "$repo/tests/c/alloc_hook.h" -c "$repo/src/lane.c" -o "$out/lane.o"
# Lease reads in the lane work on acknowledged groups (src/ackgroup.c).
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" \
    -include "$repo/tests/c/alloc_hook.h" -c "$repo/src/ackgroup.c" -o "$out/ackgroup.o"
# The C lane's event loop (src/netloop.c, harness fuzz_netloop.c) over a
# socketpair, with the same allocator: it swaps reply buffers with the lane.
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -D_POSIX_C_SOURCE=200809L \
    -include "$repo/tests/c/alloc_hook.h" -c "$repo/src/netloop.c" -o "$out/netloop.o"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for harness in ops blobs lane netloop; do
    "$cc" "${flags[@]}" "$here/fuzz_$harness.c" "$out/macronode.o" "$out/lane.o" \
        "$out/ackgroup.o" "$out/netloop.o" "$out/count_alloc.o" -lz -o "$out/fuzz_$harness"
    if [ "$mode" = --seeds ]; then
        (cd "$repo" && "${PYTHON:-python3}" -m fuzz.seeds "$here/corpus/$harness" "$here/runs/$harness" \
            -- "$out/fuzz_$harness" -max_len=65536 -timeout=10 -rss_limit_mb=2048) || status=1
        continue
    fi
    dict=()
    [ -f "$here/$harness.dict" ] && dict=(-dict="$here/$harness.dict")
    [ "$harness" = netloop ] && dict=(-dict="$here/lane.dict")  # the same requests
    if [ "$mode" = --ci ]; then
        work="$out/corpus_$harness"
        crashes="$out/crash-"
        mkdir -p "$work"
    else
        work="$here/runs/$harness"
        mkdir -p "$work" "$here/crashes"
        crashes="$here/crashes/$harness-"
    fi
    log="$out/$harness.log"
    echo "== fuzz_$harness for ${seconds}s"
    if ! "$out/fuzz_$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 "${dict[@]}" \
            -max_len=65536 -artifact_prefix="$crashes" -print_final_stats=1 \
            "$work" "$here/corpus/$harness" >"$log" 2>&1; then
        status=1
        tail -60 "$log"
        if [ "$mode" = --ci ]; then
            for f in "$out"/crash-*; do
                [ -e "$f" ] && echo "crashing input (base64): $(base64 -w0 "$f")"
            done
        fi
    fi
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|Done [0-9]+ runs" "$log" || true
done
exit $status
