"""A real `colcon build` of this package installs what `ros2 run` and `ros2 launch` need.

The build goes to a temporary folder (build, install and log bases), so the repository
is left untouched. No ROS distro is needed: colcon-ros builds ament_python packages with
the Python that runs colcon (requirements-dev.txt).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = 'unilab_ros'
EXECUTABLES = ('trainer_node', 'policy_node', 'gym_env_node', 'sim_train', 'pendulum_demo')
BUILD_TIMEOUT_S = 60


@pytest.fixture(scope='module')
def install_prefix(tmp_path_factory):
    pytest.importorskip('colcon_core', reason='colcon is in requirements-dev.txt')
    tmp = tmp_path_factory.mktemp('colcon')
    env = dict(os.environ, COLCON_LOG_PATH=str(tmp / 'log'))
    # The repository root is the package, so the crawl stops there and never walks
    # into .venv; colcon runs setup.py with the interpreter that runs colcon.
    result = subprocess.run(
        [
            sys.executable, '-m', 'colcon', 'build',
            '--base-paths', str(REPO),
            '--packages-select', PACKAGE,
            '--build-base', str(tmp / 'build'),
            '--install-base', str(tmp / 'install'),
            '--event-handlers', 'console_cohesion+',
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / 'install' / PACKAGE


def test_executables_land_where_ros2_run_looks(install_prefix):
    for name in EXECUTABLES:
        path = install_prefix / 'lib' / PACKAGE / name
        assert path.is_file(), f'{path} missing'
        assert os.access(path, os.X_OK), f'{path} not executable'


def test_package_is_registered_in_the_ament_index(install_prefix):
    share = install_prefix / 'share'
    assert (share / 'ament_index' / 'resource_index' / 'packages' / PACKAGE).is_file()
    assert (share / PACKAGE / 'package.xml').is_file()


@pytest.mark.parametrize('folder, pattern', [('launch', '*.launch.py'), ('config', '*.yaml')])
def test_every_launch_and_config_file_is_installed(install_prefix, folder, pattern):
    in_repo = sorted(path.name for path in (REPO / folder).glob(pattern))
    installed = sorted(
        path.name for path in (install_prefix / 'share' / PACKAGE / folder).glob(pattern)
    )
    assert in_repo, f'no {folder}/{pattern} in the repository'
    assert installed == in_repo


def test_every_python_package_is_installed(install_prefix):
    site_packages = list(install_prefix.glob('lib/python3*/site-packages'))
    assert len(site_packages) == 1, site_packages
    # Every folder of modules must be a package (an __init__.py) for find_packages.
    in_repo = {str(module.parent.relative_to(REPO)) for module in (REPO / PACKAGE).rglob('*.py')}
    installed = {
        str(init.parent.relative_to(site_packages[0]))
        for init in (site_packages[0] / PACKAGE).rglob('__init__.py')
    }
    assert installed == in_repo
