"""Train a MuJoCo robot through standard ROS 2 messages only: the robot node, free-running
on sim time, and the trainer reading the robot spec.

    ros2 launch unilab_ros robot_train.launch.py robot:=cartpole real_time_factor:=4.0

`robot` picks the robot node's `config/robots/<robot>.yaml` and the trainer's
`config/robot_train/<robot>.yaml`, which names the spec `config/robot_specs/<robot>.yaml`
(cartpole, reacher, quadruped); `algorithm:=sac` takes `<robot>_sac.yaml`, the off-policy
learner's file, instead. The trainer subscribes the robot's `joint_states` (and
`imu`, `odom`, site poses as the spec says), acts at the spec's control rate on sim time,
commands the robot's controller topic and resets it through its `reset` service. The
launch ends when the trainer does (max_iterations, or a failure: then with an error).

`namespace` puts both nodes in one namespace: their topics and services (the robot's
`pause_physics`, which the shipped trainer files name relatively) move there together.
`/clock` stays global, so one simulated world runs per ROS graph (ROS_DOMAIN_ID).
"""

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.ros.launch_support import ends_the_launch


def _robot_node(context: LaunchContext, params_file: str) -> Node:
    return Node(
        package='unilab_ros', executable='mujoco_robot_node', name='mujoco_robot',
        namespace=LaunchConfiguration('namespace'), output='screen',
        ros_arguments=['--log-level', LaunchConfiguration('log_level')],
        parameters=[params_file, {
            'real_time_factor': ParameterValue(LaunchConfiguration('real_time_factor'),
                                               value_type=float)}])


def _trainer(context: LaunchContext, params_file: str) -> Node:
    given = {'seed': (LaunchConfiguration('seed'), int),
             'max_iterations': (LaunchConfiguration('max_iterations'), int),
             'checkpoint_dir': (LaunchConfiguration('checkpoint_dir'), str)}
    # Only the arguments given win over the params file.
    overrides = {'use_sim_time': True, **{
        name: ParameterValue(value, value_type=kind) for name, (value, kind) in given.items()
        if value.perform(context)}}
    return Node(
        package='unilab_ros', executable='trainer_node', name='unilab_trainer',
        namespace=LaunchConfiguration('namespace'), output='screen',
        ros_arguments=['--log-level', LaunchConfiguration('log_level')],
        parameters=[params_file, overrides])


def _nodes(context: LaunchContext) -> list:
    share = Path(FindPackageShare('unilab_ros').perform(context)) / 'config'
    robot = LaunchConfiguration('robot').perform(context)
    robot_file = share / 'robots' / f'{robot}.yaml'
    algorithm = LaunchConfiguration('algorithm').perform(context)
    suffix = '' if algorithm == 'ppo' else f'_{algorithm}'
    trainer_file = Path(LaunchConfiguration('params_file').perform(context)
                        or share / 'robot_train' / f'{robot}{suffix}.yaml')
    for path in (robot_file, trainer_file):
        if not path.is_file():
            shipped = sorted(p.stem for p in (share / 'robot_train').glob('*.yaml'))
            raise FileNotFoundError(f'{path} does not exist (robot:= one of {shipped})')
    robot_node, trainer = _robot_node(context, str(robot_file)), _trainer(context,
                                                                          str(trainer_file))
    return [robot_node, trainer, ends_the_launch(robot_node, 'mujoco_robot'),
            ends_the_launch(trainer, 'unilab_trainer')]


def generate_launch_description() -> LaunchDescription:
    arguments = [
        DeclareLaunchArgument(
            'robot', default_value='cartpole',
            description='Shipped robot and task: cartpole, reacher or quadruped'),
        DeclareLaunchArgument(
            'real_time_factor', default_value='1.0',
            description='Sim seconds per wall second of the robot (0.0: as fast as it can)'),
        DeclareLaunchArgument(
            'algorithm', default_value='ppo', choices=['ppo', 'sac'],
            description='Learner of the shipped trainer file: ppo (<robot>.yaml) or the '
                        'off-policy sac (<robot>_sac.yaml)'),
        DeclareLaunchArgument(
            'params_file', default_value='',
            description='Trainer YAML; empty: config/robot_train/<robot>.yaml '
                        '(<robot>_sac.yaml with algorithm:=sac)'),
        DeclareLaunchArgument('seed', default_value='', description='Trainer seed'),
        DeclareLaunchArgument('max_iterations', default_value='',
                              description='Iterations before the trainer stops (PPO '
                                          'rollouts or SAC learning phases)'),
        DeclareLaunchArgument(
            'checkpoint_dir', default_value='',
            description='Trainer output folder; empty: runs/default/<time>-<pid>/'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of both nodes (topics and the robot\'s services move '
                        'with it); empty: none'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of both nodes'),
    ]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes)])
