"""Ray's own test files, run on stock Ray 2.60 and on Ray with our GCS in place of its own.

Two cached virtualenvs with ``ray[default]==2.60.0`` and the test tools the suite needs
(``/work/shared/ray-tests/README.md``): ``ray-suite-stock`` as shipped, ``ray-suite-ours``
with ``gcs install-into-ray`` applied (its ``gcs_server`` is a launcher of this checkout's
``gcs-server``, run by this interpreter).  Ray's test directory is copied into each venv's
``site-packages/ray/tests`` at run time, with ``conftest_compat_preamble.py`` put in front of
``conftest.py`` (the tests are older than the wheel); nothing of it is committed here.

Each file runs on its own, one Ray cluster at a time: ``python -m pytest -p no:cacheprovider
-q --timeout T FILE`` with a fresh ``RAY_TMPDIR``; a small plugin records every test's outcome
as it ends (so a file killed at its wall-clock limit still counts what ran).  Results go to a
JSON file after every file: ``--resume`` (the default when the file exists) skips what it
holds, so a long run can be stopped and continued, and stock runs once per file while ours is
iterated (``--sides ours --rerun ours``).

Printed: per file passed / failed / errors / skipped on each side, the tests that pass on
stock and how many of them pass on ours, the overall share, and each miss with its cause (the
first line of its error).  Run::

    .venv/bin/python -m bench.ray_suite                       # every file, both sides
    .venv/bin/python -m bench.ray_suite test_namespace.py 'test_placement_group*.py'
    .venv/bin/python -m bench.ray_suite --sides ours --rerun ours test_actor_failures.py
    .venv/bin/python -m bench.ray_suite --report                # the table from the JSON only
    .venv/bin/python -m bench.ray_suite --jobs 2 ...            # two files at a time (namespaces)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import fnmatch
import functools
import hashlib
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gcs.cli.dropin.install import install, locate
from gcs.server.addresses import primary_ip
from tests.interop import venvs

SUITE_SOURCE = pathlib.Path(os.environ.get("GCS_RAY_TESTS", "/work/shared/ray-tests"))
TEST_PACKAGES = (
    "pytest==7.4.4",  # pytest 8+ cannot collect these 2024 files
    "pytest-timeout",
    "pytest-asyncio==0.21.2",
    "numpy",
    "setproctitle",
    "async_timeout",
    # what more of the files import at the top (else an ImportError on both sides, no test
    # counted): test_gcs_utils.py (redis), test_autoscaler_yaml.py (mock), test_joblib.py,
    # test_runtime_env_working_dir_4.py (pytest-lazy-fixture, for pytest 7),
    # test_client_library_integration.py (fsspec), test_pydantic_serialization.py (fastapi)
    "redis",
    "mock",
    "joblib",
    "pytest-lazy-fixture",
    "fsspec",
    "fastapi",
)
SIDES = ("stock", "ours")
DEFAULT_RESULTS = pathlib.Path(".ray-suite/results.json")
PLUGIN_NAME = "_gcs_ray_suite_outcomes"

EXCLUDED: dict[str, str] = {
    "test_actor_in_container.py": "docker",
    "test_runtime_env_container.py": "docker",
    "test_tensorflow.py": "tensorflow/GPU",
    "test_runtime_env_conda_and_pip.py": "network (pip/conda)",
    "test_runtime_env_conda_and_pip_2.py": "network (pip/conda)",
    "test_runtime_env_conda_and_pip_3.py": "network (pip/conda)",
    "test_runtime_env_conda_and_pip_4.py": "network (pip/conda)",
    "test_runtime_env_conda_and_pip_5.py": "network (pip/conda)",
    "test_runtime_env_working_dir_remote_uri.py": "network (remote URIs)",
    "test_runtime_env_complicated.py": "network (pip/conda)",
    "test_autoscaler_gcp.py": "cloud provider",
    "test_minimal_install.py": "a minimal-install environment",
    "test_mpi.py": "MPI",
    "test_numba.py": "numba",
    "test_gcs_ha_e2e.py": "docker",
    "test_gcs_ha_e2e_2.py": "docker",
    "test_network_failure_e2e.py": "docker",
    "test_redis_tls.py": "TLS redis build",
    "test_microbenchmarks.py": "benchmark, not a conformance test",
    "test_stress.py": "stress (hours on 2 cores)",
    "test_stress_failure.py": "stress (hours on 2 cores)",
    "test_stress_sharded.py": "stress (hours on 2 cores)",
    "test_reconstruction_stress.py": "stress (hours on 2 cores)",
    "test_reconstruction_stress_spill.py": "stress (hours on 2 cores)",
    "test_placement_group_mini_integration.py": (
        "stress: 5 raylets with 333 GPUs each and up to 1,665 tasks at once, a worker each; "
        "load 164 on 2 cores, stock passed 0 of 1 at 480 s"
    ),
    "test_memory_pressure.py": "needs memory pressure on the host (shared machine)",
}
"""Files left out of the whole-directory run: they need a GPU, Docker, the network or
hours (the reason is printed).  They can still be named explicitly."""

PLUGIN_SOURCE = '''
"""Records each test's outcome as it ends (one JSON line per test report)."""
import json
import os

