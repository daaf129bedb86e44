"""The CLI tests' forked processes (:mod:`tests.forked_cli`) behave as ``python -m gcs``.

A child forked from the zygote skips the interpreter's start-up and the imports: that is
the same process only while no import reads the environment (a command's environment is
set after them) and the command prints and exits the same.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from tests.forked_cli import ForkedCli

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV_READS = ("environ", "getenv", "environb")


def _module_level_env_reads(tree: ast.Module) -> list[int]:
    """Lines of ``os.environ`` / ``os.getenv`` run at import: the module's own statements
    and class bodies, not function bodies; a parameter's default value too, unless it is
    the live mapping itself (``environ=os.environ``, read when the function runs)."""
    lines: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for default in (*node.args.defaults, *node.args.kw_defaults):
                live = isinstance(default, ast.Attribute) and default.attr == "environ"
                if default is not None and not live:
                    visit(default)
            return
        if isinstance(node, ast.Attribute) and node.attr in ENV_READS:
            lines.append(node.lineno)
        if isinstance(node, ast.Name) and node.id in ENV_READS:
            lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return lines


def test_no_module_reads_the_environment_at_import() -> None:
    """What the zygote imports (the CLI and what it reaches) takes its settings from the
    environment when a command runs, never when the module is imported."""
    found = {}
    for path in sorted((ROOT / "gcs").rglob("*.py")):
        if "testing" in path.relative_to(ROOT).parts:
            continue  # test helpers: never imported by the zygote before a fork
        lines = _module_level_env_reads(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_checker_sees_a_read_at_import() -> None:
    source = (
        "import os\nA = os.environ.get('X')\nclass C:\n    b = os.getenv('Y')\n"
        "def f(z=os.environ['Z'], live=os.environ):\n    return os.environ['W']\n"
    )
    assert _module_level_env_reads(ast.parse(source)) == [2, 4, 5]


@pytest.mark.parametrize(
    "argv",
    [
        ("status", "--address", "127.0.0.1:1"),  # exit 1, one line on stderr
        ("vcluster", "list", "--limit", "0"),  # exit 2: a usage error from click
        ("health", "-h"),  # exit 0, help on stdout
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_forked_command_prints_and_exits_as_python_m_gcs(
    gcs_cli: ForkedCli, argv: tuple[str, ...], tmp_path: pathlib.Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GCS_", "RAY_"))}
    env["GCS_ADDRESS"] = "127.0.0.1:1"
    fresh = subprocess.run(
        [sys.executable, "-m", "gcs", *argv], capture_output=True, text=True, env=env,
        cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=120, check=False,
    )  # fmt: skip
    forked = gcs_cli.run(argv, env=env, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
