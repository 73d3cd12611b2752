"""Soak: a mixed load against a real rcp11-server for a fixed time, with a
checker. `python -m bench.soak --duration 600`

Load (threads, redis-py): writers pipelining TWRITE in both forms on their
own streams; a blocked reader following one of them (TREAD ... BLOCK); group
readers sharing one group key (GROUP ... BLOCK) on a stream a group writer
fills; evictions (TEVICT, and TWRITE BACKLOG on their own streams); BGSAVE
and BGREWRITEAOF; every --kill-every seconds a kill -9 and a restart,
alternating appendfsync always and everysec (AOF on).

Checks, printed at the end (exit status 1 if one fails):
- every acknowledged message reads back at its offset with its bytes
  (except on the streams the soak evicts itself, where only non-null
  messages are compared);
- acknowledged offsets of a stream only grow, across restarts (no reuse);
- no offset is handed to two group readers, and every acknowledged offset
  of the group stream is handed out, except replies lost with a killed
  server (counted; at most one batch per reader per kill);
- after every stream is deleted, used_memory_dataset is back at the empty server's
  and RSS near the empty server's (reported; limit --rss-slack-mb).
Progress goes to stdout every few seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from array import array
from collections import defaultdict
from pathlib import Path

import redis

from bench.servers import Server

RETRY = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def payload(stream: str, seq: int) -> bytes:
    return b"%s:%d:" % (stream.encode(), seq) + b"x" * (seq % 97)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="rcp11-soak-"))
        self.server = Server(
            "rcp11",
            self.workdir,
            {"appendonly": args.appendonly, "appendfsync": "always", "save": ""},
        )
        self.stop = threading.Event()
        self.lock = threading.Lock()
        # stream -> acknowledged (offset, seq) pairs, in order
        self.acked: dict[str, tuple[array, array]] = defaultdict(lambda: (array("q"), array("q")))
        self.evicted_streams: set[str] = set()
        self.delivered: dict[int, int] = {}  # group stream offset -> reader
        self.duplicates: list[tuple[int, int, int]] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.failures: list[str] = []
        self.kills = 0
        self.up = threading.Event()

    # -- plumbing ------------------------------------------------------------

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, socket_timeout=30)

    def fail(self, message: str) -> None:
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(message)
        print("FAIL", message, flush=True)

    def record_ack(self, stream: str, offset: int, seq: int) -> None:
        offsets, seqs = self.acked[stream]
        if offsets and offset <= offsets[-1]:
            self.fail(f"{stream}: offset {offset} acknowledged after {offsets[-1]} (reused)")
        offsets.append(offset)
        seqs.append(seq)

    def loop(self, name: str, body) -> threading.Thread:  # type: ignore[no-untyped-def]
        def run() -> None:
            r = self.client()
            state: dict = {}
            while not self.stop.is_set():
                self.up.wait()
                try:
                    body(r, state)
                except RETRY:
                    self.counts["reconnects"] += 1
                    time.sleep(0.05)
                except redis.exceptions.ResponseError as exc:
                    if "LOADING" in str(exc) or "MISCONF" in str(exc):
                        time.sleep(0.05)
                        continue
                    self.fail(f"{name}: {exc}")
                    time.sleep(0.1)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    # -- load ------------------------------------------------------------------

    def writer(self, index: int):  # type: ignore[no-untyped-def]
        streams = [f"w{index}:s{j}" for j in range(3)]

        def body(r: redis.Redis, state: dict) -> None:
            seq = state.setdefault("seq", 0)
            pipe = r.pipeline(transaction=False)
            plan = []
            for i in range(self.args.batch):
                stream = streams[(seq + i) % len(streams)]
                if i % 5 == 4:
                    # The options form: three entries in one command.
                    pipe.execute_command(
                        "TWRITE",
                        stream,
                        "ENTRIES",
                        *(payload(stream, seq + i * 8 + k) for k in range(3)),
                    )
                    plan.append((stream, [seq + i * 8 + k for k in range(3)]))
                else:
                    pipe.execute_command("TWRITE", stream, payload(stream, seq + i * 8))
                    plan.append((stream, [seq + i * 8]))
            state["seq"] = seq + self.args.batch * 8
            replies = pipe.execute()
            with self.lock:
                for (stream, seqs), first in zip(plan, replies, strict=True):
                    for k, s in enumerate(seqs):
                        self.record_ack(stream, first + k, s)
                    self.counts["acked"] += len(seqs)

        return body

    def evictor(self, r: redis.Redis, state: dict) -> None:
        seq = state.setdefault("seq", 0)
        stream = f"ev{seq % 2}"
        self.evicted_streams.add(stream)
        entries = [payload(stream, seq * 4 + k) for k in range(4)]
        first = r.execute_command("TWRITE", stream, "BACKLOG", 50, "ENTRIES", *entries)
        with self.lock:
            for k in range(4):
                self.record_ack(stream, first + k, seq * 4 + k)
            self.counts["acked"] += 4
        if seq % 10 == 0:
            self.counts["evicted"] += r.execute_command("TEVICT", stream, -20)
        state["seq"] = seq + 1
        time.sleep(0.005)

    def follower(self, r: redis.Redis, state: dict) -> None:
        """Blocked reads along w0:s0; bytes are checked against the writer's
        acknowledgements once the load stops."""
        offset = state.setdefault("offset", 0)
        reply = r.execute_command("TREAD", "w0:s0", offset, 100, "BLOCK", 1000)
        if not reply:
            return
        received = state.setdefault("received", {})
        for i, message in enumerate(reply):
            if message is not None and len(received) < 200_000:
                received[offset + i] = message
        state["offset"] = offset + len(reply)
        self.counts["followed"] += len(reply)
        self.followed = received

    def group_writer(self, r: redis.Redis, state: dict) -> None:
        seq = state.setdefault("seq", 0)
        pipe = r.pipeline(transaction=False)
        for k in range(10):
            pipe.execute_command("TWRITE", "gs", payload("gs", seq + k))
        replies = pipe.execute()
        with self.lock:
            for k, offset in enumerate(replies):
                self.record_ack("gs", offset, seq + k)
            self.counts["acked"] += len(replies)
        state["seq"] = seq + 10
        time.sleep(0.01)

    def group_reader(self, index: int):  # type: ignore[no-untyped-def]
        def body(r: redis.Redis, state: dict) -> None:
            reply = r.execute_command("TREAD", "gs", 0, 7, "GROUP", "gk", "BLOCK", 500, "WITHINFO")
            if not reply:
                return
            start, n = reply[0][2], reply[0][3]
            with self.lock:
                for offset in range(start, start + n):
                    if offset in self.delivered:
                        self.duplicates.append((offset, self.delivered[offset], index))
                    self.delivered[offset] = index
                self.counts["group"] += n

        return body

    def admin(self, r: redis.Redis, state: dict) -> None:
        now = time.monotonic()
        if now - state.get("bgsave", 0) > 7:
            state["bgsave"] = now
            try:
                r.bgsave()
                self.counts["bgsave"] += 1
            except redis.exceptions.ResponseError:
                pass  # one already in progress
        if now - state.setdefault("rewrite", now - 3) > 11:
            state["rewrite"] = now
            try:
                r.bgrewriteaof()
                self.counts["bgrewriteaof"] += 1
            except redis.exceptions.ResponseError:
                pass
        time.sleep(0.2)

    # -- the run -----------------------------------------------------------------

    def kill_and_restart(self) -> None:
        self.up.clear()
        assert self.server.proc is not None
        self.server.proc.kill()
        self.server.proc.wait()
        self.kills += 1
        self.server.extra["appendfsync"] = "everysec" if self.kills % 2 else "always"
        self.server.start(timeout=120)
        self.up.set()

    def run(self) -> int:
        """The soak; the server is killed whatever happens, and its directory
        removed unless a check failed (then its path is printed)."""
        code = 1
        try:
            code = self._run()
        finally:
            if self.server.proc is not None and self.server.proc.poll() is None:
                self.server.proc.kill()
                self.server.proc.wait()
            if code == 0:
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                print(f"soak: server files kept in {self.workdir}", flush=True)
        return code

    def _run(self) -> int:
        args = self.args
        self.server.start()
        assert self.server.proc is not None
        base_rss = rss_kb(self.server.proc.pid)
        r = self.client()
        # The dataset's own count (used_memory is the whole process's).
        base_used = int(r.info("memory")["used_memory_dataset"])
        print(
            f"soak: server on port {self.server.port}, dir {self.workdir}, empty RSS {base_rss} kB",
            flush=True,
        )
        self.followed: dict[int, bytes] = {}
        self.up.set()
        threads = [self.loop(f"writer{i}", self.writer(i)) for i in range(args.writers)]
        threads += [self.loop("evictor", self.evictor), self.loop("follower", self.follower)]
        threads += [self.loop("group-writer", self.group_writer)]
        threads += [self.loop(f"group{i}", self.group_reader(i)) for i in range(args.group_readers)]
        threads += [self.loop("admin", self.admin)]
        started = time.monotonic()
        next_kill = started + args.kill_every if args.kill_every else float("inf")
        next_report = started + 5
        peak_rss = base_rss
        while time.monotonic() - started < args.duration:
            time.sleep(0.1)
            now = time.monotonic()
            if now >= next_kill:
                self.kill_and_restart()
                next_kill = time.monotonic() + args.kill_every
            if now >= next_report:
                next_report = now + 5
                peak_rss = max(peak_rss, rss_kb(self.server.proc.pid))
                print(self.progress(now - started), flush=True)
        self.stop.set()
        for thread in threads:
            thread.join(60)
        self.up.set()
        print(self.progress(time.monotonic() - started) + "  (load stopped)", flush=True)
        r = self.client()
        self.drain_group(r)
        self.check_messages(r)
        self.check_group()
        # Memory: delete every key, then compare with the empty server.
        loaded_rss = rss_kb(self.server.proc.pid)
        for key in r.scan_iter(count=1000):
            r.delete(key)
        # Freed memory goes back once it stayed unused 5 s (the server's
        # rcp11/server/trim.py): wait up to three times that.
        deleted_at = time.monotonic()
        bound = base_rss + args.rss_slack_mb * 1024
        after_rss = rss_kb(self.server.proc.pid)
        while after_rss > bound and time.monotonic() - deleted_at < 15:
            time.sleep(0.5)
            after_rss = rss_kb(self.server.proc.pid)
        used = int(r.info("memory")["used_memory_dataset"])
        print(
            f"soak memory: used_memory_dataset empty {base_used} -> after DEL {used}; RSS empty "
            f"{base_rss} kB, peak {peak_rss} kB, before DEL {loaded_rss} kB, after DEL {after_rss} kB "
            f"({time.monotonic() - deleted_at:.1f} s after it)",
            flush=True,
        )
        if used > base_used + 64 * 1024:
            self.fail(
                f"used_memory_dataset {used} after deleting every key, empty server {base_used}"
            )
        if after_rss > bound:
            self.fail(f"RSS {after_rss} kB after deleting every key, empty server {base_rss} kB")
        self.server.proc.kill()
        self.server.proc.wait()
        return self.summary(time.monotonic() - started)

    def progress(self, elapsed: float) -> str:
        c = self.counts
        return (
            f"soak {elapsed:6.0f}s acked={c['acked']} followed={c['followed']} group={c['group']} "
            f"evicted={c['evicted']} bgsave={c['bgsave']} bgrewriteaof={c['bgrewriteaof']} "
            f"kills={self.kills} reconnects={c['reconnects']} failures={len(self.failures)}"
        )

    def drain_group(self, r: redis.Redis) -> None:
        while True:
            reply = r.execute_command("TREAD", "gs", 0, 1000, "GROUP", "gk", "WITHINFO")
            start, n = reply[0][2], reply[0][3]
            if not n:
                return
            for offset in range(start, start + n):
                if offset in self.delivered:
                    self.duplicates.append((offset, self.delivered[offset], -1))
                self.delivered[offset] = -1

    def check_messages(self, r: redis.Redis) -> None:
        checked = 0
        for stream, (offsets, seqs) in self.acked.items():
            evicting = stream in self.evicted_streams
            for at in range(0, len(offsets), 1000):
                chunk_offsets = offsets[at : at + 1000]
                first = chunk_offsets[0]
                span = chunk_offsets[-1] - first + 1
                messages = r.execute_command("TREAD", stream, first, span)
                for offset, seq in zip(chunk_offsets, seqs[at : at + 1000], strict=True):
                    got = (
                        messages[offset - first] if offset - first < len(messages) else b"<missing>"
                    )
                    if got is None and evicting:
                        continue
                    if got != payload(stream, seq):
                        self.fail(f"{stream} offset {offset}: {got!r:.60} instead of seq {seq}")
                    checked += 1
        self.counts["checked"] = checked
        with self.lock:
            acked = dict(zip(*self.acked["w0:s0"], strict=True))
        for offset, message in self.followed.items():
            seq = acked.get(offset)
            if seq is not None and message != payload("w0:s0", seq):
                self.fail(f"blocked reader got {message!r:.60} at w0:s0 {offset}, seq {seq}")

    def check_group(self) -> None:
        offsets = self.acked["gs"][0]
        skipped = [o for o in offsets if o not in self.delivered]
        self.counts["group_skipped"] = len(skipped)
        if self.duplicates:
            self.fail(
                f"{len(self.duplicates)} group offsets delivered twice, e.g. {self.duplicates[:5]}"
            )
        # A reply in flight when the server was killed is lost with it: at
        # most one batch (7) per reader per kill.
        allowed = self.kills * self.args.group_readers * 7
        if len(skipped) > allowed:
            self.fail(
                f"{len(skipped)} acknowledged group offsets never delivered (allowed {allowed}), e.g. {skipped[:10]}"
            )

    def summary(self, elapsed: float) -> int:
        c = self.counts
        print(
            f"soak done: {elapsed:.0f}s, {c['acked']} acknowledged messages, {c['checked']} checked "
            f"at their offsets, {c['followed']} read by the blocked reader, {c['group']} handed to "
            f"group readers ({c['group_skipped']} lost in flight at kills, {len(self.duplicates)} "
            f"twice), {c['evicted']} evicted by TEVICT, {c['bgsave']} BGSAVE, "
            f"{c['bgrewriteaof']} BGREWRITEAOF, {self.kills} kill -9 rounds: "
            + ("OK" if not self.failures else f"{len(self.failures)} FAILURES"),
            flush=True,
        )
        for failure in self.failures[:20]:
            print("  ", failure)
        return 1 if self.failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60, help="seconds of load (60)")
    parser.add_argument(
        "--kill-every", type=float, default=20, help="seconds between kill -9 (20; 0: never)"
    )
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--group-readers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20, help="TWRITEs per writer pipeline")
    parser.add_argument(
        "--rss-slack-mb", type=int, default=64, help="RSS over the empty server allowed after DEL"
    )
    parser.add_argument(
        "--appendonly",
        default="yes",
        choices=("yes", "no"),
        help="no: a server that loses writes at kill -9, to see the checker catch it",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
