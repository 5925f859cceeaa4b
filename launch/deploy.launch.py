"""Run a trained policy (inference only) on a robot or simulator, as a lifecycle node.

    ros2 launch unilab_ros deploy.launch.py checkpoint:=/path/to/policy.safetensors
    ros2 launch unilab_ros deploy.launch.py checkpoint:=... activate:=false

`checkpoint` (a bundle from export_bundle, or a training checkpoint) has no default on
purpose: a deployment must name the policy it runs. The node configures itself (it loads
the policy) and, unless `activate:=false`, activates once configured (a robot spec's
policy: once the robot's joint_states were heard with the spec's joints; until then it
stays inactive and logs why); left inactive, `ros2 lifecycle set /unilab_policy activate`
starts commanding, and `ros2 lifecycle set /unilab_policy shutdown` ends it.

The node takes these steps itself (its `start_state` parameter) rather than the launch
driving them with ChangeState events: those need an rclpy node inside `ros2 launch`, and
its teardown after Ctrl-C (launch_ros's ROS adapter) hung the launch about one time in
50 here, after the policy node had already ended.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from unilab_ros.ros.launch_support import ends_the_launch, require_params_file


def generate_launch_description() -> LaunchDescription:
    checkpoint = LaunchConfiguration('checkpoint')
    namespace = LaunchConfiguration('namespace')
    params_file = LaunchConfiguration('params_file')
    activate = LaunchConfiguration('activate')
    use_sim_time = LaunchConfiguration('use_sim_time')
    log_level = LaunchConfiguration('log_level')

    arguments = [
        DeclareLaunchArgument(
            'checkpoint',
            description='Policy bundle or training checkpoint the policy node loads (required)'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the policy node (its topics are relative)'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution(
                [FindPackageShare('unilab_ros'), 'config', 'deploy.yaml']),
            description='YAML with unilab_policy parameters'),
        DeclareLaunchArgument(
            'activate', default_value='true', choices=['true', 'false'],
            description='Activate the policy node once configured, and for a robot spec once '
                        'the robot\'s joints match it (false: leave it inactive)'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='Use the /clock topic (e.g. Gazebo) instead of the wall clock'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the policy node (--ros-args --log-level)'),
    ]
    start_state = PythonExpression(["'active' if '", activate, "' == 'true' else 'inactive'"])
    policy = Node(
        package='unilab_ros', executable='policy_node', name='unilab_policy',
        namespace=namespace, output='screen', ros_arguments=['--log-level', log_level],
        parameters=[params_file,
                    {'checkpoint': ParameterValue(checkpoint, value_type=str),
                     'start_state': ParameterValue(start_state, value_type=str),
                     'use_sim_time': ParameterValue(use_sim_time, value_type=bool)}])
    return LaunchDescription([
        *arguments, require_params_file(), policy, ends_the_launch(policy, 'unilab_policy')])
