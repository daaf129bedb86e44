"""The private test servers: missing binaries are explained, restarts keep port and data."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from gcs.testing import ports, postgres
from gcs.testing.ports import free_port
from gcs.testing.postgres import PostgresServer
from gcs.testing.processes import MissingServerBinary, find_binary
from gcs.testing.redis_cluster import RedisCluster
from gcs.testing.redis_sentinels import RedisSentinels
from gcs.testing.redis_server import RedisServer


class TestServerHelpers:
    """gcs.testing.processes finds binaries and restarts servers in place."""

    def test_missing_binary_names_the_package_to_install(self) -> None:
        """An absent binary raises MissingServerBinary with the apt-get command."""
        with pytest.raises(MissingServerBinary, match="apt-get install -y some-package"):
            find_binary("gcs-no-such-binary", package="some-package")

    def test_redis_restart_keeps_port_and_appendonly_data(self) -> None:
        """stop() then start() serves the same port with the data written before."""
        server = RedisServer().start()
        try:
            port = server.port
            _send(server.port, b"SET k v\r\n")
            server.stop(kill=True)
            assert not server.running
            server.start()
            assert server.port == port
            assert _send(server.port, b"GET k\r\n") == b"$1\r\nv\r\n"
        finally:
            server.cleanup()


class TestFreePort:
    def test_ports_come_from_below_the_ephemeral_range(self) -> None:
        """Never a port the kernel also hands to bind(0) or to outgoing connections (a
        parallel worker could take it before our subprocess binds it); and it is bindable."""
        import socket

        low = ports._ephemeral_low()
        drawn = {free_port() for _ in range(20)}
        assert all(ports._RESERVED_LOW <= p < low for p in drawn), (drawn, low)
        assert len(drawn) > 1  # random, not one port every worker would share
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", drawn.pop()))

    def test_ports_for_servers_started_together_are_distinct(self, monkeypatch) -> None:
        """The sentinels of one deployment once drew the same port (21161, 29275, 29275):
        the third never bound it and the sentinels never agreed."""
        drawn = iter([21161, 29275, 29275, 29275, 30001])
        monkeypatch.setattr(ports, "free_port", lambda: next(drawn))
        assert ports.free_ports(3) == [21161, 29275, 30001]


class TestInitdbRetry:
    """initdb crashing by a signal (seen with several workers starting clusters at once) is
    retried on a fresh data directory; an ordinary failure is reported at once."""

    def _fake_initdb(self, monkeypatch, outcomes: list[tuple[int, bytes]]) -> list[bool]:
        """initdb answers with ``outcomes`` in turn; returns, per call, whether the data
        directory was absent when it ran (a retry must start from a clean one)."""
        clean: list[bool] = []

        def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
            data = postgres.pathlib.Path(cmd[cmd.index("-D") + 1])
            clean.append(not data.exists())
            data.mkdir()
            (data / "half-written").write_bytes(b"")
            code, err = outcomes.pop(0)
            return subprocess.CompletedProcess(cmd, code, b"", err)

        monkeypatch.setattr(postgres, "find_binary", lambda name, package: name)
        monkeypatch.setattr(postgres, "_postgres_user", lambda: None)
        monkeypatch.setattr(postgres.subprocess, "run", run)
        monkeypatch.setattr(postgres.time, "sleep", lambda s: None)
        return clean

    @pytest.mark.parametrize(
        "crash",
        [(-11, b""), (1, b"initdb: error: child process was terminated by signal 11")],
    )
    def test_a_crash_by_signal_is_retried_on_a_fresh_directory(
        self, monkeypatch, tmp_path, crash: tuple[int, bytes]
    ) -> None:
        clean = self._fake_initdb(monkeypatch, [crash, (0, b"")])
        server = PostgresServer(directory=tmp_path)
        server._init()
        assert clean == [True, True] and server._initialised

    def test_an_ordinary_failure_is_not_retried(self, monkeypatch, tmp_path) -> None:
        clean = self._fake_initdb(monkeypatch, [(1, b"initdb: error: bad locale")])
        with pytest.raises(subprocess.CalledProcessError):
            PostgresServer(directory=tmp_path)._init()
        assert clean == [True]

    def test_three_crashes_give_up(self, monkeypatch, tmp_path) -> None:
        clean = self._fake_initdb(monkeypatch, [(-11, b"")] * 3)
        with pytest.raises(subprocess.CalledProcessError):
            PostgresServer(directory=tmp_path)._init()
        assert clean == [True, True, True]


class TestPostmasterRetry:
    """The postmaster dying of a signal while starting is started again (on the same data
    directory); exiting with an error is reported at once."""

    def _fake_postgres(self, monkeypatch, tmp_path, crashes: int, *, exit_code: int = 0) -> Any:
        """A ``postgres`` that dies of SIGSEGV (or exits ``exit_code``) on its first
        ``crashes`` starts, then marks itself ready and waits to be stopped."""
        script = tmp_path / "postgres"
        die = f"exit {exit_code}" if exit_code else "kill -SEGV $$"
        script.write_text(
            "#!/bin/sh\n"
            f"n=$(cat {tmp_path}/starts 2>/dev/null || echo 0); n=$((n+1))\n"
            f"echo $n > {tmp_path}/starts\n"
            f"if [ $n -le {crashes} ]; then {die}; fi\n"
            f"touch {tmp_path}/ready; exec sleep 60\n"
        )
        script.chmod(0o755)
        monkeypatch.setattr(postgres, "find_binary", lambda name, package: str(script))
        monkeypatch.setattr(postgres, "_postgres_user", lambda: None)
        monkeypatch.setattr(PostgresServer, "_ready", lambda self: (tmp_path / "ready").exists())
        monkeypatch.setattr(postgres.time, "sleep", lambda s: None)
        server = PostgresServer(directory=tmp_path)
        server._initialised = True
        return server

    def starts(self, tmp_path) -> int:
        return int((tmp_path / "starts").read_text())

    def test_a_crash_by_signal_is_started_again(self, monkeypatch, tmp_path) -> None:
        server = self._fake_postgres(monkeypatch, tmp_path, crashes=2)
        try:
            server.start()
            assert server.running and self.starts(tmp_path) == 3
        finally:
            server.stop(kill=True)

    def test_three_crashes_give_up(self, monkeypatch, tmp_path) -> None:
        server = self._fake_postgres(monkeypatch, tmp_path, crashes=3)
        with pytest.raises(RuntimeError, match="exited with code -11"):
            server.start()
        assert self.starts(tmp_path) == 3

    def test_an_ordinary_exit_is_not_retried(self, monkeypatch, tmp_path) -> None:
        server = self._fake_postgres(monkeypatch, tmp_path, crashes=1, exit_code=1)
        with pytest.raises(RuntimeError, match="exited with code 1"):
            server.start()
        assert self.starts(tmp_path) == 1


def _send(port: int, command: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(command)
        return sock.recv(128)


class TestRedisDeployments:
    """Sentinel and cluster deployments stop every process they started."""

    def test_sentinel_deployment_cleanup_stops_every_process(self) -> None:
        """Master, replica and three sentinels: five processes, none left after cleanup."""
        deployment = RedisSentinels().start()
        pids = deployment.pids()
        assert len(pids) == 5
        assert deployment.master().port == deployment.nodes[0].port
        deployment.cleanup()
        assert not [pid for pid in pids if _alive(pid)]

    def test_cluster_deployment_cleanup_stops_every_process(self) -> None:
        """Three masters with a replica each, all slots served; none left after cleanup."""
        deployment = RedisCluster().start()
        pids = deployment.pids()
        assert len(pids) == 6
        assert deployment.master_of(0) is not deployment.master_of(16383)
        deployment.cleanup()
        assert not [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
