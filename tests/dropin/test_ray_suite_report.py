"""``bench/ray_suite.py``'s cumulative table: results kept on disk across runs, shown per file
with the share of stock-passing tests that pass on ours, each miss with its cause, and the
files not run with the reason (no Ray is run here)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from bench import ray_suite
from bench.ray_suite import FileRun, Results
from bench.ray_suite import TestResult as Outcome


def _run(**outcomes: str) -> FileRun:
    return FileRun(
        tests={
            f"t.py::{name}": Outcome(o, "boom" if o == "failed" else "")
            for name, o in outcomes.items()
        },
        duration_s=1.0,
        exit_code=0,
    )


def test_results_accumulate_across_runs_and_render_as_markdown(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "results.json"
    first = Results(path)
    first.put("test_a.py", "stock", _run(x="passed", y="passed", z="failed"))
    first.put("test_a.py", "ours", _run(x="passed", y="failed", z="failed"))
    second = Results(path)  # a later run, same file on disk
    second.put("test_b.py", "stock", _run(w="passed"))
    second.put("test_b.py", "ours", _run(w="passed"))
    second.put("test_c.py", "stock", FileRun({}, 0.5, 4, note="ImportError while importing x"))
    second.put("test_c.py", "ours", FileRun({}, 0.5, 4, note="ImportError while importing x"))

    every = ["test_a.py", "test_b.py", "test_c.py", "test_d.py", "test_mpi.py"]
    text = ray_suite.markdown(Results(path), ["test_a.py", "test_b.py", "test_c.py"], every)

    assert "| `test_a.py` | 2 / 1 / 0 / 0 | 1 / 2 / 0 / 0 | 1 / 2 |" in text
    assert "| `test_b.py` | 1 / 0 / 0 / 0 | 1 / 0 / 0 / 0 | 1 / 1 |" in text
    assert "**2 / 3 (66.7%)**" in text
    assert "- `y` (t.py, failed): boom" in text
    assert "`test_c.py` (ImportError)" in text
    assert "Left out (1 files): `test_mpi.py` (MPI)." in text
    assert "Not run yet (1 files): `test_d.py`." in text


def test_a_missing_files_from_list_is_one_line_not_a_traceback(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(SystemExit) as exited:
        ray_suite.main(["--files-from", str(missing), "--report"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--files-from {missing}: No such file or directory" in err
    assert "Traceback" not in err


def test_the_compat_supplement_is_in_front_of_conftest_and_changes_the_stamp(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's tests go into the venv with the shared preamble and our supplement before its
    conftest.py; a changed supplement installs them again."""
    source = tmp_path / "src"
    (source / "python" / "ray" / "tests").mkdir(parents=True)
    (source / "python" / "ray" / "tests" / "conftest.py").write_text("# ray's conftest\n")
    (source / "conftest_compat_preamble.py").write_text("# preamble\n")
    target = tmp_path / "venv-tests"
    monkeypatch.setattr(ray_suite, "tests_dir", lambda venv: target)
    ray_suite.install_tests(None, source)  # type: ignore[arg-type]
    text = (target / "conftest.py").read_text()
    assert text.index("# preamble") < text.index("dicts_equal") < text.index("# ray's conftest")
    (target / "conftest.py").write_text("stale")
    monkeypatch.setattr(ray_suite, "COMPAT_SUPPLEMENT", "# another\n")
    ray_suite.install_tests(None, source)  # type: ignore[arg-type]
    assert "# another" in (target / "conftest.py").read_text()


def test_a_test_id_holding_a_path_into_its_venv_is_the_same_on_both_sides() -> None:
    """test_runtime_env_validation.py parametrizes over schema files in the venv: the ids of
    the two sides differed, and every such stock-passing test was counted a miss."""
    base = "test_r.py::TestV::test_env[{0}/ray/tests/a.json,{0}/ray/tests/b.json]"
    stock = base.format("/root/.cache/gcs-interop/ray-suite-stock/lib/python3.11/site-packages")
    ours = base.format("/c/gcs-interop/ray-suite-ours-f2af6c09/lib/python3.11/site-packages")
    want = base.format("<site-packages>")
    assert ray_suite.canonical_nodeid(stock) == ray_suite.canonical_nodeid(ours) == want
    lines = [f'{{"nodeid": "{ours}", "when": "call", "outcome": "passed"}}']
    assert list(ray_suite.fold_outcomes(lines)) == [want]
    plain = "test_r.py::test_plain[a,b]"
    assert ray_suite.canonical_nodeid(plain) == plain