_PATH = os.environ["GCS_RAY_SUITE_OUTCOMES"]


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    if report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0][:500] if lines else ""


def pytest_runtest_logreport(report):
    if report.when != "call" and report.passed:
        return
    record = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    if not report.passed:
        record["message"] = _first_line(report)
    with open(_PATH, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\\n")
'''


def suite_spec(side: str) -> venvs.VenvSpec:
    """The cached venv of one side (both the same packages; ours gets the launcher).  Ours
    is one per checkout: its launcher names this checkout, and two checkouts running the
    suite at once must not point each other's Ray at their own GCS."""
    name = "ray-suite-stock"
    if side == "ours":
        name = "ray-suite-ours-" + hashlib.sha256(str(venvs.REPO_ROOT).encode()).hexdigest()[:8]
    return venvs.VenvSpec(
        name=name,
        dist="ray",
        version="2.60.0",
        wheel_glob="ray-2.60.0-*.whl",
        local_wheel_dir=pathlib.Path("/tmp/wheels/ray260"),
        wheel_extras=("default",),
        extra=("grpcio", *TEST_PACKAGES),
        checks=(*venvs.RAY_DEFAULT.checks, "import pytest, pytest_timeout, pytest_asyncio"),
    )


def _site_packages(venv: venvs.Venv) -> pathlib.Path:
    found = sorted(venv.path.glob("lib/python*/site-packages"))
    if not found:
        raise venvs.VenvError(f"{venv.path}: no site-packages")
    return found[0]


def tests_dir(venv: venvs.Venv) -> pathlib.Path:
    return _site_packages(venv) / "ray" / "tests"


def _source_digest(source: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(source.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(source)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


COMPAT_SUPPLEMENT = """
# --- ours, after the shared preamble: two more test helpers the 2024 files import by their
# old names (test_gcs_utils.py, test_basic_3.py), the same on both sides.
if not hasattr(_compat_tu, "async_wait_for_condition_async_predicate"):
    # 2.60's async_wait_for_condition awaits an async predicate, as this one did
    _compat_tu.async_wait_for_condition_async_predicate = _compat_tu.async_wait_for_condition
if not hasattr(_compat_tu, "dicts_equal"):
    def _dicts_equal(dict1, dict2, abs_tol=1e-4):  # as in the 2024 test_utils
        import math as _m
        if dict1.keys() != dict2.keys():
            return False
        for _k, _v in dict1.items():
            _w = dict2[_k]
            if isinstance(_v, float) and isinstance(_w, float):
                if _m.isclose(_v, _w, abs_tol=abs_tol):
                    continue
            if _v != _w:
                return False
        return True
    _compat_tu.dicts_equal = _dicts_equal
"""


def install_tests(venv: venvs.Venv, source: pathlib.Path = SUITE_SOURCE) -> pathlib.Path:
    """Copy Ray's test directory into the venv (again only when the source or our supplement
    changed), the compat preamble and :data:`COMPAT_SUPPLEMENT` in front of its conftest.py."""
    origin = source / "python" / "ray" / "tests"
    target = tests_dir(venv)
    stamp = target / ".gcs-ray-suite"
    digest = _source_digest(source) + hashlib.sha256(COMPAT_SUPPLEMENT.encode()).hexdigest()[:16]
    if stamp.is_file() and stamp.read_text() == digest:
        return target
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(origin, target, symlinks=True)
    preamble = (source / "conftest_compat_preamble.py").read_text()
    conftest = target / "conftest.py"
    conftest.write_text(preamble + "\n" + COMPAT_SUPPLEMENT + "\n" + conftest.read_text())
    stamp.write_text(digest)
    return target


def provide_redis(venv: venvs.Venv) -> None:
    """Ray's test utilities start Redis from ``ray/core/src/ray/thirdparty/redis/src/
    redis-server`` (Ray's CI builds it; the wheel has none): link the system's there, on
    both sides alike, so the external-Redis (GCS fault tolerance) tests run."""
    found = shutil.which("redis-server")
    target = _site_packages(venv) / "ray/core/src/ray/thirdparty/redis/src/redis-server"
    if found is None or target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(found)


def has_tests(source: pathlib.Path = SUITE_SOURCE) -> bool:
    """Whether Ray's test files are there to run (``GCS_RAY_TESTS``)."""
    return (source / "python" / "ray" / "tests").is_dir()


def prepare(
    side: str, *, build: bool = True, progress: venvs.Progress = lambda _: None
) -> venvs.Venv:
    """The side's venv, built once (or, ``build=False``, :class:`venvs.VenvMissing` if it is
    not), tests installed; ours with the launcher in place."""
    spec = suite_spec(side)
    venv = venvs.ensure_venv(spec, progress) if build else venvs.require_venv(spec)
    # one preparer at a time: two pytest workers copying the tests tree into the same venv
    # collide ("File exists"), as CI's first run on a fresh cache showed
    with venvs.locked(spec.name + "-prepare"):
        progress("copying Ray's tests in, installing our gcs_server launcher")
        install_tests(venv)
        provide_redis(venv)
        if side == "ours":
            install(locate(str(venv.python)))
    return venv


# -- one file on one side ------------------------------------------------------------------


@dataclass
class TestResult:
    outcome: str
    """passed | failed | error | skipped"""
    message: str = ""


@dataclass
class FileRun:
    tests: dict[str, TestResult]
    duration_s: float
    exit_code: int | None
    timed_out: bool = False
    note: str = ""
    """Why the file produced no result (collection error, crash), first line."""

    def merged(self, rerun: FileRun) -> FileRun:
        """This record with a ``-k`` run of some of its tests on top: each test run again
        takes its new outcome, the rest keep theirs (a file cut off at its time limit can be
        finished with the tests it did not reach)."""
        return FileRun(
            {**self.tests, **rerun.tests},
            self.duration_s + rerun.duration_s,
            rerun.exit_code,
            rerun.timed_out,
            rerun.note,
        )

    def counts(self) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for result in self.tests.values():
            out[result.outcome] = out.get(result.outcome, 0) + 1
        return out

    def to_json(self) -> dict:
        return {
            "tests": {k: dataclasses.asdict(v) for k, v in self.tests.items()},
            "duration_s": round(self.duration_s, 1),
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, doc: dict) -> FileRun:
        return cls(
            tests={canonical_nodeid(k): TestResult(**v) for k, v in doc["tests"].items()},
            duration_s=doc["duration_s"],
            exit_code=doc["exit_code"],
            timed_out=doc.get("timed_out", False),
            note=doc.get("note", ""),
        )


_VENV_PATH = re.compile(r"/[^\s,\[\]]*?/ray-suite-[^/\s,]+/lib/python[^/\s,]*/site-packages/")


def canonical_nodeid(nodeid: str) -> str:
    """A test id the same on both sides: a parametrized id may hold a path into its side's
    venv (``test_runtime_env_validation.py`` passes schema files), cut to ``<site-packages>/``."""
    return _VENV_PATH.sub("<site-packages>/", nodeid)


def fold_outcomes(lines: Iterable[str]) -> dict[str, TestResult]:
    """Per-phase reports -> one result per test, as junit counts them: a failed setup or
    teardown is an error, a failed call a failure, a skip anywhere a skip."""
    results: dict[str, TestResult] = {}
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        nodeid, when, outcome = (
            canonical_nodeid(record["nodeid"]),
            record["when"],
            record["outcome"],
        )
        message = record.get("message", "")
        held = results.get(nodeid)
        if outcome == "skipped":
            if held is None:
                results[nodeid] = TestResult("skipped", message)
        elif outcome == "failed":
            kind = "failed" if when == "call" else "error"
            if held is None or held.outcome in {"passed", "skipped"}:
                results[nodeid] = TestResult(kind, message)
        elif when == "call" and held is None:
            results[nodeid] = TestResult("passed")
    return results


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith(("E ", "ERROR ")) or "Error" in line:
            return line.strip()[:300]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _processes_mentioning(marker: str) -> list[int]:
    """Pids (not ours) whose command line names ``marker`` (the run's private temp dir)."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def _stop_leftovers(group: int, marker: str) -> None:
    """The file's process group, then anything still naming its temp dir (Ray processes)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    for pid in _processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _outbound_address() -> str | None:
    """The address this machine's Ray would take as its node IP (``primary_ip``, as Ray's
    ``get_node_ip_address``), so the same address can exist inside a network namespace;
    None when that is loopback anyway."""
    address = primary_ip()
    return None if address.startswith("127.") else address


def _network_setup(ip: str, address: str | None) -> str:
    """Shell lines that give a new network namespace its loopback and, when the machine has
    one, its outbound address (on ``lo``, with a default route through it): Ray finds its node
    IP by routing towards 8.8.8.8, and its tests bind fixed ports (52365, 6379, 8265, 10001)
    that may now be taken once per namespace instead of once per machine."""
    lines = [f"{ip} link set lo up"]
    if address is not None:
        lines += [
            f"{ip} addr add {address}/32 dev lo",
            f"{ip} route add default dev lo src {address}",
        ]
    return " && ".join(lines)


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """Run the file in PID (and network) namespaces of its own when the machine allows it.

    Ray's tests clean up machine-wide: ``ray stop`` (the ``call_ray_start`` fixtures) kills
    every raylet, GCS, worker and ``*monitor.py`` process it can see, and
    ``make_sure_dashboard_http_port_unused`` every process on port 52365.  In a namespace
    they see only the file's own processes (other Ray clusters on the machine, this bench
    included, are safe), and everything left when the file ends dies with it.  With its own
    network namespace too, files can run side by side (``--jobs``): each has the fixed ports
    to itself.  Empty when the machine allows neither."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    base = (unshare, "--pid", "--fork", "--mount-proc", "--kill-child")
    candidates: list[tuple[str, ...]] = []
    ip = shutil.which("ip")
    if ip is not None:
        setup = _network_setup(ip, _outbound_address())
        candidates.append((*base, "--net", "sh", "-c", f'{setup} && exec "$@"', "sh"))
    candidates.append(base)
    for prefix in candidates:
        probe = subprocess.run([*prefix, "true"], capture_output=True, check=False, timeout=30)
        if probe.returncode == 0:
            return prefix
    return ()


def network_isolated(prefix: Sequence[str]) -> bool:
    return "--net" in prefix


def keep_session_logs(ray_tmp: pathlib.Path, dest: pathlib.Path) -> None:
    """Every Ray session's ``logs`` directory under ``ray_tmp`` (the GCS's, raylets', workers'
    and the client server's own files), copied to ``dest`` before the temp dir goes: where the
    cause of a miss is when the test's output only says a process failed."""
    shutil.rmtree(dest, ignore_errors=True)
    for logs in sorted(ray_tmp.glob("**/logs")):
        if logs.is_dir() and not logs.is_symlink():
            target = dest / logs.parent.relative_to(ray_tmp)
            shutil.copytree(logs, target / "logs", symlinks=True, ignore_dangling_symlinks=True)


@contextlib.contextmanager
def account_home_guard(home: pathlib.Path | None = None) -> Iterator[None]:
    """Undo what a test file writes under the account's real ``~/.ray``.

    ``HOME`` points at a scratch dir, but some of Ray's files start drivers with a bare
    environment (no ``HOME``), and Ray then falls back to the password database's home:
    ``test_output.py`` left ``/root/.ray/auth_token`` behind, which later turned token
    auth on for every ``ray`` on the machine. Entries that were there before are kept."""
    dot_ray = (home or pathlib.Path(pwd.getpwuid(os.getuid()).pw_dir)) / ".ray"
    existed = dot_ray.exists()
    before = {p.name for p in dot_ray.iterdir()} if dot_ray.is_dir() else set()
    try:
        yield
    finally:
        if not existed:
            shutil.rmtree(dot_ray, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                dot_ray.unlink()
        elif dot_ray.is_dir():
            for entry in dot_ray.iterdir():
                if entry.name not in before:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)


def run_file(
    venv: venvs.Venv,
    test_file: str,
    *,
    test_timeout_s: int = 120,
    file_timeout_s: float = 1800.0,
    extra_args: Sequence[str] = (),
    log_dir: pathlib.Path | None = None,
    keep_sessions: pathlib.Path | None = None,
) -> FileRun:
    """One test file in ``venv``, in its own session and temp dir; never raises for test
    failures (they are the result)."""
    target = tests_dir(venv) / test_file
    with (
        account_home_guard(),
        tempfile.TemporaryDirectory(prefix="ray-suite-") as scratch,
    ):
        root = pathlib.Path(scratch)
        (root / f"{PLUGIN_NAME}.py").write_text(PLUGIN_SOURCE)
        outcomes = root / "outcomes.jsonl"
        outcomes.touch()
        ray_tmp = root / "ray"
        ray_tmp.mkdir()
        home = root / "home"  # Ray 2.60's ray.init() writes ~/.ray/auth_token
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            PATH=f"{venv.path / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            # the tests' own directory too, as Ray's CI has it: workers import classes
            # defined at a test module's top level by module name (test_actor_retry.py)
            PYTHONPATH=os.pathsep.join((str(root), str(tests_dir(venv)))),
            GCS_RAY_SUITE_OUTCOMES=str(outcomes),
            RAY_TMPDIR=str(ray_tmp),
            HOME=str(home),
            TMPDIR=str(root),
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONUNBUFFERED="1",
        )
        cmd = [
            *isolation_prefix(),
            str(venv.python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            PLUGIN_NAME,
            "-q",
            "-rfE",
            f"--timeout={test_timeout_s}",
            *extra_args,
            str(target),
        ]
        started = time.monotonic()
        log_path = (log_dir or root) / f"{pathlib.Path(test_file).stem}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as output:
            proc = subprocess.Popen(
                cmd,
                cwd=root,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=file_timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _stop_leftovers(proc.pid, scratch)
                proc.wait()
        text = log_path.read_text(errors="replace")
        duration = time.monotonic() - started
        tests = fold_outcomes(outcomes.read_text().splitlines())
        if keep_sessions is not None and (
            timed_out or any(t.outcome in ("failed", "error") for t in tests.values())
        ):
            keep_session_logs(ray_tmp, keep_sessions / pathlib.Path(test_file).stem)
    note = ""
    if timed_out:
        note = f"file timed out after {file_timeout_s:.0f} s"
    elif not tests:
        note = _first_error_line(text) or f"pytest exited {proc.returncode}, no test ran"
    return FileRun(tests, duration, None if timed_out else proc.returncode, timed_out, note)


# -- selection, results, report ------------------------------------------------------------


def all_test_files(source: pathlib.Path = SUITE_SOURCE) -> list[str]:
    return sorted(p.name for p in (source / "python" / "ray" / "tests").glob("test_*.py"))


def select_files(patterns: Sequence[str], source: pathlib.Path = SUITE_SOURCE) -> list[str]:
    """Names or globs (``test_placement_group*.py``); none = every file not excluded."""
    files = all_test_files(source)
    if not patterns:
        return [f for f in files if f not in EXCLUDED]
    chosen: list[str] = []
    for pattern in patterns:
        name = pathlib.Path(pattern).name
        matched = [f for f in files if fnmatch.fnmatch(f, name)]
        if not matched:
            raise SystemExit(f"ray_suite: no test file matches {pattern!r}")
        chosen += [f for f in matched if f not in chosen]
    return chosen


class Results:
    """``{"files": {file: {side: FileRun}}}``, written after every file."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.files: dict[str, dict[str, FileRun]] = {}
        self._lock = threading.Lock()  # --jobs: runs end on several threads
        if path.is_file():
            doc = json.loads(path.read_text())
            for name, sides in doc.get("files", {}).items():
                self.files[name] = {s: FileRun.from_json(r) for s, r in sides.items()}

    def get(self, name: str, side: str) -> FileRun | None:
        return self.files.get(name, {}).get(side)

    def put(self, name: str, side: str, run: FileRun) -> None:
        with self._lock:
            self._put(name, side, run)

    def _put(self, name: str, side: str, run: FileRun) -> None:
        self.files.setdefault(name, {})[side] = run
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "files": {
                n: {s: r.to_json() for s, r in sides.items()}
                for n, sides in sorted(self.files.items())
            }
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(temporary, self.path)


@dataclass
class Summary:
    stock_passing: int = 0
    ours_passing: int = 0
    files: int = 0
    misses: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    """(test, ours outcome, first line of its error)."""

    @property
    def share(self) -> float:
        return self.ours_passing / self.stock_passing if self.stock_passing else 0.0


def _fmt(counts: dict[str, int]) -> str:
    return (
        f"{counts['passed']:>3} {counts['failed']:>3} {counts['error']:>3} {counts['skipped']:>3}"
    )


def report(results: Results, names: Sequence[str]) -> tuple[str, Summary]:
    """The table over ``names`` (files with a stock run), and its summary."""
    summary = Summary()
    rows = [
        f"{'file':<44} {'stock P   F   E   S':>19}   {'ours P   F   E   S':>18}   ours/stock",
    ]
    for name in names:
        stock, ours = results.get(name, "stock"), results.get(name, "ours")
        if stock is None:
            continue
        passing = [t for t, r in stock.tests.items() if r.outcome == "passed"]
        ours_cell = _fmt(ours.counts()) if ours is not None else "  (not run)    "
        kept = 0
        if ours is not None:
            for test in passing:
                result = ours.tests.get(test)
                if result is not None and result.outcome == "passed":
                    kept += 1
                else:
                    outcome = result.outcome if result else "not run"
                    message = result.message if result else (ours.note or "did not run")
                    summary.misses.append((test, outcome, message))
        if passing and ours is not None:
            summary.files += 1
            summary.stock_passing += len(passing)
            summary.ours_passing += kept
        share = f"{kept}/{len(passing)}" if ours is not None else "-"
        notes = "; ".join(
            f"{side}: {run.note}"
            for side, run in (("stock", stock), ("ours", ours))
            if run and run.note
        )
        rows.append(
            f"{name:<44} {_fmt(stock.counts())}   {ours_cell}   {share:>9}"
            + (f"   [{notes}]" if notes else "")
        )
    rows.append("")
    rows.append(
        f"files with a stock-passing test, run on both sides: {summary.files}; "
        f"stock-passing tests: {summary.stock_passing}; passing on ours: "
        f"{summary.ours_passing} ({100 * summary.share:.1f}%)"
    )
    if summary.misses:
        rows.append("")
        rows.append("stock-passing tests that do not pass on ours (cause: first error line):")
        for test, outcome, message in summary.misses:
            rows.append(f"  {test}  [{outcome}] {message}")
    return "\n".join(rows), summary


def markdown(results: Results, names: Sequence[str], every_file: Sequence[str]) -> str:
    """The cumulative table as markdown (for docs/drop-in.md): per file stock-passing and
    passing on ours, each miss with its cause, the share, and the files not run and why."""
    text, summary = report(results, names)
    del text
    lines = [
        "| file | stock: passed / failed / errors / skipped | ours: passed / failed / errors "
        "/ skipped | stock-passing tests passing on ours |",
        "|---|---|---|---|",
    ]
    no_tests: list[str] = []
    for name in names:
        stock, ours = results.get(name, "stock"), results.get(name, "ours")
        if stock is None or ours is None:
            continue
        if not stock.tests:
            no_tests.append(f"`{name}` ({stock.note.split(' while ')[0] or 'no test collected'})")
            continue
        passing = [t for t, r in stock.tests.items() if r.outcome == "passed"]
        kept = sum(
            1
            for t in passing
            if ours.tests.get(t) is not None and ours.tests[t].outcome == "passed"
        )
        sc, oc = stock.counts(), ours.counts()
        lines.append(
            f"| `{name}` | {sc['passed']} / {sc['failed']} / {sc['error']} / {sc['skipped']} "
            f"| {oc['passed']} / {oc['failed']} / {oc['error']} / {oc['skipped']} "
            f"| {kept} / {len(passing)} |"
        )
    lines.append(
        f"| **{summary.files} files** | | | **{summary.ours_passing} / {summary.stock_passing} "
        f"({100 * summary.share:.1f}%)** |"
    )
    if summary.misses:
        lines += ["", "Stock-passing tests that do not pass on ours (first error line):", ""]
        lines += [
            f"- `{t.split('::', 1)[-1]}` ({t.split('::')[0].rsplit('/', 1)[-1]}, "
            f"{o}): {m or '(no message)'}"
            for t, o, m in summary.misses
        ]
    if no_tests:
        lines += ["", "Run, but no test ran on stock either: " + ", ".join(no_tests) + "."]
    not_run = [
        f for f in every_file if results.get(f, "stock") is None or results.get(f, "ours") is None
    ]
    left_out = [f"`{f}` ({EXCLUDED[f]})" for f in not_run if f in EXCLUDED]
    not_yet = [f"`{f}`" for f in not_run if f not in EXCLUDED]
    if left_out:
        lines += ["", f"Left out ({len(left_out)} files): " + ", ".join(left_out) + "."]
    if not_yet:
        lines += ["", f"Not run yet ({len(not_yet)} files): " + ", ".join(not_yet) + "."]
    return "\n".join(lines)


def _load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _iter_work(
    files: Sequence[str], sides: Sequence[str], results: Results, rerun: set[str]
) -> Iterator[tuple[str, str]]:
    for name in files:
        for side in sides:
            if side in rerun or results.get(name, side) is None:
                yield name, side


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files or globs (default: every file)")
    parser.add_argument(
        "--files-from",
        type=pathlib.Path,
        default=None,
        help="more names / globs, one a line (keeps them off the command line, where Ray's "
        "`ray stop` would match e.g. test_monitor.py as a monitor.py process)",
    )
    parser.add_argument("--sides", default="stock,ours", help="stock,ours (default both)")
    parser.add_argument("--results", type=pathlib.Path, default=DEFAULT_RESULTS)
    parser.add_argument(
        "--rerun",
        default="",
        help="sides to run again even when the results hold them (e.g. ours)",
    )
    parser.add_argument("--timeout", type=int, default=120, help="per-test timeout, s")
    parser.add_argument("--file-timeout", type=float, default=1800.0, help="per-file limit, s")
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="files run side by side, each in network and PID namespaces of its own "
        "(default 1; stock and ours of one file may run together)",
    )
    parser.add_argument("--logs", type=pathlib.Path, default=None, help="keep pytest output here")
    parser.add_argument(
        "-k",
        default="",
        help="pytest's -k: only the matching tests; their outcomes replace theirs in the "
        "file's record and the rest are kept (with --rerun: finish a file cut off at its "
        "time limit, or run a miss again)",
    )
    parser.add_argument(
        "--keep-sessions",
        type=pathlib.Path,
        default=None,
        help="copy the Ray session logs of a file with a failed test here (per side and file)",
    )
    parser.add_argument("--report", action="store_true", help="print the table only")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="with --report: the cumulative table over every file in the results, as markdown",
    )
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"--sides: unknown {sorted(unknown)}; use stock and/or ours")
    patterns = list(args.files)
    if args.files_from is not None:
        try:
            patterns += [line.strip() for line in args.files_from.read_text().splitlines()]
        except OSError as err:
            parser.error(f"--files-from {args.files_from}: {err.strerror}")
    files = select_files([p for p in patterns if p and not p.startswith("#")])
    results = Results(args.results)
    rerun = {s.strip() for s in args.rerun.split(",") if s.strip()}
    if args.report and args.markdown:
        every_file = all_test_files()
        print(markdown(results, [f for f in every_file if f in results.files], every_file))
        return 0
    if not args.report:
        if args.jobs > 1 and not network_isolated(isolation_prefix()):
            parser.error(
                f"--jobs {args.jobs}: files can share the machine only in network namespaces "
                "of their own (unshare --net and ip), which this machine does not allow"
            )
        venv_by_side = {side: prepare(side) for side in sides}
        work = list(_iter_work(files, sides, results, rerun))
        print(
            f"ray_suite: {len(work)} runs to do, {args.jobs} at a time, "
            f"load average {_load_average()}",
            flush=True,
        )
        done = iter(range(1, len(work) + 1))
        printing = threading.Lock()

        def run_one(name: str, side: str) -> None:
            side_logs = args.logs / side if args.logs else None
            if side_logs:
                side_logs.mkdir(parents=True, exist_ok=True)
            run = run_file(
                venv_by_side[side],
                name,
                test_timeout_s=args.timeout,
                file_timeout_s=args.file_timeout,
                log_dir=side_logs,
                keep_sessions=args.keep_sessions / side if args.keep_sessions else None,
                extra_args=("-k", args.k) if args.k else (),
            )
            earlier = results.get(name, side)
            if args.k and earlier is not None:
                run = earlier.merged(run)
            results.put(name, side, run)
            c = run.counts()
            with printing:
                print(
                    f"[{next(done)}/{len(work)}] {side:<5} {name}: {c['passed']} passed, "
                    f"{c['failed']} failed, {c['error']} errors, {c['skipped']} skipped in "
                    f"{run.duration_s:.0f} s (load {_load_average()})"
                    f"{'  ' + run.note if run.note else ''}",
                    flush=True,
                )

        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for future in [pool.submit(run_one, name, side) for name, side in work]:
                future.result()
    table, _summary = report(results, files)
    print(table)
    print(f"\nload average now {_load_average()}")
    excluded = [f for f in all_test_files() if f in EXCLUDED and f not in files]
    if excluded and not args.files:
        print("left out: " + ", ".join(f"{f} ({EXCLUDED[f]})" for f in excluded))
    return 0


if __name__ == "__main__":
    sys.exit(main())
