"""A MuJoCo robot that stands in for Gazebo + ros2_control: /clock, joint_states, commands.

    ros2 launch unilab_ros mujoco_robot.launch.py robot:=quadruped num_robots:=2 \
        real_time_factor:=1.0

`robot` picks `config/robots/<robot>.yaml` (cartpole, reacher, quadruped) unless
`params_file` names another file; the other arguments are applied after the file, so they
win. With one robot its topics are at the root (`/joint_states`, ...), with N of them
under `/robot1` ... `/robotN`; `/clock` and the world services (`/pause_physics`,
`/unpause_physics`, `/reset_world`) are shared. Start the nodes that use the robot with
`use_sim_time:=true`.
"""

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def _robot(context: LaunchContext) -> list:
    robots = Path(FindPackageShare('unilab_ros').perform(context)) / 'config' / 'robots'
    robot = LaunchConfiguration('robot').perform(context)
    params_file = LaunchConfiguration('params_file').perform(context) \
        or str(robots / f'{robot}.yaml')
    if not Path(params_file).is_file():
        shipped = sorted(path.stem for path in robots.glob('*.yaml'))
        raise FileNotFoundError(f'params_file {params_file} does not exist (robot:= one of '
                                f'{shipped}, or params_file:= a file of your own)')
    robot_node = Node(
        package='unilab_ros', executable='mujoco_robot_node', name='mujoco_robot',
        output='screen',
        arguments=['--ros-args', '--log-level', LaunchConfiguration('log_level')],
        parameters=[params_file, {
            'num_robots': ParameterValue(LaunchConfiguration('num_robots'), value_type=int),
            'real_time_factor': ParameterValue(LaunchConfiguration('real_time_factor'),
                                               value_type=float),
            'use_sim_time': ParameterValue(LaunchConfiguration('use_sim_time'),
                                           value_type=bool)}])
    return [robot_node]


def generate_launch_description() -> LaunchDescription:
    arguments = [
        DeclareLaunchArgument(
            'robot', default_value='cartpole',
            description='Shipped robot: config/robots/<robot>.yaml (cartpole, reacher, '
                        'quadruped)'),
        DeclareLaunchArgument(
            'num_robots', default_value='1',
            description='Copies of the robot; with more than one, each under /robot<k>'),
        DeclareLaunchArgument(
            'real_time_factor', default_value='1.0',
            description='Sim seconds per wall second: 1.0 real time, above 1 faster, 0.0 as '
                        'fast as possible'),
        DeclareLaunchArgument(
            'params_file', default_value='',
            description='YAML with mujoco_robot parameters; empty: the robot\'s own file'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='The robot node\'s own clock follows /clock (its streams are stamped '
                        'in sim time either way)'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the robot node'),
    ]
    return LaunchDescription([*arguments, OpaqueFunction(function=_robot)])
