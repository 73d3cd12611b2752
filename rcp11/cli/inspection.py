"""rcp11 info, streams, groups and evict: a stream's offsets, the streams a
server holds (kafka-topics --list), how far consumer groups are behind
(kafka-consumer-groups --describe), and eviction."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from rcp11.cli.acked import (
    ACKED_COLUMNS,
    ACKED_GROUP_TYPE,
    acked_cells,
    acked_row,
    consumer_lines,
)
from rcp11.cli.transfer import PROG, plural
from rcp11.client import Client, ReadResult

# TYPE's answer for a stream, on rcp11-server and in redis-server with the
# module (docs/PROTOCOL.md section 1).
STREAM_TYPE = "rcp11-log"
_GLOB_CHARACTERS = "*?["


def stream_info(client: Client, key: str) -> dict[str, int | str]:
    return _fields(key, client.tread(key, 0, 0, withinfo=True))


def _fields(key: str, info: ReadResult) -> dict[str, int | str]:
    return {
        "key": key,
        "first_offset": info.first_offset,
        "last_offset": info.last_offset,
        "next_offset": info.next_offset,
        "length": info.length,
    }


def info(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    fields = stream_info(client, args.key)
    if args.json:
        stdout.write(json.dumps(fields) + "\n")
        return 0
    for name, value in fields.items():
        stdout.write(f"{name}: {value}\n")
    if fields["last_offset"] == -1:
        stdout.write("(never written: reads as an empty stream)\n")
    return 0


def evict(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    evicted = client.tevict(args.key, args.offset)
    after = client.tread(args.key, 0, 0, withinfo=True)
    stdout.write(
        f"evicted {plural(evicted)} from '{args.key}'; "
        f"readable now: {after.first_offset}..{after.last_offset} ({plural(after.length)})\n"
    )
    return 0


def _scan(client: Client, pattern: str, kind: str) -> list[str]:
    keys = client.scan_iter(match=pattern, count=1000, _type=kind)
    return sorted({key.decode(errors="backslashreplace") for key in keys})


def _infos(client: Client, keys: list[str]) -> list[ReadResult]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.tread(key, 0, 0, withinfo=True)
    return pipe.execute() if keys else []


def _table(rows: list[list[Any]]) -> list[str]:
    """The lines of a table with aligned columns."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip() + "\n")
    return lines


def streams(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    keys = _scan(client, args.pattern, STREAM_TYPE)
    if not (args.long or args.json):
        stdout.writelines(f"{key}\n" for key in keys)
        return 0
    fields = [_fields(key, info) for key, info in zip(keys, _infos(client, keys), strict=True)]
    if args.json:
        stdout.writelines(json.dumps(row) + "\n" for row in fields)
    elif fields:
        header = ["STREAM", "FIRST-OFFSET", "LAST-OFFSET", "NEXT-OFFSET", "LENGTH"]
        stdout.writelines(_table([header] + [list(row.values()) for row in fields]))
    return 0


def group_lag(current: int | None, info: ReadResult) -> int:
    """Readable messages the group has not been handed yet: from its next
    offset (a new group starts at the oldest readable) to the stream's end."""
    start = info.first_offset if current is None else max(current, info.first_offset)
    return max(info.next_offset - start, 0)


class NotAGroup(Exception):
    """A key named as a consumer group holds something else."""


def _offset(kind: bytes, value: bytes | None) -> int | None | str:
    """A group key's next offset (None: no such key yet), or why it is none."""
    if kind == b"none":
        return None
    if kind != b"string" or value is None:
        shown = "a stream" if kind.decode() == STREAM_TYPE else f"a {kind.decode()}"
        return f"holds {shown}"
    try:
        return int(value)
    except ValueError:
        return f"holds {value[:40]!r}, not an offset"


def _group_names(args: argparse.Namespace, client: Client) -> tuple[list[str], set[str]]:
    """The group keys to show, in the order given (a glob's keys sorted;
    none given: every acknowledged group), and those named outright."""
    if not args.groupkeys:
        return _scan(client, "*", ACKED_GROUP_TYPE), set()
    named: set[str] = set()
    names: list[str] = []
    for name in args.groupkeys:
        if any(c in name for c in _GLOB_CHARACTERS):
            found = _scan(client, name, "string") + _scan(client, name, ACKED_GROUP_TYPE)
            names += sorted(found)
        else:
            named.add(name)
            names.append(name)
    return list(dict.fromkeys(names)), named


def groups(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    names, named = _group_names(args, client)
    info = client.tread(args.key, 0, 0, withinfo=True)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    kinds = pipe.execute() if names else []
    values = client.mget(names) if names else []
    rows: list[dict[str, Any]] = []
    for name, kind, value in zip(names, kinds, values, strict=True):
        if kind.decode() == ACKED_GROUP_TYPE:
            row = acked_row(client, args.key, name, info.next_offset)
            if isinstance(row, dict):
                rows.append(row)
            elif name in named:  # an acknowledged group of another stream
                raise NotAGroup(row.removeprefix("ERR "))
            continue
        current = _offset(kind, value)
        if isinstance(current, str):
            if name in named:
                raise NotAGroup(f"key '{name}' {current}: a consumer group's key holds its offset")
            continue  # a string a glob matched that is no group's offset
        rows.append(
            {
                "group": name,
                "stream": args.key,
                "current_offset": current,
                "next_offset": info.next_offset,
                "lag": group_lag(current, info),
            }
        )
    if args.json:
        stdout.writelines(json.dumps(row) + "\n" for row in rows)
    elif rows:
        _group_table(rows, stdout)
    elif not args.groupkeys:
        stdout.write(
            f"no acknowledged group reads '{args.key}' "
            f"(name plain groups: {PROG} groups {args.key} GROUPKEY...)\n"
        )
    return 0


def _group_table(rows: list[dict[str, Any]], stdout: TextIO) -> None:
    """The groups as a table; acknowledged groups add columns, and a line
    per consumer holding leases under their row."""
    acked = any("pending" in row for row in rows)
    header = ["GROUP", "STREAM", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    cells = [
        ["-" if row[k] is None else row[k] for k in ("group", "stream", "current_offset")]
        + [row["next_offset"], row["lag"]]
        + (acked_cells(row) if acked else [])
        for row in rows
    ]
    if acked:
        header += ACKED_COLUMNS
    lines = _table([header, *cells])
    stdout.write(lines[0])
    for line, row in zip(lines[1:], rows, strict=True):
        stdout.write(line)
        stdout.writelines(consumer_lines(row))
