"""``gcs-server`` takes Ray 2.60 ``gcs_server``'s command line as gflags parses it."""

from __future__ import annotations

import pytest

from gcs.cli.dropin.flags import FlagError, GcsServerFlags, HelpRequested, parse

RAY_ARGV = [
    "--log_dir=/tmp/ray/session_x/logs",
    "--config_list=eyJhIjogMX0=",
    "--gcs_server_port=0",
    "--metrics-agent-port=61234",
    "--node-ip-address=10.0.0.5",
    "--session-name=session_x",
    "--ray-commit=b7f4259e",
    "--session-dir=/tmp/ray/session_x",
    "--node-id=" + "ab" * 28,
    "--stdout_filepath=/tmp/ray/session_x/logs/gcs_server.out",
    "--stderr_filepath=/tmp/ray/session_x/logs/gcs_server.err",
    "--redis_address=127.0.0.1",
    "--redis_port=6380",
    "--redis_enable_ssl=false",
    "--redis_username=default",
    "--redis_password=s3cret",
]


class TestRayCommandLine:
    def test_the_command_line_services_py_builds_is_read_whole(self) -> None:
        """Every flag Ray 2.60's ``start_gcs_server`` passes lands in its field."""
        flags, rest = parse(RAY_ARGV)
        assert rest == []
        assert flags == GcsServerFlags(
            log_dir="/tmp/ray/session_x/logs",
            config_list="eyJhIjogMX0=",
            gcs_server_port=0,
            metrics_agent_port=61234,
            node_ip_address="10.0.0.5",
            session_name="session_x",
            ray_commit="b7f4259e",
            session_dir="/tmp/ray/session_x",
            node_id="ab" * 28,
            stdout_filepath="/tmp/ray/session_x/logs/gcs_server.out",
            stderr_filepath="/tmp/ray/session_x/logs/gcs_server.err",
            redis_address="127.0.0.1",
            redis_port=6380,
            redis_enable_ssl=False,
            redis_username="default",
            redis_password="s3cret",
        )

    def test_defaults_are_the_binarys(self) -> None:
        """``gcs_server --help``: port 0, metrics agent -1, redis port -1, strings empty."""
        flags, _ = parse([])
        assert (flags.gcs_server_port, flags.metrics_agent_port, flags.redis_port) == (0, -1, -1)
        assert flags.config_list == "" and not flags.redis_enable_ssl and not flags.retry_redis

    @pytest.mark.parametrize(
        "argv",
        [
            ["-gcs_server_port=7"],
            ["--gcs_server_port", "7"],
            ["-gcs-server-port", "7"],
            ["--gcs_server_port=1", "--gcs_server_port=7"],
        ],
    )
    def test_gflags_spellings(self, argv: list[str]) -> None:
        """One or two dashes, ``=`` or a separate word, dashes for underscores, last wins."""
        assert parse(argv)[0].gcs_server_port == 7

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["--redis_enable_ssl"], True),
            (["--noredis_enable_ssl"], False),
            (["--redis_enable_ssl=TRUE"], True),
            (["--redis_enable_ssl=0"], False),
            (["--redis_enable_ssl=yes"], True),
        ],
    )
    def test_booleans(self, argv: list[str], expected: bool) -> None:
        assert parse(argv)[0].redis_enable_ssl is expected

    def test_double_dash_ends_flags(self) -> None:
        flags, rest = parse(["--log_dir=/l", "--", "--gcs_server_port=9", "x"])
        assert flags.log_dir == "/l" and flags.gcs_server_port == 0
        assert rest == ["--gcs_server_port=9", "x"]

    def test_undefok_lets_named_unknown_flags_pass(self) -> None:
        flags, _ = parse(["--undefok=future_flag,other", "--future_flag=3", "--log_dir=/l"])
        assert flags.log_dir == "/l"


class TestRefusals:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--bogus=1"], "ERROR: unknown command line flag 'bogus'"),
            (["--gcs_server_port=abc"], "illegal value 'abc' specified for int32 flag"),
            (["--gcs_server_port=4294967296"], "int32 flag 'gcs_server_port'"),
            (["--redis_enable_ssl=maybe"], "illegal value 'maybe' specified for bool flag"),
            (["--log_dir"], "flag 'log_dir' is missing its argument"),
        ],
    )
    def test_bad_command_lines_are_one_gflags_line(self, argv: list[str], message: str) -> None:
        with pytest.raises(FlagError, match=message) as info:
            parse(argv)
        assert "\n" not in str(info.value)

    @pytest.mark.parametrize("flag", ["--help", "-helpshort", "--version"])
    def test_help_and_version_are_requests_not_errors(self, flag: str) -> None:
        with pytest.raises(HelpRequested):
            parse([flag])
