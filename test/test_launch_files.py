"""The launch files: checked statically everywhere, and loaded where ROS 2 `launch` exists.

`launch` and `launch_ros` come with a ROS 2 distro (or RoboStack), not from PyPI, so the
static checks read the files with `ast`: docstring, `generate_launch_description`, a
`params_file` argument, a described `DeclareLaunchArgument` for every `LaunchConfiguration`,
nodes that print to the screen and take dict parameters after files, known executables.
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
LAUNCH_DIR = PACKAGE_ROOT / 'launch'
EXPECTED_ARGUMENTS = {
    'sim_train.launch.py': {'env_id', 'num_envs', 'namespace', 'params_file', 'use_sim_time',
                            'checkpoint_dir'},
    'train.launch.py': {'namespace', 'params_file', 'use_sim_time', 'checkpoint_dir'},
    'deploy.launch.py': {'checkpoint', 'namespace', 'params_file', 'activate'},
    'fleet_train.launch.py': {'num_robots', 'env_id', 'num_envs', 'seed', 'namespace',
                              'params_file', 'checkpoint_dir'},
    'mujoco_robot.launch.py': {'robot', 'num_robots', 'real_time_factor', 'params_file',
                               'use_sim_time', 'log_level'},
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
