"""``gcs install-into-ray``: a launcher of ``gcs-server`` in place of a Ray install's
``gcs_server``, Ray's binary kept beside it; idempotent, reversible, one-line errors."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gcs.cli.dropin.install import InstallError, install, is_launcher, locate, uninstall
from gcs.cli.main import main as gcs_cli

RAY_BINARY = b"\x7fELF fake gcs_server"


def fake_ray(tmp_path: pathlib.Path, version: str = "2.60.0") -> str:
    """A Ray "install": ``ray/_version.py`` and the binary, and an interpreter that answers
    the probe the way a real one would (the package directory, then its Python version)."""
    package = tmp_path / "site-packages" / "ray"
    binary_dir = package / "core" / "src" / "ray" / "gcs"
    binary_dir.mkdir(parents=True)
    (package / "_version.py").write_text(f'version = "{version}"\ncommit = "abc"\n')
    (binary_dir / "gcs_server").write_bytes(RAY_BINARY)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {package}\necho 3.11.7\n")
    python.chmod(0o755)
    return str(python)


class TestInstall:
    def test_install_keeps_rays_binary_and_the_launcher_runs_gcs_server(self, tmp_path) -> None:
        ray = locate(fake_ray(tmp_path))
        assert ray.ray_version == "2.60.0" and ray.python_version == "3.11.7"
        message = install(ray)
        assert message.startswith("installed: ") and "gcs_server.ray-original" in message
        assert ray.original.read_bytes() == RAY_BINARY
        assert is_launcher(ray.binary)
        text = ray.binary.read_text()
        assert "GCS_PYTHON_VERSION=3.11.7" in text and sys.executable in text
        # Ray execs the file with its own arguments: it must reach our gcs-server
        proc = subprocess.run(
            [str(ray.binary), "--version"], check=False, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("gcs-server ") and "2.60.0" in proc.stdout
        bad = subprocess.run(
            [str(ray.binary), "--no_such_flag=1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 1
        assert bad.stderr.strip() == "ERROR: unknown command line flag 'no_such_flag'"

    def test_installing_again_is_a_no_op_and_uninstall_restores(self, tmp_path) -> None:
        ray = locate(fake_ray(tmp_path))
        install(ray)
        assert install(ray).startswith("already installed: ")
        assert ray.original.read_bytes() == RAY_BINARY
        assert uninstall(ray).startswith("uninstalled: ")
        assert ray.binary.read_bytes() == RAY_BINARY and not ray.original.exists()
        assert uninstall(ray).startswith("not installed: ")

    def test_a_reinstalled_ray_binary_replaces_the_kept_one(self, tmp_path) -> None:
        """``pip install --force-reinstall ray`` puts a fresh binary over the launcher."""
        ray = locate(fake_ray(tmp_path))
        install(ray)
        ray.binary.write_bytes(b"\x7fELF newer")
        install(ray)
        assert ray.original.read_bytes() == b"\x7fELF newer" and is_launcher(ray.binary)


class TestRefusals:
    def test_other_ray_versions_are_refused(self, tmp_path) -> None:
        with pytest.raises(InstallError, match=r"ray 2\.9\.0 at .*: gcs-server is a drop-in"):
            locate(fake_ray(tmp_path, version="2.9.0"))

    def test_missing_interpreter(self, tmp_path) -> None:
        with pytest.raises(InstallError, match="no such interpreter"):
            locate(str(tmp_path / "nope"))

    def test_interpreter_without_ray(self) -> None:
        with pytest.raises(InstallError, match="the ray package is not installed there"):
            locate(sys.executable)

    def test_launcher_without_rays_binary_is_reported(self, tmp_path) -> None:
        ray = locate(fake_ray(tmp_path))
        install(ray)
        ray.original.unlink()
        with pytest.raises(InstallError, match="Ray's binary is missing"):
            uninstall(ray)
        with pytest.raises(InstallError, match="Ray's binary is missing"):
            install(ray)

    def test_cli_is_one_line_either_way(self, tmp_path) -> None:
        python = fake_ray(tmp_path)
        runner = CliRunner()
        ok = runner.invoke(gcs_cli, ["install-into-ray", "--ray-python", python])
        assert ok.exit_code == 0 and ok.output.count("\n") == 1 and "installed:" in ok.output
        back = runner.invoke(gcs_cli, ["install-into-ray", "--ray-python", python, "--uninstall"])
        assert back.exit_code == 0 and "uninstalled:" in back.output
        bad = runner.invoke(gcs_cli, ["install-into-ray", "--ray-python", str(tmp_path / "x")])
        assert bad.exit_code == 2  # bad input: --ray-python names no Ray
        assert bad.output.strip().count("\n") == 0 and "no such interpreter" in bad.output
