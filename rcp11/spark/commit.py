"""The sink's two-phase commit: key names, and the driver's commit and
abort. Tasks (rcp11.spark.sink) stage rows in private streams; the commit
moves them into the target in one transaction.

Keys (all of one target share its Redis Cluster hash slot through the
target's hash tag, so the commit's transaction is legal on a Cluster)::

    rcp11-sink:{T}:<query>:<batch>:<partition>:<attempt>:<nonce>   staging stream
    rcp11-sink:{T}:<query>:staged     registry: "<batch> <staging key>" per staging stream
    rcp11-sink:{T}:<query>:progress   the last batch id committed to T by this query

``{T}`` is the target's own hash tag, or the whole target name (and when
the target has a tag of its own, its full name follows the braces); a name
with a stray '}' gets a tag of the same slot instead (slot_tag). The
query is Spark's streaming query id, which a restart from the checkpoint
keeps; a batch write uses a fresh id per job and no progress key.

A task registers each staging stream before writing to it. The commit of
batch b for target T runs, guarded by ``WATCH progress registry``::

    MULTI
    TCONCAT T <staging streams of b, in partition order>   (skipped if b is in)
    SET progress "b <first staging stream>"
    DEL <orphans: registered staging of batches <= b that are not committed>
    DEL registry; TWRITE registry <entries of b and of later batches>
    EXEC

"b is in" means progress > b, or progress = b and its marker (the first
staging stream that commit moved) is gone: a TCONCAT that failed at run
time (MISCONF) leaves its sources, while EXEC still runs SET progress.

so a retried task's earlier attempt, a replayed batch (progress already at
b: its staging is only dropped) and the staging left by a driver that died
mid-batch (found in the registry by the next commit) never reach T twice.
Before that the commit checks each staging stream still holds exactly the
rows its task wrote, where its TWRITEs put them (a gap of null offsets a
server restart left between them is no loss); a server that lost rows
fails the batch instead.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from pyspark.sql.datasource import WriterCommitMessage
from redis.crc import key_slot

from rcp11 import errors
from rcp11.spark.cluster import Fleet, Router
from rcp11.spark.options import WriteOptions

if TYPE_CHECKING:
    from rcp11.client import Client

log = logging.getLogger("rcp11.spark")

PREFIX = "rcp11-sink:"
# TCONCAT appends at most 2^28 messages per call (the server's limit). A
# commit is one TCONCAT per target, so all or none of a batch lands.
TCONCAT_MAX_MESSAGES = 1 << 28
# Progress of a commit that moved nothing.
NO_MARKER = "-"
# Messages per read when a stream is read whole (a registry; counting what
# a staging stream holds).
COUNT_PAGE = 100_000


def hash_tag(key: str) -> str:
    """The part of key Redis Cluster hashes: the text of its first
    non-empty {...}, else the whole key."""
    opening = key.find("{")
    if opening >= 0:
        closing = key.find("}", opening + 1)
        if closing > opening + 1:
            return key[opening + 1 : closing]
    return key


@functools.lru_cache(maxsize=1024)
def slot_tag(target: str) -> str:
    """A tag that puts a key in target's hash slot when written as {tag}:
    target's own hash tag, or its whole name; a whole name with a '}' in it
    would end the braces early (Redis hashes up to the first '}'), so it
    gets the first of "slot0", "slot1", ... that hashes to the same slot."""
    tag = hash_tag(target)
    if "}" not in tag:
        return tag
    slot = key_slot(target.encode())
    return next(f"slot{n}" for n in itertools.count() if key_slot(b"slot%d" % n) == slot)


def sink_key(target: str, query: str, suffix: str) -> str:
    tag = slot_tag(target)
    name = f"{PREFIX}{{{tag}}}" + (f":{target}" if tag != target else "")
    return f"{name}:{query}:{suffix}"


@dataclass(frozen=True)
class Staged:
    target: str
    key: str  # the staging stream
    rows: int
    # Where the rows are: (first offset, rows) per run of offsets its
    # TWRITEs filled. A server restart in the middle of a task may leave a
    # gap of null offsets between two runs; () means one run from 0.
    runs: tuple[tuple[int, int], ...] = ()


@dataclass
class StagedWrite(WriterCommitMessage):
    """What one task wrote: its staging streams, one per target."""

    query: str
    batch: int
    partition: int
    staged: list[Staged] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------


def _by_target(messages: Sequence[WriterCommitMessage | None]) -> dict[str, list[Staged]]:
    """Staging streams per target, in partition order."""
    writes = sorted((m for m in messages if isinstance(m, StagedWrite)), key=lambda m: m.partition)
    targets: dict[str, list[Staged]] = {}
    for write in writes:
        for staged in write.staged:
            targets.setdefault(staged.target, []).append(staged)
    return targets


def _registered(client: Any, registry: str) -> list[tuple[int, int, str]]:
    """Entries of a registry stream: (offset, batch, staging key). Read run
    by run (NONULLS): a gap a server restart left is stepped over, not read
    as a page of nulls."""
    entries = []
    offset = 0
    while True:
        result = client.tread(registry, offset, COUNT_PAGE, withinfo=True, nonulls=True)
        if result.count == 0:
            return entries
        for at, message in result.items():
            batch, _, key = message.decode().partition(" ")
            entries.append((at, int(batch), key))
        offset = result.end


def _check_staged(client: Any, staged: Sequence[Staged]) -> None:
    """Each staging stream holds exactly its task's rows, where its TWRITEs
    put them: the last row of each run readable (a crash loses a suffix of
    the log, so a lost row shows at the end of a run), and nothing readable
    before the first run, between runs or after the last one. A gap of
    null offsets between runs or after the last (what a server restart may
    leave) is no loss: TCONCAT moves only readable messages. Counted from
    what the stream holds, never from its next offset."""
    pipe = client.pipeline(transaction=False)
    plans = []
    for item in staged:
        runs = item.runs or ((0, item.rows),)
        pipe.tread(item.key, 0, 0, withinfo=True, nonulls=True)
        for first, rows in runs:
            pipe.tread(item.key, first + rows - 1, 1)
            pipe.tread(item.key, first + rows, 0, withinfo=True, nonulls=True)
        plans.append((item, runs))
    replies = iter(pipe.execute())
    for item, runs in plans:
        head = next(replies)
        intact = head.start == runs[0][0]
        for index in range(len(runs)):
            last, after = next(replies), next(replies)
            # The next readable offset after the run: the next run's first,
            # or none (reply_start is then the next offset or past it).
            following = runs[index + 1][0] if index + 1 < len(runs) else None
            intact = intact and bool(last) and last[0] is not None
            if following is None:
                intact = intact and after.start >= after.next_offset
            else:
                intact = intact and after.start == following
        if not intact:
            found = count_readable(lambda at, n, key=item.key: _run(client, key, at, n))
            raise RuntimeError(errors.spark_staging_lost(item.key, item.rows, found))


def _run(client: Any, key: str, offset: int, count: int) -> tuple[int, int]:
    result = client.tread(key, offset, count, withinfo=True, nonulls=True)
    return result.start, result.count


def count_readable(read_run: Callable[[int, int], tuple[int, int]]) -> int:
    """Messages a stream holds (nulls not counted), for an error message;
    it reads them all. read_run(offset, count) sends TREAD key offset count
    NONULLS WITHINFO and answers (reply_start, reply_count)."""
    offset = total = 0
    while True:
        start, count = read_run(offset, COUNT_PAGE)
        if count == 0:
            return total
        total += count
        offset = start + count


def _progress(client: Any, key: str) -> tuple[int, str]:
    """The progress key: (last batch committed, its marker), (-1, "-") if none."""
    value = client.get(key)
    if value is None:
        return -1, NO_MARKER
    batch, _, marker = value.decode().partition(" ")
    return int(batch), marker or NO_MARKER


def committed(client: Any, progress: str, batch: int) -> bool:
    """Whether ``batch`` is already in the target.

    A runtime error of TCONCAT inside EXEC (MISCONF when the offsets file
    cannot be written) does not stop the transaction's other commands, SET
    progress included. So progress names a marker: the first staging
    stream the commit moved, which a successful TCONCAT deleted. If it
    still exists, that commit did not happen."""
    recorded, marker = _progress(client, progress)
    if recorded != batch:
        return recorded > batch
    return marker == NO_MARKER or not client.exists(marker)


def _check_target(client: Any, target: str, staged: Sequence[Staged]) -> None:
    """What would make TCONCAT fail, checked before the transaction."""
    kind = client.type(target)
    if kind not in (b"none", b"stream", b"rcp11-log"):
        raise RuntimeError(errors.spark_target_not_a_stream(target, kind.decode()))
    rows = sum(s.rows for s in staged)
    if rows > TCONCAT_MAX_MESSAGES:
        raise RuntimeError(errors.spark_commit_too_large(target, rows, TCONCAT_MAX_MESSAGES))


def commit_target(
    client: Client, target: str, query: str, batch: int | None, staged: Sequence[Staged]
) -> None:
    """Move one target's staging streams into it (see the module docstring).
    ``batch`` None: a batch write (no progress key). Safe to run again
    after any failure: a second run finds the batch committed and only
    drops what is left."""
    registry = sink_key(target, query, "staged")
    progress = sink_key(target, query, "progress")
    committing = [s for s in staged if s.rows > 0]
    committing_keys = {s.key for s in staged}
    _check_target(client, target, committing)
    _check_staged(client, committing)
    current = batch if batch is not None else 0
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(registry, progress)
                done = batch is not None and committed(pipe, progress, batch)
                entries = _registered(pipe, registry)
                orphans = [k for _, b, k in entries if b <= current and k not in committing_keys]
                keep = [f"{b} {k}" for _, b, k in entries if b > current]
                pipe.multi()
                if not done:
                    if committing:
                        pipe.execute_command("TCONCAT", target, *(s.key for s in committing))
                    if batch is not None:
                        marker = committing[0].key if committing else NO_MARKER
                        pipe.set(progress, f"{batch} {marker}")
                        # Registered until the next commit: should this TCONCAT
                        # fail, the replay of the batch drops them as orphans.
                        keep += [f"{batch} {s.key}" for s in committing]
                drop = orphans + ([s.key for s in staged] if done else [])
                drop += [s.key for s in staged if s.rows == 0]
                if drop:
                    pipe.delete(*drop)
                if entries:
                    pipe.delete(registry)
                if keep:
                    pipe.twrite(registry, *keep)
                replies = pipe.execute(raise_on_error=False)
            except redis.WatchError:
                continue
            if not done and committing and isinstance(replies[0], redis.ResponseError):
                raise RuntimeError(errors.spark_commit_failed(target, current, f"{replies[0]}"))
            if done:
                log.info("rcp11 sink: batch %s already in %r; dropped its staging", batch, target)
            return


def commit(
    options: WriteOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch: int | None,
    router: Router | None = None,
) -> None:
    """Commit each target on the node that owns it (all its sink keys share
    its hash slot); a redirection or lost node starts that target over."""
    targets = _by_target(messages)
    writes = [m for m in messages if isinstance(m, StagedWrite)]
    if not writes:
        return  # no task ran: nothing was staged, nothing names the query
    query = writes[0].query
    if options.stream is not None:
        targets.setdefault(options.stream, [])
    with Fleet(router or Router(options.endpoint)) as fleet:
        for target, staged in sorted(targets.items()):
            fleet.call(
                f"committing batch {batch if batch is not None else 0} to {target!r}",
                lambda f, t=target, s=staged: commit_target(f.client_for(t), t, query, batch, s),
            )


def abort(
    options: WriteOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch: int,
    router: Router | None = None,
) -> None:
    """Drop what the batch staged; the target is untouched."""
    writes = [m for m in messages if isinstance(m, StagedWrite)]
    if not writes:
        return
    query = writes[0].query

    def drop(client: Client, target: str, staged: list[Staged]) -> None:
        entries = _registered(client, sink_key(target, query, "staged"))
        keys = {s.key for s in staged} | {k for _, b, k in entries if b == batch}
        recorded, marker = _progress(client, sink_key(target, query, "progress"))
        if recorded == batch:
            # A commit whose TCONCAT failed recorded this batch: its marker
            # must stay, so that the replay knows the batch is not in.
            keys.discard(marker)
        if keys:
            client.delete(*keys)

    with Fleet(router or Router(options.endpoint)) as fleet:
        for target, staged in sorted(_by_target(messages).items()):
            fleet.call(
                f"aborting batch {batch}",
                lambda f, t=target, s=staged: drop(f.client_for(t), t, s),
            )
