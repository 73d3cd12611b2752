"""The Python fuzzers (fuzz/proto): the model agrees with the contract on
hand-worked cases, the harness catches a planted bug, the seed corpus replays
clean, and each fuzzer runs for a bounded time in CI (make fuzz runs them
longer). Every fuzzer's seed set in the tree stays small (fuzz/seeds.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.proto import model
from fuzz.proto.harness import Finding, Target, parse_every_way
from fuzz.proto.model import BLOCKED, Err
from fuzz.proto.targets import TARGETS, decode
from fuzz.seeds import cover, found_name, is_found, read_control_file
from rcp11.storage import Stream

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "proto" / "corpus"
SEED_DIRS = sorted([*CORPUS.iterdir(), *(ROOT / "fuzz" / "core" / "corpus").iterdir()])
# Found inputs a target keeps after `make fuzz-seeds`: a few dozen reach
# every edge. Hundreds mean a grown corpus was copied in unminimised.
MAX_FOUND_SEEDS = 100


def argvs(*commands: str) -> list[list[bytes]]:
    return [c.encode().split() for c in commands]


def run_both(steps: list[tuple[int, str]]) -> tuple[list, list]:
    """Each (client, command) through the server and the model; both replies."""
    target, ref = Target(3), model.Model(3)
    got, want = [], []
    for client, text in steps:
        argv = text.encode().split()
        done = len(target.replies[client])
        target.run(client, [argv])
        got += [decode(r) for r in target.replies[client][done:]]
        reply = ref.run(client, argv)
        if reply is not BLOCKED:
            want.append(reply)
    for client in range(3):
        got += [decode(r) for r in target.clients[client].late]
        want += ref.late[client]
    target.finish()
    return got, want


def test_model_reads_offsets_nulls_and_info_as_the_contract_says() -> None:
    ref = model.Model(1)
    assert ref.run(0, [b"TWRITE", b"s", b"a"]) == 0
    assert ref.run(0, [b"TWRITE", b"s", b"BACKLOG", b"2", b"ENTRIES", b"b", b"c", b"d"]) == 1
    # BACKLOG 2 left offsets 2 and 3 readable.
    assert ref.run(0, argvs("TREAD s 0 10")[0]) == [None, None, b"c", b"d"]
    assert ref.run(0, argvs("TREAD s -1 10 WITHINFO")[0]) == [[2, 3, 3, 1], b"d"]
    assert ref.run(0, argvs("TREAD s 9 1 WITHINFO")[0]) == [[2, 3, 9, 0]]
    assert ref.run(0, argvs("TREAD nokey 0 5 WITHINFO")[0]) == [[0, -1, 0, 0]]
    assert ref.run(0, argvs("TEVICT s -1")[0]) == 1
    assert ref.run(0, argvs("TEVICT s 100")[0]) == 1
    assert ref.run(0, argvs("TREAD s 0 0 WITHINFO")[0]) == [[4, 3, 0, 0]]
    assert ref.run(0, argvs("TWRITE s x")[0]) == 4  # the next offset survives eviction
    assert ref.run(0, argvs("TWRITE s ENTRIES")[0]) == 5  # the simple form: any bytes
    assert ref.run(0, argvs("TWRITE s BACKLOG 1")[0]) == Err("ERR")


def test_model_groups_hand_out_each_offset_once_in_blocking_order() -> None:
    ref = model.Model(3)
    assert ref.run(0, argvs("TREAD s 0 2 GROUPNEW g BLOCK 0")[0]) is BLOCKED
    assert ref.run(2, argvs("GET g")[0]) == b"0"  # created when the reader blocked
    assert ref.run(1, argvs("TREAD s 0 2 GROUP g BLOCK 0")[0]) is BLOCKED
    assert ref.run(2, [b"TWRITE", b"s", b"ENTRIES", b"a", b"b", b"c"]) == 0
    assert ref.late == [[[b"a", b"b"]], [[b"c"]], []]
    assert ref.run(2, argvs("GET g")[0]) == b"3"
    assert ref.run(2, argvs("TREAD s 0 2 GROUP s")[0]) == Err("ERR")


def test_server_and_model_agree_on_nonulls_reads() -> None:
    got, want = run_both(
        [
            (0, "TWRITE k0 BACKLOG 2 ENTRIES a b c d"),
            (1, "TREAD k0 0 5 NONULLS WITHINFO"),
            (1, "TREAD k0 0 1 nonulls"),
            (1, "TREAD k0 9 5 WITHINFO NONULLS"),
            (2, "TREAD k0 0 9 GROUP g0 NONULLS"),
            (2, "GET g0"),
            (0, "TREAD k1 3 2 NONULLS BLOCK 0 WITHINFO"),
            (2, "TWRITE k1 ENTRIES x y z w"),
            (1, "TREAD k0 0 1 NONULLS NONULLS"),
        ]
    )
    assert got == want
    assert [[2, 3, 2, 2], b"c", b"d"] in got
    assert [[0, 3, 3, 1], b"w"] in got  # the blocked reader, served from offset 3


def test_server_and_model_agree_on_a_worked_sequence() -> None:
    got, want = run_both(
        [
            (0, "TWRITE k0 a"),
            (0, "TWRITE k0 BACKLOG 1 ENTRIES b c"),
            (1, "TREAD k0 0 5 WITHINFO"),
            (1, "WATCH g0"),
            (2, "TREAD k0 0 1 GROUP g0"),
            (1, "MULTI"),
            (1, "TREAD k0 0 1 GROUP g0 BLOCK 0"),
            (1, "EXEC"),
            (0, "TREAD k1 0 1 BLOCK 0"),
            (2, "TWRITE k1 late"),
            (2, "TEVICT k0 -1"),
            (2, "TYPE k0"),
        ]
    )
    assert got == want
    assert [[2, 2, 0, 3], None, None, b"c"] in got
    assert None in got  # the EXEC whose watched group key moved
    assert [b"late"] in got


def test_the_differential_fuzzer_catches_a_wrong_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    # A storage core that reports the offset after the right one.
    original = Stream.append

    def off_by_one(self, entries, now_ms=None):  # type: ignore[no-untyped-def]
        return original(self, entries, now_ms) + 1

    monkeypatch.setattr(Stream, "append", off_by_one)
    with pytest.raises(Finding, match="disagree"):
        run_both_check([(0, "TWRITE k0 a")])


def run_both_check(steps: list[tuple[int, str]]) -> None:
    got, want = run_both(steps)
    if got != want:
        raise Finding(f"server and model disagree: {got!r} vs {want!r}")


def test_parsing_every_way_catches_a_parser_that_depends_on_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rcp11.resp import RequestParser

    original = RequestParser.take

    def drops_second(self, data):  # type: ignore[no-untyped-def]
        return original(self, data)[:1]

    monkeypatch.setattr(RequestParser, "take", drops_second)
    with pytest.raises(Finding, match="parse differs"):
        parse_every_way(b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n")


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if p.is_file())


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_seed_corpus_replays_clean(path: Path) -> None:
    TARGETS[path.parent.name](path.read_bytes())


def test_every_fuzzer_has_seeds() -> None:
    for name in TARGETS:
        assert any((CORPUS / name).iterdir()), name


@pytest.mark.parametrize("seeds", SEED_DIRS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_seed_sets_stay_minimised(seeds: Path) -> None:
    """Found inputs carry the SHA-1 of their content (so a crash input,
    which must be kept, carries a name of its own: finding-<what>), and a
    target keeps only the few that fuzz/seeds.py picks."""
    found = [p for p in seeds.iterdir() if is_found(p)]
    for path in found:
        assert path.name == found_name(path.read_bytes()), path
    assert len(found) <= MAX_FOUND_SEEDS, f"{seeds}: run make fuzz-seeds"
    assert any(not is_found(p) for p in seeds.iterdir()), f"{seeds}: no hand-written seed"


def test_seed_minimising_keeps_every_edge_with_fewer_inputs(tmp_path: Path) -> None:
    # A control file as libFuzzer's -merge=1 writes it: the named file 0,
    # then inputs 1-3, each COV line listing the edges that input reached first.
    control = tmp_path / "control"
    control.write_text(
        "4\n1\nnamed\na\nb\nc\n"
        "STARTED 0 5\nFT 0 1 2\nCOV 0 1 2\n"
        "STARTED 1 3\nFT 1 7\nCOV 1 3\n"
        "STARTED 2 4\nFT 2 8 9\nCOV 2 4 5\n"
        "STARTED 3 9\n"  # crashed: no coverage line
    )
    files, first, cov = read_control_file(control)
    assert files == ["named", "a", "b", "c"] and first == 1
    assert cov == {0: {1, 2}, 1: {3}, 2: {4, 5}}
    # Each input alone: "ab" reaches what a and b reach, so it alone is kept.
    inputs = {}
    for name, data, edges in [("a", b"a", {1, 3}), ("b", b"bb", {4}), ("ab", b"abc", {3, 4, 5})]:
        inputs[tmp_path / name] = edges
        (tmp_path / name).write_bytes(data)
    assert cover({1, 2}, inputs) == [tmp_path / "ab"]
    assert cover({1, 2, 3, 4, 5}, inputs) == []


# Seconds per target in CI (after its seeds, which reach every edge the
# full corpus reached); `make fuzz` runs each for 10 minutes.
FUZZ_SECONDS = 8


@pytest.mark.timeout(420)  # its child process's own timeout fires first
@pytest.mark.slow
def test_each_fuzzer_runs_clean_for_a_bounded_time() -> None:
    """What CI fuzzes: each target under atheris for FUZZ_SECONDS, after
    replaying its seed corpus (the findings' reproductions included). A
    crash, a Finding or a timeout fails the test with the saved input."""
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz.proto", "--time", str(FUZZ_SECONDS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS * 3 * 4 + 120,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    lines = re.findall(r"^fuzz (\w+) +runs=(\d+) .*cov=(\d+) .*ok$", proc.stdout, re.M)
    assert sorted(name for name, _, _ in lines) == sorted(TARGETS), proc.stdout
    for name, runs, cov in lines:
        assert int(runs) > 100 and int(cov) > 100, (name, runs, cov)
