"""RESP requests: RequestParser turns the bytes of one connection into
argv lists (hiredis for multibulk, inline commands split as Redis does),
within Redis's limits on sizes and the query buffer."""

from __future__ import annotations

from collections import deque
from typing import Any

import hiredis

from rcp11 import errors
from rcp11.errors import ProtocolError
from rcp11.limits import (
    DEFAULT_MAX_BULK_LEN,
    DEFAULT_MAX_MULTIBULK_LEN,
    DEFAULT_QUERY_BUFFER_LIMIT,
    INLINE_MAX_SIZE,
    PARSE_SPAN,
    UNAUTHENTICATED_MAX_BULK_LEN,
    UNAUTHENTICATED_MAX_MULTIBULK_LEN,
)
from rcp11.resp.framing import (
    FAST_MAX_COUNT_DIGITS,
    array_header_size_of,
    bulk_size_of,
    framed_end,
    huge_header,
    line_end,
    parse_int,
)
from rcp11.resp.inline import split_args


class QueryBufferLimitError(Exception):
    """The client's unparsed input passed client-query-buffer-limit. Redis
    closes such a client without a reply and logs it."""


class RequestParser:
    """Turns bytes from one connection into argv lists.

    feed() appends what arrived; gets() returns the next complete command
    (a list of bytes), None when more input is needed, and raises
    ProtocolError (Redis's text, without the "ERR " the server adds) on input
    that is not a request, or QueryBufferLimitError. Commands before a bad one
    are returned first, as Redis executes them before it complains.

    Both request forms are accepted: RESP arrays of bulk strings, and inline
    lines as telnet and `redis-cli` inline mode send them.

    Two paths. hiredis parses runs of complete arrays at C speed, and what
    it returns is checked against the raw bytes (framed_end): a '*' where
    each command starts and a '$' where each argument starts, at the
    positions the canonical encoding of exactly those arguments gives.
    Anything else (a status, verbatim or integer element, a nested array or
    map, a limit passed) drops to the exact Python parser, which owns the
    error texts, inline commands, the limits, and every command split across
    reads. It follows Redis's processMultibulkBuffer() and
    processInlineBuffer() to the byte: a line is judged only once complete,
    and a NUL byte hides the end of a line as it does from C's strchr().
    Limits are checked on the headers, before the payload they announce is
    buffered.
    """

    def __init__(
        self,
        max_bulk_len: int = DEFAULT_MAX_BULK_LEN,
        max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN,
        query_buffer_limit: int = DEFAULT_QUERY_BUFFER_LIMIT,
    ) -> None:
        self.max_bulk_len = max_bulk_len
        self.max_multibulk_len = max_multibulk_len
        self.query_buffer_limit = query_buffer_limit
        # Set by the server while the client must still AUTH.
        self.unauthenticated = False
        self._buf = b""
        self._pos = 0
        self._more = bytearray()
        # A multibulk command being assembled across feeds by the slow path.
        self._args: list[bytes] | None = None
        # How many bytes of unparsed()'s answer were _args written back.
        self._written_back = 0
        self._remaining = 0
        # Buffered bytes needed before parsing can progress; avoids rescanning
        # (and copying) while a big bulk string trickles in.
        self._need = 0
        self._ready: deque[list[bytes]] = deque()
        self._error: ProtocolError | None = None
        # Kept empty between parses: creating one costs as much as parsing a
        # small command with it.
        self._reader = hiredis.Reader()

    def feed(self, data: bytes) -> None:
        if not self._more and self._pos >= len(self._buf) and type(data) is bytes:
            # Nothing buffered: parse the bytes as they came, no copy.
            self._buf = data
            self._pos = 0
            if len(data) <= self.query_buffer_limit or not self.query_buffer_limit:
                return
        else:
            self._more += data
        if self.query_buffer_limit and self.buffered() > self.query_buffer_limit:
            raise QueryBufferLimitError(
                f"query buffer of {self.buffered()} bytes passed {self.query_buffer_limit}"
            )

    def drop(self) -> None:
        """Forget everything buffered: the connection is gone. Its objects
        may wait for the garbage collector (they refer to each other), and
        a half-sent request can be hundreds of MB."""
        self._buf = b""
        self._pos = 0
        self._more = bytearray()
        self._args = None
        self._ready.clear()
        self._need = 0

    def buffered(self) -> int:
        """Bytes received but not yet parsed into commands (the query buffer)."""
        return len(self._buf) - self._pos + len(self._more)

    def gets(self) -> list[bytes] | None:
        ready = self._ready
        if ready:
            return ready.popleft()
        if self._error is None:
            if self._need and self.buffered() < self._need:
                return None
            self._parse_available()
            if ready:
                return ready.popleft()
        if self._error is not None:
            raise self._error
        return None

    def take(self, data: bytes) -> list[list[bytes]]:
        """feed(data), then drain(): what the server does with each read. A
        read starting a request in an empty buffer is parsed by hiredis at
        once, without a copy."""
        if (
            type(data) is not bytes
            or data[:1] != b"*"
            or self._ready
            or self._more
            or self._pos < len(self._buf)
            or self._args is not None
            or self._error is not None
            or self.unauthenticated
            or len(data) > self.query_buffer_limit > 0
        ):
            self.feed(data)
            return self.drain()
        self._buf = data
        self._pos = 0
        size = min(len(data), PARSE_SPAN)
        parsed = None
        if huge_header(data, 1, size) == size:
            parsed = self._parse_whole(data, 0, size)
        if not parsed or not parsed[0]:
            # Incomplete, or only the exact parser can judge it.
            self._parse_available(try_fast=False)
            return self.drain()
        commands, self._pos = parsed  # a command still arriving waits in the buffer
        return commands

    def drain(self) -> list[list[bytes]]:
        """The complete commands available now, up to PARSE_SPAN bytes of them
        (gets() in bulk: one call per read instead of one per command; call
        again until it returns []). Raises the pending ProtocolError once the
        commands before it were taken."""
        ready = self._ready
        if not ready and self._error is None:
            if self._pos >= len(self._buf) and not self._more:
                return []  # the usual second call: everything was taken
            if self._need and self.buffered() < self._need:
                return []
            self._parse_available()
        if ready:
            commands = list(ready)
            ready.clear()
            return commands
        if self._error is not None:
            raise self._error
        return []

    def idle(self) -> bool:
        """Nothing buffered, parsed or pending: the next read starts at a
        request boundary (the C lane may read it first)."""
        return (
            not self._ready
            and not self._more
            and self._pos >= len(self._buf)
            and self._args is None
            and self._error is None
        )

    def unparsed(self, limit: int) -> bytes | None:
        """The start of a request still arriving, as bytes, when that is
        all the parser holds (no command parsed and not taken, no error)
        and it is at most about `limit` bytes; None otherwise. The C lane
        reads it again together with the next read. Arguments the exact
        parser already took out of it are written back in canonical form:
        they are the same arguments, and canonical is what the AOF logs."""
        if self._ready or self._error is not None:
            return None
        args = self._args
        size = self.buffered()
        if args is not None:
            size += sum(map(len, args)) + 24 * (len(args) + 1)
        if size > limit:
            return None
        self._fill()
        rest = self._buf[self._pos :]
        if args is None:
            return rest
        head = [b"*%d\r\n" % (len(args) + self._remaining)]
        head += [b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in args]
        written = b"".join(head)
        self._written_back = len(written)
        return written + rest

    def raw(self) -> tuple[bytes, int] | None:
        """What the parser holds, when it is only bytes not parsed yet that
        start at a request boundary (no command parsed and not taken, none
        half assembled, no error): (buffer, where they start), for the C
        lane to read in place; skip() then drops what it ran. None
        otherwise."""
        if self._ready or self._args is not None or self._error is not None:
            return None
        if self._need and self.buffered() < self._need:
            return None  # a big request still arriving: not copied again per read
        self._fill()
        if self._pos >= len(self._buf):
            return None
        return self._buf, self._pos

    def skip(self, size: int) -> None:
        """Drop the first `size` bytes unparsed() returned: the C lane ran
        them. A request half assembled is only ever run whole, with all
        that was buffered."""
        if self._args is not None:
            # The half assembled request ran whole: its arguments, written
            # back by unparsed(), and the rest of it in the buffer. What
            # follows it (the start of the next request) stays.
            self._args = None
            self._remaining = 0
            self._pos += size - self._written_back
        else:
            self._pos += size
        self._need = 0

    def push_back(self, commands: list[list[bytes]]) -> None:
        """Return commands taken by drain() but not run (the client blocked);
        they come out first next time."""
        self._ready.extendleft(reversed(commands))

    def _fill(self) -> None:
        # Merge newly fed bytes into the immutable working buffer, so every
        # argument sliced from it is already a bytes object (hashable keys).
        if self._more:
            if self._pos >= len(self._buf):
                self._buf = bytes(self._more)
            else:
                self._buf = self._buf[self._pos :] + self._more
            self._pos = 0
            self._more.clear()

    def _parse_available(self, try_fast: bool = True) -> None:
        """Parse what is buffered; try_fast=False when the hiredis path just
        made no progress at the current position."""
        self._fill()
        self._need = 0
        ready = self._ready
        start = self._pos
        try:
            while self._pos < len(self._buf):
                if ready and self._pos - start >= PARSE_SPAN:
                    return  # enough for one turn; the rest on the next call
                if self.unauthenticated and ready:
                    # One command at a time until AUTH succeeds: the limits
                    # for the next command depend on its outcome.
                    return
                if self._args is None:
                    if self._buf[self._pos] != 42:  # not '*': an inline command
                        argv = self._inline()
                        if argv is None:
                            return
                        if argv:
                            ready.append(argv)
                        continue
                    if try_fast and not self.unauthenticated and self._fast():
                        continue
                try_fast = True
                argv = self._multibulk()
                if argv is None:
                    return
                if argv:
                    ready.append(argv)
        except ProtocolError as exc:
            self._error = exc

    def _fast(self) -> bool:
        """Parse complete arrays with hiredis; False when it made no progress
        (the slow path then handles the next command). A batch that fails
        _parse_whole()'s check is redone with a check per command."""
        buf = self._buf
        pos = self._pos
        size = huge_header(buf, pos + 1, min(len(buf), pos + PARSE_SPAN))
        parsed = self._parse_whole(buf, pos, size)
        if parsed is None:
            return self._fast_checked(size)
        commands, end = parsed
        if not commands:
            return False  # the slow path assembles it as it trickles in
        self._ready.extend(commands)
        self._pos = end
        return True

    def _parse_whole(self, buf: bytes, pos: int, size: int) -> tuple[list[Any], int] | None:
        """The complete requests hiredis reads in buf[pos:size] and where they
        end ("*0" requests dropped); None when only the exact parser may
        judge them. size must already stop before any huge header.

        hiredis accepts any RESP value, so what it returns is checked
        against the raw bytes by framed_end(): one check per batch, in C
        loops.
        """
        # hiredis allocates a whole list as soon as it reads "*<count>", so a
        # huge count must never reach it: huge_header() cut every later
        # header, the first one is checked here.
        if buf.find(b"\r", pos, pos + FAST_MAX_COUNT_DIGITS + 2) < 0:
            return [], pos
        reader = self._reader
        reader.feed(buf, pos, size - pos)
        commands: list[Any] = []
        append = commands.append
        gets = reader.gets
        try:
            while (argv := gets()) is not False:
                append(argv)
            # An argument of 16 KB or more (IndexError) or an element that is
            # not a string (TypeError) is left to the exact parser.
            end = framed_end(buf, pos, commands) if commands else pos
        except Exception:  # hiredis.ProtocolError, MemoryError, TypeError, IndexError
            self._reader = hiredis.Reader()
            return None
        if end != size:
            # A partial command stays in the reader: the next parse starts
            # from a clean one at the command's first byte.
            self._reader = hiredis.Reader()
        if not commands:
            return [], pos
        if (
            end < 0
            or (end < size and buf[end] != 42)
            or buf[end - 2 : end] != b"\r\n"
            or end - pos > self.max_bulk_len
            or max(map(len, commands)) > self.max_multibulk_len
        ):
            return None
        if len(commands) > 1 or not commands[0]:
            commands = list(filter(None, commands))  # "*0" requests are skipped
        return commands, end

    def _fast_checked(self, size: int) -> bool:
        """hiredis again, each command checked on its own by framed_end();
        stops at the first that is not a plain array of bulk strings (or is
        over a limit), so the exact parser takes over exactly there."""
        buf = self._buf
        start = pos = self._pos
        reader = hiredis.Reader()
        reader.feed(buf, pos, size - pos)
        ready = self._ready
        max_bulk = self.max_bulk_len
        while pos < size and buf[pos] == 42:
            try:
                argv = reader.gets()
                if type(argv) is not list:
                    break  # incomplete (False), or a null array, or not an array
                end = framed_end(buf, pos, [argv], bulk_size_of, array_header_size_of)
            except (hiredis.ProtocolError, TypeError):
                break  # not RESP, or an element that is not a string
            if (
                end < 0
                or buf[end - 2 : end] != b"\r\n"
                or end - pos > max_bulk
                or len(argv) > self.max_multibulk_len
            ):
                break  # not a plain array of bulk strings, or over a limit
            if argv:
                ready.append(argv)
            pos = end
        self._pos = pos
        return pos > start

    def _inline(self) -> list[bytes] | None:
        buf = self._buf
        pos = self._pos
        newline = line_end(buf, pos, b"\n")
        if newline < 0:
            if len(buf) - pos > INLINE_MAX_SIZE:
                raise ProtocolError(errors.PROTO_TOO_BIG_INLINE_REQUEST)
            self._need = len(buf) - pos + 1
            return None
        end = newline
        if end > pos and buf[end - 1] == 13:
            end -= 1
        argv = split_args(buf[pos:end])
        if argv is None:
            raise ProtocolError(errors.PROTO_UNBALANCED_QUOTES_IN_REQUEST)
        self._pos = newline + 1
        return argv

    def _multibulk(self) -> list[bytes] | None:
        buf = self._buf
        pos = self._pos
        size = len(buf)
        args = self._args
        if args is None:
            newline = line_end(buf, pos, b"\r")
            if newline < 0 or newline + 1 >= size:
                if size - pos > INLINE_MAX_SIZE:
                    raise ProtocolError(errors.PROTO_TOO_BIG_MBULK_COUNT_STRING)
                return None
            count = parse_int(buf[pos + 1 : newline])
            if count is None or count > self.max_multibulk_len:
                raise ProtocolError(errors.PROTO_INVALID_MULTIBULK_LENGTH)
            if count > UNAUTHENTICATED_MAX_MULTIBULK_LEN and self.unauthenticated:
                raise ProtocolError(errors.PROTO_UNAUTHENTICATED_MULTIBULK_LENGTH)
            pos = newline + 2
            if count <= 0:
                # "*0" and negative counts are empty requests Redis skips.
                self._pos = pos
                return []
            args = []
            remaining = count
        else:
            remaining = self._remaining
        max_bulk = self.max_bulk_len
        unauthenticated = self.unauthenticated
        append = args.append
        while remaining:
            if pos >= size:
                break
            # As Redis: the line must be complete before its type is judged.
            newline = line_end(buf, pos, b"\r")
            if newline < 0 or newline + 1 >= size:
                if size - pos > INLINE_MAX_SIZE:
                    raise ProtocolError(errors.PROTO_TOO_BIG_BULK_COUNT_STRING)
                break
            if buf[pos] != 36:  # '$'
                raise ProtocolError(errors.expected_bulk(buf[pos]))
            length = parse_int(buf[pos + 1 : newline])
            if length is None or length < 0 or length > max_bulk:
                raise ProtocolError(errors.PROTO_INVALID_BULK_LENGTH)
            if length > UNAUTHENTICATED_MAX_BULK_LEN and unauthenticated:
                raise ProtocolError(errors.PROTO_UNAUTHENTICATED_BULK_LENGTH)
            start = newline + 2
            end = start + length
            if end + 2 > size:
                self._need = end + 2 - pos
                break
            append(buf[start:end])
            pos = end + 2
            remaining -= 1
        self._pos = pos
        if remaining:
            self._args = args
            self._remaining = remaining
            return None
        self._args = None
        return args
