"""``bench/ray_suite.py``'s cumulative table: results kept on disk across runs, shown per file
with the share of stock-passing tests that pass on ours, each miss with its cause, and the
files not run with the reason (no Ray is run here)."""

from __future__ import annotations

import pathlib

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
