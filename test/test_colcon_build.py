"""A real `colcon build` of this package installs what `ros2 run` and `ros2 launch` need.

The build goes to a temporary folder (build, install and log bases), so the repository
is left untouched. No ROS distro is needed: colcon-ros builds ament_python packages with
the Python that runs colcon (requirements-dev.txt).
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = 'unilab_ros'
EXECUTABLES = ('trainer_node', 'policy_node', 'gym_env_node', 'sim_train', 'pendulum_demo',
               'export_bundle', 'mujoco_robot_node')
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


SMALL_RUN = """\
/**/gym_env:
  ros__parameters:
    env_id: Pendulum-v1
    num_envs: 2
/**/unilab_trainer:
  ros__parameters:
    num_envs: 2
    obs_dim: 3
    action_dim: 1
    num_steps: 16
    max_iterations: 2
    warm_up_update: false
    tensorboard: false
    model:
      actor_hidden_dims: [8]
      critic_hidden_dims: [8]
    ppo:
      num_mini_batches: 2
      num_learning_epochs: 1
"""


def _ros2(install_prefix, ros_domain_env) -> tuple[str, dict[str, str]]:
    """The ros2 command and an environment that finds the installed package."""
    ros2 = Path(sys.executable).parent / 'ros2'
    if not ros2.is_file() or importlib.util.find_spec('launch_ros') is None:
        pytest.skip('the ros2 CLI and launch_ros are not installed (not on PyPI): run '
                    '`make test ROS2_WHEELHOUSE=../shared/wheels/ros2-launch`')
    site_packages = next(install_prefix.glob('lib/python3*/site-packages'))
    env = dict(
        ros_domain_env,
        AMENT_PREFIX_PATH=os.pathsep.join([str(install_prefix), sys.prefix]),
        PYTHONPATH=os.pathsep.join(filter(None, [str(site_packages),
                                                 ros_domain_env.get('PYTHONPATH')])),
        PATH=os.pathsep.join([str(ros2.parent), ros_domain_env.get('PATH', '')]),
        PYTHONUNBUFFERED='1',
    )
    return str(ros2), env


def _ros2_launch(install_prefix, ros_domain_env, *arguments, timeout=120.0, cwd=None):
    ros2, env = _ros2(install_prefix, ros_domain_env)
    return subprocess.run([ros2, 'launch', PACKAGE, *arguments], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_ros2_launch_sim_train_trains_and_ends_when_the_trainer_finishes(
        install_prefix, ros_domain_env, tmp_path):
    params = tmp_path / 'small.yaml'
    params.write_text(SMALL_RUN)
    result = _ros2_launch(install_prefix, ros_domain_env, 'sim_train.launch.py',
                          f'params_file:={params}', 'num_envs:=2',
                          f'checkpoint_dir:={tmp_path / "run"}')
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert 'unilab_trainer finished: stopping the launch' in output, output[-3000:]
    assert (tmp_path / 'run' / 'checkpoint_000002.safetensors').is_file()


def test_ros2_launch_refuses_a_missing_params_file(install_prefix, ros_domain_env, tmp_path):
    missing = tmp_path / 'nowhere.yaml'
    result = _ros2_launch(install_prefix, ros_domain_env, 'train.launch.py',
                          f'params_file:={missing}', timeout=60.0)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f'params_file {missing} does not exist' in output, output[-3000:]
    assert 'unilab_trainer' not in output.split('does not exist')[-1], 'no node started'


def test_ros2_launch_show_args_lists_the_arguments(install_prefix, ros_domain_env):
    result = _ros2_launch(install_prefix, ros_domain_env, 'sim_train.launch.py', '--show-args',
                          timeout=60.0)
    assert result.returncode == 0, result.stderr
    for argument in ('env_id', 'num_envs', 'namespace', 'params_file', 'use_sim_time'):
        assert f"'{argument}'" in result.stdout


@pytest.fixture
def bundle(tmp_path):
    import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
    from unilab_ros.rl.actions import ActionConfig
    from unilab_ros.rl.agent import AgentConfig, PPOAgent
    from unilab_ros.rl.bundle import read_policy, save_bundle
    from unilab_ros.rl.checkpoint import save_checkpoint
    from unilab_ros.rl.model import ModelConfig

    agent = PPOAgent(AgentConfig(num_envs=1, obs_dim=3, action_dim=1),
                     ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]))
    checkpoint = save_checkpoint(tmp_path / 'ckpt', agent, actions=ActionConfig())
    return save_bundle(tmp_path / 'policy', read_policy(checkpoint))


def _lifecycle_state(ros2, env, deadline, wanted) -> str:
    """Poll `ros2 lifecycle get` until it reports ``wanted`` or ``deadline`` passes."""
    state = ''
    while time.monotonic() < deadline:
        # --no-daemon: a ros2 daemon would outlive the test; discovery then takes the spin.
        result = subprocess.run(
            [ros2, 'lifecycle', 'get', '--no-daemon', '--spin-time', '3', '/unilab_policy'],
            env=env, capture_output=True, text=True, timeout=30)
        state = result.stdout.strip()
        if state.startswith(wanted):
            return state
        time.sleep(0.5)
    return state


@pytest.mark.parametrize('activate, settled', [('true', 'active'), ('false', 'inactive')])
def test_ros2_launch_deploy_drives_the_lifecycle_node(install_prefix, ros_domain_env, bundle,
                                                      activate, settled):
    ros2, env = _ros2(install_prefix, ros_domain_env)
    launch = subprocess.Popen([ros2, 'launch', PACKAGE, 'deploy.launch.py',
                               f'checkpoint:={bundle}', f'activate:={activate}'],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60.0
        assert _lifecycle_state(ros2, env, deadline, settled).startswith(settled)
        # The operator's view of the same node: `ros2 lifecycle set` moves it, and the
        # launch does not re-activate a node deactivated by hand.
        change = 'deactivate' if settled == 'active' else 'activate'
        answer = _until_found(ros2, env, 'lifecycle', 'set', '--no-daemon', '--spin-time', '3',
                              '/unilab_policy', change)
        assert 'Transitioning successful' in answer, answer
        other = 'inactive' if settled == 'active' else 'active'
        assert _lifecycle_state(ros2, env, deadline, other).startswith(other)
        time.sleep(1.0)
        assert _lifecycle_state(ros2, env, deadline, other).startswith(other)
    finally:
        os.killpg(launch.pid, signal.SIGINT)
        try:
            output, _ = launch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            output, _ = launch.communicate()
    assert 'configured with' in output, output[-3000:]


def test_a_sourced_workspace_runs_ros2_launch(install_prefix, ros_domain_env):
    """docs/install.md's workspace steps: colcon build, source install/setup.bash, launch."""
    ros2, _ = _ros2(install_prefix, ros_domain_env)
    setup_bash = install_prefix.parent / 'setup.bash'
    assert setup_bash.is_file(), 'colcon-bash (requirements-dev.txt) writes setup.bash'
    # Only what docs/install.md asks for: the venv on PATH and in AMENT_PREFIX_PATH (the ament
    # markers of the ROS 2 wheels live there); setup.bash adds the workspace itself.
    env = dict(ros_domain_env, AMENT_PREFIX_PATH=sys.prefix,
               PATH=os.pathsep.join([str(Path(ros2).parent), ros_domain_env.get('PATH', '')]))
    env.pop('PYTHONPATH', None)
    script = (f'source {setup_bash} && ros2 pkg prefix {PACKAGE} && '
              f'ros2 launch {PACKAGE} sim_train.launch.py --show-args')
    result = subprocess.run(['bash', '-c', script], env=env, cwd=install_prefix.parent,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == str(install_prefix)
    assert "'checkpoint_dir'" in result.stdout


def test_two_launches_from_one_directory_write_to_folders_of_their_own(
        install_prefix, ros_domain_env, tmp_path):
    params = tmp_path / 'small.yaml'
    params.write_text(SMALL_RUN)
    ros2, env = _ros2(install_prefix, ros_domain_env)
    # One namespace, so both default to the same root; two ROS graphs, so their topics
    # stay apart (the second domain id is as arbitrary as conftest's).
    domain = int(env['ROS_DOMAIN_ID'])
    launches = [
        subprocess.Popen([ros2, 'launch', PACKAGE, 'sim_train.launch.py',
                          f'params_file:={params}', 'num_envs:=2'],
                         env=dict(env, ROS_DOMAIN_ID=str(domain_id)), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
        for domain_id in (domain, 1 + (domain + 49) % 100)
    ]
    outputs = [_finish(launch, timeout=120.0) for launch in launches]
    for launch, output in zip(launches, outputs, strict=True):
        assert launch.returncode == 0, output[-3000:]
    # Same namespace, same second: the process id keeps the runs apart.
    runs = tmp_path / 'runs' / 'default'
    folders = sorted(path for path in runs.iterdir() if path.name != 'latest')
    assert len(folders) == 2, folders
    for folder in folders:
        header_lines = [line for line in (folder / 'metrics.csv').read_text().splitlines()
                        if line.startswith('iteration')]
        assert len(header_lines) == 1, folder
        assert (folder / 'checkpoint_000002.safetensors').is_file()
    assert (runs / 'latest').resolve() in folders


def _finish(launch: subprocess.Popen, timeout: float) -> str:
    """The launch's output once it exits; its whole process group is killed if it hangs."""
    try:
        output, _ = launch.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        output, _ = launch.communicate()
    return output


def _cli(ros2, env, *arguments: str) -> str:
    result = subprocess.run([ros2, *arguments], env=env, capture_output=True, text=True,
                            timeout=60)
    return result.stdout + result.stderr


def _until_found(ros2, env, *arguments: str) -> str:
    """``ros2 <arguments>``, again while discovery has not found the node or its services
    yet (on two busy cores that can outlast one spin): "Node not found" or no answer."""
    deadline = time.monotonic() + 30.0
    while True:
        output = _cli(ros2, env, *arguments)
        if output.strip() not in ('', 'Node not found') or time.monotonic() > deadline:
            return output


def _param(ros2, env, verb: str, *arguments: str) -> str:
    # --no-daemon: a ros2 daemon would outlive the test; discovery takes the spin.
    return _until_found(ros2, env, 'param', verb, '--no-daemon', '--spin-time', '2',
                        *arguments)


def test_the_ros2_cli_steers_a_running_trainer(install_prefix, ros_domain_env, tmp_path):
    # The trainer alone, waiting for a robot: it answers at once (a training one on two
    # busy cores takes seconds per call), and waiting is its first state on a robot.
    params = tmp_path / 'small.yaml'
    params.write_text(SMALL_RUN)
    ros2, env = _ros2(install_prefix, ros_domain_env)
    run = tmp_path / 'run'
    launch = subprocess.Popen(
        [ros2, 'launch', PACKAGE, 'train.launch.py', f'params_file:={params}',
         'namespace:=cli', f'checkpoint_dir:={run}'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    trainer = '/cli/unilab_trainer'
    try:
        status = _cli(ros2, env, 'topic', 'echo', '--no-daemon', '--once', '--timeout', '60',
                      f'{trainer}/status', 'std_msgs/msg/String')
        assert '"state": "waiting_for_observation"' in status, status
        assert 'Boolean value is: True' in _param(ros2, env, 'get',
                                                 trainer, 'training')
        assert 'Set parameter successful' in _param(ros2, env, 'set',
                                                   trainer, 'ppo.learning_rate', '0.0005')
        assert 'Double value is: 0.0005' in _param(ros2, env, 'get',
                                                  trainer, 'ppo.learning_rate')
        refused = _param(ros2, env, 'set', trainer, 'num_envs', '4')
        assert 'Setting parameter failed' in refused and 'read-only' in refused, refused
        described = _param(ros2, env, 'describe', trainer,
                         'step_timeout')
        assert 'late step is dropped' in described and 'Read only: true' in described, \
            described
        answer = _cli(ros2, env, 'service', 'call', f'{trainer}/set_training',
                      'std_srvs/srv/SetBool', '{data: false}')
        assert 'success=True' in answer and 'training=False' in answer, answer
        assert 'Boolean value is: False' in _param(ros2, env, 'get',
                                                  trainer, 'training')
        saved = _cli(ros2, env, 'service', 'call', f'{trainer}/save_checkpoint',
                     'std_srvs/srv/Trigger')
        assert 'success=True' in saved, saved
        assert (run / 'latest.safetensors').is_file()
    finally:
        os.killpg(launch.pid, signal.SIGINT)
        output = _finish(launch, timeout=30.0)
    assert 'Traceback' not in output, output[-3000:]
