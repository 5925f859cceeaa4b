"""The launch files: checked statically everywhere, loaded and run where ROS 2 `launch` exists.

`launch` and `launch_ros` come with a ROS 2 distro (or RoboStack), not from PyPI, so the
static checks read the files with `ast`: docstring, `generate_launch_description`, a
`params_file` argument, a described `DeclareLaunchArgument` for every `LaunchConfiguration`,
nodes that print to the screen and take dict parameters after files, known executables.
"""

import ast
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
LAUNCH_DIR = PACKAGE_ROOT / 'launch'
COMMON_ARGUMENTS = {'params_file', 'namespace', 'use_sim_time', 'log_level'}
"""Every launch file has these: a params file, a namespace, the clock and the log level."""
EXPECTED_ARGUMENTS = {
    'sim_train.launch.py': {*COMMON_ARGUMENTS, 'env_id', 'num_envs', 'checkpoint_dir'},
    'train.launch.py': {*COMMON_ARGUMENTS, 'checkpoint_dir'},
    'deploy.launch.py': {*COMMON_ARGUMENTS, 'checkpoint', 'activate'},
    'fleet_train.launch.py': {*COMMON_ARGUMENTS, 'num_robots', 'env_id', 'num_envs', 'seed',
                              'checkpoint_dir'},
    'mujoco_robot.launch.py': {'robot', 'num_robots', 'real_time_factor', 'params_file',
                               'use_sim_time', 'log_level'},
    'robot_train.launch.py': {'robot', 'algorithm', 'real_time_factor', 'params_file',
                              'seed', 'max_iterations', 'checkpoint_dir', 'namespace',
                              'log_level'},
}
LAUNCH_FILES = sorted(EXPECTED_ARGUMENTS)


def _tree(name: str) -> ast.Module:
    return ast.parse((LAUNCH_DIR / name).read_text(), filename=name)


def _calls(tree: ast.AST, *functions: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id in functions]


NODE_ACTIONS = ('Node', 'LifecycleNode')


def _first_string_argument(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) \
            and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _declared_arguments(tree: ast.AST) -> dict[str, str | None]:
    """Declared argument name -> its description (None when missing or not a literal)."""
    declared = {}
    for call in _calls(tree, 'DeclareLaunchArgument'):
        description = _keyword(call, 'description')
        declared[_first_string_argument(call)] = (
            description.value if isinstance(description, ast.Constant) else None)
    return declared


def test_every_launch_file_is_checked():
    assert sorted(path.name for path in LAUNCH_DIR.glob('*.launch.py')) == LAUNCH_FILES


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_launch_file_has_a_docstring_and_generate_launch_description(name):
    tree = _tree(name)
    assert ast.get_docstring(tree), f'{name} needs a module docstring'
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert 'generate_launch_description' in functions


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_every_launch_configuration_is_declared_with_a_description(name):
    tree = _tree(name)
    declared = _declared_arguments(tree)
    assert set(declared) == EXPECTED_ARGUMENTS[name]
    for argument, description in declared.items():
        assert isinstance(description, str) and description.strip(), \
            f'{name}: argument {argument!r} needs a description'
    used = {_first_string_argument(call) for call in _calls(tree, 'LaunchConfiguration')}
    assert None not in used, f'{name}: LaunchConfiguration names must be literals'
    assert used <= set(declared), f'{name}: undeclared {sorted(used - set(declared))}'
    assert 'params_file' in used


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_nodes_print_to_screen_and_take_dict_parameters_after_files(name):
    nodes = _calls(_tree(name), *NODE_ACTIONS)
    assert nodes, f'{name} launches no node'
    for node in nodes:
        output = _keyword(node, 'output')
        assert isinstance(output, ast.Constant) and output.value == 'screen'
        parameters = _keyword(node, 'parameters')
        assert isinstance(parameters, ast.List)
        is_file = [isinstance(item, ast.Name) and item.id == 'params_file'
                   for item in parameters.elts]
        assert is_file[0], f'{name}: the params file comes first'
        assert is_file == sorted(is_file, reverse=True), \
            f'{name}: dict parameters go after files, so they win'


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_nodes_run_console_scripts_of_the_package(name):
    console_scripts = set(re.findall(r"'(\w+) = unilab_ros\.",
                                     (PACKAGE_ROOT / 'setup.py').read_text()))
    for node in _calls(_tree(name), *NODE_ACTIONS):
        assert _keyword(node, 'package').value == 'unilab_ros'
        assert _keyword(node, 'executable').value in console_scripts


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_default_params_files_exist_in_the_package(name):
    for join in _calls(_tree(name), 'PathJoinSubstitution'):
        *_, directory, filename = (element.value for element in join.args[0].elts[1:])
        assert (PACKAGE_ROOT / directory / filename).is_file(), \
            f'{name} refers to {directory}/{filename}, missing from the package'


