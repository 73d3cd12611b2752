"""The command line's arguments: the subcommands and their options, --since
times, and what Kafka's and kcat's spellings are here.

The spellings Kafka users type most are accepted as they are (`--topic`,
`--from-beginning`, `--max-messages`, kcat's `-o beginning|end|N`, `-o s@TS`
(--since TS) and `-c N`); the others are an error that names the rcp11 option that does it.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

from rcp11 import __version__
from rcp11.cli.transfer import DEFAULT_CONSUME_BATCH, DEFAULT_PRODUCE_BATCH, PROG
from rcp11.client import DEFAULT_LEASE_MS

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6379

# Kafka's and kcat's options that have another name, or no counterpart,
# here: shown when one of them makes the arguments fail.
_ADDRESS = "-h HOST -p PORT (or -u redis://HOST:PORT)"
_NO_PROPERTIES = (
    "no client properties here: the connection is -h/-p/-a/--user/-u, "
    "the batch size --batch, a wait --block MS"
)
KAFKA_SPELLINGS = {
    "--bootstrap-server": _ADDRESS,
    "--broker-list": _ADDRESS,
    "-b": _ADDRESS,
    "-t": "the stream key is the command's argument (rcp11 consume KEY), or --topic KEY",
    "-C": "rcp11 consume KEY",
    "-P": "rcp11 produce KEY",
    "-L": "rcp11 streams (and rcp11 info KEY)",
    "-e": "rcp11 consume exits when it has caught up unless --follow is given",
    "--list": "rcp11 streams",
    "--describe": "rcp11 groups KEY GROUPKEY... (lag), rcp11 info KEY (offsets)",
    "--offset": "--from OFFSET (beginning, end, N, or -N from the end)",
    "--partition": "a stream has no partitions: one stream per partition (events:0, events:1 ...)",
    "--timeout-ms": "--block MS",
    "--property": "--offsets prints each message's offset, --times its append time; messages "
    "have no key",
    "-G": "--group GROUPKEY (kcat -G GROUP TOPIC is rcp11 consume TOPIC --group GROUPKEY)",
    "-K": "messages have no key: each line is one message",
    "-J": "--offsets prefixes each message with its offset, --times with its append time "
    "(no JSON envelope)",
    "-X": _NO_PROPERTIES,
    "--consumer-property": _NO_PROPERTIES,
    "--producer-property": _NO_PROPERTIES,
    "--consumer.config": _NO_PROPERTIES,
    "--producer.config": _NO_PROPERTIES,
}


class _Parser(argparse.ArgumentParser):
    """argparse, plus a hint when an argument failed that is Kafka's or
    kcat's spelling of something rcp11 spells otherwise."""

    def error(self, message: str) -> NoReturn:
        for word in self._words:
            hint = KAFKA_SPELLINGS.get(word.split("=", 1)[0])
            if hint is None and len(word) > 2 and word[1] != "-":
                hint = KAFKA_SPELLINGS.get(word[:2])  # kcat's -K: and -Xa=b
            if hint is not None:
                message += f"\n{word} is Kafka's (or kcat's) spelling; here: {hint}"
                break
        super().error(message)

    _words: list[str] = []


# ---------------------------------------------------------------------------
# --since
# ---------------------------------------------------------------------------


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_UNITS_MS["w"] = 7 * _DURATION_UNITS_MS["d"]
_DURATION = re.compile(r"(?:(\d+)(ms|s|m|h|d|w))+")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")


@dataclass(frozen=True)
class Since:
    """--since: a moment (unix ms), or a duration before the moment the
    command runs (resolved then, not when the arguments were parsed)."""

    unix_ms: int | None = None
    ago_ms: int = 0

    def resolve(self, now_ms: int | None = None) -> int:
        if self.unix_ms is not None:
            return self.unix_ms
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return now - self.ago_ms


