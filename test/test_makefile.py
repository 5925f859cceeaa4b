"""The Makefile and .ci/run do what the README says, read through `make -n` (nothing is run)."""

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


def _pytest_lines(tmp_path: Path, *arguments: str) -> list[str]:
    return [line for line in _dry_run(tmp_path, *arguments) if ' -m pytest ' in line]


def test_make_test_bounds_the_learning_tests_whatever_ci_says(tmp_path):
    """A newcomer's `make test` must not run the learning tests at full length (36 min
    on 2 cores): bounded by default, and CI gets exactly the same command."""
    plain = _pytest_lines(tmp_path, 'test')
    assert len(plain) == 1 and plain[0].startswith('UNILAB_LEARNING=bounded '), plain
    assert ' -m learning' not in plain[0]
    for ci in ('CI=true', 'CI=', 'CI=0'):
        assert _pytest_lines(tmp_path, 'test', ci) == plain, ci


def test_make_test_learning_runs_the_learning_tests_at_full_length(tmp_path):
    lines = _pytest_lines(tmp_path, 'test-learning')
    assert len(lines) == 1, lines
    assert lines[0].startswith('UNILAB_LEARNING=full ') and ' -m learning' in lines[0], lines


def test_ci_runs_what_make_test_runs():
    script = (PACKAGE_ROOT / '.ci' / 'run').read_text()
    commands = [line.strip() for line in script.splitlines()
                if line.strip() and not line.lstrip().startswith('#')]
    assert commands[-1] == 'make test', commands[-1]
    assert 'UNILAB_LEARNING' not in script


def test_every_learning_test_reads_unilab_learning_the_same_way():
    """One variable, one reading: a module that bounds its learning run by another name
    (the old UNILAB_CI) would run at full length under `make test`."""
    line = 'CI = os.environ.get("UNILAB_LEARNING", "bounded").strip().lower() != "full"'
    modules = sorted((PACKAGE_ROOT / 'test').glob('test_*.py'))
    bounded = [path.name for path in modules if 'UNILAB_LEARNING' in path.read_text()
               and path.name != Path(__file__).name]
    assert {'test_end_to_end.py', 'test_fault_injection.py', 'test_general_config.py',
            'test_learning_inprocess.py', 'test_robot_learning.py'} <= set(bounded)
    for name in bounded:
        assert line in (PACKAGE_ROOT / 'test' / name).read_text().splitlines(), name
    stale = [path.name for path in modules
             if 'UNILAB_CI' in path.read_text() and path.name != Path(__file__).name]
    assert not stale, stale


@pytest.mark.parametrize('cuda, backend', [(None, 'cpu'), ('12.4', 'cuda12'), ('13.0', 'cuda13'),
                                           ('11.8', 'cpu')])
def test_setup_installs_the_mlx_backend_the_nvidia_driver_runs(tmp_path, monkeypatch, cuda,
                                                               backend):
    """An NVIDIA driver's CUDA version picks mlx[cuda13] / mlx[cuda12]; none: mlx[cpu]."""
    if os.uname().sysname != 'Linux':
        pytest.skip('the backend extra is Linux only')
    fake = tmp_path / 'bin'
    fake.mkdir()
    if cuda is not None:
        smi = fake / 'nvidia-smi'
        smi.write_text(f'#!/bin/sh\necho "| NVIDIA-SMI 580.65  Driver Version: 580.65  '
                       f'CUDA Version: {cuda}     |"\n')
        smi.chmod(0o755)
    # Only the fake (or no) nvidia-smi: a machine's real one must not decide the test.
    path = [str(fake)] + [d for d in os.environ['PATH'].split(os.pathsep)
                          if not (Path(d) / 'nvidia-smi').exists()]
    monkeypatch.setenv('PATH', os.pathsep.join(path))
    install = [line for line in _dry_run(tmp_path, 'setup') if 'requirements-dev.txt' in line]
    pin = next(line for line in (PACKAGE_ROOT / 'requirements.txt').read_text().splitlines()
               if line.startswith('mlx=='))
    assert len(install) == 1 and install[0].endswith(f"'mlx[{backend}]{pin[3:]}'"), install
