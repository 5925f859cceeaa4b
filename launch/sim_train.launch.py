"""Train in simulation without Gazebo: a Gymnasium env node and the trainer, on one graph.

    ros2 launch unilab_ros sim_train.launch.py env_id:=Pendulum-v1 num_envs:=16

Both nodes read `params_file`; the launch arguments below are applied after it, so they win.
The trainer's `obs_dim` / `action_dim` must match the env: they come from `params_file`.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.ros.launch_support import ends_the_launch, require_params_file


def generate_launch_description() -> LaunchDescription:
    env_id = LaunchConfiguration('env_id')
    num_envs = LaunchConfiguration('num_envs')
    namespace = LaunchConfiguration('namespace')
    params_file = LaunchConfiguration('params_file')
    checkpoint_dir = LaunchConfiguration('checkpoint_dir')
    use_sim_time = LaunchConfiguration('use_sim_time')
    log_level = LaunchConfiguration('log_level')

    arguments = [
        DeclareLaunchArgument(
            'env_id', default_value='Pendulum-v1',
            description='Gymnasium id served by gym_env (Box observation and action spaces)'),
        DeclareLaunchArgument(
            'num_envs', default_value='16',
            description='Parallel envs: rows of every message, for gym_env and the trainer'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of both nodes (their topics are relative)'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('unilab_ros'), 'config', 'pendulum.yaml']),
            description='YAML with gym_env and unilab_trainer parameters'),
        DeclareLaunchArgument(
            'checkpoint_dir', default_value='',
            description='Output folder of the trainer (wins over params_file); empty: a new '
                        'folder per run, runs/<namespace or default>/<time>-<pid>/, with a '
                        'runs/<namespace or default>/latest link'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='Use the /clock topic instead of the wall clock'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the bridge and the trainer (--ros-args --log-level)'),
    ]
    common = {
        'num_envs': ParameterValue(num_envs, value_type=int),
        'use_sim_time': ParameterValue(use_sim_time, value_type=bool),
    }
    gym_env = Node(
        package='unilab_ros', executable='gym_env_node', name='gym_env',
        namespace=namespace, output='screen', ros_arguments=['--log-level', log_level],
        parameters=[params_file, {**common, 'env_id': ParameterValue(env_id, value_type=str)}])
    trainer = Node(
        package='unilab_ros', executable='trainer_node', name='unilab_trainer',
        namespace=namespace, output='screen', ros_arguments=['--log-level', log_level],
        parameters=[params_file, {
            **common,
            'checkpoint_dir': ParameterValue(checkpoint_dir, value_type=str)}])
    return LaunchDescription([
        *arguments, require_params_file(), gym_env, trainer,
        ends_the_launch(gym_env, 'gym_env'), ends_the_launch(trainer, 'unilab_trainer'),
    ])
