"""Put ``gcs-server`` in place of a Ray install's ``gcs_server`` binary, reversibly.

``ray/core/src/ray/gcs/gcs_server`` (what ``ray start --head``, ``ray.init()`` and KubeRay
head pods execute) becomes a small ``/bin/sh`` launcher that ``exec``\\ s this interpreter on
:mod:`gcs.cli.dropin` with Ray's arguments (same pid, so Ray's process tracking, signals and
``PR_SET_PDEATHSIG`` fate-sharing apply to our server).  Ray's binary is kept beside it as
``gcs_server.ray-original``; ``uninstall`` puts it back.  Both steps are idempotent, and a
re-install refreshes the launcher (e.g. after this package moved).

The launcher runs Python isolated (``-I``: the Ray process's ``PYTHONPATH`` cannot shadow our
dependencies); when this package is not importable from the interpreter by itself (a source
checkout), its directory is put on ``sys.path`` by the launcher.  It also exports the Ray
interpreter's Python version (``GCS_PYTHON_VERSION``), which the GCS publishes in
``CLUSTER_METADATA`` for Ray's version check.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys
from dataclasses import dataclass

import gcs

BINARY_PARTS = ("core", "src", "ray", "gcs", "gcs_server")
"""Where the wheel keeps the GCS binary, under the ``ray`` package directory."""
ORIGINAL_SUFFIX = ".ray-original"
MARKER = "# gcs-server launcher written by `gcs install-into-ray`"
SUPPORTED_RAY = "2.60."
_PROBE = (
    "import importlib.util, pathlib, sys\n"
    "spec = importlib.util.find_spec('ray')\n"
    "if spec is None or not spec.submodule_search_locations:\n"
    "    sys.exit(3)\n"
    "print(list(spec.submodule_search_locations)[0])\n"
    "print('.'.join(map(str, sys.version_info[:3])))\n"
)


class InstallError(RuntimeError):
    """The install / uninstall cannot be done; the message is one line naming the cause."""


@dataclass(frozen=True, slots=True)
class RayInstall:
    ray_python: str
    package_dir: pathlib.Path
    python_version: str
    ray_version: str

    @property
    def binary(self) -> pathlib.Path:
        return self.package_dir.joinpath(*BINARY_PARTS)

    @property
    def original(self) -> pathlib.Path:
        return self.binary.with_name(self.binary.name + ORIGINAL_SUFFIX)


def _ray_version(package_dir: pathlib.Path) -> str:
    """``ray/_version.py``'s ``version = "..."`` (read, not imported: importing ray is slow)."""
    try:
        text = (package_dir / "_version.py").read_text(encoding="utf-8")
    except OSError:
        return ""
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "version":
            return value.strip().strip("'\"")
    return ""


def _isolated(python: str, code: str) -> subprocess.CompletedProcess[str]:
    """``python -I -c code`` from ``/`` (no working directory or ``PYTHONPATH`` on its path)."""
    return subprocess.run(
        [python, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd="/"
    )


def locate(ray_python: str) -> RayInstall:
    """The Ray install ``ray_python`` imports (without importing it)."""
    try:
        proc = _isolated(ray_python, _PROBE)
    except FileNotFoundError:
        raise InstallError(f"--ray-python {ray_python}: no such interpreter") from None
    except PermissionError:
        raise InstallError(f"--ray-python {ray_python}: not executable") from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"--ray-python {ray_python}: did not answer in 60 s") from None
    if proc.returncode == 3:
        raise InstallError(f"--ray-python {ray_python}: the ray package is not installed there")
    lines = proc.stdout.split("\n")
    if proc.returncode != 0 or len(lines) < 2:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"--ray-python {ray_python}: cannot run it ({detail})")
    package_dir = pathlib.Path(lines[0].strip())
    ray_version = _ray_version(package_dir)
    if not ray_version.startswith(SUPPORTED_RAY):
        raise InstallError(
            f"ray {ray_version or '(unknown version)'} at {package_dir}: gcs-server is a drop-in "
            f"for Ray {gcs.RAY_VERSION} only"
        )
    return RayInstall(ray_python, package_dir, lines[1].strip(), ray_version)


def is_launcher(path: pathlib.Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return head.startswith(b"#!") and MARKER.encode() in head


def _needs_path(python: str, package_root: pathlib.Path) -> bool:
    """True when ``python -I`` alone would not import this very ``gcs`` package."""
    probe = "import gcs, pathlib; print(pathlib.Path(gcs.__file__).resolve().parent.parent)"
    proc = _isolated(python, probe)
    return proc.returncode != 0 or proc.stdout.strip() != str(package_root)


def launcher_text(python: str, python_version: str, package_root: pathlib.Path | None) -> str:
    """The ``/bin/sh`` script that replaces Ray's binary."""
    if package_root is None:
        code = "import sys; from gcs.cli.dropin.main import main; sys.exit(main())"
    else:
        code = (
            f"import sys; sys.path.insert(0, {str(package_root)!r}); "
            "from gcs.cli.dropin.main import main; sys.exit(main())"
        )
    return (
        "#!/bin/sh\n"
        f"{MARKER}\n"
        f"# Ray's own binary is {BINARY_PARTS[-1]}{ORIGINAL_SUFFIX} beside this file; "
        "`gcs install-into-ray --uninstall` restores it.\n"
        f"GCS_PYTHON_VERSION={shlex.quote(python_version)}\n"
        "export GCS_PYTHON_VERSION\n"
        f'exec {shlex.quote(python)} -I -c {shlex.quote(code)} "$@"\n'
    )


def _write_executable(path: pathlib.Path, text: str) -> None:
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o755)
    os.replace(temporary, path)


def install(ray: RayInstall, python: str | None = None) -> str:
    """Install (or refresh) the launcher; returns what was done, as one line."""
    python = python or sys.executable
    binary, original = ray.binary, ray.original
    if not binary.parent.is_dir():
        raise InstallError(f"{binary.parent}: not found (is this a Ray wheel install?)")
    package_root = pathlib.Path(gcs.__file__).resolve().parent.parent
    text = launcher_text(
        python, ray.python_version, package_root if _needs_path(python, package_root) else None
    )
    try:
        if is_launcher(binary):
            if not original.exists():
                raise InstallError(
                    f"{original}: Ray's binary is missing (reinstall ray, then install again)"
                )
            refreshed = binary.read_text(encoding="utf-8") != text
            _write_executable(binary, text)
            return f"{'refreshed' if refreshed else 'already installed'}: {binary}"
        if not binary.exists():
            if not original.exists():
                raise InstallError(f"{binary}: not found (is this a Ray wheel install?)")
        else:
            os.replace(binary, original)  # a fresh Ray binary (even over an older original)
        _write_executable(binary, text)
    except PermissionError as err:
        raise InstallError(f"{err.filename}: permission denied") from None
    return f"installed: {binary} (Ray's binary kept as {original.name})"


def uninstall(ray: RayInstall) -> str:
    """Put Ray's binary back; returns what was done, as one line."""
    binary, original = ray.binary, ray.original
    try:
        if not is_launcher(binary):
            if binary.exists():
                return f"not installed: {binary} is Ray's binary"
            if not original.exists():
                raise InstallError(f"{binary}: not found (is this a Ray wheel install?)")
        elif not original.exists():
            raise InstallError(f"{original}: Ray's binary is missing (reinstall ray to restore it)")
        os.replace(original, binary)
    except PermissionError as err:
        raise InstallError(f"{err.filename}: permission denied") from None
    return f"uninstalled: {binary} is Ray's binary again"