@pytest.mark.parametrize('name', LAUNCH_FILES)
def test_launch_description_loads_with_ros2_launch(name):
    # `launch.actions`, not `launch`: this package's launch/ folder imports as a namespace.
    reason = ('ROS 2 launch / launch_ros are not installed (not on PyPI): run '
              '`make test ROS2_WHEELHOUSE=../shared/wheels/ros2-launch` or source a ROS 2 distro')
    pytest.importorskip('launch.actions', reason=reason)
    pytest.importorskip('launch_ros', reason=reason)
    spec = importlib.util.spec_from_file_location(name.replace('.', '_'), LAUNCH_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    arguments = {argument.name: argument for argument in description.get_launch_arguments()}
    assert set(arguments) == EXPECTED_ARGUMENTS[name]
    assert all(argument.description for argument in arguments.values())


EXECUTABLES = dict(
    (name, (module, function)) for name, module, function in re.findall(
        r"'(\w+) = (unilab_ros[\w.]*):(\w+)'", (PACKAGE_ROOT / 'setup.py').read_text()))
"""Each console script of setup.py: its module and function."""


@pytest.fixture
def ros2_launch(tmp_path, ros_domain_env):
    """``ros2 launch <file> args...`` as a Popen, on an ament prefix made for the test:
    the package's marker, its share folder and console scripts that run this tree."""
    ros2 = Path(sys.executable).parent / 'ros2'
    if not ros2.is_file() or importlib.util.find_spec('launch_ros') is None:
        pytest.skip('the ros2 CLI and launch_ros are not installed (not on PyPI): run '
                    '`make setup ROS2_WHEELHOUSE=../shared/wheels/ros2-launch`')
    prefix = tmp_path / 'prefix'
    marker = prefix / 'share' / 'ament_index' / 'resource_index' / 'packages' / 'unilab_ros'
    marker.parent.mkdir(parents=True)
    marker.touch()
    (prefix / 'share' / 'unilab_ros').mkdir()
    (prefix / 'share' / 'unilab_ros' / 'config').symlink_to(PACKAGE_ROOT / 'config')
    scripts = prefix / 'lib' / 'unilab_ros'
    scripts.mkdir(parents=True)
    for executable, (module, function) in EXECUTABLES.items():
        script = scripts / executable
        script.write_text(f'#!/bin/sh\nexec {sys.executable} -c "import sys; from {module} '
                          f'import {function}; sys.exit({function}())" "$@"\n')
        script.chmod(0o755)
    env = dict(ros_domain_env, AMENT_PREFIX_PATH=os.pathsep.join([str(prefix), sys.prefix]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                        ros_domain_env.get('PYTHONPATH')])),
               PYTHONUNBUFFERED='1')

    def start(name: str, *arguments: str) -> subprocess.Popen:
        # A session of its own: Ctrl-C reaches the whole process group, as in a terminal.
        return subprocess.Popen([str(ros2), 'launch', str(LAUNCH_DIR / name), *arguments],
                                env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    started: list[subprocess.Popen] = []
    yield lambda *args: started.append(start(*args)) or started[-1]
    for launch in started:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
        launch.communicate()


def _output(launch: subprocess.Popen, timeout: float = 90.0) -> str:
    try:
        output, _ = launch.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        output, _ = launch.communicate()
        raise AssertionError(f'the launch did not end in {timeout} s:\n{output[-3000:]}') from None
    return output


def test_a_failing_trainer_fails_the_launch_and_log_level_reaches_it(ros2_launch, tmp_path):
    params = tmp_path / 'trainer.yaml'
    params.write_text((PACKAGE_ROOT / 'config' / 'trainer.yaml').read_text().replace(
        'resume_from: ""', f'resume_from: "{tmp_path / "missing.safetensors"}"'))
    launch = ros2_launch('train.launch.py', f'params_file:={params}', 'log_level:=debug',
                         f'checkpoint_dir:={tmp_path / "run"}')
    output = _output(launch)
    assert launch.returncode != 0, output[-3000:]
    assert 'unilab_trainer failed (exit code 2)' in output, output[-3000:]
    assert '[DEBUG]' in output, 'log_level:=debug did not reach the trainer'


def test_deploy_stopped_with_ctrl_c_exits_0(ros2_launch, tmp_path):
    import mlx.core as mx  # noqa: F401 - after conftest's BLAS choice

    from unilab_ros.rl.actions import ActionConfig
    from unilab_ros.rl.agent import AgentConfig, PPOAgent
    from unilab_ros.rl.bundle import bundle_from_agent, save_bundle
    from unilab_ros.rl.model import ModelConfig

    agent = PPOAgent(AgentConfig(num_envs=1, obs_dim=3, action_dim=1),
                     ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]))
    bundle = save_bundle(tmp_path / 'policy', bundle_from_agent(
        agent, ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[2.0]), 'test'))
    for attempt in range(3):  # the error came "sometimes": a race at shutdown
        launch = ros2_launch('deploy.launch.py', f'checkpoint:={bundle}')
        lines: list[str] = []
        # The node logs a line a second (its status) at most: readline cannot stall long.
        while not lines or 'active: commanding' not in lines[-1]:
            line = launch.stdout.readline()
            assert line, f'deploy ended before activating:\n{"".join(lines[-40:])}'
            lines.append(line)
        time.sleep(0.5 * attempt)  # a few moments into the run
        os.killpg(launch.pid, signal.SIGINT)
        output = ''.join(lines) + _output(launch, timeout=60.0)
        assert 'Cannot shutdown a ROS adapter' not in output, output[-3000:]
        assert launch.returncode == 0, f'attempt {attempt}: {output[-3000:]}'


def test_robot_train_trains_the_cartpole_through_standard_messages(ros2_launch, tmp_path):
    """In a namespace (issue 41, 9: the trainer trained there without pausing, its files
    naming the root's /pause_physics): both nodes move, and the pause is found."""
    params = tmp_path / 'cartpole.yaml'
    params.write_text((PACKAGE_ROOT / 'config' / 'robot_train' / 'cartpole.yaml').read_text()
                      .replace('num_steps: 2048', 'num_steps: 256'))
    launch = ros2_launch('robot_train.launch.py', 'robot:=cartpole', f'params_file:={params}',
                         'max_iterations:=1', 'real_time_factor:=4.0', 'namespace:=arm1',
                         f'checkpoint_dir:={tmp_path / "run"}')
    output = _output(launch, timeout=120.0)
    assert launch.returncode == 0, output[-3000:]
    assert 'simulator service' not in output, output[-3000:]
    assert "robot spec 'cartpole'" not in output or 'Traceback' not in output
    assert 'iter     1 | steps      256' in output, output[-3000:]
    assert 'finished 1 iterations' in output, output[-3000:]
    assert (tmp_path / 'run' / 'checkpoint_000001.safetensors').is_file()
