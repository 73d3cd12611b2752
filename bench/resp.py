"""RESP encoding and reply counting for the load generators.

The generators must not cost one Python object per message, so replies are
never parsed into values while a measurement runs. Instead a counter skims
the byte stream: integer/bulk-string replies are counted by their line ends,
and an array of equally sized bulk strings (a TREAD or XRANGE reply of
fixed-size messages) is recognised from its `*N` header alone, after which
its N elements are skipped by length arithmetic. Python work is therefore
per reply (per batch of up to 1000 messages), not per message.
"""

from __future__ import annotations


def encode_command(*args: bytes | str | int) -> bytes:
    """One command as a RESP2 multibulk request."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, str):
            arg = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def encode_batch_write(command: bytes, key: bytes, payload: bytes, count: int) -> bytes:
    """`TWRITE key ENTRIES p p p ...` (or `RPUSH key p p p ...` when no ENTRIES word).

    `command` is the already-encoded prefix such as b"TWRITE" or b"RPUSH";
    the word ENTRIES is added only for TWRITE. The entry encoding is built
    once and repeated, so a 1000-entry command costs one bytes multiply.
    """
    head: list[bytes] = [command, key]
    if command.upper() == b"TWRITE":
        head.append(b"ENTRIES")
    entry = b"$%d\r\n%s\r\n" % (len(payload), payload)
    prefix = b"*%d\r\n" % (len(head) + count)
    prefix += b"".join(b"$%d\r\n%s\r\n" % (len(h), h) for h in head)
    return prefix + entry * count


def bulk_element_size(payload_len: int) -> int:
    """Bytes one RESP2 bulk string of `payload_len` bytes occupies."""
    return len(b"$%d\r\n" % payload_len) + payload_len + 2


class ReplyError(Exception):
    """The server answered a benchmark command with an error."""


class LineCounter:
    """Counts replies that are a fixed number of lines each.

    Integer replies (TWRITE, RPUSH) are one line; bulk-string replies such
    as XADD's ID are two. Offsets and lengths are never negative, so a '-'
    anywhere in the stream can only come from an error reply.
    """

    def __init__(self, lines_per_reply: int = 1) -> None:
        self.lines_per_reply = lines_per_reply
        self.lines = 0
        self.entries = 0

    def feed(self, data: bytes) -> int:
        """Consume received bytes; return how many replies are now complete."""
        if b"-" in data and self.lines_per_reply == 1:
            raise ReplyError(_first_error_line(data))
        before = self.lines // self.lines_per_reply
        self.lines += data.count(b"\n")
        return self.lines // self.lines_per_reply - before


class BulkArrayCounter:
    """Counts array replies whose elements are bulk strings of one known size.

    `entries` accumulates the element counts, `null_arrays` counts timeouts
    of blocking reads (`*-1`). The last element count seen is `last_count`,
    which a following consumer uses to advance its offset.
    """

    def __init__(self, element_size: int) -> None:
        self.element_size = element_size
        self.skip = 0
        self.carry = b""
        self.entries = 0
        self.null_arrays = 0
        self.last_count = 0

    def feed(self, data: bytes) -> int:
        done = 0
        pos = 0
        end_of_data = len(data)
        while pos < end_of_data:
            if self.skip:
                take = min(self.skip, end_of_data - pos)
                self.skip -= take
                pos += take
                if not self.skip:
                    done += 1
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self.carry += data[pos:]
                break
            line = self.carry + data[pos : newline + 1]
            self.carry = b""
            pos = newline + 1
            marker = line[:1]
            if marker == b"*":
                count = int(line[1:-2])
                self.last_count = max(count, 0)
                if count > 0:
                    self.skip = count * self.element_size
                    self.entries += count
                else:
                    self.null_arrays += count < 0
                    done += 1
            elif marker == b"-":
                raise ReplyError(line.decode(errors="replace").strip())
            else:
                raise ReplyError(f"unexpected reply line {line[:60]!r}")
        return done


class ParsedReplyCounter:
    """Counts replies of any shape by parsing them (hiredis, in C).

    For replies whose elements vary in size (JSON messages): slower than
    the counters above, which skim, so the generator's CPU is higher.
    `entries` accumulates the element counts of array replies.
    """

    def __init__(self) -> None:
        import hiredis

        self.reader = hiredis.Reader()
        self.error_type = hiredis.ReplyError
        self.entries = 0
        self.last_count = 0

    def feed(self, data: bytes) -> int:
        self.reader.feed(data)
        done = 0
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, self.error_type):
                raise ReplyError(str(reply))
            if isinstance(reply, list):
                self.last_count = len(reply)
                self.entries += len(reply)
            done += 1
        return done


def _first_error_line(data: bytes) -> str:
    start = data.find(b"-")
    line_start = data.rfind(b"\n", 0, start) + 1
    line_end = data.find(b"\r\n", start)
    return data[line_start : line_end if line_end >= 0 else None].decode(errors="replace")
