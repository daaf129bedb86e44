"""Packaging metadata that setuptools accepts without warnings (issue 20, item 10)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_expression() -> None:
    """A TOML-table `project.license` is deprecated (setuptools warns on every install and
    gives 2027-Feb-18 for it to break); the SPDX string needs setuptools >= 77."""
    doc = tomllib.loads(PYPROJECT.read_text())
    assert doc["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in doc["build-system"]["requires"]
    assert not any(c.startswith("License ::") for c in doc["project"].get("classifiers", []))