def parse_since(text: str) -> Since:
    """--since's WHEN: '10m', '1h30m', '500ms' (ago), '2026-11-23T21:00[:SS][Z|+HH:MM]'
    (local time without a zone), or unix milliseconds."""
    value = text.strip()
    if value.isdigit():
        return Since(unix_ms=int(value))
    if _DURATION.fullmatch(value):
        ago = sum(int(n) * _DURATION_UNITS_MS[unit] for n, unit in _DURATION_PART.findall(value))
        return Since(ago_ms=ago)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (10m, 2h, 1h30m), a date and time "
            "(2026-11-23T21:00) or unix milliseconds"
        ) from None
    return Since(unix_ms=round(moment.timestamp() * 1000))


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


_FROM_WORDS = {"beginning": "beginning", "earliest": "beginning", "end": "end", "latest": "end"}


def _from(text: str) -> int | str | Since:
    """--from / -o: an offset, -N from the end, or beginning/end (kcat's
    words; Kafka's earliest/latest too); kcat's s@TS is --since TS."""
    word = _FROM_WORDS.get(text.lower())
    if word is not None:
        return word
    if text.lower() == "stored":
        raise argparse.ArgumentTypeError("kcat's '-o stored' is --group GROUPKEY here")
    if text[:2].lower() == "s@" and text[2:].isdigit():
        return Since(unix_ms=int(text[2:]))
    if text[:2].lower() == "e@":
        raise argparse.ArgumentTypeError(
            "kcat's e@TS has no end time here: consume stops when it has caught up, or after -n N"
        )
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an offset: give N, -N (from the end), beginning or end"
        ) from None


# ---------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------


def _add_connection_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # The same options are accepted before and after the subcommand. After it
    # they default to SUPPRESS so they never overwrite what was given before.
    def default(value: object) -> object:
        return value if top_level else argparse.SUPPRESS

    group = parser.add_argument_group("connection (as redis-cli)")
    group.add_argument(
        "-h", "--host", default=default(DEFAULT_HOST), help=f"server host (default {DEFAULT_HOST})"
    )
    group.add_argument(
        "-p",
        "--port",
        type=int,
        default=default(DEFAULT_PORT),
        help=f"server port (default {DEFAULT_PORT})",
    )
    group.add_argument(
        "-a",
        "--password",
        default=default(None),
        help="password (AUTH); the REDISCLI_AUTH environment variable also works",
    )
    group.add_argument("--user", default=default(None), help="ACL user name for AUTH")
    group.add_argument(
        "-u",
        "--url",
        default=default(None),
        help="server URL redis://[user:password@]host[:port], instead of -h/-p/-a",
    )
    group.add_argument(
        "--progress",
        action="store_true",
        default=default(False),
        help="report progress on stderr even when it is not a terminal",
    )


def _add_key(parser: argparse.ArgumentParser) -> None:
    """KEY, or Kafka's --topic KEY (check_key() makes it one of the two)."""
    parser.add_argument("key", metavar="KEY", nargs="?", help="stream key")
    parser.add_argument("--topic", metavar="KEY", help="the same as KEY (Kafka's spelling)")


