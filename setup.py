"""Build hook: compile ``protos/`` into ``gcs/proto/*_pb2.py`` (generated, never committed)."""

from __future__ import annotations

import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent


def compile_protos() -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system.requires)

    proto_root = ROOT / "protos"
    sources = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed: " + " ".join(args))


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


if __name__ == "__main__" and sys.argv[1:] == ["--protos-only"]:
    compile_protos()  # for git worktrees and CI: regenerate without reinstalling
else:
    setup(cmdclass={"build_py": BuildPyWithProtos})
