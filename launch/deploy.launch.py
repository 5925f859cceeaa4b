"""Run a trained policy (inference only) on a robot or simulator, as a lifecycle node.

    ros2 launch unilab_ros deploy.launch.py checkpoint:=/path/to/policy.safetensors
    ros2 launch unilab_ros deploy.launch.py checkpoint:=... activate:=false

`checkpoint` (a bundle from export_bundle, or a training checkpoint) has no default on
purpose: a deployment must name the policy it runs. The launch configures the node (it
loads the policy) and, unless `activate:=false`, activates it once configured; left
inactive, `ros2 lifecycle set /unilab_policy activate` starts commanding.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.conditions import IfCondition
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition

from unilab_ros.launch_support import ends_the_launch, require_params_file


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
            'activate', default_value='true',
            description='Activate the policy node once configured (false: leave it inactive)'),
        DeclareLaunchArgument(
            'use_sim_time', default_value='false', choices=['true', 'false'],
            description='Use the /clock topic (e.g. Gazebo) instead of the wall clock'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            choices=['debug', 'info', 'warn', 'error', 'fatal'],
            description='Log level of the policy node (--ros-args --log-level)'),
    ]
    policy = LifecycleNode(
        package='unilab_ros', executable='policy_node', name='unilab_policy',
        namespace=namespace, output='screen', ros_arguments=['--log-level', log_level],
        parameters=[params_file,
                    {'checkpoint': ParameterValue(checkpoint, value_type=str),
                     'use_sim_time': ParameterValue(use_sim_time, value_type=bool)}])

    def change_state(transition_id: int) -> EmitEvent:
        return EmitEvent(event=ChangeState(
            lifecycle_node_matcher=matches_action(policy),
            transition_id=transition_id))

    # Only the configuring -> inactive step activates: a later deactivate (an operator's
    # `ros2 lifecycle set ... deactivate`) also ends in inactive and must stay there.
    activate_once_configured = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=policy, start_state='configuring', goal_state='inactive',
        entities=[change_state(Transition.TRANSITION_ACTIVATE)]),
        condition=IfCondition(activate))
    return LaunchDescription([
        *arguments, require_params_file(), activate_once_configured, policy,
        change_state(Transition.TRANSITION_CONFIGURE),
        ends_the_launch(policy, 'unilab_policy')])