_GROUP_HELP = (
    "consume as a member of the consumer group whose next offset is in the string key "
    "GROUPKEY (a new group starts at the oldest message). A group read is its own "
    "acknowledgement: each TREAD moves the group past the messages it hands out (up to "
    "--batch), before they are written to stdout, so what a consumer was handed and did "
    "not finish (it was killed, or `| head` closed the pipe) is not handed out again: "
    "at most once; --ack makes it at least once"
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        add_help=False,
        description="Produce to and consume from rcp11 streams (RCP 11 logs over RESP).",
        epilog=(
            "Start a server with: rcp11 server [redis.conf] [--port N ...] (or rcp11-server). "
            "See '%(prog)s COMMAND --help' for each command."
        ),
    )
    parser.add_argument("--help", action="help", help="show this help and exit")
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}", help="show the version"
    )
    _add_connection_options(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, add_help=False, help=help_text, description=description)
        sub.add_argument("--help", action="help", help="show this help and exit")
        _add_connection_options(sub, top_level=False)
        return sub

    p = add(
        "produce",
        "append stdin lines to a stream",
        "Append each line of stdin as one message to the stream KEY (TWRITE). Lines are "
        "sent as soon as they arrive; fast input goes in batches of --batch entries per "
        "TWRITE, pipelined. The offsets written are printed to stderr at the end.",
    )
    _add_key(p)
    p.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_PRODUCE_BATCH,
        help=f"entries per TWRITE (default {DEFAULT_PRODUCE_BATCH})",
    )
    p.add_argument(
        "--backlog",
        type=_non_negative,
        default=None,
        help="keep only the newest N messages readable (TWRITE BACKLOG N)",
    )
    p.add_argument(
        "--null", action="store_true", help="messages end with NUL bytes instead of newlines"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the offsets written")

    c = add(
        "consume",
        "write a stream's messages to stdout",
        "Write the messages of stream KEY to stdout, one per line, starting at --from "
        "(or where consumer group --group left off, or the first message appended since "
        "--since), until caught up; --follow keeps waiting for new messages. Evicted "
        "offsets, and the gap a crash may leave, are skipped. With --group, reading is "
        "acknowledging (see --group) unless --ack is given.",
    )
    _add_key(c)
    starts = c.add_mutually_exclusive_group()
    starts.add_argument(
        "--from",
        "-o",
        dest="from_offset",
        type=_from,
        default=None,
        metavar="OFFSET",
        help="first offset to read (default 0: the oldest readable); -N starts N messages "
        "before the end; 'beginning' or 'end' (only what is written from now on)",
    )
    starts.add_argument(
        "--from-beginning",
        dest="from_offset",
        action="store_const",
        const="beginning",
        help="the same as --from beginning (Kafka's spelling)",
    )
    c.add_argument(
        "--since",
        type=parse_since,
        default=None,
        metavar="WHEN",
        help="start at the first message appended at or after WHEN: a duration ago (90s, "
        "10m, 2h, 7d, 1h30m, 500ms), a date and time (2026-11-23T21:00, local time unless it "
        "ends in Z or +HH:MM) or unix milliseconds (1763931600000)",
    )
    groups = c.add_mutually_exclusive_group()
    groups.add_argument("--group", metavar="GROUPKEY", help=_GROUP_HELP)
    groups.add_argument(
        "--groupnew",
        metavar="GROUPKEY",
        help="like --group, but a new group starts with the next message written",
    )
    waits = c.add_mutually_exclusive_group()
    waits.add_argument(
        "-f", "--follow", action="store_true", help="when caught up, wait forever for more"
    )
    waits.add_argument(
        "--block",
        type=_non_negative,
        metavar="MS",
        default=None,
        help="when caught up, wait up to MS milliseconds for more, then exit",
    )
    c.add_argument(
        "-n",
        "-c",
        "--count",
        "--max-messages",
        dest="count",
        type=_non_negative,
        default=None,
        metavar="N",
        help="stop after N messages",
    )
    c.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_CONSUME_BATCH,
        help=f"messages per TREAD (default {DEFAULT_CONSUME_BATCH})",
    )
    c.add_argument(
        "--ack",
        action="store_true",
        help="with --group/--groupnew: at least once (an acknowledged group, TREAD LEASE). "
        "Each batch is leased (--lease) and acknowledged only once the reader of stdout took "
        "it (for a pipe: read it out and came back for more, or stayed a moment after the "
        "last batch); a batch the reader did not take, or of a consumer that dies, is "
        "delivered again to the group when its lease runs out",
    )
    c.add_argument(
        "--lease",
        type=_positive,
        metavar="MS",
        default=DEFAULT_LEASE_MS,
        help=f"with --ack: how long a batch may take before the group gives it to another "
        f"consumer (default {DEFAULT_LEASE_MS} ms)",
    )
    c.add_argument(
        "--consumer",
        metavar="NAME",
        default=None,
        help="with --ack: the name this consumer leases under (default HOST-PID)",
    )
    c.add_argument("--offsets", action="store_true", help="prefix each message with OFFSET<TAB>")
    c.add_argument(
        "--times",
        action="store_true",
        help="prefix each message with its append time in unix milliseconds and a TAB (after "
        "the offset with --offsets), as kcat's %%T or Kafka's print.timestamp",
    )
    c.add_argument(
        "--null", action="store_true", help="end messages with NUL bytes instead of newlines"
    )

    i = add(
        "info",
        "show a stream's offsets",
        "Show the first readable, last and next offsets of stream KEY and how many "
        "offsets lie between (TREAD KEY 0 0 WITHINFO).",
    )
    _add_key(i)
    i.add_argument("--json", action="store_true", help="print one JSON object")

    s = add(
        "streams",
        "list the streams (kafka-topics --list)",
        "List the streams whose names match PATTERN (a glob, as KEYS/SCAN take), one per "
        "line, sorted (SCAN MATCH PATTERN TYPE rcp11-log), as kafka-topics --list does.",
    )
    s.add_argument("pattern", metavar="PATTERN", nargs="?", default="*", help="default *")
    s.add_argument(
        "-l", "--long", action="store_true", help="with each stream's offsets and length"
    )
    s.add_argument("--json", action="store_true", help="one JSON object per stream")

    g = add(
        "groups",
        "how far consumer groups are behind (kafka-consumer-groups --describe)",
        "As kafka-consumer-groups --describe: for each consumer group of stream KEY, its "
        "next offset (CURRENT-OFFSET), the stream's next offset (LOG-END-OFFSET) and LAG, "
        "the readable messages it has not been handed yet. A plain group is just a string "
        "key holding its offset, so name them: GROUPKEY may be a glob. Acknowledged groups "
        "(consume --ack, TREAD LEASE) add PENDING (leased, not acknowledged), EXPIRED "
        "(leases that ran out: delivered again next), REDELIVERED and CONSUMERS, with a line "
        "per consumer holding leases; without GROUPKEY every acknowledged group of KEY is "
        "shown (SCAN TYPE rcp11-grp).",
    )
    g.add_argument("key", metavar="KEY", help="stream key")
    g.add_argument(
        "groupkeys",
        metavar="GROUPKEY",
        nargs="*",
        help="group keys or globs (default: the acknowledged groups of KEY)",
    )
    g.add_argument("--json", action="store_true", help="one JSON object per group")

    e = add(
        "evict",
        "drop old messages",
        "Make every message of KEY at or before OFFSET unreadable (TEVICT). A negative "
        "OFFSET -N keeps the newest N messages.",
    )
    e.add_argument("key", metavar="KEY", help="stream key")
    e.add_argument("offset", metavar="OFFSET", type=int, help="last offset to evict, or -N")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments, checked; a usage error exits with status 2."""
    parser = build_parser()
    _Parser._words = list(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        parser.exit(2)
    if hasattr(args, "topic"):
        if args.key is None and args.topic is None:
            parser.error(f"{args.command}: the stream KEY is missing")
        if args.key is not None and args.topic is not None and args.key != args.topic:
            parser.error(f"{args.command}: KEY {args.key!r} and --topic {args.topic!r} differ")
        args.key = args.key if args.key is not None else args.topic
    if args.command == "consume":
        if isinstance(args.from_offset, Since):  # -o s@TS
            if args.since is not None:
                parser.error("-o s@TS and --since both say where to start: give one")
            args.since, args.from_offset = args.from_offset, None
        _check_consume(parser, args)
    return args


def _check_consume(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    grouped = args.group or args.groupnew
    if args.ack and not grouped:
        parser.error("--ack needs --group or --groupnew: acknowledgements belong to a group")
    if args.ack and args.times:
        # A lease read (TREAD ... LEASE) answers no append times.
        parser.error("--times cannot be combined with --ack: acknowledged reads carry no times")
    if args.from_offset is not None and grouped:
        parser.error(
            "--from cannot be combined with --group/--groupnew: the group key holds the offset"
        )
    if args.since is not None:
        if grouped:
            parser.error(
                "--since cannot be combined with --group/--groupnew: the group key holds the offset"
            )
        if args.from_offset is not None:
            parser.error("--since and --from both say where to start: give one")
