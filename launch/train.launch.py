"""Train on a robot or an external simulator (e.g. Gazebo) that speaks the topic contract.

    ros2 launch unilab_ros train.launch.py namespace:=robot1 use_sim_time:=true

The trainer subscribes to relative `observation`, `reward` and `done` and publishes `action`:
set `namespace` (or remap) to meet the robot's topics.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.ros.launch_support import ends_the_launch, require_params_file


def generate_launch_description() -> LaunchDescription:
    namespace = LaunchConfiguration('namespace')
    params_file = LaunchConfiguration('params_file')
    checkpoint_dir = LaunchConfiguration('checkpoint_dir')
    use_sim_time = LaunchConfiguration('use_sim_time')
    log_level = LaunchConfiguration('log_level')

    arguments = [
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the trainer (its topics are relative)'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('unilab_ros'), 'config', 'trainer.yaml']),
            description='YAML with unilab_trainer parameters'),
        DeclareLaunchArgument(
            'checkpoint_dir', default_value='',
            description='Output folder of the trainer (wins over params_file); empty: a new '
                        'folder per run, runs/<namespace or default>/<time>-<pid>/, with a '
                        'runs/<namespace or default>/latest link'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='Use the /clock topic (e.g. Gazebo) instead of the wall clock'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the trainer (--ros-args --log-level)'),
    ]
    trainer = Node(
        package='unilab_ros', executable='trainer_node', name='unilab_trainer',
        namespace=namespace, output='screen', ros_arguments=['--log-level', log_level],
        parameters=[params_file,
                    {'use_sim_time': ParameterValue(use_sim_time, value_type=bool),
                     'checkpoint_dir': ParameterValue(checkpoint_dir, value_type=str)}])
    return LaunchDescription([*arguments, require_params_file(), trainer,
                              ends_the_launch(trainer, 'unilab_trainer')])
