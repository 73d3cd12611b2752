"""Write the seed corpus of the storage core fuzzers (fuzz/core/corpus/).

    .venv/bin/python fuzz/core/make_seeds.py

blobs/: dumps of the deterministic streams of tests/core_recipes.py in the
current format (whole dumps, with and without the CRC-rewriting flag, and
single node blobs), plus the older-format dumps kept in tests/data/.
ops/: a few operation sequences for fuzz_ops.c (opcodes as in its enum).
Files are named by content, so rerunning adds only what changed.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))

from core_recipes import RECIPES, pack_blobs  # noqa: E402

from rcp11.storage import FORMAT_VERSION  # noqa: E402

# fuzz_ops.c opcodes (its enum), stream A; | 0x80 picks stream B.
(APPEND, APPEND_ONE, READ, EVICT_UPTO, EVICT_KEEP, RAISE, SETTINGS, ROUNDTRIP, FAIL_NEXT) = range(9)
CLOCK, SEEK, RETAIN, CONCAT, COMPRESS = range(9, 14)


def write(directory: Path, name: str, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(data).hexdigest()[:12]
    (directory / f"{name}-{digest}.bin").write_bytes(data)


def blob_seeds() -> None:
    out = HERE / "corpus" / "blobs"
    for name, make in RECIPES.items():
        blobs = list(make().dump())
        write(out, f"v{FORMAT_VERSION}-{name}", pack_blobs(blobs, 1))
        write(out, f"v{FORMAT_VERSION}-{name}-fixcrc", pack_blobs(blobs, 3))
        for i, blob in enumerate(blobs[1:4], 1):
            write(out, f"v{FORMAT_VERSION}-{name}-node{i}", bytes([2]) + blob)
    for old in sorted((REPO / "tests" / "data").glob("macronode-v*/*.bin")):
        write(out, f"{old.parent.name.removeprefix('macronode-')}-{old.stem}", old.read_bytes())


def ops_seeds() -> None:
    out = HERE / "corpus" / "ops"
    # setup byte (levels of A and B), max_entries A (u16), max_entries B (u8)
    setup = bytes([6 + 10 * 1, 50, 0, 7])
    hundred = bytes([APPEND, 99, 0])  # 100 messages of 100 bytes
    sequences = {
        "fill-read": setup + hundred * 3 + bytes([READ, 1, 0, 0]),
        "evict-roundtrip": setup + hundred * 2 + bytes([EVICT_UPTO, 1, 130, ROUNDTRIP]),
        "gaps": setup + hundred + bytes([RAISE, 0, 17]) + hundred + bytes([ROUNDTRIP, READ, 0]),
        "near-end": setup + bytes([RAISE, 1, 5, 0, APPEND, 9, 1] + [3] * 10 + [ROUNDTRIP]),
        "oom": setup + hundred + bytes([FAIL_NEXT, 3, APPEND, 200, 3] + [200, 150] * 201),
        "both": setup + hundred + bytes([APPEND | 0x80, 40, 2] + [90] * 41 + [SETTINGS, 1, 3, 3]),
        "time": setup
        + hundred
        + bytes([CLOCK, 0, 200])
        + hundred
        + bytes([SEEK, 1, 0, 0, 0, RETAIN, 4, 0, 1, 0, 0, 0, SEEK, 0] + [0] * 8),
        "concat": setup
        + bytes([APPEND | 0x80, 120, 0, CLOCK, 0, 50])
        + hundred
        + bytes([EVICT_UPTO | 0x80, 1, 5, CONCAT, ROUNDTRIP, READ, 0]),
        "depth": setup
        + hundred * 4
        + bytes([COMPRESS, 0, 2, COMPRESS, 1, 1, SETTINGS, 0, 9, COMPRESS, 2, READ, 0]),
        "concat-oom": setup
        + hundred
        + bytes([APPEND | 0x80, 200, 3] + [100, 50] * 201 + [FAIL_NEXT, 5, CONCAT]),
    }
    rng = random.Random(11)
    for i in range(6):
        sequences[f"random{i}"] = bytes(rng.randrange(256) for _ in range(rng.randrange(64, 600)))
    for name, data in sequences.items():
        write(out, name, data)


if __name__ == "__main__":
    blob_seeds()
    ops_seeds()
