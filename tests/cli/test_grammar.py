"""One grammar for the whole CLI, checked on every command.

* The help walk visits every command of the ``gcs`` tree: every option has help text, every
  command that talks to a GCS takes ``--address``, every command that prints data takes
  ``--format text|json`` with the same default.  A new command must be classified below.
* The mistakes table runs each mistake as a user types it (a real process): the exit code
  (1 failed, 2 bad input) and ONE stderr line matching a pattern, never a traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from gcs.cli.main import main
from gcs.cli.support import DEFAULT_FORMAT
from tests.forked_cli import ForkedCli

NOTHING = "127.0.0.1:1"
UNREACHABLE = re.escape(f"cannot reach the GCS at {NOTHING} (")

#: Every leaf command: (talks to a GCS, prints data).
COMMANDS: dict[str, tuple[bool, bool]] = {
    "serve": (False, False),  # it is the GCS; it logs
    "status": (True, True),
    "request-resources": (True, True),
    "health": (True, True),
    "submit": (True, True),
    "raylet": (True, True),
    "install-into-ray": (False, False),  # changes a Ray install; says what it did
    "raylet-fleet": (True, True),
    "db upgrade": (False, True),
    "ha handover": (False, True),  # talks to a member's HA status port, not the GCS port
    "ha finish-upgrade": (False, True),  # talks to the store
    "vcluster create": (True, True),
    "vcluster update": (True, True),
    "vcluster remove": (True, True),
    "vcluster list": (True, True),
    "vcluster show": (True, True),
    "autoscaler plan": (True, True),
    "autoscaler run": (True, False),  # logs while it reconciles
    "autoscaler simulate": (False, True),
}


def _leaves(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            yield from _leaves(command, path + " ")
        else:
            yield path, command


LEAVES = dict(_leaves(main))


class TestHelpWalk:
    def test_every_command_is_classified(self) -> None:
        """A command added to the tree must say whether it talks to a GCS / prints data."""
        assert sorted(LEAVES) == sorted(COMMANDS)

    @pytest.mark.parametrize("path", sorted(COMMANDS))
    def test_every_option_has_help(self, path: str) -> None:
        """`gcs ... -h` explains every visible option (none is a bare flag name)."""
        command = LEAVES[path]
        bare = [
            p.opts[0]
            for p in command.params
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
        ]
        assert bare == [], f"gcs {path}: options without help: {bare}"

    @pytest.mark.parametrize("path", sorted(COMMANDS))
    def test_address_and_format_where_they_belong(self, path: str) -> None:
        """--address where the command talks to a GCS; --format text|json (default text)
        where it prints data; neither where it does not."""
        command = LEAVES[path]
        options = {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts}
        talks, prints = COMMANDS[path]
        assert ("--address" in options) == talks, path
        assert ("--format" in options) == prints, path
        if prints:
            fmt = options["--format"]
            assert isinstance(fmt.type, click.Choice)
            assert list(fmt.type.choices) == ["text", "json"]
            assert fmt.default == DEFAULT_FORMAT == "text"

    @pytest.mark.parametrize("path", sorted(COMMANDS))
    def test_help_runs(self, path: str) -> None:
        """`-h` prints the usage and exits 0 for every command."""
        from click.testing import CliRunner

        result = CliRunner().invoke(main, [*path.split(), "-h"])
        assert result.exit_code == 0 and "Usage:" in result.output, result.output


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mistakes")
    cluster = root / "cluster.yaml"
    cluster.write_text(
        "head_node_type: head\navailable_node_types:\n"
        "  head: {resources: {CPU: 0}, max_workers: 0}\n"
        "  cpu4: {resources: {CPU: 4}, max_workers: 5}\n"
    )
    (root / "malformed.yaml").write_text("a: [1, 2\n")
    (root / "bad.json").write_text("{not json")
    workload = root / "workload.yaml"
    workload.write_text("duration: 1h\ntasks: []\n")
    return {
        "cluster": str(cluster),
        "missing": str(root / "missing.yaml"),
        "malformed": str(root / "malformed.yaml"),
        "bad_json": str(root / "bad.json"),
        "workload": str(workload),
        "state_dir": str(root / "state"),
    }


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GCS_", "RAY_")) and k != "AUTOSCALER_UPDATE_INTERVAL_S"
    }
    env.update(extra)
    return env


#: (argv with {file} placeholders, environment, exit code, pattern of the one stderr line)
MISTAKES: list[tuple[tuple[str, ...], dict[str, str], int, str]] = [
    (("ha", "handover", "--status-address", NOTHING), {}, 1,
     re.escape(f"handover: no HA status port answers at {NOTHING} (")),
    (("ha", "finish-upgrade", "--storage", "nope://x"), {}, 2, r"--storage"),
    # -- the GCS is not there: exit 1, one sentence naming the address ---------------------
    (("status", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("status", "--format", "json"), {"GCS_ADDRESS": NOTHING}, 1, UNREACHABLE),
    (("request-resources", "--num-cpus", "4", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("health", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("submit", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("raylet", "--address", NOTHING, "--register-timeout", "1"), {}, 1, UNREACHABLE),
    (
        ("raylet-fleet", "--address", NOTHING, "--count", "2", "--register-timeout", "1"),
        {},
        1,
        UNREACHABLE,
    ),
    (("vcluster", "create", "--id", "vc1"), {"RAY_ADDRESS": NOTHING}, 1, UNREACHABLE),
    (("vcluster", "update", "--id", "vc1", "--revision", "0", "--address", NOTHING), {}, 1,
     UNREACHABLE),
    (("vcluster", "remove", "vc1", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("vcluster", "list", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("vcluster", "show", "vc1", "--address", NOTHING), {}, 1, UNREACHABLE),
    (("autoscaler", "plan", "--config", "{cluster}"), {"GCS_ADDRESS": NOTHING}, 1, UNREACHABLE),
    (
        ("autoscaler", "run", "--config", "{cluster}", "--state-dir", "{state_dir}",
         "--address", NOTHING),
        {},
        1,
        UNREACHABLE,
    ),
    # -- the address itself is wrong: exit 2, blamed on where it came from -----------------
    (("status",), {"GCS_ADDRESS": "garbage"}, 2, r"GCS_ADDRESS=garbage: not host:port"),
    (("vcluster", "list"), {"RAY_ADDRESS": "x:99999"}, 2, r"RAY_ADDRESS=x:99999: the port"),
    (("status", "--address", "nonsense"), {"GCS_ADDRESS": "1.2.3.4:5"}, 2, r"--address"),
    (("health",), {}, 2, r"no GCS address: pass --address or set GCS_ADDRESS"),
    (("autoscaler", "run", "--config", "{cluster}"), {}, 2, r"no GCS address"),
    # -- another Ray endpoint's URL, or Ray's `auto` with no cluster recorded: exit 2, saying
    #    what the value is and what to pass instead ----------------------------------------
    (("status",), {"RAY_ADDRESS": "http://127.0.0.2:8265"}, 2,
     r"RAY_ADDRESS=http://127\.0\.0\.2:8265: the Ray dashboard's HTTP address .*"
     r"pass --address 127\.0\.0\.2:6379"),
    (("vcluster", "list", "--address", "ray://h:10001"), {}, 2, r"a Ray Client address"),
    (("status",), {"RAY_ADDRESS": "auto", "RAY_TMPDIR": "/nonexistent-gcs-test-tmp"}, 2,
     r"RAY_ADDRESS=auto: no running cluster is recorded in "
     r"/nonexistent-gcs-test-tmp/ray/ray_current_cluster"),
    # -- files given as flags: missing or malformed is bad input (2), the flag named -------
    (("serve", "--config", "{missing}"), {}, 2, r"missing\.yaml"),
    (("serve", "--autoscaler-config", "{missing}"), {}, 2, r"--autoscaler-config.*cannot read"),
    (("serve", "--autoscaler-config", "{malformed}"), {}, 2, r"--autoscaler-config.*malformed"),
    (("autoscaler", "plan", "--config", "{missing}", "--state", "{bad_json}"), {}, 2,
     r"--config.*cannot read"),
    (("autoscaler", "plan", "--config", "{cluster}", "--state", "{bad_json}"), {}, 2,
     r"--state.*not a ClusterResourceState"),
    (("autoscaler", "plan", "--config", "{cluster}", "--state", "{missing}"), {}, 2,
     r"--state.*cannot read"),
    (("autoscaler", "plan", "--config", "{cluster}", "--state", "{bad_json}",
      "--ippr-status", "{missing}"), {}, 2, r"--ippr-status"),
    (("autoscaler", "simulate", "--config", "{cluster}", "--workload", "{missing}"), {}, 2,
     r"--workload.*cannot read"),
    (("autoscaler", "simulate", "--config", "{malformed}", "--workload", "{workload}"), {}, 2,
     r"--config.*malformed"),
    (("autoscaler", "run", "--config", "{missing}", "--address", NOTHING), {}, 2,
     r"--config.*cannot read"),
    # -- flags ------------------------------------------------------------------------------
    (("status", "--format", "yaml", "--address", NOTHING), {}, 2, r"--format"),
    (("status", "--interval", "0", "--address", NOTHING), {}, 2, r"--interval"),
    (("health", "--timeout", "0", "--address", NOTHING), {}, 2, r"--timeout"),
    (("request-resources", "--address", NOTHING), {}, 2, r"--num-cpus and/or --bundles"),
    (("submit", "--resources", '{"CPU": -1}', "--address", NOTHING), {}, 2, r"CPU"),
    (("raylet", "--log-level", "loud", "--address", NOTHING), {}, 2, r"--log-level"),
    (("raylet-fleet", "--count", "0", "--address", NOTHING), {}, 2, r"--count"),
    (("db", "upgrade", "--storage", "redis://x"), {}, 2, r"--storage"),
    (("install-into-ray", "--ray-python", "/nonexistent/python"), {}, 2, r"--ray-python"),
    (("vcluster", "create", "--id", "", "--address", NOTHING), {}, 2,
     r"--id.*the virtual cluster id is empty"),
    (("vcluster", "create", "--id", "bad id/x", "--address", NOTHING), {}, 2,
     r"--id.*'bad id/x' is invalid: use letters, digits"),
    (("vcluster", "create", "--id", "a", "--replica-sets", '{"x": -1}', "--address", NOTHING),
     {}, 2, r"--replica-sets"),
    (("vcluster", "update", "--id", "a", "--revision", "-1", "--address", NOTHING), {}, 2,
     r"--revision"),
    (("vcluster", "remove", "--address", NOTHING), {}, 2, r"missing the virtual cluster id"),
    (("vcluster", "show", "--address", NOTHING), {}, 2, r"missing the virtual cluster id"),
    (("vcluster", "list", "--limit", "0", "--address", NOTHING), {}, 2, r"--limit"),
    (("autoscaler", "run", "--config", "{cluster}", "--address", NOTHING),
     {"AUTOSCALER_UPDATE_INTERVAL_S": "soon"}, 2, r"AUTOSCALER_UPDATE_INTERVAL_S=soon"),
    (("autoscaler", "plan", "--config", "{cluster}", "--state", "{bad_json}",
      "--address", NOTHING), {}, 2, r"either --state or --address"),
    (("serve", "--port", "99999"), {}, 2, r"--port"),
    (("serve", "--storage", "sqlite://relative.db"), {}, 2,
     r"--storage.*'sqlite://relative\.db': a SQLite URL has no host; write "
     r"sqlite:///relative\.db"),
    (("serve",), {"GCS_STORAGE": "sqlite+aiosqlite://x.db"}, 2,
     r"GCS_STORAGE.*write sqlite\+aiosqlite:///x\.db"),
    (("db", "upgrade", "--storage", "sqlite://x.db"), {}, 2, r"--storage.*sqlite:///x\.db"),
    (("autoscaler", "simulate", "--config", "{cluster}", "--workload", "{malformed}"), {}, 2,
     r"--workload.*malformed\.yaml: line 2 column 1 malformed YAML"),
    # -- the store is down: the STORE is named (password hidden), after Ray's retry knobs ---
    (("serve", "--storage", "redis://:pw@127.0.0.1:1/0", "--port", "0", "--metrics-port", "-1",
      "--log-level", "error"),
     {"RAY_redis_db_connect_retries": "1", "RAY_redis_db_connect_wait_milliseconds": "100"}, 1,
     r"^Error: cannot reach the store redis://:\*\*\*@127\.0\.0\.1:1/0 \(--storage\): "
     r"(?!.*pw@).*gave up after \d attempts? in [\d.]+ s \(retry budget: "
     r"RAY_redis_db_connect_retries=1 x RAY_redis_db_connect_wait_milliseconds=100\)$"),
    # -- --ha: a store other processes share, and lease knobs in range ----------------------
    (("serve", "--ha", "--storage", "memory://"), {}, 2, r"--ha needs a store.*not memory"),
    (("serve", "--ha"), {}, 2, r"--ha needs a store.*not sqlite"),
    (("serve", "--ha", "--storage", "redis://127.0.0.1:1/0"), {"GCS_HA_LEASE_TTL_MS": "100"}, 2,
     r"ha\.lease_ttl_ms \(GCS_HA_LEASE_TTL_MS\): must be in 200\.\.60000, got 100"),
    (("serve", "--ha", "--storage", "redis://127.0.0.1:1/0"),
     {"GCS_HA_RENEW_INTERVAL_MS": "1500"}, 2, r"ha\.renew_interval_ms.*at most half"),
]  # fmt: skip


def _id(case: tuple[tuple[str, ...], dict[str, str], int, str]) -> str:
    argv, env, code, _ = case
    extra = ",".join(f"{k}={v}" for k, v in env.items())
    return f"{code}:{' '.join(argv)}" + (f" [{extra}]" if extra else "")


class TestMistakesTable:
    def test_every_command_has_a_mistake(self) -> None:
        """The table covers every command of the tree."""
        covered = set()
        for argv, _env_extra, _code, _pattern in MISTAKES:
            words = [w for w in argv if not w.startswith("-")]
            for path in COMMANDS:
                if words[: len(path.split())] == path.split():
                    covered.add(path)
        assert covered == set(COMMANDS)

    @pytest.mark.parametrize("case", MISTAKES, ids=[_id(c) for c in MISTAKES])
    def test_one_line_and_the_exit_code(
        self,
        case: tuple[tuple[str, ...], dict[str, str], int, str],
        files: dict[str, str],
        gcs_cli: ForkedCli,
    ) -> None:
        """Exit 1 (failed) or 2 (bad input), one `Error:` line matching, nothing else (the
        command a process forked from one that has imported the CLI: tests/forked_cli.py)."""
        argv, env_extra, code, pattern = case
        args = [files[a[1:-1]] if re.fullmatch(r"\{\w+\}", a) else a for a in argv]
        result = gcs_cli.run(args, env=_env(**env_extra), timeout=120)
        where = f"argv={args} rc={result.returncode} stderr={result.stderr!r}"
        assert "Traceback" not in result.stderr + result.stdout, where
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), where
        assert re.search(pattern, lines[0]), where
        assert result.returncode == code, where


def test_placeholders_are_files(files: dict[str, str]) -> None:
    """The table's {placeholders} are the fixture's files (a typo would test nothing)."""
    names = {m for argv, *_ in MISTAKES for a in argv for m in re.findall(r"\{(\w+)\}", a)}
    assert names <= set(files), names - set(files)
    assert Path(files["cluster"]).is_file()


def test_a_command_loads_only_its_own_subsystem() -> None:
    """``gcs status`` does not import the autoscaler runtime, the raylet agent or the
    virtual-cluster client (each subcommand module is loaded when the command line reaches
    it: ``GcsGroup(lazy_commands=...)``); ``gcs vcluster`` loads its own."""
    probe = (
        "import sys\n"
        "from gcs.cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('gcs.autoscaler.runtime', 'gcs.raylet.agent', 'gcs.sdk._vcluster_client')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )

    def loaded(*argv: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
            stdin=subprocess.DEVNULL,
            check=True,
        )
        return result.stdout.strip()

    assert loaded("status", "--bogus") == ""
    assert loaded("vcluster", "list", "--bogus") == "gcs.sdk._vcluster_client"
