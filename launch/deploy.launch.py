"""Run a trained policy (inference only) on a robot or simulator.

    ros2 launch unilab_ros deploy.launch.py checkpoint:=/path/to/checkpoint

`checkpoint` has no default on purpose: a deployment must name the policy it runs.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.launch_support import ends_the_launch, require_params_file


def generate_launch_description() -> LaunchDescription:
    checkpoint = LaunchConfiguration('checkpoint')
    namespace = LaunchConfiguration('namespace')
    params_file = LaunchConfiguration('params_file')

    arguments = [
        DeclareLaunchArgument(
            'checkpoint',
            description='Path of the trained checkpoint the policy node loads (required)'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the policy node (its topics are relative)'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('unilab_ros'), 'config', 'deploy.yaml']),
            description='YAML with unilab_policy parameters'),
    ]
    policy = Node(
        package='unilab_ros', executable='policy_node', name='unilab_policy',
        namespace=namespace, output='screen',
        parameters=[params_file,
                    {'checkpoint': ParameterValue(checkpoint, value_type=str)}])
    return LaunchDescription([*arguments, require_params_file(), policy,
                              ends_the_launch(policy, 'unilab_policy')])
