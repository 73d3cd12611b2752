"""rcp11 command line: produce from stdin, consume to stdout, inspect, evict.

    seq 1 1000000 | rcp11 produce events          # one message per line
    rcp11 consume events --from -10               # the last ten, then exit
    rcp11 consume events --group events:g --follow | ./worker
    rcp11 consume events --group events:g --ack --follow | ./worker   # at least once
    rcp11 consume events --since 10m              # appended in the last ten minutes
    rcp11 consume events --times --offsets        # OFFSET<TAB>UNIX-MS<TAB>MESSAGE
    rcp11 info events
    rcp11 streams -l                              # every stream, with its offsets
    rcp11 groups events 'events:*'                # each group's lag
    rcp11 groups events                           # its acknowledged groups: pending, consumers
    rcp11 evict events 499

Connection options are redis-cli's: -h HOST -p PORT -a PASSWORD, or -u URL.
Long runs report progress (messages and messages/s) on stderr about once a
second when stderr is a terminal and the data side (stdin for produce, stdout
for consume) is not, or always with --progress.

Exit status: 0 success, 1 an error (explained on stderr), 2 bad usage,
130 interrupted.

transfer.py has produce and consume, acked.py consume --ack and the
acknowledged groups' rows of `groups`, inspection.py the other commands,
args.py the arguments (Kafka's spellings among them), connection.py the
connection and the one-line explanations of failures.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import BinaryIO, TextIO

import redis

from rcp11.cli.args import Since, build_parser, parse_args, parse_since
from rcp11.cli.connection import connect, explain
from rcp11.cli.inspection import NotAGroup, evict, groups, info, streams
from rcp11.cli.transfer import PROG, Progress, consume, produce, split_messages
from rcp11.client import Client
from rcp11.stdio import silence_stdout

__all__ = ["Progress", "Since", "build_parser", "main", "parse_since", "split_messages"]

_TEXT_COMMANDS = {"info": info, "streams": streams, "groups": groups, "evict": evict}


def main(
    argv: list[str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the command line; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    stderr = stderr if stderr is not None else sys.stderr
    client: Client | None = None
    try:
        client = connect(args)
        if args.command == "produce":
            return produce(args, client, stdin, stderr)
        if args.command == "consume":
            return consume(args, client, stdout, stderr)
        return _TEXT_COMMANDS[args.command](args, client, _text(stdout))
    except redis.exceptions.RedisError as exc:
        stderr.write(f"{PROG} {args.command}: {explain(exc, args, client)}\n")
        return 1
    except NotAGroup as exc:
        stderr.write(f"{PROG} {args.command}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`rcp11 consume k | head`): not an error.
        silence_stdout()
        return 0
    finally:
        if client is not None:
            client.close()


class _TextOut:
    """str writes onto a binary stream (stdout may be a BytesIO in tests)."""

    def __init__(self, binary: BinaryIO) -> None:
        self.binary = binary

    def write(self, text: str) -> int:
        return self.binary.write(text.encode())

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.binary.flush()


def _text(binary: BinaryIO) -> TextIO:
    return _TextOut(binary)  # type: ignore[return-value]
