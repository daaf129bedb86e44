"""``python -m gcs ...`` as a real process, without paying the interpreter's start-up and
the CLI's imports for each command (~0.3 of a command's ~0.45 CPU s on this machine).

A zygote (``python -m tests.forked_cli``, started once per pytest worker: the ``gcs_cli``
fixture) imports the command line and every subcommand's module, then forks a child per
command.  The child is a real process: its own pid, environment, working directory, stdin
on ``/dev/null``, stdout and stderr on files, exit status from ``SystemExit`` or a
traceback as the interpreter prints it, ``atexit`` run; it runs ``gcs/__main__.py`` as
``python -m gcs`` does.  What it does not redo is what no command depends on: the
interpreter's start-up (so ``PYTHON*`` variables in a command's environment are not read)
and the imports, done before the fork with no environment variable read at import
(``tests/unit/test_forked_cli.py`` checks the package for reads at import and compares
a few commands with ``python -m gcs``).

For tests of what a command prints and exits with.  A test that signals the process, reads
its output while it runs, or checks what it imports starts ``python -m gcs`` itself.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELOAD = (
    "gcs.cli.main",
    "gcs.cli.status",
    "gcs.cli.json_output",
    "gcs.sdk",
    "gcs.server",  # what `gcs serve` imports when it runs
    "gcs.server.extras",
    "gcs.server.logging",
    "gcs.store.factory",
)
"""Imported before any fork, with every subcommand's module (``GcsGroup.lazy_commands``)."""


class ForkedCli:
    """Runs ``gcs`` commands as children of one zygote process (one command at a time)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="gcs-forked-cli-")
        self._log = Path(self._tmp.name, "zygote.log")
        with self._log.open("wb") as log:  # not a terminal: nothing imported sees one
            self._zygote = subprocess.Popen(
                [sys.executable, "-m", "tests.forked_cli"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={k: v for k, v in os.environ.items() if not k.startswith(("GCS_", "RAY_"))},
            )
        ready = self._readline(timeout=120)
        assert ready == {"ready": True}, (ready, self._log.read_text())

    def run(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run([sys.executable, "-m", "gcs", *argv], capture_output=True,
        text=True, stdin=DEVNULL, env=env, cwd=cwd, timeout=timeout)``, forked."""
        out, err = Path(self._tmp.name, "stdout"), Path(self._tmp.name, "stderr")
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "stdout": str(out),
            "stderr": str(err),
        }
        assert self._zygote.stdin is not None
        self._zygote.stdin.write(json.dumps(request).encode() + b"\n")
        self._zygote.stdin.flush()
        pid = self._readline(timeout=30)["pid"]
        try:
            done = self._readline(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._readline(timeout=30)
            raise subprocess.TimeoutExpired(["gcs", *argv], timeout) from None
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "gcs", *argv],
            done["returncode"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
        )

    def _readline(self, *, timeout: float) -> dict[str, object]:
        assert self._zygote.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._zygote.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise subprocess.TimeoutExpired("tests.forked_cli", timeout)
        line = self._zygote.stdout.readline()
        if not line:
            code = self._zygote.wait()
            raise RuntimeError(f"the CLI zygote exited ({code}): {self._log.read_text()}")
        reply: dict[str, object] = json.loads(line)
        return reply

    def close(self) -> None:
        assert self._zygote.stdin is not None
        self._zygote.stdin.close()
        try:
            self._zygote.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._zygote.kill()
            self._zygote.wait()
        self._tmp.cleanup()


def _zygote() -> None:
    import importlib
    import runpy

    import click

    from gcs.cli.main import main

    for module in PRELOAD:
        importlib.import_module(module)
    with click.Context(main) as ctx:
        for name in main.list_commands(ctx):
            main.get_command(ctx, name)
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the command's process: SystemExit or a traceback ends it
            reply.close()
            os.dup2(devnull, 0)
            sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's own stdin
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            os.close(devnull)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = ["gcs", *request["argv"]]
            runpy.run_module("gcs", run_name="__main__", alter_sys=True)
            sys.exit(0)
        reply.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    _zygote()
