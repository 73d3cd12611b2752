"""TWRITE's syntax errors say what the user most likely got wrong
(docs/PROTOCOL.md section 2), against rcp11-server."""

from __future__ import annotations

import pytest
import redis


def error_of(client: redis.Redis, *argv: object) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*argv)
    return str(info.value)


@pytest.mark.parametrize(
    "args",
    [
        ["BACKLOG", "3", "a", "b"],  # the case: ENTRIES forgotten after an option
        ["BACKLOG", "3", "a"],
        ["a", "b"],
        ["a", "b", "c"],
        ["backlog", "1", "x", "y", "z"],
    ],
)
def test_twrite_without_entries_says_entries_is_missing(
    shared_client: redis.Redis, args: list[str]
) -> None:
    message = error_of(shared_client, "TWRITE", "s", *args)
    word = args[2] if args[0].upper() == "BACKLOG" else args[0]
    assert message == (
        f"syntax error, ENTRIES is missing, unknown option '{word}' (expected BACKLOG or ENTRIES)"
    )
    assert shared_client.exists("s") == 0


def test_twrite_unknown_option_before_entries_is_only_unknown(shared_client: redis.Redis) -> None:
    message = error_of(shared_client, "TWRITE", "s", "MAXLEN", "1", "ENTRIES", "x")
    assert message == "syntax error, unknown option 'MAXLEN' (expected BACKLOG or ENTRIES)"
    assert (
        error_of(shared_client, "TWRITE", "s", "BACKLOG", "3") == "syntax error, ENTRIES is missing"
    )
    assert shared_client.exists("s") == 0
