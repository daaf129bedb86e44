"""scripts/image.sh: the image the manifests in deploy/ run, its reference in one place
(deploy/IMAGE).  docker is not needed: a stand-in client records what would be run."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "image.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


def _copy(tmp: Path) -> Path:
    shutil.copytree(ROOT / "deploy", tmp / "deploy")
    shutil.copytree(ROOT / "scripts", tmp / "scripts")
    return tmp


def test_every_manifest_names_the_one_image() -> None:
    """Each gcs container in deploy/ is the reference in deploy/IMAGE (none is `:latest`)."""
    assert _run(ROOT, "check").returncode == 0
    image = (ROOT / "deploy" / "IMAGE").read_text().strip()
    named = [
        line.split("image:")[1].split("#")[0].strip()
        for path in (ROOT / "deploy").rglob("*.yaml")
        for line in path.read_text().splitlines()
        if re.search(r"image:\s*\S*gcs:", line)
    ]
    assert named and set(named) == {image}
    assert not image.endswith(":latest")


def test_set_rewrites_every_manifest_and_check_catches_drift(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    done = _run(root, "set", "registry.local:5000/team/gcs:1.2.3")
    assert done.returncode == 0, done.stderr
    assert (root / "deploy" / "IMAGE").read_text() == "registry.local:5000/team/gcs:1.2.3\n"
    manifest = root / "deploy" / "kuberay" / "gcs.yaml"
    assert "image: registry.local:5000/team/gcs:1.2.3  # gcs image" in manifest.read_text()
    manifest.write_text(manifest.read_text().replace("team/gcs:1.2.3", "team/gcs:9"))
    drift = _run(root, "check")
    assert drift.returncode == 1 and "names registry.local:5000/team/gcs:9" in drift.stderr
    assert _run(root, "set", "not a reference").returncode == 2


def test_build_tags_the_checkout_with_the_reference(tmp_path: Path) -> None:
    """`build` runs `docker build -t <deploy/IMAGE> <checkout>` (DOCKER picks the client)."""
    log = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    image = (ROOT / "deploy" / "IMAGE").read_text().strip()
    assert _run(ROOT, "build", DOCKER=str(fake)).returncode == 0
    assert _run(ROOT, "push", DOCKER=str(fake)).returncode == 0
    assert log.read_text().splitlines() == [f"build -t {image} {ROOT}", f"push {image}"]