def test_files_run_side_by_side_each_have_the_fixed_ports_to_themselves() -> None:
    """``--jobs``: two files' clusters may both bind Ray's dashboard agent port (52365) and
    Ray's node IP, because each file runs in a network namespace of its own."""
    prefix = ray_suite.isolation_prefix()
    if not ray_suite.network_isolated(prefix):
        pytest.skip("this machine allows no network namespaces (unshare --net)")
    address = ray_suite._outbound_address() or "127.0.0.1"
    bind = (
        "import socket, sys\n"
        "s = socket.socket()\n"
        f"s.bind(({address!r}, 52365))\n"
        "s.listen()\n"
        "print('bound', flush=True)\n"
        "sys.stdin.read()\n"  # holds the port until the test is done with it
    )
    procs = [
        subprocess.Popen(
            [*prefix, sys.executable, "-c", bind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "bound"
        # both hold the port at once (each blocks on its stdin until the test ends)
        assert [proc.poll() for proc in procs] == [None, None]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_namespace_set_up_gives_loopback_and_rays_node_address() -> None:
    lines = ray_suite._network_setup("/sbin/ip", "192.0.2.2").split(" && ")
    assert lines == [
        "/sbin/ip link set lo up",
        "/sbin/ip addr add 192.0.2.2/32 dev lo",
        "/sbin/ip route add default dev lo src 192.0.2.2",
    ]
    assert ray_suite._network_setup("/sbin/ip", None) == "/sbin/ip link set lo up"


@pytest.mark.parametrize(
    ("jobs", "message"), [("0", "must be at least 1, got 0"), ("two", "must be a whole number")]
)
def test_a_bad_jobs_count_is_one_line_not_a_traceback(
    jobs: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        ray_suite.main(["--jobs", jobs, "--report"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--jobs: {message}" in err
    assert "Traceback" not in err


def test_jobs_without_network_namespaces_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    monkeypatch.setattr(ray_suite, "isolation_prefix", lambda: ("unshare", "--pid"))
    with pytest.raises(SystemExit) as exited:
        ray_suite.main(["--jobs", "2", "--results", str(tmp_path / "r.json"), "test_namespace.py"])
    assert exited.value.code == 2
    assert "network namespaces of their own" in capsys.readouterr().err


def test_kept_session_logs_are_each_sessions_logs_once(tmp_path: pathlib.Path) -> None:
    ray_tmp = tmp_path / "ray"
    logs = ray_tmp / "session_2026-11-27_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "gcs_server.err").write_text("boom\n")
    (logs / "raylet.sock").symlink_to(logs / "gone")  # dangling, as Ray leaves sockets
    (ray_tmp / "session_latest").symlink_to(ray_tmp / "session_2026-11-27_1")
    dest = tmp_path / "kept" / "test_x"
    dest.mkdir(parents=True)
    (dest / "stale").write_text("from an earlier run\n")
    ray_suite.keep_session_logs(ray_tmp, dest)
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == ["session_2026-11-27_1/logs/gcs_server.err"]


def test_a_k_run_replaces_only_the_tests_it_ran() -> None:
    cut_off = FileRun(
        tests={"t.py::a": Outcome("passed"), "t.py::b": Outcome("failed", "slow")},
        duration_s=480.0,
        exit_code=None,
        timed_out=True,
        note="file timed out after 480 s",
    )
    rest = FileRun(
        tests={"t.py::b": Outcome("passed"), "t.py::c": Outcome("passed")},
        duration_s=60.0,
        exit_code=0,
    )
    merged = cut_off.merged(rest)
    assert {k: v.outcome for k, v in merged.tests.items()} == {
        "t.py::a": "passed",
        "t.py::b": "passed",
        "t.py::c": "passed",
    }
    assert (merged.duration_s, merged.exit_code, merged.timed_out, merged.note) == (
        540.0,
        0,
        False,
        "",
    )


def test_the_account_home_guard_removes_only_what_the_file_wrote(tmp_path: pathlib.Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with ray_suite.account_home_guard(fresh):
        (fresh / ".ray").mkdir()
        (fresh / ".ray" / "auth_token").write_text("t")
    assert not (fresh / ".ray").exists()

    kept = tmp_path / "kept"
    (kept / ".ray").mkdir(parents=True)
    (kept / ".ray" / "auth_token").write_text("mine")
    with ray_suite.account_home_guard(kept):
        (kept / ".ray" / "session_latest").mkdir()
        (kept / ".ray" / "other").write_text("x")
    assert sorted(p.name for p in (kept / ".ray").iterdir()) == ["auth_token"]
    assert (kept / ".ray" / "auth_token").read_text() == "mine"
