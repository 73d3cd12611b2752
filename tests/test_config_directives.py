"""rcp11.config: the directive table, file and argument loading, CONFIG
GET/SET/REWRITE semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcp11.config import DIRECTIVES, Config, ConfigError, parse_memory

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "test.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = Config()
    assert config.get("port") == 6379
    assert config.get("bind") == ["127.0.0.1", "-::1"]
    assert config.get("protected-mode") is True
    assert config.get("appendfsync") == "everysec"
    assert config.get("save") == [(3600, 1), (300, 100), (60, 10000)]
    assert config.get("proto-max-bulk-len") == 512 * 1024 * 1024
    assert config.get("stream-node-max-entries") == 1000
    assert config.get("client-output-buffer-limit")["normal"] == (0, 0, 0)


def test_shipped_redis_conf_loads_and_names_every_directive() -> None:
    config = Config()
    config.load_file(str(REPO / "redis.conf"))
    assert config.get("appendonly") is True
    assert config.get("port") == 6379
    text = (REPO / "redis.conf").read_text()
    for name in DIRECTIVES:
        assert name in text, f"redis.conf does not document {name}"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("100", 100),
        ("1k", 1000),
        ("1kb", 1024),
        ("100mb", 100 * 1024 * 1024),
        ("100MB", 100 * 1024 * 1024),
        ("2m", 2_000_000),
        ("1gb", 1024**3),
        ("3G", 3 * 1000**3),
        ("10b", 10),
    ],
)
def test_memory_units(text: str, value: int) -> None:
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "mb", "1tb", "-1", "1.5mb", "abc", "1 mb"])
def test_bad_memory_values(text: str) -> None:
    with pytest.raises(ConfigError, match="memory value"):
        parse_memory(text)


def test_file_parsing(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# a comment\n"
        "\n"
        "   port 7000   \n"
        'requirepass "with space"\n'
        "logfile 'single quoted'\n"
        "maxmemory 100mb\n"
        "APPENDFSYNC Always\n"
        "save 900 1\n"
        "save 300 10\n"
        "bind 127.0.0.1 ::1\n"
        "client-output-buffer-limit normal 1mb 512kb 10\n",
    )
    config = Config()
    config.load_file(str(path))
    assert config.get("port") == 7000
    assert config.get("requirepass") == "with space"
    assert config.get("logfile") == "single quoted"
    assert config.get("maxmemory") == 100 * 1024 * 1024
    assert config.get("appendfsync") == "always"
    assert config.get("save") == [(900, 1), (300, 10)]
    assert config.get("bind") == ["127.0.0.1", "::1"]
    assert config.get("client-output-buffer-limit")["normal"] == (1024**2, 512 * 1024, 10)
    # classes not named keep their values
    assert config.get("client-output-buffer-limit")["pubsub"][2] == 60


def test_save_empty_disables(tmp_path: Path) -> None:
    config = Config()
    config.load_file(str(write(tmp_path, 'save ""\n')))
    assert config.get("save") == []


def test_include(tmp_path: Path) -> None:
    write(tmp_path, "port 7001\nhz 20\n", "other.conf")
    config = Config()
    config.load_file(str(write(tmp_path, "port 7000\ninclude other.conf\nhz 30\n")))
    assert config.get("port") == 7001
    assert config.get("hz") == 30


def test_args_override_file(tmp_path: Path) -> None:
    config = Config()
    config.load_file(str(write(tmp_path, "port 7000\nloglevel warning\n")))
    config.apply_args(["--port", "7005", "--save", "", "--requirepass", "two words"])
    assert config.get("port") == 7005
    assert config.get("loglevel") == "warning"
    assert config.get("save") == []
    assert config.get("requirepass") == "two words"


def test_args_with_several_words() -> None:
    config = Config()
    config.apply_args(["--save", "60", "5", "30", "100", "--bind", "127.0.0.1", "::1"])
    assert config.get("save") == [(60, 5), (30, 100)]
    assert config.get("bind") == ["127.0.0.1", "::1"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("nosuchdirective 1", "Bad directive or wrong number of arguments"),
        ("port", "Bad directive or wrong number of arguments"),
        ("port abc", "argument couldn't be parsed into an integer"),
        ("port 70000", "argument must be between 0 and 65535 inclusive"),
        ("appendonly maybe", "argument must be 'yes' or 'no'"),
        ("appendfsync sometimes", "argument(s) must be one of the following: always, everysec, no"),
        ("maxmemory lots", "argument must be a memory value"),
        ("save 100", "Invalid save parameters"),
        ("save a b", "Invalid save parameters"),
        ("databases 16", "argument must be between 1 and 1 inclusive"),
        ("stream-compression-level 10", "argument must be between 1 and 9 inclusive"),
        ("stream-compression gzip", "argument(s) must be one of the following: no, zlib"),
        ("client-output-buffer-limit normal 0 0", "Wrong number of arguments in buffer limit"),
        ("client-output-buffer-limit vip 0 0 0", "Invalid client class"),
        ("dbfilename ../escape.rcp", "can't be a path, just a filename"),
        ('requirepass "open', "Unbalanced quotes"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    path = write(tmp_path, f"# first\nport 7000\n{line}\nhz 10\n")
    with pytest.raises(ConfigError) as info:
        Config().load_file(str(path))
    text = info.value.fatal_message()
    assert "*** FATAL CONFIG FILE ERROR" in text
    assert f"'{path}', at line 3" in text
    assert f">>> '{line}'" in text
    assert reason in text


def test_bad_argument_is_fatal() -> None:
    with pytest.raises(ConfigError) as info:
        Config().apply_args(["--port", "7000", "--hz", "fast"])
    text = info.value.fatal_message()
    assert "--hz fast" in text
    assert "argument couldn't be parsed into an integer" in text


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="can't open config file"):
        Config().load_file("/nonexistent/rcp11.conf")


# -- CONFIG GET / SET ------------------------------------------------------------


def test_config_get_patterns() -> None:
    config = Config()
    assert config.config_get("port") == {"port": "6379"}
    assert config.config_get("PORT") == {"port": "6379"}
    assert config.config_get("nosuch") == {}
    both = config.config_get("port", "hz")
    assert both == {"port": "6379", "hz": "10"}
    matched = config.config_get("append*")
    assert set(matched) == {"appendonly", "appendfilename", "appendfsync"}
    assert matched["appendonly"] == "no"
    assert len(config.config_get("*")) == len(DIRECTIVES)
    assert config.config_get("save") == {"save": "3600 1 300 100 60 10000"}
    assert config.config_get("maxmemory") == {"maxmemory": "0"}
    assert config.config_get("client-output-buffer-limit")["client-output-buffer-limit"] == (
        "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
    )


def test_config_set_typed() -> None:
    config = Config()
    config.set("maxmemory", "10mb")
    assert config.get("maxmemory") == 10 * 1024 * 1024
    assert config.config_get("maxmemory") == {"maxmemory": "10485760"}
    config.set("save", "10 1 20 2")
    assert config.get("save") == [(10, 1), (20, 2)]
    config.set("save", "")
    assert config.get("save") == []
    config.set("appendonly", "YES")
    assert config.get("appendonly") is True


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([("nosuch", "1")], "ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'"),
        (
            [("daemonize", "yes")],
            "ERR CONFIG SET failed (possibly related to argument 'daemonize') - can't set immutable config",
        ),
        (
            [("maxmemory", "lots")],
            "ERR CONFIG SET failed (possibly related to argument 'maxmemory') - argument must be a memory value",
        ),
        (
            [("hz", "5"), ("hz", "6")],
            "ERR CONFIG SET failed (possibly related to argument 'hz') - duplicate parameter",
        ),
    ],
)
def test_config_set_errors(pairs: list[tuple[str, str]], message: str) -> None:
    config = Config()
    with pytest.raises(ConfigError) as info:
        config.set_many(pairs)
    assert info.value.message == message


def test_config_set_is_all_or_nothing() -> None:
    config = Config()
    with pytest.raises(ConfigError):
        config.set_many([("hz", "50"), ("appendfsync", "never")])
    assert config.get("hz") == 10


def test_on_change_and_refusal_rolls_back() -> None:
    config = Config()
    seen: list[object] = []
    config.on_change("appendonly", seen.append)

    def refuse(value: object) -> None:
        if value == "always":
            raise ConfigError("cannot fsync here")

    config.on_change("appendfsync", refuse)
    config.set_many([("appendonly", "yes"), ("hz", "20")])
    assert seen == [True]
    with pytest.raises(ConfigError) as info:
        config.set_many([("appendonly", "no"), ("appendfsync", "always")])
    assert "cannot fsync here" in info.value.message
    assert config.get("appendonly") is True
    assert config.get("appendfsync") == "everysec"
    # the appendonly callback saw the change and then its undoing
    assert seen == [True, False, True]


# -- CONFIG REWRITE --------------------------------------------------------------


def test_rewrite_keeps_comments_and_changes_only_what_changed(tmp_path: Path) -> None:
    original = (
        "# Top comment\n"
        "port 7000\n"
        "\n"
        "# How many ticks\n"
        "hz   10\n"
        "maxmemory 100mb\n"
        "save 900 1\n"
        "save 300 10\n"
        "requirepass 'x y'\n"
    )
    path = write(tmp_path, original)
    config = Config()
    config.load_file(str(path))
    config.set("hz", "25")
    config.set("save", "60 1")
    config.set("appendfsync", "always")
    config.rewrite()
    lines = path.read_text().splitlines()
    assert lines[:4] == ["# Top comment", "port 7000", "", "# How many ticks"]
    assert lines[4] == "hz 25"
    assert "maxmemory 100mb" in lines  # unchanged: the original text stays
    assert "requirepass 'x y'" in lines
    assert [line for line in lines if line.startswith("save")] == ["save 60 1"]
    assert lines[-1] == "appendfsync always"
    # the rewritten file loads back to the same running values
    again = Config()
    again.load_file(str(path))
    for name in ("hz", "save", "appendfsync", "maxmemory", "requirepass", "port"):
        assert again.get(name) == config.get(name)


def test_rewrite_quotes_values(tmp_path: Path) -> None:
    path = write(tmp_path, "port 7000\n")
    config = Config()
    config.load_file(str(path))
    config.set("requirepass", 'a "quoted" pass\\word')
    config.set("save", "")
    config.rewrite()
    again = Config()
    again.load_file(str(path))
    assert again.get("requirepass") == 'a "quoted" pass\\word'
    assert again.get("save") == []


def test_rewrite_without_file() -> None:
    with pytest.raises(ConfigError) as info:
        Config().rewrite()
    assert info.value.message == "ERR The server is running without a config file"


def test_multi_word_directive_in_one_argument(tmp_path: Path) -> None:
    config = Config()
    config.apply_args(["--save", "60 5 30 100", "--client-output-buffer-limit", "normal 2mb 1mb 5"])
    assert config.get("save") == [(60, 5), (30, 100)]
    assert config.get("client-output-buffer-limit")["normal"] == (2 * 1024**2, 1024**2, 5)
    config.load_file(str(write(tmp_path, 'bind "127.0.0.1 ::1"\n')))
    assert config.get("bind") == ["127.0.0.1", "::1"]


def test_maxmemory_policy_is_noeviction_only() -> None:
    config = Config()
    assert config.get("maxmemory-policy") == "noeviction"
    assert config.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    with pytest.raises(ConfigError):
        config.set("maxmemory-policy", "allkeys-lru")
