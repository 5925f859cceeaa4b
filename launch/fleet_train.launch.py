"""A fleet in simulation: N Gymnasium bridges in namespaces robot1..robotN, one trainer.

    ros2 launch unilab_ros fleet_train.launch.py num_robots:=3 num_envs:=16

Each bridge speaks the topic contract under its own namespace (/robot1/observation, ...);
the trainer (at the root, or in `namespace`) learns from all of them in one rollout
(its `robots` parameter). A bridge that dies does not end the launch: the trainer leaves
that robot out and takes it back when it publishes again. The launch ends when the
trainer does. Bridge k is seeded `seed + 1000 * k`, so the robots differ.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.ros.launch_support import ends_the_launch, require_params_file

SEED_STRIDE = 1000
"""Seed offset between two robots' bridges (each seeds env i with its seed + i)."""
FLEET_MAX_PAUSE = 5.0
"""Seconds a bridge stays paused without a resume: longer than an update takes."""


def _fleet(context: LaunchContext) -> list:
    num_robots = int(LaunchConfiguration('num_robots').perform(context))
    if num_robots < 1:
        raise ValueError(f'num_robots must be >= 1, got {num_robots}')
    params_file = LaunchConfiguration('params_file')
    namespace = LaunchConfiguration('namespace').perform(context).strip('/')
    seed = int(LaunchConfiguration('seed').perform(context))
    num_envs = ParameterValue(LaunchConfiguration('num_envs'), value_type=int)
    use_sim_time = ParameterValue(LaunchConfiguration('use_sim_time'), value_type=bool)
    ros_arguments = ['--log-level', LaunchConfiguration('log_level')]
    robots = [f'robot{k}' for k in range(1, num_robots + 1)]
    bridges = [
        Node(package='unilab_ros', executable='gym_env_node', name='gym_env',
             namespace='/'.join(filter(None, [namespace, robot])), output='screen',
             ros_arguments=ros_arguments,
             parameters=[params_file, {
                 'num_envs': num_envs, 'seed': seed + SEED_STRIDE * k,
                 'use_sim_time': use_sim_time,
                 # A trainer stopped during an update never resumes its bridges: they
                 # resume themselves after this many seconds.
                 'max_pause': FLEET_MAX_PAUSE,
                 'env_id': ParameterValue(LaunchConfiguration('env_id'), value_type=str)}])
        for k, robot in enumerate(robots)
    ]
    trainer = Node(
        package='unilab_ros', executable='trainer_node', name='unilab_trainer',
        namespace=namespace, output='screen', ros_arguments=ros_arguments,
        parameters=[params_file, {
            'num_envs': num_envs, 'robots': robots, 'use_sim_time': use_sim_time,
            'checkpoint_dir': ParameterValue(
                LaunchConfiguration('checkpoint_dir'), value_type=str)}])
    return [*bridges, trainer, ends_the_launch(trainer, 'unilab_trainer')]


def generate_launch_description() -> LaunchDescription:
    arguments = [
        DeclareLaunchArgument(
            'num_robots', default_value='3',
            description='Robots: one gym_env bridge each, in namespaces robot1..robotN'),
        DeclareLaunchArgument(
            'env_id', default_value='Pendulum-v1',
            description='Gymnasium id every bridge serves (Box observation and action spaces)'),
        DeclareLaunchArgument(
            'num_envs', default_value='16',
            description='Envs per robot: rows of every message; the rollout holds '
                        'num_robots x num_envs'),
        DeclareLaunchArgument(
            'seed', default_value='0',
            description='Seed of robot1; robot k+1 gets seed + 1000 k'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the trainer; the robots are below it'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('unilab_ros'), 'config', 'pendulum.yaml']),
            description='YAML with gym_env and unilab_trainer parameters'),
        DeclareLaunchArgument(
            'checkpoint_dir', default_value='',
            description='Output folder of the trainer (wins over params_file); empty: a new '
                        'folder per run under runs/<namespace or default>/'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='Use the /clock topic instead of the wall clock (bridges and trainer)'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the bridges and the trainer (--ros-args --log-level)'),
    ]
    return LaunchDescription([
        *arguments, require_params_file(), OpaqueFunction(function=_fleet),
    ])
