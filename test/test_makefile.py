"""The Makefile does what the README says, read through `make -n` (nothing is run)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _dry_run(tmp_path: Path, *arguments: str) -> list[str]:
    if shutil.which('make') is None:
        pytest.skip('make is not installed')
    # A venv of its own: the stamps of the real .venv would hide what setup does. Only
    # the arguments say which wheelhouse: .ci/run exports one, and a `make test
    # ROS2_WHEELHOUSE=...` above this passes its variables down in MAKEFLAGS.
    inherited = {'ROS2_WHEELHOUSE', 'MAKEFLAGS', 'MFLAGS', 'MAKELEVEL', 'MAKEOVERRIDES'}
    env = {key: value for key, value in os.environ.items() if key not in inherited}
    result = subprocess.run(['make', '-n', '-C', str(PACKAGE_ROOT), *arguments,
                             f'VENV={tmp_path / "venv"}'],
                            capture_output=True, text=True, timeout=60, check=True, env=env)
    return result.stdout.splitlines()


def test_setup_installs_the_ros2_wheelhouse_it_is_given(tmp_path):
    wheels = tmp_path / 'wheels'
    install = f'{tmp_path / "venv"}/bin/python -m pip install --no-deps {wheels}/*.whl'
    assert install in _dry_run(tmp_path, 'setup', f'ROS2_WHEELHOUSE={wheels}')
    assert not [line for line in _dry_run(tmp_path, 'setup') if '*.whl' in line]
