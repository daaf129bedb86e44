"""The venv harness: build once, rebuild half-built venvs, serialise builders, run scripts."""

from __future__ import annotations

import fcntl
import json
import pathlib
import sys
import threading
import zipfile
from collections.abc import Callable
from typing import Any

import pytest

from tests.interop import venvs

SPEC = venvs.VenvSpec(
    name="fake-1.0",
    dist="fake",
    version="1.0",
    wheel_glob="fake-1.0-*.whl",
    local_wheel_dir=pathlib.Path("/nonexistent"),
    checks=("import json",),
)


class FakePip:
    """Stands in for ``venvs._run``: records commands and fakes their effects on disk."""

    def __init__(self, cache: pathlib.Path, before_first: Callable[[], None] | None = None) -> None:
        self.cache = cache
        self.before_first = before_first
        self.commands: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, cmd: list[str], *, timeout: float = 0, log: Any = None) -> None:
        with self.lock:
            self.commands.append(cmd)
            first = len(self.commands) == 1
        if first and self.before_first is not None:
            self.before_first()
        if cmd[1:3] == ["-m", "venv"]:
            python = pathlib.Path(cmd[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        elif "download" in cmd:
            dest = pathlib.Path(cmd[cmd.index("--dest") + 1])
            dist, version = cmd[-1].split("==")
            (dest / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"wheel")

    def kinds(self) -> list[str]:
        out = []
        for cmd in self.commands:
            if "download" in cmd:
                out.append("download")
            elif cmd[1:3] == ["-m", "venv"]:
                out.append("venv")
            elif "install" in cmd:
                out.append("install")
            else:
                out.append("check")
        return out


@pytest.fixture
def fake_pip(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> FakePip:
    monkeypatch.setenv("GCS_INTEROP_CACHE", str(tmp_path))
    pip = FakePip(tmp_path)
    monkeypatch.setattr(venvs, "_run", pip)
    return pip


class TestEnsureVenv:
    def test_first_use_downloads_then_builds_and_stamps_last(self, fake_pip: FakePip) -> None:
        """Download into wheels/, create, install the wheel file, check imports, then stamp."""
        venv = venvs.ensure_venv(SPEC)
        assert fake_pip.kinds() == ["download", "venv", "install", "check"]
        install = fake_pip.commands[2]
        assert str(fake_pip.cache / "wheels" / "fake-1.0-py3-none-any.whl") in install
        assert "grpcio" in install
        stamp = json.loads((venv.path / ".complete").read_text())
        assert stamp["requirement"] == "fake==1.0"
        assert venv.path == fake_pip.cache / "fake-1.0"

    def test_complete_venv_is_reused_without_any_command(self, fake_pip: FakePip) -> None:
        """A second call finds the stamp and runs nothing."""
        venvs.ensure_venv(SPEC)
        before = len(fake_pip.commands)
        venvs.ensure_venv(SPEC)
        assert len(fake_pip.commands) == before

    def test_half_built_venv_is_rebuilt_from_scratch(self, fake_pip: FakePip) -> None:
        """Without the stamp (a build died midway) the directory is wiped and rebuilt."""
        leftover = fake_pip.cache / "fake-1.0" / "junk"
        leftover.parent.mkdir(parents=True)
        leftover.write_text("half")
        venvs.ensure_venv(SPEC)
        assert not leftover.exists()
        assert fake_pip.kinds() == ["download", "venv", "install", "check"]

    def test_stale_stamp_from_another_harness_version_rebuilds(
        self, fake_pip: FakePip, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bumping HARNESS_VERSION invalidates cached venvs (the wheel stays cached)."""
        venvs.ensure_venv(SPEC)
        monkeypatch.setattr(venvs, "HARNESS_VERSION", venvs.HARNESS_VERSION + 1)
        venvs.ensure_venv(SPEC)
        assert fake_pip.kinds()[4:] == ["venv", "install", "check"]

    def test_concurrent_builders_build_once(self, tmp_path: pathlib.Path, monkeypatch) -> None:
        """Three builders at once: the flock makes the others wait and then reuse.

        The race is made, not hoped for: the first builder's first step waits (holding the
        lock) until all three have asked for the venv's lock."""
        monkeypatch.setenv("GCS_INTEROP_CACHE", str(tmp_path))
        asked = threading.Condition()
        requests: list[str] = []

        class CountingFcntl:
            LOCK_EX, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_UN

            @staticmethod
            def flock(fh: Any, op: int) -> None:
                if op == fcntl.LOCK_EX:
                    with asked:
                        requests.append(pathlib.Path(fh.name).name)
                        asked.notify_all()
                fcntl.flock(fh, op)

        def all_three_waiting() -> None:
            with asked:
                ok = asked.wait_for(lambda: requests.count(f"{SPEC.name}.lock") == 3, 60)
            assert ok, f"the other builders never asked for the lock: {requests}"

        pip = FakePip(tmp_path, before_first=all_three_waiting)
        monkeypatch.setattr(venvs, "_run", pip)
        monkeypatch.setattr(venvs, "fcntl", CountingFcntl)
        errors: list[BaseException] = []

        def build() -> None:
            try:
                venvs.ensure_venv(SPEC)
            except BaseException as err:  # surfaced below, not lost in the thread
                errors.append(err)

        threads = [threading.Thread(target=build) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert pip.kinds() == ["download", "venv", "install", "check"]

    def test_failed_build_leaves_no_stamp(self, fake_pip: FakePip, monkeypatch) -> None:
        """If a step fails the error propagates and the next call starts over."""

        def failing(cmd: list[str], *, timeout: float = 0, log: Any = None) -> None:
            fake_pip(cmd)
            if "install" in cmd:
                raise venvs.VenvError("no network")

        monkeypatch.setattr(venvs, "_run", failing)
        with pytest.raises(venvs.VenvError, match="no network"):
            venvs.ensure_venv(SPEC)
        assert not (fake_pip.cache / "fake-1.0" / ".complete").exists()


class TestRunInVenv:
    here = venvs.Venv(SPEC, pathlib.Path(sys.prefix))

    def test_returns_the_last_json_line(self) -> None:
        """Earlier chatter on stdout is ignored; the last line is the result."""
        script = "import json, os; print('noise'); print(json.dumps({'x': os.environ['X']}))"
        assert venvs.run_in_venv(self.here, script, env={"X": "1"}) == {"x": "1"}

    def test_failure_raises_with_stderr(self) -> None:
        """A crashing script raises VenvError carrying its traceback."""
        with pytest.raises(venvs.VenvError, match="ZeroDivisionError"):
            venvs.run_in_venv(self.here, "1/0")

    def test_non_json_output_is_an_error(self) -> None:
        """A script that prints no JSON object is a harness error, not a silent pass."""
        with pytest.raises(venvs.VenvError, match="not JSON"):
            venvs.run_in_venv(self.here, "print('hello')")
        with pytest.raises(venvs.VenvError, match="expected a JSON object"):
            venvs.run_in_venv(self.here, "print('[1]')")


@pytest.mark.interop
class TestRealWheels:
    def test_the_wheels_are_cached_wheels(
        self, ray_wheel: pathlib.Path, ant_ray_wheel: pathlib.Path
    ) -> None:
        """The wheel fixtures give the raw wheels under the cache's wheels/ directory."""
        for path, prefix in ((ray_wheel, "ray-2.60.0-"), (ant_ray_wheel, "ant_ray-")):
            assert path.parent == venvs.cache_root() / "wheels"
            assert path.name.startswith(prefix)
            with zipfile.ZipFile(path) as zf:
                assert "ray/core/generated/autoscaler_pb2.py" in zf.namelist()

    def test_ant_ray_venv_has_ant_rays_virtual_cluster_service(
        self, ant_ray_venv: venvs.Venv
    ) -> None:
        """The ant-ray venv really holds ant-ray (it has the VC service Ray lacks)."""
        script = (
            "import json; from ray.core.generated import gcs_service_pb2 as g; "
            "print(json.dumps({'vc': 'VirtualClusterInfoGcsService' in "
            "g.DESCRIPTOR.services_by_name}))"
        )
        assert venvs.run_in_venv(ant_ray_venv, script) == {"vc": True}
