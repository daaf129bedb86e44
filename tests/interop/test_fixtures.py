"""Tests never install: the venv fixtures only check, what the tests need is built before they
run (tests.interop.prebuild), and a missing venv fails at once naming the command."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.interop import fixtures, prebuild, venvs
from tests.interop.test_venvs import FakePip

INNER_TEST = "tests/interop/test_venvs.py::TestRealWheels::test_ant_ray_venv_has_ant_rays_virtual_cluster_service"  # noqa: E501
"""A real test of the suite that asks for a venv (``ant_ray_venv``)."""


class PipDuringTests(FakePip):
    """A fake pip that records whether each command ran while a test was running (pytest
    sets ``PYTEST_CURRENT_TEST`` during a test's setup, call and teardown)."""

    def __init__(self, cache: pathlib.Path) -> None:
        super().__init__(cache)
        self.inside_a_test: list[str] = []

    def __call__(self, cmd: list[str], *, timeout: float = 0, log: Any = None) -> None:
        current = os.environ.get("PYTEST_CURRENT_TEST")
        if current:
            self.inside_a_test.append(f"{' '.join(cmd[1:4])} during {current}")
        super().__call__(cmd, timeout=timeout, log=log)


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The suite's own INNER_TEST, in this process (so the fake pip is what it calls).
    ``PYTEST_CURRENT_TEST`` names this test until the inner one runs (pytest restores it)."""
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    return pytester.runpytest_inprocess(
        str(venvs.REPO_ROOT / INNER_TEST),
        f"--rootdir={venvs.REPO_ROOT}",
        "-c", str(venvs.REPO_ROOT / "pyproject.toml"),
        "-p", "no:cacheprovider",
        "-p", "no:xdist",
        *args,
    )  # fmt: skip


@pytest.fixture
def empty_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> PipDuringTests:
    cache = tmp_path / "interop-cache"
    monkeypatch.setenv("GCS_INTEROP_CACHE", str(cache))
    monkeypatch.delenv("GCS_INTEROP_REQUIRED", raising=False)
    monkeypatch.delenv("GCS_INTEROP_BUILD", raising=False)
    pip = PipDuringTests(cache)
    monkeypatch.setattr(venvs, "_run", pip)
    return pip


class TestNoInstallInsideATest:
    def test_missing_venv_is_built_before_the_test_not_in_its_fixture(
        self, pytester: pytest.Pytester, empty_cache: PipDuringTests
    ) -> None:
        """From an empty cache, a test asking for ``ant_ray_venv`` gets it built when
        collection ends, before the test starts: no pip command runs inside the test (the
        old fixture ran the whole install in the test's setup, under its 300 s timeout)."""
        run_inner(pytester)
        assert empty_cache.inside_a_test == []
        assert empty_cache.kinds() == ["download", "venv", "install", "check"]
        assert venvs.is_complete(venvs.ANT_RAY)

    def test_without_building_the_fixture_fails_at_once_naming_the_command(
        self,
        pytester: pytest.Pytester,
        empty_cache: PipDuringTests,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """``GCS_INTEROP_BUILD=0``: nothing is built, and the test errors in its setup with
        one message naming ``python -m tests.interop.venvs``."""
        monkeypatch.setenv("GCS_INTEROP_BUILD", "0")
        result = run_inner(pytester)
        assert empty_cache.commands == []
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(
            ["*the ant-ray-2.44.1.1 virtualenv is not built under *: "
             "build it with `python -m tests.interop.venvs`*"]
        )  # fmt: skip


class TestObtain:
    def missing(self) -> venvs.Venv:
        raise venvs.VenvMissing("the ray-2.60.0 virtualenv is not built: build it with X")

    def test_missing_and_not_tried_fails_naming_the_command(self) -> None:
        with pytest.raises(pytest.fail.Exception, match=r"build it with X$"):
            fixtures.obtain({}, ("ray",), self.missing)

    def test_build_failed_before_the_tests_skips_with_the_reason(self, monkeypatch) -> None:
        """Offline: the build before the tests failed; its tests skip, naming the cause."""
        monkeypatch.delenv("GCS_INTEROP_REQUIRED", raising=False)
        with pytest.raises(pytest.skip.Exception, match="ray: pip install failed: no network"):
            fixtures.obtain({"ray": "pip install failed: no network"}, ("ray",), self.missing)

    def test_build_failed_fails_when_interop_is_required(self, monkeypatch) -> None:
        """GCS_INTEROP_REQUIRED=1 (CI, scripts/test.sh) turns that skip into a failure."""
        monkeypatch.setenv("GCS_INTEROP_REQUIRED", "1")
        with pytest.raises(pytest.fail.Exception, match="before the tests failed: ray: no net"):
            fixtures.obtain({"ray": "no net"}, ("ray",), self.missing)

    def test_a_ready_venv_is_returned(self) -> None:
        assert fixtures.obtain({}, ("ray",), lambda: "venv") == "venv"


class FakeNeeds:
    """Needs that record their builds; ``both`` waits until two builds run at once."""

    def __init__(self, fail: str = "") -> None:
        self.built: list[str] = []
        self.running = 0
        self.overlapped = False
        self.cond = threading.Condition()
        self.fail = fail

    def need(self, name: str, ready: bool = False) -> prebuild.Need:
        def build(progress: venvs.Progress) -> None:
            progress("installing")
            with self.cond:
                self.running += 1
                self.cond.notify_all()
                if self.running >= 2:
                    self.overlapped = True
                    self.cond.notify_all()
                # the first two builds meet here (else the first goes on after 30 s)
                self.cond.wait_for(lambda: self.overlapped, timeout=30)
                self.built.append(name)
                self.running -= 1
            if name == self.fail:
                raise venvs.VenvError(f"pip install failed (exit 1): boom (log: /x/{name}.log)\n…")

        return prebuild.Need(name, f"{name}==1", lambda: ready, build)


class TestBuild:
    @pytest.fixture
    def needs(self, monkeypatch: pytest.MonkeyPatch) -> FakeNeeds:
        fake = FakeNeeds(fail="b")
        monkeypatch.setattr(
            prebuild, "NEEDS", {n: fake.need(n, ready=n == "r") for n in ("a", "a2", "b", "r")}
        )
        monkeypatch.setattr(prebuild, "_CHAINS", (("a", "a2"), ("b",), ("r",)))
        return fake

    def test_chains_build_at_once_each_in_order(self, needs: FakeNeeds) -> None:
        """Different venvs build concurrently; a chain (one venv) in order; ready ones are
        skipped; a failure is reported as its first line."""
        lines: list[str] = []
        failures = prebuild.build(["a", "a2", "b", "r"], prebuild.Reporter(lines.append))
        assert needs.overlapped
        assert needs.built.index("a") < needs.built.index("a2")
        assert "r" not in needs.built
        assert failures == {"b": "pip install failed (exit 1): boom (log: /x/b.log)"}
        assert any(line.endswith("] a: installing") for line in lines)
        assert any(" a2: ready (" in line for line in lines)

    def test_the_command_exits_1_with_one_line_per_failure(self, needs, capsys) -> None:
        assert prebuild.main(["a", "b"]) == 1
        err = capsys.readouterr().err.splitlines()
        reason = "pip install failed (exit 1): boom (log: /x/b.log)"
        assert err == [f"error: cannot build b==1: {reason}"]

    def test_an_unknown_name_is_a_usage_error(self, needs, capsys) -> None:
        with pytest.raises(SystemExit) as exit_:
            prebuild.main(["nope"])
        assert exit_.value.code == 2
        assert "unknown: nope" in capsys.readouterr().err


def test_needs_follow_the_fixtures_tests_ask_for() -> None:
    assert prebuild.needs_of({"ray_venv_with_gcs", "tmp_path", "ant_ray_wheel"}) == [
        "ray+gcs",
        "ant-ray",
    ]
    assert prebuild.needs_of({"tmp_path"}) == []


def test_a_failed_command_is_one_line_naming_its_log(tmp_path: pathlib.Path) -> None:
    """pip's output goes to the log; the error says what failed, its last line, and where."""
    log = tmp_path / "logs" / "x.log"
    script = "print('Collecting ray'); print('ERROR: No matching distribution'); exit(3)"
    with pytest.raises(venvs.VenvError) as err:
        venvs._run([sys.executable, "-c", script], log=log)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"{pathlib.Path(sys.executable).name} -c failed (exit 3): "
        f"ERROR: No matching distribution (log: {log})"
    )
    assert "Collecting ray" in log.read_text()


def test_the_build_command_runs_as_documented() -> None:
    """``python -m tests.interop.venvs --help`` (scripts/test.sh runs the module)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.interop.venvs", "--help"],
        cwd=venvs.REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ray-suite" in proc.stdout
