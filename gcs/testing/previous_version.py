"""The previous version of this repository as a source tree, for rolling-upgrade tests
(issue 29): a commit from git history exported (``git archive``, no worktree registered)
into a temporary directory and its protos compiled with this interpreter; run it with the
same virtualenv, its directory first on ``PYTHONPATH`` (``tests.interop.ha_cluster``)."""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
import tarfile

__all__ = ["PREVIOUS_VERSION", "ROOT", "export_previous", "missing_reason"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
"""The repository (this file is gcs/testing/previous_version.py in it)."""
PREVIOUS_VERSION = os.environ.get("GCS_UPGRADE_FROM", "05a9bd106d4df99a4c7770117c522462345e944c")
"""The last commit before the store's format record and the planned handover (format 1):
the version a group upgrades *from*.  ``GCS_UPGRADE_FROM`` names another commit."""


def missing_reason(commit: str = PREVIOUS_VERSION) -> str | None:
    """Why ``commit`` cannot be exported here (None: it can)."""
    if not (ROOT / ".git").exists():
        return f"{ROOT} is not a git checkout"
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        check=False, capture_output=True,
    )  # fmt: skip
    if found.returncode != 0:
        return (
            f"commit {commit[:12]} is not in this clone's history (a shallow clone? fetch "
            "the full history, or set GCS_UPGRADE_FROM to an older commit that is)"
        )
    return None


def export_previous(dest: pathlib.Path, commit: str = PREVIOUS_VERSION) -> pathlib.Path:
    """``commit``'s tree under ``dest``, protos compiled; returns ``dest``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        check=True, capture_output=True,
    )  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    subprocess.run(
        [sys.executable, "setup.py", "--protos-only"],
        cwd=dest, check=True, capture_output=True,
    )  # fmt: skip
    return dest
