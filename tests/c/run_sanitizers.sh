#!/usr/bin/env bash
# Build the storage core with AddressSanitizer (+ LeakSanitizer) and UBSan
# and run tests/c/driver.c against it. Any finding fails the run.
#
# Usage: tests/c/run_sanitizers.sh [--with-python]
#   --with-python  also build the cffi extension sanitized, in a scratch copy
#                  of the checkout, and run the storage tests (test_core.py,
#                  _model, _time, _concat) against it
#                  (about a minute more; leak checks off: CPython's own
#                  allocations would drown them).
# Needs cc and zlib1g-dev.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="$repo/src"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cc="${CC:-cc}"
sanitize=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
flags=(-std=c11 -g -O1 -Wall -Wextra -Werror "${sanitize[@]}" -I"$src")

# The core gets the counting allocator hooks; the driver does not.
# (alloc_hook.h includes stdlib.h first: the feature level that declares
# madvise() is set before it.)
"$cc" "${flags[@]}" -D_DEFAULT_SOURCE -include "$here/alloc_hook.h" -c "$src/macronode.c" -o "$out/macronode.o"
"$cc" "${flags[@]}" -c "$here/count_alloc.c" -o "$out/count_alloc.o"
"$cc" "${flags[@]}" -c "$here/driver.c" -o "$out/driver.o"
"$cc" "${flags[@]}" "$out/macronode.o" "$out/count_alloc.o" "$out/driver.o" -lz -o "$out/driver"

ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=99" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$out/driver"

# The C lane over the core and the group state, all on lane_driver.c's
# failing allocator (one allocator: the core appends to and frees the
# lane's buffers).
"$cc" "${flags[@]}" -D_DEFAULT_SOURCE -include "$here/alloc_hook.h" -c "$src/macronode.c" -o "$out/macronode_lane.o"
# (alloc_hook.h includes stdlib.h first: the POSIX level is set before it.)
"$cc" "${flags[@]}" -D_POSIX_C_SOURCE=200809L -include "$here/alloc_hook.h" -c "$src/lane.c" \
    -o "$out/lane.o"
"$cc" "${flags[@]}" -include "$here/alloc_hook.h" -c "$src/ackgroup.c" -o "$out/ackgroup_lane.o"
"$cc" "${flags[@]}" -c "$here/lane_driver.c" -o "$out/lane_driver.o"
"$cc" "${flags[@]}" "$out/macronode_lane.o" "$out/ackgroup_lane.o" "$out/lane.o" \
    "$out/lane_driver.o" -lz -o "$out/lane_driver"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=99" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$out/lane_driver"

# The acknowledged-group state, on the same counting allocator (with the
# core, whose mn_buf it appends to).
"$cc" "${flags[@]}" -include "$here/alloc_hook.h" -c "$src/ackgroup.c" -o "$out/ackgroup.o"
"$cc" "${flags[@]}" -c "$here/ackgroup_driver.c" -o "$out/ackgroup_driver.o"
"$cc" "${flags[@]}" "$out/macronode.o" "$out/ackgroup.o" "$out/count_alloc.o" \
    "$out/ackgroup_driver.o" -lz -o "$out/ackgroup_driver"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=99" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$out/ackgroup_driver"

if [ "${1:-}" = "--with-python" ]; then
    copy="$out/checkout"
    mkdir -p "$copy/tests"
    cp -r "$repo/src" "$repo/rcp11" "$repo/setup.py" "$repo/pyproject.toml" "$repo/README.md" "$copy/"
    # The storage-level tests (test_core_compression.py also starts servers).
    cp "$repo/tests/test_core.py" "$repo/tests/test_core_model.py" "$repo/tests/test_core_time.py" \
        "$repo/tests/test_core_concat.py" "$repo/tests/test_core_ackgroup.py" \
        "$repo/tests/core_recipes.py" "$copy/tests/"
    cp -r "$repo/tests/data" "$copy/tests/"
    rm -f "$copy"/rcp11/_macronode*.so
    (cd "$copy" && PYTHONWARNINGS=ignore RCP11_CFLAGS="${sanitize[*]} -g -O1" RCP11_LDFLAGS="${sanitize[*]}" \
        python3 setup.py -q build_ext --inplace >/dev/null)
    preload="$("$cc" -print-file-name=libasan.so):$("$cc" -print-file-name=libubsan.so)"
    # allocator_may_return_null: a test asks for more memory than there
    # is and expects the core's refusal, not ASan's abort.
    (cd "$copy" && ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:allocator_may_return_null=1" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" LD_PRELOAD="$preload" \
        PYTHONPATH="$copy" python3 -m pytest -p no:cacheprovider -q tests)
fi
