"""Offset reservations: a stream's next offset may only grow up to a mark
that is durable in the offsets file (docs/PERSISTENCE.md, offset
reservations), so no offset is handed out twice, whatever crashes.

OffsetReservations is the table and its file (format in offsets_file.py):
marks of live streams, marks of deleted streams whose deletion is not yet
durable, the step policy, writing and fsyncing, and the AOF slot in the
file's header (what the AOF was when last written, overwritten in place).
Deletions tracks when a deletion became durable, so a deleted stream's mark
can go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

from rcp11.datafiles import SNAPSHOT_TEMP_PREFIX
from rcp11.errors import PersistenceError
from rcp11.files import fsync_dir, replace_atomically, write_all
from rcp11.limits import MAX_OFFSET, RESERVATION_MAX_STEP, RESERVATION_MIN_STEP, TORN_BATCH_MARGIN
from rcp11.persistence.offsets_file import (
    HEADER_SIZE,
    NO_AOF,
    SLOT_AT,
    AofSlot,
    Record,
    encode_batch,
    encode_slot,
    header,
    raise_after_torn_batch,
    read_contents,
)

log = logging.getLogger("rcp11.persistence")

# The file is compacted by a rewrite once it is this large and four times
# what its marks need.
_COMPACT_ABOVE = 256 * 1024


class OffsetReservations:
    """The durable key -> reserved next-offset table.

    `marks` holds the live streams' marks. `deleted` holds the marks of
    streams deleted since their deletion was last known durable: until
    forget_deleted(), an older snapshot or AOF could bring such a stream
    back, and it must then still go up to its old mark. A stream created
    again at a deleted key reserves afresh in `marks`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.marks: dict[bytes, int] = {}
        self.deleted: dict[bytes, int] = {}
        # key -> (current step, monotonic time of its last reservation)
        self._pace: dict[bytes, tuple[int, float]] = {}
        self._fd = -1
        self._slot_fd = -1  # the same file without O_APPEND, for the slot's pwrite
        self.file_size = 0
        # The AOF slot as the file holds it (docs/PERSISTENCE.md, when the
        # AOF is whole): what load() read, then what set_slot() wrote.
        self.slot: AofSlot = NO_AOF
        self.fsyncs = 0
        self._pending: list[Record] = []  # not yet written, no fsync needed
        self.unsynced = False  # reservations written but not yet fsynced
        # The file exists but was cut inside its header: no mark is known.
        self.header_torn = False

    @property
    def pending(self) -> bool:
        """Records wait to be written (best effort, no fsync needed)."""
        return bool(self._pending)

    def load(self) -> dict[bytes, int]:
        """Read the table; returns the live marks (`deleted` is filled too).
        Damage before the last batch refuses. A last batch cut short is cut
        off: torn by a power loss it was never fsynced (so never
        acknowledged), but a file damaged at its end looks the same, so every
        mark, and every key still readable in it, is raised by
        TORN_BATCH_MARGIN and the file is rewritten with the raised marks."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            self.marks, self.deleted = {}, {}
            self.slot = NO_AOF
            return self.marks
        except OSError as exc:
            raise PersistenceError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        contents = read_contents(self.path, data)
        self.header_torn = contents.header_torn
        self.slot = contents.slot
        live, deleted = contents.live, contents.deleted
        self.marks, self.deleted = live, deleted
        self.file_size = contents.valid
        if contents.torn:
            log.warning(
                "Offsets file %s: the last batch (%d bytes at byte offset %d) is cut short; "
                "every reservation is raised by %d so that no offset it may have covered "
                "is handed out again",
                self.path,
                len(contents.torn),
                contents.valid,
                TORN_BATCH_MARGIN,
            )
            live, deleted = raise_after_torn_batch(live, deleted, contents.torn)
        if contents.torn or contents.old_format:
            try:
                self.rewrite(live, deleted)
            except OSError as exc:
                raise PersistenceError(f"{self.path}: cannot rewrite: {exc.strerror}") from exc
        return live

    def _open(self) -> int:
        if self._fd < 0:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                try:
                    os.ftruncate(fd, 0)
                    write_all(fd, header(self.slot))
                    os.fsync(fd)
                except OSError:
                    os.close(fd)
                    raise
                size = HEADER_SIZE
                fsync_dir(os.path.dirname(self.path))
            self._fd = fd
            self.file_size = size
        return self._fd

    def close(self) -> None:
        for fd in (self._fd, self._slot_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._slot_fd = -1

    def set_slot(self, slot: AofSlot) -> None:
        """Overwrite the AOF slot in place (a pwrite, no fsync: it survives a
        kill -9, which is what it is for). A slot that takes back the claim
        that every write is fsynced (appendfsync changed, the AOF turned
        off or failing) is fsynced by the next sync(), before any reply:
        an older slot still making that claim must not survive a power
        loss. Raises OSError."""
        if slot == self.slot:
            return
        if self._slot_fd < 0:
            self._open()
            self._slot_fd = os.open(self.path, os.O_WRONLY)
        data = encode_slot(slot)
        if os.pwrite(self._slot_fd, data, SLOT_AT) != len(data):
            raise OSError(f"short write of the AOF slot in {self.path}")
        if self.slot.synced and not slot.synced:
            self.unsynced = True
        self.slot = slot

    def reserve(self, key: bytes, new_next: int, current_next: int) -> None:
        """Make a mark >= new_next durable for key. Raises OSError."""
        now = time.monotonic()
        step, last = self._pace.get(key, (RESERVATION_MIN_STEP, -1e9))
        if now - last < 1.0:
            step = min(step * 2, RESERVATION_MAX_STEP)
        elif now - last > 10.0:
            step = max(RESERVATION_MIN_STEP, step // 2)
        batch = max(0, new_next - current_next)
        mark = min(new_next + max(step, 2 * batch), MAX_OFFSET)
        # Written now, so a full disk refuses the write before it runs;
        # fsynced by sync(), which flush() calls before any reply leaves:
        # one fsync covers every reservation of an event-loop iteration.
        self.write([(key, mark, False)], durable=False)
        self.unsynced = True
        self.marks[key] = mark
        self._pace[key] = (step, now)

    def delete(self, keys: Sequence[bytes]) -> list[bytes]:
        """The streams at keys left the keyspace; returns those that had a
        mark, in order. Each mark moves to `deleted` (queued for the file,
        written by the next write without fsync: if that record is lost,
        the live mark it replaces brings the key back as an empty stream at
        most)."""
        marks = self.marks
        if not marks:
            return []
        # filter() and map() rather than a loop of statements: a DEL may
        # name a million strings (no mark), a TCONCAT 100,000 streams.
        had = list(filter(marks.__contains__, keys))
        moved = list(map(marks.pop, had))
        list(map(self._pace.pop, had, repeat(None)))
        deleted = self.deleted
        if deleted and not deleted.keys().isdisjoint(had):
            # Deleted before and not yet forgotten: the higher mark stays.
            moved = [max(mark, deleted.get(key, 0)) for key, mark in zip(had, moved, strict=True)]
        deleted.update(zip(had, moved, strict=True))
        self._pending += zip(had, moved, repeat(True))
        return had

    def forget_deleted(self, keys: Iterable[bytes]) -> None:
        """The deletion of each key is durable: no file can bring the old
        stream back, so its old mark goes (a stream created since keeps its
        own). A key named twice, or with no deleted mark, is passed over."""
        pop = self.deleted.pop
        gone = [key for key in keys if pop(key, None) is not None]
        pending = self._pending
        pending += [(key, -1, False) for key in gone]
        marks = self.marks
        if marks:
            # After the key's -1 record, which drops every mark it had.
            pending += [(key, marks[key], False) for key in gone if key in marks]

    def revive(self, key: bytes, mark: int) -> None:
        """A deleted stream came back from the files (its deletion was lost):
        it is live again with `mark`."""
        self.deleted.pop(key, None)
        self.marks[key] = mark
        self._pending.append((key, -1, False))
        self._pending.append((key, mark, False))

    def queue_drop(self, key: bytes) -> None:
        """Forget every mark of key."""
        self.marks.pop(key, None)
        self.deleted.pop(key, None)
        self._pace.pop(key, None)
        self._pending.append((key, -1, False))

    def write(self, records: list[Record], durable: bool) -> None:
        """Append records (after any queued ones); fsync when durable."""
        batch = self._pending + records
        fd = self._open()
        if batch:
            data = encode_batch(batch)
            try:
                write_all(fd, data)
            except OSError as exc:
                # A partial batch is a torn record the loader would take for
                # the end of the file: cut it off so later batches stay
                # readable.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self.file_size)
                raise exc
            self.file_size += len(data)
            self._pending = []
        if durable:
            os.fsync(fd)
            self.fsyncs += 1
            self.unsynced = False

    def write_best_effort(self, records: list[Record]) -> bool:
        """Append records and any queued ones without fsync, for records whose
        loss costs only a gap; False (logged) when the write failed."""
        if not records and not self._pending:
            return True
        try:
            self.write(records, durable=False)
        except OSError as exc:
            log.warning("Cannot update the offsets file %s: %s", self.path, exc.strerror or exc)
            return False
        return True

    def sync(self) -> None:
        """fsync reservations written since the last sync. Raises OSError."""
        if self.unsynced:
            os.fsync(self._open())
            self.fsyncs += 1
            self.unsynced = False

    def compact_if_large(self) -> None:
        if self.file_size <= _COMPACT_ABOVE:
            return
        # sum(map()): run by every tick while the file is large.
        live = 16 * (len(self.marks) + len(self.deleted))
        live += sum(map(len, self.marks)) + sum(map(len, self.deleted))
        if self.file_size > 4 * live:
            self.sync()
            self.rewrite(dict(self.marks), dict(self.deleted))

    def rewrite(self, marks: dict[bytes, int], deleted: dict[bytes, int] | None = None) -> None:
        """Replace the file atomically by exactly `marks` (and `deleted`)."""
        # A temporary name the start-up sweep removes if a crash leaves it.
        tmp = os.path.join(
            os.path.dirname(self.path), f"{SNAPSHOT_TEMP_PREFIX}offsets-{os.getpid()}.tmp"
        )
        deleted = dict(deleted or {})
        data = header(self.slot)
        # Deleted records first: at load one drops the key's live mark.
        records = [(k, m, True) for k, m in deleted.items()]
        records += [(k, m, False) for k, m in marks.items()]
        if records:
            data += encode_batch(records)
        replace_atomically(self.path, lambda file: file.write(data), temp_path=tmp)
        self.close()
        self.marks = dict(marks)
        self.deleted = deleted
        self._pending = []
        self.file_size = len(data)
        self.fsyncs += 1
        self.unsynced = False

    def lower_to(self, nexts: dict[bytes, int], current: Callable[[bytes], int | None]) -> None:
        """A snapshot holding these streams' next offsets just became what the
        next start loads: a stream not written since (current(key) is still
        its next offset) has handed out nothing above it, so its mark comes
        down to it and a crash right after SAVE/BGSAVE leaves no gap. Not
        fsynced: if the lowering is lost, the old (higher) mark only means a
        gap."""
        lowered = [
            (key, nxt)
            for key, nxt in nexts.items()
            if current(key) == nxt and self.marks.get(key, -1) > nxt
        ]
        if lowered and self.write_best_effort([(k, m, False) for k, m in lowered]):
            for key, nxt in lowered:
                self.marks[key] = nxt

    def write_tight(self, nexts: dict[bytes, int], durable: bool) -> None:
        """At a clean shutdown: marks = each stream's next offset, so the next
        start shows no gap. Deleted streams whose deletion is not durable
        keep their old marks: such a stream may come back from disk."""
        marks = {key: max(nxt, 0) for key, nxt in nexts.items()}
        try:
            self.rewrite(marks, {} if durable else dict(self.deleted))
        except OSError as exc:
            log.warning("Cannot rewrite the offsets file on shutdown: %s", exc.strerror or exc)


class Deletions:
    """Deleted streams whose marks wait until their deletion is durable
    (docs/PERSISTENCE.md, deleted streams): with the AOF on, once the AOF is
    fsynced past the DEL; with it off, once a snapshot taken after the DEL
    is on disk, or at once when no snapshot on disk (or being written)
    holds the key."""

    def __init__(self, reservations: OffsetReservations) -> None:
        self.reservations = reservations
        self.removals = 0  # removals so far (a sequence number)
        self.snapshot_removals = 0  # removals the on-disk snapshot reflects
        self.snapshot_streams: set[bytes] = set()  # streams in the on-disk snapshot
        self._waiting: list[tuple[bytes, int, int | None]] = []  # key, seq, AOF position

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def removed(self, keys: Sequence[bytes]) -> None:
        """The streams at keys left the keyspace (not while loading)."""
        had = self.reservations.delete(keys)
        if had:
            first = self.removals + 1
            self.removals += len(had)
            self._waiting += zip(had, range(first, self.removals + 1), repeat(None))

    def snapshot_done(self, streams: set[bytes], removals: int) -> None:
        self.snapshot_streams = streams
        self.snapshot_removals = removals

    def settle(self, aof_end: int | None, aof_synced: int, saving: set[bytes] | None) -> None:
        """Forget the marks of deleted streams whose deletion is now durable.
        aof_end: with the AOF on, its end so far (the DELs are before it);
        None with it off. saving: the streams of a snapshot being written.
        A key deleted again meanwhile waits for that deletion."""
        # Comprehensions, not a loop of statements: one TCONCAT or DEL may
        # have deleted a hundred thousand streams.
        if aof_end is not None:
            # A DEL settled for the first time was propagated before this
            # point: once the file is synced up to aof_end, it is durable.
            placed = [
                (key, seq, aof_end if pos is None else pos) for key, seq, pos in self._waiting
            ]
            keep = [entry for entry in placed if aof_synced < entry[2]]
        else:
            newest = self.snapshot_removals
            snapshot = self.snapshot_streams
            keep = [
                entry
                for entry in self._waiting
                if entry[1] > newest
                and (entry[0] in snapshot or (saving is not None and entry[0] in saving))
            ]
        if len(keep) < len(self._waiting):
            waiting = {key for key, _seq, _pos in keep}
            self.reservations.forget_deleted(
                [key for key, _seq, _pos in self._waiting if key not in waiting]
            )
        self._waiting = keep
        # Into the page cache now, so that a kill -9 right after the DEL
        # became durable does not bring the stream back empty. No fsync: a
        # lost record only leaves an empty stream with a gap.
        self.reservations.write_best_effort([])


__all__ = ["Deletions", "OffsetReservations"]
