"""ruff's default rules and lines of at most 120 columns (pyproject.toml), in the fast tier as in CI."""

import shutil
import subprocess

import pytest
from conftest import REPO


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is missing: pip install -e '.[test]' installs the pinned version")
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
