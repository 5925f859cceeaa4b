"""The whole package passes the one linter configuration (ruff.toml)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    result = subprocess.run(
        [sys.executable, '-m', 'ruff', 'check', '--no-cache', str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
