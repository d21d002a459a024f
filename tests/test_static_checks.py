"""mypy --strict stays clean on elastic/ and sim/, and ruff on them and on tests/ (part of
the one test command): a test that asserts a constant (ruff's PLW0129) fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mypy_strict_is_clean() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=590
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.timeout(120)
def test_ruff_is_clean_on_elastic_sim_and_tests() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "elastic", "sim", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "elastic", "sim", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stdout[-4000:]
